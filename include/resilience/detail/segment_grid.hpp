// SPDX-License-Identifier: MIT
/// \file detail/segment_grid.hpp
/// The grid of equal segments of time that windows kept in a ring of segments share (a circuit
/// breaker's time window, the adaptive throttle's): which segment holds an instant, and where a
/// segment lives in the ring. In the core so that neither policy reaches into the other's files.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace resilience::inline v0_2::detail {

/// The segment of width `width` that holds the instant `t` (nanoseconds since the clock's epoch):
/// `floor(t / width)`, for clocks whose epoch lies in the future too.
inline std::int64_t segment_of(std::chrono::nanoseconds t, std::chrono::nanoseconds width) noexcept {
    std::int64_t q = t.count() / width.count();
    if (t.count() % width.count() < 0)
        --q;
    return q;
}
/// Where segment `k` lives in a ring of `n` places.
inline std::size_t ring_slot(std::int64_t k, std::size_t n) noexcept {
    const auto m = static_cast<std::int64_t>(n);
    return static_cast<std::size_t>(((k % m) + m) % m);
}

} // namespace resilience::detail
