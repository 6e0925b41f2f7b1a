// SPDX-License-Identifier: MIT
/// \file adaptive_throttle.hpp
/// `adaptive_throttle`: refuses calls locally, at random, in proportion to how much of what it sent
/// the dependency has been refusing lately, so an overloaded dependency is not sent what it would
/// refuse anyway.
#pragma once

#include "classifier.hpp"
#include "clock.hpp"
#include "concepts.hpp"
#include "context.hpp"
#include "detail/segment_grid.hpp"
#include "detail/shared_handle.hpp"
#include "detail/snapshot_cell.hpp"
#include "detail/time.hpp"
#include "error.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "random.hpp"
#include "task.hpp"
#include "telemetry_event.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

namespace resilience {

/// How an `adaptive_throttle` decides. `adaptive_throttle_options{}` is valid (the values of the
/// Google SRE book's "Handling Overload" chapter: `k` 2, a window of two minutes). Checked by the
/// constructor (`std::invalid_argument` naming the throttle, the field and the value).
///
/// A user callback (`should_handle`, `on_rejected`) that throws ends the call with its exception
/// as the call's failure (after `on_rejected`, instead of the refusal, and the listener hears
/// nothing); `execute_outcome` returns it, `execute` throws it.
struct adaptive_throttle_options {
    /// Carried by the errors it makes (`error::policy_name()`), by `rejection_event`s and by
    /// `name()`. Empty: unnamed.
    std::string name{};
    /// How many requests each accepted one allows: calls are refused locally once the window's
    /// requests exceed `k` times its accepts. 2 lets through twice what the dependency accepts (it
    /// wastes some of its capacity on refusals, but finds out quickly when it recovers); 1.1 is
    /// stricter. Positive and finite. At most 1, the throttle refuses calls while any call of the
    /// window was not accepted (refused calls included), however few: rarely what is wanted.
    double k = 2.0;
    /// How long a request or an accept is remembered. Positive.
    std::chrono::nanoseconds window = std::chrono::minutes{2};
    /// `window` is kept in this many segments of `window / segments` (rounded down) each, on a grid
    /// from the clock's epoch, so the memory is fixed: a count made in the segment starting at `s`
    /// stops counting at exactly `s + segments * (window / segments)`, between
    /// `window - window / segments` and `window` after it was made (as `breaker_sampling::segments`).
    /// Positive, at most `max_segments`, and at most `window` in nanoseconds.
    std::size_t segments = 12;
    /// The most `segments` accepted: two counters are kept per segment, so the bound caps the memory.
    static constexpr std::size_t max_segments = 1'000'000;
    /// Which outcomes the dependency did not accept (see `classifier`). Empty: every failure but
    /// cancellation, and an `expected_like` value holding an error; every other value is an accept.
    /// A failure that ends a call stopped from outside the throttle (by its caller, or by a timeout
    /// around the throttle) is an accept whatever this says: the dependency did not refuse it.
    /// Called without any lock held.
    classifier should_handle{};
    /// Called when the throttle refuses a call, before the refusal (`throttled_error`) is returned,
    /// with `rejection_reason::throttled` and a zero `retry_after()`. Runs on the caller's coroutine,
    /// without any lock held; must not block.
    std::function<void(const rejection_event&)> on_rejected{};
    /// Hears this throttle's `rejection`s. Empty: the listener of a `telemetry` stage around the
    /// call, if any (see telemetry.hpp).
    telemetry_listener telemetry{};
};

namespace detail {

/// Throws `std::invalid_argument` for the first thing wrong with `o`.
inline void validate_throttle_options(const adaptive_throttle_options& o) {
    const auto bad = [&o](const std::string& what) {
        throw std::invalid_argument(policy_label("adaptive_throttle", o.name) + ": " + what);
    };
    if (!(o.k > 0.0 && std::isfinite(o.k)))
        bad("k must be positive and finite, got " + format_number(o.k));
    if (o.window <= std::chrono::nanoseconds::zero())
        bad("window must be positive, got " + std::to_string(o.window.count()) + "ns");
    if (o.segments == 0)
        bad("segments must be positive, got 0");
    if (o.segments > adaptive_throttle_options::max_segments)
        bad("segments must be at most " + std::to_string(adaptive_throttle_options::max_segments) + ", got " +
            std::to_string(o.segments));
    if (o.segments > static_cast<std::uint64_t>(o.window.count()))
        bad("segments must be at most the window in nanoseconds (" + std::to_string(o.window.count()) +
            "), got " + std::to_string(o.segments));
}

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

/// Whether `a` and `b` are the same options: a reconfiguration from one to the other changes
/// nothing. The classifier and the listener compare by identity (copies of one are the same);
/// options with an `on_rejected` are never the same as any (it cannot be compared).
inline bool same_throttle_options(const adaptive_throttle_options& a,
                                  const adaptive_throttle_options& b) noexcept {
    return !a.on_rejected && !b.on_rejected && a.name == b.name && a.k == b.k && a.window == b.window &&
           a.segments == b.segments && a.should_handle.same_as(b.should_handle) &&
           a.telemetry.same_as(b.telemetry);
}

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
        reach(since_epoch(read));
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
        reach(now);
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
        const std::int64_t k = index_of(since_epoch(read));
        const auto n = static_cast<std::int64_t>(ring_.size());
        if (k > head_ && k - head_ >= n)
            return {};
        snapshot c = totals_;
        c.accepts += pending_accepts_.load(std::memory_order_relaxed); // they belong to the head segment
        if (k > head_) {
            std::size_t slot = head_slot_;
            for (std::int64_t i = head_ + 1; i <= k; ++i) {
                slot = next(slot);
                c.requests -= ring_[slot].requests;
                c.accepts -= ring_[slot].accepts;
            }
        }
        return c;
    }

private:
    // Adds the pending accepts to the head segment, then moves the head to the segment of `now` if it is
    // newer, emptying the segments that leave the window on the way. Under the lock.
    void reach(std::chrono::nanoseconds now) {
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
        const std::int64_t k = index_of(now);
        if (!started_) {
            // No accept is counted without the lock before a window has a head: any pending now
            // raced with the reconfiguration that replaced the window, and belongs to the old one.
            pending_accepts_.store(0, std::memory_order_relaxed);
            started_ = true;
            head_slot_ = slot_of(k);
        } else if (k <= head_) {
            return; // only at the saturated end of time, where the head's end cannot be represented
        } else if (k - head_ >= static_cast<std::int64_t>(ring_.size())) {
            std::fill(ring_.begin(), ring_.end(), segment{});
            totals_ = {};
            head_slot_ = slot_of(k);
        } else {
            for (std::int64_t i = head_ + 1; i <= k; ++i) {
                head_slot_ = next(head_slot_);
                totals_.requests -= ring_[head_slot_].requests;
                totals_.accepts -= ring_[head_slot_].accepts;
                ring_[head_slot_] = {};
            }
        }
        head_ = k;
        head_end_.store(end_of(k), std::memory_order_release);
    }

    std::int64_t index_of(std::chrono::nanoseconds t) const noexcept { return segment_of(t, width_); }
    // The first instant after segment `k` (saturated: the last segment of time ends at the end of time).
    std::int64_t end_of(std::int64_t k) const noexcept {
        // `k` is the floor of some reading over the width, so `(k + 1) * width` cannot fall below the
        // lowest value; it passes the highest exactly when `k >= max / width`.
        constexpr std::int64_t highest = std::numeric_limits<std::int64_t>::max();
        const std::int64_t width = width_.count();
        if (k >= highest / width)
            return highest;
        return (k + 1) * width;
    }
    std::size_t slot_of(std::int64_t k) const noexcept { return ring_slot(k, ring_.size()); }
    std::size_t next(std::size_t slot) const noexcept { return slot + 1 == ring_.size() ? 0 : slot + 1; }

    struct segment {
        std::uint64_t requests = 0; // every call, refused ones included
        std::uint64_t accepts = 0;  // the calls the dependency accepted
    };

    snapshot_cell<throttle_config> cell_;        // replaced under the lock, pinned by calls without it
    std::atomic<std::uint64_t> window_epoch_{0}; // the block in force's, written under the lock
    std::atomic<const std::type_info*> value_type_{nullptr}; // likewise, its classifier's
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

} // namespace detail

/// Client-side adaptive throttling, as the Google SRE book's "Handling Overload" chapter describes
/// it. Over a sliding `window`, the throttle counts the *requests* (every call made through it,
/// those it refuses itself included) and the *accepts* (the calls whose outcome `should_handle`
/// does not handle), and refuses each new call, before it is sent, with probability
///
///     p = max(0, (requests - k * accepts) / (requests + 1))
///
/// as the window stands when the call arrives (the call itself is counted after). While the
/// dependency accepts at least one call in `k`, `p` is 0 and nothing is refused; as it refuses
/// more, the throttle sends less, and it sends again as accepts come back. `p` stays below 1, so
/// some calls always go through to find out. A refused call fails with `throttled_error` (a failure
/// value: `execute_outcome` reports it without an exception), reported to the listener as a
/// `rejection`; `is_transient` says no, so a default retry around the throttle does not retry it.
///
/// - A request is counted when the call arrives; an accept when the call ends, at that instant.
///   Each stops counting exactly `segments` segments after the start of its own (see `segments`).
/// - Cancellation is not a refusal: a call that ends with a failure after it was stopped from outside
///   (its caller, a timeout around the throttle) is an accept. A call stopped before it arrives is refused
///   with `cancelled_error` and not counted.
/// - The draw uses `Random` under the throttle's lock, so even a `seeded_random` may be shared by
///   threads; the same calls at the same instants with the same seed give the same decisions. No
///   draw is made while `p` is 0.
///
/// A cheap copyable handle: copies are the same throttle, thread-safe, usable from many event
/// loops at once. The state lives as long as any copy or any call that uses it (docs/core.md,
/// "Lifetimes"). Admitting a call locks a mutex briefly and
/// reads the clock (the call's shared reading). Counting an accept reads the clock (a fresh reading)
/// and is one atomic increment, without the lock, unless the call ends in a later segment of the
/// window than any call before it. An admitted call allocates nothing; a refusal allocates its
/// `throttled_error`, and throws nothing.
///
///     rs::adaptive_throttle throttle{{.k = 2.0, .window = 2min}};
///     rs::pipeline p{rs::retry{}, throttle, rs::timeout{1s}};   // every attempt is a request
///     rs::outcome<page> r = co_await p.execute_outcome(fetch);
///     if (!r && r.error().code() == rs::errc::throttled) { /* not sent: the dependency is refusing */ }
template <clock C = steady_clock, random_source Random = thread_random>
class adaptive_throttle
    : public policy_base<adaptive_throttle<C, Random>>,
      public detail::shared_handle<adaptive_throttle<C, Random>, detail::throttle_core<C, Random>> {
    using core_type = detail::throttle_core<C, Random>;
    using handle = detail::shared_handle<adaptive_throttle<C, Random>, core_type>;
    using config = typename core_type::config_block;

public:
    /// The SRE book's values: see `adaptive_throttle_options`. (A constructor of its own rather than
    /// defaulted options, so that a clock or a source without a default is asked for only when used.)
    adaptive_throttle() : adaptive_throttle(adaptive_throttle_options{}) {}
    /// Validates `options` (`std::invalid_argument` naming the field and value). Starts no timer.
    explicit adaptive_throttle(adaptive_throttle_options options, C clock = C{}, Random rng = Random{})
        : handle(make_core(std::move(options), std::move(clock), std::move(rng))) {}

    // ---- the policy protocol (see policy.hpp): admitting and recording never wait ----
    static constexpr bool enter_never_waits = true;
    struct call_state {
        detail::pinned<config> cfg; // the options the call was admitted under, to its end
    };

    /// The call is judged under the options in force when it is admitted, which it pins in the
    /// same locked step (a stop or a classifier of another type: pinned before, to say so).
    template <class R>
    step enter(call_state& s, const context& ctx, const context*&, std::optional<outcome<R>>& result) const {
        core_type& core = this->held();
        const std::type_info* const judged = core.value_type();
        if (ctx.stop_requested() || (judged && *judged != typeid(R))) [[unlikely]] {
            s.cfg = core.pin();
            const adaptive_throttle_options& o = s.cfg->options;
            if (ctx.stop_requested()) {
                result.emplace(failure::make(cancelled_error{o.name}));
                return step::done;
            }
            if (!o.should_handle.template accepts<R>()) {
                result.emplace(o.should_handle.template mismatch<R>("adaptive_throttle", o.name));
                return step::done;
            }
        }
        try {
            const std::optional<double> refused_with = core.admit(detail::call_now(core.clock(), ctx), s.cfg);
            const adaptive_throttle_options& o = s.cfg->options;
            // Reconfigured between the test above and the admission, to a classifier of another
            // type: the request is counted, the call is not run.
            if (!o.should_handle.template accepts<R>()) [[unlikely]] {
                result.emplace(o.should_handle.template mismatch<R>("adaptive_throttle", o.name));
                return step::done;
            }
            if (!refused_with)
                return step::proceed;
            if (o.on_rejected) // what it throws is the call's failure, below
                o.on_rejected(
                    rejection_event{o.name, rejection_reason::throttled}.with_properties(ctx.properties()));
            result.emplace(detail::refused(
                detail::listener_for(o.telemetry, ctx), core.clock(),
                detail::event(telemetry_kind::rejection, "adaptive_throttle", o.name, ctx.attempt()),
                failure::make(throttled_error{o.name, *refused_with})));
        } catch (...) {
            result.emplace(failure::current()); // the clock or `on_rejected` threw
        }
        return step::done;
    }

    /// Counts an accept unless `should_handle` handles the outcome. A classifier (or a clock) that
    /// throws makes its exception the call's failure, and nothing is counted.
    template <class R>
    step leave(call_state& s, const context& ctx, outcome<R>& result) const {
        core_type& core = this->held();
        try {
            if (accepted(s.cfg->options.should_handle, result, ctx))
                core.accept(*s.cfg, core.clock().now());
        } catch (...) {
            result = outcome<R>{failure::current()};
        }
        return step::proceed;
    }

    /// The rejection probability a call arriving now would be refused with. Changes nothing.
    [[nodiscard]] double probability() const {
        const auto c = counts();
        return detail::throttle_probability(c.requests, c.accepts, this->held().options().k);
    }
    /// The requests in the window now, refused ones included. Changes nothing.
    [[nodiscard]] std::uint64_t requests() const { return counts().requests; }
    /// The accepts in the window now. Changes nothing.
    [[nodiscard]] std::uint64_t accepts() const { return counts().accepts; }

    /// Puts new options in force while calls run, on every copy of the throttle. `options` is
    /// checked exactly as by the constructor (`std::invalid_argument` naming the field and the
    /// value); when it is refused, nothing changes. Thread-safe against calls and other
    /// reconfigurations (it takes the throttle's lock briefly).
    ///
    /// - Calls admitted from now on are judged under the new options; a call in flight finishes
    ///   under those it was admitted with (its `should_handle`, and the name and `on_rejected` of its
    ///   refusal).
    /// - The new `k` applies from the next call that arrives.
    /// - Carried over: the requests and accepts of the window, when `window` and `segments` are those
    ///   in force. Otherwise the throttle starts an empty window (the old counts were kept on another
    ///   grid), so it refuses nothing until the new window shows refusals again, and the accepts of
    ///   calls admitted before the change are not counted in it (their requests were not).
    /// - The random source is kept.
    ///
    /// Memory: the options replaced are freed once no call admitted under them is still running.
    /// Options the same as those in force (the same values, classifier and listener copies of those
    /// in force, and no `on_rejected`, which cannot be compared) change nothing and allocate
    /// nothing. A change of `window` or `segments` allocates the new window.
    void reconfigure(adaptive_throttle_options options) const {
        detail::validate_throttle_options(options);
        this->held().reconfigure(std::move(options));
    }

    /// A copy of the options in force: the constructor's or the latest `reconfigure`'s.
    [[nodiscard]] adaptive_throttle_options options() const { return this->held().options(); }
    [[nodiscard]] const C& clock() const noexcept { return this->held().clock(); }
    /// The `name` option (empty when unnamed).
    [[nodiscard]] std::string name() const { return this->held().options().name; }

private:
    typename core_type::snapshot counts() const { return this->held().counts(this->held().clock().now()); }

    // An accept unless the classifier handles it; a failure of a call its caller stopped is one.
    template <class R>
    static bool accepted(const classifier& handles, const outcome<R>& result, const context& ctx) {
        if (handles.plain_success(result) || (result.has_failure() && ctx.stop_requested()))
            return true;
        return !handles.classify(result, &not_cancellation, &ctx).handle;
    }
    static bool not_cancellation(const failure& f) noexcept { return !is_cancellation(f); }

    static core_type* make_core(adaptive_throttle_options options, C clock, Random rng) {
        detail::validate_throttle_options(options);
        return handle::make_state(std::move(options), std::move(clock), std::move(rng));
    }
};

// clang-format off
adaptive_throttle() -> adaptive_throttle<steady_clock, thread_random>;
adaptive_throttle(adaptive_throttle_options) -> adaptive_throttle<steady_clock, thread_random>;
template <clock C>
adaptive_throttle(adaptive_throttle_options, C) -> adaptive_throttle<C, thread_random>;
template <clock C, random_source R>
adaptive_throttle(adaptive_throttle_options, C, R) -> adaptive_throttle<C, R>;
// clang-format on

} // namespace resilience
