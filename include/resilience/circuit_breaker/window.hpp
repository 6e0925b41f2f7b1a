// SPDX-License-Identifier: MIT
/// \file circuit_breaker/window.hpp
/// The samples a circuit breaker judges its ratios over: the last N calls, or the calls of the last D of
/// time (`breaker_sampling`). The segment grid is the core's (detail/segment_grid.hpp), shared with the
/// adaptive throttle.
#pragma once

#include "../detail/segment_grid.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace resilience::inline v0_2::detail {

/// What a window holds at one instant.
struct window_counts {
    std::uint64_t calls = 0;
    std::uint64_t failures = 0;
    std::uint64_t slow = 0;

    void add(const window_counts& o) noexcept {
        calls += o.calls;
        failures += o.failures;
        slow += o.slow;
    }
    void subtract(const window_counts& o) noexcept {
        calls -= o.calls;
        failures -= o.failures;
        slow -= o.slow;
    }
};

/// Exactly the last `size` calls (`breaker_sampling::calls`): one byte per call in a ring, plus
/// running totals, so recording and reading are O(1) and the memory is fixed at construction. Not
/// synchronised: the breaker holds its lock around every use.
class count_window {
public:
    explicit count_window(std::size_t size) : marks_(size, 0) {}

    void add(bool failed, bool slow) {
        if (filled_ == marks_.size())
            totals_.subtract(counts_of(marks_[next_]));
        else
            ++filled_;
        const auto mark = static_cast<std::uint8_t>((failed ? failed_bit : 0) | (slow ? slow_bit : 0));
        marks_[next_] = mark;
        totals_.add(counts_of(mark));
        next_ = next_ + 1 == marks_.size() ? 0 : next_ + 1;
    }
    window_counts counts() const noexcept { return totals_; }
    void clear() noexcept {
        filled_ = next_ = 0;
        totals_ = {};
    }

private:
    static constexpr std::uint8_t failed_bit = 1, slow_bit = 2;
    static window_counts counts_of(std::uint8_t mark) noexcept {
        return {1, (mark & failed_bit) ? 1u : 0u, (mark & slow_bit) ? 1u : 0u};
    }

    std::vector<std::uint8_t> marks_;
    std::size_t next_ = 0, filled_ = 0;
    window_counts totals_;
};

/// The calls of the last stretch of time, kept in `buckets` buckets (the `segments` of a
/// `breaker_sampling`) of `width` each, so memory is fixed however many calls arrive. Bucket `k`
/// holds the calls made in `[k*width, (k+1)*width)` (time since the clock's epoch); at time `t`
/// the window is bucket `floor(t/width)` and the `buckets - 1` before it. A call therefore stops counting
/// between `(buckets-1)*width` and `buckets*width` after it was made: never later. Recording costs O(1) plus
/// one bucket cleared per bucket width that has passed (at most `buckets`); reading at a later time does not
/// change the window. Not synchronised: the breaker holds its lock around every use.
class time_window {
public:
    time_window(std::chrono::nanoseconds width, std::size_t buckets) : width_(width), buckets_(buckets) {}

    void add(std::chrono::nanoseconds now, bool failed, bool slow) {
        const std::int64_t k = index_of(now);
        advance(k);
        // Times reach us in order (the breaker never lets them go back), so `k` is the newest bucket;
        // an older one still inside the window is counted where it belongs, anything older is dropped.
        if (k <= head_ - static_cast<std::int64_t>(buckets_.size()))
            return;
        const window_counts one{1, failed ? 1u : 0u, slow ? 1u : 0u};
        buckets_[slot(k)].add(one);
        totals_.add(one);
    }

    /// The counts as they are at `now` (not before the last recorded time), without changing anything.
    window_counts counts(std::chrono::nanoseconds now) const noexcept {
        if (!started_)
            return {};
        const std::int64_t k = index_of(now);
        if (k <= head_)
            return totals_;
        const auto n = static_cast<std::int64_t>(buckets_.size());
        if (k - head_ >= n)
            return {};
        window_counts c = totals_;
        for (std::int64_t i = head_ + 1; i <= k; ++i)
            c.subtract(buckets_[slot(i)]);
        return c;
    }

    void clear() noexcept {
        for (auto& b : buckets_)
            b = {};
        totals_ = {};
        started_ = false;
    }

private:
    std::int64_t index_of(std::chrono::nanoseconds t) const noexcept { return segment_of(t, width_); }
    std::size_t slot(std::int64_t k) const noexcept { return ring_slot(k, buckets_.size()); }
    // Moves the newest bucket to `k`, emptying the buckets that leave the window on the way.
    void advance(std::int64_t k) noexcept {
        if (!started_) {
            started_ = true;
            head_ = k;
            return;
        }
        if (k <= head_)
            return;
        const auto n = static_cast<std::int64_t>(buckets_.size());
        if (k - head_ >= n) {
            for (auto& b : buckets_)
                b = {};
            totals_ = {};
        } else {
            for (std::int64_t i = head_ + 1; i <= k; ++i) {
                totals_.subtract(buckets_[slot(i)]);
                buckets_[slot(i)] = {};
            }
        }
        head_ = k;
    }

    std::chrono::nanoseconds width_;
    std::vector<window_counts> buckets_;
    window_counts totals_;
    std::int64_t head_ = 0;
    bool started_ = false;
};

} // namespace resilience::detail
