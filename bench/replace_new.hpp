// SPDX-License-Identifier: MIT
// The replacement of the global allocation functions that a benchmark counts allocations with, in
// one place for every benchmark executable. `RESILIENCE_BENCH_REPLACE_NEW(note)` expands, at
// namespace scope and once per executable, to the replaced `operator new` (which calls `note(n)`
// with the size asked for, then takes the block from malloc) and the matching `operator delete`s.
// `note` is a function or a lambda expression taking `std::size_t`; it must not allocate.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

// g++ sees the replacement delete inlined beside the news of the including file and warns, wrongly:
// both ends are malloc and free.
#define RESILIENCE_BENCH_REPLACE_NEW(note)                                                                   \
    _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmismatched-new-delete\"") void*       \
    operator new(std::size_t requested) {                                                                    \
        note(requested);                                                                                     \
        if (void* p = std::malloc(requested ? requested : 1))                                                \
            return p;                                                                                        \
        throw std::bad_alloc{};                                                                              \
    }                                                                                                        \
    void* operator new[](std::size_t n) {                                                                    \
        return ::operator new(n);                                                                            \
    }                                                                                                        \
    void operator delete(void* p) noexcept {                                                                 \
        std::free(p);                                                                                        \
    }                                                                                                        \
    void operator delete(void* p, std::size_t) noexcept {                                                    \
        std::free(p);                                                                                        \
    }                                                                                                        \
    void operator delete[](void* p) noexcept {                                                               \
        std::free(p);                                                                                        \
    }                                                                                                        \
    void operator delete[](void* p, std::size_t) noexcept {                                                  \
        std::free(p);                                                                                        \
    }                                                                                                        \
    _Pragma("GCC diagnostic pop")
