// SPDX-License-Identifier: MIT
/// \file concepts.hpp
/// What the library asks of the things it is given: awaitables, clocks, random sources, policies.
#pragma once

#include "stop_token.hpp"

#include <chrono>
#include <concepts>
#include <coroutine>
#include <random>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2 {

namespace detail {
// await_suspend may return void, bool or a handle to transfer to: the three forms the language accepts.
template <class T>
concept suspend_result =
    std::same_as<T, void> || std::same_as<T, bool> || std::convertible_to<T, std::coroutine_handle<>>;

template <class A>
concept awaiter = requires(A& a, std::coroutine_handle<> h) {
    { a.await_ready() } -> std::convertible_to<bool>;
    { a.await_suspend(h) } -> suspend_result;
    a.await_resume();
};

template <class T>
concept has_member_co_await = requires(T&& t) {
    { static_cast<T&&>(t).operator co_await() } -> awaiter;
};
template <class T>
concept has_free_co_await = requires(T&& t) {
    { operator co_await(static_cast<T&&>(t)) } -> awaiter;
};

/// The awaiter a `co_await` of `t` would use (ignoring await_transform, which we never rely on).
/// Constructs an optional's value from a function's prvalue (`opt.emplace(emplace_from{make})`), so
/// the value need not be movable: awaitables and awaiters are often neither copyable nor movable.
template <class F>
struct emplace_from {
    F make;
    operator std::invoke_result_t<F&>() { return make(); }
};
template <class F>
emplace_from(F) -> emplace_from<F>; // clang 14 has no deduction for aggregates

template <class T>
decltype(auto) get_awaiter(T&& t) {
    if constexpr (has_member_co_await<T>)
        return static_cast<T&&>(t).operator co_await();
    else if constexpr (has_free_co_await<T>)
        return operator co_await(static_cast<T&&>(t));
    else
        return static_cast<T&&>(t);
}
} // namespace detail

/// Something `co_await` accepts in any coroutine: an awaiter, or a type with `operator co_await`.
/// Required because policies await whatever an action returns, inside their own coroutines.
template <class T>
concept awaitable = detail::has_member_co_await<T> || detail::has_free_co_await<T> || detail::awaiter<T>;

/// The type `co_await std::declval<T>()` produces.
template <awaitable T>
using await_result_t = decltype(detail::get_awaiter(std::declval<T>()).await_resume());

/// An awaitable whose result converts to `R`: what an action must return for a policy typed on `R`.
template <class T, class R>
concept awaitable_of = awaitable<T> && std::convertible_to<await_result_t<T>, R>;

/// A time source that can also wait. One object serves every use of time in a policy.
/// - `now()`: monotonic; policies compare and subtract its time points.
/// - `sleep_until(tp, token)`: an awaitable that completes at `tp`, or earlier once `token` is
///   stopped (it never throws for that; the caller checks the token). Waiters are resumed on the
///   event loop they suspended on, so a policy shared between threads never runs a caller's code
///   on another caller's thread. An awaitable whose `operator co_await` gives an awaiter that
///   refers to nothing of it may say so (`using standalone_awaiter = void;`): a policy waiting in
///   the call's frame (a retry's backoff) then keeps the awaiter alone.
template <class C>
concept clock = std::copy_constructible<C> && requires(C& c, typename C::time_point tp, stop_token st) {
    typename C::time_point;
    typename C::duration;
    { c.now() } -> std::same_as<typename C::time_point>;
    { c.sleep_until(tp, st) } -> awaitable;
};

/// A source of random bits, as the standard library defines it. Policies keep their own copy.
template <class R>
concept random_source = std::uniform_random_bit_generator<std::remove_cvref_t<R>>;

} // namespace resilience
