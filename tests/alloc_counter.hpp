// SPDX-License-Identifier: MIT
// Counts heap allocations made on the calling thread while a `counting_allocations` scope is alive.
// The replacement operator new lives in test_task.cpp (one definition for the test binary).
#pragma once

#include <cstddef>

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

struct allocation_counter {
    static inline thread_local bool enabled = false;
    static inline thread_local std::size_t count = 0;
};

/// While alive, counts this thread's calls of operator new.
class counting_allocations {
public:
    counting_allocations() noexcept {
        allocation_counter::count = 0;
        allocation_counter::enabled = true;
    }
    ~counting_allocations() { allocation_counter::enabled = false; }
    std::size_t count() const noexcept { return allocation_counter::count; }
};

} // namespace resilience_tests
