// SPDX-License-Identifier: MIT
/// \file circuit_breaker/config_block.hpp
/// `breaker_config`: the options block a breaker publishes (the options with what it derives from
/// them), and what follows from a block alone, with no state: whether two blocks are alike, the empty
/// sample one asks for, the verdict on an outcome, the length of the n-th break. The state that reads
/// them is in state.hpp.
#pragma once

#include "../classifier.hpp"
#include "../context.hpp"
#include "../detail/snapshot_cell.hpp" // pinnable
#include "../outcome.hpp"
#include "options.hpp"
#include "window.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

namespace resilience::inline v0_2::detail {

/// How a finished call is recorded.
enum class breaker_verdict : std::uint8_t { success, failure, ignored };

/// The options of a breaker with what the breaker derives from them: immutable once published (see
/// `breaker_core::cell_`). A call that needs them after its admission pins the block it was admitted
/// under, and a block replaced by a reconfiguration is freed once no call pins it. A call admitted
/// under plain options (`plain`) pins nothing: it is judged under `breaker_plain<>::block`, which says
/// the same as its own options for everything such a call reads after its admission (its sample
/// and the sample's epoch it takes along in its admission).
struct breaker_config : pinnable {
    breaker_config(circuit_breaker_options o, std::uint64_t epoch)
        : options(std::move(o)), sample_epoch(epoch) {
        if (!options.sampling) {
            plain = options.should_handle.empty();
            return;
        }
        const breaker_sampling& w = *options.sampling;
        minimum_throughput =
            static_cast<std::uint64_t>(w.minimum_throughput.value_or(w.calls ? *w.calls : 20));
        slow_duration = w.slow_call_duration;
        slow_trips = w.slow_call_ratio.has_value();
        plain = options.should_handle.empty() && !slow_duration;
    }

    /// Does admitting a call need the time (to time it against a slow-call rule)?
    bool times_calls() const noexcept { return slow_duration.has_value(); }

    const circuit_breaker_options options;
    std::uint64_t minimum_throughput = 0;
    std::optional<std::chrono::nanoseconds> slow_duration;
    bool slow_trips = false;
    /// The default classifier and no slow-call rule: a closed admission under these options needs
    /// nothing of them later but whether they sample and the sample's epoch, which it takes along,
    /// so it pins nothing (see `breaker_core::admit_plain`).
    bool plain = false;
    /// Which sample the calls admitted under this block belong to: a reconfiguration that starts a
    /// fresh sample gives the next number, one that keeps the sample keeps it.
    const std::uint64_t sample_epoch;
};

/// Whether `a` and `b` are the same options, so that a reconfiguration from one to the other
/// changes nothing. Callbacks compare by identity: two classifiers are the same when they share
/// their callable (copies of one), and options with a `std::function` callback are never the same
/// as any (two of them cannot be compared).
inline bool same_breaker_options(const circuit_breaker_options& a,
                                 const circuit_breaker_options& b) noexcept {
    if (a.on_state_change || b.on_state_change || a.on_rejected || b.on_rejected)
        return false;
    if (a.sampling.has_value() != b.sampling.has_value())
        return false;
    if (a.sampling) {
        const breaker_sampling& x = *a.sampling;
        const breaker_sampling& y = *b.sampling;
        if (x.calls != y.calls || x.window != y.window || x.segments != y.segments ||
            x.minimum_throughput != y.minimum_throughput || x.failure_ratio != y.failure_ratio ||
            x.slow_call_duration != y.slow_call_duration || x.slow_call_ratio != y.slow_call_ratio)
            return false;
    }
    return a.name == b.name && a.failure_threshold == b.failure_threshold &&
           a.break_duration == b.break_duration && a.break_duration_growth == b.break_duration_growth &&
           a.max_break_duration == b.max_break_duration && a.probes == b.probes &&
           a.should_handle.same_as(b.should_handle) && a.telemetry.same_as(b.telemetry);
}

/// What a plain call is judged under past its admission (`block`): the default classifier and no
/// slow-call rule. Never freed; read only for those two, which read as the defaults even before it is
/// initialised (zero-initialised, an empty classifier and no duration): the dynamic initialisation of
/// a template's static member is unordered, so a call made during another file's static
/// initialisation may be judged under it before it is made. A static member of a template,
/// so that only a file that admits a call through a breaker makes it and runs its initialiser (in
/// the compiled mode, only the library): an inline variable would be made, with the options'
/// constructor and destructor, in every file that includes this header.
template <class = void>
struct breaker_plain {
    static const breaker_config block;
};
template <class T>
const breaker_config breaker_plain<T>::block{circuit_breaker_options{.failure_threshold = 1}, 0};

/// Whether options `a` and `b` sample alike: neither samples, or both keep the same window (the
/// same `calls`, or the same `window` and `segments`) and mark the same calls slow. What a sample
/// holds means the same under both, so a reconfiguration from one to the other keeps it; the ratios
/// and `minimum_throughput` only judge it.
inline bool same_sample(const circuit_breaker_options& a, const circuit_breaker_options& b) noexcept {
    if (!a.sampling || !b.sampling)
        return !a.sampling && !b.sampling;
    const breaker_sampling& x = *a.sampling;
    const breaker_sampling& y = *b.sampling;
    if (x.calls != y.calls || x.window != y.window || x.slow_call_duration != y.slow_call_duration)
        return false;
    return !x.window || x.segments == y.segments;
}

/// The empty sample `cfg` asks for, if any.
inline void make_sample(const breaker_config& cfg, std::optional<count_window>& counts,
                        std::optional<time_window>& times) {
    if (!cfg.options.sampling)
        return;
    const breaker_sampling& w = *cfg.options.sampling;
    if (w.calls)
        counts.emplace(static_cast<std::size_t>(*w.calls));
    else
        times.emplace(*w.window / static_cast<std::int64_t>(w.segments), w.segments);
}
/// How the outcome `o` of a call admitted under `cfg` is recorded: a value is a success unless
/// `should_handle` handles it (then a failure); a failure is a failure when it handles it, else
/// ignored. Calls the user's classifier, with no lock held; what it throws propagates.
/// Precondition: `cfg.options.should_handle.accepts<R>()`.
template <class R>
breaker_verdict verdict_of(const breaker_config& cfg, const outcome<R>& o, const context* ctx = nullptr) {
    const bool handled = cfg.options.should_handle
                             .classify(
                                 o, [](const failure& f) noexcept { return !is_cancellation(f); }, ctx)
                             .handle;
    if (o.has_value())
        return handled ? breaker_verdict::failure : breaker_verdict::success;
    return handled ? breaker_verdict::failure : breaker_verdict::ignored;
}

/// The `opens`-th consecutive break under the options `cfg`.
inline std::chrono::nanoseconds break_for(const breaker_config& cfg, std::uint64_t opens) noexcept {
    const circuit_breaker_options& o = cfg.options;
    const std::chrono::nanoseconds cap = o.max_break_duration.value_or(std::chrono::nanoseconds::max());
    const double growth = o.break_duration_growth;
    if (opens <= 1 || growth == 1.0)
        return std::min(o.break_duration, cap);
    const long double d = static_cast<long double>(o.break_duration.count()) *
                          std::pow(static_cast<long double>(growth), static_cast<long double>(opens - 1));
    if (!(d < static_cast<long double>(cap.count())))
        return cap; // also catches infinity
    return std::chrono::nanoseconds{static_cast<std::chrono::nanoseconds::rep>(d)};
}

} // namespace resilience::detail
