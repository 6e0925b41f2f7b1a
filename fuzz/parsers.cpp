// SPDX-License-Identifier: MIT
// Fuzz targets for the text parsers: Retry-After values and HTTP-dates. Bytes become the value;
// the parser must stay within its documented results, and what it reads must mean what it says.

#include "targets.hpp"

#include <resilience/http.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace rs = resilience;

namespace resilience_fuzz {
namespace {

[[noreturn]] void finding(const char* what, std::string_view value) {
    std::fprintf(stderr, "resilience fuzz finding: %s (value \"%.*s\")\n", what,
                 static_cast<int>(value.size()), value.data());
    std::abort();
}

// `t` as an IMF-fixdate, the form every sender must use.
std::string imf_fixdate(std::chrono::sys_seconds t) {
    static constexpr const char* days[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static constexpr const char* months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                             "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    const auto day = std::chrono::floor<std::chrono::days>(t);
    const std::chrono::year_month_day ymd{day};
    const std::chrono::hh_mm_ss hms{t - day};
    char text[64];
    std::snprintf(text, sizeof text, "%s, %02u %s %04d %02lld:%02lld:%02lld GMT",
                  days[std::chrono::weekday{day}.c_encoding()], static_cast<unsigned>(ymd.day()),
                  months[static_cast<unsigned>(ymd.month()) - 1], static_cast<int>(ymd.year()),
                  static_cast<long long>(hms.hours().count()), static_cast<long long>(hms.minutes().count()),
                  static_cast<long long>(hms.seconds().count()));
    return text;
}

bool is_ows(char c) {
    return c == ' ' || c == '\t';
}

} // namespace

int retry_after(const std::uint8_t* data, std::size_t size) {
    if (size < 1)
        return 0;
    // The first byte moves `now` by whole days around a fixed instant, so dates near and far are read.
    const auto now =
        std::chrono::sys_seconds{std::chrono::seconds{1'700'000'000}} + std::chrono::days{data[0]} * 200;
    const std::string_view value{reinterpret_cast<const char*>(data + 1), size - 1};

    const std::optional<std::chrono::seconds> wait = rs::http::parse_retry_after(value, now);
    if (wait && (wait->count() < 0 || *wait > rs::http::max_retry_after))
        finding("parse_retry_after returned a wait outside [0, max_retry_after]", value);

    // delay-seconds: the digits' own value, or no hint when it is too large.
    std::string_view trimmed = value;
    while (!trimmed.empty() && is_ows(trimmed.front()))
        trimmed.remove_prefix(1);
    while (!trimmed.empty() && is_ows(trimmed.back()))
        trimmed.remove_suffix(1);
    const bool digits = !trimmed.empty() && trimmed.find_first_not_of("0123456789") == std::string_view::npos;
    if (digits) {
        std::string_view significant =
            trimmed.substr(std::min(trimmed.find_first_not_of('0'), trimmed.size()));
        const bool fits = significant.size() <= 18; // below 10^18: no overflow in the check
        const long long n = fits ? std::strtoll(std::string(significant).c_str(), nullptr, 10) : 0;
        const bool in_range = fits && n <= rs::http::max_retry_after.count();
        if (in_range != wait.has_value() || (wait && wait->count() != n))
            finding("parse_retry_after misread delay-seconds", value);
    }

    // An HTTP-date: written back as an IMF-fixdate it reads as the same instant, and the wait is the
    // time until it, rounded up, or zero when past.
    if (const auto date = rs::http::parse_http_date(value, now)) {
        const std::string again = imf_fixdate(*date);
        const auto reread = rs::http::parse_http_date(again, now);
        if (!reread || *reread != *date)
            finding("parse_http_date does not read back its own date as an IMF-fixdate", value);
        if (!digits) {
            const auto until = (*date - now).count();
            const bool expect = until <= rs::http::max_retry_after.count();
            if (expect != wait.has_value() || (wait && wait->count() != std::max<long long>(until, 0)))
                finding("parse_retry_after misread an HTTP-date", value);
        }
    } else if (wait && !digits) {
        finding("parse_retry_after read a value that is neither delay-seconds nor an HTTP-date", value);
    }
    return 0;
}

} // namespace resilience_fuzz
