// SPDX-License-Identifier: MIT
// <resilience/version.hpp> and the ABI namespace it names: the version macros a user's `#if` reads agree
// with each other, and the library's names live in resilience::v<major>_<minor>, so that two versions in
// one program have different symbols (fail to link rather than mix).
#include "catch.hpp"

#include <resilience/error.hpp>
#include <resilience/retry.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/version.hpp>

#include <string>
#include <type_traits>
#include <typeinfo>

namespace test_version {

namespace rs = resilience;

TEST_CASE("version: the single number orders versions as major, minor, patch", "[version]") {
    STATIC_REQUIRE(RESILIENCE_VERSION == RESILIENCE_VERSION_MAJOR * 10000 + RESILIENCE_VERSION_MINOR * 100 +
                                             RESILIENCE_VERSION_PATCH);
    STATIC_REQUIRE(RESILIENCE_VERSION >= 200);
}

TEST_CASE("version: the library's names are in the ABI namespace of this version", "[version]") {
    const std::string abi =
        "v" + std::to_string(RESILIENCE_VERSION_MAJOR) + "_" + std::to_string(RESILIENCE_VERSION_MINOR);
    // The mangled names (Itanium ABI: g++ and clang) spell every enclosing namespace.
    CHECK(std::string(typeid(rs::errc).name()).find(abi) != std::string::npos);
    CHECK(std::string(typeid(rs::stop_token).name()).find(abi) != std::string::npos);
    CHECK(std::string(typeid(rs::retry_options).name()).find(abi) != std::string::npos);
    // Users never write it: the inline namespace is found through `resilience`.
    STATIC_REQUIRE(std::is_same_v<rs::errc, rs::v0_2::errc>);
}

} // namespace test_version
