// SPDX-License-Identifier: MIT
/// \file when_all.hpp
/// `when_all`: run several awaitables concurrently and wait for every one of them.
#pragma once

#include "concepts.hpp"
#include "task.hpp"

#include <array>
#include <atomic>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace resilience::inline v0_2 {

namespace detail {

// Counts finished children; the last one to finish resumes the parent. The parent holds one count
// itself while it starts the children, so a child finishing early cannot resume it too soon.
struct join_counter {
    explicit join_counter(std::size_t children) noexcept : count(children + 1) {}
    std::atomic<std::size_t> count;
    std::coroutine_handle<> parent;
    std::exception_ptr first_error;
    std::atomic<bool> has_error{false};

    void fail(std::exception_ptr e) noexcept {
        if (!has_error.exchange(true, std::memory_order_acq_rel))
            first_error = std::move(e);
    }
};

struct join_task {
    struct promise_type : recycled_frame {
        join_counter* counter = nullptr;
        join_task get_return_object() noexcept {
            return {std::coroutine_handle<promise_type>::from_promise(*this)};
        }
        std::suspend_always initial_suspend() const noexcept { return {}; }
        struct final_awaiter {
            bool await_ready() const noexcept { return false; }
            std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
                join_counter* c = h.promise().counter;
                if (c->count.fetch_sub(1, std::memory_order_acq_rel) == 1)
                    return c->parent;
                return std::noop_coroutine();
            }
            void await_resume() const noexcept {}
        };
        final_awaiter final_suspend() const noexcept { return {}; }
        void return_void() noexcept {}
        void unhandled_exception() noexcept { counter->fail(std::current_exception()); }
    };
    std::coroutine_handle<promise_type> handle;
    join_task() noexcept = default;
    join_task(std::coroutine_handle<promise_type> h) noexcept : handle(h) {}
    join_task(join_task&& o) noexcept : handle(std::exchange(o.handle, {})) {}
    join_task& operator=(join_task&& o) noexcept {
        std::swap(handle, o.handle);
        return *this;
    }
    ~join_task() {
        if (handle)
            handle.destroy();
    }
};

template <class T>
using when_all_value_t = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

template <class A, class Slot>
join_task when_all_child(A a, Slot& slot) {
    if constexpr (std::is_void_v<await_result_t<A>>) {
        co_await std::move(a);
        slot.emplace();
    } else {
        slot.emplace(co_await std::move(a));
    }
}

// Starts every child, then suspends until the last one finishes.
struct join_awaiter {
    join_counter& counter;
    join_task* children;
    std::size_t size;
    bool await_ready() const noexcept { return size == 0; }
    bool await_suspend(std::coroutine_handle<> parent) noexcept {
        counter.parent = parent;
        for (std::size_t i = 0; i < size; ++i) {
            children[i].handle.promise().counter = &counter;
            children[i].handle.resume();
        }
        return counter.count.fetch_sub(1, std::memory_order_acq_rel) != 1;
    }
    void await_resume() const noexcept {}
};

} // namespace detail

/// Runs every awaitable concurrently on the current thread (each runs until its first suspension
/// before the next starts) and completes when all have finished: structured, so none outlives
/// the call. The result is a tuple of their values (`std::monostate` for `void`). If any threw,
/// the first exception is rethrown, but only after every child has finished.
template <awaitable... As>
task<std::tuple<detail::when_all_value_t<await_result_t<As>>...>> when_all(As... as) {
    std::tuple<std::optional<detail::when_all_value_t<await_result_t<As>>>...> slots;
    detail::join_counter counter{sizeof...(As)};
    std::array<detail::join_task, sizeof...(As)> children;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        ((children[I] = detail::when_all_child(std::move(as), std::get<I>(slots))), ...);
    }(std::index_sequence_for<As...>{});
    co_await detail::join_awaiter{counter, children.data(), children.size()};
    if (counter.first_error)
        std::rethrow_exception(counter.first_error);
    co_return std::apply(
        [](auto&... s) {
            return std::tuple<detail::when_all_value_t<await_result_t<As>>...>{std::move(*s)...};
        },
        slots);
}

/// The same over a vector of tasks of one type; the results keep the order of the input.
template <class T>
task<std::vector<detail::when_all_value_t<T>>> when_all(std::vector<task<T>> tasks) {
    std::vector<std::optional<detail::when_all_value_t<T>>> slots(tasks.size());
    detail::join_counter counter{tasks.size()};
    std::vector<detail::join_task> children;
    children.reserve(tasks.size());
    for (std::size_t i = 0; i < tasks.size(); ++i)
        children.push_back(detail::when_all_child(std::move(tasks[i]), slots[i]));
    co_await detail::join_awaiter{counter, children.data(), children.size()};
    if (counter.first_error)
        std::rethrow_exception(counter.first_error);
    std::vector<detail::when_all_value_t<T>> out;
    out.reserve(slots.size());
    for (auto& s : slots)
        out.push_back(std::move(*s));
    co_return out;
}

} // namespace resilience
