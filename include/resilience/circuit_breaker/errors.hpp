// SPDX-License-Identifier: MIT
/// \file circuit_breaker/errors.hpp
/// The refusals of a `circuit_breaker`: `circuit_open_error` and `circuit_isolated_error`. Their codes
/// (`errc::circuit_open`, `errc::circuit_isolated`) and reasons stay in the core (error.hpp), so code that
/// only compares codes needs no breaker.
#pragma once

#include "../error.hpp"

#include <chrono>
#include <exception>
#include <string>
#include <utility>

namespace resilience::inline v0_2 {

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

} // namespace resilience
