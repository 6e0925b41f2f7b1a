// SPDX-License-Identifier: MIT
// The definitions of <resilience/bulkhead/adaptive_limit.hpp> that do not depend on a user's type:
// included by the header (header-only), or compiled once into resilience::compiled (detail/config.hpp).
#pragma once

#include "adaptive_limit.hpp"

namespace resilience::inline v0_2::detail {

RESILIENCE_DECL void validate_adaptive_limit(const adaptive_limit& choice, std::size_t start,
                                             const std::string& label) {
    const auto bad = [&label](const std::string& what) { throw std::invalid_argument(label + ": " + what); };
    const auto check_bounds = [&](std::size_t min, std::size_t max) {
        if (min == 0)
            bad("adapt.min must be positive, got 0");
        if (max < min)
            bad("adapt.max must be at least adapt.min (" + std::to_string(min) + "), got " +
                std::to_string(max));
        if (start < min || start > max)
            bad("max_concurrent_calls, the starting limit, must be within [adapt.min, adapt.max] = [" +
                std::to_string(min) + ", " + std::to_string(max) + "], got " + std::to_string(start));
    };
    if (const aimd* a = std::get_if<aimd>(&choice)) {
        check_bounds(a->min, a->max);
        if (!(a->decrease > 0.0 && a->decrease < 1.0))
            bad("adapt.decrease must be in (0, 1), got " + format_number(a->decrease));
        if (a->slow_call_duration && *a->slow_call_duration <= std::chrono::nanoseconds::zero())
            bad("adapt.slow_call_duration must be positive, got " +
                std::to_string(a->slow_call_duration->count()) + "ns");
    } else if (const gradient* g = std::get_if<gradient>(&choice)) {
        check_bounds(g->min, g->max);
        if (g->short_samples == 0)
            bad("adapt.short_samples must be positive, got 0");
        if (g->long_samples == 0)
            bad("adapt.long_samples must be positive, got 0");
        if (!(g->tolerance >= 1.0 && std::isfinite(g->tolerance)))
            bad("adapt.tolerance must be finite and at least 1, got " + format_number(g->tolerance));
        if (!(g->smoothing > 0.0 && g->smoothing <= 1.0))
            bad("adapt.smoothing must be in (0, 1], got " + format_number(g->smoothing));
        if (!(g->headroom >= 0.0 && std::isfinite(g->headroom)))
            bad("adapt.headroom must be finite and not negative, got " + format_number(g->headroom));
    }
}

} // namespace resilience::detail
