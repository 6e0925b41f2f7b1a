// SPDX-License-Identifier: MIT
/// \file limiter/window_counter.hpp
/// `window_counter`: the meter of `sliding_window_limiter` (see state.hpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace resilience::inline v0_2::detail {

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
        // oldest first, then those permits again, in the same order, as each comes back. After a
        // reconfiguration lowered the limit, more permits may be in use than it allows: the first
        // `excess` of them to come back free nothing.
        const std::size_t free = active_ < limit_ ? limit_ - active_ : 0;
        const std::size_t excess = active_ > limit_ ? active_ - limit_ : 0;
        const std::size_t index = ahead % limit_;
        const auto cycles = static_cast<std::int64_t>(ahead / limit_);
        std::int64_t at = now.count();
        if (index >= free)
            at = return_of_used(index - free + excess);
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
        return active_ < limit_ ? static_cast<double>(limit_ - active_) : 0.0;
    }

    /// New parameters from `now` on (a reconfiguration; `now` as for the other calls). The
    /// permits in use are kept: with the same window and segment length, exactly as they were
    /// counted; otherwise each is counted again on the new segment grid, at the boundary at or
    /// after the one it was counted at but no later than the boundary at or after `now`, and
    /// comes back one new window after that (so never sooner than the new window after it was
    /// taken). Permits already back stay back. A smaller limit takes no permit back: nobody is
    /// admitted until fewer than the new limit are in use. Throws only `std::bad_alloc` (a new
    /// ring), changing nothing then.
    void reconfigure(std::size_t limit, std::chrono::nanoseconds window, std::size_t segments,
                     std::chrono::nanoseconds now) {
        expire(now.count());
        const std::int64_t w = window.count();
        const std::int64_t seg = w / static_cast<std::int64_t>(segments);
        if (w == window_ && seg == segment_) {
            limit_ = limit;
            return;
        }
        std::vector<std::size_t> counts(static_cast<std::size_t>(ceil_div(w, seg) + 2), 0);
        const std::int64_t latest = ceil_div(now.count(), seg);
        const std::int64_t first_live = std::max<std::int64_t>(floor_div(now.count() - w, seg) + 1, 0);
        std::int64_t newest = -1;
        for (std::int64_t b = oldest_; b <= newest_; ++b) {
            const std::size_t c = counts_[slot(b)];
            if (c == 0)
                continue;
            const std::int64_t moved = std::min(ceil_div(b * segment_, seg), latest);
            if (moved < first_live) // back already under the new window
                continue;
            counts[static_cast<std::size_t>(moved) % counts.size()] += c;
            newest = std::max(newest, moved);
        }
        active_ = 0;
        for (const std::size_t c : counts)
            active_ += c;
        counts_ = std::move(counts);
        limit_ = limit;
        window_ = w;
        segment_ = seg;
        oldest_ = first_live;
        newest_ = newest;
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
        return a > std::numeric_limits<std::int64_t>::max() - b ? std::numeric_limits<std::int64_t>::max()
                                                                : a + b;
    }
    static std::int64_t saturating_multiply(std::int64_t a, std::int64_t b) noexcept {
        return b != 0 && a > std::numeric_limits<std::int64_t>::max() / b
                   ? std::numeric_limits<std::int64_t>::max()
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

} // namespace resilience::detail
