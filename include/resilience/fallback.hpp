// SPDX-License-Identifier: MIT
/// \file fallback.hpp
/// `fallback`: answers a failed call (or a returned value it handles) with a substitute.
#pragma once

#include "classifier.hpp"
#include "concepts.hpp"
#include "context.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "policy_kit.hpp"
#include "task.hpp"
#include "telemetry_event.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>

namespace resilience::inline v0_2 {

/// What a fallback reports to `on_fallback`: the outcome its substitute is about to replace.
/// Refers to the call's own outcome and to the fallback's name: valid only during the callback;
/// copy what you need to keep.
class fallback_event {
public:
    fallback_event(int attempt, const failure* error, const void* value = nullptr,
                   const std::type_info* value_type = nullptr, std::string_view policy_name = {}) noexcept
        : attempt_(attempt), error_(error), value_(value, value_type), name_(policy_name) {}
    /// The event of an outcome that holds `value` (what the fallback itself makes).
    fallback_event(int attempt, const failure* error, detail::value_view value,
                   std::string_view policy_name) noexcept
        : attempt_(attempt), error_(error), value_(value), name_(policy_name) {}

    /// The attempt the fallback saw (`context::attempt()`).
    [[nodiscard]] int attempt() const noexcept { return attempt_; }
    /// The failure the substitute replaces; null when it replaces a value `should_handle` handled
    /// (see `value<T>()`).
    [[nodiscard]] const failure* error() const noexcept { return error_; }
    /// The value the substitute replaces, if it is one of type `T`; otherwise null.
    template <class T>
    [[nodiscard]] const T* value() const noexcept {
        return value_.template get<T>();
    }
    /// The `name` option of the fallback that reports (empty when unnamed).
    [[nodiscard]] std::string_view policy_name() const noexcept { return name_; }

    /// What the caller set on the call's context (properties.hpp): a request id, a tenant.
    [[nodiscard]] properties_view properties() const noexcept { return properties_; }
    /// Sets what `properties()` returns (the reporting policy passes the call's).
    fallback_event& with_properties(properties_view p) noexcept {
        properties_ = p;
        return *this;
    }

private:
    int attempt_;
    const failure* error_;
    detail::value_view value_;
    std::string_view name_;
    properties_view properties_{};
};

/// How a `fallback` behaves, besides its substitute. `fallback_options{}` answers every failure but
/// cancellation (and an `expected_like` value holding an error).
///
/// A user callback (`should_handle`, `on_fallback`, the `telemetry` listener) that throws ends the
/// call with its exception as the call's failure, in place of the outcome it was judging; the
/// substitute is then not used.
struct fallback_options {
    /// Names the fallback in its messages, in `fallback_event`s and its telemetry (`name()`).
    /// Empty: unnamed.
    std::string name{};
    /// Which outcomes get the substitute (see `classifier`): the others pass through unchanged.
    /// Empty: every failure but cancellation; values pass, except an `expected_like` value holding
    /// an error.
    classifier should_handle{};
    /// Called when the substitute is about to answer, with the outcome it replaces. Runs on the
    /// caller's coroutine; must not block.
    std::function<void(const fallback_event&)> on_fallback{};
    /// Hears a `fallback` event each time the substitute answers. Empty: the listener of a
    /// `telemetry` stage around the call, if any (see telemetry.hpp).
    telemetry_listener telemetry{};
};

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
bool fallback_handles(const H& h, const outcome<R>& o, const context& ctx) {
    if constexpr (std::same_as<H, classifier>) {
        return h.classify(o, unless_cancelled{}, &ctx).handle;
    } else if constexpr (outcome_predicate<H>) {
        static_assert(std::is_same_v<classified_value_t<H>, R>,
                      "resilience::fallback: should_handle classifies an rs::outcome<T> whose T is not the "
                      "action's result type");
        return to_verdict(invoke_classifier(h, o, &ctx)).handle;
    } else {
        const auto judge = [&](const failure& f) { return to_verdict(invoke_classifier(h, f, &ctx)); };
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
    substitute_kind_for<S, R>() != substitute_kind::value && awaitable<substitute_call_t<S, R>>;

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
/// - `should_handle` (in `fallback_options`) narrows which outcomes get the substitute; the others
///   pass through unchanged. It is an `rs::classifier`, the same object a retry or a breaker takes.
///   The default declines cancellation (`is_cancellation`) and every value but an `expected_like`
///   one holding an error: a caller that gave up is not a failure to answer for.
/// - Whatever `should_handle` says, a call whose caller's stop token is stopped is never answered:
///   its outcome passes through (and the call ends with `cancelled_error`, see docs/core.md, "A call
///   its caller stopped"), so cancelling a call never turns into a substitute.
/// - `on_fallback` is told each time the substitute is about to answer, with what it replaces.
/// - If the substitute, `should_handle` or `on_fallback` throws, that exception becomes the call's
///   failure: it replaces the outcome rather than suppressing it. Nothing escapes `execute_outcome`.
///
/// A fallback swallows failures, so it belongs outermost: inside a retry the retry would see a
/// success, inside a breaker the breaker would never learn the dependency fails.
///
///     rs::pipeline p{rs::fallback{[](const rs::failure&) { return cached(); }}, rs::retry{},
///     rs::timeout{2s}};
///     rs::fallback named{-1, {.name = "prices", .on_fallback = log_fallback}};
///
/// Stateless value: copies are independent. The substitute is called as `const` and lives in the
/// fallback, so a coroutine substitute may use its captures for as long as the fallback lives
/// (which, as for every policy, must outlive the calls made through it); the `const failure&` or
/// `const outcome<R>&` it receives stays valid until its awaitable finishes.
///
/// `ShouldHandle` is `rs::classifier` for a fallback made with `fallback_options`. The deprecated
/// constructor also takes a predicate of its own type, kept unerased (a callable a classifier
/// accepts); `detail::unless_cancelled`, the default, is the default predicate.
template <class Substitute, class ShouldHandle = detail::unless_cancelled>
class fallback : public policy_base<fallback<Substitute, ShouldHandle>> {
    static_assert(detail::fallback_predicate<ShouldHandle>,
                  "resilience::fallback: should_handle must be an rs::classifier, or callable as "
                  "bool(const rs::failure&) or bool(const rs::outcome<T>&) (or returning rs::verdict)");
    static_assert(!std::is_reference_v<Substitute>, "resilience::fallback: the substitute is held by value");

    static constexpr bool erased = std::same_as<ShouldHandle, classifier>;

public:
    /// Answers every failure but cancellation (and an `expected_like` value holding an error).
    explicit fallback(Substitute substitute) : substitute_(std::move(substitute)) {}
    /// Answers what `options.should_handle` handles.
    explicit fallback(Substitute substitute, fallback_options options)
    requires erased
        : substitute_(std::move(substitute)), options_(std::move(options)) {}
    /// The positional form. Kept for one version.
    [[deprecated("use fallback_options")]] explicit fallback(Substitute substitute,
                                                             ShouldHandle should_handle,
                                                             std::string name = {},
                                                             telemetry_listener telemetry = {})
        : substitute_(std::move(substitute)), options_{.name = std::move(name),
                                                       .should_handle = erased_part(should_handle),
                                                       .telemetry = std::move(telemetry)},
          typed_(typed_part(std::move(should_handle))) {}

    [[nodiscard]] const Substitute& substitute() const noexcept { return substitute_; }
    /// The options; for a fallback with a predicate of its own type, `should_handle` is empty here
    /// (see `should_handle()`).
    [[nodiscard]] const fallback_options& options() const noexcept { return options_; }
    /// What decides which outcomes get the substitute.
    [[nodiscard]] const ShouldHandle& should_handle() const noexcept {
        if constexpr (erased)
            return options_.should_handle;
        else
            return typed_;
    }
    /// The `name` option (empty when unnamed).
    [[nodiscard]] const std::string& name() const noexcept { return options_.name; }

    // ---- the policy protocol (see policy.hpp): an outcome not handled passes through untouched ----
    static constexpr bool enter_never_waits = true;
    struct call_state {};

    template <class R>
    step enter(call_state&, const context&, std::optional<outcome<R>>& result) const {
        if constexpr (erased) {
            if (!options_.should_handle.template accepts<R>()) {
                result.emplace(options_.should_handle.template mismatch<R>("fallback", options_.name));
                return step::done;
            }
        }
        return step::proceed;
    }

    /// Asks `should_handle` here, so an outcome it declines costs no frame: only a handled one
    /// goes on to `resume` and the substitute.
    template <class R>
    step leave(call_state&, const context& ctx, outcome<R>& result) const {
        if (detail::fallback_plain_success(should_handle(), result))
            return step::proceed;
        if (ctx.stop_requested())
            return step::proceed;
        try {
            // Looked at again after `should_handle`, which may have stopped the caller.
            return detail::fallback_handles(should_handle(), result, ctx) && !ctx.stop_requested()
                       ? step::wait
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

        const failure no_failure;
        const failure& original = result.has_failure() ? result.error() : no_failure;
        try {
            if (options_.on_fallback)
                tell(result, ctx);
            // No clock here: the event's `at` is zero.
            if (const detail::listener_ref l = kit::listener_for(options_.telemetry, ctx)) {
                telemetry_event e =
                    detail::event(telemetry_kind::fallback, "fallback", options_.name, ctx.attempt(), {},
                                  result.has_failure() ? &original : nullptr);
                e.handled = true; // only what the classifier handled reaches the substitute
                (*l)(e);
            }
            if (ctx.stop_requested()) // stopped since `leave` looked (by a callback, or another thread)
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
    template <class R>
    void tell(const outcome<R>& result, const context& ctx) const {
        options_.on_fallback(fallback_event{ctx.attempt(), result.has_failure() ? &result.error() : nullptr,
                                            detail::value_view::of(result), options_.name}
                                 .with_properties(ctx.properties()));
    }

    // The implicit conversion the static_assert promised (no explicit constructor sneaks in).
    template <class R, class X>
    static R convert(X&& x) {
        return std::forward<X>(x);
    }

    struct none {};
    // The deprecated constructor's predicate goes to `options_` or to `typed_`, by its type.
    static classifier erased_part(ShouldHandle& h) {
        if constexpr (erased)
            return std::move(h);
        else
            return {};
    }
    static auto typed_part(ShouldHandle&& h) {
        if constexpr (erased)
            return none{};
        else
            return std::move(h);
    }

    Substitute substitute_;
    fallback_options options_{};
    [[no_unique_address]] std::conditional_t<erased, none, ShouldHandle> typed_{};
};

template <class Substitute>
fallback(Substitute) -> fallback<Substitute>;
template <class Substitute>
fallback(Substitute, fallback_options) -> fallback<Substitute, classifier>;
template <class Substitute, class ShouldHandle>
fallback(Substitute, ShouldHandle) -> fallback<Substitute, ShouldHandle>;
template <class Substitute, class ShouldHandle>
fallback(Substitute, ShouldHandle, std::string) -> fallback<Substitute, ShouldHandle>;
template <class Substitute, class ShouldHandle>
fallback(Substitute, ShouldHandle, std::string, telemetry_listener) -> fallback<Substitute, ShouldHandle>;

} // namespace resilience
