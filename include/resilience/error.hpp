// SPDX-License-Identifier: MIT
/// \file error.hpp
/// The library's error codes (`errc`, for every policy), their category, `rejection_reason`, and the
/// core's exceptions: `error`, the base of all the library's own, `timeout_error`, `cancelled_error`
/// and `retry_after_error`. A policy's own exceptions are in its folder's `errors.hpp`.
#pragma once

#include "detail/config.hpp"
#include "detail/error_category.hpp"
#include "properties.hpp"

#include <chrono>
#include <cstddef>
#include <exception>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace resilience::inline v0_2 {

/// Why a policy refused or ended a call. Values are stable: they are part of the ABI of logs.
/// As `std::error_code`s, `timeout` compares equal to `std::errc::timed_out` and `cancelled` to
/// `std::errc::operation_canceled`; the others match no standard condition.
enum class errc {
    timeout = 1,       ///< an attempt ran past its deadline
    cancelled,         ///< the caller asked to stop
    circuit_open,      ///< a circuit breaker refused the call
    bulkhead_rejected, ///< a bulkhead had no slot and no queue place (or the queue wait ran out)
    rate_limited,      ///< a rate limiter had no token and would not wait
    budget_exhausted,  ///< a retry budget had no token left
    circuit_isolated,  ///< a circuit breaker isolated by hand refused the call (until `reset()`)
    throttled,         ///< an adaptive throttle refused the call locally, without sending it
    no_endpoint,       ///< a balancer had no endpoint to pick
};

template <>
struct detail::errc_text<errc> {
    static constexpr const char* name = "resilience";
    static constexpr const char* messages[] = {
        // by value, from 1
        "timed out",        "cancelled",
        "circuit open",     "bulkhead rejected the call",
        "rate limited",     "retry budget exhausted",
        "circuit isolated", "throttled",
        "no endpoint",
    };
    static_assert(std::size(messages) == static_cast<std::size_t>(errc::no_endpoint), "a message per errc");
    static constexpr const char* unknown = "unknown resilience error";
    static std::errc standard(errc e) noexcept {
        return e == errc::timeout     ? std::errc::timed_out
               : e == errc::cancelled ? std::errc::operation_canceled
                                      : std::errc{};
    }
};

/// The category of `errc`; one object for the whole program.
inline const std::error_category& error_category() noexcept {
    return detail::category_of<errc>();
}

inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), error_category()};
}

/// Base of every exception this library throws of its own. A `std::system_error`, so code that
/// already catches those sees ours too; `code()` is an `errc` in `error_category()`.
/// `policy_name()` is the `name` option of the policy that made it (empty when unnamed), also
/// the start of `what()`: "payments: circuit open".
class error : public std::system_error {
public:
    RESILIENCE_DECL explicit error(errc e, std::string policy_name = {});
    const std::string& policy_name() const noexcept { return name_; }

private:
    std::string name_;
};

/// An attempt ran past its deadline. When the attempt failed after the deadline, `cause()` holds
/// that failure; when it was stopped and finished without one, `cause()` is null.
class timeout_error : public error {
public:
    explicit timeout_error(std::string policy_name = {}, std::exception_ptr cause = nullptr)
        : error(errc::timeout, std::move(policy_name)), cause_(std::move(cause)) {}
    const std::exception_ptr& cause() const noexcept { return cause_; }

private:
    std::exception_ptr cause_;
};

/// The caller asked to stop (through the stop token it passed in). Never retried, never a timeout.
/// What a call its caller stopped ends with, unless an attempt returned a value all the same,
/// whatever the stopped attempt threw (docs/core.md, "A call its caller stopped"). Its code
/// compares equal to `std::errc::operation_canceled`.
class cancelled_error : public error {
public:
    cancelled_error() : error(errc::cancelled) {}
    /// Made by the policy named `policy_name` (see `error::policy_name()`).
    explicit cancelled_error(std::string policy_name) : error(errc::cancelled, std::move(policy_name)) {}
};

/// Thrown by the code that refuses a call because a wait would be needed: carries how long until
/// asking again may succeed. Shared by `circuit_open_error` and `rate_limited_error`.
class retry_after_error : public error {
public:
    retry_after_error(errc e, std::string policy_name, std::chrono::nanoseconds retry_after)
        : error(e, std::move(policy_name)), retry_after_(retry_after) {}
    /// Time from the refusal until the policy may admit a call (exact on virtual time).
    std::chrono::nanoseconds retry_after() const noexcept { return retry_after_; }

private:
    std::chrono::nanoseconds retry_after_;
};

/// Why a policy refused a call without running it (`reason()` of its error, `rejection_event`).
/// The bulkhead's and the limiters' first three need different answers from the caller: more
/// capacity, a longer queue, or a longer `queue_timeout`; `shed` says the dependency is overloaded
/// (its queue stands), so waiting longer would not help.
enum class rejection_reason : unsigned char {
    no_capacity,      ///< nothing free and waiting not allowed (`queue_limit` 0)
    queue_full,       ///< nothing free and `queue_limit` calls already waiting
    queue_timeout,    ///< waited in the queue for `queue_timeout` without being served
    circuit_open,     ///< a circuit breaker is open, or half-open with every probe taken
    circuit_isolated, ///< a circuit breaker is held open by hand (`isolate()`)
    throttled,        ///< an adaptive throttle drew a local refusal
    shed,             ///< a queue discipline (CoDel, adaptive LIFO) dropped the waiter: the queue stood
};

/// "no_capacity", "queue_full", ...: a static string, for logs and metric labels.
constexpr const char* to_string(rejection_reason r) noexcept {
    switch (r) {
    case rejection_reason::no_capacity:
        return "no_capacity";
    case rejection_reason::queue_full:
        return "queue_full";
    case rejection_reason::queue_timeout:
        return "queue_timeout";
    case rejection_reason::circuit_open:
        return "circuit_open";
    case rejection_reason::circuit_isolated:
        return "circuit_isolated";
    case rejection_reason::throttled:
        return "throttled";
    case rejection_reason::shed:
        return "shed";
    }
    return "unknown";
}

/// What a policy tells its `on_rejected` callback when it refuses a call, before the refusal is
/// returned. Refers to the policy's name: valid only during the callback.
class rejection_event {
public:
    rejection_event(std::string_view policy_name, rejection_reason reason,
                    std::chrono::nanoseconds retry_after = {}) noexcept
        : name_(policy_name), reason_(reason), retry_after_(retry_after) {}

    /// The `name` option of the refusing policy (empty when unnamed).
    [[nodiscard]] std::string_view policy_name() const noexcept { return name_; }
    /// Why it refused.
    [[nodiscard]] rejection_reason reason() const noexcept { return reason_; }
    /// The `retry_after()` of the refusal's error; zero when it carries none.
    [[nodiscard]] std::chrono::nanoseconds retry_after() const noexcept { return retry_after_; }

    /// What the caller set on the call's context (properties.hpp): a request id, a tenant.
    [[nodiscard]] properties_view properties() const noexcept { return properties_; }
    /// Sets what `properties()` returns (the reporting policy passes the call's).
    rejection_event& with_properties(properties_view p) noexcept {
        properties_ = p;
        return *this;
    }

private:
    std::string_view name_;
    rejection_reason reason_;
    std::chrono::nanoseconds retry_after_;
    properties_view properties_{};
};

} // namespace resilience

template <>
struct std::is_error_code_enum<resilience::errc> : std::true_type {};

#if RESILIENCE_INCLUDE_DEFINITIONS
#include "impl/error.ipp"
#endif
