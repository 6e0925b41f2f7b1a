// SPDX-License-Identifier: MIT
// The definitions of <resilience/outcome.hpp> that do not depend on a user's type: included by the
// header (header-only), or compiled once into resilience::compiled (detail/config.hpp).
#pragma once

#include "../outcome.hpp"

namespace resilience::inline v0_2::detail {

RESILIENCE_DECL failure cancelled_failure(std::string_view name) {
    return failure::make(cancelled_error{std::string{name}});
}

} // namespace resilience::detail
