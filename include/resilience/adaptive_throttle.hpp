// SPDX-License-Identifier: MIT
/// \file adaptive_throttle.hpp
/// forwards to adaptive_throttle/adaptive_throttle.hpp, where the policy lives
#pragma once

#include "adaptive_throttle/adaptive_throttle.hpp"
