// SPDX-License-Identifier: MIT
/// \file classifier.hpp
/// `classifier`: the one predicate type that says which outcomes a policy handles (`should_handle`
/// of `retry`, `circuit_breaker`, `hedge`, `fallback`, and of the `telemetry` stage, for its events),
/// `verdict`, its answer, and `is_transient`.
#pragma once

#include "context.hpp"
#include "detail/label.hpp"
#include "error.hpp"
#include "outcome.hpp"

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>

#if __has_include(<cxxabi.h>)
#include <cxxabi.h>
#define RESILIENCE_HAS_CXXABI 1
#endif

namespace resilience::inline v0_2 {

/// A classifier's answer: does the policy handle this outcome, and (for a retry) how long to wait
/// first. A `delay` (an HTTP Retry-After, say) replaces the retry's backoff for that wait, capped
/// by `retry_options::max_delay`; a negative one means no wait. A circuit breaker and a fallback
/// read `handle` only.
///
///     return rs::verdict{.handle = true, .delay = 5s};
struct verdict {
    bool handle = false;
    std::optional<std::chrono::nanoseconds> delay{};
};

/// The default classification of a failure for a retry: worth retrying, unless retrying cannot
/// help or the caller gave up. Not transient: `cancelled_error`, `circuit_open_error` and
/// `circuit_isolated_error` (the breaker refuses on purpose; retrying would only spin against it),
/// `throttled_error` (an adaptive throttle refuses on purpose, and each retry is one more request
/// drawn against the same odds), `no_endpoint_error` (a balancer's set is empty: a retry would find it
/// so again), and `std::logic_error` and everything derived from it (a bug or a bad argument fails the same
/// way every time). Costs one rethrow for a failure the library did not make.
RESILIENCE_DECL bool is_transient(const failure& f) noexcept;

/// Specialize as `true` for a type that has `has_value()` and `error()` but is not a result that
/// may hold an error, to keep it out of `expected_like`.
template <class T>
inline constexpr bool disable_expected_like = false;

/// A result that carries its own error instead of throwing it: `std::expected<T, E>`,
/// `tl::expected`, `boost::outcome`'s results, `rs::outcome`, or a type of your own with
/// `has_value()` (which must not throw) and `error()`. An action returning one is classified by
/// its value: one holding an error is handled by default (see `classifier`), and no exception is
/// made for it anywhere. `std::optional` is not one: it has no `error()`.
template <class T>
concept expected_like = !disable_expected_like<std::remove_cv_t<T>> && requires(const T& r) {
    { r.has_value() } -> std::convertible_to<bool>;
    r.error();
};

class classifier;

namespace detail {

/// Does `v` hold an error? Only an `expected_like` value can.
template <class T>
bool holds_error(const T& v) noexcept {
    if constexpr (expected_like<T>)
        return !static_cast<bool>(v.has_value());
    else
        return false;
}

/// The default verdict on a returned value `v`: nothing unless it holds an error; an error that is
/// an exception (an `rs::failure` or a `std::exception_ptr`) is judged as that failure by
/// `judge(const failure&)`, any other error is handled.
template <class T, class JudgeFailure>
verdict judge_error_value(const T& v, const JudgeFailure& judge) {
    if constexpr (expected_like<T>) {
        if (!static_cast<bool>(v.has_value())) {
            using error_type = std::remove_cvref_t<decltype(v.error())>;
            if constexpr (std::is_same_v<error_type, failure>)
                return judge(v.error());
            else if constexpr (std::is_same_v<error_type, std::exception_ptr>)
                return judge(failure{v.error()});
            else
                return verdict{.handle = true, .delay = std::nullopt};
        }
    }
    return {};
}

template <class T>
struct outcome_parameter : std::false_type {};
template <class T>
struct outcome_parameter<outcome<T>> : std::true_type {
    using value_type = T;
};

// The first parameter of a non-overloaded, non-generic call operator or of a function pointer, for
// callables of one or two parameters: a classifier takes one, a fallback's substitute one or two.
template <class M>
struct first_parameter_of {};
template <class Ret, class Cls, class A, class... B>
requires(sizeof...(B) <= 1)
struct first_parameter_of<Ret (Cls::*)(A, B...) const> {
    using type = A;
    static constexpr std::size_t arity = 1 + sizeof...(B);
};
template <class Ret, class Cls, class A, class... B>
requires(sizeof...(B) <= 1)
struct first_parameter_of<Ret (Cls::*)(A, B...) const noexcept> {
    using type = A;
    static constexpr std::size_t arity = 1 + sizeof...(B);
};
template <class Ret, class A, class... B>
requires(sizeof...(B) <= 1)
struct first_parameter_of<Ret (*)(A, B...)> {
    using type = A;
    static constexpr std::size_t arity = 1 + sizeof...(B);
};
template <class Ret, class A, class... B>
requires(sizeof...(B) <= 1)
struct first_parameter_of<Ret (*)(A, B...) noexcept> {
    using type = A;
    static constexpr std::size_t arity = 1 + sizeof...(B);
};

template <class F>
struct first_parameter : first_parameter_of<F> {};
template <class F>
requires requires { &F::operator(); }
struct first_parameter<F> : first_parameter_of<decltype(&F::operator())> {};

/// The `T` of a callable whose first parameter is spelled `outcome<T>` (by value or reference):
/// `value` is true and `value_type` is `T`. A generic or overloaded callable has no spelled
/// parameter, so `value` is false for it.
template <class F, bool = requires { typename first_parameter<F>::type; }>
struct spelled_outcome {
    static constexpr bool value = false;
};
template <class F>
struct spelled_outcome<F, true> {
    using parameter = std::remove_cvref_t<typename first_parameter<F>::type>;
    static constexpr bool value = outcome_parameter<parameter>::value;
    static constexpr std::size_t arity = first_parameter<F>::arity;
};

template <class R>
concept verdict_like = std::same_as<std::remove_cvref_t<R>, verdict> || std::convertible_to<R, bool>;

template <class F, class P>
concept plain_classifier_of =
    std::invocable<const F&, const P&> && verdict_like<std::invoke_result_t<const F&, const P&>>;
/// One that also reads the call's context (its properties, its attempt): `f(p, ctx)`.
template <class F, class P>
concept context_classifier_of = std::invocable<const F&, const P&, const context&> &&
                                verdict_like<std::invoke_result_t<const F&, const P&, const context&>>;
template <class F, class P>
concept classifier_of = plain_classifier_of<F, P> || context_classifier_of<F, P>;

/// A callable whose first parameter is spelled `outcome<T>` (by value or const reference), with
/// the context as an optional second one.
template <class F>
concept outcome_classifier =
    spelled_outcome<F>::value &&
    ((spelled_outcome<F>::arity == 1 && plain_classifier_of<F, typename spelled_outcome<F>::parameter>) ||
     (spelled_outcome<F>::arity == 2 && context_classifier_of<F, typename spelled_outcome<F>::parameter>));

template <class F>
concept failure_classifier = classifier_of<F, failure>;

/// The context a classifier taking one reads when its policy has none to give (no properties).
inline const context& no_context() noexcept {
    static const context none;
    return none;
}

/// Calls the classifier `fn` on `p`, with the call's context if it takes one.
template <class F, class P>
decltype(auto) invoke_classifier(const F& fn, const P& p, const context* ctx) {
    if constexpr (plain_classifier_of<F, P>)
        return std::invoke(fn, p);
    else
        return std::invoke(fn, p, ctx ? *ctx : no_context());
}

// What `classifier` accepts. The outcome form is tried first, because a failure also converts to
// any `outcome<T>`; `classifier` itself is excluded first, so that asking whether it is one does
// not recurse through its own copy constructor.
template <class F>
concept classifier_callable = !std::same_as<F, classifier> && std::copy_constructible<F> &&
                              (outcome_classifier<F> || failure_classifier<F>);

/// The `T` of an outcome classifier.
template <class F>
using classified_value_t = typename outcome_parameter<typename spelled_outcome<F>::parameter>::value_type;

template <class R>
verdict to_verdict(R&& r) {
    if constexpr (std::same_as<std::remove_cvref_t<R>, verdict>)
        return std::forward<R>(r);
    else
        return verdict{.handle = static_cast<bool>(std::forward<R>(r)), .delay = std::nullopt};
}

struct classifier_model {
    virtual ~classifier_model() = default;
    virtual verdict classify_failure(const failure& f, const context* ctx) const = 0;
    /// `o` points to an `outcome<T>` of the classifier's own `T` (checked by the caller).
    virtual verdict classify_outcome(const void* o, const context* ctx) const = 0;
    /// True when the callable answers a `verdict`, which may set a retry's wait.
    virtual bool answers_verdicts() const noexcept = 0;
};

template <class F, class P>
inline constexpr bool answers_verdict =
    std::same_as<std::remove_cvref_t<decltype(invoke_classifier(std::declval<const F&>(),
                                                                std::declval<const P&>(), nullptr))>,
                 verdict>;

template <class F>
struct failure_classifier_impl final : classifier_model {
    explicit failure_classifier_impl(F f) : fn(std::move(f)) {}
    verdict classify_failure(const failure& f, const context* ctx) const override {
        return to_verdict(invoke_classifier(fn, f, ctx));
    }
    verdict classify_outcome(const void*, const context*) const override { return {}; }
    bool answers_verdicts() const noexcept override { return answers_verdict<F, failure>; }
    F fn;
};

template <class F, class T>
struct outcome_classifier_impl final : classifier_model {
    explicit outcome_classifier_impl(F f) : fn(std::move(f)) {}
    verdict classify_failure(const failure& f, const context* ctx) const override {
        return to_verdict(invoke_classifier(fn, outcome<T>{f}, ctx));
    }
    verdict classify_outcome(const void* o, const context* ctx) const override {
        return to_verdict(invoke_classifier(fn, *static_cast<const outcome<T>*>(o), ctx));
    }
    bool answers_verdicts() const noexcept override { return answers_verdict<F, outcome<T>>; }
    F fn;
};

inline std::string type_name(const std::type_info& t) {
#ifdef RESILIENCE_HAS_CXXABI
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> name{abi::__cxa_demangle(t.name(), nullptr, nullptr, &status),
                                                std::free};
    if (status == 0 && name)
        return name.get();
#endif
    return t.name();
}

} // namespace detail

namespace detail {
/// `classifier::mismatch`'s failure, made once whatever the result type (impl/classifier.ipp).
RESILIENCE_DECL failure classifier_mismatch(const std::type_info& classified, const std::type_info& returned,
                                            const char* policy, const std::string& name);
} // namespace detail

/// Says which outcomes a policy handles: the `should_handle` of `retry` (which outcomes to retry),
/// `circuit_breaker` (which count as failures), `fallback` (which get the substitute) and `hedge`
/// (which bring the next attempt forward). One object may be given to all four. Type-erased, so
/// options stay plain aggregates. Built from:
/// - nothing: empty; each policy then applies its own default (retry: `is_transient`; the others:
///   every failure but cancellation). Values are not handled, except an `expected_like` value that
///   holds an error (see below);
/// - a callable taking `const failure&`: sees failures only; values are treated as by an empty one;
/// - a callable whose one parameter is spelled `outcome<T>` (or `const outcome<T>&`), e.g.
///   `[](const rs::outcome<response>& o) { return !o || o.value().status == 503; }`: sees values
///   and failures, so a returned value can be retried, counted against the breaker, or replaced by
///   the fallback. `T` is read from the parameter, so the callable must not be generic (a generic
///   lambda is taken as a failure classifier).
/// Each returns `bool` or a `verdict` (whose `delay` only a retry reads). Either form may take the
/// call's context as a second parameter, `(const rs::failure& f, const rs::context& ctx)`, to read
/// what the caller set on it (`ctx.property(key)`, properties.hpp) or the attempt number.
/// Results without exceptions: when the action returns an `expected_like` value, the first two
/// forms handle a value holding an error (`!v.has_value()`), so it is retried, counted against the
/// breaker, substituted or hedged on as a thrown failure would be, and a policy that gives up
/// returns that value, its error unchanged; no exception is thrown for it. An error that is itself
/// an exception (`rs::failure`, `std::exception_ptr`: an action returning `rs::outcome<U>`, say)
/// is judged as that failure would be, by the callable or the policy's default. To decide on the
/// error's content, give an outcome classifier of the action's exact result type.
/// An outcome classifier works only with actions whose result type is exactly `T`; any other
/// action makes the call fail at once, before the action runs, with `std::invalid_argument`
/// naming both types (options are not templates, so this cannot be checked at compile time).
/// An exception it throws becomes the failure of the call that asked it.
/// Copies share the callable, which must be callable as `const` and safe to call concurrently.
class classifier {
public:
    classifier() noexcept = default;

    // Implicit on purpose, so that `.should_handle = [](const rs::failure& f) {...}` reads well.
    template <detail::classifier_callable F>
    classifier(F f) {
        if constexpr (detail::outcome_classifier<F>) {
            using T = detail::classified_value_t<F>;
            model_ = std::make_shared<const detail::outcome_classifier_impl<F, T>>(std::move(f));
            value_type_ = &typeid(T);
        } else {
            model_ = std::make_shared<const detail::failure_classifier_impl<F>>(std::move(f));
        }
    }

    /// True when built from nothing: the policy's default applies.
    [[nodiscard]] bool empty() const noexcept { return model_ == nullptr; }
    /// True when the classifier looks at returned values (an `outcome<T>` classifier).
    [[nodiscard]] bool sees_values() const noexcept { return value_type_ != nullptr; }
    /// True when both are empty, or copies of one classifier (they share its callable). Two
    /// classifiers built apart are never the same, even from equal callables.
    [[nodiscard]] bool same_as(const classifier& o) const noexcept {
        return model_ == o.model_ && value_type_ == o.value_type_;
    }
    /// True when the callable answers a `verdict` (rather than `bool`), whose `delay` may set a
    /// retry's wait whatever its backoff.
    [[nodiscard]] bool may_set_delay() const noexcept { return model_ && model_->answers_verdicts(); }
    /// The `T` of an `outcome<T>` classifier, or null.
    [[nodiscard]] const std::type_info* value_type() const noexcept { return value_type_; }
    /// Can this classifier judge the outcomes of an action returning `R`?
    template <class R>
    [[nodiscard]] bool accepts() const noexcept {
        return accepts(typeid(R));
    }
    /// The same for an action returning the type `returned` names.
    [[nodiscard]] bool accepts(const std::type_info& returned) const noexcept {
        return value_type_ == nullptr || *value_type_ == returned;
    }

    /// True when `o` is a value nobody needs to ask about: no outcome classifier looks at it, and it
    /// is not an `expected_like` value holding an error. A policy's success path asks this, not the
    /// classifier. Precondition: `accepts<T>()`.
    template <class T>
    [[nodiscard]] bool plain_success(const outcome<T>& o) const noexcept {
        if (!o.has_value() || value_type_)
            return false;
        if constexpr (std::is_void_v<T>)
            return true;
        else
            return !detail::holds_error(*o);
    }

    /// Judges one outcome; an empty classifier answers `otherwise(failure)` for a failure, and for a
    /// value "not handled" unless it holds an error (see the class comment). `ctx` is the context of
    /// the call the outcome ends, for a classifier that reads it (null: an empty context).
    /// Precondition: `accepts<T>()`. Whatever the callable throws propagates.
    template <class T, class Otherwise>
    [[nodiscard]] verdict classify(const outcome<T>& o, const Otherwise& otherwise,
                                   const context* ctx = nullptr) const {
        if (value_type_)
            return model_->classify_outcome(&o, ctx);
        const auto judge = [&](const failure& f) {
            if (model_)
                return model_->classify_failure(f, ctx);
            return verdict{.handle = static_cast<bool>(otherwise(f)), .delay = std::nullopt};
        };
        if (o.has_failure())
            return judge(o.error());
        if constexpr (std::is_void_v<T>)
            return {};
        else
            return detail::judge_error_value(*o, judge);
    }

    /// The failure reported when an action returning `R` meets an outcome classifier of another
    /// type: "resilience::retry: should_handle classifies rs::outcome<long> but the action returns
    /// int" (`policy` is "retry", the name of the policy kind; `name` its `name` option, if any).
    template <class R>
    [[nodiscard]] failure mismatch(const char* policy = "retry", const std::string& name = {}) const {
        return detail::classifier_mismatch(*value_type_, typeid(R), policy, name);
    }
    /// The same for an action returning the type `returned` names.
    [[nodiscard]] failure mismatch(const std::type_info& returned, const char* policy,
                                   const std::string& name) const {
        return detail::classifier_mismatch(*value_type_, returned, policy, name);
    }

private:
    std::shared_ptr<const detail::classifier_model> model_;
    const std::type_info* value_type_ = nullptr;
};

namespace detail {
/// Why the policy named `policy` (`name`) refuses a call before admitting it: its classifier `c`
/// judges another result type than the action's (`returned`), or else the caller stopped
/// (`cancelled_error`). The type is asked first: it does not change, while a stop may arrive between
/// two checks, and a setup mistake must not pass for a cancellation. `c` null: no classifier to ask.
RESILIENCE_DECL failure refused_before_admission(const classifier* c, const std::type_info& returned,
                                                 const char* policy, const std::string& name);
} // namespace detail

} // namespace resilience

#if RESILIENCE_INCLUDE_DEFINITIONS
#include "impl/classifier.ipp"
#endif
