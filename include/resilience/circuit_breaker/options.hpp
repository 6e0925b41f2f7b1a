// SPDX-License-Identifier: MIT
/// \file circuit_breaker/options.hpp
/// What a `circuit_breaker` is told and tells: its states (`circuit_state`), its options
/// (`circuit_breaker_options`, `breaker_sampling`), its `state_change_event` and its `circuit_metrics`;
/// with the checks of the options, and the trip condition a breaker uses when they set none.
#pragma once

#include "../classifier.hpp" // classifier; policy_label, format_number for the checks
#include "../detail/config.hpp"
#include "../error.hpp"           // rejection_event
#include "../telemetry_event.hpp" // telemetry_listener

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace resilience::inline v0_2 {

/// Where a breaker stands. `closed`: calls run and are recorded. `open`: calls are refused until the
/// break is over. `half_open`: the break is over and up to `probes` calls test the dependency.
/// `isolated`: held open by hand (`isolate()`) until `reset()`.
enum class circuit_state { closed, open, half_open, isolated };

/// "closed", "open", "half_open" or "isolated": a static string, for logs.
constexpr const char* to_string(circuit_state s) noexcept {
    switch (s) {
    case circuit_state::closed:
        return "closed";
    case circuit_state::open:
        return "open";
    case circuit_state::half_open:
        return "half_open";
    case circuit_state::isolated:
        return "isolated";
    }
    return "unknown";
}

/// The recent calls over which a breaker judges ratios. Set exactly one of `calls` (the last N
/// calls, however long ago) and `window` (the calls of the last D of time, however many), and at
/// least one of `failure_ratio` and `slow_call_ratio`.
struct breaker_sampling {
    /// Count-based: the last `calls` calls. Positive and at most `max_calls`.
    std::optional<int> calls{};
    /// The largest `calls` accepted: a byte is kept per call, so the bound caps the memory.
    static constexpr int max_calls = 10'000'000;
    /// Time-based: the calls of the last `window` of time. Positive.
    std::optional<std::chrono::nanoseconds> window{};
    /// Time-based only: `window` is kept in this many segments of `window / segments` (rounded down)
    /// each, so memory is fixed; a call stops counting at most `window` after it was made, and not
    /// before `window - window / segments`. Positive, at most `max_segments`, and at most `window` in
    /// nanoseconds.
    std::size_t segments = 10;
    /// The most `segments` accepted: a few counters are kept per segment, so the bound caps the memory.
    static constexpr std::size_t max_segments = 1'000'000;
    /// Calls the sample must hold before a ratio can open the circuit, so two failures in a quiet
    /// hour do not read as 100%. Default: `calls` for a count sample (it must be full), 20 for a
    /// time window. Positive, and at most `calls`.
    std::optional<int> minimum_throughput{};
    /// Opens when at least this share of the sample failed; in (0, 1].
    std::optional<double> failure_ratio{};
    /// A call taking at least this long is slow, whether it succeeded or failed; positive.
    std::optional<std::chrono::nanoseconds> slow_call_duration{};
    /// Opens when at least this share of the sample was slow; in (0, 1]; needs `slow_call_duration`.
    std::optional<double> slow_call_ratio{};
};

/// What a breaker tells `on_state_change`. Refers to the breaker's name: valid only during the
/// callback.
class state_change_event {
public:
    state_change_event(std::string_view policy_name, circuit_state from, circuit_state to) noexcept
        : name_(policy_name), from_(from), to_(to) {}

    /// The `name` option of the breaker (empty when unnamed).
    [[nodiscard]] std::string_view policy_name() const noexcept { return name_; }
    /// The state left.
    [[nodiscard]] circuit_state from() const noexcept { return from_; }
    /// The state entered.
    [[nodiscard]] circuit_state to() const noexcept { return to_; }

private:
    std::string_view name_;
    circuit_state from_;
    circuit_state to_;
};

/// How a `circuit_breaker` decides. `circuit_breaker_options{}` is valid: with no trip condition
/// set (neither `failure_threshold` nor `sampling`), the breaker uses Polly's defaults, a time
/// window of 30s, `failure_ratio` 0.1 and `minimum_throughput` 100, and `options()` shows that
/// sampling. Checked by the constructor (`std::invalid_argument` naming field and value).
///
/// A user callback (`should_handle`, `on_state_change`, `on_rejected`) that throws while a call
/// runs makes its exception that call's failure, after the breaker's own bookkeeping (the result
/// recorded, a probe slot freed); `execute_outcome` returns it, `execute` throws it. One thrown
/// from `isolate()` or `reset()` reaches their caller, after the change was made.
struct circuit_breaker_options {
    /// Names this breaker in the errors it makes (`error::policy_name()`), in its events, in
    /// `circuit_metrics` and in its messages. Empty: unnamed.
    std::string name{};
    /// Opens after this many consecutive recorded failures (a recorded success resets the run).
    /// Unset: no consecutive rule. Positive.
    std::optional<int> failure_threshold{};
    /// Opens on a failure or slow-call ratio over recent calls. Unset: no ratio rule, unless
    /// `failure_threshold` is unset too (then Polly's default, above).
    std::optional<breaker_sampling> sampling{};
    /// How long the circuit stays open after its first opening. Default 5s (Polly's). Positive.
    std::chrono::nanoseconds break_duration = std::chrono::seconds{5};
    /// Each re-opening without a close in between multiplies the break by this factor: the n-th
    /// consecutive opening breaks for `break_duration * growth^(n-1)`, capped at
    /// `max_break_duration`. 1 (the default) keeps it constant. Finite and at least 1.
    double break_duration_growth = 1.0;
    /// The longest break. Unset: no cap, but the break saturates at the longest time the clock can
    /// represent instead of overflowing. At least `break_duration`.
    std::optional<std::chrono::nanoseconds> max_break_duration{};
    /// How many calls half-open admits, all of which must succeed to close it. At least 1.
    int probes = 1;
    /// Which outcomes count against the dependency (see `classifier`). A failure it declines is
    /// not recorded at all (neither opens nor closes the circuit, frees a probe slot) and is
    /// passed on unchanged. A returned value it handles is recorded as a failure with a null
    /// cause, and still returned to the caller. Empty: every failure but cancellation; values
    /// are successes, except an `expected_like` value holding an error. Called without any lock
    /// held.
    classifier should_handle{};
    /// Told of every change of state, one at a time and in the order they happened, without any
    /// lock held (so it may call back into the breaker), on the thread of a call that made or saw
    /// a change. Empty: nothing is told.
    std::function<void(const state_change_event&)> on_state_change{};
    /// Told of every call the breaker refuses (open, half-open with every probe slot taken, or
    /// isolated), before the refusal is returned, on the caller's thread and without any lock held:
    /// the reason (`circuit_open` or `circuit_isolated`) and the refusal's `retry_after()`. Not told
    /// of a call that never reached the breaker's decision (the caller had stopped it, or the
    /// classifier is for another type). Empty: nothing is told.
    std::function<void(const rejection_event&)> on_rejected{};
    /// Hears this breaker's `state_change` events (after `on_state_change`, in the same order) and its
    /// `rejection`s (after `on_rejected`). Empty: the listener of a `telemetry` stage around the call
    /// that made or saw the change, if any (see telemetry.hpp).
    telemetry_listener telemetry{};
};

/// A consistent snapshot of a breaker, taken under its lock at one instant.
struct circuit_metrics {
    std::string name{};                          ///< the breaker's `name` option
    circuit_state state = circuit_state::closed; ///< as `state()` reports it
    std::uint64_t calls = 0;                     ///< calls in the sample now (0 without `sampling`)
    std::uint64_t failures = 0;                  ///< recorded failures in the sample now
    std::uint64_t slow_calls = 0;                ///< slow calls in the sample now
    std::uint64_t consecutive_failures = 0;      ///< the current run of recorded failures
    std::uint64_t consecutive_opens = 0;         ///< openings since the circuit last closed
};

} // namespace resilience

namespace resilience::inline v0_2::detail {

/// Throws `std::invalid_argument` for the first thing wrong with `o`: the breaker's label, then the
/// field and the value.
RESILIENCE_DECL void validate_breaker_options(const circuit_breaker_options& o);

/// `o` with Polly's default trip condition when it has none, so `circuit_breaker_options{}` is a
/// usable breaker rather than an error.
RESILIENCE_DECL circuit_breaker_options with_default_trip(circuit_breaker_options o);

} // namespace resilience::detail

#if RESILIENCE_INCLUDE_DEFINITIONS
#include "options.ipp"
#endif
