// SPDX-License-Identifier: MIT
/// \file bulkhead/adaptive_limit.hpp
/// The algorithms that move a bulkhead's limit with what the dependency manages: `aimd` and `gradient`.
///
/// Each is an options aggregate (what the user writes in `bulkhead_options::adapt`) and, in
/// `detail`, a small state machine that turns the samples of finished calls into a limit. The state
/// machines know nothing of threads, queues or clocks: the bulkhead feeds them under its lock, and a
/// test can drive them directly.
#pragma once

#include "../classifier.hpp"
#include "../detail/config.hpp"
#include "../detail/time.hpp"
#include "../error.hpp"
#include "../outcome.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>

namespace resilience::inline v0_2 {

/// Additive increase, multiplicative decrease, as TCP does with its congestion window: the limit
/// creeps up while calls succeed under pressure and drops by a share as soon as the dependency fails
/// or drags. The right choice when the dependency says it is overloaded with errors (503s,
/// timeouts, refused connections), or when "too slow" is a number you can write down.
///
/// - **Increase.** A success ending while the limit is what holds calls back (someone is queued, or
///   every slot is taken) counts one; when the count reaches the limit, the limit grows by one and
///   the count starts again: one more slot per limit's worth of successful calls. A success while
///   slots are free counts nothing, so the limit never grows while nothing waits for it.
/// - **Decrease.** A failure `should_handle` counts, or a call lasting at least
///   `slow_call_duration`, multiplies the limit by `decrease`, rounded down (so it always drops by
///   at least one), never below `min`, and starts the count again. Once per round: a call admitted
///   before the latest decrease moves the limit no more, either way (it ran under the old limit,
///   which has already paid for it), so a burst of failures from one overloaded moment costs one
///   decrease, not one per call.
///
///     .adapt = rs::aimd{.min = 5, .max = 100, .slow_call_duration = 1s}
struct aimd {
    /// The lowest the limit goes. At least 1, at most `bulkhead_options::max_limit`.
    std::size_t min = 1;
    /// The highest the limit goes. At least `min`, at most `bulkhead_options::max_limit`. 200 is
    /// Netflix concurrency-limits' default.
    std::size_t max = 200;
    /// A call lasting at least this long (from taking its slot to giving it back) counts as a
    /// failure, whatever it returned. Unset: only failures count. Positive when set.
    std::optional<std::chrono::nanoseconds> slow_call_duration{};
    /// What the limit is multiplied by on a failure or a slow call, in (0, 1).
    double decrease = 0.9;
    /// Which outcomes count as failures (see `classifier`); a failure it declines is not recorded
    /// at all, a value it handles counts as a failure. Empty: every failure but cancellation and
    /// `bulkhead_rejected_error` (a refusal by this or an inner bulkhead says nothing of the
    /// dependency); values are successes. Called without any lock held.
    classifier should_handle{};
};

/// Latency against its own baseline, in the manner of Netflix's Gradient2: the mean latency of the
/// last `short_samples` calls is compared with a long-running average of it (the baseline), and the
/// limit is scaled by how far the first has drifted above the second. The right choice when
/// overload shows as queueing at the dependency (latency climbs before anything fails) and no
/// fixed "too slow" fits every load.
///
/// Every `short_samples` recorded calls make one measurement, and the limit is recomputed once:
/// - `short`: the mean latency of the measurement's successful calls. The baseline, an exponential
///   average over `long_samples` measurements (weight `2 / (long_samples + 1)`; the first
///   measurement sets it), takes it in; when `short` falls below half the baseline (the dependency
///   recovered from a long overload that had inflated it), the baseline also drops by 5%, so it need
///   not wait out the whole average.
/// - the gradient: `tolerance * baseline / short` (latency up to `tolerance` times the baseline reads
///   as no queueing), lowered to the measurement's share of successful calls when that is smaller (a
///   dependency failing fast must not read as healthy), and kept within [0.5, 1].
/// - the limit: `estimate * gradient + headroom`, taken in with weight `smoothing`:
///   `estimate = estimate * (1 - smoothing) + (estimate * gradient + headroom) * smoothing`, within
///   [`min`, `max`]; the limit is that estimate rounded down. A measurement in which no call ended
///   while the limit held calls back may lower the estimate but not raise it: the limit never
///   grows while nothing waits for it.
///
/// At a steady latency the limit grows by `headroom * smoothing` a measurement; it settles where
/// the latency rise from the extra calls balances `headroom`.
///
///     .adapt = rs::gradient{.min = 5, .max = 500}
struct gradient {
    /// The lowest the limit goes. At least 1, at most `bulkhead_options::max_limit`.
    std::size_t min = 1;
    /// The highest the limit goes. At least `min`, at most `bulkhead_options::max_limit`.
    std::size_t max = 200;
    /// Calls per measurement: the limit is recomputed once every this many recorded calls. Positive.
    std::size_t short_samples = 10;
    /// Measurements (each of `short_samples` calls) the baseline averages over. Positive. The
    /// default 60 (600 calls with the default `short_samples`) follows Netflix's 600-sample long
    /// window.
    std::size_t long_samples = 60;
    /// How far above the baseline the short latency may go before the limit shrinks: 1.5 lets it
    /// be 50% higher. Finite and at least 1.
    double tolerance = 1.5;
    /// The weight of each new estimate, in (0, 1]: 1 takes it whole, smaller values damp swings.
    double smoothing = 0.2;
    /// Calls added to each estimate: what lets the limit grow while latency holds at its baseline,
    /// and how much queueing at the dependency it accepts. Finite and not negative.
    double headroom = 4.0;
    /// Which outcomes count as failures (as for `aimd`). A counted failure adds no latency (a fast
    /// refusal is not a healthy answer) and lowers the measurement's share of successes.
    classifier should_handle{};
};

/// What `bulkhead_options::adapt` holds: nothing (a fixed limit, the default), `aimd` or `gradient`.
///
///     rs::bulkhead db{{.max_concurrent_calls = 20, .queue_limit = 100,
///                      .adapt = rs::aimd{.min = 5, .max = 100}}};
using adaptive_limit = std::variant<std::monostate, aimd, gradient>;

namespace detail {

/// What a finished call tells the algorithm.
struct limit_sample {
    std::chrono::nanoseconds latency{}; ///< from taking the slot to giving it back
    bool failed = false;                ///< a failure `should_handle` counts
    bool limited = false;               ///< when it ended, someone was queued or every slot was taken
    std::uint64_t epoch = 0;            ///< the algorithm's `epoch()` when the call was admitted
};

/// How the outcome of a call is recorded.
enum class limit_verdict : unsigned char { success, failure, ignored };

/// The default of `should_handle`: every failure but cancellation and a bulkhead's refusal.
inline bool limit_counts_by_default(const failure& f) noexcept {
    return !is_cancellation(f) && f.code() != errc::bulkhead_rejected;
}

/// Judges the outcome of a call with `should_handle`. A failure while the caller's own stop was
/// requested is the caller giving up: ignored. What the classifier throws propagates.
/// Precondition: `should_handle.accepts<R>()`.
template <class R>
limit_verdict judge_limit(const classifier& should_handle, const outcome<R>& o, bool caller_stopped,
                          const context* ctx = nullptr) {
    if (o.has_value() && !should_handle.sees_values())
        return limit_verdict::success;
    if (o.has_failure() && caller_stopped)
        return limit_verdict::ignored;
    const bool handled = should_handle.classify(o, &limit_counts_by_default, ctx).handle;
    if (o.has_value())
        return handled ? limit_verdict::failure : limit_verdict::success;
    return handled ? limit_verdict::failure : limit_verdict::ignored;
}

/// `aimd`'s state (see `aimd`). Not thread-safe: its owner locks.
class aimd_limit {
public:
    aimd_limit(const aimd& o, std::size_t start, std::uint64_t epoch = 0) noexcept
        : options_(o), limit_(start), epoch_(epoch) {}

    /// Takes new parameters (a reconfiguration of the bulkhead): they judge the next samples. The
    /// limit carries over, clamped into the new [`min`, `max`]; the count towards the next increase
    /// carries over too, unless the clamp moved the limit (it then starts again). The epoch is
    /// kept: the calls admitted before count as they would have.
    void reconfigure(const aimd& o) noexcept {
        options_ = o;
        const std::size_t clamped = std::clamp(limit_, o.min, o.max);
        if (clamped != limit_) {
            limit_ = clamped;
            successes_ = 0;
        }
    }

    std::size_t limit() const noexcept { return limit_; }
    /// Decreases so far: a call remembers it at admission, and its sample counts only while it holds.
    std::uint64_t epoch() const noexcept { return epoch_; }
    bool needs_latency() const noexcept { return options_.slow_call_duration.has_value(); }
    bool slow(std::chrono::nanoseconds latency) const noexcept {
        return options_.slow_call_duration && latency >= *options_.slow_call_duration;
    }
    /// True when a sample like this changes nothing whatever the state: a quick success while
    /// nothing waits. Lets the owner skip its lock.
    bool inert(std::chrono::nanoseconds latency, bool failed, bool limited) const noexcept {
        return !failed && !limited && !slow(latency);
    }

    /// Takes one sample in; says whether the limit changed.
    bool record(const limit_sample& s) noexcept {
        if (s.epoch != epoch_)
            return false;
        if (s.failed || slow(s.latency)) {
            successes_ = 0;
            const auto scaled =
                static_cast<std::size_t>(std::floor(static_cast<double>(limit_) * options_.decrease));
            const std::size_t lowered = std::max(options_.min, std::min(scaled, limit_ - 1));
            if (lowered >= limit_)
                return false;
            limit_ = lowered;
            ++epoch_;
            return true;
        }
        if (!s.limited || limit_ >= options_.max)
            return false;
        if (++successes_ < limit_)
            return false;
        successes_ = 0;
        ++limit_;
        return true;
    }

private:
    aimd options_;
    std::size_t limit_;
    std::size_t successes_ = 0;
    std::uint64_t epoch_ = 0;
};

/// `gradient`'s state (see `gradient`). Not thread-safe: its owner locks.
class gradient_limit {
public:
    gradient_limit(const gradient& o, std::size_t start) noexcept
        : options_(o), estimate_(static_cast<double>(start)) {}

    /// Takes new parameters (a reconfiguration of the bulkhead): they apply from the next sample.
    /// The estimate carries over, clamped into the new [`min`, `max`]; so do the baseline and the
    /// measurement being filled (which closes at the next sample if it already holds the new
    /// `short_samples`).
    void reconfigure(const gradient& o) noexcept {
        options_ = o;
        estimate_ = std::clamp(estimate_, static_cast<double>(o.min), static_cast<double>(o.max));
    }

    std::size_t limit() const noexcept {
        if (!(estimate_ < static_cast<double>(options_.max)))
            return options_.max;
        return std::max(options_.min, static_cast<std::size_t>(estimate_));
    }
    std::uint64_t epoch() const noexcept { return 0; }
    bool needs_latency() const noexcept { return true; }
    bool inert(std::chrono::nanoseconds, bool, bool) const noexcept { return false; }
    /// The baseline latency in nanoseconds (0 before the first measurement).
    double baseline() const noexcept { return baseline_; }
    double estimate() const noexcept { return estimate_; }

    bool record(const limit_sample& s) noexcept {
        ++calls_;
        if (!s.failed) {
            ++successes_;
            latency_sum_ += static_cast<double>(s.latency.count());
        }
        limited_ = limited_ || s.limited;
        if (calls_ < options_.short_samples)
            return false;
        const std::size_t before = limit();
        close_measurement();
        return limit() != before;
    }

private:
    void close_measurement() noexcept {
        double ratio = 1.0; // latency unknown (every call failed): no verdict from latency
        if (successes_ > 0) {
            const double recent = latency_sum_ / static_cast<double>(successes_);
            if (measurements_ == 0)
                baseline_ = recent;
            else
                baseline_ += (recent - baseline_) * 2.0 / (static_cast<double>(options_.long_samples) + 1.0);
            if (recent > 0.0 && baseline_ > 2.0 * recent)
                baseline_ *= 0.95;
            if (recent > 0.0)
                ratio = options_.tolerance * baseline_ / recent;
            ++measurements_;
        }
        const double share = static_cast<double>(successes_) / static_cast<double>(calls_);
        const double g = std::clamp(std::min(ratio, share), 0.5, 1.0);
        // Headroom only while nothing says "too many": added to a shrinking estimate it would hold
        // the limit where the shrink and the headroom balance, above what the dependency serves,
        // while the baseline slowly takes the inflated latency in and lets it climb further.
        const double target = g < 1.0 ? estimate_ * g : estimate_ + options_.headroom;
        double next = estimate_ * (1.0 - options_.smoothing) + target * options_.smoothing;
        if (!limited_)
            next = std::min(next, estimate_);
        estimate_ = std::clamp(next, static_cast<double>(options_.min), static_cast<double>(options_.max));
        calls_ = successes_ = 0;
        latency_sum_ = 0.0;
        limited_ = false;
    }

    gradient options_;
    double estimate_;
    double baseline_ = 0.0;
    std::size_t measurements_ = 0;
    // The measurement being filled.
    std::size_t calls_ = 0;
    std::size_t successes_ = 0;
    double latency_sum_ = 0.0;
    bool limited_ = false;
};

/// The algorithm `adapt` chose, or none (`adaptive()` false; nothing else may then be called).
class limit_algorithm {
    // Declared first: the members below deduce their return types from it.
    template <class F>
    auto visit(F f) const noexcept {
        if (const aimd_limit* a = std::get_if<aimd_limit>(&impl_))
            return f(*a);
        return f(*std::get_if<gradient_limit>(&impl_));
    }

public:
    limit_algorithm(const adaptive_limit& choice, std::size_t start) {
        if (const aimd* a = std::get_if<aimd>(&choice))
            impl_.emplace<aimd_limit>(*a, start);
        else if (const gradient* g = std::get_if<gradient>(&choice))
            impl_.emplace<gradient_limit>(*g, start);
    }

    /// Takes the options of a reconfiguration: `choice`, with `start` the new
    /// `max_concurrent_calls` (already validated against it). The same kind of algorithm keeps its
    /// state (see `aimd_limit::reconfigure`, `gradient_limit::reconfigure`). Another kind starts
    /// afresh from the current limit clamped into its bounds, or from `start` when there was no
    /// algorithm; a fresh AIMD starts a new epoch, so that calls admitted under the old algorithm
    /// move it no more. None: no algorithm.
    void reconfigure(const adaptive_limit& choice, std::size_t start) noexcept {
        aimd_limit* const was_aimd = std::get_if<aimd_limit>(&impl_);
        gradient_limit* const was_gradient = std::get_if<gradient_limit>(&impl_);
        const aimd* const a = std::get_if<aimd>(&choice);
        const gradient* const g = std::get_if<gradient>(&choice);
        if (was_aimd && a) {
            was_aimd->reconfigure(*a);
            return;
        }
        if (was_gradient && g) {
            was_gradient->reconfigure(*g);
            return;
        }
        const bool was = adaptive();
        const std::size_t from = was ? limit() : start;
        // A new AIMD starts past every epoch an AIMD of this bulkhead has had, whatever came between
        // (a gradient, or no algorithm at all), so that no call admitted before matches it.
        if (was)
            epochs_past_ = std::max(epochs_past_, epoch());
        if (a)
            impl_.emplace<aimd_limit>(*a, std::clamp(from, a->min, a->max), ++epochs_past_);
        else if (g)
            impl_.emplace<gradient_limit>(*g, std::clamp(from, g->min, g->max));
        else
            impl_.emplace<std::monostate>();
    }

    bool adaptive() const noexcept { return impl_.index() != 0; }
    std::size_t limit() const noexcept {
        return visit([](const auto& a) { return a.limit(); });
    }
    std::uint64_t epoch() const noexcept {
        return visit([](const auto& a) { return a.epoch(); });
    }
    bool needs_latency() const noexcept {
        return visit([](const auto& a) { return a.needs_latency(); });
    }
    bool inert(std::chrono::nanoseconds latency, bool failed, bool limited) const noexcept {
        return visit([&](const auto& a) { return a.inert(latency, failed, limited); });
    }
    bool record(const limit_sample& s) noexcept {
        if (aimd_limit* a = std::get_if<aimd_limit>(&impl_))
            return a->record(s);
        return std::get_if<gradient_limit>(&impl_)->record(s);
    }

private:
    std::variant<std::monostate, aimd_limit, gradient_limit> impl_;
    std::uint64_t epochs_past_ =
        0; // the latest epoch of any AIMD this algorithm has been (see `reconfigure`)
};

/// The `should_handle` of the algorithm `adapt` chose, or null for none.
inline const classifier* limit_classifier(const adaptive_limit& choice) noexcept {
    if (const aimd* a = std::get_if<aimd>(&choice))
        return &a->should_handle;
    if (const gradient* g = std::get_if<gradient>(&choice))
        return &g->should_handle;
    return nullptr;
}

/// Throws `std::invalid_argument` (prefixed with `label`) for the first thing wrong with `choice`,
/// given the starting limit `start` (`max_concurrent_calls`).
RESILIENCE_DECL void validate_adaptive_limit(const adaptive_limit& choice, std::size_t start,
                                             const std::string& label);

} // namespace detail

} // namespace resilience

#if RESILIENCE_INCLUDE_DEFINITIONS
#include "adaptive_limit.ipp"
#endif
