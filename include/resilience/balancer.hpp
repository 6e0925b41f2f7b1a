// SPDX-License-Identifier: MIT
/// \file balancer.hpp
/// Forwards to balancer/balancer.hpp, where the policy lives.
#pragma once

#include "balancer/balancer.hpp"
