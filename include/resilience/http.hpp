// SPDX-License-Identifier: MIT
/// \file http.hpp
/// `rs::http`: which statuses are worth another attempt, a Retry-After parser,
/// `response_classifier`, a ready `should_handle` for any response type, and `max_age`, a
/// response's Cache-Control max-age for `cache_options::ttl_of`.
///
/// Nothing here sends a request or depends on an HTTP library: a response type of your own is read
/// through `response_traits` (its status, and the Retry-After field's value when it has one).
#pragma once

#include "classifier.hpp"
#include "detail/http_date.hpp"
#include "outcome.hpp"

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2::http {

/// Statuses worth sending the same request again for: 408 Request Timeout, 429 Too Many Requests
/// and every 5xx. Not 409 Conflict or 422 Unprocessable Content: the server understood the request
/// and refused it, and the same request will be refused the same way. (501 Not Implemented and 505
/// are 5xx and so included; narrow with `response_classifier_options::transient_status`.)
[[nodiscard]] constexpr bool is_transient_status(int status) noexcept {
    return status == 408 || status == 429 || (status >= 500 && status <= 599);
}

/// The longest wait a Retry-After can ask for here: `std::chrono::nanoseconds::max()` in whole
/// seconds (about 292 years), so that any hint converts to a `verdict`'s delay without overflow.
/// A longer one is out of range and gives no hint (a retry would cap it at `max_delay` anyway).
inline constexpr std::chrono::seconds max_retry_after =
    std::chrono::duration_cast<std::chrono::seconds>(std::chrono::nanoseconds::max());

/// An HTTP-date (RFC 9110, section 5.6.7) as seconds on the system clock, or nullopt when the
/// value is not one. All three forms a recipient must accept are read:
/// - IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`;
/// - the obsolete RFC 850 form, `Sunday, 06-Nov-94 08:49:37 GMT`, whose two-digit year is the
///   latest year ending in those digits that is at most 50 years after `now`'s year (RFC 9110's
///   rule for a year that would otherwise be more than 50 years in the future);
/// - C's asctime form, `Sun Nov  6 08:49:37 1994`, read as UTC.
/// As the grammar says, names are case-sensitive and every field has its exact width. The day
/// name must be a real one of the form's kind (`Sun` or `Sunday`), but it is not checked against
/// the date: a sender that gets it wrong still means the date it wrote. A day that does not exist
/// (February 29th of a common year, April 31st), an hour past 23, a minute past 59 or a second
/// past 60 (a leap second, reckoned as the next second) makes the value malformed. Whitespace
/// (SP, HTAB) around the value is ignored. Reads the text in place: no allocation, no locale.
[[nodiscard]] constexpr std::optional<std::chrono::sys_seconds>
parse_http_date(std::string_view value, std::chrono::system_clock::time_point now) noexcept {
    value = detail::trim_ows(value);
    std::optional<std::int64_t> t = detail::imf_fixdate(value);
    if (!t)
        t = detail::asctime_date(value);
    if (!t)
        t = detail::rfc850_date(value,
                                detail::year_of_day(detail::floor_div(detail::unix_seconds(now), 86'400)));
    if (!t)
        return std::nullopt;
    return std::chrono::sys_seconds{std::chrono::seconds{*t}};
}

namespace detail {

/// `parse_retry_after`, asking `now()` for the time only when the value is a date.
template <class Now>
constexpr std::optional<std::chrono::seconds> retry_after_wait(std::string_view value, const Now& now) {
    value = trim_ows(value);
    if (value.empty())
        return std::nullopt;
    if (is_digit(value.front())) {
        std::int64_t n = 0;
        for (const char c : value) {
            if (!is_digit(c))
                return std::nullopt;
            n = n * 10 + (c - '0');
            if (n > max_retry_after.count())
                return std::nullopt; // checked at every digit, so n never overflows
        }
        return std::chrono::seconds{n};
    }
    const std::chrono::system_clock::time_point at = now();
    const std::optional<std::chrono::sys_seconds> date = parse_http_date(value, at);
    if (!date)
        return std::nullopt;
    // A date holds whole seconds, so the wait rounded up is the date less `now` rounded down.
    const std::int64_t wait = date->time_since_epoch().count() - unix_seconds(at);
    if (wait <= 0)
        return std::chrono::seconds::zero();
    if (wait > max_retry_after.count())
        return std::nullopt;
    return std::chrono::seconds{wait};
}

} // namespace detail

/// The wait a `Retry-After` field value asks for, seen at `now` on the system clock, or nullopt
/// for no hint. The value is either
/// - delay-seconds: one or more ASCII digits, nothing else (no sign, no fraction, no unit); or
/// - an HTTP-date (see `parse_http_date`): the time from `now` until then, rounded up to a whole
///   second (waiting a little longer is safe, retrying early is not); a date already past is zero.
/// No hint for anything malformed, for a wait longer than `max_retry_after`, or for a number too
/// large to hold: never a wrapped or clamped value standing in for what the server said.
/// Whitespace (SP, HTAB) around the value is ignored. No allocation, no locale, no exception.
[[nodiscard]] constexpr std::optional<std::chrono::seconds>
parse_retry_after(std::string_view value, std::chrono::system_clock::time_point now) noexcept {
    return detail::retry_after_wait(value, [now] { return now; });
}

namespace detail {

template <class R>
concept has_status_function = requires(const R& r) {
    { r.status() } -> std::convertible_to<int>;
};
template <class R>
concept has_status_field = requires(const R& r) {
    { r.status } -> std::convertible_to<int>;
};
template <class R>
concept has_retry_after_function = requires(const R& r) { r.retry_after(); };
template <class R>
concept has_retry_after_field = requires(const R& r) { r.retry_after; };
template <class R>
concept has_cache_control_function = requires(const R& r) { r.cache_control(); };
template <class R>
concept has_cache_control_field = requires(const R& r) { r.cache_control; };

template <class H>
concept optional_header = requires(const H& h) {
    { static_cast<bool>(h) } -> std::same_as<bool>;
    { *h } -> std::convertible_to<std::string_view>;
};

/// A Retry-After value as given by `response_traits<R>::retry_after`, as a view: an optional (or
/// anything testable and dereferenceable) of something string-like; a `const char*`, null for
/// none; or a string-like value, empty for none. The view refers to `h`.
template <class H>
std::optional<std::string_view> header_view(const H& h) noexcept {
    if constexpr (std::is_same_v<H, std::nullopt_t>) {
        return std::nullopt;
    } else if constexpr (std::is_pointer_v<H>) {
        static_assert(std::is_convertible_v<H, std::string_view>,
                      "resilience::http: a Retry-After given as a pointer must be a const char*");
        if (h == nullptr)
            return std::nullopt;
        return std::string_view{h};
    } else if constexpr (optional_header<H>) {
        if (!h)
            return std::nullopt;
        return std::string_view{*h};
    } else {
        static_assert(std::is_convertible_v<const H&, std::string_view>,
                      "resilience::http: response_traits<R>::retry_after must return an optional string, a "
                      "string (empty for none) or a const char* (null for none)");
        const std::string_view v{h};
        if (v.empty())
            return std::nullopt;
        return v;
    }
}

} // namespace detail

/// How `response_classifier` reads a response of type `Response`. Specialize it for yours:
///
///     template <> struct rs::http::response_traits<my::reply> {
///         static int status(const my::reply& r) { return r.code(); }
///         // optional; the view must stay valid while `r` lives:
///         static std::optional<std::string_view> retry_after(const my::reply& r) {
///             return r.header("Retry-After");
///         }
///     };
///
/// `retry_after` may return an optional of anything string-like, a string-like value (empty for
/// none) or a `const char*` (null for none); without it, no Retry-After is read. `cache_control`,
/// optional too and of the same kinds, gives the Cache-Control field's value (its lines joined by
/// commas), read by `max_age`. This primary template reads members: `status()` or a `status` field
/// convertible to `int`, and, when the type has them, `retry_after()` or a `retry_after` field and
/// `cache_control()` or a `cache_control` field, of one of those kinds.
template <class Response>
struct response_traits {
    static int status(const Response& r)
    requires detail::has_status_function<Response> || detail::has_status_field<Response>
    {
        if constexpr (detail::has_status_function<Response>)
            return static_cast<int>(r.status());
        else
            return static_cast<int>(r.status);
    }
    static decltype(auto) retry_after(const Response& r)
    requires detail::has_retry_after_function<Response> || detail::has_retry_after_field<Response>
    {
        if constexpr (detail::has_retry_after_function<Response>)
            return r.retry_after();
        else
            return (r.retry_after); // a reference to the field
    }
    static decltype(auto) cache_control(const Response& r)
    requires detail::has_cache_control_function<Response> || detail::has_cache_control_field<Response>
    {
        if constexpr (detail::has_cache_control_function<Response>)
            return r.cache_control();
        else
            return (r.cache_control); // a reference to the field
    }
};

/// A type `response_traits` can read a status from.
template <class Response>
concept response = requires(const Response& r) {
    { response_traits<Response>::status(r) } -> std::convertible_to<int>;
};

namespace detail {

constexpr bool same_ignoring_case(std::string_view a, std::string_view b) noexcept {
    if (a.size() != b.size())
        return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
        const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
        if (lower(a[i]) != lower(b[i]))
            return false;
    }
    return true;
}

/// The largest delta-seconds a cache must be able to hold (RFC 9111, section 1.2.2): a larger value
/// is read as this one.
inline constexpr std::int64_t max_delta_seconds = 2'147'483'648;

/// A `max-age` argument (a token or a quoted string) as delta-seconds; zero when it is not digits
/// (invalid freshness information, which RFC 9111, section 4.2.1, asks a cache to treat as stale).
constexpr std::chrono::seconds max_age_argument(std::string_view arg) noexcept {
    if (arg.size() >= 2 && arg.front() == '"' && arg.back() == '"')
        arg = arg.substr(1, arg.size() - 2); // a quoted string of digits has no escapes to undo
    if (arg.empty())
        return std::chrono::seconds::zero();
    std::int64_t n = 0;
    for (const char c : arg) {
        if (!is_digit(c))
            return std::chrono::seconds::zero();
        if (n < max_delta_seconds)
            n = n * 10 + (c - '0'); // at most 10 * 2^31 + 9: no overflow
    }
    return std::chrono::seconds{n < max_delta_seconds ? n : max_delta_seconds};
}

} // namespace detail

/// The freshness lifetime a `Cache-Control` field value gives (RFC 9111, section 5.2.2.1): its
/// `max-age` directive, or nullopt when it has none. The value is a comma-separated list of
/// directives, `name` or `name=argument` (the argument a token or a quoted string, so
/// `max-age=60` and `max-age="60"` are alike); names are compared without regard to case, and a
/// comma inside a quoted string does not end a directive. The first `max-age` counts. An argument
/// that is not delta-seconds (digits only: no sign, no fraction) gives zero, since RFC 9111
/// (section 4.2.1) asks a cache to treat invalid freshness information as stale; one too large is
/// read as 2^31 seconds (section 1.2.2). No other directive is read: `s-maxage` is for shared
/// caches, and `no-cache`, `no-store` and `private` are left to the caller. Whitespace (SP, HTAB)
/// around directives and around `=` is ignored. Reads the text in place: no allocation, no
/// exception.
[[nodiscard]] constexpr std::optional<std::chrono::seconds> parse_max_age(std::string_view value) noexcept {
    std::size_t at = 0;
    while (at <= value.size()) {
        // One directive: up to the next comma outside a quoted string.
        std::size_t end = at;
        bool quoted = false;
        for (; end < value.size(); ++end) {
            const char c = value[end];
            if (quoted && c == '\\') {
                ++end; // a quoted-pair: the next character is taken as it is
                continue;
            }
            if (c == '"')
                quoted = !quoted;
            else if (c == ',' && !quoted)
                break;
        }
        const std::string_view directive = value.substr(at, std::min(end, value.size()) - at);
        const std::size_t eq = directive.find('=');
        const std::string_view name = detail::trim_ows(directive.substr(0, eq));
        if (detail::same_ignoring_case(name, "max-age")) {
            if (eq == std::string_view::npos)
                return std::chrono::seconds::zero(); // no argument: invalid, so stale
            return detail::max_age_argument(detail::trim_ows(directive.substr(eq + 1)));
        }
        at = end + 1;
    }
    return std::nullopt;
}

/// The `max-age` of `r`'s Cache-Control (see `parse_max_age`), read through
/// `response_traits<Response>::cache_control`; nullopt when the response has no such field, or its
/// field no `max-age`. Made for `cache_options::ttl_of`:
///
///     rs::cache<std::string, reply> pages{{.ttl = 30s, .ttl_of = [](const reply& r) { return rs::http::max_age(r); }}};
template <response Response>
[[nodiscard]] std::optional<std::chrono::seconds> max_age(const Response& r) {
    if constexpr (requires { response_traits<Response>::cache_control(r); }) {
        // Kept whole while viewed: cache_control may return the field's text by value.
        const auto& field = response_traits<Response>::cache_control(r);
        if (const std::optional<std::string_view> text = detail::header_view(field))
            return parse_max_age(*text);
    }
    return std::nullopt;
}

namespace detail {

template <class Result>
struct response_of {};
template <response Result>
struct response_of<Result> {
    using type = Result;
};
template <class Result>
requires(!response<Result> && expected_like<Result> &&
         response<std::remove_cvref_t<decltype(std::declval<const Result&>().value())>>)
struct response_of<Result> {
    using type = std::remove_cvref_t<decltype(std::declval<const Result&>().value())>;
};

} // namespace detail

/// What a `response_classifier` handles, and whether it listens to Retry-After.
struct response_classifier_options {
    /// Which statuses are worth another attempt (or count as failures, for a breaker).
    /// Empty: `is_transient_status`. To widen or narrow it:
    ///
    ///     .transient_status = [](int s) { return rs::http::is_transient_status(s) && s != 501; }
    std::function<bool(int)> transient_status{};
    /// A handled response's Retry-After sets the retry's wait (capped by `retry_options::max_delay`,
    /// as every verdict's delay is). `false`: the backoff decides, whatever the server asked.
    bool use_retry_after = true;
};

/// A ready `should_handle` for actions returning `Result`: a response type `response_traits` reads,
/// or an `expected_like` result whose value is one (`std::expected<reply, std::error_code>`).
/// - A response whose status is transient (`is_transient_status`, or the options' predicate) is
///   handled; when it carries a Retry-After the verdict's delay is what it asks for (seconds, or
///   the time until its HTTP-date on `WallClock`), so a retry waits that long instead of its
///   backoff, capped by `max_delay`. A Retry-After that gives no hint (see `parse_retry_after`)
///   leaves the backoff in charge. Any other status is an answer, not handled.
/// - A failure (an exception) is judged by `rs::is_transient`.
/// - An `expected_like` result holding an error is judged as an empty classifier judges it:
///   handled, or, for an error that is an exception, by `rs::is_transient`.
/// Give it as `should_handle` to a retry (and the same to a breaker, a hedge or a fallback, which
/// read `handle` only):
///
///     rs::retry r{{.should_handle = rs::http::response_classifier<reply>{}}};
///
/// `WallClock` gives the time an HTTP-date is measured from: anything whose `now()` converts to
/// `std::chrono::system_clock::time_point` (a test gives a fixed or simulated one). It is read only
/// for a Retry-After that is a date. A value: copies are independent; `transient_status` is called
/// as `const`, from any thread that runs a call.
template <class Result, class WallClock = std::chrono::system_clock>
requires requires { typename detail::response_of<Result>::type; }
class response_classifier {
public:
    /// The response type read through `response_traits`.
    using response_type = typename detail::response_of<Result>::type;

    response_classifier() = default;
    explicit response_classifier(response_classifier_options options, WallClock clock = WallClock{})
        : options_(std::move(options)), clock_(std::move(clock)) {}

    /// The verdict on one outcome (see the class comment).
    verdict operator()(const outcome<Result>& o) const {
        const auto by_failure = [](const failure& f) noexcept {
            return verdict{.handle = is_transient(f), .delay = std::nullopt};
        };
        if (o.has_failure())
            return by_failure(o.error());
        const Result& r = *o;
        if constexpr (std::is_same_v<Result, response_type>) {
            return judge(r);
        } else {
            if (!static_cast<bool>(r.has_value()))
                return resilience::detail::judge_error_value(r, by_failure);
            return judge(r.value());
        }
    }

    /// The verdict on a response alone: its status, and its Retry-After when the status is handled.
    [[nodiscard]] verdict judge(const response_type& r) const {
        const int status = response_traits<response_type>::status(r);
        if (!(options_.transient_status ? options_.transient_status(status) : is_transient_status(status)))
            return {};
        verdict v{.handle = true, .delay = std::nullopt};
        if constexpr (requires { response_traits<response_type>::retry_after(r); }) {
            if (options_.use_retry_after) {
                // Kept whole while viewed: retry_after may return the field's text by value.
                const auto& field = response_traits<response_type>::retry_after(r);
                if (const std::optional<std::string_view> text = detail::header_view(field)) {
                    if (const auto wait = detail::retry_after_wait(*text, [this] { return wall_now(); }))
                        v.delay = std::chrono::nanoseconds{*wait};
                }
            }
        }
        return v;
    }

    [[nodiscard]] const response_classifier_options& options() const noexcept { return options_; }
    [[nodiscard]] const WallClock& wall_clock() const noexcept { return clock_; }

private:
    std::chrono::system_clock::time_point wall_now() const { return clock_.now(); }

    response_classifier_options options_{};
    WallClock clock_{};
};

} // namespace resilience::http
