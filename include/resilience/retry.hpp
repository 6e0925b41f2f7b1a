// SPDX-License-Identifier: MIT
/// \file retry.hpp
/// `retry`: runs an action again after a failure (or a rejected value), waiting out a backoff between tries.
#pragma once

#include "backoff.hpp"
#include "clock.hpp"
#include "concepts.hpp"
#include "context.hpp"
#include "detail/time.hpp"
#include "error.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "random.hpp"
#include "retry_budget.hpp"
#include "task.hpp"

#include <algorithm>
#include <chrono>
#include <concepts>
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

/// A classifier's answer: try again or not, and optionally how long to wait first. A `delay`
/// (an HTTP Retry-After, say) replaces the backoff for that wait, capped by `retry_options::max_delay`;
/// a negative one means no wait.
///
///     return rs::verdict{.retry = true, .delay = 5s};
struct verdict {
    bool retry = false;
    std::optional<std::chrono::nanoseconds> delay{};
};

/// The default classification of a failure: worth retrying, unless retrying cannot help or the
/// caller gave up. Not transient: `cancelled_error`, `circuit_open_error` (the breaker refuses on
/// purpose; retrying would only spin against it), and `std::logic_error` and everything derived
/// from it (a bug or a bad argument fails the same way every time). Costs one rethrow.
inline bool is_transient(const failure& f) noexcept {
    if (!f.has_exception())
        return false;
    if (f.code() == errc::cancelled || f.code() == errc::circuit_open)
        return false;
    if (f.code() != errc{})
        return true; // the library's other failures (timeout, rejections) are transient: no rethrow needed
    try {
        f.rethrow();
    } catch (const cancelled_error&) {
        return false;
    } catch (const circuit_open_error&) {
        return false;
    } catch (const std::logic_error&) {
        return false;
    } catch (...) {
        return true;
    }
}

class retry_classifier;

namespace detail {

template <class T>
struct outcome_parameter : std::false_type {};
template <class T>
struct outcome_parameter<outcome<T>> : std::true_type {
    using value_type = T;
};

// The single parameter of a non-overloaded, non-generic call operator or of a function pointer.
template <class M>
struct sole_parameter_of {};
template <class Ret, class Cls, class A>
struct sole_parameter_of<Ret (Cls::*)(A) const> {
    using type = A;
};
template <class Ret, class Cls, class A>
struct sole_parameter_of<Ret (Cls::*)(A) const noexcept> {
    using type = A;
};
template <class Ret, class A>
struct sole_parameter_of<Ret (*)(A)> {
    using type = A;
};
template <class Ret, class A>
struct sole_parameter_of<Ret (*)(A) noexcept> {
    using type = A;
};

template <class F>
struct sole_parameter : sole_parameter_of<F> {};
template <class F>
requires requires {
    &F::operator();
}
struct sole_parameter<F> : sole_parameter_of<decltype(&F::operator())> {};

template <class F>
concept has_sole_parameter = requires {
    typename sole_parameter<F>::type;
};

template <class R>
concept verdict_like = std::same_as<std::remove_cvref_t<R>, verdict> || std::convertible_to<R, bool>;

template <class F, bool = has_sole_parameter<F>>
struct classified_value {
    static constexpr bool value = false;
};
template <class F>
struct classified_value<F, true> {
    using parameter = std::remove_cvref_t<typename sole_parameter<F>::type>;
    static constexpr bool value = outcome_parameter<parameter>::value;
};

template <class F, class P>
concept classifier_of =
    std::invocable<const F&, const P&> && verdict_like<std::invoke_result_t<const F&, const P&>>;

/// A callable whose one parameter is spelled `outcome<T>` (by value or const reference).
template <class F>
concept outcome_classifier =
    classified_value<F>::value && classifier_of<F, typename classified_value<F>::parameter>;

template <class F>
concept failure_classifier = classifier_of<F, failure>;

template <class F>
concept classifier_shape = outcome_classifier<F> || failure_classifier<F>;

// What `retry_classifier` accepts. The outcome form is tried first, because a failure also
// converts to any `outcome<T>`; `retry_classifier` itself is excluded first, so that asking
// whether it is one does not recurse through its own copy constructor.
template <class F>
concept classifier_callable =
    !std::same_as<F, retry_classifier> && std::copy_constructible<F> && classifier_shape<F>;

template <class R>
verdict to_verdict(R&& r) {
    if constexpr (std::same_as<std::remove_cvref_t<R>, verdict>)
        return std::forward<R>(r);
    else
        return verdict{.retry = static_cast<bool>(std::forward<R>(r)), .delay = std::nullopt};
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

} // namespace detail

/// Decides which outcomes are worth another attempt; type-erased so `retry_options` stays a plain
/// aggregate. Built from one of:
/// - nothing: `is_transient` (failures only; every value is a success);
/// - a callable taking `const failure&`: sees failures only; values always succeed;
/// - a callable whose one parameter is spelled `outcome<T>` (or `const outcome<T>&`), e.g.
///   `[](const rs::outcome<response>& o) { return !o || o.value().status == 503; }`: sees values
///   and failures, so a returned value can be retried. `T` is read from the parameter, so the
///   callable must not be generic (a generic lambda is taken as a failure classifier).
/// Each returns `bool` or a `verdict`. It is asked only when another attempt could follow: not
/// after the last attempt, not once the caller asked to stop, and never about cancellation, which
/// is not retried whatever it would say. An exception it throws ends the call with that exception.
/// An outcome classifier works only with actions whose result type is
/// exactly `T`; any other action makes the call fail at once with `std::invalid_argument` naming
/// both types (the options are not a template, so this cannot be checked at compile time).
/// Copies share the callable, which must be callable as `const` and safe to call concurrently.
class retry_classifier {
public:
    retry_classifier() noexcept = default;

    // Implicit on purpose, so that `.retry_if = [](const rs::failure& f) {...}` reads well.
    template <detail::classifier_callable F>
    retry_classifier(F f) {
        if constexpr (detail::outcome_classifier<F>) {
            using T = typename detail::outcome_parameter<
                typename detail::classified_value<F>::parameter>::value_type;
            model_ = std::make_shared<const detail::outcome_classifier_impl<F, T>>(std::move(f));
            value_type_ = &typeid(T);
        } else {
            model_ = std::make_shared<const detail::failure_classifier_impl<F>>(std::move(f));
        }
    }

    /// True when the classifier looks at returned values (an `outcome<T>` classifier).
    bool sees_values() const noexcept { return value_type_ != nullptr; }
    /// The `T` of an `outcome<T>` classifier, or null.
    const std::type_info* value_type() const noexcept { return value_type_; }
    /// Can this classifier judge the outcomes of an action returning `R`?
    template <class R>
    bool accepts() const noexcept {
        return value_type_ == nullptr || *value_type_ == typeid(R);
    }

    /// Classifies one outcome. Precondition: `accepts<T>()`.
    template <class T>
    verdict classify(const outcome<T>& o) const {
        if (o.has_failure() && is_cancellation(o.error()))
            return {};
        if (value_type_)
            return model_->classify_outcome(&o);
        if (o.has_value())
            return {};
        if (model_)
            return model_->classify_failure(o.error());
        return verdict{.retry = is_transient(o.error()), .delay = std::nullopt};
    }

    /// The failure reported when an action returning `R` meets an outcome classifier of another type.
    template <class R>
    failure mismatch() const {
        return failure::make(std::invalid_argument(
            "resilience::retry: retry_if classifies rs::outcome<" + detail::type_name(*value_type_) +
            "> but the action returns " + detail::type_name(typeid(R))));
    }

private:
    std::shared_ptr<const detail::classifier_model> model_;
    const std::type_info* value_type_ = nullptr;
};

/// What a retry reports to `on_retry` and `on_budget_exhausted`. Refers to the call's own
/// outcome: valid only during the callback; copy what you need to keep.
class retry_event {
public:
    retry_event(int attempt, const failure* error, std::chrono::nanoseconds delay,
                const void* value = nullptr, const std::type_info* value_type = nullptr) noexcept
        : attempt_(attempt), error_(error), delay_(delay), value_(value), value_type_(value_type) {}

    /// The attempt that just ended (1-based).
    int attempt() const noexcept { return attempt_; }
    /// Its failure; null when it returned a value the classifier rejected (see `value<T>()`).
    const failure* error() const noexcept { return error_; }
    /// The wait before the next attempt (`on_retry`); zero for `on_budget_exhausted`, where no
    /// attempt follows.
    std::chrono::nanoseconds delay() const noexcept { return delay_; }
    /// The value the attempt returned, if it returned one of type `T`; otherwise null.
    template <class T>
    const T* value() const noexcept {
        if constexpr (std::is_void_v<T>)
            return nullptr;
        else
            return value_type_ && *value_type_ == typeid(T) ? static_cast<const T*>(value_) : nullptr;
    }

private:
    int attempt_;
    const failure* error_;
    std::chrono::nanoseconds delay_;
    const void* value_;
    const std::type_info* value_type_;
};

struct retry_options {
    /// Attempts in all, counting the first: `1` never retries. Must be at least 1.
    int max_attempts = 3;
    /// The wait before each retry. Default: `exponential_backoff{}` = 200ms, x2, capped at 30s,
    /// full jitter. Validated when assigned (see `backoff`).
    resilience::backoff backoff{};
    /// Which outcomes to retry (see `retry_classifier`). Default: `is_transient` failures.
    retry_classifier retry_if{};
    /// No attempt is started once the wait before it would carry the call past this, measured
    /// from the start of the first attempt. Zero: unbounded. Must not be negative.
    std::chrono::nanoseconds max_elapsed{};
    /// Cap on a verdict's `delay` (a server asking for an hour does not park the caller for an
    /// hour). Does not apply to the backoff, which has its own `max`. Must not be negative.
    std::chrono::nanoseconds max_delay = std::chrono::seconds{30};
    /// Shared ceiling on retries: each call records itself, each retry withdraws a token first,
    /// and without one the loop ends.
    std::optional<retry_budget> budget{};
    /// Called before each wait. Runs on the caller's coroutine; must not block. An exception
    /// thrown here ends the call with that exception.
    std::function<void(const retry_event&)> on_retry{};
    /// Called when `budget` refused a retry the classifier wanted; the last outcome is then returned.
    std::function<void(const retry_event&)> on_budget_exhausted{};
};

/// Runs an action again after a failure, waiting out a backoff in between, until it succeeds or
/// one of these ends the loop:
/// - `max_attempts` attempts were made;
/// - `retry_if` said no (cancellation is never retried);
/// - `budget` had no token left (`on_budget_exhausted` is told);
/// - the wait before the next attempt would carry the call past `max_elapsed`;
/// - the caller asked to stop: at once, also in the middle of a backoff wait.
/// Whatever ended it, the last outcome is what the call produces: the last failure exactly as it
/// was (the same exception object), or, for an outcome classifier, the last value it rejected.
/// A stop requested before the first attempt yields `cancelled_error` without calling the action.
///
/// Each attempt sees `ctx.with_attempt(n)` (n = 1, 2, ...). The success path calls no
/// `std::function`, touches no type-erased object and allocates nothing; the backoff, the
/// classifier and the callbacks are consulted only after an attempt failed (an outcome
/// classifier, which judges values, is the one exception: it is asked about successes too).
/// Decorrelated jitter needs the previous wait of the same call: the retry keeps it in the
/// call's own frame, so one retry serves any number of concurrent calls.
///
/// A stateless value, copied freely, except for its random source `Random`: the default
/// `thread_random` is safe to share across threads, but a retry given a stateful generator
/// (`seeded_random`) mutates it on every jittered wait and must not be used from two threads
/// at once. `C` serves every use of time. The retry must outlive the calls made through it:
///
///     rs::retry r{{.max_attempts = 3}};
///     int v = co_await r.execute(fetch);                           // OK: r outlives the call
///     rs::task<int> bad() { return rs::retry{}.execute(fetch); }   // dangling: the retry dies first
template <clock C = steady_clock, random_source Random = thread_random>
class retry : public policy_base<retry<C, Random>> {
public:
    retry() : retry(retry_options{}) {}
    /// Validates `options`: a bad value throws `std::invalid_argument` naming the field and value.
    explicit retry(retry_options options, C clock = C{}, Random rng = Random{})
        : options_(std::move(options)), clock_(std::move(clock)), rng_(std::move(rng)) {
        if (options_.max_attempts < 1)
            throw std::invalid_argument("resilience::retry: max_attempts must be at least 1, got " +
                                        std::to_string(options_.max_attempts));
        if (options_.max_elapsed < std::chrono::nanoseconds::zero())
            throw std::invalid_argument("resilience::retry: max_elapsed must not be negative, got " +
                                        std::to_string(options_.max_elapsed.count()) + "ns");
        if (options_.max_delay < std::chrono::nanoseconds::zero())
            throw std::invalid_argument("resilience::retry: max_delay must not be negative, got " +
                                        std::to_string(options_.max_delay.count()) + "ns");
    }

    const retry_options& options() const noexcept { return options_; }
    const C& clock() const noexcept { return clock_; }

    // ---- the policy protocol (see policy.hpp) ----
    static constexpr bool enter_never_waits = true;
    struct call_state {
        context inner; // attempt 1, when the context coming in says otherwise
        typename C::time_point start{};
    };

    template <class R>
    step enter(call_state& s, const context& ctx, const context*& inner, std::optional<outcome<R>>& result) const {
        if (ctx.stop_requested()) {
            result.emplace(failure::make(cancelled_error{}));
            return step::done;
        }
        if (!options_.retry_if.template accepts<R>()) {
            result.emplace(options_.retry_if.template mismatch<R>());
            return step::done;
        }
        if (options_.budget)
            options_.budget->record_call();
        // Only max_elapsed needs the start.
        if (options_.max_elapsed > std::chrono::nanoseconds::zero())
            s.start = detail::call_now(clock_, ctx);
        if (ctx.attempt() != 1) {
            s.inner = detail::context_access::derive_attempt(ctx, 1);
            inner = &s.inner;
        }
        return step::proceed;
    }

    /// A success that nobody needs to judge ends here; anything else goes on in `resume`.
    template <class R>
    step leave(call_state&, const context&, const outcome<R>& result) const noexcept {
        return result.has_value() && !options_.retry_if.sees_values() ? step::proceed : step::wait;
    }

    /// The retry loop after the first attempt ended with `result`.
    template <class Next, class R>
    task<outcome<R>> resume(call_state& s, Next next, const context& ctx, outcome<R> result) const {
        std::chrono::nanoseconds previous{};
        for (int attempt = 1;; ++attempt) {
            if (attempt > 1) {
                const context child = detail::context_access::derive_attempt(ctx, attempt);
                result = co_await next(child);
                if (result.has_value() && !options_.retry_if.sees_values())
                    co_return std::move(result);
            }

            std::optional<std::chrono::nanoseconds> wait;
            std::optional<failure> thrown; // by the classifier or a callback: it ends the call
            try {
                wait = plan(result, attempt, ctx, s.start, previous);
            } catch (...) {
                thrown.emplace(failure::current());
            }
            if (thrown)
                co_return outcome<R>{std::move(*thrown)};
            if (!wait)
                co_return std::move(result);

            if (*wait > std::chrono::nanoseconds::zero())
                co_await clock_.sleep_until(after(*wait), ctx.stop_token());
            if (ctx.stop_requested())
                co_return std::move(result);
            previous = *wait;
        }
    }

private:
    // The failure path: decides whether another attempt follows and after what wait (nullopt: the
    // loop ends with `result`). Tells the callbacks.
    template <class T>
    std::optional<std::chrono::nanoseconds> plan(const outcome<T>& result, int attempt, const context& ctx,
                                                 typename C::time_point start,
                                                 std::chrono::nanoseconds previous) const {
        if (ctx.stop_requested() || attempt >= options_.max_attempts)
            return std::nullopt;
        const verdict v = options_.retry_if.classify(result);
        if (!v.retry)
            return std::nullopt;

        const failure* error = result.has_failure() ? &result.error() : nullptr;
        const void* value = nullptr;
        const std::type_info* value_type = nullptr;
        if constexpr (!std::is_void_v<T>) {
            if (result.has_value()) {
                value = std::addressof(result.value());
                value_type = &typeid(T);
            }
        }

        std::chrono::nanoseconds delay;
        if (v.delay) {
            delay = std::clamp(*v.delay, std::chrono::nanoseconds::zero(), options_.max_delay);
        } else {
            delay = options_.backoff.delay(attempt, rng_, error ? *error : failure{}, previous);
        }
        if (options_.max_elapsed > std::chrono::nanoseconds::zero()) {
            const auto elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(clock_.now() - start);
            if (delay > options_.max_elapsed - elapsed)
                return std::nullopt;
        }
        if (options_.budget && !options_.budget->try_withdraw()) {
            if (options_.on_budget_exhausted)
                options_.on_budget_exhausted(
                    retry_event{attempt, error, std::chrono::nanoseconds::zero(), value, value_type});
            return std::nullopt;
        }
        if (options_.on_retry)
            options_.on_retry(retry_event{attempt, error, delay, value, value_type});
        return delay;
    }

    // now + d on the clock, rounded up to its tick, saturating at the clock's end.
    typename C::time_point after(std::chrono::nanoseconds d) const {
        return detail::add_saturating(clock_.now(), d);
    }

    retry_options options_;
    C clock_;
    mutable Random rng_; // jitter draws on the failure path of a const `run`
};

retry()->retry<steady_clock, thread_random>;
retry(retry_options)->retry<steady_clock, thread_random>;
template <clock C>
retry(retry_options, C) -> retry<C, thread_random>;
template <clock C, random_source R>
retry(retry_options, C, R) -> retry<C, R>;

} // namespace resilience
