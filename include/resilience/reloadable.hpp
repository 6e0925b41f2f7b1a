// SPDX-License-Identifier: MIT
/// \file reloadable.hpp
/// `reloadable<P>`: a policy or pipeline held by value (retry, timeout, hedge, fallback, chaos, a
/// whole `pipeline`) that can be replaced while calls run through it: new calls run on the new one,
/// calls in flight finish on the one they started on, which is destroyed after the last of them.
///
/// Locking: `reload_state::mutex_` serialises reloads: it guards the list of blocks (`blocks_`) and
/// the building of a policy in one. `current_` and each block's `pins` are atomics, read and changed
/// without it by the calls that pin a snapshot. No function is called with it held, so none is named
/// `_locked`.
#pragma once

#include "concepts.hpp"
#include "context.hpp"
#include "detail/shared_handle.hpp"
#include "detail/stages.hpp"
#include "engine/action.hpp"
#include "engine/driver.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "stop_token.hpp"
#include "task.hpp"

#include <atomic>
#include <concepts>
#include <cstdint>
#include <mutex>
#include <new>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2 {

namespace detail {

template <class P>
class reload_state;

/// One snapshot of a `reloadable`'s policy, and the count of what pins it: one for being the current
/// snapshot, one per call (or `snapshot` handle) running on it. The policy is destroyed by whoever
/// brings that count to zero once the snapshot is no longer current; the block itself stays (a call
/// starting may have read its address just before it was replaced), and the next reload builds its
/// snapshot in it (see `reload_state`).
template <class P>
struct reload_block {
    /// Set, with the count at zero, once the policy is being destroyed: a pin that finds it backs off.
    static constexpr std::uint64_t dead = std::uint64_t{1} << 63;
    /// Set with `dead` once the policy is destroyed: a reload may build its snapshot in the block.
    static constexpr std::uint64_t free = std::uint64_t{1} << 62;

    reload_block(P&& p, reload_state<P>& o) : owner(&o) {
        ::new (static_cast<void*>(&policy)) P(std::move(p));
    }
    /// An empty block, `dead`, for `reload_state::publish` to build a snapshot in.
    explicit reload_block(reload_state<P>& o) noexcept : pins(dead | free), owner(&o) {}
    reload_block(const reload_block&) = delete;
    reload_block& operator=(const reload_block&) = delete;
    ~reload_block() {} // the policy is destroyed by `reload_state::unpin`, not here

    std::atomic<std::uint64_t> pins{1};
    reload_state<P>* owner;
    reload_block* next = nullptr; // every block the state made, newest first
    union {
        P policy;
    };
};

/// What the copies of a `reloadable` share: the current snapshot and every block made.
///
/// A call pins the current snapshot with one atomic increment of its block's count (and unpins it
/// with one decrement), never touching the state's own count: a snapshot that is no longer current
/// holds the state (one hold each) until it dies, and the current one is retired when the last
/// handle goes, so a pin keeps alive everything it needs. A block is not freed when its policy dies,
/// because a call may have loaded its address just before a reload and be about to pin it: that pin
/// sees `dead` and loads the current one again. Instead, a reload builds its snapshot in a dead
/// block when there is one, so the blocks are as many as the snapshots that were ever alive at once
/// (two, when no call runs across a reload), not one per reload; they are freed with the state.
/// A pin that finds its block alive again under another snapshot sees that it is not the current
/// one (the load after the pin), gives it back and starts over: a call runs on the snapshot that was
/// current at its pin.
template <class P>
class reload_state : public shared_state {
public:
    using block = reload_block<P>;

    explicit reload_state(P p) : blocks_(new block(std::move(p), *this)) {
        current_.store(blocks_, std::memory_order_relaxed);
    }
    reload_state(const reload_state&) = delete;
    reload_state& operator=(const reload_state&) = delete;
    ~reload_state() {
        // Every snapshot is dead by now: each retired one held the state until it died.
        for (block* b = blocks_; b;) {
            block* const after = b->next;
            delete b;
            b = after;
        }
    }

    /// Pins the current snapshot. Lock-free; one increment, unless a reload raced with it.
    block* pin() noexcept {
        for (;;) {
            block* const b = current_.load(std::memory_order_acquire);
            // Acquire: a block built again in place was revived by a release (`publish`), which this
            // must see whole if it pins it. The policy is destroyed only by the acquire-release
            // that takes the count to zero, after this pin.
            if (pinned(b, b->pins.fetch_add(1, std::memory_order_acquire))) [[likely]]
                return b;
        }
    }
    /// The rest of a pin on `b`, whose count was `before` when the pin added itself: true when `b` is
    /// the current snapshot; else the pin is given back and `pin` starts over.
    bool pinned(block* b, std::uint64_t before) noexcept {
        if (!(before & block::dead) && current_.load(std::memory_order_acquire) == b) [[likely]]
            return true;
        // Replaced since the load (perhaps built again), or dead. Given back with `unpin`, not a bare
        // decrement, in either case: a reload may have revived a dead block since, counting this pin
        // in, and retired it again; this pin is then the snapshot's last, and destroys it. (That cannot
        // delete the state: the handle the pin was taken through holds it.)
        unpin(b);
        return false;
    }

    /// Gives back a pin (or the current snapshot's own count); the last one of a retired snapshot
    /// destroys its policy and gives back its hold on the state, which may delete the state.
    void unpin(block* b) noexcept {
        if (b->pins.fetch_sub(1, std::memory_order_acq_rel) != 1)
            return;
        // Zero: retired, and no call on it. A pin may still come from a call that read its address
        // before the reload: it then finds the count above zero here, and unpins it itself later.
        std::uint64_t zero = 0;
        if (!b->pins.compare_exchange_strong(zero, block::dead, std::memory_order_acq_rel,
                                             std::memory_order_relaxed))
            return;
        b->policy.~P();
        // Release: a reload that builds in the block sees the policy destroyed. Before the hold
        // goes, which may delete the state and the block with it.
        b->pins.fetch_or(block::free, std::memory_order_release);
        drop_hold(*this); // the retired snapshot's hold: the state may go now
    }

    /// Makes `p` the current snapshot and retires the one it replaces. Throws only what allocating
    /// the block and moving `p` throw, and then nothing changed.
    void publish(P p) {
        block* old = nullptr;
        {
            std::lock_guard lock(mutex_);
            block* fresh = blocks_;
            // A free block is built in again (a pin passing there is counted in, and gives its count
            // back with `unpin`).
            while (fresh && !(fresh->pins.load(std::memory_order_acquire) & block::free))
                fresh = fresh->next;
            if (!fresh) {
                fresh = new block(*this);
                fresh->next = blocks_;
                blocks_ = fresh;
            }
            ::new (static_cast<void*>(&fresh->policy)) P(std::move(p)); // dead until revived below
            // Revived with the count of the current snapshot, and whatever passing pins hold now,
            // which each give back theirs. Release: a pin that finds it alive sees the policy built.
            fresh->pins.fetch_sub((block::dead | block::free) - 1, std::memory_order_acq_rel);
            old = current_.exchange(fresh, std::memory_order_acq_rel);
        }
        add_hold(*this); // the retired snapshot holds the state until it dies
        unpin(old);      // its count as the current one
    }

    /// The last handle went: the current snapshot is retired like a replaced one, and the state is
    /// deleted when it dies (at once, if no call runs on it).
    bool last_hold_dropped() noexcept {
        block* const b = current_.exchange(nullptr, std::memory_order_acq_rel);
        if (!b)
            return true; // the retired current snapshot just died: nothing is left
        add_hold(*this);
        unpin(b); // may delete the state: `this` is not touched after it
        return false;
    }

private:
    std::atomic<block*> current_{nullptr};
    std::mutex mutex_; // serialises reloads
    block* blocks_;
};

} // namespace detail

/// A policy or pipeline `P` held by value (a `retry`, `timeout`, `hedge`, `fallback`, `chaos`, a
/// `pipeline`, ...) that can be replaced while calls run, as Polly v8 reloads a pipeline and
/// resilience4j swaps a configuration: `reload(next)` (or `reconfigure(args...)`, which builds the
/// next `P` from its constructor's arguments, so bad options throw as they would at construction and
/// the policy in force stays) makes `next` the current snapshot, on every copy of the handle.
///
/// - A call runs on the snapshot current when it is made (`execute`, a task being lazy, takes it at
///   once), or, as a stage of a pipeline, when the call reaches the stage (each attempt of a retry
///   outside it takes the snapshot current then). It keeps that snapshot alive until it has ended,
///   also when it is destroyed without being resumed. A snapshot replaced is destroyed when its last
///   call ends, on the thread that ends it (at once, by `reload`, when no call runs on it).
/// - Stateful handles (breaker, bulkhead, limiter, throttle, budget) are shared by copies: a snapshot
///   built with the same handles as the one before keeps their state; change their options in place
///   with their own `reconfigure`. A snapshot built with new handles starts fresh ones.
/// - A policy itself: it satisfies `policy`, so it can be a stage of a pipeline. `reloadable<P>` is a
///   cheap copyable handle to shared state (docs/core.md, "Lifetimes"): copies share the current
///   snapshot, and a call needs nothing of the handle it was made through.
///
/// What it costs: a call pins its snapshot with one atomic increment and one decrement of the
/// snapshot's count (the call through `P` is otherwise the same: one frame for the whole of `P`);
/// as a stage of a pipeline, it adds a frame of its own. `reload` takes a mutex and builds the new
/// `P` in a block: one left by a snapshot that has died, or a new one. A replaced snapshot (what its
/// `P` owns) is destroyed once its last call has ended; its block, `sizeof(P)` plus about 24 bytes,
/// is kept for the next reload, so the blocks are as many as the snapshots ever alive at once (two
/// when no call runs across a reload), freed when the last copy of the handle and the last call
/// are gone. Thread-safe: calls, `reload` and `current` may come from any thread.
///
///     rs::circuit_breaker<> breaker{{.failure_threshold = 5}};
///     rs::reloadable policy{rs::pipeline{rs::retry{{.max_attempts = 3}}, breaker, rs::timeout{1s}}};
///     co_await policy.execute(fetch);                      // runs on the first pipeline
///     policy.reconfigure(rs::retry{{.max_attempts = 5}}, breaker, rs::timeout{2s});   // same breaker
///     co_await policy.execute(fetch);                      // runs on the new one
template <class P>
class reloadable : public policy_base<reloadable<P>>,
                   public detail::shared_handle<reloadable<P>, detail::reload_state<P>> {
    static_assert(policy<P>, "resilience::reloadable<P>: P must be a policy (or a pipeline)");
    static_assert(std::is_move_constructible_v<P>, "resilience::reloadable<P>: P must be movable");
    using state = detail::reload_state<P>;
    using block = typename state::block;
    using handle = detail::shared_handle<reloadable<P>, state>;
    using stage_tuple = detail::stages_t<P>;

public:
    /// A pin on one snapshot: the policy it holds stays alive (and unchanged) while the pin lives,
    /// whatever is reloaded meanwhile. Move-only; an empty one (default-constructed or moved from)
    /// holds nothing.
    class snapshot {
    public:
        snapshot() noexcept = default;
        snapshot(snapshot&& o) noexcept : b_(std::exchange(o.b_, nullptr)) {}
        snapshot& operator=(snapshot&& o) noexcept {
            if (this != &o) {
                reset();
                b_ = std::exchange(o.b_, nullptr);
            }
            return *this;
        }
        ~snapshot() { reset(); }

        [[nodiscard]] const P& get() const noexcept { return b_->policy; }
        [[nodiscard]] const P& operator*() const noexcept { return b_->policy; }
        [[nodiscard]] const P* operator->() const noexcept { return &b_->policy; }
        explicit operator bool() const noexcept { return b_ != nullptr; }
        /// Gives the pin back (the snapshot may be destroyed now, if it was replaced).
        void reset() noexcept {
            if (block* b = std::exchange(b_, nullptr))
                b->owner->unpin(b);
        }

    private:
        friend class reloadable;
        explicit snapshot(block* b) noexcept : b_(b) {}
        block* b_ = nullptr;
    };

    /// Holds `initial` as the first snapshot.
    explicit reloadable(P initial) : handle(handle::make_state(std::move(initial))) {}

    /// Makes `next` the current snapshot, for every copy of the handle: calls made from now on run on
    /// it; calls in flight finish on theirs. Throws only `std::bad_alloc` (or what moving `P` throws),
    /// and then nothing changed.
    void reload(P next) const { this->held().publish(std::move(next)); }

    /// Builds the next snapshot as `P(args...)` and reloads it: bad options throw from `P`'s
    /// constructor (`std::invalid_argument` naming the field and the value) before anything changes,
    /// so the snapshot in force stays.
    template <class... Args>
    requires std::constructible_from<P, Args...>
    void reconfigure(Args&&... args) const {
        reload(P(std::forward<Args>(args)...));
    }

    /// A pin on the current snapshot, to read it (`current()->options()`, `current()->get<0>()`).
    [[nodiscard]] snapshot current() const noexcept { return snapshot{this->held().pin()}; }

    /// What the current snapshot answers (see `detail::default_clock_sleeper`); a call through
    /// the reloadable asks the stages of the snapshot it pinned.
    [[nodiscard]] detail::sleeper may_sleep_on_default_clock() const noexcept {
        const snapshot now = current();
        return detail::default_clock_sleeper(now.get());
    }

    // ---- calls: `policy_base`'s `execute` and `execute_outcome`, which come to `launch` below;
    // each pins the current snapshot and runs `P`'s stages in one frame ----

    /// As a stage of a pipeline: runs `next` under the snapshot current now, which this pass keeps.
    template <class Next>
    task<next_outcome_t<Next>> run(Next next, const context& ctx) const {
        using drv = detail::driver<stage_tuple, Next>;
        return drv::template drive<false>(pinned{snapshot{this->held().pin()}},
                                          detail::borrowed_next<Next>{std::move(next)},
                                          detail::context_access::derive(ctx), typename drv::outermost{});
    }

private:
    friend class policy_base<reloadable>;
    template <bool Throw, class Source, class A>
    static auto launch(Source source, A action, context ctx) {
        return source.get().template call<Throw>(std::move(action), std::move(ctx));
    }

    // What a call's frame holds of the reloadable: the pin, and `P`'s stages (in the pinned snapshot,
    // whose address does not change), where the driver looks for them.
    struct pinned {
        snapshot hold;
        std::conditional_t<detail::keeps_stages<P>, const stage_tuple&, stage_tuple> stages;
        explicit pinned(snapshot s) noexcept : hold(std::move(s)), stages(detail::stages_of(*hold)) {}
    };

    template <bool Throw, class A>
    auto call(A action, context ctx) const {
        if constexpr (!detail::checked_action<A>::valid) {
            return detail::refuse_action<Throw, A>();
        } else {
            // A small action shares one call body with every other of its result type.
            using stored = std::remove_cvref_t<decltype(detail::stored_action(std::move(action)))>;
            using drv = detail::driver<stage_tuple, detail::guarded<stored>>;
            return drv::template drive<Throw>(
                pinned{snapshot{this->held().pin()}},
                detail::owned_action<stored>{detail::stored_action(std::move(action))}, std::move(ctx),
                typename drv::whole_call{});
        }
    }
};

template <class P>
reloadable(P) -> reloadable<P>;

} // namespace resilience
