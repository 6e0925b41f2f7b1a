// SPDX-License-Identifier: MIT
#include "alloc_counter.hpp"
#include "catch.hpp"
#include "loopless_clock.hpp"

#include <resilience/any_clock.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/circuit_breaker.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/retry.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/task.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <array>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <vector>

namespace test_any_clock {

namespace rs = resilience;
using namespace std::chrono_literals;
using rs::testing::script;
using rs::testing::scripted_action;
using std::chrono::nanoseconds;

static_assert(rs::clock<rs::any_clock>);
static_assert(rs::detail::loop_timer_clock<rs::any_clock>);
static_assert(rs::policy<rs::retry<rs::any_clock>>);
static_assert(rs::policy<rs::timeout<rs::any_clock>>);
static_assert(rs::policy<rs::rate_limiter<rs::any_clock>>);
static_assert(rs::policy<rs::bulkhead<rs::any_clock>>);
static_assert(rs::policy<rs::circuit_breaker<rs::any_clock>>);
static_assert(std::is_convertible_v<rs::testing::virtual_clock, rs::any_clock>);
static_assert(std::is_convertible_v<rs::steady_clock, rs::any_clock>);

namespace {

const rs::constant_backoff exact_200ms{200ms, rs::jitter::none};

using resilience_tests::loopless_clock; // no loop timers to hand out

// Ticks in whole milliseconds, on virtual time: coarser than any_clock's nanoseconds.
struct millisecond_clock {
    rs::testing::virtual_clock inner;
    using duration = std::chrono::milliseconds;
    using time_point = std::chrono::time_point<millisecond_clock, duration>;
    time_point now() const {
        return time_point{std::chrono::floor<duration>(inner.now().time_since_epoch())};
    }
    auto sleep_until(time_point tp, resilience::stop_token st) const {
        return inner.sleep_until(rs::testing::virtual_clock::time_point{tp.time_since_epoch()},
                                 std::move(st));
    }
};

// Sleeps through an awaitable with operator co_await, whose awaiter answers await_suspend with a bool
// (false when the instant has already come): the other shapes an awaitable may take.
class bool_awaiter {
public:
    explicit bool_awaiter(rs::detail::sleep_awaiter inner) : inner_(std::move(inner)) {}
    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<> h) {
        if (inner_.await_ready())
            return false;
        inner_.await_suspend(h);
        return true;
    }
    void await_resume() { inner_.await_resume(); }

private:
    rs::detail::sleep_awaiter inner_;
};
struct indirect_clock {
    rs::testing::virtual_clock inner;
    using duration = nanoseconds;
    using time_point = rs::testing::virtual_clock::time_point;
    struct sleep {
        sleep(rs::testing::virtual_clock c, time_point tp, resilience::stop_token st)
            : clock(c), when(tp), token(std::move(st)) {}
        rs::testing::virtual_clock clock;
        time_point when;
        resilience::stop_token token;
        bool_awaiter operator co_await() && {
            return bool_awaiter{clock.sleep_until(when, std::move(token))};
        }
    };
    time_point now() const { return inner.now(); }
    sleep sleep_until(time_point tp, resilience::stop_token st) const {
        return sleep{inner, tp, std::move(st)};
    }
    rs::event_loop* timer_loop() const { return inner.timer_loop(); }
};

// Too large for any_clock's inline buffer, and so is each of its sleeps: both go to the heap.
struct bulky_clock {
    rs::testing::virtual_clock inner;
    int id = 0;
    std::array<std::byte, 64> padding{};
    using duration = nanoseconds;
    using time_point = rs::testing::virtual_clock::time_point;
    struct sleep {
        explicit sleep(rs::detail::sleep_awaiter inner) : inner_(std::move(inner)) {}
        bool await_ready() const noexcept { return inner_.await_ready(); }
        void await_suspend(std::coroutine_handle<> h) { inner_.await_suspend(h); }
        void await_resume() { inner_.await_resume(); }

        rs::detail::sleep_awaiter inner_;
        std::array<std::byte, 512> padding{};
    };
    time_point now() const { return inner.now(); }
    sleep sleep_until(time_point tp, resilience::stop_token st) const {
        return sleep{inner.sleep_until(tp, std::move(st))};
    }
};

// Records the instant each attempt starts and fails every attempt.
struct recording_action {
    rs::testing::simulation* sim;
    std::vector<nanoseconds>* starts;
    rs::task<int> operator()() const {
        starts->push_back(sim->now());
        throw std::runtime_error("down");
        co_return 0;
    }
};

template <class Clock>
std::vector<nanoseconds> retry_instants(rs::testing::simulation& sim, Clock clock) {
    std::vector<nanoseconds> starts;
    rs::retry r{
        {.max_attempts = 4, .backoff = rs::exponential_backoff{.initial = 200ms, .jitter = rs::jitter::none}},
        clock};
    CHECK_THROWS_AS(sim.run(r.execute(recording_action{&sim, &starts})), std::runtime_error);
    return starts;
}

struct timed_call {
    std::vector<nanoseconds> starts;
    std::vector<std::optional<nanoseconds>> deadlines;
    nanoseconds finished{};
    int value = 0;
};

// Two attempts that stall past a 1 s timeout, then one that answers in 100 ms, under
// pipeline{retry, timeout} on the clock `make_clock(sim)` gives.
template <class MakeClock>
timed_call retry_over_timeout(MakeClock make_clock) {
    rs::testing::simulation sim;
    const auto clock = make_clock(sim);
    timed_call seen;
    auto action = [&](const rs::context& ctx) -> rs::task<int> {
        seen.starts.push_back(sim.now());
        seen.deadlines.push_back(ctx.deadline());
        const nanoseconds latency = seen.starts.size() < 3 ? nanoseconds{5s} : nanoseconds{100ms};
        co_await sim.sleep_for(latency, ctx.stop_token());
        if (ctx.stop_token().stop_requested())
            throw rs::cancelled_error{};
        co_return 11;
    };
    rs::pipeline policy{rs::retry{{.max_attempts = 3, .backoff = exact_200ms}, clock},
                        rs::timeout{1s, clock}};
    seen.value = sim.run(policy.execute(action));
    seen.finished = sim.now();
    CHECK(sim.loop().timers() == 0);
    return seen;
}

} // namespace

TEST_CASE("any_clock: reads the held clock's time and hands out its loop", "[any_clock]") {
    rs::testing::simulation sim;
    rs::any_clock clock = sim.clock();
    CHECK(clock.now().time_since_epoch() == 0ns);
    sim.run([&]() -> rs::task<void> { co_await sim.sleep_for(1500ms); }());
    CHECK(clock.now().time_since_epoch() == 1500ms);
    CHECK(clock.timer_loop() == &sim.loop());
    REQUIRE(clock.target<rs::testing::virtual_clock>() != nullptr);
    CHECK(clock.target<rs::steady_clock>() == nullptr);

    rs::any_clock by_default;
    CHECK(by_default.target<rs::steady_clock>() != nullptr);

    rs::any_clock loopless = loopless_clock{sim.clock()};
    CHECK(loopless.timer_loop() == nullptr); // the signal that this clock has no loop timers
    CHECK(loopless.now().time_since_epoch() == 1500ms);
}

TEST_CASE("any_clock: sleeps end at the held clock's instants, or at once when stopped", "[any_clock]") {
    rs::testing::simulation sim;
    const rs::any_clock clock = sim.clock();
    std::vector<nanoseconds> woke;
    resilience::stop_source stop;
    // Parameters, not captures: a spawned coroutine outlives the lambda that made it.
    sim.spawn([](rs::testing::simulation& s, resilience::stop_source& source) -> rs::task<void> {
        co_await s.sleep_for(700ms);
        source.request_stop();
    }(sim, stop));
    sim.run([&]() -> rs::task<void> {
        co_await clock.sleep_until(rs::any_clock::time_point{250ms}, {});
        woke.push_back(sim.now());
        co_await clock.sleep_for(100ms, {});
        woke.push_back(sim.now());
        co_await clock.sleep_until(rs::any_clock::time_point{100ms}, {}); // already past: no wait
        woke.push_back(sim.now());
        co_await clock.sleep_for(1h, stop.get_token()); // cut short by the stop at 700 ms
        woke.push_back(sim.now());
        co_await clock.sleep_for(1h, stop.get_token()); // already stopped: no wait
        woke.push_back(sim.now());
    }());
    CHECK(woke == std::vector<nanoseconds>{250ms, 350ms, 350ms, 700ms, 700ms});
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("any_clock: a retry fires at the same instants as over the clock it holds", "[any_clock]") {
    rs::testing::simulation direct, erased, loopless;
    const auto expected = std::vector<nanoseconds>{0ms, 200ms, 600ms, 1400ms};
    CHECK(retry_instants(direct, direct.clock()) == expected);
    CHECK(retry_instants(erased, rs::any_clock{erased.clock()}) == expected);
    CHECK(retry_instants(loopless, rs::any_clock{loopless_clock{loopless.clock()}}) == expected);
    CHECK(erased.now() == direct.now());
}

TEST_CASE("any_clock: a timeout fires at the same instants as over the clock it holds", "[any_clock]") {
    const timed_call direct = retry_over_timeout([](rs::testing::simulation& sim) { return sim.clock(); });
    const timed_call erased =
        retry_over_timeout([](rs::testing::simulation& sim) { return rs::any_clock{sim.clock()}; });
    // 0-1s times out, wait 200ms; 1.2s-2.2s times out, wait 200ms; 2.4s-2.5s succeeds.
    CHECK(direct.starts == std::vector<nanoseconds>{0s, 1200ms, 2400ms});
    CHECK(direct.deadlines == std::vector<std::optional<nanoseconds>>{1s, 2200ms, 3400ms});
    CHECK(direct.finished == 2500ms);
    CHECK(erased.starts == direct.starts);
    CHECK(erased.deadlines == direct.deadlines);
    CHECK(erased.finished == direct.finished);
    CHECK(erased.value == 11);

    // The timeout alone: fires at its deadline, and a call that ends first leaves no timer.
    rs::testing::simulation sim;
    const rs::timeout limit{2s, rs::any_clock{sim.clock()}};
    scripted_action slow{sim.clock(), script<int>{.latency = 10s, .value = 1}};
    auto late = sim.run(limit.execute_outcome(slow));
    CHECK(sim.now() == 2s);
    REQUIRE(late.has_failure());
    CHECK(late.failure().code() == rs::errc::timeout);
    CHECK(slow.stopped() == 1);
    scripted_action fast{sim.clock(), script<int>{.latency = 10ms, .value = 3}};
    CHECK(sim.run(limit.execute(fast)) == 3);
    CHECK(sim.now() == 2s + 10ms);
    CHECK(sim.loop().timers() == 0);
}

namespace {
// The service of docs/core.md: not a template, yet on virtual time in tests.
class inventory_client {
public:
    explicit inventory_client(rs::any_clock clock = {})
        : policy_{rs::retry<rs::any_clock>{{.max_attempts = 3, .backoff = exact_200ms}, clock},
                  rs::timeout<rs::any_clock>{1s, clock}} {}
    template <class A>
    rs::task<int> fetch(A action) const {
        return policy_.execute(std::move(action));
    }

private:
    rs::pipeline<rs::retry<rs::any_clock>, rs::timeout<rs::any_clock>> policy_;
};
} // namespace

TEST_CASE("any_clock: a service that is not a template runs on virtual time in tests", "[any_clock]") {
    rs::testing::simulation sim;
    const inventory_client client{sim.clock()};
    scripted_action flaky{sim.clock(), script<int>{.failures = 2, .latency = 100ms, .value = 42}};
    CHECK(sim.run(client.fetch(flaky)) == 42);
    CHECK(sim.now() == 700ms); // three calls of 100 ms, two waits of 200 ms

    // The limiters sleep through it too: a token 100 ms away is granted at exactly 100 ms.
    rs::rate_limiter limiter{{.token_limit = 1, .tokens_per_second = 10, .queue_limit = rs::unbounded_queue},
                             rs::any_clock{sim.clock()}};
    sim.run([](rs::rate_limiter<rs::any_clock>& l) -> rs::task<void> {
        co_await l.take();
        co_await l.take();
    }(limiter));
    CHECK(sim.now() == 800ms);
}

TEST_CASE("any_clock: a timeout over a clock without loop timers watches beside the call", "[any_clock]") {
    // timer_loop() is null for such a clock: the timeout takes its waiting form (a sleeping watcher
    // beside the call) and still fires at the exact instant.
    rs::testing::simulation sim;
    const rs::timeout limit{1s, rs::any_clock{loopless_clock{sim.clock()}}};
    scripted_action slow{sim.clock(), script<int>{.latency = 1h, .value = 1}};
    auto result = sim.run(limit.execute_outcome(slow));
    CHECK(sim.now() == 1s);
    REQUIRE(result.has_failure());
    CHECK(result.error().code() == rs::errc::timeout);
    CHECK(slow.calls() == 1);
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("any_clock: a coarser clock is woken at its first tick at or after the instant", "[any_clock]") {
    rs::testing::simulation sim;
    const rs::any_clock clock = millisecond_clock{sim.clock()};
    sim.run([&]() -> rs::task<void> { co_await clock.sleep_until(rs::any_clock::time_point{1500us}, {}); }());
    CHECK(sim.now() == 2ms); // never before the instant asked for
    CHECK(clock.now().time_since_epoch() == 2ms);
}

TEST_CASE("any_clock: holds clocks of every awaitable shape and size", "[any_clock]") {
    rs::testing::simulation sim;
    const rs::any_clock indirect = indirect_clock{sim.clock()};
    CHECK(indirect.timer_loop() == &sim.loop());
    bulky_clock big{sim.clock()};
    big.id = 7;
    rs::any_clock bulky = big;
    std::vector<nanoseconds> woke;
    sim.run([&]() -> rs::task<void> {
        co_await indirect.sleep_for(30ms, {});
        woke.push_back(sim.now());
        co_await indirect.sleep_until(rs::any_clock::time_point{10ms}, {}); // past: await_suspend says false
        woke.push_back(sim.now());
        co_await bulky.sleep_for(20ms, {});
        woke.push_back(sim.now());
    }());
    CHECK(woke == std::vector<nanoseconds>{30ms, 30ms, 50ms});

    // Copies hold copies, in place or on the heap, and assignment swaps what is held.
    const rs::any_clock copy = bulky;
    REQUIRE(copy.target<bulky_clock>() != nullptr);
    CHECK(copy.target<bulky_clock>() != bulky.target<bulky_clock>());
    CHECK(copy.target<bulky_clock>()->id == 7);
    rs::any_clock assigned = sim.clock();
    assigned = copy;
    REQUIRE(assigned.target<bulky_clock>() != nullptr);
    CHECK(assigned.target<bulky_clock>()->id == 7);
    assigned = indirect;
    CHECK(assigned.target<bulky_clock>() == nullptr);
    CHECK(assigned.target<indirect_clock>() != nullptr);
    const rs::any_clock& self = assigned;
    assigned = self; // self-assignment keeps the clock
    CHECK(assigned.target<indirect_clock>() != nullptr);
    CHECK(assigned.now() == copy.now());
}

TEST_CASE("any_clock: over steady_clock, reads monotonic steady time and sleeps on the caller's loop",
          "[any_clock]") {
    const rs::any_clock clock = rs::steady_clock{};
    const auto before = std::chrono::steady_clock::now().time_since_epoch();
    const auto first = clock.now().time_since_epoch();
    const auto second = clock.now().time_since_epoch();
    const auto after = std::chrono::steady_clock::now().time_since_epoch();
    CHECK(before <= first);
    CHECK(first <= second);
    CHECK(second <= after);

    const auto slept = rs::sync_wait([&]() -> rs::task<nanoseconds> {
        const auto start = clock.now();
        co_await clock.sleep_for(5ms, {});
        co_return clock.now() - start;
    }());
    CHECK(slept >= 5ms);

    // A timeout over it keeps the loop timer: the deadline stops a call that listens.
    const rs::timeout limit{20ms, clock};
    const auto outcome = rs::sync_wait(limit.execute_outcome([](resilience::stop_token st) -> rs::task<int> {
        co_await rs::steady_clock{}.sleep_for(1h, st);
        if (st.stop_requested())
            throw rs::cancelled_error{};
        co_return 1;
    }));
    REQUIRE(outcome.has_failure());
    CHECK(outcome.failure().is<rs::timeout_error>());
    CHECK(rs::sync_wait(limit.execute([]() -> rs::task<int> { co_return 2; })) == 2);

    // The same usage errors as the clock it holds.
    rs::testing::simulation sim;
    CHECK_THROWS_AS(sim.run([&]() -> rs::task<void> { co_await clock.sleep_for(1ms, {}); }()),
                    std::logic_error);
    CHECK_THROWS_AS(clock.timer_loop(), std::logic_error); // no loop on this thread
}

#ifdef RESILIENCE_TESTS_COUNT_ALLOCATIONS
TEST_CASE("any_clock: sleeps and timeouts over the library's clocks allocate nothing", "[any_clock][alloc]") {
    rs::testing::simulation sim;
    const rs::any_clock clock = sim.clock();
    const rs::timeout limit{1s, clock};
    std::size_t allocations = 0;
    auto ok = []() -> rs::task<int> { co_return 1; };
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 50; ++i) { // warm the frame cache and the timer heap
            co_await clock.sleep_for(1ms, {});
            (void)co_await limit.execute(ok);
        }
        resilience_tests::counting_allocations counting;
        int sum = 0;
        for (int i = 0; i < 1000; ++i) {
            co_await clock.sleep_for(1ms, {});
            sum += co_await limit.execute(ok);
        }
        allocations = counting.count();
        CHECK(sum == 1000);
    }());
    CHECK(allocations == 0);
}
#endif

TEST_CASE("coarse_steady_clock: steady_clock's epoch, readings that never run ahead, exact timers",
          "[clock]") {
    const rs::coarse_steady_clock coarse;
    // Same epoch as steady_clock; a coarse reading is the last tick, never later than the true time.
    const auto first = coarse.now();
    const auto precise = std::chrono::steady_clock::now();
    const auto second = coarse.now();
    CHECK(first <= precise);
    CHECK(first <= second);
#if defined(__linux__)
    CHECK(rs::coarse_steady_clock::resolution() > nanoseconds{0});
    CHECK(rs::coarse_steady_clock::resolution() <= 100ms);
#endif

    // Policies run over it as over steady_clock: a timeout still stops a call that listens.
    const rs::timeout limit{20ms, coarse};
    const auto outcome = rs::sync_wait(limit.execute_outcome([](resilience::stop_token st) -> rs::task<int> {
        co_await rs::steady_clock{}.sleep_for(1h, st);
        if (st.stop_requested())
            throw rs::cancelled_error{};
        co_return 1;
    }));
    REQUIRE(outcome.has_failure());
    CHECK(outcome.failure().is<rs::timeout_error>());
    const rs::pipeline fast{rs::retry{{}, coarse},
                            rs::rate_limiter{{.token_limit = 10, .tokens_per_second = 1}, coarse},
                            rs::timeout{1s, coarse}};
    CHECK(rs::sync_wait(fast.execute([]() -> rs::task<int> { co_return 2; })) == 2);
}

} // namespace test_any_clock
