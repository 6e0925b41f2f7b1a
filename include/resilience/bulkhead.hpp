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

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <utility>

namespace resilience {

struct bulkhead_options {
    /// How many calls may run at once. Must be positive.
    std::size_t max_concurrent = 0;
    /// How many more calls may wait for a slot. Beyond that a call is refused at once; the
    /// default 0 refuses as soon as every slot is busy.
    std::size_t max_queued = 0;
    /// How long a call may wait in the queue before it is refused. Empty (the default): as long as
    /// it takes. Must be positive when set.
    std::optional<std::chrono::nanoseconds> queue_timeout{};
};

/// Bounds how many calls run at once, so one slow dependency cannot take every connection,
/// socket or worker the process has.
/// - At most `max_concurrent` calls hold a slot. A call holds its slot from admission until the
///   rest of the pipeline returns, however it ends: value, failure, exception or cancellation.
/// - When every slot is busy, up to `max_queued` calls wait, served strictly in arrival order: a
///   freed slot is handed straight to the oldest waiter, so a call arriving while anyone waits
///   queues behind it even if it arrives at the very instant a slot frees (no barging).
/// - A call with no slot and no queue place, or whose wait outlasts `queue_timeout` (refused at
///   exactly that instant), fails with `bulkhead_rejected_error`, returned as a value through the
///   pipeline: `execute_outcome` reports it without an exception, and the action never runs.
/// - A waiter whose caller stops (its stop token) leaves the queue at that instant, takes no slot,
///   and fails with `cancelled_error`; so does a call whose token is stopped before it starts, or
///   by the time a slot handed to it is picked up (the slot goes straight on to the next waiter).
///
/// A copyable handle: copies share one bulkhead (one set of slots), which is thread-safe; event
/// loops on several threads may share it, and each waiter is resumed on the loop it waited on.
/// Constructing one starts no timer. The bulkhead must outlive the calls made through it. `C` is
/// used only for `queue_timeout` (its sleeps run on the waiter's loop); copies share one clock
/// object, which must be usable from every thread that calls through the bulkhead.
///
///     rs::bulkhead db{{.max_concurrent = 8, .max_queued = 32, .queue_timeout = 200ms}};
///     auto rows = co_await db.execute(query);          // throws bulkhead_rejected_error when full
///     auto r = co_await db.execute_outcome(query);     // or reports it without throwing
template <clock C = steady_clock>
class bulkhead : public policy_base<bulkhead<C>> {
    struct state;

public:
    explicit bulkhead(bulkhead_options options, C clock = C{})
        : state_(std::make_shared<state>(validate(options), std::move(clock))) {}

    /// Calls holding a slot now (including one just handed to a waiter not yet resumed).
    std::size_t in_flight() const {
        std::lock_guard lock(state_->mutex);
        return state_->in_flight;
    }
    /// Calls waiting for a slot now.
    std::size_t queued() const {
        std::lock_guard lock(state_->mutex);
        return state_->queue.size();
    }
    const bulkhead_options& options() const noexcept { return state_->options; }
    const C& clock() const noexcept { return state_->clock; }

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
            result.emplace(failure::make(cancelled_error{}));
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
            co_return failure::make(cancelled_error{});
        state& s = *state_;
        detail::waiter node;
        waiter_state admitted;
        if (!s.options.queue_timeout) {
            admitted = co_await detail::queue_awaiter<state>{s, node, token};
        } else {
            // The fast path decides under the lock alone; only a call that must wait pays for
            // the timer that bounds the wait.
            {
                std::lock_guard lock(s.mutex);
                admitted = s.decide_locked(node);
            }
            if (admitted == waiter_state::idle)
                admitted = co_await wait_bounded(s, node, token);
        }
        if (admitted == waiter_state::stopped)
            co_return failure::make(cancelled_error{});
        if (admitted != waiter_state::granted)
            co_return failure::make(bulkhead_rejected_error{});
        slot_guard slot{&s};
        if (token.stop_requested())
            co_return failure::make(cancelled_error{});
        co_return co_await next(ctx);
    }

private:
    struct state {
        state(bulkhead_options o, C c) : options(std::move(o)), clock(std::move(c)) {}

        const bulkhead_options options;
        C clock;
        std::mutex mutex;
        detail::waiter_queue queue;
        std::size_t in_flight = 0; // slots taken, including ones handed to waiters not yet resumed

        /// A slot without waiting, or false (every slot busy, or somebody queued first).
        bool try_acquire() {
            std::lock_guard lock(mutex);
            if (queue.empty() && in_flight < options.max_concurrent) {
                ++in_flight;
                return true;
            }
            return false;
        }

        // ---- the waiter_queue protocol; `mutex` held ----
        detail::waiter_state decide_locked(detail::waiter&) noexcept {
            if (queue.empty() && in_flight < options.max_concurrent) {
                ++in_flight;
                return detail::waiter_state::granted;
            }
            if (queue.size() >= options.max_queued)
                return detail::waiter_state::rejected;
            return detail::waiter_state::idle;
        }
        detail::waiter_state enqueue_locked(detail::waiter& w) noexcept {
            queue.push_back(w);
            return detail::waiter_state::queued;
        }

        // A freed slot goes to the oldest waiter without ever becoming free, so no newcomer can
        // take it between the release and the waiter's resumption.
        void release() {
            detail::waiter* next = nullptr;
            {
                std::lock_guard lock(mutex);
                next = queue.pop_front();
                if (next)
                    next->state = detail::waiter_state::granted;
                else
                    --in_flight;
            }
            if (next)
                next->wake();
        }
        void expire(detail::waiter& w) {
            bool wake;
            {
                std::lock_guard lock(mutex);
                wake = queue.withdraw(w, detail::waiter_state::expired);
            }
            if (wake)
                w.wake();
        }
    };

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
        if (o.max_concurrent == 0)
            throw std::invalid_argument("resilience::bulkhead: max_concurrent must be positive, got 0");
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
