// SPDX-License-Identifier: MIT
// registry and keyed_registry: one handle per name (and per key), options of later calls ignored,
// the snapshot a health endpoint shows, bounded idle keyed entries, and lookups from many threads.

#include "catch.hpp"
#include "support.hpp"

#include <resilience/registry.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace test_registry {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_tests::invalid_argument_message;
using rs::testing::simulation;
using rs::testing::virtual_clock;

namespace {

rs::task<void> sleep_long(simulation* sim, resilience::stop_token st) {
    co_await sim->sleep_for(24h, st);
}

// Holds a slot of `b` from now until `release` is stopped.
rs::task<void> hold(rs::bulkhead<virtual_clock> b, simulation* sim, resilience::stop_token release) {
    co_await b.execute(sleep_long, sim, release);
}

rs::task<int> fail_once() {
    throw std::runtime_error("down");
    co_return 0;
}

} // namespace

TEST_CASE("registry: the same name hands out the same handle, and later options are ignored", "[registry]") {
    rs::registry<> reg;
    auto first = reg.breaker("payments", {.failure_threshold = 5});
    auto again = reg.breaker("payments", {.failure_threshold = 1, .break_duration = 1s});
    CHECK(first == again);
    CHECK(std::hash<rs::circuit_breaker<>>{}(first) == std::hash<rs::circuit_breaker<>>{}(again));
    CHECK(again.options().failure_threshold == std::optional<int>{5});
    CHECK(again.options().break_duration == 5s);
    CHECK(reg.breaker("orders") != first);

    auto db = reg.bulkhead("db", {.max_concurrent_calls = 8});
    CHECK(reg.bulkhead("db") == db);
    CHECK(reg.bulkhead("db", {.max_concurrent_calls = 1}).limit() == 8);

    auto budget = reg.retry_budget("retries", {.ratio = 0.5});
    CHECK(reg.retry_budget("retries") == budget);
    CHECK(reg.retry_budget("retries").options().ratio == 0.5);
}

TEST_CASE("registry: names are per kind", "[registry]") {
    rs::registry<> reg;
    auto breaker = reg.breaker("db", {});
    auto bulkhead = reg.bulkhead("db", {});
    const auto all = reg.snapshot();
    REQUIRE(all.size() == 2);
    CHECK(all[0].kind == rs::policy_kind::circuit_breaker);
    CHECK(all[0].name == "db");
    CHECK(all[1].kind == rs::policy_kind::bulkhead);
    CHECK(all[1].name == "db");
    CHECK(std::string(rs::to_string(all[1].kind)) == "bulkhead");
}

TEST_CASE("registry: a policy without a name of its own takes the registry name", "[registry]") {
    rs::registry<> reg;
    CHECK(reg.breaker("payments").name() == "payments");
    CHECK(reg.breaker("orders", {.name = "orders-breaker"}).name() == "orders-breaker");
    CHECK(reg.bulkhead("db", "tenant-7", {}).name() == "db/tenant-7");
    CHECK(reg.rate_limiter("api", {.token_limit = 1, .tokens_per_second = 1}).name() == "api");
}

TEST_CASE("registry: options that cannot make a policy throw on first use and register nothing",
          "[registry]") {
    rs::registry<> reg;
    const std::string msg = invalid_argument_message([&] { (void)reg.rate_limiter("api", {}); });
    CHECK(msg.find("token_limit must be positive") != std::string::npos);
    CHECK(reg.snapshot().empty());
    auto api = reg.rate_limiter("api", {.token_limit = 10, .tokens_per_second = 5});
    // Once registered, any options look it up: `{}` is not even validated.
    CHECK(reg.rate_limiter("api", {}) == api);
    auto w = reg.sliding_window_limiter("w", {.permit_limit = 3, .window = 1s});
    CHECK(reg.sliding_window_limiter("w", {}) == w);
    CHECK_THROWS_AS(rs::registry<>({.keyed_capacity = 0}), std::invalid_argument);
}

TEST_CASE("registry: policies run on the registry's clock", "[registry]") {
    simulation sim;
    rs::registry reg{{}, sim.clock()};
    auto breaker = reg.breaker("b", {.failure_threshold = 1, .break_duration = 5s});
    CHECK(sim.run(breaker.execute_outcome(fail_once)).has_failure());
    CHECK(breaker.state() == rs::circuit_state::open);
    sim.run_for(5s - 1ns);
    CHECK(breaker.state() == rs::circuit_state::open);
    sim.run_for(1ns);
    CHECK(breaker.state() == rs::circuit_state::half_open);

    auto limiter = reg.rate_limiter("l", {.token_limit = 2, .tokens_per_second = 10});
    sim.run(limiter.take());
    sim.run(limiter.take());
    CHECK(limiter.tokens() == 0.0);
    sim.run_for(100ms);
    CHECK(limiter.tokens() == 1.0);
}

// A registry on a clock that cannot be made from nothing has no default constructor, rather than
// one whose default clock argument fails to compile when a trait asks (std::optional's did, with
// clang 14).
static_assert(!std::is_default_constructible_v<rs::registry<virtual_clock>>);
static_assert(!std::is_constructible_v<rs::registry<virtual_clock>, rs::registry_options>);
static_assert(std::is_constructible_v<rs::registry<virtual_clock>, rs::registry_options, virtual_clock>);
static_assert(std::is_default_constructible_v<rs::registry<>>);
static_assert(std::is_constructible_v<rs::registry<>, rs::registry_options>);

TEST_CASE("registry: std::optional holds a registry on virtual time", "[registry]") {
    simulation sim;
    std::optional<rs::registry<virtual_clock>> reg;
    CHECK_FALSE(reg.has_value());
    reg.emplace(rs::registry_options{.keyed_capacity = 4}, sim.clock());
    auto breaker = reg->breaker("b", {.failure_threshold = 1, .break_duration = 5s});
    CHECK(sim.run(breaker.execute_outcome(fail_once)).has_failure());
    sim.run_for(5s);
    CHECK(breaker.state() == rs::circuit_state::half_open);
    reg.reset();
    CHECK(breaker.state() == rs::circuit_state::half_open); // handles outlive the registry

    std::optional<rs::registry<>> steady{std::in_place};
    CHECK(steady->breaker("x").name() == "x");
}

TEST_CASE("registry: the snapshot shows every entry's state, ordered by kind, name and key", "[registry]") {
    simulation sim;
    rs::registry reg{{}, sim.clock()};
    reg.retry_budget("retries", {.ratio = 0.5, .capacity = 2});
    reg.sliding_window_limiter("search", {.permit_limit = 5, .window = 1s});
    auto api = reg.rate_limiter("api", {.token_limit = 10, .tokens_per_second = 1});
    auto db = reg.bulkhead("db", {.max_concurrent_calls = 2});
    reg.bulkhead("db", "tenant-b", {.max_concurrent_calls = 3});
    reg.bulkhead("db", "tenant-a", {});
    auto payments = reg.breaker("payments", {.failure_threshold = 1});
    reg.breaker("alpha", {});

    payments.isolate();
    // (sim.run runs everything spawned to completion: the slot is taken last, below.)
    sim.run(api.take());
    sim.run(api.take());
    sim.run(api.take());
    auto search = reg.sliding_window_limiter("search", {});
    sim.run(search.take());
    sim.run(search.take());
    auto budget = reg.retry_budget("retries");
    budget.record_call();
    budget.record_call();
    CHECK(budget.try_withdraw());
    CHECK(budget.try_withdraw());
    CHECK_FALSE(budget.try_withdraw());
    resilience::stop_source release;
    sim.spawn(hold(db, &sim, release.get_token()));
    sim.run_for(0s);
    REQUIRE(sim.now() == 0s);

    const std::vector<rs::policy_status> all = reg.snapshot();
    REQUIRE(all.size() == 8);
    std::vector<std::pair<std::string, std::string>> order;
    for (const auto& s : all)
        order.emplace_back(std::string(rs::to_string(s.kind)) + " " + s.name, s.key);
    CHECK(order == std::vector<std::pair<std::string, std::string>>{{"circuit_breaker alpha", ""},
                                                                    {"circuit_breaker payments", ""},
                                                                    {"bulkhead db", ""},
                                                                    {"bulkhead db", "tenant-a"},
                                                                    {"bulkhead db", "tenant-b"},
                                                                    {"rate_limiter api", ""},
                                                                    {"sliding_window_limiter search", ""},
                                                                    {"retry_budget retries", ""}});
    REQUIRE(all[0].circuit.has_value());
    CHECK(all[0].circuit->state == rs::circuit_state::closed);
    REQUIRE(all[1].circuit.has_value());
    CHECK(all[1].circuit->state == rs::circuit_state::isolated);
    CHECK(all[1].circuit->name == "payments");
    CHECK(all[2].in_flight == 1);
    CHECK(all[2].limit == 2);
    CHECK(all[2].queued == 0);
    CHECK_FALSE(all[2].circuit.has_value());
    CHECK(all[3].in_flight == 0);
    CHECK(all[3].limit == 25);
    CHECK(all[4].limit == 3);
    CHECK(all[5].tokens == 7.0);
    CHECK(all[5].queued == 0);
    CHECK(all[6].tokens == 3.0);
    CHECK(all[7].tokens == 0.0);
    CHECK(all[7].calls == 2);
    CHECK(all[7].granted == 2);
    CHECK(all[7].denied == 1);

    release.request_stop();
    sim.run_all();
    CHECK(reg.snapshot()[2].in_flight == 0);
}

TEST_CASE("registry: a keyed family hands out one policy per key", "[registry]") {
    rs::registry<> reg;
    auto a = reg.breaker("payments", "host-a", {.failure_threshold = 3});
    CHECK(reg.breaker("payments", "host-a", {}) == a);
    CHECK(reg.breaker("payments", "host-a", {}).options().failure_threshold == std::optional<int>{3});
    CHECK(reg.breaker("payments", "host-b", {}) != a);
    CHECK(reg.breaker("payments", {}) != a); // the plain entry is another breaker
    CHECK(reg.breaker("orders", "host-a", {}) != a);
    CHECK(a.name() == "payments/host-a");
    // (Each first call made before the comparison: the operands of == may run in either order.)
    auto tenant = reg.rate_limiter("api", "tenant", {.token_limit = 1, .tokens_per_second = 1});
    CHECK(reg.rate_limiter("api", "tenant", {}) == tenant);
    auto budget = reg.retry_budget("r", "k", {});
    CHECK(reg.retry_budget("r", "k", {}) == budget);
    auto window = reg.sliding_window_limiter("w", "k", {.permit_limit = 1, .window = 1s});
    CHECK(reg.sliding_window_limiter("w", "k", {}) == window);
}

TEST_CASE("registry: beyond keyed_capacity the least recently handed out idle entry is forgotten",
          "[registry]") {
    rs::registry<> reg{{.keyed_capacity = 2}};
    auto a = reg.breaker("p", "a", {});
    auto b = reg.breaker("p", "b", {});
    CHECK(reg.breaker("p", "a", {}) == a); // a is now the most recent
    auto c = reg.breaker("p", "c", {});    // three: b, the least recent, goes
    CHECK(reg.snapshot().size() == 2);
    CHECK(reg.breaker("p", "a", {}) == a);
    CHECK(reg.breaker("p", "c", {}) == c);
    auto b2 = reg.breaker("p", "b", {}); // made anew; now a, the least recent, goes
    CHECK(b2 != b);
    CHECK(reg.breaker("p", "c", {}) == c);
    CHECK(reg.breaker("p", "a", {}) != a);
    // The forgotten handle still works: its state lives while a copy does.
    CHECK(b.state() == rs::circuit_state::closed);
}

TEST_CASE("registry: a keyed bulkhead with a call in flight is never forgotten", "[registry]") {
    simulation sim;
    rs::registry reg{{.keyed_capacity = 1}, sim.clock()};
    auto busy = reg.bulkhead("db", "a", {});
    resilience::stop_source release;
    sim.spawn(hold(busy, &sim, release.get_token()));
    sim.run_for(1s);
    auto other = reg.bulkhead("db", "b", {}); // a is busy: both are kept, past the capacity
    CHECK(reg.snapshot().size() == 2);
    CHECK(reg.bulkhead("db", "a", {}) == busy);
    release.request_stop();
    sim.run_all();
    auto third = reg.bulkhead("db", "c", {}); // both idle now: back within one
    const auto all = reg.snapshot();
    REQUIRE(all.size() == 1);
    CHECK(all[0].key == "c");
    CHECK(reg.bulkhead("db", "b", {}) != other);
}

TEST_CASE("keyed_registry: an open breaker is kept, a closed one forgotten", "[registry]") {
    rs::keyed_registry<rs::circuit_breaker<>, int> per_host{
        1, [](const int&) { return rs::circuit_breaker<>{{.failure_threshold = 1}}; }};
    auto open = per_host.get(1);
    open.isolate();
    auto closed = per_host.get(2); // 1 is isolated: kept
    CHECK(per_host.size() == 2);
    CHECK(per_host.evictions() == 0);
    per_host.get(3); // 2 is closed: forgotten; 1 still kept
    CHECK(per_host.size() == 2);
    CHECK(per_host.evictions() == 1);
    CHECK(per_host.find(1) == std::optional{open});
    CHECK_FALSE(per_host.find(2).has_value());
    open.reset();
    per_host.get(4); // 1 closed now: it goes, and so does 3
    CHECK(per_host.size() == 1);
    CHECK(per_host.evictions() == 3);
    CHECK(per_host.find(4).has_value());
}

TEST_CASE("keyed_registry: find, erase and entries, most recent first", "[registry]") {
    int made = 0;
    rs::keyed_registry<rs::retry_budget, int> budgets{3, [&](const int&) {
                                                          ++made;
                                                          return rs::retry_budget{};
                                                      }};
    CHECK(budgets.capacity() == 3);
    auto one = budgets.get(1);
    budgets.get(2);
    budgets.get(3);
    CHECK(made == 3);
    CHECK(budgets.get(1) == one);
    CHECK(made == 3);
    CHECK(budgets.find(2).has_value()); // find makes nothing and leaves the order alone
    CHECK_FALSE(budgets.find(9).has_value());
    std::vector<int> keys;
    for (const auto& [k, h] : budgets.entries())
        keys.push_back(k);
    CHECK(keys == std::vector<int>{1, 3, 2});
    budgets.get(4); // 2 was the least recently handed out
    CHECK_FALSE(budgets.find(2).has_value());
    CHECK(budgets.erase(3));
    CHECK_FALSE(budgets.erase(3));
    CHECK(budgets.size() == 2);
    CHECK(budgets.evictions() == 1);
    // A maker given to get() serves that call.
    auto custom = budgets.get(7, [](const int&) { return rs::retry_budget{{.ratio = 1.0}}; });
    CHECK(custom.options().ratio == 1.0);
}

TEST_CASE("keyed_registry: a maker that throws changes nothing", "[registry]") {
    rs::keyed_registry<rs::retry_budget, std::string> budgets{2};
    budgets.get("a", [](const std::string&) { return rs::retry_budget{}; });
    CHECK_THROWS_AS(budgets.get("b", [](const std::string&) { return rs::retry_budget{{.ratio = 2.0}}; }),
                    std::invalid_argument);
    CHECK(budgets.size() == 1);
    CHECK_FALSE(budgets.find("b").has_value());
    CHECK_THROWS_AS(budgets.get("c"), std::bad_function_call); // no maker of its own
    CHECK(budgets.size() == 1);
    CHECK_THROWS_AS((rs::keyed_registry<rs::retry_budget>{0}), std::invalid_argument);
}

TEST_CASE("registry: lookups, keyed churn and snapshots from many threads agree", "[registry][concurrency]") {
    rs::registry<> reg{{.keyed_capacity = 8}};
    constexpr int threads = 4;
    constexpr int rounds = 2000;
    std::vector<std::vector<rs::circuit_breaker<>>> seen(threads);
    std::atomic<std::size_t> snapshots{0};
    std::atomic<int> busy{0};
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t)
        workers.emplace_back([&, t] {
            for (int i = 0; i < rounds; ++i) {
                if (i % 100 == 0)
                    seen[static_cast<std::size_t>(t)].push_back(reg.breaker("shared", {}));
                auto tenant = reg.bulkhead("tenants", "t" + std::to_string((i * 7 + t) % 40), {});
                if (tenant.in_flight() != 0)
                    ++busy; // (no CHECK here: Catch2 assertions are for the test's own thread)
                auto budget = reg.retry_budget("budget", "k" + std::to_string(i % 3), {});
                budget.record_call();
                (void)budget.try_withdraw();
                if (i % 50 == 0)
                    snapshots += reg.snapshot().size();
            }
        });
    for (auto& w : workers)
        w.join();
    const rs::circuit_breaker<> shared = reg.breaker("shared", {});
    for (const auto& per_thread : seen)
        for (const auto& b : per_thread)
            CHECK(b == shared);
    // One shared breaker, at most 8 tenants (all idle), the three budgets.
    const auto all = reg.snapshot();
    CHECK(all.size() == 1 + 8 + 3);
    CHECK(snapshots.load() > 0);
    CHECK(busy.load() == 0);
}

} // namespace test_registry
