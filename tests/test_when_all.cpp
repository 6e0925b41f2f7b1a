// SPDX-License-Identifier: MIT
#include "catch.hpp"

#include <resilience/testing/simulation.hpp>
#include <resilience/when_all.hpp>

#include <chrono>
#include <stdexcept>
#include <tuple>
#include <variant>
#include <vector>

namespace test_when_all {

namespace rs = resilience;
using namespace std::chrono_literals;

TEST_CASE("when_all: runs children concurrently and returns every result in order", "[when_all]") {
    rs::testing::simulation sim;
    auto after = [&](std::chrono::milliseconds d, int v) -> rs::task<int> {
        co_await sim.sleep_for(d);
        co_return v;
    };
    auto [a, b, c] = sim.run(rs::when_all(after(300ms, 1), after(100ms, 2), after(200ms, 3)));
    CHECK(std::tie(a, b, c) == std::tuple{1, 2, 3});
    CHECK(sim.now() == 300ms); // concurrent: the longest, not the sum
}

TEST_CASE("when_all: void children yield std::monostate", "[when_all]") {
    rs::testing::simulation sim;
    auto nap = [&]() -> rs::task<void> { co_await sim.sleep_for(1s); };
    auto result = sim.run(rs::when_all(nap(), nap()));
    STATIC_REQUIRE(std::is_same_v<decltype(result), std::tuple<std::monostate, std::monostate>>);
    CHECK(sim.now() == 1s);
}

TEST_CASE("when_all: a failure is rethrown only after every child has finished", "[when_all]") {
    rs::testing::simulation sim;
    bool slow_finished = false;
    auto fail_fast = [&]() -> rs::task<int> {
        co_await sim.sleep_for(10ms);
        throw std::runtime_error("fast failure");
    };
    auto slow = [&]() -> rs::task<int> {
        co_await sim.sleep_for(1s);
        slow_finished = true;
        co_return 1;
    };
    CHECK_THROWS_WITH(sim.run(rs::when_all(fail_fast(), slow())), "fast failure");
    CHECK(slow_finished);
    CHECK(sim.now() == 1s);
}

TEST_CASE("when_all: a vector of tasks keeps the input order", "[when_all]") {
    rs::testing::simulation sim;
    auto after = [&](int i) -> rs::task<int> {
        co_await sim.sleep_for(std::chrono::milliseconds(100 - i));
        co_return i* i;
    };
    std::vector<rs::task<int>> tasks;
    for (int i = 0; i < 10; ++i)
        tasks.push_back(after(i));
    auto results = sim.run(rs::when_all(std::move(tasks)));
    REQUIRE(results.size() == 10);
    for (int i = 0; i < 10; ++i)
        CHECK(results[static_cast<std::size_t>(i)] == i * i);
    CHECK(sim.now() == 100ms);
    CHECK(sim.run(rs::when_all(std::vector<rs::task<int>>{})).empty());
}

TEST_CASE("when_all: children that finish synchronously complete the join at once", "[when_all]") {
    auto value = [](int v) -> rs::task<int> { co_return v; };
    auto [a, b] = rs::sync_wait(rs::when_all(value(1), value(2)));
    CHECK(a + b == 3);
}

} // namespace test_when_all
