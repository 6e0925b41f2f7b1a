// SPDX-License-Identifier: MIT
// The definitions of <resilience/detail/label.hpp> that do not depend on a user's type: included by the
// header (header-only), or compiled once into resilience::compiled (detail/config.hpp).
#pragma once

#include "../detail/label.hpp"

namespace resilience::inline v0_2::detail {

RESILIENCE_DECL std::string policy_label(const char* policy, const std::string& name) {
    std::string label = std::string("resilience::") + policy;
    if (!name.empty())
        label += " (" + name + ")";
    return label;
}

} // namespace resilience::detail
