// SPDX-License-Identifier: MIT
// Tests of resilience::bulkhead: slots, the FIFO queue, queue timeout, stops, release, threads.

#include "catch.hpp"
#include "loopless_clock.hpp"
#include "support.hpp"

#include <resilience/bulkhead.hpp>
#include <resilience/clock.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/when_all.hpp>

#include <atomic>
#include <chrono>
#include <coroutine>
#include <functional>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace test_bulkhead {

namespace rs = resilience;
using namespace std::chrono_literals;
using std::chrono::nanoseconds;
using vclock = rs::testing::virtual_clock;
using resilience_tests::describe;
using resilience_tests::stop_at;
using resilience_tests::yield_now;

static_assert(rs::policy<rs::bulkhead<>>);
static_assert(rs::policy<rs::bulkhead<vclock>>);

namespace {

// What happened to each call of a scenario, by call id.
struct journal {
    resilience_tests::instant_log started; // (id, instant) in the order actions started
    std::map<int, std::pair<nanoseconds, std::string>> finished;
    int running = 0, peak = 0;

    std::vector<int> start_order() const { return resilience_tests::ids_of(started); }
    nanoseconds started_at(int id) const { return resilience_tests::instant_of(started, id); }
    bool ran(int id) const { return started_at(id) >= nanoseconds::zero(); }
};

struct call_spec {
    int id = 0;
    nanoseconds arrive{};
    nanoseconds hold{};
    bool fail = false;
    resilience::stop_token stop{};
};

// Arrives at `arrive`, runs an action holding its slot for `hold` (listening to its stop token),
// and writes down when the action started and how the call ended.
rs::task<void> client(rs::testing::simulation& sim, rs::bulkhead<vclock>& bh, journal& j, call_spec c) {
    if (c.arrive > sim.now())
        co_await sim.sleep_for(c.arrive - sim.now());
    // Named, then passed as an lvalue (copied): g++ 12 destroys a lambda written as a temporary
    // inside a co_await expression twice, which a capture with a destructor does not survive, and
    // execute refuses any rvalue of such a lambda there (docs/core.md#compiler-notes).
    auto action = [&sim, &j, c](resilience::stop_token st) -> rs::task<int> {
        j.started.emplace_back(c.id, sim.now());
        j.peak = std::max(j.peak, ++j.running);
        struct leave {
            journal& j;
            ~leave() { --j.running; }
        } guard{j};
        if (c.hold > nanoseconds::zero())
            co_await sim.sleep_for(c.hold, st);
        if (st.stop_requested())
            throw rs::cancelled_error{};
        if (c.fail)
            throw std::runtime_error("boom");
        co_return c.id;
    };
    auto r = co_await bh.execute_outcome(action, c.stop);
    j.finished[c.id] = {sim.now(), describe(r)};
}

// Call 1 holds the only slot for 100 ms; call 2 (arriving at 10 ms) and call 3 (at 20 ms) queue behind
// it, and call 2's caller stops at `stop`. Runs that, and returns the queue length right after the stop.
std::size_t stop_first_waiter(rs::testing::simulation& sim, rs::bulkhead<vclock>& bh, journal& j,
                              nanoseconds stop) {
    resilience::stop_source src;
    std::size_t queued_after_stop = 99;
    sim.spawn(client(sim, bh, j, {.id = 1, .hold = 100ms}));
    sim.spawn(client(sim, bh, j, {.id = 2, .arrive = 10ms, .hold = 10ms, .stop = src.get_token()}));
    sim.spawn(client(sim, bh, j, {.id = 3, .arrive = 20ms, .hold = 10ms}));
    sim.spawn(stop_at(sim, src, stop, bh, queued_after_stop));
    sim.run_all();
    return queued_after_stop;
}

} // namespace

TEST_CASE("bulkhead: at most max_concurrent_calls calls run at once, the rest start as slots free",
          "[bulkhead]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 2, .queue_limit = 10}, sim.clock()};
    journal j;
    for (int id = 1; id <= 5; ++id)
        sim.spawn(client(sim, bh, j, {.id = id, .hold = 100ms}));
    sim.run_all();
    CHECK(j.peak == 2);
    CHECK(j.started_at(1) == 0ms);
    CHECK(j.started_at(2) == 0ms);
    CHECK(j.started_at(3) == 100ms);
    CHECK(j.started_at(4) == 100ms);
    CHECK(j.started_at(5) == 200ms);
    CHECK(sim.now() == 300ms);
    for (int id = 1; id <= 5; ++id)
        CHECK(j.finished[id].second == "value");
    CHECK(bh.in_flight() == 0);
    CHECK(bh.queued() == 0);
}

TEST_CASE("bulkhead: when full with queue_limit = 0 a call is refused at once without running",
          "[bulkhead]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1}, sim.clock()};
    auto act =
        rs::testing::scripted_action{sim.clock(), rs::testing::script<int>{.latency = 100ms, .value = 7}};
    sim.spawn(bh.execute(act));

    auto refused = [](rs::testing::simulation& s, rs::bulkhead<vclock>& b,
                      rs::testing::scripted_action<int, vclock> a) -> rs::task<void> {
        auto r = co_await b.execute_outcome(a);
        CHECK(s.now() == 0ms);
        REQUIRE(r.has_failure());
        CHECK(r.error().code() == rs::errc::bulkhead_rejected); // read without rethrowing
        CHECK(r.error().is<rs::bulkhead_rejected_error>());
        CHECK(a.calls() == 1); // only the first call ran
        CHECK_THROWS_AS(co_await b.execute(a), rs::bulkhead_rejected_error);
        CHECK(a.calls() == 1);
    };
    sim.spawn(refused(sim, bh, act));
    sim.run_all();
    CHECK(act.calls() == 1);
    CHECK(sim.now() == 100ms);
}

TEST_CASE("bulkhead: waiters get slots in the order they arrived", "[bulkhead]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 10}, sim.clock()};
    journal j;
    // Spawned in another order than they arrive, so the test sees arrival order, not spawn order.
    sim.spawn(client(sim, bh, j, {.id = 4, .arrive = 40ms, .hold = 100ms}));
    sim.spawn(client(sim, bh, j, {.id = 2, .arrive = 20ms, .hold = 100ms}));
    sim.spawn(client(sim, bh, j, {.id = 1, .arrive = 0ms, .hold = 100ms}));
    sim.spawn(client(sim, bh, j, {.id = 3, .arrive = 30ms, .hold = 100ms}));
    sim.run_all();
    CHECK(j.start_order() == std::vector<int>{1, 2, 3, 4});
    CHECK(j.started_at(2) == 100ms);
    CHECK(j.started_at(3) == 200ms);
    CHECK(j.started_at(4) == 300ms);
}

TEST_CASE("bulkhead: a freed slot goes to the oldest waiter, not to a call arriving at that instant",
          "[bulkhead]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 10}, sim.clock()};
    journal j;
    sim.spawn(client(sim, bh, j, {.id = 1, .hold = 100ms}));
    sim.spawn(client(sim, bh, j, {.id = 2, .arrive = 10ms, .hold = 100ms}));
    // Arrives at 100 ms, right after call 1 released its slot and before call 2 was resumed.
    sim.spawn(client(sim, bh, j, {.id = 3, .arrive = 100ms, .hold = 100ms}));
    sim.run_all();
    CHECK(j.start_order() == std::vector<int>{1, 2, 3});
    CHECK(j.started_at(2) == 100ms);
    CHECK(j.started_at(3) == 200ms);
    CHECK(j.peak == 1);
}

TEST_CASE("bulkhead: a queued call is refused at exactly queue_timeout", "[bulkhead]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 5, .queue_timeout = 50ms}, sim.clock()};
    journal j;
    sim.spawn(client(sim, bh, j, {.id = 1, .hold = 100ms}));
    sim.spawn(client(sim, bh, j, {.id = 2, .arrive = 10ms, .hold = 10ms}));
    // Arrives at 60 ms; its slot comes at 100 ms, before its timeout (110 ms).
    sim.spawn(client(sim, bh, j, {.id = 3, .arrive = 60ms, .hold = 10ms}));
    sim.run_all();
    CHECK(j.finished[2] == std::pair{nanoseconds{60ms}, std::string{"rejected"}});
    CHECK_FALSE(j.ran(2));
    CHECK(j.started_at(3) == 100ms);
    CHECK(j.finished[3] == std::pair{nanoseconds{110ms}, std::string{"value"}});
    CHECK(sim.now() == 110ms);
    CHECK(bh.in_flight() == 0);
}

TEST_CASE("bulkhead: a waiter whose caller stops leaves the queue at that instant and never runs",
          "[bulkhead]") {
    const bool bounded = GENERATE(false, true); // with and without a queue timeout: two wait paths
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1,
                     .queue_limit = 5,
                     .queue_timeout = bounded ? std::optional<nanoseconds>{1s} : std::nullopt},
                    sim.clock()};
    journal j;
    const std::size_t queued_after_stop = stop_first_waiter(sim, bh, j, 30ms);
    CHECK(queued_after_stop == 1); // only call 3 still waits
    CHECK(j.finished[2] == std::pair{nanoseconds{30ms}, std::string{"cancelled"}});
    CHECK_FALSE(j.ran(2));
    CHECK(j.started_at(3) == 100ms); // the slot went to the next waiter
    CHECK(bh.in_flight() == 0);
}

TEST_CASE("bulkhead: a waiter stopped after its slot was handed over passes it on without running",
          "[bulkhead]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 5}, sim.clock()};
    journal j;
    // The stop fires at 100 ms after call 1's action ends (its timer was armed earlier): the slot has
    // been handed to call 2, which has not been resumed yet.
    const std::size_t queued_after_stop = stop_first_waiter(sim, bh, j, 100ms);
    CHECK(queued_after_stop == 1);
    CHECK(j.finished[2] == std::pair{nanoseconds{100ms}, std::string{"cancelled"}});
    CHECK_FALSE(j.ran(2));
    CHECK(j.started_at(3) == 100ms);
    CHECK(bh.in_flight() == 0);
}

TEST_CASE("bulkhead: the slot is released when the action throws", "[bulkhead]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 5}, sim.clock()};
    journal j;
    sim.spawn(client(sim, bh, j, {.id = 1, .hold = 50ms, .fail = true}));
    sim.spawn(client(sim, bh, j, {.id = 2, .arrive = 10ms, .hold = 10ms}));
    sim.run_all();
    CHECK(j.finished[1] == std::pair{nanoseconds{50ms}, std::string{"failure"}});
    CHECK(j.started_at(2) == 50ms);
    CHECK(j.finished[2].second == "value");
    CHECK(bh.in_flight() == 0);
}

TEST_CASE("bulkhead: the slot is released when the running call is cancelled", "[bulkhead]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 5}, sim.clock()};
    journal j;
    resilience::stop_source src;
    sim.spawn(client(sim, bh, j, {.id = 1, .hold = 100ms, .stop = src.get_token()}));
    sim.spawn(client(sim, bh, j, {.id = 2, .arrive = 10ms, .hold = 10ms}));
    sim.spawn(stop_at(sim, src, 40ms));
    sim.run_all();
    CHECK(j.finished[1] == std::pair{nanoseconds{40ms}, std::string{"cancelled"}});
    CHECK(j.started_at(2) == 40ms);
    CHECK(bh.in_flight() == 0);
}

TEST_CASE("bulkhead: in_flight and queued count the calls holding and waiting for slots", "[bulkhead]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 2, .queue_limit = 2}, sim.clock()};
    journal j;
    for (int id = 1; id <= 5; ++id)
        sim.spawn(client(sim, bh, j, {.id = id, .arrive = id * 1ms, .hold = 100ms}));
    std::vector<std::pair<std::size_t, std::size_t>> seen;
    auto observe = [](rs::testing::simulation& s, rs::bulkhead<vclock>& b,
                      std::vector<std::pair<std::size_t, std::size_t>>& out) -> rs::task<void> {
        for (nanoseconds at : {nanoseconds{0ms}, nanoseconds{10ms}, nanoseconds{150ms}, nanoseconds{250ms}}) {
            co_await s.sleep_for(at - s.now());
            out.emplace_back(b.in_flight(), b.queued());
        }
    };
    sim.spawn(observe(sim, bh, seen));
    sim.run_all();
    using counts = std::vector<std::pair<std::size_t, std::size_t>>;
    CHECK(seen == counts{{0, 0}, {2, 2}, {2, 0}, {0, 0}});
    CHECK(j.finished[5] == std::pair{nanoseconds{5ms}, std::string{"rejected"}}); // two running, two waiting
}

TEST_CASE("bulkhead: works as a stage of a pipeline and holds the slot across the inner stages",
          "[bulkhead]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 1}, sim.clock()};
    rs::pipeline p{bh, rs::bulkhead{{.max_concurrent_calls = 5}, sim.clock()}};
    auto act =
        rs::testing::scripted_action{sim.clock(), rs::testing::script<int>{.latency = 100ms, .value = 1}};
    sim.spawn(p.execute(act));
    sim.spawn(p.execute(act));
    sim.run_all();
    CHECK(act.calls() == 2);
    CHECK(sim.now() == 200ms);
}

TEST_CASE("bulkhead: invalid options are refused naming the field and the value", "[bulkhead]") {
    CHECK_THROWS_WITH(rs::bulkhead{{.max_concurrent_calls = 0}},
                      "resilience::bulkhead: max_concurrent_calls must be positive, got 0");
    CHECK_THROWS_WITH((rs::bulkhead{{.max_concurrent_calls = 1, .queue_timeout = nanoseconds{0}}}),
                      "resilience::bulkhead: queue_timeout must be positive, got 0ns");
    CHECK_THROWS_WITH((rs::bulkhead{{.max_concurrent_calls = 1, .queue_timeout = -5ms}}),
                      "resilience::bulkhead: queue_timeout must be positive, got -5000000ns");
    CHECK_NOTHROW(rs::bulkhead{{.max_concurrent_calls = 1, .queue_timeout = 1ns}});
}

TEST_CASE("bulkhead: copies are handles to one bulkhead", "[bulkhead]") {
    rs::testing::simulation sim;
    rs::bulkhead a{{.max_concurrent_calls = 1}, sim.clock()};
    auto b = a;
    auto act = rs::testing::scripted_action{sim.clock(), rs::testing::script<int>{.latency = 100ms}};
    sim.spawn(a.execute(act));
    auto second = [](rs::bulkhead<vclock> copy,
                     rs::testing::scripted_action<int, vclock> action) -> rs::task<void> {
        auto r = co_await copy.execute_outcome(action);
        CHECK(r.has_failure());
        CHECK(copy.in_flight() == 1);
    };
    sim.spawn(second(b, act));
    sim.run_all();
    CHECK(act.calls() == 1);
}

// ---------------------------------------------------------------------------------------------------------
// The shared state, driven step by step through the interleavings a lock-free fast path must survive.
// Another thread's call is played by a std::thread doing its step while this one holds the mutex.

namespace {

using slots = rs::detail::bulkhead_state<rs::steady_clock>;
using rs::detail::waiter_state;

// A waiter that is woken inline, resuming nothing: the steps below only look at its state.
rs::detail::waiter inert_waiter() {
    rs::detail::waiter w;
    w.handle = std::noop_coroutine();
    return w;
}

// Decides for `w` and queues it, as queue_awaiter does for a call finding every slot taken.
waiter_state decide_and_enqueue(slots& s, rs::detail::waiter& w) {
    std::lock_guard lock(s.mutex);
    w.state = s.decide_locked(w);
    if (w.state == waiter_state::idle)
        w.state = s.enqueue_locked(w);
    return w.state;
}

} // namespace

TEST_CASE("bulkhead state: try_acquire and release take and give back slots up to max_concurrent_calls",
          "[bulkhead]") {
    slots s{{.max_concurrent_calls = 2}, {}};
    CHECK(s.try_acquire());
    CHECK(s.try_acquire());
    CHECK_FALSE(s.try_acquire());
    CHECK(s.in_flight() == 2);
    s.release();
    CHECK(s.in_flight() == 1);
    CHECK(s.try_acquire());
    s.release();
    s.release();
    CHECK(s.in_flight() == 0);
}

TEST_CASE("bulkhead state: a slot freed between the decision to queue and the queueing goes to that call",
          "[bulkhead]") {
    slots s{{.max_concurrent_calls = 1, .queue_limit = 4}, {}};
    REQUIRE(s.try_acquire());
    rs::detail::waiter w = inert_waiter();
    {
        std::lock_guard lock(s.mutex);
        REQUIRE(s.decide_locked(w) == waiter_state::idle);
        // The holder's call ends on another thread now. Nobody is queued yet, so its release takes
        // no lock and hands the slot to nobody: the call about to queue must take it, or it would
        // wait for a release that never comes.
        std::thread([&] { s.release(); }).join();
        w.state = s.enqueue_locked(w);
        CHECK(w.state == waiter_state::granted);
    }
    CHECK(s.queue.empty());
    CHECK(s.in_flight() == 1);
    CHECK_FALSE(s.try_acquire());
    s.release();
    CHECK(s.in_flight() == 0);
}

TEST_CASE("bulkhead state: a release after a call queued hands it the slot, which no newcomer can take",
          "[bulkhead]") {
    slots s{{.max_concurrent_calls = 2, .queue_limit = 4}, {}};
    REQUIRE(s.try_acquire());
    REQUIRE(s.try_acquire());
    rs::detail::waiter w = inert_waiter();
    REQUIRE(decide_and_enqueue(s, w) == waiter_state::queued);
    CHECK_FALSE(s.try_acquire()); // someone waits
    std::thread([&] { s.release(); }).join();
    CHECK(w.state == waiter_state::granted);
    CHECK(s.queue.empty());
    CHECK(s.in_flight() == 2);    // the slot changed hands without ever being free...
    CHECK_FALSE(s.try_acquire()); // ...so a newcomer at that instant finds none
    s.release();                  // nobody waits now: slots come back without the lock again
    CHECK(s.in_flight() == 1);
    CHECK(s.try_acquire());
    s.release();
    s.release();
    CHECK(s.in_flight() == 0);
}

TEST_CASE("bulkhead state: once the last waiter stops, a slot given back is free for the next call at once",
          "[bulkhead]") {
    slots s{{.max_concurrent_calls = 1, .queue_limit = 4}, {}};
    REQUIRE(s.try_acquire());
    rs::detail::waiter w = inert_waiter();
    REQUIRE(decide_and_enqueue(s, w) == waiter_state::queued);
    rs::detail::stop_waiter(s, w);
    CHECK(w.state == waiter_state::stopped);
    CHECK(s.queue.empty());
    CHECK((s.word.load() & slots::waiting) == 0); // so the release below needs no lock
    s.release();
    CHECK(s.in_flight() == 0);
    CHECK(s.try_acquire());
    s.release();
}

// ---------------------------------------------------------------------------------------------------------
// Threads. Real event loops on two threads share one bulkhead; actions yield to their loop so calls
// overlap and slots move between threads. Run under ThreadSanitizer in CI.

namespace {

// The most `n` was seen at.
void raise_to(std::atomic<int>& peak, int n) {
    int seen = peak.load();
    while (n > seen && !peak.compare_exchange_weak(seen, n)) {
    }
}

struct shared_counts {
    std::atomic<int> running{0}, peak{0};
    std::atomic<int> peak_in_flight{0}; // the most in_flight() said, read inside actions
    resilience_tests::call_tally<rs::bulkhead_rejected_error> calls;
    explicit shared_counts(std::size_t n) : calls(n) {}
};

// An action counted in `c` while it runs, yielding to its loop `yields` times (0: it ends at once,
// and its slot is given back before its loop runs anything else).
rs::task<void> threaded_client(rs::bulkhead<>& bh, shared_counts& c, std::size_t id,
                               resilience::stop_token stop, int yields = 2) {
    auto action = [&bh, &c, yields]() -> rs::task<int> {
        raise_to(c.peak, ++c.running);
        raise_to(c.peak_in_flight, static_cast<int>(bh.in_flight()));
        for (int i = 0; i < yields; ++i)
            co_await yield_now{};
        --c.running;
        co_return 1;
    };
    auto r = co_await bh.execute_outcome(std::move(action), std::move(stop));
    c.calls.record(id, r);
}

// Makes `calls` calls one after another, numbered from `first`, whose actions yield 0, 1 or 2 times.
rs::task<void> serial_client(rs::bulkhead<>& bh, shared_counts& c, std::size_t first, std::size_t calls) {
    for (std::size_t i = 0; i < calls; ++i)
        co_await threaded_client(bh, c, first + i, {}, static_cast<int>((first + i) % 3));
}

} // namespace

TEST_CASE("bulkhead: shared by loops on two threads, never more than max_concurrent_calls run at once",
          "[bulkhead][concurrency]") {
    struct variant {
        rs::bulkhead_options options;
        bool stops;
    };
    const auto v =
        GENERATE(variant{{.max_concurrent_calls = 3, .queue_limit = 100000}, false},
                 variant{{.max_concurrent_calls = 3, .queue_limit = 8}, false},
                 variant{{.max_concurrent_calls = 4, .queue_limit = 100000, .queue_timeout = 10s}, true});
    constexpr std::size_t per_loop = 2000;
    rs::bulkhead bh{v.options};
    shared_counts c{2 * per_loop};
    std::vector<resilience::stop_source> sources(per_loop);
    rs::event_loop a, b;
    for (std::size_t i = 0; i < per_loop; ++i) {
        const bool stopped = v.stops && i % 5 == 0;
        a.spawn(threaded_client(bh, c, i, stopped ? sources[i].get_token() : resilience::stop_token{}));
        b.spawn(threaded_client(bh, c, per_loop + i, {}));
        if (stopped) // the other loop stops some of this loop's calls at unpredictable moments
            b.spawn(resilience_tests::stop_after_yields(sources[i], 1));
    }
    resilience_tests::run_on_threads(a, b); // both loops start together, so their calls overlap

    CHECK(c.peak.load() <= static_cast<int>(v.options.max_concurrent_calls));
    CHECK(c.peak_in_flight.load() <= static_cast<int>(v.options.max_concurrent_calls));
    CHECK(c.peak.load() >= 1);
    CHECK(c.running.load() == 0);
    CHECK(c.calls.values + c.calls.refused + c.calls.cancelled == static_cast<int>(2 * per_loop));
    CHECK(c.calls.failed == 0);
    REQUIRE(c.calls.completions.exactly_once() == 2 * per_loop);
    if (!v.stops)
        CHECK(c.calls.cancelled == 0);
    if (v.options.queue_limit >= 2 * per_loop)
        CHECK(c.calls.refused == 0);
    else
        CHECK(c.calls.refused > 0);
    CHECK(bh.in_flight() == 0);
    CHECK(bh.queued() == 0);
}

TEST_CASE("bulkhead: queue timeouts firing on each of two loops race slots handed over from the other: every "
          "call ends once, and every refusal is heard once",
          "[bulkhead][concurrency]") {
    // A queued call waits in its own loop's frame with its deadline a timer on that loop, while the
    // slot it waits for is given back on either thread: the timer firing and the hand-over meet.
    const auto queue_timeout = GENERATE(1us, 30us);
    resilience_tests::heard_counts heard;
    rs::bulkhead bh{{.max_concurrent_calls = 2,
                     .queue_limit = 100000,
                     .queue_timeout = queue_timeout,
                     .telemetry = heard.listener()}};
    constexpr std::size_t per_loop = 2000;
    shared_counts c{2 * per_loop};
    std::vector<resilience::stop_source> sources(per_loop);
    rs::event_loop a, b;
    for (std::size_t i = 0; i < per_loop; ++i) {
        const bool stopped = i % 5 == 0;
        const int yields = static_cast<int>(i % 3);
        a.spawn(
            threaded_client(bh, c, i, stopped ? sources[i].get_token() : resilience::stop_token{}, yields));
        b.spawn(threaded_client(bh, c, per_loop + i, {}, yields));
        if (stopped)
            b.spawn(resilience_tests::stop_after_yields(sources[i], static_cast<int>(i % 4)));
    }
    resilience_tests::run_on_threads(a, b);

    CHECK(c.peak.load() <= 2);
    CHECK(c.peak_in_flight.load() <= 2);
    CHECK(c.running.load() == 0);
    CHECK(c.calls.values + c.calls.refused + c.calls.cancelled == static_cast<int>(2 * per_loop));
    CHECK(c.calls.failed == 0);
    REQUIRE(c.calls.completions.exactly_once() == 2 * per_loop);
    // Every refusal here is a queue timeout, heard once. A call refused as its caller stops ends with
    // cancelled_error all the same (a call its caller stopped ends with a value or cancelled_error), so
    // a refusal heard may belong to a call counted as cancelled.
    CHECK(heard.rejections.load() >= c.calls.refused.load());
    CHECK(heard.rejections.load() <= c.calls.refused.load() + c.calls.cancelled.load());
    CHECK(heard.waits.load() <= c.calls.values.load());
    CHECK(bh.in_flight() == 0);
    CHECK(bh.queued() == 0);
}

TEST_CASE("bulkhead: hammered by loops on four threads, with actions that end at once or yield, never more "
          "than max_concurrent_calls run at once and every call ends",
          "[bulkhead][concurrency]") {
    // Actions that end at once give their slot back while other threads are taking theirs or
    // queueing: the release that races a waiter being queued must still reach it. Each loop runs
    // long enough (a few chains of calls, one after another) for the threads to overlap.
    const auto options = GENERATE(rs::bulkhead_options{.max_concurrent_calls = 1, .queue_limit = 100000},
                                  rs::bulkhead_options{.max_concurrent_calls = 2, .queue_limit = 100000},
                                  rs::bulkhead_options{.max_concurrent_calls = 2, .queue_limit = 0},
                                  rs::bulkhead_options{.max_concurrent_calls = 1, .queue_limit = 0});
    constexpr std::size_t loops = 4, chains = 4, chain_length = resilience_tests::stress_rounds(5000),
                          per_loop = chains * chain_length;
    rs::bulkhead bh{options};
    shared_counts c{loops * per_loop};
    rs::event_loop l0, l1, l2, l3;
    rs::event_loop* all[loops] = {&l0, &l1, &l2, &l3};
    for (std::size_t l = 0; l < loops; ++l)
        for (std::size_t k = 0; k < chains; ++k)
            all[l]->spawn(serial_client(bh, c, l * per_loop + k * chain_length, chain_length));
    resilience_tests::run_on_threads(l0, l1, l2, l3);

    CHECK(c.peak.load() <= static_cast<int>(options.max_concurrent_calls));
    CHECK(c.peak_in_flight.load() <= static_cast<int>(options.max_concurrent_calls));
    CHECK(c.running.load() == 0);
    CHECK(c.calls.values + c.calls.refused == static_cast<int>(loops * per_loop));
    CHECK(c.calls.failed == 0);
    CHECK(c.calls.cancelled == 0);
    REQUIRE(c.calls.completions.exactly_once() == loops * per_loop);
    if (options.queue_limit > 0)
        CHECK(c.calls.refused == 0);
    CHECK(bh.in_flight() == 0);
    CHECK(bh.queued() == 0);
}

TEST_CASE("bulkhead: one call at a time through sync_wait on each of four threads, never more than "
          "max_concurrent_calls run at once and every call ends",
          "[bulkhead][concurrency]") {
    const std::size_t queue_limit = GENERATE(std::size_t{0}, std::size_t{8});
    constexpr std::size_t threads = 4, per_thread = 5000;
    rs::bulkhead bh{{.max_concurrent_calls = 2, .queue_limit = queue_limit}};
    shared_counts c{threads * per_thread};
    std::latch go{threads};
    std::vector<std::thread> workers;
    for (std::size_t t = 0; t < threads; ++t)
        workers.emplace_back([&, t] {
            go.arrive_and_wait();
            for (std::size_t i = 0; i < per_thread; ++i)
                rs::sync_wait(threaded_client(bh, c, t * per_thread + i, {}, static_cast<int>(i % 2)));
        });
    for (auto& w : workers)
        w.join();

    CHECK(c.peak.load() <= 2);
    CHECK(c.peak_in_flight.load() <= 2);
    CHECK(c.running.load() == 0);
    CHECK(c.calls.values + c.calls.refused == static_cast<int>(threads * per_thread));
    CHECK(c.calls.failed == 0);
    REQUIRE(c.calls.completions.exactly_once() == threads * per_thread);
    if (queue_limit >= threads)
        CHECK(c.calls.refused == 0); // at most four calls at once: two run, the others wait
    CHECK(bh.in_flight() == 0);
    CHECK(bh.queued() == 0);
}

TEST_CASE("bulkhead state: try_acquire from threads released at the same instant never takes more than "
          "max_concurrent_calls slots",
          "[bulkhead][concurrency]") {
    // The fast paths alone, with nothing around them to spread the threads apart.
    constexpr std::size_t threads = 4, rounds = resilience_tests::stress_rounds(20000);
    slots s{{.max_concurrent_calls = 1}, {}};
    std::atomic<int> peak{0};
    std::atomic<std::size_t> taken{0};
    resilience_tests::in_lockstep(threads, rounds, [&](std::size_t, std::size_t) {
        if (s.try_acquire()) {
            ++taken;
            raise_to(peak, static_cast<int>(s.in_flight()));
            s.release();
        }
    });
    CHECK(peak.load() == 1);
    CHECK(taken.load() >= rounds); // in each round, someone got the slot
    CHECK(s.in_flight() == 0);
}

TEST_CASE("bulkhead: a waiter destroyed with its event loop leaves the queue, and the slot comes back",
          "[bulkhead]") {
    rs::bulkhead shared{{.max_concurrent_calls = 1, .queue_limit = 4}};
    struct never {
        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<>) const noexcept {}
        void await_resume() const noexcept {}
    };
    auto holds_forever = []() -> rs::task<int> {
        co_await never{};
        co_return 0;
    };
    auto quick = []() -> rs::task<int> { co_return 1; };
    {
        rs::testing::simulation sim;
        sim.spawn(shared.execute(holds_forever));         // takes the only slot and never gives it back...
        sim.spawn(shared.execute(quick));                 // ...so this one queues behind it
        CHECK_THROWS_AS(sim.run_all(), std::logic_error); // the simulation sees nothing can move
        CHECK(shared.queued() == 1);
    } // the loop is torn down: both coroutines are destroyed while suspended
    CHECK(shared.queued() == 0);
    CHECK(shared.in_flight() == 0);
    rs::testing::simulation again;
    CHECK(again.run(shared.execute(quick)) == 1); // the bulkhead is whole again
}

TEST_CASE("bulkhead: a queue_timeout too long to add to the clock waits instead of overflowing",
          "[bulkhead]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 1, .queue_timeout = nanoseconds::max()},
                    sim.clock()};
    rs::testing::scripted_action slow{sim.clock(), rs::testing::script<int>{.latency = 10ms, .value = 1}};
    sim.run([&]() -> rs::task<void> { co_await sim.sleep_for(1s); }()); // now + max must not wrap
    auto [a, b] = sim.run(rs::when_all(bh.execute_outcome(slow), bh.execute_outcome(slow)));
    CHECK(a.has_value());
    CHECK(b.has_value()); // waited its turn; a wrapped deadline would have refused it at once
    CHECK(sim.now() == 1s + 20ms);
}

// ---------------------------------------------------------------------------------------------------------
// Vocabulary: why a call was refused, names, defaults, equality and hashing.

namespace {

// Refused calls' reasons and policy names, by call id.
struct refusals {
    std::map<int, rs::rejection_reason> reason;
    std::map<int, std::string> name;
};

rs::task<void> hold_or_refuse(rs::testing::simulation& sim, rs::bulkhead<vclock>& bh, refusals& seen, int id,
                              nanoseconds arrive, nanoseconds hold) {
    if (arrive > sim.now())
        co_await sim.sleep_for(arrive - sim.now());
    auto action = [&sim, hold]() -> rs::task<int> {
        co_await sim.sleep_for(hold);
        co_return 1;
    };
    auto r = co_await bh.execute_outcome(std::move(action));
    if (r.has_failure())
        if (auto* e = r.error().template as<rs::bulkhead_rejected_error>()) {
            seen.reason[id] = e->reason();
            seen.name[id] = e->policy_name();
        }
}

} // namespace

TEST_CASE("bulkhead: a refusal says why: no_capacity, queue_full or queue_timeout, and names the bulkhead",
          "[bulkhead]") {
    rs::testing::simulation sim;
    using why = rs::rejection_reason;
    SECTION("queue_limit 0: refused at once, no_capacity") {
        rs::bulkhead bh{{.name = "db", .max_concurrent_calls = 1}, sim.clock()};
        CHECK(bh.name() == "db");
        refusals seen;
        sim.spawn(hold_or_refuse(sim, bh, seen, 1, 0ms, 100ms));
        sim.spawn(hold_or_refuse(sim, bh, seen, 2, 10ms, 0ms));
        sim.run_all();
        CHECK(seen.reason == std::map<int, why>{{2, why::no_capacity}});
        CHECK(seen.name[2] == "db");
    }
    SECTION("a full queue: queue_full; a wait that runs out: queue_timeout, at exactly that instant") {
        rs::bulkhead bh{{.name = "db", .max_concurrent_calls = 1, .queue_limit = 1, .queue_timeout = 50ms},
                        sim.clock()};
        refusals seen;
        sim.spawn(hold_or_refuse(sim, bh, seen, 1, 0ms, 100ms));
        sim.spawn(hold_or_refuse(sim, bh, seen, 2, 10ms, 0ms)); // queued, refused at 60 ms
        sim.spawn(hold_or_refuse(sim, bh, seen, 3, 20ms, 0ms)); // the queue is full
        std::size_t queued_at_59 = 99, queued_at_60 = 99;
        auto observe = [](rs::testing::simulation& s, rs::bulkhead<vclock>& b, std::size_t& before,
                          std::size_t& at) -> rs::task<void> {
            co_await s.sleep_for(59ms);
            before = b.queued();
            co_await s.sleep_for(1ms);
            co_await resilience_tests::yield_now{};
            at = b.queued();
        };
        sim.spawn(observe(sim, bh, queued_at_59, queued_at_60));
        sim.run_all();
        CHECK(seen.reason == std::map<int, why>{{2, why::queue_timeout}, {3, why::queue_full}});
        CHECK(seen.name[2] == "db");
        CHECK(queued_at_59 == 1);
        CHECK(queued_at_60 == 0);
    }
    SECTION("rs::unbounded_queue refuses no call for want of a queue place") {
        rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = rs::unbounded_queue}, sim.clock()};
        refusals seen;
        for (int id = 1; id <= 50; ++id)
            sim.spawn(hold_or_refuse(sim, bh, seen, id, 0ms, 1ms));
        sim.run_all();
        CHECK(seen.reason.empty());
        CHECK(sim.now() == 50ms);
    }
}

TEST_CASE("bulkhead: default options are valid: 25 calls at once, none queued", "[bulkhead]") {
    const rs::bulkhead_options defaults{};
    CHECK(defaults.max_concurrent_calls == 25);
    CHECK(defaults.queue_limit == 0);
    CHECK_FALSE(defaults.queue_timeout);
    CHECK(defaults.name.empty());
    rs::testing::simulation sim;
    rs::bulkhead bh{{}, sim.clock()};
    refusals seen;
    for (int id = 1; id <= 26; ++id)
        sim.spawn(hold_or_refuse(sim, bh, seen, id, 0ms, 10ms));
    sim.run_all();
    CHECK(seen.reason == std::map<int, rs::rejection_reason>{{26, rs::rejection_reason::no_capacity}});
    CHECK(seen.name[26].empty());
    CHECK_NOTHROW(rs::bulkhead<>{});
}

TEST_CASE("bulkhead: a call made through a copy that is destroyed before the call is awaited runs on the "
          "shared state",
          "[bulkhead]") {
    rs::testing::simulation sim;
    rs::bulkhead keeper{{.max_concurrent_calls = 1, .queue_limit = 1}, sim.clock()};
    auto act =
        rs::testing::scripted_action{sim.clock(), rs::testing::script<int>{.latency = 100ms, .value = 3}};
    auto first = keeper.execute(act);
    auto copy = std::make_unique<rs::bulkhead<vclock>>(keeper);
    // The fast path (a free slot) for one call, the waiting path (queued behind it) for the other.
    auto through_copy = copy->execute(act);
    auto queued_through_copy = copy->execute_outcome(act);
    copy.reset(); // the handle object is gone; `keeper` keeps the state alive
    std::vector<int> got;
    auto run = [](rs::task<int> t, std::vector<int>& out) -> rs::task<void> {
        out.push_back(co_await std::move(t));
    };
    auto run_outcome = [](rs::task<rs::outcome<int>> t, std::vector<int>& out) -> rs::task<void> {
        out.push_back((co_await std::move(t)).value());
    };
    sim.spawn(run(std::move(through_copy), got));
    sim.spawn(run_outcome(std::move(queued_through_copy), got));
    sim.run_all();
    CHECK(got == std::vector<int>{3, 3});
    CHECK(sim.now() == 200ms);
    CHECK(sim.run(std::move(first)) == 3);
    CHECK(keeper.in_flight() == 0);
}

TEST_CASE("bulkhead: copies are equal and hash alike, other bulkheads do not", "[bulkhead]") {
    rs::bulkhead a{{.name = "a", .max_concurrent_calls = 2}};
    const auto copy = a;
    rs::bulkhead other{{.name = "a", .max_concurrent_calls = 2}};
    CHECK(copy == a);
    CHECK(other != a);
    const std::hash<rs::bulkhead<>> h;
    CHECK(h(copy) == h(a));
    CHECK(copy.name() == "a");
    CHECK(copy.options().max_concurrent_calls == a.options().max_concurrent_calls); // one state
    static_assert(noexcept(a.in_flight()));
}

// ---------------------------------------------------------------------------------------------------------
// on_rejected: told of each refusal, before it is returned.

namespace {

// A bulkhead's queue_timeout on a clock without loop timers is bounded by a watchdog that sleeps
// beside the queued call (`wait_bounded`, bulkhead/state.hpp).
using loopless_vclock = resilience_tests::loopless_clock;

// What on_rejected was told: (instant, policy name, reason), in order.
struct told_log {
    std::vector<std::tuple<nanoseconds, std::string, rs::rejection_reason>> told;
};

// How each call ended, by id: the instant and describe()'s word, or the failure's what() for a
// failure that is not the bulkhead's.
using endings = std::map<int, std::pair<nanoseconds, std::string>>;

template <class B>
rs::task<void> arrive_and_hold(rs::testing::simulation& sim, const B& bh, endings& ended, int id,
                               nanoseconds arrive, nanoseconds hold, resilience::stop_token stop = {}) {
    if (arrive > sim.now())
        co_await sim.sleep_for(arrive - sim.now());
    auto action = [&sim, hold](resilience::stop_token st) -> rs::task<int> {
        co_await sim.sleep_for(hold, st);
        co_return 1;
    };
    auto r = co_await bh.execute_outcome(action, std::move(stop));
    const std::string how = describe(r);
    ended[id] = {sim.now(), how == "failure" ? r.error().what() : how};
}

// The three kinds of wait a bulkhead's call may make in the pipeline's frame (see bulkhead/state.hpp),
// each given the same options but `adapt` and the clock: plain, with `adapt` (its ticket taken once
// admitted), and with a watchdog bounding the queue timeout (a clock without loop timers). Until 0.2
// the last two waited in a coroutine of the bulkhead's own (`run`).
enum class wait_way { frame, adapt, watchdog };

template <class F>
void for_each_wait_way(rs::testing::simulation& sim, rs::bulkhead_options o, F&& scenario) {
    const wait_way way = GENERATE(wait_way::frame, wait_way::adapt, wait_way::watchdog);
    CAPTURE(static_cast<int>(way));
    if (way == wait_way::adapt)
        o.adapt = rs::aimd{.min = o.max_concurrent_calls, .max = o.max_concurrent_calls};
    if (way == wait_way::watchdog)
        scenario(rs::bulkhead{std::move(o), loopless_vclock{sim.clock()}});
    else
        scenario(rs::bulkhead{std::move(o), sim.clock()});
}

rs::bulkhead_options telling(told_log& log, rs::testing::simulation& sim, std::size_t queue_limit,
                             std::optional<nanoseconds> queue_timeout) {
    return {.name = "db",
            .max_concurrent_calls = 1,
            .queue_limit = queue_limit,
            .queue_timeout = queue_timeout,
            .on_rejected = [&log, &sim](const rs::rejection_event& e) {
                log.told.emplace_back(sim.now(), std::string(e.policy_name()), e.reason());
                CHECK(e.retry_after() == nanoseconds::zero());
            }};
}

} // namespace

TEST_CASE("bulkhead: a slot handed to a waiter whose event loop is torn down before it resumes comes back",
          "[bulkhead]") {
    // Unbounded; bounded by a timer on the waiter's loop; or bounded by a watchdog beside the wait (a
    // clock without loop timers), whose queue wait is the one the slot is handed to.
    const int way = GENERATE(0, 1, 2);
    CAPTURE(way);
    auto waiter_loop = std::make_unique<rs::testing::simulation>();
    const rs::bulkhead_options o{.max_concurrent_calls = 1,
                                 .queue_limit = 4,
                                 .queue_timeout = way > 0 ? std::optional<nanoseconds>{1h} : std::nullopt};
    std::coroutine_handle<> parked{};
    struct park {
        std::coroutine_handle<>* where;
        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<> h) const noexcept { *where = h; }
        int await_resume() const noexcept { return 0; }
    };
    auto holds = [&parked]() -> rs::task<int> { co_return co_await park{&parked}; };
    auto quick = []() -> rs::task<int> { co_return 1; };
    const auto scenario = [&](const auto& shared) {
        rs::testing::simulation holder_loop;
        holder_loop.spawn(shared.execute(holds)); // takes the only slot
        holder_loop.run_for(1ms);
        waiter_loop->spawn(shared.execute(quick)); // queues on the other loop
        waiter_loop->run_for(1ms);
        REQUIRE(shared.queued() == 1);
        std::exchange(parked, {}).resume(); // the holder's action ends...
        holder_loop.run_for(1ms);           // ...and its slot is handed to the waiter, posted to its loop
        CHECK(shared.queued() == 0);
        CHECK(shared.in_flight() == 1);
        waiter_loop.reset(); // torn down before the waiter resumed: the slot comes back, once
        CHECK(shared.in_flight() == 0);
        rs::testing::simulation again;
        CHECK(again.run(shared.execute(quick)) == 1);
        CHECK(shared.in_flight() == 0);
    };
    // The queue timeout's timer is armed on the waiter's loop, so on that loop's clock.
    if (way == 2)
        scenario(rs::bulkhead{o, loopless_vclock{waiter_loop->clock()}});
    else
        scenario(rs::bulkhead{o, waiter_loop->clock()});
}

TEST_CASE("bulkhead: on_rejected is told once per refusal with its reason, and never for a call admitted",
          "[bulkhead]") {
    using why = rs::rejection_reason;
    rs::testing::simulation sim;
    told_log log;
    SECTION("queue_limit 0: no_capacity, at the instant of the refusal") {
        for_each_wait_way(sim, telling(log, sim, 0, std::nullopt), [&](const auto& bh) {
            endings ended;
            sim.spawn(arrive_and_hold(sim, bh, ended, 1, 0ms, 100ms));
            sim.spawn(arrive_and_hold(sim, bh, ended, 2, 10ms, 10ms));  // refused
            sim.spawn(arrive_and_hold(sim, bh, ended, 3, 100ms, 10ms)); // the slot is free again
            sim.run_all();
            CHECK(log.told == decltype(log.told){{10ms, "db", why::no_capacity}});
            CHECK(ended == endings{{1, {100ms, "value"}}, {2, {10ms, "rejected"}}, {3, {110ms, "value"}}});
        });
    }
    SECTION("a full queue: queue_full at once; a wait that runs out: queue_timeout at exactly its deadline") {
        for_each_wait_way(sim, telling(log, sim, 1, 50ms), [&](const auto& bh) {
            endings ended;
            sim.spawn(arrive_and_hold(sim, bh, ended, 1, 0ms, 100ms));
            sim.spawn(arrive_and_hold(sim, bh, ended, 2, 10ms, 10ms)); // queued, refused at 60 ms
            sim.spawn(arrive_and_hold(sim, bh, ended, 3, 20ms, 10ms)); // the queue is full
            sim.spawn(arrive_and_hold(sim, bh, ended, 4, 70ms, 10ms)); // queued, admitted at 100 ms
            sim.run_all();
            CHECK(log.told ==
                  decltype(log.told){{20ms, "db", why::queue_full}, {60ms, "db", why::queue_timeout}});
            CHECK(ended == endings{{1, {100ms, "value"}},
                                   {2, {60ms, "rejected"}},
                                   {3, {20ms, "rejected"}},
                                   {4, {110ms, "value"}}});
            CHECK(bh.in_flight() == 0);
        });
    }
    SECTION("a waiter whose caller stops is cancelled, not refused: nothing is told") {
        for_each_wait_way(sim, telling(log, sim, 1, 50ms), [&](const auto& bh) {
            endings ended;
            resilience::stop_source stop;
            sim.spawn(arrive_and_hold(sim, bh, ended, 1, 0ms, 100ms));
            sim.spawn(arrive_and_hold(sim, bh, ended, 2, 10ms, 10ms, stop.get_token()));
            sim.spawn([](rs::testing::simulation& simulated, resilience::stop_source& s) -> rs::task<void> {
                co_await simulated.sleep_for(30ms);
                s.request_stop();
            }(sim, stop));
            sim.run_all();
            CHECK(log.told.empty());
            CHECK(ended == endings{{1, {100ms, "value"}}, {2, {30ms, "cancelled"}}});
        });
    }
}

TEST_CASE(
    "bulkhead: an on_rejected that throws ends the call with its exception, and the listener hears none",
    "[bulkhead]") {
    rs::testing::simulation sim;
    resilience_tests::heard_counts heard;
    int told = 0;
    rs::bulkhead_options o{.name = "db",
                           .max_concurrent_calls = 1,
                           .queue_limit = 1,
                           .queue_timeout = 50ms,
                           .on_rejected =
                               [&told](const rs::rejection_event& e) {
                                   ++told;
                                   throw std::domain_error(std::string("told: ") + rs::to_string(e.reason()));
                               },
                           .telemetry = heard.listener()};
    for_each_wait_way(sim, o, [&](const auto& bh) {
        endings ended;
        sim.spawn(arrive_and_hold(sim, bh, ended, 1, 0ms, 100ms));
        sim.spawn(arrive_and_hold(sim, bh, ended, 2, 10ms, 10ms)); // queued, its wait runs out at 60 ms
        sim.spawn(arrive_and_hold(sim, bh, ended, 3, 20ms, 10ms)); // the queue is full
        sim.spawn(arrive_and_hold(sim, bh, ended, 4, 70ms, 10ms)); // queued, admitted at 100 ms
        sim.run_all();
        CHECK(told == 2);
        CHECK(ended == endings{{1, {100ms, "value"}},
                               {2, {60ms, "told: queue_timeout"}},
                               {3, {20ms, "told: queue_full"}},
                               {4, {110ms, "value"}}});
        CHECK(heard.rejections == 0);
        CHECK(heard.waits == 1); // call 4's
        CHECK(bh.in_flight() == 0);
        CHECK(bh.queued() == 0);
    });
}

TEST_CASE("bulkhead: execute throws what on_rejected threw", "[bulkhead]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.name = "db",
                     .max_concurrent_calls = 1,
                     .on_rejected = [](const rs::rejection_event&) { throw std::domain_error("no"); }},
                    sim.clock()};
    auto hold = [&sim]() -> rs::task<int> {
        co_await sim.sleep_for(10ms);
        co_return 1;
    };
    auto second = [&]() -> rs::task<void> { CHECK_THROWS_AS(co_await bh.execute(hold), std::domain_error); };
    auto [first, ignored] = sim.run(rs::when_all(bh.execute(hold), second()));
    (void)ignored;
    CHECK(first == 1);
}

} // namespace test_bulkhead
