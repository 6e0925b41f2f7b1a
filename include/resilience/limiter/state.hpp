// SPDX-License-Identifier: MIT
/// \file limiter/state.hpp
/// `limiter_state`: the first-come-first-served queue of the rate limiters, driven by a meter that
/// counts the permits (`token_bucket`, `window_counter`).
///
/// Locking: `limiter_state::mutex` guards the queue (`queue`, `deferred_`, `alarm`), `queue_timeout`,
/// the queue discipline (`discipline`, `standing`), `latest`, the priorities' blocks (`rank_blocks`),
/// and the meter while the mutex side holds it (from a `meter_lease`, made and ended with the mutex
/// held, to the end of the last wait); `queue_limit` and `ranks` are atomics written only under it. A
/// member function whose name ends in `_locked` is called with `mutex` held and never takes it (the
/// waiter queue's protocol, `decide_locked` and the rest, is called so by `queue_awaiter` and
/// `stop_waiter`); every other function that touches a guarded member takes it itself. Read without
/// it, as said where each is declared: `ranks` (the fast path), `queue_limit` (a refusal's reason),
/// and a `lock_free_meter`'s own word (`try_take_shared`).
#pragma once

#include "../clock.hpp"
#include "../context.hpp"
#include "../detail/inlining.hpp"
#include "../detail/shared_handle.hpp"
#include "../detail/time.hpp"
#include "../engine/waiter_queue.hpp"
#include "../event_loop.hpp"
#include "../priority.hpp"
#include "../queue_discipline.hpp"
#include "../stop_token.hpp"
#include "../task.hpp"
#include "discipline.hpp"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace resilience::inline v0_2::detail {

/// The outcome of asking a limiter for one token: `granted`, `rejected` or `expired` (with
/// `retry_after`), or `stopped`.
struct admission {
    waiter_state state = waiter_state::idle;
    std::chrono::nanoseconds retry_after{};
};

/// The longest wait a limiter tells or sleeps: 2^62 ns, about 146 years (a rate of a token per
/// century). Due times and `retry_after` beyond it are held there, so adding one to a clock's time
/// cannot overflow; `redis::rate_limiter` holds Redis's answers at the same bound.
inline constexpr std::chrono::nanoseconds longest_wait{std::int64_t{1} << 62};

// Rounds a time in nanoseconds (a double, from the meters) up to a whole nanosecond, so nobody is
// woken or told to come back before the permit is really there. Times beyond `longest_wait` are
// held there.
inline std::chrono::nanoseconds ceil_ns(double ns) noexcept {
    constexpr std::int64_t far = longest_wait.count();
    const double up = std::ceil(ns);
    if (!(up < static_cast<double>(far))) // also NaN, which no meter makes: never sooner than can be told
        return std::chrono::nanoseconds(far);
    if (up < -static_cast<double>(far))
        return std::chrono::nanoseconds(-far);
    return std::chrono::nanoseconds(static_cast<std::int64_t>(up));
}

/// A meter that can also hand out permits without the limiter's mutex (see `limiter_state`).
template <class M>
concept lock_free_meter = requires(M& m, std::chrono::nanoseconds now) {
    { m.try_take_shared(now) } -> std::same_as<bool>;
    m.hold();
    m.unhold();
};

/// The waiting machinery shared by `rate_limiter` and `sliding_window_limiter`; `Meter` does the
/// counting. A meter is called with the mutex held, with times as nanoseconds since the limiter
/// was made (never decreasing), and provides:
///
///     bool try_take(nanoseconds now);                      // spends one permit if there is one
///     double available_at(nanoseconds now, size_t ahead);  // when a caller with `ahead` callers
///                                                          // before it would get its permit (>= now)
///     double remaining(nanoseconds now);                   // permits available now
///
/// The queue's front waiter (the head) is the only one that watches the clock: it sleeps until
/// its permit is due, takes it, leaves, and hands the timing to the next waiter, which it wakes.
/// A head whose caller stops leaves the same way. Other waiters just sit in the queue until they
/// become the head or their caller stops. So a new call never takes a permit while anyone waits,
/// and no timer runs for a limiter nobody waits on.
///
/// A queue timeout needs no timer of its own either. Every waiter's deadline is its queueing time
/// (read under the mutex, so never decreasing along the queue) plus the same timeout, so the head
/// always has the earliest deadline: it sleeps until its permit is due or its deadline, whichever
/// comes first, and at its deadline leaves (`expired`) and hands the turn on. The next waiter
/// takes over at that instant, so its own deadline, no earlier, is never missed.
///
/// A `lock_free_meter` keeps its state where calls can take a permit without the mutex, at any
/// reading of the clock (a stale one sees fewer permits, never more):
///
///     bool try_take_shared(nanoseconds now) noexcept; // spends one permit if there is one and
///                                                     // the mutex side does not hold the state
///     void hold() noexcept;   // mutex held: takes the state over; the calls above now say no
///     void unhold() noexcept; // mutex held: hands it back (nothing if not held)
///
/// and its other functions are called only while held. The mutex side holds it while it decides
/// and for exactly as long as anyone waits, so a permit taken without the mutex is never taken
/// ahead of a waiter, and the mutex side always sees a state nobody else changes.
///
/// With priorities (`ranks`, priority.hpp) the queue is ordered by class (see waiter_queue.hpp), and
/// a caller of class k takes a permit only while `keep(k)` more stay (`take_keeping_locked`); its due time
/// is the meter's `available_at(now, ahead + keep)`. The turn stays with the front waiter: a newcomer
/// of a higher class queued in front of the head takes the turn from it, and the old head, woken
/// through its alarm, parks (`park`) until the turn comes back to it, its caller stops, or it is
/// refused; while parked it is woken like any waiter, by whoever moves it on. The head also watches
/// the deadlines of the waiters behind it, which no longer come after its own: it sleeps until the
/// earliest, and refuses (`expired`) those whose deadline has come. Without priorities every waiter
/// is of class 0 and all this reduces to the arrival-order queue above.
///
/// With a queue discipline (`discipline`, queue_discipline.hpp), the instant a permit is due for the
/// head is a hand-over (limiter/discipline.hpp's `hand_over_locked`): the discipline may shed waiters of
/// the head's class, the head among them, and give the permit to another waiter than the head, which
/// then keeps its turn and looks again at once. Each waiter notes the instant it queued (`queued_at`),
/// the time its admission's decision read, in the same locked step.
///
/// A reconfiguration (`reconfigure`) changes the meter and the queue options under the mutex,
/// the meter held. Waiters stay queued, with their deadlines; the head, which may be asleep until
/// a due time the old meter computed, is woken through its alarm (`head_alarm`) to time its permit
/// again.
template <clock C, class Meter>
struct limiter_state : shared_state {
    /// Every waiter of this queue is one (`queue_awaiter` takes no other), with the notes kept on it.
    using node_type = timed_waiter;

    limiter_state(Meter m, C c, std::size_t queue_limit_,
                  std::optional<std::chrono::nanoseconds> queue_timeout_ = std::nullopt,
                  discipline_rule discipline_ = {})
        : meter(std::move(m)), clock(std::move(c)), origin(clock.now()), queue_limit(queue_limit_),
          queue_timeout(queue_timeout_), discipline(discipline_) {}
#ifndef NDEBUG
    ~limiter_state() { assert(queue.empty()); } // a waiting call holds the limiter
#endif

    Meter meter; // guarded by `mutex` while held (`meter_lease`); a lock-free one is taken without it
    C clock;
    const typename C::time_point origin;
    std::atomic<std::size_t> queue_limit; // written under `mutex`; read without it (relaxed) by refusals
    std::optional<std::chrono::nanoseconds> queue_timeout; // guarded by `mutex`
    discipline_rule discipline;                            // guarded by `mutex`
    standing_queue standing[waiter_ranks]; // whether each class's queue stands; guarded by `mutex`
    std::mutex mutex;
    waiter_queue queue;

    std::chrono::nanoseconds latest{}; // the latest time a decision used; guarded by `mutex`
    stop_source* alarm = nullptr;      // the sleeping head's (see `head_alarm`); guarded by `mutex`

    /// Priorities as admission uses them: the classes' table and the limit their shares are of, and
    /// the classes they were made from (to find the block again).
    struct priority_block {
        priority_table table;
        std::size_t limit;
        priority_classes source;
    };
    /// The priorities in force, or null (off): stored (release) under `mutex`, loaded without it by
    /// the fast path. Every block so far is kept (`rank_blocks`) until the state goes, one per
    /// distinct setting: a reconfiguration back to priorities and a limit used before takes their
    /// block again, so a limiter reconfigured between a few settings keeps a few blocks.
    std::atomic<const priority_block*> ranks{nullptr};
    std::vector<std::unique_ptr<const priority_block>> rank_blocks; // guarded by `mutex`
    deferred_wake deferred_; // left by `enqueue_locked` for `take_deferred_locked`; guarded by `mutex`

    /// The block for `p` (checked) with `limit` (the permits the shares are of), null when `p` is
    /// off; room is made for it in `rank_blocks`. `mutex` held, or before the state is shared. Only
    /// `std::bad_alloc` can throw, changing nothing; `publish_priorities_locked` then cannot.
    struct prepared_priorities {
        const priority_block* block = nullptr;        // null: off
        std::unique_ptr<const priority_block> made{}; // set when `block` is new
    };
    prepared_priorities prepare_priorities_locked(const priority_classes& p, std::size_t limit) {
        if (p.classes == 0)
            return {};
        for (const auto& kept : rank_blocks)
            if (kept->limit == limit && kept->source.classes == p.classes &&
                kept->source.reserved == p.reserved && kept->source.default_class == p.default_class)
                return {kept.get(), nullptr};
        auto b = std::make_unique<const priority_block>(priority_block{priority_table{p}, limit, p});
        rank_blocks.reserve(rank_blocks.size() + 1);
        const priority_block* const made = b.get();
        return {made, std::move(b)};
    }
    /// Puts in force what `prepare_priorities_locked` made.
    void publish_priorities_locked(prepared_priorities b) noexcept {
        ranks.store(b.block, std::memory_order_release);
        if (b.made)
            rank_blocks.push_back(std::move(b.made));
    }
    /// How many permits a waiter of class `rank` must leave, by the priorities in force; `mutex` held.
    std::size_t keep_locked(unsigned rank) const noexcept {
        const priority_block* b = ranks.load(std::memory_order_relaxed);
        return b ? static_cast<std::size_t>(b->table.keep(rank, b->limit)) : 0;
    }
    /// `mutex` held, meter held: a permit at `now` for a caller that must leave `keep` more.
    bool take_keeping_locked(std::chrono::nanoseconds now, std::size_t keep) {
        if (keep == 0)
            return meter.try_take(now);
        return !(meter.available_at(now, keep) > static_cast<double>(now.count())) && meter.try_take(now);
    }

    /// How long from `now` until a permit would be there for a caller with `ahead` before it.
    std::chrono::nanoseconds wait_for_locked(std::chrono::nanoseconds now, std::size_t ahead) {
        return ceil_ns(meter.available_at(now, ahead)) - now;
    }
    std::chrono::nanoseconds since_origin(typename C::time_point t) const {
        const auto e = std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin);
        return std::max(e, std::chrono::nanoseconds::zero());
    }
    std::chrono::nanoseconds elapsed_locked() {
        // Read under the mutex, so the meter sees times in the order its decisions are made.
        latest = std::max(latest, since_origin(clock.now()));
        return latest;
    }
    typename C::time_point time_point_of(double ns) const {
        return detail::add_saturating(origin, ceil_ns(ns)); // ns >= 0: a due time, never before now
    }

    // Made with `mutex` held, ended before it is released: a lock-free meter's state is held by the
    // mutex side meanwhile, and stays held afterwards exactly while anyone waits.
    struct meter_lease {
        limiter_state& s;
        explicit meter_lease(limiter_state& owner) noexcept : s(owner) {
            if constexpr (lock_free_meter<Meter>)
                s.meter.hold();
        }
        meter_lease(const meter_lease&) = delete;
        meter_lease& operator=(const meter_lease&) = delete;
        ~meter_lease() { s.waiter_left_locked(); }
    };
    // Also called by `stop_waiter` and `queue_awaiter` when a waiter leaves on its own: the meter's
    // state goes back to the fast path as soon as nobody waits.
    void waiter_left_locked() noexcept {
        if constexpr (lock_free_meter<Meter>)
            if (queue.empty())
                meter.unhold();
        if (discipline.on)
            reset_idle_classes(queue, standing);
    }

    // ---- the waiter_queue protocol; `mutex` held ----
    // A caller takes a permit unless someone of its class or above waits (it never passes them; it
    // passes waiters of lower classes, whose reserve holds them back). With the queue full it waits
    // only if it displaces a waiter of a lower class (`enqueue_locked`); refused, it is told when a
    // permit would be there for it behind the waiters of its class and above.
    waiter_state decide_locked(timed_waiter& w) {
        meter_lease lease{*this};
        const auto now = elapsed_locked();
        const std::size_t keep = keep_locked(w.rank);
        if (!queue.any_from(w.rank) && take_keeping_locked(now, keep))
            return waiter_state::granted;
        if (queue.size() >= queue_limit.load(std::memory_order_relaxed) && !queue.displaced_by(w.rank)) {
            w.retry_after = ceil_ns(meter.available_at(now, queue.count_from(w.rank) + keep)) - now;
            return waiter_state::rejected;
        }
        return waiter_state::idle;
    }
    // The meter is held before the waiter is queued: a permit taken without the mutex is taken
    // before this waiter queued, never after, however the two race. A full queue (which
    // `decide_locked` let this waiter into) gives up its last waiter of the lowest class; a waiter
    // queued in front of the head takes the turn from it. Whom that moves on is woken once the
    // mutex is released (`take_deferred_locked`).
    waiter_state enqueue_locked(timed_waiter& w) {
        meter_lease lease{*this};
        w.queued_at = latest; // the time `decide_locked` used, in this same locked step
        if (queue_timeout) {
            const auto now = elapsed_locked();
            w.deadline = *queue_timeout < std::chrono::nanoseconds::max() - now
                             ? now + *queue_timeout
                             : std::chrono::nanoseconds::max();
        }
        if (queue.size() >= queue_limit.load(std::memory_order_relaxed))
            if (waiter* out = queue.displaced_by(w.rank)) {
                const auto now = elapsed_locked();
                // Everyone else is ahead of it: it is the last of the lowest class.
                timed(*out).retry_after =
                    ceil_ns(meter.available_at(now, queue.size() - 1 + keep_locked(out->rank))) - now;
                const bool was_head = out->state == waiter_state::turn;
                queue.erase(*out);
                out->state = waiter_state::rejected;
                if (was_head)
                    claim_alarm_locked(); // asleep, or it sees the refusal when it next looks
                else if (!out->driving)
                    deferred_.wake = out;
            }
        waiter* const head = queue.front();
        queue.push_back(w);
        if (queue.front() != &w)
            return waiter_state::queued;
        if (head && head->state == waiter_state::turn) { // in front of the head: the turn is w's now
            head->state = waiter_state::queued;
            claim_alarm_locked();
        }
        w.driving = true;
        return waiter_state::turn;
    }
    void take_deferred_locked(deferred_wake& later) noexcept {
        later.wake = std::exchange(deferred_.wake, nullptr);
        later.alarm = std::move(deferred_.alarm);
        deferred_.alarm.reset();
    }
    // `mutex` held: the sleeping head's alarm, to be stopped once the mutex is released (see
    // `head_alarm`); none while the head is awake, which looks at its node before it sleeps again.
    void claim_alarm_locked() {
        if (alarm) {
            deferred_.alarm.emplace(*alarm);
            alarm = nullptr;
        }
    }

    /// The fast path: a permit at `now`, a reading of `clock` the caller made, with nobody waiting.
    /// False: no permit now or someone waits; the caller goes on to `wait`, which decides again.
    /// Without the mutex for a `lock_free_meter`.
    [[nodiscard]] bool try_take_now(typename C::time_point now) {
        if constexpr (lock_free_meter<Meter>) {
            return meter.try_take_shared(since_origin(now));
        } else {
            std::lock_guard lock(mutex);
            // A reading made before the lock may be older than one a decision already used.
            return queue.empty() && meter.try_take(std::max(since_origin(now), latest));
        }
    }
    [[nodiscard]] bool try_take_now() { return try_take_now(clock.now()); }
    /// `try_take_now` for a call started with `ctx`: with priorities, by its class (a class that
    /// must leave permits to those above decides under the mutex).
    [[nodiscard]] bool try_take_now(typename C::time_point now, const context& ctx) {
        const priority_block* b = ranks.load(std::memory_order_acquire);
        if (!b) [[likely]]
            return try_take_now(now);
        return try_take_ranked(now, *b, b->table.class_of(ctx));
    }
    /// The rank a call started with `ctx` waits at: its class with priorities, else 0.
    [[nodiscard]] unsigned char rank_of(const context& ctx) const noexcept {
        const priority_block* b = ranks.load(std::memory_order_acquire);
        return b ? static_cast<unsigned char>(b->table.class_of(ctx)) : 0;
    }

    /// The slow path: refuse, or wait for a permit in arrival order (within its class `rank`).
    task<admission> wait(stop_token token, unsigned char rank = 0) {
        timed_waiter node;
        node.rank = rank;
        waiter_state st = co_await queue_awaiter<limiter_state>{*this, node, token};
        if (st == waiter_state::turn || st == waiter_state::queued) { // `queued`: a turn lost already
            // Passes the turn on if `serve_turn` cannot even start (its frame not allocated);
            // once it runs, its own guard does it first and this one finds nothing to do.
            turn_guard guard{this, &node};
            st = co_await serve_turn(node, token);
        }
        co_return admission{st, node.retry_after};
    }

    /// The head's part of a wait: `node` has its turn; ends with its final state.
    task<waiter_state> serve_turn(timed_waiter& node, stop_token token) {
        // However this coroutine ends (a value, an exception from the clock, or destroyed while
        // asleep), the turn passes on: the waiters behind are never stranded.
        turn_guard guard{this, &node};
        // While it is the head, a stop takes it out of the queue at once and hands the turn
        // on, as for any waiter; its sleep, stopped by the same token, then ends the loop.
        std::optional<stop_callback<leave_on_stop>> on_stop;
        if (token.stop_possible())
            on_stop.emplace(token, leave_on_stop{this, &node});
        co_return co_await serve_head(node, token);
    }

    struct turn_guard {
        limiter_state* self;
        waiter* node;
        ~turn_guard() {
            waiter* next = nullptr;
            {
                std::lock_guard lock(self->mutex);
                if (node->state == waiter_state::turn) {
                    next = self->queue.leave_turn(*node, waiter_state::stopped);
                    self->waiter_left_locked();
                } else if (node->state ==
                           waiter_state::queued) { // lost its turn, and ends before it comes back
                    self->queue.erase(*node);
                    node->state = waiter_state::stopped;
                    self->waiter_left_locked();
                }
            }
            if (next)
                next->wake_later();
        }
    };

    struct leave_on_stop {
        limiter_state* self;
        waiter* node;
        void operator()() const { stop_waiter(*self, *node); } // may post a wake-up
    };

    /// What the head sleeps on, one per round of `serve_head`: stopped by the caller's stop, or by a
    /// reconfiguration, which then makes the head time its permit again. Armed (`arm_locked`) in the
    /// locked step that computed the due time, so a reconfiguration after that step finds it. A
    /// reconfiguration stops it through a copy of the source taken under the mutex (the request
    /// itself runs outside: a clock may resume the sleeper from it), and leaves `alarm` empty; the
    /// head then finds its source claimed and stops it itself before it goes, so that it never
    /// returns to the pool of sources stopped or about to be.
    class head_alarm {
    public:
        head_alarm(limiter_state& s, const stop_token& caller) : s_(s), link_(caller, source_) {}
        head_alarm(const head_alarm&) = delete;
        head_alarm& operator=(const head_alarm&) = delete;
        ~head_alarm() {
            if (!armed_)
                return;
            bool claimed;
            {
                std::lock_guard lock(s_.mutex);
                claimed = s_.alarm != &source_.source();
                if (!claimed)
                    s_.alarm = nullptr;
            }
            if (claimed)
                source_.request_stop();
        }
        void arm_locked() noexcept {
            s_.alarm = &source_.source();
            armed_ = true;
        }
        stop_token token() const noexcept { return source_.get_token(); }

    private:
        limiter_state& s_;
        pooled_stop_source source_;
        stop_link link_; // after the source it stops: gone first
        bool armed_ = false;
    };

    /// Changes the meter and the queue options: `change(meter, now)` runs with `mutex` held and
    /// the meter's state held, before anything else changes (what throws there changes nothing);
    /// then `queue_limit` and `queue_timeout` (for waiters queued from now on) are set, and a
    /// sleeping head is woken to time its permit again.
    template <class Change>
    void reconfigure(Change&& change, std::size_t new_queue_limit,
                     std::optional<std::chrono::nanoseconds> new_queue_timeout,
                     discipline_rule new_discipline) {
        std::optional<stop_source> wake;
        {
            std::lock_guard lock(mutex);
            meter_lease lease{*this};
            change(meter, elapsed_locked());
            queue_limit.store(new_queue_limit, std::memory_order_relaxed);
            queue_timeout = new_queue_timeout;
            if (std::exchange(discipline, new_discipline) != new_discipline)
                for (standing_queue& q : standing) // another rule measures afresh
                    q.reset();
            if (alarm) {
                wake.emplace(*alarm);
                alarm = nullptr;
            }
        }
        if (wake)
            wake->request_stop();
    }

    // The head's loop: take the permit when it is there, else sleep until it is due or the wait
    // runs out. Ends when the permit is taken, when the deadline passed first (a permit due at the
    // very instant of the deadline is still taken), or when the node left its turn (stopped).
    task<waiter_state> serve_head(timed_waiter& node, const stop_token& token) {
        for (;;) {
            typename C::time_point due{};
            waiter* next = nullptr;
            waiter_state st = waiter_state::turn;
            head_alarm turn_alarm{*this, token};
            waiter* refused = nullptr; // others moved on (a deadline, the discipline), chained through `next`
            bool again = false;        // the discipline served another: look again at once
            {
                std::lock_guard lock(mutex);
                meter_lease lease{*this};
                if (node.state == waiter_state::queued) {
                    // A caller of a higher class took the turn: out at its own deadline, else parked.
                    st = waiter_state::queued;
                    const auto now = elapsed_locked();
                    if (now >= node.deadline) {
                        node.retry_after = ceil_ns(meter.available_at(now, queue.count_from(node.rank + 1u) +
                                                                               keep_locked(node.rank))) -
                                           now;
                        queue.erase(node);
                        node.state = st = waiter_state::expired;
                    }
                } else if (node.state != waiter_state::turn) {
                    st = node.state;
                } else if (token.stop_requested()) {
                    next = queue.leave_turn(node, waiter_state::stopped);
                    st = waiter_state::stopped;
                } else {
                    const auto now = elapsed_locked();
                    const std::size_t keep = keep_locked(node.rank);
                    if (discipline.on &&
                        !(meter.available_at(now, keep) > static_cast<double>(now.count()))) {
                        st = hand_over_locked(*this, node, now, keep, next, refused);
                        again = st == waiter_state::turn;
                    } else if (take_keeping_locked(now, keep)) {
                        next = queue.leave_turn(node, waiter_state::granted);
                        st = waiter_state::granted;
                    } else {
                        const double at = meter.available_at(now, keep);
                        if (now >= node.deadline) {
                            node.retry_after = ceil_ns(at) - now;
                            next = queue.leave_turn(node, waiter_state::expired);
                            st = waiter_state::expired;
                        } else {
                            // With classes in the queue, the deadlines behind the head may come
                            // before its own (in arrival order, they do not).
                            const std::chrono::nanoseconds until =
                                queue.any_from(1)
                                    ? std::min(node.deadline, expire_behind_locked(node, now, refused))
                                    : node.deadline;
                            if (ceil_ns(at) <= until && ceil_ns(at) > now) {
                                due = time_point_of(at);
                            } else {
                                // A deadline comes first, or the permit is further than the limiter
                                // can tell (held at ceil_ns's limit, which `now` may have passed on
                                // virtual time): sleep until the deadline, or for good, not in a loop.
                                due = detail::add_saturating(origin, until);
                            }
                        }
                        if (st == waiter_state::turn)
                            turn_alarm.arm_locked();
                    }
                }
            }
            if (next)
                next->wake();
            wake_chain(refused);
            if (again)
                continue;
            if (st == waiter_state::queued) {
                co_await park{*this, node}; // until it is moved on: its turn, a stop, a refusal
                continue;
            }
            if (st != waiter_state::turn)
                co_return st;
            // Until the permit is due, the deadline, the caller's stop or a reconfiguration. If it
            // throws, serve_turn's turn_guard hands the turn on.
            co_await clock.sleep_until(due, turn_alarm.token());
        }
    }

    // The fast path of a call of class `rank` with priorities on. One that keeps nothing for the
    // classes above takes its permit as any call does (without the mutex for a lock-free meter,
    // and never while anyone waits); the others decide under the mutex, passing waiters of lower
    // classes.
    RESILIENCE_DETAIL_NOINLINE bool try_take_ranked(typename C::time_point now, const priority_block& b,
                                                    unsigned rank) {
        if (b.table.keep(rank, b.limit) == 0)
            return try_take_now(now);
        std::lock_guard lock(mutex);
        meter_lease lease{*this};
        // A reading made before the lock may be older than one a decision already used.
        return !queue.any_from(rank) &&
               take_keeping_locked(std::max(since_origin(now), latest), keep_locked(rank));
    }

    // `mutex` held, by the head `head` at `now`: refuses (`expired`) the waiters behind it whose
    // deadline has come, highest class first and in arrival order within a class, each told when a
    // permit would be there for it behind those still ahead, and chains those to wake into
    // `refused`. Returns the earliest deadline left behind the head (or the largest time).
    std::chrono::nanoseconds expire_behind_locked(const waiter& head, std::chrono::nanoseconds now,
                                                  waiter*& refused) {
        std::chrono::nanoseconds earliest = std::chrono::nanoseconds::max();
        for (std::size_t r = waiter_ranks; r-- > 0;) {
            for (;;) {
                waiter* w = queue.first_of(r);
                if (w == &head)
                    w = w->next && w->next->rank == r ? w->next : nullptr;
                if (!w)
                    break;
                if (now < timed(*w).deadline) { // the rest of the class comes later (queued later)
                    earliest = std::min(earliest, timed(*w).deadline);
                    break;
                }
                const std::size_t ahead = queue.count_from(r + 1) + (head.rank == r ? 1 : 0);
                timed(*w).retry_after =
                    ceil_ns(meter.available_at(now, ahead + keep_locked(static_cast<unsigned>(r)))) - now;
                queue.erase(*w);
                w->state = waiter_state::expired;
                if (!w->driving) {
                    w->next = refused;
                    refused = w;
                }
            }
        }
        return earliest;
    }

    // A waiter of this queue as what it is (`node_type`).
    static timed_waiter& timed(waiter& w) noexcept { return static_cast<timed_waiter&>(w); }

    // Wakes a chain of waiters linked through `next`, without the mutex. Each link is read before
    // its waiter is woken: once woken, it may run and end at once.
    static void wake_chain(waiter* w) {
        while (w) {
            waiter* next = w->next;
            w->wake();
            w = next;
        }
    }

    // What a head that lost its turn waits on, in its own coroutine: suspended, it is woken like any
    // queued waiter (it is no longer `driving`) when its turn comes back, its caller stops, or it is
    // refused. Decided under the mutex after the coroutine is suspended, so no wake-up is missed.
    struct park {
        limiter_state& s;
        waiter& node;
        bool await_ready() const noexcept { return false; }
        bool await_suspend(std::coroutine_handle<> h) {
            std::lock_guard lock(s.mutex);
            if (node.state != waiter_state::queued)
                return false; // moved on meanwhile: look again at once
            node.handle = h;
            node.loop = home_loop::current();
            node.driving = false;
            return true;
        }
        void await_resume() const noexcept {}
    };

    double remaining() {
        std::lock_guard lock(mutex);
        meter_lease lease{*this};
        return meter.remaining(elapsed_locked());
    }
    [[nodiscard]] std::size_t queued() {
        std::lock_guard lock(mutex);
        return queue.size();
    }
};

} // namespace resilience::detail
