// SPDX-License-Identifier: MIT
/// \file engine/waiter_queue.hpp
/// The queue of suspended coroutines that the bulkhead and the rate limiters make callers wait in: in
/// arrival order, or with priorities (priority.hpp) by rank, highest first, in arrival order within a
/// rank.
///
/// How a policy uses it. The policy's shared state (the *owner*) holds a `std::mutex mutex` and a
/// `waiter_queue queue`, and says in two functions, called with `mutex` held, what a caller gets:
///
///     waiter_state decide_locked(waiter& w);  // granted (took it now), rejected, or idle (must wait)
///     waiter_state enqueue_locked(waiter& w); // push_back(w); then queued (suspend) or turn (go on);
///                                             // or granted, not queued, when what it waits for came
///                                             // back since decide_locked without passing the mutex
///
/// An owner whose fast path reads a summary of the queue without the mutex (whether anyone waits)
/// may also provide `void waiter_left_locked()`, called with `mutex` held after a stop or a
/// withdrawal took a waiter out here, so that it can update the summary when the queue empties.
/// An owner whose grant can be given back (a bulkhead's slot) may provide `void take_back_grant()`,
/// called without `mutex` when a waiter is destroyed after being granted and before it resumed.
/// An owner whose `enqueue_locked` may move another waiter on (a waiter of a lower rank displaced
/// from a full queue, a head that loses its turn to a higher rank) provides
/// `void take_deferred_locked(deferred_wake&)`, called with `mutex` held right after
/// `enqueue_locked`: it hands over what must be woken once `mutex` is released.
///
/// A call then waits with `co_await queue_awaiter<Owner>{owner, node, stop_token}`, where `node` is a
/// `waiter` that outlives the wait: declared in the calling coroutine, or beside the awaiter in a
/// pipeline's `frame_wait` (so queueing allocates nothing of its own). The awaiter decides at once when it
/// can; otherwise it queues the node, suspends, and is resumed exactly once, on the event loop it suspended
/// on, by whoever moves the node on:
/// - the owner, when the node's turn comes: it pops the node (or leaves it at the front for a
///   `turn`), sets its state under `mutex`, releases `mutex`, then calls `node->wake()`;
/// - the caller's stop token: a stop request takes a still-queued node out at once (`stopped`),
///   and a node at its `turn` too (handing the turn on), through `stop_waiter`;
/// - anything else that bounds the wait (a bulkhead's queue timeout) through `withdraw`; a rate
///   limiter's head ends its own `turn` when its queue timeout comes first (see `limiter_state`).
/// The awaiter's result is the node's final state. Each of these checks the node's state under
/// `mutex` first, so the first one wins and the others do nothing.
///
/// A node that is `driving` (a limiter's head, or a head that lost its turn and has not yet noticed)
/// runs or sleeps in a coroutine of its own that checks the node's state under `mutex` before it
/// waits: whoever moves it on leaves it alone (or stops its sleep), instead of waking it.
///
/// Locking: the queue has no mutex of its own. Its owner's `mutex` guards the queue and every queued
/// node's `prev`, `next` and `state`; the owner's functions that the queue calls (`decide_locked`,
/// `enqueue_locked`, `waiter_left_locked`, `take_deferred_locked`) are called with it held, as their names
/// say, and never take it.
#pragma once

#include "../detail/inlining.hpp"
#include "../event_loop.hpp"
#include "../stop_token.hpp"

#include <chrono>
#include <concepts>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2 {

/// A `queue_limit` with no bound: every call that finds nothing free waits.
inline constexpr std::size_t unbounded_queue = std::numeric_limits<std::size_t>::max();

} // namespace resilience

namespace resilience::inline v0_2::detail {

/// Where a waiter stands. Changed only with the owner's mutex held.
enum class waiter_state : unsigned char {
    idle,     ///< not in the queue (not arrived yet, or the owner said it must wait)
    queued,   ///< in the queue and suspended: only its turn, a stop or a withdrawal moves it on
    turn,     ///< at the front and running: still queued, the owner's protocol goes on in the
              ///< waiter's own coroutine (the rate limiters' head, which sleeps until its token is due)
    granted,  ///< got its slot or token; out of the queue
    rejected, ///< refused without waiting (no queue place, or waiting not allowed)
    stopped,  ///< its caller stopped waiting first; out of the queue, got nothing
    expired,  ///< its queue timeout ran out first; out of the queue, got nothing
    shed,     ///< its owner's queue discipline dropped it (queue_discipline.hpp); out of the queue
};

/// One waiting caller: an intrusive list node living in the waiting coroutine's frame. The owner's
/// mutex guards `prev`, `next` and `state`. `handle` and `loop` are written before the node enters
/// the queue and never after. The node must stay alive, and must not be destroyed, while queued.
struct waiter {
    waiter* prev = nullptr;
    waiter* next = nullptr;
    std::coroutine_handle<> handle{};
    home_loop* loop = nullptr; ///< the home it suspended on; null: it is resumed inline
    waiter_state state = waiter_state::idle;
    /// Its place among the waiters: a higher rank is served first (priority.hpp's class), below
    /// `waiter_ranks`. Written before the node enters the queue and never after.
    unsigned char rank = 0;
    /// Its own coroutine runs (or sleeps, the head of a limiter), and checks `state` under the
    /// owner's mutex before it waits: not to be woken (see the file comment).
    bool driving = false;
    /// Where, counted in bytes from the node, the waiting call keeps the instant it queued, for an
    /// owner whose queue discipline needs it (a bulkhead's, beside its awaiter); 0: it keeps none.
    /// In the node's padding, so a queue without a discipline pays nothing for it. Written before
    /// the node enters the queue and never after.
    std::uint16_t since_offset = 0;

    /// Resumes the waiter on its own loop, or inline when it had none. Call it without the
    /// owner's mutex held (an inline resume may re-enter the owner), and touch the node no more:
    /// once posted, the waiter may already be running on another thread.
    void wake() const {
        home_loop* l = loop;
        std::coroutine_handle<> h = handle;
        if (l)
            l->post_resume(h);
        else
            resume_homeless(h);
    }
    /// Like `wake`, but never resumes inline (safe with a lock held): a waiter with no loop is
    /// resumed on the calling thread's loop if there is one, else inline after all.
    void wake_later() const {
        if (loop)
            loop->post_resume(handle);
        else if (home_loop* const here = home_loop::current())
            here->post(here->is_event_loop() ? job::resume(handle) : resume_without_home(handle));
        else
            handle.resume();
    }
};

static_assert(sizeof(waiter) == 4 * sizeof(void*) + 8, "the flags and `since_offset` stay in the padding");

/// A waiter with the notes a rate limiter keeps on it. A limiter's queue holds only these (its state's
/// `node_type`, which `queue_awaiter` takes), so the limiter may treat any waiter of its queue as one.
struct timed_waiter : waiter {
    union {
        /// The owner's note on a refusal, written once the waiter is out of the queue.
        std::chrono::nanoseconds retry_after{};
        /// The owner's note while it is queued: the instant it queued (for a queue discipline).
        std::chrono::nanoseconds queued_at;
    };
    /// The owner's note, set when queued: when the wait runs out (with a queue timeout).
    std::chrono::nanoseconds deadline = std::chrono::nanoseconds::max();
};

/// The node type a queue's owner takes: `Owner::node_type` if it names one, else `waiter`.
template <class Owner>
struct node_type_of {
    using type = waiter;
};
template <class Owner>
requires requires { typename Owner::node_type; }
struct node_type_of<Owner> {
    using type = typename Owner::node_type;
};

/// How many ranks a queue orders its waiters by (`waiter::rank`, below this).
inline constexpr std::size_t waiter_ranks = 8;

/// A list of waiters, highest rank first and in arrival order within a rank: O(1) pop and erase
/// from anywhere, push in O(ranks), no allocation. With every waiter of rank 0 (no priorities), a
/// FIFO list. Not locked by itself: every call must hold the owner's mutex.
class waiter_queue {
public:
    waiter_queue() = default;
    waiter_queue(const waiter_queue&) = delete;
    waiter_queue& operator=(const waiter_queue&) = delete;

    bool empty() const noexcept { return head_ == nullptr; }
    std::size_t size() const noexcept { return size_; }
    /// The first waiter to serve (the highest rank's longest waiting), or null.
    waiter* front() const noexcept { return head_; }

    /// Queues `w` behind every waiter of its rank or higher, ahead of those of lower ranks.
    void push_back(waiter& w) noexcept {
        waiter* after = nullptr; // the last waiter of a rank >= w's
        for (std::size_t r = w.rank; r < waiter_ranks && !after; ++r)
            after = tails_[r];
        w.prev = after;
        w.next = after ? after->next : head_;
        if (w.next)
            w.next->prev = &w;
        else
            tail_ = &w;
        if (after)
            after->next = &w;
        else
            head_ = &w;
        tails_[w.rank] = &w;
        ++counts_[w.rank];
        ++size_;
    }
    /// Precondition: `w` is in this queue.
    void erase(waiter& w) noexcept {
        if (tails_[w.rank] == &w)
            tails_[w.rank] = w.prev && w.prev->rank == w.rank ? w.prev : nullptr;
        if (w.prev)
            w.prev->next = w.next;
        else
            head_ = w.next;
        if (w.next)
            w.next->prev = w.prev;
        else
            tail_ = w.prev;
        w.prev = w.next = nullptr;
        --counts_[w.rank];
        --size_;
    }
    waiter* pop_front() noexcept {
        waiter* w = head_;
        if (w)
            erase(*w);
        return w;
    }

    /// How many waiters have rank `r` or higher.
    std::size_t count_from(std::size_t r) const noexcept {
        std::size_t n = 0;
        for (; r < waiter_ranks; ++r)
            n += counts_[r];
        return n;
    }
    /// How many waiters have rank `r`.
    std::size_t count_of(std::size_t r) const noexcept { return counts_[r]; }
    /// The last to arrive of rank `r`, or null.
    waiter* last_of(std::size_t r) const noexcept { return tails_[r]; }
    /// Whether a waiter of rank `r` or higher is queued.
    bool any_from(std::size_t r) const noexcept {
        for (; r < waiter_ranks; ++r)
            if (counts_[r] != 0)
                return true;
        return false;
    }
    /// The longest waiting of rank `r`, or null.
    waiter* first_of(std::size_t r) const noexcept {
        if (counts_[r] == 0)
            return nullptr;
        for (std::size_t above = r + 1; above < waiter_ranks; ++above)
            if (tails_[above])
                return tails_[above]->next;
        return head_;
    }
    /// The waiter a newcomer of rank `r` displaces from a full queue: the last to arrive of the
    /// lowest rank present, when that rank is below `r`; else null.
    waiter* displaced_by(std::size_t r) const noexcept { return tail_ && tail_->rank < r ? tail_ : nullptr; }

    /// Takes `w` out and marks it `why` if it is still `queued`, and says whether the caller must
    /// then `wake()` it (after releasing the mutex): not when it is `driving`. A node in any other
    /// state is left alone: the owner, or another withdrawal, already moved it on.
    bool withdraw(waiter& w, waiter_state why) noexcept {
        if (w.state != waiter_state::queued)
            return false;
        erase(w);
        w.state = why;
        return !w.driving;
    }
    /// Ends the `turn` of `head` (the front): takes it out, marks it `why`, and gives the turn to
    /// the next waiter, which it returns to be woken (after releasing the mutex), or null (nobody
    /// left, or the next one is `driving` and finds its turn by itself).
    waiter* leave_turn(waiter& head, waiter_state why) noexcept {
        erase(head);
        head.state = why;
        return give_turn();
    }
    /// Gives the turn to the front waiter if it does not have it yet, and returns it to be woken
    /// (after releasing the mutex), or null (none, it has the turn already, or it is `driving`).
    /// From then on it drives.
    waiter* give_turn() noexcept {
        waiter* next = head_;
        if (!next || next->state == waiter_state::turn)
            return nullptr;
        next->state = waiter_state::turn;
        return std::exchange(next->driving, true) ? nullptr : next;
    }
    /// What a stop request does to `w`: a `queued` waiter leaves (`stopped`) and is returned to be
    /// woken (unless `driving`: it sees the stop itself); a waiter at its `turn` leaves (`stopped`)
    /// at once too, without being woken (it is running, or already posted), and the returned waiter
    /// to wake is the next one, whose turn it now is. Any other state: nothing to do, null.
    waiter* stop(waiter& w) noexcept {
        if (w.state == waiter_state::queued) {
            erase(w);
            w.state = waiter_state::stopped;
            return w.driving ? nullptr : &w;
        }
        if (w.state == waiter_state::turn)
            return leave_turn(w, waiter_state::stopped);
        return nullptr;
    }

private:
    waiter* head_ = nullptr;
    waiter* tail_ = nullptr;
    std::size_t size_ = 0;
    waiter* tails_[waiter_ranks] = {};      // the last waiter of each rank, or null
    std::size_t counts_[waiter_ranks] = {}; // the waiters of each rank
};

/// What an owner's step under its mutex leaves to do once the mutex is released (see the file
/// comment): a waiter to wake, and the alarm of a sleeping head to stop (a copy of its source,
/// taken under the mutex, so that the request is safe however soon the head ends).
struct deferred_wake {
    waiter* wake = nullptr;
    std::optional<stop_source> alarm{};

    /// Does it, without the owner's mutex: a clock may resume the head inline from the request.
    void run() {
        if (waiter* w = std::exchange(wake, nullptr))
            w->wake();
        if (alarm) {
            stop_source s = std::move(*alarm);
            alarm.reset();
            s.request_stop();
        }
    }
};

/// What `queue_awaiter` needs from the state of the policy owning the queue (see the file comment).
template <class O>
concept queue_owner = requires(O& o, typename node_type_of<O>::type& w) {
    requires std::same_as<decltype(o.mutex), std::mutex>;
    requires std::same_as<decltype(o.queue), waiter_queue>;
    { o.decide_locked(w) } -> std::same_as<waiter_state>;
    { o.enqueue_locked(w) } -> std::same_as<waiter_state>;
};

/// Tells `owner` (its mutex held) that a waiter left its queue, if it asks to know (see the file
/// comment).
template <queue_owner Owner>
void waiter_left_locked(Owner& owner) noexcept {
    if constexpr (requires { owner.waiter_left_locked(); })
        owner.waiter_left_locked();
}

/// Applies a stop request to `w` (see `waiter_queue::stop`): takes the owner's mutex, so call it
/// without holding it; a stop callback is the place. Wakes whoever must be woken.
template <queue_owner Owner>
void stop_waiter(Owner& owner, waiter& w) {
    waiter* wake;
    {
        std::lock_guard lock(owner.mutex);
        wake = owner.queue.stop(w);
        waiter_left_locked(owner);
    }
    if (wake)
        wake->wake();
}

/// Waits for the owner's decision on `node`, in arrival order; yields the node's final state:
/// `granted`, `rejected`, `stopped` (the token was stopped before the owner moved it on), `turn`
/// (the owner's protocol goes on in the caller), or whatever a `withdraw` set. Never suspends
/// when the owner decides at once or the token is already stopped. Not movable: `co_await` it
/// where it is made. `owner`, `node` (unless it is the awaiter's own, `OwnNode`) and `token` must
/// outlive it.
///
/// It is its own stop callback (one `stop_callback_node`, listed on the token's state while it waits),
/// with its flags in that node's padding: 64 bytes and the node, in the frame of every call that waits
/// in a queue.
template <queue_owner Owner, bool OwnNode = false>
class queue_awaiter : private stop_callback_node {
public:
    using node_type = typename node_type_of<Owner>::type;

    // The two constructors are templates so that an explicit instantiation of the class (the
    // compiled mode's, bulkhead.hpp) leaves out the one its `OwnNode` rules out: clang 14 would
    // instantiate it despite its constraint.
    /// Waits with `node`, which the caller keeps.
    template <bool Own = OwnNode>
    requires(!Own)
    queue_awaiter(Owner& owner, node_type& node, const stop_token& token) noexcept
        : stop_callback_node(&on_stop), owner_(owner), node_(&node), token_(stop_access::state(token)) {}
    /// Waits with a node of its own (`node()`): 8 bytes less where the awaiter and its node live
    /// side by side (a pipeline's `frame_wait`).
    template <bool Own = OwnNode>
    requires Own
    queue_awaiter(Owner& owner, const stop_token& token) noexcept
        : stop_callback_node(&on_stop), owner_(owner), token_(stop_access::state(token)) {}
    queue_awaiter(const queue_awaiter&) = delete;
    queue_awaiter& operator=(const queue_awaiter&) = delete;
    /// Reached while still suspended only when the waiting coroutine is destroyed without being
    /// resumed (its event loop was torn down): a still-queued node leaves the queue, so nobody
    /// wakes a dead frame. What was already granted to it goes back to an owner that takes grants
    /// back (`take_back_grant`); otherwise (a limiter's permit) it is spent, as the grant was.
    RESILIENCE_DETAIL_NOINLINE ~queue_awaiter() { leave(); }

    /// What the destructor does, done now (and not again): for an owner that must still hold its
    /// state while the waiter leaves its queue, and gives it up right after.
    RESILIENCE_DETAIL_NOINLINE void leave() noexcept {
        // First: an awaiter that listed itself and then did not suspend (an owner's step threw in
        // `await_suspend`, or the head of a limiter left before it slept) is listed all the same.
        unlist();
        if (!suspended_)
            return;
        suspended_ = false;
        waiter* turn_to = nullptr;             // the waiter this one's turn passes to
        [[maybe_unused]] bool granted = false; // read only for an owner that takes grants back
        {
            std::lock_guard lock(owner_.mutex);
            if (!owner_.queue.withdraw(node(), waiter_state::stopped) && node().state == waiter_state::turn)
                turn_to = owner_.queue.leave_turn(node(), waiter_state::stopped);
            granted = node().state == waiter_state::granted;
            if constexpr (requires { owner_.take_back_grant(); })
                if (granted)
                    node().state = waiter_state::stopped; // given back below: the node holds nothing
            waiter_left_locked(owner_);
        }
        if (turn_to)
            turn_to->wake_later();
        if constexpr (requires { owner_.take_back_grant(); })
            if (granted)
                owner_.take_back_grant();
    }

    RESILIENCE_DETAIL_NOINLINE bool await_ready() {
        if (token_ && token_->stop_requested()) {
            node().state = waiter_state::stopped;
            return true;
        }
        std::lock_guard lock(owner_.mutex);
        node().state = owner_.decide_locked(node());
        return node().state != waiter_state::idle;
    }

    RESILIENCE_DETAIL_NOINLINE bool await_suspend(std::coroutine_handle<> h) {
        node().handle = h;
        node().loop = home_loop::current();
        // Registered before taking the mutex: a token stopped meanwhile runs the callback right
        // here, which takes the mutex itself. It finds the node not yet queued and does nothing;
        // the check below then sees the stop.
        if (token_ && token_->stop_possible())
            listed_ = token_->add(this);
        deferred_wake later; // what queueing moved on: woken once the mutex is released
        bool suspend;
        {
            std::lock_guard lock(owner_.mutex);
            if (token_ && token_->stop_requested()) {
                node().state = waiter_state::stopped;
                return false;
            }
            // Decided again: the slot or token may have come back since await_ready.
            node().state = owner_.decide_locked(node());
            if (node().state != waiter_state::idle)
                return false;
            node().state = owner_.enqueue_locked(node());
            if constexpr (requires { owner_.take_deferred_locked(later); })
                owner_.take_deferred_locked(later);
            entered_ = true;
            suspend = suspended_ = node().state == waiter_state::queued;
        }
        // Once the mutex is released the node may be woken at any time: nothing below touches it.
        later.run();
        return suspend;
    }

    /// The owner whose queue this awaiter waits in.
    Owner& owner() const noexcept { return owner_; }
    /// The node it waits with.
    node_type& node() noexcept {
        if constexpr (OwnNode)
            return node_;
        else
            return *node_;
    }

    RESILIENCE_DETAIL_NOINLINE waiter_state await_resume() noexcept {
        suspended_ = false;
        // Waits for a stop callback running on another thread, so it is done with the node.
        unlist();
        if (!entered_)
            return node().state; // decided here, under the mutex or before anyone saw the node
        // Once queued, the node's state is another thread's to write (its grant, a `turn` passed on,
        // and taken back by a newcomer of a higher class even after this resumed): read under the
        // mutex it is written under, which also orders what the writer set beside it (`retry_after`).
        std::lock_guard lock(owner_.mutex);
        return node().state;
    }

private:
    // Run by a stop request on the token (at once, in `await_suspend`, if it came first).
    static void on_stop(stop_callback_node* n) noexcept {
        auto* const self = static_cast<queue_awaiter*>(n);
        stop_waiter(self->owner_, self->node());
    }
    // Takes this awaiter off the token's list (as a `stop_callback`'s destructor does), waiting for
    // its run in progress on another thread; from inside its own run it only marks it destroyed.
    void unlist() noexcept {
        if (listed_) {
            listed_ = false;
            token_->remove(this);
        }
    }

    // In the node's padding (after its `finished` flag).
    bool suspended_ = false; ///< written under the owner's mutex before the node can be woken
    bool entered_ = false;   ///< the node went into the queue: others write its state from then on
    bool listed_ = false;    ///< on the token's list of callbacks, or running from it

public:
    /// A byte of the padding, the holder's to use (a bulkhead's `frame_wait` keeps there whether
    /// it has room after it, and what that room holds); this awaiter never reads it.
    unsigned char spare = 0;

private:
    Owner& owner_;
    std::conditional_t<OwnNode, node_type, node_type*> node_;
    // The token's stop state (null: it can never stop), referred to by the caller's token, which
    // outlives this awaiter.
    stop_state* token_;
};

} // namespace resilience::detail
