// SPDX-License-Identifier: MIT
// redis::connection against a real redis-server: replies, pipelining, the per-command timeout, stop
// tokens, and reconnection after the server dies. Real time: bounds are asserted, never instants.
#include "catch.hpp"
#include "redis/support.hpp"

#include <resilience/redis.hpp>
#include <resilience/stop_token.hpp>

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include <chrono>
#include <set>
#include <string>
#include <vector>

namespace redis_test_connection {

namespace rs = resilience;
namespace redis = resilience::redis;
using namespace std::chrono_literals;
using resilience_tests::redis_server;
using resilience_tests::run;

namespace {

// The error code of what `t` throws, or an empty code when it returns.
rs::task<std::error_code> code_of(rs::task<redis::reply> t) {
    try {
        co_await std::move(t);
    } catch (const std::system_error& e) {
        co_return e.code();
    }
    co_return std::error_code{};
}

// PINGs until one is answered (for at most 5 s); the time that took.
std::chrono::nanoseconds until_answered(::asio::io_context& io, const redis::connection& c) {
    const auto start = std::chrono::steady_clock::now();
    while (run(io, code_of(c.command({"PING"}))) && std::chrono::steady_clock::now() - start < 5s) {
    }
    return std::chrono::steady_clock::now() - start;
}

rs::task<long long> incr_many(redis::connection c, int n, std::vector<long long>& seen) {
    std::vector<rs::task<redis::reply>> calls;
    for (int i = 0; i < n; ++i)
        calls.push_back(c.command({"INCR", "counter"}));
    auto all = rs::when_all(std::move(calls));
    std::vector<redis::reply> replies = co_await std::move(all);
    for (const auto& r : replies)
        seen.push_back(r.integer);
    co_return static_cast<long long>(replies.size());
}

} // namespace

TEST_CASE("redis connection: replies of every kind, an error reply returned as a reply", "[redis]") {
    if (!resilience_tests::redis_tests_enabled())
        return;
    resilience_tests::local_redis fixture;
    auto& [server, io, c, clock] = fixture;
    CHECK(run(io, c.command({"SET", "k", "v"})).type == redis::reply::kind::status);
    const redis::reply got = run(io, c.command({"GET", "k"}));
    CHECK(got.type == redis::reply::kind::string);
    CHECK(got.str == "v");
    CHECK(run(io, c.command({"GET", "absent"})).type == redis::reply::kind::nil);
    INFO("eval");
    const redis::reply list = run(io, c.command({"EVAL", "return {1, 'two', {3}}", "0"}));
    REQUIRE(list.type == redis::reply::kind::array);
    REQUIRE(list.elements.size() == 3);
    CHECK(list.elements[0].integer == 1);
    CHECK(list.elements[1].str == "two");
    CHECK(list.elements[2].elements.at(0).integer == 3);
    INFO("error reply");
    const redis::reply bad = run(io, c.command({"NOSUCHCOMMAND"}));
    CHECK(bad.is_error());
    CHECK(run(io, c.command({"PING"})).str == "PONG"); // the connection goes on after an error reply
}

TEST_CASE("redis connection: pipelined commands get their own replies, in order", "[redis]") {
    if (!resilience_tests::redis_tests_enabled())
        return;
    resilience_tests::local_redis fixture;
    auto& [server, io, c, clock] = fixture;
    std::vector<long long> seen;
    CHECK(run(io, incr_many(c, 200, seen)) == 200);
    // Sent together, the 200 INCRs were in flight at once; each caller got its own reply, in order.
    REQUIRE(seen.size() == 200);
    for (std::size_t i = 0; i < seen.size(); ++i)
        CHECK(seen[i] == static_cast<long long>(i + 1));
    CHECK(c.in_flight() == 0);
}

TEST_CASE("redis connection: a frozen server fails the command with a timeout, then the connection backs off",
          "[redis]") {
    if (!resilience_tests::redis_tests_enabled())
        return;
    resilience_tests::local_redis fixture;
    auto& [server, io, c, clock] = fixture;
    CHECK(run(io, c.command({"PING"})).str == "PONG");
    server.freeze();
    const auto start = std::chrono::steady_clock::now();
    CHECK(run(io, code_of(c.command({"INCR", "x"}))) == redis::errc::timeout);
    const auto took = std::chrono::steady_clock::now() - start;
    CHECK(took >= 200ms);
    CHECK(took < 2s); // the timeout, not the frozen server, ended it
    // Backing off: the next command fails at once, without waiting for anything.
    CHECK(run(io, code_of(c.command({"PING"}))) == redis::errc::unavailable);
    CHECK(c.reconnect_in() > 0ns);
    server.thaw();
    // Within one backoff (250 ms here; the rest is a margin for a loaded machine) the connection is back.
    CHECK(until_answered(io, c) < 1s);
}

TEST_CASE("redis connection: a frozen server that still accepts connections makes the backoff grow",
          "[redis]") {
    if (!resilience_tests::redis_tests_enabled())
        return;
    resilience_tests::local_redis fixture{[](redis::connection_options& o) {
        o.command_timeout = 100ms;
        o.reconnect = rs::exponential_backoff{50ms, 4.0, 5s, rs::jitter::none};
    }};
    auto& [server, io, c, clock] = fixture;
    CHECK(run(io, c.command({"PING"})).str == "PONG");
    server.freeze();
    // Each cycle: the backoff ends, a new connect succeeds (the kernel accepts for the frozen
    // server), the command times out. The server never answered, so the backoff goes on growing:
    // 50 ms, 200 ms, 800 ms; were a connect enough to end the outage, it would stay at 50 ms.
    std::vector<std::chrono::nanoseconds> waits;
    for (int cycle = 0; cycle < 3; ++cycle) {
        ::asio::steady_timer backoff{io, c.reconnect_in()};
        backoff.async_wait([](const std::error_code&) {});
        io.restart();
        io.run();
        CHECK(run(io, code_of(c.command({"PING"}))) == redis::errc::timeout);
        waits.push_back(c.reconnect_in());
    }
    server.thaw();
    INFO("backoffs " << waits[0].count() << "ns, " << waits[1].count() << "ns, " << waits[2].count() << "ns");
    CHECK(waits[0] <= 50ms);
    CHECK(waits[1] > 100ms);
    CHECK(waits[1] <= 200ms);
    CHECK(waits[2] > 400ms);
    // Once the server answers, the outage is over: the next timeout backs off from the first step.
    CHECK(until_answered(io, c) < 2s);
    server.freeze();
    CHECK(run(io, code_of(c.command({"PING"}))) == redis::errc::timeout);
    CHECK(c.reconnect_in() <= 50ms);
    server.thaw();
}

TEST_CASE(
    "redis connection: a killed server fails commands in flight, and the restarted one is reached again",
    "[redis]") {
    if (!resilience_tests::redis_tests_enabled())
        return;
    resilience_tests::local_redis fixture;
    auto& [server, io, c, clock] = fixture;
    CHECK(run(io, c.command({"PING"})).str == "PONG");
    server.kill();
    const std::error_code lost = run(io, code_of(c.command({"PING"})));
    INFO(lost.message());
    CHECK((lost == redis::errc::connection_lost || lost == redis::errc::unavailable));
    CHECK(run(io, code_of(c.command({"PING"}))) == redis::errc::unavailable); // refused, then backing off
    server.start();
    CHECK(until_answered(io, c) < 1s);
}

TEST_CASE("redis connection: a stop ends the caller's wait at once with cancelled_error", "[redis]") {
    if (!resilience_tests::redis_tests_enabled())
        return;
    resilience_tests::local_redis fixture{[](redis::connection_options& o) { o.command_timeout = 10s; }};
    // Named, not bound: clang 14 does not let a lambda capture a structured binding.
    redis_server& server = fixture.server;
    ::asio::io_context& io = fixture.io;
    redis::connection& c = fixture.connection;
    CHECK(run(io, c.command({"PING"})).str == "PONG");
    server.freeze();
    resilience::stop_source stop;
    ::asio::steady_timer timer{io, 50ms};
    timer.async_wait([&](const std::error_code&) { stop.request_stop(); });
    const auto start = std::chrono::steady_clock::now();
    auto blocked = [](redis::connection conn, resilience::stop_token st) -> rs::task<bool> {
        try {
            auto sent = conn.command({"PING"}, st);
            co_await std::move(sent);
        } catch (const rs::cancelled_error&) {
            co_return true;
        }
        co_return false;
    };
    bool cancelled = false;
    rs::asio::async_run(io.get_executor(), blocked(c, stop.get_token()), [&](std::exception_ptr, bool v) {
        cancelled = v;
        c.close(); // the command itself is still queued on the frozen server: drop it, so run() returns
    });
    io.restart();
    io.run_for(5s);
    CHECK(cancelled);
    CHECK(std::chrono::steady_clock::now() - start < 2s);
    server.thaw();
}

TEST_CASE("redis connection: bad options are refused naming the field", "[redis]") {
    ::asio::io_context io;
    CHECK_THROWS_AS(redis::connection(io.get_executor(), {.host = ""}), std::invalid_argument);
    CHECK_THROWS_AS(redis::connection(io.get_executor(), {.port = 0}), std::invalid_argument);
    CHECK_THROWS_AS(redis::connection(io.get_executor(), {.command_timeout = 0ns}), std::invalid_argument);
    CHECK(redis::connection_options::from_url("redis://10.1.2.3:7000").port == 7000);
    CHECK(redis::connection_options::from_url("redis://10.1.2.3:7000").host == "10.1.2.3");
    CHECK_THROWS_AS(redis::connection_options::from_url("redis://h:99999"), std::invalid_argument);
}

TEST_CASE("redis connection: from_url reads host and port, and refuses what it would not honour", "[redis]") {
    using redis::connection_options;
    CHECK(connection_options::from_url("cache").host == "cache");
    CHECK(connection_options::from_url("cache").port == 6379);
    CHECK(connection_options::from_url("redis://cache:7000/").port == 7000);
    CHECK(connection_options::from_url("redis://cache:7000/0").host == "cache");
    INFO("IPv6 in brackets: the brackets are not part of the address");
    CHECK(connection_options::from_url("redis://[::1]:7000").host == "::1");
    CHECK(connection_options::from_url("redis://[::1]:7000").port == 7000);
    CHECK(connection_options::from_url("redis://[::1]").host == "::1");
    CHECK(connection_options::from_url("redis://[::1]").port == 6379);
    CHECK_THROWS_AS(connection_options::from_url("redis://[::1"), std::invalid_argument);
    CHECK_THROWS_AS(connection_options::from_url("redis://[::1]x"), std::invalid_argument);
    INFO("a database other than 0, a user or a password: refused, not dropped");
    CHECK_THROWS_AS(connection_options::from_url("redis://cache:6379/2"), std::invalid_argument);
    CHECK_THROWS_AS(connection_options::from_url("redis://:secret@cache:6379"), std::invalid_argument);
    CHECK_THROWS_AS(connection_options::from_url("redis://user:secret@cache"), std::invalid_argument);
    CHECK_THROWS_AS(connection_options::from_url("redis://cache:"), std::invalid_argument);
    // The password is not repeated in the error.
    try {
        (void)connection_options::from_url("redis://:secret@cache");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string{e.what()}.find("secret") == std::string::npos);
    }
}

} // namespace redis_test_connection
