// SPDX-License-Identifier: MIT
// The compiled mode (RESILIENCE_SEPARATE_COMPILATION, resilience::compiled): a program of two
// translation units that use the policies on steady_clock, whose code is in the library, and a policy on
// virtual time, which the headers still instantiate. Linking proves one definition of each; the cases
// check that the library's code is the code that runs.

#include "catch.hpp"
#include "second_unit.hpp"

#include <resilience/resilience.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>

#include <chrono>
#include <stdexcept>
#include <string>

#if !defined(RESILIENCE_SEPARATE_COMPILATION)
#error "this test is built against resilience::compiled, which defines RESILIENCE_SEPARATE_COMPILATION"
#endif

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

rs::task<int> succeed() {
    co_return 42;
}
rs::task<int> fail() {
    throw std::runtime_error("down");
    co_return 0;
}

} // namespace

TEST_CASE("compiled mode: a pipeline of five on steady_clock runs from the library's code", "[compiled]") {
    rs::pipeline p{rs::retry{{.max_attempts = 2, .backoff = rs::constant_backoff{1ms, rs::jitter::none}}},
                   rs::circuit_breaker{{.failure_threshold = 5}}, rs::timeout{1s},
                   rs::bulkhead{{.max_concurrent_calls = 8}},
                   rs::rate_limiter{{.token_limit = 10, .tokens_per_second = 10}}};
    CHECK(rs::sync_wait(p.execute([] { return succeed(); })) == 42);
    const auto failed = rs::sync_wait(p.execute_outcome([] { return fail(); }));
    REQUIRE(failed.has_failure());
    const auto* cause = failed.error().as<std::runtime_error>();
    REQUIRE(cause);
    CHECK(std::string(cause->what()) == "down");
}

TEST_CASE("compiled mode: a breaker made in one file and driven in another shares its state", "[compiled]") {
    rs::circuit_breaker breaker{{.failure_threshold = 2, .break_duration = 1h}};
    CHECK(second_unit::fail_through(breaker, 2) == 2);
    CHECK(breaker.state() == rs::circuit_state::open);
    const auto refused = rs::sync_wait(breaker.execute_outcome([] { return succeed(); }));
    REQUIRE(refused.has_failure());
    CHECK(refused.error().code() == rs::errc::circuit_open);
}

TEST_CASE("compiled mode: invalid options are refused by the library's checks, naming field and value",
          "[compiled]") {
    try {
        rs::circuit_breaker breaker{{.name = "payments", .failure_threshold = 0}};
        FAIL("a breaker with failure_threshold 0 was made");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()) ==
              "resilience::circuit_breaker (payments): failure_threshold must be positive, got 0");
    }
    CHECK_THROWS_AS(second_unit::make_bulkhead(0), std::invalid_argument);
    CHECK(second_unit::make_bulkhead(3).limit() == 3);
}

TEST_CASE("compiled mode: a policy on virtual time is instantiated by the headers, as header-only",
          "[compiled]") {
    rs::testing::simulation sim;
    rs::timeout limit{2s, sim.clock()};
    rs::testing::scripted_action slow{sim.clock(), rs::testing::script<int>{.latency = 10s, .value = 1}};
    auto result = sim.run(limit.execute_outcome(slow));
    REQUIRE(result.has_failure());
    CHECK(result.error().code() == rs::errc::timeout);
    CHECK(sim.now() == 2s);
    CHECK(slow.stopped() == 1);
}
