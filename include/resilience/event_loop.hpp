// SPDX-License-Identifier: MIT
/// \file event_loop.hpp
/// `event_loop`: the embedded single-threaded runtime (timers and posted work), real or virtual time.
///
/// Locking: `event_loop::mutex_` guards the work posted from other threads (`remote_`), the list of
/// calls started with `spawn` (`spawned_`, each `drive_node`'s links and `orphaned`) and the first
/// failure of one (`failed_`), since a spawned call may end on another thread; `wake_` waits on it.
/// Everything else belongs to the thread running the loop. `outstanding_` and `remote_pending_` are atomics, read
/// without it (a hint, confirmed under it). No function is called with it held, so none is named `_locked`.
#pragma once

#include "concepts.hpp"
#include "detail/config.hpp"
#include "detail/home_loop.hpp"
#include "detail/intrusive_list.hpp"
#include "detail/ring.hpp"
#include "detail/timer_wheel.hpp"
#include "task.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace resilience::inline v0_2 {

namespace detail {

struct virtual_time_t {
    explicit virtual_time_t() = default;
};

template <class T>
struct result_slot {
    std::optional<T> value;
    std::exception_ptr error;
};
template <>
struct result_slot<void> {
    bool value = false;
    std::exception_ptr error;
};

struct loop_access;

} // namespace detail

/// Tag that makes an `event_loop` run on virtual time (see `testing::simulation`).
inline constexpr detail::virtual_time_t virtual_time{};

/// A single-threaded event loop: posted work, timers, and coroutines spawned onto it.
///
/// `run()` processes work on the calling thread until every spawned coroutine has finished.
/// On real time it blocks between timers; on virtual time (`event_loop{virtual_time}`) it never
/// blocks: when nothing is ready it jumps the clock to the next timer. While `run()` executes,
/// `event_loop::current()` on that thread names this loop, which is how the default clock finds
/// where to sleep. `post` and `spawn` may be called from any thread; timers are armed only from
/// the loop's own thread. Several loops on several threads may share stateful policies.
/// The loop must outlive everything spawned on it.
///
/// Timers fire at their exact instant (to the nanosecond on virtual time), in deadline order, those
/// of one instant in the order they were armed. A timer armed for an instant already past fires at
/// the next turn, before other due timers (several such: in arming order). Arming, cancelling and
/// firing cost O(1) however many timers are pending (see `detail/timer_wheel.hpp`).
class event_loop : private detail::home_loop {
public:
    // The wheel starts at the earliest time rather than read the clock (a loop made per call would pay
    // for it); the first turn with a timer armed brings it up to date.
    event_loop() noexcept : home_loop(&as_home), wheel_(std::chrono::nanoseconds::min()) {}
    explicit event_loop(detail::virtual_time_t) noexcept
        : home_loop(&as_home), virtual_(true), wheel_(std::chrono::nanoseconds{0}) {}
    event_loop(const event_loop&) = delete;
    event_loop& operator=(const event_loop&) = delete;
    /// Destroys every spawned coroutine that has not finished (suspended for good, or never
    /// started), with its whole chain of awaited tasks, as an I/O context destroys pending handlers.
    RESILIENCE_DECL ~event_loop();

    /// The loop running on this thread, or null (also while an Asio call's own code runs on it).
    static event_loop* current() noexcept {
        home_loop* const h = home_loop::current();
        return h && h->is_event_loop() ? static_cast<event_loop*>(h) : nullptr;
    }

    bool is_virtual() const noexcept { return virtual_; }

    /// Time on this loop's clock, as time since its epoch: `std::chrono::steady_clock`'s for a
    /// real-time loop, the simulation's start for a virtual one.
    std::chrono::nanoseconds now() const noexcept {
        if (virtual_)
            return vnow_;
        return std::chrono::steady_clock::now().time_since_epoch();
    }

    /// Runs `fn(arg)` on the loop's thread, after the work already queued. Thread-safe; may
    /// allocate (the queue grows), so it can throw `std::bad_alloc`.
    void post(void (*fn)(void*), void* arg) { post(detail::job{fn, arg}); }
    /// Resumes `h` on the loop's thread, after the work already queued. Thread-safe.
    void post(std::coroutine_handle<> h) { post(detail::job::resume(h)); }

    /// Starts `a` on this loop; `run()` does not return before it finishes. An exception escaping
    /// it is kept and rethrown by `run()`. A task runs as it is, its end reaching the loop through a
    /// node of four words; any other awaitable is moved into a coroutine that runs it.
    template <awaitable A>
    void spawn(A&& a) {
        if constexpr (detail::is_task<std::remove_cvref_t<A>> && !std::is_lvalue_reference_v<A>) {
            if (detail::task_access::startable(a)) { // an empty or finished one goes the other way
                spawn_task(std::move(a));
                return;
            }
        }
        auto h = drive(std::forward<A>(a)).handle; // may throw bad_alloc: nothing counted yet
        start(&h.promise(), h, 0);
    }

    /// Runs until every spawned coroutine has finished, then rethrows the first exception one of
    /// them let escape, if any.
    RESILIENCE_DECL void run();

    /// Virtual time only: runs everything due up to the instant `t` (posted work, and timers in
    /// order, time jumping to each one's instant), then sets the time to `t` and returns, leaving
    /// later timers and unfinished coroutines pending for the next call. Rethrows the first
    /// exception a spawned coroutine let escape. Never throws "stuck": work may well be pending.
    RESILIENCE_DECL void run_until(std::chrono::nanoseconds t);

    /// Runs `a` to completion on this loop (with anything else spawned) and returns its result.
    template <awaitable A>
    await_result_t<A> run(A&& a) {
        using R = await_result_t<A>;
        detail::result_slot<R> slot;
        spawn(capture<R>(std::forward<A>(a), slot));
        run();
        if (slot.error)
            std::rethrow_exception(slot.error);
        if constexpr (!std::is_void_v<R>)
            return std::move(*slot.value);
    }

    /// Timers armed now.
    [[nodiscard]] std::size_t timers() const noexcept { return wheel_.size(); }

private:
    friend struct detail::loop_access;

    /// For the length of a `run` or `run_until`: this loop is the thread's current one, and the one
    /// before it comes back after (impl/event_loop.ipp).
    class current_scope;

    // Work and timers for the library's own awaiters, through detail::loop_access.
    //
    // `post` may allocate (the queues grow), so it is never called from a function marked noexcept:
    // waking a waiter, a stop callback that posts, and a shared call releasing its callers are all
    // declared as able to throw. The one place a wake-up is posted where nothing may throw is a
    // destructor (a call's frame destroyed while holding a bulkhead slot hands the slot to the next
    // waiter); there, running out of memory ends the program, as it does in any destructor.
    RESILIENCE_DECL void post(detail::job j);
    // Timers, the loop's own thread only. Arms `t`, which must not be armed, for `t->when`; it
    // fires (`t->fire(t)`) on this loop.
    void add_timer(detail::timer_node* t) { wheel_.insert(t); }
    // Disarms `t` if it is armed; it will not fire.
    void remove_timer(detail::timer_node* t) noexcept { wheel_.erase(t); }

    // Every spawned coroutine is on an intrusive list until it finishes, so the destructor can
    // reclaim the ones that never do.
    using drive_node = detail::spawn_node;
    void start(drive_node* n, std::coroutine_handle<> h, std::uintptr_t bits) {
        n->word = reinterpret_cast<std::uintptr_t>(static_cast<home_loop*>(this)) | bits;
        n->handle = h;
        outstanding_.fetch_add(1, std::memory_order_relaxed);
        link(n);
        post(h);
    }
    void link(drive_node* n) {
        std::lock_guard lock(mutex_);
        spawned_.push_front(*n);
    }
    void unlink(drive_node* n) {
        std::lock_guard lock(mutex_);
        if (!n->orphaned())
            spawned_.erase(*n);
    }

    // A spawned task needs no coroutine around it: its node (a block of four words, smaller than a
    // frame) is where its continuation would be, and resuming the task is one resumption fewer.
    struct detached_node : drive_node, detail::recycled_frame {};
    template <class T>
    void spawn_task(task<T>&& t) {
        auto* const n = new detached_node{}; // may throw bad_alloc: `t` is left as it was
        const auto h = detail::task_access::release(t);
        h.promise().continuation_ = reinterpret_cast<void*>(
            reinterpret_cast<std::uintptr_t>(static_cast<drive_node*>(n)) | detail::detached_tag);
        start(n, h, drive_node::detached_bit);
    }
    // From a detached task's final suspension (it may have ended on another thread).
    RESILIENCE_DECL static void spawn_ended(home_loop* home, drive_node* n,
                                            std::exception_ptr failure) noexcept;
    // The first failure of a spawned coroutine is kept for `run` to rethrow.
    void record_failure(std::exception_ptr failure) noexcept {
        std::lock_guard lock(mutex_); // the coroutine may end on another thread
        if (!failed_)
            failed_ = std::move(failure);
    }

    struct drive_task {
        struct promise_type : drive_node, detail::recycled_frame {
            drive_task get_return_object() noexcept {
                return {std::coroutine_handle<promise_type>::from_promise(*this)};
            }
            std::suspend_always initial_suspend() const noexcept { return {}; }
            struct final_awaiter {
                bool await_ready() const noexcept { return false; }
                void await_suspend(std::coroutine_handle<promise_type> h) noexcept {
                    auto* const l = static_cast<event_loop*>(h.promise().home());
                    l->unlink(&h.promise());
                    h.destroy();
                    l->finished();
                }
                void await_resume() const noexcept {}
            };
            final_awaiter final_suspend() const noexcept { return {}; }
            void return_void() noexcept {}
            void unhandled_exception() noexcept {
                static_cast<event_loop*>(home())->record_failure(std::current_exception());
            }
        };
        std::coroutine_handle<promise_type> handle;
    };

    // A spawned awaitable's result is dropped, as `spawn` says: a `[[nodiscard]]` one too. A task's
    // is not even taken out (`detail::ended`): it takes no place in this frame, which every spawned
    // call has. The loop is set by `spawn` (a parameter would be kept in the frame too).
    template <class A>
    static drive_task drive(A a) {
        if constexpr (detail::is_task<A>)
            co_await detail::ended(std::move(a));
        else
            static_cast<void>(co_await std::move(a));
    }

    template <class R, class A>
    static task<void> capture(A a, detail::result_slot<R>& slot) {
        try {
            if constexpr (std::is_void_v<R>) {
                co_await std::move(a);
                slot.value = true;
            } else {
                slot.value.emplace(co_await std::move(a));
            }
        } catch (...) {
            slot.error = std::current_exception();
        }
    }

    // A spawned coroutine ended, perhaps on another thread: count it under the lock and wake the loop,
    // which may be waiting for exactly this (nothing is posted back when a coroutine ends elsewhere).
    void finished() noexcept {
        std::lock_guard lock(mutex_);
        outstanding_.fetch_sub(1, std::memory_order_acq_rel);
        wake_.notify_one();
    }

    RESILIENCE_DECL void take_remote();
    // Rethrows, once, the first failure of a spawned call, if there was one.
    RESILIENCE_DECL void rethrow_failure();

    // Fires every timer due at `now` (those armed meanwhile included), in the wheel's order; says
    // whether there was any.
    RESILIENCE_DECL bool fire_due(std::chrono::nanoseconds now);

    RESILIENCE_DECL void loop();

    // How a call made on this loop comes back to it (detail/home_loop.hpp).
    static void post_here(home_loop* loop, detail::job j) { static_cast<event_loop*>(loop)->post(j); }
    static constexpr operations as_home{&post_here, nullptr, nullptr, &spawn_ended};

    bool virtual_ = false;
    std::chrono::nanoseconds vnow_{0};
    detail::timer_wheel wheel_;
    detail::ring<detail::job> local_;
    std::atomic<std::size_t> outstanding_{0};
    std::exception_ptr failed_;

    std::mutex mutex_;
    std::condition_variable wake_;
    std::vector<detail::job> remote_;
    std::atomic<bool> remote_pending_{false};
    detail::intrusive_list<drive_node> spawned_;
};

/// Runs `a` to completion on the calling thread, on a fresh real-time `event_loop`, and returns
/// its result (or rethrows its exception). Timers and the default clock work inside it.
template <awaitable A>
await_result_t<A> sync_wait(A&& a) {
    event_loop loop;
    return loop.run(std::forward<A>(a));
}

namespace detail {
/// The library's way to post jobs and arm timers on a loop: not part of the public interface.
struct loop_access {
    static void post(event_loop& loop, job j) { loop.post(j); }
    static void add_timer(event_loop& loop, timer_node* t) { loop.add_timer(t); }
    static void remove_timer(event_loop& loop, timer_node* t) noexcept { loop.remove_timer(t); }
    /// The loop as the home of the calls made on it (detail/home_loop.hpp).
    static home_loop* home(event_loop* loop) noexcept { return loop; }
};
} // namespace detail

} // namespace resilience

#if RESILIENCE_INCLUDE_DEFINITIONS
#include "impl/event_loop.ipp"
#endif
