// SPDX-License-Identifier: MIT
/// \file bulkhead/errors.hpp
/// The bulkhead's refusal, `bulkhead_rejected_error`. Its code (`errc::bulkhead_rejected`) and
/// `rejection_reason` stay in the core's error.hpp, which the classifier and the limiters share.
#pragma once

#include "../error.hpp"

#include <string>
#include <utility>

namespace resilience::inline v0_2 {

/// A bulkhead refused the call: every slot busy and no queue place, or the queue wait ran out;
/// `reason()` says which.
class bulkhead_rejected_error : public error {
public:
    explicit bulkhead_rejected_error(std::string policy_name = {},
                                     rejection_reason reason = rejection_reason::no_capacity)
        : error(errc::bulkhead_rejected, std::move(policy_name)), reason_(reason) {}
    rejection_reason reason() const noexcept { return reason_; }

private:
    rejection_reason reason_;
};

} // namespace resilience
