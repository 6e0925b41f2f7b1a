// SPDX-License-Identifier: MIT
/// \file retry.hpp
/// `retry`: runs an action again after a failure (or a rejected value), waiting out a backoff between tries.
#pragma once

#include "backoff.hpp"
#include "classifier.hpp"
#include "clock.hpp"
#include "concepts.hpp"
#include "context.hpp"
#include "detail/config.hpp"
#include "detail/time.hpp"
#include "engine/default_clock.hpp"
#include "engine/frame_sleep.hpp"
#include "error.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "policy_kit.hpp"
#include "random.hpp"
#include "retry_budget.hpp"
#include "task.hpp"
#include "telemetry_event.hpp"

#include <algorithm>
#include <chrono>
#include <concepts>
#include <coroutine>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>

namespace resilience::inline v0_2 {

/// The name `classifier` had before it served every policy. Kept for one version.
using retry_classifier [[deprecated("use rs::classifier")]] = classifier;

/// What a retry reports to `on_retry` and `on_budget_exhausted`. Refers to the call's own
/// outcome and to the retry's name: valid only during the callback; copy what you need to keep.
class retry_event {
public:
    retry_event(int attempt, const failure* error, std::chrono::nanoseconds delay,
                const void* value = nullptr, const std::type_info* value_type = nullptr,
                std::string_view policy_name = {}) noexcept
        : attempt_(attempt), error_(error), delay_(delay), value_(value, value_type), name_(policy_name) {}
    /// The event of an attempt whose outcome holds `value` (what the retry itself makes).
    retry_event(int attempt, const failure* error, std::chrono::nanoseconds delay, detail::value_view value,
                std::string_view policy_name) noexcept
        : attempt_(attempt), error_(error), delay_(delay), value_(value), name_(policy_name) {}

    /// The attempt that just ended (1-based).
    [[nodiscard]] int attempt() const noexcept { return attempt_; }
    /// Its failure; null when it returned a value the classifier handled (see `value<T>()`).
    [[nodiscard]] const failure* error() const noexcept { return error_; }
    /// The wait before the next attempt (`on_retry`); zero for `on_budget_exhausted`, where no
    /// attempt follows.
    [[nodiscard]] std::chrono::nanoseconds delay() const noexcept { return delay_; }
    /// The value the attempt returned, if it returned one of type `T`; otherwise null.
    template <class T>
    [[nodiscard]] const T* value() const noexcept {
        return value_.template get<T>();
    }
    /// The `name` option of the retry that reports (empty when unnamed).
    [[nodiscard]] std::string_view policy_name() const noexcept { return name_; }

    /// What the caller set on the call's context (properties.hpp): a request id, a tenant.
    [[nodiscard]] properties_view properties() const noexcept { return properties_; }
    /// Sets what `properties()` returns (the reporting policy passes the call's).
    retry_event& with_properties(properties_view p) noexcept {
        properties_ = p;
        return *this;
    }

private:
    int attempt_;
    const failure* error_;
    std::chrono::nanoseconds delay_;
    detail::value_view value_;
    std::string_view name_;
    properties_view properties_{};
};

/// How a `retry` behaves. Every field has a usable default: `retry_options{}` retries transient
/// failures three times in all, on an exponential backoff.
///
/// A user callback (`should_handle`, `on_retry`, `on_budget_exhausted`) that throws ends the call
/// with its exception as the call's failure, after the retry's own bookkeeping (a budget token
/// withdrawn stays withdrawn); `execute_outcome` returns it, `execute` throws it.
struct retry_options {
    /// Names this retry in the errors it makes (`error::policy_name()`), in `retry_event`s and in
    /// its messages. Empty: unnamed.
    std::string name{};
    /// Attempts in all, counting the first: `1` never retries. Must be at least 1.
    int max_attempts = 3;
    /// The wait before each retry. Default: `exponential_backoff{}` = 200ms, x2, capped at 30s,
    /// full jitter. Validated when assigned (see `backoff`).
    resilience::backoff backoff{};
    /// No attempt is started once the wait before it would carry the call past this, measured
    /// from the start of the first attempt. Zero: unbounded. Must not be negative.
    std::chrono::nanoseconds max_elapsed{};
    /// Inside a call with a deadline (an enclosing `timeout`'s, `context::deadline_for(clock)`), no
    /// attempt is started that would have less than this left before the deadline: the loop ends
    /// when `now + wait + min_attempt_time > deadline`, as it does for `max_elapsed`. Zero (the
    /// default): it ends only when the wait itself would end past the deadline. A deadline set on
    /// another clock type cannot be compared with this clock's time and is not applied. Must not be
    /// negative.
    std::chrono::nanoseconds min_attempt_time{};
    /// Cap on every wait, the backoff's and a verdict's `delay` alike (a server asking for an hour
    /// does not park the caller for an hour). Zero: no wait at all. Must not be negative.
    std::chrono::nanoseconds max_delay = std::chrono::seconds{30};
    /// Shared ceiling on retries: each call records itself, each retry withdraws a token first,
    /// and without one the loop ends.
    std::optional<retry_budget> budget{};
    /// Which outcomes to retry (see `classifier`); a `verdict` may set the wait. Cancellation is
    /// never retried, whatever it says. Empty: `is_transient` failures; values succeed, except an
    /// `expected_like` value holding an error, which is retried.
    classifier should_handle{};
    /// Called before each wait. Runs on the caller's coroutine; must not block.
    std::function<void(const retry_event&)> on_retry{};
    /// Called when `budget` refused a retry the classifier wanted; the last outcome is then returned.
    std::function<void(const retry_event&)> on_budget_exhausted{};
    /// Hears this retry's `attempt` and `retry` events, and a `rejection` from `budget`. Empty: the
    /// listener of a `telemetry` stage around it, if any (see telemetry.hpp).
    telemetry_listener telemetry{};
};

/// Runs an action again after a failure, waiting out a backoff in between, until it succeeds or
/// one of these ends the loop:
/// - `max_attempts` attempts were made;
/// - `should_handle` said no (cancellation is never retried);
/// - `budget` had no token left (`on_budget_exhausted` is told);
/// - the wait before the next attempt would carry the call past `max_elapsed`;
/// - the wait and `min_attempt_time` would carry the next attempt past the call's deadline (set by
///   a `timeout` around the retry, on a clock of the retry's clock type);
/// - the caller asked to stop: at once, also in the middle of a backoff wait.
/// Whatever ended it but a caller's stop, the last outcome is what the call produces: the last
/// failure exactly as it was (the same exception object), or the last value it handled (an outcome
/// classifier's, or an `expected_like` value holding an error: returned with its error unchanged,
/// nothing thrown). A call its caller stopped ends with the value its last attempt returned, or
/// with `cancelled_error` (made where the call ends: docs/core.md, "A call its caller stopped").
/// A stop requested before the first attempt yields `cancelled_error` without calling the action.
///
/// Each attempt sees `ctx.with_attempt(n)` (n = 1, 2, ...). The success path calls no
/// `std::function`, touches no type-erased object and allocates nothing; the backoff, the
/// classifier and the callbacks are consulted only after an attempt failed (an outcome
/// classifier, which judges values, is the one exception: it is asked about successes too). The
/// classifier judges the last attempt as well, for its `attempt` event's `handled`.
/// Decorrelated jitter needs the previous wait of the same call: the retry keeps it in the
/// call's own frame, so one retry serves any number of concurrent calls.
///
/// A stateless value, copied freely, except for its random source `Random`: the default
/// `thread_random` is safe to share across threads, but a retry given a stateful generator
/// (`seeded_random`) mutates it on every jittered wait and must not be used from two threads
/// at once. `C` serves every use of time. A retry called as an lvalue must outlive the calls made
/// through it; called on an rvalue it is moved into the call:
///
///     rs::retry r{{.max_attempts = 3}};
///     int v = co_await r.execute(fetch);                              // OK: r outlives the call
///     rs::task<int> also_ok() { return rs::retry{}.execute(fetch); }  // OK: moved into the call
///     rs::task<int> bad(rs::retry<> r) { return r.execute(fetch); }   // dangling: r dies first
template <clock C = steady_clock, random_source Random = thread_random>
class retry : public policy_base<retry<C, Random>> {
public:
    retry() : retry(retry_options{}) {}
    /// Validates `options`: a bad value throws `std::invalid_argument` naming the field and value.
    RESILIENCE_DETAIL_CONSTRUCTOR explicit retry(retry_options options, C clock = C{}, Random rng = Random{})
        : options_(std::move(options)), clock_(std::move(clock)), rng_(std::move(rng)) {
        const auto bad = [this](const std::string& what) {
            throw std::invalid_argument(detail::policy_label("retry", options_.name) + ": " + what);
        };
        if (options_.max_attempts < 1)
            bad("max_attempts must be at least 1, got " + std::to_string(options_.max_attempts));
        if (options_.max_elapsed < std::chrono::nanoseconds::zero())
            bad("max_elapsed must not be negative, got " + std::to_string(options_.max_elapsed.count()) +
                "ns");
        if (options_.max_delay < std::chrono::nanoseconds::zero())
            bad("max_delay must not be negative, got " + std::to_string(options_.max_delay.count()) + "ns");
        if (options_.min_attempt_time < std::chrono::nanoseconds::zero())
            bad("min_attempt_time must not be negative, got " +
                std::to_string(options_.min_attempt_time.count()) + "ns");
    }

    [[nodiscard]] const retry_options& options() const noexcept { return options_; }
    [[nodiscard]] const C& clock() const noexcept { return clock_; }
    /// The `name` option (empty when unnamed).
    [[nodiscard]] const std::string& name() const noexcept { return options_.name; }

    /// Whether a call through this retry may sleep on the default clock: a second attempt may
    /// follow a wait longer than zero (a backoff that can give one, or a classifier answering
    /// `verdict`s, whose `delay` sets the wait), under `max_delay` above zero (see
    /// `detail::default_clock_sleeper`).
    [[nodiscard]] detail::sleeper may_sleep_on_default_clock() const noexcept {
        if (!detail::is_default_clock(clock_) || options_.max_attempts < 2 ||
            options_.max_delay <= std::chrono::nanoseconds::zero() ||
            !(options_.backoff.may_wait() || options_.should_handle.may_set_delay()))
            return {};
        return {"retry", "its backoff"};
    }

    // ---- the policy protocol (see policy.hpp) ----
    static constexpr bool enter_never_waits = true;
    /// The call's progress through its attempts, in the pipeline's frame.
    struct call_state {
        context
            inner; // the attempt's: attempt 1's when the context coming in says otherwise, then each retry's
        typename C::time_point start{}; // when the call reached the retry (max_elapsed, a listener)
        typename C::time_point begun{}; // when the attempt under way began (a listener)
        // The wait before the attempt under way: written before it is read (from the second attempt
        // on), so left uninitialised on every call's path.
        std::chrono::nanoseconds previous;
        // The attempt under way: `inner`'s number (a default context's is 1).
        int attempt() const noexcept { return inner.attempt(); }
        // When the attempt under way began: the first at the call's start.
        typename C::time_point began() const noexcept { return attempt() == 1 ? start : begun; }
    };

    template <class R>
    entry enter(call_state& s, const context& ctx, std::optional<outcome<R>>& result) const {
        if (ctx.stop_requested() || !options_.should_handle.template accepts<R>()) [[unlikely]]
            return refuse(result);
        // Only max_elapsed and a listener (the first attempt's length) need the start. Read before the
        // budget counts the call: a clock that throws refuses it (see engine/driver.hpp, `entered`).
        if (options_.max_elapsed > std::chrono::nanoseconds::zero() ||
            kit::listener_for(options_.telemetry, ctx))
            s.start = kit::call_now(clock_, ctx);
        if (options_.budget)
            options_.budget->record_call();
        if (ctx.attempt() != 1) {
            s.inner = detail::context_access::derive_attempt(ctx, 1);
            return entry::proceed_in(s.inner);
        }
        return step::proceed;
    }

    /// Once per attempt: a success that nobody needs to judge ends here; anything else goes on in
    /// `again`. Inlined: in a pipeline of five, g++ would call it out of line (13 instructions a call).
    template <class R>
    RESILIENCE_DETAIL_ALWAYS_INLINE step leave(call_state& s, const context& ctx,
                                               outcome<R>& result) const noexcept {
        if (!options_.should_handle.plain_success(result))
            return step::wait; // judged, then reported, in `again`
        if (const detail::listener_ref l = kit::listener_for(options_.telemetry, ctx)) [[unlikely]]
            report_attempt(l, s.began(), s.attempt(), false,
                           result); // a listener that throws ends the call as well
        return step::proceed;
    }

    /// After an attempt that `leave` did not let through: judges and reports it, then decides.
    /// `step::done`: the call ends with `result`. Otherwise another attempt, in the attempt's context
    /// kept in `s`: at once (`step::proceed`), or after the backoff, awaited in `frame_wait`
    /// (`step::wait`). The pipeline runs the stages inside the retry again, in the call's frame.
    template <class R>
    RESILIENCE_DETAIL_NOINLINE entry again(call_state& s, const context& ctx, outcome<R>& result) const {
        const detail::listener_ref listener = kit::listener_for(options_.telemetry, ctx);
        // Judged before the attempt is reported, so that its event says whether it was handled.
        std::optional<failure> thrown; // by the classifier: it ends the call
        const verdict v = judge_catching(result, ctx, thrown);
        if (listener && !report_attempt(listener, s.began(), s.attempt(), v.handle, result))
            return step::done; // the listener threw: that ends the call
        const entry e = thrown ? entry{step::done}
                               : decide(v, result.has_failure() ? &result.error() : nullptr,
                                        detail::value_view::of(result), s, ctx, listener, thrown);
        if (thrown) // by the classifier, or by the backoff's planning in `decide`
            result = outcome<R>{std::move(*thrown)};
        return e;
    }

    /// The backoff before the next attempt, awaited in the pipeline's frame (in a block of the frame
    /// cache, taken only by a call that backs off): `step::proceed` when it has passed, `step::done`
    /// when the caller stopped during it (the call ends with the last attempt's result). It keeps
    /// only the sleep: `await_resume` is given the retry and the call's state.
    template <class R>
    class frame_wait {
    public:
        frame_wait(const retry& r, call_state& s, const context& ctx, std::optional<outcome<R>>&)
            : sleep_(r.clock_, r.after(s.previous), ctx.stop_token()) {}
        frame_wait(const frame_wait&) = delete;
        frame_wait& operator=(const frame_wait&) = delete;

        bool await_ready() { return sleep_.await_ready(); }
        template <class Promise>
        auto await_suspend(std::coroutine_handle<Promise> h) {
            return sleep_.await_suspend(h);
        }
        step await_resume(const retry& r, call_state& s, const context&, std::optional<outcome<R>>&) {
            sleep_.await_resume();
            // The next attempt's context is derived from the call's: the same stop, the same listener.
            return r.start_attempt(s, kit::listener_for(r.options_.telemetry, s.inner));
        }

    private:
        detail::frame_sleep<C> sleep_;
    };

private:
    // `again` once the attempt is judged `v` (and reported), whatever the result type: the result as its
    // failure (`error`, null for a value) and a view of its value. What the backoff's planning throws
    // goes into `thrown`: the call ends with it.
    RESILIENCE_DETAIL_NOINLINE RESILIENCE_DETAIL_CONSTRUCTOR entry
    decide(const verdict& v, const failure* error, const detail::value_view& value, call_state& s,
           const context& ctx, const detail::listener_ref& listener, std::optional<failure>& thrown) const {
        // The stop is looked at again: the classifier may have stopped the caller.
        if (!v.handle || ctx.stop_requested() || s.attempt() >= options_.max_attempts)
            return step::done;
        std::optional<std::chrono::nanoseconds> wait;
        try {
            wait = plan(error, value, v, s, ctx);
        } catch (...) {
            thrown.emplace(failure::current());
            return step::done;
        }
        if (!wait)
            return step::done;
        s.previous = *wait;
        s.inner = detail::context_access::derive_attempt(ctx, s.attempt() + 1);
        if (*wait > std::chrono::nanoseconds::zero())
            return entry::wait_then_in(s.inner);
        if (start_attempt(s, listener) == step::done)
            return step::done;
        return entry::proceed_in(s.inner);
    }

    // The next attempt (`s.inner`) starts now, unless the caller stopped (`step::done`); a listener
    // gets the time it began.
    step start_attempt(call_state& s, const detail::listener_ref& listener) const {
        if (s.inner.stop_requested())
            return step::done;
        if (listener)
            s.begun = clock_.now();
        return step::proceed;
    }
    // A stopped caller, or an outcome classifier for another result type: refused before the first
    // attempt. Out of line, so that `enter` stays small enough to be inlined into the call's frame.
    template <class R>
    RESILIENCE_DETAIL_NOINLINE step refuse(std::optional<outcome<R>>& result) const {
        result.emplace(
            detail::refused_before_admission(&options_.should_handle, typeid(R), "retry", options_.name));
        return step::done;
    }

    // Out of line, so that `leave` stays small enough to be inlined into the call's frame.
    template <class R>
    RESILIENCE_DETAIL_NOINLINE bool report_attempt(detail::listener_ref l, typename C::time_point begun,
                                                   int attempt, bool handled,
                                                   outcome<R>& result) const noexcept {
        telemetry_event e = detail::event(telemetry_kind::attempt, "retry", name(), attempt);
        e.handled = handled;
        return detail::report_ended(l, clock_, begun, e, result);
    }

    // The classifier's verdict on an attempt's outcome, asked of every attempt, the last one too.
    // Cancellation is the caller giving up, never the dependency failing: never handled, and the
    // classifier is not even asked; nor about an attempt whose caller has stopped.
    template <class T>
    verdict judge(const outcome<T>& result, const context& ctx) const {
        if (ctx.stop_requested() || (result.has_failure() && is_cancellation(result.error())))
            return {};
        return options_.should_handle.classify(result, &is_transient, &ctx);
    }

    // `judge`, with what it throws kept in `thrown` (the verdict is then empty).
    template <class T>
    verdict judge_catching(const outcome<T>& result, const context& ctx,
                           std::optional<failure>& thrown) const {
        try {
            return judge(result, ctx);
        } catch (...) {
            thrown.emplace(failure::current());
            return {};
        }
    }

    // The failure path, for an attempt the classifier judged `v` to be handled, with attempts left:
    // decides whether another attempt follows, and after what wait (nullopt: the loop ends with the
    // attempt's result). Tells the callbacks. Whatever the result type: the result as its failure
    // (`error`, null for a value) and a view of its value.
    RESILIENCE_DETAIL_NOINLINE std::optional<std::chrono::nanoseconds>
    plan(const failure* error, const detail::value_view& value, const verdict& v, const call_state& s,
         const context& ctx) const {
        const int attempt = s.attempt();
        const typename C::time_point start = s.start;
        const std::chrono::nanoseconds previous =
            attempt == 1 ? std::chrono::nanoseconds::zero() : s.previous;

        const std::chrono::nanoseconds wanted =
            v.delay ? *v.delay : options_.backoff.delay(attempt, rng_, error ? *error : failure{}, previous);
        const std::chrono::nanoseconds delay =
            std::clamp(wanted, std::chrono::nanoseconds::zero(), options_.max_delay);
        const std::optional<std::chrono::nanoseconds> deadline = ctx.deadline_for(clock_);
        if (options_.max_elapsed > std::chrono::nanoseconds::zero() || deadline) {
            const typename C::time_point now = clock_.now(); // one reading serves both
            if (options_.max_elapsed > std::chrono::nanoseconds::zero() &&
                delay >
                    options_.max_elapsed - std::chrono::duration_cast<std::chrono::nanoseconds>(now - start))
                return std::nullopt;
            if (deadline && !fits_before(*deadline, detail::since_epoch(now), delay))
                return std::nullopt;
        }
        if (options_.budget && !options_.budget->try_withdraw()) {
            if (options_.on_budget_exhausted)
                options_.on_budget_exhausted(
                    retry_event{attempt, error, std::chrono::nanoseconds::zero(), value, options_.name}
                        .with_properties(ctx.properties()));
            telemetry_event refused =
                detail::event(telemetry_kind::rejection, "retry_budget", options_.name, attempt, {}, error);
            refused.handled = true;
            detail::emit(options_.telemetry, ctx, clock_, refused);
            return std::nullopt;
        }
        if (options_.on_retry)
            options_.on_retry(
                retry_event{attempt, error, delay, value, options_.name}.with_properties(ctx.properties()));
        telemetry_event retrying =
            detail::event(telemetry_kind::retry, "retry", options_.name, attempt, delay, error);
        retrying.handled = true;
        detail::emit(options_.telemetry, ctx, clock_, retrying);
        return delay;
    }

    // Does `now + delay + min_attempt_time <= deadline` hold? Without overflowing: `delay` and
    // `min_attempt_time` are not negative, and a deadline already past leaves no time at all.
    bool fits_before(std::chrono::nanoseconds deadline, std::chrono::nanoseconds now,
                     std::chrono::nanoseconds delay) const noexcept {
        if (deadline < now)
            return false;
        const std::chrono::nanoseconds left =
            now < std::chrono::nanoseconds::zero() && deadline > std::chrono::nanoseconds::max() + now
                ? std::chrono::nanoseconds::max()
                : deadline - now;
        return delay <= left && options_.min_attempt_time <= left - delay;
    }

    // now + d on the clock, rounded up to its tick, saturating at the clock's end.
    typename C::time_point after(std::chrono::nanoseconds d) const {
        return detail::add_saturating(clock_.now(), d);
    }

    retry_options options_;
    C clock_;
    mutable Random rng_; // jitter draws on the failure path of a const `run`
};

retry() -> retry<steady_clock, thread_random>;
retry(retry_options) -> retry<steady_clock, thread_random>;
template <clock C>
retry(retry_options, C) -> retry<C, thread_random>;
template <clock C, random_source R>
retry(retry_options, C, R) -> retry<C, R>;

} // namespace resilience

// The compiled mode instantiates these once, in resilience::compiled: declared `extern template` in a
// user's file, defined in the library's (detail/config.hpp, RESILIENCE_INSTANTIATE).
#if RESILIENCE_EXTERN_TEMPLATES
namespace resilience::inline v0_2 {
RESILIENCE_INSTANTIATE class retry<steady_clock, thread_random>;
} // namespace resilience
#endif
