// SPDX-License-Identifier: MIT
// The counting replacement of the global allocation functions (see alloc_counter.hpp). Include it in
// exactly one file of a test executable: test_task.cpp for resilience_tests, test_prometheus.cpp for
// its own. Nothing is replaced under a sanitizer, which brings its own.
#pragma once

#include "alloc_counter.hpp"

#include <cstddef>
#include <cstdlib>
#include <new>

#ifdef RESILIENCE_TESTS_COUNT_ALLOCATIONS
// g++ sees the replacement delete inlined beside the news of the including file and warns, wrongly:
// both ends are malloc and free.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t n) {
    if (resilience_tests::allocation_counter::enabled)
        ++resilience_tests::allocation_counter::count;
    if (void* p = std::malloc(n ? n : 1))
        return p;
    throw std::bad_alloc{};
}
void* operator new[](std::size_t n) {
    return ::operator new(n);
}
void operator delete(void* p) noexcept {
    std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
    std::free(p);
}
void operator delete[](void* p) noexcept {
    std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
    std::free(p);
}
#endif
