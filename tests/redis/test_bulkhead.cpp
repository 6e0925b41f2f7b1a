// SPDX-License-Identifier: MIT
// redis::bulkhead against a real redis-server: one concurrency limit across replicas, leases that come
// back when a replica dies holding them, renewal that keeps a long call's slot, and the failure modes.
// Real time: bounds with tolerance, never instants.
#include "catch.hpp"
#include "redis/support.hpp"

#include <resilience/redis.hpp>
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace redis_test_bulkhead {

namespace rs = resilience;
namespace redis = resilience::redis;
using namespace std::chrono_literals;
using resilience_tests::redis_server;
using resilience_tests::run;
using resilience_tests::together;

namespace {

// A call that lasts `length` on `clock` (or until stopped).
rs::task<int> lasting(rs::asio::clock clock, std::chrono::nanoseconds length, resilience::stop_token st) {
    auto sleeping = clock.sleep_for(length, st);
    co_await std::move(sleeping);
    co_return 1;
}

// 1 when admitted, 0 when refused by the bulkhead, -1 otherwise.
rs::task<int> call(redis::bulkhead b, std::chrono::nanoseconds length) {
    auto running = b.execute_outcome(lasting, b.clock(), length);
    rs::outcome<int> r = co_await std::move(running);
    if (r.has_value())
        co_return 1;
    co_return r.failure().code() == rs::errc::bulkhead_rejected ? 0 : -1;
}

// Tries `b` every 10 ms until admitted or `limit` passes; the time it took.
std::chrono::nanoseconds until_admitted(::asio::io_context& io, const redis::bulkhead& b,
                                        std::chrono::nanoseconds limit) {
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < limit) {
        if (run(io, call(b, 0ns)) == 1)
            return std::chrono::steady_clock::now() - start;
        std::this_thread::sleep_for(10ms); // a poll, under the limit above
    }
    return std::chrono::nanoseconds::max();
}

// Gives connection options the longest command timeout a bulkhead with a lease of `lease` accepts.
auto for_lease(std::chrono::nanoseconds lease) {
    return [lease](redis::connection_options& o) { o.command_timeout = lease / 3; };
}

redis::bulkhead_options slots(std::string key, std::size_t n, std::chrono::nanoseconds lease) {
    return {.key = std::move(key), .max_concurrent_calls = n, .lease_duration = lease};
}

} // namespace

TEST_CASE("redis bulkhead: two replicas share the slots, and a slot comes back when its call ends",
          "[redis]") {
    if (!resilience_tests::redis_tests_enabled())
        return;
    resilience_tests::local_redis fixture;
    auto& [server, io, ca, clock] = fixture;
    redis::connection cb{io.get_executor(), server.options()};
    const redis::bulkhead a{slots("shared", 2, 5s), ca};
    const redis::bulkhead b{slots("shared", 2, 5s), cb};
    std::vector<rs::task<int>> calls;
    calls.push_back(call(a, 300ms));
    calls.push_back(call(a, 300ms));
    calls.push_back([](redis::bulkhead other, rs::asio::clock b_clock) -> rs::task<int> {
        auto later = b_clock.sleep_for(100ms, {}); // both of a's calls hold their slots by now
        co_await std::move(later);
        auto refused = call(other, 0ns);
        co_return co_await std::move(refused);
    }(b, b.clock()));
    CHECK(run(io, together(std::move(calls))) == std::vector{1, 1, 0});
    CHECK(run(io, call(b, 0ns)) == 1); // released as the calls ended
    CHECK(run(io, call(b, 0ns)) == 1);
}

TEST_CASE("redis bulkhead: a replica that dies holding slots gives them back after the lease", "[redis]") {
    if (!resilience_tests::redis_tests_enabled())
        return;
    const auto lease = 300ms;
    resilience_tests::local_redis fixture{for_lease(lease)};
    std::chrono::steady_clock::time_point taken;
    std::atomic<int> running{0};
    {
        // The replica: takes both slots with calls of an hour, then its loop stops for good, as a
        // crashed process's would: no renewal, no release. Destroying it drops its connection.
        resilience_tests::replica_loop dying{fixture.server, for_lease(lease)};
        const redis::bulkhead a{slots("crash", 2, lease), dying.connection};
        for (int i = 0; i < 2; ++i) {
            auto hour = a.execute(
                [&running](rs::asio::clock clock) -> rs::task<int> {
                    ++running;
                    auto sleeping = clock.sleep_for(1h, {});
                    co_await std::move(sleeping);
                    co_return 1;
                },
                a.clock());
            rs::asio::async_run(dying.io.get_executor(), std::move(hour), [](std::exception_ptr, int) {});
        }
        const auto deadline = std::chrono::steady_clock::now() + 5s;
        while (running < 2 && std::chrono::steady_clock::now() < deadline)
            dying.io.run_for(5ms);
        REQUIRE(running == 2);
        taken = std::chrono::steady_clock::now();
    }
    ::asio::io_context& io = fixture.io;
    const redis::bulkhead b{slots("crash", 2, lease), fixture.connection};
    CHECK(run(io, call(b, 0ns)) == 0); // both slots still leased to the dead replica
    const auto waited = until_admitted(io, b, 5s);
    const auto since = std::chrono::steady_clock::now() - taken;
    INFO("admitted " << std::chrono::duration_cast<std::chrono::milliseconds>(since).count()
                     << " ms after the replica died");
    CHECK(waited < 5s);
    CHECK(since >= lease - 100ms); // not before the lease ran out (less the time it took to see it taken)
    CHECK(since < lease + 1s);
}

TEST_CASE("redis bulkhead: a call longer than its lease keeps its slot by renewing it", "[redis]") {
    if (!resilience_tests::redis_tests_enabled())
        return;
    const auto lease = 150ms;
    resilience_tests::local_redis fixture{for_lease(lease)};
    std::atomic<bool> holding{false};
    std::atomic<bool> done{false};
    // The long call, for four leases, on a loop of its own on another thread.
    std::jthread replica([&fixture, &holding, &done, lease] {
        resilience_tests::replica_loop loop{fixture.server, for_lease(lease)};
        const redis::bulkhead a{slots("renewed", 1, lease), loop.connection};
        auto long_call = [](redis::bulkhead b, std::atomic<bool>& held) -> rs::task<int> {
            auto running = b.execute_outcome(
                [&held](rs::asio::clock clock) -> rs::task<int> {
                    held = true;
                    auto sleeping = clock.sleep_for(600ms, {});
                    co_await std::move(sleeping);
                    co_return 1;
                },
                b.clock());
            rs::outcome<int> r = co_await std::move(running);
            co_return r.has_value() ? 1 : 0;
        };
        CHECK(run(loop.io, long_call(a, holding)) == 1);
        done = true;
    });
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (!holding && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(5ms); // a poll, under the deadline
    REQUIRE(holding);
    ::asio::io_context& io = fixture.io;
    const redis::bulkhead b{slots("renewed", 1, lease), fixture.connection};
    int refused = 0;
    int admitted_early = 0;
    while (!done) {
        const int r = run(io, call(b, 0ns));
        // An admission while the long call still ran means its lease lapsed; one in the instant
        // between the call's end and `done` is not.
        if (r == 1 && !done)
            ++admitted_early;
        refused += r == 0 ? 1 : 0;
        std::this_thread::sleep_for(20ms); // a poll, bounded by the long call
    }
    CHECK(refused >= 10); // about 600 ms of polls, four leases long
    CHECK(admitted_early == 0);
    CHECK(run(io, call(b, 0ns)) == 1); // released at its end
}

TEST_CASE("redis bulkhead: Redis killed: each failure mode as configured, reported once", "[redis]") {
    if (!resilience_tests::redis_tests_enabled())
        return;
    resilience_tests::local_redis fixture;
    // Named, not bound: clang 14 does not let a lambda capture a structured binding.
    redis_server& server = fixture.server;
    ::asio::io_context& io = fixture.io;
    const redis::connection& c = fixture.connection;
    std::vector<std::string> lost;
    const auto make = [&](redis::unavailable_policy mode) {
        return redis::bulkhead{{.key = "outage",
                                .max_concurrent_calls = 4,
                                .lease_duration = 1s,
                                .when_unavailable = mode,
                                .local_share = 0.5,
                                .telemetry =
                                    [&](const rs::telemetry_event& e) {
                                        if (e.kind == rs::telemetry_kind::backend_lost)
                                            lost.emplace_back(e.note);
                                    }},
                               c};
    };
    const redis::bulkhead closed = make(redis::unavailable_policy::fail_closed);
    const redis::bulkhead open = make(redis::unavailable_policy::fail_open);
    const redis::bulkhead local = make(redis::unavailable_policy::local_share);
    CHECK(run(io, call(closed, 0ns)) == 1);
    CHECK(run(io, call(open, 0ns)) == 1);
    CHECK(run(io, call(local, 0ns)) == 1);
    server.kill();
    const auto start = std::chrono::steady_clock::now();
    const auto three = [&](const redis::bulkhead& b) {
        std::vector<rs::task<int>> calls;
        for (int i = 0; i < 3; ++i)
            calls.push_back(call(b, 50ms));
        return run(io, together(std::move(calls)));
    };
    CHECK(three(closed) == std::vector{0, 0, 0});
    CHECK(three(open) == std::vector{1, 1, 1});
    CHECK(three(local) == std::vector{1, 1, 0}); // half of 4 slots, locally
    CHECK(std::chrono::steady_clock::now() - start < 2s);
    CHECK(lost == std::vector<std::string>{"fail_closed", "fail_open", "local_share"});
}

TEST_CASE(
    "redis bulkhead: an acquisition whose caller stopped gives its slot back at once, not after the lease",
    "[redis]") {
    if (!resilience_tests::redis_tests_enabled())
        return;
    resilience_tests::local_redis fixture{[](redis::connection_options& o) { o.command_timeout = 10s; }};
    // Named, not bound: clang 14 does not let a lambda capture a structured binding.
    redis_server& server = fixture.server;
    ::asio::io_context& io = fixture.io;
    const redis::connection& c = fixture.connection;
    const redis::bulkhead b{slots("stopped", 1, 1h), c};
    CHECK(run(io, call(b, 0ns)) == 1); // connected, the script loaded: the next call is one EVALSHA
    // The server is frozen, so the acquisition is sent but not answered before its caller stops.
    server.freeze();
    resilience::stop_source stop;
    ::asio::steady_timer timer{io, 50ms};
    timer.async_wait([&stop](const std::error_code&) { stop.request_stop(); });
    std::optional<bool> cancelled;
    auto stopped = [](redis::bulkhead bh, resilience::stop_token st) -> rs::task<bool> {
        auto running = bh.execute_outcome(lasting, bh.clock(), 0ns, st);
        rs::outcome<int> r = co_await std::move(running);
        co_return !r.has_value() && r.failure().code() == rs::errc::cancelled;
    };
    rs::asio::async_run(io.get_executor(), stopped(b, stop.get_token()), [&](std::exception_ptr, bool v) {
        cancelled = v;
        server.thaw(); // the acquisition runs now, taking the slot; then whatever followed it
    });
    io.restart();
    io.run_for(5s); // until the acquisition and what followed it are answered
    const redis::reply held = run(io, c.command({"ZCARD", "stopped"}));
    REQUIRE(cancelled.has_value());
    CHECK(*cancelled);
    CHECK(held.integer == 0); // with a lease of an hour: only the release can have freed it
    CHECK(run(io, call(b, 0ns)) == 1);
}

namespace {

// Once a call of 1.2 s holds a slot of `b` (100 ms in), restarts the server (every lease is gone) or
// deletes the key (the lease is gone while Redis answers); then every 50 ms reads `redis_up()` and
// makes a short call through `b`. What `redis_up()` read each time.
rs::task<std::vector<bool>> lease_lost(redis::bulkhead b, redis_server& server, redis::connection c,
                                       bool restart) {
    auto holding = b.clock().sleep_for(100ms, {});
    co_await std::move(holding);
    if (restart) {
        server.kill();
        server.start(); // blocks the loop meanwhile: no command is sent to a server that is down
    } else {
        auto deleting = c.command({"DEL", b.options().key});
        const redis::reply deleted = co_await std::move(deleting);
        CHECK(deleted.integer == 1);
    }
    std::vector<bool> up;
    for (int i = 0; i < 20; ++i) { // 1 s: five renewal periods after the lease is gone
        auto pause = b.clock().sleep_for(50ms, {});
        co_await std::move(pause);
        up.push_back(b.redis_up());
        auto short_call = call(b, 0ns);
        CHECK(co_await std::move(short_call) == 1);
    }
    co_return up;
}

} // namespace

TEST_CASE("redis bulkhead: a lease found gone is no outage: lost and restored reported once each, redis_up() "
          "true while Redis answers",
          "[redis][regression]") {
    if (!resilience_tests::redis_tests_enabled())
        return;
    resilience_tests::local_redis fixture; // command_timeout 200 ms: a lease of 600 ms, renewed every 200 ms
    // Named, not bound: clang 14 does not let a lambda capture a structured binding.
    redis_server& server = fixture.server;
    ::asio::io_context& io = fixture.io;
    const redis::connection& c = fixture.connection;
    std::vector<std::string> events;
    auto o = slots("lease-lost", 4, 600ms);
    o.when_unavailable = redis::unavailable_policy::fail_open;
    o.telemetry = [&events](const rs::telemetry_event& e) {
        if (e.kind == rs::telemetry_kind::backend_lost || e.kind == rs::telemetry_kind::backend_restored)
            events.emplace_back(rs::to_string(e.kind));
    };
    const redis::bulkhead b{o, c};
    // A renewal that found its lease gone reported backend_lost although Redis had answered it, and
    // the next call Redis answered reported backend_restored: a pair of events and redis_up() false
    // for a while at every renewal (every 200 ms here) for as long as the call ran.
    SECTION("the server restarted") {
        auto [long_call, up] = run(io, rs::when_all(call(b, 1200ms), lease_lost(b, server, c, true)));
        CHECK(long_call == 1); // the call goes on without its lease
        // The restart is an outage (the connection broke), seen by the first command after it.
        CHECK(events == std::vector<std::string>{"backend_lost", "backend_restored"});
        INFO("redis_up() every 50 ms: " << ::Catch::Detail::stringify(up));
        CHECK(std::count(up.begin(), up.end(), false) <= 2);
        const auto back = std::find(std::find(up.begin(), up.end(), false), up.end(), true);
        CHECK(std::all_of(back, up.end(), [](bool u) { return u; }));
    }
    SECTION("the key was deleted while Redis answers") {
        auto [long_call, up] = run(io, rs::when_all(call(b, 1200ms), lease_lost(b, server, c, false)));
        CHECK(long_call == 1);
        CHECK(events.empty());
        INFO("redis_up() every 50 ms: " << ::Catch::Detail::stringify(up));
        CHECK(std::all_of(up.begin(), up.end(), [](bool u) { return u; }));
    }
    CHECK(b.redis_up());
}

TEST_CASE("redis bulkhead and rate_limiter: bad options are refused naming the field", "[redis]") {
    ::asio::io_context io;
    redis::connection c{io.get_executor()};
    CHECK_THROWS_AS(redis::bulkhead({.key = ""}, c), std::invalid_argument);
    CHECK_THROWS_AS(redis::bulkhead({.key = "k", .max_concurrent_calls = 0}, c), std::invalid_argument);
    CHECK_THROWS_AS(redis::bulkhead({.key = "k", .lease_duration = 1ms}, c), std::invalid_argument);
    // A lease must outlive a renewal that timed out: at least 3 x the connection's command_timeout.
    REQUIRE(c.options().command_timeout == 250ms);
    CHECK_THROWS_AS(redis::bulkhead({.key = "k", .lease_duration = 749ms}, c), std::invalid_argument);
    CHECK(redis::bulkhead({.key = "k", .lease_duration = 750ms}, c).options().lease_duration == 750ms);
    CHECK_THROWS_AS(
        redis::bulkhead({.key = "k", .when_unavailable = redis::unavailable_policy::local_share}, c),
        std::invalid_argument);
    CHECK_THROWS_AS(redis::rate_limiter({.key = "k", .token_limit = 1, .tokens_per_second = 0}, c),
                    std::invalid_argument);
    // A named policy signs its messages with its name, as every policy does.
    CHECK_THROWS_WITH(redis::bulkhead({.name = "db", .key = "k", .max_concurrent_calls = 0}, c),
                      "resilience::redis::bulkhead (db): max_concurrent_calls must be positive, got 0");
    CHECK_THROWS_WITH(
        redis::rate_limiter({.name = "api", .key = "k", .token_limit = 0, .tokens_per_second = 1}, c),
        "resilience::redis::rate_limiter (api): token_limit must be positive, got 0");
}

} // namespace redis_test_bulkhead
