// SPDX-License-Identifier: MIT
/// \file hedge/options.hpp
/// How a `hedge` is configured and what it reports: `hedge_options`, its `hedge_delay`, and the
/// `hedge_event` (with its `hedge_reason`) that `on_hedge` hears.
#pragma once

#include "../classifier.hpp"
#include "../context.hpp"
#include "../detail/time.hpp"
#include "../outcome.hpp"
#include "../retry_budget.hpp"
#include "../telemetry_event.hpp"

#include <chrono>
#include <concepts>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace resilience::inline v0_2 {

/// Why a hedge started an extra attempt.
enum class hedge_reason : unsigned char {
    delay,   ///< the attempts in flight had not finished within `hedge_options::delay`
    failure, ///< an attempt failed and `hedge_options::should_handle` brought the next one forward
};

constexpr const char* to_string(hedge_reason r) noexcept {
    return r == hedge_reason::delay ? "delay" : "failure";
}

/// What a hedge reports to `on_hedge`. Refers to the call's own outcome and to the hedge's name:
/// valid only during the callback; copy what you need to keep.
class hedge_event {
public:
    hedge_event(int attempt, hedge_reason reason, const failure* error = nullptr,
                std::string_view policy_name = {}) noexcept
        : attempt_(attempt), reason_(reason), error_(error), name_(policy_name) {}

    /// The attempt about to start: 2 for the first extra one, and so on.
    [[nodiscard]] int attempt() const noexcept { return attempt_; }
    [[nodiscard]] hedge_reason reason() const noexcept { return reason_; }
    /// For `hedge_reason::failure`, the failure that brought it forward; null for `delay`, and for
    /// a returned value that `should_handle` handled.
    [[nodiscard]] const failure* error() const noexcept { return error_; }
    /// The `name` option of the hedge that reports (empty when unnamed).
    [[nodiscard]] std::string_view policy_name() const noexcept { return name_; }

    /// What the caller set on the call's context (properties.hpp): a request id, a tenant.
    [[nodiscard]] properties_view properties() const noexcept { return properties_; }
    /// Sets what `properties()` returns (the reporting policy passes the call's).
    hedge_event& with_properties(properties_view p) noexcept {
        properties_ = p;
        return *this;
    }

private:
    int attempt_;
    hedge_reason reason_;
    const failure* error_;
    std::string_view name_;
    properties_view properties_{};
};

class hedge_delay;

namespace detail {
template <class D>
concept chrono_duration = std::same_as<D, std::chrono::duration<typename D::rep, typename D::period>>;

/// A delay schedule: called with the number of attempts already started, returns a duration.
/// `hedge_delay` itself is excluded first, so that asking whether it is one does not recurse
/// through its own copy constructor.
template <class F>
concept hedge_schedule =
    !std::same_as<F, hedge_delay> && std::copy_constructible<F> && std::invocable<const F&, int> &&
    chrono_duration<std::remove_cvref_t<std::invoke_result_t<const F&, int>>>;
} // namespace detail

/// How long a hedge waits for the attempts in flight before it starts another: one duration, or a
/// schedule called with the number of attempts already started (1 before the second attempt).
///
///     .delay = 300ms
///     .delay = [](int started) { return started == 1 ? 300ms : 1s; }
///
/// Zero starts the next attempt at once (every attempt together). `std::chrono::nanoseconds::max()`
/// (or a longer duration) means never: only a failure brings the next attempt (Polly's
/// `InfiniteHedgingDelay`). A schedule's negative answer counts as zero; a schedule must be callable
/// as `const` and safe to call concurrently, and what it throws ends the call that asked it.
class hedge_delay {
public:
    /// 2 seconds.
    hedge_delay() noexcept = default;
    // Implicit on purpose, so that `.delay = 300ms` and `.delay = [](int) {...}` read well.
    // A floating-point duration that is NaN or infinite is refused (`std::invalid_argument`), here
    // and when a schedule answers one (which ends the call that asked it).
    template <class Rep, class Period>
    hedge_delay(std::chrono::duration<Rep, Period> d)
        : fixed_(detail::finite_nanoseconds(d, "resilience::hedge: delay")) {}
    template <detail::hedge_schedule F>
    hedge_delay(F schedule)
        : schedule_([s = std::move(schedule)](int started) {
              return detail::finite_nanoseconds(s(started), "resilience::hedge: delay (from its schedule)");
          }) {}

    /// The wait after `started` attempts have started: never negative.
    [[nodiscard]] std::chrono::nanoseconds operator()(int started) const {
        if (!schedule_)
            return fixed_;
        const std::chrono::nanoseconds d = schedule_(started);
        return d < std::chrono::nanoseconds::zero() ? std::chrono::nanoseconds::zero() : d;
    }
    /// True when a schedule decides each wait.
    [[nodiscard]] bool is_schedule() const noexcept { return static_cast<bool>(schedule_); }
    /// The one duration (meaningful when `!is_schedule()`).
    [[nodiscard]] std::chrono::nanoseconds duration() const noexcept { return fixed_; }

private:
    std::chrono::nanoseconds fixed_ = std::chrono::seconds{2};
    std::function<std::chrono::nanoseconds(int)> schedule_;
};

/// How a `hedge` behaves. `hedge_options{}` sends a second attempt when the first has not answered
/// within 2 s, and a failed first attempt brings it forward.
///
/// A user callback (`delay` as a schedule, `should_handle`, `on_hedge`) that throws ends the call with
/// its exception as the call's failure, once every attempt in flight was stopped and has finished
/// (a budget token withdrawn stays withdrawn).
struct hedge_options {
    /// Carried by the errors this policy makes (`policy_name()`) and by `hedge_event`s. Empty: unnamed.
    std::string name{};
    /// Attempts in all, counting the first (Polly's `MaxHedgedAttempts` is the extra ones only:
    /// ours is that plus one). `1` never hedges. Must be at least 1.
    int max_attempts = 2;
    /// How long to wait for the attempts in flight before starting another (see `hedge_delay`).
    /// Must not be negative.
    hedge_delay delay{};
    /// Shared ceiling on extra attempts: each call records itself, each extra attempt withdraws a
    /// token first, and without one it does not start. The same budget may be given to a retry,
    /// so that retries and hedges draw from one ceiling.
    std::optional<retry_budget> budget{};
    /// Which outcomes of an attempt bring the next attempt forward at once instead of waiting out
    /// the delay (see `classifier`). An outcome it does not handle ends the call: a failure passes
    /// straight to the caller, a value is the answer. Empty: every failure but cancellation; values
    /// are answers, except an `expected_like` value holding an error. One `rs::classifier` may
    /// serve a retry's `should_handle` and this alike.
    classifier should_handle{};
    /// Called just before an extra attempt starts, with its number and why. Runs on the caller's
    /// event loop; must not block.
    std::function<void(const hedge_event&)> on_hedge{};
    /// Hears a `hedge` event for each extra attempt, and a `rejection` when `budget` refuses one.
    /// Empty: the listener of a `telemetry` stage around the call, if any (see telemetry.hpp).
    telemetry_listener telemetry{};
};

} // namespace resilience
