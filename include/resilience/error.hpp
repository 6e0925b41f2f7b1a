// SPDX-License-Identifier: MIT
/// \file error.hpp
/// The library's error codes, their category, and the exception types policies throw.
#pragma once

#include "properties.hpp"

#include <chrono>
#include <exception>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace resilience {

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
};

namespace detail {
class error_category_impl final : public std::error_category {
public:
    const char* name() const noexcept override { return "resilience"; }
    std::string message(int value) const override {
        switch (static_cast<errc>(value)) {
        case errc::timeout:
            return "timed out";
        case errc::cancelled:
            return "cancelled";
        case errc::circuit_open:
            return "circuit open";
        case errc::bulkhead_rejected:
            return "bulkhead rejected the call";
        case errc::rate_limited:
            return "rate limited";
        case errc::budget_exhausted:
            return "retry budget exhausted";
        case errc::circuit_isolated:
            return "circuit isolated";
        case errc::throttled:
            return "throttled";
        }
        return "unknown resilience error";
    }
    // Code written against the standard conditions (`ec == std::errc::timed_out`) should recognise
    // ours without knowing this library; the comparison asks the code's category first.
    bool equivalent(int value, const std::error_condition& condition) const noexcept override {
        switch (static_cast<errc>(value)) {
        case errc::timeout:
            return condition == std::errc::timed_out || default_error_condition(value) == condition;
        case errc::cancelled:
            return condition == std::errc::operation_canceled || default_error_condition(value) == condition;
        default:
            return default_error_condition(value) == condition;
        }
    }
};
} // namespace detail

/// The category of `errc`; one object for the whole program (an inline variable).
inline const std::error_category& error_category() noexcept {
    static const detail::error_category_impl category;
    return category;
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
    explicit error(errc e, std::string policy_name = {})
        : std::system_error(policy_name.empty() ? std::system_error(make_error_code(e))
                                                : std::system_error(make_error_code(e), policy_name)),
          name_(std::move(policy_name)) {}
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
/// The bulkhead's and the limiters' three need different answers from the caller: more capacity, a
/// longer queue, or a longer `queue_timeout`.
enum class rejection_reason : unsigned char {
    no_capacity,      ///< nothing free and waiting not allowed (`queue_limit` 0)
    queue_full,       ///< nothing free and `queue_limit` calls already waiting
    queue_timeout,    ///< waited in the queue for `queue_timeout` without being served
    circuit_open,     ///< a circuit breaker is open, or half-open with every probe taken
    circuit_isolated, ///< a circuit breaker is held open by hand (`isolate()`)
    throttled,        ///< an adaptive throttle drew a local refusal
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
    }
    return "unknown";
}

/// A circuit breaker refused the call without running it. `retry_after()` is positive: while open,
/// the time left in the break; while half-open with every probe slot taken, the breaker's current
/// break duration (a probe that fails keeps it closed to callers at least that long). `cause()` is
/// the failure that opened the circuit, null when slowness or a handled value opened it.
/// A breaker isolated by hand refuses with the derived `circuit_isolated_error`.
class circuit_open_error : public retry_after_error {
public:
    circuit_open_error(std::string policy_name, std::chrono::nanoseconds retry_after,
                       std::exception_ptr cause = nullptr)
        : retry_after_error(errc::circuit_open, std::move(policy_name), retry_after),
          cause_(std::move(cause)) {}
    const std::exception_ptr& cause() const noexcept { return cause_; }
    /// `circuit_open`, or `circuit_isolated` for a `circuit_isolated_error`.
    rejection_reason reason() const noexcept {
        return code() == make_error_code(errc::circuit_isolated) ? rejection_reason::circuit_isolated
                                                                 : rejection_reason::circuit_open;
    }

protected:
    /// For refusals of their own kind that existing `catch (const circuit_open_error&)` still meet.
    circuit_open_error(errc e, std::string policy_name, std::chrono::nanoseconds retry_after,
                       std::exception_ptr cause)
        : retry_after_error(e, std::move(policy_name), retry_after), cause_(std::move(cause)) {}

private:
    std::exception_ptr cause_;
};

/// A circuit breaker held open by hand (`isolate()`) refused the call. Nothing but `reset()` admits
/// calls again, so no wait helps: `retry_after()` is `std::chrono::nanoseconds::max()`, never zero,
/// and `is_transient` says no. `code()` is `errc::circuit_isolated`; derived from
/// `circuit_open_error`, so code catching that catches this too. `cause()` is null.
class circuit_isolated_error : public circuit_open_error {
public:
    explicit circuit_isolated_error(std::string policy_name = {})
        : circuit_open_error(errc::circuit_isolated, std::move(policy_name), std::chrono::nanoseconds::max(),
                             nullptr) {}
};

/// A rate limiter refused the call; `retry_after()` is when a token will be there for it, and
/// `reason()` why it was refused.
class rate_limited_error : public retry_after_error {
public:
    rate_limited_error(std::string policy_name, std::chrono::nanoseconds retry_after,
                       rejection_reason reason = rejection_reason::no_capacity)
        : retry_after_error(errc::rate_limited, std::move(policy_name), retry_after), reason_(reason) {}
    rejection_reason reason() const noexcept { return reason_; }

private:
    rejection_reason reason_;
};

/// An adaptive throttle refused the call locally, without sending it: the dependency has been
/// refusing so much of what it was sent that this call would likely have been refused too.
/// `probability()` is the rejection probability the call was refused with (in (0, 1)). No
/// `retry_after`: the refusal is a draw, not a wait, and `is_transient` says no (a retry at once
/// would only draw again against the same odds, and add to the requests that raise them).
class throttled_error : public error {
public:
    explicit throttled_error(std::string policy_name = {}, double probability = 0.0)
        : error(errc::throttled, std::move(policy_name)), probability_(probability) {}
    double probability() const noexcept { return probability_; }
    /// Always `rejection_reason::throttled`.
    rejection_reason reason() const noexcept { return rejection_reason::throttled; }

private:
    double probability_;
};

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
