// SPDX-License-Identifier: MIT
// The bulkhead, the circuit breaker, the adaptive throttle and a retry around a timeout against their reference models
// (tests/models.hpp) on seeded random scenarios, and timeouts nested on two clocks.
//
// A failing scenario prints its seed; replay it alone with
//     RESILIENCE_MODEL_SEED=<seed> RESILIENCE_MODEL_SCENARIOS=1 resilience_tests "[model]"
// and run many more with `scripts/dev model N`.

#include "catch.hpp"
#include "model_scenarios.hpp"
#include "support.hpp"

#include <resilience/clock.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <chrono>
#include <optional>

namespace test_model_policies {

namespace rs = resilience;
namespace rm = resilience_models;
using namespace std::chrono_literals;
using rm::run_scenarios;
using std::chrono::nanoseconds;

TEST_CASE("model: the bulkhead admits, queues and refuses as its model", "[model][bulkhead]") {
    run_scenarios(300, rm::check_bulkhead);
}

TEST_CASE("model: the circuit breaker opens, refuses, probes and closes as its model",
          "[model][circuit_breaker]") {
    run_scenarios(300, rm::check_breaker);
}

TEST_CASE("model: a windowed circuit breaker opens on its failure and slow-call shares as its model",
          "[model][circuit_breaker]") {
    run_scenarios(300, rm::check_breaker_window);
}

TEST_CASE("model: a retry around a timeout ends as its model, at the same instant",
          "[model][retry][timeout]") {
    run_scenarios(300, rm::check_retry_timeout);
}

TEST_CASE("model: the adaptive throttle refuses and counts as its model, with the same draws",
          "[model][adaptive_throttle]") {
    run_scenarios(300, rm::check_throttle);
}

namespace {

using resilience_tests::shifted_clock;
static_assert(rs::clock<shifted_clock> && !rs::detail::loop_timer_clock<shifted_clock>);

// steady_clock's time an hour behind, sleeping on steady_clock's timers: the same on real time.
struct steady_behind {
    using duration = std::chrono::nanoseconds;
    using time_point = std::chrono::time_point<steady_behind, duration>;
    static constexpr duration shift = std::chrono::hours{1};
    time_point now() const { return time_point{rs::steady_clock{}.now().time_since_epoch() - shift}; }
    auto sleep_until(time_point tp, resilience::stop_token st) const {
        return rs::steady_clock{}.sleep_until(rs::steady_clock::time_point{tp.time_since_epoch() + shift},
                                              std::move(st));
    }
};

} // namespace

TEST_CASE("timeout: nested on two clocks, the attempt sees the inner deadline on the inner clock",
          "[timeout][regression]") {
    // The outer deadline (5 s on a clock an hour behind) must not be compared with the inner one
    // as if both clocks shared an epoch: kept as the tighter one, it would show the attempt a
    // deadline an hour in the past of its own clock.
    rs::testing::simulation sim;
    const shifted_clock other{sim.clock()};
    rs::pipeline nested{rs::timeout{5s, other}, rs::timeout{1s, sim.clock()}};
    std::optional<nanoseconds> seen, on_inner, on_other;
    const auto result = sim.run(nested.execute_outcome([&](const rs::context& ctx) -> rs::task<int> {
        seen = ctx.deadline();
        on_inner = ctx.deadline_for(sim.clock());
        on_other = ctx.deadline_for(other);
        co_await sim.sleep_for(10ms, ctx.stop_token());
        co_return 1;
    }));
    CHECK(result.has_value());
    CHECK(sim.now() == 10ms);
    CHECK(seen == std::optional<nanoseconds>{1s});
    CHECK(on_inner == std::optional<nanoseconds>{1s});
    CHECK_FALSE(on_other.has_value()); // the deadline is the inner clock's, not the other's

    // Inside out: the inner timeout is the one on the other clock, and its deadline is kept.
    rs::pipeline inside_out{rs::timeout{1s, sim.clock()}, rs::timeout{5s, other}};
    const auto start = sim.now();
    (void)sim.run(inside_out.execute_outcome([&](const rs::context& ctx) -> rs::task<int> {
        on_inner = ctx.deadline_for(sim.clock());
        on_other = ctx.deadline_for(other);
        co_return 1;
    }));
    CHECK_FALSE(on_inner.has_value());
    CHECK(on_other == std::optional<nanoseconds>{start + 5s - std::chrono::hours{1}});

    // On one clock, the earlier deadline is still kept, whichever timeout set it.
    rs::pipeline same{rs::timeout{1s, sim.clock()}, rs::timeout{5s, sim.clock()}};
    const auto later = sim.now();
    (void)sim.run(same.execute_outcome([&](const rs::context& ctx) -> rs::task<int> {
        on_inner = ctx.deadline_for(sim.clock());
        co_return 1;
    }));
    CHECK(on_inner == std::optional<nanoseconds>{later + 1s});
}

TEST_CASE("timeout: nested on two real clocks with different epochs, a fast call succeeds",
          "[timeout][regression]") {
    rs::event_loop loop;
    rs::pipeline nested{rs::timeout{5s, steady_behind{}}, rs::timeout{1s}};
    std::optional<nanoseconds> seen;
    const auto result = loop.run(nested.execute_outcome([&](const rs::context& ctx) -> rs::task<int> {
        seen = ctx.deadline_for(rs::steady_clock{});
        co_await rs::steady_clock{}.sleep_for(10ms, ctx.stop_token());
        co_return 1;
    }));
    REQUIRE(result.has_value());
    REQUIRE(seen.has_value());
    const auto left = *seen - rs::steady_clock{}.now().time_since_epoch();
    CHECK(left > 0ns);
    CHECK(left < 1s);
}

} // namespace test_model_policies
