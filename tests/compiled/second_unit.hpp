// SPDX-License-Identifier: MIT
// The second translation unit of the compiled-mode test (second_unit.cpp).
#pragma once

#include <resilience/bulkhead.hpp>
#include <resilience/circuit_breaker.hpp>

#include <cstddef>

namespace second_unit {

/// Runs `calls` failing calls through `breaker`; returns how many failed.
int fail_through(resilience::circuit_breaker<>& breaker, int calls);

/// A bulkhead of `max` slots (throws std::invalid_argument for 0).
resilience::bulkhead<> make_bulkhead(std::size_t max);

} // namespace second_unit
