// SPDX-License-Identifier: MIT
/// \file adaptive_limit.hpp
/// Forwards to bulkhead/adaptive_limit.hpp, where the bulkhead's adaptive limits (`aimd`,
/// `gradient`) live.
#pragma once

#include "bulkhead/adaptive_limit.hpp"
