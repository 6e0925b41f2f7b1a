// SPDX-License-Identifier: MIT
/// \file bulkhead.hpp
/// Forwards to bulkhead/bulkhead.hpp, where the policy lives.
#pragma once

#include "bulkhead/bulkhead.hpp"
