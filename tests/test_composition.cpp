// SPDX-License-Identifier: MIT
// Policies composed in pipelines: the order decides what each one sees.
#include "alloc_counter.hpp"
#include "catch.hpp"

#include <resilience/fallback.hpp>
#include <resilience/resilience.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>

#include <chrono>
#include <stdexcept>

namespace test_composition {

namespace rs = resilience;
using namespace std::chrono_literals;
using rs::testing::script;
using rs::testing::scripted_action;
using rs::testing::simulation;

namespace {
rs::retry_options fixed_retry(int attempts, std::chrono::nanoseconds wait) {
    return {.max_attempts = attempts, .backoff = rs::constant_backoff{wait, rs::jitter::none}};
}
} // namespace

TEST_CASE("composition: retry outside a breaker stops once the breaker opens, sleeping no further backoff",
          "[composition]") {
    simulation sim;
    scripted_action down{sim.clock(), script<int>{.failures = 1000, .latency = 100ms}};
    rs::circuit_breaker breaker{{.failure_threshold = 2, .break_duration = 1min}, sim.clock()};
    rs::pipeline policy{rs::retry{fixed_retry(10, 1s), sim.clock()}, breaker, rs::timeout{5s, sim.clock()}};

    auto result = sim.run(policy.execute_outcome(down));
    // Attempt 1 fails at 100ms, attempt 2 at 1.2s and opens the breaker; attempt 3 (at 2.2s) is refused
    // without a call, and the default classifier does not retry circuit_open_error: the call ends there.
    CHECK(down.calls() == 2);
    CHECK(sim.now() == 2s + 200ms);
    REQUIRE(result.has_failure());
    REQUIRE(result.error().is<rs::circuit_open_error>());
    CHECK(result.error().as<rs::circuit_open_error>()->retry_after() == 1min - 1s);
    CHECK(breaker.state() == rs::circuit_state::open);
}

TEST_CASE("composition: a breaker outside a retry counts one exhausted retry as one failure",
          "[composition]") {
    simulation sim;
    scripted_action down{sim.clock(), script<int>{.failures = 1000, .latency = 10ms}};
    rs::circuit_breaker breaker{{.failure_threshold = 2, .break_duration = 1min}, sim.clock()};
    rs::pipeline policy{breaker, rs::retry{fixed_retry(3, 100ms), sim.clock()}};

    CHECK_THROWS_AS(sim.run(policy.execute(down)), rs::testing::scripted_failure);
    CHECK(down.calls() == 3);
    CHECK(breaker.metrics().consecutive_failures == 1);
    CHECK(breaker.state() == rs::circuit_state::closed);

    CHECK_THROWS_AS(sim.run(policy.execute(down)), rs::testing::scripted_failure);
    CHECK(down.calls() == 6);
    CHECK(breaker.state() == rs::circuit_state::open);

    CHECK_THROWS_AS(sim.run(policy.execute(down)), rs::circuit_open_error);
    CHECK(down.calls() == 6); // refused without running the retry at all
}

TEST_CASE("composition: a timeout inside the breaker counts every expired attempt as a failure",
          "[composition]") {
    simulation sim;
    scripted_action stalls{sim.clock(), script<int>{.latency = 1h}};
    rs::circuit_breaker breaker{{.failure_threshold = 3, .break_duration = 10s}, sim.clock()};
    rs::pipeline policy{breaker, rs::timeout{200ms, sim.clock()}};
    for (int i = 0; i < 3; ++i)
        CHECK_THROWS_AS(sim.run(policy.execute(stalls)), rs::timeout_error);
    CHECK(sim.now() == 600ms);
    CHECK(breaker.state() == rs::circuit_state::open);
    CHECK(stalls.in_flight() == 0); // every stalled attempt was stopped and finished
}

TEST_CASE("composition: fallback outermost answers for whatever the inner policies gave up on",
          "[composition]") {
    simulation sim;
    scripted_action down{sim.clock(), script<int>{.failures = 1000, .latency = 50ms}};
    rs::pipeline policy{rs::fallback{-1}, rs::retry{fixed_retry(3, 1s), sim.clock()},
                        rs::timeout{1s, sim.clock()}};
    CHECK(sim.run(policy.execute(down)) == -1);
    CHECK(down.calls() == 3);
    CHECK(sim.now() == 2s + 150ms);
}

TEST_CASE("composition: the README's virtual-time example holds exactly", "[composition][docs]") {
    rs::testing::simulation sim;
    rs::testing::scripted_action flaky{
        sim.clock(), rs::testing::script<int>{.failures = 2, .latency = 100ms, .value = 42}};
    rs::retry retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1s, rs::jitter::none}}, sim.clock()};
    REQUIRE(sim.run(retry.execute(flaky)) == 42);
    REQUIRE(sim.now() == 2300ms);
}

namespace {
struct response {
    int status = 0;
};
} // namespace

TEST_CASE("composition: one rs::classifier handles a returned 503 in all three: the retry retries it, the "
          "breaker counts it, the fallback substitutes it",
          "[composition]") {
    simulation sim;
    int asked = 0;
    const rs::classifier unavailable = [&asked](const rs::outcome<response>& o) {
        ++asked;
        return !o || o.value().status == 503;
    };
    rs::circuit_breaker breaker{
        {.failure_threshold = 3, .break_duration = 1min, .should_handle = unavailable}, sim.clock()};
    rs::pipeline policy{
        rs::fallback{response{299}, {.should_handle = unavailable}},
        rs::retry{{.max_attempts = 3,
                   .backoff = rs::constant_backoff{1s, rs::jitter::none},
                   .should_handle = unavailable},
                  sim.clock()},
        breaker,
    };
    int calls = 0;
    auto always_503 = [&]() -> rs::task<response> {
        ++calls;
        co_await sim.sleep_for(10ms);
        co_return response{503};
    };
    const response r = sim.run(policy.execute(always_503));
    // Three attempts (at 0s, 1.01s, 2.02s), each a 503: the breaker counts three failures and opens;
    // the retry gives up with the last 503, which the fallback replaces.
    CHECK(calls == 3);
    CHECK(r.status == 299);
    CHECK(sim.now() == 2030ms);
    CHECK(breaker.state() == rs::circuit_state::open);
    CHECK(breaker.metrics().consecutive_failures == 3);
    // Per attempt: the breaker and the retry (the last attempt too, so that its telemetry says it was
    // handled); the fallback once.
    CHECK(asked == 3 + 3 + 1);

    // A predicate that only looks at failures is accepted by all three as well.
    const auto server_error = [](const rs::failure& f) { return f.is<std::runtime_error>(); };
    rs::pipeline plain{
        rs::fallback{response{1}, {.should_handle = server_error}},
        rs::retry{{.should_handle = server_error}, sim.clock()},
        rs::circuit_breaker{{.failure_threshold = 1, .should_handle = server_error}, sim.clock()}};
    CHECK(sim.run(plain.execute(always_503)).status == 503);
}

TEST_CASE("composition: with pipeline{retry, breaker}, a throwing breaker classifier or on_state_change "
          "becomes the call's failure, and execute_outcome does not throw",
          "[composition]") {
    simulation sim;
    scripted_action down{sim.clock(), script<int>{.failures = 1000, .latency = 10ms}};
    SECTION("the classifier") {
        rs::circuit_breaker breaker{
            {.failure_threshold = 1,
             .should_handle = [](const rs::failure&) -> bool { throw std::domain_error("classifier"); }},
            sim.clock()};
        rs::pipeline policy{rs::retry{fixed_retry(3, 1s), sim.clock()}, breaker};
        rs::outcome<int> r = 0;
        REQUIRE_NOTHROW(r = sim.run(policy.execute_outcome(down)));
        REQUIRE(r.has_failure());
        CHECK(r.error().is<std::domain_error>()); // a logic_error: the retry does not retry it
        CHECK(down.calls() == 1);
        CHECK(breaker.state() == rs::circuit_state::closed); // recorded as neither
    }
    SECTION("on_state_change") {
        rs::circuit_breaker breaker{
            {.failure_threshold = 2,
             .break_duration = 1min,
             .on_state_change = [](const rs::state_change_event&) { throw std::runtime_error("observer"); }},
            sim.clock()};
        rs::pipeline policy{rs::retry{fixed_retry(5, 1s), sim.clock()}, breaker};
        rs::outcome<int> r = 0;
        REQUIRE_NOTHROW(r = sim.run(policy.execute_outcome(down)));
        // The second attempt opens the breaker, and fails with the observer's exception: transient,
        // so the retry tries again and the open breaker refuses, which ends the loop.
        REQUIRE(r.has_failure());
        CHECK(r.error().is<rs::circuit_open_error>());
        CHECK(down.calls() == 2);
        CHECK(breaker.state() == rs::circuit_state::open);
        CHECK(sim.now() == 2020ms);
    }
}

#ifdef RESILIENCE_TESTS_COUNT_ALLOCATIONS
TEST_CASE("composition: the success path of retry, breaker, timeout, bulkhead and limiter allocates nothing",
          "[composition][alloc]") {
    simulation sim;
    rs::pipeline policy{rs::retry{{.max_attempts = 3}, sim.clock()},
                        rs::circuit_breaker{{.failure_threshold = 5}, sim.clock()},
                        rs::timeout{1s, sim.clock()}, rs::bulkhead{{.max_concurrent_calls = 4}, sim.clock()},
                        rs::rate_limiter{{.token_limit = 1'000'000, .tokens_per_second = 1e9}, sim.clock()}};
    auto action = []() -> rs::task<int> { co_return 1; };
    std::size_t allocations = 0;
    int sum = 0;
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 100; ++i)
            sum += co_await policy.execute(action); // warm-up: frames, pools
        resilience_tests::counting_allocations counting;
        for (int i = 0; i < 1'000; ++i)
            sum += co_await policy.execute(action);
        allocations = counting.count();
    }());
    CHECK(sum == 1'100);
    CHECK(allocations == 0);
}
#endif

TEST_CASE("composition: a call stopped before it starts is refused by the policy that saw it, by name",
          "[composition][names]") {
    rs::testing::simulation sim;
    resilience::stop_source caller;
    caller.request_stop();
    const auto name_of = [](const rs::outcome<int>& o) {
        REQUIRE(o.has_failure());
        const auto* e = o.error().as<rs::cancelled_error>();
        REQUIRE(e);
        return std::string(e->policy_name());
    };
    const auto answer = []() -> rs::task<int> { co_return 42; };
    const rs::timeout deadline{{.name = "deadline", .timeout = 1s}, sim.clock()};
    const rs::bulkhead slots{{.name = "slots", .max_concurrent_calls = 1}, sim.clock()};
    const rs::rate_limiter bucket{{.name = "bucket", .token_limit = 1, .tokens_per_second = 1}, sim.clock()};
    const rs::sliding_window_limiter window{{.name = "window", .permit_limit = 1, .window = 1s}, sim.clock()};
    const rs::single_flight<int, int> flights{{.name = "flights"}};
    sim.run([&]() -> rs::task<void> {
        CHECK(name_of(co_await deadline.execute_outcome(answer, caller.get_token())) == "deadline");
        CHECK(name_of(co_await slots.execute_outcome(answer, caller.get_token())) == "slots");
        CHECK(name_of(co_await bucket.execute_outcome(answer, caller.get_token())) == "bucket");
        CHECK(name_of(co_await window.execute_outcome(answer, caller.get_token())) == "window");
        CHECK(name_of(co_await flights.run_outcome(1, answer, caller.get_token())) == "flights");
        // The outermost policy sees the stop first.
        const rs::pipeline both{slots, deadline};
        CHECK(name_of(co_await both.execute_outcome(answer, caller.get_token())) == "slots");
    }());
    CHECK(flights.name() == "flights");
}

} // namespace test_composition
