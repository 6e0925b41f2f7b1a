// SPDX-License-Identifier: MIT
/// \file bulkhead.hpp
/// `bulkhead`: a cap on how many calls run at once, with a bounded first-come-first-served queue,
/// and optionally a cap that moves with what the dependency manages (`adapt`).
#pragma once

#include "adaptive_limit.hpp"
#include "classifier.hpp"
#include "clock.hpp"
#include "concepts.hpp"
#include "context.hpp"
#include "detail/shared_handle.hpp"
#include "detail/stop.hpp"
#include "detail/time.hpp"
#include "detail/waiter_queue.hpp"
#include "error.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "task.hpp"
#include "telemetry.hpp"
#include "when_all.hpp"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <utility>

namespace resilience {

struct bulkhead_options {
    /// How many calls may run at once. Must be positive. 25 is resilience4j's default: a guess,
    /// like any default here; size it to what the dependency can serve. With `adapt`, the
    /// starting limit, within the algorithm's [`min`, `max`].
    std::size_t max_concurrent_calls = 25;
    /// How many more calls may wait for a slot; beyond that a call is refused at once
    /// (`rejection_reason::queue_full`). The default 0 refuses as soon as every slot is busy
    /// (`no_capacity`); `rs::unbounded_queue` never refuses for want of a queue place.
    std::size_t queue_limit = 0;
    /// How long a call may wait in the queue before it is refused (`queue_timeout`), at exactly
    /// that instant. Empty (the default): as long as it takes. Must be positive when set.
    std::optional<std::chrono::nanoseconds> queue_timeout{};
    /// Moves the limit with what the dependency manages: `rs::aimd{...}` or `rs::gradient{...}`
    /// (see adaptive_limit.hpp). Empty (the default): the limit stays `max_concurrent_calls`.
    adaptive_limit adapt{};
    /// Carried by the errors it makes (`policy_name()`) and by `name()`.
    std::string name{};
    /// Hears this bulkhead's `rejection`s and `queue_wait`s. Empty: the listener of a `telemetry`
    /// stage around the call, if any (see telemetry.hpp).
    telemetry_listener telemetry{};
};

namespace detail {

/// What the copies of a `bulkhead` share: its slots, the limit on them, and the queue of calls
/// waiting for one.
///
/// The slots live in one atomic word, so that while nobody waits a call takes and gives back its
/// slot with one atomic operation and never touches the mutex:
///
///     bit 63       `waiting`: someone is queued; releases must come through the mutex
///     bit 62       `retired`: the last hold went (see below)
///     bits 0..61   slots taken, including ones handed to waiters not yet resumed
///
/// A slot is a hold on the state (the lifetime rule, detail/shared_handle.hpp), folded into the
/// atomic operation that takes it: when the last hold of the handles (and of waiting calls) goes
/// while calls hold slots, `retired` is raised in the word, and the release that gives back the
/// last slot deletes the state. Only one of the two finds both "no hold" and "no slot", so exactly
/// one deletes it. A retired state has no queue (a waiting call holds the state) and takes no new
/// call (nothing can reach it but the calls holding its slots).
///
/// The limit is an atomic of its own, read relaxed by the fast path and written only with `mutex`
/// held (and only when `adapt` is set: otherwise it never changes).
///
/// Invariants:
/// - Whenever `mutex` is free, `waiting` is set exactly when the queue is non-empty. It is raised
///   and lowered only with `mutex` held: raised in the same atomic step that finds every slot
///   taken, before the waiter is queued, and lowered by whoever empties the queue. So a release
///   that needs no mutex either freed its slot before that step (which then takes the slot
///   instead of queueing) or finds the bit and hands its slot over through the mutex.
/// - Whenever `mutex` is free and the queue is non-empty, slots taken >= limit: nobody waits
///   while a slot is free. A release through the mutex hands its slot over only when that keeps
///   the count within the limit (after a shrink it just gives it back), and a limit that grows
///   hands the new slots to waiters in the same locked step.
/// - While `waiting` is set, only `mutex` holders write the word: the fast paths leave it alone.
/// - `word < limit` says "a slot is free and nobody waits" in one comparison, as `limit` is
///   below bit 63. Slots taken may exceed the limit after it shrank: calls already admitted keep
///   their slots.
template <clock C>
struct bulkhead_state : shared_state {
    bulkhead_state(bulkhead_options o, C c)
        : limit(clear_of_waiting(o.max_concurrent_calls)), options(std::move(o)), clock(std::move(c)),
          algorithm(options.adapt, options.max_concurrent_calls), adaptive(algorithm.adaptive()),
          should_handle(limit_classifier(options.adapt)) {}

#ifndef NDEBUG
    ~bulkhead_state() {
        assert(queue.empty() && (word.load(std::memory_order_relaxed) & slot_mask) == 0);
    }
#endif

    static constexpr std::uint64_t waiting = std::uint64_t{1} << 63;
    static constexpr std::uint64_t retired = std::uint64_t{1} << 62;
    static constexpr std::uint64_t slot_mask = retired - 1;

    /// The last hold went: deletable now unless calls hold slots, the last of which deletes it.
    bool last_hold_dropped() noexcept {
        return (word.fetch_or(retired, std::memory_order_acq_rel) & slot_mask) == 0;
    }

    /// What an admitted call remembers for its sample: when it took its slot (in clock ticks since
    /// the epoch), and the algorithm's epoch then. Left uninitialised in a call's state, so a
    /// bulkhead without `adapt` pays nothing for it.
    struct ticket {
        typename C::duration::rep start;
        std::uint64_t epoch;
    };

    // First: on the cache line of the state's count of holds (see `shared_state`).
    std::atomic<std::uint64_t> word{0};
    std::atomic<std::uint64_t> limit;    // written under `mutex`
    std::atomic<std::uint64_t> epoch{0}; // `algorithm.epoch()`, for admissions without the lock
    const bulkhead_options options;
    C clock;
    limit_algorithm algorithm; // guarded by `mutex`
    const bool adaptive;
    const classifier* const should_handle; // the algorithm's, in `options`; null without `adapt`
    std::mutex mutex;
    waiter_queue queue;

    static std::uint64_t clear_of_waiting(std::size_t n) noexcept {
        return std::min<std::uint64_t>(n, slot_mask);
    }

    [[nodiscard]] std::size_t in_flight() const noexcept {
        return static_cast<std::size_t>(word.load(std::memory_order_relaxed) & slot_mask);
    }
    [[nodiscard]] std::size_t current_limit() const noexcept {
        return static_cast<std::size_t>(limit.load(std::memory_order_relaxed));
    }

    /// Takes a slot if one is free and nobody waits, without waiting or locking. False: the
    /// caller must take the waiting path (as `bulkhead::run` does), which decides again under
    /// the mutex. A slot taken is given back with `release` (or `finish`).
    [[nodiscard]] bool try_acquire() noexcept {
        std::uint64_t seen = word.load(std::memory_order_relaxed);
        const std::uint64_t cap = limit.load(std::memory_order_relaxed);
        // Acquire: whatever the slot's previous holder did happens before this call runs.
        while (seen < cap)
            if (word.compare_exchange_weak(seen, seen + 1, std::memory_order_acquire,
                                           std::memory_order_relaxed))
                return true;
        return false;
    }

    /// Gives a slot back. A freed slot goes to the oldest waiter without ever becoming free, so
    /// no newcomer can take it between the release and the waiter's resumption. The last slot of a
    /// retired state deletes it: touch nothing of it after this.
    void release() {
        std::uint64_t seen = word.load(std::memory_order_relaxed);
        while ((seen & waiting) == 0)
            // Acquire too (free where a read-modify-write is a full barrier): the last slot of a
            // retired state deletes it after every other holder's writes.
            if (word.compare_exchange_weak(seen, seen - 1, std::memory_order_acq_rel,
                                           std::memory_order_relaxed)) {
                if (seen - 1 == retired) [[unlikely]]
                    delete_state(this);
                return;
            }
        release_to_waiter();
    }

    // ---- adaptation: only when `adaptive` ----

    /// The ticket of a call admitted now. `now` is read only when the algorithm times calls.
    template <class Now>
    ticket admitted(Now&& now) const {
        ticket t{};
        if (algorithm_times_calls())
            t.start = now().time_since_epoch().count();
        t.epoch = epoch.load(std::memory_order_relaxed);
        return t;
    }
    bool algorithm_times_calls() const noexcept { return times_calls_; }

    /// Ends a call admitted with `t`: records its sample (unless `ignored`) and gives its slot
    /// back, in one locked step when the sample may change the limit. A limit that grew hands its
    /// new slots to waiters at once. The slot is given back even when the clock throws.
    void finish(const ticket& t, limit_verdict v) {
        if (v == limit_verdict::ignored) {
            release();
            return;
        }
        std::chrono::nanoseconds latency{};
        if (times_calls_) {
            try {
                latency = std::max(
                    saturating_nanoseconds(clock.now().time_since_epoch() - typename C::duration{t.start}),
                    std::chrono::nanoseconds::zero());
            } catch (...) {
                release();
                throw;
            }
        }
        const bool failed = v == limit_verdict::failure;
        // A sample that cannot change anything (an AIMD success while nothing waits) takes no lock:
        // it is recorded, as nothing, at the instant of these loads.
        if (algorithm.inert(latency, failed, limited_now())) {
            release();
            return;
        }
        waiter* woken = nullptr;
        bool last = false;
        {
            std::lock_guard lock(mutex);
            const limit_sample sample{
                .latency = latency, .failed = failed, .limited = limited_locked(), .epoch = t.epoch};
            if (algorithm.record(sample)) {
                limit.store(clear_of_waiting(algorithm.limit()), std::memory_order_relaxed);
                epoch.store(algorithm.epoch(), std::memory_order_relaxed);
            }
            woken = release_locked(&last);
            woken = grant_locked(woken);
            waiter_left_locked();
        }
        if (last) [[unlikely]] { // a retired state's last slot: nobody waits, nothing to wake
            delete_state(this);
            return;
        }
        wake_chain(woken);
    }

    // `release` with someone queued: through the mutex. Kept out of `release`, so that the path
    // taken while nobody waits stays small enough to inline.
    void release_to_waiter() {
        waiter* woken = nullptr;
        bool last = false;
        {
            std::lock_guard lock(mutex);
            woken = release_locked(&last);
            waiter_left_locked();
        }
        if (last) [[unlikely]] {
            delete_state(this);
            return;
        }
        wake_chain(woken);
    }

    // ---- the waiter_queue protocol; `mutex` held, except for take_back_grant ----
    /// A waiter destroyed after its slot was handed to it and before it resumed (its event loop
    /// torn down): the slot goes back.
    void take_back_grant() { release(); }
    waiter_state decide_locked(waiter&) noexcept {
        if (queue.empty() && take_locked(false))
            return waiter_state::granted;
        if (queue.size() >= options.queue_limit)
            return waiter_state::rejected;
        return waiter_state::idle;
    }
    // A release that needed no mutex may have freed a slot since `decide_locked`: the waiter
    // takes it instead of queueing, since no release would hand it over.
    waiter_state enqueue_locked(waiter& w) noexcept {
        if (queue.empty() && take_locked(true))
            return waiter_state::granted;
        queue.push_back(w);
        return waiter_state::queued;
    }

    void waiter_left_locked() noexcept {
        if (queue.empty())
            word.fetch_and(~waiting, std::memory_order_relaxed);
    }

    // `mutex` held, queue empty (so `waiting` is clear). Takes a free slot and says true; else,
    // when `raise`, raises `waiting` in the same atomic step that found every slot taken.
    bool take_locked(bool raise) noexcept {
        std::uint64_t seen = word.load(std::memory_order_relaxed);
        const std::uint64_t cap = limit.load(std::memory_order_relaxed);
        for (;;) {
            const bool free = seen < cap;
            if (!free && !raise)
                return false;
            if (word.compare_exchange_weak(seen, free ? seen + 1 : seen | waiting, std::memory_order_acquire,
                                           std::memory_order_relaxed))
                return free;
        }
    }

    void expire(waiter& w) {
        bool wake;
        {
            std::lock_guard lock(mutex);
            wake = queue.withdraw(w, waiter_state::expired);
            waiter_left_locked();
        }
        if (wake)
            w.wake();
    }

private:
    const bool times_calls_ = algorithm.adaptive() && algorithm.needs_latency();

    // Is the limit what holds calls back: someone queued, or every slot taken (this call's own
    // included)? Without the lock: at the instant of the loads.
    bool limited_now() const noexcept {
        const std::uint64_t w = word.load(std::memory_order_relaxed);
        return (w & waiting) != 0 || (w & slot_mask) >= limit.load(std::memory_order_relaxed);
    }
    bool limited_locked() const noexcept {
        return !queue.empty() ||
               (word.load(std::memory_order_relaxed) & slot_mask) >= limit.load(std::memory_order_relaxed);
    }

    // `mutex` held. Gives back one slot: to the oldest waiter when the count stays within the limit
    // (the slot changes hands, the count is kept), else to nobody. Returns the waiter to wake;
    // `*last` says the slot was a retired state's last (it must then be deleted, once unlocked).
    waiter* release_locked(bool* last) noexcept {
        const std::uint64_t taken = word.load(std::memory_order_relaxed) & slot_mask;
        if (!queue.empty() && taken - 1 < limit.load(std::memory_order_relaxed)) {
            waiter* next = queue.pop_front();
            next->state = waiter_state::granted;
            next->next = nullptr;
            return next;
        }
        *last = word.fetch_sub(1, std::memory_order_acq_rel) - 1 == retired;
        return nullptr;
    }

    // `mutex` held. Hands the slots a grown limit freed to the oldest waiters, appending them to
    // the chain `woken` (linked through `waiter::next`, which a granted waiter no longer uses).
    waiter* grant_locked(waiter* woken) noexcept {
        waiter* tail = woken;
        while (!queue.empty() &&
               (word.load(std::memory_order_relaxed) & slot_mask) < limit.load(std::memory_order_relaxed)) {
            waiter* next = queue.pop_front();
            next->state = waiter_state::granted;
            next->next = nullptr;
            word.fetch_add(1, std::memory_order_relaxed);
            if (tail)
                tail->next = next;
            else
                woken = next;
            tail = next;
        }
        return woken;
    }

    // Wakes a chain of granted waiters, in order, with `mutex` released. Each link is read before
    // its waiter is woken: once woken, it may run and end at once.
    static void wake_chain(waiter* w) {
        while (w) {
            waiter* next = w->next;
            w->wake();
            w = next;
        }
    }
};

} // namespace detail

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
///
/// A copyable handle: copies share one bulkhead (one set of slots), which is thread-safe; event
/// loops on several threads may share it, and each waiter is resumed on the loop it waited on.
/// While nobody waits, a call takes and gives back its slot with one atomic operation each,
/// without a lock.
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
    using handle = detail::shared_handle<bulkhead<C>, state>;

public:
    /// The default options: 25 calls at once, none queued.
    bulkhead() requires std::default_initializable<C> : bulkhead(bulkhead_options{}) {}
    explicit bulkhead(bulkhead_options options, C clock = C{})
        : handle(handle::make_state(validate(std::move(options)), std::move(clock))) {}

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
    [[nodiscard]] const bulkhead_options& options() const noexcept { return this->held().options; }
    [[nodiscard]] const std::string& name() const noexcept { return this->held().options.name; }
    [[nodiscard]] const C& clock() const noexcept { return this->held().clock; }

    // ---- the policy protocol (see policy.hpp) ----
    struct call_state {
        state* held = nullptr;         // the bulkhead whose slot this call holds (a hold on it)
        typename state::ticket ticket; // with `adapt`: what the call's sample needs
        call_state() = default;
        call_state(const call_state&) = delete;
        call_state& operator=(const call_state&) = delete;
        ~call_state() {
            if (held)
                held->release(); // the call never finished (its loop was torn down)
        }
    };

    /// A free slot with nobody queued is taken at once; anything else waits in `frame_wait`, or in
    /// `run` for a bulkhead that times or bounds the wait (see `waits_in_frame`).
    template <class R>
    step enter(call_state& c, const context& ctx, const context*&, std::optional<outcome<R>>& result) const {
        state& s = this->held();
        if (s.adaptive)
            return enter_adaptive(c, ctx, result);
        if (ctx.stop_requested()) [[unlikely]] {
            detail::set_cancelled(result, name());
            return step::done;
        }
        if (!s.try_acquire())
            return step::wait;
        c.held = &s;
        return step::proceed;
    }
    /// Gives the slot back; with `adapt`, records the call's outcome first. A `should_handle` (or a
    /// clock) that throws makes its exception the call's result, once the slot is given back.
    template <class R>
    step leave(call_state& c, const context& ctx, outcome<R>& result) const {
        state* s = std::exchange(c.held, nullptr);
        if (s->adaptive)
            finish_adaptive(*s, c.ticket, ctx, result);
        else
            s->release();
        return step::proceed;
    }

    /// Whether a call that found no free slot waits for one in the pipeline's frame (`frame_wait`):
    /// a bulkhead without `adapt` does, and with a `queue_timeout` when its clock arms timers on
    /// the loop the call runs on (`steady_clock`, a simulation's clock); the others wait in `run`.
    bool waits_in_frame(const context&) const noexcept {
        const state& s = this->held();
        return !s.adaptive && (!s.options.queue_timeout || timer_loop_here(s.clock));
    }
    /// Queues for a slot in the pipeline's frame; yields `step::proceed` holding it, or
    /// `step::done` with the refusal (`bulkhead_rejected_error`) or the stop (`cancelled_error`)
    /// in `result`. With a `queue_timeout` a timer on the loop withdraws the call at its deadline,
    /// and with a telemetry listener the wait is timed: both are kept in a block of their own from
    /// the frame cache, taken only then. Not movable: the queue's node is inside it. Holds the
    /// bulkhead while it lives (taken at construction, given back at the end of its destructor: no
    /// member of its own), so a call destroyed while it waits leaves the queue of a live one.
    template <class R>
    class frame_wait {
    public:
        frame_wait(const bulkhead& b, call_state& c, const context& ctx, std::optional<outcome<R>>& result)
            : call_(c), ctx_(ctx), result_(result), queue_(b.held(), node_, ctx.stop_token()) {
            detail::add_hold(b.held(), true);
        }
        frame_wait(const frame_wait&) = delete;
        frame_wait& operator=(const frame_wait&) = delete;
        ~frame_wait() {
            state& s = owner();
            let_go();
            queue_.leave(); // what its destructor would do, while the bulkhead is still held
            detail::drop_hold(s, true);
        }

        bool await_ready() {
            state& s = owner();
            if (detail::listener_for(s.options.telemetry, ctx_))
                extra().queued_at = s.clock.now(); // as `run`: from the moment the call found no slot
            if (queue_.await_ready())
                return true;
            if (s.options.queue_timeout)
                arm(*s.options.queue_timeout); // only a call that must wait pays for the timer
            return false;
        }
        bool await_suspend(std::coroutine_handle<> h) { return queue_.await_suspend(h); }
        step await_resume() {
            disarm();
            state& s = owner();
            detail::waiter_state admitted = queue_.await_resume();
            const telemetry_listener* const listener =
                extra_ ? detail::listener_for(s.options.telemetry, ctx_) : nullptr;
            if (admitted == detail::waiter_state::granted) {
                if (!ctx_.stop_requested()) {
                    // Held from here: given back by `leave`, or by the state's destructor (also when
                    // the clock throws while the event below is made).
                    call_.held = &s;
                    if (listener) {
                        if (std::optional<failure> thrown =
                                detail::emit_caught(listener, s.clock, waited(telemetry_kind::queue_wait))) {
                            std::exchange(call_.held, nullptr)->release();
                            result_.emplace(std::move(*thrown));
                            return step::done;
                        }
                        if (ctx_.stop_requested()) { // stopped by the listener: runs nothing
                            std::exchange(call_.held, nullptr)->release();
                            detail::set_cancelled(result_, s.options.name);
                            return step::done;
                        }
                    }
                    return step::proceed;
                }
                s.release();
                admitted = detail::waiter_state::stopped;
            }
            if (admitted == detail::waiter_state::stopped) {
                detail::set_cancelled(result_, s.options.name);
            } else {
                const rejection_reason why = reason_of(s, admitted);
                failure refusal = failure::make(bulkhead_rejected_error{s.options.name, why});
                result_.emplace(listener ? detail::refused(listener, s.clock,
                                                           waited(telemetry_kind::rejection, why),
                                                           std::move(refusal))
                                         : std::move(refusal));
            }
            return step::done;
        }

    private:
        // What only some waits need: the timer of a queue timeout and the loop it is armed on, and
        // for a listener the time the call found no slot.
        struct extras {
            detail::timer_node timer;
            event_loop* loop = nullptr; // null: no timer armed
            typename C::time_point queued_at{};
        };

        state& owner() const noexcept { return queue_.owner(); }
        extras& extra() {
            if (!extra_)
                extra_ = ::new (detail::frame_cache::allocate(sizeof(extras))) extras{};
            return *extra_;
        }

        // The deadline: the clock's time now plus the queue timeout, on the loop the call runs
        // on (checked by `waits_in_frame`), where the timer fires and the call resumes.
        void arm(std::chrono::nanoseconds timeout) {
            state& s = owner();
            const auto deadline = std::chrono::duration_cast<std::chrono::nanoseconds>(
                detail::add_saturating(s.clock.now(), timeout).time_since_epoch());
            extras& x = extra();
            x.timer.when = deadline;
            x.timer.owner = this;
            x.timer.fire = [](detail::timer_node* n) {
                auto* self = static_cast<frame_wait*>(n->owner);
                self->owner().expire(self->node_); // nothing if the node left the queue already
            };
            event_loop* const here = event_loop::current();
            detail::loop_access::add_timer(*here, &x.timer);
            x.loop = here;
        }
        // On the timer's loop: the call resumes there, and its frame is destroyed there.
        void disarm() noexcept {
            if (extra_ && extra_->loop && extra_->timer.armed())
                detail::loop_access::remove_timer(*extra_->loop, &extra_->timer);
        }
        void let_go() noexcept {
            disarm();
            if (extra_) {
                std::destroy_at(extra_);
                detail::frame_cache::deallocate(std::exchange(extra_, nullptr), sizeof(extras));
            }
        }

        telemetry_event waited(telemetry_kind k, rejection_reason why = rejection_reason::no_capacity) const {
            return waited_on(owner(), ctx_, &extra_->queued_at, k, why);
        }

        call_state& call_;
        const context& ctx_;
        std::optional<outcome<R>>& result_;
        extras* extra_ = nullptr; // with a queue timeout or a listener, while the call waits
        detail::waiter node_;
        detail::queue_awaiter<bulkhead::state> queue_; // after the node it queues
    };

    /// The waiting form: queues for a slot, then runs `next` holding it.
    template <class Next>
    task<detail::next_outcome_t<Next>> run(Next next, const context& ctx) const {
        using detail::waiter_state;
        const std::stop_token& token = ctx.stop_token();
        state& s = this->held();
        using value_type = detail::next_value_t<Next>;
        if (token.stop_requested() || (s.adaptive && !s.should_handle->template accepts<value_type>()))
            co_return refused_before_admission<value_type>();
        detail::state_hold<state> waiting; // taken by a call that waits: first, given back last
        detail::waiter node;
        waiter_state admitted = waiter_state::granted;
        const telemetry_listener* const listener = detail::listener_for(s.options.telemetry, ctx);
        std::optional<typename C::time_point> queued_at; // for a listener, when the call found no slot
        if (!s.try_acquire()) {
            waiting.take(s);
            if (listener)
                queued_at = s.clock.now();
            if (!s.options.queue_timeout) {
                admitted = co_await detail::queue_awaiter<state>{s, node, token};
            } else {
                // Decided under the lock first: only a call that must wait pays for the timer that
                // bounds the wait.
                {
                    std::lock_guard lock(s.mutex);
                    admitted = s.decide_locked(node);
                }
                if (admitted == waiter_state::idle)
                    admitted = co_await wait_bounded(s, node, token);
            }
        }
        if (admitted == waiter_state::stopped)
            co_return failure::make(cancelled_error{s.options.name});
        const typename C::time_point* since = queued_at ? &*queued_at : nullptr;
        if (admitted != waiter_state::granted) {
            const rejection_reason why = reason_of(s, admitted);
            co_return detail::refused(listener, s.clock,
                                      waited_on(s, ctx, since, telemetry_kind::rejection, why),
                                      failure::make(bulkhead_rejected_error{s.options.name, why}));
        }
        call_state held;
        held.held = &s; // given back by `leave`, or by its destructor if the call ends first
        if (token.stop_requested())
            co_return failure::make(cancelled_error{s.options.name});
        if (since)
            if (std::optional<failure> thrown = detail::emit_caught(
                    listener, s.clock,
                    waited_on(s, ctx, since, telemetry_kind::queue_wait, rejection_reason::no_capacity)))
                co_return std::move(*thrown); // the slot goes back with `held`
        if (since && token.stop_requested()) // stopped by the listener: runs nothing
            co_return failure::make(cancelled_error{name()});
        std::optional<detail::next_outcome_t<Next>> refused;
        if (s.adaptive && !admit(held, ctx, refused))
            co_return std::move(*refused);
        detail::next_outcome_t<Next> result = co_await next(ctx);
        leave(held, ctx, result);
        co_return result;
    }

private:
    // Whether the clock's timers are those of the loop this thread runs: a queued call's timer
    // then fires where the call resumes. False for a clock without loop timers, or outside a loop.
    static bool timer_loop_here(const C& clock) noexcept {
        if constexpr (detail::loop_timer_clock<C>) {
            event_loop* const here = event_loop::current();
            try {
                return here && clock.timer_loop() == here;
            } catch (...) {
                return false; // `run` reports what the clock thinks of this loop
            }
        } else {
            return false;
        }
    }

    // With `adapt`: judges the outcome, records it and gives the slot back.
    template <class R>
    RESILIENCE_DETAIL_NOINLINE static void finish_adaptive(state& s, const typename state::ticket& t,
                                                           const context& ctx, outcome<R>& result) {
        detail::limit_verdict v = detail::limit_verdict::ignored;
        std::optional<failure> thrown;
        try {
            v = detail::judge_limit(*s.should_handle, result, ctx.stop_requested());
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
    template <class R>
    bool admit(call_state& c, const context& ctx, std::optional<outcome<R>>& result) const {
        state& s = *c.held;
        try {
            c.ticket = s.admitted([&] { return detail::call_now(s.clock, ctx); });
            return true;
        } catch (...) {
            std::exchange(c.held, nullptr)->release();
            result.emplace(failure::current());
            return false;
        }
    }

    // A stopped caller, or an outcome classifier for another result type: refused before any slot.
    template <class R>
    // The classifier's type is asked first: it does not change, while a stop may arrive between
    // two checks.
    failure refused_before_admission() const {
        if (this->held().adaptive && !this->held().should_handle->template accepts<R>())
            return this->held().should_handle->template mismatch<R>("bulkhead", this->held().options.name);
        return failure::make(cancelled_error{name()});
    }

    // `enter` with `adapt`: also checks the classifier's type, and takes the call's ticket.
    template <class R>
    RESILIENCE_DETAIL_NOINLINE step enter_adaptive(call_state& c, const context& ctx,
                                                   std::optional<outcome<R>>& result) const {
        state& s = this->held();
        if (!s.should_handle->template accepts<R>() || ctx.stop_requested()) [[unlikely]] {
            result.emplace(refused_before_admission<R>());
            return step::done;
        }
        if (!s.try_acquire())
            return step::wait;
        c.held = &s;
        return admit(c, ctx, result) ? step::proceed : step::done;
    }

    // An event about a call that waited since `*since` (if it waited at all: `since` may be null).
    static telemetry_event waited_on(const state& s, const context& ctx, const typename C::time_point* since,
                                     telemetry_kind k, rejection_reason why) {
        return {.kind = k,
                .policy = "bulkhead",
                .name = s.options.name,
                .attempt = ctx.attempt(),
                .duration = since ? detail::saturating_nanoseconds(s.clock.now() - *since)
                                  : std::chrono::nanoseconds{},
                .reason = why};
    }

    static rejection_reason reason_of(const state& s, detail::waiter_state refused) noexcept {
        if (refused == detail::waiter_state::expired)
            return rejection_reason::queue_timeout;
        return s.options.queue_limit == 0 ? rejection_reason::no_capacity : rejection_reason::queue_full;
    }

    // Waits in the queue with a watchdog beside it that withdraws the waiter at the deadline.
    // Whichever moves the node first (its turn, a stop, the deadline) wins; the other finds it
    // moved on. The watchdog's sleep is stopped once the wait is over, and when_all waits for it,
    // so nothing outlives the call.
    static task<detail::waiter_state> wait_bounded(state& s, detail::waiter& node,
                                                   const std::stop_token& token) {
        const auto deadline = detail::add_saturating(s.clock.now(), *s.options.queue_timeout);
        detail::pooled_stop_source done;
        try {
            auto [admitted, ignored] =
                co_await when_all(wait_in_queue(s, node, token, done), watch(s, node, deadline, done));
            (void)ignored;
            co_return admitted;
        } catch (...) {
            // Only the watchdog can throw (a clock that cannot sleep here): keep no slot.
            if (node.state == detail::waiter_state::granted)
                s.release();
            throw;
        }
    }
    static task<detail::waiter_state> wait_in_queue(state& s, detail::waiter& node,
                                                    const std::stop_token& token,
                                                    detail::pooled_stop_source& done) {
        const detail::waiter_state admitted = co_await detail::queue_awaiter<state>{s, node, token};
        done.request_stop();
        co_return admitted;
    }
    static task<void> watch(state& s, detail::waiter& node, typename C::time_point deadline,
                            detail::pooled_stop_source& done) {
        const std::stop_token until = done.get_token();
        try {
            co_await s.clock.sleep_until(deadline, until);
        } catch (...) {
            s.expire(node); // the waiter must not stay queued behind a watchdog that failed
            throw;
        }
        if (!until.stop_requested())
            s.expire(node);
    }

    static bulkhead_options validate(bulkhead_options o) {
        const std::string label = detail::policy_label("bulkhead", o.name);
        if (o.max_concurrent_calls == 0)
            throw std::invalid_argument(label + ": max_concurrent_calls must be positive, got 0");
        if (o.queue_timeout && *o.queue_timeout <= std::chrono::nanoseconds::zero())
            throw std::invalid_argument(label + ": queue_timeout must be positive, got " +
                                        std::to_string(o.queue_timeout->count()) + "ns");
        detail::validate_adaptive_limit(o.adapt, o.max_concurrent_calls, label);
        return o;
    }
};

bulkhead(bulkhead_options)->bulkhead<steady_clock>;
template <clock C>
bulkhead(bulkhead_options, C) -> bulkhead<C>;

} // namespace resilience
