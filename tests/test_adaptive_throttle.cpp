// SPDX-License-Identifier: MIT
// adaptive_throttle: the probability formula, the seeded draws, the sliding window, what counts as a
// request and as an accept, refusals without exceptions, telemetry, retries around it, and sharing
// across threads.

#include "catch.hpp"
#include "support.hpp"
#include "throw_counter.hpp"

#include <resilience/adaptive_throttle.hpp>
#include <resilience/classifier.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/random.hpp>
#include <resilience/retry.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/telemetry.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace test_adaptive_throttle {

namespace rs = resilience;
using namespace std::chrono_literals;
using rs::testing::simulation;
using std::chrono::nanoseconds;

namespace {

struct boom : std::runtime_error {
    boom() : std::runtime_error("boom") {}
};

auto fail_now(int* ran = nullptr) {
    return [ran]() -> rs::task<int> {
        if (ran)
            ++*ran;
        throw boom{};
        co_return 0;
    };
}
auto succeed_now(int* ran = nullptr) {
    return [ran]() -> rs::task<int> {
        if (ran)
            ++*ran;
        co_return 7;
    };
}

// Draws 0 every time: every call meeting a probability above 0 is refused.
struct always_refuse {
    using result_type = std::uint64_t;
    static constexpr result_type min() noexcept { return 0; }
    static constexpr result_type max() noexcept { return std::numeric_limits<result_type>::max(); }
    result_type operator()() noexcept { return 0; }
};

bool throttled(const rs::outcome<int>& r) {
    return r.has_failure() && r.error().code() == rs::errc::throttled;
}

using virtual_throttle = rs::adaptive_throttle<rs::testing::virtual_clock, rs::seeded_random>;

} // namespace

static_assert(rs::policy<rs::adaptive_throttle<>>);
static_assert(rs::policy<virtual_throttle>);

TEST_CASE("adaptive_throttle: deduces its clock and random source, and copies are the same throttle",
          "[adaptive_throttle]") {
    simulation sim;
    rs::adaptive_throttle plain{};
    static_assert(
        std::is_same_v<decltype(plain), rs::adaptive_throttle<rs::steady_clock, rs::thread_random>>);
    rs::adaptive_throttle t{{.name = "api"}, sim.clock(), rs::seeded_random{1}};
    static_assert(std::is_same_v<decltype(t), virtual_throttle>);
    CHECK(t.options().k == 2.0);
    CHECK(t.options().window == 2min);
    CHECK(t.options().segments == 12);
    CHECK(t.name() == "api");

    const auto copy = t;
    CHECK(copy == t);
    CHECK_FALSE(rs::adaptive_throttle(rs::adaptive_throttle_options{}, sim.clock(), rs::seeded_random{1}) ==
                t);
    (void)sim.run(copy.execute_outcome(succeed_now()));
    CHECK(t.requests() == 1);
    CHECK(t.accepts() == 1);
}

TEST_CASE("adaptive_throttle: a bad option is refused with the throttle's label, the field and the value",
          "[adaptive_throttle]") {
    simulation sim;
    CHECK_THROWS_WITH((rs::adaptive_throttle{{.name = "api", .k = 0.0}, sim.clock()}),
                      "resilience::adaptive_throttle (api): k must be positive and finite, got 0");
    CHECK_THROWS_WITH(
        (rs::adaptive_throttle{{.window = 10ns, .segments = 11}, sim.clock()}),
        "resilience::adaptive_throttle: segments must be at most the window in nanoseconds (10), got 11");
}

TEST_CASE("adaptive_throttle: the probability is max(0, (requests - k * accepts) / (requests + 1)) "
          "over the window",
          "[adaptive_throttle]") {
    simulation sim;
    rs::adaptive_throttle t{{.k = 2.0}, sim.clock(), rs::seeded_random{7}};
    CHECK(t.probability() == 0.0);
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 5; ++i)
            (void)co_await t.execute_outcome(succeed_now());
        CHECK(t.requests() == 5);
        CHECK(t.accepts() == 5);
        CHECK(t.probability() == 0.0);
        // Up to k * accepts requests, nothing is refused: p stays 0 and every call runs.
        int ran = 0;
        for (int i = 0; i < 5; ++i)
            (void)co_await t.execute_outcome(fail_now(&ran));
        CHECK(ran == 5);
        CHECK(t.requests() == 10);
        CHECK(t.probability() == 0.0);
        (void)co_await t.execute_outcome(fail_now(&ran));
        CHECK(ran == 6);
        CHECK(t.probability() == 1.0 / 12.0); // (11 - 2 * 5) / 12
        // Refused or failed, each call is a request and none an accept.
        for (int i = 0; i < 14; ++i)
            (void)co_await t.execute_outcome(fail_now());
        CHECK(t.requests() == 25);
        CHECK(t.accepts() == 5);
        CHECK(t.probability() == 15.0 / 26.0);
    }());

    rs::adaptive_throttle strict{{.k = 1.5}, sim.clock(), rs::seeded_random{7}};
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 4; ++i)
            (void)co_await strict.execute_outcome(succeed_now());
        for (int i = 0; i < 10; ++i)
            (void)co_await strict.execute_outcome(fail_now());
    }());
    CHECK(strict.probability() == 8.0 / 15.0); // (14 - 1.5 * 4) / 15
}

TEST_CASE("adaptive_throttle: with k at most 1 it refuses while any call of the window was not accepted",
          "[adaptive_throttle]") {
    simulation sim;
    rs::adaptive_throttle t{{.k = 1.0}, sim.clock(), always_refuse{}};
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 100; ++i)
            (void)co_await t.execute_outcome(succeed_now());
        CHECK(t.probability() == 0.0);
        (void)co_await t.execute_outcome(fail_now());
        CHECK(t.probability() == 1.0 / 102.0);
        int ran = 0;
        const auto r = co_await t.execute_outcome(succeed_now(&ran));
        CHECK(ran == 0);
        CHECK(throttled(r));
    }());
}

TEST_CASE("adaptive_throttle: over 2000 calls with a seeded source, the refusals are the formula's draws",
          "[adaptive_throttle]") {
    // The dependency accepts one call in four of those it receives. The reference below draws from a
    // copy of the seeded source exactly where the throttle does (only while p > 0) and counts as the
    // documentation says: the probability as the window stands, then the call as a request.
    constexpr int n = 2000;
    constexpr std::uint64_t seed = 42;
    simulation sim;
    rs::adaptive_throttle t{{.k = 2.0}, sim.clock(), rs::seeded_random{seed}};
    int received = 0;
    const auto dependency = [&received]() -> rs::task<int> {
        if (++received % 4 != 0)
            throw boom{};
        co_return 1;
    };
    std::vector<bool> refused;
    std::vector<double> refused_with;
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < n; ++i) {
            const auto r = co_await t.execute_outcome(dependency);
            refused.push_back(throttled(r));
            if (throttled(r))
                refused_with.push_back(r.error().as<rs::throttled_error>()->probability());
        }
    }());

    rs::seeded_random rng{seed};
    std::uint64_t requests = 0, accepts = 0, sent = 0;
    std::vector<bool> expected;
    std::vector<double> expected_with;
    double mean = 0.0, variance = 0.0;
    for (int i = 0; i < n; ++i) {
        const double r = static_cast<double>(requests);
        const double p = std::max(0.0, (r - 2.0 * static_cast<double>(accepts)) / (r + 1.0));
        mean += p;
        variance += p * (1.0 - p);
        const bool refuse = p > 0.0 && rs::detail::unit_random(rng) < p;
        ++requests;
        expected.push_back(refuse);
        if (refuse) {
            expected_with.push_back(p);
            continue;
        }
        if (++sent % 4 == 0)
            ++accepts;
    }
    CHECK(refused == expected);
    CHECK(refused_with == expected_with);
    CHECK(t.requests() == requests);
    CHECK(t.accepts() == accepts);
    // And the draws follow the odds: the refusals are within four standard deviations of their mean.
    const auto count = static_cast<double>(std::count(refused.begin(), refused.end(), true));
    CHECK(count > 0.0);
    CHECK(std::abs(count - mean) < 4.0 * std::sqrt(variance));
}

TEST_CASE("adaptive_throttle: a client offering ten times what its dependency accepts sends about k times it",
          "[adaptive_throttle]") {
    // One call a millisecond to a dependency that accepts 100 calls a second and refuses the rest at
    // once. Once the first window (10 s) has passed, the client sends about k * 100 calls a second and
    // the dependency still gets enough to accept (nearly) all it can.
    for (const double k : {1.1, 2.0, 3.0}) {
        simulation sim;
        rs::adaptive_throttle t{{.k = k, .window = 10s, .segments = 10}, sim.clock(), rs::seeded_random{1}};
        long sent = 0, accepted = 0, capacity = 100;
        std::int64_t second = 0;
        sim.run([&]() -> rs::task<void> {
            for (int i = 0; i < 60'000; ++i) {
                if (sim.now() / 1s != second) {
                    second = sim.now() / 1s;
                    capacity = 100;
                }
                const bool counted = sim.now() >= 10s;
                (void)co_await t.execute_outcome([&]() -> rs::task<int> {
                    sent += counted ? 1 : 0;
                    if (capacity == 0)
                        throw boom{};
                    --capacity;
                    accepted += counted ? 1 : 0;
                    co_return 1;
                });
                co_await sim.sleep_for(1ms);
            }
        }());
        INFO("k = " << k << ": " << sent / 50.0 << " sent and " << accepted / 50.0 << " accepted a second");
        CHECK(std::abs(static_cast<double>(sent) / 50.0 - k * 100.0) < 0.1 * k * 100.0);
        CHECK(accepted >= 95 * 50);
    }
}

TEST_CASE("adaptive_throttle: a refused call is a request, is not sent, and costs no exception",
          "[adaptive_throttle]") {
    simulation sim;
    // An outcome classifier that reads -1 as a refusal: nothing in this test throws.
    rs::adaptive_throttle t{{.should_handle = [](const rs::outcome<int>& o) { return !o || o.value() < 0; }},
                            sim.clock(),
                            rs::seeded_random{3}};
    int ran = 0, refused = 0;
    const auto refusing = [&ran]() -> rs::task<int> {
        ++ran;
        co_return -1;
    };
#ifdef RESILIENCE_TESTS_COUNT_CATCHES
    resilience_tests::counting_catches counting;
#endif
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 200; ++i) {
            const auto r = co_await t.execute_outcome(refusing);
            if (r.has_failure()) {
                CHECK(r.error().code() == rs::errc::throttled);
                ++refused;
            } else {
                CHECK(r.value() == -1); // a handled value is still returned
            }
        }
    }());
#ifdef RESILIENCE_TESTS_COUNT_CATCHES
    CHECK(counting.count() == 0);
#endif
    CHECK(refused > 0);
    CHECK(ran + refused == 200);
    CHECK(t.requests() == 200);
    CHECK(t.accepts() == 0);
    CHECK(t.probability() == 200.0 / 201.0);

    // Through `execute`, the refusal is thrown as a throttled_error carrying its probability and name.
    rs::adaptive_throttle named{{.name = "api"}, sim.clock(), always_refuse{}};
    (void)sim.run(named.execute_outcome(fail_now()));
    try {
        (void)sim.run(named.execute(succeed_now()));
        FAIL("expected throttled_error");
    } catch (const rs::throttled_error& e) {
        CHECK(e.probability() == 0.5);
        CHECK(e.policy_name() == "api");
        CHECK(e.code() == rs::errc::throttled);
        CHECK(std::string(e.what()) == "api: throttled");
    }
}

namespace {

// Spawned, so a function of its own: its parameters live in its frame, where a lambda's captures would
// not (see docs/core.md, lifetimes). At 5 s two accepted calls, at 25 s three failed ones.
rs::task<void> accepts_then_failures(simulation& sim, const virtual_throttle& t) {
    co_await sim.sleep_for(5s);
    for (int i = 0; i < 2; ++i)
        (void)co_await t.execute_outcome(succeed_now());
    co_await sim.sleep_for(20s);
    int ran = 0;
    for (int i = 0; i < 3; ++i)
        (void)co_await t.execute_outcome(fail_now(&ran));
    CHECK(ran == 3); // p was (2 - 4) / 3, (3 - 4) / 4, (4 - 4) / 5: never above 0
}

// At `at`, one call that takes `latency` and succeeds.
rs::task<void> one_call(simulation& sim, const virtual_throttle& t, nanoseconds at, nanoseconds latency) {
    co_await sim.sleep_for(at);
    // Named, not a temporary of the co_await expression (g++ 12 destroys those twice).
    const rs::testing::scripted_action call{sim.clock(),
                                            rs::testing::script<int>{.latency = latency, .value = 1}};
    const auto r = co_await t.execute_outcome(call);
    CHECK(r.has_value());
}

} // namespace

TEST_CASE("adaptive_throttle: counts leave the window at exact segment instants", "[adaptive_throttle]") {
    simulation sim;
    // Segments of 10 s: a count made in [10k, 10k + 10) s stops counting at 10k + 60 s.
    rs::adaptive_throttle t{{.window = 60s, .segments = 6}, sim.clock(), rs::seeded_random{5}};
    sim.spawn(accepts_then_failures(sim, t));
    sim.run_until(60s - 1ns);
    CHECK(t.requests() == 5);
    CHECK(t.accepts() == 2);
    CHECK(t.probability() == 1.0 / 6.0);
    sim.run_until(60s);
    CHECK(t.requests() == 3);
    CHECK(t.accepts() == 0);
    CHECK(t.probability() == 3.0 / 4.0);
    sim.run_until(80s - 1ns);
    CHECK(t.requests() == 3);
    sim.run_until(80s);
    CHECK(t.requests() == 0);
    CHECK(t.probability() == 0.0);
    sim.run_all();
}

TEST_CASE("adaptive_throttle: a request counts when the call arrives, an accept when it ends",
          "[adaptive_throttle]") {
    simulation sim;
    rs::adaptive_throttle t{{.window = 60s, .segments = 6}, sim.clock(), rs::seeded_random{5}};
    sim.spawn(one_call(sim, t, 9s, 2s));
    sim.run_until(10s);
    CHECK(t.requests() == 1);
    CHECK(t.accepts() == 0); // still running
    sim.run_until(11s);
    CHECK(t.accepts() == 1);
    sim.run_until(60s);
    CHECK(t.requests() == 0); // made at 9 s, in the segment [0, 10) s
    CHECK(t.accepts() == 1);  // made at 11 s, in the segment [10, 20) s
    sim.run_until(70s);
    CHECK(t.accepts() == 0);
    sim.run_all();
}

TEST_CASE("adaptive_throttle: cancellation is not a refusal by the dependency", "[adaptive_throttle]") {
    simulation sim;
    const rs::classifier everything = [](const rs::failure&) { return true; };
    rs::adaptive_throttle t{{}, sim.clock(), rs::seeded_random{9}};
    rs::adaptive_throttle strict{{.should_handle = everything}, sim.clock(), rs::seeded_random{9}};
    const auto slow = [&sim](resilience::stop_token st) -> rs::task<int> {
        co_await sim.sleep_for(1s, st);
        if (st.stop_requested())
            throw rs::cancelled_error{};
        co_return 1;
    };

    SECTION("the caller stops the call: an accept, whatever should_handle says") {
        for (const auto* throttle : {&t, &strict}) {
            resilience::stop_source stop;
            sim.spawn(resilience_tests::stop_at(sim, stop, sim.now() + 500ms));
            const auto r = sim.run(throttle->execute_outcome(slow, stop.get_token()));
            REQUIRE(r.has_failure());
            CHECK(rs::is_cancellation(r.error()));
            CHECK(throttle->requests() == 1);
            CHECK(throttle->accepts() == 1);
        }
    }
    SECTION("an action that reports cancellation of its own: an accept by default") {
        const auto cancelled = []() -> rs::task<int> {
            throw rs::cancelled_error{};
            co_return 0;
        };
        (void)sim.run(t.execute_outcome(cancelled));
        CHECK(t.accepts() == 1);
        (void)sim.run(strict.execute_outcome(cancelled)); // a classifier that handles it says otherwise
        CHECK(strict.requests() == 1);
        CHECK(strict.accepts() == 0);
    }
    SECTION("a call stopped before it arrives is not counted and not sent") {
        resilience::stop_source stop;
        stop.request_stop();
        int ran = 0;
        const auto r = sim.run(t.execute_outcome(succeed_now(&ran), stop.get_token()));
        REQUIRE(r.has_failure());
        CHECK(r.error().code() == rs::errc::cancelled);
        CHECK(ran == 0);
        CHECK(t.requests() == 0);
    }
}

TEST_CASE("adaptive_throttle: should_handle decides the accepts, values included", "[adaptive_throttle]") {
    simulation sim;
    rs::adaptive_throttle t{
        {.should_handle = [](const rs::outcome<int>& o) { return !o || o.value() == 503; }},
        sim.clock(),
        rs::seeded_random{11}};
    const auto status = [](int s) { return [s]() -> rs::task<int> { co_return s; }; };
    CHECK(sim.run(t.execute_outcome(status(200))).value() == 200);
    CHECK(sim.run(t.execute_outcome(status(503))).value() == 503);
    CHECK(t.requests() == 2);
    CHECK(t.accepts() == 1);

    // A classifier of another result type: the call fails before it is counted or sent.
    rs::adaptive_throttle other{
        {.should_handle = [](const rs::outcome<long>& o) { return !o; }}, sim.clock(), rs::seeded_random{11}};
    int ran = 0;
    const auto r = sim.run(other.execute_outcome(succeed_now(&ran)));
    REQUIRE(r.has_failure());
    CHECK(r.error().is<std::invalid_argument>());
    CHECK(ran == 0);
    CHECK(other.requests() == 0);

    // A classifier that throws: its exception is the call's failure, and no accept is counted.
    rs::adaptive_throttle throwing{
        {.should_handle = [](const rs::failure&) -> bool { throw std::logic_error("no"); }},
        sim.clock(),
        rs::seeded_random{11}};
    const auto thrown = sim.run(throwing.execute_outcome(fail_now()));
    REQUIRE(thrown.has_failure());
    CHECK(thrown.error().is<std::logic_error>());
    CHECK(throwing.requests() == 1);
    CHECK(throwing.accepts() == 0);
}

TEST_CASE("adaptive_throttle: a refusal is reported to the listener as a rejection",
          "[adaptive_throttle][telemetry]") {
    simulation sim;
    struct seen {
        rs::telemetry_kind kind;
        std::string policy, name;
        int attempt;
        rs::errc code;
        nanoseconds at;
    };
    std::vector<seen> events;
    rs::adaptive_throttle t{{.name = "api",
                             .telemetry =
                                 [&events](const rs::telemetry_event& e) {
                                     events.push_back({e.kind, std::string(e.policy), std::string(e.name),
                                                       e.attempt, e.error ? e.error->code() : rs::errc{},
                                                       e.at});
                                 }},
                            sim.clock(),
                            always_refuse{}};
    sim.run([&]() -> rs::task<void> {
        (void)co_await t.execute_outcome(fail_now()); // admitted: nothing to report
        co_await sim.sleep_for(3s);
        (void)co_await t.execute_outcome(succeed_now());
    }());
    REQUIRE(events.size() == 1);
    CHECK(events[0].kind == rs::telemetry_kind::rejection);
    CHECK(events[0].policy == "adaptive_throttle");
    CHECK(events[0].name == "api");
    CHECK(events[0].attempt == 1);
    CHECK(events[0].code == rs::errc::throttled);
    CHECK(events[0].at == 3s);
}

TEST_CASE(
    "adaptive_throttle: on_rejected is told once per refusal, before it is returned, as throttled with no "
    "retry_after, and never for an admitted call",
    "[adaptive_throttle][on_rejected]") {
    simulation sim;
    struct told {
        std::string name;
        rs::rejection_reason reason;
        nanoseconds retry_after;
        nanoseconds at;
    };
    std::vector<told> log;
    std::vector<nanoseconds> refusals_returned;
    rs::adaptive_throttle t{{.name = "api",
                             .should_handle = [](const rs::outcome<int>& o) { return !o || o.value() < 0; },
                             .on_rejected =
                                 [&](const rs::rejection_event& e) {
                                     CHECK(refusals_returned.size() == log.size()); // before it is returned
                                     log.push_back({std::string(e.policy_name()), e.reason(), e.retry_after(),
                                                    sim.clock().now().time_since_epoch()});
                                 }},
                            sim.clock(),
                            rs::seeded_random{3}};
    const auto refusing = []() -> rs::task<int> { co_return -1; };
    int admitted = 0;
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 200; ++i) {
            co_await sim.sleep_for(1ms);
            const auto r = co_await t.execute_outcome(refusing);
            if (r.has_failure())
                refusals_returned.push_back(sim.clock().now().time_since_epoch());
            else
                ++admitted;
        }
    }());
    REQUIRE(!refusals_returned.empty());
    REQUIRE(log.size() == refusals_returned.size());
    CHECK(admitted + static_cast<int>(log.size()) == 200);
    for (std::size_t i = 0; i < log.size(); ++i) {
        CHECK(log[i].name == "api");
        CHECK(log[i].reason == rs::rejection_reason::throttled);
        CHECK(log[i].retry_after == 0ns);
        CHECK(log[i].at == refusals_returned[i]);
    }
}

TEST_CASE("adaptive_throttle: an on_rejected that throws ends the call with its exception, and the listener "
          "hears nothing",
          "[adaptive_throttle][on_rejected]") {
    simulation sim;
    struct told_off : std::runtime_error {
        told_off() : std::runtime_error("told off") {}
    };
    int told = 0, heard = 0;
    rs::adaptive_throttle t{{.on_rejected =
                                 [&told](const rs::rejection_event&) {
                                     ++told;
                                     throw told_off{};
                                 },
                             .telemetry =
                                 [&heard](const rs::telemetry_event& e) {
                                     if (e.kind == rs::telemetry_kind::rejection)
                                         ++heard;
                                 }},
                            sim.clock(),
                            always_refuse{}};
    int ran = 0;
    const auto first = sim.run(t.execute_outcome(fail_now(&ran)));     // p was 0: admitted, not told
    const auto second = sim.run(t.execute_outcome(succeed_now(&ran))); // p 0.5: refused
    REQUIRE(first.has_failure());
    CHECK(first.error().is<boom>());
    REQUIRE(second.has_failure());
    CHECK(second.error().is<told_off>());
    CHECK(ran == 1);
    CHECK(told == 1);
    CHECK(heard == 0);
    CHECK(t.requests() == 2); // the refused call is still a request
    CHECK_THROWS_AS(sim.run(t.execute(succeed_now(&ran))), told_off);
    CHECK(told == 2);
}

TEST_CASE("adaptive_throttle: a retry around it does not retry a refusal, by default",
          "[adaptive_throttle][retry]") {
    // Inside the retry, every attempt is a request. The refusal is not transient (as a breaker's is
    // not), so the default retry ends at it, and the call reports it: the last outcome, as ever.
    simulation sim;
    rs::adaptive_throttle t{{}, sim.clock(), always_refuse{}};
    const rs::pipeline p{
        rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{100ms, rs::jitter::none}}, sim.clock()},
        t};
    int ran = 0;
    const auto r = sim.run(p.execute_outcome(fail_now(&ran)));
    CHECK(throttled(r));
    CHECK(ran == 1);           // the first attempt failed, the second was refused (p = 1/2)
    CHECK(t.requests() == 2);  // and the retry stopped there
    CHECK(sim.now() == 100ms); // after the one backoff it waited
    CHECK_FALSE(rs::is_transient(rs::failure::make(rs::throttled_error{"", 0.5})));
    CHECK_FALSE(rs::is_transient(rs::failure{std::make_exception_ptr(rs::throttled_error{"", 0.5})}));

    // A retry told to handle every failure retries the refusal too: each retry is a request that
    // draws again, and that raises the odds for everybody.
    rs::adaptive_throttle u{{}, sim.clock(), always_refuse{}};
    const rs::pipeline eager{rs::retry{{.max_attempts = 3,
                                        .backoff = rs::constant_backoff{100ms, rs::jitter::none},
                                        .should_handle = [](const rs::failure&) { return true; }},
                                       sim.clock()},
                             u};
    ran = 0;
    CHECK(throttled(sim.run(eager.execute_outcome(fail_now(&ran)))));
    CHECK(ran == 1);
    CHECK(u.requests() == 3);

    // Outside the retry, a whole retried call is one request, judged by its last outcome.
    rs::adaptive_throttle outer{{}, sim.clock(), always_refuse{}};
    const rs::pipeline whole{
        outer,
        rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{0ms, rs::jitter::none}}, sim.clock()}};
    ran = 0;
    CHECK(sim.run(whole.execute_outcome(fail_now(&ran))).error().is<boom>());
    CHECK(ran == 3);
    CHECK(outer.requests() == 1);
    CHECK(outer.accepts() == 0);
}

namespace {

using shared_throttle = rs::adaptive_throttle<rs::steady_clock, rs::seeded_random>;

struct tally {
    std::atomic<int> sent{0}, answered{0}, refused{0};
};

// One call through `t` to a dependency that answers at once, or fails when `fails`.
rs::task<void> call_through(shared_throttle t, bool fails, tally& n) {
    const auto dependency = [&n, fails]() -> rs::task<int> {
        n.sent.fetch_add(1);
        if (fails)
            throw boom{};
        co_return 0;
    };
    const auto r = co_await t.execute_outcome(dependency);
    if (r.has_value())
        n.answered.fetch_add(1);
    else if (throttled(r))
        n.refused.fetch_add(1);
}

// `per_loop` calls through `t` on each of two event loops, each loop on a thread of its own.
void on_two_threads(const shared_throttle& t, int per_loop, bool fails, tally& n) {
    rs::event_loop a, b;
    for (int i = 0; i < per_loop; ++i) {
        a.spawn(call_through(t, fails, n));
        b.spawn(call_through(t, fails, n));
    }
    resilience_tests::run_on_threads(a, b);
}

} // namespace

TEST_CASE("adaptive_throttle: shared by two threads, every accept is counted once, across segments",
          "[adaptive_throttle][concurrency]") {
    constexpr int per_loop = 2000;
    // Segments of 60 us: the window moves on many times while the threads run, so accepts are counted
    // both without the lock (in the newest segment) and with it (in a later one), racing the admissions.
    shared_throttle t{{.window = 60s, .segments = 1'000'000}, rs::steady_clock{}, rs::seeded_random{13}};
    tally n;
    on_two_threads(t, per_loop, false, n);
    // A call may find the other thread's call admitted and not yet ended, and be refused.
    CHECK(n.sent.load() == n.answered.load());
    CHECK(n.answered.load() + n.refused.load() == 2 * per_loop);
    CHECK(t.requests() == 2 * per_loop);
    CHECK(t.accepts() == static_cast<std::uint64_t>(n.answered.load()));
}

TEST_CASE("adaptive_throttle: shared by two threads, every call is counted once",
          "[adaptive_throttle][concurrency]") {
    constexpr int per_loop = 2000;
    shared_throttle t{{}, rs::steady_clock{}, rs::seeded_random{13}}; // drawn under the throttle's lock
    tally n;
    on_two_threads(t, per_loop, true, n);
    CHECK(n.sent.load() + n.refused.load() == 2 * per_loop);
    CHECK(n.refused.load() > 0);
    CHECK(t.requests() == 2 * per_loop);
    CHECK(t.accepts() == 0);
}

} // namespace test_adaptive_throttle
