// SPDX-License-Identifier: MIT
/// \file fallback.hpp
/// `fallback`: answers a failed call (or a returned value it handles) with a substitute.
#pragma once

#include "classifier.hpp"
#include "concepts.hpp"
#include "context.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "task.hpp"
#include "telemetry.hpp"

#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace resilience {

namespace detail {

/// The default `should_handle` of a fallback: every failure but cancellation; no value but an
/// `expected_like` one holding an error.
struct unless_cancelled {
    bool operator()(const failure& f) const noexcept { return !is_cancellation(f); }
};

/// What a fallback's `should_handle` may be: an `rs::classifier`, or a callable of a shape it
/// accepts (failure-taking, or taking a spelled `outcome<T>`), kept as is so no call through it
/// is type-erased.
template <class H>
concept fallback_predicate = std::same_as<H, classifier> || outcome_classifier<H> || failure_classifier<H>;

template <class H>
inline constexpr bool outcome_predicate = !std::same_as<H, classifier> && outcome_classifier<H>;

/// Does `h` handle `o`? An empty classifier answers as `unless_cancelled`. A failure predicate
/// sees failures, and treats a value as an empty classifier does (see `classifier`).
template <class H, class R>
bool fallback_handles(const H& h, const outcome<R>& o) {
    if constexpr (std::same_as<H, classifier>) {
        return h.classify(o, unless_cancelled{}).handle;
    } else if constexpr (outcome_predicate<H>) {
        static_assert(std::is_same_v<classified_value_t<H>, R>,
                      "resilience::fallback: should_handle classifies an rs::outcome<T> whose T is not the "
                      "action's result type");
        return to_verdict(std::invoke(h, o)).handle;
    } else {
        const auto judge = [&](const failure& f) { return to_verdict(std::invoke(h, f)); };
        if (o.has_failure())
            return judge(o.error()).handle;
        if constexpr (std::is_void_v<R>)
            return false;
        else
            return judge_error_value(*o, judge).handle;
    }
}

/// Is `o` a value `h` need not be asked about? Known at compile time except for a type-erased
/// classifier and an `expected_like` value, which may hold an error.
template <class H, class R>
bool fallback_plain_success(const H& h, const outcome<R>& o) noexcept {
    if constexpr (std::same_as<H, classifier>) {
        return h.plain_success(o);
    } else if constexpr (outcome_predicate<H>) {
        return false;
    } else if constexpr (std::is_void_v<R>) {
        return o.has_value();
    } else {
        return o.has_value() && !holds_error(*o);
    }
}

// How a substitute is used, in order of preference: called with the outcome it answers (only when
// its first parameter is spelled `outcome<T>`) and maybe the caller's context; with the failure
// and the caller's context, with the failure alone, with nothing; anything else is a value that is
// copied out.
enum class substitute_kind {
    value,
    nullary,
    of_failure,
    of_failure_and_context,
    of_outcome,
    of_outcome_and_context
};

template <class S, class R>
constexpr substitute_kind substitute_kind_for() {
    if constexpr (spelled_outcome<S>::value) {
        static_assert(std::is_same_v<typename spelled_outcome<S>::parameter, outcome<R>>,
                      "resilience::fallback: a substitute taking rs::outcome<T> needs T to be the action's "
                      "result type");
        if constexpr (std::is_invocable_v<const S&, const outcome<R>&, const context&>)
            return substitute_kind::of_outcome_and_context;
        else
            return substitute_kind::of_outcome;
    } else if constexpr (std::is_invocable_v<const S&, const failure&, const context&>) {
        return substitute_kind::of_failure_and_context;
    } else if constexpr (std::is_invocable_v<const S&, const failure&>) {
        return substitute_kind::of_failure;
    } else if constexpr (std::is_invocable_v<const S&>) {
        return substitute_kind::nullary;
    } else {
        return substitute_kind::value;
    }
}

/// Calls (or copies) the substitute for the outcome `o`, whose failure `f` is (an empty failure
/// when `o` is a value).
template <class S, class R>
decltype(auto) call_substitute(const S& s, const outcome<R>& o, const failure& f, const context& ctx) {
    constexpr substitute_kind kind = substitute_kind_for<S, R>();
    if constexpr (kind == substitute_kind::of_outcome_and_context)
        return std::invoke(s, o, ctx);
    else if constexpr (kind == substitute_kind::of_outcome)
        return std::invoke(s, o);
    else if constexpr (kind == substitute_kind::of_failure_and_context)
        return std::invoke(s, f, ctx);
    else if constexpr (kind == substitute_kind::of_failure)
        return std::invoke(s, f);
    else if constexpr (kind == substitute_kind::nullary)
        return std::invoke(s);
    else
        return (s);
}

template <class S, class R>
using substitute_call_t =
    decltype(call_substitute(std::declval<const S&>(), std::declval<const outcome<R>&>(),
                             std::declval<const failure&>(), std::declval<const context&>()));

// A function's awaitable result is awaited; a value substitute is never awaited, even if it could be.
template <class S, class R>
inline constexpr bool substitute_awaited =
    substitute_kind_for<S, R>() != substitute_kind::value&& awaitable<substitute_call_t<S, R>>;

template <class S, class R, bool Awaited = substitute_awaited<S, R>>
struct substitute_result {
    using type = substitute_call_t<S, R>;
};
template <class S, class R>
struct substitute_result<S, R, true> {
    using type = await_result_t<substitute_call_t<S, R>>;
};

/// What the substitute finally produces for an action returning `R`: the value itself, the
/// function's result, or what that result's awaitable yields.
template <class S, class R>
using substitute_result_t = typename substitute_result<S, R>::type;

} // namespace detail

/// Answers a failed call with a substitute instead of the failure: stale data, an empty list, a
/// degraded result. The substitute is, in order of preference, something callable with
/// `(const rs::outcome<R>&, const context&)` or `(const rs::outcome<R>&)` (its first parameter
/// spelled so), with `(const failure&, const context&)`, with `(const failure&)`, or with `()`;
/// a function's result may be an awaitable (`-> rs::task<int>`), which is awaited; anything not
/// callable is a value, copied out each time. Its result must convert to the action's result type
/// `R` (checked at compile time); for a `void` action it must be a callable returning `void` or an
/// awaitable of `void`.
///
/// - A value is returned unchanged and the substitute never runs, unless `should_handle` handles
///   it (an outcome classifier: a 503 returned as a value, say; or, by default, an `expected_like`
///   value holding an error, see `classifier`). Then the substitute answers it:
///   one taking `const rs::outcome<R>&` sees the value; one taking `const failure&` receives an
///   empty failure (`has_exception()` false), since there was none.
/// - A failure the substitute answers: the call's result is the substitute's. The function sees
///   the failure as it was (same exception object).
/// - `should_handle` narrows which outcomes get the substitute; the others pass through unchanged.
///   It is an `rs::classifier` (the same object a retry or a breaker takes) or any callable a
///   classifier accepts, kept unerased: `bool`/`verdict` of `(const failure&)` or of a spelled
///   `(const rs::outcome<T>&)`. The default declines cancellation (`is_cancellation`) and every
///   value but an `expected_like` one holding an error: a caller that gave up is not a failure to
///   answer for.
/// - Whatever `should_handle` says, a call whose caller's stop token is stopped is never answered:
///   its outcome passes through, so cancelling a call never turns into a substitute.
/// - If the substitute or `should_handle` throws, that exception becomes the call's failure: it
///   replaces the outcome rather than suppressing it. Nothing escapes `execute_outcome`.
///
/// A fallback swallows failures, so it belongs outermost: inside a retry the retry would see a
/// success, inside a breaker the breaker would never learn the dependency fails.
///
///     rs::pipeline p{rs::fallback{[](const rs::failure&) { return cached(); }}, rs::retry{},
///     rs::timeout{2s}};
///
/// Stateless value: copies are independent. The substitute is called as `const` and lives in the
/// fallback, so a coroutine substitute may use its captures for as long as the fallback lives
/// (which, as for every policy, must outlive the calls made through it); the `const failure&` or
/// `const outcome<R>&` it receives stays valid until its awaitable finishes.
template <class Substitute, class ShouldHandle = detail::unless_cancelled>
class fallback : public policy_base<fallback<Substitute, ShouldHandle>> {
    static_assert(detail::fallback_predicate<ShouldHandle>,
                  "resilience::fallback: should_handle must be an rs::classifier, or callable as "
                  "bool(const rs::failure&) or bool(const rs::outcome<T>&) (or returning rs::verdict)");
    static_assert(!std::is_reference_v<Substitute>, "resilience::fallback: the substitute is held by value");

public:
    /// `name` names the fallback in its messages (`name()`); empty: unnamed. `telemetry` hears a
    /// `fallback` event each time the substitute answers; empty: the listener of a `telemetry`
    /// stage around the call, if any (see telemetry.hpp).
    explicit fallback(Substitute substitute, ShouldHandle should_handle = ShouldHandle{},
                      std::string name = {}, telemetry_listener telemetry = {})
        : substitute_(std::move(substitute)), should_handle_(std::move(should_handle)),
          name_(std::move(name)), telemetry_(std::move(telemetry)) {}

    [[nodiscard]] const Substitute& substitute() const noexcept { return substitute_; }
    [[nodiscard]] const ShouldHandle& should_handle() const noexcept { return should_handle_; }
    /// The name given to the constructor (empty when unnamed).
    [[nodiscard]] const std::string& name() const noexcept { return name_; }

    // ---- the policy protocol (see policy.hpp): an outcome not handled passes through untouched ----
    static constexpr bool enter_never_waits = true;
    struct call_state {};

    template <class R>
    step enter(call_state&, const context&, const context*&, std::optional<outcome<R>>& result) const {
        if constexpr (std::same_as<ShouldHandle, classifier>) {
            if (!should_handle_.template accepts<R>()) {
                result.emplace(should_handle_.template mismatch<R>("fallback", name_));
                return step::done;
            }
        }
        return step::proceed;
    }

    /// Asks `should_handle` here, so an outcome it declines costs no frame: only a handled one
    /// goes on to `resume` and the substitute.
    template <class R>
    step leave(call_state&, const context& ctx, outcome<R>& result) const {
        if (detail::fallback_plain_success(should_handle_, result))
            return step::proceed;
        if (ctx.stop_requested())
            return step::proceed;
        try {
            // Looked at again after `should_handle`, which may have stopped the caller.
            return detail::fallback_handles(should_handle_, result) && !ctx.stop_requested() ? step::wait
                                                                                             : step::proceed;
        } catch (...) {
            result = outcome<R>{failure::current()};
            return step::proceed;
        }
    }

    /// A handled outcome: answered with the substitute.
    template <class Next, class R>
    task<outcome<R>> resume(call_state&, Next, const context& ctx, outcome<R> result) const {
        using result_t = outcome<R>;
        static_assert(
            std::is_convertible_v<detail::substitute_result_t<Substitute, R>, R>,
            "resilience::fallback: the substitute's result must convert to the action's result type "
            "(for a void action: a callable returning void or an awaitable of void)");

        const failure none;
        const failure& original = result.has_failure() ? result.error() : none;
        try {
            // No clock here: the event's `at` is zero.
            if (const telemetry_listener* l = detail::listener_for(telemetry_, ctx))
                (*l)(detail::event(telemetry_kind::fallback, "fallback", name_, ctx.attempt(), {},
                                   result.has_failure() ? &original : nullptr));
            if (ctx.stop_requested()) // stopped since `leave` looked (by the listener, or another thread)
                co_return std::move(result);
            if constexpr (std::is_void_v<R>) {
                if constexpr (detail::substitute_awaited<Substitute, R>)
                    co_await detail::call_substitute(substitute_, result, original, ctx);
                else
                    detail::call_substitute(substitute_, result, original, ctx);
                co_return result_t{};
            } else if constexpr (detail::substitute_awaited<Substitute, R>) {
                co_return result_t(
                    convert<R>(co_await detail::call_substitute(substitute_, result, original, ctx)));
            } else {
                co_return result_t(convert<R>(detail::call_substitute(substitute_, result, original, ctx)));
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
    ShouldHandle should_handle_;
    std::string name_;
    telemetry_listener telemetry_;
};

template <class Substitute>
fallback(Substitute) -> fallback<Substitute>;
template <class Substitute, class ShouldHandle>
fallback(Substitute, ShouldHandle) -> fallback<Substitute, ShouldHandle>;
template <class Substitute, class ShouldHandle>
fallback(Substitute, ShouldHandle, std::string) -> fallback<Substitute, ShouldHandle>;
template <class Substitute, class ShouldHandle>
fallback(Substitute, ShouldHandle, std::string, telemetry_listener) -> fallback<Substitute, ShouldHandle>;

} // namespace resilience
