// SPDX-License-Identifier: MIT
// The balancer: what reaches the action, retries and hedges to endpoints not tried, the picks against
// their models, slow start, membership changes while calls run, outlier ejection at exact instants.
#include <resilience/balancer.hpp>
#include <resilience/hedge.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/retry.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace test_balancer {

namespace rs = resilience;
using namespace std::chrono_literals;
using vclock = rs::testing::virtual_clock;
using lb_t = rs::balancer<std::string, vclock, rs::seeded_random>;

std::vector<std::string> hosts(int n) {
    std::vector<std::string> v;
    for (int i = 0; i < n; ++i)
        v.push_back("h" + std::to_string(i));
    return v;
}

rs::balancer_options no_ejection(rs::balancer_options o = {}) {
    o.outlier_ejection.reset();
    return o;
}

// One call through `lb` (or `p`) that takes `latency` and then fails or not, on virtual time; the
// endpoint it was sent to is appended to `seen`.
template <class P>
rs::task<void> call(rs::testing::simulation& sim, const P& p, const lb_t& lb, std::vector<std::string>& seen,
                    std::chrono::nanoseconds latency, bool fail) {
    (void)co_await p.execute_outcome(
        lb.bind([&sim, &seen, latency, fail](const std::string& h, const rs::context& c) -> rs::task<int> {
            seen.push_back(h);
            co_await sim.sleep_for(latency, c.stop_token());
            if (fail)
                throw std::runtime_error("down");
            co_return 1;
        }));
}

TEST_CASE(
    "the endpoint reaches the action, bound or read from the context, and outlives the call in a copy") {
    rs::testing::simulation sim;
    lb_t lb{{"only"}, {}, sim.clock(), rs::seeded_random{1}};
    CHECK(sim.run(lb.execute(lb.bind([](const std::string& h) -> rs::task<std::string> { co_return h; }))) ==
          "only");
    rs::context kept;
    CHECK(sim.run(lb.execute([&kept](const rs::context& c) -> rs::task<std::string> {
        kept = c; // a copy out of the call: owns its own endpoint
        co_return rs::endpoint<std::string>(c);
    })) == "only");
    REQUIRE(kept.property(rs::endpoint_key<std::string>) != nullptr);
    CHECK(*kept.property(rs::endpoint_key<std::string>) == "only");
    // No balancer around: the action is told so.
    rs::context none;
    CHECK_THROWS_AS(rs::endpoint<std::string>(none), std::logic_error);
}

TEST_CASE("a retry goes to an endpoint the call has not tried, then to any once all are tried") {
    rs::testing::simulation sim;
    for (const auto pick :
         {rs::balance_pick::least_loaded, rs::balance_pick::round_robin, rs::balance_pick::random}) {
        for (std::uint64_t seed = 1; seed <= 20; ++seed) {
            lb_t lb{hosts(3), no_ejection({.pick = pick}), sim.clock(), rs::seeded_random{seed}};
            rs::pipeline p{
                rs::retry<vclock>{{.max_attempts = 4, .backoff = rs::constant_backoff{0ms}}, sim.clock()},
                lb};
            std::vector<std::string> seen;
            sim.run(call(sim, p, lb, seen, 1ms, true));
            REQUIRE(seen.size() == 4);
            CHECK(std::set<std::string>(seen.begin(), seen.begin() + 3).size() == 3);
        }
    }
    SECTION("not when told not to: a retry may go back to the endpoint it just tried") {
        int repeats = 0;
        for (std::uint64_t seed = 1; seed <= 20; ++seed) {
            lb_t lb{hosts(2), no_ejection({.pick = rs::balance_pick::random, .avoid_tried = false}),
                    sim.clock(), rs::seeded_random{seed}};
            rs::pipeline p{
                rs::retry<vclock>{{.max_attempts = 2, .backoff = rs::constant_backoff{0ms}}, sim.clock()},
                lb};
            std::vector<std::string> seen;
            sim.run(call(sim, p, lb, seen, 1ms, true));
            REQUIRE(seen.size() == 2);
            repeats += seen[0] == seen[1] ? 1 : 0;
        }
        CHECK(repeats > 0); // with avoid_tried, never; without, all but certain (1 - 2^-20)
    }
}

TEST_CASE("a hedge's extra attempt goes to another endpoint than the one still running") {
    rs::testing::simulation sim;
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
        lb_t lb{hosts(2), no_ejection(), sim.clock(), rs::seeded_random{seed}};
        rs::pipeline p{rs::hedge<vclock>{{.max_attempts = 2, .delay = rs::hedge_delay{10ms}}, sim.clock()},
                       lb};
        std::vector<std::string> seen;
        sim.run(call(sim, p, lb, seen, 50ms, false));
        REQUIRE(seen.size() == 2);
        CHECK(seen[0] != seen[1]);
    }
}

TEST_CASE("an empty set refuses the call with no_endpoint_error, which a retry does not retry") {
    rs::testing::simulation sim;
    lb_t lb{{}, {.name = "replicas"}, sim.clock(), rs::seeded_random{1}};
    int calls = 0;
    rs::pipeline p{rs::retry<vclock>{{.max_attempts = 3}, sim.clock()}, lb};
    auto r = sim.run(p.execute_outcome([&calls]() -> rs::task<int> {
        ++calls;
        co_return 1;
    }));
    REQUIRE(r.has_failure());
    CHECK(r.error().code() == rs::errc::no_endpoint);
    CHECK(calls == 0);
    CHECK(sim.now() == 0ms);
    lb.add("late");
    CHECK(sim.run(p.execute(lb.bind([](const std::string& h) -> rs::task<std::string> { co_return h; }))) ==
          "late");
}

// Gives endpoint i of `lb` (round robin, one call each, at once) the latency estimate 40 + 10 i ms, so
// that their loads are distinct and in the order of their names.
void warm(rs::testing::simulation& sim, lb_t& lb, int n) {
    std::vector<std::string> seen;
    for (int i = 0; i < n; ++i)
        sim.spawn(lb.execute(lb.bind([&sim](const std::string& h) -> rs::task<int> {
            co_await sim.sleep_for(std::chrono::milliseconds{40 + 10 * std::stoi(h.substr(1))});
            co_return 0;
        })));
    sim.run_all();
}

// Picks `n` endpoints with calls that end at once (their latency, zero on virtual time, changes no
// estimate: no time passed since the last update) and counts them.
std::map<std::string, int> shares(rs::testing::simulation& sim, const lb_t& lb, int n) {
    std::map<std::string, int> got;
    for (int i = 0; i < n; ++i)
        ++got[sim.run(
            lb.execute(lb.bind([](const std::string& h) -> rs::task<std::string> { co_return h; })))];
    return got;
}

// Each endpoint's share of 2 x 10^5 picks (10^4 for each of 20 seeds) within 3 sigma of its model.
void check_shares(const std::map<std::string, int>& got, int picks, const std::vector<double>& model) {
    for (std::size_t k = 0; k < model.size(); ++k) {
        const double p = model[k];
        const double sigma = std::sqrt(picks * p * (1 - p));
        const auto it = got.find("h" + std::to_string(k));
        const int count = it == got.end() ? 0 : it->second;
        INFO("endpoint h" << k << ": " << count << " against " << picks * p << " (sigma " << sigma << ")");
        CHECK(std::abs(count - picks * p) <= 3 * sigma + 1e-9);
    }
}

TEST_CASE("the picks follow their models: 10^4 picks for each of 20 seeds, each share within 3 sigma") {
    constexpr int n = 10, picks = 10'000, seeds = 20;
    const auto run = [&](rs::balance_pick pick) {
        std::map<std::string, int> all;
        for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
            rs::testing::simulation sim;
            lb_t lb{hosts(n), no_ejection({.pick = rs::balance_pick::round_robin}), sim.clock(),
                    rs::seeded_random{seed}};
            warm(sim, lb, n);
            lb.reconfigure(no_ejection({.pick = pick}));
            const auto got = shares(sim, lb, picks);
            if (pick == rs::balance_pick::round_robin) {
                for (const auto& [h, count] : got)
                    CHECK(count == picks / n); // exactly even, whatever the seed
            }
            for (const auto& [h, count] : got)
                all[h] += count;
        }
        return all;
    };
    SECTION("least loaded: of two drawn, the lower load; the k-th least loaded with p = 2 (n - k) / (n (n - "
            "1))") {
        std::vector<double> model;
        for (int k = 1; k <= n; ++k)
            model.push_back(2.0 * (n - k) / (n * (n - 1.0)));
        check_shares(run(rs::balance_pick::least_loaded), picks * seeds, model);
    }
    SECTION("random: uniform") {
        check_shares(run(rs::balance_pick::random), picks * seeds, std::vector<double>(n, 1.0 / n));
    }
    SECTION("round robin: exactly even") {
        check_shares(run(rs::balance_pick::round_robin), picks * seeds, std::vector<double>(n, 1.0 / n));
    }
}

TEST_CASE("least loaded counts the calls in flight: a busy endpoint loses to an idle one") {
    rs::testing::simulation sim;
    lb_t lb{hosts(2), no_ejection(), sim.clock(), rs::seeded_random{5}};
    std::vector<std::string> seen;
    // Forty calls of 1 s each, started one after another: with equal latencies, each goes to the endpoint
    // with fewer in flight, so the two never differ by more than one (random picks would, by far).
    int most_apart = 0;
    for (int i = 0; i < 40; ++i) {
        sim.spawn(call(sim, lb, lb, seen, 1s, false));
        sim.run_for(1us);
        const auto gap = static_cast<int>(lb.in_flight("h0")) - static_cast<int>(lb.in_flight("h1"));
        most_apart = std::max(most_apart, std::abs(gap));
    }
    CHECK(most_apart <= 1);
    CHECK(lb.in_flight("h0") + lb.in_flight("h1") == 40);
    sim.run_all();
}

TEST_CASE("an estimate raised by one slow call comes back down to the latency, however often calls end") {
    // Ten calls of 10 us always in flight, one ending and one starting every microsecond, under a 10 ms
    // decay_time: each end moves an estimate by a ten-thousandth of its gap to the sample, steps that an
    // estimate kept in whole nanoseconds would round away, leaving h0 stuck above its latency after its
    // one slow call and short of its half of the calls.
    rs::testing::simulation sim;
    lb_t lb{hosts(2), no_ejection({.decay_time = 10ms, .initial_latency = 10us}), sim.clock(),
            rs::seeded_random{3}};
    {
        auto slow = lb.pick();
        while (slow.endpoint() != "h0")
            slow = lb.pick();
        sim.run_for(1ms);
        slow.succeeded(); // h0's estimate: 1 ms
    }
    std::deque<decltype(lb.pick())> running;
    for (int i = 0; i < 150'000; ++i) { // 150 ms, fifteen decay times
        if (running.size() == 10) {
            running.front().succeeded();
            running.pop_front();
        }
        running.push_back(lb.pick());
        sim.run_for(1us);
    }
    running.clear(); // dropped: cancelled calls, shorter than the estimates, which they leave as they are
    // Nothing in flight: the estimates alone decide, and h0's is back to h1's (the 1 ms gap decayed to
    // under a nanosecond), so the two tie and each is the first drawn half the time.
    int to_h0 = 0;
    const int picks = 1000;
    for (int i = 0; i < picks; ++i)
        to_h0 += lb.pick().endpoint() == "h0" ? 1 : 0;
    CHECK(std::abs(to_h0 - picks / 2) <= 3 * 16); // 3 sigma of 1000 fair draws
}

TEST_CASE("slow start: an endpoint added takes a share that grows with its weight over the window") {
    constexpr int picks = 10'000;
    rs::testing::simulation sim;
    lb_t lb{{"old"},
            no_ejection(
                {.pick = rs::balance_pick::random, .slow_start_window = 10s, .slow_start_min_weight = 0.1}),
            sim.clock(),
            rs::seeded_random{9}};
    lb.add("new");
    for (const auto& [at, w] : {std::pair{0s, 0.1}, std::pair{5s, 0.5}, std::pair{10s, 1.0}}) {
        sim.run_until(at);
        const auto got = shares(sim, lb, picks);
        const double p = w / (1.0 + w); // drawn with the odds of the weights, 1 to w
        const double sigma = std::sqrt(picks * p * (1 - p));
        INFO("at " << at.count() << " s: " << got.at("new") << " against " << picks * p);
        CHECK(std::abs(got.at("new") - picks * p) <= 3 * sigma);
    }
}

TEST_CASE(
    "membership changes while calls run: a removed endpoint's call ends on it, new calls go elsewhere") {
    rs::testing::simulation sim;
    lb_t lb{
        {"a", "b"}, no_ejection({.pick = rs::balance_pick::round_robin}), sim.clock(), rs::seeded_random{1}};
    std::vector<std::string> seen;
    sim.spawn(call(sim, lb, lb, seen, 100ms, false)); // to a
    sim.run_for(10ms);
    REQUIRE(seen == std::vector<std::string>{"a"});
    CHECK(lb.remove("a"));
    CHECK_FALSE(lb.remove("a"));
    CHECK(lb.endpoints() == std::vector<std::string>{"b"});
    for (int i = 0; i < 3; ++i)
        sim.spawn(call(sim, lb, lb, seen, 10ms, false));
    sim.run_all();
    CHECK(seen == std::vector<std::string>{"a", "b", "b", "b"});
    CHECK(sim.now() == 100ms);
    lb.set_endpoints({"b", "c"});
    CHECK(lb.endpoints() == std::vector<std::string>{"b", "c"});
}

TEST_CASE("consecutive failures eject at the failure that makes the run, for base x times, then it returns") {
    rs::testing::simulation sim;
    std::vector<std::pair<std::chrono::nanoseconds, std::string>> heard;
    rs::balancer_options o{.pick = rs::balance_pick::round_robin};
    o.outlier_ejection->max_ejection_percent = 50;
    o.outlier_ejection->success_rate_stdev_factor = 0; // consecutive failures only
    o.on_ejection = [&](const rs::ejection_event& e) {
        heard.emplace_back(sim.now(), std::string(e.endpoint()) + " " + to_string(e.reason()) + " " +
                                          std::to_string(e.times_ejected()) + " " +
                                          std::to_string(e.duration() / 1s));
    };
    lb_t lb{{"good", "bad"}, o, sim.clock(), rs::seeded_random{1}};
    std::vector<std::string> seen;
    // One call a second, each alternating between the two (round robin); "bad" fails each time.
    const auto one = [&](bool fail_bad) -> rs::task<void> {
        (void)co_await lb.execute_outcome(lb.bind([&](const std::string& h) -> rs::task<int> {
            seen.push_back(h);
            co_await sim.sleep_for(1ms);
            if (h == "bad" && fail_bad)
                throw std::runtime_error("down");
            co_return 1;
        }));
    };
    for (int i = 0; i < 10; ++i) {
        sim.run(one(true));
        sim.run_for(1s - 1ms);
    }
    // "bad" failed at 1.001, 3.001, 5.001, 7.001 and 9.001 s: ejected at 9.001 s for 30 s.
    REQUIRE(heard.size() == 1);
    CHECK(heard[0] == std::pair<std::chrono::nanoseconds, std::string>{
                          9001ms, std::string("bad consecutive_failures 1 30")});
    CHECK(lb.is_ejected("bad"));
    CHECK(lb.ejected() == 1);
    seen.clear();
    sim.run_until(38990ms);
    for (int i = 0; i < 3; ++i)
        sim.run(one(true));
    CHECK(seen == std::vector<std::string>(3, "good"));
    CHECK(lb.is_ejected("bad"));
    sim.run_until(39001ms);
    CHECK_FALSE(lb.is_ejected("bad"));
    seen.clear();
    sim.run(one(false)); // the return is seen by the first call at or after its instant
    REQUIRE(heard.size() == 2);
    CHECK(heard[1] ==
          std::pair<std::chrono::nanoseconds, std::string>{39001ms, std::string("bad returned 1 0")});
    CHECK(std::count(seen.begin(), seen.end(), "bad") + std::count(seen.begin(), seen.end(), "good") == 1);
}

TEST_CASE("the ejection callback may call the balancer back: it is told with no lock held") {
    rs::testing::simulation sim;
    rs::balancer_options o{.pick = rs::balance_pick::round_robin};
    o.outlier_ejection->consecutive_failures = 1;
    o.outlier_ejection->max_ejection_percent = 50;
    o.outlier_ejection->base_ejection_time = 1s;
    std::vector<std::string> told;
    std::optional<lb_t> lb;
    o.on_ejection = [&](const rs::ejection_event& e) {
        const std::string h(e.endpoint());
        told.push_back(h + (lb->is_ejected(h) ? " out " : " in ") + std::to_string(lb->ejected()));
    };
    lb.emplace(std::vector<std::string>{"a", "b"}, o, sim.clock(), rs::seeded_random{1});
    std::vector<std::string> seen;
    sim.run(call(sim, *lb, *lb, seen, 1ms, true)); // a fails: out for 1 s
    sim.run_until(2s);
    sim.run(call(sim, *lb, *lb, seen, 1ms, false)); // sees a's return
    CHECK(told == std::vector<std::string>{"a out 1", "a in 0"});
}

TEST_CASE("no more than max_ejection_percent of the set is ejected at once, but always one") {
    rs::testing::simulation sim;
    rs::balancer_options o{.pick = rs::balance_pick::round_robin};
    o.outlier_ejection->success_rate_stdev_factor = 0;
    o.outlier_ejection->consecutive_failures = 1;
    o.outlier_ejection->max_ejection_percent = 10; // of 3: one
    lb_t lb{{"a", "b", "c"}, o, sim.clock(), rs::seeded_random{1}};
    std::vector<std::string> seen;
    for (int i = 0; i < 2; ++i)
        sim.run(call(sim, lb, lb, seen, 1ms, true)); // a, then b or c, both failing
    REQUIRE(seen.size() == 2);
    CHECK(seen[0] == "a");
    CHECK(lb.is_ejected("a"));
    CHECK_FALSE(lb.is_ejected(seen[1])); // a is out, and it is a third of the set
    CHECK(lb.ejected() == 1);
}

TEST_CASE("in panic, with fewer than the threshold left, every endpoint may be picked") {
    rs::testing::simulation sim;
    rs::balancer_options o{.pick = rs::balance_pick::round_robin};
    o.outlier_ejection->success_rate_stdev_factor = 0;
    o.outlier_ejection->consecutive_failures = 1;
    o.outlier_ejection->max_ejection_percent = 100;
    o.outlier_ejection->panic_threshold_percent = 50;
    lb_t lb{{"a", "b", "c", "d"}, o, sim.clock(), rs::seeded_random{1}};
    std::vector<std::string> seen;
    sim.run(call(sim, lb, lb, seen, 1ms, true)); // a out: 3 of 4 left
    sim.run(call(sim, lb, lb, seen, 1ms, true)); // b out: 2 of 4 left, 50 %: not yet panic
    CHECK(lb.ejected() == 2);
    std::set<std::string> in;
    for (const std::string& h : lb.endpoints())
        if (!lb.is_ejected(h))
            in.insert(h);
    REQUIRE(in.size() == 2);
    seen.clear();
    for (int i = 0; i < 4; ++i)
        sim.run(call(sim, lb, lb, seen, 1ms, false));
    CHECK(std::set<std::string>(seen.begin(), seen.end()) == in);
    sim.run(call(sim, lb, lb, seen, 1ms, true)); // c or d out: 1 of 4 left, panic
    CHECK(lb.ejected() == 3);
    seen.clear();
    for (int i = 0; i < 8; ++i)
        sim.run(call(sim, lb, lb, seen, 1ms, false));
    CHECK(std::set<std::string>(seen.begin(), seen.end()).size() == 4);
}

TEST_CASE("success rate: at an interval's end, an endpoint below mean - k sigma is ejected") {
    rs::testing::simulation sim;
    std::vector<std::pair<std::chrono::nanoseconds, std::string>> heard;
    rs::balancer_options o{.pick = rs::balance_pick::round_robin};
    o.outlier_ejection->consecutive_failures = 0;
    o.outlier_ejection->max_ejection_percent = 50;
    o.on_ejection = [&](const rs::ejection_event& e) {
        heard.emplace_back(sim.now(), std::string(e.endpoint()) + " " + to_string(e.reason()));
    };
    lb_t lb{hosts(6), o, sim.clock(), rs::seeded_random{1}};
    int n = 0;
    // 120 calls to each endpoint in the first 10 s; h5 fails every other one.
    const auto one = [&]() -> rs::task<void> {
        (void)co_await lb.execute_outcome(lb.bind([&](const std::string& h) -> rs::task<int> {
            if (h == "h5" && ++n % 2 == 0)
                throw std::runtime_error("down");
            co_return 1;
        }));
    };
    for (int i = 0; i < 720; ++i) {
        sim.run(one());
        sim.run_for(10ms);
    }
    CHECK(sim.now() == 7200ms);
    CHECK(heard.empty());
    sim.run_until(10s);
    sim.run(one()); // the first call at or after the interval's end compares
    REQUIRE(heard.size() == 1);
    CHECK(heard[0] ==
          std::pair<std::chrono::nanoseconds, std::string>{10000ms, std::string("h5 success_rate")});
    CHECK(lb.is_ejected("h5"));
}

TEST_CASE("a lease picks for a call made by hand, counts it in flight, and reports how it went") {
    rs::testing::simulation sim;
    rs::balancer_options o{.pick = rs::balance_pick::round_robin};
    o.outlier_ejection->max_ejection_percent = 50;
    lb_t lb{{"a", "b"}, o, sim.clock(), rs::seeded_random{1}};
    {
        auto l = lb.pick();
        REQUIRE(l);
        CHECK(l.endpoint() == "a");
        CHECK(lb.in_flight("a") == 1);
        auto moved = std::move(l);
        CHECK(lb.in_flight("a") == 1);
    } // dropped: a cancelled call
    CHECK(lb.in_flight("a") == 0);
    for (int i = 0; i < 10; ++i) {
        auto l = lb.pick();
        sim.run_for(1ms);
        if (l.endpoint() == "b")
            l.failed();
        else
            l.succeeded();
    }
    CHECK(lb.is_ejected("b")); // its fifth failure in a row
    CHECK_FALSE(lb.is_ejected("a"));
    lb_t empty{{}, {}, sim.clock(), rs::seeded_random{1}};
    CHECK_FALSE(empty.pick());
}

TEST_CASE("a generator of 32 bits picks as uniformly as one of 64") {
    rs::testing::simulation sim;
    constexpr int n = 10, picks = 20'000;
    rs::balancer<std::string, vclock, std::mt19937> lb{
        hosts(n), no_ejection({.pick = rs::balance_pick::random}), sim.clock(), std::mt19937{7}};
    std::map<std::string, int> got;
    for (int i = 0; i < picks; ++i)
        ++got[sim.run(
            lb.execute(lb.bind([](const std::string& h) -> rs::task<std::string> { co_return h; })))];
    REQUIRE(got.size() == n);
    const double p = 1.0 / n, sigma = std::sqrt(picks * p * (1 - p));
    for (const auto& [h, count] : got)
        CHECK(std::abs(count - picks * p) <= 4 * sigma);
}

TEST_CASE("a retry avoids the endpoint tried however often the set was changed") {
    rs::testing::simulation sim;
    lb_t lb{{"a", "b"}, no_ejection({.pick = rs::balance_pick::random}), sim.clock(), rs::seeded_random{3}};
    for (int i = 0; i < 63; ++i) // the second endpoint replaced 63 times: numbers are reused, not spent
        lb.set_endpoints({"a", "n" + std::to_string(i)});
    rs::pipeline p{rs::retry<vclock>{{.max_attempts = 2, .backoff = rs::constant_backoff{0ms}}, sim.clock()},
                   lb};
    for (int i = 0; i < 20; ++i) {
        std::vector<std::string> seen;
        sim.run(call(sim, p, lb, seen, 1ms, true));
        REQUIRE(seen.size() == 2);
        CHECK(seen[0] != seen[1]);
    }
}

TEST_CASE("a classifier that throws ends the call with what it threw, counted neither way") {
    rs::testing::simulation sim;
    rs::balancer_options o{
        .should_handle = [](const rs::failure&) -> bool { throw std::logic_error("judge"); }};
    o.outlier_ejection->consecutive_failures = 1;
    lb_t lb{{"a"}, o, sim.clock(), rs::seeded_random{1}};
    auto r = sim.run(lb.execute_outcome([]() -> rs::task<int> { throw std::runtime_error("down"); }));
    REQUIRE(r.has_failure());
    CHECK_THROWS_WITH(r.error().rethrow(), "judge");
    CHECK_FALSE(lb.is_ejected("a"));
}

TEST_CASE("ejections of any length, and intervals of any length, are exact and never wrap") {
    rs::testing::simulation sim;
    rs::balancer_options o{.pick = rs::balance_pick::round_robin};
    o.outlier_ejection->consecutive_failures = 1;
    o.outlier_ejection->max_ejection_percent = 50;
    o.outlier_ejection->base_ejection_time = std::chrono::nanoseconds::max(); // for good
    o.outlier_ejection->max_ejection_time = std::chrono::nanoseconds::max();
    o.outlier_ejection->interval = std::chrono::nanoseconds::max(); // never compared
    o.slow_start_window = std::chrono::nanoseconds::max();
    lb_t lb{{"a", "b"}, o, sim.clock(), rs::seeded_random{1}};
    std::vector<std::string> seen;
    sim.run(call(sim, lb, lb, seen, 1ms, true)); // a: out for good
    sim.run_until(std::chrono::hours(24 * 365));
    seen.clear();
    for (int i = 0; i < 4; ++i)
        sim.run(call(sim, lb, lb, seen, 1ms, false));
    CHECK(lb.is_ejected("a"));
    CHECK(seen == std::vector<std::string>(4, "b"));
}

TEST_CASE("an endpoint ejected stays out to the end of its time when ejection is turned off") {
    rs::testing::simulation sim;
    rs::balancer_options o{.pick = rs::balance_pick::round_robin};
    o.outlier_ejection->consecutive_failures = 1;
    o.outlier_ejection->max_ejection_percent = 50;
    lb_t lb{{"a", "b"}, o, sim.clock(), rs::seeded_random{1}};
    std::vector<std::string> seen;
    sim.run(call(sim, lb, lb, seen, 1ms, true)); // a: out for 30 s
    lb.reconfigure(no_ejection({.pick = rs::balance_pick::round_robin}));
    seen.clear();
    for (int i = 0; i < 4; ++i)
        sim.run(call(sim, lb, lb, seen, 1ms, true)); // b fails too: no ejection now
    CHECK(seen == std::vector<std::string>(4, "b"));
    CHECK(lb.is_ejected("a"));
    CHECK_FALSE(lb.is_ejected("b"));
    sim.run_until(30001ms);
    seen.clear();
    for (int i = 0; i < 4; ++i)
        sim.run(call(sim, lb, lb, seen, 1ms, false));
    CHECK(std::count(seen.begin(), seen.end(), "a") == 2);
}

TEST_CASE("bad options are refused, naming the field and the value, and reconfigure keeps the old ones") {
    rs::testing::simulation sim;
    const auto refuses = [&](rs::balancer_options o, const std::string& field) {
        try {
            lb_t{{"a"}, std::move(o), sim.clock(), rs::seeded_random{1}};
            FAIL("accepted");
        } catch (const std::invalid_argument& e) {
            CHECK_THAT(e.what(), Catch::Contains(field));
        }
    };
    refuses({.decay_time = 0s}, "decay_time must be positive, got 0ns");
    refuses({.initial_latency = -1s}, "initial_latency");
    refuses({.failure_penalty = -1ns}, "failure_penalty must not be negative, got -1ns");
    refuses({.slow_start_window = -1s}, "slow_start_window");
    refuses({.slow_start_min_weight = 0}, "slow_start_min_weight");
    rs::balancer_options o;
    o.outlier_ejection->interval = 0s;
    refuses(o, "outlier_ejection.interval");
    o = {};
    o.outlier_ejection->max_ejection_percent = 101;
    refuses(o, "outlier_ejection.max_ejection_percent must be in [0, 100]");
    o = {};
    o.outlier_ejection->consecutive_failures = -1;
    refuses(o, "outlier_ejection.consecutive_failures");
    lb_t lb{{"a"}, {.name = "x"}, sim.clock(), rs::seeded_random{1}};
    CHECK_THROWS_AS(lb.reconfigure({.decay_time = -1s}), std::invalid_argument);
    CHECK(lb.options().name == "x");
    lb.reconfigure({.name = "y", .pick = rs::balance_pick::random});
    CHECK(lb.options().name == "y");
    CHECK(lb.options().pick == rs::balance_pick::random);
}

} // namespace test_balancer
