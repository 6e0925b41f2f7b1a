// SPDX-License-Identifier: MIT
// The definitions of <resilience/classifier.hpp> that do not depend on a user's type: included by the
// header (header-only), or compiled once into resilience::compiled (detail/config.hpp).
#pragma once

#include "../classifier.hpp"

namespace resilience::inline v0_2::detail {

RESILIENCE_DECL failure classifier_mismatch(const std::type_info& classified, const std::type_info& returned,
                                            const char* policy, const std::string& name) {
    return failure::make(
        std::invalid_argument(policy_label(policy, name) + ": should_handle classifies rs::outcome<" +
                              type_name(classified) + "> but the action returns " + type_name(returned)));
}

} // namespace resilience::detail
