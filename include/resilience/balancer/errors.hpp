// SPDX-License-Identifier: MIT
/// \file balancer/errors.hpp
/// The balancer's refusal, `no_endpoint_error`.
#pragma once

#include "../error.hpp"

#include <string>
#include <utility>

namespace resilience::inline v0_2 {

/// A balancer had no endpoint to pick: its set is empty.
class no_endpoint_error : public error {
public:
    explicit no_endpoint_error(std::string policy_name = {})
        : error(errc::no_endpoint, std::move(policy_name)) {}
};

} // namespace resilience
