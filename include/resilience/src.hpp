// SPDX-License-Identifier: MIT
/// \file src.hpp
/// The compiled mode's one source: `src/resilience.cpp` includes it to build `resilience::compiled`.
/// It defines what the headers only declare when `RESILIENCE_SEPARATE_COMPILATION` is defined: the
/// functions of the `.ipp` files (`impl/` for the core, a policy's folder for its own) and the policies on
/// `steady_clock` (detail/config.hpp). A project that
/// builds the library its own way compiles one file of its own that includes this header, with
/// `RESILIENCE_SEPARATE_COMPILATION` and `RESILIENCE_COMPILING_LIBRARY` defined, and defines
/// `RESILIENCE_SEPARATE_COMPILATION` in every file that includes the library.
#pragma once

#if !defined(RESILIENCE_SEPARATE_COMPILATION) || !defined(RESILIENCE_COMPILING_LIBRARY)
#error                                                                                                       \
    "<resilience/src.hpp> builds the compiled mode: define RESILIENCE_SEPARATE_COMPILATION and RESILIENCE_COMPILING_LIBRARY"
#endif

#include "resilience.hpp"

// The policies on steady_clock are instantiated where their headers list them (RESILIENCE_INSTANTIATE).
