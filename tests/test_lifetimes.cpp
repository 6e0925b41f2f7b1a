// SPDX-License-Identifier: MIT
// The one lifetime rule (docs/core.md, "Lifetimes"): a call keeps alive every piece of shared state it
// touches until it has ended, and the destruction of a call, resumed or not, touches nothing else. For
// each stateful policy: the last handle reassigned or destroyed while a call is suspended, then the call
// let finish; and the handles and the pipeline destroyed before the virtual-time loop that holds the
// suspended calls, in either order. Under AddressSanitizer a call that touched a dead state would fail.

#include "catch.hpp"

#include <resilience/adaptive_throttle.hpp>
#include <resilience/any_policy.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/circuit_breaker.hpp>
#include <resilience/error.hpp>
#include <resilience/outcome.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/retry.hpp>
#include <resilience/retry_budget.hpp>
#include <resilience/single_flight.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <chrono>
#include <cstdint>
#include <latch>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace test_lifetimes {

namespace rs = resilience;
using namespace std::chrono_literals;
using vclock = rs::testing::virtual_clock;

namespace {

// An action that holds the call for `hold` of virtual time, then returns 7 (or throws).
struct slow_action {
    rs::testing::simulation* sim;
    std::chrono::nanoseconds hold = 100ms;
    bool fail = false;
    rs::task<int> operator()(resilience::stop_token st) const {
        co_await sim->sleep_for(hold, st);
        if (fail)
            throw std::runtime_error("boom");
        co_return 7;
    }
};

// Draws the top of its range: a throttle using it refuses nothing (its probability stays below 1).
struct top_draw {
    using result_type = std::uint64_t;
    static constexpr result_type min() { return 0; }
    static constexpr result_type max() { return ~result_type{0}; }
    result_type operator()() noexcept { return max(); }
};
using test_throttle = rs::adaptive_throttle<vclock, top_draw>;

struct failing_action {
    rs::task<int> operator()() const {
        throw std::runtime_error("boom");
        co_return 0;
    }
};

// Awaits `call` and keeps what it ended with.
rs::task<void> keep(rs::task<rs::outcome<int>> call, std::optional<rs::outcome<int>>& out) {
    out.emplace(co_await std::move(call));
}

std::string how(const std::optional<rs::outcome<int>>& r) {
    if (!r)
        return "not ended";
    if (r->has_value())
        return "value " + std::to_string(r->value());
    return r->error().what();
}

} // namespace

// ---------------------------------------------------------------------------------------------------------
// The last handle goes while a call made through it is suspended; the call then finishes on the state it
// started with.

TEST_CASE("lifetimes: a breaker's last handle reassigned or destroyed while its call runs", "[lifetimes]") {
    rs::testing::simulation sim;
    auto breaker = std::make_unique<rs::circuit_breaker<vclock>>(
        rs::circuit_breaker_options{.failure_threshold = 1, .break_duration = 1s}, sim.clock());
    std::optional<rs::outcome<int>> succeeded, failed;
    sim.spawn(keep(breaker->execute_outcome(slow_action{&sim}), succeeded));
    sim.spawn(keep(breaker->execute_outcome(slow_action{&sim, 100ms, true}), failed));
    sim.run_for(10ms);
    SECTION("reassigned: the reload pattern") {
        *breaker = rs::circuit_breaker<vclock>{{.failure_threshold = 5}, sim.clock()};
        sim.run_all();
        CHECK(how(succeeded) == "value 7");
        CHECK(how(failed) == "boom");
        CHECK(breaker->state() == rs::circuit_state::closed); // the failure went to the old breaker
    }
    SECTION("destroyed") {
        breaker.reset();
        sim.run_all();
        CHECK(how(succeeded) == "value 7");
        CHECK(how(failed) == "boom");
    }
}

TEST_CASE("lifetimes: a half-open breaker's probe outlives every handle", "[lifetimes]") {
    rs::testing::simulation sim;
    auto breaker = std::make_unique<rs::circuit_breaker<vclock>>(
        rs::circuit_breaker_options{.failure_threshold = 1, .break_duration = 10ms}, sim.clock());
    CHECK(!sim.run(breaker->execute_outcome(failing_action{})));
    sim.run_for(20ms);
    std::optional<rs::outcome<int>> probe;
    sim.spawn(keep(breaker->execute_outcome(slow_action{&sim}), probe));
    sim.run_for(10ms);
    CHECK(breaker->state() == rs::circuit_state::half_open);
    breaker.reset();
    sim.run_all();
    CHECK(how(probe) == "value 7");
}

TEST_CASE("lifetimes: a bulkhead's last handle goes while calls hold slots and wait for them",
          "[lifetimes]") {
    rs::testing::simulation sim;
    auto options =
        GENERATE(rs::bulkhead_options{.max_concurrent_calls = 1, .queue_limit = 4},
                 rs::bulkhead_options{.max_concurrent_calls = 1, .queue_limit = 4, .queue_timeout = 1s},
                 rs::bulkhead_options{
                     .max_concurrent_calls = 1, .queue_limit = 4, .adapt = rs::aimd{.min = 1, .max = 4}});
    auto bulkhead = std::make_unique<rs::bulkhead<vclock>>(options, sim.clock());
    std::optional<rs::outcome<int>> holder, waiter;
    sim.spawn(keep(bulkhead->execute_outcome(slow_action{&sim}), holder)); // the fast path: a free slot
    sim.spawn(keep(bulkhead->execute_outcome(slow_action{&sim}), waiter)); // queued behind it
    sim.run_for(10ms);
    CHECK(bulkhead->in_flight() == 1);
    CHECK(bulkhead->queued() == 1);
    SECTION("reassigned") {
        *bulkhead = rs::bulkhead<vclock>{{.max_concurrent_calls = 3}, sim.clock()};
        sim.run_all();
        CHECK(bulkhead->in_flight() == 0);
    }
    SECTION("destroyed") {
        bulkhead.reset();
        sim.run_all();
    }
    CHECK(how(holder) == "value 7");
    CHECK(how(waiter) == "value 7");
    CHECK(sim.now() == 200ms);
}

TEST_CASE("lifetimes: a rate limiter's last handle goes while a call waits for a token", "[lifetimes]") {
    rs::testing::simulation sim;
    auto limiter = std::make_unique<rs::rate_limiter<vclock>>(
        rs::rate_limiter_options{.token_limit = 1, .tokens_per_second = 10, .queue_limit = 4}, sim.clock());
    std::optional<rs::outcome<int>> first, second, third;
    sim.spawn(keep(limiter->execute_outcome(slow_action{&sim}), first));  // the token there
    sim.spawn(keep(limiter->execute_outcome(slow_action{&sim}), second)); // the head: watches the clock
    sim.spawn(keep(limiter->execute_outcome(slow_action{&sim}), third));  // queued behind it
    sim.run_for(10ms);
    CHECK(limiter->queued() == 2);
    SECTION("reassigned") {
        *limiter = rs::rate_limiter<vclock>{{.token_limit = 5, .tokens_per_second = 1}, sim.clock()};
        sim.run_all();
        CHECK(limiter->tokens() == 5);
    }
    SECTION("destroyed") {
        limiter.reset();
        sim.run_all();
    }
    CHECK(how(first) == "value 7");
    CHECK(how(second) == "value 7");
    CHECK(how(third) == "value 7");
    CHECK(sim.now() == 300ms); // tokens at 100 and 200 ms, each call holding 100 ms
}

TEST_CASE("lifetimes: a rate limiter's take outlives the handle it was asked of", "[lifetimes]") {
    rs::testing::simulation sim;
    auto limiter = std::make_unique<rs::rate_limiter<vclock>>(
        rs::rate_limiter_options{.token_limit = 1, .tokens_per_second = 10, .queue_limit = 4}, sim.clock());
    CHECK(sim.run(limiter->take_outcome()).has_value());
    rs::task<rs::outcome<void>> waiting = limiter->take_outcome();
    limiter.reset(); // before the take even started
    const rs::outcome<void> r = sim.run(std::move(waiting));
    CHECK(r.has_value());
    CHECK(sim.now() == 100ms);
}

TEST_CASE("lifetimes: a sliding-window limiter's last handle goes while a call waits for a permit",
          "[lifetimes]") {
    rs::testing::simulation sim;
    auto limiter = std::make_unique<rs::sliding_window_limiter<vclock>>(
        rs::sliding_window_limiter_options{
            .permit_limit = 1, .window = 100ms, .segments = 1, .queue_limit = 4},
        sim.clock());
    std::optional<rs::outcome<int>> first, second;
    sim.spawn(keep(limiter->execute_outcome(slow_action{&sim, 10ms}), first));
    sim.spawn(keep(limiter->execute_outcome(slow_action{&sim, 10ms}), second));
    sim.run_for(5ms);
    CHECK(limiter->queued() == 1);
    SECTION("reassigned") {
        *limiter = rs::sliding_window_limiter<vclock>{{.permit_limit = 3, .window = 1s}, sim.clock()};
        sim.run_all();
        CHECK(limiter->tokens() == 3);
    }
    SECTION("destroyed") {
        limiter.reset();
        sim.run_all();
    }
    CHECK(how(first) == "value 7");
    CHECK(how(second) == "value 7");
    CHECK(sim.now() == 110ms);
}

TEST_CASE("lifetimes: an adaptive throttle's last handle goes while its call runs", "[lifetimes]") {
    rs::testing::simulation sim;
    auto throttle = std::make_unique<test_throttle>(rs::adaptive_throttle_options{}, sim.clock());
    std::optional<rs::outcome<int>> succeeded, failed;
    sim.spawn(keep(throttle->execute_outcome(slow_action{&sim}), succeeded));
    sim.spawn(keep(throttle->execute_outcome(slow_action{&sim, 100ms, true}), failed));
    sim.run_for(10ms);
    SECTION("reassigned") {
        *throttle = test_throttle{{}, sim.clock()};
        sim.run_all();
        CHECK(throttle->requests() == 0); // the calls were counted by the old throttle
    }
    SECTION("destroyed") {
        throttle.reset();
        sim.run_all();
    }
    CHECK(how(succeeded) == "value 7");
    CHECK(how(failed) == "boom");
}

TEST_CASE("lifetimes: a retry budget outlives the any_policy holding its last handle", "[lifetimes]") {
    rs::testing::simulation sim;
    int calls = 0;
    auto flaky = [&calls]() -> rs::task<int> {
        if (++calls < 3)
            throw std::runtime_error("boom");
        co_return 7;
    };
    auto policy = std::make_unique<rs::any_policy<int>>(
        rs::retry{{.max_attempts = 5,
                   .backoff = rs::constant_backoff{100ms, rs::jitter::none},
                   .budget = rs::retry_budget{{.ratio = 0.5, .capacity = 2}}},
                  sim.clock()});
    std::optional<rs::outcome<int>> r;
    sim.spawn(keep(policy->execute_outcome(flaky), r));
    sim.run_for(50ms); // asleep before its second attempt
    CHECK(calls == 1);
    SECTION("reassigned") {
        *policy = rs::any_policy<int>{rs::retry{{.max_attempts = 1}, sim.clock()}};
    }
    SECTION("destroyed") {
        policy.reset();
    }
    sim.run_all();
    CHECK(how(r) == "value 7");
    CHECK(calls == 3);
}

TEST_CASE("lifetimes: a single_flight call outlives the handle it was made through", "[lifetimes]") {
    rs::testing::simulation sim;
    auto flights = std::make_unique<rs::single_flight<int, int>>();
    rs::task<int> call = flights->run(1, slow_action{&sim});
    flights.reset(); // before the call even started
    CHECK(sim.run(std::move(call)) == 7);
}

// ---------------------------------------------------------------------------------------------------------
// The handles and the pipeline die before the loop that holds suspended calls: the loop then destroys
// the calls, which give back what they hold (a slot, a probe, a place in a queue) to states that only
// they keep alive.

namespace {

using stateful = rs::pipeline<rs::circuit_breaker<vclock>, test_throttle, rs::bulkhead<vclock>,
                              rs::rate_limiter<vclock>, rs::sliding_window_limiter<vclock>>;

struct handles {
    rs::circuit_breaker<vclock> breaker;
    test_throttle throttle;
    rs::bulkhead<vclock> bulkhead;
    rs::rate_limiter<vclock> limiter;
    rs::sliding_window_limiter<vclock> window;

    explicit handles(rs::testing::simulation& sim,
                     rs::bulkhead_options b = {.max_concurrent_calls = 1, .queue_limit = 8})
        : breaker{{.failure_threshold = 1, .break_duration = 10ms}, sim.clock()}, throttle{{}, sim.clock()},
          bulkhead{std::move(b), sim.clock()},
          limiter{{.token_limit = 2, .tokens_per_second = 1, .queue_limit = 8}, sim.clock()},
          window{{.permit_limit = 3, .window = 1min, .queue_limit = 8}, sim.clock()} {}
    stateful pipeline() const { return stateful{breaker, throttle, bulkhead, limiter, window}; }
};

} // namespace

TEST_CASE("lifetimes: handles and pipeline destroyed before the loop holding suspended calls",
          "[lifetimes]") {
    const int order = GENERATE(0, 1, 2);
    const bool timed_queue = GENERATE(false, true);
    std::optional<rs::outcome<int>> r1, r2, r3, r4, r5; // NOLINT(readability-isolate-declaration)
    {
        rs::testing::simulation sim; // declared first: destroyed last, with the calls it holds
        rs::bulkhead_options b{.max_concurrent_calls = 1, .queue_limit = 8};
        if (timed_queue)
            b.queue_timeout = 1h;
        auto h = std::make_unique<handles>(sim, b);
        auto p = std::make_unique<stateful>(h->pipeline());
        // Call 1 holds the bulkhead's slot, having taken a token and a permit; call 2 waits for the slot.
        sim.spawn(keep(p->execute_outcome(slow_action{&sim, 1h}), r1));
        sim.spawn(keep(p->execute_outcome(slow_action{&sim, 1h}), r2));
        sim.run_for(10ms);
        CHECK(h->bulkhead.in_flight() == 1);
        CHECK(h->bulkhead.queued() == 1);
        // Call 3 goes around the bulkhead: it waits at the head of the rate limiter's queue, call 4
        // behind it. Call 5 is a half-open breaker's probe, asleep in its action.
        rs::pipeline limited{h->limiter, h->window};
        sim.spawn(keep(limited.execute_outcome(slow_action{&sim}), r3));
        sim.spawn(keep(limited.execute_outcome(slow_action{&sim}), r4));
        rs::pipeline probing{h->breaker};
        std::optional<rs::outcome<int>> opened;
        sim.spawn(keep(probing.execute_outcome(failing_action{}), opened));
        sim.run_for(20ms);
        CHECK(how(opened) == "boom");
        sim.spawn(keep(probing.execute_outcome(slow_action{&sim, 1h}), r5));
        sim.run_for(10ms);
        CHECK(h->limiter.queued() == 1);
        CHECK(h->breaker.state() == rs::circuit_state::half_open);
        switch (order) {
        case 0: // the pipeline, then the handles
            p.reset();
            h.reset();
            break;
        case 1: // the handles, then the pipeline
            h.reset();
            p.reset();
            break;
        default: // everything with the scope, the pipelines after the handles (declared later)
            break;
        }
    }
    CHECK(how(r1) == "not ended");
    CHECK(how(r2) == "not ended");
    CHECK(how(r5) == "not ended");
}

TEST_CASE("lifetimes: a pipeline moved into its call needs nothing else", "[lifetimes]") {
    rs::testing::simulation sim;
    std::optional<rs::outcome<int>> r;
    {
        handles h{sim};
        sim.spawn(keep(h.pipeline().execute_outcome(slow_action{&sim}), r));
        sim.run_for(10ms);
    } // the handles go; the call holds the pipeline, which holds them
    sim.run_all();
    CHECK(how(r) == "value 7");
}

TEST_CASE("lifetimes: the last handle and the last slots go on two threads at once", "[lifetimes]") {
    // The bulkhead's slots are its calls' holds: whichever of the handle's drop and the calls' releases
    // comes last deletes the state, exactly once (ASan and TSan watch).
    for (int round = 0; round < 200; ++round) {
        auto sim = std::make_unique<rs::testing::simulation>();
        auto bulkhead = std::make_unique<rs::bulkhead<vclock>>(
            rs::bulkhead_options{.max_concurrent_calls = 4}, sim->clock());
        auto p = std::make_unique<rs::pipeline<rs::bulkhead<vclock>>>(*bulkhead);
        for (int i = 0; i < 4; ++i)
            sim->spawn(p->execute_outcome(slow_action{sim.get(), 1h}));
        sim->run_for(1ms);
        REQUIRE(bulkhead->in_flight() == 4);
        p.reset(); // the calls will never be resumed
        std::latch go{2};
        std::thread other([&] {
            go.arrive_and_wait();
            bulkhead.reset();
        });
        go.arrive_and_wait();
        sim.reset(); // destroys the calls, which give their slots back
        other.join();
    }
}

// ---------------------------------------------------------------------------------------------------------
// What every handle has from its base: equality and hashing by shared state.

TEMPLATE_TEST_CASE("lifetimes: copies of a handle are equal and hash alike, others differ", "[lifetimes]",
                   rs::circuit_breaker<>, rs::bulkhead<>, rs::rate_limiter<>, rs::sliding_window_limiter<>,
                   rs::adaptive_throttle<>, rs::retry_budget) {
    const auto make = [] {
        if constexpr (std::is_same_v<TestType, rs::rate_limiter<>>)
            return TestType{{.token_limit = 1, .tokens_per_second = 1}};
        else if constexpr (std::is_same_v<TestType, rs::sliding_window_limiter<>>)
            return TestType{{.permit_limit = 1, .window = 1s}};
        else
            return TestType{};
    };
    const TestType a = make();
    const TestType copy = a; // NOLINT(performance-unnecessary-copy-initialization)
    TestType moved_into = make();
    moved_into = a;
    const TestType other = make();
    CHECK(copy == a);
    CHECK(moved_into == a);
    CHECK(!(other == a));
    CHECK(std::hash<TestType>{}(copy) == std::hash<TestType>{}(a));
}

} // namespace test_lifetimes
