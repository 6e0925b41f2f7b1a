// SPDX-License-Identifier: MIT
/// \file hedge/race.hpp
/// `detail::hedge_race`: one hedged call, its attempts racing and the decisions between them; the
/// machinery behind `hedge` (hedge/hedge.hpp).
#pragma once

#include "../clock.hpp"
#include "../context.hpp"
#include "../detail/intrusive_list.hpp"
#include "../detail/time.hpp"
#include "../engine/race.hpp"
#include "../error.hpp"
#include "../event_loop.hpp"
#include "../outcome.hpp"
#include "../stop_token.hpp"
#include "../telemetry_event.hpp"
#include "options.hpp"

#include <chrono>
#include <concepts>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>

namespace resilience::inline v0_2 {

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
        : o_(o), clock_(clock), next_(next), ctx_(ctx), inbox_(home_loop::current()),
          home_(home_loop::current()) {
        timer_event_.what = race_node::kind::timer;
    }
    hedge_race(const hedge_race&) = delete;
    hedge_race& operator=(const hedge_race&) = delete;
    /// Normally everything has finished by now. Reached with attempts pending only when the call's
    /// frame is destroyed unfinished (its event loop torn down): they go with it, as `when_all`'s do.
    ~hedge_race() {
        if (node_.armed())
            loop_access::remove_timer(*timers_, &node_);
        while (promise* p = children_.pop_front())
            std::coroutine_handle<promise>::from_promise(*p).destroy();
    }

    void begin() {
        start(hedge_reason::delay, nullptr); // attempt 1: nothing user-made runs before it
        settle();
    }
    /// True while an attempt or a sleeper has not finished.
    [[nodiscard]] bool busy() const noexcept { return !children_.empty(); }
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
        if (final_) // after the caller's stop, only a value an attempt returned
            return std::move(*final_);
        if (cancelled_)
            return O{failure::make(cancelled_error{o_.name})};
        return std::move(*last_);
    }

private:
    // ---- decisions ----

    void attempt_ended(promise& p) {
        O result = std::move(*p.result);
        destroy(p);
        --in_flight_;
        if (ending_) {
            // Decided already: a loser's outcome is dropped. After the caller's stop nothing won
            // yet, and a value an attempt returns all the same is worth more than cancelled_error.
            if (cancelled_ && !final_ && result.has_value())
                final_.emplace(std::move(result));
            return;
        }
        if (ctx_.stop_requested()) {
            if (result.has_value())
                end_with(std::move(result));
            else
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
                          .classify(
                              result, [](const failure& f) noexcept { return !is_cancellation(f); }, &ctx_)
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
        for (promise* p = children_.front(); p; p = p->next)
            if (p->number > 0)
                request_stop(*p);
    }
    static void request_stop(promise& p) noexcept {
        stop_source s = p.stop->expire();
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
                telemetry_event refused =
                    event(telemetry_kind::rejection, "retry_budget", o_.name, n, {}, cause);
                refused.handled = why == hedge_reason::failure;
                emit(o_.telemetry, ctx_, clock_, refused);
                return false;
            }
            if (o_.on_hedge)
                o_.on_hedge(hedge_event{n, why, cause, o_.name}.with_properties(ctx_.properties()));
            if (const detail::listener_ref l = listener_for(o_.telemetry, ctx_)) { // asks `delay` only then
                telemetry_event e = event(
                    telemetry_kind::hedge, "hedge", o_.name, n,
                    why == hedge_reason::delay ? o_.delay(started_) : std::chrono::nanoseconds{}, cause);
                e.handled = why == hedge_reason::failure;
                emit(l, clock_, e);
            }
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
                timers_ = loop && loop_access::home(loop) == home_ ? loop : nullptr;
            }
        }
        if (timers_) {
            node_.when = std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch());
            node_.self = this;
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
            for (promise* p = children_.front(); p; p = p->next)
                if (p->number == 0)
                    request_stop(*p);
        }
    }

    // On the loop's thread, which is the hedge's own: the hedge is not running now.
    static void fired(timer_node* t) {
        hedge_race* self = static_cast<delay_timer*>(t)->self;
        self->fired_generation_ = self->generation_;
        if (std::coroutine_handle<> parent = self->inbox_.deliver(&self->timer_event_))
            parent.resume(); // last: the hedge may finish, and `self` with it
    }

    static child sleeper(const C& clock, typename C::time_point at) {
        promise& self = co_await typename child::own_promise{};
        const stop_token token = self.stop->token(); // named: no temporary in the co_await
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
        children_.push_front(p);
        return p;
    }

    void destroy(promise& p) noexcept {
        children_.erase(p);
        std::coroutine_handle<promise>::from_promise(p).destroy();
    }

    const hedge_options& o_;
    const C& clock_;
    const Next& next_;
    const context& ctx_;
    race_inbox inbox_;
    home_loop* home_;
    intrusive_list<promise> children_;

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
    // The delay's timer, with the way back to the race for `fired`.
    struct delay_timer : timer_node {
        hedge_race* self = nullptr;
    };
    delay_timer node_;
    race_node timer_event_;
};

} // namespace detail

} // namespace resilience
