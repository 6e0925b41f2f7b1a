// SPDX-License-Identifier: MIT
/// \file async_generator.hpp
/// `async_generator<T>`: a coroutine that yields values one at a time and may `co_await` in between.
#pragma once

#include "detail/frame_allocator.hpp"
#include "detail/inline_start.hpp"

#include <concepts>
#include <coroutine>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2 {

template <class T>
class async_generator;

namespace detail {

/// A value of another type than `T` that `T` can be made from.
template <class U, class T>
concept converted_item = !std::same_as<std::remove_cvref_t<U>, T> && std::constructible_from<T, U&&>;

template <class T>
class async_generator_promise : public recycled_frame {
public:
    async_generator<T> get_return_object() noexcept;

    std::suspend_always initial_suspend() const noexcept { return {}; }

    // Every suspension of the body hands control back to the consumer waiting in `next()`.
    struct to_consumer {
        bool await_ready() const noexcept { return false; }
        std::coroutine_handle<> await_suspend(std::coroutine_handle<async_generator_promise> self) noexcept {
            return resume_awaiter(self, self.promise().consumer_);
        }
        void await_resume() const noexcept {}
    };
    to_consumer final_suspend() const noexcept { return {}; }

    // The yielded object lives in the body's frame until the body resumes, which is after the
    // consumer took it: the promise keeps only its address, so an item costs a move, not a copy
    // into a slot and another out of it.
    to_consumer yield_value(T&& value) noexcept {
        movable_ = std::addressof(value);
        return {};
    }
    to_consumer yield_value(const T& value) noexcept
    requires std::copy_constructible<T>
    {
        copyable_ = std::addressof(value);
        return {};
    }
    /// `co_yield "text"` into an `async_generator<std::string>`: the `T` is made in the frame.
    template <converted_item<T> U>
    auto yield_value(U&& value) noexcept(std::is_nothrow_constructible_v<T, U&&>) {
        struct converted {
            T value;
            bool await_ready() const noexcept { return false; }
            std::coroutine_handle<>
            await_suspend(std::coroutine_handle<async_generator_promise> self) noexcept {
                self.promise().movable_ = std::addressof(value);
                return resume_awaiter(self, self.promise().consumer_);
            }
            void await_resume() const noexcept {}
        };
        return converted{T(std::forward<U>(value))};
    }

    void return_void() const noexcept {}
    void unhandled_exception() noexcept { error_ = std::current_exception(); }

    // ---- for the consumer's awaiter ----
    void resumed_by(std::coroutine_handle<> consumer) noexcept {
        consumer_ = consumer;
        movable_ = nullptr;
        copyable_ = nullptr;
    }
    std::optional<T> take() {
        if (movable_)
            return std::optional<T>(std::in_place, std::move(*movable_));
        if constexpr (std::copy_constructible<T>)
            if (copyable_)
                return std::optional<T>(std::in_place, *copyable_);
        return std::nullopt;
    }
    /// The body's exception, once: later calls see a finished generator.
    std::exception_ptr take_error() noexcept { return std::exchange(error_, nullptr); }

private:
    std::coroutine_handle<> consumer_ = std::noop_coroutine();
    T* movable_ = nullptr;
    const T* copyable_ = nullptr;
    std::exception_ptr error_;
};

} // namespace detail

/// A lazy coroutine that produces a sequence of `T`: its body `co_yield`s values and may
/// `co_await` anything between them. The consumer pulls one value at a time:
///
///     rs::async_generator<int> numbers(rs::testing::simulation& sim) {
///         for (int i = 0; i < 3; ++i) {
///             co_await sim.sleep_for(10ms);
///             co_yield i;
///         }
///     }
///     auto gen = numbers(sim);                       // nothing runs yet
///     while (std::optional<int> v = co_await gen.next())
///         use(*v);                                   // 0, 1, 2; then an empty optional
///
/// - Lazy: the body starts at the first `next()` and runs only while a `next()` is pending, up to
///   its next `co_yield` or its end. `next()` after the end keeps returning an empty optional.
/// - An exception escaping the body is rethrown by the `next()` that was pending; the generator is
///   then finished.
/// - Move-only; the generator object owns the frame. Destroying it destroys the body where it
///   stands (at a `co_yield`, or never started), and with it every local of the body, so a
///   consumer that stops half-way releases what the body held (a connection, an inner generator).
/// - Consumer and body pass control by symmetric transfer: neither stack grows however many items
///   flow, and a generator consuming another (see `retry_stream`) is as cheap. An item costs one
///   move (a copy when an lvalue is yielded) and no allocation; the frame comes from the
///   library's recycling allocator.
///
/// Lifetimes are those of any coroutine: parameters are copied into the frame, but a reference
/// parameter, or the captures of a coroutine lambda, must outlive the generator:
///
///     auto ok = [](std::string key) -> rs::async_generator<row> { ... }(key);  // OK: key copied
///     auto bad = [key]() -> rs::async_generator<row> { ... }();  // dangling: the lambda (and key)
///                                                                // dies at the end of the line
///
/// One consumer at a time: `next()` must not be called again before the previous one completed.
template <class T>
class [[nodiscard]] async_generator {
    static_assert(!std::is_reference_v<T>,
                  "async_generator<T&> is not supported: yield a pointer or a reference_wrapper");
    static_assert(std::move_constructible<T>, "async_generator<T>: T must be move-constructible");

public:
    using promise_type = detail::async_generator_promise<T>;
    using value_type = T;

    async_generator() noexcept = default;
    explicit async_generator(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
    async_generator(async_generator&& other) noexcept : handle_(std::exchange(other.handle_, {})) {}
    async_generator& operator=(async_generator&& other) noexcept {
        if (this != &other) {
            destroy();
            handle_ = std::exchange(other.handle_, {});
        }
        return *this;
    }
    ~async_generator() { destroy(); }

    /// False for a default-constructed or moved-from generator.
    bool valid() const noexcept { return static_cast<bool>(handle_); }

    /// Awaitable: runs the body to its next `co_yield` and gives that value, or an empty optional
    /// once the body has ended; rethrows what escaped the body. The generator must outlive the
    /// `co_await`. On an empty generator (`!valid()`) it throws `std::logic_error`.
    auto next() noexcept {
        struct awaiter {
            std::coroutine_handle<promise_type> handle;
            bool await_ready() const noexcept { return !handle || handle.done(); }
            detail::start_result await_suspend(std::coroutine_handle<> consumer) noexcept {
                handle.promise().resumed_by(consumer);
                return detail::start_inline(handle);
            }
            std::optional<T> await_resume() {
                if (!handle)
                    throw std::logic_error("resilience::async_generator: next() on an empty generator");
                if (handle.done()) {
                    if (std::exception_ptr e = handle.promise().take_error())
                        std::rethrow_exception(std::move(e));
                    return std::nullopt;
                }
                return handle.promise().take();
            }
        };
        return awaiter{handle_};
    }

private:
    void destroy() noexcept {
        if (handle_)
            std::exchange(handle_, {}).destroy();
    }
    std::coroutine_handle<promise_type> handle_;
};

namespace detail {
template <class T>
async_generator<T> async_generator_promise<T>::get_return_object() noexcept {
    return async_generator<T>{std::coroutine_handle<async_generator_promise>::from_promise(*this)};
}
} // namespace detail

} // namespace resilience
