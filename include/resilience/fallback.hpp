// SPDX-License-Identifier: MIT
/// \file fallback.hpp
/// `fallback`: answers a failed call with a substitute (a value, or what a function of the failure gives).
#pragma once

#include "concepts.hpp"
#include "context.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "task.hpp"

#include <functional>
#include <type_traits>
#include <utility>

namespace resilience {

namespace detail {

/// The default `handle_if` of a fallback: every failure but cancellation.
struct unless_cancelled {
    bool operator()(const failure& f) const noexcept { return !is_cancellation(f); }
};

// How a substitute is used, in order of preference: called with the failure and the caller's
// context, with the failure alone, with nothing; anything else is a value that is copied out.
enum class substitute_kind { value, nullary, of_failure, of_failure_and_context };

template <class S>
inline constexpr substitute_kind substitute_kind_of =
    std::is_invocable_v<const S&, const failure&, const context&> ? substitute_kind::of_failure_and_context
    : std::is_invocable_v<const S&, const failure&>               ? substitute_kind::of_failure
    : std::is_invocable_v<const S&>                               ? substitute_kind::nullary
                                                                  : substitute_kind::value;

template <class S>
decltype(auto) call_substitute(const S& s, const failure& f, const context& ctx) {
    constexpr substitute_kind kind = substitute_kind_of<S>;
    if constexpr (kind == substitute_kind::of_failure_and_context)
        return std::invoke(s, f, ctx);
    else if constexpr (kind == substitute_kind::of_failure)
        return std::invoke(s, f);
    else if constexpr (kind == substitute_kind::nullary)
        return std::invoke(s);
    else
        return (s);
}

template <class S>
using substitute_call_t = decltype(call_substitute(std::declval<const S&>(), std::declval<const failure&>(),
                                                   std::declval<const context&>()));

// A function's awaitable result is awaited; a value substitute is never awaited, even if it could be.
template <class S>
inline constexpr bool substitute_awaited =
    substitute_kind_of<S> != substitute_kind::value&& awaitable<substitute_call_t<S>>;

template <class S, bool Awaited = substitute_awaited<S>>
struct substitute_result {
    using type = substitute_call_t<S>;
};
template <class S>
struct substitute_result<S, true> {
    using type = await_result_t<substitute_call_t<S>>;
};

/// What the substitute finally produces: the value itself, the function's result, or what that
/// result's awaitable yields.
template <class S>
using substitute_result_t = typename substitute_result<S>::type;

} // namespace detail

/// Answers a failed call with a substitute instead of the failure: stale data, an empty list, a
/// degraded result. The substitute is, in order of preference, something callable with
/// `(const failure&, const context&)`, with `(const failure&)`, or with `()`; a function's result
/// may be an awaitable (`-> rs::task<int>`), which is awaited; anything not callable is a value,
/// copied out each time. Its result must convert to the action's result type (checked at compile
/// time); for a `void` action it must be a callable returning `void` or an awaitable of `void`.
///
/// - A value is returned unchanged and the substitute never runs.
/// - A failure the substitute answers: the call's result is the substitute's. The function sees
///   the failure as it was (same exception object). If the substitute (or `handle_if`) throws, that
///   exception becomes the call's failure: it replaces the original rather than suppressing it.
/// - `handle_if(const failure&) -> bool` narrows which failures get the substitute; the others pass
///   through unchanged. The default declines cancellation (`is_cancellation`): a caller that gave
///   up is not a failure to answer for.
/// - Whatever `handle_if` says, a call whose caller's stop token is stopped is never answered: its
///   failure passes through, so cancelling a call never turns into a substitute.
///
/// A fallback swallows failures, so it belongs outermost: inside a retry the retry would see a
/// success, inside a breaker the breaker would never learn the dependency fails.
///
///     rs::pipeline p{rs::fallback{[](const rs::failure&) { return cached(); }}, rs::retry{},
///     rs::timeout{2s}};
///
/// Stateless value: copies are independent. The substitute is called as `const` and lives in the
/// fallback, so a coroutine substitute may use its captures for as long as the fallback lives
/// (which, as for every policy, must outlive the calls made through it); the `const failure&` it
/// receives stays valid until its awaitable finishes.
template <class Substitute, class HandleIf = detail::unless_cancelled>
class fallback : public policy_base<fallback<Substitute, HandleIf>> {
    static_assert(std::is_invocable_r_v<bool, const HandleIf&, const failure&>,
                  "resilience::fallback: handle_if must be callable as bool(const rs::failure&)");
    static_assert(!std::is_reference_v<Substitute>, "resilience::fallback: the substitute is held by value");

public:
    explicit fallback(Substitute substitute, HandleIf handle_if = HandleIf{})
        : substitute_(std::move(substitute)), handle_if_(std::move(handle_if)) {}

    const Substitute& substitute() const noexcept { return substitute_; }
    const HandleIf& handle_if() const noexcept { return handle_if_; }

    // ---- the policy protocol (see policy.hpp): a value passes through untouched ----
    static constexpr bool enter_never_waits = true;
    struct call_state {};

    template <class R>
    step enter(call_state&, const context&, const context*&, std::optional<outcome<R>>&) const noexcept {
        return step::proceed;
    }
    template <class R>
    step leave(call_state&, const context& ctx, const outcome<R>& result) const noexcept {
        return result.has_value() || ctx.stop_requested() ? step::proceed : step::wait;
    }

    /// A failure: answered with the substitute, or passed on.
    template <class Next, class R>
    task<outcome<R>> resume(call_state&, Next, const context& ctx, outcome<R> result) const {
        using result_t = outcome<R>;
        static_assert(
            std::is_convertible_v<detail::substitute_result_t<Substitute>, R>,
            "resilience::fallback: the substitute's result must convert to the action's result type "
            "(for a void action: a callable returning void or an awaitable of void)");

        const failure& original = result.error();
        try {
            if (!std::invoke(handle_if_, original))
                co_return std::move(result);
            if constexpr (std::is_void_v<R>) {
                if constexpr (detail::substitute_awaited<Substitute>)
                    co_await detail::call_substitute(substitute_, original, ctx);
                else
                    detail::call_substitute(substitute_, original, ctx);
                co_return result_t{};
            } else if constexpr (detail::substitute_awaited<Substitute>) {
                co_return result_t(convert<R>(co_await detail::call_substitute(substitute_, original, ctx)));
            } else {
                co_return result_t(convert<R>(detail::call_substitute(substitute_, original, ctx)));
            }
        } catch (...) {
            co_return failure::current();
        }
    }

private:
    // The implicit conversion the static_assert promised (no explicit constructor sneaks in).
    template <class R, class X>
    static R convert(X&& x) {
        return std::forward<X>(x);
    }

    Substitute substitute_;
    HandleIf handle_if_;
};

template <class Substitute>
fallback(Substitute) -> fallback<Substitute>;
template <class Substitute, class HandleIf>
fallback(Substitute, HandleIf) -> fallback<Substitute, HandleIf>;

} // namespace resilience
