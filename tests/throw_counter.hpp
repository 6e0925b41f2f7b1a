// SPDX-License-Identifier: MIT
// Counts exceptions caught on the calling thread while a `counting_catches` scope is alive. Every
// exception thrown (or rethrown from an exception_ptr) and caught in the test binary passes through
// the C++ runtime's __cxa_begin_catch, which test_expected.cpp wraps (one definition for the binary),
// as bench/harness.hpp does for the benchmarks. A failure that travels as an exception is caught
// somewhere, so a count of zero means none did.
#pragma once

#include "thread_counter.hpp"

#include <version>

// libc++ before 18 makes an exception_ptr (std::make_exception_ptr) by throwing the exception and
// catching it: there, a failure the library makes without throwing still passes through a catch, so
// the counts would say nothing about the library.
#if defined(_LIBCPP_VERSION) && _LIBCPP_VERSION < 180000
#define RESILIENCE_TESTS_CATCHES_IN_MAKE_EXCEPTION_PTR 1
#endif

#if defined(__linux__) && (defined(__GNUC__) || defined(__clang__)) && __has_include(<dlfcn.h>) &&                \
    !defined(RESILIENCE_TESTS_CATCHES_IN_MAKE_EXCEPTION_PTR)
#define RESILIENCE_TESTS_COUNT_CATCHES 1
#endif

namespace resilience_tests {

struct catch_tag {};
using catch_counter = thread_counter<catch_tag>;
/// While alive, counts the exceptions this thread catches.
using counting_catches = counting_scope<catch_tag>;

} // namespace resilience_tests
