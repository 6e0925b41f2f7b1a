// SPDX-License-Identifier: MIT
// Must not compile: an action of rs::boost_asio::execute returns a plain int, not something to await.
// expect: rs::boost_asio::execute: the action returns a plain value, not something to await
#include <resilience/boost_asio.hpp>
#include <resilience/resilience.hpp>

#include <boost/asio/io_context.hpp>

namespace rs = resilience;
namespace net = boost::asio;

void call(net::io_context& io, const rs::retry<>& policy) {
    rs::boost_asio::execute(
        io, policy, [] { return 42; }, [](std::exception_ptr, int) {});
}
