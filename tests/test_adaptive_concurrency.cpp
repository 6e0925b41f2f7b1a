// SPDX-License-Identifier: MIT
// Tests of adaptive concurrency: rs::bulkhead with `adapt = rs::aimd{...}` or `rs::gradient{...}`, the two
// algorithms on their own, a seeded comparison with a reference model of AIMD, and threads.

#include "catch.hpp"
#include "support.hpp"

#include <resilience/adaptive_limit.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/random.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace test_adaptive_concurrency {

namespace rs = resilience;
using namespace std::chrono_literals;
using std::chrono::nanoseconds;
using vclock = rs::testing::virtual_clock;
using resilience_tests::describe;
using resilience_tests::invalid_argument_message;
using resilience_tests::yield_now;

namespace {

struct overloaded : std::runtime_error {
    overloaded() : std::runtime_error("overloaded") {}
};

// A dependency that serves `capacity` calls at once in 10 ms each. Beyond that it either fails
// (`overloaded`, after the same 10 ms), or, with `queues`, slows down in proportion: a call that
// finds n > capacity calls in progress (itself included) takes 10 ms * n / capacity.
struct dependency {
    rs::testing::simulation& sim;
    std::size_t capacity;
    bool queues = false;
    std::size_t running = 0;
    std::size_t peak = 0;
    int calls = 0, failures = 0;

    rs::task<int> call() {
        const std::size_t here = ++running;
        peak = std::max(peak, here);
        ++calls;
        struct leave {
            std::size_t& running;
            ~leave() { --running; }
        } guard{running};
        nanoseconds latency = 10ms;
        if (queues && here > capacity)
            latency = nanoseconds{10ms} * static_cast<long>(here) / static_cast<long>(capacity);
        co_await sim.sleep_for(latency);
        if (!queues && here > capacity) {
            ++failures;
            throw overloaded{};
        }
        co_return 1;
    }
};

// Calls the dependency through `bh` again and again until `until`.
rs::task<void> busy_client(rs::testing::simulation& sim, rs::bulkhead<vclock>& bh, dependency& dep,
                           nanoseconds until) {
    while (sim.now() < until) {
        auto action = [&dep]() { return dep.call(); };
        (void)co_await bh.execute_outcome(std::move(action));
    }
}

// Calls the dependency through `bh`, pausing `pause` between calls, until `until`.
rs::task<void> idle_client(rs::testing::simulation& sim, rs::bulkhead<vclock>& bh, dependency& dep,
                           nanoseconds pause, nanoseconds until) {
    while (sim.now() < until) {
        auto action = [&dep]() { return dep.call(); };
        (void)co_await bh.execute_outcome(std::move(action));
        co_await sim.sleep_for(pause);
    }
}

// Writes down `bh.limit()` every `every`, from `every` to `until`.
rs::task<void> sample_limit(rs::testing::simulation& sim, rs::bulkhead<vclock>& bh, nanoseconds every,
                            nanoseconds until, std::vector<std::size_t>& out) {
    while (sim.now() + every <= until) {
        co_await sim.sleep_for(every);
        out.push_back(bh.limit());
    }
}

// Sets `dep.capacity` to `capacity` at the instant `at`.
rs::task<void> set_capacity_at(rs::testing::simulation& sim, dependency& dep, nanoseconds at,
                               std::size_t capacity) {
    co_await sim.sleep_for(at - sim.now());
    dep.capacity = capacity;
}

// What happened to one call of a scripted scenario.
struct call_record {
    nanoseconds started{-1};
    nanoseconds ended{-1};
    std::string how;
};

struct scripted_call {
    int id = 0;
    nanoseconds arrive{};
    nanoseconds hold{};
    bool fail = false;
    resilience::stop_token stop{};
};

rs::task<void> scripted(rs::testing::simulation& sim, rs::bulkhead<vclock>& bh,
                        std::map<int, call_record>& log, scripted_call c) {
    if (c.arrive > sim.now())
        co_await sim.sleep_for(c.arrive - sim.now());
    auto action = [&sim, &log, c](resilience::stop_token st) -> rs::task<int> {
        log[c.id].started = sim.now();
        co_await sim.sleep_for(c.hold, st);
        if (st.stop_requested())
            throw rs::cancelled_error{};
        if (c.fail)
            throw overloaded{};
        co_return c.id;
    };
    auto r = co_await bh.execute_outcome(action, c.stop); // an lvalue: docs/core.md#compiler-notes
    log[c.id].ended = sim.now();
    log[c.id].how = describe(r);
}

// Writes down (instant, limit) whenever the limit differs from the last one written, checking every 1 ms.
rs::task<void> watch_limit(rs::testing::simulation& sim, rs::bulkhead<vclock>& bh, nanoseconds until,
                           std::vector<std::pair<nanoseconds, std::size_t>>& changes) {
    std::size_t last = bh.limit();
    while (sim.now() < until) {
        co_await sim.sleep_for(1ms);
        co_await yield_now{}; // after whatever else happens at this instant
        if (bh.limit() != last) {
            last = bh.limit();
            changes.emplace_back(sim.now(), last);
        }
    }
}

} // namespace

// ---------------------------------------------------------------------------------------------------------
// Options

TEST_CASE("adaptive bulkhead: invalid adapt options are refused at construction, naming the field and the "
          "value",
          "[bulkhead][adaptive]") {
    using opts = rs::bulkhead_options;
    const auto message = [](opts o) {
        return invalid_argument_message([&] { rs::bulkhead b{std::move(o)}; });
    };
    CHECK(message(opts{.max_concurrent_calls = 1, .adapt = rs::aimd{.min = 0}}) ==
          "resilience::bulkhead: adapt.min must be positive, got 0");
    CHECK(message(opts{.max_concurrent_calls = 5, .adapt = rs::aimd{.min = 5, .max = 3}}) ==
          "resilience::bulkhead: adapt.max must be at least adapt.min (5), got 3");
    CHECK(message(opts{.max_concurrent_calls = 200, .adapt = rs::aimd{.min = 5, .max = 100}}) ==
          "resilience::bulkhead: max_concurrent_calls, the starting limit, must be within [adapt.min, "
          "adapt.max] = [5, 100], got 200");
    CHECK(message(opts{.max_concurrent_calls = 2, .adapt = rs::gradient{.min = 5, .max = 100}}) ==
          "resilience::bulkhead: max_concurrent_calls, the starting limit, must be within [adapt.min, "
          "adapt.max] = [5, 100], got 2");
    CHECK(message(opts{.adapt = rs::aimd{.decrease = 1.0}}) ==
          "resilience::bulkhead: adapt.decrease must be in (0, 1), got 1");
    CHECK(message(opts{.adapt = rs::aimd{.decrease = 0.0}}) ==
          "resilience::bulkhead: adapt.decrease must be in (0, 1), got 0");
    CHECK(message(opts{.adapt = rs::aimd{.decrease = std::numeric_limits<double>::quiet_NaN()}}) ==
          "resilience::bulkhead: adapt.decrease must be in (0, 1), got nan");
    CHECK(message(opts{.adapt = rs::aimd{.slow_call_duration = 0ns}}) ==
          "resilience::bulkhead: adapt.slow_call_duration must be positive, got 0ns");
    CHECK(message(opts{.adapt = rs::aimd{.slow_call_duration = -1ms}}) ==
          "resilience::bulkhead: adapt.slow_call_duration must be positive, got -1000000ns");
    CHECK(message(opts{.adapt = rs::gradient{.short_samples = 0}}) ==
          "resilience::bulkhead: adapt.short_samples must be positive, got 0");
    CHECK(message(opts{.adapt = rs::gradient{.long_samples = 0}}) ==
          "resilience::bulkhead: adapt.long_samples must be positive, got 0");
    CHECK(message(opts{.adapt = rs::gradient{.tolerance = 0.5}}) ==
          "resilience::bulkhead: adapt.tolerance must be finite and at least 1, got 0.5");
    CHECK(message(opts{.adapt = rs::gradient{.tolerance = std::numeric_limits<double>::infinity()}}) ==
          "resilience::bulkhead: adapt.tolerance must be finite and at least 1, got inf");
    CHECK(message(opts{.adapt = rs::gradient{.smoothing = 0.0}}) ==
          "resilience::bulkhead: adapt.smoothing must be in (0, 1], got 0");
    CHECK(message(opts{.adapt = rs::gradient{.smoothing = 1.5}}) ==
          "resilience::bulkhead: adapt.smoothing must be in (0, 1], got 1.5");
    CHECK(message(opts{.adapt = rs::gradient{.headroom = -1.0}}) ==
          "resilience::bulkhead: adapt.headroom must be finite and not negative, got -1");
    CHECK(message(opts{.name = "db", .max_concurrent_calls = 1, .adapt = rs::aimd{.min = 0}}) ==
          "resilience::bulkhead (db): adapt.min must be positive, got 0");

    // The defaults are valid, and so are the edges.
    CHECK_NOTHROW(rs::bulkhead{{.adapt = rs::aimd{}}});
    CHECK_NOTHROW(rs::bulkhead{{.adapt = rs::gradient{}}});
    CHECK_NOTHROW(rs::bulkhead{{.max_concurrent_calls = 1, .adapt = rs::aimd{.min = 1, .max = 1}}});
    CHECK_NOTHROW(rs::bulkhead{{.adapt = rs::aimd{.slow_call_duration = 1ns, .decrease = 0.001}}});
    CHECK_NOTHROW(rs::bulkhead{{.adapt = rs::gradient{.tolerance = 1.0, .smoothing = 1.0, .headroom = 0.0}}});
}

TEST_CASE("adaptive bulkhead: limit() is max_concurrent_calls to begin with, and stays it without adapt",
          "[bulkhead][adaptive]") {
    rs::testing::simulation sim;
    rs::bulkhead fixed{{.max_concurrent_calls = 7}, sim.clock()};
    rs::bulkhead adaptive{{.max_concurrent_calls = 7, .adapt = rs::aimd{}}, sim.clock()};
    CHECK(fixed.limit() == 7);
    CHECK(adaptive.limit() == 7);
    CHECK(std::holds_alternative<std::monostate>(fixed.options().adapt));
    CHECK(std::holds_alternative<rs::aimd>(adaptive.options().adapt));
    static_assert(noexcept(fixed.limit()));

    // Failures do not move a fixed limit.
    rs::bulkhead queued{{.max_concurrent_calls = 7, .queue_limit = rs::unbounded_queue}, sim.clock()};
    dependency dep{sim, 3};
    for (int i = 0; i < 20; ++i)
        sim.spawn(busy_client(sim, queued, dep, 1s));
    sim.run_all();
    CHECK(dep.failures > 0);
    CHECK(queued.limit() == 7);
}

// ---------------------------------------------------------------------------------------------------------
// AIMD in a bulkhead, on virtual time

TEST_CASE("aimd: the limit rises toward what the dependency serves, then falls when that drops",
          "[bulkhead][adaptive]") {
    // 30 clients call without pause, so there is always a queue: the limit is what holds them back.
    // The dependency serves 10 calls at once until 20 s, then 5; a call beyond that fails.
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 2,
                     .queue_limit = rs::unbounded_queue,
                     .adapt = rs::aimd{.min = 1, .max = 50}},
                    sim.clock()};
    dependency dep{sim, 10};
    for (int i = 0; i < 30; ++i)
        sim.spawn(busy_client(sim, bh, dep, 40s));
    sim.spawn(set_capacity_at(sim, dep, 20s, 5));
    std::vector<std::size_t> every_second;
    sim.spawn(sample_limit(sim, bh, 1s, 40s, every_second));
    std::vector<std::pair<nanoseconds, std::size_t>> changes;
    sim.spawn(watch_limit(sim, bh, 40s, changes));
    sim.run_all();

    // Every call lasts 10 ms and every slot is busy, so a limit's worth of successes takes 10 ms:
    // the limit grows by one every 10 ms until 11 calls at once meet the dependency's 10, and the
    // failure of the eleventh takes it to 9 (11 x 0.9, rounded down).
    REQUIRE(changes.size() >= 10);
    using change = std::pair<nanoseconds, std::size_t>;
    CHECK(std::vector<change>(changes.begin(), changes.begin() + 10) == std::vector<change>{{10ms, 3},
                                                                                            {20ms, 4},
                                                                                            {30ms, 5},
                                                                                            {40ms, 6},
                                                                                            {50ms, 7},
                                                                                            {60ms, 8},
                                                                                            {70ms, 9},
                                                                                            {80ms, 10},
                                                                                            {90ms, 11},
                                                                                            {100ms, 9}});
    // From then on it saws just around the capacity: never above one over it, never below 9.
    const auto range_between = [&](nanoseconds from, nanoseconds to) {
        std::pair<std::size_t, std::size_t> r{1000, 0};
        for (const auto& [at, limit] : changes)
            if (at >= from && at < to)
                r = {std::min(r.first, limit), std::max(r.second, limit)};
        return r;
    };
    CHECK(range_between(100ms, 20s) == std::pair<std::size_t, std::size_t>{9, 11});
    // The capacity halves at 20 s: within 40 ms the limit is down to 5, and it saws at 5 and 6.
    CHECK(range_between(20s + 1ms, 20s + 40ms) == std::pair<std::size_t, std::size_t>{6, 8});
    CHECK(range_between(20s + 40ms, 40s) == std::pair<std::size_t, std::size_t>{5, 6});
    CHECK(every_second == std::vector<std::size_t>{10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10,
                                                   10, 10, 10, 10, 10, 10, 6,  6,  6,  6,  6,  6,  6,  6,
                                                   6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6});
    CHECK(dep.peak == 11);
}

TEST_CASE("adaptive bulkhead: under light load, with nothing waiting, the limit stays where it is",
          "[bulkhead][adaptive]") {
    // Three clients pausing 5 ms between 10 ms calls never fill 10 slots: nothing ever waits.
    const bool use_gradient = GENERATE(false, true);
    rs::testing::simulation sim;
    rs::adaptive_limit adapt = rs::aimd{.min = 1, .max = 50};
    if (use_gradient)
        adapt = rs::gradient{.min = 1, .max = 50, .short_samples = 5};
    rs::bulkhead bh{{.max_concurrent_calls = 10, .queue_limit = 10, .adapt = adapt}, sim.clock()};
    dependency dep{sim, 100};
    for (int i = 0; i < 3; ++i)
        sim.spawn(idle_client(sim, bh, dep, 5ms, 10s));
    std::vector<std::size_t> limits;
    sim.spawn(sample_limit(sim, bh, 1s, 10s, limits));
    sim.run_all();
    CHECK(dep.calls == 3 * 667); // a call every 15 ms for 10 s, for each client
    CHECK(limits == std::vector<std::size_t>(10, 10));
}

TEST_CASE("adaptive bulkhead: a smaller limit never cancels calls already admitted, and admits nobody "
          "until fewer than the new limit hold a slot",
          "[bulkhead][adaptive]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 4,
                     .queue_limit = 10,
                     .adapt = rs::aimd{.min = 1, .max = 10, .decrease = 0.5}},
                    sim.clock()};
    std::map<int, call_record> log;
    sim.spawn(scripted(sim, bh, log, {.id = 1, .hold = 10ms, .fail = true})); // halves the limit at 10 ms
    sim.spawn(scripted(sim, bh, log, {.id = 2, .hold = 100ms}));
    sim.spawn(scripted(sim, bh, log, {.id = 3, .hold = 150ms}));
    sim.spawn(scripted(sim, bh, log, {.id = 4, .hold = 200ms}));
    sim.spawn(scripted(sim, bh, log, {.id = 5, .arrive = 20ms, .hold = 10ms}));
    std::size_t limit_at_20 = 0, in_flight_at_20 = 0, queued_at_20 = 0, in_flight_at_120 = 0;
    auto observe = [&]() -> rs::task<void> {
        co_await sim.sleep_for(20ms);
        co_await yield_now{};
        limit_at_20 = bh.limit();
        in_flight_at_20 = bh.in_flight();
        queued_at_20 = bh.queued();
        co_await sim.sleep_for(100ms);
        in_flight_at_120 = bh.in_flight();
    };
    sim.spawn(observe());
    sim.run_all();

    CHECK(limit_at_20 == 2);
    CHECK(in_flight_at_20 == 3); // above the new limit: calls 2, 3 and 4 keep their slots...
    CHECK(queued_at_20 == 1);    // ...and call 5 waits
    CHECK(log[2].how == "value");
    CHECK(log[3].how == "value");
    CHECK(log[4].how == "value");
    CHECK(log[2].ended == 100ms);
    CHECK(in_flight_at_120 == 2);   // call 2's slot was given back, not handed on: 2 is the limit
    CHECK(log[5].started == 150ms); // call 3's was handed on: one below the limit
    CHECK(log[5].how == "value");
    CHECK(bh.limit() == 2); // the successes of calls admitted before the decrease do not count
    CHECK(bh.in_flight() == 0);
}

TEST_CASE("adaptive bulkhead: a larger limit hands its new slots to the oldest waiters at that instant",
          "[bulkhead][adaptive]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 10, .adapt = rs::aimd{.min = 1, .max = 3}},
                    sim.clock()};
    std::map<int, call_record> log;
    for (int id = 1; id <= 6; ++id)
        sim.spawn(scripted(sim, bh, log, {.id = id, .arrive = (id - 1) * 1ms, .hold = 10ms}));
    sim.run_all();
    // Call 1 succeeds at 10 ms with five waiting: one success is a limit's worth at 1, so the limit
    // becomes 2, and both slots go at once to the two oldest waiters. At 20 ms calls 2 and 3 succeed:
    // two successes at limit 2 make it 3, and three waiters are served, oldest first.
    CHECK(log[1].started == 0ms);
    CHECK(log[2].started == 10ms);
    CHECK(log[3].started == 10ms);
    CHECK(log[4].started == 20ms);
    CHECK(log[5].started == 20ms);
    CHECK(log[6].started == 20ms);
    CHECK(bh.limit() == 3); // and no further: max is 3
    for (int id = 1; id <= 6; ++id)
        CHECK(log[id].how == "value");
    CHECK(bh.in_flight() == 0);
    CHECK(bh.queued() == 0);
}

TEST_CASE("aimd: a call at least slow_call_duration long lowers the limit like a failure",
          "[bulkhead][adaptive]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 10, .adapt = rs::aimd{.slow_call_duration = 50ms}}, sim.clock()};
    std::map<int, call_record> log;
    sim.spawn(scripted(sim, bh, log, {.id = 1, .hold = 49ms}));
    sim.run_all();
    CHECK(bh.limit() == 10);
    sim.spawn(scripted(sim, bh, log, {.id = 2, .hold = 50ms}));
    sim.run_all();
    CHECK(log[2].how == "value"); // still returned as it was
    CHECK(bh.limit() == 9);
}

TEST_CASE("aimd: one decrease per round: calls admitted before the latest decrease do not lower it again",
          "[bulkhead][adaptive]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 16, .queue_limit = 10, .adapt = rs::aimd{.decrease = 0.5}},
                    sim.clock()};
    std::map<int, call_record> log;
    for (int id = 1; id <= 10; ++id) // ten calls fail together at 10..19 ms
        sim.spawn(scripted(sim, bh, log, {.id = id, .hold = 10ms + (id - 1) * 1ms, .fail = true}));
    sim.spawn(scripted(sim, bh, log, {.id = 11, .arrive = 15ms, .hold = 10ms, .fail = true}));
    std::vector<std::pair<nanoseconds, std::size_t>> changes;
    sim.spawn(watch_limit(sim, bh, 40ms, changes));
    sim.run_all();
    // Call 1's failure halves 16 to 8; calls 2..10, admitted before it, change nothing; call 11,
    // admitted after it, halves again.
    using change = std::pair<nanoseconds, std::size_t>;
    CHECK(changes == std::vector<change>{{10ms, 8}, {25ms, 4}});
}

TEST_CASE("aimd: which failures count: should_handle, by default every failure but cancellation and "
          "bulkhead refusals",
          "[bulkhead][adaptive]") {
    rs::testing::simulation sim;
    std::map<int, call_record> log;
    SECTION("a failure counts by default") {
        rs::bulkhead bh{{.max_concurrent_calls = 10, .adapt = rs::aimd{}}, sim.clock()};
        sim.spawn(scripted(sim, bh, log, {.id = 1, .hold = 10ms, .fail = true}));
        sim.run_all();
        CHECK(log[1].how == "failure");
        CHECK(bh.limit() == 9);
    }
    SECTION("a caller's stop, and the cancellation it brings, never count") {
        rs::bulkhead bh{{.max_concurrent_calls = 10, .adapt = rs::aimd{}}, sim.clock()};
        resilience::stop_source src;
        sim.spawn(scripted(sim, bh, log, {.id = 1, .hold = 100ms, .stop = src.get_token()}));
        sim.spawn(resilience_tests::stop_at(sim, src, 10ms));
        sim.run_all();
        CHECK(log[1].how == "cancelled");
        CHECK(bh.limit() == 10);
    }
    SECTION("an inner bulkhead's refusal never counts") {
        rs::bulkhead outer{{.max_concurrent_calls = 10, .adapt = rs::aimd{}}, sim.clock()};
        rs::bulkhead inner{{.max_concurrent_calls = 1}, sim.clock()};
        rs::pipeline p{outer, inner};
        auto slow = [&sim]() -> rs::task<int> {
            co_await sim.sleep_for(10ms);
            co_return 1;
        };
        auto hold = [](rs::task<rs::outcome<int>> t) -> rs::task<void> { (void)co_await std::move(t); };
        sim.spawn(hold(p.execute_outcome(slow))); // holds the inner slot for 10 ms
        sim.run_for(1ms);
        auto refused = sim.run(p.execute_outcome(slow));
        REQUIRE(refused.has_failure());
        CHECK(refused.error().is<rs::bulkhead_rejected_error>());
        sim.run_all();
        CHECK(outer.limit() == 10);
    }
    SECTION("a failure classifier decides which failures count; a declined one is not recorded at all") {
        rs::bulkhead bh{
            {.max_concurrent_calls = 10,
             .adapt = rs::aimd{.should_handle = [](const rs::failure& f) { return f.is<overloaded>(); }}},
            sim.clock()};
        auto logic = [&sim]() -> rs::task<int> {
            co_await sim.sleep_for(10ms);
            throw std::invalid_argument("bad request");
        };
        auto r = sim.run(bh.execute_outcome(logic));
        CHECK(r.has_failure());
        CHECK(bh.limit() == 10);
        sim.spawn(scripted(sim, bh, log, {.id = 1, .hold = 10ms, .fail = true}));
        sim.run_all();
        CHECK(bh.limit() == 9);
    }
    SECTION("an outcome classifier may count returned values as failures") {
        rs::bulkhead bh{{.max_concurrent_calls = 10,
                         .adapt = rs::aimd{.should_handle =
                                               [](const rs::outcome<int>& o) {
                                                   return o.has_failure() || o.value() == 503;
                                               }}},
                        sim.clock()};
        auto busy = []() -> rs::task<int> { co_return 503; };
        CHECK(sim.run(bh.execute(busy)) == 503); // returned as it was...
        CHECK(bh.limit() == 9);                  // ...and counted
        auto fine = []() -> rs::task<int> { co_return 200; };
        CHECK(sim.run(bh.execute(fine)) == 200);
        CHECK(bh.limit() == 9);
        // An action of another type is refused before it takes a slot or runs.
        bool ran = false;
        auto other = [&ran]() -> rs::task<long> {
            ran = true;
            co_return 1L;
        };
        auto r = sim.run(bh.execute_outcome(other));
        REQUIRE(r.has_failure());
        CHECK_THROWS_WITH(
            r.error().rethrow(),
            Catch::Matchers::Contains("resilience::bulkhead: should_handle classifies rs::outcome<int>"));
        CHECK_FALSE(ran);
        CHECK(bh.in_flight() == 0);
        // A caller that has stopped too still learns of the setup mistake, not of a cancellation.
        resilience::stop_source stopped;
        stopped.request_stop();
        auto r_stopped = sim.run(bh.execute_outcome(other, stopped.get_token()));
        REQUIRE(r_stopped.has_failure());
        CHECK_THROWS_WITH(
            r_stopped.error().rethrow(),
            Catch::Matchers::Contains("resilience::bulkhead: should_handle classifies rs::outcome<int>"));
        CHECK_FALSE(ran);
    }
    SECTION("a classifier that throws makes its exception the call's failure, and the slot comes back") {
        rs::bulkhead bh{{.max_concurrent_calls = 1,
                         .queue_limit = 1,
                         .adapt = rs::aimd{.should_handle = [](const rs::failure&) -> bool {
                             throw std::logic_error("classifier bug");
                         }}},
                        sim.clock()};
        sim.spawn(scripted(sim, bh, log, {.id = 1, .hold = 10ms, .fail = true}));
        sim.spawn(scripted(sim, bh, log, {.id = 2, .arrive = 1ms, .hold = 10ms, .fail = true})); // queued
        sim.run_all();
        CHECK(log[1].how == "failure");
        CHECK(log[2].started == 10ms);
        CHECK(log[2].how == "failure");
        CHECK(bh.limit() == 1);
        CHECK(bh.in_flight() == 0);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Gradient in a bulkhead, on virtual time

TEST_CASE("gradient: the limit rises while latency holds at its baseline, settles at what the dependency "
          "serves, and falls when the dependency starts queueing sooner",
          "[bulkhead][adaptive]") {
    // The dependency serves 10 calls at once in 10 ms; beyond that its latency grows in proportion
    // (20 calls at once take 20 ms each), until 20 s, when it starts at 5. With tolerance 1 any rise
    // over the baseline shrinks the limit, and the long window (1000 windows of 10 calls) outlasts
    // the scenario, so the baseline stays the 10 ms of an unloaded call.
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 2,
                     .queue_limit = rs::unbounded_queue,
                     .adapt = rs::gradient{.min = 1,
                                           .max = 100,
                                           .short_samples = 10,
                                           .long_samples = 1000,
                                           .tolerance = 1.0,
                                           .smoothing = 0.5,
                                           .headroom = 1.0}},
                    sim.clock()};
    dependency dep{sim, 10, true};
    for (int i = 0; i < 30; ++i)
        sim.spawn(busy_client(sim, bh, dep, 40s));
    sim.spawn(set_capacity_at(sim, dep, 20s, 5));
    std::vector<std::size_t> every_second;
    sim.spawn(sample_limit(sim, bh, 1s, 40s, every_second));
    std::vector<std::pair<nanoseconds, std::size_t>> changes;
    sim.spawn(watch_limit(sim, bh, 40s, changes));
    sim.run_all();
    const auto range_between = [&](nanoseconds from, nanoseconds to) {
        std::pair<std::size_t, std::size_t> r{1000, 0};
        for (const auto& [at, limit] : changes)
            if (at >= from && at < to)
                r = {std::min(r.first, limit), std::max(r.second, limit)};
        return r;
    };
    // Up from 2 by half a call of headroom a window (a window is 10 calls: 50 ms at 2 at once), then
    // between the capacity and one over it. After the drop at 20 s it is down to 5 within 75 ms (10,
    // 8, 6, 5), and then between 5 and 6.
    using change = std::pair<nanoseconds, std::size_t>;
    REQUIRE(changes.size() >= 2);
    CHECK(changes[0] == change{100ms, 3});
    CHECK(changes[1] == change{170ms, 4});
    CHECK(range_between(1s, 20s) == std::pair<std::size_t, std::size_t>{10, 11});
    CHECK(range_between(20s + 1ms, 20s + 75ms) == std::pair<std::size_t, std::size_t>{6, 10});
    CHECK(range_between(20s + 75ms, 40s) == std::pair<std::size_t, std::size_t>{5, 6});
    CHECK(every_second == std::vector<std::size_t>{11, 11, 10, 10, 11, 11, 10, 11, 10, 11, 11, 10, 10, 10,
                                                   11, 10, 11, 11, 10, 11, 6,  6,  5,  5,  6,  6,  5,  5,
                                                   6,  6,  5,  6,  6,  5,  6,  6,  6,  6,  6,  6});
    CHECK(dep.peak <= 11);
}

// ---------------------------------------------------------------------------------------------------------
// The algorithms on their own

TEST_CASE("aimd_limit: grows by one per limit's worth of limited successes, shrinks by decrease once per "
          "round, within [min, max]",
          "[adaptive]") {
    using sample = rs::detail::limit_sample;
    rs::detail::aimd_limit a{rs::aimd{.min = 2, .max = 4, .slow_call_duration = 100ms, .decrease = 0.5}, 3};
    CHECK(a.limit() == 3);
    // Unlimited successes count nothing.
    for (int i = 0; i < 10; ++i)
        CHECK_FALSE(a.record(sample{.latency = 1ms}));
    CHECK(a.limit() == 3);
    // Three limited successes make 4; four more would make 5, but max is 4.
    CHECK_FALSE(a.record(sample{.latency = 1ms, .limited = true}));
    CHECK_FALSE(a.record(sample{.latency = 1ms, .limited = true}));
    CHECK(a.record(sample{.latency = 1ms, .limited = true}));
    CHECK(a.limit() == 4);
    for (int i = 0; i < 10; ++i)
        CHECK_FALSE(a.record(sample{.latency = 1ms, .limited = true}));
    CHECK(a.limit() == 4);
    // A slow call halves it; the next epoch begins.
    CHECK(a.epoch() == 0);
    CHECK(a.record(sample{.latency = 100ms, .limited = true}));
    CHECK(a.limit() == 2);
    CHECK(a.epoch() == 1);
    // Samples of calls admitted in epoch 0 change nothing now, failures or successes.
    CHECK_FALSE(a.record(sample{.failed = true, .epoch = 0}));
    CHECK_FALSE(a.record(sample{.latency = 1ms, .limited = true, .epoch = 0}));
    CHECK_FALSE(a.record(sample{.latency = 1ms, .limited = true, .epoch = 0}));
    CHECK(a.limit() == 2);
    // At min a failure changes nothing (and starts no epoch), but starts the count again.
    CHECK_FALSE(a.record(sample{.latency = 1ms, .limited = true, .epoch = 1}));
    CHECK_FALSE(a.record(sample{.failed = true, .epoch = 1}));
    CHECK(a.epoch() == 1);
    CHECK_FALSE(a.record(sample{.latency = 1ms, .limited = true, .epoch = 1}));
    CHECK(a.record(sample{.latency = 1ms, .limited = true, .epoch = 1}));
    CHECK(a.limit() == 3);
    // Rounding down always lowers the limit by at least one.
    rs::detail::aimd_limit gentle{rs::aimd{.min = 1, .max = 10, .decrease = 0.99}, 5};
    CHECK(gentle.record(sample{.failed = true}));
    CHECK(gentle.limit() == 4);
}

TEST_CASE("gradient_limit: recomputes the limit once per short window from the latency against its "
          "baseline and the share of successes",
          "[adaptive]") {
    using sample = rs::detail::limit_sample;
    // Numbers chosen to be exact in binary, so every value below is exact.
    rs::detail::gradient_limit g{rs::gradient{.min = 1,
                                              .max = 100,
                                              .short_samples = 2,
                                              .long_samples = 3, // weight 2 / 4 = 0.5
                                              .tolerance = 1.5,
                                              .smoothing = 0.5,
                                              .headroom = 2.0},
                                 10};
    const auto ms = [](double v) { return v * 1e6; };
    // Window 1 (10 ms, 10 ms): the baseline starts at 10 ms; gradient min(1.5, 1) = 1:
    // 10 * 0.5 + (10 * 1 + 2) * 0.5 = 11.
    CHECK_FALSE(g.record(sample{.latency = 10ms, .limited = true}));
    CHECK(g.record(sample{.latency = 10ms, .limited = true}));
    CHECK(g.baseline() == ms(10));
    CHECK(g.estimate() == 11.0);
    CHECK(g.limit() == 11);
    // Window 2 (20 ms): baseline 10 + (20 - 10) * 0.5 = 15; 1.5 * 15 / 20 = 1.125, so 1: 12.
    g.record(sample{.latency = 20ms, .limited = true});
    g.record(sample{.latency = 20ms, .limited = true});
    CHECK(g.baseline() == ms(15));
    CHECK(g.estimate() == 12.0);
    // Window 3 (60 ms): baseline 37.5; 1.5 * 37.5 / 60 = 0.9375, and below 1 there is no headroom:
    // 6 + 12 * 0.9375 * 0.5 = 11.625.
    g.record(sample{.latency = 60ms, .limited = true});
    CHECK(g.record(sample{.latency = 60ms, .limited = true}));
    CHECK(g.baseline() == ms(37.5));
    CHECK(g.estimate() == 11.625);
    CHECK(g.limit() == 11);
    // Window 4 (a failure, and a 10 ms success; nothing waited): the baseline takes 10 ms in (23.75),
    // then, being over twice it, drops by 5% (22.5625); the latency alone says 3.38, but half the
    // calls failed: gradient 0.5: 5.8125 + 5.8125 * 0.5 = 8.71875.
    g.record(sample{.failed = true});
    CHECK(g.record(sample{.latency = 10ms}));
    CHECK(g.baseline() == ms(22.5625));
    CHECK(g.estimate() == 8.71875);
    CHECK(g.limit() == 8);
    // Window 5 (10 ms, nothing waited): the baseline goes to 16.28125; it would grow to 9.71875, but
    // the limit held nobody back.
    g.record(sample{.latency = 10ms});
    CHECK_FALSE(g.record(sample{.latency = 10ms}));
    CHECK(g.baseline() == ms(16.28125));
    CHECK(g.estimate() == 8.71875);
    // Window 6 (every call failed): no latency, so the baseline stays; gradient 0.5:
    // 4.359375 + 4.359375 * 0.5 = 6.5390625.
    g.record(sample{.failed = true, .limited = true});
    CHECK(g.record(sample{.failed = true, .limited = true}));
    CHECK(g.baseline() == ms(16.28125));
    CHECK(g.estimate() == 6.5390625);
    CHECK(g.limit() == 6);
    // Never below min nor above max.
    rs::detail::gradient_limit bounded{rs::gradient{.min = 3, .max = 4, .short_samples = 1, .smoothing = 1.0},
                                       3};
    for (int i = 0; i < 5; ++i)
        bounded.record(sample{.failed = true, .limited = true});
    CHECK(bounded.limit() == 3);
    for (int i = 0; i < 5; ++i)
        bounded.record(sample{.latency = 1ms, .limited = true});
    CHECK(bounded.limit() == 4);
}

// ---------------------------------------------------------------------------------------------------------
// A seeded random scenario against a reference model of an AIMD bulkhead: which calls start when, how
// they end, and the limit after each one, all computed by a plain sequential model written from the
// documented rules.

namespace {

struct model_call {
    nanoseconds arrive{};
    nanoseconds hold{};
    bool flaky = false; // fails whatever the load
};

struct model_result {
    std::vector<nanoseconds> started; // -1: never ran
    std::vector<std::string> how;
    std::vector<std::size_t> limit_after; // the limit right after the call ended (or was refused)
};

struct model_options {
    std::size_t start, min, max, queue_limit, capacity;
    double decrease;
    nanoseconds slow, queue_timeout;
};

// The reference: a discrete-event model of one AIMD bulkhead in front of a dependency that fails
// calls finding more than `capacity` in progress. Instants are distinct, so event order is clear.
model_result run_model(const std::vector<model_call>& calls, const model_options& o) {
    const std::size_t n = calls.size();
    model_result r{std::vector<nanoseconds>(n, nanoseconds{-1}), std::vector<std::string>(n),
                   std::vector<std::size_t>(n)};
    enum kind { arrival, completion, expiry };
    struct event {
        nanoseconds at;
        kind what;
        std::size_t id;
        bool operator>(const event& e) const { return at > e.at; }
    };
    std::priority_queue<event, std::vector<event>, std::greater<>> events;
    for (std::size_t i = 0; i < n; ++i)
        events.push({calls[i].arrive, arrival, i});
    std::size_t limit = o.start, successes = 0, slots = 0, running = 0;
    std::uint64_t epoch = 0;
    std::deque<std::size_t> queue;
    std::vector<std::uint64_t> admitted_in(n);
    std::vector<bool> fails(n);

    const auto admit = [&](std::size_t id, nanoseconds now) {
        ++slots;
        const std::size_t here = ++running;
        fails[id] = calls[id].flaky || here > o.capacity;
        admitted_in[id] = epoch;
        r.started[id] = now;
        events.push({now + calls[id].hold, completion, id});
    };
    while (!events.empty()) {
        const event e = events.top();
        events.pop();
        const std::size_t id = e.id;
        switch (e.what) {
        case arrival:
            if (queue.empty() && slots < limit) {
                admit(id, e.at);
            } else if (queue.size() < o.queue_limit) {
                queue.push_back(id);
                events.push({e.at + o.queue_timeout, expiry, id});
            } else {
                r.how[id] = "rejected";
                r.limit_after[id] = limit;
            }
            break;
        case expiry:
            if (const auto it = std::find(queue.begin(), queue.end(), id); it != queue.end()) {
                queue.erase(it);
                r.how[id] = "rejected";
                r.limit_after[id] = limit;
            }
            break;
        case completion: {
            --running;
            const bool limited = !queue.empty() || slots >= limit;
            const bool bad = fails[id] || calls[id].hold >= o.slow;
            if (admitted_in[id] == epoch) {
                if (bad) {
                    successes = 0;
                    const auto lowered =
                        std::max(o.min, static_cast<std::size_t>(static_cast<double>(limit) * o.decrease));
                    if (lowered < limit) {
                        limit = lowered;
                        ++epoch;
                    }
                } else if (limited && limit < o.max && ++successes == limit) {
                    successes = 0;
                    ++limit;
                }
            }
            --slots;
            while (!queue.empty() && slots < limit) {
                const std::size_t next = queue.front();
                queue.pop_front();
                admit(next, e.at);
            }
            r.how[id] = fails[id] ? "failure" : "value";
            r.limit_after[id] = limit;
            break;
        }
        }
    }
    return r;
}

struct real_run {
    model_result result;
    std::size_t final_in_flight = 99, final_queued = 99;
};

rs::task<void> model_client(rs::testing::simulation& sim, rs::bulkhead<vclock>& bh, const model_call& c,
                            std::size_t id, std::size_t capacity, std::size_t& running, model_result& out) {
    co_await sim.sleep_for(c.arrive - sim.now());
    auto action = [&sim, &c, &running, &out, id, capacity]() -> rs::task<int> {
        out.started[id] = sim.now();
        const std::size_t here = ++running;
        co_await sim.sleep_for(c.hold);
        --running;
        if (c.flaky || here > capacity)
            throw overloaded{};
        co_return 1;
    };
    auto r = co_await bh.execute_outcome(std::move(action));
    out.how[id] = describe(r);
    out.limit_after[id] = bh.limit();
}

real_run run_bulkhead(const std::vector<model_call>& calls, const model_options& o) {
    rs::testing::simulation sim;
    rs::bulkhead bh{
        {.max_concurrent_calls = o.start,
         .queue_limit = o.queue_limit,
         .queue_timeout = o.queue_timeout,
         .adapt = rs::aimd{.min = o.min, .max = o.max, .slow_call_duration = o.slow, .decrease = o.decrease}},
        sim.clock()};
    const std::size_t n = calls.size();
    real_run run{{std::vector<nanoseconds>(n, nanoseconds{-1}), std::vector<std::string>(n),
                  std::vector<std::size_t>(n)}};
    std::size_t running = 0;
    for (std::size_t i = 0; i < n; ++i)
        sim.spawn(model_client(sim, bh, calls[i], i, o.capacity, running, run.result));
    sim.run_all();
    run.final_in_flight = bh.in_flight();
    run.final_queued = bh.queued();
    return run;
}

} // namespace

TEST_CASE("aimd: seeded random scenarios start, end and limit calls exactly as a reference model says",
          "[bulkhead][adaptive]") {
    const std::uint64_t seed = GENERATE(range<std::uint64_t>(1, 21));
    rs::seeded_random rng{seed};
    const auto uniform = [&rng](std::int64_t lo, std::int64_t hi) { // in [lo, hi]
        return lo +
               static_cast<std::int64_t>(rs::detail::unit_random(rng) * static_cast<double>(hi - lo + 1));
    };
    const model_options o{.start = static_cast<std::size_t>(uniform(1, 8)),
                          .min = 1,
                          .max = static_cast<std::size_t>(uniform(8, 20)),
                          .queue_limit = static_cast<std::size_t>(uniform(0, 12)),
                          .capacity = static_cast<std::size_t>(uniform(3, 12)),
                          .decrease = 0.5 + 0.1 * static_cast<double>(uniform(0, 4)),
                          .slow = nanoseconds{uniform(30'000'000, 60'000'000)},
                          .queue_timeout = nanoseconds{uniform(5'000'000, 80'000'000)}};
    std::vector<model_call> calls(400);
    nanoseconds at{};
    for (auto& c : calls) {
        at += nanoseconds{uniform(1, 3'000'000)}; // busy enough to queue; nanosecond instants never meet
        c.arrive = at;
        c.hold = nanoseconds{uniform(1'000'000, 50'000'000)};
        c.flaky = uniform(0, 19) == 0;
    }
    CAPTURE(seed, o.start, o.max, o.queue_limit, o.capacity, o.decrease, o.slow.count(),
            o.queue_timeout.count());
    const model_result expected = run_model(calls, o);
    const real_run got = run_bulkhead(calls, o);
    CHECK(got.result.started == expected.started);
    CHECK(got.result.how == expected.how);
    CHECK(got.result.limit_after == expected.limit_after);
    CHECK(got.final_in_flight == 0);
    CHECK(got.final_queued == 0);
    // The scenario is worth checking: the limit moved both ways, calls waited, some were refused.
    const auto& limits = expected.limit_after;
    CHECK(std::adjacent_find(limits.begin(), limits.end(), std::less<>{}) != limits.end());
    CHECK(std::adjacent_find(limits.begin(), limits.end(), std::greater<>{}) != limits.end());
}

// ---------------------------------------------------------------------------------------------------------
// Threads. Real event loops on four threads share one adaptive bulkhead whose limit moves all the time;
// run under ThreadSanitizer in CI.

namespace {

struct shared_counts {
    std::atomic<int> running{0}, peak{0};
    resilience_tests::call_tally<rs::bulkhead_rejected_error> calls;
    explicit shared_counts(std::size_t n) : calls(n) {}
};

void raise_to(std::atomic<int>& peak, int n) {
    int seen = peak.load();
    while (n > seen && !peak.compare_exchange_weak(seen, n)) {
    }
}

// Makes `count` calls one after another, numbered from `first`; every fifth fails, and actions yield
// 0, 1 or 2 times so that calls overlap across loops.
rs::task<void> serial_client(rs::bulkhead<>& bh, shared_counts& c, std::size_t first, std::size_t count) {
    for (std::size_t id = first; id < first + count; ++id) {
        auto action = [&c, id]() -> rs::task<int> {
            raise_to(c.peak, ++c.running);
            for (std::size_t i = 0; i < id % 3; ++i)
                co_await yield_now{};
            --c.running;
            if (id % 5 == 0)
                throw overloaded{};
            co_return 1;
        };
        auto r = co_await bh.execute_outcome(std::move(action));
        c.calls.record(id, r);
    }
}

} // namespace

TEST_CASE("adaptive bulkhead: hammered by loops on four threads while its limit moves, never more than max "
          "run at once, and every call ends once",
          "[bulkhead][adaptive][concurrency]") {
    const auto options =
        GENERATE(rs::bulkhead_options{.max_concurrent_calls = 2,
                                      .queue_limit = 100000,
                                      .adapt = rs::aimd{.min = 1, .max = 4, .decrease = 0.5}},
                 rs::bulkhead_options{.max_concurrent_calls = 2,
                                      .queue_limit = 2,
                                      .adapt = rs::aimd{.min = 1, .max = 3, .slow_call_duration = 20us}},
                 rs::bulkhead_options{
                     .max_concurrent_calls = 2,
                     .queue_limit = 100000,
                     .adapt = rs::gradient{.min = 1, .max = 4, .short_samples = 3, .smoothing = 1.0}});
    constexpr std::size_t loops = 4, chains = 4, chain_length = resilience_tests::stress_rounds(3000),
                          per_loop = chains * chain_length;
    rs::bulkhead bh{options};
    shared_counts c{loops * per_loop};
    rs::event_loop l0, l1, l2, l3;
    rs::event_loop* all[loops] = {&l0, &l1, &l2, &l3};
    for (std::size_t l = 0; l < loops; ++l)
        for (std::size_t k = 0; k < chains; ++k)
            all[l]->spawn(serial_client(bh, c, l * per_loop + k * chain_length, chain_length));
    resilience_tests::run_on_threads(l0, l1, l2, l3);

    const std::size_t max = std::visit(
        [](const auto& a) -> std::size_t {
            if constexpr (requires { a.max; })
                return a.max;
            else
                return 0;
        },
        options.adapt);
    CHECK(c.peak.load() <= static_cast<int>(max));
    CHECK(c.running.load() == 0);
    CHECK(c.calls.values + c.calls.failed + c.calls.refused == static_cast<int>(loops * per_loop));
    CHECK(c.calls.cancelled == 0);
    REQUIRE(c.calls.completions.exactly_once() == loops * per_loop);
    if (options.queue_limit >= loops * chains)
        CHECK(c.calls.refused == 0);
    CHECK(bh.in_flight() == 0);
    CHECK(bh.queued() == 0);
    CHECK(bh.limit() >= 1);
    CHECK(bh.limit() <= max);
}

} // namespace test_adaptive_concurrency
