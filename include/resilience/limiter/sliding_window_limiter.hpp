// SPDX-License-Identifier: MIT
/// \file limiter/sliding_window_limiter.hpp
/// `sliding_window_limiter`: at most N calls in any window-long span, counted per segment.
#pragma once

#include "../classifier.hpp"
#include "../clock.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../priority.hpp"
#include "../telemetry_event.hpp"
#include "handle.hpp"
#include "window_counter.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace resilience {

/// How a `sliding_window_limiter` admits calls. `permit_limit` and `window` have no usable default;
/// the constructor checks every field (`std::invalid_argument` naming the limiter, the field and the
/// value). A throwing `on_rejected` ends the call as for `rate_limiter_options`.
struct sliding_window_limiter_options {
    /// Carried by the errors it makes (`policy_name()`), by `rejection_event`s and by `name()`.
    std::string name{};
    /// How many calls any window-long span may admit. Must be positive. No default, as for the
    /// window: only the user knows what the dependency allows, and a guess would silently either
    /// throttle it or overload it; so a limiter made without them throws.
    std::size_t permit_limit = 0;
    /// The span. Must be positive.
    std::chrono::nanoseconds window{};
    /// How finely the window slides: permits come back in steps of `window / segments`. Positive
    /// and at most `window` in nanoseconds and `max_segments`.
    std::size_t segments = 10;
    /// The most `segments` accepted: one counter each is kept, so the bound caps the memory.
    static constexpr std::size_t max_segments = 1'000'000;
    /// How many calls may wait for a permit; beyond that a call is refused at once
    /// (`rejection_reason::queue_full`). The default 0 refuses as soon as no permit is free
    /// (`no_capacity`); `rs::unbounded_queue` never refuses for want of a queue place.
    std::size_t queue_limit = 0;
    /// How long a call may wait in the queue before it is refused (`queue_timeout`), at exactly
    /// that instant. Empty (the default): as long as it takes. Must be positive when set.
    std::optional<std::chrono::nanoseconds> queue_timeout{};
    /// Priority classes (priority.hpp): the share of `permit_limit` reserved for each class, and the queue
    /// served highest class first, a full queue giving up its lowest class's last waiter to a
    /// newcomer of a higher class. A call's class is its `rs::priority` property; `take` is of the
    /// `default_class`. Empty (the default): every call alike, in arrival order, at no cost.
    priority_classes priorities{};
    /// Called when the limiter refuses a call, before the refusal is returned, with its `reason()`
    /// and `retry_after()`. Not called for `take`, which returns its refusal to its own caller.
    /// Runs on the caller's coroutine, without any lock held; must not block.
    std::function<void(const rejection_event&)> on_rejected{};
    /// Hears this limiter's `rejection`s and `queue_wait`s. Empty: the listener of a `telemetry`
    /// stage around the call, if any (see telemetry.hpp).
    telemetry_listener telemetry{};
};

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
        validate(options);
        const std::size_t limit = options.permit_limit, segments = options.segments;
        const std::chrono::nanoseconds window = options.window;
        this->reconfigure_with(std::move(options),
                               [=](detail::window_counter& w, std::chrono::nanoseconds now) {
                                   w.reconfigure(limit, window, segments, now);
                               });
    }

private:
    static detail::window_counter meter_of(const sliding_window_limiter_options& o) {
        validate(o);
        return detail::window_counter{o.permit_limit, o.window, o.segments};
    }
    static void validate(const sliding_window_limiter_options& o) {
        const std::string who = detail::policy_label("sliding_window_limiter", o.name) + ": ";
        if (o.permit_limit == 0)
            throw std::invalid_argument(who + "permit_limit must be positive, got 0");
        if (o.window <= std::chrono::nanoseconds::zero())
            throw std::invalid_argument(who + "window must be positive, got " +
                                        std::to_string(o.window.count()) + "ns");
        if (o.segments == 0)
            throw std::invalid_argument(who + "segments must be positive, got 0");
        if (o.segments > sliding_window_limiter_options::max_segments)
            throw std::invalid_argument(who + "segments must be at most " +
                                        std::to_string(sliding_window_limiter_options::max_segments) +
                                        ", got " + std::to_string(o.segments));
        if (o.segments > static_cast<std::uint64_t>(o.window.count()))
            throw std::invalid_argument(who + "segments must be at most the window in nanoseconds (" +
                                        std::to_string(o.window.count()) + "), got " +
                                        std::to_string(o.segments));
        detail::validate_queue_options(o, who);
    }
};

sliding_window_limiter(sliding_window_limiter_options) -> sliding_window_limiter<steady_clock>;
template <clock C>
sliding_window_limiter(sliding_window_limiter_options, C) -> sliding_window_limiter<C>;

} // namespace resilience
