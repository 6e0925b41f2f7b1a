// SPDX-License-Identifier: MIT
// The Asio integration: policies on an io_context with the Asio clock, and async_run from Asio code.
// Built only when standalone Asio is found. Real time, but nothing here asserts how long anything took:
// run_for only bounds a broken test instead of letting it hang.
#include "catch.hpp"

#include "asio_flavour.hpp"
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

namespace test_asio {

namespace rs = resilience;
using namespace std::chrono_literals;

static_assert(rs::clock<rsa::clock>);

TEST_CASE("asio: a sleep on the Asio clock resumes in the io_context and ends early when stopped", "[asio]") {
    net::io_context io;
    rsa::clock clock{io.get_executor()};
    resilience::stop_source stop;
    bool woke = false;
    std::thread::id io_thread, resumed_on;
    auto sleeper = [&]() -> rs::task<void> {
        co_await clock.sleep_for(1h, stop.get_token());
        woke = true;
        resumed_on = std::this_thread::get_id();
    };
    rsa::async_run(io.get_executor(), sleeper(), [](std::exception_ptr) {});
    std::thread stopper([&] { stop.request_stop(); });
    io_thread = std::this_thread::get_id();
    io.run_for(10s);
    stopper.join();
    CHECK(woke);
    CHECK(resumed_on == io_thread);
}

TEST_CASE("asio: async_run completes a callback with the value or the exception", "[asio]") {
    net::io_context io;
    int value = 0;
    std::exception_ptr error;
    rsa::async_run(
        io.get_executor(), []() -> rs::task<int> { co_return 5; }(),
        [&](std::exception_ptr e, int v) {
            error = e;
            value = v;
        });
    io.run_for(10s);
    CHECK(value == 5);
    CHECK(error == nullptr);

    io.restart();
    rsa::async_run(
        io.get_executor(),
        []() -> rs::task<int> {
            throw std::runtime_error("down");
            co_return 0; // a coroutine: the exception travels through the task
        }(),
        [&](std::exception_ptr e, int) { error = e; });
    io.run_for(10s);
    REQUIRE(error != nullptr);
    CHECK_THROWS_WITH(std::rethrow_exception(error), "down");
}

TEST_CASE("asio: a pipeline on the Asio clock recovers from a stalled and a failed attempt", "[asio]") {
    net::io_context io;
    rsa::clock clock{io.get_executor()};
    rs::pipeline policy{rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms}}, clock},
                        rs::timeout{20ms, clock}};
    int calls = 0;
    auto dependency = [&](resilience::stop_token st) -> rs::task<int> {
        ++calls;
        if (calls == 1) { // stalls until the timeout stops it
            co_await clock.sleep_for(1h, st);
            throw rs::cancelled_error{};
        }
        if (calls == 2)
            throw std::runtime_error("503");
        co_return 42;
    };
    int result = 0;
    rsa::async_run(io.get_executor(), policy.execute(dependency),
                   [&](std::exception_ptr, int v) { result = v; });
    io.run_for(10s);
    CHECK(result == 42);
    CHECK(calls == 3);
}

#if defined(                                                                                                 \
    RESILIENCE_TEST_HAS_CO_AWAIT) // net::awaitable: Asio enables it for g++, not for clang 14 with libstdc++
TEST_CASE("asio: with use_awaitable a failure is rethrown in the Asio coroutine", "[asio]") {
    net::io_context io;
    rsa::clock clock{io.get_executor()};
    rs::timeout limit{5ms, clock};
    auto stalls = [&](resilience::stop_token st) -> rs::task<void> {
        co_await clock.sleep_for(1h, st);
        throw rs::cancelled_error{};
    };
    bool timed_out = false;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            auto call = limit.execute(stalls);
            try {
                co_await rsa::async_run(io.get_executor(), std::move(call), net::use_awaitable);
            } catch (const rs::timeout_error&) {
                timed_out = true;
            }
        },
        net::detached);
    io.run_for(10s);
    CHECK(timed_out);
}

#endif

TEST_CASE("asio: use_task awaits an Asio operation inside a resilience coroutine", "[asio]") {
    net::io_context io;
    net::steady_timer timer{io, std::chrono::steady_clock::now() + 1h};
    net_error_code seen;
    auto waits = [&]() -> rs::task<void> {
        auto [ec] = co_await timer.async_wait(rsa::use_task);
        seen = ec;
    };
    rsa::async_run(io.get_executor(), waits(), [](std::exception_ptr) {});
    net::post(io, [&] { timer.cancel(); });
    io.run_for(10s);
    CHECK(seen == net::error::operation_aborted);
}

TEST_CASE("asio: sleeps on a two-thread io_context all end when stopped from a third thread",
          "[asio][concurrency]") {
    net::io_context io;
    auto guard = net::make_work_guard(io);
    rsa::clock clock{io.get_executor()};
    resilience::stop_source stop;
    std::atomic<int> woke{0};
    constexpr int sleepers = 200;
    auto sleeper = [&]() -> rs::task<void> {
        co_await clock.sleep_for(1h, stop.get_token());
        woke.fetch_add(1);
    };
    std::atomic<int> finished{0};
    for (int i = 0; i < sleepers; ++i)
        rsa::async_run(io.get_executor(), sleeper(), [&](std::exception_ptr) { finished.fetch_add(1); });
    std::thread a([&] { io.run_for(10s); }), b([&] { io.run_for(10s); });
    std::thread stopper([&] { stop.request_stop(); }); // races with the sleeps still starting
    stopper.join();
    while (finished.load() < sleepers && !io.stopped())
        std::this_thread::yield();
    guard.reset();
    io.stop();
    a.join();
    b.join();
    CHECK(woke.load() == sleepers);
    CHECK(finished.load() == sleepers);
}

TEST_CASE("asio: an exception thrown by the completion handler comes out of io_context::run", "[asio]") {
    net::io_context io;
    rsa::async_run(
        io.get_executor(), []() -> rs::task<int> { co_return 1; }(),
        [](std::exception_ptr, int) { throw std::runtime_error("from the handler"); });
    CHECK_THROWS_WITH(io.run(), "from the handler");
}

TEST_CASE("asio: run() keeps going while the awaitable waits on something outside Asio",
          "[asio][concurrency]") {
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 8}};
    resilience::stop_source release;
    std::atomic<bool> holding{false};
    // Another part of the program, on its own event loop, holds the only slot until told to let go.
    std::thread other([&] {
        auto hold = [&]() -> rs::task<void> {
            holding = true;
            co_await rs::steady_clock{}.sleep_for(1h, release.get_token());
        };
        rs::sync_wait(bh.execute(hold));
    });
    while (!holding)
        std::this_thread::yield();
    net::io_context io;
    int completed = 0;
    std::thread::id handler_thread;
    rsa::async_run(io.get_executor(), bh.execute([]() -> rs::task<int> { co_return 42; }),
                   [&](std::exception_ptr, int v) {
                       completed = v;
                       handler_thread = std::this_thread::get_id();
                   });
    std::thread releaser([&] { release.request_stop(); });
    io.run(); // returns only once the handler has run: the operation holds work on the io_context
    releaser.join();
    other.join();
    CHECK(completed == 42);
    CHECK(handler_thread == std::this_thread::get_id()); // delivered in the io_context, not on `other`
}

} // namespace test_asio
