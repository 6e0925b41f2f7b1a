// SPDX-License-Identifier: MIT
/// \file version.hpp
/// The library's version, for `#if` tests in users' code. The one place it is written: CMake's
/// `project(VERSION ...)` reads it from here, and the package config and the vcpkg port follow.
#pragma once

#define RESILIENCE_VERSION_MAJOR 0
#define RESILIENCE_VERSION_MINOR 1
#define RESILIENCE_VERSION_PATCH 0

/// One number that orders versions: 10000 * major + 100 * minor + patch (0.1.0 is 100).
#define RESILIENCE_VERSION                                                                                   \
    (RESILIENCE_VERSION_MAJOR * 10000 + RESILIENCE_VERSION_MINOR * 100 + RESILIENCE_VERSION_PATCH)
