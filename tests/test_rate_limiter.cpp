// SPDX-License-Identifier: MIT
// Tests of resilience::rate_limiter (token bucket) and resilience::sliding_window_limiter.

#include "catch.hpp"
#include "support.hpp"

#include <resilience/clock.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace test_rate_limiter {

namespace rs = resilience;
using namespace std::chrono_literals;
using std::chrono::nanoseconds;
using vclock = rs::testing::virtual_clock;
using resilience_tests::stop_at;

static_assert(rs::policy<rs::rate_limiter<>>);
static_assert(rs::policy<rs::rate_limiter<vclock>>);
static_assert(rs::policy<rs::sliding_window_limiter<>>);
static_assert(rs::policy<rs::sliding_window_limiter<vclock>>);

namespace {

struct ending {
    nanoseconds at{-1};
    std::string what;
    nanoseconds retry_after{-1};
    bool operator==(const ending&) const = default;
};

// When each call's action ran, and how each call ended, by call id.
struct journal {
    resilience_tests::instant_log admitted;
    std::map<int, ending> finished;

    std::vector<int> order() const { return resilience_tests::ids_of(admitted); }
    nanoseconds admitted_at(int id) const { return resilience_tests::instant_of(admitted, id); }
};

template <class T>
ending describe(const rs::outcome<T>& r, nanoseconds now) {
    if (r.has_value())
        return {now, "value"};
    if (auto* e = r.error().template as<rs::rate_limited_error>())
        return {now, "rate_limited", e->retry_after()};
    if (rs::is_cancellation(r.error()))
        return {now, "cancelled"};
    return {now, "failure"};
}

// Arrives at `arrive`, then runs an action that writes down when it was admitted.
template <class L>
rs::task<void> client(rs::testing::simulation& sim, L& limiter, journal& j, int id, nanoseconds arrive,
                      resilience::stop_token stop = {}) {
    if (arrive > sim.now())
        co_await sim.sleep_for(arrive - sim.now());
    // Named, then moved in: see the same note in test_bulkhead.cpp (a GCC 12 coroutine bug).
    auto action = [&sim, &j, id]() -> rs::task<int> {
        j.admitted.emplace_back(id, sim.now());
        co_return id;
    };
    auto r = co_await limiter.execute_outcome(std::move(action), std::move(stop));
    j.finished[id] = describe(r, sim.now());
}

// Calls 1 to `calls` all arrive at `arrive`; runs them to the end and returns what happened.
template <class L>
journal run_burst(rs::testing::simulation& sim, L& limiter, int calls, nanoseconds arrive = 0ms) {
    journal j;
    for (int id = 1; id <= calls; ++id)
        sim.spawn(client(sim, limiter, j, id, arrive));
    sim.run_all();
    return j;
}

ending value_at(nanoseconds at) {
    return {at, "value"};
}
ending cancelled_at(nanoseconds at) {
    return {at, "cancelled"};
}
ending limited_at(nanoseconds at, nanoseconds retry_after) {
    return {at, "rate_limited", retry_after};
}

} // namespace

// ---------------------------------------------------------------------------------------------------------
// rate_limiter

TEST_CASE("rate_limiter: a full bucket admits token_limit calls at once, then one per refill interval",
          "[rate_limiter]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 2, .tokens_per_second = 10, .queue_limit = rs::unbounded_queue},
                        sim.clock()};
    journal j = run_burst(sim, rl, 6);
    using admissions = std::vector<std::pair<int, nanoseconds>>;
    CHECK(j.admitted == admissions{{1, 0ms}, {2, 0ms}, {3, 100ms}, {4, 200ms}, {5, 300ms}, {6, 400ms}});
    CHECK(rl.queued() == 0);
}

TEST_CASE("rate_limiter: a refill interval that is not a whole nanosecond is rounded up", "[rate_limiter]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 1, .tokens_per_second = 3, .queue_limit = rs::unbounded_queue},
                        sim.clock()};
    journal j = run_burst(sim, rl, 3);
    CHECK(j.admitted_at(1) == 0ns);
    CHECK(j.admitted_at(2) == 333'333'334ns); // 1/3 s, never before
    CHECK(j.admitted_at(3) == 666'666'667ns);
}

TEST_CASE(
    "rate_limiter: queue_limit 0 (the default) refuses at once with the exact retry_after, without running",
    "[rate_limiter]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 1, .tokens_per_second = 10}, sim.clock()};
    journal j;
    sim.spawn(client(sim, rl, j, 1, 0ms));
    sim.spawn(client(sim, rl, j, 2, 30ms));
    sim.spawn(client(sim, rl, j, 3, 100ms)); // exactly when call 2 was told to come back
    sim.run_all();
    CHECK(j.finished[1] == value_at(0ms));
    CHECK(j.finished[2] == limited_at(30ms, 70ms));
    CHECK(j.admitted_at(2) == -1ns);
    CHECK(j.finished[3] == value_at(100ms));

    auto probe = [](rs::rate_limiter<vclock>& limiter) -> rs::task<void> {
        auto action = []() -> rs::task<int> { co_return 1; };
        auto r = co_await limiter.execute_outcome(std::move(action));
        REQUIRE(r.has_failure());
        CHECK(r.error().code() == rs::errc::rate_limited); // read without rethrowing
        CHECK_THROWS_AS(co_await limiter.execute(action), rs::rate_limited_error);
    };
    sim.run(probe(rl));
}

TEST_CASE("rate_limiter: queue_limit bounds the waiters, and a refused call's retry_after counts them",
          "[rate_limiter]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 1, .tokens_per_second = 10, .queue_limit = 2}, sim.clock()};
    journal j = run_burst(sim, rl, 4);
    CHECK(j.finished[1] == value_at(0ms));
    CHECK(j.finished[2] == value_at(100ms));
    CHECK(j.finished[3] == value_at(200ms));
    CHECK(j.finished[4] == limited_at(0ms, 300ms)); // two waiters ahead: the third token from now
}

TEST_CASE("rate_limiter: queue_limit = 0 never waits", "[rate_limiter]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 1, .tokens_per_second = 10, .queue_limit = 0}, sim.clock()};
    journal j;
    sim.spawn(client(sim, rl, j, 1, 0ms));
    sim.spawn(client(sim, rl, j, 2, 40ms));
    sim.run_all();
    CHECK(j.finished[2] == limited_at(40ms, 60ms));
}

TEST_CASE(
    "rate_limiter: waiters are served in arrival order: a new call cannot take a token while anyone waits",
    "[rate_limiter]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 1, .tokens_per_second = 10, .queue_limit = rs::unbounded_queue},
                        sim.clock()};
    journal j;
    // New calls arrive exactly when each token comes due, and are spawned first, so their timers
    // fire before the waiting call's: a limiter that let them take a free token would starve it.
    sim.spawn(client(sim, rl, j, 3, 100ms));
    sim.spawn(client(sim, rl, j, 4, 200ms));
    sim.spawn(client(sim, rl, j, 5, 300ms));
    sim.spawn(client(sim, rl, j, 1, 0ms));
    sim.spawn(client(sim, rl, j, 2, 0ms));
    sim.run_all();
    using admissions = std::vector<std::pair<int, nanoseconds>>;
    CHECK(j.admitted == admissions{{1, 0ms}, {2, 100ms}, {3, 200ms}, {4, 300ms}, {5, 400ms}});
}

TEST_CASE("rate_limiter: a waiter whose caller stops leaves the queue at once, and the next one takes over "
          "the timing",
          "[rate_limiter]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 1, .tokens_per_second = 10, .queue_limit = rs::unbounded_queue},
                        sim.clock()};
    journal j;
    resilience::stop_source stop_head, stop_third;
    std::size_t queued_after_head = 99, queued_after_third = 99;
    sim.spawn(client(sim, rl, j, 1, 0ms));
    sim.spawn(client(sim, rl, j, 2, 0ms, stop_head.get_token()));  // the head: due at 100 ms
    sim.spawn(client(sim, rl, j, 3, 0ms));                         // due at 200 ms
    sim.spawn(client(sim, rl, j, 4, 0ms, stop_third.get_token())); // due at 300 ms
    sim.spawn(client(sim, rl, j, 5, 0ms));                         // due at 400 ms
    sim.spawn(stop_at(sim, stop_head, 50ms, rl, queued_after_head));
    sim.spawn(stop_at(sim, stop_third, 60ms, rl, queued_after_third));
    sim.run_all();
    CHECK(queued_after_head == 3);
    CHECK(queued_after_third == 2);
    CHECK(j.finished[2] == cancelled_at(50ms));
    CHECK(j.finished[4] == cancelled_at(60ms));
    CHECK(j.order() == std::vector<int>{1, 3, 5});
    CHECK(j.finished[3] == value_at(100ms)); // the token the head gave up
    CHECK(j.finished[5] == value_at(200ms));
}

TEST_CASE("rate_limiter: a timeout around the limiter bounds the wait, and the waiter leaves the queue",
          "[rate_limiter]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 1, .tokens_per_second = 1, .queue_limit = rs::unbounded_queue},
                        sim.clock()};
    rs::pipeline bounded{rs::timeout{150ms, sim.clock()}, rl};
    journal j;
    sim.spawn(client(sim, rl, j, 1, 0ms));
    auto impatient = [](rs::testing::simulation& s,
                        rs::pipeline<rs::timeout<vclock>, rs::rate_limiter<vclock>>& p,
                        journal& out) -> rs::task<void> {
        auto action = [&s, &out]() -> rs::task<int> {
            out.admitted.emplace_back(2, s.now());
            co_return 2;
        };
        auto r = co_await p.execute_outcome(std::move(action));
        REQUIRE(r.has_failure());
        CHECK(r.error().code() == rs::errc::timeout);
        out.finished[2] = {s.now(), "timeout"};
    };
    sim.spawn(impatient(sim, bounded, j));
    sim.spawn(client(sim, rl, j, 3, 200ms));
    sim.run_all();
    CHECK(j.finished[2] == ending{150ms, "timeout"});
    CHECK(j.order() == std::vector<int>{1, 3});
    CHECK(j.finished[3] == value_at(1s)); // the token call 2 would have had
}

TEST_CASE("rate_limiter: take spends a token by the same rules as a call", "[rate_limiter]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 1, .tokens_per_second = 10, .queue_limit = rs::unbounded_queue},
                        sim.clock()};
    journal j;
    std::vector<nanoseconds> taken;
    auto taker = [](rs::testing::simulation& s, rs::rate_limiter<vclock>& limiter,
                    std::vector<nanoseconds>& out) -> rs::task<void> {
        co_await limiter.take();
        out.push_back(s.now());
        co_await s.sleep_for(10ms);
        co_await limiter.take(); // queued behind the call that arrived at 5 ms
        out.push_back(s.now());
    };
    sim.spawn(taker(sim, rl, taken));
    sim.spawn(client(sim, rl, j, 1, 5ms));
    sim.run_all();
    CHECK(taken == std::vector<nanoseconds>{0ms, 200ms});
    CHECK(j.finished[1] == value_at(100ms));

    resilience::stop_source src;
    src.request_stop();
    CHECK_THROWS_AS(sim.run(rl.take(src.get_token())), rs::cancelled_error);
    auto r = sim.run(rl.take_outcome(src.get_token()));
    REQUIRE(r.has_failure());
    CHECK(r.error().code() == rs::errc::cancelled);
}

TEST_CASE("rate_limiter: take with queue_limit 0 throws rate_limited_error, or reports it as a value",
          "[rate_limiter]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 1, .tokens_per_second = 4}, sim.clock()};
    sim.run(rl.take());
    auto r = sim.run(rl.take_outcome());
    REQUIRE(r.has_failure());
    REQUIRE(r.error().is<rs::rate_limited_error>());
    CHECK(r.error().as<rs::rate_limited_error>()->retry_after() == 250ms);
    CHECK_THROWS_AS(sim.run(rl.take()), rs::rate_limited_error);
    CHECK(sim.now() == 0ms);
}

TEST_CASE("rate_limiter: tokens refill lazily and never exceed token_limit, however long the idle",
          "[rate_limiter]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 3, .tokens_per_second = 10, .queue_limit = rs::unbounded_queue},
                        sim.clock()};
    CHECK(rl.tokens() == 3.0);
    CHECK(sim.loop().timers() == 0); // nothing scheduled: the bucket is refilled by reading the clock
    for (int i = 0; i < 3; ++i)
        sim.run(rl.take());
    CHECK(rl.tokens() == 0.0);
    sim.run(sim.sleep_for(150ms));
    CHECK(rl.tokens() == Approx(1.5));
    sim.run(sim.sleep_for(10s));
    CHECK(rl.tokens() == 3.0);

    const nanoseconds t0 = sim.now();
    journal j = run_burst(sim, rl, 4, t0);
    CHECK(j.admitted_at(3) == t0);         // a burst of exactly capacity...
    CHECK(j.admitted_at(4) == t0 + 100ms); // ...and not one more
}

TEST_CASE("rate_limiter: copies are handles to one bucket", "[rate_limiter]") {
    rs::testing::simulation sim;
    rs::rate_limiter a{{.token_limit = 1, .tokens_per_second = 10}, sim.clock()};
    auto b = a;
    sim.run(a.take());
    CHECK(b.tokens() == 0.0);
    CHECK_THROWS_AS(sim.run(b.take()), rs::rate_limited_error);
}

TEST_CASE("rate_limiter: try_take_now with the caller's clock reading grants no token before it is due, "
          "even when the reading is older than one already used",
          "[rate_limiter]") {
    // The entry point a pipeline sharing one clock reading per call uses, on the limiter's state.
    rs::testing::simulation sim;
    rs::detail::limiter_state<vclock, rs::detail::token_bucket> bucket{rs::detail::token_bucket{2, 10},
                                                                       sim.clock(), rs::unbounded_queue};
    const vclock::time_point t0 = sim.clock().now();
    CHECK(bucket.try_take_now(t0));
    CHECK(bucket.try_take_now(t0));
    CHECK_FALSE(bucket.try_take_now(t0)); // a burst of exactly capacity
    CHECK_FALSE(bucket.try_take_now(t0 + 99'999'999ns));
    CHECK(bucket.try_take_now(t0 + 100ms)); // exactly when due
    CHECK_FALSE(bucket.try_take_now(t0 + 199'999'999ns));
    CHECK_FALSE(bucket.try_take_now(t0 + 150ms)); // stale: the next token is due at 200 ms
    CHECK(bucket.try_take_now(t0 + 200ms));
    CHECK_FALSE(bucket.try_take_now(t0 + 200ms));

    // Idle long enough to fill the bucket, then a reading from before that: it sees fewer tokens.
    CHECK(bucket.try_take_now(t0 + 10s));
    CHECK_FALSE(bucket.try_take_now(t0 + 9s));
    CHECK(bucket.try_take_now(t0 + 10s));
    CHECK_FALSE(bucket.try_take_now(t0 + 10s)); // capacity, no more
    CHECK(bucket.remaining() == 0.0);
    CHECK(bucket.queued() == 0);
}

TEST_CASE("rate_limiter: try_take_now takes no token while a call waits, whatever the reading, and takes "
          "them again once nobody waits",
          "[rate_limiter]") {
    rs::testing::simulation sim;
    rs::detail::limiter_state<vclock, rs::detail::token_bucket> bucket{rs::detail::token_bucket{1, 10},
                                                                       sim.clock(), rs::unbounded_queue};
    const vclock::time_point t0 = sim.clock().now();
    REQUIRE(bucket.try_take_now(t0));
    rs::detail::timed_waiter w;
    {
        std::lock_guard lock(bucket.mutex);
        REQUIRE(bucket.decide_locked(w) == rs::detail::waiter_state::idle);
        w.state = bucket.enqueue_locked(w); // as queue_awaiter does
        REQUIRE(w.state == rs::detail::waiter_state::turn);
    }
    CHECK_FALSE(bucket.try_take_now(t0 + 1s)); // tokens are there, but the waiter comes first
    rs::detail::stop_waiter(bucket, w);        // it leaves
    CHECK(w.state == rs::detail::waiter_state::stopped);
    CHECK(bucket.queued() == 0);
    CHECK(bucket.try_take_now(t0 + 1s));
    CHECK_FALSE(bucket.try_take_now(t0 + 1s)); // a bucket of one
}

TEST_CASE("rate_limiter: invalid options are refused naming the field and the value", "[rate_limiter]") {
    using Catch::Matchers::Contains;
    CHECK_THROWS_WITH((rs::rate_limiter{{.token_limit = 0, .tokens_per_second = 1}}),
                      "resilience::rate_limiter: token_limit must be positive, got 0");
    CHECK_THROWS_WITH((rs::rate_limiter{{.token_limit = 1, .tokens_per_second = 0}}),
                      "resilience::rate_limiter: tokens_per_second must be finite and positive, got 0");
    CHECK_THROWS_WITH((rs::rate_limiter{{.token_limit = 1, .tokens_per_second = -2.5}}),
                      "resilience::rate_limiter: tokens_per_second must be finite and positive, got -2.5");
    CHECK_THROWS_WITH(
        (rs::rate_limiter{{.token_limit = 1, .tokens_per_second = std::numeric_limits<double>::quiet_NaN()}}),
        Contains("tokens_per_second must be finite and positive, got") && Contains("nan"));
    CHECK_THROWS_WITH(
        (rs::rate_limiter{{.token_limit = 1, .tokens_per_second = std::numeric_limits<double>::infinity()}}),
        "resilience::rate_limiter: tokens_per_second must be finite and positive, got inf");
    CHECK_NOTHROW(rs::rate_limiter{{.token_limit = 1, .tokens_per_second = 0.001}});
}

// ---------------------------------------------------------------------------------------------------------
// sliding_window_limiter

TEST_CASE("sliding_window_limiter: admits exactly permit_limit calls per window",
          "[rate_limiter][sliding_window]") {
    rs::testing::simulation sim;
    rs::sliding_window_limiter sw{{.permit_limit = 3, .window = 1s, .queue_limit = rs::unbounded_queue},
                                  sim.clock()};
    journal j = run_burst(sim, sw, 7);
    using admissions = std::vector<std::pair<int, nanoseconds>>;
    CHECK(j.admitted == admissions{{1, 0s}, {2, 0s}, {3, 0s}, {4, 1s}, {5, 1s}, {6, 1s}, {7, 2s}});
    CHECK(sw.tokens() == 2.0);
}

TEST_CASE(
    "sliding_window_limiter: a permit comes back a window after the segment boundary at or after its call",
    "[rate_limiter][sliding_window]") {
    rs::testing::simulation sim;
    rs::sliding_window_limiter sw{
        {.permit_limit = 2, .window = 1s, .segments = 4, .queue_limit = rs::unbounded_queue},
        sim.clock()}; // 250 ms segments
    journal j;
    sim.spawn(client(sim, sw, j, 1, 0ms));   // counted at 0: back at 1 s
    sim.spawn(client(sim, sw, j, 2, 100ms)); // counted at 250 ms: back at 1.25 s
    sim.spawn(client(sim, sw, j, 3, 300ms)); // waits for call 1's permit
    sim.spawn(client(sim, sw, j, 4, 600ms)); // waits for call 2's permit, never sooner than 1.1 s
    sim.run_all();
    using admissions = std::vector<std::pair<int, nanoseconds>>;
    CHECK(j.admitted == admissions{{1, 0ms}, {2, 100ms}, {3, 1s}, {4, 1250ms}});
}

TEST_CASE("sliding_window_limiter: no window-long span admits more than permit_limit calls",
          "[rate_limiter][sliding_window]") {
    rs::testing::simulation sim;
    const std::size_t limit = 5;
    rs::sliding_window_limiter sw{
        {.permit_limit = limit, .window = 1s, .segments = 7, .queue_limit = rs::unbounded_queue},
        sim.clock()};
    journal j;
    // Irregular arrivals: every 37 ms for 6 s, so calls land all over the segments.
    for (int id = 0; id < 160; ++id)
        sim.spawn(client(sim, sw, j, id, id * 37ms));
    sim.run_all();
    REQUIRE(j.admitted.size() == 160);
    std::vector<nanoseconds> at;
    for (auto& [id, t] : j.admitted)
        at.push_back(t);
    std::sort(at.begin(), at.end());
    std::size_t most = 0;
    for (std::size_t i = 0; i < at.size(); ++i) {
        const auto end = std::lower_bound(at.begin(), at.end(), at[i] + 1s);
        most = std::max(most, static_cast<std::size_t>(end - (at.begin() + static_cast<std::ptrdiff_t>(i))));
    }
    CHECK(most == limit);
    CHECK(j.order().front() == 0);
    CHECK(std::is_sorted(j.admitted.begin(), j.admitted.end(),
                         [](auto& a, auto& b) { return a.first < b.first; })); // arrival order kept
}

TEST_CASE("sliding_window_limiter: queue_limit 0, queue_limit and take follow the rate_limiter rules",
          "[rate_limiter][sliding_window]") {
    rs::testing::simulation sim;
    SECTION("queue_limit 0: retry_after is when the oldest permit comes back") {
        rs::sliding_window_limiter sw{{.permit_limit = 1, .window = 1s}, sim.clock()};
        journal j;
        sim.spawn(client(sim, sw, j, 1, 250ms)); // counted at 300 ms: back at 1.3 s
        sim.spawn(client(sim, sw, j, 2, 400ms));
        sim.spawn(client(sim, sw, j, 3, 1300ms));
        sim.run_all();
        CHECK(j.finished[1] == value_at(250ms));
        CHECK(j.finished[2] == limited_at(400ms, 900ms));
        CHECK(j.finished[3] == value_at(1300ms));
    }
    SECTION("queue_limit: the waiters beyond it are refused, retry_after counting those ahead") {
        rs::sliding_window_limiter sw{{.permit_limit = 2, .window = 1s, .queue_limit = 3}, sim.clock()};
        journal j = run_burst(sim, sw, 6);
        CHECK(j.finished[3] == value_at(1s));
        CHECK(j.finished[4] == value_at(1s));
        CHECK(j.finished[5] == value_at(2s));
        CHECK(j.finished[6] == limited_at(0ms, 2s)); // three ahead: the second permit of the third window
    }
    SECTION("take spends a permit; tokens() counts the free ones") {
        rs::sliding_window_limiter sw{{.permit_limit = 2, .window = 1s, .queue_limit = rs::unbounded_queue},
                                      sim.clock()};
        CHECK(sw.tokens() == 2.0);
        sim.run(sw.take());
        CHECK(sw.tokens() == 1.0);
        sim.run(sw.take());
        sim.run(sw.take());
        CHECK(sim.now() == 1s);
        CHECK(sw.tokens() == 1.0);
        CHECK(sw.queued() == 0);
    }
    SECTION("a waiter whose caller stops leaves the queue at once") {
        rs::sliding_window_limiter sw{{.permit_limit = 1, .window = 1s, .queue_limit = rs::unbounded_queue},
                                      sim.clock()};
        journal j;
        resilience::stop_source src;
        std::size_t queued_after = 99;
        sim.spawn(client(sim, sw, j, 1, 0ms));
        sim.spawn(client(sim, sw, j, 2, 0ms, src.get_token()));
        sim.spawn(client(sim, sw, j, 3, 0ms));
        sim.spawn(stop_at(sim, src, 500ms, sw, queued_after));
        sim.run_all();
        CHECK(queued_after == 1);
        CHECK(j.finished[2] == cancelled_at(500ms));
        CHECK(j.finished[3] == value_at(1s));
    }
}

TEST_CASE("sliding_window_limiter: invalid options are refused naming the field and the value",
          "[rate_limiter][sliding_window]") {
    CHECK_THROWS_WITH((rs::sliding_window_limiter{{.permit_limit = 0, .window = 1s}}),
                      "resilience::sliding_window_limiter: permit_limit must be positive, got 0");
    CHECK_THROWS_WITH((rs::sliding_window_limiter{{.permit_limit = 1, .window = 0s}}),
                      "resilience::sliding_window_limiter: window must be positive, got 0ns");
    CHECK_THROWS_WITH((rs::sliding_window_limiter{{.permit_limit = 1, .window = -1ms}}),
                      "resilience::sliding_window_limiter: window must be positive, got -1000000ns");
    CHECK_THROWS_WITH((rs::sliding_window_limiter{{.permit_limit = 1, .window = 1s, .segments = 0}}),
                      "resilience::sliding_window_limiter: segments must be positive, got 0");
    CHECK_THROWS_WITH(
        (rs::sliding_window_limiter{{.permit_limit = 1, .window = 5ns, .segments = 6}}),
        "resilience::sliding_window_limiter: segments must be at most the window in nanoseconds (5), got 6");
    CHECK_NOTHROW(rs::sliding_window_limiter{{.permit_limit = 1, .window = 5ns, .segments = 5}});
}

// ---------------------------------------------------------------------------------------------------------
// Threads. Two real event loops share one limiter on std::chrono::steady_clock. Run under
// ThreadSanitizer in CI; about 0.1 s of real time.

namespace {

// The default clock, remembering on each thread the last time it read. The limiter reads the clock
// under its lock when it admits a call, and the admitted call's action then starts on the same
// thread without suspending, so the action sees the exact instant of its admission.
struct recording_clock {
    using duration = rs::steady_clock::duration;
    using time_point = rs::steady_clock::time_point;
    static inline thread_local time_point last{};
    time_point now() const noexcept { return last = rs::steady_clock{}.now(); }
    auto sleep_until(time_point tp, resilience::stop_token token) const {
        return rs::steady_clock{}.sleep_until(tp, std::move(token));
    }
};
static_assert(rs::clock<recording_clock>);

using shared_log = resilience_tests::call_tally<rs::rate_limited_error>;

rs::task<void> limited_client(rs::rate_limiter<recording_clock>& rl, shared_log& log,
                              std::vector<recording_clock::time_point>& admitted, std::size_t id,
                              resilience::stop_token stop) {
    auto action = [&admitted]() -> rs::task<int> {
        admitted.push_back(recording_clock::last); // this loop's own vector: one thread only
        co_return 1;
    };
    auto r = co_await rl.execute_outcome(std::move(action), std::move(stop));
    log.record(id, r);
}

} // namespace

TEST_CASE("rate_limiter: shared by loops on two threads, no span of length t admits more than token_limit + "
          "rate * t",
          "[rate_limiter][concurrency]") {
    constexpr std::size_t capacity = 10;
    constexpr double rate = 20000; // a token every 50 us
    constexpr std::size_t per_loop = 1000;
    rs::rate_limiter rl{
        {.token_limit = capacity, .tokens_per_second = rate, .queue_limit = rs::unbounded_queue},
        recording_clock{}};
    shared_log log{2 * per_loop};
    std::vector<recording_clock::time_point> admitted_a, admitted_b;
    // Every 7th call of loop A is stopped from loop B at some point, waiting or not.
    std::vector<resilience::stop_source> sources(per_loop);
    rs::event_loop a, b;
    for (std::size_t i = 0; i < per_loop; ++i) {
        const bool stopped = i % 7 == 0;
        a.spawn(limited_client(rl, log, admitted_a, i,
                               stopped ? sources[i].get_token() : resilience::stop_token{}));
        b.spawn(limited_client(rl, log, admitted_b, per_loop + i, {}));
        if (stopped)
            b.spawn(resilience_tests::stop_after_yields(sources[i], static_cast<int>(i % 40)));
    }
    resilience_tests::run_on_threads(a, b);

    CHECK(log.values + log.cancelled == static_cast<int>(2 * per_loop));
    CHECK(log.cancelled <= static_cast<int>(per_loop / 7 + 1));
    CHECK(log.refused == 0);
    CHECK(log.failed == 0);
    REQUIRE(log.completions.exactly_once() == 2 * per_loop);
    CHECK(rl.queued() == 0);

    std::vector<recording_clock::time_point> all = admitted_a;
    all.insert(all.end(), admitted_b.begin(), admitted_b.end());
    REQUIRE(all.size() == static_cast<std::size_t>(log.values.load()));
    std::sort(all.begin(), all.end());
    // Between the i-th and j-th admissions, j - i + 1 tokens were spent: at most the bucket plus
    // what refilled in between. The + 1 absorbs the rounding of due times to whole nanoseconds.
    std::size_t violations = 0;
    for (std::size_t i = 0; i < all.size(); ++i)
        for (std::size_t k = i; k < all.size(); ++k) {
            const double t = std::chrono::duration<double>(all[k] - all[i]).count();
            if (static_cast<double>(k - i + 1) > static_cast<double>(capacity) + rate * t + 1)
                ++violations;
        }
    CHECK(violations == 0);
    // And the limiter did limit: the whole run took at least the time the tokens needed.
    const double span = std::chrono::duration<double>(all.back() - all.front()).count();
    CHECK(span >= static_cast<double>(all.size() - capacity) / rate);
}

TEST_CASE("rate_limiter: queue timeouts firing on each of two loops race tokens served from the other: every "
          "call ends once, and every refusal is heard once",
          "[rate_limiter][concurrency]") {
    // A queued call waits in its own loop's frame, served in turn by whichever thread's call is at
    // the head of the queue, while its queue timeout and its caller's stop may end the wait first.
    const auto queue_timeout = GENERATE(1us, 30us);
    resilience_tests::heard_counts heard;
    rs::rate_limiter rl{{.token_limit = 5,
                         .tokens_per_second = 100000, // a token every 10 us
                         .queue_limit = rs::unbounded_queue,
                         .queue_timeout = queue_timeout,
                         .telemetry = heard.listener()}};
    constexpr std::size_t per_loop = 1000;
    resilience_tests::call_tally<rs::rate_limited_error> log{2 * per_loop};
    std::vector<resilience::stop_source> sources(per_loop);
    auto client = [](rs::rate_limiter<>& limiter, resilience_tests::call_tally<rs::rate_limited_error>& tally,
                     std::size_t id, resilience::stop_token stop) -> rs::task<void> {
        auto action = []() -> rs::task<int> { co_return 1; };
        tally.record(id, co_await limiter.execute_outcome(action, std::move(stop)));
    };
    rs::event_loop a, b;
    for (std::size_t i = 0; i < per_loop; ++i) {
        const bool stopped = i % 7 == 0;
        a.spawn(client(rl, log, i, stopped ? sources[i].get_token() : resilience::stop_token{}));
        b.spawn(client(rl, log, per_loop + i, {}));
        if (stopped)
            b.spawn(resilience_tests::stop_after_yields(sources[i], static_cast<int>(i % 5)));
    }
    resilience_tests::run_on_threads(a, b);

    CHECK(log.values + log.refused + log.cancelled == static_cast<int>(2 * per_loop));
    CHECK(log.failed == 0);
    REQUIRE(log.completions.exactly_once() == 2 * per_loop);
    // Every refusal here is a queue timeout, heard once. A call refused as its caller stops ends with
    // cancelled_error all the same (a call its caller stopped ends with a value or cancelled_error), so
    // a refusal heard may belong to a call counted as cancelled.
    CHECK(heard.rejections.load() >= log.refused.load());
    CHECK(heard.rejections.load() <= log.refused.load() + log.cancelled.load());
    CHECK(heard.waits.load() <= log.values.load());
    CHECK(rl.queued() == 0);
}

TEST_CASE("rate_limiter: shared by four threads, a bucket of N that barely refills grants exactly N tokens "
          "and refuses the rest",
          "[rate_limiter][concurrency]") {
    constexpr std::size_t capacity = 1000, threads = 4, per_thread = 1000, calls = threads * per_thread;
    // A token per 10^6 s: none comes back during the test.
    rs::rate_limiter rl{{.token_limit = capacity, .tokens_per_second = 1e-6}};
    shared_log log{calls};
    resilience_tests::in_lockstep(threads, per_thread, [&](std::size_t t, std::size_t i) {
        log.record(t * per_thread + i, rs::sync_wait(rl.take_outcome()));
    });
    CHECK(log.values == static_cast<int>(capacity));
    CHECK(log.refused == static_cast<int>(calls - capacity));
    CHECK(log.cancelled + log.failed == 0);
    CHECK(log.completions.exactly_once() == calls);
    CHECK(rl.tokens() < 1.0);
    CHECK(rl.queued() == 0);
}

TEST_CASE("rate_limiter: try_take_now from threads released at the same instant takes exactly the tokens "
          "in the bucket",
          "[rate_limiter][concurrency]") {
    // The fast path alone, with nothing around it to spread the threads apart.
    constexpr std::size_t threads = 4, rounds = resilience_tests::stress_rounds(20000),
                          capacity = rounds * threads / 2;
    rs::detail::limiter_state<rs::steady_clock, rs::detail::token_bucket> bucket{
        rs::detail::token_bucket{capacity, 1e-6}, rs::steady_clock{}, 0};
    std::atomic<std::size_t> taken{0};
    resilience_tests::in_lockstep(threads, rounds, [&](std::size_t, std::size_t) {
        if (bucket.try_take_now())
            ++taken;
    });
    CHECK(taken.load() == capacity);
    CHECK(bucket.remaining() < 1.0);
}

TEST_CASE("rate_limiter: shared by loops on four threads, a bucket of N that barely refills grants exactly "
          "N calls at once, the others wait in the queue until stopped",
          "[rate_limiter][concurrency]") {
    constexpr std::size_t capacity = 50, loops = 4, per_loop = 200, total = loops * per_loop;
    rs::rate_limiter rl{
        {.token_limit = capacity, .tokens_per_second = 1e-6, .queue_limit = rs::unbounded_queue}};
    shared_log log{total};
    std::atomic<std::size_t> admitted{0};
    resilience::stop_source stop_all;
    auto client = [](rs::rate_limiter<>& limiter, shared_log& tally, std::atomic<std::size_t>& count,
                     std::size_t id, resilience::stop_token stop) -> rs::task<void> {
        auto action = [&count]() -> rs::task<int> {
            ++count;
            co_return 1;
        };
        tally.record(id, co_await limiter.execute_outcome(std::move(action), std::move(stop)));
    };
    // Stops every call once each has its token or waits for one: no token would ever come.
    auto stopper = [](rs::rate_limiter<>& limiter, std::atomic<std::size_t>& count,
                      resilience::stop_source& stop) -> rs::task<void> {
        while (count.load() + limiter.queued() < total)
            co_await resilience_tests::yield_now{};
        stop.request_stop();
    };
    rs::event_loop l0, l1, l2, l3;
    rs::event_loop* all[loops] = {&l0, &l1, &l2, &l3};
    for (std::size_t i = 0; i < per_loop; ++i)
        for (std::size_t l = 0; l < loops; ++l)
            all[l]->spawn(client(rl, log, admitted, l * per_loop + i, stop_all.get_token()));
    l0.spawn(stopper(rl, admitted, stop_all));
    resilience_tests::run_on_threads(l0, l1, l2, l3);

    CHECK(admitted.load() == capacity);
    CHECK(log.values == static_cast<int>(capacity));
    CHECK(log.cancelled == static_cast<int>(total - capacity));
    CHECK(log.refused + log.failed == 0);
    REQUIRE(log.completions.exactly_once() == total);
    CHECK(rl.queued() == 0);
}

// ---------------------------------------------------------------------------------------------------------
// Queue options, reasons, names, equality and hashing.

namespace {

// How each refused call was refused (the reason and the limiter's name), by call id.
struct refusal {
    rs::rejection_reason reason{};
    std::string name;
    bool operator==(const refusal&) const = default;
};

template <class L>
rs::task<void> noted_client(rs::testing::simulation& sim, L& limiter, journal& j,
                            std::map<int, refusal>& refused, int id, nanoseconds arrive) {
    if (arrive > sim.now())
        co_await sim.sleep_for(arrive - sim.now());
    auto action = [&sim, &j, id]() -> rs::task<int> {
        j.admitted.emplace_back(id, sim.now());
        co_return id;
    };
    auto r = co_await limiter.execute_outcome(std::move(action));
    j.finished[id] = describe(r, sim.now());
    if (auto* e = r.has_failure() ? r.error().template as<rs::rate_limited_error>() : nullptr)
        refused[id] = {e->reason(), e->policy_name()};
}

} // namespace

TEST_CASE("rate_limiter: a refusal says why: no_capacity with queue_limit 0, queue_full beyond it",
          "[rate_limiter]") {
    using why = rs::rejection_reason;
    rs::testing::simulation sim;
    rs::rate_limiter eager{{.name = "api", .token_limit = 1, .tokens_per_second = 10}, sim.clock()};
    rs::rate_limiter patient{{.name = "api2", .token_limit = 1, .tokens_per_second = 10, .queue_limit = 1},
                             sim.clock()};
    CHECK(eager.options().queue_limit == 0); // the default
    CHECK(eager.name() == "api");
    journal j, k;
    std::map<int, refusal> refused, refused_k;
    for (int id = 1; id <= 2; ++id)
        sim.spawn(noted_client(sim, eager, j, refused, id, 0ms));
    for (int id = 1; id <= 3; ++id)
        sim.spawn(noted_client(sim, patient, k, refused_k, id, 0ms));
    sim.run_all();
    CHECK(refused == std::map<int, refusal>{{2, {why::no_capacity, "api"}}});
    CHECK(j.finished[2] == limited_at(0ms, 100ms));
    CHECK(refused_k == std::map<int, refusal>{{3, {why::queue_full, "api2"}}});
    CHECK(k.finished[2] == value_at(100ms));
    CHECK(k.finished[3] == limited_at(0ms, 200ms));
}

TEST_CASE("rate_limiter: a waiter is refused at exactly its queue_timeout, and the waiters behind it are "
          "served in order at their exact instants",
          "[rate_limiter]") {
    using why = rs::rejection_reason;
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.name = "api",
                         .token_limit = 1,
                         .tokens_per_second = 10,
                         .queue_limit = rs::unbounded_queue,
                         .queue_timeout = 150ms},
                        sim.clock()};
    journal j;
    std::map<int, refusal> refused;
    // Tokens are due every 100 ms; each waiter gives up 150 ms after it queued.
    sim.spawn(noted_client(sim, rl, j, refused, 1, 0ms));   // the full bucket's token
    sim.spawn(noted_client(sim, rl, j, refused, 2, 0ms));   // the head: its token at 100 ms
    sim.spawn(noted_client(sim, rl, j, refused, 3, 0ms));   // head at 100 ms, token due 200: out at 150
    sim.spawn(noted_client(sim, rl, j, refused, 4, 0ms));   // head at 150 ms, its deadline: out at once
    sim.spawn(noted_client(sim, rl, j, refused, 5, 60ms));  // takes the token call 3 gave up, at 200
    sim.spawn(noted_client(sim, rl, j, refused, 6, 120ms)); // head at 200, token due 300: out at 270
    sim.spawn(noted_client(sim, rl, j, refused, 7, 200ms)); // head at 270: the 300 ms token
    sim.spawn(noted_client(sim, rl, j, refused, 8, 290ms)); // head at 300: the 400 ms token
    std::size_t queued_at_149 = 99, queued_at_150 = 99;
    auto observe = [](rs::testing::simulation& s, rs::rate_limiter<vclock>& limiter, std::size_t& before,
                      std::size_t& at) -> rs::task<void> {
        co_await s.sleep_for(149ms);
        before = limiter.queued();
        co_await s.sleep_for(1ms);
        for (int i = 0; i < 4; ++i)
            co_await resilience_tests::yield_now{};
        at = limiter.queued();
    };
    sim.spawn(observe(sim, rl, queued_at_149, queued_at_150));
    sim.run_all();
    using admissions = std::vector<std::pair<int, nanoseconds>>;
    CHECK(j.admitted == admissions{{1, 0ms}, {2, 100ms}, {5, 200ms}, {7, 300ms}, {8, 400ms}});
    CHECK(j.finished[3] == limited_at(150ms, 50ms)); // the token it waited for was 50 ms away
    CHECK(j.finished[4] == limited_at(150ms, 50ms));
    CHECK(j.finished[6] == limited_at(270ms, 30ms));
    CHECK(refused == std::map<int, refusal>{{3, {why::queue_timeout, "api"}},
                                            {4, {why::queue_timeout, "api"}},
                                            {6, {why::queue_timeout, "api"}}});
    CHECK(queued_at_149 == 4); // calls 3, 4, 5 and 6
    CHECK(queued_at_150 == 2); // calls 5 and 6
    CHECK(rl.queued() == 0);
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("rate_limiter: a token due at the very instant the queue_timeout runs out is still taken",
          "[rate_limiter]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 1, .tokens_per_second = 10, .queue_limit = 5, .queue_timeout = 100ms},
                        sim.clock()};
    journal j;
    std::map<int, refusal> refused;
    for (int id = 1; id <= 3; ++id)
        sim.spawn(noted_client(sim, rl, j, refused, id, 0ms));
    sim.run_all();
    CHECK(j.finished[2] == value_at(100ms));
    CHECK(j.finished[3] == limited_at(100ms, 100ms));
    CHECK(refused[3].reason == rs::rejection_reason::queue_timeout);
}

TEST_CASE(
    "sliding_window_limiter: queue_timeout refuses a waiter at exactly that instant, and take reports it",
    "[rate_limiter][sliding_window]") {
    rs::testing::simulation sim;
    rs::sliding_window_limiter sw{{.name = "window",
                                   .permit_limit = 1,
                                   .window = 1s,
                                   .queue_limit = rs::unbounded_queue,
                                   .queue_timeout = 500ms},
                                  sim.clock()};
    CHECK(sw.name() == "window");
    journal j;
    std::map<int, refusal> refused;
    sim.spawn(noted_client(sim, sw, j, refused, 1, 0ms));
    sim.spawn(noted_client(sim, sw, j, refused, 2, 0ms));   // out at 500 ms
    sim.spawn(noted_client(sim, sw, j, refused, 3, 600ms)); // the permit back at 1 s
    sim.run_all();
    CHECK(j.finished[2] == limited_at(500ms, 500ms));
    CHECK(refused[2] == refusal{rs::rejection_reason::queue_timeout, "window"});
    CHECK(j.finished[3] == value_at(1s));

    auto r = sim.run([](rs::sliding_window_limiter<vclock>& limiter) -> rs::task<rs::outcome<void>> {
        co_return co_await limiter.take_outcome();
    }(sw));
    REQUIRE(r.has_failure());
    CHECK(r.error().as<rs::rate_limited_error>()->reason() == rs::rejection_reason::queue_timeout);
    CHECK(sim.now() == 1500ms);
}

// ---------------------------------------------------------------------------------------------------------
// on_rejected

namespace {

// What an `on_rejected` was told, and when.
struct told {
    std::string name;
    rs::rejection_reason reason{};
    nanoseconds retry_after{-1};
    nanoseconds at{-1};
    bool operator==(const told&) const = default;
};

std::function<void(const rs::rejection_event&)> tell(rs::testing::simulation& sim, std::vector<told>& log) {
    return [&sim, &log](const rs::rejection_event& e) {
        log.push_back({std::string(e.policy_name()), e.reason(), e.retry_after(), sim.now()});
    };
}

struct told_off : std::runtime_error {
    told_off() : std::runtime_error("told off") {}
};

// Arrives at `arrive` and keeps the outcome; the action writes down when it was admitted.
template <class L>
rs::task<void> kept_client(rs::testing::simulation& sim, L& limiter, journal& j,
                           std::map<int, rs::outcome<int>>& outcomes, int id, nanoseconds arrive) {
    if (arrive > sim.now())
        co_await sim.sleep_for(arrive - sim.now());
    auto action = [&sim, &j, id]() -> rs::task<int> {
        j.admitted.emplace_back(id, sim.now());
        co_return id;
    };
    auto r = co_await limiter.execute_outcome(std::move(action));
    j.finished[id] = describe(r, sim.now());
    outcomes.emplace(id, std::move(r));
}

} // namespace

TEST_CASE("rate_limiter: on_rejected is told once per refusal, before it is returned, with its reason and "
          "exact retry_after, and never for an admitted call",
          "[rate_limiter][on_rejected]") {
    using why = rs::rejection_reason;
    rs::testing::simulation sim;
    std::vector<told> log;
    journal j;
    std::map<int, refusal> refused;
    SECTION("no_capacity") {
        rs::rate_limiter rl{
            {.name = "api", .token_limit = 1, .tokens_per_second = 10, .on_rejected = tell(sim, log)},
            sim.clock()};
        sim.spawn(noted_client(sim, rl, j, refused, 1, 0ms));
        sim.spawn(noted_client(sim, rl, j, refused, 2, 30ms));
        sim.spawn(noted_client(sim, rl, j, refused, 3, 100ms));
        sim.run_all();
        CHECK(j.finished[2] == limited_at(30ms, 70ms));
        CHECK(log == std::vector<told>{{"api", why::no_capacity, 70ms, 30ms}});
    }
    SECTION("queue_full and queue_timeout") {
        rs::rate_limiter rl{{.name = "api",
                             .token_limit = 1,
                             .tokens_per_second = 10,
                             .queue_limit = 2,
                             .queue_timeout = 150ms,
                             .on_rejected = tell(sim, log)},
                            sim.clock()};
        for (int id = 1; id <= 4; ++id)
            sim.spawn(noted_client(sim, rl, j, refused, id, 0ms));
        sim.run_all();
        // 1 takes the full bucket's token, 2 the one due at 100 ms; 3 waits for the one due at 200 ms
        // and gives up at 150 ms; 4 finds the queue full, with two waiters before it.
        CHECK(j.order() == std::vector<int>{1, 2});
        CHECK(j.finished[4] == limited_at(0ms, 300ms));
        CHECK(j.finished[3] == limited_at(150ms, 50ms));
        CHECK(log == std::vector<told>{{"api", why::queue_full, 300ms, 0ms},
                                       {"api", why::queue_timeout, 50ms, 150ms}});
    }
    SECTION("through a pipeline") {
        rs::rate_limiter rl{{.token_limit = 1, .tokens_per_second = 10, .on_rejected = tell(sim, log)},
                            sim.clock()};
        const rs::pipeline p{rl};
        auto r =
            sim.run([](const rs::pipeline<rs::rate_limiter<vclock>>& policy) -> rs::task<std::vector<bool>> {
                std::vector<bool> ok;
                for (int i = 0; i < 3; ++i) {
                    auto one = co_await policy.execute_outcome([]() -> rs::task<int> { co_return 1; });
                    ok.push_back(one.has_value());
                }
                co_return ok;
            }(p));
        CHECK(r == std::vector<bool>{true, false, false});
        CHECK(log ==
              std::vector<told>{{"", why::no_capacity, 100ms, 0ms}, {"", why::no_capacity, 100ms, 0ms}});
    }
    SECTION("not for take, which returns its refusal to its own caller") {
        rs::rate_limiter rl{{.token_limit = 1, .tokens_per_second = 10, .on_rejected = tell(sim, log)},
                            sim.clock()};
        auto r = sim.run([](rs::rate_limiter<vclock>& limiter) -> rs::task<rs::outcome<void>> {
            co_await limiter.take();
            co_return co_await limiter.take_outcome();
        }(rl));
        CHECK(r.has_failure());
        CHECK(log.empty());
    }
}

TEST_CASE(
    "sliding_window_limiter: on_rejected is told once per refusal with its reason and exact retry_after",
    "[rate_limiter][sliding_window][on_rejected]") {
    using why = rs::rejection_reason;
    rs::testing::simulation sim;
    std::vector<told> log;
    journal j;
    std::map<int, refusal> refused;
    rs::sliding_window_limiter sw{{.name = "window",
                                   .permit_limit = 1,
                                   .window = 1s,
                                   .queue_limit = 1,
                                   .queue_timeout = 500ms,
                                   .on_rejected = tell(sim, log)},
                                  sim.clock()};
    sim.spawn(noted_client(sim, sw, j, refused, 1, 0ms));
    sim.spawn(noted_client(sim, sw, j, refused, 2, 0ms));    // waits, out at 500 ms
    sim.spawn(noted_client(sim, sw, j, refused, 3, 100ms));  // the queue is full
    sim.spawn(noted_client(sim, sw, j, refused, 4, 600ms));  // the permit back at 1 s
    sim.spawn(noted_client(sim, sw, j, refused, 5, 1100ms)); // waits, out at 1.6 s: the next permit is at 2 s
    sim.run_all();
    CHECK(j.order() == std::vector<int>{1, 4});
    CHECK(j.finished[3] == limited_at(100ms, 1900ms));
    CHECK(j.finished[2] == limited_at(500ms, 500ms));
    CHECK(j.finished[5] == limited_at(1600ms, 400ms));
    CHECK(log == std::vector<told>{{"window", why::queue_full, 1900ms, 100ms},
                                   {"window", why::queue_timeout, 500ms, 500ms},
                                   {"window", why::queue_timeout, 400ms, 1600ms}});
}

TEST_CASE("rate limiters: an on_rejected that throws ends the call with its exception, the listener hears "
          "nothing, and the queue goes on",
          "[rate_limiter][sliding_window][on_rejected]") {
    rs::testing::simulation sim;
    int told_count = 0;
    int heard = 0;
    const auto throw_it = [&told_count](const rs::rejection_event&) {
        ++told_count;
        throw told_off{};
    };
    const auto listen = [&heard](const rs::telemetry_event& e) {
        if (e.kind == rs::telemetry_kind::rejection)
            ++heard;
    };
    journal j;
    std::map<int, rs::outcome<int>> outcomes;
    const auto run = [&](auto& limiter) {
        sim.spawn(kept_client(sim, limiter, j, outcomes, 1, 0ms));  // admitted
        sim.spawn(kept_client(sim, limiter, j, outcomes, 2, 0ms));  // waits; out at 50 ms
        sim.spawn(kept_client(sim, limiter, j, outcomes, 3, 0ms));  // queue full
        sim.spawn(kept_client(sim, limiter, j, outcomes, 4, 60ms)); // waits; admitted
        sim.run_all();
        CHECK(told_count == 2);
        CHECK(heard == 0);
        for (int id : {2, 3}) {
            REQUIRE(outcomes.at(id).has_failure());
            CHECK(outcomes.at(id).error().is<told_off>());
        }
        CHECK(j.finished[2].at == 50ms);
        CHECK(j.finished[3].at == 0ms);
        CHECK(outcomes.at(4).has_value());
        CHECK(limiter.queued() == 0);
    };
    SECTION("rate_limiter") {
        rs::rate_limiter rl{{.token_limit = 1,
                             .tokens_per_second = 10,
                             .queue_limit = 1,
                             .queue_timeout = 50ms,
                             .on_rejected = throw_it,
                             .telemetry = listen},
                            sim.clock()};
        run(rl);
        CHECK(j.order() == std::vector<int>{1, 4});
        CHECK(j.admitted_at(4) == 100ms);
    }
    SECTION("sliding_window_limiter") {
        rs::sliding_window_limiter sw{{.permit_limit = 1,
                                       .window = 100ms,
                                       .queue_limit = 1,
                                       .queue_timeout = 50ms,
                                       .on_rejected = throw_it,
                                       .telemetry = listen},
                                      sim.clock()};
        run(sw);
        CHECK(j.order() == std::vector<int>{1, 4});
        CHECK(j.admitted_at(4) == 100ms);
    }
}

TEST_CASE("rate limiters: a queue_timeout that is not positive is refused naming the field and the value",
          "[rate_limiter][sliding_window]") {
    CHECK_THROWS_WITH((rs::rate_limiter{{.token_limit = 1, .tokens_per_second = 1, .queue_timeout = 0ms}}),
                      "resilience::rate_limiter: queue_timeout must be positive, got 0ns");
    CHECK_THROWS_WITH((rs::sliding_window_limiter{{.permit_limit = 1, .window = 1s, .queue_timeout = -2ns}}),
                      "resilience::sliding_window_limiter: queue_timeout must be positive, got -2ns");
    // A named limiter's messages start with its label.
    CHECK_THROWS_WITH((rs::rate_limiter{{.name = "api", .token_limit = 0, .tokens_per_second = 1}}),
                      "resilience::rate_limiter (api): token_limit must be positive, got 0");
    CHECK_THROWS_WITH(
        (rs::sliding_window_limiter{{.name = "api", .permit_limit = 1, .window = 1s, .queue_timeout = 0ms}}),
        "resilience::sliding_window_limiter (api): queue_timeout must be positive, got 0ns");
    // No default rate: only the user knows the dependency's limit.
    CHECK_THROWS_AS(rs::rate_limiter{rs::rate_limiter_options{}}, std::invalid_argument);
    CHECK_THROWS_AS(rs::sliding_window_limiter{rs::sliding_window_limiter_options{}}, std::invalid_argument);
}

TEST_CASE("rate limiters: a call made through a copy that is destroyed before the call is awaited runs on "
          "the shared state",
          "[rate_limiter][sliding_window]") {
    rs::testing::simulation sim;
    rs::rate_limiter keeper{{.token_limit = 1, .tokens_per_second = 10, .queue_limit = 1}, sim.clock()};
    auto copy = std::make_unique<rs::rate_limiter<vclock>>(keeper);
    auto action = [&sim]() -> rs::task<nanoseconds> { co_return sim.now(); };
    auto now_call = copy->execute(action);             // the fast path: the bucket's token
    auto waiting_call = copy->execute_outcome(action); // the waiting path: the 100 ms token
    copy.reset();
    std::vector<nanoseconds> got;
    sim.spawn([](rs::task<nanoseconds> t, std::vector<nanoseconds>& out) -> rs::task<void> {
        out.push_back(co_await std::move(t));
    }(std::move(now_call), got));
    sim.spawn([](rs::task<rs::outcome<nanoseconds>> t, std::vector<nanoseconds>& out) -> rs::task<void> {
        out.push_back((co_await std::move(t)).value());
    }(std::move(waiting_call), got));
    sim.run_all();
    CHECK(got == std::vector<nanoseconds>{0ms, 100ms});

    rs::sliding_window_limiter window_keeper{{.permit_limit = 1, .window = 1s}, sim.clock()};
    auto window_copy = std::make_unique<rs::sliding_window_limiter<vclock>>(window_keeper);
    auto window_call = window_copy->execute(action);
    window_copy.reset();
    CHECK(sim.run(std::move(window_call)) == sim.now());
    CHECK(window_keeper.tokens() == 0.0);
}

TEST_CASE("rate limiters: copies are equal and hash alike, other limiters do not",
          "[rate_limiter][sliding_window]") {
    rs::rate_limiter a{{.name = "a", .token_limit = 1, .tokens_per_second = 1}};
    const auto copy = a;
    const rs::rate_limiter other{{.name = "a", .token_limit = 1, .tokens_per_second = 1}};
    CHECK(copy == a);
    CHECK(other != a);
    const std::hash<rs::rate_limiter<>> h;
    CHECK(h(copy) == h(a));
    CHECK(copy.name() == "a");

    rs::sliding_window_limiter w{{.permit_limit = 1, .window = 1s}};
    const auto w_copy = w;
    CHECK(w_copy == w);
    CHECK(w != rs::sliding_window_limiter{{.permit_limit = 1, .window = 1s}});
    CHECK(std::hash<rs::sliding_window_limiter<>>{}(w_copy) == std::hash<rs::sliding_window_limiter<>>{}(w));
}

TEST_CASE("rate_limiter: calls destroyed with their event loop while they wait leave the queue, the first "
          "one while it watches the clock",
          "[rate_limiter]") {
    auto sim = std::make_unique<rs::testing::simulation>();
    rs::rate_limiter lim{{.token_limit = 1, .tokens_per_second = 1, .queue_limit = 4}, sim->clock()};
    auto quick = []() -> rs::task<int> { co_return 1; };
    sim->spawn(lim.execute(quick)); // takes the only token
    sim->spawn(lim.execute(quick)); // the head: sleeps until the next token, due at 1 s
    sim->spawn(lim.execute(quick)); // waits behind it
    sim->run_for(10ms);
    CHECK(lim.queued() == 2);
    sim.reset(); // the loop is torn down with both calls suspended
    CHECK(lim.queued() == 0);
}

TEST_CASE("rate_limiter: the first waiter in a pipeline, stopped while it watches the clock, hands the "
          "turn on at that instant",
          "[rate_limiter][pipeline]") {
    rs::testing::simulation sim;
    rs::rate_limiter lim{{.token_limit = 1, .tokens_per_second = 10, .queue_limit = 4}, sim.clock()};
    rs::pipeline p{lim, rs::timeout{1s, sim.clock()}}; // a stage inside, run once admitted
    journal j;
    resilience::stop_source stop;
    const auto call = [&](int id, resilience::stop_token token) -> rs::task<void> {
        auto action = [&sim, &j, id]() -> rs::task<int> {
            j.admitted.emplace_back(id, sim.now());
            co_return id;
        };
        auto r = co_await p.execute_outcome(std::move(action), std::move(token));
        j.finished[id] = {sim.now(), r.has_value() ? "value" : r.error().what()};
    };
    sim.spawn(call(1, {}));               // the token at 0
    sim.spawn(call(2, stop.get_token())); // the head: its token is due at 100 ms
    sim.spawn(call(3, {}));               // behind it: takes the 100 ms token
    sim.run_until(40ms);
    CHECK(lim.queued() == 2);
    stop.request_stop();
    sim.run_until(41ms);
    CHECK(lim.queued() == 1);
    sim.run_all();
    CHECK(j.order() == std::vector<int>{1, 3});
    CHECK(j.admitted_at(3) == 100ms);
    CHECK(j.finished[2].at == 40ms);
    CHECK(lim.queued() == 0);
}

namespace {
// The simulation's clock, whose readings throw from the `fail_from`-th on (counted from 1).
struct clock_failing_from {
    using duration = vclock::duration;
    using time_point = vclock::time_point;
    vclock inner;
    std::shared_ptr<int> reads = std::make_shared<int>(0);
    std::shared_ptr<int> fail_from = std::make_shared<int>(std::numeric_limits<int>::max());
    time_point now() const {
        if (++*reads >= *fail_from)
            throw std::runtime_error("clock: no reading");
        return inner.now();
    }
    auto sleep_until(time_point tp, resilience::stop_token token) const {
        return inner.sleep_until(tp, token);
    }
    rs::event_loop* timer_loop() const noexcept { return inner.timer_loop(); }
};
} // namespace

TEST_CASE("rate_limiter: a call whose clock throws while it queues leaves no stop callback on its caller's "
          "token",
          "[rate_limiter][stop]") {
    // Whichever reading throws (before, while or after the call queues; or none, once the call has its
    // token), the call ends and nothing of it stays listed on the caller's token: a later stop of that
    // token must not reach the call's freed frame.
    for (int nth = 1; nth <= 12; ++nth) {
        CAPTURE(nth);
        rs::testing::simulation sim;
        const clock_failing_from clock{sim.clock()};
        rs::rate_limiter<clock_failing_from> lim{
            {.token_limit = 1, .tokens_per_second = 10, .queue_limit = rs::unbounded_queue}, clock};
        const auto action = []() -> rs::task<int> { co_return 1; };
        REQUIRE(sim.run(lim.execute_outcome(action)).has_value()); // takes the one token
        rs::stop_source caller;
        *clock.fail_from = *clock.reads + nth;
        std::optional<rs::outcome<int>> ended;
        bool threw = false;
        sim.spawn([](const rs::rate_limiter<clock_failing_from>& l, auto act, rs::stop_token token,
                     std::optional<rs::outcome<int>>& out, bool& failed) -> rs::task<void> {
            try {
                out.emplace(co_await l.execute_outcome(act, std::move(token)));
            } catch (const std::runtime_error&) {
                failed = true;
            }
        }(lim, action, caller.get_token(), ended, threw));
        sim.run_all();
        CHECK_FALSE(threw); // whichever reading threw, the call ended with it as its failure
        CHECK(ended.has_value());
        CHECK_FALSE(rs::detail::stop_access::state(caller.get_token())->has_callbacks());
        CHECK(lim.queued() == 0);
        caller.request_stop();
    }
}

} // namespace test_rate_limiter
