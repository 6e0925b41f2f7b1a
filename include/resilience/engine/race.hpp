// SPDX-License-Identifier: MIT
/// \file engine/race.hpp
/// Children a parent coroutine starts and collects one by one as they finish, on any thread: the
/// joining a hedge needs, where `when_all` waits for all at once.
///
/// The parent starts each child (`race_child`) inline and later waits on a `race_inbox`. A child
/// that finishes delivers itself to the inbox; so does a timer that fires. The inbox is a
/// lock-free stack of those deliveries plus one "the parent waits" mark in the same word, so a
/// delivery and the parent going to sleep cannot miss each other, and exactly one delivery wakes
/// a sleeping parent. The parent always carries on on its own event loop: a child finishing on
/// another thread posts the wake-up there (as a timeout's disarm does) instead of running the
/// parent on its thread. Deliveries allocate nothing; children's frames come from the recycling
/// frame allocator.
#pragma once

#include "../context.hpp"
#include "../detail/frame_allocator.hpp"
#include "../event_loop.hpp"
#include "../outcome.hpp"

#include <atomic>
#include <coroutine>
#include <cstdint>
#include <optional>
#include <utility>

namespace resilience::inline v0_2::detail {

/// What a parent is told about: a child's end or a timer's expiry. Lives in whoever delivers it.
struct race_node {
    enum class kind : unsigned char { attempt, sleeper, timer };
    race_node* next_event = nullptr; // the inbox's link; owned by the inbox while delivered
    kind what = kind::attempt;
};

/// One parent's inbox (see the file comment). Lives in the parent's frame. Deliveries come from any
/// thread; `take` and `wait` only from the parent.
class race_inbox {
public:
    /// `home`: the loop the parent runs on, or null when it runs on none (then it is resumed on
    /// whichever thread delivers).
    explicit race_inbox(home_loop* home) noexcept : home_(home) {}
    race_inbox(const race_inbox&) = delete;
    race_inbox& operator=(const race_inbox&) = delete;

    /// Hands `n` to the parent. Returns the parent to resume now, on this thread, when the parent
    /// was waiting and this is its loop; otherwise null (the parent runs later, or is running). After
    /// this returns neither `n` nor the inbox may be touched: the parent may already have gone on.
    [[nodiscard]] std::coroutine_handle<> deliver(race_node* n) noexcept {
        home_loop* const home = home_; // read now: the inbox may be gone once `n` is in
        std::uintptr_t cur = word_.load(std::memory_order_relaxed);
        do {
            n->next_event = cur == waiting ? nullptr : reinterpret_cast<race_node*>(cur);
        } while (!word_.compare_exchange_weak(cur, reinterpret_cast<std::uintptr_t>(n),
                                              std::memory_order_acq_rel, std::memory_order_relaxed));
        if (cur != waiting)
            return {};
        // The parent was asleep and this delivery took its mark: waking it is ours alone, and it
        // stays asleep (its frame in place) until we do.
        const std::coroutine_handle<> parent = waiter_;
        if (home == nullptr || home_loop::current() == home)
            return parent;
        home->post_resume(parent);
        return {};
    }

    /// True when something was delivered and not yet taken.
    [[nodiscard]] bool pending() const noexcept { return word_.load(std::memory_order_acquire) != 0; }

    /// Everything delivered so far, in the order it came (the parent only).
    [[nodiscard]] race_node* take() noexcept {
        // Never `waiting` here: the parent is running, so the mark was taken by the delivery that woke it.
        auto* n = reinterpret_cast<race_node*>(word_.exchange(0, std::memory_order_acquire));
        race_node* in_order = nullptr;
        while (n) {
            race_node* next = n->next_event;
            n->next_event = in_order;
            in_order = n;
            n = next;
        }
        return in_order;
    }

    /// Awaitable: completes once something is delivered (at once if something already is).
    auto wait() noexcept {
        struct awaiter {
            race_inbox* self;
            bool await_ready() const noexcept { return self->pending(); }
            bool await_suspend(std::coroutine_handle<> h) noexcept {
                self->waiter_ = h; // published by the exchange below
                std::uintptr_t expected = 0;
                return self->word_.compare_exchange_strong(expected, waiting, std::memory_order_acq_rel,
                                                           std::memory_order_acquire);
            }
            void await_resume() const noexcept {}
        };
        return awaiter{this};
    }

private:
    static constexpr std::uintptr_t waiting = 1; // no node is at an odd address

    std::atomic<std::uintptr_t> word_{0}; // 0, `waiting`, or the last node delivered
    std::coroutine_handle<> waiter_;
    home_loop* home_;
};

/// A child of a race: an attempt (its outcome in `result`) or a sleeper standing in for a timer on a
/// clock without loop timers (`fired`). Starts suspended; the parent fills in the promise, links it
/// into its own list and resumes it. At its end it delivers itself to `inbox` and stays suspended
/// until the parent destroys it.
template <class O>
class race_child {
public:
    struct promise_type : recycled_frame, race_node {
        race_inbox* inbox = nullptr;
        const context* parent = nullptr; // the call's context, which every child's outlives
        std::optional<lazy_stop> stop;   // the child's own stop token, linked to the parent's
        std::optional<O> result;         // an attempt's outcome; a sleeper's failure, if its sleep threw
        int number = 0;                  // the attempt's number (1-based); 0 for a sleeper
        unsigned generation = 0;         // a sleeper: which arming of the timer it stands for
        bool fired = false;              // a sleeper: slept until its time, not stopped
        promise_type* prev = nullptr; // its links in the parent's list of children (detail::intrusive_list)
        promise_type* next = nullptr;

        race_child get_return_object() noexcept {
            return race_child{std::coroutine_handle<promise_type>::from_promise(*this)};
        }
        std::suspend_always initial_suspend() const noexcept { return {}; }
        struct final_awaiter {
            bool await_ready() const noexcept { return false; }
            std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) const noexcept {
                race_inbox* box = h.promise().inbox;
                if (std::coroutine_handle<> to_resume = box->deliver(&h.promise()))
                    return to_resume;
                return std::noop_coroutine();
            }
            void await_resume() const noexcept {}
        };
        final_awaiter final_suspend() const noexcept { return {}; }
        void return_void() noexcept {}
        void unhandled_exception() noexcept { result.emplace(failure::current()); }
    };

    /// Awaitable inside a child's own body: its promise, without suspending.
    struct own_promise {
        promise_type* p = nullptr;
        bool await_ready() const noexcept { return false; }
        bool await_suspend(std::coroutine_handle<promise_type> h) noexcept {
            p = &h.promise();
            return false;
        }
        promise_type& await_resume() const noexcept { return *p; }
    };

    explicit race_child(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
    race_child(race_child&& o) noexcept : handle_(std::exchange(o.handle_, {})) {}
    race_child& operator=(race_child&&) = delete;
    ~race_child() {
        if (handle_)
            handle_.destroy();
    }
    /// The parent takes the frame over (into its list).
    promise_type& release() noexcept { return std::exchange(handle_, {}).promise(); }

private:
    std::coroutine_handle<promise_type> handle_;
};

} // namespace resilience::detail
