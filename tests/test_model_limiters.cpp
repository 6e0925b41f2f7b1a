// SPDX-License-Identifier: MIT
// The token bucket and the sliding window against their reference models (tests/models.hpp) on
// seeded random scenarios, those two and the bulkhead also with reconfigurations while calls run,
// and the scenarios the models found or that were reported, pinned.
//
// A failing scenario prints its seed; replay it alone with
//     RESILIENCE_MODEL_SEED=<seed> RESILIENCE_MODEL_SCENARIOS=1 resilience_tests "[model]"
// and run many more with `scripts/dev model N`.

#include "catch.hpp"
#include "model_scenarios.hpp"

#include <resilience/rate_limiter.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/testing/simulation.hpp>

#include <chrono>
#include <cmath>
#include <optional>
#include <vector>

namespace test_model_limiters {

namespace rs = resilience;
namespace rm = resilience_models;
using rm::run_scenarios;
using namespace std::chrono_literals;
using std::chrono::nanoseconds;

namespace {

// Takes a permit at the current instant and writes down when it was admitted or what it was told.
template <class Limiter>
rs::task<void> take(rs::testing::simulation& sim, const Limiter& limiter, std::vector<nanoseconds>& admitted,
                    std::vector<nanoseconds>& retry_after) {
    auto r = co_await limiter.take_outcome();
    if (r.has_value())
        admitted.push_back(sim.now());
    else if (auto* e = r.error().template as<rs::rate_limited_error>())
        retry_after.push_back(e->retry_after());
}

} // namespace

TEST_CASE("model: the token bucket admits, queues and refuses as its model", "[model][rate_limiter]") {
    run_scenarios(400, rm::check_token_bucket);
}

TEST_CASE("model: the sliding window admits, queues and refuses as its model", "[model][sliding_window]") {
    run_scenarios(400, rm::check_sliding_window);
}

TEST_CASE("model: the token bucket reconfigured while calls wait admits, queues and refuses as its model",
          "[model][rate_limiter][reconfigure]") {
    run_scenarios(400, rm::check_token_bucket_reconfigured);
}

TEST_CASE("model: the sliding window reconfigured while calls wait admits, queues and refuses as its model",
          "[model][sliding_window][reconfigure]") {
    run_scenarios(400, rm::check_sliding_window_reconfigured);
}

TEST_CASE("model: the bulkhead reconfigured while calls run and wait admits, queues and refuses as its model",
          "[model][bulkhead][reconfigure]") {
    run_scenarios(300, rm::check_bulkhead_reconfigured);
}

TEST_CASE("sliding window: retry_after counts every reuse of a permit on the segment grid",
          "[model][sliding_window][regression]") {
    // One permit, a window of three segments of 333333333 ns. Call 1 takes the permit at 0 (back
    // at 1 s), call 2 at 1 s (counted at 1.333 s, back at 2.333 s), call 3 at 2.333 s (counted at
    // 2.667 s, back at 3.667 s). Call 4 finds the queue full at 0: its permit is call 3's, at
    // 3.667 s. Adding whole windows to one grid point would say 3.333 s, before any permit is free.
    rs::testing::simulation sim;
    rs::sliding_window_limiter limiter{{.permit_limit = 1, .window = 1s, .segments = 3, .queue_limit = 2},
                                       sim.clock()};
    std::vector<nanoseconds> admitted, retry_after;
    for (int i = 0; i < 4; ++i)
        sim.spawn(take(sim, limiter, admitted, retry_after));
    sim.run_all();
    CHECK(admitted == std::vector<nanoseconds>{0ns, 1s, 2'333'333'332ns});
    CHECK(retry_after == std::vector<nanoseconds>{3'666'666'664ns});

    // The same at a later instant, with more reuses: every prediction is the instant it happens.
    rs::testing::simulation again;
    rs::sliding_window_limiter wide{{.permit_limit = 2, .window = 1s, .segments = 7, .queue_limit = 5},
                                    again.clock()};
    std::vector<nanoseconds> got, told;
    again.run([&]() -> rs::task<void> { co_await again.sleep_for(123'456'789ns); }());
    for (int i = 0; i < 8; ++i)
        again.spawn(take(again, wide, got, told));
    again.run_all();
    REQUIRE(got.size() == 7);
    REQUIRE(told.size() == 1);
    // The eighth caller had five waiting ahead of it, after two taken at once: the model says when
    // its permit comes back, the third reuse of one of the two, each rounded up to the grid.
    rm::sliding_window_meter model{2, 1'000'000'000, 7};
    REQUIRE(model.try_take(123'456'789));
    REQUIRE(model.try_take(123'456'789));
    CHECK(told[0].count() == model.available_at(123'456'789, 5) - 123'456'789);
    CHECK(got.back().count() == model.available_at(123'456'789, 4));
}

TEST_CASE("sliding window: a window of nanoseconds::max() saturates instead of overflowing",
          "[sliding_window][regression]") {
    // The return time of a permit is its segment boundary plus the window: past the largest
    // nanosecond count it is held there, so retry_after is far away and positive (a signed overflow
    // would make it about -8.3e18 ns).
    rs::testing::simulation sim;
    rs::sliding_window_limiter limiter{
        {.permit_limit = 1, .window = nanoseconds::max(), .queue_limit = 1, .queue_timeout = 10s},
        sim.clock()};
    std::vector<nanoseconds> admitted, retry_after;
    for (int i = 0; i < 3; ++i)
        sim.spawn(take(sim, limiter, admitted, retry_after));
    sim.run_until(1s);
    CHECK(admitted == std::vector<nanoseconds>{0ns});
    REQUIRE(retry_after.size() == 1);
    CHECK(retry_after[0] >= std::chrono::hours{24 * 365 * 100});
    CHECK(limiter.queued() == 1);
    CHECK(limiter.tokens() == 0.0);
    // The queued call gives up at its queue timeout, before the limiter and the loop go.
    sim.run_until(11s);
    CHECK(limiter.queued() == 0);
}

TEST_CASE("token bucket: a rate too slow for its interval to fit is refused, naming it",
          "[rate_limiter][regression]") {
    // 1e-300 tokens per second is a token every 1e309 ns: infinite as a double. The bucket's
    // arithmetic would turn NaN, which compares as "admit": every call would go through.
    const auto message = [](double rate) {
        try {
            rs::rate_limiter{{.token_limit = 1, .tokens_per_second = rate}};
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    CHECK_THAT(message(1e-300),
               Catch::Matchers::Contains("tokens_per_second") && Catch::Matchers::Contains("1e-300"));
    CHECK_THAT(message(1e-10), Catch::Matchers::Contains("at least 1e-9"));

    // The slowest rate accepted behaves: one token, then a refusal that says 31.7 years.
    rs::testing::simulation sim;
    rs::rate_limiter slow{
        {.token_limit = 1, .tokens_per_second = rs::rate_limiter_options::min_tokens_per_second},
        sim.clock()};
    int admitted = 0;
    std::optional<nanoseconds> retry_after;
    for (int i = 0; i < 10; ++i) {
        auto r = sim.run(slow.take_outcome());
        if (r.has_value())
            ++admitted;
        else
            retry_after = r.error().as<rs::rate_limited_error>()->retry_after();
    }
    CHECK(admitted == 1);
    CHECK(retry_after == std::optional<nanoseconds>{nanoseconds{1'000'000'000'000'000'000}});
    CHECK(std::isfinite(slow.tokens()));
    CHECK(slow.tokens() == 0.0);
}

} // namespace test_model_limiters
