// SPDX-License-Identifier: MIT
/// \file retry_budget.hpp
/// Forwards to retry_budget/retry_budget.hpp, where the policy lives.
#pragma once

#include "retry_budget/retry_budget.hpp"
