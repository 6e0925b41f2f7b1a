// SPDX-License-Identifier: MIT
/// \file bulkhead/bulkhead.hpp
/// `bulkhead`: a cap on how many calls run at once, with a bounded first-come-first-served queue
/// (by class first, with priorities), and optionally a cap that moves with what the dependency
/// manages (`adapt`). Its options are in bulkhead/options.hpp, its refusal in bulkhead/errors.hpp;
/// the slots, the queue and the ways a call waits are in bulkhead/state.hpp.
///
/// Locking: no mutex of its own. `queued()` (which reads the queue) takes the state's `mutex` itself,
/// for that step only; the rest of a call goes through `bulkhead_state`, which locks for itself
/// (bulkhead/state.hpp).
#pragma once

#include "../classifier.hpp"
#include "../clock.hpp"
#include "../concepts.hpp"
#include "../context.hpp"
#include "../detail/config.hpp"
#include "../detail/frame_allocator.hpp"
#include "../detail/inlining.hpp"
#include "../detail/shared_handle.hpp"
#include "../detail/time.hpp"
#include "../engine/default_clock.hpp"
#include "../engine/waiter_queue.hpp"
#include "../error.hpp"
#include "../outcome.hpp"
#include "../policy.hpp"
#include "../policy_kit.hpp"
#include "../priority.hpp"
#include "../stop_token.hpp"
#include "../task.hpp"
#include "../telemetry_event.hpp"
#include "adaptive_limit.hpp"
#include "errors.hpp"
#include "options.hpp"
#include "state.hpp"

#include <algorithm>
#include <chrono>
#include <concepts>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace resilience::inline v0_2 {

/// Bounds how many calls run at once, so one slow dependency cannot take every connection,
/// socket or worker the process has.
/// - At most `max_concurrent_calls` calls hold a slot. A call holds its slot from admission until the
///   rest of the pipeline returns, however it ends: value, failure, exception or cancellation.
/// - When every slot is busy, up to `queue_limit` calls wait, served strictly in arrival order: a
///   freed slot is handed straight to the oldest waiter, so a call arriving while anyone waits
///   queues behind it even if it arrives at the very instant a slot frees (no barging).
/// - A call with no slot and no queue place, or whose wait outlasts `queue_timeout` (refused at
///   exactly that instant), fails with `bulkhead_rejected_error`, returned as a value through the
///   pipeline: `execute_outcome` reports it without an exception, and the action never runs. Its
///   `reason()` says which: `no_capacity` (`queue_limit` 0), `queue_full` or `queue_timeout`.
/// - A waiter whose caller stops (its stop token) leaves the queue at that instant, takes no slot,
///   and fails with `cancelled_error`; so does a call whose token is stopped before it starts, or
///   by the time a slot handed to it is picked up (the slot goes straight on to the next waiter).
/// - With `adapt` (`rs::aimd` or `rs::gradient`), the limit moves within the algorithm's
///   [`min`, `max`] with the outcomes and latencies of the calls that held a slot; `limit()` reads
///   it. A smaller limit never cancels a call already admitted: it admits nobody until fewer than
///   the new limit hold a slot. A larger one hands its new slots to the oldest waiters at once.
///   The limit grows only while it is what holds calls back (someone queued, or every slot taken).
/// - With `priorities`, a call of a class takes a slot only while the shares reserved by the
///   classes above it stay free, waiters are served highest class first (in arrival order within
///   a class, never passing one of their own class or above), and a newcomer of a higher class
///   displaces the lowest class's last waiter from a full queue (`queue_full`); see priority.hpp.
///   "Arrival order" above is then within a class.
///
/// A copyable handle: copies share one bulkhead (one set of slots), which is thread-safe; event
/// loops on several threads may share it, and each waiter is resumed on the loop it waited on.
/// While nobody waits, a call takes and gives back its slot with one atomic operation each,
/// without a lock.
/// A call also loads the options in force once, where it starts (one acquire load: `reconfigure`).
/// Without `adapt` the limit is read with one relaxed atomic load and nothing else changes; with
/// it, a call's end takes the lock when its sample may move the limit (an AIMD success while
/// slots are free does not).
/// Constructing one starts no timer. The state lives as long as any copy or any call that uses it
/// (docs/core.md, "Lifetimes"): a call holding a slot or waiting for one keeps it alive, for no
/// more than the atomic operation that takes the slot. `C` is used for `queue_timeout` (its
/// sleeps run on the waiter's loop) and to time calls for `adapt` (a slow-call duration, latency);
/// copies share one clock object, which must be usable from every thread that calls through the
/// bulkhead.
///
///     rs::bulkhead db{{.max_concurrent_calls = 8, .queue_limit = 32, .queue_timeout = 200ms}};
///     auto rows = co_await db.execute(query);          // throws bulkhead_rejected_error when full
///     auto r = co_await db.execute_outcome(query);     // or reports it without throwing
template <clock C = steady_clock>
class bulkhead : public policy_base<bulkhead<C>>,
                 public detail::shared_handle<bulkhead<C>, detail::bulkhead_state<C>> {
    using state = detail::bulkhead_state<C>;
    using config = typename state::config;
    using handle = detail::shared_handle<bulkhead<C>, state>;

public:
    /// The default options: 25 calls at once, none queued.
    bulkhead()
    requires std::default_initializable<C>
        : bulkhead(bulkhead_options{}) {}
    RESILIENCE_DETAIL_CONSTRUCTOR explicit bulkhead(bulkhead_options options, C clock = C{})
        : handle(handle::make_state(validate(std::move(options)), std::move(clock))) {}

    /// Puts `options` in force for every copy, while calls run. They are checked as the
    /// constructor checks them: invalid ones throw `std::invalid_argument` (naming the field and
    /// the value) and the options in force stay. Thread-safe against calls and other
    /// reconfigurations.
    ///
    /// New calls see the new options at once. A call already started (holding a slot, or queued
    /// for one) finishes under the options it started with: its name, `on_rejected`, listener,
    /// `queue_timeout` and, with `adapt`, its `should_handle`. What the bulkhead itself does from
    /// now on follows the new ones; what carries over:
    /// - the slots: calls holding one keep it, and calls queued stay queued, in their order;
    /// - a smaller `max_concurrent_calls` evicts nobody: nobody new is admitted until fewer calls
    ///   than the new limit hold a slot; a larger one hands its new slots to the oldest waiters at
    ///   once;
    /// - a smaller `queue_limit` turns no queued caller away: newcomers are refused until the
    ///   queue is under it;
    /// - a `queue_timeout` applies to callers queued after the change; those queued before keep
    ///   their deadline;
    /// - `adapt`: with the same algorithm as before (AIMD and AIMD, gradient and gradient), its
    ///   state carries over: the current limit (the gradient's estimate, its baseline and the
    ///   measurement being filled, AIMD's count towards its next increase and its epoch), clamped
    ///   into the new [`min`, `max`]; the new parameters judge the next samples, including those
    ///   of calls admitted before. `max_concurrent_calls` (the starting limit, still checked to
    ///   lie within the bounds) does not reset it. Another algorithm starts afresh from the current
    ///   limit clamped into its bounds (the old one's counts mean nothing to it; calls admitted
    ///   before no longer move an AIMD); switching `adapt` on starts from `max_concurrent_calls`,
    ///   switching it off makes the limit `max_concurrent_calls`. A call admitted without `adapt`
    ///   records no sample, nor does one untimed under an algorithm that now needs its latency.
    ///
    /// Memory: the options replaced are freed once no call that needs them is still running (a
    /// call that waits, or one under `adapt` or `priorities`, keeps those it started with; a call
    /// that took a free slot under neither keeps none). Options the same as those in force (the
    /// same values, classifier and listener copies of those in force, and no `on_rejected`, which
    /// cannot be compared) change nothing and allocate nothing. Reconfiguration is for changes of
    /// configuration, not a control loop run per call (`adapt` is that loop).
    ///
    ///     rs::bulkhead db{{.max_concurrent_calls = 8, .queue_limit = 32}};
    ///     db.reconfigure({.max_concurrent_calls = 4, .queue_limit = 32}); // the 8 running stay
    void reconfigure(bulkhead_options options) const {
        this->held().reconfigure(validate(std::move(options)));
    }

    /// Calls holding a slot now (including one just handed to a waiter not yet resumed). May
    /// exceed `limit()` for a while after the limit shrank.
    [[nodiscard]] std::size_t in_flight() const noexcept { return this->held().in_flight(); }
    /// How many calls may hold a slot now: `max_concurrent_calls`, or with `adapt` wherever the
    /// algorithm has moved it.
    [[nodiscard]] std::size_t limit() const noexcept { return this->held().current_limit(); }
    /// Calls waiting for a slot now.
    [[nodiscard]] std::size_t queued() const {
        std::lock_guard lock(this->held().mutex);
        return this->held().queue.size();
    }
    /// A copy of the options in force now (the latest `reconfigure`'s, or the constructor's).
    [[nodiscard]] bulkhead_options options() const { return this->held().options(); }
    [[nodiscard]] std::string name() const { return options().name; }
    [[nodiscard]] const C& clock() const noexcept { return this->held().clock; }

    /// Whether a call through this bulkhead may sleep on the default clock: under the options in
    /// force, a call may wait in the queue with a `queue_timeout`, a timer of that clock (a queue
    /// without one waits for a slot, not for the clock; see `detail::default_clock_sleeper`).
    [[nodiscard]] detail::sleeper may_sleep_on_default_clock() const noexcept {
        if (!detail::is_default_clock(this->held().clock))
            return {};
        const detail::pinned<config> in_force = this->held().pin();
        if (in_force->options.queue_limit == 0 || !in_force->options.queue_timeout)
            return {};
        return {"bulkhead", "its queue_timeout"};
    }

    // ---- the policy protocol (see policy.hpp) ----
    struct call_state {
        state* held = nullptr; // the bulkhead whose slot this call holds (a hold on it)
        // The options the call started under, pinned (`detail::pinned::release`); null for a plain
        // call. A raw pointer, so that the plain call's end stays one test and small enough to inline.
        const config* cfg = nullptr;
        typename state::ticket ticket; // with `adapt`: what the call's sample needs
        call_state() = default;
        call_state(const call_state&) = delete;
        call_state& operator=(const call_state&) = delete;
        ~call_state() {
            if (held || cfg) [[unlikely]]
                abandon();
        }

    private:
        // The call never finished (its loop was torn down), or it ended holding its options (a
        // refusal after it pinned them). Out of line: the destructor stays small enough to inline.
        RESILIENCE_DETAIL_NOINLINE void abandon() noexcept {
            if (held)
                std::exchange(held, nullptr)->release();
            if (cfg)
                detail::pinned<config>::unpin(std::exchange(cfg, nullptr));
        }
    };

    /// A free slot with nobody queued is taken at once; anything else waits in `frame_wait` (see
    /// bulkhead/state.hpp).
    /// The call's options are the block in force now, kept to its end; a call under options with
    /// neither `adapt` nor `priorities` that takes a free slot needs none of them and pins none.
    template <class R>
    step enter(call_state& c, const context& ctx, std::optional<outcome<R>>& result) const {
        state& s = this->held();
        if (s.plain.load(std::memory_order_acquire) && !ctx.stop_requested() && s.try_acquire()) [[likely]] {
            c.held = &s;
            return step::proceed;
        }
        return enter_pinned(c, ctx, result);
    }
    /// Gives the slot back; with `adapt`, records the call's outcome first. A `should_handle` (or a
    /// clock) that throws makes its exception the call's result, once the slot is given back.
    template <class R>
    step leave(call_state& c, const context& ctx, outcome<R>& result) const {
        state* s = std::exchange(c.held, nullptr);
        if (c.cfg) [[unlikely]]
            leave_pinned(*s, c, ctx, result);
        else
            s->release();
        return step::proceed;
    }

    /// Every call that finds no free slot waits for one in the pipeline's frame (`frame_wait`), with
    /// or without `adapt`, whatever its clock; a bulkhead used alone or through an `any_policy` runs
    /// the same way (`policy_base::run`: a pipeline of one).
    static constexpr bool always_waits_in_frame = true;
    bool waits_in_frame(const context&) const noexcept { return true; }
    /// Queues for a slot in the pipeline's frame; yields `step::proceed` holding it (with `adapt`, its
    /// ticket taken), or `step::done` with the refusal (`bulkhead_rejected_error`) or the stop
    /// (`cancelled_error`) in `result`. With a `queue_timeout` the wait is bounded at its deadline:
    /// by a timer on the loop the call runs on when the clock's timers are that loop's
    /// (`steady_clock`, a simulation's clock), else by the state's `wait_bounded`, a watchdog
    /// sleeping on the clock beside the queue wait (a coroutine this awaiter owns). With a telemetry
    /// listener or a queue discipline the wait is timed. The timer and the time are kept in room the
    /// pipeline makes after the awaiter (`extra_bytes`), only then. It keeps no reference to the
    /// call: what it needs of it is decided when it is made (the queue's first answer, the timer) or
    /// given to `await_resume`. Not movable: the queue's node is inside it. Holds the bulkhead while
    /// it lives (taken at construction, given back at the end of its destructor: no member of its
    /// own), so a call destroyed while it waits leaves the queue of a live one.
    // The waiting form's awaiter, whatever the result type: `frame_wait<R>` adds only the result's
    // type to its protocol, so that what it does is compiled once per bulkhead type.
    class wait_in_queue {
        using watched_wait = task<detail::waiter_state>;
        // What only some waits need, in the room after the awaiter: the timer of a queue timeout and
        // the loop it is armed on, or in the loop's place the watched wait that bounds it instead
        // (`wait_bounded`: made in `watched` and destroyed by the awaiter, `queue_.spare` says which),
        // and for a listener or a queue discipline the time the call found no slot.
        struct extras : detail::timer_node { // the timer itself: its `fire` finds the awaiter
            union {
                event_loop* loop = nullptr; // null: no timer armed
                alignas(watched_wait) unsigned char watched[sizeof(watched_wait)];
            };
            typename C::time_point queued_at{};
        };
        static_assert(std::is_trivially_destructible_v<extras>, "left in the room without a destructor");
        static_assert(sizeof(watched_wait) <= sizeof(event_loop*), "the watched wait takes the loop's place");
        // The bits of `queue_.spare` (a byte of the queue awaiter's padding, this awaiter's to use).
        static constexpr unsigned char has_room = 1; // `extras` follows the awaiter
        static constexpr unsigned char watching = 2; // `extras::watched` holds a `watched_wait`

    public:
        /// Room for `extras`, for a call with a queue timeout, a listener or a queue discipline.
        static std::size_t extra_bytes(const bulkhead&, call_state& c, const context& ctx) noexcept {
            const bulkhead_options& o = c.cfg->options; // the call's own, from `enter`
            return o.queue_timeout || stamped(*c.cfg, ctx) ? sizeof(extras) : 0;
        }
        std::size_t extra_bytes() const noexcept { return (queue_.spare & has_room) ? sizeof(extras) : 0; }

        /// Asks the queue at once; a call that must wait bounds its wait by its queue timeout.
        /// `room`: the room `extra_bytes` asked for, at `kit::room_after(this)` (the pipeline's
        /// block), or null.
        RESILIENCE_DETAIL_NOINLINE wait_in_queue(const bulkhead& b, call_state& c, const context& ctx,
                                                 void* room)
            : queue_(b.held(), ctx.stop_token()) {
            state& s = b.held();
            if ((room != nullptr) != (extra_bytes(b, c, ctx) != 0) || (room && room != kit::room_after(this)))
                throw std::logic_error("resilience: bulkhead::frame_wait made without the room it asks for");
            queue_.node().rank = c.cfg->rank_of(ctx);
            if (room) {
                ::new (room) extras{};
                queue_.spare = has_room;
            }
            detail::add_hold(s, true);
            try {
                const bulkhead_options& o = c.cfg->options;
                if ((queue_.spare & has_room) && stamped(*c.cfg, ctx)) {
                    extra().queued_at = s.clock.now(); // from the moment the call found no slot
                    // Found from the node by the queue discipline (queue_discipline.hpp's `waited_beside`).
                    queue_.node().since_offset =
                        static_cast<std::uint16_t>(reinterpret_cast<unsigned char*>(&extra().queued_at) -
                                                   reinterpret_cast<unsigned char*>(&queue_.node()));
                }
                // Only a call that must wait pays for what bounds the wait.
                if (!queue_.await_ready() && o.queue_timeout) {
                    if (detail::timer_loop_here(s.clock))
                        arm(*o.queue_timeout);
                    else
                        watch(s.wait_bounded(queue_.node(), ctx.stop_token(), *o.queue_timeout));
                }
            } catch (...) {
                queue_.leave();
                detail::drop_hold(s, true);
                throw;
            }
        }
        wait_in_queue(const wait_in_queue&) = delete;
        wait_in_queue& operator=(const wait_in_queue&) = delete;
        RESILIENCE_DETAIL_NOINLINE ~wait_in_queue() {
            state& s = owner();
            if (watched())
                abandon_watch();
            disarm();
            queue_.leave(); // what its destructor would do, while the bulkhead is still held
            detail::drop_hold(s, true);
        }

        bool await_ready() noexcept { return queue_.node().state != detail::waiter_state::idle; }
        detail::start_result await_suspend(std::coroutine_handle<> h) {
            if (watched_wait* w = watched())
                return std::move(*w).operator co_await().await_suspend(h);
            return detail::suspend_unless_done(queue_.await_suspend(h), h);
        }
        // How the wait ended: `step::proceed` holding the slot (with `adapt`, its ticket taken), or
        // `step::done` with the refusal or the stop in `refusal`.
        RESILIENCE_DETAIL_NOINLINE step resume(call_state& c, const context& ctx,
                                               std::optional<failure>& refusal) {
            disarm();
            detail::waiter_state admitted;
            if (watched_wait* w = watched()) {
                // What the clock threw (it cannot sleep here) goes on out of the call, as from the
                // limiter's wait; the watched wait kept no slot, and the destructor ends it.
                admitted = std::move(*w).operator co_await().await_resume();
                unwatch();
            } else {
                admitted = queue_.await_resume();
            }
            const detail::listener_ref listener =
                (queue_.spare & has_room) ? kit::listener_for(c.cfg->options.telemetry, ctx) : nullptr;
            const step s = settle(owner(), *c.cfg, ctx, admitted, listener,
                                  listener ? &extra().queued_at : nullptr, c, refusal);
            if (s == step::proceed && c.cfg->adaptive && !admit(c, ctx, refusal))
                return step::done;
            return s;
        }

    private:
        // Whether the call keeps the instant it found no slot: for its listener, or for the queue
        // discipline of its options.
        static bool stamped(const config& cfg, const context& ctx) noexcept {
            return cfg.discipline.on || kit::listener_for(cfg.options.telemetry, ctx);
        }
        state& owner() const noexcept { return queue_.owner(); }
        extras& extra() noexcept { return *std::launder(static_cast<extras*>(kit::room_after(this))); }

        // The deadline: the clock's time now plus the queue timeout, on the loop the call runs
        // on (`timer_loop_here`), where the timer fires and the call resumes.
        void arm(std::chrono::nanoseconds timeout) {
            state& s = owner();
            const auto deadline = std::chrono::duration_cast<std::chrono::nanoseconds>(
                detail::add_saturating(s.clock.now(), timeout).time_since_epoch());
            extras& x = extra();
            x.when = deadline;
            x.fire = [](detail::timer_node* n) {
                auto* const self = detail::awaiter_of_room<wait_in_queue>(static_cast<extras*>(n));
                self->owner().expire(self->queue_.node()); // nothing if the node left the queue already
            };
            event_loop* const here = event_loop::current();
            detail::loop_access::add_timer(*here, &x);
            x.loop = here;
        }
        // The wait bounded by `wait_bounded`, kept in the room (which a queue timeout always has).
        void watch(watched_wait w) noexcept {
            extras& x = extra();
            ::new (static_cast<void*>(x.watched)) watched_wait(std::move(w));
            queue_.spare |= watching;
        }
        watched_wait* watched() noexcept {
            if ((queue_.spare & watching) == 0)
                return nullptr;
            return std::launder(reinterpret_cast<watched_wait*>(extra().watched));
        }
        void unwatch() noexcept {
            if (watched_wait* w = watched()) {
                std::destroy_at(w);
                extra().loop = nullptr; // no timer armed
                queue_.spare &= static_cast<unsigned char>(~watching);
            }
        }
        // A watched wait destroyed before the call took what it yielded (its loop was torn down):
        // its frames leave the queue, or give back a slot handed to them while they still waited
        // (`queue_awaiter::leave`). A slot handed to a wait that had already ended, while the
        // watchdog beside it was still being stopped, has nobody else to give it back.
        void abandon_watch() noexcept {
            unwatch();
            owner().give_back_unclaimed(queue_.node());
        }
        // On the timer's loop: the call resumes there, and its frame is destroyed there.
        void disarm() noexcept {
            if (queue_.spare == has_room) { // room, and no watched wait in the loop's place
                extras& x = extra();
                if (x.loop && x.armed())
                    detail::loop_access::remove_timer(*x.loop, &x);
            }
        }

        // With its node; `spare`: `has_room` and `watching`. A watched wait (`wait_bounded`) waits
        // with this node, and `queue_` itself then never enters the queue.
        detail::queue_awaiter<bulkhead::state, true> queue_;
    };

public:
    /// Waits in the bulkhead's queue in the call's frame (see `wait_in_queue`).
    template <class R>
    class frame_wait : public wait_in_queue {
    public:
        using wait_in_queue::extra_bytes;
        frame_wait(const bulkhead& b, call_state& c, const context& ctx, std::optional<outcome<R>>&,
                   void* room)
            : wait_in_queue(b, c, ctx, room) {
            static_assert(sizeof(frame_wait) == sizeof(wait_in_queue), "its room is found past the base");
        }
        step await_resume(const bulkhead&, call_state& c, const context& ctx,
                          std::optional<outcome<R>>& result) {
            std::optional<failure> refusal;
            return kit::settled(this->resume(c, ctx, refusal), refusal, result);
        }
    };

private:
    // `leave` for a call that pinned its options: records its sample (with `adapt`), gives the slot
    // back, then the pin.
    template <class R>
    RESILIENCE_DETAIL_NOINLINE static void leave_pinned(state& s, call_state& c, const context& ctx,
                                                        outcome<R>& result) {
        const config* const cfg = std::exchange(c.cfg, nullptr);
        if (cfg->adaptive)
            finish_adaptive(s, *cfg, c.ticket, ctx, result);
        else
            s.release();
        detail::pinned<config>::unpin(cfg);
    }

    // With `adapt`: judges the outcome, records it and gives the slot back.
    template <class R>
    RESILIENCE_DETAIL_NOINLINE static void finish_adaptive(state& s, const config& cfg,
                                                           const typename state::ticket& t,
                                                           const context& ctx, outcome<R>& result) {
        detail::limit_verdict v = detail::limit_verdict::ignored;
        std::optional<failure> thrown;
        try {
            v = detail::judge_limit(*cfg.should_handle, result, ctx.stop_requested(), &ctx);
        } catch (...) {
            thrown.emplace(failure::current());
        }
        try {
            s.finish(t, v);
        } catch (...) {
            if (!thrown)
                thrown.emplace(failure::current());
        }
        if (thrown)
            result = outcome<R>{std::move(*thrown)};
    }

    // Takes the ticket of a call that has just taken its slot. A clock that throws gives the slot
    // back and makes its exception the call's result (false).
    static bool admit(call_state& c, const context& ctx, std::optional<failure>& result) {
        state& s = *c.held;
        try {
            c.ticket = s.admitted(*c.cfg, [&] { return kit::call_now(s.clock, ctx); });
            return true;
        } catch (...) {
            std::exchange(c.held, nullptr)->release();
            result.emplace(failure::current());
            return false;
        }
    }

    // `enter` for every call but a plain one that found a free slot: pins the options in force.
    // Made once per bulkhead type: the result type only says where a refusal goes.
    template <class R>
    RESILIENCE_DETAIL_NOINLINE step enter_pinned(call_state& c, const context& ctx,
                                                 std::optional<outcome<R>>& result) const {
        std::optional<failure> refusal;
        return kit::settled(enter_pinned(c, ctx, typeid(R), refusal), refusal, result);
    }
    RESILIENCE_DETAIL_NOINLINE step enter_pinned(call_state& c, const context& ctx,
                                                 const std::type_info& returned,
                                                 std::optional<failure>& result) const {
        state& s = this->held();
        const config* const cfg = c.cfg = s.pin().release();
        if (cfg->long_entry)
            return enter_adaptive(c, ctx, returned, result);
        if (ctx.stop_requested()) [[unlikely]] {
            result.emplace(detail::cancelled_failure(cfg->options.name));
            return step::done;
        }
        if (!s.try_acquire())
            return step::wait;
        c.held = &s;
        return step::proceed;
    }

    // `enter` with `adapt` or `priorities`: also checks the classifier's type and takes the call's
    // ticket (`adapt`), and admits the call by its class (`priorities`).
    step enter_adaptive(call_state& c, const context& ctx, const std::type_info& returned,
                        std::optional<failure>& result) const {
        state& s = this->held();
        const bool adaptive = c.cfg->adaptive;
        if ((adaptive && !c.cfg->should_handle->accepts(returned)) || ctx.stop_requested()) [[unlikely]] {
            result.emplace(detail::refused_before_admission(c.cfg->should_handle, returned, "bulkhead",
                                                            c.cfg->options.name));
            return step::done;
        }
        if (c.cfg->priority.enabled() ? !s.try_acquire_as(c.cfg->priority, ctx) : !s.try_acquire())
            return step::wait;
        c.held = &s;
        if (!adaptive)
            return step::proceed;
        return admit(c, ctx, result) ? step::proceed : step::done;
    }

    // An event about a call that waited since `*since` (if it waited at all: `since` may be null).
    static telemetry_event waited_on(const state& s, const config& cfg, const context& ctx,
                                     const typename C::time_point* since, telemetry_kind k,
                                     rejection_reason why) {
        return {.kind = k,
                .policy = "bulkhead",
                .name = cfg.options.name,
                .attempt = ctx.attempt(),
                .duration = since ? detail::saturating_nanoseconds(s.clock.now() - *since)
                                  : std::chrono::nanoseconds{},
                .reason = why};
    }

    // What a wait for a slot yields; every wait ends here (see bulkhead/state.hpp). Granted
    // and not stopped: the call holds the slot (`c.held`) and proceeds. Otherwise `result` says why:
    // a stop, or a refusal. `since`: when the call found no slot, for the listener (null without one).
    static step settle(state& s, const config& cfg, const context& ctx, detail::waiter_state admitted,
                       detail::listener_ref listener, const typename C::time_point* since, call_state& c,
                       std::optional<failure>& result) {
        if (admitted == detail::waiter_state::granted) {
            if (!ctx.stop_requested()) {
                // Held from here: given back by `leave`, or by the call state's destructor (also when
                // the clock throws while the event below is made).
                c.held = &s;
                if (listener) {
                    if (std::optional<failure> thrown =
                            detail::emit_caught(listener, s.clock,
                                                waited_on(s, cfg, ctx, since, telemetry_kind::queue_wait,
                                                          rejection_reason::no_capacity))) {
                        std::exchange(c.held, nullptr)->release();
                        result.emplace(std::move(*thrown));
                        return step::done;
                    }
                    if (ctx.stop_requested()) { // stopped by the listener: runs nothing
                        std::exchange(c.held, nullptr)->release();
                        result.emplace(detail::cancelled_failure(cfg.options.name));
                        return step::done;
                    }
                }
                return step::proceed;
            }
            s.release(); // the slot goes straight on to the next waiter
            admitted = detail::waiter_state::stopped;
        }
        if (admitted == detail::waiter_state::stopped)
            result.emplace(detail::cancelled_failure(cfg.options.name));
        else
            result.emplace(refuse(s, cfg, ctx, listener, since, s.reason_of(admitted)));
        return step::done;
    }

    // A refusal: told to `on_rejected`, then to the listener; what either throws is the call's
    // result instead.
    RESILIENCE_DETAIL_NOINLINE static failure refuse(const state& s, const config& cfg, const context& ctx,
                                                     detail::listener_ref listener,
                                                     const typename C::time_point* since,
                                                     rejection_reason why) {
        if (cfg.options.on_rejected) {
            try {
                cfg.options.on_rejected(
                    rejection_event{cfg.options.name, why}.with_properties(ctx.properties()));
            } catch (...) {
                return failure::current();
            }
        }
        failure refusal = failure::make(bulkhead_rejected_error{cfg.options.name, why});
        if (!listener)
            return refusal;
        return detail::refused(listener, s.clock,
                               waited_on(s, cfg, ctx, since, telemetry_kind::rejection, why),
                               std::move(refusal));
    }

    static_assert(bulkhead_options::max_limit <= state::slot_mask, "every accepted limit fits the slot word");

    static bulkhead_options validate(bulkhead_options o) {
        detail::validate_bulkhead_options(o);
        return o;
    }
};

bulkhead(bulkhead_options) -> bulkhead<steady_clock>;
template <clock C>
bulkhead(bulkhead_options, C) -> bulkhead<C>;

} // namespace resilience

// The compiled mode instantiates these once, in resilience::compiled: declared `extern template` in a
// user's file, defined in the library's (detail/config.hpp, RESILIENCE_INSTANTIATE).
#if RESILIENCE_EXTERN_TEMPLATES
namespace resilience::inline v0_2 {
RESILIENCE_INSTANTIATE class bulkhead<steady_clock>;
RESILIENCE_INSTANTIATE struct detail::bulkhead_state<steady_clock>;
RESILIENCE_INSTANTIATE void detail::delete_state(detail::bulkhead_state<steady_clock>*) noexcept;
RESILIENCE_INSTANTIATE class detail::queue_awaiter<detail::bulkhead_state<steady_clock>, false>;
RESILIENCE_INSTANTIATE class detail::queue_awaiter<detail::bulkhead_state<steady_clock>, true>;
RESILIENCE_INSTANTIATE void detail::stop_waiter(detail::bulkhead_state<steady_clock>&, detail::waiter&);
RESILIENCE_INSTANTIATE class detail::snapshot_cell<detail::bulkhead_config>;
RESILIENCE_INSTANTIATE class detail::pinned<detail::bulkhead_config>;
} // namespace resilience
#endif
