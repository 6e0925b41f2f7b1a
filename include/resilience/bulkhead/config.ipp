// SPDX-License-Identifier: MIT
// The definitions of <resilience/bulkhead/config.hpp> that do not depend on a user's type: included by the
// header (header-only), or compiled once into resilience::compiled (detail/config.hpp).
#pragma once

#include "../detail/label.hpp"
#include "config.hpp"

#include <chrono>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>

namespace resilience::inline v0_2::detail {

RESILIENCE_DECL void validate_bulkhead_options(const bulkhead_options& o) {
    const std::string label = detail::policy_label("bulkhead", o.name);
    // Checked first, so that a value beyond the slot word is named as such even where a check
    // below would refuse the options too; the algorithm's bounds before the starting limit
    // they must hold.
    const auto within_word = [&label](const char* field, std::size_t v) {
        if (v > bulkhead_options::max_limit)
            throw std::invalid_argument(label + ": " + field + " must be at most " +
                                        std::to_string(bulkhead_options::max_limit) + ", got " +
                                        std::to_string(v));
    };
    std::visit(
        [&](const auto& a) {
            if constexpr (!std::is_same_v<std::decay_t<decltype(a)>, std::monostate>) {
                within_word("adapt.min", a.min);
                within_word("adapt.max", a.max);
            }
        },
        o.adapt);
    within_word("max_concurrent_calls", o.max_concurrent_calls);
    if (o.max_concurrent_calls == 0)
        throw std::invalid_argument(label + ": max_concurrent_calls must be positive, got 0");
    if (o.queue_timeout && *o.queue_timeout <= std::chrono::nanoseconds::zero())
        throw std::invalid_argument(label + ": queue_timeout must be positive, got " +
                                    std::to_string(o.queue_timeout->count()) + "ns");
    detail::validate_adaptive_limit(o.adapt, o.max_concurrent_calls, label);
    detail::priority_table::validate(o.priorities, label + ": ");
    detail::validate_queue_discipline(o.queue_discipline, label + ": ");
}

} // namespace resilience::detail
