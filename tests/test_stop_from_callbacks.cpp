// SPDX-License-Identifier: MIT
// A caller's stop requested from inside a policy's own user callbacks (a classifier, a listener,
// on_state_change, on_retry, a key function), between the policy's look at the caller's token and the
// start of new work: the work does not start, and the call ends as the policy's documentation says of
// a stopped caller. The hedge's own case is in test_hedge.cpp.

#include "catch.hpp"
#include "support.hpp"

#include <resilience/bulkhead.hpp>
#include <resilience/circuit_breaker.hpp>
#include <resilience/fallback.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/retry.hpp>
#include <resilience/retry_stream.hpp>
#include <resilience/single_flight.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/when_all.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace test_stop_from_callbacks {

namespace rs = resilience;
using namespace std::chrono_literals;
using rs::testing::simulation;

namespace {

template <class T = int>
auto action(simulation& sim, rs::testing::script<T> s) {
    return rs::testing::scripted_action{sim.clock(), std::move(s)};
}

} // namespace

TEST_CASE("fallback: a caller's stop requested from should_handle or the listener gets no substitute",
          "[fallback][stop]") {
    simulation sim;
    resilience::stop_source caller;
    int substitutes = 0;
    const auto substitute = [&](const rs::failure&) {
        ++substitutes;
        return -1;
    };
    auto act = action(sim, {.failures = 1, .latency = 10ms});
    std::optional<rs::outcome<int>> result;
    SECTION("should_handle") {
        rs::fallback fb{substitute, {.should_handle = [&](const rs::failure&) {
                            caller.request_stop();
                            return true;
                        }}};
        result = sim.run(fb.execute_outcome(act, caller.get_token()));
    }
    SECTION("the fallback's telemetry listener") {
        const auto not_cancelled = [](const rs::failure& f) { return !rs::is_cancellation(f); };
        rs::fallback fb{substitute,
                        {.should_handle = not_cancelled, .telemetry = [&](const rs::telemetry_event& e) {
                             if (e.kind == rs::telemetry_kind::fallback)
                                 caller.request_stop();
                         }}};
        result = sim.run(fb.execute_outcome(act, caller.get_token()));
    }
    // No substitute for a caller that stopped, and the call ends as a stopped call does (docs/core.md,
    // "A call its caller stopped"): with cancelled_error, not the failure the substitute would have answered.
    REQUIRE(result->has_failure());
    CHECK(result->error().is<rs::cancelled_error>());
    CHECK(substitutes == 0);
    CHECK(sim.now() == 10ms);
}

TEST_CASE("circuit_breaker: a caller's stop requested while the breaker turns half-open admits no probe",
          "[circuit_breaker][stop]") {
    simulation sim;
    resilience::stop_source caller;
    bool stop_on_change = false;
    auto act = action(sim, {.failures = 1, .value = 7});
    std::optional<rs::circuit_breaker<rs::testing::virtual_clock>> breaker;
    SECTION("on_state_change") {
        breaker.emplace(rs::circuit_breaker_options{.failure_threshold = 1,
                                                    .break_duration = 1s,
                                                    .on_state_change =
                                                        [&](const rs::state_change_event& e) {
                                                            if (stop_on_change &&
                                                                e.to() == rs::circuit_state::half_open)
                                                                caller.request_stop();
                                                        }},
                        sim.clock());
    }
    SECTION("the breaker's telemetry listener") {
        breaker.emplace(
            rs::circuit_breaker_options{
                .failure_threshold = 1,
                .break_duration = 1s,
                .telemetry = rs::telemetry_listener{[&](const rs::telemetry_event& e) {
                    if (stop_on_change && e.kind == rs::telemetry_kind::state_change)
                        caller.request_stop();
                }}},
            sim.clock());
    }
    CHECK(sim.run(breaker->execute_outcome(act)).has_failure()); // opens it
    REQUIRE(breaker->state() == rs::circuit_state::open);
    sim.run_for(1s);
    stop_on_change = true;
    auto result = sim.run(breaker->execute_outcome(act, caller.get_token()));
    REQUIRE(result.has_failure());
    CHECK(rs::is_cancellation(result.error()));
    CHECK(act.calls() == 1); // the stopped call never ran the action
    // The probe slot it did not use is free: the next call is the probe, and closes the breaker.
    stop_on_change = false;
    CHECK(sim.run(breaker->execute(act)) == 7);
    CHECK(breaker->state() == rs::circuit_state::closed);
}

TEST_CASE("bulkhead: a caller's stop requested from the queue_wait listener runs nothing",
          "[bulkhead][stop]") {
    simulation sim;
    resilience::stop_source caller;
    const rs::telemetry_listener stop_when_admitted{[&](const rs::telemetry_event& e) {
        if (e.kind == rs::telemetry_kind::queue_wait)
            caller.request_stop();
    }};
    auto holder = action(sim, {.latency = 100ms, .value = 1});
    auto waiter = action(sim, {.latency = 10ms, .value = 2});
    const auto check = [&](const auto& bh) {
        auto [first, second] =
            sim.run(rs::when_all(bh.execute_outcome(holder), bh.execute_outcome(waiter, caller.get_token())));
        REQUIRE(first.has_value());
        REQUIRE(second.has_failure());
        CHECK(rs::is_cancellation(second.error()));
        CHECK(waiter.calls() == 0);
        CHECK(bh.in_flight() == 0);
        CHECK(sim.now() == 100ms);
    };
    SECTION("waiting in the pipeline's frame") {
        rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 1, .telemetry = stop_when_admitted},
                        sim.clock()};
        check(bh);
    }
    SECTION("waiting in run (a queue timeout on a clock without loop timers)") {
        rs::bulkhead bh{{.max_concurrent_calls = 1,
                         .queue_limit = 1,
                         .queue_timeout = 1s,
                         .telemetry = stop_when_admitted},
                        resilience_tests::shifted_clock{sim.clock()}};
        check(bh);
    }
}

TEST_CASE("rate_limiter: a caller's stop requested from the queue_wait listener runs nothing",
          "[rate_limiter][stop]") {
    simulation sim;
    resilience::stop_source caller;
    rs::rate_limiter rl{{.token_limit = 1,
                         .tokens_per_second = 10,
                         .queue_limit = 1,
                         .telemetry = rs::telemetry_listener{[&](const rs::telemetry_event& e) {
                             if (e.kind == rs::telemetry_kind::queue_wait)
                                 caller.request_stop();
                         }}},
                        sim.clock()};
    auto first_act = action(sim, {.value = 1});
    auto waiter = action(sim, {.latency = 10ms, .value = 2});
    CHECK(sim.run(rl.execute(first_act)) == 1); // spends the only token
    auto result = sim.run(rl.execute_outcome(waiter, caller.get_token()));
    REQUIRE(result.has_failure());
    CHECK(rs::is_cancellation(result.error()));
    CHECK(waiter.calls() == 0);
    CHECK(sim.now() == 100ms);
}

namespace {
// A key hash that requests a stop on `*src` when asked (a user's key function).
struct stopping_hash {
    resilience::stop_source* src;
    std::size_t operator()(const std::string& k) const {
        if (src)
            src->request_stop();
        return std::hash<std::string>{}(k);
    }
};
} // namespace

TEST_CASE("single_flight: a caller's stop requested from the key's hash starts no shared call",
          "[single_flight][stop]") {
    simulation sim;
    resilience::stop_source caller;
    rs::single_flight<std::string, int, stopping_hash> flights{{}, stopping_hash{&caller}};
    auto act = action(sim, {.latency = 10ms, .value = 1});
    std::optional<rs::outcome<int>> result;
    SECTION("run") {
        result = sim.run(flights.run_outcome("k", act, caller.get_token()));
    }
    SECTION("the keyed policy") {
        result = sim.run(flights.policy("k").execute_outcome(act, caller.get_token()));
    }
    REQUIRE(result->has_failure());
    CHECK(rs::is_cancellation(result->error()));
    CHECK(act.calls() == 0);
    CHECK(flights.in_flight() == 0);
}

// Checked and found right; kept as regression guards for the same class.
TEST_CASE("retry: a caller's stop requested from on_retry, a listener or the classifier with no backoff "
          "starts no attempt",
          "[retry][stop]") {
    simulation sim;
    resilience::stop_source caller;
    auto act = action(sim, {.failures = 5, .latency = 10ms});
    rs::retry_options o{.max_attempts = 3, .backoff = rs::constant_backoff{0ms}};
    SECTION("on_retry") {
        o.on_retry = [&](const rs::retry_event&) { caller.request_stop(); };
    }
    SECTION("the listener") {
        o.telemetry = rs::telemetry_listener{[&](const rs::telemetry_event& e) {
            if (e.kind == rs::telemetry_kind::attempt)
                caller.request_stop();
        }};
    }
    SECTION("should_handle") {
        o.should_handle = [&](const rs::failure&) {
            caller.request_stop();
            return true;
        };
    }
    rs::retry r{o, sim.clock()};
    auto result = sim.run(r.execute_outcome(act, caller.get_token()));
    REQUIRE(result.has_failure());
    CHECK(act.calls() == 1);
    CHECK(sim.now() == 10ms);
}

TEST_CASE("retry_stream: a consumer's stop requested from the classifier with no backoff restarts nothing",
          "[retry_stream][stop]") {
    simulation sim;
    resilience::stop_source consumer;
    int factories = 0;
    auto stream = rs::retry_stream(
        [&]() -> rs::async_generator<int> {
            ++factories;
            throw std::runtime_error("broken");
            co_yield 1;
        },
        rs::stream_retry_options{.max_attempts = 4,
                                 .backoff = rs::constant_backoff{0ms},
                                 .should_handle =
                                     [&](const rs::failure&) {
                                         consumer.request_stop();
                                         return true;
                                     }},
        sim.clock(), consumer.get_token());
    bool threw = false;
    sim.run([&]() -> rs::task<void> {
        try {
            while (co_await stream.next()) {
            }
        } catch (const std::runtime_error&) {
            threw = true;
        }
    }());
    CHECK(threw);
    CHECK(factories == 1);
}

} // namespace test_stop_from_callbacks
