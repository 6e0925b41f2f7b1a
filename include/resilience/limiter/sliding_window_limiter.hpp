// SPDX-License-Identifier: MIT
/// \file limiter/sliding_window_limiter.hpp
/// `sliding_window_limiter`: at most N calls in any window-long span, counted per segment.
#pragma once

#include "../clock.hpp"
#include "errors.hpp"
#include "handle.hpp"
#include "options.hpp"
#include "window_counter.hpp"

#include <chrono>
#include <cstddef>
#include <string_view>
#include <utility>

namespace resilience::inline v0_2 {

/// Limits calls to `permit_limit` in any `window`, with the interface of `rate_limiter` (waiting
/// in arrival order, `queue_limit`, `queue_timeout`, `priorities`, `take`,
/// `rate_limited_error::retry_after()` and `reason()`, `queued()`, `name()`; `tokens()` is the
/// number of permits free now).
///
/// Counting is segmented: the window is cut into `segments` segments (on a grid starting when the
/// limiter is made), and a permit is counted against the segment boundary at or after the instant
/// it was taken, coming back one window after that boundary. So:
/// - no span `[t, t + window)` ever admits more than `permit_limit` calls;
/// - a permit comes back between `window` and `window + window / segments` after it was taken:
///   exactly `window` after for calls made on a segment boundary (`permit_limit` calls at 0 free
///   their permits at exactly `window`);
/// - memory is a ring of about `segments` counters, whatever the limit.
/// Unlike a token bucket it has no sustained rate separate from its burst: after a quiet window
/// all `permit_limit` permits are there at once.
///
/// A copyable handle to one shared, thread-safe limiter; see `rate_limiter` for waiting, clocks
/// and lifetimes, which are the same.
///
///     rs::sliding_window_limiter api{{.permit_limit = 100, .window = 1min, .queue_limit = 50}};
///     auto r = co_await api.execute(call);
template <clock C = steady_clock>
class sliding_window_limiter
    : public detail::limiter_handle<sliding_window_limiter<C>, C, detail::window_counter,
                                    sliding_window_limiter_options> {
    using base = detail::limiter_handle<sliding_window_limiter<C>, C, detail::window_counter,
                                        sliding_window_limiter_options>;

public:
    /// The `policy` of its telemetry events.
    static constexpr std::string_view telemetry_policy = "sliding_window_limiter";

    explicit sliding_window_limiter(sliding_window_limiter_options options, C clock = C{})
        : base(meter_of(options), std::move(clock), options) {}

    /// Permits free now, at most `permit_limit`.
    [[nodiscard]] double tokens() const { return this->held().remaining(); }

    /// Puts `options` in force for every copy, while calls run. They are checked as the
    /// constructor checks them: invalid ones throw `std::invalid_argument` (naming the field and
    /// the value) and the options in force stay. Thread-safe against calls and other
    /// reconfigurations.
    ///
    /// New calls see the new options at once; a call already waiting finishes under the options
    /// it started waiting with (its name, `on_rejected`, listener). What carries over:
    /// - the permits in use. With the same `window` and segment length (`window / segments`),
    ///   their counts are kept as they are: each comes back when it would have. Otherwise each
    ///   is counted again on the new segment grid (still starting when the limiter was made), at
    ///   the boundary at or after the one it was counted at, but no later than the boundary at or
    ///   after the change, and comes back one new `window` after that: never sooner than the new
    ///   window after it was taken, and a shorter window frees them sooner. Permits already back
    ///   stay back, even under a longer window. So no reconfiguration opens a burst: the permits
    ///   in use at the change count until they come back, and no span of the new window starting
    ///   at or after the change admits more than the new `permit_limit`;
    /// - a smaller `permit_limit` takes no permit back: nobody is admitted until fewer than it
    ///   are in use; a larger one frees its new permits at once, to the oldest waiter first;
    /// - the queue: waiters stay queued, in their order, with their deadlines; the first one
    ///   times its permit again; a smaller `queue_limit` turns no waiter away (newcomers are
    ///   refused until the queue is under it); a `queue_timeout` applies to callers queued after
    ///   the change.
    ///
    /// Memory: the options replaced are freed once no call that waited under them is still
    /// running (a call that takes its permit at once keeps none). Options the same as those in
    /// force (the same values, a listener copied from those in force, and no `on_rejected`, which
    /// cannot be compared) change nothing and allocate nothing. A change of the grid replaces the
    /// ring of counters (a `std::size_t` per segment, plus two); with `priorities`, each distinct
    /// setting of them and `permit_limit` keeps a small table of the classes' shares until the
    /// limiter goes.
    void reconfigure(sliding_window_limiter_options options) const {
        detail::validate_sliding_window_limiter_options(options);
        const std::size_t limit = options.permit_limit, segments = options.segments;
        const std::chrono::nanoseconds window = options.window;
        this->reconfigure_with(std::move(options),
                               [=](detail::window_counter& w, std::chrono::nanoseconds now) {
                                   w.reconfigure(limit, window, segments, now);
                               });
    }

private:
    static detail::window_counter meter_of(const sliding_window_limiter_options& o) {
        detail::validate_sliding_window_limiter_options(o);
        return detail::window_counter{o.permit_limit, o.window, o.segments};
    }
};

sliding_window_limiter(sliding_window_limiter_options) -> sliding_window_limiter<steady_clock>;
template <clock C>
sliding_window_limiter(sliding_window_limiter_options, C) -> sliding_window_limiter<C>;

} // namespace resilience
