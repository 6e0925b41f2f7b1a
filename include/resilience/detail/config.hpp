// SPDX-License-Identifier: MIT
/// \file detail/config.hpp
/// Header-only or compiled: what `RESILIENCE_SEPARATE_COMPILATION` changes (docs/install.md, "Compiled
/// mode").
///
/// Header-only (the default), every definition is in the headers: the functions that do not depend on
/// the user's types are `inline` and their bodies come from `impl/*.ipp`, included by their header.
///
/// With `RESILIENCE_SEPARATE_COMPILATION` defined (linking `resilience::compiled` defines it), those
/// bodies and the policies on `steady_clock` are compiled once, into the library, by
/// `src/resilience.cpp` (which includes `<resilience/src.hpp>`). A user's translation unit sees
/// declarations and `extern template` declarations only, and compiles the templates that depend on its
/// own types (the action, the result, another clock) as before.
#pragma once

#if defined(RESILIENCE_SEPARATE_COMPILATION)
/// How a function that is defined in an `impl/*.ipp` file is declared: `inline` header-only, nothing
/// in the compiled mode (one definition, in the library).
#define RESILIENCE_DECL
#if defined(RESILIENCE_COMPILING_LIBRARY)
#define RESILIENCE_HEADER_ONLY 1 // the library's own source includes the definitions
#else
#define RESILIENCE_HEADER_ONLY 0
#endif
/// The policies on `steady_clock` are instantiated in the library: `extern template` declarations.
#define RESILIENCE_EXTERN_TEMPLATES 1
#else
#define RESILIENCE_DECL inline
#define RESILIENCE_HEADER_ONLY 1
#define RESILIENCE_EXTERN_TEMPLATES 0
#endif
