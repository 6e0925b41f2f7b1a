// SPDX-License-Identifier: MIT
// Counts heap allocations made on the calling thread while a `counting_allocations` scope is alive.
// The replacement operator new lives in test_task.cpp (one definition for the test binary).
#pragma once

#include "thread_counter.hpp"

// Sanitizers bring their own operator new; replacing it under them breaks their bookkeeping, so
// allocation counts are only taken in plain builds.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RESILIENCE_TESTS_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define RESILIENCE_TESTS_SANITIZED 1
#endif
#endif
#ifndef RESILIENCE_TESTS_SANITIZED
#define RESILIENCE_TESTS_COUNT_ALLOCATIONS 1
#endif

namespace resilience_tests {

struct allocation_tag {};
using allocation_counter = thread_counter<allocation_tag>;
/// While alive, counts this thread's calls of operator new.
using counting_allocations = counting_scope<allocation_tag>;

} // namespace resilience_tests
