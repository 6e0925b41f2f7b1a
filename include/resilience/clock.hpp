// SPDX-License-Identifier: MIT
/// \file clock.hpp
/// `steady_clock`: the default clock of every policy, sleeping on the caller's event loop.
#pragma once

#include "concepts.hpp"
#include "context.hpp"
#include "event_loop.hpp"
#include "stop_token.hpp"

#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>
#include <type_traits>

#if defined(__linux__)
#include <time.h> // clock_gettime, CLOCK_MONOTONIC_COARSE
#endif

namespace resilience::inline v0_2 {

namespace detail {

/// Where one of the library's timers runs: in an event loop's wheel, or, when `loop` is null, among the
/// timers of a home that is not an event loop (an Asio call's executor). What a sleep and a deadline
/// timer both arm, disarm and post their wake-ups through.
class timer_place {
public:
    timer_place(event_loop* loop, home_loop* foreign) noexcept
        : word_(loop ? reinterpret_cast<std::uintptr_t>(loop)
                     : (foreign ? reinterpret_cast<std::uintptr_t>(foreign) | foreign_tag : 0)) {}

    /// The event loop, or null when the timers are a foreign home's (or there are none).
    event_loop* loop() const noexcept {
        return word_ & foreign_tag ? nullptr : reinterpret_cast<event_loop*>(word_);
    }
    /// The foreign home, when `loop()` is null; null when there is neither.
    home_loop* foreign() const noexcept {
        return word_ & foreign_tag ? reinterpret_cast<home_loop*>(word_ & ~foreign_tag) : nullptr;
    }

    void add(timer_node* node) const { // may allocate (the wheel's levels)
        if (event_loop* l = loop())
            loop_access::add_timer(*l, node);
        else
            foreign()->add_timer(node);
    }
    void remove(timer_node* node) const noexcept {
        if (event_loop* l = loop())
            loop_access::remove_timer(*l, node);
        else
            foreign()->remove_timer(node);
    }
    void post(job j) const { // may allocate
        if (event_loop* l = loop())
            loop_access::post(*l, j);
        else
            foreign()->post(j);
    }
    home_loop* home() const noexcept {
        if (event_loop* l = loop())
            return loop_access::home(l);
        return foreign();
    }

private:
    // The loop's address, or the foreign home's tagged with `foreign_tag`: one word in every timer
    // of a call's frame.
    static constexpr std::uintptr_t foreign_tag = 1;
    std::uintptr_t word_;
};

/// Suspends the awaiting coroutine until `when` on `loop`'s clock, or until `token` is stopped,
/// whichever comes first. Exactly one of the two resumes it, always on the loop's thread: a stop
/// requested on another thread posts the wake-up instead of running the waiter there. Made with a
/// home that is not an event loop (an Asio call's), the same on that home's timers, `when` being
/// time since `std::chrono::steady_clock`'s epoch.
class sleep_awaiter : private timer_node, private stop_callback_node {
    // It is its own timer (`fire` casts back) and its own stop callback, listed on the token's state
    // while it sleeps with a token that may stop: 112 bytes, in the frame of every sleeping call.
public:
    sleep_awaiter(event_loop* loop, std::chrono::nanoseconds due, stop_token token) noexcept
        : stop_callback_node(&on_stop), at_{loop, nullptr}, token_(std::move(token)) {
        node().when = due;
    }
    sleep_awaiter(home_loop* foreign, std::chrono::nanoseconds due, stop_token token) noexcept
        : stop_callback_node(&on_stop), at_{nullptr, foreign}, token_(std::move(token)) {
        node().when = due;
    }
    sleep_awaiter(const sleep_awaiter&) = delete;
    sleep_awaiter& operator=(const sleep_awaiter&) = delete;
    sleep_awaiter(sleep_awaiter&& o) noexcept
        : stop_callback_node(&on_stop), at_(o.at_), token_(std::move(o.token_)) {
        node().when = o.node().when;
    }
    /// Reached armed only when the sleeping coroutine is destroyed without being resumed (its loop is
    /// being torn down): the timer leaves the loop's timers with it.
    RESILIENCE_DETAIL_NOINLINE RESILIENCE_DECL ~sleep_awaiter();

    bool await_ready() const noexcept {
        if (token_.stop_requested())
            return true;
        if (event_loop* l = at_.loop())
            return node().when <= l->now();
        return at_.foreign() && node().when <= std::chrono::steady_clock::now().time_since_epoch();
    }
    RESILIENCE_DETAIL_NOINLINE RESILIENCE_DECL void await_suspend(std::coroutine_handle<> h);
    void await_resume() noexcept { stop_listening(); }

private:
    // Run by a stop request on the token, on the thread that asks: posting may allocate.
    RESILIENCE_DECL static void on_stop(stop_callback_node* n) noexcept;
    RESILIENCE_DECL static void cancelled(void* p);
    timer_node& node() noexcept { return *this; }
    const timer_node& node() const noexcept { return *this; }
    // Takes this awaiter off the token's list, waiting for an `on_stop` running on another thread. Never
    // at the same time as `await_suspend`: the sleep's wake-ups (`fire`, `cancelled`) run on its home, one
    // at a time, so `add` has returned (and marked the node finished if it did not list it) by then.
    void stop_listening() noexcept {
        if (listening_) {
            listening_ = false;
            stop_access::state(token_)->remove(this);
        }
    }

    std::atomic<bool> claimed_{false}; // in the stop callback node's tail padding
    bool listening_ = false;           // handed to the token's stop state (`on_stop` may run)
    timer_place at_;
    stop_token token_;
    std::coroutine_handle<> waiter_;
};

/// A clock whose sleeps are timers of an `event_loop` can hand out that loop, so a policy can arm
/// a timer directly instead of running a sleeping coroutine beside the call (see `deadline_timer`).
/// A clock that only sometimes has loop timers (`any_clock`) declares
/// `static constexpr bool timer_loop_may_be_null = true`: a null `timer_loop()` then means "no loop
/// timers", and a policy must wait by sleeping on the clock instead.
template <class C>
concept loop_timer_clock = requires(const C& c) {
    { c.timer_loop() } -> std::same_as<event_loop*>;
};

template <class C>
inline constexpr bool timer_loop_may_be_null = requires { requires C::timer_loop_may_be_null; };

/// A one-shot timer that expires a `lazy_stop` at `when`, unless disarmed first. Used by policies
/// that race a deadline against a call they are awaiting (timeout): arming and disarming cost a
/// link and an unlink in the loop's timer wheel, with no coroutine, stop source or allocation.
///
/// Firing takes its own copy of the stop source (if a token was made) and marks the timer fired
/// *before* requesting the stop: stop callbacks run inline and may finish the whole call, owner
/// and timer included, before `request_stop` returns. Disarming on the loop's thread is immediate. A call that finished on
/// another thread disarms by posting to the loop and resuming there, so the owner always carries
/// on on its own loop.
class deadline_timer : private timer_node { // the timer itself: its `fire` casts back
public:
    deadline_timer(event_loop* loop, std::chrono::nanoseconds due, lazy_stop& target)
        : at_{loop, nullptr}, target_(&target) {
        if (!loop) // a clock without loop timers reached here: report it rather than crash
            throw std::logic_error("resilience: a deadline timer needs an event loop, and the clock's "
                                   "timer_loop() returned null (a clock without loop timers)");
        arm(due);
    }
    /// The same on the timers of a home that is not an event loop (an Asio call's), `when` being
    /// time since `std::chrono::steady_clock`'s epoch.
    deadline_timer(home_loop* foreign, std::chrono::nanoseconds due, lazy_stop& target)
        : at_{nullptr, foreign}, target_(&target) {
        arm(due);
    }
    deadline_timer(const deadline_timer&) = delete;
    deadline_timer& operator=(const deadline_timer&) = delete;
    ~deadline_timer() {
        // Only reached armed when the owning coroutine is destroyed without finishing (loop teardown).
        if (node().armed())
            at_.remove(&node());
    }

    /// True once the deadline passed and the stop was requested. Read after `disarm()`.
    bool expired() const noexcept { return state_.load(std::memory_order_acquire) == fired; }

    /// Awaitable: the timer will not fire after this completes, and the awaiter is on the loop.
    auto disarm() noexcept {
        struct awaiter {
            deadline_timer* self;
            bool await_ready() noexcept { return self->try_disarm_here(); }
            void await_suspend(std::coroutine_handle<> h) {
                std::construct_at(&self->waiter_, h); // `target_` is done with (see the member)
                const job j{[](void* p) {
                                auto* t = static_cast<deadline_timer*>(p);
                                t->at_.remove(&t->node()); // no-op unless still armed
                                t->waiter_.resume();
                            },
                            self};
                self->at_.post(j);
            }
            void await_resume() const noexcept {}
        };
        return awaiter{this};
    }

    /// Disarms without suspending when it can (on the loop's thread, or once a cross-thread
    /// cancel won): true when done. False: `co_await disarm()` finishes it on the loop.
    bool try_disarm_here() noexcept {
        if (home_loop::current() == at_.home()) {
            // Where the timer fires (the loop's thread, the home's serialised executor): it is not
            // between its two steps right now.
            if (state_.load(std::memory_order_relaxed) == armed) {
                state_.store(cancelled, std::memory_order_relaxed);
                at_.remove(&node());
            }
            return true;
        }
        int expected = armed;
        if (!state_.compare_exchange_strong(expected, cancelled, std::memory_order_acq_rel))
            while (state_.load(std::memory_order_acquire) == firing)
                std::this_thread::yield(); // a copy, then done
        return false;
    }

private:
    enum : int { armed, firing, fired, cancelled };

    void arm(std::chrono::nanoseconds due) {
        node().when = due;
        node().fire = [](timer_node* n) {
            auto* self = static_cast<deadline_timer*>(n);
            int expected = armed;
            if (!self->state_.compare_exchange_strong(expected, firing, std::memory_order_acq_rel))
                return;
            stop_source stop = self->target_->expire(); // shares the stop state: outlives the owner
            self->state_.store(fired, std::memory_order_release);
            if (stop.stop_possible())
                stop.request_stop(); // from here on, `self` may be gone
        };
        at_.add(&node());
    }

    timer_node& node() noexcept { return *this; }
    const timer_node& node() const noexcept { return *this; }

    std::atomic<int> state_{armed}; // first: in the timer node's tail padding
    timer_place at_;
    // The stop to expire, read by the firing alone; then, once a disarm from another thread has
    // found the timer cancelled or fired (`try_disarm_here` false: the firing will not read
    // `target_` again), the coroutine that awaits the disarm. One word for the two.
    union {
        lazy_stop* target_;
        std::coroutine_handle<> waiter_;
    };
};

} // namespace detail

/// The default clock: `std::chrono::steady_clock` time, sleeping where the call runs: on the event loop
/// that runs the awaiting coroutine (`event_loop::current()`), or, in a call started from Asio code
/// (`rs::asio::execute`, `async_run`, `spawn`, and the Boost.Asio ones), on timers of that call's
/// executor. Sleeping outside both, or inside a virtual-time loop, is a usage error reported as
/// `std::logic_error`. Stateless and copyable.
struct steady_clock {
    /// Inside an Asio call there are no loop timers (`timer_loop()` is null): a policy then sleeps on
    /// the call's executor, and a timeout arms a timer of that call's home (`foreign_timer_home`;
    /// see `detail::loop_timer_clock`).
    static constexpr bool timer_loop_may_be_null = true;
    using duration = std::chrono::steady_clock::duration;
    using time_point = std::chrono::steady_clock::time_point;

    time_point now() const noexcept { return std::chrono::steady_clock::now(); }

    auto sleep_until(time_point tp, stop_token token) const {
        struct awaitable {
            using standalone_awaiter [[maybe_unused]] =
                void; // what `co_await` gives refers to nothing of this
            std::chrono::nanoseconds when;
            stop_token token;
            detail::sleep_awaiter operator co_await() && {
                detail::home_loop* const home = detail::home_loop::current();
                if (home && !home->is_event_loop()) // an Asio call's: its timers
                    return detail::sleep_awaiter{home, when, std::move(token)};
                event_loop* loop = event_loop::current();
                if (loop && loop->is_virtual())
                    throw std::logic_error("resilience::steady_clock: sleeping on a virtual-time loop; "
                                           "give the policy the simulation's clock()");
                return detail::sleep_awaiter{loop, when, std::move(token)};
            }
        };
        return awaitable{tp.time_since_epoch(), std::move(token)};
    }
    auto sleep_for(duration d, stop_token token) const { return sleep_until(now() + d, std::move(token)); }

    /// The loop that timers of this clock run on: the calling thread's (see `detail::loop_timer_clock`);
    /// null inside an Asio call, whose home has no loop timers (its sleeps are that home's timers).
    event_loop* timer_loop() const {
        event_loop* loop = event_loop::current();
        if (!loop) {
            if (detail::home_loop* home = detail::home_loop::current(); home && !home->is_event_loop())
                return nullptr;
        }
        if (!loop || loop->is_virtual())
            throw std::logic_error(
                "resilience::steady_clock: timers need a real-time event loop on this thread "
                "(sync_wait, event_loop::run); on virtual time use the simulation's clock()");
        return loop;
    }
};

static_assert(clock<steady_clock>);

/// `steady_clock` with a cheaper `now()`: on Linux the kernel's coarse monotonic clock
/// (`CLOCK_MONOTONIC_COARSE`: the time of the last timer tick, read without the hardware counter,
/// about a quarter of the cost), elsewhere the same reading as `steady_clock`. Its time points are
/// `std::chrono::steady_clock`'s (same epoch) and its sleeps and timers are `steady_clock`'s, exact.
/// Only readings are coarse: they lag the true time by up to `resolution()` (one kernel tick,
/// typically 1 to 4 ms). What that means for each policy is in docs/core.md ("A cheaper now").
struct coarse_steady_clock : steady_clock {
    time_point now() const noexcept {
#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)
        timespec ts;
        if (::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) == 0)
            return time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
#endif
        return std::chrono::steady_clock::now();
    }
    /// How far a reading may lag: the coarse clock's tick (0 where `now()` is `steady_clock`'s).
    static std::chrono::nanoseconds resolution() noexcept {
#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)
        timespec ts;
        if (::clock_getres(CLOCK_MONOTONIC_COARSE, &ts) == 0)
            return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
#endif
        return std::chrono::nanoseconds{0};
    }
};

static_assert(clock<coarse_steady_clock>);

namespace detail {
/// Whether clock `C`'s timers are those of an Asio call's home wherever `C` has no loop timers:
/// `steady_clock`'s and `coarse_steady_clock`'s (whose time is `steady_clock`'s). For such a clock a
/// policy always has a timer to arm, on the loop or on the home (`foreign_timer_home`).
template <class C>
inline constexpr bool home_timers_when_loopless =
    std::is_same_v<C, steady_clock> || std::is_same_v<C, coarse_steady_clock>;

/// The home whose timers a policy on clock `C` arms when `C` has no loop timers here: inside an Asio
/// call, the home's, for a clock of `home_timers_when_loopless`; null otherwise (the policy then waits
/// beside the call by sleeping on the clock).
template <class C>
home_loop* foreign_timer_home(const C&) noexcept {
    if constexpr (home_timers_when_loopless<C>) {
        home_loop* const h = home_loop::current();
        return h && !h->is_event_loop() ? h : nullptr;
    } else {
        return nullptr;
    }
}
} // namespace detail

} // namespace resilience

#if RESILIENCE_INCLUDE_DEFINITIONS
#include "impl/clock.ipp"
#endif
