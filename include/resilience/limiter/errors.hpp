// SPDX-License-Identifier: MIT
/// \file limiter/errors.hpp
/// `rate_limited_error`: the refusal of `rate_limiter`, `sliding_window_limiter` and `redis::rate_limiter`.
#pragma once

#include "../error.hpp"

#include <chrono>
#include <string>
#include <utility>

namespace resilience::inline v0_2 {

/// A rate limiter refused the call; `retry_after()` is when a token will be there for it, and
/// `reason()` why it was refused.
class rate_limited_error : public retry_after_error {
public:
    rate_limited_error(std::string policy_name, std::chrono::nanoseconds retry_after,
                       rejection_reason reason = rejection_reason::no_capacity)
        : retry_after_error(errc::rate_limited, std::move(policy_name), retry_after), reason_(reason) {}
    rejection_reason reason() const noexcept { return reason_; }

private:
    rejection_reason reason_;
};

} // namespace resilience
