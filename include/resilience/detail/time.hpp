// SPDX-License-Identifier: MIT
/// \file detail/time.hpp
/// Time arithmetic that saturates instead of overflowing, for deadlines that may be "forever".
#pragma once

#include <chrono>
#include <type_traits>

namespace resilience::detail {

/// `d` in nanoseconds, or the largest nanosecond count when it does not fit (about 292 years).
template <class Rep, class Period>
constexpr std::chrono::nanoseconds saturating_nanoseconds(std::chrono::duration<Rep, Period> d) noexcept {
    using wide = std::chrono::duration<long double, std::nano>;
    if (wide(d) >= wide(std::chrono::nanoseconds::max()))
        return std::chrono::nanoseconds::max();
    if (wide(d) <= wide(std::chrono::nanoseconds::min()))
        return std::chrono::nanoseconds::min();
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d);
}

/// `now + d` rounded up to the clock's tick, or the latest representable time point when that would
/// overflow. `d` must not be negative.
template <class TimePoint>
TimePoint add_saturating(TimePoint now, std::chrono::nanoseconds d) noexcept {
    using D = typename TimePoint::duration;
    if constexpr (std::is_same_v<D, std::chrono::nanoseconds>) {
        // The common case (every clock of the library ticks in nanoseconds): integers only.
        // `d` is not negative, so `max - d` cannot overflow.
        if (now.time_since_epoch().count() > D::max().count() - d.count())
            return TimePoint::max();
        return now + d;
    }
    using wide = std::chrono::duration<long double, std::nano>;
    const long double room = wide(D(TimePoint::max().time_since_epoch().count())).count() -
                             wide(D(now.time_since_epoch().count())).count();
    if (static_cast<long double>(d.count()) >= room)
        return TimePoint::max();
    return now + std::chrono::ceil<D>(d);
}

} // namespace resilience::detail
