// SPDX-License-Identifier: MIT
/// \file detail/config.hpp
/// Header-only or compiled: what `RESILIENCE_SEPARATE_COMPILATION` changes (docs/install.md, "Compiled
/// mode").
///
/// Header-only (the default), every definition is in the headers: the functions that do not depend on
/// the user's types are `inline` and their bodies come from `.ipp` files (`impl/` for the core, a policy's
/// folder for its own), included by their header.
///
/// With `RESILIENCE_SEPARATE_COMPILATION` defined (linking `resilience::compiled` defines it), those
/// bodies and the policies on `steady_clock` are compiled once, into the library, by
/// `src/resilience.cpp` (which includes `<resilience/src.hpp>`). A user's translation unit sees
/// declarations and `extern template` declarations only, and compiles the templates that depend on its
/// own types (the action, the result, another clock) as before.
#pragma once

#if defined(RESILIENCE_SEPARATE_COMPILATION)
/// How a function that is defined in an `.ipp` file is declared: `inline` header-only, nothing
/// in the compiled mode (one definition, in the library).
#define RESILIENCE_DECL
/// Whether a header includes its `.ipp` definitions: header-only, and in the library's own
/// source; not in a user's file in the compiled mode.
#if defined(RESILIENCE_COMPILING_LIBRARY)
#define RESILIENCE_INCLUDE_DEFINITIONS 1
/// The policies on `steady_clock`, listed once at the end of each policy's header: explicit
/// instantiation definitions in the library's source...
#define RESILIENCE_INSTANTIATE template
#else
#define RESILIENCE_INCLUDE_DEFINITIONS 0
/// ... and `extern template` declarations in a user's file.
#define RESILIENCE_INSTANTIATE extern template
#endif
/// The policies on `steady_clock` are instantiated in the library.
#define RESILIENCE_EXTERN_TEMPLATES 1
/// A policy's constructor, or another out-of-line member that no result type changes (a timeout's
/// watch beside the call, a retry's decision), made in the library for `steady_clock`: kept out of a
/// user's file. g++ compiles the body of a function of an `extern template` that it may clone for its
/// constant arguments (`noinline` is not enough), so there it is `noipa`.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__INTEL_COMPILER) && !defined(__NVCOMPILER)
#define RESILIENCE_DETAIL_CONSTRUCTOR [[gnu::noipa]]
#elif defined(_MSC_VER) && !defined(__clang__)
#define RESILIENCE_DETAIL_CONSTRUCTOR __declspec(noinline)
#else
#define RESILIENCE_DETAIL_CONSTRUCTOR [[gnu::noinline]]
#endif
#else
#define RESILIENCE_DECL inline
#define RESILIENCE_INCLUDE_DEFINITIONS 1
#define RESILIENCE_EXTERN_TEMPLATES 0
/// Header-only, a policy's constructor is compiled where it is used, as any other function.
#define RESILIENCE_DETAIL_CONSTRUCTOR
#endif
