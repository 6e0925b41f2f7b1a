// SPDX-License-Identifier: MIT
/// \file detail/home_loop.hpp
/// `home_loop`: where a call runs, resumes and sleeps (which home runs on this thread, how to resume
/// a coroutine there, how to arm a timer there), so that the driver of a call and the policies do
/// not include the loop itself. Two kinds: an `event_loop`, and the home an Asio call makes on a
/// strand of its executor (asio_flavour/home.hpp).
#pragma once

#include "timer_wheel.hpp"

#include <coroutine>
#include <cstdint>
#include <exception>
#include <utility>

namespace resilience::inline v0_2::detail {

/// Work handed to a home: a function and its argument, no allocation.
struct job {
    void (*fn)(void*) = nullptr;
    void* arg = nullptr;
    void operator()() const { fn(arg); }
    static job resume(std::coroutine_handle<> h) noexcept {
        return {[](void* a) { std::coroutine_handle<>::from_address(a).resume(); }, h.address()};
    }
};

class home_loop;

/// A coroutine started on a home with nothing awaiting it (`event_loop::spawn`): on the home's list
/// of them until it ends, so that the home can destroy it if it never does. For a task started that
/// way (`detached`), the node is a block of its own that the task's end reaches through its
/// continuation (task.hpp); otherwise it is the promise of the coroutine that runs what was started.
/// Four words: every spawned call has one.
struct spawn_node {
    static constexpr std::uintptr_t orphaned_bit = 1; // the home let it go (its destructor)
    static constexpr std::uintptr_t detached_bit = 2; // a task's node, a block of its own
    std::uintptr_t word = 0;                          // the home's address and the bits above
    spawn_node* prev = nullptr;
    spawn_node* next = nullptr;
    std::coroutine_handle<> handle{}; // the coroutine it runs

    home_loop* home() const noexcept {
        return reinterpret_cast<home_loop*>(word & ~(orphaned_bit | detached_bit));
    }
    bool orphaned() const noexcept { return (word & orphaned_bit) != 0; }
    bool detached() const noexcept { return (word & detached_bit) != 0; }
};

/// The part of a home that a call sees. `event_loop` (event_loop.hpp) is made of one and sets
/// `current()` while it runs; so does an Asio call's home while the call's own code runs (every
/// resumption of the call goes through it). A home that is not an event loop (`is_event_loop()`
/// false) arms its timers through `add_timer`, which the default clock's sleeps use.
class home_loop {
public:
    home_loop(const home_loop&) = delete;
    home_loop& operator=(const home_loop&) = delete;

    /// The home running on this thread, or null.
    static home_loop* current() noexcept { return current_; }

    /// Runs `j` on this home, after the work already queued. Thread-safe; may throw `std::bad_alloc`.
    void post(job j) { ops_->post(this, j); }
    /// Resumes `h` on this home, after the work already queued (`event_loop::post`).
    void post_resume(std::coroutine_handle<> h) { post(job::resume(h)); }

    bool is_event_loop() const noexcept { return ops_->add_timer == nullptr; }

    /// A home that is not an event loop: arms `t`, which fires (`t->fire(t)`) on this home at
    /// `t->when` (time since `std::chrono::steady_clock`'s epoch) unless removed first. Called on
    /// this home only; `remove_timer` too, or once nothing else can touch the timer (teardown).
    void add_timer(timer_node* t) { ops_->add_timer(this, t); }
    void remove_timer(timer_node* t) noexcept { ops_->remove_timer(this, t); }

    /// A detached task on this home ended (from its final suspension, on any thread), with `failure`
    /// if it ended with an exception: the home destroys it and its node.
    void spawn_ended(spawn_node* n, std::exception_ptr failure) noexcept {
        ops_->spawn_ended(this, n, std::move(failure));
    }

    /// Makes `h` the current home of this thread until destroyed: what a home's own handlers do
    /// around resuming a call.
    class scope {
    public:
        explicit scope(home_loop* h) noexcept : previous_(std::exchange(current_, h)) {}
        scope(const scope&) = delete;
        scope& operator=(const scope&) = delete;
        ~scope() { current_ = previous_; }

    private:
        home_loop* previous_;
    };

protected:
    struct operations {
        void (*post)(home_loop*, job);
        void (*add_timer)(home_loop*, timer_node*); ///< null: an event loop
        void (*remove_timer)(home_loop*, timer_node*) noexcept;
        void (*spawn_ended)(home_loop*, spawn_node*, std::exception_ptr) noexcept; ///< null: spawns nothing
    };
    explicit home_loop(const operations* ops) noexcept : ops_(ops) {}
    ~home_loop() = default;

    static inline thread_local home_loop* current_ = nullptr;

private:
    const operations* ops_;
};

/// Resumes `h`, a coroutine of a call made outside any home, on this thread. Under an event loop it
/// goes on on that loop, as such a call always has. Under the home of an Asio call it runs with no
/// home: that home ends with its call, so nothing this coroutine queues for later may name it.
inline void resume_homeless(std::coroutine_handle<> h) {
    home_loop* const here = home_loop::current();
    if (here && !here->is_event_loop()) {
        home_loop::scope none(nullptr);
        h.resume();
    } else {
        h.resume();
    }
}

/// Work that resumes `h`, a coroutine of a call made outside any home, with no home: what a home
/// that is not an event loop runs for it (the job must not read that home, whose call may be gone).
inline job resume_without_home(std::coroutine_handle<> h) noexcept {
    return {[](void* a) {
                home_loop::scope none(nullptr);
                std::coroutine_handle<>::from_address(a).resume();
            },
            h.address()};
}

/// Resumes the awaiting coroutine on `loop` (posted) when it is not the home of this thread: a
/// call returns to the home it was made on, whatever thread its action or its wait ended on. A
/// null `loop` (a call made outside any home) goes on where it is.
struct resume_on_loop {
    home_loop* loop;
    bool await_ready() const noexcept { return loop == nullptr || home_loop::current() == loop; }
    void await_suspend(std::coroutine_handle<> h) const { loop->post_resume(h); }
    void await_resume() const noexcept {}
};

} // namespace resilience::detail
