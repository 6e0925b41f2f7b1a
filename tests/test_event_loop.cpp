// SPDX-License-Identifier: MIT
#include "catch.hpp"
#include "support.hpp"

#include <resilience/clock.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/when_all.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <stop_token>
#include <thread>
#include <vector>

namespace rs = resilience;
using namespace std::chrono_literals;

TEST_CASE("event_loop: run returns the awaitable's value and rethrows its exception", "[event_loop]") {
    rs::event_loop loop;
    CHECK(loop.run([]() -> rs::task<int> { co_return 42; }()) == 42);
    auto fails = []() -> rs::task<int> {
        throw std::out_of_range("x");
        co_return 0; // a coroutine: the exception travels through the task and the loop
    };
    auto t = fails(); // created outside the check: only awaiting it may throw
    CHECK_THROWS_AS(loop.run(std::move(t)), std::out_of_range);
}

TEST_CASE("event_loop: current() names the loop only while it runs", "[event_loop]") {
    rs::event_loop loop;
    CHECK(rs::event_loop::current() == nullptr);
    rs::event_loop* seen = nullptr;
    loop.run([&]() -> rs::task<void> {
        seen = rs::event_loop::current();
        co_return;
    }());
    CHECK(seen == &loop);
    CHECK(rs::event_loop::current() == nullptr);
}

TEST_CASE("event_loop: work posted from another thread runs on the loop's thread",
          "[event_loop][concurrency]") {
    rs::event_loop loop;
    std::thread::id loop_thread, resumed_on;
    struct resume_from_other_thread {
        rs::event_loop* loop;
        std::thread* worker;
        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<> h) {
            *worker = std::thread([l = loop, h] { l->post(h); });
        }
        void await_resume() const noexcept {}
    };
    std::thread worker;
    loop.run([&]() -> rs::task<void> {
        loop_thread = std::this_thread::get_id();
        co_await resume_from_other_thread{&loop, &worker};
        resumed_on = std::this_thread::get_id();
    }());
    worker.join();
    CHECK(resumed_on == loop_thread);
}

TEST_CASE("event_loop: an exception escaping a spawned coroutine is rethrown by run", "[event_loop]") {
    rs::event_loop loop;
    loop.spawn([]() -> rs::task<void> {
        throw std::runtime_error("spawned");
        co_return;
    }());
    CHECK_THROWS_WITH(loop.run(), "spawned");
    // The loop is usable again afterwards.
    CHECK(loop.run([]() -> rs::task<int> { co_return 1; }()) == 1);
}

TEST_CASE("event_loop: timers due at the same instant fire in the order they were armed", "[event_loop]") {
    rs::testing::simulation sim;
    std::vector<int> order;
    auto sleeper = [&](int id, std::chrono::milliseconds d) -> rs::task<void> {
        co_await sim.sleep_for(d);
        order.push_back(id);
    };
    sim.run(rs::when_all(sleeper(1, 20ms), sleeper(2, 10ms), sleeper(3, 20ms), sleeper(4, 10ms)));
    CHECK(order == std::vector<int>{2, 4, 1, 3});
    CHECK(sim.now() == 20ms);
}

TEST_CASE("event_loop: a virtual-time loop reports a coroutine that can never resume", "[event_loop]") {
    rs::testing::simulation sim;
    struct forever {
        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<>) const noexcept {}
        void await_resume() const noexcept {}
    };
    CHECK_THROWS_AS(sim.run([]() -> rs::task<void> { co_await forever{}; }()), std::logic_error);
}

TEST_CASE("clock: a sleep stopped from another thread ends early and resumes on its own loop",
          "[clock][concurrency]") {
    rs::event_loop loop;
    std::stop_source stop;
    std::thread::id loop_thread, resumed_on;
    std::thread stopper;
    const auto started = std::chrono::steady_clock::now();
    loop.run([&]() -> rs::task<void> {
        loop_thread = std::this_thread::get_id();
        stopper = std::thread([&] { stop.request_stop(); });
        co_await rs::steady_clock{}.sleep_for(1h, stop.get_token());
        resumed_on = std::this_thread::get_id();
    }());
    stopper.join();
    CHECK(resumed_on == loop_thread);
    CHECK(std::chrono::steady_clock::now() - started < 1h); // it did not sleep the hour
}

TEST_CASE("clock: the steady clock refuses to sleep outside a loop or on virtual time", "[clock]") {
    rs::testing::simulation sim;
    auto nap = []() -> rs::task<void> { co_await rs::steady_clock{}.sleep_for(1ms, {}); };
    CHECK_THROWS_AS(sim.run(nap()), std::logic_error);
}

TEST_CASE("clock: a sleep whose instant has passed completes without suspending", "[clock]") {
    rs::testing::simulation sim;
    sim.run([&]() -> rs::task<void> {
        co_await sim.sleep_for(5s);
        auto c = sim.clock();
        co_await c.sleep_until(c.now() - 1s, {});
    }());
    CHECK(sim.now() == 5s);
}

TEST_CASE("event_loop: a spawned coroutine that ends on another thread wakes its loop",
          "[event_loop][concurrency]") {
    // Nothing is posted back to the loop: the coroutine simply finishes on the worker thread, and run()
    // must notice that the last spawned coroutine is done instead of sleeping forever. The worker gives
    // the loop time to go to sleep first, so a lost wake-up shows as a hang (caught by the test timeout);
    // nothing depends on that timing when the loop is right.
    resilience_tests::foreign_thread worker{std::chrono::milliseconds(20)};
    auto work = [&]() -> rs::task<int> {
        co_await worker.resume_here();
        co_return 5;
    };
    CHECK(rs::sync_wait(work()) == 5);
}

TEST_CASE("clock: a sleep destroyed while its timer is armed takes the timer out of the heap", "[clock]") {
    rs::testing::simulation timers; // owns the heap the sleep's timer goes into
    {
        rs::testing::simulation runner;
        auto clock = timers.clock();
        auto sleeper = [clock]() -> rs::task<void> { co_await clock.sleep_for(1s, {}); };
        runner.spawn(sleeper());
        CHECK_THROWS_AS(runner.run_all(), std::logic_error); // nothing in `runner` can make progress
        CHECK(timers.loop().timers() == 1);
    } // the sleeping coroutine is destroyed with `runner`
    CHECK(timers.loop().timers() == 0);
    timers.run_all(); // nothing left to fire
    CHECK(timers.now() == 0s);
}
