// SPDX-License-Identifier: MIT
/// \file adaptive_throttle/errors.hpp
/// What an `adaptive_throttle` (adaptive_throttle.hpp) refuses a call with: `throttled_error`.
#pragma once

#include "../error.hpp"

#include <string>
#include <utility>

namespace resilience::inline v0_2 {

/// An adaptive throttle refused the call locally, without sending it: the dependency has been
/// refusing so much of what it was sent that this call would likely have been refused too.
/// `probability()` is the rejection probability the call was refused with (in (0, 1)). No
/// `retry_after`: the refusal is a draw, not a wait, and `is_transient` says no (a retry at once
/// would only draw again against the same odds, and add to the requests that raise them).
class throttled_error : public error {
public:
    explicit throttled_error(std::string policy_name = {}, double probability = 0.0)
        : error(errc::throttled, std::move(policy_name)), probability_(probability) {}
    double probability() const noexcept { return probability_; }
    /// Always `rejection_reason::throttled`.
    rejection_reason reason() const noexcept { return rejection_reason::throttled; }

private:
    double probability_;
};

} // namespace resilience
