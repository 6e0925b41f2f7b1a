// SPDX-License-Identifier: MIT
/// \file policy.hpp
/// The `policy` concept and `policy_base`, which gives every policy its `execute` family from one
/// `run` member.
///
/// How a policy is built. A policy implements one member template:
///
///     template <class Next>
///     task<outcome<R>> run(Next next, const context& ctx);
///
/// `next(ctx)` runs the rest of the pipeline (the inner policies, then the user's action) once and
/// returns an awaitable of `outcome<R>`: failures travel as values between policies, so a
/// rejection reported through `execute_outcome` never throws. `next` is a small copyable handle;
/// `ctx` must stay alive until the returned task finishes (every caller in the library awaits it
/// at once). `policy_base<Derived>` turns that into the public calls:
///
///     co_await p.execute(action);                  // R, or rethrows the failure unchanged
///     co_await p.execute(action, stop_token);      // the caller's stop token reaches every attempt
///     co_await p.execute(action, ctx);             // from inside another attempt
///     co_await p.execute_outcome(action);          // outcome<R>, never throws for the action's failure
///
/// The action is taken by value and kept alive until the call ends; the policy object must
/// outlive the call, as an Asio I/O object must outlive its operations:
///
///     rs::task<int> ok(rs::retry<>& r) { co_return co_await r.execute(fetch); }   // OK: r outlives the call
///     rs::task<int> bad() { return rs::retry<>{}.execute(fetch); }               // dangling: the policy
///     dies first
#pragma once

#include "concepts.hpp"
#include "context.hpp"
#include "outcome.hpp"
#include "task.hpp"

#include <concepts>
#include <coroutine>
#include <functional>
#include <optional>
#include <stop_token>
#include <type_traits>
#include <utility>

namespace resilience {

namespace detail {

/// Calls an action the way it asks to be called: with the context, with the stop token, or bare.
template <class A>
decltype(auto) invoke_action(A& a, const context& ctx) {
    if constexpr (std::is_invocable_v<A&, const context&>)
        return std::invoke(a, ctx);
    else if constexpr (std::is_invocable_v<A&, std::stop_token>)
        return std::invoke(a, ctx.stop_token());
    else {
        static_assert(std::is_invocable_v<A&>,
                      "an action must be callable with (rs::context const&), (std::stop_token) or ()");
        return std::invoke(a);
    }
}

template <class A>
using action_awaitable_t = decltype(invoke_action(std::declval<A&>(), std::declval<const context&>()));

/// The type an action's awaitable produces: what `execute` returns.
template <class A>
using action_result_t = await_result_t<action_awaitable_t<A>>;

/// What `next(ctx)` yields once awaited: `outcome<R>`.
template <class Next>
using next_outcome_t = await_result_t<std::invoke_result_t<Next&, const context&>>;
template <class Next>
using next_value_t = typename next_outcome_t<Next>::value_type;

/// Awaits one call of the user's action and yields `outcome<R>`: whatever the action throws, when
/// called or while awaited, becomes a failure. A plain awaiter rather than a coroutine, so the
/// innermost step of every call costs no frame. It lives in the awaiting coroutine's frame for the
/// whole `co_await`, which is what keeps the context (the action may hold a reference to it) and
/// the action's awaitable alive until the action finishes.
template <class A>
class guarded_call {
    using awaitable_type = action_awaitable_t<A>;
    static_assert(!std::is_reference_v<awaitable_type>, "an action must return its awaitable by value");
    using raw_awaiter = decltype(get_awaiter(std::declval<awaitable_type>()));
    // An awaitable without operator co_await is its own awaiter; an operator co_await may hand back
    // an awaiter by value (kept here) or by reference (pointed to: it lives in the awaitable).
    static constexpr bool self_awaiting =
        !has_member_co_await<awaitable_type> && !has_free_co_await<awaitable_type>;
    static constexpr bool awaiter_by_reference = !self_awaiting && std::is_reference_v<raw_awaiter>;
    using awaiter_type =
        std::conditional_t<self_awaiting, awaitable_type, std::remove_reference_t<raw_awaiter>>;
    using awaiter_slot = std::conditional_t<
        self_awaiting, char,
        std::conditional_t<awaiter_by_reference, awaiter_type*, std::optional<awaiter_type>>>;

public:
    using value_type = action_result_t<A>;

    guarded_call(A* action, const context& ctx) : ctx_(ctx), action_(action) {}
    // Moved only before it is awaited (into when_all and the like): nothing has started yet.
    guarded_call(guarded_call&& other) noexcept : ctx_(std::move(other.ctx_)), action_(other.action_) {}
    guarded_call& operator=(guarded_call&&) = delete;

    bool await_ready() noexcept {
        try {
            awaitable_.emplace(emplace_from{[&] { return invoke_action(*action_, ctx_); }});
            if constexpr (awaiter_by_reference)
                awaiter_ = &get_awaiter(std::move(*awaitable_));
            else if constexpr (!self_awaiting)
                awaiter_.emplace(emplace_from{[&] { return get_awaiter(std::move(*awaitable_)); }});
            return awaiter().await_ready();
        } catch (...) {
            early_ = failure::current();
            return true;
        }
    }

    template <class Promise>
    auto await_suspend(std::coroutine_handle<Promise> h) noexcept {
        using result = decltype(awaiter().await_suspend(h));
        // One return type for both paths: bool, or an untyped handle (the awaiter may return any
        // coroutine_handle<P>).
        using returned = std::conditional_t<std::is_void_v<result> || std::is_same_v<result, bool>, bool,
                                            std::coroutine_handle<>>;
        try {
            if constexpr (std::is_void_v<result>) {
                awaiter().await_suspend(h);
                return returned{true};
            } else {
                return returned(awaiter().await_suspend(h));
            }
        } catch (...) {
            early_ = failure::current();
            // Resume the awaiting coroutine at once: await_resume reports the failure.
            if constexpr (std::is_same_v<returned, bool>)
                return returned{false};
            else
                return returned{h};
        }
    }

    outcome<value_type> await_resume() noexcept {
        if (early_.has_exception())
            return std::move(early_);
        try {
            if constexpr (std::is_void_v<value_type>) {
                awaiter().await_resume();
                return outcome<void>{};
            } else {
                return outcome<value_type>(awaiter().await_resume());
            }
        } catch (...) {
            return failure::current();
        }
    }

private:
    // Constructs an optional's value from a function's prvalue, so neither the awaitable nor the
    // awaiter has to be movable.
    template <class F>
    struct emplace_from {
        F make;
        operator std::invoke_result_t<F&>() { return make(); }
    };
    template <class F>
    emplace_from(F) -> emplace_from<F>; // clang 14 has no deduction for aggregates

    awaiter_type& awaiter() noexcept {
        if constexpr (self_awaiting)
            return *awaitable_;
        else
            return *awaiter_; // the optional's value, or the pointed-to awaiter
    }

    context ctx_;
    A* action_;
    std::optional<awaitable_type> awaitable_;
    awaiter_slot awaiter_{};
    failure early_;
};

/// The innermost `next`: runs the user's action once (see `guarded_call`).
template <class A>
struct guarded {
    A* action;
    using value_type = action_result_t<A>;
    guarded_call<A> operator()(const context& ctx) const { return guarded_call<A>{action, ctx}; }
};

// Stand-ins used to check the `policy` concept. Defined, because checking a policy whose `run`
// has a deduced return type instantiates bodies that call them (they are never run).
struct probe_action {
    task<int> operator()() const { co_return 0; }
};
struct probe_next {
    task<outcome<int>> operator()(const context&) const { co_return outcome<int>{0}; }
};

} // namespace detail

/// What `next(ctx)` yields in a policy's `run`: `outcome<R>`, the result type a custom policy returns
/// (`task<next_outcome_t<Next>>`).
template <class Next>
using next_outcome_t = detail::next_outcome_t<Next>;

/// Gives a policy its public calls; `Derived` provides `run(next, ctx)` (see the file comment).
template <class Derived>
class policy_base {
public:
    /// Runs `action` under this policy; returns its value or rethrows the final failure as it was.
    template <class A>
    task<detail::action_result_t<A>> execute(A action, context ctx) const {
        auto result = co_await self().run(detail::guarded<A>{&action}, ctx);
        co_return std::move(result).value();
    }
    template <class A>
    task<detail::action_result_t<A>> execute(A action, std::stop_token token = {}) const {
        return execute(std::move(action), context{std::move(token)});
    }

    /// Like `execute`, but reports the final failure as a value instead of throwing it.
    template <class A>
    task<outcome<detail::action_result_t<A>>> execute_outcome(A action, context ctx) const {
        co_return co_await self().run(detail::guarded<A>{&action}, ctx);
    }
    template <class A>
    task<outcome<detail::action_result_t<A>>> execute_outcome(A action, std::stop_token token = {}) const {
        return execute_outcome(std::move(action), context{std::move(token)});
    }

private:
    const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
};

/// A policy: wraps an action (a callable returning an awaitable) and is itself callable through
/// `execute`, `execute_outcome` and `run`, so policies compose. Checked with a probe action that
/// returns `task<int>`, since a policy is a template over every action type. Copyable, because a
/// pipeline holds its policies by value (a stateful policy's copy is a handle to the same state).
template <class P>
concept policy = std::copy_constructible<P> &&
    requires(const P& p, detail::probe_action a, std::stop_token st, const context& c, detail::probe_next n) {
    { p.execute(a) } -> awaitable_of<int>;
    { p.execute(a, st) } -> awaitable_of<int>;
    { p.execute_outcome(a) } -> awaitable_of<outcome<int>>;
    { p.run(n, c) } -> awaitable_of<outcome<int>>;
};

} // namespace resilience
