// SPDX-License-Identifier: MIT
/// \file timeout.hpp
/// `timeout`: a structured deadline per call, reporting the outcome that really happened.
#pragma once

#include "clock.hpp"
#include "concepts.hpp"
#include "context.hpp"
#include "detail/config.hpp"
#include "detail/label.hpp"
#include "detail/time.hpp"
#include "engine/default_clock.hpp"
#include "error.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "policy_kit.hpp"
#include "stop_token.hpp"
#include "task.hpp"
#include "telemetry_event.hpp"
#include "when_all.hpp"

#include <atomic>
#include <chrono>
#include <coroutine>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace resilience::inline v0_2 {

namespace detail {

/// Between a timeout's attempt and its watcher on the generic path (see `timeout::run_beside`):
/// `done` is stopped once the attempt has finished, which wakes the watcher's sleep on the clock.
struct beside_join {
    pooled_stop_source done;
    // Null; the watcher's handle when it waits without the clock (its clock threw); or `&mark`
    // once the attempt has finished. Set to `&mark` before `done` is stopped.
    std::atomic<void*> waiter{nullptr};
    static inline char mark = 0;

    bool finished() const noexcept { return waiter.load(std::memory_order_acquire) == &mark; }

    // Called by the attempt once it has finished (its frame suspended for good): the watcher may
    // destroy it, and this object, as soon as it sees that, so everything here is done on copies.
    // Returns what to resume: the watcher when it was waiting without the clock.
    std::coroutine_handle<> attempt_finished() noexcept {
        stop_source stop = done.source(); // a copy: shares the stop state, outlives `*this`
        void* w = waiter.exchange(&mark, std::memory_order_acq_rel);
        stop.request_stop(); // the watcher's sleep on the clock ends, resumed where it slept
        return w ? std::coroutine_handle<>::from_address(w) : std::noop_coroutine();
    }

    /// The watcher's wait when it cannot sleep on the clock: resumed by the attempt, on its thread.
    struct last_resort {
        beside_join& join;
        bool await_ready() const noexcept { return join.finished(); }
        bool await_suspend(std::coroutine_handle<> h) noexcept {
            void* expected = nullptr;
            return join.waiter.compare_exchange_strong(expected, h.address(), std::memory_order_acq_rel);
        }
        void await_resume() const noexcept {}
    };
};

/// A timeout's attempt on the generic path: started by `start`, runs `next(ctx)` once, keeps its
/// outcome, and tells the `beside_join` when it has finished. Owns its frame.
template <class O>
class beside_attempt {
public:
    struct promise_type : recycled_frame {
        beside_join* join = nullptr;
        std::optional<O> result;

        beside_attempt get_return_object() noexcept {
            return beside_attempt{std::coroutine_handle<promise_type>::from_promise(*this)};
        }
        std::suspend_always initial_suspend() const noexcept { return {}; }
        struct final_awaiter {
            bool await_ready() const noexcept { return false; }
            std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
                return h.promise().join->attempt_finished();
            }
            void await_resume() const noexcept {}
        };
        final_awaiter final_suspend() const noexcept { return {}; }
        void return_value(O o) { result.emplace(std::move(o)); }
        void unhandled_exception() noexcept { result.emplace(failure::current()); }
    };

    beside_attempt(beside_attempt&& o) noexcept : h_(std::exchange(o.h_, {})) {}
    beside_attempt& operator=(beside_attempt&&) = delete;
    ~beside_attempt() {
        if (h_)
            h_.destroy();
    }

    /// Runs the attempt until its first suspension (or to its end).
    template <class Next>
    static beside_attempt start(Next next, const context& ctx, beside_join& join) {
        beside_attempt a = run(std::move(next), ctx);
        a.h_.promise().join = &join;
        a.h_.resume();
        return a;
    }
    /// The attempt's outcome; only once it has finished.
    O result() { return std::move(*h_.promise().result); }

private:
    explicit beside_attempt(std::coroutine_handle<promise_type> h) noexcept : h_(h) {}
    template <class Next>
    static beside_attempt run(Next next, const context& ctx) {
        co_return co_await next(ctx);
    }
    std::coroutine_handle<promise_type> h_;
};

} // namespace detail

/// What a timeout reports to `on_timeout`. Refers to the call's own outcome and to the timeout's
/// name: valid only during the callback; copy what you need to keep.
class timeout_event {
public:
    timeout_event(std::chrono::nanoseconds timeout, int attempt, const failure* error = nullptr,
                  std::string_view policy_name = {}) noexcept
        : timeout_(timeout), attempt_(attempt), error_(error), name_(policy_name) {}

    /// The timeout's length (`timeout_options::timeout`).
    [[nodiscard]] std::chrono::nanoseconds timeout() const noexcept { return timeout_; }
    /// The attempt that timed out, as the timeout saw it (`context::attempt()`).
    [[nodiscard]] int attempt() const noexcept { return attempt_; }
    /// The `timeout_error` the attempt ends with (its `cause()` is the failure the attempt ended
    /// with); null when a value came after the deadline anyway and is returned.
    [[nodiscard]] const failure* error() const noexcept { return error_; }
    /// The `name` option of the timeout that reports (empty when unnamed).
    [[nodiscard]] std::string_view policy_name() const noexcept { return name_; }

    /// What the caller set on the call's context (properties.hpp): a request id, a tenant.
    [[nodiscard]] properties_view properties() const noexcept { return properties_; }
    /// Sets what `properties()` returns (the reporting policy passes the call's).
    timeout_event& with_properties(properties_view p) noexcept {
        properties_ = p;
        return *this;
    }

private:
    std::chrono::nanoseconds timeout_;
    int attempt_;
    const failure* error_;
    std::string_view name_;
    properties_view properties_{};
};

/// How a `timeout` behaves. `timeout_options{}` gives each attempt 30 seconds, as Polly does.
///
/// A user callback (`on_timeout`, the `telemetry` listener) that throws ends the call with its
/// exception as the call's failure, in place of the `timeout_error`.
struct timeout_options {
    /// Carried by the errors this policy makes (`timeout_error`, and `cancelled_error` for a call
    /// stopped before it starts: `policy_name()`) and by `timeout_event`s; empty: unnamed.
    std::string name{};
    /// How long an attempt may run before it is asked to stop (Polly's `Timeout`). Positive.
    std::chrono::nanoseconds timeout = std::chrono::seconds{30};
    /// Called when an attempt timed out: once the attempt, asked to stop at the deadline, has
    /// ended (the timeout waits for it), before its `timeout_error` is returned. For an attempt
    /// that stops when asked, that is the deadline itself. Not called for a caller that stopped.
    /// Runs on the caller's coroutine; must not block.
    std::function<void(const timeout_event&)> on_timeout{};
    /// Hears a `timeout` event when an attempt ends after its deadline. Empty: the listener of a
    /// `telemetry` stage around it, if any (see telemetry.hpp).
    telemetry_listener telemetry{};
};

/// Gives each call it wraps its own deadline, structured and honest about the outcome:
/// - the wrapped call gets its own stop token (linked to the caller's) and `context::deadline()`;
/// - at the deadline that token is stopped, and the timeout then *waits for the call to finish*:
///   nothing it started outlives it, so the action may safely reference the caller's locals;
/// - a failure before the deadline is reported at once, unchanged;
/// - a failure after the deadline becomes `timeout_error`, with that failure as `cause()`;
/// - a value that arrives after the deadline anyway is returned, not thrown away;
/// - a stop requested by the caller is cancellation, never reported as a timeout.
/// An action that ignores its stop token therefore delays the caller past the deadline: the
/// timeout bounds the work only as far as the work listens. Stateless value; `C` serves every
/// use of time (see `clock`).
///
/// Inside a retry it bounds each attempt; outside, the whole retried operation:
///
///     rs::pipeline per_attempt{rs::retry{}, rs::timeout{2s}};
///     rs::pipeline overall{rs::timeout{10s}, rs::retry{}};
template <clock C = steady_clock>
class timeout : public policy_base<timeout<C>> {
public:
    /// 30 seconds, as Polly's default.
    timeout() : timeout(timeout_options{}) {}
    /// Validates `options`: a bad value throws `std::invalid_argument` naming the field and value.
    RESILIENCE_DETAIL_CONSTRUCTOR explicit timeout(timeout_options options, C clock = C{})
        : options_(std::move(options)), clock_(std::move(clock)) {
        if (options_.timeout <= std::chrono::nanoseconds::zero())
            throw std::invalid_argument(detail::policy_label("timeout", options_.name) +
                                        ": timeout must be positive, got " +
                                        std::to_string(options_.timeout.count()) + "ns");
    }
    /// A duration beyond what nanoseconds hold (about 292 years) is taken as that much: forever.
    /// A floating-point duration that is NaN or infinite is refused (`std::invalid_argument`).
    template <class Rep, class Period>
    explicit timeout(std::chrono::duration<Rep, Period> after, C clock = C{})
        : timeout(
              timeout_options{.timeout = detail::finite_nanoseconds(after, "resilience::timeout: timeout")},
              std::move(clock)) {}

    [[nodiscard]] const timeout_options& options() const noexcept { return options_; }
    /// How long an attempt may run. Kept for one version.
    [[deprecated("use options().timeout")]] [[nodiscard]] std::chrono::nanoseconds duration() const noexcept {
        return options_.timeout;
    }
    /// The `name` option (empty when unnamed).
    [[nodiscard]] const std::string& name() const noexcept { return options_.name; }
    [[nodiscard]] const C& clock() const noexcept { return clock_; }

    /// On the default clock, every call arms a timer there (see `detail::default_clock_sleeper`).
    [[nodiscard]] detail::sleeper may_sleep_on_default_clock() const noexcept {
        if (!detail::is_default_clock(clock_))
            return {};
        return {"timeout", "its timer"};
    }

    // ---- the policy protocol (see policy.hpp) ----
    // On a clock whose timers are an event loop's, the deadline is a timer armed in the call's own
    // frame, and the attempt's stop token is made only if somebody asks for it; inside an Asio call,
    // the timer of `steady_clock` and `coarse_steady_clock` is the call's home's. Any other clock
    // waits beside the call with a sleeping coroutine (`run_beside`: `run_waited` in a pipeline), and
    // so does one that only sometimes has loop timers (`any_clock`) when it has none. A pipeline
    // compiles that watch only for a timeout whose `enter` may wait.
    static constexpr bool enter_never_waits =
        detail::loop_timer_clock<C> &&
        (!detail::timer_loop_may_be_null<C> || detail::home_timers_when_loopless<C>);
    /// The attempt's stop and the timer that expires it are made together by `enter`, or not at
    /// all; `inner` then takes its token from `stop`, which says whether they were (rather than a
    /// flag beside each: every byte here is in every call's frame).
    struct call_state {
        call_state() noexcept {}
        call_state(const call_state&) = delete;
        call_state& operator=(const call_state&) = delete;
        ~call_state() {
            if (made()) {
                std::destroy_at(&timer);
                std::destroy_at(&stop);
            }
        }
        bool made() const noexcept { return detail::context_access::lazy_of(inner) == &stop; }

        union {
            detail::lazy_stop stop; // declared before the timer that expires it
        };
        union {
            detail::deadline_timer timer;
        };
        context inner;
    };

    // Inlined, so that a call makes one call here, to `arm`, as when it was all one function.
    template <class R>
    RESILIENCE_DETAIL_ALWAYS_INLINE entry enter(call_state& s, const context& ctx,
                                                std::optional<outcome<R>>& result) const {
        if constexpr (!detail::loop_timer_clock<C>) {
            return step::wait;
        } else {
            if (ctx.stop_requested()) [[unlikely]] {
                return kit::cancel(result, options_.name);
            }
            return arm(s, ctx);
        }
    }

private:
    // `enter` for a caller that has not stopped: arms the deadline's timer, whatever the result type.
    RESILIENCE_DETAIL_NOINLINE entry arm(call_state& s, const context& ctx) const
    requires detail::loop_timer_clock<C>
    {
        event_loop* const loop = clock_.timer_loop();
        detail::home_loop* foreign = nullptr;
        if (!loop) {
            // No loop timers after all: the timers of the call's home (an Asio call's), or
            // else the pipeline watches beside the call (`run_waited`). Never that for a clock of
            // `home_timers_when_loopless`, whose `timer_loop()` is null only in such a call.
            foreign = detail::foreign_timer_home(clock_);
            if (!foreign)
                return step::wait;
        }
        const auto deadline = std::chrono::duration_cast<std::chrono::nanoseconds>(
            detail::add_saturating(kit::call_now(clock_, ctx), options_.timeout).time_since_epoch());
        std::construct_at(&s.stop, &ctx);
        try {
            if (loop)
                std::construct_at(&s.timer, loop, deadline, s.stop);
            else
                std::construct_at(&s.timer, foreign, deadline, s.stop);
        } catch (...) {
            std::destroy_at(&s.stop);
            throw;
        }
        // From here `made()`: the state's destructor destroys both.
        detail::context_access::set_deadline(s.inner, ctx, &s.stop, deadline, detail::reading_key(clock_));
        return entry::proceed_in(s.inner);
    }

public:
    template <class R>
    step leave(call_state& s, const context& ctx, outcome<R>& result) const {
        if (!s.timer.try_disarm_here())
            return step::wait; // finished on another thread: disarm on the loop
        if (s.timer.expired())
            result = finish(std::move(result), true, ctx);
        return step::proceed;
    }

    template <class Next, class R>
    task<outcome<R>> resume(call_state& s, Next, const context& ctx, outcome<R> result) const {
        co_await s.timer.disarm();
        co_return finish(std::move(result), s.timer.expired(), ctx);
    }

    /// The waiting form, for clocks without loop timers: a sleeping coroutine beside the call.
    template <class Next>
    task<detail::next_outcome_t<Next>> run(Next next, const context& ctx) const {
        if constexpr (!detail::loop_timer_clock<C>)
            return run_beside(std::move(next), ctx);
        else if constexpr (enter_never_waits)
            return policy_base<timeout>::run(std::move(next), ctx);
        else if (clock_.timer_loop() || detail::foreign_timer_home(clock_))
            return policy_base<timeout>::run(std::move(next), ctx);
        else
            return run_beside(std::move(next), ctx);
    }

    /// What a pipeline runs once `enter` has answered `step::wait` (see `detail::runs_waited`): there
    /// was no timer to arm, so the watch beside the call, without `run`'s own drive for the case where
    /// there is one.
    template <class Next>
    task<detail::next_outcome_t<Next>> run_waited(Next next, const context& ctx) const {
        return run_beside(std::move(next), ctx);
    }

private:
    // The generic path. The attempt runs as a child coroutine; this coroutine waits in `watch`,
    // whose every wake-up is a sleep on the clock, and the clock resumes a sleeper where it slept
    // (see `clock`). The attempt, wherever it finishes, only wakes the watcher (by stopping its
    // sleep): so the caller always carries on on its own loop, never on the attempt's thread.
    template <class Next>
    task<detail::next_outcome_t<Next>> run_beside(Next next, const context& ctx) const {
        using result_type = detail::next_outcome_t<Next>;
        if (ctx.stop_requested())
            co_return detail::cancelled_failure(options_.name);
        beside_watch w{*this, ctx};
        auto attempt = detail::beside_attempt<result_type>::start(std::move(next), w.child, w.join);
        co_await watch(w); // returns once the attempt has finished
        co_return finish(attempt.result(), w.expired, ctx);
    }

    // What the generic path keeps beside its attempt, whatever the result type (made out of line, once
    // per clock): the deadline, the attempt's stop (linked to the caller's), its context, the join.
    struct beside_watch {
        RESILIENCE_DETAIL_NOINLINE RESILIENCE_DETAIL_CONSTRUCTOR beside_watch(const timeout& t,
                                                                              const context& ctx)
            : deadline(detail::add_saturating(t.clock_.now(), t.options_.timeout)),
              link(ctx.stop_token(), attempt_stop),
              child(ctx.with_stop_token(attempt_stop.get_token())
                        .with_deadline(
                            std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()),
                            t.clock_)) {}
        RESILIENCE_DETAIL_NOINLINE RESILIENCE_DETAIL_CONSTRUCTOR ~beside_watch() {}
        beside_watch(const beside_watch&) = delete;
        beside_watch& operator=(const beside_watch&) = delete;

        typename C::time_point deadline;
        detail::pooled_stop_source attempt_stop;
        detail::stop_link link;
        context child;
        detail::beside_join join;
        bool expired = false;
    };

    template <class Outcome>
    Outcome finish(Outcome result, bool expired, const context& ctx) const {
        if (!expired || ctx.stop_requested())
            return result;
        if (std::optional<failure> f = expire(result.has_failure() ? &result.error() : nullptr, ctx))
            result = Outcome{std::move(*f)};
        return result;
    }

    // An attempt that ran past the deadline and ended with `error` (null: a value), whatever the
    // result type: its failure becomes a `timeout_error`, then `on_timeout` and the listener are told;
    // what either throws is the call's result instead. Returns the failure the result becomes, if any.
    RESILIENCE_DETAIL_NOINLINE std::optional<failure> expire(const failure* error, const context& ctx) const {
        std::optional<failure> replaced;
        if (error)
            replaced.emplace(failure::make(timeout_error{options_.name, error->exception()}));
        const failure* const now = replaced ? &*replaced : error;
        if (std::optional<failure> thrown = kit::invoke_callback(
                options_.on_timeout,
                timeout_event{options_.timeout, ctx.attempt(), now, options_.name}.with_properties(
                    ctx.properties())))
            return thrown;
        if (const detail::listener_ref l = kit::listener_for(options_.telemetry, ctx)) {
            telemetry_event e = detail::event(telemetry_kind::timeout, "timeout", options_.name,
                                              ctx.attempt(), options_.timeout, now);
            if (std::optional<failure> thrown = detail::emit_caught(l, clock_, std::move(e)))
                return thrown;
        }
        return replaced;
    }

    // Sleeps until the deadline unless the attempt finishes first; at the deadline, stops it and
    // sleeps on until it has finished. Returns only once the attempt has finished. A clock whose
    // sleep throws cannot time the attempt: the attempt is left to finish, waited for without the
    // clock, and the clock's exception is the call's.
    RESILIENCE_DETAIL_CONSTRUCTOR task<void> watch(beside_watch& w) const {
        std::exception_ptr clock_failed;
        const stop_token finished = w.join.done.get_token();
        if (!w.join.finished()) {
            try {
                co_await clock_.sleep_until(w.deadline, finished);
                if (!w.join.finished()) {
                    w.expired = true;
                    w.attempt_stop.request_stop();
                    co_await clock_.sleep_until(C::time_point::max(), finished);
                }
            } catch (...) {
                clock_failed = std::current_exception();
            }
        }
        // The sleeps end early only once the attempt has finished; this is for a clock that threw.
        if (!w.join.finished())
            co_await detail::beside_join::last_resort{w.join};
        if (clock_failed)
            std::rethrow_exception(clock_failed);
    }

    timeout_options options_;
    C clock_;
};

template <class Rep, class Period>
timeout(std::chrono::duration<Rep, Period>) -> timeout<steady_clock>;
template <class Rep, class Period, clock C>
timeout(std::chrono::duration<Rep, Period>, C) -> timeout<C>;
timeout() -> timeout<steady_clock>;
timeout(timeout_options) -> timeout<steady_clock>;
template <clock C>
timeout(timeout_options, C) -> timeout<C>;

} // namespace resilience

// The compiled mode instantiates these once, in resilience::compiled: declared `extern template` in a
// user's file, defined in the library's (detail/config.hpp, RESILIENCE_INSTANTIATE).
#if RESILIENCE_EXTERN_TEMPLATES
namespace resilience::inline v0_2 {
RESILIENCE_INSTANTIATE class timeout<steady_clock>;
} // namespace resilience
#endif
