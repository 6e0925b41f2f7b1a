// SPDX-License-Identifier: MIT
/// \file single_flight.hpp
/// Forwards to single_flight/single_flight.hpp, where the policy lives.
#pragma once

#include "single_flight/single_flight.hpp"
