// SPDX-License-Identifier: MIT
#include "catch.hpp"

#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/when_all.hpp>

#include <chrono>
#include <stop_token>

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
    CHECK_THROWS_AS(sim.run(act(std::stop_token{})), rs::testing::scripted_failure);
    CHECK(sim.now() == 100ms);
    CHECK_THROWS_AS(sim.run(act(std::stop_token{})), rs::testing::scripted_failure);
    CHECK(sim.run(act(std::stop_token{})) == 7);
    CHECK(sim.now() == 300ms);
    CHECK(act.calls() == 3);
    CHECK(act.in_flight() == 0);
}

TEST_CASE("scripted_action: explicit steps come first, and a stop ends the call at once", "[simulation]") {
    rs::testing::simulation sim;
    rs::testing::scripted_action act{
        sim.clock(), rs::testing::script<int>{.latency = 1s, .value = 1, .steps = {{50ms, false}}}};
    CHECK(sim.run(act(std::stop_token{})) == 1);
    CHECK(sim.now() == 50ms);

    std::stop_source stop;
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
