// SPDX-License-Identifier: MIT
/// \file context.hpp
/// `context`: what one attempt knows about itself (stop token, attempt number, deadline).
#pragma once

#include <chrono>
#include <optional>
#include <stop_token>

namespace resilience {

/// Per-attempt information handed to an action that asks for it (`[](rs::context const& c)`).
/// A value: copying is cheap. Policies derive child contexts: a retry sets `attempt()`, a timeout
/// replaces the stop token with the attempt's own and tightens the deadline.
class context {
public:
    context() = default;
    explicit context(std::stop_token token) noexcept : token_(std::move(token)) {}

    /// Stopped when the caller, or a policy around this attempt (timeout, hedge), wants it to end.
    const std::stop_token& stop_token() const noexcept { return token_; }
    /// 1 for the first attempt of the innermost retry, 2 for its first retry, and so on.
    int attempt() const noexcept { return attempt_; }
    /// The earliest deadline set by an enclosing timeout, as time since the epoch of that timeout's
    /// clock (compare with `clock.now().time_since_epoch()`); empty when nothing bounds the attempt.
    std::optional<std::chrono::nanoseconds> deadline() const noexcept { return deadline_; }

    context with_stop_token(std::stop_token t) const noexcept {
        context c = *this;
        c.token_ = std::move(t);
        return c;
    }
    context with_attempt(int a) const noexcept {
        context c = *this;
        c.attempt_ = a;
        return c;
    }
    /// Keeps the earlier of the current deadline and `d`.
    context with_deadline(std::chrono::nanoseconds d) const noexcept {
        context c = *this;
        if (!c.deadline_ || d < *c.deadline_)
            c.deadline_ = d;
        return c;
    }

private:
    std::stop_token token_;
    int attempt_ = 1;
    std::optional<std::chrono::nanoseconds> deadline_;
};

} // namespace resilience
