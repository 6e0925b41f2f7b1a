// SPDX-License-Identifier: MIT
// async_scope on the embedded loop, on virtual time: spawn, request_stop reaching every kind of wait,
// join resuming at the instant the last call ends, and the endings where the scope or the loop goes
// first (run under the asan preset, these also show that nothing leaks or is touched after it is freed).
#include "catch.hpp"

#include <resilience/async_scope.hpp>
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace test_async_scope {

namespace rs = resilience;
using namespace std::chrono_literals;
using std::chrono::nanoseconds;

namespace {

// Lives in a waiting call's frame; owns a heap block, so a leaked frame is a leak LeakSanitizer sees.
struct tracked {
    static inline int live = 0;
    std::unique_ptr<std::string> payload = std::make_unique<std::string>(64, 'x');
    tracked() { ++live; }
    tracked(const tracked&) = delete;
    tracked& operator=(const tracked&) = delete;
    ~tracked() { --live; }
};

// What became of the calls of a test.
struct tally {
    int succeeded = 0;
    int failed = 0;
    std::vector<nanoseconds> ended_at;
};

} // namespace

TEST_CASE("async_scope: join resumes at the instant the last call ends", "[async_scope]") {
    rs::testing::simulation sim;
    rs::async_scope scope;
    tally t;
    // Coroutine lambdas named here, since spawn keeps the task and not the lambda.
    auto sleeper = [&](nanoseconds d) -> rs::task<void> {
        co_await sim.sleep_for(d);
        ++t.succeeded;
        t.ended_at.push_back(sim.now());
    };
    for (nanoseconds d : {30ms, 10ms, 20ms})
        scope.spawn(sim.loop(), sleeper(d));
    CHECK(scope.size() == 3); // counted from spawn, before they start
    std::optional<nanoseconds> joined;
    auto joiner = [&]() -> rs::task<void> {
        co_await scope.join();
        joined = sim.now();
    };
    sim.spawn(joiner());
    sim.run_all();
    CHECK(t.succeeded == 3);
    REQUIRE(joined);
    CHECK(*joined == 30ms);
    CHECK(scope.size() == 0);
}

TEST_CASE("async_scope: join with no call in the scope completes at once", "[async_scope]") {
    rs::testing::simulation sim;
    rs::async_scope scope;
    bool joined = false;
    sim.run([&]() -> rs::task<void> {
        co_await scope.join();
        joined = true;
    }());
    CHECK(joined);
    CHECK(sim.now() == 0ns);
}

TEST_CASE("async_scope: request_stop ends calls wherever they wait, and join resumes then", "[async_scope]") {
    rs::testing::simulation sim;
    auto clock = sim.clock();
    REQUIRE(tracked::live == 0);
    rs::retry backing_off{
        {.max_attempts = 5, .backoff = rs::constant_backoff{1h, rs::jitter::none}, .max_delay = 1h}, clock};
    rs::hedge hedging{{.max_attempts = 2, .delay = 1h}, clock};
    rs::bulkhead slots{{.max_concurrent_calls = 1, .queue_limit = 10}, clock};
    rs::rate_limiter tokens{{.token_limit = 1, .tokens_per_second = 1.0 / 3600, .queue_limit = 10}, clock};
    rs::timeout long_wait{1h, clock};
    rs::async_scope scope;
    tally t;
    // Each call records how and when it ended; the failures of stopped calls are expected here.
    auto spawn = [&](auto run) {
        scope.spawn(sim.loop(), [&t, &sim, run](resilience::stop_token st) -> rs::task<void> {
            tracked owned;
            try {
                co_await run(st);
                ++t.succeeded;
            } catch (const std::exception& e) {
                ++t.failed;
                UNSCOPED_INFO("failed at " << sim.now().count() << ": " << e.what());
            }
            t.ended_at.push_back(sim.now());
        });
    };
    auto fails = []() -> rs::task<int> {
        throw std::runtime_error("503");
        co_return 0;
    };
    auto slow = [&sim](resilience::stop_token st) -> rs::task<int> {
        co_await sim.sleep_for(2h, st);
        if (st.stop_requested())
            throw rs::cancelled_error{};
        co_return 1;
    };
    // A retry's backoff sleep.
    spawn([&](resilience::stop_token st) { return backing_off.execute(fails, st); });
    // A hedge's delay (the first attempt is slow and stoppable).
    spawn([&](resilience::stop_token st) { return hedging.execute(slow, st); });
    // A bulkhead slot's holder, and three calls in its queue.
    for (int i = 0; i < 4; ++i)
        spawn([&](resilience::stop_token st) { return slots.execute(slow, st); });
    // A rate limiter's only token spent, and two calls in its queue.
    for (int i = 0; i < 3; ++i)
        spawn([&](resilience::stop_token st) { return tokens.execute(slow, st); });
    // A timeout's deadline over a slow attempt.
    spawn([&](resilience::stop_token st) { return long_wait.execute(slow, st); });

    std::optional<nanoseconds> joined;
    auto drain = [&]() -> rs::task<void> {
        co_await sim.sleep_for(5min);
        CHECK(scope.size() == 10);
        CHECK(tracked::live == 10);
        CHECK(slots.queued() == 3);
        scope.request_stop();
        co_await scope.join();
        joined = sim.now();
    };
    sim.spawn(drain());
    sim.run_all();
    CHECK(t.succeeded + t.failed == 10);
    CHECK(t.succeeded == 0);
    REQUIRE(joined);
    CHECK(*joined == 5min);
    for (auto at : t.ended_at)
        CHECK(at == 5min);
    CHECK(tracked::live == 0);
    CHECK(scope.size() == 0);
    CHECK(scope.stop_requested());
}

TEST_CASE("async_scope: a call spawned after request_stop starts with its token stopped", "[async_scope]") {
    rs::testing::simulation sim;
    rs::async_scope scope;
    scope.request_stop();
    bool saw_stop = false;
    scope.spawn(sim.loop(), [&](resilience::stop_token st) -> rs::task<void> {
        saw_stop = st.stop_requested();
        co_return;
    });
    sim.run_all();
    CHECK(saw_stop);
}

TEST_CASE("async_scope: destroying the scope first stops its calls, which end on their own",
          "[async_scope]") {
    rs::testing::simulation sim;
    REQUIRE(tracked::live == 0);
    int ended = 0;
    {
        rs::async_scope scope;
        for (int i = 0; i < 3; ++i)
            scope.spawn(sim.loop(), [&](resilience::stop_token st) -> rs::task<void> {
                tracked owned;
                co_await sim.sleep_for(1h, st);
                ++ended;
            });
        sim.run_for(1s);
        CHECK(tracked::live == 3);
    } // the calls keep what they share with the scope; they were stopped
    sim.run_all();
    CHECK(ended == 3);
    CHECK(sim.now() == 1s);
    CHECK(tracked::live == 0);
}

TEST_CASE("async_scope: a loop destroyed with calls unfinished takes them out of the scope",
          "[async_scope]") {
    REQUIRE(tracked::live == 0);
    rs::async_scope scope;
    std::optional<rs::testing::simulation> sim_holder{std::in_place};
    auto& sim = *sim_holder;
    // Declared before the loop goes: what the calls share outlives them here (that a call keeps its
    // bulkhead alive by itself is the handles' own contract, tested with them).
    rs::bulkhead slots{{.max_concurrent_calls = 1, .queue_limit = 10}, sim.clock()};
    {
        for (int i = 0; i < 3; ++i)
            scope.spawn(sim.loop(), [&](resilience::stop_token st) -> rs::task<void> {
                co_await slots.execute(
                    [&]() -> rs::task<void> {
                        tracked owned;
                        co_await sim.sleep_for(1h);
                    },
                    st);
            });
        // Not started yet, and destroyed unstarted with the loop.
        scope.spawn(sim.loop(), [](resilience::stop_token) -> rs::task<void> { co_return; });
        sim.run_for(1s);
        CHECK(tracked::live == 1);
        CHECK(scope.size() == 3);
        scope.spawn(sim.loop(), [](resilience::stop_token) -> rs::task<void> { co_return; });
        CHECK(scope.size() == 4);
        sim_holder.reset();
    }
    CHECK(tracked::live == 0);
    CHECK(scope.size() == 0);
}

TEST_CASE("async_scope: a joiner destroyed while it waits leaves the scope's queue", "[async_scope]") {
    rs::async_scope scope;
    std::optional<rs::testing::simulation> other;
    other.emplace();
    bool joined = false;
    rs::testing::simulation sim;
    scope.spawn(sim.loop(),
                [&](resilience::stop_token st) -> rs::task<void> { co_await sim.sleep_for(1h, st); });
    auto joiner = [&]() -> rs::task<void> {
        co_await scope.join();
        joined = true;
    };
    other->spawn(joiner());
    other->run_for(1s);
    other.reset(); // destroys the joiner, suspended in join()
    scope.request_stop();
    sim.run_all(); // the last call ends: no joiner to wake
    CHECK_FALSE(joined);
    CHECK(scope.size() == 0);
}

TEST_CASE("async_scope: nest counts an awaitable from its making, started or not", "[async_scope]") {
    rs::testing::simulation sim;
    rs::async_scope scope;
    {
        auto unstarted = scope.nest([]() -> rs::task<int> { co_return 1; }());
        CHECK(scope.size() == 1);
    }
    CHECK(scope.size() == 0);
    auto nested = scope.nest([](resilience::stop_token) -> rs::task<int> { co_return 7; });
    CHECK(scope.size() == 1);
    CHECK(sim.run(std::move(nested)) == 7);
    CHECK(scope.size() == 0);
}

TEST_CASE("async_scope: a spawned call's failure comes out of the loop's run", "[async_scope]") {
    rs::testing::simulation sim;
    rs::async_scope scope;
    scope.spawn(sim.loop(), [](resilience::stop_token) -> rs::task<void> {
        throw std::runtime_error("boom");
        co_return;
    });
    CHECK_THROWS_WITH(sim.run_all(), "boom");
    CHECK(scope.size() == 0);
}

} // namespace test_async_scope
