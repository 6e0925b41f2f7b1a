// SPDX-License-Identifier: MIT
/// \file classifier.hpp
/// `classifier`: the one predicate type that says which outcomes a policy handles (`should_handle`
/// of `retry`, `circuit_breaker` and `fallback`), `verdict`, its answer, and `is_transient`.
#pragma once

#include "error.hpp"
#include "outcome.hpp"

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdlib>
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

namespace resilience {

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
/// and `std::logic_error` and everything derived from it (a bug or a bad argument fails the same
/// way every time). Costs one rethrow for a failure the library did not make.
inline bool is_transient(const failure& f) noexcept {
    if (!f.has_exception())
        return false;
    if (f.code() == errc::cancelled || f.code() == errc::circuit_open || f.code() == errc::circuit_isolated)
        return false;
    if (f.code() != errc{})
        return true; // the library's other failures (timeout, rejections) are transient: no rethrow needed
    try {
        f.rethrow();
    } catch (const cancelled_error&) {
        return false;
    } catch (const circuit_open_error&) {
        return false; // circuit_isolated_error too
    } catch (const std::logic_error&) {
        return false;
    } catch (...) {
        return true;
    }
}

class classifier;

namespace detail {

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
requires(sizeof...(B) <= 1) struct first_parameter_of<Ret (Cls::*)(A, B...) const> {
    using type = A;
    static constexpr std::size_t arity = 1 + sizeof...(B);
};
template <class Ret, class Cls, class A, class... B>
requires(sizeof...(B) <= 1) struct first_parameter_of<Ret (Cls::*)(A, B...) const noexcept> {
    using type = A;
    static constexpr std::size_t arity = 1 + sizeof...(B);
};
template <class Ret, class A, class... B>
requires(sizeof...(B) <= 1) struct first_parameter_of<Ret (*)(A, B...)> {
    using type = A;
    static constexpr std::size_t arity = 1 + sizeof...(B);
};
template <class Ret, class A, class... B>
requires(sizeof...(B) <= 1) struct first_parameter_of<Ret (*)(A, B...) noexcept> {
    using type = A;
    static constexpr std::size_t arity = 1 + sizeof...(B);
};

template <class F>
struct first_parameter : first_parameter_of<F> {};
template <class F>
requires requires {
    &F::operator();
}
struct first_parameter<F> : first_parameter_of<decltype(&F::operator())> {};

/// The `T` of a callable whose first parameter is spelled `outcome<T>` (by value or reference):
/// `value` is true and `value_type` is `T`. A generic or overloaded callable has no spelled
/// parameter, so `value` is false for it.
template <class F, bool = requires {
    typename first_parameter<F>::type;
}
> struct spelled_outcome { static constexpr bool value = false; };
template <class F>
struct spelled_outcome<F, true> {
    using parameter = std::remove_cvref_t<typename first_parameter<F>::type>;
    static constexpr bool value = outcome_parameter<parameter>::value;
    static constexpr std::size_t arity = first_parameter<F>::arity;
};

template <class R>
concept verdict_like = std::same_as<std::remove_cvref_t<R>, verdict> || std::convertible_to<R, bool>;

template <class F, class P>
concept classifier_of =
    std::invocable<const F&, const P&> && verdict_like<std::invoke_result_t<const F&, const P&>>;

/// A callable whose one parameter is spelled `outcome<T>` (by value or const reference).
template <class F>
concept outcome_classifier = spelled_outcome<F>::value && spelled_outcome<F>::arity == 1 &&
                             classifier_of<F, typename spelled_outcome<F>::parameter>;

template <class F>
concept failure_classifier = classifier_of<F, failure>;

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
    virtual verdict classify_failure(const failure& f) const = 0;
    /// `o` points to an `outcome<T>` of the classifier's own `T` (checked by the caller).
    virtual verdict classify_outcome(const void* o) const = 0;
};

template <class F>
struct failure_classifier_impl final : classifier_model {
    explicit failure_classifier_impl(F f) : fn(std::move(f)) {}
    verdict classify_failure(const failure& f) const override { return to_verdict(std::invoke(fn, f)); }
    verdict classify_outcome(const void*) const override { return {}; }
    F fn;
};

template <class F, class T>
struct outcome_classifier_impl final : classifier_model {
    explicit outcome_classifier_impl(F f) : fn(std::move(f)) {}
    verdict classify_failure(const failure& f) const override {
        return to_verdict(std::invoke(fn, outcome<T>{f}));
    }
    verdict classify_outcome(const void* o) const override {
        return to_verdict(std::invoke(fn, *static_cast<const outcome<T>*>(o)));
    }
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

/// "resilience::retry" or "resilience::retry (payments)": how a policy signs its messages.
inline std::string policy_label(const char* policy, const std::string& name) {
    std::string label = std::string("resilience::") + policy;
    if (!name.empty())
        label += " (" + name + ")";
    return label;
}

} // namespace detail

/// Says which outcomes a policy handles: the `should_handle` of `retry` (which outcomes to retry),
/// `circuit_breaker` (which count as failures) and `fallback` (which get the substitute). One
/// object may be given to all three. Type-erased, so options stay plain aggregates. Built from:
/// - nothing: empty; each policy then applies its own default (retry: `is_transient`; breaker and
///   fallback: every failure but cancellation). Values are never handled;
/// - a callable taking `const failure&`: sees failures only; values are never handled;
/// - a callable whose one parameter is spelled `outcome<T>` (or `const outcome<T>&`), e.g.
///   `[](const rs::outcome<response>& o) { return !o || o.value().status == 503; }`: sees values
///   and failures, so a returned value can be retried, counted against the breaker, or replaced by
///   the fallback. `T` is read from the parameter, so the callable must not be generic (a generic
///   lambda is taken as a failure classifier).
/// Each returns `bool` or a `verdict` (whose `delay` only a retry reads).
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
    /// The `T` of an `outcome<T>` classifier, or null.
    [[nodiscard]] const std::type_info* value_type() const noexcept { return value_type_; }
    /// Can this classifier judge the outcomes of an action returning `R`?
    template <class R>
    [[nodiscard]] bool accepts() const noexcept {
        return value_type_ == nullptr || *value_type_ == typeid(R);
    }

    /// Judges one outcome; an empty classifier answers `otherwise(failure)` for a failure and "not
    /// handled" for a value. Precondition: `accepts<T>()`. Whatever the callable throws propagates.
    template <class T, class Otherwise>
    [[nodiscard]] verdict classify(const outcome<T>& o, const Otherwise& otherwise) const {
        if (value_type_)
            return model_->classify_outcome(&o);
        if (o.has_value())
            return {};
        if (model_)
            return model_->classify_failure(o.error());
        return verdict{.handle = static_cast<bool>(otherwise(o.error())), .delay = std::nullopt};
    }

    /// The failure reported when an action returning `R` meets an outcome classifier of another
    /// type: "resilience::retry: should_handle classifies rs::outcome<long> but the action returns
    /// int" (`policy` is "retry", the name of the policy kind; `name` its `name` option, if any).
    template <class R>
    [[nodiscard]] failure mismatch(const char* policy = "retry", const std::string& name = {}) const {
        return failure::make(std::invalid_argument(
            detail::policy_label(policy, name) + ": should_handle classifies rs::outcome<" +
            detail::type_name(*value_type_) + "> but the action returns " + detail::type_name(typeid(R))));
    }

private:
    std::shared_ptr<const detail::classifier_model> model_;
    const std::type_info* value_type_ = nullptr;
};

} // namespace resilience
