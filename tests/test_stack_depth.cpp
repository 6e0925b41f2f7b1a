// SPDX-License-Identifier: MIT
// Work that completes at once never grows the stack, whether or not the compiler turns symmetric
// transfer into a tail call: g++ without optimisation (a Debug build) does not, and a loop of a million
// awaits that each complete during their start used to nest one resume per iteration and overflow the
// default 8 MB stack. CI runs these tests in a g++ -O0 build (tests/CMakeLists.txt:
// resilience_debug_tests), where they fail without the guard in detail/inline_start.hpp.
//
// Where POSIX threads exist, each case runs on a thread with a 512 KiB stack, and 10^5 iterations are
// enough: a resume nested per iteration costs at least a return address and a frame pointer (16 bytes),
// 1.6 MB in all. Elsewhere a case runs on the calling thread, whose stack is 8 MB or less, with 10^6.
#include "catch.hpp"

#include <resilience/async_generator.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/circuit_breaker.hpp>
#include <resilience/fallback.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/retry.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/task.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>
#include <resilience/when_all.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <stdexcept>
#include <tuple>

#if __has_include(<pthread.h>)
#include <pthread.h>
#define TEST_STACK_DEPTH_SMALL_STACK 1
#else
#define TEST_STACK_DEPTH_SMALL_STACK 0
#endif

namespace test_stack_depth {

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

#if TEST_STACK_DEPTH_SMALL_STACK
constexpr std::size_t stack_bytes = 512 * 1024;
constexpr long iterations = 100'000; // 1.6 MB at 16 bytes an iteration
#else
constexpr long iterations = 1'000'000; // 16 MB
#endif

// Runs `f` on a thread with a stack of `stack_bytes` where POSIX threads exist (the calling thread waits,
// so Catch2's assertions are never made from two threads at once), and rethrows what it threw.
template <class F>
void on_small_stack(F&& f) {
#if TEST_STACK_DEPTH_SMALL_STACK
    struct job {
        F* f;
        std::exception_ptr error;
    } j{&f, nullptr};
    pthread_attr_t attr;
    REQUIRE(pthread_attr_init(&attr) == 0);
    REQUIRE(pthread_attr_setstacksize(&attr, stack_bytes) == 0);
    pthread_t thread;
    const int made = pthread_create(
        &thread, &attr,
        [](void* p) -> void* {
            auto* jp = static_cast<job*>(p);
            try {
                (*jp->f)();
            } catch (...) {
                jp->error = std::current_exception();
            }
            return nullptr;
        },
        &j);
    pthread_attr_destroy(&attr);
    REQUIRE(made == 0);
    pthread_join(thread, nullptr);
    if (j.error)
        std::rethrow_exception(j.error);
#else
    f();
#endif
}

rs::task<int> one() {
    co_return 1;
}

rs::task<int> fails() {
    throw std::runtime_error("refused below");
    co_return 0;
}

struct immediate_awaiter {
    bool await_ready() const noexcept { return true; }
    void await_suspend(std::coroutine_handle<>) const noexcept {}
    int await_resume() const noexcept { return 1; }
};

} // namespace

TEST_CASE("stack depth: a loop of tasks that finish at once", "[stack_depth]") {
    on_small_stack([&] {
        auto loop = []() -> rs::task<long> {
            long sum = 0;
            for (long i = 0; i < iterations; ++i)
                sum += co_await one();
            co_return sum;
        };
        rs::testing::simulation sim;
        CHECK(sim.run(loop()) == iterations);
    });
}

TEST_CASE("stack depth: a loop of nested tasks that each await another finishing at once", "[stack_depth]") {
    on_small_stack([&] {
        auto middle = []() -> rs::task<int> { co_return co_await one() + co_await one(); };
        auto loop = [&]() -> rs::task<long> {
            long sum = 0;
            for (long i = 0; i < iterations / 2; ++i)
                sum += co_await middle();
            co_return sum;
        };
        rs::testing::simulation sim;
        CHECK(sim.run(loop()) == iterations);
    });
}

TEST_CASE("stack depth: a loop of calls through a policy and a pipeline", "[stack_depth]") {
    on_small_stack([&] {
        rs::testing::simulation sim;
        rs::retry r{{.max_attempts = 3, .backoff = rs::constant_backoff{0ms}}, sim.clock()};
        rs::pipeline p{rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{0ms}}, sim.clock()},
                       rs::circuit_breaker{{.failure_threshold = 5}, sim.clock()},
                       rs::timeout{1s, sim.clock()}, rs::bulkhead{{.max_concurrent_calls = 4}, sim.clock()}};
        auto loop = [&]() -> rs::task<long> {
            long sum = 0;
            for (long i = 0; i < iterations; ++i) {
                sum += co_await r.execute(one);
                sum += co_await p.execute(one);
                sum += co_await p.execute([] { return immediate_awaiter{}; });
            }
            co_return sum;
        };
        CHECK(sim.run(loop()) == 3 * iterations);
        CHECK(sim.now() == 0ms);
    });
}

TEST_CASE("stack depth: a loop of calls refused at once by a bulkhead and a rate limiter and a breaker",
          "[stack_depth]") {
    on_small_stack([&] {
        rs::testing::simulation sim;
        rs::bulkhead full{{.max_concurrent_calls = 1}, sim.clock()};
        rs::rate_limiter empty{{.token_limit = 1, .tokens_per_second = 1e-3}, sim.clock()};
        rs::circuit_breaker open{{.failure_threshold = 1, .break_duration = 1h}, sim.clock()};

        auto hold = [&]() -> rs::task<int> {
            co_await sim.clock().sleep_until(sim.clock().now() + 1s, {});
            co_return 1;
        };
        sim.spawn(full.execute(hold)); // holds the bulkhead's one slot for a second
        auto loop = [&]() -> rs::task<void> {
            static_cast<void>(
                co_await empty.execute_outcome(one)); // spends the bucket's token, if it has one
            CHECK((co_await open.execute_outcome(fails)).has_failure()); // opens the breaker
            long bulkhead_refused = 0, limiter_refused = 0, breaker_refused = 0;
            for (long i = 0; i < iterations; ++i) {
                bulkhead_refused += (co_await full.execute_outcome(one)).has_failure();
                limiter_refused += (co_await empty.execute_outcome(one)).has_failure();
                breaker_refused += (co_await open.execute_outcome(one)).has_failure();
            }
            CHECK(bulkhead_refused == iterations);
            CHECK(limiter_refused == iterations);
            CHECK(breaker_refused == iterations);
            CHECK(sim.now() == 0ms);
        };
        sim.spawn(loop());
        sim.run_all();
        CHECK(sim.now() == 1s);
    });
}

TEST_CASE("stack depth: a loop of calls refused at once inside a pipeline with a fallback", "[stack_depth]") {
    on_small_stack([&] {
        rs::testing::simulation sim;
        rs::circuit_breaker open{{.failure_threshold = 1, .break_duration = 1h}, sim.clock()};
        rs::pipeline p{rs::fallback{2}, open, rs::timeout{1s, sim.clock()}};
        auto loop = [&]() -> rs::task<long> {
            long sum = co_await p.execute(fails); // opens the breaker; the fallback answers
            for (long i = 0; i < iterations; ++i)
                sum += co_await p.execute(one);
            co_return sum;
        };
        CHECK(sim.run(loop()) == 2 * (iterations + 1));
    });
}

TEST_CASE("stack depth: a loop of when_all over children that finish at once", "[stack_depth]") {
    on_small_stack([&] {
        auto loop = []() -> rs::task<long> {
            long sum = 0;
            for (long i = 0; i < iterations / 2; ++i) {
                auto [a, b] = co_await rs::when_all(one(), one());
                sum += a + b;
            }
            co_return sum;
        };
        rs::testing::simulation sim;
        CHECK(sim.run(loop()) == iterations);
    });
}

TEST_CASE("stack depth: a generator that yields item after item at once and one that forwards them",
          "[stack_depth]") {
    on_small_stack([&] {
        auto count = []() -> rs::async_generator<int> {
            for (long i = 0; i < iterations; ++i)
                co_yield 1;
        };
        auto forward = [](rs::async_generator<int> in) -> rs::async_generator<int> {
            while (auto v = co_await in.next())
                co_yield *v;
        };
        auto consume = [&]() -> rs::task<long> {
            long sum = 0;
            auto gen = forward(count());
            while (auto v = co_await gen.next())
                sum += *v;
            co_return sum;
        };
        rs::testing::simulation sim;
        CHECK(sim.run(consume()) == iterations);
    });
}

} // namespace test_stack_depth
