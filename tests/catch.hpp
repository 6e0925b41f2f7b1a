// SPDX-License-Identifier: MIT
// Catch2 for the tests, whichever major version the build found: test files include "catch.hpp".
#pragma once

#if defined(RESILIENCE_CATCH2_V3)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
