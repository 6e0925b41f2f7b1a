// SPDX-License-Identifier: MIT
/// \file detail/inlining.hpp
/// Inlining hints for a call's fast path: `RESILIENCE_DETAIL_NOINLINE` keeps a rare path out of a
/// fast one, so that the fast one stays small enough to be inlined into a call's frame.
#pragma once

#ifndef RESILIENCE_DETAIL_NOINLINE
#if defined(_MSC_VER) && !defined(__clang__)
#define RESILIENCE_DETAIL_NOINLINE __declspec(noinline)
#else
#define RESILIENCE_DETAIL_NOINLINE [[gnu::noinline]]
#endif
#endif

