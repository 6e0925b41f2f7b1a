// SPDX-License-Identifier: MIT
/// \file detail/home_loop.hpp
/// `home_loop`: what a call needs of the event loop it was made on to return there (which loop
/// runs on this thread, and how to resume a coroutine on it), so that the driver of a call does
/// not include the loop itself.
#pragma once

#include <coroutine>

namespace resilience::detail {

/// The part of an event loop that a call sees. `event_loop` (event_loop.hpp) is made of one and
/// sets `current()` while it runs; nothing else is.
class home_loop {
public:
    home_loop(const home_loop&) = delete;
    home_loop& operator=(const home_loop&) = delete;

    /// The loop running on this thread, or null.
    static home_loop* current() noexcept { return current_; }
    /// Resumes `h` on this loop's thread, after the work already queued (`event_loop::post`).
    /// Thread-safe; may throw `std::bad_alloc`.
    void post_resume(std::coroutine_handle<> h) { post_(this, h); }

protected:
    using post_function = void (*)(home_loop*, std::coroutine_handle<>);
    explicit home_loop(post_function post) noexcept : post_(post) {}
    ~home_loop() = default;

    static inline thread_local home_loop* current_ = nullptr;

private:
    post_function post_;
};

/// Resumes the awaiting coroutine on `loop` (posted) when it is not the loop of this thread: a
/// call returns to the loop it was made on, whatever thread its action or its wait ended on. A
/// null `loop` (a call made outside any loop) goes on where it is.
struct resume_on_loop {
    home_loop* loop;
    bool await_ready() const noexcept { return loop == nullptr || home_loop::current() == loop; }
    void await_suspend(std::coroutine_handle<> h) const { loop->post_resume(h); }
    void await_resume() const noexcept {}
};

} // namespace resilience::detail
