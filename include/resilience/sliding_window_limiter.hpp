// SPDX-License-Identifier: MIT
/// \file sliding_window_limiter.hpp
/// `sliding_window_limiter`: at most N calls in any window-long span, counted per segment.
#pragma once

#include "clock.hpp"
#include "concepts.hpp"
#include "rate_limiter.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace resilience {

namespace detail {

/// Counts permits per segment, in a ring of O(window / segment) counters. A permit taken at `t`
/// is counted in bucket `ceil(t / segment)` (the segment boundary at or after `t`) and comes
/// back at that boundary plus `window`: never sooner than `window` after it was taken, so any
/// span `[t, t + window)` admits at most `limit`, and exactly `window` after for a permit taken
/// on a boundary. Rounding up costs a permit at most one segment of extra holding; rounding down
/// would let `2 * limit` calls through in a bit less than a window.
///
/// Times are nanoseconds since the limiter was made. A return time past the largest of them (a
/// window near `nanoseconds::max()`) is held at that largest time rather than overflowing: such a
/// permit never comes back in practice, and `available_at` says so with the latest time it has.
class window_counter {
public:
    window_counter(std::size_t limit, std::chrono::nanoseconds window, std::size_t segments)
        : limit_(limit), window_(window.count()),
          segment_(window.count() / static_cast<std::int64_t>(segments)),
          // Live buckets span at most ceil(window / segment) + 2 indices (see expire and try_take).
          counts_(static_cast<std::size_t>(ceil_div(window_, segment_) + 2), 0) {}

    bool try_take(std::chrono::nanoseconds now) {
        expire(now.count());
        if (active_ >= limit_)
            return false;
        const std::int64_t b = ceil_div(now.count(), segment_);
        ++counts_[slot(b)];
        ++active_;
        newest_ = std::max(newest_, b);
        return true;
    }

    double available_at(std::chrono::nanoseconds now, std::size_t ahead) {
        expire(now.count());
        // The callers ahead take the free permits first, then the ones in use as they come back,
        // oldest first, then those permits again, in the same order, as each comes back.
        const std::size_t free = limit_ - active_;
        const std::size_t index = ahead % limit_;
        const auto cycles = static_cast<std::int64_t>(ahead / limit_);
        std::int64_t at = now.count();
        if (index >= free)
            at = return_of_used(index - free);
        if (cycles == 0)
            return static_cast<double>(at);
        // Every reuse is rounded up to the segment grid again, as try_take counts it: taken at `at`,
        // the permit comes back at ceil_grid(at) + window; taken again then, at ceil_grid(at) +
        // ceil_grid(window) + window; and so on, each further reuse adding ceil_grid(window), which
        // is more than a window when the window is not a whole number of segments.
        const std::int64_t boundary =
            at > std::numeric_limits<std::int64_t>::max() - segment_ ? at : ceil_div(at, segment_) * segment_;
        const std::int64_t first_back = saturating_add(boundary, window_);
        const std::int64_t per_reuse = saturating_multiply(ceil_div(window_, segment_), segment_);
        return static_cast<double>(saturating_add(first_back, saturating_multiply(cycles - 1, per_reuse)));
    }

    double remaining(std::chrono::nanoseconds now) {
        expire(now.count());
        return static_cast<double>(limit_ - active_);
    }

private:
    static std::int64_t floor_div(std::int64_t a, std::int64_t b) noexcept {
        std::int64_t q = a / b;
        if (a % b != 0 && (a < 0) != (b < 0))
            --q;
        return q;
    }
    static std::int64_t ceil_div(std::int64_t a, std::int64_t b) noexcept { return -floor_div(-a, b); }
    // For times and durations that are not negative: the sum or product, or the largest time.
    static std::int64_t saturating_add(std::int64_t a, std::int64_t b) noexcept {
        return a > std::numeric_limits<std::int64_t>::max() - b ? std::numeric_limits<std::int64_t>::max() : a + b;
    }
    static std::int64_t saturating_multiply(std::int64_t a, std::int64_t b) noexcept {
        return b != 0 && a > std::numeric_limits<std::int64_t>::max() / b ? std::numeric_limits<std::int64_t>::max()
                                                                            : a * b;
    }

    std::size_t slot(std::int64_t bucket) const noexcept {
        return static_cast<std::size_t>(bucket) % counts_.size(); // buckets are never negative
    }

    // Bucket b is live while b * segment + window > now. Every bucket that dies is zeroed, so a
    // ring slot reused for a later bucket starts from zero.
    void expire(std::int64_t now) noexcept {
        const std::int64_t first_live = floor_div(now - window_, segment_) + 1;
        for (; oldest_ < first_live && oldest_ <= newest_; ++oldest_) {
            std::size_t& c = counts_[slot(oldest_)];
            active_ -= c;
            c = 0;
        }
        oldest_ = std::max(oldest_, first_live);
    }

    // When the k-th (0-based) oldest permit in use comes back. Precondition: k < active_.
    std::int64_t return_of_used(std::size_t k) const noexcept {
        std::int64_t b = oldest_;
        for (; b < newest_; ++b) {
            const std::size_t c = counts_[slot(b)];
            if (k < c)
                break;
            k -= c;
        }
        return saturating_add(b * segment_, window_);
    }

    std::size_t limit_;
    std::int64_t window_;  // nanoseconds
    std::int64_t segment_; // nanoseconds, window / segments rounded down
    std::vector<std::size_t> counts_;
    std::size_t active_ = 0;   // permits in use: the sum of the live buckets
    std::int64_t oldest_ = 0;  // first bucket that may be live
    std::int64_t newest_ = -1; // last bucket written
};

} // namespace detail

struct sliding_window_limiter_options {
    /// How many calls any window-long span may admit. Must be positive. No default, as for the
    /// window: only the user knows what the dependency allows, and a guess would silently either
    /// throttle it or overload it; so a limiter made without them throws.
    std::size_t permit_limit = 0;
    /// The span. Must be positive.
    std::chrono::nanoseconds window{};
    /// How finely the window slides: permits come back in steps of `window / segments`. Positive
    /// and at most `window` in nanoseconds and `max_segments`.
    std::size_t segments = 10;
    /// The most `segments` accepted: one counter each is kept, so the bound caps the memory (8 MB).
    static constexpr std::size_t max_segments = 1'000'000;
    /// How many calls may wait for a permit; beyond that a call is refused at once
    /// (`rejection_reason::queue_full`). The default 0 refuses as soon as no permit is free
    /// (`no_capacity`); `rs::unbounded_queue` never refuses for want of a queue place.
    std::size_t queue_limit = 0;
    /// How long a call may wait in the queue before it is refused (`queue_timeout`), at exactly
    /// that instant. Empty (the default): as long as it takes. Must be positive when set.
    std::optional<std::chrono::nanoseconds> queue_timeout{};
    /// Carried by the errors it makes (`policy_name()`) and by `name()`.
    std::string name{};
    /// Hears this limiter's `rejection`s and `queue_wait`s. Empty: the listener of a `telemetry`
    /// stage around the call, if any (see telemetry.hpp).
    telemetry_listener telemetry{};
};

/// Limits calls to `permit_limit` in any `window`, with the interface of `rate_limiter` (waiting
/// in arrival order, `queue_limit`, `queue_timeout`, `take`, `rate_limited_error::retry_after()`
/// and `reason()`, `queued()`, `name()`; `tokens()` is the number of permits free now).
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

private:
    static detail::window_counter meter_of(const sliding_window_limiter_options& o) {
        const std::string who = "resilience::sliding_window_limiter: ";
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
        return detail::window_counter{o.permit_limit, o.window, o.segments};
    }
};

sliding_window_limiter(sliding_window_limiter_options)->sliding_window_limiter<steady_clock>;
template <clock C>
sliding_window_limiter(sliding_window_limiter_options, C) -> sliding_window_limiter<C>;

} // namespace resilience
