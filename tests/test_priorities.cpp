// SPDX-License-Identifier: MIT
// Tests of priorities under load (priority.hpp) in the bulkhead (fixed and adaptive), the rate limiter
// and the sliding window limiter: reserved shares, the queue ordered by class, displacement from a
// full queue, the default class, refused options; each policy against a reference model on seeded
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
#include <resilience/rate_limiter.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace test_priorities {

namespace rs = resilience;
namespace rm = resilience_models;
using namespace std::chrono_literals;
using resilience_tests::invalid_argument_message;
using std::chrono::nanoseconds;
using namespace resilience_ranked; // calls with a class, their journal, and the bulkhead's model

// ---------------------------------------------------------------------------------------------------------
// The bulkhead

TEST_CASE("priorities: a bulkhead keeps the reserved share of its slots for the higher class",
          "[priorities]") {
    // Four slots, half reserved for class 1: class 0 takes a slot only while two stay free.
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 4, .priorities = {.classes = 2, .reserved = {0, 0.5}}},
                    sim.clock()};
    journal j;
    spawn_all(sim, bh, j,
              {{.id = 1, .cls = 0, .hold = 100ms},
               {.id = 2, .cls = 0, .hold = 100ms},
               {.id = 3, .cls = 0, .hold = 100ms}, // two slots taken: the rest is class 1's
               {.id = 4, .arrive = 10ms, .cls = 1, .hold = 100ms},
               {.id = 5, .arrive = 10ms, .cls = 1, .hold = 100ms},
               {.id = 6, .arrive = 10ms, .cls = 1, .hold = 100ms}, // all four taken
               {.id = 7, .arrive = 105ms, .cls = 0, .hold = 10ms}, // 4 and 5 hold two: none for class 0
               {.id = 8, .arrive = 120ms, .cls = 0, .hold = 10ms}});
    sim.run_until(10ms);
    CHECK(bh.in_flight() == 4);
    sim.run_all();
    CHECK(j.ended[1] == ended{100ms, "value"});
    CHECK(j.ended[2] == ended{100ms, "value"});
    CHECK(j.ended[3] == ended{0ms, "rejected no_capacity"});
    CHECK(j.ended[4] == ended{110ms, "value"});
    CHECK(j.ended[5] == ended{110ms, "value"});
    CHECK(j.ended[6] == ended{10ms, "rejected no_capacity"});
    CHECK(j.ended[7] == ended{105ms, "rejected no_capacity"});
    CHECK(j.ended[8] == ended{130ms, "value"});
    CHECK(bh.in_flight() == 0);
}

TEST_CASE("priorities: a bulkhead serves its queue highest class first, in arrival order within a class",
          "[priorities]") {
    // Strict priority (nothing reserved): one slot, and everyone who finds it taken queues.
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 10, .priorities = {.classes = 3}},
                    sim.clock()};
    journal j;
    spawn_all(sim, bh, j,
              {{.id = 1, .cls = 0, .hold = 100ms},
               {.id = 2, .arrive = 10ms, .cls = 0, .hold = 100ms},
               {.id = 3, .arrive = 20ms, .cls = 1, .hold = 100ms},
               {.id = 4, .arrive = 30ms, .cls = 0, .hold = 100ms},
               {.id = 5, .arrive = 40ms, .cls = 2, .hold = 100ms},
               {.id = 6, .arrive = 50ms, .cls = 1, .hold = 100ms}});
    sim.run_until(60ms);
    CHECK(bh.queued() == 5);
    sim.run_all();
    CHECK(j.start_order() == std::vector<int>{1, 5, 3, 6, 2, 4});
    CHECK(j.started_at(5) == 100ms);
    CHECK(j.started_at(3) == 200ms);
    CHECK(j.started_at(6) == 300ms);
    CHECK(j.started_at(2) == 400ms);
    CHECK(j.started_at(4) == 500ms);
    CHECK(sim.now() == 600ms);
}

TEST_CASE("priorities: a bulkhead gives a freed slot to a waiter of a lower class only within its share",
          "[priorities]") {
    // Four slots, half reserved for class 1. Class 0 waits while two are taken, and a call of class 1
    // passes it to a free slot.
    rs::testing::simulation sim;
    rs::bulkhead bh{
        {.max_concurrent_calls = 4, .queue_limit = 10, .priorities = {.classes = 2, .reserved = {0, 0.5}}},
        sim.clock()};
    journal j;
    spawn_all(sim, bh, j,
              {{.id = 1, .cls = 0, .hold = 100ms},
               {.id = 2, .cls = 1, .hold = 200ms},
               {.id = 3, .arrive = 10ms, .cls = 0, .hold = 100ms}, // two taken: waits
               {.id = 4, .arrive = 20ms, .cls = 1, .hold = 50ms},  // passes it
               {.id = 5, .arrive = 30ms, .cls = 1, .hold = 50ms}});
    sim.run_all();
    CHECK(j.started_at(4) == 20ms);
    CHECK(j.started_at(5) == 30ms);
    // At 70 and 80 ms 4 and 5 end (1 and 2 still hold two); at 100 ms 1 ends: one taken, 3 runs.
    CHECK(j.started_at(3) == 100ms);
    CHECK(j.ended[3] == ended{200ms, "value"});
}

TEST_CASE("priorities: a newcomer of a higher class displaces the lowest class's last waiter from a full "
          "bulkhead queue",
          "[priorities]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 2, .priorities = {.classes = 3}}, sim.clock()};
    journal j;
    spawn_all(sim, bh, j,
              {{.id = 1, .cls = 0, .hold = 100ms},
               {.id = 2, .arrive = 10ms, .cls = 1, .hold = 10ms},
               {.id = 3, .arrive = 20ms, .cls = 0, .hold = 10ms},
               {.id = 4, .arrive = 30ms, .cls = 0, .hold = 10ms},   // full, nobody below: refused
               {.id = 5, .arrive = 40ms, .cls = 2, .hold = 10ms},   // displaces 3, the lowest class
               {.id = 6, .arrive = 50ms, .cls = 2, .hold = 10ms},   // displaces 2
               {.id = 7, .arrive = 60ms, .cls = 1, .hold = 10ms}}); // full of class 2: refused
    sim.run_all();
    CHECK(j.ended[3] == ended{40ms, "rejected queue_full"});
    CHECK(j.ended[4] == ended{30ms, "rejected queue_full"});
    CHECK(j.ended[2] == ended{50ms, "rejected queue_full"});
    CHECK(j.ended[7] == ended{60ms, "rejected queue_full"});
    CHECK(j.start_order() == std::vector<int>{1, 5, 6});
    CHECK(j.ended[5] == ended{110ms, "value"});
    CHECK(j.ended[6] == ended{120ms, "value"});
}

TEST_CASE(
    "priorities: a displaced waiter of a bulkhead is refused at once, its queue timer disarmed, and told "
    "to on_rejected and the listener",
    "[priorities]") {
    rs::testing::simulation sim;
    std::vector<std::string> told;
    resilience_tests::heard_counts heard;
    rs::bulkhead bh{
        {.max_concurrent_calls = 1,
         .queue_limit = 1,
         .queue_timeout = 500ms,
         .priorities = {.classes = 2},
         .on_rejected = [&](const rs::rejection_event& e) { told.push_back(rs::to_string(e.reason())); },
         .telemetry = heard.listener()},
        sim.clock()};
    journal j;
    spawn_all(sim, bh, j,
              {{.id = 1, .cls = 0, .hold = 100ms},
               {.id = 2, .arrive = 10ms, .cls = 0, .hold = 10ms},
               {.id = 3, .arrive = 20ms, .cls = 1, .hold = 10ms}});
    sim.run_all();
    CHECK(j.ended[2] == ended{20ms, "rejected queue_full"});
    CHECK(j.ended[3] == ended{110ms, "value"});
    CHECK(told == std::vector<std::string>{"queue_full"});
    CHECK(heard.rejections.load() == 1);
    CHECK(heard.waits.load() == 1);
    CHECK(sim.now() == 110ms); // no timer of the displaced call left to fire
}

TEST_CASE("priorities: a call without the property is of the default class, and a priority out of range "
          "counts as the nearest class",
          "[priorities]") {
    // Two slots, one reserved for class 1.
    const auto run = [](int default_class, std::vector<std::optional<int>> classes) {
        rs::testing::simulation sim;
        rs::bulkhead bh{{.max_concurrent_calls = 2,
                         .priorities = {.classes = 2, .reserved = {0, 0.5}, .default_class = default_class}},
                        sim.clock()};
        journal j;
        int id = 0;
        for (const std::optional<int>& c : classes)
            sim.spawn(client(sim, bh, j, {.id = ++id, .cls = c, .hold = 10ms}));
        sim.run_all();
        std::vector<std::string> out;
        for (auto& [i, e] : j.ended)
            out.push_back(e.second);
        return out;
    };
    // Unset, then class 0: with default class 1 the first takes a slot, and class 0 finds one of two
    // taken, the other reserved.
    CHECK(run(1, {std::nullopt, 0}) == std::vector<std::string>{"value", "rejected no_capacity"});
    CHECK(run(1, {std::nullopt, std::nullopt}) == std::vector<std::string>{"value", "value"});
    CHECK(run(0, {std::nullopt, std::nullopt}) == std::vector<std::string>{"value", "rejected no_capacity"});
    CHECK(run(0, {std::nullopt, 1}) == std::vector<std::string>{"value", "value"});
    // 7 is the highest class, -3 the lowest.
    CHECK(run(0, {0, 7}) == std::vector<std::string>{"value", "value"});
    CHECK(run(0, {0, -3}) == std::vector<std::string>{"value", "rejected no_capacity"});
}

TEST_CASE("priorities: an adaptive bulkhead reserves its share of the limit wherever the limit moved",
          "[priorities]") {
    // The limit starts at 10, 30% reserved for class 1 (3 slots): class 0 runs up to 7. One failure
    // halves it to 5, whose 30% is 1 slot (rounded down): class 0 runs up to 4.
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 10,
                     .adapt = rs::aimd{.min = 1, .max = 10, .decrease = 0.5},
                     .priorities = {.classes = 2, .reserved = {0, 0.3}}},
                    sim.clock()};
    journal j;
    std::vector<call> calls{{.id = 100, .cls = 1, .hold = 10ms, .fail = true}};
    for (int i = 1; i <= 8; ++i) // at 0, beside the failing call: 6 run (7 with it), 2 refused
        calls.push_back({.id = i, .cls = 0, .hold = 5ms});
    for (int i = 11; i <= 15; ++i) // at 20 ms, under a limit of 5
        calls.push_back({.id = i, .arrive = 20ms, .cls = 0, .hold = 100ms});
    calls.push_back({.id = 21, .arrive = 30ms, .cls = 1, .hold = 100ms});
    calls.push_back({.id = 22, .arrive = 30ms, .cls = 1, .hold = 100ms});
    spawn_all(sim, bh, j, calls);
    sim.run_until(15ms);
    CHECK(bh.limit() == 5);
    sim.run_all();
    for (int i = 1; i <= 6; ++i)
        CHECK(j.ended[i] == ended{5ms, "value"});
    CHECK(j.ended[7] == ended{0ms, "rejected no_capacity"});
    CHECK(j.ended[8] == ended{0ms, "rejected no_capacity"});
    for (int i = 11; i <= 14; ++i)
        CHECK(j.ended[i] == ended{120ms, "value"});
    CHECK(j.ended[15] == ended{20ms, "rejected no_capacity"});
    CHECK(j.ended[21] == ended{130ms, "value"});
    CHECK(j.ended[22] == ended{30ms, "rejected no_capacity"});
}

// ---------------------------------------------------------------------------------------------------------
// The rate limiter

TEST_CASE("priorities: a rate limiter keeps the reserved share of its tokens for the higher class",
          "[priorities]") {
    // Ten tokens, 40% reserved for class 1: class 0 takes one only while five are there.
    rs::testing::simulation sim;
    rs::rate_limiter rl{
        {.token_limit = 10, .tokens_per_second = 10, .priorities = {.classes = 2, .reserved = {0, 0.4}}},
        sim.clock()};
    journal j;
    std::vector<call> calls;
    for (int i = 1; i <= 7; ++i)
        calls.push_back({.id = i, .cls = 0});
    for (int i = 11; i <= 15; ++i)
        calls.push_back({.id = i, .cls = 1});
    calls.push_back({.id = 21, .arrive = 150ms, .cls = 0}); // 1.5 tokens: no
    calls.push_back({.id = 22, .arrive = 500ms, .cls = 0}); // 5 tokens: yes
    spawn_all(sim, rl, j, calls);
    sim.run_all();
    for (int i = 1; i <= 6; ++i)
        CHECK(j.ended[i].second == "value");
    // Four tokens left, and five due at 100 ms: the bucket's instant is -400 ms.
    CHECK(j.ended[7] == ended{0ms, "limited no_capacity 100000000ns"});
    for (int i = 11; i <= 14; ++i)
        CHECK(j.ended[i].second == "value");
    CHECK(j.ended[15] == ended{0ms, "limited no_capacity 100000000ns"});
    CHECK(j.ended[21] == ended{150ms, "limited no_capacity 350000000ns"});
    CHECK(j.ended[22] == ended{500ms, "value"});
}

TEST_CASE("priorities: a rate limiter serves its queue highest class first, a newcomer in front taking the "
          "turn",
          "[priorities]") {
    // One token every 100 ms. Each newcomer of a higher class queues in front of the one watching the
    // clock and takes over.
    rs::testing::simulation sim;
    rs::rate_limiter rl{
        {.token_limit = 1, .tokens_per_second = 10, .queue_limit = 10, .priorities = {.classes = 3}},
        sim.clock()};
    journal j;
    spawn_all(sim, rl, j,
              {{.id = 1, .cls = 0},
               {.id = 2, .arrive = 10ms, .cls = 0},
               {.id = 3, .arrive = 20ms, .cls = 1},
               {.id = 4, .arrive = 30ms, .cls = 0},
               {.id = 5, .arrive = 40ms, .cls = 2},
               {.id = 6, .arrive = 50ms, .cls = 1}});
    sim.run_until(60ms);
    CHECK(rl.queued() == 5);
    sim.run_all();
    CHECK(j.start_order() == std::vector<int>{1, 5, 3, 6, 2, 4});
    CHECK(j.started_at(5) == 100ms);
    CHECK(j.started_at(3) == 200ms);
    CHECK(j.started_at(6) == 300ms);
    CHECK(j.started_at(2) == 400ms);
    CHECK(j.started_at(4) == 500ms);
    CHECK(sim.now() == 500ms);
    CHECK(rl.queued() == 0);
}

TEST_CASE("priorities: a rate limiter's waiter of a lower class waits for its share while a higher class "
          "passes it",
          "[priorities]") {
    // Four tokens, half reserved for class 1: class 0 takes one only while three are there.
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 4,
                         .tokens_per_second = 10,
                         .queue_limit = 10,
                         .priorities = {.classes = 2, .reserved = {0, 0.5}}},
                        sim.clock()};
    journal j;
    spawn_all(sim, rl, j,
              {{.id = 1, .cls = 0},
               {.id = 2, .cls = 0},
               {.id = 3, .cls = 0},                   // two left: waits for three, at 100 ms
               {.id = 4, .arrive = 50ms, .cls = 1}}); // 2.5 there: takes one, so three only at 200 ms
    sim.run_all();
    CHECK(j.started_at(4) == 50ms);
    CHECK(j.started_at(3) == 200ms);
    CHECK(rl.queued() == 0);
}

TEST_CASE("priorities: a newcomer of a higher class displaces the waiter watching the clock from a full "
          "rate limiter queue",
          "[priorities]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{
        {.token_limit = 1, .tokens_per_second = 10, .queue_limit = 1, .priorities = {.classes = 2}},
        sim.clock()};
    journal j;
    spawn_all(sim, rl, j,
              {{.id = 1, .cls = 0},
               {.id = 2, .arrive = 10ms, .cls = 0},   // waits for the token due at 100 ms
               {.id = 3, .arrive = 20ms, .cls = 1},   // displaces it, and waits for that token
               {.id = 4, .arrive = 30ms, .cls = 0}}); // full, nobody below: refused
    sim.run_all();
    CHECK(j.ended[2] == ended{20ms, "limited queue_full 80000000ns"});
    CHECK(j.ended[4] == ended{30ms, "limited queue_full 170000000ns"});
    CHECK(j.ended[3] == ended{100ms, "value"});
    CHECK(sim.now() == 100ms);
}

TEST_CASE("priorities: a rate limiter's waiter that lost its turn to a higher class is refused at its own "
          "queue deadline",
          "[priorities]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{{.token_limit = 1,
                         .tokens_per_second = 10,
                         .queue_limit = 10,
                         .queue_timeout = 150ms,
                         .priorities = {.classes = 2}},
                        sim.clock()};
    journal j;
    spawn_all(sim, rl, j,
              {{.id = 1, .cls = 0},
               {.id = 2, .arrive = 10ms, .cls = 0},   // deadline 160 ms
               {.id = 3, .arrive = 20ms, .cls = 1},   // takes the turn; the token at 100 ms
               {.id = 4, .arrive = 30ms, .cls = 1}}); // deadline 180 ms, before its token at 200 ms
    sim.run_all();
    CHECK(j.ended[3] == ended{100ms, "value"});
    // At 160 ms call 4 is ahead of it, and the bucket empty since 100 ms: its token at 300 ms.
    CHECK(j.ended[2] == ended{160ms, "limited queue_timeout 140000000ns"});
    CHECK(j.ended[4] == ended{180ms, "limited queue_timeout 20000000ns"});
    CHECK(rl.queued() == 0);
}

TEST_CASE("priorities: a rate limiter's waiter that lost its turn leaves at once when its caller stops",
          "[priorities]") {
    rs::testing::simulation sim;
    rs::rate_limiter rl{
        {.token_limit = 1, .tokens_per_second = 10, .queue_limit = 10, .priorities = {.classes = 2}},
        sim.clock()};
    journal j;
    resilience::stop_source stop;
    std::size_t queued_after_stop = 99;
    spawn_all(sim, rl, j,
              {{.id = 1, .cls = 0},
               {.id = 2, .arrive = 10ms, .cls = 0, .stop = stop.get_token()},
               {.id = 3, .arrive = 20ms, .cls = 1}});
    sim.spawn(resilience_tests::stop_at(sim, stop, 50ms, rl, queued_after_stop));
    sim.run_all();
    CHECK(j.ended[2] == ended{50ms, "cancelled"});
    CHECK(queued_after_stop == 1);
    CHECK(j.ended[3] == ended{100ms, "value"});
}

TEST_CASE("priorities: a rate limiter's waiter given the turn loses it to a higher class before it runs, "
          "and waits on",
          "[priorities]") {
    // At 100 ms call 2 takes the token and hands the turn to call 3, whose wake-up is posted; before
    // call 3 runs, call 2's action makes a call of class 1 through the same limiter, which queues in
    // front of it and takes the turn.
    rs::testing::simulation sim;
    rs::rate_limiter rl{
        {.token_limit = 1, .tokens_per_second = 10, .queue_limit = 10, .priorities = {.classes = 2}},
        sim.clock()};
    journal j;
    std::optional<std::pair<nanoseconds, std::string>> inner;
    auto calls_inside = [&sim, &rl, &inner]() -> rs::task<int> {
        auto action = []() -> rs::task<int> { co_return 0; };
        auto r = co_await rl.execute_outcome(action, with_class(1));
        inner = {sim.now(), how(r)};
        co_return 2;
    };
    sim.spawn(client(sim, rl, j, {.id = 1, .cls = 0}));
    sim.spawn([](rs::testing::simulation& s, const rs::rate_limiter<rs::testing::virtual_clock>& limiter,
                 decltype(calls_inside)& action) -> rs::task<void> {
        co_await s.sleep_for(10ms);
        (void)co_await limiter.execute_outcome(action, with_class(0));
    }(sim, rl, calls_inside));
    sim.spawn(client(sim, rl, j, {.id = 3, .arrive = 20ms, .cls = 0}));
    sim.run_all();
    CHECK(inner == std::optional<std::pair<nanoseconds, std::string>>{{200ms, "value"}});
    CHECK(j.ended[3] == ended{300ms, "value"});
    CHECK(rl.queued() == 0);
}

TEST_CASE("priorities: a rate limiter's take is of the default class", "[priorities]") {
    const auto takes = [](int default_class) {
        rs::testing::simulation sim;
        rs::rate_limiter rl{
            {.token_limit = 2,
             .tokens_per_second = 10,
             .priorities = {.classes = 2, .reserved = {0, 0.5}, .default_class = default_class}},
            sim.clock()};
        std::vector<std::string> out;
        for (int i = 0; i < 2; ++i) {
            auto r = sim.run(rl.take_outcome());
            out.push_back(r.has_value() ? "taken"
                                        : std::to_string(
                                              r.error().as<rs::rate_limited_error>()->retry_after().count()));
        }
        return out;
    };
    CHECK(takes(0) == std::vector<std::string>{"taken", "100000000"}); // class 0 leaves one
    CHECK(takes(1) == std::vector<std::string>{"taken", "taken"});
}

// ---------------------------------------------------------------------------------------------------------
// The sliding window limiter

TEST_CASE("priorities: a sliding window limiter keeps the reserved share of its permits, and its waiter "
          "of a lower class gets one when its share is back",
          "[priorities]") {
    // Four permits a second in segments of 100 ms, half reserved for class 1: class 0 takes one only
    // while three are free.
    rs::testing::simulation sim;
    rs::sliding_window_limiter sw{{.permit_limit = 4,
                                   .window = 1s,
                                   .segments = 10,
                                   .queue_limit = 10,
                                   .priorities = {.classes = 2, .reserved = {0, 0.5}}},
                                  sim.clock()};
    journal j;
    spawn_all(sim, sw, j,
              {{.id = 1, .cls = 0},
               {.id = 2, .cls = 0},
               {.id = 3, .cls = 0}, // two free: waits for three
               {.id = 4, .arrive = 10ms, .cls = 1},
               {.id = 5, .arrive = 20ms, .cls = 1}});
    sim.run_until(30ms);
    CHECK(sw.tokens() == 0.0);
    CHECK(sw.queued() == 1);
    sim.run_all();
    CHECK(j.started_at(4) == 10ms);
    CHECK(j.started_at(5) == 20ms);
    // 1 and 2 come back at 1 s (two free), 4 and 5 at 1.1 s (counted at the 100 ms boundary).
    CHECK(j.started_at(3) == 1100ms);
}

// ---------------------------------------------------------------------------------------------------------
// Options

TEST_CASE("priorities: invalid priorities are refused at construction, naming the field and the value",
          "[priorities]") {
    struct bad {
        rs::priority_classes p;
        const char* field;
        const char* value;
    };
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const bad cases[] = {
        {{.classes = 9}, "priorities.classes must be at most 8", "got 9"},
        {{.classes = 2, .reserved = {0}},
         "priorities.reserved must be empty or have one share per class (2)",
         "got 1 shares"},
        {{.classes = 2, .reserved = {0.1, 0.2}}, "priorities.reserved[0] must be 0", "got 0.1"},
        {{.classes = 2, .reserved = {0, -0.5}}, "priorities.reserved[1] must be in [0, 1)", "got -0.5"},
        {{.classes = 2, .reserved = {0, 1}}, "priorities.reserved[1] must be in [0, 1)", "got 1"},
        {{.classes = 2, .reserved = {0, nan}}, "priorities.reserved[1] must be in [0, 1)", "got nan"},
        {{.classes = 3, .reserved = {0, 0.5, 0.5}},
         "priorities.reserved must add up to less than 1",
         "got 1"},
        {{.classes = 2, .default_class = 2},
         "priorities.default_class must be a class, from 0 to 1",
         "got 2"},
        {{.classes = 2, .default_class = -1},
         "priorities.default_class must be a class, from 0 to 1",
         "got -1"},
        {{.classes = 0, .reserved = {0}},
         "priorities.reserved must be empty or have one share per class (0)",
         "got 1 shares"},
        {{.classes = 0, .default_class = 1},
         "priorities.default_class must be a class, from 0 to 0",
         "got 1"},
    };
    for (const bad& b : cases) {
        INFO(b.field);
        using Catch::Matchers::Contains;
        CHECK_THAT(invalid_argument_message([&] { rs::bulkhead{{.name = "db", .priorities = b.p}}; }),
                   Contains("bulkhead (db): ") && Contains(b.field) && Contains(b.value));
        CHECK_THAT(invalid_argument_message([&] {
                       rs::rate_limiter{{.token_limit = 1, .tokens_per_second = 1, .priorities = b.p}};
                   }),
                   Contains("rate_limiter: ") && Contains(b.field) && Contains(b.value));
        CHECK_THAT(invalid_argument_message([&] {
                       rs::sliding_window_limiter{{.permit_limit = 1, .window = 1s, .priorities = b.p}};
                   }),
                   Contains("sliding_window_limiter: ") && Contains(b.field) && Contains(b.value));
    }
    // The edges that are fine.
    CHECK_NOTHROW(rs::bulkhead{{.priorities = {.classes = 8, .default_class = 7}}});
    CHECK_NOTHROW(rs::bulkhead{{.priorities = {.classes = 3, .reserved = {0, 0.49, 0.5}}}});
    CHECK_NOTHROW(rs::bulkhead{{.priorities = {.classes = 1}}});
}

TEST_CASE("priorities: the reserve is the limit times the shares above, rounded down as written in decimal",
          "[priorities]") {
    const rs::detail::priority_table t{rs::priority_classes{.classes = 3, .reserved = {0, 0.29, 0.1}}};
    CHECK(t.keep(0, 100) == 39); // 0.29 + 0.1 of 100, not 38.99999...
    CHECK(t.keep(1, 100) == 10);
    CHECK(t.keep(2, 100) == 0);
    CHECK(t.keep(0, 2) == 0);
    CHECK(t.keep(0, 3) == 1);
    CHECK(t.keep(1, 1) == 0);
    const rs::detail::priority_table off;
    CHECK_FALSE(off.enabled());
}

TEST_CASE("priorities: reconfigure puts priorities in force for the next admission, and a waiter keeps its "
          "class",
          "[priorities]") {
    SECTION("bulkhead") {
        // Two slots; from 10 ms on, one is kept for class 1.
        rs::testing::simulation sim;
        rs::bulkhead bh{{.max_concurrent_calls = 2, .queue_limit = 10}, sim.clock()};
        journal j;
        spawn_all(sim, bh, j,
                  {{.id = 1, .cls = 0, .hold = 100ms},
                   {.id = 2, .arrive = 20ms, .cls = 0, .hold = 10ms},    // one taken: waits
                   {.id = 3, .arrive = 30ms, .cls = 1, .hold = 100ms}}); // passes it
        sim.spawn(
            [](rs::testing::simulation& s, rs::bulkhead<rs::testing::virtual_clock>& b) -> rs::task<void> {
                co_await s.sleep_for(10ms);
                b.reconfigure({.max_concurrent_calls = 2,
                               .queue_limit = 10,
                               .priorities = {.classes = 2, .reserved = {0, 0.5}}});
            }(sim, bh));
        sim.run_all();
        CHECK(j.started_at(3) == 30ms);
        CHECK(j.started_at(2) == 130ms); // at 100 ms, 3 still holds the one slot class 0 may fill
        CHECK(bh.options().priorities.classes == 2);
    }
    SECTION("rate limiter") {
        // Four tokens, ten a second; from 10 ms on, two are kept for class 1.
        rs::testing::simulation sim;
        rs::rate_limiter rl{{.token_limit = 4, .tokens_per_second = 10, .queue_limit = 10}, sim.clock()};
        journal j;
        spawn_all(sim, rl, j,
                  {{.id = 1, .cls = 0},
                   {.id = 2, .arrive = 20ms, .cls = 0},   // 3.2 tokens: takes one
                   {.id = 3, .arrive = 20ms, .cls = 0},   // 2.2: waits for three
                   {.id = 4, .arrive = 50ms, .cls = 1}}); // 2.5: takes one, so three only at 200 ms
        sim.spawn([](rs::testing::simulation& s,
                     rs::rate_limiter<rs::testing::virtual_clock>& limiter) -> rs::task<void> {
            co_await s.sleep_for(10ms);
            limiter.reconfigure({.token_limit = 4,
                                 .tokens_per_second = 10,
                                 .queue_limit = 10,
                                 .priorities = {.classes = 2, .reserved = {0, 0.5}}});
        }(sim, rl));
        sim.run_all();
        CHECK(j.started_at(2) == 20ms);
        CHECK(j.started_at(4) == 50ms);
        CHECK(j.started_at(3) == 200ms);
        CHECK_THROWS_AS(
            rl.reconfigure({.token_limit = 4, .tokens_per_second = 10, .priorities = {.classes = 9}}),
            std::invalid_argument);
        CHECK(rl.options().priorities.classes == 2); // the options in force stay
    }
}

// ---------------------------------------------------------------------------------------------------------
// Reference models on seeded random scenarios
//
// The models (tests/ranked_models.hpp), written from priority.hpp: a call of class k takes a slot (a permit) when nobody of
// class k or above waits and, after it, the classes above keep floor(limit * their shares); else it
// queues, highest class first, in arrival order within a class; a newcomer that finds the queue full
// displaces the last waiter of the lowest class if that class is below its own, else is refused. A
// freed slot goes to the front waiter when its class may take it. The limiter's front waiter takes its
// permit as soon as its class may (at `available_at(now, keep)`); the deadlines of the waiters behind
// it are watched too. Shares are drawn in quarters, so the models count reserves in whole numbers.
// Instants keep to the grids of tests/models.hpp (arrivals at 1, stops at 250, deadlines at 501 mod
// 1000 ns).

TEST_CASE("model: a bulkhead with priorities admits, queues, displaces and refuses as its model",
          "[priorities][model]") {
    rm::run_scenarios(400, [](rm::chooser& pick) { return check_ranked_bulkhead(pick); });
}

TEST_CASE("model: a token bucket with priorities admits, queues, displaces and refuses as its model",
          "[priorities][model]") {
    rm::run_scenarios(400, [](rm::chooser& pick) { return check_ranked_token_bucket(pick); });
}

TEST_CASE("model: a sliding window with priorities admits, queues, displaces and refuses as its model",
          "[priorities][model]") {
    rm::run_scenarios(400, [](rm::chooser& pick) { return check_ranked_sliding_window(pick); });
}

// ---------------------------------------------------------------------------------------------------------
// Threads

namespace {

struct shared_tally {
    std::atomic<int> running{0}, peak{0};
    resilience_tests::call_tally<rs::bulkhead_rejected_error> calls;
    explicit shared_tally(std::size_t n) : calls(n) {}
};

void raise_to(std::atomic<int>& peak, int v) {
    int seen = peak.load();
    while (v > seen && !peak.compare_exchange_weak(seen, v)) {
    }
}

template <class Policy, class Tally>
rs::task<void> threaded_call(const Policy& p, Tally& t, std::size_t id, resilience::stop_token stop) {
    auto action = [&t, id]() -> rs::task<int> {
        raise_to(t.peak, ++t.running);
        for (std::size_t i = 0; i < id % 3; ++i)
            co_await resilience_tests::yield_now{};
        --t.running;
        co_return 1;
    };
    auto r =
        co_await p.execute_outcome(std::move(action), with_class(static_cast<int>(id % 3), std::move(stop)));
    t.calls.record(id, r);
}

} // namespace

TEST_CASE("priorities: a bulkhead with priorities shared by loops on four threads never runs more than its "
          "limit, and every call ends once",
          "[priorities][concurrency]") {
    const std::size_t queue_limit = GENERATE(std::size_t{0}, std::size_t{3}, std::size_t{100000});
    constexpr std::size_t loops = 4, per_loop = 2000, total = loops * per_loop;
    rs::bulkhead bh{{.max_concurrent_calls = 3,
                     .queue_limit = queue_limit,
                     .priorities = {.classes = 3, .reserved = {0, 0.34, 0.34}}}};
    shared_tally t{total};
    std::vector<resilience::stop_source> stops(total);
    rs::event_loop l0, l1, l2, l3;
    rs::event_loop* all[loops] = {&l0, &l1, &l2, &l3};
    for (std::size_t i = 0; i < per_loop; ++i)
        for (std::size_t l = 0; l < loops; ++l) {
            const std::size_t id = l * per_loop + i;
            all[l]->spawn(threaded_call(bh, t, id, stops[id].get_token()));
            if (id % 7 == 0) // stopped from another loop, at an unpredictable moment
                all[(l + 1) % loops]->spawn(
                    resilience_tests::stop_after_yields(stops[id], static_cast<int>(i % 3)));
        }
    resilience_tests::run_on_threads(l0, l1, l2, l3);

    CHECK(t.peak.load() <= 3);
    CHECK(t.running.load() == 0);
    CHECK(t.calls.values + t.calls.refused + t.calls.cancelled == static_cast<int>(total));
    CHECK(t.calls.values > 0);
    if (queue_limit < total)
        CHECK(t.calls.refused > 0);
    CHECK(t.calls.failed == 0);
    REQUIRE(t.calls.completions.exactly_once() == total);
    CHECK(bh.in_flight() == 0);
    CHECK(bh.queued() == 0);
}

TEST_CASE("priorities: a rate limiter with priorities shared by loops on four threads grants at most its "
          "tokens, and every call ends once",
          "[priorities][concurrency]") {
    // A bucket that barely refills: the first tokens go at once, the waiters take turns watching the
    // clock, lose them to newcomers of higher classes, are displaced or time out.
    struct limited_tally {
        std::atomic<int> running{0}, peak{0};
        resilience_tests::call_tally<rs::rate_limited_error> calls;
        explicit limited_tally(std::size_t n) : calls(n) {}
    };
    constexpr std::size_t loops = 4, per_loop = 500, total = loops * per_loop, tokens = 40;
    rs::rate_limiter rl{{.token_limit = tokens,
                         .tokens_per_second = 1e-6,
                         .queue_limit = 16,
                         .queue_timeout = 2ms,
                         .priorities = {.classes = 3, .reserved = {0, 0.25, 0.25}}}};
    limited_tally t{total};
    std::vector<resilience::stop_source> stops(total);
    rs::event_loop l0, l1, l2, l3;
    rs::event_loop* all[loops] = {&l0, &l1, &l2, &l3};
    for (std::size_t i = 0; i < per_loop; ++i)
        for (std::size_t l = 0; l < loops; ++l) {
            const std::size_t id = l * per_loop + i;
            all[l]->spawn(threaded_call(rl, t, id, stops[id].get_token()));
            if (id % 5 == 0)
                all[(l + 2) % loops]->spawn(
                    resilience_tests::stop_after_yields(stops[id], static_cast<int>(i % 4)));
        }
    resilience_tests::run_on_threads(l0, l1, l2, l3);

    CHECK(t.calls.values <= static_cast<int>(tokens));
    CHECK(t.calls.values >= 1);
    CHECK(t.calls.values + t.calls.refused + t.calls.cancelled == static_cast<int>(total));
    CHECK(t.calls.refused > 0);
    CHECK(t.calls.failed == 0);
    REQUIRE(t.calls.completions.exactly_once() == total);
    CHECK(rl.queued() == 0);
}

} // namespace test_priorities
