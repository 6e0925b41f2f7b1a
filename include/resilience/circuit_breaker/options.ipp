// SPDX-License-Identifier: MIT
// The definitions of <resilience/circuit_breaker/options.hpp> that do not depend on a user's type:
// included by the header (header-only), or compiled once into resilience::compiled (detail/config.hpp).
#pragma once

#include "options.hpp"

namespace resilience::inline v0_2::detail {

RESILIENCE_DECL void validate_breaker_options(const circuit_breaker_options& o) {
    const auto bad = [&o](const std::string& what) {
        throw std::invalid_argument(policy_label("circuit_breaker", o.name) + ": " + what);
    };
    const auto check_ratio = [&bad](const std::optional<double>& ratio, const char* name) {
        if (ratio && !(*ratio > 0.0 && *ratio <= 1.0))
            bad(std::string(name) + " must be in (0, 1], got " + format_number(*ratio));
    };
    const auto check_duration = [&bad](const std::optional<std::chrono::nanoseconds>& d, const char* name) {
        if (d && *d <= std::chrono::nanoseconds::zero())
            bad(std::string(name) + " must be positive, got " + std::to_string(d->count()) + "ns");
    };
    if (o.failure_threshold && *o.failure_threshold < 1)
        bad("failure_threshold must be positive, got " + std::to_string(*o.failure_threshold));
    check_duration(o.break_duration, "break_duration");
    if (!(o.break_duration_growth >= 1.0 && std::isfinite(o.break_duration_growth)))
        bad("break_duration_growth must be finite and at least 1, got " +
            format_number(o.break_duration_growth));
    check_duration(o.max_break_duration, "max_break_duration");
    if (o.max_break_duration && *o.max_break_duration < o.break_duration)
        bad("max_break_duration must be at least break_duration (" +
            std::to_string(o.break_duration.count()) + "ns), got " +
            std::to_string(o.max_break_duration->count()) + "ns");
    if (o.probes < 1)
        bad("probes must be at least 1, got " + std::to_string(o.probes));
    if (!o.sampling)
        return;
    const breaker_sampling& s = *o.sampling;
    if (s.calls.has_value() == s.window.has_value())
        bad(std::string("sampling needs exactly one of sampling.calls and sampling.window, got ") +
            (s.calls ? "both" : "neither"));
    if (s.calls && *s.calls < 1)
        bad("sampling.calls must be positive, got " + std::to_string(*s.calls));
    if (s.calls && *s.calls > breaker_sampling::max_calls)
        bad("sampling.calls must be at most " + std::to_string(breaker_sampling::max_calls) + ", got " +
            std::to_string(*s.calls));
    check_duration(s.window, "sampling.window");
    if (s.window) {
        if (s.segments == 0)
            bad("sampling.segments must be positive, got " + std::to_string(s.segments));
        if (s.segments > breaker_sampling::max_segments)
            bad("sampling.segments must be at most " + std::to_string(breaker_sampling::max_segments) +
                ", got " + std::to_string(s.segments));
        if (static_cast<std::uint64_t>(s.window->count()) < s.segments)
            bad("sampling.segments must not exceed sampling.window in nanoseconds (" +
                std::to_string(s.window->count()) + "), got " + std::to_string(s.segments));
    }
    if (s.minimum_throughput && *s.minimum_throughput < 1)
        bad("sampling.minimum_throughput must be positive, got " + std::to_string(*s.minimum_throughput));
    if (s.minimum_throughput && s.calls && *s.minimum_throughput > *s.calls)
        bad("sampling.minimum_throughput must not exceed sampling.calls (" + std::to_string(*s.calls) +
            "), got " + std::to_string(*s.minimum_throughput));
    check_ratio(s.failure_ratio, "sampling.failure_ratio");
    check_ratio(s.slow_call_ratio, "sampling.slow_call_ratio");
    check_duration(s.slow_call_duration, "sampling.slow_call_duration");
    if (s.slow_call_ratio && !s.slow_call_duration)
        bad("sampling.slow_call_ratio needs sampling.slow_call_duration, got none");
    if (!s.failure_ratio && !s.slow_call_ratio)
        bad("sampling needs sampling.failure_ratio or sampling.slow_call_ratio, got neither");
}

RESILIENCE_DECL circuit_breaker_options with_default_trip(circuit_breaker_options o) {
    if (!o.failure_threshold && !o.sampling)
        o.sampling = breaker_sampling{
            .window = std::chrono::seconds{30}, .minimum_throughput = 100, .failure_ratio = 0.1};
    return o;
}

} // namespace resilience::detail
