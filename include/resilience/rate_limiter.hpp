// SPDX-License-Identifier: MIT
/// \file rate_limiter.hpp
/// Forwards to limiter/rate_limiter.hpp, where the policy lives.
#pragma once

#include "limiter/rate_limiter.hpp"
