// SPDX-License-Identifier: MIT
/// \file bulkhead.hpp
/// `bulkhead`: a cap on how many calls run at once, with a bounded first-come-first-served queue.
#pragma once

#include "clock.hpp"
#include "concepts.hpp"
#include "context.hpp"
#include "detail/stop.hpp"
#include "detail/time.hpp"
#include "detail/waiter_queue.hpp"
#include "error.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "task.hpp"
#include "when_all.hpp"

#include <algorithm>
#include <atomic>
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
    /// like any default here; size it to what the dependency can serve.
    std::size_t max_concurrent_calls = 25;
    /// How many more calls may wait for a slot; beyond that a call is refused at once
    /// (`rejection_reason::queue_full`). The default 0 refuses as soon as every slot is busy
    /// (`no_capacity`); `rs::unbounded_queue` never refuses for want of a queue place.
    std::size_t queue_limit = 0;
    /// How long a call may wait in the queue before it is refused (`queue_timeout`), at exactly
    /// that instant. Empty (the default): as long as it takes. Must be positive when set.
    std::optional<std::chrono::nanoseconds> queue_timeout{};
    /// Carried by the errors it makes (`policy_name()`) and by `name()`.
    std::string name{};
};

namespace detail {

/// What the copies of a `bulkhead` share: its slots, and the queue of calls waiting for one.
///
/// The slots live in one atomic word, so that while nobody waits a call takes and gives back its
/// slot with one atomic operation and never touches the mutex:
///
///     bit 63       `waiting`: someone is queued; releases must come through the mutex
///     bits 0..62   slots taken, including ones handed to waiters not yet resumed
///
/// Invariants:
/// - Whenever `mutex` is free, `waiting` is set exactly when the queue is non-empty. It is raised
///   and lowered only with `mutex` held: raised in the same atomic step that finds every slot
///   taken, before the waiter is queued, and lowered by whoever empties the queue. So a release
///   that needs no mutex either freed its slot before that step (which then takes the slot
///   instead of queueing) or finds the bit and hands its slot over through the mutex.
/// - While `waiting` is set, only `mutex` holders write the word: the fast paths leave it alone.
/// - `word < limit` says "a slot is free and nobody waits" in one comparison, as `limit` is
///   below bit 63.
template <clock C>
struct bulkhead_state {
    bulkhead_state(bulkhead_options o, C c)
        : options(std::move(o)), clock(std::move(c)),
          limit(std::min<std::uint64_t>(options.max_concurrent_calls, slot_mask)) {}

    static constexpr std::uint64_t waiting = std::uint64_t{1} << 63;
    static constexpr std::uint64_t slot_mask = waiting - 1;

    const bulkhead_options options;
    C clock;
    const std::uint64_t limit; // max_concurrent_calls, kept clear of the `waiting` bit
    std::mutex mutex;
    waiter_queue queue;
    std::atomic<std::uint64_t> word{0};

    [[nodiscard]] std::size_t in_flight() const noexcept {
        return static_cast<std::size_t>(word.load(std::memory_order_relaxed) & slot_mask);
    }

    /// Takes a slot if one is free and nobody waits, without waiting or locking. False: the
    /// caller must take the waiting path (as `bulkhead::run` does), which decides again under
    /// the mutex. A slot taken is given back with `release`.
    [[nodiscard]] bool try_acquire() noexcept {
        std::uint64_t seen = word.load(std::memory_order_relaxed);
        // Acquire: whatever the slot's previous holder did happens before this call runs.
        while (seen < limit)
            if (word.compare_exchange_weak(seen, seen + 1, std::memory_order_acquire,
                                           std::memory_order_relaxed))
                return true;
        return false;
    }

    /// Gives a slot back. A freed slot goes to the oldest waiter without ever becoming free, so
    /// no newcomer can take it between the release and the waiter's resumption.
    void release() {
        std::uint64_t seen = word.load(std::memory_order_relaxed);
        while ((seen & waiting) == 0)
            if (word.compare_exchange_weak(seen, seen - 1, std::memory_order_release,
                                           std::memory_order_relaxed))
                return;
        waiter* next = nullptr;
        {
            std::lock_guard lock(mutex);
            next = queue.pop_front();
            if (next)
                next->state = waiter_state::granted; // the slot changes hands: count kept
            else
                word.fetch_sub(1, std::memory_order_release);
            waiter_left_locked();
        }
        if (next)
            next->wake();
    }

    // ---- the waiter_queue protocol; `mutex` held ----
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
        for (;;) {
            const bool free = seen < limit;
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
///
/// A copyable handle: copies share one bulkhead (one set of slots), which is thread-safe; event
/// loops on several threads may share it, and each waiter is resumed on the loop it waited on.
/// While nobody waits, a call takes and gives back its slot with one atomic operation each,
/// without a lock.
/// Constructing one starts no timer. A call made through a handle needs only the shared state to
/// live (some copy of the handle), not that handle object. `C` is
/// used only for `queue_timeout` (its sleeps run on the waiter's loop); copies share one clock
/// object, which must be usable from every thread that calls through the bulkhead.
///
///     rs::bulkhead db{{.max_concurrent_calls = 8, .queue_limit = 32, .queue_timeout = 200ms}};
///     auto rows = co_await db.execute(query);          // throws bulkhead_rejected_error when full
///     auto r = co_await db.execute_outcome(query);     // or reports it without throwing
template <clock C = steady_clock>
class bulkhead : public policy_base<bulkhead<C>> {
    using state = detail::bulkhead_state<C>;

public:
    /// The default options: 25 calls at once, none queued.
    bulkhead() requires std::default_initializable<C> : bulkhead(bulkhead_options{}) {}
    explicit bulkhead(bulkhead_options options, C clock = C{})
        : state_(std::make_shared<state>(validate(std::move(options)), std::move(clock))) {}

    /// Calls holding a slot now (including one just handed to a waiter not yet resumed).
    [[nodiscard]] std::size_t in_flight() const noexcept { return state_->in_flight(); }
    /// Calls waiting for a slot now.
    [[nodiscard]] std::size_t queued() const {
        std::lock_guard lock(state_->mutex);
        return state_->queue.size();
    }
    [[nodiscard]] const bulkhead_options& options() const noexcept { return state_->options; }
    [[nodiscard]] const std::string& name() const noexcept { return state_->options.name; }
    [[nodiscard]] const C& clock() const noexcept { return state_->clock; }

    /// A copy that does not own the shared state: copying it touches no reference count. A call
    /// holds one in its frame (see `detail::stages_of`); it is valid while some owning copy lives.
    [[nodiscard]] bulkhead borrow() const noexcept {
        return bulkhead{std::shared_ptr<state>(std::shared_ptr<void>{}, state_.get())};
    }
    /// Copies of one bulkhead (borrowed or not) are equal: they share its slots and queue.
    friend bool operator==(const bulkhead& a, const bulkhead& b) noexcept { return a.state_ == b.state_; }

    // ---- the policy protocol (see policy.hpp) ----
    struct call_state {
        state* held = nullptr; // the bulkhead whose slot this call holds
        call_state() = default;
        call_state(const call_state&) = delete;
        call_state& operator=(const call_state&) = delete;
        ~call_state() {
            if (held)
                held->release(); // the call never finished (its loop was torn down)
        }
    };

    /// A free slot with nobody queued is taken at once; anything else waits in `run`.
    template <class R>
    step enter(call_state& c, const context& ctx, const context*&, std::optional<outcome<R>>& result) const {
        if (ctx.stop_requested()) {
            result.emplace(failure::make(cancelled_error{name()}));
            return step::done;
        }
        if (!state_->try_acquire())
            return step::wait;
        c.held = state_.get();
        return step::proceed;
    }
    template <class R>
    step leave(call_state& c, const context&, outcome<R>&) const {
        std::exchange(c.held, nullptr)->release();
        return step::proceed;
    }

    /// The waiting form: queues for a slot, then runs `next` holding it.
    template <class Next>
    task<detail::next_outcome_t<Next>> run(Next next, const context& ctx) const {
        using detail::waiter_state;
        const std::stop_token& token = ctx.stop_token();
        if (token.stop_requested())
            co_return failure::make(cancelled_error{name()});
        state& s = *state_;
        detail::waiter node;
        waiter_state admitted = waiter_state::granted;
        if (!s.try_acquire()) {
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
            co_return failure::make(cancelled_error{name()});
        if (admitted != waiter_state::granted)
            co_return failure::make(bulkhead_rejected_error{s.options.name, reason_of(s, admitted)});
        slot_guard slot{&s};
        if (token.stop_requested())
            co_return failure::make(cancelled_error{name()});
        co_return co_await next(ctx);
    }

private:
    friend struct std::hash<bulkhead>;

    explicit bulkhead(std::shared_ptr<state> s) noexcept : state_(std::move(s)) {}

    static rejection_reason reason_of(const state& s, detail::waiter_state refused) noexcept {
        if (refused == detail::waiter_state::expired)
            return rejection_reason::queue_timeout;
        return s.options.queue_limit == 0 ? rejection_reason::no_capacity : rejection_reason::queue_full;
    }

    struct slot_guard {
        state* s;
        explicit slot_guard(state* p) noexcept : s(p) {}
        slot_guard(const slot_guard&) = delete;
        slot_guard& operator=(const slot_guard&) = delete;
        ~slot_guard() { s->release(); }
    };

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
        if (o.max_concurrent_calls == 0)
            throw std::invalid_argument("resilience::bulkhead: max_concurrent_calls must be positive, got 0");
        if (o.queue_timeout && *o.queue_timeout <= std::chrono::nanoseconds::zero())
            throw std::invalid_argument("resilience::bulkhead: queue_timeout must be positive, got " +
                                        std::to_string(o.queue_timeout->count()) + "ns");
        return o;
    }

    std::shared_ptr<state> state_;
};

bulkhead(bulkhead_options)->bulkhead<steady_clock>;
template <clock C>
bulkhead(bulkhead_options, C) -> bulkhead<C>;

} // namespace resilience

/// Hashes a bulkhead by the state its copies share, consistently with `==`.
template <resilience::clock C>
struct std::hash<resilience::bulkhead<C>> {
    std::size_t operator()(const resilience::bulkhead<C>& b) const noexcept {
        return std::hash<const void*>{}(b.state_.get());
    }
};
