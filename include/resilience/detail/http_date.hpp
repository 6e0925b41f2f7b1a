// SPDX-License-Identifier: MIT
/// \file detail/http_date.hpp
/// The HTTP-date forms a Retry-After may carry (IMF-fixdate, RFC 850, asctime), read into seconds
/// since 1970 on the proleptic Gregorian calendar: the parser behind `http::parse_retry_after`.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

namespace resilience::inline v0_2::http {

namespace detail {

// ---- civil calendar (proleptic Gregorian), in whole days from 1970-01-01 ----

constexpr bool is_leap_year(std::int64_t y) noexcept {
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

constexpr int days_in_month(std::int64_t y, int m) noexcept {
    constexpr int length[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return m == 2 && is_leap_year(y) ? 29 : length[m - 1];
}

// Days from January 1st of year 1 to January 1st of year y, for y >= 1: 365 a year, plus one for
// each leap year before it.
constexpr std::int64_t days_before_year(std::int64_t y) noexcept {
    const std::int64_t full = y - 1;
    return 365 * full + full / 4 - full / 100 + full / 400;
}

// Four hundred Gregorian years hold exactly this many days, so shifting a year by 400 shifts its
// day count by this much, and years 0 to 399 can be counted as years 400 to 799.
inline constexpr std::int64_t days_per_400_years = 146'097;

/// Days from 1970-01-01 to y-m-d (negative before it). Precondition: a valid date, y >= -399.
constexpr std::int64_t days_from_civil(std::int64_t y, int m, int d) noexcept {
    constexpr int before_month[12] = {0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334};
    const std::int64_t jan1 = days_before_year(y + 400) - days_per_400_years;
    const std::int64_t in_year = before_month[m - 1] + (m > 2 && is_leap_year(y) ? 1 : 0) + (d - 1);
    return jan1 + in_year - (days_before_year(1970 + 400) - days_per_400_years);
}

/// The year of the day `days` after 1970-01-01, held within [0, 9999] (the years an HTTP-date can
/// name; only the RFC 850 pivot asks, and a clock outside them has no useful century anyway).
constexpr std::int64_t year_of_day(std::int64_t days) noexcept {
    if (days < days_from_civil(0, 1, 1))
        return 0;
    if (days >= days_from_civil(9999, 12, 31))
        return 9999;
    std::int64_t y = 1970 + days / 365; // within a year or two of the answer over this range
    if (y > 9999)
        y = 9999;
    if (y < 0)
        y = 0;
    while (days_from_civil(y, 1, 1) > days)
        --y;
    while (y < 9999 && days_from_civil(y + 1, 1, 1) <= days)
        ++y;
    return y;
}

constexpr std::int64_t floor_div(std::int64_t a, std::int64_t b) noexcept {
    const std::int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

// ---- reading a field value ----

constexpr bool is_digit(char c) noexcept {
    return c >= '0' && c <= '9';
}

/// Without the optional whitespace (SP, HTAB) a field value may carry at either end.
constexpr std::string_view trim_ows(std::string_view s) noexcept {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
        s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
        s.remove_suffix(1);
    return s;
}

/// Reads a string left to right; every step either consumes what it expects or answers "no".
class cursor {
public:
    constexpr explicit cursor(std::string_view s) noexcept : s_(s) {}

    [[nodiscard]] constexpr bool at_end() const noexcept { return i_ == s_.size(); }

    constexpr bool literal(std::string_view t) noexcept {
        if (s_.size() - i_ < t.size() || s_.substr(i_, t.size()) != t)
            return false;
        i_ += t.size();
        return true;
    }

    /// Exactly `n` digits as a number, or -1.
    constexpr int digits(int n) noexcept {
        if (s_.size() - i_ < static_cast<std::size_t>(n))
            return -1;
        int v = 0;
        for (int k = 0; k < n; ++k) {
            const char c = s_[i_ + static_cast<std::size_t>(k)];
            if (!is_digit(c))
                return -1;
            v = v * 10 + (c - '0');
        }
        i_ += static_cast<std::size_t>(n);
        return v;
    }

    /// The index of the name in `names` that comes next (case-sensitive), or -1. No name in a
    /// table is a prefix of another.
    template <std::size_t N>
    constexpr int one_of(const std::string_view (&names)[N]) noexcept {
        for (std::size_t k = 0; k < N; ++k)
            if (literal(names[k]))
                return static_cast<int>(k);
        return -1;
    }

private:
    std::string_view s_;
    std::size_t i_ = 0;
};

inline constexpr std::string_view month_names[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
inline constexpr std::string_view day_names[7] = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
inline constexpr std::string_view long_day_names[7] = {"Monday", "Tuesday",  "Wednesday", "Thursday",
                                                       "Friday", "Saturday", "Sunday"};

/// hour ":" minute ":" second, as seconds into the day; 23:59:60 (a leap second) is accepted and
/// reckoned as the next second. -1 when malformed or out of range.
constexpr std::int64_t time_of_day(cursor& c) noexcept {
    const int h = c.digits(2);
    if (h < 0 || h > 23 || !c.literal(":"))
        return -1;
    const int m = c.digits(2);
    if (m < 0 || m > 59 || !c.literal(":"))
        return -1;
    const int s = c.digits(2);
    if (s < 0 || s > 60)
        return -1;
    return std::int64_t{h} * 3600 + m * 60 + s;
}

/// Seconds since 1970-01-01 00:00:00 UTC, or nullopt when the day does not exist in that month
/// (February 29th of a common year, April 31st) or a field is out of range.
constexpr std::optional<std::int64_t> to_unix(std::int64_t y, int month_index, int d,
                                              std::int64_t seconds_of_day) noexcept {
    if (month_index < 0 || d < 1 || d > days_in_month(y, month_index + 1) || seconds_of_day < 0)
        return std::nullopt;
    return days_from_civil(y, month_index + 1, d) * 86'400 + seconds_of_day;
}

// IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT".
constexpr std::optional<std::int64_t> imf_fixdate(std::string_view s) noexcept {
    cursor c{s};
    if (c.one_of(day_names) < 0 || !c.literal(", "))
        return std::nullopt;
    const int d = c.digits(2);
    if (d < 0 || !c.literal(" "))
        return std::nullopt;
    const int m = c.one_of(month_names);
    if (m < 0 || !c.literal(" "))
        return std::nullopt;
    const int y = c.digits(4);
    if (y < 0 || !c.literal(" "))
        return std::nullopt;
    const std::int64_t t = time_of_day(c);
    if (t < 0 || !c.literal(" GMT") || !c.at_end())
        return std::nullopt;
    return to_unix(y, m, d, t);
}

/// The year a two-digit RFC 850 year names, seen in `current_year`: the latest year ending in those
/// digits that is at most 50 years after the current one. This is RFC 9110's rule (a year more
/// than 50 years ahead is the most recent past year with the same last two digits), compared year
/// by year.
constexpr std::int64_t rfc850_year(int two_digits, std::int64_t current_year) noexcept {
    std::int64_t y = current_year - current_year % 100 + two_digits;
    if (y > current_year + 50)
        y -= 100;
    else if (y <= current_year - 50)
        y += 100;
    return y;
}

// The obsolete RFC 850 form: "Sunday, 06-Nov-94 08:49:37 GMT".
constexpr std::optional<std::int64_t> rfc850_date(std::string_view s, std::int64_t current_year) noexcept {
    cursor c{s};
    if (c.one_of(long_day_names) < 0 || !c.literal(", "))
        return std::nullopt;
    const int d = c.digits(2);
    if (d < 0 || !c.literal("-"))
        return std::nullopt;
    const int m = c.one_of(month_names);
    if (m < 0 || !c.literal("-"))
        return std::nullopt;
    const int yy = c.digits(2);
    if (yy < 0 || !c.literal(" "))
        return std::nullopt;
    const std::int64_t t = time_of_day(c);
    if (t < 0 || !c.literal(" GMT") || !c.at_end())
        return std::nullopt;
    const std::int64_t y = rfc850_year(yy, current_year);
    if (y < 0)
        return std::nullopt;
    return to_unix(y, m, d, t);
}

// C's asctime() form: "Sun Nov  6 08:49:37 1994" (the day padded with a space or a zero).
constexpr std::optional<std::int64_t> asctime_date(std::string_view s) noexcept {
    cursor c{s};
    if (c.one_of(day_names) < 0 || !c.literal(" "))
        return std::nullopt;
    const int m = c.one_of(month_names);
    if (m < 0 || !c.literal(" "))
        return std::nullopt;
    const int d = c.literal(" ") ? c.digits(1) : c.digits(2);
    if (d < 0 || !c.literal(" "))
        return std::nullopt;
    const std::int64_t t = time_of_day(c);
    if (t < 0 || !c.literal(" "))
        return std::nullopt;
    const int y = c.digits(4);
    if (y < 0 || !c.at_end())
        return std::nullopt;
    return to_unix(y, m, d, t);
}

constexpr std::int64_t unix_seconds(std::chrono::system_clock::time_point t) noexcept {
    return std::chrono::floor<std::chrono::seconds>(t).time_since_epoch().count();
}

} // namespace detail

} // namespace resilience::http
