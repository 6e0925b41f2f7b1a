// SPDX-License-Identifier: MIT
// A bulkhead's hand-over of slots to waiters, which the granting thread wakes once it has released
// the mutex (bulkhead/state.hpp's `wake_chain`), held open at the instant between the two while
// another thread stops the waiter's caller, or runs the waiter's loop past its queue timeout.
// Whoever moved the node out of `queued` under the mutex owns its one resumption (engine/
// waiter_queue.hpp); the others find it moved on and do nothing, so the waiter neither resumes nor
// ends, and its node is not freed, before the grant's wake-up reads it.

#include "catch.hpp"
#include "support.hpp"

#include <resilience/bulkhead.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>

#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <optional>
#include <thread>

namespace test_bulkhead_wake {

namespace rs = resilience;
using namespace std::chrono_literals;
using bulkhead = rs::bulkhead<rs::testing::virtual_clock>;

namespace {

// How the call on the simulation's loop ended.
enum class ending : int { none, value, cancelled, rejected, other };

// Holds a coroutine until the test lets it go (`*held`), on the test's thread.
struct gate {
    explicit gate(std::coroutine_handle<>& h) noexcept : held(&h) {}
    std::coroutine_handle<>* held;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) const noexcept { *held = h; }
    void await_resume() const noexcept {}
};

struct scene {
    rs::testing::simulation sim; // the second waiter's loop, on virtual time
    bool stops = false;          // the second call's caller stops (else: its queue timeout)
    rs::stop_source stop;
    std::coroutine_handle<> holder_gate{}; // the holder's action, held at its gate
    int first_value = 0;
    std::size_t in_flight_at_grant = 0;
    // Written on the thread the second call ends on, read here after that thread is joined.
    std::atomic<int> second_ends{0};
    std::atomic<ending> second_end{ending::none};
    std::atomic<bool> second_ran{false};
    std::atomic<bool> ended_before_wake{false}; // ended while the grant had yet to wake it
};

// Started on the test's thread, outside any loop.
resilience_tests::started_here holder(const bulkhead& bh, scene& s) {
    (void)co_await bh.execute_outcome([&s]() -> rs::task<int> {
        co_await gate{s.holder_gate}; // holds the only slot until the test lets it go
        co_return 0;
    });
}

// The first waiter, outside any loop too, so the grant resumes it inline on the granting thread,
// before it wakes the second waiter, granted in the same locked step. Its action is that instant:
// another thread stops the second waiter's caller, or runs its loop past its queue timeout (and
// whatever that posted), and the action notes whether the second call ended meanwhile. The
// simulation is run by one thread at a time: this one joins that thread before going on.
resilience_tests::started_here first_waiter(const bulkhead& bh, scene& s) {
    auto r = co_await bh.execute_outcome([&s, &bh]() -> rs::task<int> {
        s.in_flight_at_grant = bh.in_flight();
        std::thread([&s] {
            if (s.stops)
                s.stop.request_stop();
            s.sim.run_until(2s); // the queue timeout (1 s) fires here
        }).join();
        s.ended_before_wake = s.second_ends.load() != 0;
        co_return 1;
    });
    s.first_value = r.has_value() ? *r : -1;
}

// The second waiter, on the simulation's loop.
rs::task<void> second_waiter(const bulkhead& bh, scene& s) {
    rs::context ctx{s.stops ? s.stop.get_token() : rs::stop_token{}};
    auto r = co_await bh.execute_outcome(
        [&s]() -> rs::task<int> {
            s.second_ran = true;
            co_return 2;
        },
        ctx);
    ending e = ending::other;
    if (r.has_value() && *r == 2)
        e = ending::value;
    else if (!r.has_value() && rs::is_cancellation(r.error()))
        e = ending::cancelled;
    else if (!r.has_value() && r.error().is<rs::bulkhead_rejected_error>())
        e = ending::rejected;
    s.second_end = e;
    ++s.second_ends;
}

} // namespace

TEST_CASE("bulkhead: a waiter granted by another thread is resumed by that grant alone, though its caller "
          "stops or its queue timeout fires before the grant wakes it",
          "[bulkhead][concurrency]") {
    scene s;
    s.stops = GENERATE(true, false);
    bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 4}, s.sim.clock()};

    holder(bh, s);
    REQUIRE(bh.in_flight() == 1);
    first_waiter(bh, s); // queued with no loop: resumed inline by whoever wakes it
    REQUIRE(bh.queued() == 1);
    if (!s.stops) // the second call pins options with a queue timeout, a timer on its loop
        bh.reconfigure({.max_concurrent_calls = 1, .queue_limit = 4, .queue_timeout = 1s});
    s.sim.spawn(second_waiter(bh, s));
    s.sim.run_until(0ns);
    REQUIRE(bh.queued() == 2);

    // Two more slots, handed to both waiters in one locked step; once the mutex is released they
    // are woken in order, the first one inline here: its action runs before the second one's wake.
    bh.reconfigure({.max_concurrent_calls = 3, .queue_limit = 4});
    CHECK(s.first_value == 1);
    CHECK(s.in_flight_at_grant == 3); // the holder's slot and both grants
    CHECK_FALSE(s.ended_before_wake); // neither the stop nor the timer resumed the granted waiter
    s.sim.run_all();                  // the second call, woken by the grant
    REQUIRE(s.holder_gate);
    s.holder_gate.resume(); // the holder ends and gives its slot back

    CHECK(s.second_ends == 1);
    if (s.stops) {
        // Granted, then stopped before it resumed: it gives the slot back and its action never runs.
        CHECK(s.second_end == ending::cancelled);
        CHECK_FALSE(s.second_ran);
    } else {
        // The timer found the node granted already: the call runs in the slot it was given.
        CHECK(s.second_end == ending::value);
        CHECK(s.second_ran);
    }
    CHECK(bh.in_flight() == 0);
    CHECK(bh.queued() == 0);
}

} // namespace test_bulkhead_wake
