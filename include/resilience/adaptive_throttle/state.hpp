// SPDX-License-Identifier: MIT
/// \file adaptive_throttle/state.hpp
/// The shared state of an `adaptive_throttle` (adaptive_throttle.hpp): its window of requests and
/// accepts, the block of options a call is admitted under, and the rejection probability.
///
/// Locking: `throttle_core::mutex_` guards the window (`width_`, `ring_`, `totals_`, `head_`,
/// `head_slot_`, `started_`), the random source `rng_`, the replacement of the options block in `cell_`
/// (read with `cell_.locked()` and `pin_locked()` under it; `pin()` takes no lock) and every write of
/// the atomics `window_epoch_`, `value_type_` and `head_end_`, which are read without it where their
/// declarations say. `pending_accepts_` is added to without the lock and emptied under it. A member
/// function whose name ends in `_locked` must be called holding `mutex_` and never takes it; every
/// other member function that touches what it guards takes it itself. The clock, the classifier and
/// the listener are never called holding it.
#pragma once

#include "options.hpp"

#include "../detail/segment_grid.hpp"
#include "../detail/shared_handle.hpp"
#include "../detail/snapshot_cell.hpp"
#include "../random.hpp"
#include "../telemetry_event.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <typeinfo>
#include <utility>
#include <vector>

namespace resilience::inline v0_2::detail {

/// The rejection probability for `requests` and `accepts`: `max(0, (requests - k * accepts) /
/// (requests + 1))`, always below 1.
inline double throttle_probability(std::uint64_t requests, std::uint64_t accepts, double k) noexcept {
    const double r = static_cast<double>(requests);
    return std::max(0.0, (r - k * static_cast<double>(accepts)) / (r + 1.0));
}

/// A throttle's options: immutable once published. A call pins the block it was admitted under
/// to its end; a block replaced by a reconfiguration is freed once no call pins it.
struct throttle_config : pinnable {
    throttle_config(adaptive_throttle_options o, std::uint64_t epoch)
        : options(std::move(o)), window_epoch(epoch) {}
    const adaptive_throttle_options options;
    /// Which window the calls admitted under this block are counted in: a reconfiguration that
    /// replaces the window gives the next number.
    const std::uint64_t window_epoch;
};

/// The shared state of one throttle: one ring of `segments` pairs of counts (requests, accepts) with
/// their totals, the random source and the newest segment reached (the head), under `mutex_`, which is
/// held to admit a call, never across user code (the clock, the classifier and the listener are called
/// without it). Time never goes back for the window: a reading older than one already used (two
/// threads racing) is taken as that one, so only the segment of the newest reading matters.
///
/// An accept whose reading falls in the head segment or before it (the common case: the call ended
/// in the segment it was admitted in) is one atomic increment of `pending_accepts_`, without the lock:
/// whoever takes the lock next adds the pending accepts to the head segment before anything else,
/// which is where the accept would have gone under the lock (the head cannot have moved in between
/// without that holder adding them first). Only an accept in a later segment takes the lock.
///
/// The options are an immutable `throttle_config` published through `cell_`, pinned by each call, and
/// replaced whole by `reconfigure`; the window is replaced with them only when its shape
/// (`window`, `segments`) changes.
template <class C, class Random>
class throttle_core : public shared_state {
public:
    using time_point = typename C::time_point;
    using config_block = throttle_config;

    throttle_core(adaptive_throttle_options o, C clock, Random rng)
        : cell_(std::make_unique<throttle_config>(std::move(o), 0)), clock_(std::move(clock)),
          rng_(std::move(rng)) {
        const adaptive_throttle_options& first = cell_.locked()->options;
        value_type_.store(first.should_handle.value_type(), std::memory_order_relaxed);
        width_ = first.window / static_cast<std::int64_t>(first.segments);
        ring_.resize(first.segments);
    }
    throttle_core(const throttle_core&) = delete;
    throttle_core& operator=(const throttle_core&) = delete;

    /// Pins the options in force, for a call admitted under them.
    pinned<throttle_config> pin() noexcept { return cell_.pin(); }
    /// The result type the classifier in force judges (`classifier::value_type`), or null.
    const std::type_info* value_type() const noexcept { return value_type_.load(std::memory_order_acquire); }
    /// A copy of the options in force.
    adaptive_throttle_options options() const {
        std::lock_guard lock(mutex_);
        return cell_.locked()->options;
    }
    const C& clock() const noexcept { return clock_; }

    /// Puts `o` (checked) in force. The counts are kept when `o` has the window and segments in
    /// force, and otherwise replaced by an empty window, which the accepts of calls admitted before
    /// do not enter (their requests were counted in the window dropped). The block replaced is freed
    /// once no call pins it; options the same as those in force change nothing. Throws only
    /// `std::bad_alloc`, and then nothing changed.
    void reconfigure(adaptive_throttle_options o) {
        std::lock_guard lock(mutex_);
        const throttle_config* const old = cell_.locked();
        if (same_throttle_options(old->options, o))
            return;
        const bool keep = old->options.window == o.window && old->options.segments == o.segments;
        auto fresh =
            std::make_unique<throttle_config>(std::move(o), keep ? old->window_epoch : old->window_epoch + 1);
        std::vector<segment> ring;
        if (!keep)
            ring.resize(fresh->options.segments);
        const adaptive_throttle_options& now = fresh->options;
        const std::uint64_t epoch = fresh->window_epoch;
        const std::type_info* const judged = fresh->options.should_handle.value_type();
        cell_.replace(std::move(fresh)); // may free `old`, not read after this
        window_epoch_.store(epoch, std::memory_order_release);
        value_type_.store(judged, std::memory_order_release);
        if (keep)
            return;
        ring_ = std::move(ring);
        width_ = now.window / static_cast<std::int64_t>(now.segments);
        totals_ = {};
        head_ = 0;
        head_slot_ = 0;
        started_ = false;
        head_end_.store(std::numeric_limits<std::int64_t>::min(), std::memory_order_release);
        pending_accepts_.store(0, std::memory_order_relaxed);
    }

    /// Counts a request at `read`; returns the probability it is refused with when the draw refuses
    /// it, nothing when it is admitted. Draws only when the probability is above zero. The
    /// probability is judged with the `k` in force.
    std::optional<double> admit(time_point read) {
        pinned<throttle_config> ignored;
        return admit(read, ignored);
    }
    /// As `admit(read)`, pinning into `own` the options in force, which judged the call (taken
    /// under the lock the admission takes anyway: no pin of its own to pay for).
    std::optional<double> admit(time_point read, pinned<throttle_config>& own) {
        std::lock_guard lock(mutex_);
        own = cell_.pin_locked();
        reach_locked(since_epoch(read));
        const double k = cell_.locked()->options.k; // replaced under the lock
        const double p = throttle_probability(totals_.requests, totals_.accepts, k);
        ++ring_[head_slot_].requests;
        ++totals_.requests;
        if (p > 0.0 && unit_random(rng_) < p)
            return p;
        return std::nullopt;
    }

    /// Counts an accept at `read`, of a call admitted under `own`: none if the window it was counted
    /// in has been replaced since. An accept counted without the lock at the very moment of the
    /// replacement may land in the new window: a count off by one there, aged out with the window.
    void accept(const throttle_config& own, time_point read) {
        if (window_epoch_.load(std::memory_order_acquire) != own.window_epoch) [[unlikely]]
            return;
        const std::chrono::nanoseconds now = since_epoch(read);
        // Acquire: the head that published this end was reached after every flush before it, so the
        // increment is added by a later holder of the lock, to that head or a newer one.
        if (now.count() < head_end_.load(std::memory_order_acquire)) {
            pending_accepts_.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        std::lock_guard lock(mutex_);
        if (window_epoch_.load(std::memory_order_relaxed) != own.window_epoch)
            return; // replaced while this call was on its way here
        reach_locked(now);
        ++ring_[head_slot_].accepts;
        ++totals_.accepts;
    }

    struct snapshot {
        std::uint64_t requests = 0, accepts = 0;
    };
    /// The counts at `read` (not before the latest time used), without changing anything.
    snapshot counts(time_point read) const {
        std::lock_guard lock(mutex_);
        if (!started_)
            return {};
        const std::int64_t k = index_of_locked(since_epoch(read));
        const auto n = static_cast<std::int64_t>(ring_.size());
        if (k > head_ && k - head_ >= n)
            return {};
        snapshot c = totals_;
        c.accepts += pending_accepts_.load(std::memory_order_relaxed); // they belong to the head segment
        if (k > head_) {
            std::size_t slot = head_slot_;
            for (std::int64_t i = head_ + 1; i <= k; ++i) {
                slot = next_locked(slot);
                c.requests -= ring_[slot].requests;
                c.accepts -= ring_[slot].accepts;
            }
        }
        return c;
    }

private:
    // Adds the pending accepts to the head segment, then moves the head to the segment of `now` if it is
    // newer, emptying the segments that leave the window on the way. Under the lock.
    void reach_locked(std::chrono::nanoseconds now) {
        if (started_) {
            if (pending_accepts_.load(std::memory_order_relaxed) != 0) {
                const std::uint64_t pending = pending_accepts_.exchange(0, std::memory_order_relaxed);
                ring_[head_slot_].accepts += pending;
                totals_.accepts += pending;
            }
            // Within the head segment (or before it): no division.
            if (now.count() < head_end_.load(std::memory_order_relaxed))
                return;
        }
        const std::int64_t k = index_of_locked(now);
        if (!started_) {
            // No accept is counted without the lock before a window has a head: any pending now
            // raced with the reconfiguration that replaced the window, and belongs to the old one.
            pending_accepts_.store(0, std::memory_order_relaxed);
            started_ = true;
            head_slot_ = slot_of_locked(k);
        } else if (k <= head_) {
            return; // only at the saturated end of time, where the head's end cannot be represented
        } else if (k - head_ >= static_cast<std::int64_t>(ring_.size())) {
            std::fill(ring_.begin(), ring_.end(), segment{});
            totals_ = {};
            head_slot_ = slot_of_locked(k);
        } else {
            for (std::int64_t i = head_ + 1; i <= k; ++i) {
                head_slot_ = next_locked(head_slot_);
                totals_.requests -= ring_[head_slot_].requests;
                totals_.accepts -= ring_[head_slot_].accepts;
                ring_[head_slot_] = {};
            }
        }
        head_ = k;
        head_end_.store(end_of_locked(k), std::memory_order_release);
    }

    std::int64_t index_of_locked(std::chrono::nanoseconds t) const noexcept { return segment_of(t, width_); }
    // The first instant after segment `k` (saturated: the last segment of time ends at the end of time).
    std::int64_t end_of_locked(std::int64_t k) const noexcept {
        // `k` is the floor of some reading over the width, so `(k + 1) * width` cannot fall below the
        // lowest value; it passes the highest exactly when `k >= max / width`.
        constexpr std::int64_t highest = std::numeric_limits<std::int64_t>::max();
        const std::int64_t width = width_.count();
        if (k >= highest / width)
            return highest;
        return (k + 1) * width;
    }
    std::size_t slot_of_locked(std::int64_t k) const noexcept { return ring_slot(k, ring_.size()); }
    std::size_t next_locked(std::size_t slot) const noexcept {
        return slot + 1 == ring_.size() ? 0 : slot + 1;
    }

    struct segment {
        std::uint64_t requests = 0; // every call, refused ones included
        std::uint64_t accepts = 0;  // the calls the dependency accepted
    };

    snapshot_cell<throttle_config> cell_; // replaced under the lock, pinned by calls without it
    // The block in force's `window_epoch`, written under the lock; read without it by `accept`.
    std::atomic<std::uint64_t> window_epoch_{0};
    // What the block in force's classifier judges, written under the lock; read without it by
    // `value_type()`.
    std::atomic<const std::type_info*> value_type_{nullptr};
    C clock_;
    mutable std::mutex mutex_;
    Random rng_;
    std::chrono::nanoseconds width_{}; // of the segments of the window in use
    std::vector<segment> ring_;
    snapshot totals_;
    std::int64_t head_ = 0; // the newest segment reached; `ring_[head_slot_]`
    std::size_t head_slot_ = 0;
    bool started_ = false;
    // The end of the head segment, for the accepts that read it without the lock; the lowest value
    // (no reading is below it) until the first call.
    std::atomic<std::int64_t> head_end_{std::numeric_limits<std::int64_t>::min()};
    // Accepts counted without the lock since it was last held: they belong to the head segment.
    std::atomic<std::uint64_t> pending_accepts_{0};
};

} // namespace resilience::detail
