// SPDX-License-Identifier: MIT
/// \file hedge.hpp
/// Forwards to hedge/hedge.hpp, where the policy lives.
#pragma once

#include "hedge/hedge.hpp"
