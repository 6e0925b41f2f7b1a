// SPDX-License-Identifier: MIT
/// \file fmt.hpp
/// Optional fmt formatters for the library's vocabulary types (needs fmt 9 or later): error codes,
/// errors, failures and outcomes, a breaker's states, rejection and hedge reasons, telemetry kinds
/// and events.
///
///     fmt::print("{}\n", rs::errc::circuit_open);            // circuit open
///     fmt::print("call failed: {}\n", outcome.error());       // the exception's what()
///     fmt::print("{}\n", rs::outcome<int>{42});               // value(42)
///     fmt::print("{}\n", rs::circuit_state::half_open);       // half_open
///     fmt::print("{}\n", event);  // [1.2s] retry(payments) retry: attempt 1 failed, next in 200ms: boom
#pragma once

#include "adaptive_throttle/errors.hpp"
#include "bulkhead/errors.hpp"
#include "circuit_breaker.hpp"
#include "circuit_breaker/errors.hpp"
#include "error.hpp"
#include "hedge.hpp"
#include "limiter/errors.hpp"
#include "outcome.hpp"
#include "telemetry.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

template <>
struct fmt::formatter<resilience::errc> : fmt::formatter<std::string_view> {
    template <class FormatContext>
    auto format(resilience::errc e, FormatContext& ctx) const -> decltype(ctx.out()) {
        const std::string message = resilience::error_category().message(static_cast<int>(e));
        return fmt::formatter<std::string_view>::format(message, ctx);
    }
};

/// A failure prints as its exception's `what()`.
template <>
struct fmt::formatter<resilience::failure> : fmt::formatter<std::string_view> {
    template <class FormatContext>
    auto format(const resilience::failure& f, FormatContext& ctx) const -> decltype(ctx.out()) {
        const std::string text = f.what();
        return fmt::formatter<std::string_view>::format(text, ctx);
    }
};

/// An outcome prints as `value(<value>)`, `value()` for `outcome<void>`, or `failure(<what>)`.
template <class T>
struct fmt::formatter<resilience::outcome<T>> {
    constexpr auto parse(fmt::format_parse_context& ctx) -> decltype(ctx.begin()) { return ctx.begin(); }
    template <class FormatContext>
    auto format(const resilience::outcome<T>& o, FormatContext& ctx) const -> decltype(ctx.out()) {
        if (o.has_failure())
            return fmt::format_to(ctx.out(), "failure({})", o.error().what());
        if constexpr (std::is_void_v<T>)
            return fmt::format_to(ctx.out(), "value()");
        else
            return fmt::format_to(ctx.out(), "value({})", o.value());
    }
};

namespace resilience::inline v0_2::detail {

/// "0s", "250ms", "1.5s", "12.345us": the largest unit in which `d` is at least one, three decimals
/// at most, trailing zeros dropped. The longest duration prints as "forever".
inline std::string format_duration(std::chrono::nanoseconds d) {
    if (d == std::chrono::nanoseconds::max())
        return "forever";
    const std::int64_t n = d.count();
    const std::int64_t magnitude = n < 0 ? -n : n;
    const char* unit = "ns";
    double value = static_cast<double>(n);
    if (magnitude >= 1'000'000'000) {
        unit = "s";
        value /= 1e9;
    } else if (magnitude >= 1'000'000) {
        unit = "ms";
        value /= 1e6;
    } else if (magnitude >= 1'000) {
        unit = "us";
        value /= 1e3;
    }
    std::string text = fmt::format("{:.3f}", value);
    while (text.back() == '0')
        text.pop_back();
    if (text.back() == '.')
        text.pop_back();
    return text + unit;
}

/// Formats an enum through its `to_string`, as a string (so width and alignment apply).
template <class E>
struct named_enum_formatter : fmt::formatter<std::string_view> {
    template <class FormatContext>
    auto format(E e, FormatContext& ctx) const -> decltype(ctx.out()) {
        return fmt::formatter<std::string_view>::format(to_string(e), ctx);
    }
};

/// What an error of the library prints: its `what()`, then what a caller acts on: how long to
/// wait (`retry_after()`) and why it was refused (`reason()`).
inline std::string describe_error(const error& e) {
    std::string text = e.what();
    if (const auto* r = dynamic_cast<const retry_after_error*>(&e);
        r && r->retry_after() != std::chrono::nanoseconds::max())
        text += " (retry after " + format_duration(r->retry_after()) + ")";
    if (const auto* b = dynamic_cast<const bulkhead_rejected_error*>(&e))
        text += std::string(" (") + to_string(b->reason()) + ")";
    if (const auto* l = dynamic_cast<const rate_limited_error*>(&e))
        text += std::string(" (") + to_string(l->reason()) + ")";
    return text;
}

/// Formats an error of the library (see `describe_error`).
struct error_formatter : fmt::formatter<std::string_view> {
    template <class FormatContext>
    auto format(const error& e, FormatContext& ctx) const -> decltype(ctx.out()) {
        const std::string text = describe_error(e);
        return fmt::formatter<std::string_view>::format(text, ctx);
    }
};

/// A failure as the error formatter prints it when it is one of the library's, else its `what()`.
inline std::string describe_failure(const failure& f) {
    if (const auto* e = f.as<error>())
        return describe_error(*e);
    return f.what();
}

} // namespace resilience::detail

template <>
struct fmt::formatter<resilience::circuit_state>
    : resilience::detail::named_enum_formatter<resilience::circuit_state> {};
template <>
struct fmt::formatter<resilience::rejection_reason>
    : resilience::detail::named_enum_formatter<resilience::rejection_reason> {};
template <>
struct fmt::formatter<resilience::hedge_reason>
    : resilience::detail::named_enum_formatter<resilience::hedge_reason> {};
template <>
struct fmt::formatter<resilience::telemetry_kind>
    : resilience::detail::named_enum_formatter<resilience::telemetry_kind> {};

// The library's errors: `what()`, then "(retry after 4.5s)" for the ones that carry a wait and
// "(queue_full)" for the ones that carry a reason. One specialization each: an exact match, so a
// formatter that fmt (or the user) provides for every std::exception does not make it ambiguous.
template <>
struct fmt::formatter<resilience::error> : resilience::detail::error_formatter {};
template <>
struct fmt::formatter<resilience::timeout_error> : resilience::detail::error_formatter {};
template <>
struct fmt::formatter<resilience::cancelled_error> : resilience::detail::error_formatter {};
template <>
struct fmt::formatter<resilience::retry_after_error> : resilience::detail::error_formatter {};
template <>
struct fmt::formatter<resilience::circuit_open_error> : resilience::detail::error_formatter {};
template <>
struct fmt::formatter<resilience::circuit_isolated_error> : resilience::detail::error_formatter {};
template <>
struct fmt::formatter<resilience::bulkhead_rejected_error> : resilience::detail::error_formatter {};
template <>
struct fmt::formatter<resilience::rate_limited_error> : resilience::detail::error_formatter {};
template <>
struct fmt::formatter<resilience::throttled_error> : resilience::detail::error_formatter {};

namespace resilience::inline v0_2::detail {

/// The line `fmt::formatter<telemetry_event>` prints.
inline std::string describe_event(const telemetry_event& e) {
    std::string text = fmt::format("[{}] {}", format_duration(e.at), e.policy);
    if (!e.name.empty())
        text += fmt::format("({})", e.name);
    text += fmt::format(" {}: ", to_string(e.kind));
    const std::string error = e.error ? describe_failure(*e.error) : std::string{};
    const std::string waited =
        e.duration > std::chrono::nanoseconds::zero() ? " after waiting " + format_duration(e.duration) : "";
    switch (e.kind) {
    case telemetry_kind::attempt:
    case telemetry_kind::call:
        text += e.kind == telemetry_kind::call ? std::string("call") : fmt::format("attempt {}", e.attempt);
        // A value the classifier handled (a 503 retried) did not succeed, though nothing was thrown.
        if (e.error)
            text += fmt::format(" failed after {}: {}", format_duration(e.duration), error);
        else if (e.handled)
            text += fmt::format(" returned a handled value after {}", format_duration(e.duration));
        else
            text += fmt::format(" succeeded after {}", format_duration(e.duration));
        break;
    case telemetry_kind::retry:
        text += fmt::format("attempt {} {}, next in {}", e.attempt,
                            e.error ? "failed" : "returned a handled value", format_duration(e.duration));
        if (e.error)
            text += ": " + error;
        break;
    case telemetry_kind::timeout:
        text += fmt::format("attempt {} ran past {}", e.attempt, format_duration(e.duration));
        text += e.error ? ": " + error : std::string(", its value kept");
        break;
    case telemetry_kind::state_change:
        text += fmt::format("{} -> {}", to_string(e.from), to_string(e.to));
        break;
    case telemetry_kind::rejection:
        text += fmt::format("attempt {} refused{}", e.attempt, waited);
        if (e.error)
            text += ": " + error;
        break;
    case telemetry_kind::hedge:
        text += fmt::format("attempt {} started", e.attempt);
        if (e.duration > std::chrono::nanoseconds::zero())
            text += " after " + format_duration(e.duration);
        if (e.error)
            text += ", brought forward by: " + error;
        break;
    case telemetry_kind::queue_wait:
        text += fmt::format("attempt {} admitted after waiting {}", e.attempt, format_duration(e.duration));
        break;
    case telemetry_kind::fallback:
        text += fmt::format("attempt {} answered by the substitute", e.attempt);
        text += e.error ? " for: " + error : std::string(" for a handled value");
        break;
    case telemetry_kind::backend_lost:
        text += fmt::format("store lost, {} meanwhile", e.note);
        if (e.error)
            text += ": " + error;
        break;
    case telemetry_kind::backend_restored:
        text += fmt::format("store back, after {}", e.note);
        break;
    case telemetry_kind::cache_hit:
        text += e.error ? "answered with a remembered failure: " + error
                        : std::string("answered from a fresh entry");
        break;
    case telemetry_kind::cache_miss:
        text += "no usable entry, called";
        break;
    case telemetry_kind::endpoint_ejected:
        text += fmt::format("{} ejected for {} ({})", e.endpoint.empty() ? "an endpoint" : e.endpoint,
                            format_duration(e.duration), e.note);
        break;
    case telemetry_kind::endpoint_returned:
        text += fmt::format("{} back", e.endpoint.empty() ? "an endpoint" : e.endpoint);
        break;
    case telemetry_kind::stale_served:
        text += fmt::format("answered from an entry {} past its freshness ({})", format_duration(e.duration),
                            e.note);
        if (e.error)
            text += ": " + error;
        break;
    }
    // The call's properties whose values are text, as `{request_id=r-42, tenant=acme}`.
    std::string tags;
    e.properties.for_each([&](std::string_view name, std::string_view value) {
        if (!value.empty())
            tags += fmt::format("{}{}={}", tags.empty() ? "" : ", ", name, value);
    });
    if (!tags.empty())
        text += " {" + tags + "}";
    return text;
}

} // namespace resilience::detail

/// One line per event, for logs ("[at] policy(name) kind: what happened"; the name only when the
/// policy has one, `at` as time since the clock's epoch):
///
///     [1.2s] retry(payments) attempt: attempt 1 failed after 30ms: boom
///     [1.2s] retry(payments) retry: attempt 1 failed, next in 200ms: boom
///     [5s] circuit_breaker(payments) state_change: closed -> open
///     [5s] bulkhead rejection: attempt 1 refused: bulkhead rejected the call (no_capacity)
///
/// The call's properties whose values are text (properties.hpp) end the line:
///
///     [1.2s] retry(payments) retry: attempt 1 failed, next in 200ms: boom {request_id=r-42, tenant=acme}
template <>
struct fmt::formatter<resilience::telemetry_event> : fmt::formatter<std::string_view> {
    template <class FormatContext>
    auto format(const resilience::telemetry_event& e, FormatContext& ctx) const -> decltype(ctx.out()) {
        const std::string text = resilience::detail::describe_event(e);
        return fmt::formatter<std::string_view>::format(text, ctx);
    }
};
