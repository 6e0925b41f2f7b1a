// SPDX-License-Identifier: MIT
// Must not compile: an action of rs::asio::execute (standalone Asio) returns a Boost.Asio awaitable.
// expect: rs::asio::execute: the action returns an awaitable of another Asio
#define ASIO_STANDALONE 1
#include <resilience/asio.hpp>
#include <resilience/boost_asio.hpp>
#include <resilience/resilience.hpp>

#include <asio/io_context.hpp>
#include <boost/asio/awaitable.hpp>

namespace rs = resilience;

boost::asio::awaitable<int> fetch();

void call(asio::io_context& io, const rs::retry<>& policy) {
    rs::asio::execute(
        io, policy, [] { return fetch(); }, [](std::exception_ptr, int) {});
}
