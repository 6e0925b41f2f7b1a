// SPDX-License-Identifier: MIT
/// \file outcome.hpp
/// `failure` (a held exception) and `outcome<T>` (a value or a failure).
#pragma once

#include "error.hpp"

#include <cassert>
#include <exception>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <variant>

namespace resilience {

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
    static failure make(E e) {
        errc code{};
        if constexpr (std::is_base_of_v<error, E>)
            code = static_cast<errc>(e.code().value());
        return failure{std::make_exception_ptr(std::move(e)), code};
    }
    /// The exception being handled (call inside a `catch`).
    static failure current() noexcept { return failure{std::current_exception()}; }

    const std::exception_ptr& exception() const noexcept { return ptr_; }
    bool has_exception() const noexcept { return ptr_ != nullptr; }

    /// The library's `errc` when the library made this failure itself, else an empty value.
    errc code() const noexcept { return code_; }

    /// Does the held exception derive from (or equal) `E`?
    template <class E>
    bool is() const noexcept {
        return as<E>() != nullptr;
    }
    /// The held exception as `E`, or null. The pointer lives as long as any copy of this failure.
    template <class E>
    const E* as() const noexcept {
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
    std::string what() const {
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
inline bool is_cancellation(const failure& f) noexcept {
    // A failure the library made carries its code: answered without rethrowing.
    if (f.code() != errc{})
        return f.code() == errc::cancelled;
    return f.is<cancelled_error>();
}

/// A value of `T` or a `failure`. What classifiers look at and what `execute_outcome` returns,
/// so a rejected call can be reported without throwing. `outcome<void>` holds no value.
template <class T>
class outcome {
    using stored = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

public:
    using value_type = T;

    outcome() requires std::is_void_v<T> : data_(std::in_place_index<0>) {}
    template <class U = stored>
    requires(!std::is_void_v<T> && std::is_constructible_v<stored, U&&> &&
             !std::is_same_v<std::remove_cvref_t<U>, outcome> &&
             !std::is_same_v<std::remove_cvref_t<U>, failure>) outcome(U&& v)
        : data_(std::in_place_index<0>, std::forward<U>(v)) {}
    outcome(failure f) : data_(std::in_place_index<1>, std::move(f)) {}

    bool has_value() const noexcept { return data_.index() == 0; }
    bool has_failure() const noexcept { return data_.index() == 1; }
    explicit operator bool() const noexcept { return has_value(); }

    /// The value; rethrows the failure unchanged when there is none.
    decltype(auto) value() & { return get(*this); }
    decltype(auto) value() const& { return get(*this); }
    decltype(auto) value() && { return get(std::move(*this)); }

    /// The failure. Precondition: `has_failure()` (checked: throws `std::logic_error` otherwise).
    const failure& error() const {
        if (!has_failure())
            throw std::logic_error("resilience::outcome: error() on a value");
        return std::get<1>(data_);
    }

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

    std::variant<stored, failure> data_;
};

template <class T>
inline constexpr bool is_outcome_v = false;
template <class T>
inline constexpr bool is_outcome_v<outcome<T>> = true;

} // namespace resilience
