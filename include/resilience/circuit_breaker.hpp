// SPDX-License-Identifier: MIT
/// \file circuit_breaker.hpp
/// Forwards to circuit_breaker/circuit_breaker.hpp, where the policy lives.
#pragma once

#include "circuit_breaker/circuit_breaker.hpp"
