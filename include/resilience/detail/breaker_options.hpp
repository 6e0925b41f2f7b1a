// SPDX-License-Identifier: MIT
/// \file detail/breaker_options.hpp
/// The checks of `circuit_breaker_options`, and the trip condition a breaker uses when they set none.
#pragma once

#include "../circuit_breaker.hpp" // the options; includes this file back at its end
#include "../classifier.hpp"      // policy_label, format_number
#include "config.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace resilience::detail {

/// Throws `std::invalid_argument` for the first thing wrong with `o`: the breaker's label, then the
/// field and the value.
RESILIENCE_DECL void validate_breaker_options(const circuit_breaker_options& o);

/// `o` with Polly's default trip condition when it has none, so `circuit_breaker_options{}` is a
/// usable breaker rather than an error.
RESILIENCE_DECL circuit_breaker_options with_default_trip(circuit_breaker_options o);

} // namespace resilience::detail

#if RESILIENCE_INCLUDE_DEFINITIONS
#include "../impl/breaker_options.ipp"
#endif
