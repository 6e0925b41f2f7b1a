// SPDX-License-Identifier: MIT
// The one Catch2 main of resilience_tests; the test cases live in tests/test_*.cpp.

#if defined(RESILIENCE_CATCH2_V3)
#include <catch2/catch_session.hpp>

int main(int argc, char* argv[]) {
    return Catch::Session().run(argc, argv);
}
#else
#define CATCH_CONFIG_MAIN
#include "catch.hpp"
#endif
