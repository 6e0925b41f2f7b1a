// SPDX-License-Identifier: MIT
// Tests of the bulkhead's queue disciplines (queue_discipline.hpp): FIFO unchanged, CoDel shedding at
// the instants its rule gives, adaptive LIFO's order, priorities, the `shed` refusal, invalid options,
// stops and reconfiguration; and the bulkhead against a reference model on seeded random scenarios.

#include "catch.hpp"
#include "model_scenarios.hpp"
#include "models.hpp"
#include "support.hpp"

#include <resilience/any_policy.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/priority.hpp>
#include <resilience/queue_discipline.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/telemetry.hpp>
#include <resilience/testing/simulation.hpp>

#include <algorithm>
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

namespace {

rs::context with_class(std::optional<int> cls, resilience::stop_token stop = {}) {
    rs::context ctx{std::move(stop)};
    if (cls)
        ctx.set_property(rs::priority, *cls);
    return ctx;
}

// How a call ended: "value", "rejected shed" (or another reason), "cancelled".
std::string how(const rs::outcome<int>& r) {
    if (r.has_value())
        return "value";
    if (auto* e = r.error().as<rs::bulkhead_rejected_error>())
        return "rejected " + rm::reason_name(e->reason());
    if (rs::is_cancellation(r.error()))
        return "cancelled";
    return "failure";
}

struct call {
    int id = 0;
    nanoseconds arrive{};
    nanoseconds hold = 10ms;
    std::optional<int> cls{};
    resilience::stop_token stop{};
};

struct journal {
    std::vector<std::pair<int, nanoseconds>> started;
    std::map<int, std::pair<nanoseconds, std::string>> ended;

    std::vector<int> start_order() const { return resilience_tests::ids_of(started); }
    nanoseconds started_at(int id) const { return resilience_tests::instant_of(started, id); }
};

using ended = std::pair<nanoseconds, std::string>;

rs::task<void> client(rs::testing::simulation& sim, const rs::bulkhead<rs::testing::virtual_clock>& bh,
                      journal& j, call c) {
    if (c.arrive > sim.now())
        co_await sim.sleep_for(c.arrive - sim.now());
    // Named, then passed as an lvalue (docs/core.md#compiler-notes).
    auto action = [&sim, &j, c](resilience::stop_token st) -> rs::task<int> {
        j.started.emplace_back(c.id, sim.now());
        co_await sim.sleep_for(c.hold, st);
        co_return c.id;
    };
    auto r = co_await bh.execute_outcome(action, with_class(c.cls, c.stop));
    j.ended[c.id] = {sim.now(), how(r)};
}

// One slot, held by call 0 from 0 to 200 ms, then by each waiter for 10 ms; calls 1 to 20 queue at
// 1 ms to 20 ms. The first hand-over, at 200 ms, finds the oldest waiter 199 ms old: the queue
// stands from then, and is overloaded from 300 ms. `more` joins them.
void standing_queue(rs::testing::simulation& sim, const rs::bulkhead<rs::testing::virtual_clock>& bh,
                    journal& j, const std::vector<call>& more = {}) {
    sim.spawn(client(sim, bh, j, {.id = 0, .hold = 200ms}));
    for (int i = 1; i <= 20; ++i)
        sim.spawn(client(sim, bh, j, {.id = i, .arrive = std::chrono::milliseconds{i}}));
    for (const call& c : more)
        sim.spawn(client(sim, bh, j, c));
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
    standing_queue(sim, bh, j, {{.id = 21, .arrive = 296ms}});
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
    standing_queue(sim, bh, j,
                   {{.id = 21, .arrive = 296ms},
                    {.id = 22, .arrive = 306ms},
                    {.id = 23, .arrive = 307ms},
                    {.id = 24, .arrive = 308ms},
                    {.id = 25, .arrive = 309ms}});
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
                   {{.id = 21, .arrive = 296ms},
                    {.id = 22, .arrive = 297ms},
                    {.id = 23, .arrive = 298ms},
                    {.id = 24, .arrive = 305ms},
                    {.id = 25, .arrive = 308ms},
                    // After the queue emptied at 320 ms: nothing stands, arrival order again.
                    {.id = 26, .arrive = 400ms},
                    {.id = 27, .arrive = 401ms},
                    {.id = 28, .arrive = 402ms}});
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
        sim.spawn(client(sim, bh, j, {.id = 0, .hold = 200ms, .cls = 1}));
        for (int i = 1; i <= 20; ++i)
            sim.spawn(client(sim, bh, j, {.id = i, .arrive = std::chrono::milliseconds{i}, .cls = 1}));
        sim.spawn(client(sim, bh, j, {.id = 100, .arrive = 5ms, .cls = 0, .stop = low.get_token()}));
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
        sim.spawn(client(sim, bh, j, {.id = 2, .arrive = 10ms, .stop = src.get_token()}));
        sim.spawn(client(sim, bh, j, {.id = 3, .arrive = 20ms}));
        sim.spawn(resilience_tests::stop_at(sim, src, 50ms, bh, queued_after));
        sim.run_all();
        CHECK(j.ended[2] == ended{50ms, "cancelled"});
        CHECK(queued_after == 1);
        CHECK(j.started_at(2) == nanoseconds{-1});
        CHECK(j.ended[3] == ended{210ms, "value"}); // the first hand-over only starts a standing queue
    }
}

TEST_CASE("queue discipline: reconfigure puts a discipline in force for the next hand-over; waiters queued "
          "before it are served in their order",
          "[queue_discipline]") {
    rs::testing::simulation sim;
    rs::bulkhead bh = one_slot(sim, rs::fifo{});
    journal j;
    // Calls 1 to 5 queue under fifo (keeping no instant), 11 to 30 under codel.
    sim.spawn(client(sim, bh, j, {.id = 0, .hold = 200ms}));
    for (int i = 1; i <= 5; ++i)
        sim.spawn(client(sim, bh, j, {.id = i, .arrive = std::chrono::milliseconds{i}}));
    for (int i = 11; i <= 30; ++i)
        sim.spawn(client(sim, bh, j, {.id = i, .arrive = std::chrono::milliseconds{40 + i}}));
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
// A reference model on seeded random scenarios
//
// Written from docs/bulkhead.md, "Queue disciplines": a call of class k takes a free slot when nobody
// of class k or above waits; else it queues (highest class first, in arrival order within a class),
// displacing the last waiter of the lowest class below its own from a full queue, or is refused. A
// freed slot is handed over to the highest class waiting. Under codel or adaptive lifo, each hand-over
// samples that class's oldest waiter's wait: at most the target ends the standing queue; above it, the
// queue stands from the first such sample and is overloaded from that instant plus the interval. While
// overloaded and no lower class waits, the class's waiters older than the target are shed; adaptive
// lifo then serves the newest. A class that empties stands no more. Instants keep to the grids of
// tests/models.hpp (arrivals at 1, stops at 250, deadlines at 501 mod 1000 ns; holds, targets and
// intervals whole microseconds).

namespace {

struct dcall {
    rm::ns arrive = 1;
    rm::ns hold = 0;
    std::optional<rm::ns> stop_at{};
    std::optional<int> cls{};
};

struct setup {
    rm::ns slots = 1;
    std::size_t queue_limit = 0;
    std::optional<rm::ns> queue_timeout{};
    int classes = 1;
    int kind = 0; // 0 fifo, 1 codel, 2 adaptive lifo
    rm::ns target = 0, interval = 0;
    bool listener = false; // the waits are stamped for the listener too

    rs::queue_discipline discipline() const {
        if (kind == 1)
            return rs::codel{.target = nanoseconds{target}, .interval = nanoseconds{interval}};
        if (kind == 2)
            return rs::adaptive_lifo{.target = nanoseconds{target}, .interval = nanoseconds{interval}};
        return rs::fifo{};
    }
    int class_of(const dcall& c) const { return c.cls ? std::clamp(*c.cls, 0, classes - 1) : 0; }
    std::string text() const {
        std::ostringstream out;
        out << "max_concurrent_calls=" << slots << " queue_limit=" << queue_limit
            << " queue_timeout=" << (queue_timeout ? std::to_string(*queue_timeout) + "ns" : "none")
            << " classes=" << classes << " discipline="
            << (kind == 0   ? "fifo"
                : kind == 1 ? "codel"
                            : "adaptive_lifo")
            << " target=" << target << "ns interval=" << interval << "ns listener=" << listener;
        return out.str();
    }
};

struct model_waiter {
    int call;
    int rank;
    rm::ns arrived;
    rm::ns deadline;
};

std::vector<rm::event> model(const setup& s, const std::vector<dcall>& calls) {
    std::vector<rm::event> out;
    std::vector<model_waiter> queue; // highest class first, in arrival order within a class
    struct standing {
        bool on = false;
        rm::ns overloaded_from = 0;
    };
    std::vector<standing> stands(static_cast<std::size_t>(s.classes));
    std::vector<std::pair<rm::ns, int>> running; // (ends at, call), in admission order
    rm::ns busy = 0;
    const rm::ns forever = INT64_MAX;
    const auto count = [&](int k) {
        return std::count_if(queue.begin(), queue.end(), [k](const model_waiter& w) { return w.rank == k; });
    };
    const auto leave = [&](std::vector<model_waiter>::iterator it) {
        const int k = it->rank;
        queue.erase(it);
        if (count(k) == 0)
            stands[static_cast<std::size_t>(k)].on = false;
    };
    const auto admit = [&](int id, rm::ns now) {
        ++busy;
        out.push_back({id, now, "admitted"});
        running.emplace_back(now + calls[static_cast<std::size_t>(id)].hold, id);
    };
    const auto hand_over = [&](rm::ns now) {
        while (!queue.empty() && busy < s.slots) {
            const int k = queue.front().rank;
            bool overloaded = false;
            if (s.kind != 0) {
                standing& st = stands[static_cast<std::size_t>(k)];
                if (now - queue.front().arrived <= s.target) {
                    st.on = false;
                } else {
                    if (!st.on)
                        st = {true, now + s.interval};
                    overloaded = now >= st.overloaded_from;
                }
            }
            if (overloaded && count(k) == static_cast<long>(queue.size()))
                while (!queue.empty() && now - queue.front().arrived > s.target) {
                    out.push_back({queue.front().call, now, "bulkhead_rejected", -1, "shed"});
                    leave(queue.begin());
                }
            if (count(k) == 0)
                continue;
            auto pick = queue.begin();
            if (overloaded && s.kind == 2)
                pick = std::find_if(queue.begin(), queue.end(),
                                    [k](const model_waiter& w) { return w.rank < k; }) -
                       1;
            const int id = pick->call;
            leave(pick);
            admit(id, now);
            return;
        }
    };
    const rm::call_instants instants = rm::instants_of(calls);
    std::size_t a = 0, st = 0;
    for (;;) {
        rm::ns now = forever;
        if (a < instants.arrivals.size())
            now = std::min(now, instants.arrivals[a].first);
        if (st < instants.stops.size())
            now = std::min(now, instants.stops[st].first);
        for (auto& r : running)
            now = std::min(now, r.first);
        for (auto& w : queue)
            now = std::min(now, w.deadline);
        if (now == forever)
            break;
        for (; a < instants.arrivals.size() && instants.arrivals[a].first == now; ++a) {
            const int id = instants.arrivals[a].second;
            const int k = s.class_of(calls[static_cast<std::size_t>(id)]);
            const model_waiter w{id, k, now, s.queue_timeout ? now + *s.queue_timeout : forever};
            const bool above =
                std::any_of(queue.begin(), queue.end(), [k](const model_waiter& q) { return q.rank >= k; });
            if (!above && busy < s.slots) {
                admit(id, now);
                continue;
            }
            if (queue.size() >= s.queue_limit) {
                if (queue.empty() || queue.back().rank >= k) {
                    out.push_back({id, now, "bulkhead_rejected", -1,
                                   s.queue_limit == 0 ? "no_capacity" : "queue_full"});
                    continue;
                }
                out.push_back({queue.back().call, now, "bulkhead_rejected", -1, "queue_full"});
                leave(queue.end() - 1);
            }
            queue.insert(
                std::find_if(queue.begin(), queue.end(), [k](const model_waiter& q) { return q.rank < k; }),
                w);
        }
        for (; st < instants.stops.size() && instants.stops[st].first == now; ++st) {
            const int id = instants.stops[st].second;
            auto it = std::find_if(queue.begin(), queue.end(),
                                   [id](const model_waiter& w) { return w.call == id; });
            if (it != queue.end()) {
                out.push_back({id, now, "cancelled"});
                leave(it);
            }
        }
        for (std::size_t i = 0; i < running.size();) {
            if (running[i].first != now) {
                ++i;
                continue;
            }
            out.push_back({running[i].second, now, "value"});
            running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
            --busy;
            hand_over(now);
        }
        for (auto it = queue.begin(); it != queue.end();) {
            if (it->deadline == now) {
                out.push_back({it->call, now, "bulkhead_rejected", -1, "queue_timeout"});
                const auto at = it - queue.begin();
                leave(it);
                it = queue.begin() + at;
            } else {
                ++it;
            }
        }
    }
    return out;
}

template <class Policy>
std::vector<rm::event> play(rs::testing::simulation& sim, const Policy& policy,
                            const std::vector<dcall>& calls) {
    return rm::run_calls(
        sim, calls,
        [&](std::vector<rm::event>& out, int id, const dcall& c,
            resilience::stop_token stop) -> rs::task<void> {
            auto action = [&out, &sim, id, hold = c.hold]() -> rs::task<int> {
                out.push_back({id, sim.now().count(), "admitted"});
                co_await sim.sleep_for(nanoseconds{hold}); // ignores stop: it holds its slot
                co_return id;
            };
            const auto r = co_await policy.execute_outcome(std::move(action), with_class(c.cls, stop));
            const rm::ns now = sim.now().count();
            if (r.has_value())
                out.push_back({id, now, "value"});
            else if (auto* e = r.error().template as<rs::bulkhead_rejected_error>())
                out.push_back({id, now, "bulkhead_rejected", -1, rm::reason_name(e->reason())});
            else if (rs::is_cancellation(r.error()))
                out.push_back({id, now, "cancelled"});
            else
                out.push_back({id, now, "unexpected failure"});
        });
}

rm::comparison check(rm::chooser& pick) {
    setup s;
    s.slots = pick.between(1, 3);
    s.queue_limit = pick.coin(20) ? rs::unbounded_queue : static_cast<std::size_t>(pick.between(0, 8));
    if (pick.coin(30))
        s.queue_timeout = pick.between(0, 300) * 1'000 + 500;
    s.classes = static_cast<int>(pick.between(1, 3));
    s.kind = static_cast<int>(pick.between(0, 2));
    s.target = pick.between(1, 40) * 1'000;
    s.interval = pick.between(1, 150) * 1'000;
    s.listener = pick.coin(30);
    std::vector<dcall> calls(static_cast<std::size_t>(pick.between(1, 24)));
    rm::ns t = 0;
    for (dcall& c : calls) {
        if (pick.coin(70))
            t += pick.between(0, 40) * 1'000;
        c.arrive = t + 1;
        c.hold = pick.between(1, 100) * 1'000;
        if (pick.coin(10))
            c.stop_at = c.arrive + pick.between(0, 200) * 1'000 + 249;
        if (pick.coin(80))
            c.cls = static_cast<int>(pick.between(0, s.classes - 1));
    }
    const bool through_any = pick.coin(30);
    rm::comparison c;
    c.setup = s.text() + (through_any ? " route=any_policy" : " route=direct");
    c.expected = rm::sorted(model(s, calls));
    rs::testing::simulation sim;
    std::vector<rm::event> heard;
    rs::bulkhead_options o{.max_concurrent_calls = static_cast<std::size_t>(s.slots),
                           .queue_limit = s.queue_limit,
                           .queue_timeout = rm::as_duration(s.queue_timeout),
                           .priorities = {.classes = static_cast<std::size_t>(s.classes)},
                           .queue_discipline = s.discipline()};
    if (s.listener)
        o.telemetry = rm::recorder(heard);
    const rs::bulkhead policy{std::move(o), sim.clock()};
    c.actual =
        rm::sorted(through_any ? play(sim, rs::any_policy<int>{policy}, calls) : play(sim, policy, calls));
    return c;
}

} // namespace

TEST_CASE("model: a bulkhead with a queue discipline admits, sheds, serves and refuses as its model",
          "[queue_discipline][model]") {
    rm::run_scenarios(600, check);
}

} // namespace test_queue_discipline
