// SPDX-License-Identifier: MIT
// What every Redis test uses: a private redis-server (server_process.hpp), the rule for a machine
// without one, an io_context with a connection to the server (the test's own, or a replica's), and
// running coroutines on an io_context.
#pragma once

#include "catch.hpp"
#include "redis/server_process.hpp"

#include <resilience/asio.hpp>
#include <resilience/redis.hpp>
#include <resilience/task.hpp>
#include <resilience/when_all.hpp>

#include <asio/io_context.hpp>

#include <concepts>
#include <cstdlib>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace resilience_tests {

/// True when the tests may run; false (after a warning) when they are to be skipped: no binary and
/// RESILIENCE_NO_INSTALL=1. A missing binary otherwise fails the test.
inline bool redis_tests_enabled() {
    if (!redis_server_binary().empty())
        return true;
    const char* no_install = std::getenv("RESILIENCE_NO_INSTALL");
    if (no_install && std::string{no_install} == "1") {
        WARN("skipped: redis-server is not on PATH and RESILIENCE_NO_INSTALL=1 (apt-get install "
             "redis-server)");
        return false;
    }
    FAIL("redis-server is not on PATH: install it (apt-get install redis-server; scripts/dev test does), "
         "or set RESILIENCE_NO_INSTALL=1 to skip the Redis tests");
    return false;
}

/// `server`'s connection options (`redis_server::options`) as `adjust` changes them.
template <std::invocable<resilience::redis::connection_options&> Adjust>
resilience::redis::connection_options options_of(const redis_server& server, Adjust adjust) {
    resilience::redis::connection_options o = server.options();
    adjust(o);
    return o;
}

/// What most tests start with: a private server, an io_context, a connection to the server on it and
/// the Asio clock of that io_context. Members in that order, for a structured binding.
struct local_redis {
    local_redis() = default;
    /// The same, with the connection's options changed by `adjust` (a longer command timeout, another
    /// reconnect backoff): `local_redis fixture{[](connection_options& o) { o.command_timeout = 10s; }};`
    template <std::invocable<resilience::redis::connection_options&> Adjust>
    explicit local_redis(Adjust adjust)
        : server{}, io{}, connection{io.get_executor(), options_of(server, std::move(adjust))} {}

    redis_server server;
    ::asio::io_context io;
    resilience::redis::connection connection{io.get_executor(), server.options()};
    resilience::asio::clock clock{io.get_executor()};
};

/// A replica of the service under test: an io_context of its own and a connection on it to `server`,
/// with the options `adjust` gives. Its loop is run on another thread, or stopped for good as a
/// crashed process's would be.
struct replica_loop {
    template <std::invocable<resilience::redis::connection_options&> Adjust>
    replica_loop(const redis_server& server, Adjust adjust)
        : io{}, connection{io.get_executor(), options_of(server, std::move(adjust))} {}

    ::asio::io_context io;
    resilience::redis::connection connection;
};

/// Runs `t` on `io` as an async_run operation, runs `io` until nothing is left, and returns the value
/// (or rethrows). `io` is restarted first, so it may be run again.
template <class T>
T run(::asio::io_context& io, resilience::task<T> t) {
    std::optional<T> value;
    std::exception_ptr error;
    resilience::asio::async_run(io.get_executor(), std::move(t), [&](std::exception_ptr e, T v) {
        error = e;
        if (!e)
            value.emplace(std::move(v));
    });
    io.restart();
    io.run();
    if (error)
        std::rethrow_exception(error);
    if (!value)
        throw std::logic_error("the io_context ran out of work before the task finished");
    return std::move(*value);
}

/// The calls awaited together, their results in order.
template <class T>
resilience::task<std::vector<T>> together(std::vector<resilience::task<T>> calls) {
    auto all = resilience::when_all(std::move(calls));
    co_return co_await std::move(all);
}

} // namespace resilience_tests
