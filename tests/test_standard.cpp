// SPDX-License-Identifier: MIT
// standard_pipeline: Polly's standard defaults, the two constraints between its options, and what it
// does to calls against a stalled or failing dependency, at exact virtual instants.

#include "catch.hpp"
#include "support.hpp"

#include <resilience/standard.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace test_standard {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_tests::invalid_argument_message;
using rs::testing::simulation;
using std::chrono::nanoseconds;

namespace {

using sim_pipeline = rs::standard_pipeline_t<rs::testing::virtual_clock, rs::seeded_random>;

// The waits the standard retry draws from a seeded_random{seed}: base * 2^(n-1), equal jitter.
std::vector<nanoseconds> standard_waits(std::uint64_t seed, nanoseconds base, int count) {
    rs::seeded_random replay{seed};
    const rs::exponential_backoff schedule{
        .initial = base, .factor = 2.0, .max = 30s, .jitter = rs::jitter::equal};
    std::vector<nanoseconds> waits;
    for (int n = 1; n <= count; ++n)
        waits.push_back(schedule.delay(n, replay));
    return waits;
}

// One attempt of a dependency that never answers: it waits until stopped, notes when it ran, and
// ends with cancelled_error.
struct span {
    nanoseconds start, end;
    bool operator==(const span&) const = default;
};
rs::task<int> stalled(simulation* sim, std::vector<span>* attempts, resilience::stop_token st) {
    const nanoseconds start = sim->now();
    co_await sim->sleep_for(24h, st);
    attempts->push_back({start, sim->now()});
    throw rs::cancelled_error{};
}

} // namespace

TEST_CASE("standard: the defaults are those of Polly's standard pipeline", "[standard]") {
    const rs::standard_options o;
    CHECK(o.max_attempts == 4);
    CHECK(o.base_delay == 2s);
    CHECK(o.attempt_timeout == 10s);
    CHECK(o.total_timeout == 30s);
    CHECK(o.failure_ratio == 0.1);
    CHECK(o.window == 30s);
    CHECK(o.minimum_throughput == 100);
    CHECK(o.break_duration == 5s);
    CHECK(o.name.empty());

    // The field order, for positional and designated initialisation alike.
    const rs::standard_options positional{"x", 5, 1s, 3s, 20s, 0.5, 6s, 7, 9s};
    CHECK(positional.max_attempts == 5);
    CHECK(positional.base_delay == 1s);
    CHECK(positional.attempt_timeout == 3s);
    CHECK(positional.total_timeout == 20s);
    CHECK(positional.failure_ratio == 0.5);
    CHECK(positional.window == 6s);
    CHECK(positional.minimum_throughput == 7);
    CHECK(positional.break_duration == 9s);
    CHECK(positional.name == "x");

    auto p = rs::standard_pipeline(o);
    CHECK(p.get<0>().options().timeout == 30s);
    CHECK(p.get<1>().options().max_attempts == 4); // the first attempt and three retries
    CHECK(p.get<1>().options().max_delay == 30s);
    const rs::circuit_breaker_options& b = p.get<2>().options();
    REQUIRE(b.sampling.has_value());
    CHECK(b.sampling->window == std::optional<nanoseconds>{30s});
    CHECK(b.sampling->failure_ratio == std::optional<double>{0.1});
    CHECK(b.sampling->minimum_throughput == std::optional<int>{100});
    CHECK_FALSE(b.failure_threshold.has_value());
    CHECK(b.break_duration == 5s);
    CHECK(p.get<3>().options().timeout == 10s);
    CHECK(p.get<2>().state() == rs::circuit_state::closed);
}

TEST_CASE("standard: each stage is named after the pipeline", "[standard]") {
    auto named = rs::standard_pipeline({.name = "billing"});
    CHECK(named.get<0>().name() == "billing.total_timeout");
    CHECK(named.get<1>().name() == "billing.retry");
    CHECK(named.get<2>().name() == "billing.circuit_breaker");
    CHECK(named.get<3>().name() == "billing.attempt_timeout");
    auto unnamed = rs::standard_pipeline({});
    CHECK(unnamed.get<0>().name() == "total_timeout");
    CHECK(unnamed.get<3>().name() == "attempt_timeout");
}

TEST_CASE("standard: an attempt timeout not below the total timeout is refused, naming the field",
          "[standard]") {
    const std::string equal = invalid_argument_message(
        [] { (void)rs::standard_pipeline({.attempt_timeout = 30s, .total_timeout = 30s, .window = 60s}); });
    CHECK(equal.find("attempt_timeout must be less than total_timeout") != std::string::npos);
    CHECK(equal.find("30000000000ns") != std::string::npos);
    const std::string above = invalid_argument_message([] {
        (void)rs::standard_pipeline(
            {.name = "api", .attempt_timeout = 31s, .total_timeout = 30s, .window = 62s});
    });
    CHECK(above.rfind("resilience::standard_pipeline (api): attempt_timeout", 0) == 0);
    CHECK(above.find("got 31000000000ns") != std::string::npos);
    // Just below is fine.
    CHECK_NOTHROW(rs::standard_pipeline({.attempt_timeout = 30s - 1ns, .total_timeout = 30s, .window = 60s}));
}

TEST_CASE("standard: a window under twice the attempt timeout is refused, naming the field", "[standard]") {
    const std::string msg = invalid_argument_message(
        [] { (void)rs::standard_pipeline({.attempt_timeout = 10s, .window = 20s - 1ns}); });
    CHECK(msg.find("window must be at least twice attempt_timeout") != std::string::npos);
    CHECK(msg.find("got 19999999999ns") != std::string::npos);
    CHECK_NOTHROW(rs::standard_pipeline({.attempt_timeout = 10s, .window = 20s}));
    // Odd durations: 2 * 5ns = 10ns is enough, 9ns is not.
    CHECK_NOTHROW(rs::standard_pipeline({.attempt_timeout = 5ns, .window = 10ns}));
    CHECK_THROWS_AS(rs::standard_pipeline({.attempt_timeout = 5ns, .window = 9ns}), std::invalid_argument);
    // Also when the breaker is made elsewhere.
    rs::circuit_breaker<> shared;
    CHECK_THROWS_AS(rs::standard_pipeline({.attempt_timeout = 10s, .window = 15s}, shared),
                    std::invalid_argument);
}

TEST_CASE("standard: values out of range are refused, naming the field", "[standard]") {
    const auto refused = [](rs::standard_options o) {
        return invalid_argument_message([&] { (void)rs::standard_pipeline(o); });
    };
    CHECK(refused({.max_attempts = 0}) ==
          "resilience::standard_pipeline: max_attempts must be at least 1, got 0");
    CHECK(refused({.base_delay = 0s}).find("base_delay must be positive") != std::string::npos);
    CHECK(refused({.attempt_timeout = -1s}).find("attempt_timeout must be positive") != std::string::npos);
    CHECK(refused({.total_timeout = 0s}).find("total_timeout must be positive") != std::string::npos);
    CHECK(refused({.failure_ratio = 0.0}).find("failure_ratio must be in (0, 1], got 0") !=
          std::string::npos);
    CHECK(refused({.failure_ratio = 1.5}).find("failure_ratio") != std::string::npos);
    CHECK(refused({.minimum_throughput = 0}).find("minimum_throughput must be positive") !=
          std::string::npos);
    CHECK(refused({.break_duration = 0s}).find("break_duration must be positive") != std::string::npos);
}

TEST_CASE("standard: no retries at all is allowed", "[standard]") {
    auto p = rs::standard_pipeline({.max_attempts = 1});
    CHECK(p.get<1>().options().max_attempts == 1);
}

TEST_CASE(
    "standard: a stalled dependency, attempts time out at 10 s and the total timeout ends the call at 30 s",
    "[standard]") {
    simulation sim;
    const sim_pipeline p = rs::standard_pipeline({.name = "api"}, sim.clock(), rs::seeded_random{2024});
    std::vector<span> attempts;
    auto r = sim.run(p.execute_outcome(stalled, &sim, &attempts));

    const std::vector<nanoseconds> d = standard_waits(2024, 2s, 2);
    CHECK(d[0] >= 1s);
    CHECK(d[0] <= 2s); // equal jitter: the upper half of 2 s
    CHECK(d[1] >= 2s);
    CHECK(d[1] <= 4s); // and of 4 s
    // Attempt 1 times out at 10 s; attempt 2 starts after the first wait and times out 10 s later;
    // attempt 3 starts after the second wait and is stopped by the total timeout at 30 s.
    const std::vector<span> expected{{0s, 10s}, {10s + d[0], 20s + d[0]}, {20s + d[0] + d[1], 30s}};
    CHECK(attempts == expected);
    CHECK(sim.now() == 30s);
    REQUIRE(r.has_failure());
    const auto* e = r.error().as<rs::timeout_error>();
    REQUIRE(e != nullptr);
    CHECK(e->policy_name() == "api.total_timeout");
    // The two attempt timeouts were recorded as failures; the stopped third attempt was not.
    const rs::circuit_metrics m = p.get<2>().metrics();
    CHECK(m.calls == 2);
    CHECK(m.failures == 2);
    CHECK(m.state == rs::circuit_state::closed);
}

TEST_CASE("standard: the same seed gives the same instants, another seed others", "[standard]") {
    const auto run = [](std::uint64_t seed) {
        simulation sim;
        const sim_pipeline p = rs::standard_pipeline({}, sim.clock(), rs::seeded_random{seed});
        std::vector<span> attempts;
        (void)sim.run(p.execute_outcome(stalled, &sim, &attempts));
        return attempts;
    };
    CHECK(run(5) == run(5));
    CHECK(run(5) != run(6));
}

TEST_CASE("standard: the breaker opens when the failure ratio is reached with enough throughput, "
          "and the retries it then refuses end their calls",
          "[standard]") {
    simulation sim;
    const sim_pipeline p = rs::standard_pipeline({.name = "api"}, sim.clock(), rs::seeded_random{99});
    int dependency_calls = 0;
    struct ended {
        int id;
        nanoseconds at;
        bool refused;            // by the open circuit
        nanoseconds retry_after; // when refused
    };
    std::vector<ended> log;
    // Calls 0..89 answer at once; calls 90..99 stall until their attempt times out.
    const auto dependency = [&](int id, resilience::stop_token st) -> rs::task<int> {
        ++dependency_calls;
        if (id >= 90) {
            co_await sim.sleep_for(24h, st);
            throw rs::cancelled_error{};
        }
        co_return id;
    };
    const auto caller = [&](int id) -> rs::task<void> {
        auto r = co_await p.execute_outcome(dependency, id);
        const auto* open = r.has_failure() ? r.error().as<rs::circuit_open_error>() : nullptr;
        log.push_back({id, sim.now(), open != nullptr, open ? open->retry_after() : 0ns});
    };
    for (int id = 0; id < 100; ++id)
        sim.spawn(caller(id));

    sim.run_until(10s - 1ns);
    CHECK(log.size() == 90); // the healthy calls, all at 0
    CHECK(p.get<2>().state() == rs::circuit_state::closed);
    CHECK(p.get<2>().metrics().calls == 90);

    // At 10 s the ten attempt timeouts are recorded: the hundredth call in the window makes ten
    // failures in a hundred, the ratio of 0.1, and the circuit opens at that instant.
    sim.run_until(10s);
    const rs::circuit_metrics m = p.get<2>().metrics();
    CHECK(m.state == rs::circuit_state::open);
    CHECK(m.calls == 100);
    CHECK(m.failures == 10);

    // Each stalled call's retry waits its draw and is refused by the open circuit, which the
    // retry does not retry: the call ends there, told how long is left of the 5 s break.
    sim.run_all();
    REQUIRE(log.size() == 100);
    CHECK(dependency_calls == 100);
    std::vector<nanoseconds> expected_ends;
    rs::seeded_random replay{99};
    const rs::exponential_backoff schedule{
        .initial = 2s, .factor = 2.0, .max = 30s, .jitter = rs::jitter::equal};
    for (int i = 0; i < 10; ++i) // ten first retries, one draw each
        expected_ends.push_back(10s + schedule.delay(1, replay));
    std::vector<nanoseconds> ends;
    for (const ended& e : log) {
        if (e.id < 90) {
            CHECK(e.at == 0s);
            CHECK_FALSE(e.refused);
            continue;
        }
        CHECK(e.refused);
        CHECK(e.retry_after == 15s - e.at);
        ends.push_back(e.at);
    }
    std::sort(ends.begin(), ends.end());
    std::sort(expected_ends.begin(), expected_ends.end());
    CHECK(ends == expected_ends);
}

TEST_CASE("standard: below the minimum throughput even every call failing leaves the breaker closed",
          "[standard]") {
    simulation sim;
    const sim_pipeline p = rs::standard_pipeline({}, sim.clock(), rs::seeded_random{3});
    const auto failing = []() -> rs::task<int> {
        throw std::runtime_error("down");
        co_return 0;
    };
    std::vector<nanoseconds> ends;
    const auto caller = [&]() -> rs::task<void> {
        auto r = co_await p.execute_outcome(failing);
        CHECK(r.has_failure());
        ends.push_back(sim.now());
    };
    for (int i = 0; i < 10; ++i)
        sim.spawn(caller());
    sim.run_all();
    // Ten calls of four attempts each: forty failures, under the hundred calls a ratio needs.
    const rs::circuit_metrics m = p.get<2>().metrics();
    CHECK(m.state == rs::circuit_state::closed);
    CHECK(m.calls == 40);
    CHECK(m.failures == 40);
    // Each call ended after its three waits, drawn in turn from the one generator the calls share.
    REQUIRE(ends.size() == 10);
    for (nanoseconds at : ends) {
        CHECK(at >= 1s + 2s + 4s);
        CHECK(at <= 2s + 4s + 8s);
    }
}

TEST_CASE("standard: a healthy dependency answers at once through every stage", "[standard]") {
    simulation sim;
    const sim_pipeline p = rs::standard_pipeline({}, sim.clock(), rs::seeded_random{1});
    const auto healthy = []() -> rs::task<int> { co_return 42; };
    CHECK(sim.run(p.execute(healthy)) == 42);
    CHECK(sim.now() == 0s);
    CHECK(p.get<2>().metrics().calls == 1);
}

TEST_CASE("standard: a pipeline built around a shared breaker uses it and its clock", "[standard]") {
    simulation sim;
    const rs::standard_options o{.name = "db", .minimum_throughput = 2};
    rs::circuit_breaker shared{rs::standard_breaker_options(o), sim.clock()};
    CHECK(shared.name() == "db.circuit_breaker");
    const auto a = rs::standard_pipeline(o, shared, rs::seeded_random{1});
    const auto b = rs::standard_pipeline(o, shared, rs::seeded_random{2});
    CHECK(a.get<2>() == shared);
    CHECK(b.get<2>() == shared);
    const auto failing = []() -> rs::task<int> {
        throw std::runtime_error("down");
        co_return 0;
    };
    // Two failures through `a` reach the minimum throughput at a ratio of 1: the shared breaker
    // opens, and `b` is refused without calling anything.
    auto ra = sim.run(a.execute_outcome(failing));
    CHECK(ra.error().is<rs::circuit_open_error>()); // the second attempt opened it, the third was refused
    CHECK(shared.state() == rs::circuit_state::open);
    int called = 0;
    const auto counted = [&]() -> rs::task<int> {
        ++called;
        co_return 1;
    };
    auto rb = sim.run(b.execute_outcome(counted));
    CHECK(rb.error().is<rs::circuit_open_error>());
    CHECK(called == 0);
}

} // namespace test_standard
