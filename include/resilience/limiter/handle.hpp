// SPDX-License-Identifier: MIT
/// \file limiter/handle.hpp
/// `limiter_handle`: the public face shared by `rate_limiter` and `sliding_window_limiter` (the policy
/// protocol, `take`, `queued`, `name`, `reconfigure`), over a `limiter_state` with its options.
///
/// Locking: no mutex of its own; the functions of `limiter_state` it calls take `limiter_state::mutex`
/// (state.hpp), and `limiter_shared::reconfigure`'s change runs with it held. `limiter_shared::cell` is
/// replaced only with that mutex held and pinned without it (a `snapshot_cell`); `ranks` and
/// `queue_limit` are read here without it, as state.hpp says where they are declared.
#pragma once

#include "../clock.hpp"
#include "../context.hpp"
#include "../detail/frame_allocator.hpp"
#include "../detail/inlining.hpp"
#include "../detail/shared_handle.hpp"
#include "../detail/snapshot_cell.hpp"
#include "../engine/default_clock.hpp"
#include "../engine/waiter_queue.hpp"
#include "../error.hpp"
#include "../outcome.hpp"
#include "../policy.hpp"
#include "../policy_kit.hpp"
#include "../priority.hpp"
#include "../queue_discipline.hpp"
#include "../stop_token.hpp"
#include "../task.hpp"
#include "../telemetry_event.hpp"
#include "errors.hpp"
#include "state.hpp"

#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace resilience::inline v0_2::detail {

/// One configuration of a limiter, immutable: pinned by the calls that need it past their start.
template <class Options>
struct limiter_options_block : pinnable {
    explicit limiter_options_block(Options o) : options(std::move(o)) {}
    const Options options;
};

/// Whether limiter options `a` and `b` are the same: a reconfiguration from one to the other
/// changes nothing. Listeners compare by identity (copies of one are the same); options with an
/// `on_rejected` are never the same as any (it cannot be compared).
template <class Options>
bool same_limiter_options(const Options& a, const Options& b) noexcept {
    if (a.on_rejected || b.on_rejected || a.name != b.name || a.queue_limit != b.queue_limit ||
        a.queue_timeout != b.queue_timeout || a.priorities.classes != b.priorities.classes ||
        a.priorities.reserved != b.priorities.reserved ||
        a.priorities.default_class != b.priorities.default_class ||
        discipline_rule::of(a.queue_discipline) != discipline_rule::of(b.queue_discipline) ||
        !a.telemetry.same_as(b.telemetry))
        return false;
    if constexpr (requires { a.token_limit; })
        return a.token_limit == b.token_limit && a.tokens_per_second == b.tokens_per_second;
    else
        return a.permit_limit == b.permit_limit && a.window == b.window && a.segments == b.segments;
}

/// A limiter's shared state with its options: each configuration an immutable block, the one in
/// force published through `cell`. A call that waits pins it once, when it starts waiting, and
/// uses it to its end (its name, `on_rejected`, listener); a call that takes its permit at once
/// needs none and pins none. A block replaced by a reconfiguration is freed once no call pins it.
template <clock C, class Meter, class Options>
struct limiter_shared : limiter_state<C, Meter> {
    using block = limiter_options_block<Options>;

    limiter_shared(Meter m, C c, Options o)
        : limiter_state<C, Meter>(std::move(m), std::move(c), o.queue_limit, o.queue_timeout,
                                  discipline_rule::of(o.queue_discipline)),
          cell(std::make_unique<block>(Options(o))) {
        this->publish_priorities_locked(this->prepare_priorities_locked(o.priorities, limit_of(o)));
    }

    /// Pins the options in force now.
    pinned<block> pin() noexcept { return cell.pin(); }

    /// Puts `o` (validated) in force: `change(meter, now)` gives the meter its new parameters
    /// (see `limiter_state::reconfigure`). Options the same as those in force change nothing.
    /// Nothing changes if it throws.
    template <class Change>
    void reconfigure(Options o, Change change) {
        if (same_limiter_options(pin()->options, o))
            return; // a reconfiguration racing this one is ordered after it
        auto next = std::make_unique<block>(std::move(o));
        const Options& in_force = next->options;
        this->limiter_state<C, Meter>::reconfigure(
            [&](Meter& m, std::chrono::nanoseconds now) {
                auto next_ranks =
                    this->prepare_priorities_locked(in_force.priorities, limit_of(in_force)); // may throw
                cell.reserve();                                                               // likewise
                change(m, now);                // may throw only before it changes anything
                cell.replace(std::move(next)); // cannot throw now; `in_force` is the block in force
                this->publish_priorities_locked(std::move(next_ranks));
            },
            in_force.queue_limit, in_force.queue_timeout, discipline_rule::of(in_force.queue_discipline));
    }

    /// The limit the shares of `priorities` are of: `token_limit` or `permit_limit`.
    static std::size_t limit_of(const Options& o) noexcept {
        if constexpr (requires { o.token_limit; })
            return o.token_limit;
        else
            return o.permit_limit;
    }

    snapshot_cell<block> cell; // replaced under the mutex
};

/// The public face shared by the limiters: the policy protocol, `take`, `queued`, `name`, `==`.
/// A copyable handle to one shared, thread-safe limiter. A call holds the limiter only while it
/// waits: on the fast path it takes its permit and touches the limiter no more.
template <class Derived, clock C, class Meter, class Options>
class limiter_handle : public policy_base<Derived>,
                       public shared_handle<Derived, limiter_shared<C, Meter, Options>> {
    using handle = shared_handle<Derived, limiter_shared<C, Meter, Options>>;

public:
    /// Whether a call through this limiter may sleep on the default clock: under the options in
    /// force, a call that finds no permit may queue, and the head of the queue sleeps on the clock
    /// until its permit is due (see `default_clock_sleeper`).
    [[nodiscard]] sleeper may_sleep_on_default_clock() const noexcept {
        if (!is_default_clock(this->held().clock) || this->held().pin()->options.queue_limit == 0)
            return {};
        if constexpr (requires(const Options& o) { o.token_limit; })
            return {"rate_limiter", "its queue"};
        else
            return {"sliding_window_limiter", "its queue"};
    }

    // ---- the policy protocol (see policy.hpp) ----
    struct call_state {};

    /// A permit now with nobody queued is taken at once; anything else waits (or is refused) in
    /// `frame_wait`.
    template <class R>
    step enter(call_state&, const context& ctx, std::optional<outcome<R>>& result) const {
        if (ctx.stop_requested()) [[unlikely]]
            return kit::cancel(result, name());
        shared& s = this->held();
        if (s.ranks.load(std::memory_order_relaxed)) [[unlikely]]
            return enter_ranked(s, ctx);
        return s.try_take_now(call_now(s.clock, ctx)) ? step::proceed : step::wait;
    }
    /// `enter` with priorities: by the call's class.
    RESILIENCE_DETAIL_NOINLINE static step enter_ranked(limiter_shared<C, Meter, Options>& s,
                                                        const context& ctx) {
        return s.try_take_now(call_now(s.clock, ctx), ctx) ? step::proceed : step::wait;
    }
    template <class R>
    step leave(call_state&, const context&, outcome<R>&) const noexcept {
        return step::proceed;
    }

    /// Whether a call that found no permit waits for one in the pipeline's frame (`frame_wait`):
    /// always (`run` is for a limiter used inside a waiting-form policy).
    bool waits_in_frame(const context&) const noexcept { return true; }
    /// So a pipeline never compiles `run` for it (engine/protocol.hpp).
    static constexpr bool always_waits_in_frame = true;
    /// Waits for a permit without a frame of its own, by the rules of `run`: yields `step::proceed`
    /// with the permit spent, or `step::done` with the refusal (`rate_limited_error`) or the stop
    /// (`cancelled_error`) in `result`. The queue's node is in it; only the head, which watches
    /// the clock, runs a coroutine (`serve_turn`), so it answers `step::wait` (await it again)
    /// when its turn comes. It keeps no reference to the call: it decides what it can when it is
    /// made (a stop, a permit now, the queue's first answer), and `await_resume` is given the rest.
    /// With a telemetry listener, the time the wait began is kept in a block of its own from the
    /// frame cache, taken only then. Holds the limiter while it lives (taken at construction,
    /// given back at the end of its destructor: no member of its own).
    /// What `frame_wait<R>` does, whatever the result type `R`: compiled once per limiter type.
    class wait_for_permit {
        using shared = limiter_shared<C, Meter, Options>;

    public:
        RESILIENCE_DETAIL_NOINLINE wait_for_permit(const limiter_handle& l, const context& ctx)
            : pin_(l.held().pin()), queue_(l.held(), ctx.stop_token()) {
            queue_.node().rank = l.held().rank_of(ctx);
            add_hold(l.held(), true);
            try {
                start(ctx);
            } catch (...) {
                forget_queued_at();
                queue_.leave();
                drop_hold(l.held(), true);
                throw;
            }
        }
        wait_for_permit(const wait_for_permit&) = delete;
        wait_for_permit& operator=(const wait_for_permit&) = delete;
        RESILIENCE_DETAIL_NOINLINE ~wait_for_permit() {
            shared& l = limiter();
            // Ended (or destroyed) at its turn, before or while the head's coroutine ran: the turn
            // passes on all the same. The coroutine goes first; its own guard may do it.
            turn_ = {};
            if (phase_ == phase::turn) {
                typename limiter_state<C, Meter>::turn_guard pass_on{&l, &queue_.node()};
                (void)pass_on; // its destructor hands the turn on, if the node still has it
            }
            forget_queued_at();
            queue_.leave(); // what its destructor would do, while the limiter is still held
            drop_hold(l, true);
        }

        bool await_ready() noexcept {
            switch (phase_) {
            case phase::queue:
                return queue_.node().state != waiter_state::idle; // decided when it was made
            case phase::turn:
                return false; // the head's coroutine runs next
            default:
                return true;
            }
        }
        detail::start_result await_suspend(std::coroutine_handle<> h) {
            if (phase_ == phase::turn)
                return std::move(turn_).operator co_await().await_suspend(h);
            return detail::suspend_unless_done(queue_.await_suspend(h), h);
        }
        // Made by a caller that had stopped: decided at once, with `cancelled_error`.
        bool stopped_at_start() const noexcept { return phase_ == phase::decided && answer_ == step::done; }
        // `await_resume`, with a refusal or a stop put in `result`.
        RESILIENCE_DETAIL_NOINLINE step resume(const context& ctx, std::optional<failure>& result) {
            waiter_state st;
            switch (phase_) {
            case phase::decided:
                return answer_;
            case phase::queue:
                st = queue_.await_resume();
                // Its turn, or one it already lost to a newcomer of a higher class before it could
                // run (`queued`): it drives all the same, and `serve_turn` parks it.
                if (st == waiter_state::turn || st == waiter_state::queued) {
                    phase_ = phase::turn;
                    turn_ = limiter().serve_turn(queue_.node(), ctx.stop_token());
                    return step::wait;
                }
                break;
            default: // phase::turn
                st = std::move(turn_).operator co_await().await_resume();
                break;
            }
            phase_ = phase::decided;
            shared& l = limiter();
            const detail::listener_ref listener =
                queued_at_ ? listener_for(options().telemetry, ctx) : nullptr;
            if (st == waiter_state::granted) {
                if (listener)
                    if (std::optional<failure> thrown = emit_caught(
                            listener, l.clock,
                            waited_on(l, options(), ctx, queued_at_, telemetry_kind::queue_wait))) {
                        result.emplace(std::move(*thrown)); // the permit stays spent
                        return answer_ = step::done;
                    }
                // Stopped since its turn came (by the listener, or from another thread): runs
                // nothing, and the permit stays spent.
                if (ctx.stop_requested()) {
                    result.emplace(cancelled_failure(options().name));
                    return answer_ = step::done;
                }
                return answer_ = step::proceed;
            }
            if (st == waiter_state::stopped) {
                result.emplace(cancelled_failure(options().name));
            } else {
                result.emplace(refuse_call(l, options(), ctx, queued_at_, listener,
                                           admission{st, queue_.node().retry_after}));
            }
            return answer_ = step::done;
        }

        const Options& options() const noexcept { return pin_->options; }

    private:
        enum class phase : unsigned char { queue, turn, decided };

        shared& limiter() const noexcept { return static_cast<shared&>(queue_.owner()); }

        // A stopped caller or a permit now decide the call; otherwise it asks the queue.
        void start(const context& ctx) {
            if (ctx.stop_requested()) {
                phase_ = phase::decided; // and `answer_` says done: `stopped_at_start`
                return;
            }
            if (limiter().try_take_now(limiter().clock.now(), ctx)) {
                phase_ = phase::decided;
                answer_ = step::proceed;
                return;
            }
            if (listener_for(options().telemetry, ctx)) { // as `run`: from when it found none
                const typename C::time_point now = limiter().clock.now();
                queued_at_ =
                    ::new (frame_cache::allocate(sizeof(typename C::time_point))) typename C::time_point(now);
            }
            (void)queue_.await_ready(); // its answer is in the node's state
        }
        void forget_queued_at() noexcept {
            if (queued_at_) {
                std::destroy_at(queued_at_);
                frame_cache::deallocate(std::exchange(queued_at_, nullptr), sizeof(typename C::time_point));
            }
        }

        pinned<typename shared::block> pin_; // the call's options: those in force when it started waiting
        typename C::time_point* queued_at_ = nullptr;        // with a listener: when the call found no permit
        queue_awaiter<limiter_state<C, Meter>, true> queue_; // with its node
        phase phase_ = phase::queue;
        step answer_ = step::done;
        task<waiter_state> turn_; // the head's: watches the clock
    };

    /// The protocol's form of `wait_for_permit`, for a call whose result type is `R`.
    template <class R>
    class frame_wait : public wait_for_permit {
    public:
        frame_wait(const limiter_handle& l, call_state&, const context& ctx,
                   std::optional<outcome<R>>& result)
            : wait_for_permit(l, ctx) {
            if (this->stopped_at_start())
                kit::cancel(result, this->options().name);
        }
        step await_resume(const limiter_handle&, call_state&, const context& ctx,
                          std::optional<outcome<R>>& result) {
            std::optional<failure> refusal;
            return kit::settled(this->resume(ctx, refusal), refusal, result);
        }
    };

    /// Admits the call once it has a permit, spending exactly one; otherwise fails it (as a value)
    /// with `rate_limited_error` when it may not wait or waited `queue_timeout`, or
    /// `cancelled_error` when its caller stops first. A permit, once spent, is not given back,
    /// however the call ends.
    template <class Next>
    task<next_outcome_t<Next>> run(Next next, const context& ctx) const {
        // The same wait as in a pipeline's frame, in this coroutine's.
        std::optional<next_outcome_t<Next>> refused_call;
        call_state none;
        step s;
        {
            frame_wait<next_value_t<Next>> waiting{*this, none, ctx, refused_call};
            do { // `step::wait`: the head's turn came, await it again
                co_await awaiting<frame_wait<next_value_t<Next>>>{waiting};
                s = waiting.await_resume(*this, none, ctx, refused_call);
            } while (s == step::wait);
        }
        if (s != step::proceed)
            co_return std::move(*refused_call);
        co_return co_await next(ctx);
    }

    /// Spends one permit without running anything, by the same rules as a call (waits in the
    /// same queue). Throws `rate_limited_error` when refused, `cancelled_error` when `token` stops
    /// the wait first. Like a call, it holds the limiter from the moment it is made.
    task<void> take(stop_token token = {}) const {
        return take_with(static_cast<const Derived&>(*this), std::move(token));
    }
    /// `take`, reporting a refusal or a stop as a failure value instead of throwing it.
    [[nodiscard]] task<outcome<void>> take_outcome(stop_token token = {}) const {
        return take_outcome_with(static_cast<const Derived&>(*this), std::move(token));
    }

    /// Calls (and `take`s) waiting now, the one watching the clock included.
    [[nodiscard]] std::size_t queued() const { return this->held().queued(); }
    /// A copy of the options in force now (the latest `reconfigure`'s, or the constructor's).
    [[nodiscard]] Options options() const { return this->held().pin()->options; }
    [[nodiscard]] std::string name() const { return this->held().pin()->options.name; }
    [[nodiscard]] const C& clock() const noexcept { return this->held().clock; }

protected:
    using shared = limiter_shared<C, Meter, Options>;

    limiter_handle(Meter meter, C clock, Options options)
        : handle(handle::make_state(std::move(meter), std::move(clock), std::move(options))) {}

    /// Puts `options` (validated by the limiter) in force; `change(meter, now)` gives the meter
    /// its new parameters under the limiter's mutex. Queued callers stay queued with their
    /// deadlines; the head is woken to time its permit again.
    template <class Change>
    void reconfigure_with(Options options, Change change) const {
        this->held().reconfigure(std::move(options), std::move(change));
    }

private:
    // Awaits a `frame_wait` outside a pipeline (in `run`): its `await_resume` takes the call, so the
    // caller asks it once resumed.
    template <class A>
    struct awaiting {
        A& wait;
        bool await_ready() { return wait.await_ready(); }
        auto await_suspend(std::coroutine_handle<> h) { return wait.await_suspend(h); }
        void await_resume() const noexcept {}
    };

    // The limiter is a copy in the frame: the take needs no handle of the caller's.
    static task<void> take_with(Derived self, stop_token token) {
        auto r = co_await self.take_outcome(std::move(token));
        r.value();
    }
    static task<outcome<void>> take_outcome_with(Derived self, stop_token token) {
        shared& s = self.held();
        const pinned<typename shared::block> pin = s.pin();
        const Options& o = pin->options; // the take's, to its end
        if (token.stop_requested())
            co_return failure::make(cancelled_error{o.name});
        const context as_default; // a take is of the default class
        if (s.try_take_now(s.clock.now(), as_default))
            co_return outcome<void>{};
        const admission a = co_await s.wait(token, s.rank_of(as_default));
        if (a.state == waiter_state::granted)
            co_return outcome<void>{};
        if (a.state == waiter_state::stopped)
            co_return failure::make(cancelled_error{o.name});
        co_return failure::make(refusal_of(s, o, a));
    }

    // A call refused: `on_rejected` is told, then the listener (if any); what either throws is the
    // call's failure instead of the refusal.
    static failure refuse_call(const shared& s, const Options& o, const context& ctx,
                               const typename C::time_point* since, detail::listener_ref listener,
                               const admission& a) {
        rate_limited_error e = refusal_of(s, o, a);
        const rejection_reason why = e.reason();
        if (o.on_rejected) {
            try {
                o.on_rejected(
                    rejection_event{o.name, why, e.retry_after()}.with_properties(ctx.properties()));
            } catch (...) {
                return failure::current();
            }
        }
        failure refusal = failure::make(std::move(e));
        if (!listener)
            return refusal;
        return refused(listener, s.clock, waited_on(s, o, ctx, since, telemetry_kind::rejection, why),
                       std::move(refusal));
    }
    // The reason follows the `queue_limit` in force when the call was refused.
    static rate_limited_error refusal_of(const shared& s, const Options& o, const admission& a) {
        rejection_reason why = rejection_reason::queue_timeout;
        if (a.state == waiter_state::shed)
            why = rejection_reason::shed;
        else if (a.state == waiter_state::rejected)
            why = s.queue_limit.load(std::memory_order_relaxed) == 0 ? rejection_reason::no_capacity
                                                                     : rejection_reason::queue_full;
        return rate_limited_error{o.name, a.retry_after, why};
    }
    // An event about a call that waited since `since` (read only for a listener).
    static telemetry_event waited_on(const shared& s, const Options& o, const context& ctx,
                                     const typename C::time_point* since, telemetry_kind k,
                                     rejection_reason why = rejection_reason::no_capacity) {
        return {.kind = k,
                .policy = Derived::telemetry_policy,
                .name = o.name,
                .attempt = ctx.attempt(),
                .duration =
                    since ? saturating_nanoseconds(s.clock.now() - *since) : std::chrono::nanoseconds{},
                .reason = why};
    }
};

} // namespace resilience::detail
