// SPDX-License-Identifier: MIT
/// \file clock.hpp
/// `steady_clock`: the default clock of every policy, sleeping on the caller's event loop.
#pragma once

#include "concepts.hpp"
#include "event_loop.hpp"

#include <atomic>
#include <chrono>
#include <coroutine>
#include <optional>
#include <stdexcept>
#include <stop_token>

namespace resilience {

namespace detail {

/// Suspends the awaiting coroutine until `when` on `loop`'s clock, or until `token` is stopped,
/// whichever comes first. Exactly one of the two resumes it, always on the loop's thread: a stop
/// requested on another thread posts the wake-up instead of running the waiter there.
class sleep_awaiter {
public:
    sleep_awaiter(event_loop* loop, std::chrono::nanoseconds when, std::stop_token token) noexcept
        : loop_(loop), token_(std::move(token)) {
        node_.when = when;
    }
    sleep_awaiter(const sleep_awaiter&) = delete;
    sleep_awaiter& operator=(const sleep_awaiter&) = delete;
    sleep_awaiter(sleep_awaiter&& o) noexcept : loop_(o.loop_), token_(std::move(o.token_)) { node_.when = o.node_.when; }

    bool await_ready() const noexcept { return token_.stop_requested() || (loop_ && node_.when <= loop_->now()); }

    void await_suspend(std::coroutine_handle<> h) {
        if (!loop_) throw std::logic_error("resilience: a sleep needs an event loop: run the coroutine under "
                                           "sync_wait, event_loop::run or testing::simulation");
        waiter_ = h;
        node_.owner = this;
        node_.fire = [](timer_node* n) {
            auto* self = static_cast<sleep_awaiter*>(n->owner);
            if (!self->claimed_.exchange(true, std::memory_order_acq_rel)) self->waiter_.resume();
        };
        loop_->add_timer(&node_);
        if (token_.stop_possible()) stop_.emplace(token_, on_stop{this});
    }
    void await_resume() noexcept { stop_.reset(); }

private:
    struct on_stop {
        sleep_awaiter* self;
        void operator()() const noexcept {
            if (!self->claimed_.exchange(true, std::memory_order_acq_rel))
                self->loop_->post(job{&sleep_awaiter::cancelled, self});
        }
    };
    static void cancelled(void* p) {
        auto* self = static_cast<sleep_awaiter*>(p);
        self->loop_->remove_timer(&self->node_);
        self->waiter_.resume();
    }

    timer_node node_;
    event_loop* loop_;
    std::stop_token token_;
    std::coroutine_handle<> waiter_;
    std::atomic<bool> claimed_{false};
    std::optional<std::stop_callback<on_stop>> stop_;
};

} // namespace detail

/// The default clock: `std::chrono::steady_clock` time, sleeping on the event loop that runs the
/// awaiting coroutine (`event_loop::current()`). Sleeping outside any loop, or inside a
/// virtual-time loop, is a usage error reported as `std::logic_error`. Stateless and copyable.
struct steady_clock {
    using duration = std::chrono::steady_clock::duration;
    using time_point = std::chrono::steady_clock::time_point;

    time_point now() const noexcept { return std::chrono::steady_clock::now(); }

    auto sleep_until(time_point tp, std::stop_token token) const {
        struct awaitable {
            std::chrono::nanoseconds when;
            std::stop_token token;
            detail::sleep_awaiter operator co_await() && {
                event_loop* loop = event_loop::current();
                if (loop && loop->is_virtual())
                    throw std::logic_error("resilience::steady_clock: sleeping on a virtual-time loop; "
                                           "give the policy the simulation's clock()");
                return detail::sleep_awaiter{loop, when, std::move(token)};
            }
        };
        return awaitable{tp.time_since_epoch(), std::move(token)};
    }
    auto sleep_for(duration d, std::stop_token token) const { return sleep_until(now() + d, std::move(token)); }
};

static_assert(clock<steady_clock>);

} // namespace resilience
