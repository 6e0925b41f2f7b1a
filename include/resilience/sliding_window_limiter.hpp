// SPDX-License-Identifier: MIT
/// \file sliding_window_limiter.hpp
/// Forwards to limiter/sliding_window_limiter.hpp, where the policy lives.
#pragma once

#include "limiter/sliding_window_limiter.hpp"
