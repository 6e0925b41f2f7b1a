// SPDX-License-Identifier: MIT
/// \file hedge.hpp
/// `hedge`: starts another attempt while a slow one is still running, keeps the first success, and
/// stops and awaits the others.
#pragma once

#include "classifier.hpp"
#include "clock.hpp"
#include "concepts.hpp"
#include "context.hpp"
#include "detail/default_clock.hpp"
#include "detail/race.hpp"
#include "detail/time.hpp"
#include "error.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "retry_budget.hpp"
#include "task.hpp"
#include "telemetry_event.hpp"

#include <chrono>
#include <concepts>
#include <functional>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>

namespace resilience {

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

namespace detail {
template <class C, class Next, class O>
class hedge_race;
}

/// Sends the same work again when an attempt is slow, and keeps the first answer. A retry waits for
/// a failure, and a slow call is not one: waiting for it is how a p99 becomes a timeout.
///
/// - The first attempt starts at once. While no attempt has succeeded, another starts every
///   `delay` (measured from the last start), or at once when an attempt fails with an outcome
///   `should_handle` handles, up to `max_attempts` in all and while `budget` has a token for it.
/// - The first success wins. Every other attempt is asked to stop through its own stop token and
///   *awaited* before the call returns: no attempt outlives the call, so an action may safely
///   reference the caller's locals. The winner's token is never stopped.
/// - A failure `should_handle` does not handle (by default: a cancellation) ends the call with that
///   failure, after the others are stopped and awaited.
/// - If every attempt fails, the failure that came last is the call's failure, exactly as it was
///   (or the last value it handled: an outcome classifier's, or an `expected_like` error).
/// - A stop requested by the caller stops every attempt (each attempt's token is linked to the
///   caller's), starts no more, and, once they have finished, ends the call with the first value
///   one of them returned all the same, or else `cancelled_error` (never with what a stopped
///   attempt threw). A caller already stopped is refused without running the action.
///
/// Each attempt sees `ctx.attempt()` = 1, 2, ... (send each to another replica) and a stop token of
/// its own. Only hedge what is safe to run twice: reads, or writes an idempotency key makes safe.
///
/// Cost: one coroutine frame for the hedge and one per attempt (recycled: nothing is allocated
/// after warm-up), one timer armed and disarmed per call whose first attempt does not finish at
/// once, and no stop source unless an attempt asks for its token. `max_attempts` 1 runs the call
/// in the pipeline's own frame, like a plain call.
///
/// A stateless value; `C` serves every use of time. On a clock whose timers are an event loop's
/// the delay is a timer of the loop the call runs on; any other clock sleeps beside the attempts.
/// Attempts may finish on other threads: the hedge always carries on on the caller's loop. Called as
/// an lvalue, the hedge must outlive its calls; on an rvalue it is moved into the call:
///
///     rs::hedge h{{.max_attempts = 3, .delay = 200ms}};
///     auto v = co_await h.execute(read_replica);                             // OK: h outlives the call
///     rs::task<int> also_ok() { return rs::hedge{}.execute(read_replica); }  // OK: moved into the call
///     rs::task<int> bad(rs::hedge<> h) { return h.execute(read_replica); }   // dangling: h dies first
template <clock C = steady_clock>
class hedge : public policy_base<hedge<C>> {
public:
    hedge() : hedge(hedge_options{}) {}
    /// Validates `options`: a bad value throws `std::invalid_argument` naming the field and value.
    explicit hedge(hedge_options options, C clock = C{})
        : options_(std::move(options)), clock_(std::move(clock)) {
        const auto bad = [this](const std::string& what) {
            throw std::invalid_argument(detail::policy_label("hedge", options_.name) + ": " + what);
        };
        if (options_.max_attempts < 1)
            bad("max_attempts must be at least 1, got " + std::to_string(options_.max_attempts));
        if (!options_.delay.is_schedule() && options_.delay.duration() < std::chrono::nanoseconds::zero())
            bad("delay must not be negative, got " + std::to_string(options_.delay.duration().count()) +
                "ns");
    }

    [[nodiscard]] const hedge_options& options() const noexcept { return options_; }
    [[nodiscard]] const C& clock() const noexcept { return clock_; }
    /// The `name` option (empty when unnamed).
    [[nodiscard]] const std::string& name() const noexcept { return options_.name; }

    /// Whether a call through this hedge may sleep on the default clock: a second attempt may
    /// follow a delay longer than zero and not "never" (a schedule may give any delay; see
    /// `detail::default_clock_sleeper`).
    [[nodiscard]] detail::sleeper may_sleep_on_default_clock() const noexcept {
        if (!detail::is_default_clock(clock_) || options_.max_attempts < 2)
            return {};
        const hedge_delay& d = options_.delay;
        if (!d.is_schedule() && (d.duration() <= std::chrono::nanoseconds::zero() ||
                                 d.duration() == std::chrono::nanoseconds::max()))
            return {};
        return {"hedge", "its delay"};
    }

    // ---- the policy protocol (see policy.hpp) ----
    // Racing attempts need frames of their own, so a hedge that may hedge always waits (`run`);
    // with `max_attempts` 1 it admits the call in the pipeline's frame, as a retry of one attempt.
    struct call_state {
        context inner; // attempt 1, when the context coming in says otherwise
    };

    template <class R>
    step enter(call_state& s, const context& ctx, const context*& inner,
               std::optional<outcome<R>>& result) const {
        if (options_.max_attempts > 1)
            return step::wait;
        if (auto refused = admit<R>(ctx)) {
            result.emplace(std::move(*refused));
            return step::done;
        }
        if (ctx.attempt() != 1) {
            s.inner = detail::context_access::derive_attempt(ctx, 1);
            inner = &s.inner;
        }
        return step::proceed;
    }

    template <class R>
    step leave(call_state&, const context&, const outcome<R>&) const noexcept {
        return step::proceed;
    }

    /// The whole call: the race of attempts.
    template <class Next>
    task<detail::next_outcome_t<Next>> run(Next next, const context& ctx) const {
        using O = detail::next_outcome_t<Next>;
        if (auto refused = admit<typename O::value_type>(ctx))
            co_return O{std::move(*refused)};
        if (options_.max_attempts == 1) {
            const context first = detail::context_access::derive_attempt(ctx, 1);
            co_return co_await next(first);
        }
        detail::hedge_race<C, Next, O> race{options_, clock_, next, ctx};
        race.begin();
        while (race.busy()) {
            co_await race.wait();
            race.drain();
        }
        co_return race.finish();
    }

private:
    // Refuses a call the hedge cannot run; otherwise records it with the budget.
    template <class R>
    std::optional<failure> admit(const context& ctx) const {
        if (ctx.stop_requested())
            return failure::make(cancelled_error{options_.name});
        if (!options_.should_handle.template accepts<R>())
            return failure::make(std::invalid_argument(
                detail::policy_label("hedge", options_.name) + ": should_handle classifies rs::outcome<" +
                detail::type_name(*options_.should_handle.value_type()) + "> but the action returns " +
                detail::type_name(typeid(R))));
        if (options_.budget)
            options_.budget->record_call();
        return std::nullopt;
    }

    hedge_options options_;
    C clock_;
};

hedge() -> hedge<steady_clock>;
hedge(hedge_options) -> hedge<steady_clock>;
template <clock C>
hedge(hedge_options, C) -> hedge<C>;

} // namespace resilience

// The race behind the hedge (it includes this file first, so it compiles on its own).
#include "detail/hedge_race.hpp"
