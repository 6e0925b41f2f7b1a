// SPDX-License-Identifier: MIT
/// \file detail/limiter_state.hpp
/// `limiter_state`: the first-come-first-served queue of the rate limiters, driven by a meter that
/// counts the permits (`token_bucket`, `window_counter`).
#pragma once

#include "../clock.hpp"
#include "../task.hpp"
#include "shared_handle.hpp"
#include "time.hpp"
#include "waiter_queue.hpp"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stop_token>
#include <utility>

namespace resilience::detail {

/// The outcome of asking a limiter for one token: `granted`, `rejected` or `expired` (with
/// `retry_after`), or `stopped`.
struct admission {
    waiter_state state = waiter_state::idle;
    std::chrono::nanoseconds retry_after{};
};

/// The longest wait a limiter tells or sleeps: 2^62 ns, about 146 years (a rate of a token per
/// century). Due times and `retry_after` beyond it are held there, so adding one to a clock's time
/// cannot overflow; `redis::rate_limiter` holds Redis's answers at the same bound.
inline constexpr std::chrono::nanoseconds longest_wait{std::int64_t{1} << 62};

// Rounds a time in nanoseconds (a double, from the meters) up to a whole nanosecond, so nobody is
// woken or told to come back before the permit is really there. Times beyond `longest_wait` are
// held there.
inline std::chrono::nanoseconds ceil_ns(double ns) noexcept {
    constexpr std::int64_t far = longest_wait.count();
    const double up = std::ceil(ns);
    if (!(up < static_cast<double>(far))) // also NaN, which no meter makes: never sooner than can be told
        return std::chrono::nanoseconds(far);
    if (up < -static_cast<double>(far))
        return std::chrono::nanoseconds(-far);
    return std::chrono::nanoseconds(static_cast<std::int64_t>(up));
}

/// A meter that can also hand out permits without the limiter's mutex (see `limiter_state`).
template <class M>
concept lock_free_meter = requires(M& m, std::chrono::nanoseconds now) {
    { m.try_take_shared(now) } -> std::same_as<bool>;
    m.hold();
    m.unhold();
};

/// The waiting machinery shared by `rate_limiter` and `sliding_window_limiter`; `Meter` does the
/// counting. A meter is called with the mutex held, with times as nanoseconds since the limiter
/// was made (never decreasing), and provides:
///
///     bool try_take(nanoseconds now);                      // spends one permit if there is one
///     double available_at(nanoseconds now, size_t ahead);  // when a caller with `ahead` callers
///                                                          // before it would get its permit (>= now)
///     double remaining(nanoseconds now);                   // permits available now
///
/// The queue's front waiter (the head) is the only one that watches the clock: it sleeps until
/// its permit is due, takes it, leaves, and hands the timing to the next waiter, which it wakes.
/// A head whose caller stops leaves the same way. Other waiters just sit in the queue until they
/// become the head or their caller stops. So a new call never takes a permit while anyone waits,
/// and no timer runs for a limiter nobody waits on.
///
/// A queue timeout needs no timer of its own either. Every waiter's deadline is its queueing time
/// (read under the mutex, so never decreasing along the queue) plus the same timeout, so the head
/// always has the earliest deadline: it sleeps until its permit is due or its deadline, whichever
/// comes first, and at its deadline leaves (`expired`) and hands the turn on. The next waiter
/// takes over at that instant, so its own deadline, no earlier, is never missed.
///
/// A `lock_free_meter` keeps its state where calls can take a permit without the mutex, at any
/// reading of the clock (a stale one sees fewer permits, never more):
///
///     bool try_take_shared(nanoseconds now) noexcept; // spends one permit if there is one and
///                                                     // the mutex side does not hold the state
///     void hold() noexcept;   // mutex held: takes the state over; the calls above now say no
///     void unhold() noexcept; // mutex held: hands it back (nothing if not held)
///
/// and its other functions are called only while held. The mutex side holds it while it decides
/// and for exactly as long as anyone waits, so a permit taken without the mutex is never taken
/// ahead of a waiter, and the mutex side always sees a state nobody else changes.
template <clock C, class Meter>
struct limiter_state : shared_state {
    limiter_state(Meter m, C c, std::size_t queue_limit_,
                  std::optional<std::chrono::nanoseconds> queue_timeout_ = std::nullopt)
        : meter(std::move(m)), clock(std::move(c)), origin(clock.now()), queue_limit(queue_limit_),
          queue_timeout(queue_timeout_) {}
#ifndef NDEBUG
    ~limiter_state() { assert(queue.empty()); } // a waiting call holds the limiter
#endif

    Meter meter;
    C clock;
    const typename C::time_point origin;
    const std::size_t queue_limit;
    const std::optional<std::chrono::nanoseconds> queue_timeout;
    std::mutex mutex;
    waiter_queue queue;

    std::chrono::nanoseconds latest{}; // the latest time a decision under the mutex used

    std::chrono::nanoseconds since_origin(typename C::time_point t) const {
        const auto e = std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin);
        return std::max(e, std::chrono::nanoseconds::zero());
    }
    std::chrono::nanoseconds elapsed_locked() {
        // Read under the mutex, so the meter sees times in the order its decisions are made.
        latest = std::max(latest, since_origin(clock.now()));
        return latest;
    }
    typename C::time_point time_point_of(double ns) const {
        return detail::add_saturating(origin, ceil_ns(ns)); // ns >= 0: a due time, never before now
    }

    // Made with `mutex` held, ended before it is released: a lock-free meter's state is held by the
    // mutex side meanwhile, and stays held afterwards exactly while anyone waits.
    struct meter_lease {
        limiter_state& s;
        explicit meter_lease(limiter_state& owner) noexcept : s(owner) {
            if constexpr (lock_free_meter<Meter>)
                s.meter.hold();
        }
        meter_lease(const meter_lease&) = delete;
        meter_lease& operator=(const meter_lease&) = delete;
        ~meter_lease() { s.waiter_left_locked(); }
    };
    // Also called by `stop_waiter` and `queue_awaiter` when a waiter leaves on its own: the meter's
    // state goes back to the fast path as soon as nobody waits.
    void waiter_left_locked() noexcept {
        if constexpr (lock_free_meter<Meter>)
            if (queue.empty())
                meter.unhold();
    }

    // ---- the waiter_queue protocol; `mutex` held ----
    waiter_state decide_locked(waiter& w) {
        meter_lease lease{*this};
        const auto now = elapsed_locked();
        if (queue.empty() && meter.try_take(now))
            return waiter_state::granted;
        if (queue.size() >= queue_limit) {
            w.retry_after = ceil_ns(meter.available_at(now, queue.size())) - now;
            return waiter_state::rejected;
        }
        return waiter_state::idle;
    }
    // The meter is held before the waiter is queued: a permit taken without the mutex is taken
    // before this waiter queued, never after, however the two race.
    waiter_state enqueue_locked(waiter& w) noexcept {
        meter_lease lease{*this};
        if (queue_timeout) {
            const auto now = elapsed_locked();
            w.deadline = *queue_timeout < std::chrono::nanoseconds::max() - now
                             ? now + *queue_timeout
                             : std::chrono::nanoseconds::max();
        }
        queue.push_back(w);
        return queue.front() == &w ? waiter_state::turn : waiter_state::queued;
    }

    /// The fast path: a permit at `now`, a reading of `clock` the caller made, with nobody waiting.
    /// False: no permit now or someone waits; the caller goes on to `wait`, which decides again.
    /// Without the mutex for a `lock_free_meter`.
    [[nodiscard]] bool try_take_now(typename C::time_point now) {
        if constexpr (lock_free_meter<Meter>) {
            return meter.try_take_shared(since_origin(now));
        } else {
            std::lock_guard lock(mutex);
            // A reading made before the lock may be older than one a decision already used.
            return queue.empty() && meter.try_take(std::max(since_origin(now), latest));
        }
    }
    [[nodiscard]] bool try_take_now() { return try_take_now(clock.now()); }

    /// The slow path: refuse, or wait for a permit in arrival order.
    task<admission> wait(std::stop_token token) {
        waiter node;
        waiter_state st = co_await queue_awaiter<limiter_state>{*this, node, token};
        if (st == waiter_state::turn) {
            // Passes the turn on if `serve_turn` cannot even start (its frame not allocated);
            // once it runs, its own guard does it first and this one finds nothing to do.
            turn_guard guard{this, &node};
            st = co_await serve_turn(node, token);
        }
        co_return admission{st, node.retry_after};
    }

    /// The head's part of a wait: `node` has its turn; ends with its final state.
    task<waiter_state> serve_turn(waiter& node, std::stop_token token) {
        // However this coroutine ends (a value, an exception from the clock, or destroyed while
        // asleep), the turn passes on: the waiters behind are never stranded.
        turn_guard guard{this, &node};
        // While it is the head, a stop takes it out of the queue at once and hands the turn
        // on, as for any waiter; its sleep, stopped by the same token, then ends the loop.
        std::optional<std::stop_callback<leave_on_stop>> on_stop;
        if (token.stop_possible())
            on_stop.emplace(token, leave_on_stop{this, &node});
        co_return co_await serve_head(node, token);
    }

    struct turn_guard {
        limiter_state* self;
        waiter* node;
        ~turn_guard() {
            waiter* next = nullptr;
            {
                std::lock_guard lock(self->mutex);
                if (node->state == waiter_state::turn) {
                    next = self->queue.leave_turn(*node, waiter_state::stopped);
                    self->waiter_left_locked();
                }
            }
            if (next)
                next->wake_later();
        }
    };

    struct leave_on_stop {
        limiter_state* self;
        waiter* node;
        void operator()() const { stop_waiter(*self, *node); } // may post a wake-up
    };

    // The head's loop: take the permit when it is there, else sleep until it is due or the wait
    // runs out. Ends when the permit is taken, when the deadline passed first (a permit due at the
    // very instant of the deadline is still taken), or when the node left its turn (stopped).
    task<waiter_state> serve_head(waiter& node, const std::stop_token& token) {
        for (;;) {
            typename C::time_point due{};
            waiter* next = nullptr;
            waiter_state st = waiter_state::turn;
            {
                std::lock_guard lock(mutex);
                meter_lease lease{*this};
                if (node.state != waiter_state::turn) {
                    st = node.state;
                } else if (token.stop_requested()) {
                    next = queue.leave_turn(node, waiter_state::stopped);
                    st = waiter_state::stopped;
                } else {
                    const auto now = elapsed_locked();
                    if (meter.try_take(now)) {
                        next = queue.leave_turn(node, waiter_state::granted);
                        st = waiter_state::granted;
                    } else {
                        const double at = meter.available_at(now, 0);
                        if (now >= node.deadline) {
                            node.retry_after = ceil_ns(at) - now;
                            next = queue.leave_turn(node, waiter_state::expired);
                            st = waiter_state::expired;
                        } else if (ceil_ns(at) <= node.deadline && ceil_ns(at) > now) {
                            due = time_point_of(at);
                        } else {
                            // The deadline comes first, or the permit is further than the limiter
                            // can tell (held at ceil_ns's limit, which `now` may have passed on
                            // virtual time): sleep until the deadline, or for good, not in a loop.
                            due = detail::add_saturating(origin, node.deadline);
                        }
                    }
                }
            }
            if (next)
                next->wake();
            if (st != waiter_state::turn)
                co_return st;
            co_await clock.sleep_until(due, token); // if it throws, serve_turn's turn_guard hands the turn on
        }
    }

    double remaining() {
        std::lock_guard lock(mutex);
        meter_lease lease{*this};
        return meter.remaining(elapsed_locked());
    }
    [[nodiscard]] std::size_t queued() {
        std::lock_guard lock(mutex);
        return queue.size();
    }
};

} // namespace resilience::detail
