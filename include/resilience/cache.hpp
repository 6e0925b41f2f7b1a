// SPDX-License-Identifier: MIT
/// \file cache.hpp
/// forwards to cache/cache.hpp, where the policy lives
#pragma once

#include "cache/cache.hpp"
