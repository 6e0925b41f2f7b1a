// SPDX-License-Identifier: MIT
#include "catch.hpp"
#include "support.hpp"

#include <resilience/clock.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/when_all.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <vector>

namespace test_event_loop {

namespace rs = resilience;
using namespace std::chrono_literals;

TEST_CASE("event_loop: run returns the awaitable's value and rethrows its exception", "[event_loop]") {
    rs::event_loop loop;
    CHECK(loop.run([]() -> rs::task<int> { co_return 42; }()) == 42);
    auto fails = []() -> rs::task<int> {
        throw std::out_of_range("x");
        co_return 0; // a coroutine: the exception travels through the task and the loop
    };
    auto t = fails(); // created outside the check: only awaiting it may throw
    CHECK_THROWS_AS(loop.run(std::move(t)), std::out_of_range);
}

TEST_CASE("event_loop: current() names the loop only while it runs", "[event_loop]") {
    rs::event_loop loop;
    CHECK(rs::event_loop::current() == nullptr);
    rs::event_loop* seen = nullptr;
    loop.run([&]() -> rs::task<void> {
        seen = rs::event_loop::current();
        co_return;
    }());
    CHECK(seen == &loop);
    CHECK(rs::event_loop::current() == nullptr);
}

TEST_CASE("event_loop: work posted from another thread runs on the loop's thread",
          "[event_loop][concurrency]") {
    rs::event_loop loop;
    std::thread::id loop_thread, resumed_on;
    struct resume_from_other_thread {
        rs::event_loop* loop;
        std::thread* worker;
        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<> h) {
            *worker = std::thread([l = loop, h] { l->post(h); });
        }
        void await_resume() const noexcept {}
    };
    std::thread worker;
    loop.run([&]() -> rs::task<void> {
        loop_thread = std::this_thread::get_id();
        co_await resume_from_other_thread{&loop, &worker};
        resumed_on = std::this_thread::get_id();
    }());
    worker.join();
    CHECK(resumed_on == loop_thread);
}

// Counts the live objects of its kind: a spawned task's dropped value must be destroyed, once.
struct counted_value {
    static inline int alive = 0;
    counted_value() { ++alive; }
    counted_value(const counted_value&) { ++alive; }
    counted_value(counted_value&&) noexcept { ++alive; }
    ~counted_value() { --alive; }
};

TEST_CASE("event_loop: a spawned task's value is dropped, once, and its exception rethrown by run",
          "[event_loop]") {
    rs::event_loop loop;
    int ran = 0;
    for (int i = 0; i < 3; ++i)
        loop.spawn([](int& r) -> rs::task<counted_value> {
            ++r;
            co_return counted_value{};
        }(ran));
    loop.run();
    CHECK(ran == 3);
    CHECK(counted_value::alive == 0);

    loop.spawn([]() -> rs::task<counted_value> {
        throw std::runtime_error("no value");
        co_return counted_value{};
    }());
    CHECK_THROWS_WITH(loop.run(), "no value");
    CHECK(counted_value::alive == 0);
}

TEST_CASE("event_loop: destroyed with spawned calls that never ended, it destroys each once, a task "
          "and any other awaitable",
          "[event_loop]") {
    struct forever {
        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<>) const noexcept {}
        void await_resume() const noexcept {}
    };
    // An awaitable that is not a task, waiting forever, holding one counted value (moved into the
    // coroutine that runs it).
    struct held_forever : forever {
        std::unique_ptr<counted_value> held = std::make_unique<counted_value>();
    };
    int ended = 0;
    {
        rs::testing::simulation sim;
        rs::event_loop& loop = sim.loop();
        for (int i = 0; i < 2; ++i)
            loop.spawn([](int& e) -> rs::task<int> {
                counted_value local;
                co_await forever{};
                ++e;
                co_return 1;
            }(ended));
        loop.spawn(held_forever{});
        loop.run_until(1s); // each starts and waits
        CHECK(counted_value::alive == 3);
    }
    CHECK(counted_value::alive == 0); // the two tasks' locals and the awaitable, each destroyed once
    CHECK(ended == 0);
}

TEST_CASE("event_loop: a task spawned after it finished is not run again: its value is dropped, its "
          "exception rethrown by run",
          "[event_loop]") {
    rs::event_loop loop;
    // A task awaited to its end still holds its finished coroutine.
    const auto await_to_end = [](rs::task<int>& t) -> rs::task<int> {
        try {
            co_return co_await std::move(t);
        } catch (const std::runtime_error&) {
            co_return -1;
        }
    };
    auto done = []() -> rs::task<int> { co_return 7; }();
    CHECK(loop.run(await_to_end(done)) == 7);
    REQUIRE(done.valid());
    loop.spawn(std::move(done));
    CHECK_NOTHROW(loop.run());

    auto failed = []() -> rs::task<int> {
        throw std::runtime_error("finished failing");
        co_return 0;
    }();
    CHECK(loop.run(await_to_end(failed)) == -1);
    loop.spawn(std::move(failed));
    CHECK_THROWS_WITH(loop.run(), "finished failing");
}

TEST_CASE("event_loop: an exception escaping a spawned coroutine is rethrown by run", "[event_loop]") {
    rs::event_loop loop;
    loop.spawn([]() -> rs::task<void> {
        throw std::runtime_error("spawned");
        co_return;
    }());
    CHECK_THROWS_WITH(loop.run(), "spawned");
    // The loop is usable again afterwards.
    CHECK(loop.run([]() -> rs::task<int> { co_return 1; }()) == 1);
}

TEST_CASE("event_loop: timers due at the same instant fire in the order they were armed", "[event_loop]") {
    rs::testing::simulation sim;
    std::vector<int> order;
    auto sleeper = [&](int id, std::chrono::milliseconds d) -> rs::task<void> {
        co_await sim.sleep_for(d);
        order.push_back(id);
    };
    sim.run(rs::when_all(sleeper(1, 20ms), sleeper(2, 10ms), sleeper(3, 20ms), sleeper(4, 10ms)));
    CHECK(order == std::vector<int>{2, 4, 1, 3});
    CHECK(sim.now() == 20ms);
}

TEST_CASE("event_loop: a virtual-time loop reports a coroutine that can never resume", "[event_loop]") {
    rs::testing::simulation sim;
    struct forever {
        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<>) const noexcept {}
        void await_resume() const noexcept {}
    };
    CHECK_THROWS_AS(sim.run([]() -> rs::task<void> { co_await forever{}; }()), std::logic_error);
}

TEST_CASE("clock: a sleep stopped from another thread ends early and resumes on its own loop",
          "[clock][concurrency]") {
    rs::event_loop loop;
    resilience::stop_source stop;
    std::thread::id loop_thread, resumed_on;
    std::thread stopper;
    const auto started = std::chrono::steady_clock::now();
    loop.run([&]() -> rs::task<void> {
        loop_thread = std::this_thread::get_id();
        stopper = std::thread([&] { stop.request_stop(); });
        co_await rs::steady_clock{}.sleep_for(1h, stop.get_token());
        resumed_on = std::this_thread::get_id();
    }());
    stopper.join();
    CHECK(resumed_on == loop_thread);
    CHECK(std::chrono::steady_clock::now() - started < 1h); // it did not sleep the hour
}

TEST_CASE("clock: the steady clock refuses to sleep outside a loop or on virtual time", "[clock]") {
    rs::testing::simulation sim;
    auto nap = []() -> rs::task<void> { co_await rs::steady_clock{}.sleep_for(1ms, {}); };
    CHECK_THROWS_AS(sim.run(nap()), std::logic_error);
}

TEST_CASE("clock: a sleep whose instant has passed completes without suspending", "[clock]") {
    rs::testing::simulation sim;
    sim.run([&]() -> rs::task<void> {
        co_await sim.sleep_for(5s);
        auto c = sim.clock();
        co_await c.sleep_until(c.now() - 1s, {});
    }());
    CHECK(sim.now() == 5s);
}

TEST_CASE("event_loop: a spawned coroutine that ends on another thread wakes its loop",
          "[event_loop][concurrency]") {
    // Nothing is posted back to the loop: the coroutine simply finishes on the worker thread, and run()
    // must notice that the last spawned coroutine is done instead of sleeping forever. The worker gives
    // the loop time to go to sleep first, so a lost wake-up shows as a hang (caught by the test timeout);
    // nothing depends on that timing when the loop is right.
    resilience_tests::foreign_thread worker{std::chrono::milliseconds(20)};
    auto work = [&]() -> rs::task<int> {
        co_await worker.resume_here();
        co_return 5;
    };
    CHECK(rs::sync_wait(work()) == 5);
}

TEST_CASE("event_loop: a spawned coroutine that fails on another thread has its exception rethrown by run",
          "[event_loop][concurrency]") {
    // The failure is stored on the worker thread, where the coroutine ends, and read by run() on the
    // loop's thread; the TSan leg checks that the two are ordered.
    rs::event_loop loop;
    resilience_tests::foreign_thread worker;
    loop.spawn([](resilience_tests::foreign_thread& w) -> rs::task<void> {
        co_await w.resume_here();
        throw std::runtime_error("failed on the worker");
    }(worker));
    CHECK_THROWS_WITH(loop.run(), "failed on the worker");
    // The failure was taken: the loop runs again without it.
    CHECK(loop.run([]() -> rs::task<int> { co_return 2; }()) == 2);
}

TEST_CASE("clock: a sleep destroyed while its timer is armed takes the timer off its loop", "[clock]") {
    rs::testing::simulation timers; // the loop the sleep's timer is armed on
    {
        rs::testing::simulation runner;
        auto clock = timers.clock();
        auto sleeper = [clock]() -> rs::task<void> { co_await clock.sleep_for(1s, {}); };
        runner.spawn(sleeper());
        CHECK_THROWS_AS(runner.run_all(), std::logic_error); // nothing in `runner` can make progress
        CHECK(timers.loop().timers() == 1);
    } // the sleeping coroutine is destroyed with `runner`
    CHECK(timers.loop().timers() == 0);
    timers.run_all(); // nothing left to fire
    CHECK(timers.now() == 0s);
}

// ---------------------------------------------------------------------------------------------------------
// Timers at the edges of the timer wheel: far deadlines, ties, cancellation after cascading, instants
// already past, the largest deadline. Raw timers on virtual time, every instant exact.

namespace {

using ns = std::chrono::nanoseconds;
constexpr auto year = std::chrono::hours(24 * 365);
constexpr ns pow2(int bits) {
    return ns(std::int64_t{1} << bits);
}

/// A raw timer that writes (id, the loop's time) into `log` when it fires, then runs `then`. Must not move
/// while armed.
struct probe {
    // A timer finds its way back from the node: here, a node beside a pointer to its probe.
    struct node_type : rs::detail::timer_node {
        probe* self = nullptr;
    };
    rs::event_loop* loop;
    resilience_tests::instant_log* log;
    int id;
    std::function<void()> then{};
    node_type node{};

    probe(rs::testing::simulation& sim, resilience_tests::instant_log& l, int i)
        : loop(&sim.loop()), log(&l), id(i) {}
    probe(const probe&) = delete;
    probe& operator=(const probe&) = delete;

    void arm(ns when) {
        node.when = when;
        node.self = this;
        node.fire = [](rs::detail::timer_node* n) {
            probe* self = static_cast<node_type*>(n)->self;
            self->log->emplace_back(self->id, self->loop->now());
            if (self->then)
                self->then();
        };
        rs::detail::loop_access::add_timer(*loop, &node);
    }
    void cancel() { rs::detail::loop_access::remove_timer(*loop, &node); }
};

} // namespace

TEST_CASE("event_loop: timers far beyond the first wheel level fire at their exact instants",
          "[event_loop][timer_wheel]") {
    rs::testing::simulation sim;
    resilience_tests::instant_log log;
    // Each side of every power of 64 (a level of the wheel) up to 2^60, hours and years; armed out of
    // order.
    std::vector<ns> instants = {3 * year + 13ns, 1ns, 64ns, 63ns, 65ns, 4095ns, 4096ns, 4097ns};
    for (int bits = 18; bits <= 60; bits += 6)
        for (ns d : {-1ns, 0ns, 1ns})
            instants.push_back(pow2(bits) + d);
    for (ns d : std::initializer_list<ns>{1h + 7ns, 24h, 200 * year, 292 * year})
        instants.push_back(d);
    std::list<probe> probes;
    for (std::size_t i = 0; i < instants.size(); ++i)
        probes.emplace_back(sim, log, static_cast<int>(i)).arm(instants[i]);
    CHECK(sim.loop().timers() == instants.size());

    sim.run_all();

    resilience_tests::instant_log expected;
    for (std::size_t i = 0; i < instants.size(); ++i)
        expected.emplace_back(static_cast<int>(i), instants[i]);
    std::sort(expected.begin(), expected.end(), [](auto& a, auto& b) { return a.second < b.second; });
    CHECK(log == expected);
    CHECK(sim.now() == 292 * year);
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("event_loop: timers armed after a long jump fire at their exact instants, among older ones",
          "[event_loop][timer_wheel]") {
    rs::testing::simulation sim;
    resilience_tests::instant_log log;
    probe before{sim, log, 1}, after{sim, log, 2}, much_later{sim, log, 3};
    before.arm(1h + 9ns);
    after.arm(1h + 11ns);
    much_later.arm(1h + 10ns + pow2(40) + 1ns);
    sim.run([&]() -> rs::task<void> {
        co_await sim.sleep_for(1h + 7ns);
        log.emplace_back(0, sim.now());
        co_await sim.sleep_for(3ns);
        log.emplace_back(0, sim.now());
        co_await sim.sleep_for(pow2(40));
        log.emplace_back(0, sim.now());
        co_await sim.sleep_for(2 * year);
        log.emplace_back(0, sim.now());
    }());
    CHECK(log == resilience_tests::instant_log{{0, 1h + 7ns},
                                               {1, 1h + 9ns},
                                               {0, 1h + 10ns},
                                               {2, 1h + 11ns},
                                               {0, 1h + 10ns + pow2(40)},
                                               {3, 1h + 10ns + pow2(40) + 1ns},
                                               {0, 1h + 10ns + pow2(40) + 2 * year}});
}

TEST_CASE("event_loop: timers due at one instant fire in arming order, however long ago each was armed",
          "[event_loop][timer_wheel]") {
    rs::testing::simulation sim;
    resilience_tests::instant_log log;
    const ns at = 1h + 5ns;
    probe a{sim, log, 1}, b{sim, log, 2}, armed_late{sim, log, 3}, armed_while_firing{sim, log, 4},
        next{sim, log, 5}, arms_late{sim, log, 6};
    a.arm(at); // far away when armed: moves down the wheel on the way
    b.arm(at);
    next.arm(at + 1ns);
    arms_late.then = [&] { armed_late.arm(at); }; // 3 ns before: straight into the lowest level
    arms_late.arm(at - 3ns);
    a.then = [&] { armed_while_firing.arm(sim.now()); }; // the instant being fired
    sim.run_all();
    CHECK(log ==
          resilience_tests::instant_log{{6, at - 3ns}, {1, at}, {2, at}, {3, at}, {4, at}, {5, at + 1ns}});
}

TEST_CASE("event_loop: a timer cancelled after moving down the wheel never fires and holds no time",
          "[event_loop][timer_wheel]") {
    rs::testing::simulation sim;
    resilience_tests::instant_log log;
    const ns base = pow2(40);
    probe canceller{sim, log, 1}, near{sim, log, 2}, twin{sim, log, 3}, far{sim, log, 4},
        rearmed{sim, log, 5};
    canceller.arm(base + 50ns);
    near.arm(base + 100ns); // by base + 50 ns it shares every level but the lowest with the time
    twin.arm(base + 100ns);
    far.arm(base + pow2(20)); // cascaded once, to a middle level, by then
    rearmed.arm(base + 60ns);
    canceller.then = [&] {
        CHECK(sim.loop().timers() == 4);
        near.cancel();
        far.cancel();
        rearmed.cancel();
        rearmed.arm(base + 70ns); // the same node, again
        CHECK_FALSE(near.node.armed());
        CHECK_FALSE(far.node.armed());
        CHECK(sim.loop().timers() == 2);
        near.cancel(); // a second cancel is a no-op
        CHECK(sim.loop().timers() == 2);
    };
    sim.run_all();
    CHECK(log == resilience_tests::instant_log{{1, base + 50ns}, {5, base + 70ns}, {3, base + 100ns}});
    CHECK(sim.now() == base + 100ns); // not the cancelled far one's instant
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("event_loop: a timer armed for an instant already past fires on the next turn, at the "
          "current instant",
          "[event_loop][timer_wheel]") {
    rs::testing::simulation sim;
    resilience_tests::instant_log log;
    probe three{sim, log, 1}, zero{sim, log, 2}, earliest{sim, log, 3}, current{sim, log, 4},
        next{sim, log, 5}, from_a_timer{sim, log, 6}, arms_in_the_past{sim, log, 7},
        same_instant{sim, log, 8};
    next.arm(5s + 1ns);
    sim.run([&]() -> rs::task<void> {
        co_await sim.sleep_for(5s);
        current.arm(5s);
        three.arm(3s);
        zero.arm(0s);
        earliest.arm(ns::min());
        log.emplace_back(0, sim.now()); // arming fires nothing: this coroutine carries on first
        co_await sim.sleep_for(2ns);
        // A timer firing arms one in the past: it fires before the rest of this instant's timers.
        arms_in_the_past.then = [&] { from_a_timer.arm(1s); };
        arms_in_the_past.arm(10s);
        same_instant.arm(10s);
        co_await sim.sleep_for(10s - sim.now() + 1ns);
    }());
    // Late timers fire together, at the next turn, in the order they were armed (their instants are
    // all "now"), before any timer of the current instant and without moving time either way.
    CHECK(log ==
          resilience_tests::instant_log{
              {0, 5s}, {1, 5s}, {2, 5s}, {3, 5s}, {4, 5s}, {5, 5s + 1ns}, {7, 10s}, {6, 10s}, {8, 10s}});
    CHECK(sim.now() == 10s + 1ns);
}

TEST_CASE("event_loop: the largest deadline, nanoseconds::max(), neither overflows nor comes early",
          "[event_loop][timer_wheel]") {
    rs::testing::simulation sim;
    resilience_tests::instant_log log;
    probe last{sim, log, 1}, before_last{sim, log, 2}, hour{sim, log, 3}, at_the_end{sim, log, 4},
        at_the_end_again{sim, log, 5};
    last.arm(ns::max());
    before_last.arm(ns::max() - 1ns);
    hour.arm(1h);
    before_last.then = [&] { at_the_end.arm(sim.now() + 1ns); };
    last.then = [&] { at_the_end_again.arm(sim.now()); };
    sim.run_all();
    CHECK(log == resilience_tests::instant_log{
                     {3, 1h}, {2, ns::max() - 1ns}, {1, ns::max()}, {4, ns::max()}, {5, ns::max()}});
    CHECK(sim.now() == ns::max());
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("event_loop: on real time, sleeps end in deadline order and never before their deadline",
          "[event_loop][timer_wheel]") {
    // Forty sleeps within 30 ms: more than the wheel reads to find an exact deadline in one slot, so
    // the loop also wakes at slot boundaries on the way down.
    using clock = std::chrono::steady_clock;
    std::vector<std::pair<clock::time_point, int>> deadlines, woken;
    std::vector<rs::task<void>> sleepers;
    std::mt19937_64 rng{3};
    for (int id = 0; id < 40; ++id) {
        const auto deadline = clock::now() + 1ms + std::chrono::microseconds(rng() % 29'000);
        deadlines.emplace_back(deadline, id);
        sleepers.push_back([](clock::time_point at, int i, auto& log) -> rs::task<void> {
            co_await rs::steady_clock{}.sleep_until(at, {});
            log.emplace_back(clock::now(), i);
            CHECK(clock::now() >= at);
        }(deadline, id, woken));
    }
    rs::sync_wait(rs::when_all(std::move(sleepers)));
    std::sort(deadlines.begin(), deadlines.end());
    REQUIRE(woken.size() == deadlines.size());
    for (std::size_t i = 0; i < woken.size(); ++i) {
        CHECK(woken[i].second == deadlines[i].second);
        CHECK(woken[i].first >= deadlines[i].first);
    }
}

namespace {

/// The firing order the loop promises, kept the slow way: a list of armed timers, each with the
/// instant it fires at and its rank there. A timer armed before the wheel's time `cur` is late: it
/// fires at `cur`, before the timers of that instant, late ones in arming order; the others fire at
/// their deadline, ties in arming order.
class timer_model {
public:
    struct entry {
        ns at;
        bool on_time; // late ones first
        std::uint64_t seq;
        int id;
        auto rank() const { return std::tuple(at, on_time, seq); }
    };
    void arm(int id, ns when, ns cur) {
        entries_.push_back(when < cur ? entry{cur, false, seq_++, id} : entry{when, true, seq_++, id});
    }
    void cancel(int id) {
        std::erase_if(entries_, [&](const entry& e) { return e.id == id; });
    }
    bool empty() const { return entries_.empty(); }
    std::size_t size() const { return entries_.size(); }
    entry earliest() const {
        return *std::min_element(entries_.begin(), entries_.end(),
                                 [](const entry& a, const entry& b) { return a.rank() < b.rank(); });
    }
    ns deadline_of(std::size_t i) const { return entries_[i].at; }

private:
    std::vector<entry> entries_;
    std::uint64_t seq_ = 0;
};

ns saturating_add(ns t, ns d) {
    return d > ns::max() - t ? ns::max() : t + d;
}

/// A deadline relative to `now` such as tests of the wheel need: past (down to nanoseconds::min()),
/// now, each level's range, years, the very last instant, or the deadline of another armed timer.
ns random_deadline(std::mt19937_64& rng, ns now, const timer_model& model) {
    const auto below = [&](std::int64_t n) {
        return ns(static_cast<std::int64_t>(rng() % std::uint64_t(n)));
    };
    switch (rng() % 10) {
    case 0:
        return rng() % 8 == 0 ? ns::min() : now - below(10'000'000'000);
    case 1:
        return now;
    case 2:
        return saturating_add(now, below(64));
    case 3:
        return saturating_add(now, below(4096));
    case 4:
        return saturating_add(now, below(std::int64_t{1} << 20));
    case 5:
        return saturating_add(now, below(std::int64_t{1} << 40));
    case 6:
        return saturating_add(now, below(std::chrono::duration_cast<ns>(10 * year).count()));
    case 7:
        return rng() % 64 == 0 ? ns::max() : saturating_add(now, below(1'000'000));
    default:
        return model.empty() ? now : model.deadline_of(rng() % model.size());
    }
}

} // namespace

TEST_CASE("event_loop: random arming and cancelling on virtual time fires what a sorted list would, "
          "at its exact instant",
          "[event_loop][timer_wheel]") {
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
        CAPTURE(seed);
        rs::testing::simulation sim;
        resilience_tests::instant_log log;
        std::mt19937_64 rng{seed};
        timer_model model;
        std::deque<probe> probes;
        constexpr int count = 64;
        int budget = 3'000; // arming and cancelling operations left
        bool mismatch = false;

        const auto arm = [&](probe& p) {
            model.cancel(p.id);
            p.cancel();
            const ns when = random_deadline(rng, sim.now(), model);
            model.arm(p.id, when, sim.now());
            p.arm(when);
        };
        const auto operate = [&] {
            for (int n = 1 + static_cast<int>(rng() % 4); n > 0 && budget > 0; --n, --budget) {
                probe& p = probes[rng() % count];
                if (rng() % 4 == 0) {
                    model.cancel(p.id);
                    p.cancel();
                } else {
                    arm(p);
                }
            }
        };
        for (int i = 0; i < count; ++i) {
            probes.emplace_back(sim, log, i);
            probes.back().then = [&, id = i] {
                // Checked here, in the middle of firing: the wheel's choice against the model's.
                const auto e = model.earliest();
                if (e.id != id || e.at != sim.now())
                    mismatch = true;
                model.cancel(id);
                operate();
            };
        }
        for (int i = 0; i < count / 2; ++i)
            arm(probes[static_cast<std::size_t>(i)]);
        sim.run_all();
        CHECK_FALSE(mismatch);
        CHECK(model.empty());
        CHECK(sim.loop().timers() == 0);
        CHECK(budget == 0);
    }
}

TEST_CASE("timer_wheel: on a clock it does not drive, it never wakes its loop late, and fires what a "
          "sorted list would",
          "[event_loop][timer_wheel]") {
    // What a real-time loop does with the wheel: sleep until wake_at() (or wake earlier, for posted
    // work), then pop_due(now) until nothing is due, arming and cancelling timers in between.
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
        CAPTURE(seed);
        std::mt19937_64 rng{seed};
        ns now = 1'000'000'000'000ns; // any steady_clock reading
        rs::detail::timer_wheel wheel{now};
        ns cur = now; // the wheel's time, as the model sees it: what pop_due last reached
        timer_model model;
        constexpr int count = 64;
        std::vector<rs::detail::timer_node> nodes(count);
        const auto id_of = [&](rs::detail::timer_node* t) { return static_cast<int>(t - nodes.data()); };
        int fired = 0, wakes_in_a_row = 0, most_wakes_in_a_row = 0;

        const auto operate = [&] {
            for (int n = static_cast<int>(rng() % 4); n > 0; --n) {
                const int id = static_cast<int>(rng() % count);
                model.cancel(id);
                wheel.erase(&nodes[static_cast<std::size_t>(id)]);
                if (rng() % 4 != 0) {
                    nodes[static_cast<std::size_t>(id)].when = random_deadline(rng, now, model);
                    model.arm(id, nodes[static_cast<std::size_t>(id)].when, cur);
                    wheel.insert(&nodes[static_cast<std::size_t>(id)]);
                }
            }
            wakes_in_a_row = 0;
        };
        for (int step = 0; step < 3'000 && now < ns::max(); ++step) {
            if (rng() % 2)
                operate();
            REQUIRE(wheel.size() == model.size());
            if (wheel.empty()) {
                now = saturating_add(now, ns(static_cast<std::int64_t>(rng() % 1'000'000)));
            } else {
                const ns wake = wheel.wake_at();
                REQUIRE(wake <= model.earliest().at); // never late
                if (rng() % 4 == 0) {
                    now =
                        saturating_add(now, ns(static_cast<std::int64_t>(rng() % 1'000'000))); // posted work
                } else if (wake > now) {
                    now = wake;
                    ++wakes_in_a_row;
                }
            }
            bool any = false;
            while (rs::detail::timer_node* t = wheel.pop_due(now)) {
                const auto e = model.earliest();
                REQUIRE(id_of(t) == e.id);
                REQUIRE(e.at <= now);
                REQUIRE_FALSE(t->armed());
                cur = e.at;
                model.cancel(e.id);
                ++fired;
                any = true;
                if (rng() % 2)
                    operate();
            }
            cur = std::max(cur, now);
            REQUIRE((model.empty() || model.earliest().at > now));
            if (any)
                wakes_in_a_row = 0;
            most_wakes_in_a_row = std::max(most_wakes_in_a_row, wakes_in_a_row);
        }
        CHECK(fired > 100);
        // Woken early only on the way down to a crowded slot: at most once per level above the lowest.
        CHECK(most_wakes_in_a_row <= 10);
    }
}

} // namespace test_event_loop
