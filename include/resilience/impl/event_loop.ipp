// SPDX-License-Identifier: MIT
// The definitions of <resilience/event_loop.hpp> that do not depend on a user's type: included by the
// header (header-only), or compiled once into resilience::compiled (detail/config.hpp).
#pragma once

#include "../event_loop.hpp"

namespace resilience::inline v0_2 {

class event_loop::current_scope {
public:
    explicit current_scope(event_loop& loop) noexcept
        : previous_(std::exchange(current_, static_cast<home_loop*>(&loop))) {}
    ~current_scope() { current_ = previous_; }
    current_scope(const current_scope&) = delete;
    current_scope& operator=(const current_scope&) = delete;

private:
    home_loop* previous_;
};

RESILIENCE_DECL void event_loop::spawn_ended(home_loop* home, drive_node* n,
                                             std::exception_ptr failure) noexcept {
    auto* const l = static_cast<event_loop*>(home);
    if (failure)
        l->record_failure(std::move(failure));
    l->unlink(n);
    n->handle.destroy();
    delete static_cast<detached_node*>(n);
    l->finished();
}

RESILIENCE_DECL void event_loop::post(detail::job j) {
    if (current_ == this) {
        local_.push(j);
        return;
    }
    // Notified under the lock: once the lock is released the loop may run the job, finish, and be
    // destroyed, so nothing of the loop may be touched after that.
    std::lock_guard lock(mutex_);
    remote_.push_back(j);
    remote_pending_.store(true, std::memory_order_release);
    wake_.notify_one();
}

RESILIENCE_DECL event_loop::~event_loop() {
    drive_node* n = nullptr;
    {
        std::lock_guard lock(mutex_);
        n = spawned_.take_all();
    }
    while (n) {
        drive_node* next = n->next;
        n->next = n->prev = nullptr;
        n->word |= drive_node::orphaned_bit;
        // A task's node is a block of its own; any other is the promise of the frame destroyed here.
        const bool detached = n->detached();
        n->handle.destroy();
        if (detached)
            delete static_cast<detached_node*>(n);
        n = next;
    }
}

RESILIENCE_DECL void event_loop::run() {
    const current_scope running_here{*this};
    loop();
    rethrow_failure();
}

RESILIENCE_DECL void event_loop::run_until(std::chrono::nanoseconds t) {
    if (!virtual_)
        throw std::logic_error("resilience::event_loop: run_until needs a virtual-time loop");
    const current_scope running_here{*this};
    for (;;) {
        take_remote();
        while (!local_.empty()) {
            local_.pop()();
            take_remote();
        }
        // wake_at() is the earliest deadline or a lower bound of it: past `t`, nothing is due.
        if (wheel_.empty() || wheel_.wake_at() > t)
            break;
        detail::timer_node* first = wheel_.pop_due(t);
        if (!first)
            break;
        if (first->when > vnow_)
            vnow_ = first->when;
        first->fire(first);
        fire_due(vnow_); // the others of the same instant
    }
    if (t > vnow_)
        vnow_ = t;
    rethrow_failure();
}

RESILIENCE_DECL void event_loop::rethrow_failure() {
    std::exception_ptr e;
    {
        std::lock_guard lock(mutex_); // set by a spawned call, which may have ended on another thread
        e = std::exchange(failed_, nullptr);
    }
    if (e)
        std::rethrow_exception(e);
}

RESILIENCE_DECL void event_loop::take_remote() {
    if (!remote_pending_.load(std::memory_order_acquire))
        return;
    std::lock_guard lock(mutex_);
    for (const auto& j : remote_)
        local_.push(j);
    remote_.clear();
    remote_pending_.store(false, std::memory_order_relaxed);
}

RESILIENCE_DECL bool event_loop::fire_due(std::chrono::nanoseconds now) {
    bool fired = false;
    while (detail::timer_node* t = wheel_.pop_due(now)) {
        fired = true;
        t->fire(t);
    }
    return fired;
}

RESILIENCE_DECL void event_loop::loop() {
    for (;;) {
        take_remote();
        while (!local_.empty()) {
            local_.pop()();
            take_remote();
        }
        if (!wheel_.empty()) {
            if (virtual_) {
                // Nothing else can happen before the next deadline: time jumps there.
                const auto next = wheel_.advance_to_next();
                if (next > vnow_)
                    vnow_ = next;
                fire_due(vnow_);
                continue;
            }
            if (fire_due(this->now()))
                continue;
        }
        if (outstanding_.load(std::memory_order_acquire) == 0)
            return;
        if (virtual_ && wheel_.empty()) {
            std::unique_lock lock(mutex_);
            if (remote_.empty())
                throw std::logic_error("resilience::event_loop: virtual-time loop is stuck: " +
                                       std::to_string(outstanding_.load()) +
                                       " coroutine(s) wait for something no timer or posted work will bring");
            continue;
        }
        std::unique_lock lock(mutex_);
        // Woken by posted work, or by the last spawned coroutine finishing on another thread.
        const auto ready = [&] {
            return !remote_.empty() || outstanding_.load(std::memory_order_acquire) == 0;
        };
        if (ready())
            continue;
        if (wheel_.empty())
            wake_.wait(lock, ready);
        else
            wake_.wait_until(
                lock,
                std::chrono::steady_clock::time_point(
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(wheel_.wake_at())),
                ready);
    }
}

} // namespace resilience
