// SPDX-License-Identifier: MIT
/// \file outcome.hpp
/// `failure` (a held exception) and `outcome<T>` (a value or a failure).
#pragma once

#include "detail/config.hpp"
#include "detail/inlining.hpp"
#include "error.hpp"

#include <cassert>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <variant>
#include <version>

#if defined(__cpp_lib_expected) && __cpp_lib_expected >= 202202L
#include <expected>
/// 1 when `<expected>` is available: `outcome<T>::to_expected()` exists only then.
#define RESILIENCE_HAS_STD_EXPECTED 1
#else
#define RESILIENCE_HAS_STD_EXPECTED 0
#endif

namespace resilience::inline v0_2 {

/// A failed call: owns the exception (by `std::exception_ptr`, so copies share it). Asking what it
/// holds (`is`, `as`) rethrows and catches internally, so it costs an exception; `code()` does not.
/// Failures the library creates itself carry their `errc`, which `code()` reads for free.
class failure {
public:
    failure() = default; ///< empty; only for containers. `has_exception()` is false.
    explicit failure(std::exception_ptr e) noexcept : ptr_(std::move(e)) {}
    failure(std::exception_ptr e, errc code) noexcept : ptr_(std::move(e)), code_(code) {}

    /// Makes a failure holding `e` without throwing it.
    template <class E>
    [[nodiscard]] static failure make(E e) {
        errc code{};
        if constexpr (std::is_base_of_v<error, E>)
            code = static_cast<errc>(e.code().value());
        return failure{std::make_exception_ptr(std::move(e)), code};
    }
    /// The exception being handled (call inside a `catch`).
    [[nodiscard]] static failure current() noexcept { return failure{std::current_exception()}; }

    [[nodiscard]] const std::exception_ptr& exception() const noexcept { return ptr_; }
    [[nodiscard]] bool has_exception() const noexcept { return ptr_ != nullptr; }

    /// The library's `errc` when the library made this failure itself, else an empty value.
    [[nodiscard]] errc code() const noexcept { return code_; }

    /// Does the held exception derive from (or equal) `E`?
    template <class E>
    [[nodiscard]] bool is() const noexcept {
        return as<E>() != nullptr;
    }
    /// The held exception as `E`, or null. The pointer lives as long as any copy of this failure.
    template <class E>
    [[nodiscard]] const E* as() const noexcept {
        if (!ptr_)
            return nullptr;
        try {
            std::rethrow_exception(ptr_);
        } catch (const E& e) {
            return &e;
        } catch (...) {
            return nullptr;
        }
    }
    /// A short description: the `what()` of a `std::exception`, otherwise "unknown exception".
    [[nodiscard]] std::string what() const {
        if (auto* e = as<std::exception>())
            return e->what();
        return ptr_ ? "unknown exception" : "no failure";
    }

    [[noreturn]] void rethrow() const {
        if (!ptr_)
            throw std::logic_error("resilience::failure: rethrow of an empty failure");
        std::rethrow_exception(ptr_);
    }

private:
    std::exception_ptr ptr_;
    errc code_{};
};

/// True for failures that mean "the caller gave up": `cancelled_error`. Never retried, never
/// counted against a dependency.
[[nodiscard]] inline bool is_cancellation(const failure& f) noexcept {
    // A failure the library made carries its code: answered without rethrowing.
    if (f.code() != errc{})
        return f.code() == errc::cancelled;
    return f.is<cancelled_error>();
}

template <class T>
class outcome;

template <class T>
inline constexpr bool is_outcome_v = false;
template <class T>
inline constexpr bool is_outcome_v<outcome<T>> = true;

/// A value of `T` or a `failure`: what classifiers look at and what `execute_outcome` returns, so
/// a rejected call can be reported without throwing. `outcome<void>` holds no value.
///
/// Read like `std::expected<T, failure>`: `has_value()` / `has_failure()`, `value()` (checked:
/// rethrows the failure unchanged), `*o` and `o->` (unchecked, asserted as for `std::optional`),
/// `value_or`, `failure()` (also spelt `error()`, as in `std::expected`), and the monadic
/// `transform`, `and_then`, `or_else`, `transform_error`, which pass the other side through
/// untouched. Functions given to these run on the caller's thread and their exceptions propagate,
/// as with the standard types.
template <class T>
class [[nodiscard]] outcome {
    using stored = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

public:
    using value_type = T;
    using failure_type = resilience::failure;
    using error_type = resilience::failure; ///< the `std::expected` spelling of `failure_type`

    outcome()
    requires std::is_void_v<T>
        : data_(std::in_place_index<0>) {}
    template <class U = stored>
    requires(!std::is_void_v<T> && std::is_constructible_v<stored, U &&> &&
             !std::is_same_v<std::remove_cvref_t<U>, outcome> &&
             !std::is_same_v<std::remove_cvref_t<U>, resilience::failure>)
    outcome(U&& v) : data_(std::in_place_index<0>, std::forward<U>(v)) {}
    outcome(resilience::failure f) : data_(std::in_place_index<1>, std::move(f)) {}

    [[nodiscard]] bool has_value() const noexcept { return data_.index() == 0; }
    [[nodiscard]] bool has_failure() const noexcept { return data_.index() == 1; }
    explicit operator bool() const noexcept { return has_value(); }

    /// The value; rethrows the failure unchanged when there is none.
    decltype(auto) value() & { return get(*this); }
    decltype(auto) value() const& { return get(*this); }
    decltype(auto) value() && { return get(std::move(*this)); }

    /// The value, or `fallback` converted to `T` when this holds a failure. Never throws for
    /// the failure (only what copying or converting the value throws).
    template <class U>
    requires(!std::is_void_v<T>)
    [[nodiscard]] T value_or(U&& fallback) const& {
        static_assert(std::is_copy_constructible_v<T> && std::is_convertible_v<U&&, T>,
                      "outcome<T>::value_or needs a copyable T and a fallback convertible to T");
        if (has_value())
            return std::get<0>(data_);
        return static_cast<T>(std::forward<U>(fallback));
    }
    template <class U>
    requires(!std::is_void_v<T>)
    [[nodiscard]] T value_or(U&& fallback) && {
        static_assert(std::is_move_constructible_v<T> && std::is_convertible_v<U&&, T>,
                      "outcome<T>::value_or needs a movable T and a fallback convertible to T");
        if (has_value())
            return std::get<0>(std::move(data_));
        return static_cast<T>(std::forward<U>(fallback));
    }

    /// The value, unchecked: precondition `has_value()`, asserted in debug builds only (the
    /// `std::optional` convention). Use `value()` when a failure is possible: it rethrows it.
    template <class U = T>
    requires(!std::is_void_v<U>)
    [[nodiscard]] U& operator*() & noexcept {
        assert(has_value());
        return *std::get_if<0>(&data_);
    }
    template <class U = T>
    requires(!std::is_void_v<U>)
    [[nodiscard]] const U& operator*() const& noexcept {
        assert(has_value());
        return *std::get_if<0>(&data_);
    }
    template <class U = T>
    requires(!std::is_void_v<U>)
    [[nodiscard]] U&& operator*() && noexcept {
        assert(has_value());
        return std::move(*std::get_if<0>(&data_));
    }
    /// `outcome<void>`: asserts `has_value()`, as `std::expected<void, E>` does.
    void operator*() const& noexcept
    requires std::is_void_v<T>
    {
        assert(has_value());
    }
    /// Member access to the value, unchecked like `operator*`.
    template <class U = T>
    requires(!std::is_void_v<U>)
    [[nodiscard]] U* operator->() noexcept {
        assert(has_value());
        return std::get_if<0>(&data_);
    }
    template <class U = T>
    requires(!std::is_void_v<U>)
    [[nodiscard]] const U* operator->() const noexcept {
        assert(has_value());
        return std::get_if<0>(&data_);
    }

    /// The failure. Precondition: `has_failure()` (checked: throws `std::logic_error` otherwise).
    [[nodiscard]] const resilience::failure& failure() const {
        if (!has_failure())
            throw std::logic_error("resilience::outcome: failure() on a value");
        return std::get<1>(data_);
    }
    /// The failure, by its `std::expected` name: the same as `failure()`.
    [[nodiscard]] const resilience::failure& error() const {
        if (!has_failure())
            throw std::logic_error("resilience::outcome: error() on a value");
        return std::get<1>(data_);
    }

    /// `outcome<U>` holding `f(value)` (`f()` for `outcome<void>`), or this failure unchanged;
    /// `U` is what `f` returns, without cv or reference (`void` gives `outcome<void>`).
    template <class F>
    auto transform(F&& f) & {
        return transform_impl(*this, std::forward<F>(f));
    }
    template <class F>
    auto transform(F&& f) const& {
        return transform_impl(*this, std::forward<F>(f));
    }
    template <class F>
    auto transform(F&& f) && {
        return transform_impl(std::move(*this), std::forward<F>(f));
    }

    /// `f(value)` (`f()` for `outcome<void>`), which must return an `outcome<U>`, or this failure
    /// unchanged as an `outcome<U>`: chains steps that may each fail.
    template <class F>
    auto and_then(F&& f) & {
        return and_then_impl(*this, std::forward<F>(f));
    }
    template <class F>
    auto and_then(F&& f) const& {
        return and_then_impl(*this, std::forward<F>(f));
    }
    template <class F>
    auto and_then(F&& f) && {
        return and_then_impl(std::move(*this), std::forward<F>(f));
    }

    /// This value unchanged, or `f(failure)`, which must return an `outcome<T>`: recovers from
    /// (or replaces) a failure.
    template <class F>
    outcome or_else(F&& f) const& {
        static_assert(
            std::is_same_v<std::remove_cvref_t<std::invoke_result_t<F, const resilience::failure&>>, outcome>,
            "outcome<T>::or_else: f(failure) must return outcome<T>");
        if (has_failure())
            return std::invoke(std::forward<F>(f), std::get<1>(data_));
        return *this;
    }
    template <class F>
    outcome or_else(F&& f) && {
        static_assert(
            std::is_same_v<std::remove_cvref_t<std::invoke_result_t<F, resilience::failure&&>>, outcome>,
            "outcome<T>::or_else: f(failure) must return outcome<T>");
        if (has_failure())
            return std::invoke(std::forward<F>(f), std::get<1>(std::move(data_)));
        return std::move(*this);
    }

    /// This value unchanged, or the failure `f(failure)` returns (to wrap or translate it).
    template <class F>
    outcome transform_error(F&& f) const& {
        static_assert(
            std::is_convertible_v<std::invoke_result_t<F, const resilience::failure&>, resilience::failure>,
            "outcome<T>::transform_error: f(failure) must return a failure");
        if (has_failure())
            return outcome{resilience::failure(std::invoke(std::forward<F>(f), std::get<1>(data_)))};
        return *this;
    }
    template <class F>
    outcome transform_error(F&& f) && {
        static_assert(
            std::is_convertible_v<std::invoke_result_t<F, resilience::failure&&>, resilience::failure>,
            "outcome<T>::transform_error: f(failure) must return a failure");
        if (has_failure())
            return outcome{
                resilience::failure(std::invoke(std::forward<F>(f), std::get<1>(std::move(data_))))};
        return std::move(*this);
    }

#if RESILIENCE_HAS_STD_EXPECTED
    /// The same state as a `std::expected`, the failure as its `std::exception_ptr` (the `errc`
    /// that `failure::code()` reads is not kept). Only where the standard library has `<expected>`.
    [[nodiscard]] std::expected<T, std::exception_ptr> to_expected() const& {
        if (has_failure())
            return std::unexpected(std::get<1>(data_).exception());
        if constexpr (std::is_void_v<T>)
            return {};
        else
            return std::expected<T, std::exception_ptr>(std::in_place, std::get<0>(data_));
    }
    [[nodiscard]] std::expected<T, std::exception_ptr> to_expected() && {
        if (has_failure())
            return std::unexpected(std::get<1>(data_).exception());
        if constexpr (std::is_void_v<T>)
            return {};
        else
            return std::expected<T, std::exception_ptr>(std::in_place, std::get<0>(std::move(data_)));
    }
#endif

private:
    template <class Self>
    static decltype(auto) get(Self&& self) {
        if (self.data_.index() == 1)
            std::get<1>(self.data_).rethrow();
        if constexpr (std::is_void_v<T>)
            return;
        else
            return std::get<0>(std::forward<Self>(self).data_);
    }

    // f(value), or f() when there is none to give.
    template <class Self, class F>
    static decltype(auto) call_with_value(Self&& self, F&& f) {
        if constexpr (std::is_void_v<T>)
            return std::invoke(std::forward<F>(f));
        else
            return std::invoke(std::forward<F>(f), std::get<0>(std::forward<Self>(self).data_));
    }

    template <class Self, class F>
    static auto transform_impl(Self&& self, F&& f) {
        using U =
            std::remove_cvref_t<decltype(call_with_value(std::forward<Self>(self), std::forward<F>(f)))>;
        static_assert(!std::is_same_v<U, resilience::failure>,
                      "outcome<T>::transform: f returns a failure; use and_then with an outcome instead");
        if (self.has_failure())
            return outcome<U>{std::get<1>(std::forward<Self>(self).data_)};
        if constexpr (std::is_void_v<U>) {
            call_with_value(std::forward<Self>(self), std::forward<F>(f));
            return outcome<U>{};
        } else {
            return outcome<U>(call_with_value(std::forward<Self>(self), std::forward<F>(f)));
        }
    }

    template <class Self, class F>
    static auto and_then_impl(Self&& self, F&& f) {
        using R =
            std::remove_cvref_t<decltype(call_with_value(std::forward<Self>(self), std::forward<F>(f)))>;
        static_assert(is_outcome_v<R>, "outcome<T>::and_then: f must return an outcome<U>");
        if (self.has_failure())
            return R{std::get<1>(std::forward<Self>(self).data_)};
        return R(call_with_value(std::forward<Self>(self), std::forward<F>(f)));
    }

    std::variant<stored, resilience::failure> data_;
};

namespace detail {

/// A `cancelled_error` from the policy named `name`, as a failure. Not a template: made once, whatever
/// the result type of the call it ends (`kit::cancel` puts it in a call's result).
RESILIENCE_DECL failure cancelled_failure(std::string_view name);

/// `r` as an `outcome<T>`, for a policy that keeps or shares a `T` (a cache, a single flight) and runs
/// an action producing anything convertible to it: a failure is kept, a value converted (a conversion
/// that throws becomes the failure).
template <class T, class R>
outcome<T> converted_outcome(outcome<R>&& r) {
    if constexpr (std::is_same_v<R, T>) {
        return std::move(r);
    } else {
        if (r.has_failure())
            return r.error();
        try {
            return outcome<T>(static_cast<T>(std::move(*r)));
        } catch (...) {
            return failure::current();
        }
    }
}

/// The value of an outcome an event refers to, with its type erased: what `retry_event::value<T>()`
/// and `fallback_event::value<T>()` read. Empty for a failure or a `void` value.
class value_view {
public:
    value_view() noexcept = default;
    value_view(const void* value, const std::type_info* type) noexcept : value_(value), type_(type) {}
    template <class R>
    static value_view of(const outcome<R>& result) noexcept {
        if constexpr (!std::is_void_v<R>)
            if (result.has_value())
                return {std::addressof(result.value()), &typeid(R)};
        return {};
    }

    /// The value, if it is of type `T`; otherwise null.
    template <class T>
    [[nodiscard]] const T* get() const noexcept {
        if constexpr (std::is_void_v<T>)
            return nullptr;
        else
            return type_ && *type_ == typeid(T) ? static_cast<const T*>(value_) : nullptr;
    }

private:
    const void* value_ = nullptr;
    const std::type_info* type_ = nullptr;
};

} // namespace detail

} // namespace resilience

#if RESILIENCE_INCLUDE_DEFINITIONS
#include "impl/outcome.ipp"
#endif
