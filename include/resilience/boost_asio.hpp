// SPDX-License-Identifier: MIT
/// \file boost_asio.hpp
/// Optional Asio integration on Boost.Asio (Boost 1.81 or later): what <resilience/asio.hpp> gives on
/// standalone Asio, in the namespace `resilience::boost_asio` and on `boost::asio`'s types. One
/// implementation serves both (resilience/asio_flavour/), and a program may include both headers.
/// A Beast client keeps its style: its own awaitable is the action, called once per attempt, and the
/// policies, built without a clock, sleep on timers of the call's executor.
///
///     namespace net = boost::asio;
///     rs::pipeline policy{rs::retry{{.max_attempts = 3}}, rs::timeout{2s}};
///
///     auto fetch = [&]() -> net::awaitable<response> {
///         tcp::socket socket{co_await net::this_coro::executor};   // the call's strand
///         co_await socket.async_connect(server, net::use_awaitable);
///         ...                                                      // Beast's async_write, async_read
///         co_return reply;
///     };
///     response reply = co_await rs::boost_asio::execute(policy, fetch, net::use_awaitable);
///
/// docs/asio.md describes both flavours; the CMake target is resilience::boost_asio.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/execution_context.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/query.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/system_context.hpp>
#include <boost/asio/system_executor.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

namespace resilience::inline v0_2::boost_asio {
/// The Asio this integration is built on: Boost.Asio's namespace.
namespace net = ::boost::asio;
} // namespace resilience::boost_asio

#if defined(RESILIENCE_ASIO_FLAVOUR) || defined(RESILIENCE_ASIO_NET) || defined(RESILIENCE_ASIO_FLAVOUR_NAME)
#error "RESILIENCE_ASIO_FLAVOUR, RESILIENCE_ASIO_NET and RESILIENCE_ASIO_FLAVOUR_NAME are the library's own"
#endif
#define RESILIENCE_ASIO_FLAVOUR boost_asio
#define RESILIENCE_ASIO_FLAVOUR_NAME "boost_asio"
#define RESILIENCE_ASIO_NET boost::asio
#define RESILIENCE_ASIO_NET_NAME "boost::asio"
#if defined(BOOST_ASIO_HAS_CO_AWAIT)
#define RESILIENCE_ASIO_HAS_CO_AWAIT 1
#else
#define RESILIENCE_ASIO_HAS_CO_AWAIT 0
#endif
#define RESILIENCE_ASIO_HAS_DEFERRED 1
#if defined(BOOST_ASIO_HAS_STD_FUTURE_CLASS)
#define RESILIENCE_ASIO_HAS_USE_FUTURE 1
#else
#define RESILIENCE_ASIO_HAS_USE_FUTURE 0
#endif
#include "asio_flavour/bodies.hpp" // the bodies, in order; undefines the macros above
