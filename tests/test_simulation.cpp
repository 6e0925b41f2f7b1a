// SPDX-License-Identifier: MIT
#include "catch.hpp"

#include <resilience/circuit_breaker.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/when_all.hpp>

#include <chrono>
#include <stdexcept>
#include <utility>
#include <vector>

namespace test_simulation {

namespace rs = resilience;
using namespace std::chrono_literals;

TEST_CASE("simulation: hours of virtual time pass instantly and exactly", "[simulation]") {
    rs::testing::simulation sim;
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 24; ++i)
            co_await sim.sleep_for(1h);
    }());
    CHECK(sim.now() == 24h);
}

TEST_CASE("simulation: spawned coroutines run with the next run and time is shared", "[simulation]") {
    rs::testing::simulation sim;
    std::chrono::nanoseconds spawned_done{};
    // Named, not a temporary: a spawned coroutine outlives the statement that spawned it, and a
    // lambda's captures live in the lambda object, not in the coroutine frame.
    auto body = [&]() -> rs::task<void> {
        co_await sim.sleep_for(3s);
        spawned_done = sim.now();
    };
    sim.spawn(body());
    sim.run_all();
    CHECK(spawned_done == 3s);
    CHECK(sim.now() == 3s);
}

TEST_CASE("simulation: the virtual clock reads the simulation's time", "[simulation]") {
    rs::testing::simulation sim;
    auto clock = sim.clock();
    CHECK(clock.now().time_since_epoch() == 0ns);
    sim.run([&]() -> rs::task<void> { co_await clock.sleep_for(1500ms, {}); }());
    CHECK(clock.now().time_since_epoch() == 1500ms);
}

TEST_CASE("scripted_action: fails the scripted number of times, each taking its latency", "[simulation]") {
    rs::testing::simulation sim;
    rs::testing::scripted_action act{sim.clock(),
                                     rs::testing::script<int>{.failures = 2, .latency = 100ms, .value = 7}};
    CHECK_THROWS_AS(sim.run(act(resilience::stop_token{})), rs::testing::scripted_failure);
    CHECK(sim.now() == 100ms);
    CHECK_THROWS_AS(sim.run(act(resilience::stop_token{})), rs::testing::scripted_failure);
    CHECK(sim.run(act(resilience::stop_token{})) == 7);
    CHECK(sim.now() == 300ms);
    CHECK(act.calls() == 3);
    CHECK(act.in_flight() == 0);
}

TEST_CASE("scripted_action: explicit steps come first, and a stop ends the call at once", "[simulation]") {
    rs::testing::simulation sim;
    rs::testing::scripted_action act{
        sim.clock(), rs::testing::script<int>{.latency = 1s, .value = 1, .steps = {{50ms, false}}}};
    CHECK(sim.run(act(resilience::stop_token{})) == 1);
    CHECK(sim.now() == 50ms);

    resilience::stop_source stop;
    auto stopper = [&]() -> rs::task<void> {
        co_await sim.sleep_for(200ms);
        stop.request_stop();
    };
    auto call = [&]() -> rs::task<bool> {
        try {
            co_await act(stop.get_token());
        } catch (const rs::cancelled_error&) {
            co_return true;
        }
        co_return false;
    };
    auto [cancelled, ignored] = sim.run(rs::when_all(call(), stopper()));
    CHECK(cancelled);
    CHECK(sim.now() == 250ms);
    CHECK(act.stopped() == 1);
}

TEST_CASE("deterministic_random: the same seed gives the same sequence", "[simulation]") {
    rs::testing::deterministic_random a{42}, b{42}, c{43};
    for (int i = 0; i < 100; ++i) {
        auto x = a();
        CHECK(x == b());
        (void)c;
    }
    CHECK(rs::testing::deterministic_random{42}() != rs::testing::deterministic_random{43}());
}

TEST_CASE("simulation: run_for steps virtual time and leaves later work pending", "[simulation]") {
    rs::testing::simulation sim;
    std::vector<std::pair<int, std::chrono::nanoseconds>> woke;
    auto sleeper = [](rs::testing::simulation& s, std::vector<std::pair<int, std::chrono::nanoseconds>>& log,
                      int id, std::chrono::nanoseconds d) -> rs::task<void> {
        co_await s.sleep_for(d);
        log.emplace_back(id, s.now());
        co_await s.sleep_for(d);
        log.emplace_back(id, s.now());
    };
    sim.spawn(sleeper(sim, woke, 1, 300ms));
    sim.spawn(sleeper(sim, woke, 2, 500ms));
    sim.run_for(700ms);
    CHECK(sim.now() == 700ms);
    CHECK(woke == std::vector<std::pair<int, std::chrono::nanoseconds>>{{1, 300ms}, {2, 500ms}, {1, 600ms}});
    CHECK(sim.loop().timers() == 1); // the second sleeper's next wake, at 1 s, still pending
    sim.run_until(1s);
    CHECK(sim.now() == 1s);
    CHECK(woke.back() == std::pair<int, std::chrono::nanoseconds>{2, 1s});
    sim.run_until(500ms); // a past instant: nothing moves back
    CHECK(sim.now() == 1s);
    sim.run_all();
}

TEST_CASE("simulation: a call started with spawn can be inspected between steps", "[simulation]") {
    rs::testing::simulation sim;
    rs::circuit_breaker breaker{{.failure_threshold = 2, .break_duration = 10s}, sim.clock()};
    rs::testing::scripted_action down{sim.clock(), rs::testing::script<int>{.failures = 100, .latency = 1s}};
    std::vector<bool> failed;
    auto caller = [](rs::circuit_breaker<rs::testing::virtual_clock>& b, decltype(down)& a,
                     std::vector<bool>& log) -> rs::task<void> {
        for (int i = 0; i < 3; ++i)
            log.push_back((co_await b.execute_outcome(a)).has_failure());
    };
    sim.spawn(caller(breaker, down, failed));
    sim.run_for(1500ms);
    CHECK(breaker.state() == rs::circuit_state::closed); // one failure recorded, the second call running
    sim.run_for(500ms);
    CHECK(sim.now() == 2s);
    CHECK(breaker.state() == rs::circuit_state::open); // the second failure, at exactly 2 s, opened it
    sim.run_all();
    CHECK(failed == std::vector<bool>{true, true, true}); // the third refused without running
    CHECK(down.calls() == 2);
}

TEST_CASE("simulation: run_until rethrows what a spawned coroutine let escape", "[simulation]") {
    rs::testing::simulation sim;
    sim.spawn([](rs::testing::simulation& s) -> rs::task<void> {
        co_await s.sleep_for(1s);
        throw std::runtime_error("boom");
    }(sim));
    CHECK_NOTHROW(sim.run_for(500ms));
    CHECK_THROWS_WITH(sim.run_for(1s), "boom");
    CHECK(sim.now() == 1500ms);
}

} // namespace test_simulation
