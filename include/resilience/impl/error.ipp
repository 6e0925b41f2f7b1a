// SPDX-License-Identifier: MIT
// The definitions of <resilience/error.hpp> that do not depend on a user's type: included by the
// header (header-only), or compiled once into resilience::compiled (detail/config.hpp).
#pragma once

#include "../error.hpp"

namespace resilience::inline v0_2 {

RESILIENCE_DECL error::error(errc e, std::string policy_name)
    : std::system_error(policy_name.empty() ? std::system_error(make_error_code(e))
                                            : std::system_error(make_error_code(e), policy_name)),
      name_(std::move(policy_name)) {}

} // namespace resilience
