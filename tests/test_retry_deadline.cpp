// SPDX-License-Identifier: MIT
// retry inside a call with a deadline: no attempt is started that cannot finish in time
// (`min_attempt_time`), the last failure is reported at its own instant, deadlines of other clocks.

#include "catch.hpp"
#include "support.hpp"

#include <resilience/any_clock.hpp>
#include <resilience/classifier.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/retry.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/telemetry.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace test_retry_deadline {

namespace rs = resilience;
using namespace std::chrono_literals;
using rs::testing::simulation;
using std::chrono::nanoseconds;

namespace {

struct boom : std::runtime_error {
    explicit boom(int i) : std::runtime_error("boom " + std::to_string(i)), id(i) {}
    int id;
};

// Writes down when each attempt starts; each runs until its token is stopped (or `fail_after`,
// then throws boom{attempt}).
struct recorded_action {
    simulation* sim;
    std::vector<nanoseconds>* starts;
    nanoseconds fail_after = nanoseconds::max();

    rs::task<int> operator()(const rs::context& ctx) const {
        starts->push_back(sim->now());
        const int attempt = static_cast<int>(starts->size());
        const resilience::stop_token st = ctx.stop_token();
        co_await sim->sleep_for(fail_after == nanoseconds::max() ? 1h : fail_after, st);
        if (st.stop_requested())
            throw rs::cancelled_error{};
        throw boom{attempt};
    }
};

// One call through a policy: how it ended, when each attempt started and when the call ended, both
// measured from the call's start.
struct played {
    rs::outcome<int> result;
    std::vector<nanoseconds> starts;
    nanoseconds ended;
};

template <class Policy>
played play(simulation& sim, const Policy& policy, nanoseconds fail_after = nanoseconds::max()) {
    std::vector<nanoseconds> starts;
    const auto begun = sim.now();
    auto result = sim.run(policy.execute_outcome(recorded_action{&sim, &starts, fail_after}));
    for (auto& s : starts)
        s -= begun;
    return {std::move(result), std::move(starts), sim.now() - begun};
}

rs::backoff constant(nanoseconds d) {
    return rs::constant_backoff{d, rs::jitter::none};
}

// The name of the timeout that made a timeout_error, or "" for another failure.
std::string timeout_name(const rs::outcome<int>& r) {
    const auto* e = r.has_failure() ? r.error().as<rs::timeout_error>() : nullptr;
    return e ? e->policy_name() : std::string{};
}

} // namespace

TEST_CASE("retry: inside a deadline, an attempt that would not have min_attempt_time left is not started",
          "[retry][deadline]") {
    // Attempts of 200 ms (the inner timeout) every 100 ms of backoff, inside 1 s: attempts at 0, 300,
    // 600 ms end at 200, 500, 800 ms. At 800 ms the next attempt would start at 900 ms.
    simulation sim;
    const auto run = [&](nanoseconds min_attempt_time) {
        const rs::pipeline p{
            rs::timeout{{.name = "total", .timeout = 1s}, sim.clock()},
            rs::retry{{.max_attempts = 10, .backoff = constant(100ms), .min_attempt_time = min_attempt_time},
                      sim.clock()},
            rs::timeout{{.name = "attempt", .timeout = 200ms}, sim.clock()},
        };
        return play(sim, p);
    };

    SECTION("min_attempt_time 0: the attempt at 900 ms starts, and the outer timeout stops it at 1 s") {
        const played r = run(0ns);
        CHECK(r.starts == std::vector<nanoseconds>{0ms, 300ms, 600ms, 900ms});
        CHECK(r.ended == 1s);
        CHECK(timeout_name(r.result) == "total");
    }
    SECTION("min_attempt_time 100 ms: 900 ms + 100 ms is the deadline itself, so it still starts") {
        const played r = run(100ms);
        CHECK(r.starts == std::vector<nanoseconds>{0ms, 300ms, 600ms, 900ms});
        CHECK(r.ended == 1s);
        CHECK(timeout_name(r.result) == "total");
    }
    SECTION("min_attempt_time 100 ms + 1 ns: it is not started, and the call ends at 800 ms with the "
            "last failure") {
        const played r = run(100ms + 1ns);
        CHECK(r.starts == std::vector<nanoseconds>{0ms, 300ms, 600ms});
        CHECK(r.ended == 800ms);
        CHECK(timeout_name(r.result) == "attempt"); // the third attempt's own timeout, reported at once
    }
    SECTION("min_attempt_time 200 ms: the whole attempt must fit") {
        const played r = run(200ms);
        CHECK(r.starts == std::vector<nanoseconds>{0ms, 300ms, 600ms});
        CHECK(r.ended == 800ms);
    }
}

TEST_CASE("retry: inside a deadline, min_attempt_time 0 gives up only when the wait itself ends past it",
          "[retry][deadline]") {
    simulation sim;
    const auto run = [&](nanoseconds backoff) {
        const rs::pipeline p{rs::timeout{{.name = "total", .timeout = 1s}, sim.clock()},
                             rs::retry{{.max_attempts = 10, .backoff = constant(backoff)}, sim.clock()},
                             rs::timeout{{.name = "attempt", .timeout = 200ms}, sim.clock()}};
        return play(sim, p);
    };
    // The second wait would end at 750 + 350 = 1100 ms: the call ends at 750 ms, with the second
    // attempt's timeout, not the outer one's at 1 s.
    const played past = run(350ms);
    CHECK(past.starts == std::vector<nanoseconds>{0ms, 550ms});
    CHECK(past.ended == 750ms);
    CHECK(timeout_name(past.result) == "attempt");
    // Ending exactly at the deadline (700 + 300 ms) is not past it: the retry waits, and the outer
    // timeout, armed first, ends the call at that instant.
    const played at = run(300ms);
    CHECK(at.starts == std::vector<nanoseconds>{0ms, 500ms});
    CHECK(at.ended == 1s);
    CHECK(timeout_name(at.result) == "total");
}

TEST_CASE("retry: giving up at a deadline reports the last failure as it was, unannounced",
          "[retry][deadline]") {
    simulation sim;
    int retries = 0, retry_events = 0;
    const rs::pipeline p{
        rs::timeout{1s, sim.clock()},
        rs::retry{{.max_attempts = 10,
                   .backoff = constant(250ms),
                   .min_attempt_time = 100ms,
                   .on_retry = [&retries](const rs::retry_event&) { ++retries; },
                   .telemetry =
                       [&retry_events](const rs::telemetry_event& e) {
                           if (e.kind == rs::telemetry_kind::retry || e.kind == rs::telemetry_kind::rejection)
                               ++retry_events;
                       }},
                  sim.clock()},
    };
    // Each attempt fails 50 ms in: at 50, 350 and 650 ms. At 650 ms the next would start at 900 ms
    // with 100 ms left: it fits. At 950 ms the next would start at 1200 ms: the call ends at 950 ms.
    const played r = play(sim, p, 50ms);
    CHECK(r.starts == std::vector<nanoseconds>{0ms, 300ms, 600ms, 900ms});
    CHECK(r.ended == 950ms);
    REQUIRE(r.result.has_failure());
    REQUIRE(r.result.error().is<boom>());
    CHECK(r.result.error().as<boom>()->id == 4); // the last attempt's own exception, not a timeout
    // As when max_elapsed ends the loop: the retries made are reported, the one not made is not.
    CHECK(retries == 3);
    CHECK(retry_events == 3);
}

TEST_CASE("retry: a verdict's delay counts as the wait against the deadline", "[retry][deadline]") {
    simulation sim;
    const rs::pipeline p{
        rs::timeout{1s, sim.clock()},
        rs::retry{
            {.max_attempts = 10,
             .backoff = constant(1ms),
             .should_handle = [](const rs::failure&) { return rs::verdict{.handle = true, .delay = 2s}; }},
            sim.clock()},
    };
    const played r = play(sim, p, 10ms);
    CHECK(r.starts.size() == 1); // Retry-After: 2 s, inside 1 s: no point waiting
    CHECK(r.ended == 10ms);
    CHECK(r.result.error().is<boom>());
}

TEST_CASE("retry: the first attempt starts whatever the deadline leaves, and without a deadline "
          "min_attempt_time changes nothing",
          "[retry][deadline]") {
    simulation sim;
    const rs::retry retry{{.max_attempts = 3, .backoff = constant(100ms), .min_attempt_time = 1h},
                          sim.clock()};
    const played bounded = play(sim, rs::pipeline{rs::timeout{100ms, sim.clock()}, retry}, 10ms);
    CHECK(bounded.starts == std::vector<nanoseconds>{0ms});
    CHECK(bounded.ended == 10ms);
    CHECK(bounded.result.error().is<boom>());

    const played unbounded = play(sim, retry, 10ms);
    CHECK(unbounded.starts == std::vector<nanoseconds>{0ms, 110ms, 220ms});
    CHECK(unbounded.result.error().as<boom>()->id == 3);
}

TEST_CASE("retry: a deadline on another clock type is not compared with the retry's clock",
          "[retry][deadline]") {
    // Inside 1 s, attempts of 200 ms every 300 ms start at 0 and 500 ms. At 700 ms the third would
    // start at 1 s with nothing left of its 500 ms: where the retry sees the deadline, the call ends
    // at 700 ms with the second attempt's own timeout; where it does not, the outer timeout ends it at 1 s.
    simulation sim;
    const auto call = [&](auto outer_clock, auto retry_clock) {
        const rs::pipeline p{
            rs::timeout{1s, outer_clock},
            rs::retry<decltype(retry_clock)>{
                {.max_attempts = 10, .backoff = constant(300ms), .min_attempt_time = 500ms}, retry_clock},
            rs::timeout{200ms, sim.clock()}};
        const played r = play(sim, p);
        CHECK(r.starts == std::vector<nanoseconds>{0ms, 500ms});
        CHECK(r.result.error().is<rs::timeout_error>());
        return r.ended;
    };
    // The outer timeout's clock has another epoch: its deadline means nothing on the simulation's clock.
    CHECK(call(resilience_tests::shifted_clock{sim.clock()}, sim.clock()) == 1s);
    CHECK(call(sim.clock(), sim.clock()) == 700ms);
    // Clocks are told apart by their type, and an any_clock is a type of its own: a retry on one sees
    // the deadlines of timeouts on any_clocks, not those of a timeout on the clock it holds.
    CHECK(call(rs::any_clock{sim.clock()}, rs::any_clock{sim.clock()}) == 700ms);
    CHECK(call(sim.clock(), rs::any_clock{sim.clock()}) == 1s);
}

} // namespace test_retry_deadline
