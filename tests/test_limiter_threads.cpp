// SPDX-License-Identifier: MIT
// The rate limiters with priority classes shared by event loops on four threads, for ThreadSanitizer:
// the queue's turn and its grants handed from one thread's call to another's, displacement, queue
// timeouts and stops from other loops. Real time, but nothing is asserted about timing: only how the
// calls end and a bound on the permits that any run, however slow, must keep.

#include "catch.hpp"
#include "support.hpp"

#include <resilience/event_loop.hpp>
#include <resilience/priority.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/stop_token.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <vector>

namespace test_limiter_threads {

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t loops = 4, workers_per_loop = 8, calls_per_worker = 1600;
constexpr std::size_t total = loops * workers_per_loop * calls_per_worker; // 51200 per limiter
constexpr std::size_t every_nth_stopped = 16; // those calls are stopped from another loop

struct tally {
    resilience_tests::call_tally<rs::rate_limited_error> calls{total};
    resilience_tests::heard_counts heard;
    std::atomic<int> cancelled_unasked{0}; // ended cancelled although nobody stopped them
    std::vector<resilience::stop_source> stops{total / every_nth_stopped};
};

// One call, of class `id % 3`; every `every_nth_stopped`th is stopped by a coroutine on the next loop
// after a few rounds of that loop, so the stop lands wherever the call then is (queued, at its turn,
// granted, done).
template <class Limiter>
rs::task<void> one_call(const Limiter& limiter, tally& t, std::size_t id, rs::event_loop& next_loop) {
    const bool stopped = id % every_nth_stopped == 0;
    resilience::stop_source& stop = t.stops[id / every_nth_stopped];
    rs::context ctx{stopped ? stop.get_token() : resilience::stop_token{}};
    ctx.set_property(rs::priority, static_cast<int>(id % 3));
    if (stopped)
        next_loop.spawn(
            resilience_tests::stop_after_yields(stop, static_cast<int>(id / every_nth_stopped % 4)));
    auto r = co_await limiter.execute_outcome([]() -> rs::task<int> { co_return 1; }, ctx);
    if (!r.has_value() && rs::is_cancellation(r.error()) && !stopped)
        ++t.cancelled_unasked;
    t.calls.record(id, r);
}

// A worker makes its calls one after another, so each loop keeps `workers_per_loop` calls in flight.
template <class Limiter>
rs::task<void> worker(const Limiter& limiter, tally& t, std::size_t first_id, rs::event_loop& next_loop) {
    for (std::size_t i = 0; i < calls_per_worker; ++i)
        co_await one_call(limiter, t, first_id + i, next_loop);
}

// Runs every call on four loops, each on its own thread, all sharing `limiter`.
template <class Limiter>
void hammer(const Limiter& limiter, tally& t) {
    rs::event_loop l0, l1, l2, l3;
    rs::event_loop* all[loops] = {&l0, &l1, &l2, &l3};
    for (std::size_t l = 0; l < loops; ++l)
        for (std::size_t w = 0; w < workers_per_loop; ++w)
            all[l]->spawn(
                worker(limiter, t, (l * workers_per_loop + w) * calls_per_worker, *all[(l + 1) % loops]));
    resilience_tests::run_on_threads(l0, l1, l2, l3);
}

// What every run must show, whatever the machine's speed: each call ended once, admitted, refused
// by the limiter or (only when its caller stopped it) cancelled; some waited in the queue; nobody
// is left queued.
template <class Limiter>
void check_ends(const Limiter& limiter, const tally& t) {
    CHECK(t.calls.failed == 0);
    CHECK(t.cancelled_unasked == 0);
    CHECK(t.calls.values + t.calls.refused + t.calls.cancelled == static_cast<int>(total));
    REQUIRE(t.calls.completions.exactly_once() == total);
    CHECK(t.calls.values > 0);
    CHECK(t.calls.refused > 0);
    CHECK(t.heard.waits > 0); // admitted after queueing
    CHECK(limiter.queued() == 0);
}

} // namespace

TEST_CASE("limiter threads: a rate limiter with priority classes shared by loops on four threads ends every "
          "call once and grants no more than its bucket allows",
          "[limiter_threads][concurrency]") {
    tally t;
    constexpr std::size_t token_limit = 10;
    constexpr double per_second = 20000;
    const auto start = std::chrono::steady_clock::now(); // before the bucket starts filling
    rs::rate_limiter limiter{{.token_limit = token_limit,
                              .tokens_per_second = per_second,
                              .queue_limit = 16,
                              .queue_timeout = 2ms,
                              .priorities = {.classes = 3, .reserved = {0, 0.2, 0.2}},
                              .telemetry = t.heard.listener()}};
    hammer(limiter, t);
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;

    check_ends(limiter, t);
    // The bucket starts full and refills at `per_second`: that many tokens and no more, over the run.
    CHECK(t.calls.values <= static_cast<int>(token_limit + per_second * elapsed.count()) + 1);
}

TEST_CASE("limiter threads: a sliding window limiter with priority classes shared by loops on four threads "
          "ends every call once and admits no more than its windows allow",
          "[limiter_threads][concurrency]") {
    tally t;
    constexpr std::size_t permit_limit = 10;
    constexpr auto window = 500us;
    const auto start = std::chrono::steady_clock::now(); // before the first window starts
    rs::sliding_window_limiter limiter{{.permit_limit = permit_limit,
                                        .window = window,
                                        .segments = 5,
                                        .queue_limit = 16,
                                        .queue_timeout = 2ms,
                                        .priorities = {.classes = 3, .reserved = {0, 0.2, 0.2}},
                                        .telemetry = t.heard.listener()}};
    hammer(limiter, t);
    const auto elapsed = std::chrono::steady_clock::now() - start;

    check_ends(limiter, t);
    // No window-long span admits more than `permit_limit`, and the run is covered by this many spans.
    const auto spans = static_cast<int>((elapsed + window - 1ns) / window);
    CHECK(t.calls.values <= spans * static_cast<int>(permit_limit));
}

} // namespace test_limiter_threads
