// SPDX-License-Identifier: MIT
/// \file single_flight/options.hpp
/// `single_flight_options`: the options of a `single_flight` (single_flight/single_flight.hpp).
#pragma once

#include <string>

namespace resilience::inline v0_2 {

/// Options of a `single_flight`. Nothing to tune: a shared call lasts as long as its action.
struct single_flight_options {
    /// Carried by the errors it makes (`policy_name()`) and by `name()`.
    std::string name{};
};

} // namespace resilience
