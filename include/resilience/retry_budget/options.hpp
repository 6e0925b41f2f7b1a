// SPDX-License-Identifier: MIT
/// \file retry_budget/options.hpp
/// `retry_budget_options`: how many retries a `retry_budget` earns per call and how many it may save
/// up (checked by the budget's constructor and `reconfigure`, retry_budget/retry_budget.hpp).
#pragma once

namespace resilience::inline v0_2 {

struct retry_budget_options {
    /// Retries earned per call: each call deposits this many tokens (`0.2`: one retry per five
    /// calls). Must be in `(0, 1]` (and at least 1e-9, the budget's resolution).
    double ratio = 0.2;
    /// The most tokens that can be saved up, and so the longest run of retries allowed when
    /// nothing has been earned yet. The budget starts full. Must be positive and at most 1e9.
    double capacity = 10.0;
};

} // namespace resilience
