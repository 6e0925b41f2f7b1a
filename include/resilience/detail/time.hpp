// SPDX-License-Identifier: MIT
/// \file detail/time.hpp
/// Time arithmetic that saturates instead of overflowing, for deadlines that may be "forever".
#pragma once

#include <chrono>
#include <cstdio>
#include <ratio>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace resilience::inline v0_2::detail {

/// "0.5", "-1", "nan", "inf": a double as a person would write it, for validation messages.
inline std::string format_number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

/// False for a floating-point duration that is NaN or infinite: options refuse those by name
/// before converting them (converting a NaN to an integer count is undefined behaviour).
template <class Rep, class Period>
constexpr bool is_finite_duration(std::chrono::duration<Rep, Period> d) noexcept {
    if constexpr (std::chrono::treat_as_floating_point_v<Rep>) {
        const auto c = static_cast<long double>(d.count());
        return c == c && c - c == 0; // NaN is unequal to itself; inf - inf is NaN
    } else {
        return true;
    }
}

/// "nan s", "-inf ms", "2.5 h", "-5000000 ns": a duration as written, for validation messages.
template <class Rep, class Period>
std::string describe_duration(std::chrono::duration<Rep, Period> d) {
    char count[48];
    if constexpr (std::chrono::treat_as_floating_point_v<Rep>)
        std::snprintf(count, sizeof count, "%Lg", static_cast<long double>(d.count()));
    else if constexpr (std::is_signed_v<Rep>)
        std::snprintf(count, sizeof count, "%lld", static_cast<long long>(d.count()));
    else
        std::snprintf(count, sizeof count, "%llu", static_cast<unsigned long long>(d.count()));
    std::string unit;
    if constexpr (std::is_same_v<Period, std::nano>)
        unit = "ns";
    else if constexpr (std::is_same_v<Period, std::micro>)
        unit = "us";
    else if constexpr (std::is_same_v<Period, std::milli>)
        unit = "ms";
    else if constexpr (std::is_same_v<Period, std::ratio<1>>)
        unit = "s";
    else if constexpr (std::is_same_v<Period, std::ratio<60>>)
        unit = "min";
    else if constexpr (std::is_same_v<Period, std::ratio<3600>>)
        unit = "h";
    else
        unit = "x " + std::to_string(Period::num) + "/" + std::to_string(Period::den) + " s";
    return std::string(count) + " " + unit;
}

/// `d` in nanoseconds, or the largest nanosecond count when it does not fit (about 292 years).
/// `d` must be finite (see `is_finite_duration`): a NaN gives zero rather than undefined behaviour,
/// but callers refuse it first, naming the option.
template <class Rep, class Period>
constexpr std::chrono::nanoseconds saturating_nanoseconds(std::chrono::duration<Rep, Period> d) noexcept {
    using wide = std::chrono::duration<long double, std::nano>;
    if constexpr (std::chrono::treat_as_floating_point_v<Rep>)
        if (d.count() != d.count())
            return std::chrono::nanoseconds::zero(); // NaN
    if (wide(d) >= wide(std::chrono::nanoseconds::max()))
        return std::chrono::nanoseconds::max();
    if (wide(d) <= wide(std::chrono::nanoseconds::min()))
        return std::chrono::nanoseconds::min();
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d);
}

/// `saturating_nanoseconds(d)`, after refusing a NaN or infinite `d` with `std::invalid_argument`
/// "<field> must be finite, got nan s" (`field` names the option, prefixed with its policy).
template <class Rep, class Period>
std::chrono::nanoseconds finite_nanoseconds(std::chrono::duration<Rep, Period> d, const std::string& field) {
    if (!is_finite_duration(d))
        throw std::invalid_argument(field + " must be finite, got " + describe_duration(d));
    return saturating_nanoseconds(d);
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
