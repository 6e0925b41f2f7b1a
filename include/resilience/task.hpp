// SPDX-License-Identifier: MIT
/// \file task.hpp
/// `task<T>`: the lazy coroutine type every policy returns.
#pragma once

#include "detail/frame_allocator.hpp"
#include "detail/home_loop.hpp"
#include "detail/inline_start.hpp"
#include "detail/inlining.hpp"

#include <coroutine>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2 {

template <class T = void>
class task;

namespace detail {

struct task_access;

/// A task started with no coroutine awaiting it (`event_loop::spawn`) keeps its `spawn_node`
/// (detail/home_loop.hpp) where its continuation would be, tagged with `detached_tag`, so that a task
/// carries no member for it.
inline constexpr std::uintptr_t detached_tag = 1;

struct task_promise_base : recycled_frame {
    struct final_awaiter {
        bool await_ready() const noexcept { return false; }
        // Inlined into every task's end, the detached end kept out of line: g++ stopped inlining this
        // when it held the detached end's work, and a bare call took 11 more instructions
        // (bench/instructions.sh, bare_call).
        template <class Promise>
        RESILIENCE_DETAIL_ALWAYS_INLINE std::coroutine_handle<>
        await_suspend(std::coroutine_handle<Promise> self) noexcept {
            void* const next = self.promise().continuation_;
            if (reinterpret_cast<std::uintptr_t>(next) & detached_tag) [[unlikely]]
                return end_detached(next, self);
            return resume_awaiter(self, std::coroutine_handle<>::from_address(next));
        }
        void await_resume() const noexcept {}
    };

    std::suspend_always initial_suspend() const noexcept { return {}; }
    final_awaiter final_suspend() const noexcept { return {}; }

    /// The address of the coroutine to resume at the end, or a `spawn_node` tagged with
    /// `detached_tag` (a frame, and a node, is aligned to more than 1).
    void* continuation_ = std::noop_coroutine().address();

    /// What awaiting an empty task (default-constructed or moved from) throws; out of line, so that
    /// every await keeps only the check.
    [[noreturn]] RESILIENCE_DETAIL_NOINLINE static void awaited_empty() {
        throw std::logic_error("resilience::task: awaiting an empty task");
    }

private:
    // Out of line, with all it does (the exception taken out of the promise among it): the common
    // end keeps no stack frame for it.
    template <class Promise>
    RESILIENCE_DETAIL_NOINLINE static std::coroutine_handle<>
    end_detached(void* tagged, std::coroutine_handle<Promise> self) noexcept {
        auto* n = reinterpret_cast<spawn_node*>(reinterpret_cast<std::uintptr_t>(tagged) & ~detached_tag);
        n->home()->spawn_ended(n,
                               self.promise().failure()); // destroys the task: nothing of it is touched after
        return std::noop_coroutine();
    }
};

template <class T>
struct task_promise : task_promise_base {
    task_promise() noexcept {}
    task_promise(const task_promise&) = delete;
    task_promise& operator=(const task_promise&) = delete;
    ~task_promise() { clear(); }

    task<T> get_return_object() noexcept;
    template <class U = T>
    requires std::is_convertible_v<U&&, T>
    void return_value(U&& v) noexcept(std::is_nothrow_constructible_v<T, U&&>) {
        // A conversion that throws leaves no value: the coroutine then stores its exception.
        std::construct_at(std::addressof(value_), std::forward<U>(v));
        state_ = state::value;
    }
    void unhandled_exception() noexcept {
        // After `co_return`, a local's destructor may still throw: the exception replaces the value.
        clear();
        std::construct_at(std::addressof(error_), std::current_exception());
        state_ = state::error;
    }

    T take() {
        check();
        return std::move(value_);
    }
    /// What the coroutine ended with if it is not a value (as `check` would throw it), else null.
    std::exception_ptr failure() const noexcept {
        if (state_ == state::value) [[likely]]
            return nullptr;
        if (state_ == state::error)
            return error_;
        try {
            check(); // ended without a result
        } catch (...) {
            return std::current_exception();
        }
        return nullptr;
    }
    /// Rethrows what the coroutine ended with if it is not a value (as `take` would), and leaves a
    /// value where it is.
    void check() const {
        if (state_ != state::value) [[unlikely]] {
            if (state_ == state::error)
                std::rethrow_exception(error_);
            throw std::logic_error("resilience::task: the coroutine ended without a result");
        }
    }

private:
    // A union with its own tag rather than a std::variant: every task's result type would instantiate
    // a variant's machinery (its visitation tables, some fifty functions), in every file.
    enum class state : unsigned char { empty, value, error };
    union {
        T value_;
        std::exception_ptr error_;
    };
    state state_ = state::empty;

    void clear() noexcept {
        if (state_ == state::value)
            std::destroy_at(std::addressof(value_));
        else if (state_ == state::error)
            std::destroy_at(std::addressof(error_));
        state_ = state::empty;
    }
};

template <>
struct task_promise<void> : task_promise_base {
    task<void> get_return_object() noexcept;
    void return_void() noexcept {}
    void unhandled_exception() noexcept { error_ = std::current_exception(); }
    void take() {
        if (error_)
            std::rethrow_exception(error_);
    }
    void check() const {
        if (error_)
            std::rethrow_exception(error_);
    }
    std::exception_ptr failure() const noexcept { return error_; }
    std::exception_ptr error_;
};

} // namespace detail

/// A lazy coroutine producing a `T`. Nothing runs until the task is awaited; awaiting it runs it
/// to its end and hands back its value, or rethrows its exception. Move-only and awaitable once,
/// as an rvalue (`co_await std::move(t)` or `co_await make_task()`). The frame is owned by the
/// task object: destroying an un-awaited task destroys the coroutine without running it.
/// Completion resumes the awaiter by symmetric transfer, and a task that finishes during its start
/// lets its awaiter go on in its own frame (detail/inline_start.hpp), so long chains and loops do not
/// grow the stack in any build.
/// Frames come from a per-thread recycling allocator.
template <class T>
class [[nodiscard]] task {
    static_assert(!std::is_reference_v<T>,
                  "task<T&> is not supported: return a pointer or a reference_wrapper");

public:
    using promise_type = detail::task_promise<T>;
    using value_type = T;

    task() noexcept = default;
    explicit task(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
    task(task&& other) noexcept : handle_(std::exchange(other.handle_, {})) {}
    task& operator=(task&& other) noexcept {
        if (this != &other) {
            destroy();
            handle_ = std::exchange(other.handle_, {});
        }
        return *this;
    }
    ~task() { destroy(); }

    /// False for a default-constructed or moved-from task.
    bool valid() const noexcept { return static_cast<bool>(handle_); }

    auto operator co_await() && noexcept {
        struct awaiter {
            std::coroutine_handle<promise_type> handle;
            bool await_ready() const noexcept { return !handle || handle.done(); }
            detail::start_result await_suspend(std::coroutine_handle<> awaiting) noexcept {
                handle.promise().continuation_ = awaiting.address();
                return detail::start_inline(handle);
            }
            // Inlined wherever a task is awaited: a check and a move, whose call g++ would sometimes
            // keep (5 instructions a call through a policy, bench/README.md).
            RESILIENCE_DETAIL_ALWAYS_INLINE T await_resume() {
                if (!handle) [[unlikely]]
                    detail::task_promise_base::awaited_empty();
                return handle.promise().take();
            }
        };
        return awaiter{handle_};
    }

private:
    friend struct detail::task_access;
    void destroy() noexcept {
        if (handle_)
            handle_.destroy();
    }
    std::coroutine_handle<promise_type> handle_;
};

namespace detail {
template <class A>
inline constexpr bool is_task = false;
template <class T>
inline constexpr bool is_task<task<T>> = true;

/// The library's way to take a task's coroutine out of it (`event_loop::spawn`).
struct task_access {
    template <class T>
    static std::coroutine_handle<task_promise<T>> release(task<T>& t) noexcept {
        return std::exchange(t.handle_, {});
    }
    /// Whether `t` holds a coroutine that has not finished (a task awaited to its end keeps its handle).
    template <class T>
    static bool startable(const task<T>& t) noexcept {
        return t.handle_ && !t.handle_.done();
    }
};

/// Awaits `t` for its end only: as `co_await std::move(t)`, but its value is left in its frame (and
/// destroyed with the task) rather than moved into the awaiting frame; an exception is rethrown.
template <class T>
auto ended(task<T>&& t) noexcept {
    using awaiter = decltype(std::move(t).operator co_await());
    struct end_awaiter : awaiter {
        void await_resume() const {
            if (!this->handle) [[unlikely]]
                task_promise_base::awaited_empty();
            this->handle.promise().check();
        }
    };
    return end_awaiter{std::move(t).operator co_await()};
}

template <class T>
task<T> task_promise<T>::get_return_object() noexcept {
    return task<T>{std::coroutine_handle<task_promise<T>>::from_promise(*this)};
}
inline task<void> task_promise<void>::get_return_object() noexcept {
    return task<void>{std::coroutine_handle<task_promise<void>>::from_promise(*this)};
}
} // namespace detail

} // namespace resilience
