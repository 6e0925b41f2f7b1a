// SPDX-License-Identifier: MIT
// Tests of reconfiguring the limits while calls run: `bulkhead` (a fixed limit and an adaptive one),
// `rate_limiter` and `sliding_window_limiter`. What carries over, on virtual time with exact times;
// options refused, with the old ones still in force; calls in flight finishing under the options
// they started with; and threads calling while another thread reconfigures.

#include "catch.hpp"
#include "support.hpp"

#include <resilience/adaptive_limit.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/testing/simulation.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <latch>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace test_reconfigure_limits {

namespace rs = resilience;
using namespace std::chrono_literals;
using std::chrono::nanoseconds;
using vclock = rs::testing::virtual_clock;
using Catch::Matchers::Contains;
using resilience_tests::invalid_argument_message;

namespace {

struct overloaded : std::runtime_error {
    overloaded() : std::runtime_error("overloaded") {}
};

// How a call ended: "value", "rejected" (a bulkhead's or a limiter's refusal), "cancelled" or
// "failure"; for a refusal, also its reason and the name of the policy that made it.
struct ending {
    nanoseconds at{-1};
    std::string what;
    std::string detail{};
    nanoseconds retry_after{-1};
    bool operator==(const ending&) const = default;
};

template <class T>
ending ending_of(const rs::outcome<T>& r, nanoseconds now) {
    if (r.has_value())
        return {now, "value"};
    if (auto* e = r.error().template as<rs::bulkhead_rejected_error>())
        return {now, "rejected", std::string(rs::to_string(e->reason())) + " by " + e->policy_name()};
    if (auto* e = r.error().template as<rs::rate_limited_error>())
        return {now, "rejected", std::string(rs::to_string(e->reason())) + " by " + e->policy_name(),
                e->retry_after()};
    if (rs::is_cancellation(r.error()))
        return {now, "cancelled"};
    return {now, "failure"};
}

ending value_at(nanoseconds at) {
    return {at, "value"};
}
ending refused_at(nanoseconds at, std::string detail, nanoseconds retry_after = nanoseconds{-1}) {
    return {at, "rejected", std::move(detail), retry_after};
}

// When each call's action started, and how each call ended, by call id.
struct journal {
    std::map<int, nanoseconds> started;
    std::map<int, ending> ended;
};

// Arrives at `arrive`, then runs an action through `policy` that holds on for `hold` and then returns,
// or throws `overloaded` when `fails`. `policy` is a copy: a handle.
template <class Policy>
rs::task<void> call(rs::testing::simulation& sim, Policy policy, journal& j, int id, nanoseconds arrive,
                    nanoseconds hold = 0ns, bool fails = false) {
    if (arrive > sim.now())
        co_await sim.sleep_for(arrive - sim.now());
    // Named, then passed as an lvalue: see test_bulkhead.cpp (a GCC 12 coroutine bug).
    auto action = [&sim, &j, id, hold, fails]() -> rs::task<int> {
        j.started[id] = sim.now();
        if (hold > 0ns)
            co_await sim.sleep_for(hold);
        if (fails)
            throw overloaded{};
        co_return id;
    };
    auto r = co_await policy.execute_outcome(action);
    j.ended[id] = ending_of(r, sim.now());
}

// Reconfigures `policy` (a copy: a handle) with `options` at the instant `at`.
template <class Policy, class Options>
rs::task<void> reconfigure_at(rs::testing::simulation& sim, Policy policy, nanoseconds at, Options options) {
    co_await sim.sleep_for(at - sim.now());
    policy.reconfigure(std::move(options));
}

// Counts the refusals an `on_rejected` is told of.
auto counting(std::shared_ptr<int> n) {
    return [n = std::move(n)](const rs::rejection_event&) { ++*n; };
}

} // namespace

// ---------------------------------------------------------------------------------------------------------
// bulkhead, fixed limit

TEST_CASE("bulkhead reconfigure: a smaller limit evicts nobody and admits nobody new until the calls in "
          "flight are under it",
          "[bulkhead][reconfigure]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 3, .queue_limit = 10}, sim.clock()};
    journal j;
    sim.spawn(call(sim, bh, j, 1, 0ms, 100ms));
    sim.spawn(call(sim, bh, j, 2, 0ms, 200ms));
    sim.spawn(call(sim, bh, j, 3, 0ms, 300ms));
    sim.spawn(
        reconfigure_at(sim, bh, 10ms, rs::bulkhead_options{.max_concurrent_calls = 1, .queue_limit = 10}));
    sim.spawn(call(sim, bh, j, 4, 20ms, 10ms));
    sim.run_until(15ms);
    CHECK(bh.limit() == 1);
    CHECK(bh.in_flight() == 3); // nobody evicted
    sim.run_until(250ms);
    CHECK(bh.in_flight() == 1); // call 3, at the new limit: call 4 still waits
    CHECK(bh.queued() == 1);
    sim.run_all();
    CHECK(j.ended[1] == value_at(100ms));
    CHECK(j.ended[2] == value_at(200ms));
    CHECK(j.ended[3] == value_at(300ms));
    CHECK(j.started[4] == 300ms);
    CHECK(j.ended[4] == value_at(310ms));
    CHECK(bh.options().max_concurrent_calls == 1);
}

TEST_CASE("bulkhead reconfigure: a larger limit admits queued waiters at once, oldest first, up to it",
          "[bulkhead][reconfigure]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 10}, sim.clock()};
    journal j;
    sim.spawn(call(sim, bh, j, 1, 0ms, 100ms));
    sim.spawn(call(sim, bh, j, 2, 1ms, 100ms));
    sim.spawn(call(sim, bh, j, 3, 2ms, 100ms));
    sim.spawn(call(sim, bh, j, 4, 3ms, 100ms));
    sim.spawn(
        reconfigure_at(sim, bh, 10ms, rs::bulkhead_options{.max_concurrent_calls = 3, .queue_limit = 10}));
    sim.run_until(10ms);
    CHECK(bh.in_flight() == 3);
    CHECK(bh.queued() == 1);
    sim.run_all();
    CHECK(j.started[2] == 10ms);
    CHECK(j.started[3] == 10ms);
    CHECK(j.started[4] == 100ms); // the slot call 1 gives back
    CHECK(bh.limit() == 3);
}

TEST_CASE("bulkhead reconfigure: a smaller queue limit turns no queued caller away, and refuses newcomers "
          "until the queue is under it",
          "[bulkhead][reconfigure]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.name = "db", .max_concurrent_calls = 1, .queue_limit = 3}, sim.clock()};
    journal j;
    sim.spawn(call(sim, bh, j, 1, 0ms, 100ms));
    for (int id = 2; id <= 4; ++id)
        sim.spawn(call(sim, bh, j, id, nanoseconds{std::chrono::milliseconds{id - 1}}, 100ms));
    sim.spawn(reconfigure_at(
        sim, bh, 10ms, rs::bulkhead_options{.name = "db", .max_concurrent_calls = 1, .queue_limit = 1}));
    sim.spawn(call(sim, bh, j, 5, 20ms, 10ms));  // queue 3 >= 1
    sim.spawn(call(sim, bh, j, 6, 150ms, 10ms)); // queue 2 >= 1
    sim.spawn(call(sim, bh, j, 7, 250ms, 10ms)); // queue 1 >= 1
    sim.spawn(call(sim, bh, j, 8, 350ms, 10ms)); // queue empty: waits
    sim.spawn(reconfigure_at(
        sim, bh, 360ms, rs::bulkhead_options{.name = "db", .max_concurrent_calls = 1, .queue_limit = 0}));
    sim.spawn(call(sim, bh, j, 9, 370ms, 10ms)); // call 8 still queued; now queue_limit 0
    sim.run_all();
    CHECK(j.started[2] == 100ms);
    CHECK(j.started[3] == 200ms);
    CHECK(j.started[4] == 300ms);
    CHECK(j.ended[5] == refused_at(20ms, "queue_full by db"));
    CHECK(j.ended[6] == refused_at(150ms, "queue_full by db"));
    CHECK(j.ended[7] == refused_at(250ms, "queue_full by db"));
    CHECK(j.started[8] == 400ms);
    CHECK(j.ended[9] == refused_at(370ms, "no_capacity by db"));
}

TEST_CASE("bulkhead reconfigure: a queue timeout applies to callers queued after the change, those queued "
          "before keep theirs",
          "[bulkhead][reconfigure]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 10, .queue_timeout = 50ms}, sim.clock()};
    journal j;
    sim.spawn(call(sim, bh, j, 1, 0ms, 200ms));
    sim.spawn(call(sim, bh, j, 2, 10ms)); // deadline 60 ms
    sim.spawn(reconfigure_at(
        sim, bh, 20ms,
        rs::bulkhead_options{.max_concurrent_calls = 1, .queue_limit = 10, .queue_timeout = 100ms}));
    sim.spawn(call(sim, bh, j, 3, 30ms)); // deadline 130 ms
    sim.spawn(
        reconfigure_at(sim, bh, 135ms, rs::bulkhead_options{.max_concurrent_calls = 1, .queue_limit = 10}));
    sim.spawn(call(sim, bh, j, 4, 140ms)); // no deadline
    sim.run_all();
    CHECK(j.ended[2] == refused_at(60ms, "queue_timeout by "));
    CHECK(j.ended[3] == refused_at(130ms, "queue_timeout by "));
    CHECK(j.started[4] == 200ms);
    CHECK(j.ended[4] == value_at(200ms));
}

TEST_CASE("bulkhead reconfigure: invalid options are refused naming the field and the value, and the old "
          "ones stay in force",
          "[bulkhead][reconfigure]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.name = "db", .max_concurrent_calls = 2}, sim.clock()};
    CHECK_THAT(invalid_argument_message([&] { bh.reconfigure({.name = "db", .max_concurrent_calls = 0}); }),
               Contains("db") && Contains("max_concurrent_calls must be positive, got 0"));
    CHECK_THAT(invalid_argument_message([&] {
                   bh.reconfigure({.max_concurrent_calls = 5, .queue_limit = 3, .queue_timeout = -5ms});
               }),
               Contains("queue_timeout must be positive, got -5000000ns"));
    CHECK_THAT(invalid_argument_message([&] {
                   bh.reconfigure({.max_concurrent_calls = 5, .adapt = rs::aimd{.min = 6, .max = 3}});
               }),
               Contains("adapt.max must be at least adapt.min (6), got 3"));
    CHECK_THAT(invalid_argument_message([&] {
                   bh.reconfigure({.max_concurrent_calls = 50, .adapt = rs::aimd{.min = 1, .max = 10}});
               }),
               Contains("max_concurrent_calls, the starting limit") && Contains("got 50"));
    CHECK(bh.options().name == "db");
    CHECK(bh.options().max_concurrent_calls == 2);
    CHECK(bh.limit() == 2);
    // By behaviour: two calls at once, the third refused at once (no queue, no adaptation).
    journal j;
    for (int id = 1; id <= 3; ++id)
        sim.spawn(call(sim, bh, j, id, 0ms, 100ms, true));
    sim.run_all();
    CHECK(j.started.size() == 2);
    CHECK(j.ended[3] == refused_at(0ms, "no_capacity by db"));
    CHECK(bh.limit() == 2); // the failures moved no limit
}

TEST_CASE("bulkhead reconfigure: a call queued before the change ends under its own options: name, "
          "on_rejected, queue timeout",
          "[bulkhead][reconfigure]") {
    rs::testing::simulation sim;
    auto old_told = std::make_shared<int>(0), new_told = std::make_shared<int>(0);
    rs::bulkhead bh{{.name = "old",
                     .max_concurrent_calls = 1,
                     .queue_limit = 10,
                     .queue_timeout = 50ms,
                     .on_rejected = counting(old_told)},
                    sim.clock()};
    journal j;
    sim.spawn(call(sim, bh, j, 1, 0ms, 200ms));
    sim.spawn(call(sim, bh, j, 2, 10ms));
    sim.spawn(reconfigure_at(sim, bh, 20ms,
                             rs::bulkhead_options{.name = "new",
                                                  .max_concurrent_calls = 1,
                                                  .queue_limit = 10,
                                                  .queue_timeout = 500ms,
                                                  .on_rejected = counting(new_told)}));
    sim.spawn(call(sim, bh, j, 3, 30ms));
    sim.run_all();
    CHECK(j.ended[2] == refused_at(60ms, "queue_timeout by old"));
    CHECK(*old_told == 1);
    CHECK(*new_told == 0);
    CHECK(j.started[3] == 200ms);
    CHECK(bh.name() == "new");
}

TEST_CASE("bulkhead reconfigure: the options returned by options() stay valid after a reconfiguration",
          "[bulkhead][reconfigure]") {
    rs::bulkhead bh{{.name = "first", .max_concurrent_calls = 2}};
    const rs::bulkhead_options& before = bh.options();
    for (std::size_t n = 1; n <= 20; ++n)
        bh.reconfigure({.name = "n" + std::to_string(n), .max_concurrent_calls = n});
    CHECK(before.name == "first"); // replaced blocks are kept while the bulkhead lives
    CHECK(bh.name() == "n20");
    CHECK(bh.limit() == 20);
}

// ---------------------------------------------------------------------------------------------------------
// bulkhead, adaptive limit

TEST_CASE("adaptive limit reconfigure: the current limit carries over, clamped into the new bounds - the "
          "algorithm's parameters apply to the next samples",
          "[bulkhead][adaptive][reconfigure]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{
        {.max_concurrent_calls = 8, .queue_limit = 100, .adapt = rs::aimd{.max = 10, .decrease = 0.5}},
        sim.clock()};
    journal j;
    sim.run(call(sim, bh, j, 1, 0ms, 1ms, true)); // one failure: 8 * 0.5
    REQUIRE(bh.limit() == 4);

    bh.reconfigure({.max_concurrent_calls = 5, .queue_limit = 100, .adapt = rs::aimd{.min = 5, .max = 10}});
    CHECK(bh.limit() == 5); // clamped up
    bh.reconfigure(
        {.max_concurrent_calls = 3, .queue_limit = 100, .adapt = rs::aimd{.max = 3, .decrease = 0.5}});
    CHECK(bh.limit() == 3); // clamped down
    bh.reconfigure(
        {.max_concurrent_calls = 2, .queue_limit = 100, .adapt = rs::aimd{.max = 10, .decrease = 0.5}});
    CHECK(bh.limit() == 3); // carried over: the starting limit does not reset it

    // The new decrease judges the next sample.
    bh.reconfigure(
        {.max_concurrent_calls = 2, .queue_limit = 100, .adapt = rs::aimd{.max = 10, .decrease = 0.34}});
    sim.run(call(sim, bh, j, 2, sim.now(), 1ms, true));
    CHECK(bh.limit() == 1); // floor(3 * 0.34)

    // Another algorithm starts from the current limit, clamped into its bounds.
    bh.reconfigure(
        {.max_concurrent_calls = 7, .queue_limit = 100, .adapt = rs::gradient{.min = 2, .max = 10}});
    CHECK(bh.limit() == 2);
    // Off: the fixed limit. On again: from max_concurrent_calls, as at construction.
    bh.reconfigure({.max_concurrent_calls = 6, .queue_limit = 100});
    CHECK(bh.limit() == 6);
    bh.reconfigure({.max_concurrent_calls = 9, .queue_limit = 100, .adapt = rs::aimd{.max = 10}});
    CHECK(bh.limit() == 9);
}

TEST_CASE("adaptive limit reconfigure: the gradient's estimate carries over, clamped into the new bounds",
          "[bulkhead][adaptive][reconfigure]") {
    rs::bulkhead bh{{.max_concurrent_calls = 20, .adapt = rs::gradient{.max = 50}}};
    bh.reconfigure({.max_concurrent_calls = 10, .adapt = rs::gradient{.max = 10}});
    CHECK(bh.limit() == 10);
    bh.reconfigure({.max_concurrent_calls = 30, .adapt = rs::gradient{.max = 50, .short_samples = 5}});
    CHECK(bh.limit() == 10);
    bh.reconfigure({.max_concurrent_calls = 30, .adapt = rs::gradient{.min = 12, .max = 50}});
    CHECK(bh.limit() == 12);
}

TEST_CASE("adaptive limit reconfigure: a call admitted under an AIMD moves no AIMD made after it, even with "
          "no algorithm or a gradient between",
          "[bulkhead][adaptive][reconfigure]") {
    const rs::adaptive_limit between[] = {rs::adaptive_limit{}, rs::gradient{.min = 1, .max = 10}};
    for (const rs::adaptive_limit& middle : between) {
        rs::testing::simulation sim;
        const auto overload = [](const rs::failure& f) { return f.is<overloaded>(); };
        rs::bulkhead bh{{.max_concurrent_calls = 8,
                         .adapt = rs::aimd{.min = 1, .max = 10, .decrease = 0.5, .should_handle = overload}},
                        sim.clock()};
        journal j;
        sim.spawn(call(sim, bh, j, 1, 0ms, 100ms, true)); // admitted under the first AIMD, fails at 100ms
        sim.spawn(
            reconfigure_at(sim, bh, 10ms, rs::bulkhead_options{.max_concurrent_calls = 8, .adapt = middle}));
        sim.spawn(reconfigure_at(
            sim, bh, 20ms,
            rs::bulkhead_options{
                .max_concurrent_calls = 8,
                .adapt = rs::aimd{.min = 1, .max = 10, .decrease = 0.5, .should_handle = overload}}));
        sim.run_all();
        CHECK(j.started[1] == 0ms);
        CHECK(bh.limit() == 8); // the failure of the call admitted before did not halve the new AIMD
    }
}

TEST_CASE("adaptive limit reconfigure: bounds that raise the limit admit queued waiters at once",
          "[bulkhead][adaptive][reconfigure]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 2, .queue_limit = 10, .adapt = rs::aimd{.max = 10}},
                    sim.clock()};
    journal j;
    for (int id = 1; id <= 5; ++id)
        sim.spawn(call(sim, bh, j, id, 0ms, 100ms));
    sim.spawn(reconfigure_at(sim, bh, 10ms,
                             rs::bulkhead_options{.max_concurrent_calls = 4,
                                                  .queue_limit = 10,
                                                  .adapt = rs::aimd{.min = 4, .max = 10}}));
    sim.run_all();
    CHECK(j.started[3] == 10ms);
    CHECK(j.started[4] == 10ms);
    CHECK(j.started[5] == 100ms);
}

TEST_CASE("adaptive limit reconfigure: a call admitted before the change is classified by its own "
          "should_handle, and its sample moves the limit by the parameters in force",
          "[bulkhead][adaptive][reconfigure]") {
    rs::testing::simulation sim;
    const auto handles_overload = [](const rs::failure& f) { return f.is<overloaded>(); };
    const auto handles_nothing = [](const rs::failure&) { return false; };
    rs::bulkhead bh{{.max_concurrent_calls = 8,
                     .adapt = rs::aimd{.max = 10, .decrease = 0.5, .should_handle = handles_overload}},
                    sim.clock()};
    journal j;
    sim.spawn(call(sim, bh, j, 1, 0ms, 100ms, true)); // started under handles_overload
    sim.spawn(reconfigure_at(
        sim, bh, 10ms,
        rs::bulkhead_options{.max_concurrent_calls = 8,
                             .adapt =
                                 rs::aimd{.max = 10, .decrease = 0.25, .should_handle = handles_nothing}}));
    sim.spawn(call(sim, bh, j, 2, 200ms, 100ms, true)); // started under handles_nothing
    sim.run_until(150ms);
    CHECK(j.ended[1].what == "failure");
    CHECK(bh.limit() == 2); // counted (its own classifier), by the new decrease: floor(8 * 0.25)
    sim.run_all();
    CHECK(j.ended[2].what == "failure");
    CHECK(bh.limit() == 2); // not counted
}

TEST_CASE("adaptive limit reconfigure: a call admitted without adapt, or untimed by an algorithm that now "
          "times calls, records no sample",
          "[bulkhead][adaptive][reconfigure]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 4}, sim.clock()};
    journal j;
    sim.spawn(call(sim, bh, j, 1, 0ms, 100ms, true)); // admitted without adapt, fails at 100 ms
    sim.spawn(reconfigure_at(
        sim, bh, 10ms,
        rs::bulkhead_options{.max_concurrent_calls = 4, .adapt = rs::aimd{.max = 10, .decrease = 0.5}}));
    sim.run_until(150ms);
    CHECK(j.ended[1].what == "failure");
    CHECK(bh.limit() == 4);                       // no sample
    sim.spawn(call(sim, bh, j, 2, 200ms, 100ms)); // untimed: AIMD without slow_call_duration
    sim.spawn(reconfigure_at(
        sim, bh, 210ms,
        rs::bulkhead_options{.max_concurrent_calls = 4,
                             .adapt = rs::aimd{.max = 10, .slow_call_duration = 50ms, .decrease = 0.5}}));
    sim.spawn(call(sim, bh, j, 3, 220ms, 100ms)); // timed, and slow
    sim.run_until(310ms);
    CHECK(j.ended[2] == value_at(300ms));
    CHECK(bh.limit() == 4); // call 2's 100 ms were not measured
    sim.run_all();
    CHECK(j.ended[3] == value_at(320ms));
    CHECK(bh.limit() == 2); // call 3 was slow: 4 * 0.5
}

// ---------------------------------------------------------------------------------------------------------
// rate_limiter

TEST_CASE("rate_limiter reconfigure: the tokens earned up to the change are counted at the old rate and "
          "kept, fractions included, and the new rate applies from the change on",
          "[rate_limiter][reconfigure]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 10, .tokens_per_second = 10, .queue_limit = rs::unbounded_queue},
                        sim.clock()};
    journal j;
    for (int id = 1; id <= 10; ++id) // the whole bucket at 0
        sim.spawn(call(sim, rl, j, id, 0ms));
    // At 250 ms, 2.5 tokens earned at 10 per second; from then on, one per second.
    sim.spawn(reconfigure_at(sim, rl, 250ms,
                             rs::rate_limiter_options{.token_limit = 10,
                                                      .tokens_per_second = 1,
                                                      .queue_limit = rs::unbounded_queue}));
    sim.run_until(250ms);
    CHECK(rl.tokens() == 2.5);
    for (int id = 11; id <= 13; ++id)
        sim.spawn(call(sim, rl, j, id, 300ms));
    sim.run_all();
    CHECK(j.started[11] == 300ms);
    CHECK(j.started[12] == 300ms);
    CHECK(j.started[13] == 750ms); // 0.55 token at 300 ms, the rest at one per second
}

TEST_CASE("rate_limiter reconfigure: the tokens are capped at a smaller token_limit, and a larger one adds "
          "none at once",
          "[rate_limiter][reconfigure]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.name = "api", .token_limit = 10, .tokens_per_second = 10}, sim.clock()};
    sim.run_until(100ms);
    rl.reconfigure({.name = "api", .token_limit = 3, .tokens_per_second = 100});
    CHECK(rl.tokens() == 3.0);
    journal j;
    for (int id = 1; id <= 4; ++id)
        sim.spawn(call(sim, rl, j, id, 200ms));
    sim.run_until(200ms);
    CHECK(j.started.size() == 3);
    CHECK(j.ended[4] == refused_at(200ms, "no_capacity by api", 10ms));
    sim.run_until(230ms);
    CHECK(rl.tokens() == 3.0); // full again
    rl.reconfigure({.name = "api", .token_limit = 20, .tokens_per_second = 100});
    CHECK(rl.tokens() == 3.0);
    sim.run_until(330ms);
    CHECK(rl.tokens() == 13.0);
}

TEST_CASE("rate_limiter reconfigure: the waiter first in line times its token again by the new rate, sooner "
          "or later",
          "[rate_limiter][reconfigure]") {
    struct change {
        double rate;
        nanoseconds second_admitted;
    };
    // At 100 ms, 0.1 token earned at 1 per second: the other 0.9 take 90 ms at 10 per second,
    // 1.8 s at 0.5.
    const auto c = GENERATE(change{10, 190ms}, change{0.5, 1900ms});
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 1, .tokens_per_second = 1, .queue_limit = rs::unbounded_queue},
                        sim.clock()};
    journal j;
    sim.spawn(call(sim, rl, j, 1, 0ms));
    sim.spawn(call(sim, rl, j, 2, 0ms)); // due at 1 s until the change
    sim.spawn(call(sim, rl, j, 3, 0ms));
    sim.spawn(reconfigure_at(sim, rl, 100ms,
                             rs::rate_limiter_options{.token_limit = 1,
                                                      .tokens_per_second = c.rate,
                                                      .queue_limit = rs::unbounded_queue}));
    sim.run_until(100ms);
    CHECK(rl.queued() == 2); // the waiters stay
    sim.run_all();
    CHECK(j.started[1] == 0ms);
    CHECK(j.started[2] == c.second_admitted);
    CHECK(j.started[3] == c.second_admitted + std::chrono::duration_cast<nanoseconds>(1s / c.rate));
}

TEST_CASE("rate_limiter reconfigure: a smaller queue limit turns no waiter away - a queue timeout applies "
          "to callers queued after the change",
          "[rate_limiter][reconfigure]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 1, .tokens_per_second = 10, .queue_limit = 3, .queue_timeout = 250ms},
                        sim.clock()};
    journal j;
    for (int id = 1; id <= 4; ++id)
        sim.spawn(call(sim, rl, j, id, 0ms)); // 1 now; 2, 3, 4 at 100, 200 and 300 ms (deadline 250)
    sim.spawn(reconfigure_at(
        sim, rl, 10ms,
        rs::rate_limiter_options{.token_limit = 1, .tokens_per_second = 10, .queue_limit = 1}));
    sim.spawn(call(sim, rl, j, 5, 20ms));  // 3 queued >= 1
    sim.spawn(call(sim, rl, j, 6, 260ms)); // the queue emptied at 250 ms: waits, without a deadline
    sim.run_all();
    CHECK(j.started[2] == 100ms);
    CHECK(j.started[3] == 200ms);
    CHECK(j.ended[4] == refused_at(250ms, "queue_timeout by ", 50ms));
    CHECK(j.ended[5] == refused_at(20ms, "queue_full by ", 380ms)); // behind three waiters
    CHECK(j.started[6] == 300ms);
}

TEST_CASE("rate_limiter reconfigure: invalid options are refused naming the field and the value, and the "
          "old ones stay in force",
          "[rate_limiter][reconfigure]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.name = "api", .token_limit = 1, .tokens_per_second = 10}, sim.clock()};
    CHECK_THAT(invalid_argument_message([&] { rl.reconfigure({.name = "api", .tokens_per_second = 10}); }),
               Contains("api") && Contains("token_limit must be positive, got 0"));
    CHECK_THAT(invalid_argument_message([&] { rl.reconfigure({.token_limit = 5, .tokens_per_second = -1}); }),
               Contains("tokens_per_second must be finite and positive, got -1"));
    CHECK_THAT(invalid_argument_message([&] {
                   rl.reconfigure({.token_limit = 5, .tokens_per_second = 10, .queue_timeout = 0ms});
               }),
               Contains("queue_timeout must be positive, got 0ns"));
    CHECK(rl.options().token_limit == 1);
    CHECK(rl.name() == "api");
    // By behaviour: one token, then one per 100 ms, no queue.
    journal j;
    sim.spawn(call(sim, rl, j, 1, 0ms));
    sim.spawn(call(sim, rl, j, 2, 30ms));
    sim.spawn(call(sim, rl, j, 3, 100ms));
    sim.run_all();
    CHECK(j.ended[1] == value_at(0ms));
    CHECK(j.ended[2] == refused_at(30ms, "no_capacity by api", 70ms));
    CHECK(j.ended[3] == value_at(100ms));
}

TEST_CASE("rate_limiter reconfigure: a call waiting since before the change ends under its own options",
          "[rate_limiter][reconfigure]") {
    rs::testing::simulation sim;
    auto old_told = std::make_shared<int>(0), new_told = std::make_shared<int>(0);
    rs::rate_limiter rl{{.name = "old",
                         .token_limit = 1,
                         .tokens_per_second = 1,
                         .queue_limit = 5,
                         .queue_timeout = 300ms,
                         .on_rejected = counting(old_told)},
                        sim.clock()};
    journal j;
    sim.spawn(call(sim, rl, j, 1, 0ms));
    sim.spawn(call(sim, rl, j, 2, 0ms));
    sim.spawn(reconfigure_at(sim, rl, 100ms,
                             rs::rate_limiter_options{.name = "new",
                                                      .token_limit = 1,
                                                      .tokens_per_second = 1,
                                                      .queue_limit = 5,
                                                      .on_rejected = counting(new_told)}));
    sim.run_all();
    CHECK(j.ended[2] == refused_at(300ms, "queue_timeout by old", 700ms));
    CHECK(*old_told == 1);
    CHECK(*new_told == 0);
    CHECK(rl.name() == "new");
}

// ---------------------------------------------------------------------------------------------------------
// sliding_window_limiter

TEST_CASE("sliding_window_limiter reconfigure: the same window keeps its counts - a smaller permit_limit "
          "takes no permit back and admits nobody until under it",
          "[sliding_window][reconfigure]") {
    rs::testing::simulation sim;
    rs::sliding_window_limiter sw{{.name = "w", .permit_limit = 3, .window = 1s}, sim.clock()};
    journal j;
    for (int id = 1; id <= 3; ++id)
        sim.spawn(call(sim, sw, j, id, 0ms)); // back at 1 s
    sim.spawn(reconfigure_at(
        sim, sw, 100ms, rs::sliding_window_limiter_options{.name = "w", .permit_limit = 5, .window = 1s}));
    sim.spawn(call(sim, sw, j, 4, 150ms)); // counted at 200 ms: back at 1.2 s
    sim.spawn(call(sim, sw, j, 5, 150ms));
    sim.spawn(call(sim, sw, j, 6, 150ms));
    sim.spawn(reconfigure_at(
        sim, sw, 300ms, rs::sliding_window_limiter_options{.name = "w", .permit_limit = 1, .window = 1s}));
    sim.spawn(call(sim, sw, j, 7, 1050ms)); // two in use, one allowed: the second of them frees one
    sim.spawn(call(sim, sw, j, 8, 1200ms));
    sim.run_until(300ms);
    CHECK(sw.tokens() == 0.0);
    sim.run_all();
    CHECK(j.ended[4] == value_at(150ms));
    CHECK(j.ended[5] == value_at(150ms));
    CHECK(j.ended[6] == refused_at(150ms, "no_capacity by w", 850ms));
    CHECK(j.ended[7] == refused_at(1050ms, "no_capacity by w", 150ms));
    CHECK(j.ended[8] == value_at(1200ms));
}

TEST_CASE("sliding_window_limiter reconfigure: another window or segment grid counts the permits in use "
          "again, on the new grid, and they come back one new window later",
          "[sliding_window][reconfigure]") {
    struct change {
        nanoseconds window;
        std::size_t segments;
        nanoseconds back; // when the permits taken at 50 ms come back
    };
    // Taken at 50 ms, counted at the 100 ms boundary. The new grid counts them at the boundary at or
    // after 100 ms, but no later than the one at or after the change (300 ms).
    const auto c = GENERATE(change{500ms, 5, 600ms},  // 100 ms + 500 ms
                            change{2s, 20, 2100ms},   // 100 ms + 2 s
                            change{1s, 4, 1250ms},    // segments of 250 ms: 250 ms + 1 s
                            change{400ms, 2, 600ms}); // segments of 200 ms: 200 ms + 400 ms
    rs::testing::simulation sim;
    rs::sliding_window_limiter sw{{.permit_limit = 2, .window = 1s, .segments = 10}, sim.clock()};
    journal j;
    sim.spawn(call(sim, sw, j, 1, 50ms));
    sim.spawn(call(sim, sw, j, 2, 50ms));
    sim.spawn(reconfigure_at(
        sim, sw, 300ms,
        rs::sliding_window_limiter_options{.permit_limit = 2, .window = c.window, .segments = c.segments}));
    sim.spawn(call(sim, sw, j, 3, 310ms));
    sim.spawn(call(sim, sw, j, 4, c.back - 1ns));
    sim.spawn(call(sim, sw, j, 5, c.back));
    sim.run_all();
    CHECK(j.ended[3] == refused_at(310ms, "no_capacity by ", c.back - 310ms));
    CHECK(j.ended[4] == refused_at(c.back - 1ns, "no_capacity by ", 1ns));
    CHECK(j.ended[5] == value_at(c.back));
}

TEST_CASE("sliding_window_limiter reconfigure: a permit counted at a coarse boundary is counted again no "
          "later than the boundary at or after the change",
          "[sliding_window][reconfigure]") {
    rs::testing::simulation sim;
    // One segment of 1 s: a permit taken at 50 ms is counted at 1 s and comes back at 2 s.
    rs::sliding_window_limiter sw{{.permit_limit = 1, .window = 1s, .segments = 1, .queue_limit = 1},
                                  sim.clock()};
    journal j;
    sim.spawn(call(sim, sw, j, 1, 50ms));
    sim.spawn(call(sim, sw, j, 2, 60ms)); // waits; its permit was due at 2 s
    sim.spawn(reconfigure_at(sim, sw, 300ms,
                             rs::sliding_window_limiter_options{
                                 .permit_limit = 1, .window = 1s, .segments = 10, .queue_limit = 1}));
    sim.run_all();
    CHECK(j.started[2] == 1300ms); // counted at 300 ms on the grid of 100 ms
}

TEST_CASE("sliding_window_limiter reconfigure: a larger permit_limit serves the waiters at once, and bad "
          "options leave the old ones in force",
          "[sliding_window][reconfigure]") {
    rs::testing::simulation sim;
    rs::sliding_window_limiter sw{{.name = "w", .permit_limit = 1, .window = 1s, .queue_limit = 5},
                                  sim.clock()};
    CHECK_THAT(invalid_argument_message(
                   [&] { sw.reconfigure({.name = "w", .permit_limit = 1, .window = 10ns, .segments = 11}); }),
               Contains("w") && Contains("segments must be at most the window in nanoseconds (10), got 11"));
    CHECK_THAT(invalid_argument_message([&] { sw.reconfigure({.permit_limit = 0, .window = 1s}); }),
               Contains("permit_limit must be positive, got 0"));
    CHECK(sw.options().permit_limit == 1);
    journal j;
    for (int id = 1; id <= 4; ++id)
        sim.spawn(call(sim, sw, j, id, 0ms));
    sim.spawn(reconfigure_at(
        sim, sw, 100ms,
        rs::sliding_window_limiter_options{.name = "w", .permit_limit = 3, .window = 1s, .queue_limit = 5}));
    sim.run_all();
    CHECK(j.started[1] == 0ms);
    CHECK(j.started[2] == 100ms);
    CHECK(j.started[3] == 100ms);
    CHECK(j.started[4] == 1000ms); // the first permit back
}

// ---------------------------------------------------------------------------------------------------------
// Threads: four loops call a bulkhead and a rate limiter while another thread reconfigures them. Run
// under ThreadSanitizer.

namespace {

// The most `n` was seen at.
void raise_to(std::atomic<int>& peak, int n) {
    int seen = peak.load();
    while (n > seen && !peak.compare_exchange_weak(seen, n)) {
    }
}

struct shared_counts {
    std::atomic<int> running{0}, peak{0};
    resilience_tests::call_tally<rs::bulkhead_rejected_error> bulkhead_calls;
    resilience_tests::call_tally<rs::rate_limited_error> limiter_calls;
    explicit shared_counts(std::size_t n) : bulkhead_calls(n), limiter_calls(n) {}
};

rs::task<void> threaded_calls(rs::bulkhead<> bh, rs::rate_limiter<> rl, shared_counts& c, std::size_t first,
                              std::size_t calls) {
    for (std::size_t i = first; i < first + calls; ++i) {
        const int yields = static_cast<int>(i % 4);
        auto action = [&c, yields]() -> rs::task<int> {
            raise_to(c.peak, ++c.running);
            for (int k = 0; k < yields; ++k)
                co_await resilience_tests::yield_now{};
            --c.running;
            co_return 1;
        };
        const rs::outcome<int> slot = co_await bh.execute_outcome(action);
        c.bulkhead_calls.record(i, slot);
        auto take = []() -> rs::task<int> { co_return 1; };
        const rs::outcome<int> token = co_await rl.execute_outcome(take);
        c.limiter_calls.record(i, token);
    }
}

} // namespace

TEST_CASE("bulkhead and rate_limiter reconfigure: four threads call while another reconfigures - every call "
          "ends once and the bulkhead never runs more than the largest limit",
          "[bulkhead][rate_limiter][reconfigure][concurrency]") {
    // Four chains of calls one after another on each loop: up to sixteen calls at once, more than
    // the largest limit, so that calls queue, are refused and are handed slots across threads.
    constexpr std::size_t per_chain = 400, chains = 4, loops = 4, per_loop = chains * per_chain;
    rs::bulkhead bh{{.max_concurrent_calls = 2, .queue_limit = 1000}};
    rs::rate_limiter rl{{.token_limit = 50, .tokens_per_second = 1e6, .queue_limit = 1000}};
    shared_counts c{loops * per_loop};
    rs::event_loop l0, l1, l2, l3;
    rs::event_loop* const all[] = {&l0, &l1, &l2, &l3};
    for (std::size_t t = 0; t < loops; ++t)
        for (std::size_t k = 0; k < chains; ++k)
            all[t]->spawn(threaded_calls(bh, rl, c, t * per_loop + k * per_chain, per_chain));
    std::atomic<bool> done{false};
    std::atomic<int> reconfigurations{0};
    std::thread reconfigurer([&] {
        for (std::size_t n = 0; !done.load() && n < 20000; ++n) {
            const bool odd = n % 2 == 1;
            bh.reconfigure(
                {.max_concurrent_calls = odd ? 4u : 1u,
                 .queue_limit = odd ? 1000u : 3u,
                 .queue_timeout = odd ? std::optional<nanoseconds>{} : std::optional<nanoseconds>{5ms}});
            rl.reconfigure({.token_limit = odd ? 100u : 5u,
                            .tokens_per_second = odd ? 1e6 : 1e5,
                            .queue_limit = odd ? 1000u : 2u});
            ++reconfigurations;
            std::this_thread::yield();
        }
    });
    resilience_tests::run_on_threads(l0, l1, l2, l3);
    done = true;
    reconfigurer.join();
    CHECK(reconfigurations.load() > 0);
    CHECK(c.peak.load() <= 4);
    CHECK(c.running.load() == 0);
    const int total = static_cast<int>(loops * per_loop);
    CHECK(c.bulkhead_calls.values + c.bulkhead_calls.refused == total);
    CHECK(c.limiter_calls.values + c.limiter_calls.refused == total);
    CHECK(c.bulkhead_calls.completions.exactly_once() == loops * per_loop);
    CHECK(c.limiter_calls.completions.exactly_once() == loops * per_loop);
    CHECK(bh.in_flight() == 0);
    CHECK(bh.queued() == 0);
    CHECK(rl.queued() == 0);
}

} // namespace test_reconfigure_limits
