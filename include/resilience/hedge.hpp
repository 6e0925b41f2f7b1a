// SPDX-License-Identifier: MIT
/// \file hedge.hpp
/// `hedge`: starts another attempt while a slow one is still running, keeps the first success, and
/// stops and awaits the others.
#pragma once

#include "classifier.hpp"
#include "clock.hpp"
#include "concepts.hpp"
#include "context.hpp"
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

private:
    int attempt_;
    hedge_reason reason_;
    const failure* error_;
    std::string_view name_;
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
///   caller's), starts no more, and ends the call as `cancelled_error` once they have finished.
///   A caller already stopped is refused without running the action.
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

namespace detail {

/// One hedged call, kept in the frame of `hedge::run`: the attempts racing, the delay's timer, and
/// the decisions. Only the hedge's coroutine touches it; attempts and the timer reach it through
/// the inbox alone (see `race.hpp`), whatever thread they finish on.
template <class C, class Next, class O>
class hedge_race {
    using child = race_child<O>;
    using promise = typename child::promise_type;

public:
    hedge_race(const hedge_options& o, const C& clock, const Next& next, const context& ctx) noexcept
        : o_(o), clock_(clock), next_(next), ctx_(ctx), inbox_(event_loop::current()),
          home_(event_loop::current()) {
        timer_event_.what = race_node::kind::timer;
    }
    hedge_race(const hedge_race&) = delete;
    hedge_race& operator=(const hedge_race&) = delete;
    /// Normally everything has finished by now. Reached with attempts pending only when the call's
    /// frame is destroyed unfinished (its event loop torn down): they go with it, as `when_all`'s do.
    ~hedge_race() {
        if (node_.armed())
            loop_access::remove_timer(*timers_, &node_);
        while (children_) {
            promise* p = children_;
            children_ = p->next_child;
            std::coroutine_handle<promise>::from_promise(*p).destroy();
        }
    }

    void begin() {
        start(hedge_reason::delay, nullptr); // attempt 1: nothing user-made runs before it
        settle();
    }
    /// True while an attempt or a sleeper has not finished.
    [[nodiscard]] bool busy() const noexcept { return children_ != nullptr; }
    auto wait() noexcept { return inbox_.wait(); }

    /// Handles what was delivered, in the order it came, then arms what comes next.
    void drain() {
        for (race_node* n = inbox_.take(); n;) {
            race_node* next = n->next_event; // read first: handling a child destroys it
            switch (n->what) {
            case race_node::kind::attempt:
                attempt_ended(static_cast<promise&>(*n));
                break;
            case race_node::kind::sleeper:
                sleeper_ended(static_cast<promise&>(*n));
                break;
            case race_node::kind::timer:
                if (fired_generation_ == generation_)
                    delay_passed();
                break;
            }
            n = next;
        }
        settle();
    }

    O finish() {
        if (cancelled_)
            return O{failure::make(cancelled_error{o_.name})};
        if (final_)
            return std::move(*final_);
        return std::move(*last_);
    }

private:
    // ---- decisions ----

    void attempt_ended(promise& p) {
        O result = std::move(*p.result);
        destroy(p);
        --in_flight_;
        if (ending_)
            return; // decided already: a loser's outcome is dropped
        if (ctx_.stop_requested()) {
            cancel();
            return;
        }
        if (o_.should_handle.plain_success(result)) {
            end_with(std::move(result)); // the first success wins
            return;
        }
        bool handled = false;
        try {
            handled = o_.should_handle
                          .classify(result, [](const failure& f) noexcept { return !is_cancellation(f); })
                          .handle;
        } catch (...) {
            end_with(O{failure::current()});
            return;
        }
        if (!handled) {
            end_with(std::move(result)); // a success, or a failure that passes straight to the caller
            return;
        }
        last_.emplace(std::move(result));
        if (may_start()) {
            disarm();
            guarded_start(hedge_reason::failure, last_->has_failure() ? &last_->error() : nullptr);
        }
    }

    void delay_passed() {
        if (!armed_)
            return; // disarmed after it fired (a failure started the next attempt first)
        armed_ = false;
        if (ending_)
            return;
        if (ctx_.stop_requested()) {
            cancel();
            return;
        }
        if (may_start())
            guarded_start(hedge_reason::delay, nullptr);
    }

    void sleeper_ended(promise& p) {
        const bool fired = p.fired && p.generation == generation_;
        std::optional<O> thrown = std::move(p.result);
        destroy(p);
        if (thrown) {
            if (!ending_)
                end_with(std::move(*thrown));
        } else if (fired) {
            delay_passed();
        } else if (!ending_ && ctx_.stop_requested()) {
            cancel();
        }
    }

    // After every batch: arms the delay for the next attempt (starting it at once when the delay is
    // zero), and ends the call when no attempt is left to wait for.
    void settle() {
        // Whatever already came (an attempt that finished at once) is heard before anything is armed
        // or started: it may have been the answer.
        while (!inbox_.pending() && !armed_ && may_start()) {
            if (ctx_.stop_requested()) {
                cancel();
                break;
            }
            std::chrono::nanoseconds d{};
            try {
                d = o_.delay(started_);
            } catch (...) {
                end_with(O{failure::current()});
                break;
            }
            if (d == std::chrono::nanoseconds::max())
                break; // only a failure brings the next attempt
            if (d > std::chrono::nanoseconds::zero()) {
                arm(d);
                break;
            }
            if (!guarded_start(hedge_reason::delay, nullptr))
                break;
        }
        if (!ending_ && in_flight_ == 0 && !inbox_.pending()) {
            // Every attempt failed and none may follow: the last failure is the answer.
            ending_ = true;
            disarm();
        }
    }

    [[nodiscard]] bool may_start() const noexcept {
        return !ending_ && !closed_ && started_ < o_.max_attempts;
    }

    void end_with(O outcome) {
        final_.emplace(std::move(outcome));
        stop_all();
    }
    void cancel() {
        cancelled_ = true;
        stop_all();
    }
    // Stops every attempt still running and the timer; they are awaited before the call returns.
    void stop_all() {
        ending_ = true;
        disarm();
        for (promise* p = children_; p; p = p->next_child)
            if (p->number > 0)
                request_stop(*p);
    }
    static void request_stop(promise& p) noexcept {
        std::stop_source s = p.stop->expire();
        if (s.stop_possible())
            s.request_stop(); // may finish the attempt inline: it then delivers itself, and stays
    }

    // ---- attempts ----

    bool guarded_start(hedge_reason why, const failure* cause) {
        try {
            return start(why, cause);
        } catch (...) {
            end_with(O{failure::current()});
            return false;
        }
    }

    // Starts attempt `started_ + 1`; an extra one only with a budget token. False when refused, or
    // when the caller's token was stopped since the caller of this looked (by a `should_handle`, an
    // `on_hedge` or a listener, or from another thread): a stopped call starts no more attempts.
    bool start(hedge_reason why, const failure* cause) {
        const int n = started_ + 1;
        if (n > 1) {
            if (ctx_.stop_requested()) {
                cancel();
                return false;
            }
            if (o_.budget && !o_.budget->try_withdraw()) {
                closed_ = true; // no token now: no more extra attempts in this call
                emit(o_.telemetry, ctx_, clock_,
                     event(telemetry_kind::rejection, "retry_budget", o_.name, n, {}, cause));
                return false;
            }
            if (o_.on_hedge)
                o_.on_hedge(hedge_event{n, why, cause, o_.name});
            if (const telemetry_listener* l = listener_for(o_.telemetry, ctx_)) // asks `delay` only then
                emit(l, clock_,
                     event(telemetry_kind::hedge, "hedge", o_.name, n,
                           why == hedge_reason::delay ? o_.delay(started_) : std::chrono::nanoseconds{},
                           cause));
            if (ctx_.stop_requested()) { // stopped by one of the two just above
                cancel();
                return false;
            }
        }
        promise& p = adopt(attempt(next_), n);
        ++started_;
        ++in_flight_;
        std::coroutine_handle<promise>::from_promise(p).resume();
        return true;
    }

    static child attempt(const Next& next) {
        promise& self = co_await typename child::own_promise{};
        const context ctx = context_access::derive_attempt(*self.parent, &*self.stop, self.number);
        self.result.emplace(co_await next(ctx));
    }

    // ---- the delay's timer: a timer of the call's loop, or a sleeper on any other clock ----

    void arm(std::chrono::nanoseconds d) {
        const auto at = add_saturating(clock_.now(), d);
        ++generation_;
        armed_ = true;
        if (!timers_resolved_) {
            timers_resolved_ = true;
            if constexpr (loop_timer_clock<C>) {
                event_loop* loop = clock_.timer_loop();
                timers_ = loop && loop == home_ ? loop : nullptr;
            }
        }
        if (timers_) {
            node_.when = std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch());
            node_.owner = this;
            node_.fire = &fired;
            loop_access::add_timer(*timers_, &node_);
        } else {
            promise& p = adopt(sleeper(clock_, at), 0);
            p.what = race_node::kind::sleeper;
            p.generation = generation_;
            std::coroutine_handle<promise>::from_promise(p).resume();
        }
    }

    void disarm() noexcept {
        if (!armed_)
            return;
        armed_ = false;
        if (timers_) {
            loop_access::remove_timer(*timers_, &node_); // a no-op once it fired
        } else {
            for (promise* p = children_; p; p = p->next_child)
                if (p->number == 0)
                    request_stop(*p);
        }
    }

    // On the loop's thread, which is the hedge's own: the hedge is not running now.
    static void fired(timer_node* t) {
        auto* self = static_cast<hedge_race*>(t->owner);
        self->fired_generation_ = self->generation_;
        if (std::coroutine_handle<> parent = self->inbox_.deliver(&self->timer_event_))
            parent.resume(); // last: the hedge may finish, and `self` with it
    }

    static child sleeper(const C& clock, typename C::time_point at) {
        promise& self = co_await typename child::own_promise{};
        const std::stop_token token = self.stop->token(); // named: no temporary in the co_await
        co_await clock.sleep_until(at, token);
        self.fired = !self.stop->stop_requested();
    }

    // ---- children ----

    promise& adopt(child c, int number) noexcept {
        promise& p = c.release();
        p.inbox = &inbox_;
        p.parent = &ctx_;
        p.stop.emplace(&ctx_);
        p.number = number;
        p.next_child = children_;
        if (children_)
            children_->prev_child = &p;
        children_ = &p;
        return p;
    }

    void destroy(promise& p) noexcept {
        if (p.prev_child)
            p.prev_child->next_child = p.next_child;
        else
            children_ = p.next_child;
        if (p.next_child)
            p.next_child->prev_child = p.prev_child;
        std::coroutine_handle<promise>::from_promise(p).destroy();
    }

    const hedge_options& o_;
    const C& clock_;
    const Next& next_;
    const context& ctx_;
    race_inbox inbox_;
    event_loop* home_;
    promise* children_ = nullptr;

    int started_ = 0;
    int in_flight_ = 0;
    bool ending_ = false;    // decided: stop everything, wait, answer
    bool closed_ = false;    // the budget refused: no more extra attempts
    bool cancelled_ = false; // the caller stopped
    std::optional<O> final_; // the winner, or the failure that ended the call
    std::optional<O> last_;  // the last failure hedged on

    bool armed_ = false;
    bool timers_resolved_ = false;
    unsigned generation_ = 0;       // arming count: tells a live expiry from a stale one
    unsigned fired_generation_ = 0; // which arming the loop timer fired for
    event_loop* timers_ = nullptr;  // the loop the delay is a timer of; null: sleepers
    timer_node node_;
    race_node timer_event_;
};

} // namespace detail

} // namespace resilience
