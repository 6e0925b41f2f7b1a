// SPDX-License-Identifier: MIT
// Counts exceptions caught on the calling thread while a `counting_catches` scope is alive. Every
// exception thrown (or rethrown from an exception_ptr) and caught in the test binary passes through
// the C++ runtime's __cxa_begin_catch, which test_expected.cpp wraps (one definition for the binary),
// as bench/harness.hpp does for the benchmarks. A failure that travels as an exception is caught
// somewhere, so a count of zero means none did.
#pragma once

#include <cstddef>

#if defined(__linux__) && (defined(__GNUC__) || defined(__clang__)) && __has_include(<dlfcn.h>)
#define RESILIENCE_TESTS_COUNT_CATCHES 1
#endif

namespace resilience_tests {

struct catch_counter {
    static inline thread_local bool enabled = false;
    static inline thread_local std::size_t count = 0;
};

/// While alive, counts the exceptions this thread catches.
class counting_catches {
public:
    counting_catches() noexcept {
        catch_counter::count = 0;
        catch_counter::enabled = true;
    }
    ~counting_catches() { catch_counter::enabled = false; }
    counting_catches(const counting_catches&) = delete;
    counting_catches& operator=(const counting_catches&) = delete;
    std::size_t count() const noexcept { return catch_counter::count; }
};

} // namespace resilience_tests
