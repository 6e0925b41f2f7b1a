// SPDX-License-Identifier: MIT
/// \file adaptive_throttle/options.hpp
/// The options of an `adaptive_throttle` (adaptive_throttle.hpp), their checks, and when two sets of
/// them are the same (a reconfiguration between them changes nothing).
#pragma once

#include "../classifier.hpp"
#include "../detail/label.hpp"
#include "../detail/time.hpp"
#include "../error.hpp"
#include "../telemetry_event.hpp"

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace resilience::inline v0_2 {

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

/// Whether `a` and `b` are the same options: a reconfiguration from one to the other changes
/// nothing. The classifier and the listener compare by identity (copies of one are the same);
/// options with an `on_rejected` are never the same as any (it cannot be compared).
inline bool same_throttle_options(const adaptive_throttle_options& a,
                                  const adaptive_throttle_options& b) noexcept {
    return !a.on_rejected && !b.on_rejected && a.name == b.name && a.k == b.k && a.window == b.window &&
           a.segments == b.segments && a.should_handle.same_as(b.should_handle) &&
           a.telemetry.same_as(b.telemetry);
}

} // namespace detail

} // namespace resilience
