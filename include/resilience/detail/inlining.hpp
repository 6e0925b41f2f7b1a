// SPDX-License-Identifier: MIT
/// \file detail/inlining.hpp
/// Inlining hints for a call's fast path: `RESILIENCE_DETAIL_NOINLINE` keeps a rare path out of a
/// fast one, so that the fast one stays small enough to be inlined into a call's frame;
/// `RESILIENCE_DETAIL_ALWAYS_INLINE` marks a check so small and so often repeated along a call (a stop
/// poll per stage) that a call to it would cost more than its body.
#pragma once

#ifndef RESILIENCE_DETAIL_NOINLINE
#if defined(_MSC_VER) && !defined(__clang__)
#define RESILIENCE_DETAIL_NOINLINE __declspec(noinline)
#else
#define RESILIENCE_DETAIL_NOINLINE [[gnu::noinline]]
#endif
#endif

#ifndef RESILIENCE_DETAIL_ALWAYS_INLINE
#if defined(_MSC_VER) && !defined(__clang__)
#define RESILIENCE_DETAIL_ALWAYS_INLINE __forceinline
#else
#define RESILIENCE_DETAIL_ALWAYS_INLINE [[gnu::always_inline]] inline
#endif
#endif
