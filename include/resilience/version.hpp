// SPDX-License-Identifier: MIT
/// \file version.hpp
/// The library's version, for `#if` tests in users' code. The one place it is written: CMake's
/// `project(VERSION ...)` reads it from here, and the package config and the vcpkg port follow.
#pragma once

#define RESILIENCE_VERSION_MAJOR 0
#define RESILIENCE_VERSION_MINOR 2
#define RESILIENCE_VERSION_PATCH 0

/// Every name of the library is declared in the inline namespace `resilience::v<major>_<minor>`
/// (`resilience::v0_2` here), which users never write: `resilience::retry` names
/// `resilience::v0_2::retry`. Two versions with different ABIs compiled into one program then have
/// different symbols, so mixing them fails to link instead of misbehaving at run time.
/// scripts/check_layers.py checks that every header opens this namespace.

/// One number that orders versions: 10000 * major + 100 * minor + patch (0.2.0 is 200).
#define RESILIENCE_VERSION                                                                                   \
    (RESILIENCE_VERSION_MAJOR * 10000 + RESILIENCE_VERSION_MINOR * 100 + RESILIENCE_VERSION_PATCH)
