// SPDX-License-Identifier: MIT
/// \file detail/label.hpp
/// `detail::policy_label`: how a policy signs its validation messages and the errors it makes.
#pragma once

#include "config.hpp"
#include <string>

namespace resilience::inline v0_2::detail {

/// "resilience::retry" or "resilience::retry (payments)": the policy's label, with its `name`
/// option when it has one. Every validation message starts with it, then names the field and the
/// value: "resilience::retry (payments): max_attempts must be at least 1, got 0".
RESILIENCE_DECL std::string policy_label(const char* policy, const std::string& name);

} // namespace resilience::detail

#if RESILIENCE_INCLUDE_DEFINITIONS
#include "../impl/label.ipp"
#endif
