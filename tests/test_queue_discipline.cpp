// SPDX-License-Identifier: MIT
// Tests of the queue disciplines (queue_discipline.hpp) of the bulkhead and the limiters: FIFO unchanged,
// CoDel shedding at the instants its rule gives, adaptive LIFO's order, priorities, the `shed` refusal,
// invalid options, stops and reconfiguration; the policies against their reference models on seeded
// random scenarios; and the shared state hit from four threads.

#include "catch.hpp"
#include "model_scenarios.hpp"
#include "models.hpp"
#include "ranked_models.hpp"
#include "support.hpp"

#include <resilience/any_policy.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/priority.hpp>
#include <resilience/queue_discipline.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/telemetry.hpp>
#include <resilience/testing/simulation.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace test_queue_discipline {

namespace rs = resilience;
namespace rm = resilience_models;
using namespace std::chrono_literals;
using resilience_tests::invalid_argument_message;
using std::chrono::nanoseconds;
using namespace resilience_ranked; // calls with a class, their journal, and the bulkhead's model

namespace {

// One slot, held by call 0 from 0 to 200 ms, then by each waiter for 10 ms; calls 1 to 20 queue at
// 1 ms to 20 ms. The first hand-over, at 200 ms, finds the oldest waiter 199 ms old: the queue
// stands from then, and is overloaded from 300 ms. `later` join them: (id, arrival), each holding the
// slot 10 ms too.
void standing_queue(rs::testing::simulation& sim, const rs::bulkhead<rs::testing::virtual_clock>& bh,
                    journal& j, const std::vector<std::pair<int, nanoseconds>>& later = {}) {
    sim.spawn(client(sim, bh, j, {.id = 0, .hold = 200ms}));
    for (int i = 1; i <= 20; ++i)
        sim.spawn(client(sim, bh, j, {.id = i, .arrive = std::chrono::milliseconds{i}, .hold = 10ms}));
    for (const auto& [id, at] : later)
        sim.spawn(client(sim, bh, j, {.id = id, .arrive = at, .hold = 10ms}));
}

rs::bulkhead<rs::testing::virtual_clock> one_slot(rs::testing::simulation& sim, rs::queue_discipline d,
                                                  rs::priority_classes p = {}) {
    return rs::bulkhead{{.name = "db",
                         .max_concurrent_calls = 1,
                         .queue_limit = rs::unbounded_queue,
                         .priorities = std::move(p),
                         .queue_discipline = d},
                        sim.clock()};
}

} // namespace

TEST_CASE("queue discipline: fifo is the default, and serves a standing queue in arrival order, shedding "
          "nobody",
          "[queue_discipline]") {
    CHECK(std::holds_alternative<rs::fifo>(rs::bulkhead_options{}.queue_discipline));
    rs::testing::simulation sim;
    const auto bh = one_slot(sim, rs::fifo{});
    journal j;
    standing_queue(sim, bh, j);
    sim.run_all();
    CHECK(j.start_order() ==
          std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20});
    for (int i = 1; i <= 20; ++i)
        CHECK(j.ended[i] == ended{nanoseconds{200ms + 10ms * i}, "value"});
}

TEST_CASE("queue discipline: codel sheds the late waiters exactly once the queue has stood for an interval, "
          "and not before",
          "[queue_discipline]") {
    rs::testing::simulation sim;
    const auto bh = one_slot(sim, rs::codel{}); // 5 ms, 100 ms
    journal j;
    // Call 21 arrives at 296 ms: 4 ms old at 300 ms, within the target.
    standing_queue(sim, bh, j, {{21, 296ms}});
    sim.run_until(299ms);
    CHECK(bh.queued() == 11); // 10 served from 200 ms, each past the target: the queue stands, unshed
    for (int i = 1; i <= 9; ++i)
        CHECK(j.ended[i] == ended{nanoseconds{200ms + 10ms * i}, "value"});
    sim.run_all();
    CHECK(j.ended[10] == ended{300ms, "value"});
    for (int i = 11; i <= 20; ++i)
        CHECK(j.ended[i] == ended{300ms, "rejected shed"});
    CHECK(j.started_at(21) == 300ms);
    CHECK(j.ended[21] == ended{310ms, "value"});
    CHECK(bh.queued() == 0);
}

TEST_CASE("queue discipline: codel stops shedding once the oldest waiter's wait is back within the target",
          "[queue_discipline]") {
    rs::testing::simulation sim;
    const auto bh = one_slot(sim, rs::codel{});
    journal j;
    // At 310 ms call 22 is the oldest, 4 ms old: nothing stands. At 320 ms call 23 (13 ms) starts a
    // new standing queue, which would shed only from 420 ms: 23 to 25 are served however long they
    // waited.
    standing_queue(sim, bh, j, {{21, 296ms}, {22, 306ms}, {23, 307ms}, {24, 308ms}, {25, 309ms}});
    sim.run_all();
    for (int i = 11; i <= 20; ++i)
        CHECK(j.ended[i] == ended{300ms, "rejected shed"});
    CHECK(j.start_order() == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 21, 22, 23, 24, 25});
    CHECK(j.ended[25] == ended{350ms, "value"});
}

TEST_CASE("queue discipline: adaptive lifo serves in arrival order until the queue is overloaded, then the "
          "newest first, shedding as codel",
          "[queue_discipline]") {
    rs::testing::simulation sim;
    const auto bh = one_slot(sim, rs::adaptive_lifo{});
    journal j;
    standing_queue(sim, bh, j,
                   {{21, 296ms},
                    {22, 297ms},
                    {23, 298ms},
                    {24, 305ms},
                    {25, 308ms},
                    // After the queue emptied at 320 ms: nothing stands, arrival order again.
                    {26, 400ms},
                    {27, 401ms},
                    {28, 402ms}});
    sim.run_all();
    // Until 300 ms the queue stands but has not stood for an interval: arrival order.
    for (int i = 1; i <= 10; ++i)
        CHECK(j.started_at(i) == 200ms + 10ms * (i - 1));
    // At 300 ms: the waiters older than 5 ms are shed, and the newest of the rest served.
    for (int i = 11; i <= 20; ++i)
        CHECK(j.ended[i] == ended{300ms, "rejected shed"});
    CHECK(j.started_at(23) == 300ms);
    // At 310 ms the queue still stands (21 waited 14 ms): 21 and 22 are shed, 24 (5 ms) is not, and
    // 25, the newest, is served.
    CHECK(j.ended[21] == ended{310ms, "rejected shed"});
    CHECK(j.ended[22] == ended{310ms, "rejected shed"});
    CHECK(j.started_at(25) == 310ms);
    // At 320 ms 24 has waited 15 ms: shed, and the queue is empty.
    CHECK(j.ended[24] == ended{320ms, "rejected shed"});
    CHECK(j.started_at(26) == 400ms);
    CHECK(j.started_at(27) == 410ms); // 9 ms old: a new standing queue, served in arrival order
    CHECK(j.started_at(28) == 420ms);
    CHECK(bh.in_flight() == 0);
}

TEST_CASE("queue discipline: with priorities a higher class is never shed while a lower one waits",
          "[queue_discipline]") {
    // Class 1 holds the slot to 200 ms; class-1 waiters from 1 to 20 ms, one class-0 waiter at 5 ms.
    // From 300 ms class 1's queue is overloaded.
    rs::testing::simulation sim;
    const rs::priority_classes two{.classes = 2};
    journal j;
    resilience::stop_source low;
    auto run = [&](const rs::bulkhead<rs::testing::virtual_clock>& bh) {
        sim.spawn(client(sim, bh, j, {.id = 0, .cls = 1, .hold = 200ms}));
        for (int i = 1; i <= 20; ++i)
            sim.spawn(client(sim, bh, j,
                             {.id = i, .arrive = std::chrono::milliseconds{i}, .cls = 1, .hold = 10ms}));
        sim.spawn(
            client(sim, bh, j, {.id = 100, .arrive = 5ms, .cls = 0, .hold = 10ms, .stop = low.get_token()}));
    };
    SECTION("codel") {
        const auto bh = one_slot(sim, rs::codel{}, two);
        run(bh);
        SECTION("while the lower class waits, the higher one is served in full") {
            sim.run_all();
            for (int i = 1; i <= 20; ++i)
                CHECK(j.ended[i] == ended{nanoseconds{200ms + 10ms * i}, "value"});
            // Its own class's first sample: 395 ms old, the start of a standing queue; served.
            CHECK(j.ended[100] == ended{410ms, "value"});
        }
        SECTION("once the lower class has left, the higher one sheds at the next hand-over") {
            sim.spawn(resilience_tests::stop_at(sim, low, 305ms));
            sim.run_all();
            CHECK(j.ended[100] == ended{305ms, "cancelled"});
            CHECK(j.ended[10] == ended{300ms, "value"});
            CHECK(j.ended[11] == ended{310ms, "value"}); // handed the slot at 300 ms
            for (int i = 12; i <= 20; ++i)
                CHECK(j.ended[i] == ended{310ms, "rejected shed"});
        }
    }
    SECTION("adaptive lifo: the higher class is served newest first, still unshed") {
        const auto bh = one_slot(sim, rs::adaptive_lifo{}, two);
        run(bh);
        sim.run_all();
        CHECK(j.start_order() == std::vector<int>{0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10,
                                                  20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 100});
        for (int i = 1; i <= 20; ++i)
            CHECK(j.ended[i].second == "value");
    }
}

TEST_CASE("queue discipline: a shed waiter is refused with bulkhead_rejected_error and reason shed, told to "
          "on_rejected and the listener",
          "[queue_discipline]") {
    CHECK(std::string{rs::to_string(rs::rejection_reason::shed)} == "shed");
    rs::testing::simulation sim;
    std::vector<std::string> told;
    std::vector<rs::telemetry_event> heard;
    const rs::bulkhead bh{{.name = "db",
                           .max_concurrent_calls = 1,
                           .queue_limit = 8,
                           .queue_discipline = rs::codel{.target = 1ms, .interval = 10ms},
                           .on_rejected =
                               [&](const rs::rejection_event& e) {
                                   told.push_back(std::string{e.policy_name()} + " " +
                                                  rs::to_string(e.reason()));
                               },
                           .telemetry = [&](const rs::telemetry_event& e) { heard.push_back(e); }},
                          sim.clock()};
    // Holds to 20 ms; waiters at 1 to 4 ms. At 20 ms the queue stands (call 1 waited 19 ms), to be
    // overloaded from 30 ms, when calls 2 to 4 (28, 27 and 26 ms old) are shed.
    auto holder = [&]() -> rs::task<void> {
        auto act = [&]() -> rs::task<int> {
            co_await sim.sleep_for(20ms);
            co_return 0;
        };
        (void)co_await bh.execute_outcome(act);
    };
    std::optional<rs::outcome<int>> third;
    bool threw = false;
    auto waiter = [&](nanoseconds at, int id) -> rs::task<void> {
        co_await sim.sleep_for(at);
        auto act = [&]() -> rs::task<int> {
            co_await sim.sleep_for(10ms);
            co_return id;
        };
        if (id == 3) {
            third.emplace(co_await bh.execute_outcome(act));
        } else if (id == 4) {
            try {
                (void)co_await bh.execute(act);
            } catch (const rs::bulkhead_rejected_error& e) {
                threw = e.reason() == rs::rejection_reason::shed;
            }
        } else {
            (void)co_await bh.execute_outcome(act);
        }
    };
    sim.spawn(holder());
    sim.spawn(waiter(1ms, 1));
    sim.spawn(waiter(2ms, 2));
    sim.spawn(waiter(3ms, 3));
    sim.spawn(waiter(4ms, 4));
    sim.run_all();
    REQUIRE(third);
    REQUIRE(third->has_failure());
    CHECK(third->error().code() == rs::errc::bulkhead_rejected);
    const auto* e = third->error().as<rs::bulkhead_rejected_error>();
    REQUIRE(e);
    CHECK(e->reason() == rs::rejection_reason::shed);
    CHECK(e->policy_name() == "db");
    CHECK(threw);
    CHECK(told == std::vector<std::string>{"db shed", "db shed", "db shed"});
    std::vector<std::pair<nanoseconds, nanoseconds>> rejections;
    for (const rs::telemetry_event& ev : heard)
        if (ev.kind == rs::telemetry_kind::rejection && ev.reason == rs::rejection_reason::shed)
            rejections.emplace_back(ev.at, ev.duration);
    std::sort(rejections.begin(), rejections.end());
    CHECK(rejections ==
          std::vector<std::pair<nanoseconds, nanoseconds>>{{30ms, 26ms}, {30ms, 27ms}, {30ms, 28ms}});
}

TEST_CASE("queue discipline: invalid options are refused naming the field and the value, at construction "
          "and by reconfigure",
          "[queue_discipline]") {
    struct bad {
        rs::queue_discipline d;
        const char* message;
    };
    const bad cases[] = {
        {rs::codel{.target = 0ns}, "queue_discipline.target must be positive, got 0ns"},
        {rs::codel{.target = -1ms}, "queue_discipline.target must be positive, got -1000000ns"},
        {rs::codel{.interval = 0ns}, "queue_discipline.interval must be positive, got 0ns"},
        {rs::adaptive_lifo{.target = 0ns}, "queue_discipline.target must be positive, got 0ns"},
        {rs::adaptive_lifo{.interval = -5ns}, "queue_discipline.interval must be positive, got -5ns"},
    };
    rs::bulkhead<> kept{{.name = "db", .queue_discipline = rs::codel{}}};
    for (const bad& b : cases) {
        INFO(b.message);
        CHECK(invalid_argument_message([&] { rs::bulkhead{{.name = "db", .queue_discipline = b.d}}; }) ==
              std::string{"resilience::bulkhead (db): "} + b.message);
        CHECK(invalid_argument_message([&] { kept.reconfigure({.name = "db", .queue_discipline = b.d}); }) ==
              std::string{"resilience::bulkhead (db): "} + b.message);
        CHECK(std::holds_alternative<rs::codel>(kept.options().queue_discipline));
    }
    CHECK_NOTHROW(rs::bulkhead{{.queue_discipline = rs::codel{.target = 1ns, .interval = 1ns}}});
    CHECK_NOTHROW(rs::bulkhead{{.queue_discipline = rs::adaptive_lifo{}}});
    const rs::rate_limiter limiter{{.name = "db", .token_limit = 1, .tokens_per_second = 1}};
    for (const bad& b : cases) {
        INFO(b.message);
        CHECK(invalid_argument_message([&] {
                  rs::rate_limiter{
                      {.name = "db", .token_limit = 1, .tokens_per_second = 1, .queue_discipline = b.d}};
              }) == std::string{"resilience::rate_limiter (db): "} + b.message);
        CHECK(invalid_argument_message([&] {
                  rs::sliding_window_limiter{{.permit_limit = 1, .window = 1s, .queue_discipline = b.d}};
              }) == std::string{"resilience::sliding_window_limiter: "} + b.message);
        CHECK(invalid_argument_message([&] {
                  limiter.reconfigure(
                      {.name = "db", .token_limit = 1, .tokens_per_second = 1, .queue_discipline = b.d});
              }) == std::string{"resilience::rate_limiter (db): "} + b.message);
        CHECK(std::holds_alternative<rs::fifo>(limiter.options().queue_discipline));
    }
}

TEST_CASE("queue discipline: a waiter whose caller stops leaves at that instant under every discipline",
          "[queue_discipline]") {
    const rs::queue_discipline disciplines[] = {rs::fifo{}, rs::codel{}, rs::adaptive_lifo{}};
    for (const rs::queue_discipline& d : disciplines) {
        INFO("discipline " << d.index());
        rs::testing::simulation sim;
        const auto bh = one_slot(sim, d);
        journal j;
        resilience::stop_source src;
        std::size_t queued_after = 99;
        sim.spawn(client(sim, bh, j, {.id = 1, .hold = 200ms}));
        sim.spawn(client(sim, bh, j, {.id = 2, .arrive = 10ms, .hold = 10ms, .stop = src.get_token()}));
        sim.spawn(client(sim, bh, j, {.id = 3, .arrive = 20ms, .hold = 10ms}));
        sim.spawn(resilience_tests::stop_at(sim, src, 50ms, bh, queued_after));
        sim.run_all();
        CHECK(j.ended[2] == ended{50ms, "cancelled"});
        CHECK(queued_after == 1);
        CHECK(j.started_at(2) == nanoseconds{-1});
        CHECK(j.ended[3] == ended{210ms, "value"}); // the first hand-over only starts a standing queue
    }
}

TEST_CASE(
    "queue discipline: reconfigure puts a discipline in force for the next hand-over, and waiters queued "
    "before it are served in their order",
    "[queue_discipline]") {
    rs::testing::simulation sim;
    rs::bulkhead bh = one_slot(sim, rs::fifo{});
    journal j;
    // Calls 1 to 5 queue under fifo (keeping no instant), 11 to 30 under codel.
    sim.spawn(client(sim, bh, j, {.id = 0, .hold = 200ms}));
    for (int i = 1; i <= 5; ++i)
        sim.spawn(client(sim, bh, j, {.id = i, .arrive = std::chrono::milliseconds{i}, .hold = 10ms}));
    for (int i = 11; i <= 30; ++i)
        sim.spawn(client(sim, bh, j, {.id = i, .arrive = std::chrono::milliseconds{40 + i}, .hold = 10ms}));
    auto change = [&]() -> rs::task<void> {
        co_await sim.sleep_for(50ms);
        bh.reconfigure({.name = "db",
                        .max_concurrent_calls = 1,
                        .queue_limit = rs::unbounded_queue,
                        .queue_discipline = rs::codel{}});
    };
    sim.spawn(change());
    sim.run_all();
    CHECK(std::holds_alternative<rs::codel>(bh.options().queue_discipline));
    for (int i = 1; i <= 5; ++i)
        CHECK(j.ended[i].second == "value");
    // 11 is the first sample, at 250 ms: overloaded from 350 ms, when 21 to 30 are shed.
    for (int i = 11; i <= 20; ++i)
        CHECK(j.started_at(i) == 250ms + 10ms * (i - 11));
    for (int i = 21; i <= 30; ++i)
        CHECK(j.ended[i] == ended{350ms, "rejected shed"});
}

// ---------------------------------------------------------------------------------------------------------
// The limiters: a token (a permit) due is handed over as a bulkhead's slot is

namespace {

// A bucket of one token, one more every 10 ms: call 0 takes it at 0 ms, calls 1 to 12 queue at 2 to
// 24 ms, calls 101 to 104 at 61 to 64 ms. Target 20 ms, interval 50 ms: at 10 and 20 ms the head has
// waited 8 and 16 ms; at 30 ms call 3 (24 ms) starts a standing queue, overloaded from 80 ms.
std::vector<call> bucket_calls() {
    std::vector<call> calls;
    for (int i = 0; i <= 12; ++i)
        calls.push_back({.id = i, .arrive = std::chrono::milliseconds{2 * i}});
    for (int i = 1; i <= 4; ++i)
        calls.push_back({.id = 100 + i, .arrive = std::chrono::milliseconds{60 + i}});
    return calls;
}

rs::rate_limiter<rs::testing::virtual_clock> one_token(rs::testing::simulation& sim, rs::queue_discipline d) {
    return rs::rate_limiter{{.token_limit = 1,
                             .tokens_per_second = 100,
                             .queue_limit = rs::unbounded_queue,
                             .queue_discipline = d},
                            sim.clock()};
}

} // namespace

TEST_CASE("queue discipline: a rate limiter sheds its late waiters at the instant a token is due once its "
          "queue has stood for an interval, and under adaptive lifo gives the token to the newest waiter",
          "[queue_discipline]") {
    const bool lifo = GENERATE(false, true);
    INFO((lifo ? "adaptive lifo" : "codel"));
    rs::testing::simulation sim;
    const auto rl = lifo ? one_token(sim, rs::adaptive_lifo{.target = 20ms, .interval = 50ms})
                         : one_token(sim, rs::codel{.target = 20ms, .interval = 50ms});
    journal j;
    spawn_all(sim, rl, j, bucket_calls());
    sim.run_all();
    for (int i = 0; i <= 7; ++i) // in arrival order until overloaded
        CHECK(j.ended[i] == ended{nanoseconds{10ms * i}, "value"});
    // At 80 ms the head (call 8) has waited 64 ms: calls 8 to 12 are shed, told that a token would be
    // there for them behind the three still queued at 120 ms. Under codel call 101 (19 ms), the
    // oldest left, takes the token; under adaptive lifo call 104, the newest.
    for (int i = 8; i <= 12; ++i)
        CHECK(j.ended[i] == ended{80ms, "limited shed 40000000ns"});
    const int served = lifo ? 104 : 101;
    CHECK(j.ended[served] == ended{80ms, "value"});
    // At 90 ms the queue still stands (the oldest left has waited 28 or 29 ms): the other three are
    // shed, and the token stays there.
    for (int i = 101; i <= 104; ++i)
        if (i != served)
            CHECK(j.ended[i] == ended{90ms, "limited shed 0ns"});
    CHECK(rl.queued() == 0);
}

TEST_CASE("queue discipline: a sliding window limiter sheds as the rate limiter does", "[queue_discipline]") {
    // One permit per 10 ms window (in one segment): a permit comes back 10 ms after it was taken.
    rs::testing::simulation sim;
    const rs::sliding_window_limiter sw{{.permit_limit = 1,
                                         .window = 10ms,
                                         .segments = 1,
                                         .queue_limit = rs::unbounded_queue,
                                         .queue_discipline = rs::codel{.target = 20ms, .interval = 50ms}},
                                        sim.clock()};
    journal j;
    spawn_all(sim, sw, j, bucket_calls());
    sim.run_all();
    for (int i = 8; i <= 12; ++i)
        CHECK(j.ended[i].second.rfind("limited shed", 0) == 0);
    CHECK(j.ended[8].first == 80ms);
    CHECK(j.ended[101] == ended{80ms, "value"});
}

// ---------------------------------------------------------------------------------------------------------
// The reference models on seeded random scenarios
//
// tests/ranked_models.hpp's models of the bulkhead and the limiters with priorities, which apply the
// discipline at each hand-over as docs/bulkhead.md and docs/rate_limiter.md say, on denser scenarios
// than the priorities' ones, so that queues stand.

TEST_CASE("model: a token bucket with a queue discipline admits, sheds and refuses as its model",
          "[queue_discipline][model]") {
    rm::run_scenarios(1500, [](rm::chooser& pick) { return check_ranked_token_bucket(pick, true); });
}

TEST_CASE("model: a sliding window with a queue discipline admits, sheds and refuses as its model",
          "[queue_discipline][model]") {
    rm::run_scenarios(1500, [](rm::chooser& pick) { return check_ranked_sliding_window(pick, true); });
}

TEST_CASE("model: a bulkhead with a queue discipline admits, sheds, serves and refuses as its model",
          "[queue_discipline][model]") {
    rm::run_scenarios(600, [](rm::chooser& pick) { return check_ranked_bulkhead(pick, true); });
}

// ---------------------------------------------------------------------------------------------------------
// Threads

namespace {

template <class Refusal>
struct shared_counts {
    std::atomic<int> running{0}, peak{0}, shed{0};
    resilience_tests::call_tally<Refusal> calls;
    explicit shared_counts(std::size_t n) : calls(n) {}
};

// Stops `src` (a copy: the call may be over first) after two rounds of its loop.
rs::task<void> stop_soon(resilience::stop_source src) {
    co_await resilience_tests::stop_after_yields(src, 2);
}

// A call whose action yields to its loop a few times while it runs, so that a bulkhead's queue forms
// and stands; every third one is of class 1, and every seventh one's caller stops it soon.
template <class Policy, class Refusal>
rs::task<void> threaded_call(const Policy& p, shared_counts<Refusal>& c, std::size_t id) {
    auto action = [&c, id]() -> rs::task<int> {
        int seen = c.peak.load();
        const int now = ++c.running;
        while (now > seen && !c.peak.compare_exchange_weak(seen, now)) {
        }
        for (std::size_t i = 0; i < 1 + id % 4; ++i)
            co_await resilience_tests::yield_now{};
        --c.running;
        co_return 1;
    };
    resilience::stop_source src;
    if (id % 7 == 0)
        rs::event_loop::current()->spawn(stop_soon(src));
    auto r = co_await p.execute_outcome(std::move(action),
                                        with_class(static_cast<int>(id % 3 == 0), src.get_token()));
    if (!r.has_value())
        if (auto* e = r.error().template as<Refusal>(); e && e->reason() == rs::rejection_reason::shed)
            ++c.shed;
    c.calls.record(id, r);
}

// Makes `calls` calls one after another, numbered from `first`.
template <class Policy, class Refusal>
rs::task<void> chain_of_calls(const Policy& p, shared_counts<Refusal>& c, std::size_t first,
                              std::size_t calls) {
    for (std::size_t i = 0; i < calls; ++i)
        co_await threaded_call(p, c, first + i);
}

// Sixteen chains of calls on each of four loops (up to 64 calls at once, so that a queue of 64 stands
// but is rarely full), run on four threads; every call ends once, and the policy is left idle.
template <class Policy, class Refusal>
void run_on_four_threads(const Policy& p, shared_counts<Refusal>& c, std::size_t chain_length) {
    constexpr std::size_t loops = 4, chains = 16;
    const std::size_t per_loop = chains * chain_length;
    rs::event_loop l0, l1, l2, l3;
    rs::event_loop* all[loops] = {&l0, &l1, &l2, &l3};
    for (std::size_t l = 0; l < loops; ++l)
        for (std::size_t k = 0; k < chains; ++k)
            all[l]->spawn(chain_of_calls(p, c, l * per_loop + k * chain_length, chain_length));
    resilience_tests::run_on_threads(l0, l1, l2, l3);
    CHECK(c.running.load() == 0);
    CHECK(c.calls.failed == 0);
    CHECK(c.calls.values + c.calls.refused + c.calls.cancelled == static_cast<int>(loops * per_loop));
    REQUIRE(c.calls.completions.exactly_once() == loops * per_loop);
    CHECK(p.queued() == 0);
    SUCCEED(c.shed.load() << " shed, " << c.calls.refused.load() << " refused in all");
}

const rs::queue_discipline threaded_disciplines[] = {rs::codel{.target = 1us, .interval = 20us},
                                                     rs::adaptive_lifo{.target = 1us, .interval = 20us}};

} // namespace

TEST_CASE("queue discipline: a bulkhead shedding by codel or adaptive lifo, shared by loops on four threads, "
          "never runs more than its limit, and every call ends once",
          "[queue_discipline][concurrency]") {
    const rs::queue_discipline d = threaded_disciplines[GENERATE(0, 1)];
    const std::size_t classes = GENERATE(std::size_t{0}, std::size_t{2});
    const rs::bulkhead<> bh{{.max_concurrent_calls = 3,
                             .queue_limit = 64,
                             .priorities = {.classes = classes},
                             .queue_discipline = d}};
    shared_counts<rs::bulkhead_rejected_error> c{4 * 16 * resilience_tests::stress_rounds(200)};
    run_on_four_threads(bh, c, resilience_tests::stress_rounds(200));
    CHECK(c.peak.load() <= 3);
    CHECK(bh.in_flight() == 0);
}

TEST_CASE("queue discipline: a rate limiter shedding by codel or adaptive lifo, shared by loops on four "
          "threads, ends every call once",
          "[queue_discipline][concurrency]") {
    const rs::queue_discipline d = threaded_disciplines[GENERATE(0, 1)];
    const std::size_t classes = GENERATE(std::size_t{0}, std::size_t{2});
    // A token every 5 µs: the heads sleep on the steady clock, often past the target.
    const rs::rate_limiter<> rl{{.token_limit = 2,
                                 .tokens_per_second = 200'000,
                                 .queue_limit = 64,
                                 .priorities = {.classes = classes},
                                 .queue_discipline = d}};
    shared_counts<rs::rate_limited_error> c{4 * 16 * resilience_tests::stress_rounds(100)};
    run_on_four_threads(rl, c, resilience_tests::stress_rounds(100));
}

} // namespace test_queue_discipline
