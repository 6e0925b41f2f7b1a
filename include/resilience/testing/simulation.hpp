// SPDX-License-Identifier: MIT
/// \file testing/simulation.hpp
/// `testing::simulation`: the event loop on virtual time, and the clock policies use on it.
#pragma once

#include "../clock.hpp"
#include "../concepts.hpp"
#include "../detail/time.hpp"
#include "../event_loop.hpp"
#include "../random.hpp"
#include "../stop_token.hpp"

#include <chrono>

namespace resilience::inline v0_2::testing {

/// A clock that reads and sleeps on a simulation's virtual time. Copies share the simulation,
/// which must outlive them. For one thread: the simulation's.
class virtual_clock {
public:
    using rep = std::chrono::nanoseconds::rep;
    using period = std::chrono::nanoseconds::period;
    using duration = std::chrono::nanoseconds;
    using time_point = std::chrono::time_point<virtual_clock, duration>;
    static constexpr bool is_steady = true;

    explicit virtual_clock(event_loop& loop) noexcept : loop_(&loop) {}

    time_point now() const noexcept { return time_point{loop_->now()}; }
    detail::sleep_awaiter sleep_until(time_point tp, stop_token token) const noexcept {
        return detail::sleep_awaiter{loop_, tp.time_since_epoch(), std::move(token)};
    }
    detail::sleep_awaiter sleep_for(duration d, stop_token token) const noexcept {
        // Saturating: a sleep of "forever" late in virtual time must not overflow.
        return sleep_until(d.count() < 0 ? now() + d : detail::add_saturating(now(), d), std::move(token));
    }
    event_loop* timer_loop() const noexcept { return loop_; }

private:
    event_loop* loop_;
};

static_assert(clock<virtual_clock>);

/// A deterministic random source for tests: the same seed gives the same jitter on every run.
using deterministic_random = seeded_random;

/// An event loop on virtual time. `run(a)` runs `a` (with anything spawned) to completion and
/// returns its result; whenever nothing is ready, time jumps to the next timer, so an hour of
/// backoff takes microseconds and every instant is exact. Time starts at zero.
///
///     rs::testing::simulation sim;
///     rs::retry r{{.max_attempts = 3}, sim.clock()};
///     int v = sim.run(r.execute(action));
///     CHECK(sim.now() == 300ms);
///
/// A coroutine waiting for something that nothing scheduled will ever bring makes `run` throw
/// `std::logic_error` instead of hanging. Single-threaded: use it from one thread.
class simulation {
public:
    simulation() = default;
    simulation(const simulation&) = delete;
    simulation& operator=(const simulation&) = delete;

    /// Runs `a` to completion and returns its result (or rethrows its exception).
    template <awaitable A>
    await_result_t<A> run(A&& a) {
        return loop_.run(std::forward<A>(a));
    }
    /// Starts `a`; it runs during the next `run` or `run_all`.
    template <awaitable A>
    void spawn(A&& a) {
        loop_.spawn(std::forward<A>(a));
    }
    /// Runs until every spawned coroutine has finished.
    void run_all() { loop_.run(); }

    /// Runs everything due up to the instant `t` (timers in order, time jumping to each), then
    /// sets the time to `t` and returns with later work still pending: start calls with `spawn`,
    /// step time with `run_until`/`run_for`, and look at the policies' state in between. A `t`
    /// already past runs what is ready and leaves the time as it is. Rethrows the first exception
    /// a spawned coroutine let escape.
    ///
    ///     sim.spawn(call_through(breaker));      // starts at the next step
    ///     sim.run_for(1s);
    ///     CHECK(breaker.state() == rs::circuit_state::open);
    void run_until(std::chrono::nanoseconds t) { loop_.run_until(t); }
    /// `run_until(now() + d)`.
    void run_for(std::chrono::nanoseconds d) { loop_.run_until(now() + d); }

    /// Virtual time elapsed since the simulation started.
    std::chrono::nanoseconds now() const noexcept { return loop_.now(); }
    /// A clock for policies under test.
    virtual_clock clock() noexcept { return virtual_clock{loop_}; }
    event_loop& loop() noexcept { return loop_; }

    /// Suspends the calling coroutine for `d` of virtual time.
    detail::sleep_awaiter sleep_for(std::chrono::nanoseconds d, stop_token token = {}) noexcept {
        return clock().sleep_for(d, std::move(token));
    }

private:
    event_loop loop_{virtual_time};
};

} // namespace resilience::testing
