// SPDX-License-Identifier: MIT
// The Asio the Asio tests run on. The same test files are built twice: on standalone Asio in
// resilience_tests, and on Boost.Asio in resilience_boost_asio_tests (RESILIENCE_TEST_BOOST_ASIO), as
// `net` (Asio's namespace) and `rsa` (the integration's: resilience::asio or resilience::boost_asio).
#pragma once

#if defined(RESILIENCE_TEST_BOOST_ASIO)

#include <resilience/boost_asio.hpp>

#include <boost/asio.hpp>
#if defined(BOOST_ASIO_HAS_CO_AWAIT)
#define RESILIENCE_TEST_HAS_CO_AWAIT 1
#include <boost/asio/experimental/awaitable_operators.hpp>
#endif

namespace net = ::boost::asio;
namespace rsa = ::resilience::boost_asio;
using net_error_code = ::boost::system::error_code;
using net_system_error = ::boost::system::system_error;
inline constexpr const char* asio_flavour_namespace = "boost_asio";

#else

#include <resilience/asio.hpp>

#include <system_error>

#include <asio.hpp>
#if defined(ASIO_HAS_CO_AWAIT)
#define RESILIENCE_TEST_HAS_CO_AWAIT 1
#include <asio/experimental/awaitable_operators.hpp>
#endif

namespace net = ::asio;
namespace rsa = ::resilience::asio;
using net_error_code = std::error_code;
using net_system_error = std::system_error;
inline constexpr const char* asio_flavour_namespace = "asio";

#endif
