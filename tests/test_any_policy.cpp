// SPDX-License-Identifier: MIT
#include "alloc_counter.hpp"
#include "catch.hpp"

#include <resilience/any_policy.hpp>
#include <resilience/resilience.hpp>
#include <resilience/testing/simulation.hpp>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace test_any_policy {

namespace rs = resilience;
using namespace std::chrono_literals;
using rs::testing::simulation;

namespace {

// A service that stores its policy without naming the pipeline's type.
class quote_client {
public:
    explicit quote_client(rs::any_policy<int> policy) : policy_(std::move(policy)) {}
    rs::task<int> quote(simulation& sim, int failures_first, int& calls) const {
        return policy_.execute([&sim, &calls, failures_first](resilience::stop_token st) -> rs::task<int> {
            ++calls;
            co_await sim.sleep_for(10ms, st);
            if (calls <= failures_first)
                throw std::runtime_error("unavailable");
            co_return 7;
        });
    }

private:
    rs::any_policy<int> policy_;
};

} // namespace

TEST_CASE("any_policy: a member holds a whole pipeline, which behaves as it does unwrapped", "[any_policy]") {
    simulation sim;
    const quote_client client{rs::pipeline{
        rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{100ms, rs::jitter::none}}, sim.clock()},
        rs::timeout{1s, sim.clock()}}};
    int calls = 0;
    sim.run([&]() -> rs::task<void> {
        const int quoted = co_await client.quote(sim, 2, calls);
        CHECK(quoted == 7);
        // Two failures, two backoffs: 10 + 100 + 10 + 100 + 10 ms.
        CHECK(sim.now() == 230ms);
        CHECK(calls == 3);
    }());
}

TEST_CASE("any_policy: failures, refusals and execute_outcome come through unchanged", "[any_policy]") {
    simulation sim;
    const rs::circuit_breaker breaker{{.failure_threshold = 1, .break_duration = 5s}, sim.clock()};
    const rs::any_policy<int> policy = breaker;
    sim.run([&]() -> rs::task<void> {
        auto failed =
            co_await policy.execute_outcome([]() -> rs::task<int> { throw std::logic_error("bad"); });
        REQUIRE(failed.has_failure());
        CHECK(failed.failure().is<std::logic_error>());
        auto refused = co_await policy.execute_outcome([]() -> rs::task<int> { co_return 1; });
        REQUIRE(refused.has_failure());
        CHECK(refused.failure().is<rs::circuit_open_error>());
        // The copy inside the any_policy is the same breaker.
        CHECK(breaker.state() == rs::circuit_state::open);
        bool refused_again = false;
        try {
            (void)co_await policy.execute([]() -> rs::task<int> { co_return 1; });
        } catch (const rs::circuit_open_error&) {
            refused_again = true;
        }
        CHECK(refused_again);
    }());
}

TEST_CASE("any_policy: composes in a pipeline, and copies hold the same policy", "[any_policy]") {
    simulation sim;
    std::vector<int> attempts;
    const rs::any_policy<int> inner = rs::timeout{50ms, sim.clock()};
    const rs::any_policy<int> copy = inner;
    CHECK(copy == inner);
    CHECK_FALSE(copy == rs::any_policy<int>{rs::timeout{50ms, sim.clock()}});
    const rs::pipeline outer{
        rs::retry{{.max_attempts = 2, .backoff = rs::constant_backoff{0ms, rs::jitter::none}}, sim.clock()},
        copy};
    sim.run([&]() -> rs::task<void> {
        auto result = co_await outer.execute_outcome([&](const rs::context& ctx) -> rs::task<int> {
            attempts.push_back(ctx.attempt());
            co_await sim.sleep_for(1h, ctx.stop_token()); // stopped by the timeout at 50 ms
            if (ctx.stop_requested())
                throw rs::cancelled_error{};
            co_return 1;
        });
        REQUIRE(result.has_failure());
        CHECK(result.failure().is<rs::timeout_error>());
        CHECK(sim.now() == 100ms);
    }());
    CHECK(attempts == std::vector<int>{1, 2});
}

#if defined(RESILIENCE_TESTS_COUNT_ALLOCATIONS)
TEST_CASE("any_policy: the success path allocates nothing after warm-up", "[any_policy][alloc]") {
    const rs::any_policy<int> policy = rs::pipeline{rs::retry{}, rs::circuit_breaker{}};
    const auto answer = []() -> rs::task<int> { co_return 3; };
    std::size_t allocations = 1;
    int sum = 0;
    rs::sync_wait([&]() -> rs::task<void> {
        sum += co_await policy.execute(answer); // warms the frame cache
        resilience_tests::counting_allocations counting;
        for (int i = 0; i < 100; ++i)
            sum += co_await policy.execute(answer);
        allocations = counting.count();
    }());
    CHECK(sum == 303);
    CHECK(allocations == 0);
}
#endif

TEST_CASE("any_policy: a rate limiter behind it queues, refuses and reports as it does in a pipeline",
          "[any_policy][rate_limiter]") {
    // any_policy runs its policy through `run`: the limiter's waiting form, the same wait as in a
    // pipeline's frame.
    simulation sim;
    std::vector<std::pair<rs::telemetry_kind, std::chrono::nanoseconds>> events;
    const rs::rate_limiter limiter{
        {.token_limit = 1,
         .tokens_per_second = 1,
         .queue_limit = 1,
         .telemetry = rs::telemetry_listener{[&events](const rs::telemetry_event& e) {
             events.emplace_back(e.kind, e.duration);
         }}},
        sim.clock()};
    const rs::any_policy<int> erased{limiter};
    std::vector<std::chrono::nanoseconds> ran;
    auto action = [&]() -> rs::task<int> {
        ran.push_back(sim.now());
        co_return 1;
    };
    auto [a, b, c] = sim.run(rs::when_all(erased.execute_outcome(action), erased.execute_outcome(action),
                                          erased.execute_outcome(action)));
    CHECK(a.has_value());
    CHECK(b.has_value()); // waited for the token due at 1s
    REQUIRE(c.has_failure());
    CHECK(c.error().is<rs::rate_limited_error>());
    CHECK(ran == std::vector<std::chrono::nanoseconds>{0s, 1s});
    CHECK(events == std::vector<std::pair<rs::telemetry_kind, std::chrono::nanoseconds>>{
                        {rs::telemetry_kind::rejection, 0s}, {rs::telemetry_kind::queue_wait, 1s}});
}

} // namespace test_any_policy
