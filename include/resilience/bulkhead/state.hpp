// SPDX-License-Identifier: MIT
/// \file bulkhead/state.hpp
/// What the copies of a `bulkhead` share (`bulkhead_state`): the slots, the limit on them with its
/// adaptive algorithm, and the queue of calls waiting for a slot. The options block each call
/// pins is bulkhead/config.hpp's; the algorithm is bulkhead/adaptive_limit.hpp's.
///
/// Locking: `bulkhead_state::mutex` guards `queue` (and its waiters' links and states, see
/// engine/waiter_queue.hpp), `algorithm`, `displaced_`, `shed_`, `standing_` and the replacement of
/// `cell`'s block (read as `cell.locked()` under it). It is the only lock that writes `limit`,
/// `epoch`, `plain` and `sample_word`, and that raises or lowers the `waiting` bit of `word`: those
/// are atomics, read without it by the calls' fast paths (and the slot count below the bits changes
/// by atomic steps without it while `waiting` is clear), as each says where it is declared. A
/// function whose name ends in `_locked` is called with `mutex` held and never takes it
/// (`decide_locked`, `enqueue_locked`, `take_deferred_locked`, `waiter_left_locked`, `cap_locked`,
/// `take_locked`, `limited_locked`, `release_locked`, `grant_locked`, `next_locked`,
/// `next_disciplined_locked`); every other function that touches what it guards takes it itself
/// (`options`, `finish`, `release_to_waiter`, `expire`, `reason_of`, `reconfigure`; the queue's
/// awaiter, engine/waiter_queue.hpp). The constructor and the
/// destructor touch them unlocked: no other thread can reach the state then.
///
/// How a call gets a slot. It first tries `try_acquire` (in `bulkhead::enter`): with a slot free
/// and nobody queued, one compare-and-swap, no lock, no allocation, no wait. A call that finds no
/// slot waits in `bulkhead::frame_wait`, in the frame of the pipeline it runs in (a bulkhead used
/// alone is a pipeline of one): the queue's node and, for a `queue_timeout`, a telemetry listener
/// or a queue discipline, room after it in the same block. No coroutine frame of its own, but for
/// one case. A
/// `queue_timeout` bounds the wait in one of two ways:
/// 1. a timer armed on the loop the call runs on, when the clock's timers run on it
///    (`timer_loop_here`: `steady_clock`, a simulation's clock);
/// 2. `wait_bounded`, otherwise: a clock whose timers do not run on the caller's loop can only bound
///    the wait with its `sleep_until`, so a watchdog coroutine sleeps beside the queue wait and
///    withdraws the waiter at the deadline (the awaiter owns the coroutine).
/// With `adapt`, a call admitted after waiting then takes its ticket (`admitted`), as one that
/// found a free slot does in `enter`.
/// Under a queue discipline (`codel`, `adaptive_lifo`), a waiting call keeps in that room the
/// instant it found no slot, and its node says where (`waiter::since_offset`); each hand-over of a
/// slot (`next_locked`) reads the clock once and applies the discipline (queue_discipline.hpp's
/// `serve_class`): the waiters it sheds end as refusals, woken with the mutex released.
/// Every wait ends in `bulkhead::settle`, which holds the one set of rules for what a wait yields: the
/// slot, a stop (`cancelled_error`) or a refusal (`bulkhead_rejected_error`, told to `on_rejected`
/// and the telemetry listener).
#pragma once

#include "../clock.hpp"
#include "../context.hpp"
#include "../detail/inlining.hpp"
#include "../detail/shared_handle.hpp"
#include "../detail/snapshot_cell.hpp"
#include "../detail/time.hpp"
#include "../engine/waiter_queue.hpp"
#include "../error.hpp"
#include "../event_loop.hpp"
#include "../priority.hpp"
#include "../queue_discipline.hpp"
#include "../stop_token.hpp"
#include "../task.hpp"
#include "../when_all.hpp"
#include "adaptive_limit.hpp"
#include "config.hpp"
#include "options.hpp"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <variant>
#include <vector>

namespace resilience::inline v0_2::detail {

/// Whether `clock`'s timers are those of the loop this thread runs: a queued call's timer then
/// fires where the call resumes. False for a clock without loop timers, or outside a loop.
template <clock C>
bool timer_loop_here(const C& clock) noexcept {
    if constexpr (loop_timer_clock<C>) {
        event_loop* const here = event_loop::current();
        try {
            return here && clock.timer_loop() == here;
        } catch (...) {
            return false; // the watched wait's sleep reports what the clock thinks of this loop
        }
    } else {
        return false;
    }
}

static_assert(max_priority_classes <= waiter_ranks, "each priority class needs a rank of the queue");

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
/// held (by `adapt`, or by a reconfiguration).
///
/// The options live in immutable blocks (`bulkhead_config`), the one in force published through
/// `cell`: a call that needs it past its admission pins it once where it starts (`bulkhead::enter`,
/// or `run`) and uses that block to its end, for its name, callbacks, listener, queue timeout and
/// classifier. A call of a bulkhead with neither `adapt` nor `priorities` that finds a free slot
/// needs nothing of it (`plain`, read from one word), and pins nothing. A reconfiguration publishes
/// a new block under `mutex`; the old one is freed once no call pins it. What the state itself does
/// (the limit, the queue limit a newcomer is refused at, the algorithm a sample goes to) follows
/// the block in force when it does it.
///
/// Invariants:
/// - Whenever `mutex` is free, `waiting` is set exactly when the queue is non-empty. It is raised
///   and lowered only with `mutex` held: raised in the same atomic step that finds every slot
///   taken, before the waiter is queued, and lowered by whoever empties the queue. So a release
///   that needs no mutex either freed its slot before that step (which then takes the slot
///   instead of queueing) or finds the bit and hands its slot over through the mutex.
/// - Whenever `mutex` is free and the queue is non-empty, slots taken >= the front waiter's cap
///   (`cap_locked`: the limit, less with priorities what the classes above its own keep): nobody
///   waits while a slot is free for them. A release through the mutex hands its slot over only
///   when that keeps the count within the front waiter's cap (after a shrink, or when the slot is
///   kept for a higher class, it just gives it back), and a limit that grows hands the new slots
///   to waiters in the same locked step. With priorities the queue is ordered by class (see
///   engine/waiter_queue.hpp), so a waiter the front one's cap holds back is held back too.
/// - While `waiting` is set, only `mutex` holders write the word: the fast paths leave it alone.
/// - `word < limit` says "a slot is free and nobody waits" in one comparison, as `limit` is at
///   most `slot_mask`: the options are refused beyond it (`bulkhead_options::max_limit`), never
///   clamped, and the algorithm keeps the limit within them. Slots taken may exceed the limit
///   after it shrank: calls already admitted keep their slots. With priorities a call compares
///   with its class's cap instead (`try_acquire_as`), still one comparison; while waiters of a
///   lower class are held back by a reserve, a slot may be free with `waiting` set, and a call of
///   a higher class takes it through the mutex.
template <clock C>
struct bulkhead_state : shared_state {
    using config = bulkhead_config;

    bulkhead_state(bulkhead_options o, C c)
        : limit(o.max_concurrent_calls), clock(std::move(c)), algorithm(o.adapt, o.max_concurrent_calls),
          cell(std::make_unique<config>(std::move(o))) {
        const config& first = *cell.locked();
        plain.store(!first.long_entry, std::memory_order_relaxed);
        sample_word.store(first.sample_word(), std::memory_order_relaxed);
    }

#ifndef NDEBUG
    ~bulkhead_state() { assert(queue.empty() && (word.load(std::memory_order_relaxed) & slot_mask) == 0); }
#endif

    static constexpr std::uint64_t waiting = std::uint64_t{1} << 63;
    static constexpr std::uint64_t retired = std::uint64_t{1} << 62;
    static constexpr std::uint64_t slot_mask = retired - 1;

    /// The last hold went: deletable now unless calls hold slots, the last of which deletes it.
    bool last_hold_dropped() noexcept {
        return (word.fetch_or(retired, std::memory_order_acq_rel) & slot_mask) == 0;
    }

    /// What an admitted call remembers for its sample: when it took its slot (in clock ticks since
    /// the epoch; only when `timed`), and the algorithm's epoch then. Left uninitialised in a call's
    /// state, so a bulkhead without `adapt` pays nothing for it.
    struct ticket {
        typename C::duration::rep start;
        std::uint64_t
            word; // the epoch, and `timed_bit` when `start` was read: two words in the frame, not three

        static constexpr std::uint64_t timed_bit = std::uint64_t{1} << 63; // an epoch never gets there
        bool timed() const noexcept { return (word & timed_bit) != 0; }
        std::uint64_t epoch() const noexcept { return word & ~timed_bit; }
    };

    // First: on the cache line of the state's count of holds (see `shared_state`).
    // The slot word: the slot count changes without the lock while `waiting` is clear; `waiting`
    // is raised and lowered under `mutex` only. Read without the lock by the fast paths.
    std::atomic<std::uint64_t> word{0};
    std::atomic<std::uint64_t> limit;    // written under `mutex`; read without it (relaxed)
    std::atomic<std::uint64_t> epoch{0}; // `algorithm.epoch()`, written under `mutex`; read without it
    /// The block in force has neither `adapt` nor `priorities`: a call that takes a free slot
    /// needs nothing of it (see `bulkhead::enter`). Stored under `mutex` with the block; read
    /// without it.
    std::atomic<bool> plain{true};
    C clock;
    limit_algorithm algorithm; // guarded by `mutex`
    mutable std::mutex mutex;
    waiter_queue queue;           // guarded by `mutex`
    waiter* displaced_ = nullptr; // refused by `enqueue_locked`, to wake unlocked; guarded by `mutex`
    /// Waiters the queue discipline shed, linked through `waiter::next`, to wake once `mutex` is
    /// released; guarded by `mutex`.
    waiter* shed_ = nullptr;
    /// Whether each class's queue stands (queue_discipline.hpp); guarded by `mutex`.
    standing_queue standing_[waiter_ranks];
    /// The block in force: replaced under `mutex` (and read there as `cell.locked()`), pinned
    /// without it by the calls that need it (detail/snapshot_cell.hpp).
    snapshot_cell<config> cell;
    // The block in force's `sample_word()`: stored under `mutex`, read without it by a call's end.
    std::atomic<std::uint64_t> sample_word{0};

    /// Pins the block in force now, for a call starting.
    pinned<config> pin() noexcept { return cell.pin(); }
    /// A copy of the options in force.
    bulkhead_options options() const {
        std::lock_guard lock(mutex);
        return cell.locked()->options;
    }

    [[nodiscard]] std::size_t in_flight() const noexcept {
        return static_cast<std::size_t>(word.load(std::memory_order_relaxed) & slot_mask);
    }
    [[nodiscard]] std::size_t current_limit() const noexcept {
        return static_cast<std::size_t>(limit.load(std::memory_order_relaxed));
    }

    /// Takes a slot if one is free and nobody waits, without waiting or locking. False: the
    /// caller must take the waiting path (`bulkhead::frame_wait`), which decides again under
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
    /// `try_acquire` for a call started with `ctx` under `p` (the call's priorities, on): a slot
    /// only while the classes above the call's keep their reserve.
    [[nodiscard]] RESILIENCE_DETAIL_NOINLINE bool try_acquire_as(const priority_table& p,
                                                                 const context& ctx) noexcept {
        std::uint64_t seen = word.load(std::memory_order_relaxed);
        const std::uint64_t l = limit.load(std::memory_order_relaxed);
        const std::uint64_t cap = l - p.keep(p.class_of(ctx), l);
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

    // ---- adaptation: for calls whose block has `adapt` ----

    /// The ticket of a call admitted now under `cfg`. `now` is read only when its algorithm times
    /// calls.
    template <class Now>
    ticket admitted(const config& cfg, Now&& now) const {
        ticket t{};
        if (cfg.times_calls) {
            t.start = now().time_since_epoch().count();
            t.word = ticket::timed_bit;
        }
        t.word |= epoch.load(std::memory_order_relaxed) & ~ticket::timed_bit;
        return t;
    }

    /// Ends a call admitted with `t`: records its sample (unless `ignored`) with the algorithm in
    /// force, and gives its slot back, in one locked step when the sample may change the limit. A
    /// limit that grew hands its new slots to waiters at once. The slot is given back even when the
    /// clock throws. A sample is dropped when no algorithm is in force any more, or when the one
    /// in force needs a latency the call was not timed for (it started under other options).
    void finish(const ticket& t, limit_verdict v) {
        if (v == limit_verdict::ignored) {
            release();
            return;
        }
        std::chrono::nanoseconds latency{};
        if (t.timed()) {
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
        // A sample that cannot change anything (an AIMD success while nothing waits, or no
        // algorithm any more) takes no lock: it is recorded, as nothing, at the instant of these
        // loads.
        const std::uint64_t in_force = sample_word.load(std::memory_order_acquire);
        if (in_force == 0 || config::inert(in_force, latency, failed, limited_now())) {
            release();
            return;
        }
        waiter* woken = nullptr;
        waiter* shed = nullptr;
        bool last = false;
        {
            std::lock_guard lock(mutex);
            if (algorithm.adaptive() && (t.timed() || !algorithm.needs_latency())) {
                const limit_sample sample{
                    .latency = latency, .failed = failed, .limited = limited_locked(), .epoch = t.epoch()};
                if (algorithm.record(sample)) {
                    limit.store(algorithm.limit(), std::memory_order_relaxed);
                    epoch.store(algorithm.epoch(), std::memory_order_relaxed);
                }
            }
            woken = release_locked(&last);
            woken = grant_locked(woken);
            waiter_left_locked();
            shed = std::exchange(shed_, nullptr);
        }
        if (last) [[unlikely]] { // a retired state's last slot: nobody waits, nothing to wake
            delete_state(this);
            return;
        }
        wake_chain(shed);
        wake_chain(woken);
    }

    // `release` with someone queued: through the mutex. Kept out of `release`, so that the path
    // taken while nobody waits stays small enough to inline.
    void release_to_waiter() {
        waiter* woken = nullptr;
        waiter* shed = nullptr;
        bool last = false;
        {
            std::lock_guard lock(mutex);
            woken = release_locked(&last);
            waiter_left_locked();
            shed = std::exchange(shed_, nullptr);
        }
        if (last) [[unlikely]] { // a retired state's last slot: nobody waits, nothing to wake
            delete_state(this);
            return;
        }
        wake_chain(shed);
        wake_chain(woken);
    }

    // ---- the waiter_queue protocol: the `_locked` ones with `mutex` held, take_back_grant without ----
    /// A waiter destroyed after its slot was handed to it and before it resumed (its event loop
    /// torn down): the slot goes back.
    void take_back_grant() { release(); }
    // A call takes a free slot its class may have unless someone of its class or above waits (it
    // never passes them; it passes waiters of lower classes, whom the reserve holds back). With
    // the queue full it waits only if it displaces a waiter of a lower class (`enqueue_locked`).
    waiter_state decide_locked(waiter& w) noexcept {
        if (!queue.any_from(w.rank) && take_locked(cap_locked(w.rank), false))
            return waiter_state::granted;
        if (queue.size() >= cell.locked()->options.queue_limit && !queue.displaced_by(w.rank))
            return waiter_state::rejected;
        return waiter_state::idle;
    }
    // A release that needed no mutex may have freed a slot since `decide_locked`: the waiter
    // takes it instead of queueing, since no release would hand it over. A full queue (which
    // `decide_locked` let this waiter into) gives up its last waiter of the lowest class, refused
    // once the mutex is released (`take_deferred_locked`).
    waiter_state enqueue_locked(waiter& w) noexcept {
        if (queue.empty() && take_locked(cap_locked(w.rank), true))
            return waiter_state::granted;
        if (queue.size() >= cell.locked()->options.queue_limit) {
            if (waiter* out = queue.displaced_by(w.rank)) {
                queue.erase(*out);
                out->state = waiter_state::rejected;
                displaced_ = out;
                if (queue.count_of(out->rank) == 0)
                    standing_[out->rank].reset();
            }
        }
        queue.push_back(w);
        return waiter_state::queued;
    }
    void take_deferred_locked(deferred_wake& later) noexcept {
        later.wake = std::exchange(displaced_, nullptr);
    }

    void waiter_left_locked() noexcept {
        if (queue.empty())
            word.fetch_and(~waiting, std::memory_order_relaxed);
        if (cell.locked()->discipline.on)
            reset_idle_classes(queue, standing_);
    }

    // `mutex` held. The slots a waiter of class `rank` may fill: the limit, less with priorities
    // what the classes above keep, by the block in force.
    std::uint64_t cap_locked(unsigned rank) const noexcept {
        const std::uint64_t l = limit.load(std::memory_order_relaxed);
        return l - cell.locked()->priority.keep(rank, l);
    }

    // `mutex` held, nobody of the caller's class or above queued (`waiting` is clear when nobody
    // is). Takes a slot if fewer than `cap` are taken and says true; else, when `raise`, raises
    // `waiting` in the same atomic step that found them taken.
    bool take_locked(std::uint64_t cap, bool raise) noexcept {
        std::uint64_t seen = word.load(std::memory_order_relaxed);
        for (;;) {
            const bool free = (seen & ~waiting) < cap;
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

    /// The reason of a refusal the queue gave (`rejected` or `expired`), by the `queue_limit` in
    /// force.
    rejection_reason reason_of(waiter_state refused) const noexcept {
        if (refused == waiter_state::expired)
            return rejection_reason::queue_timeout;
        if (refused == waiter_state::shed)
            return rejection_reason::shed;
        std::lock_guard lock(mutex);
        return cell.locked()->options.queue_limit == 0 ? rejection_reason::no_capacity
                                                       : rejection_reason::queue_full;
    }

    /// Puts `o` (validated) in force; see `bulkhead::reconfigure` for what carries over. The block
    /// replaced is freed once no call pins it; options the same as those in force change nothing.
    /// A limit that grew hands its new slots to the oldest waiters at once; one that shrank admits
    /// nobody until the calls holding slots are under it. Nothing changes if it throws (only
    /// allocation can).
    void reconfigure(bulkhead_options o) {
        {
            std::lock_guard lock(mutex);
            if (same_bulkhead_options(cell.locked()->options, o))
                return;
        }
        auto next = std::make_unique<config>(std::move(o));
        const config& c = *next;
        waiter* woken = nullptr;
        waiter* shed = nullptr;
        {
            std::lock_guard lock(mutex);
            // Another discipline measures afresh: what stood under the old rule says nothing.
            const bool restart = cell.locked()->discipline != c.discipline;
            cell.replace(std::move(next)); // the only step that can throw: before any other change
            if (restart)
                for (standing_queue& q : standing_)
                    q.reset();
            algorithm.reconfigure(c.options.adapt, c.options.max_concurrent_calls);
            plain.store(!c.long_entry, std::memory_order_release);
            sample_word.store(c.sample_word(), std::memory_order_release);
            if (algorithm.adaptive()) {
                limit.store(algorithm.limit(), std::memory_order_relaxed);
                epoch.store(algorithm.epoch(), std::memory_order_relaxed);
            } else {
                limit.store(c.options.max_concurrent_calls, std::memory_order_relaxed);
            }
            woken = grant_locked(nullptr);
            waiter_left_locked();
            shed = std::exchange(shed_, nullptr);
        }
        wake_chain(shed);
        wake_chain(woken);
    }

    // ---- a queue wait bounded by `queue_timeout` with the clock's sleep (see the file comment) ----

    /// Waits in the queue with a watchdog beside it that withdraws the waiter at the deadline.
    /// Whichever moves the node first (its turn, a stop, the deadline) wins; the other finds it
    /// moved on. The watchdog's sleep is stopped once the wait is over, and when_all waits for it,
    /// so nothing outlives the call. The caller holds the state while this runs.
    task<waiter_state> wait_bounded(waiter& node, const stop_token& token, std::chrono::nanoseconds timeout) {
        const auto deadline = add_saturating(clock.now(), timeout);
        pooled_stop_source done;
        try {
            auto [admitted, ignored] =
                co_await when_all(wait_in_queue(node, token, done), watch(node, deadline, done));
            (void)ignored;
            co_return admitted;
        } catch (...) {
            // Only the watchdog can throw (a clock that cannot sleep here): keep no slot.
            give_back_unclaimed(node);
            throw;
        }
    }

    /// Gives back the slot handed to `node` when no call took it (the wait that got it ended, and
    /// the call did not go on to settle it), and leaves the node holding none. Takes `mutex`.
    void give_back_unclaimed(waiter& node) noexcept {
        bool granted;
        {
            std::lock_guard lock(mutex);
            granted = node.state == waiter_state::granted;
            if (granted)
                node.state = waiter_state::stopped;
        }
        if (granted)
            release();
    }

private:
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

    // `mutex` held. Gives back one slot: to the front waiter when the count stays within its cap
    // (the slot changes hands, the count is kept), else to nobody. Returns the waiter to wake;
    // `*last` says the slot was a retired state's last (it must then be deleted, once unlocked).
    waiter* release_locked(bool* last) noexcept {
        if (waiter* next = next_locked((word.load(std::memory_order_relaxed) & slot_mask) - 1)) {
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
        while (waiter* next = next_locked(word.load(std::memory_order_relaxed) & slot_mask)) {
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

    // `mutex` held. Takes out of the queue the waiter a slot goes to while `taken` others are
    // held, or null when nobody waits or the front waiter's cap holds it back. In arrival order
    // unless a queue discipline is in force.
    waiter* next_locked(std::uint64_t taken) noexcept {
        const config& in_force = *cell.locked();
        if (in_force.discipline.on) [[unlikely]]
            return next_disciplined_locked(taken, in_force.discipline);
        if (!queue.empty() && taken < cap_locked(queue.front()->rank))
            return queue.pop_front();
        return nullptr;
    }

    // `next_locked` under CoDel or adaptive LIFO: one hand-over to the front waiter's class at a
    // time (`serve_class`), on to the next class when it shed the whole of one. A clock that
    // throws sheds nobody.
    waiter* next_disciplined_locked(std::uint64_t taken, const discipline_rule& rule) noexcept {
        std::optional<std::chrono::nanoseconds> now;
        while (!queue.empty() && taken < cap_locked(queue.front()->rank)) {
            if (!now) {
                try {
                    now = saturating_nanoseconds(clock.now().time_since_epoch());
                } catch (...) {
                    return queue.pop_front();
                }
            }
            const auto waited = [t = *now](const waiter& w) {
                return waited_beside<typename C::time_point>(w, t);
            };
            if (waiter* next = serve_class(queue, standing_, rule, *now, shed_, waited))
                return next;
        }
        return nullptr;
    }

    task<waiter_state> wait_in_queue(waiter& node, const stop_token& token, pooled_stop_source& done) {
        const waiter_state admitted = co_await queue_awaiter<bulkhead_state>{*this, node, token};
        done.request_stop();
        co_return admitted;
    }
    task<void> watch(waiter& node, typename C::time_point deadline, pooled_stop_source& done) {
        const stop_token until = done.get_token();
        try {
            co_await clock.sleep_until(deadline, until);
        } catch (...) {
            expire(node); // the waiter must not stay queued behind a watchdog that failed
            throw;
        }
        if (!until.stop_requested())
            expire(node);
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

} // namespace resilience::detail
