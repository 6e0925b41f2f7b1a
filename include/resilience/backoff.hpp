// SPDX-License-Identifier: MIT
/// \file backoff.hpp
/// Backoff schedules (how long to wait before retry n), jitter, and `backoff`, the holder a retry keeps.
///
/// A schedule answers one question: the attempt numbered `attempt` (1-based) just failed; how long
/// should the caller wait before the next one? Every built-in schedule is a small aggregate with
///
///     std::chrono::nanoseconds delay(int attempt, Rng& rng) const;
///
/// computed in floating point with the cap applied before converting back, so no attempt number up
/// to `INT_MAX` overflows, wraps negative or collapses to zero, and jitter keeps its spread at the
/// cap. Options are validated when a schedule is wrapped in `backoff` (or asked for a delay): a bad
/// value throws `std::invalid_argument` naming the field and the value.
#pragma once

#include "concepts.hpp"
#include "outcome.hpp"
#include "random.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace resilience::inline v0_2 {

/// A type-erased reference to a random bit generator, so a schedule held by `backoff` can draw
/// from whichever generator the retry was given. A full 64-bit generator passes through unchanged;
/// others are rescaled (53 bits of them are kept). Refers to the generator, which must outlive it.
class random_ref {
public:
    using result_type = std::uint64_t;

    template <random_source R>
    requires(!std::same_as<std::remove_cvref_t<R>, random_ref>)
    random_ref(R& rng) noexcept
        : rng_(const_cast<void*>(static_cast<const void*>(std::addressof(rng)))), draw_(&draw<R>) {}

    static constexpr result_type min() noexcept { return 0; }
    static constexpr result_type max() noexcept { return std::numeric_limits<result_type>::max(); }
    result_type operator()() const { return draw_(rng_); }

private:
    template <class R>
    static result_type draw(void* p) {
        using G = std::remove_cvref_t<R>;
        R& rng = *static_cast<R*>(p);
        if constexpr (G::min() == 0 && G::max() == std::numeric_limits<result_type>::max()) {
            return static_cast<result_type>(rng());
        } else {
            // unit_random is below 1, so the product stays below 2^64.
            return static_cast<result_type>(detail::unit_random(rng) * 18446744073709551616.0);
        }
    }

    void* rng_;
    result_type (*draw_)(void*);
};

static_assert(random_source<random_ref>);

/// How a delay is spread at random, so clients that failed together do not retry together.
/// - `none`: the delay is exact;
/// - `full` (the default of every built-in schedule): uniform in `[0, d]`;
/// - `equal`: uniform in `[d/2, d]`;
/// - `proportional(f)`: uniform in `[d(1-f), d]`, `f` in `(0, 1]` (`full` is `f = 1`, `equal` `f = 0.5`);
/// - `decorrelated`: uniform in `[initial, 3 x previous delay]`, capped at `max`: each wait grows
///   from the last one actually taken rather than from the attempt number. Only `exponential_backoff`
///   supports it (it needs an `initial` and a `max`); its `factor` is then unused.
/// A small value; compare with `==`.
class jitter {
public:
    enum class mode { none, full, equal, proportional, decorrelated };

    static const jitter none;
    static const jitter full;
    static const jitter equal;
    static const jitter decorrelated;

    /// Spreads a delay `d` over `[d(1-f), d]`. Throws `std::invalid_argument` unless `0 < f <= 1`.
    static jitter proportional(double f) {
        if (!(f > 0.0 && f <= 1.0)) {
            std::ostringstream msg;
            msg << "resilience::jitter: proportional fraction must be in (0, 1], got " << f;
            throw std::invalid_argument(msg.str());
        }
        return jitter{mode::proportional, f};
    }

    constexpr mode kind() const noexcept { return mode_; }
    /// The share of the delay that is randomised: 0 for `none` and `decorrelated`, 1 for `full`,
    /// 0.5 for `equal`, `f` for `proportional(f)`.
    constexpr double fraction() const noexcept { return fraction_; }

    friend constexpr bool operator==(const jitter&, const jitter&) = default;

private:
    constexpr jitter(mode m, double f) noexcept : mode_(m), fraction_(f) {}

    mode mode_;
    double fraction_;
};

inline constexpr jitter jitter::none{jitter::mode::none, 0.0};
inline constexpr jitter jitter::full{jitter::mode::full, 1.0};
inline constexpr jitter jitter::equal{jitter::mode::equal, 0.5};
inline constexpr jitter jitter::decorrelated{jitter::mode::decorrelated, 0.0};

namespace detail {

inline std::string describe(std::chrono::nanoseconds d) {
    return std::to_string(d.count()) + "ns";
}
inline std::string describe(double v) {
    std::ostringstream out;
    out << v;
    return out.str();
}

[[noreturn]] inline void bad_backoff(const char* schedule, const std::string& what) {
    throw std::invalid_argument(std::string("resilience::") + schedule + ": " + what);
}
inline void require_non_negative(const char* schedule, const char* field, std::chrono::nanoseconds d) {
    if (d < std::chrono::nanoseconds::zero())
        bad_backoff(schedule, std::string(field) + " must not be negative, got " + describe(d));
}
inline void require_not_decorrelated(const char* schedule, const jitter& j) {
    if (j.kind() == jitter::mode::decorrelated)
        bad_backoff(schedule, "jitter decorrelated needs an initial and a max: use exponential_backoff");
}

/// `x` nanoseconds as a duration in `[0, cap]`; NaN and anything at or above the cap give the cap.
inline std::chrono::nanoseconds clamp_to_duration(double x, std::chrono::nanoseconds cap) noexcept {
    if (!(x < static_cast<double>(cap.count())))
        return cap;
    if (!(x > 0.0))
        return std::chrono::nanoseconds::zero();
    return std::chrono::nanoseconds{static_cast<std::chrono::nanoseconds::rep>(x)};
}

/// Applies a jitter other than `decorrelated` to a delay `d` (finite, in `[0, cap]`).
template <class R>
std::chrono::nanoseconds spread(const jitter& j, double d, std::chrono::nanoseconds cap, R& rng) {
    if (j.kind() == jitter::mode::none || j.kind() == jitter::mode::decorrelated || d <= 0.0)
        return clamp_to_duration(d, cap);
    const double f = j.fraction();
    return clamp_to_duration(d * (1.0 - f) + unit_random(rng) * d * f, cap);
}

inline double attempts_past_first(int attempt) noexcept {
    return attempt > 1 ? static_cast<double>(attempt) - 1.0 : 0.0;
}

inline constexpr std::chrono::nanoseconds no_cap = std::chrono::nanoseconds::max();

} // namespace detail

/// The same delay before every retry. `constant_backoff{500ms}` waits up to 500ms (full jitter);
/// `constant_backoff{500ms, rs::jitter::none}` exactly 500ms. `interval` must not be negative;
/// `decorrelated` jitter is not supported.
struct constant_backoff {
    std::chrono::nanoseconds interval{};
    resilience::jitter jitter = resilience::jitter::full;

    void validate() const {
        detail::require_non_negative("constant_backoff", "interval", interval);
        detail::require_not_decorrelated("constant_backoff", jitter);
    }
    template <random_source R>
    std::chrono::nanoseconds delay(int /*attempt*/, R& rng) const {
        validate();
        return detail::spread(jitter, static_cast<double>(interval.count()), interval, rng);
    }
};

/// `initial + step * (attempt - 1)`, capped at `max`. Durations must not be negative and `max`
/// must be at least `initial`; `decorrelated` jitter is not supported.
struct linear_backoff {
    std::chrono::nanoseconds initial = std::chrono::milliseconds{200};
    std::chrono::nanoseconds step = std::chrono::milliseconds{200};
    std::chrono::nanoseconds max = std::chrono::seconds{30};
    resilience::jitter jitter = resilience::jitter::full;

    void validate() const {
        detail::require_non_negative("linear_backoff", "initial", initial);
        detail::require_non_negative("linear_backoff", "step", step);
        detail::require_non_negative("linear_backoff", "max", max);
        if (max < initial)
            detail::bad_backoff("linear_backoff", "max must be at least initial (" +
                                                      detail::describe(initial) + "), got " +
                                                      detail::describe(max));
        detail::require_not_decorrelated("linear_backoff", jitter);
    }
    template <random_source R>
    std::chrono::nanoseconds delay(int attempt, R& rng) const {
        validate();
        const double d = static_cast<double>(initial.count()) +
                         static_cast<double>(step.count()) * detail::attempts_past_first(attempt);
        return detail::spread(jitter, std::min(d, static_cast<double>(max.count())), max, rng);
    }
};

/// `initial * factor^(attempt - 1)`, capped at `max`, then jittered. Positional or designated:
/// `exponential_backoff{200ms, 2.0, 5s}` or `{.initial = 200ms, .max = 5s, .jitter = rs::jitter::none}`.
/// Defaults: 200ms, 2, 30s, full jitter. `initial` must be positive, `factor` finite and at least
/// 1, `max` at least `initial`. With `jitter::decorrelated` each delay is drawn from
/// `[initial, 3 x previous]` capped at `max` (see `delay(attempt, rng, previous)`).
struct exponential_backoff {
    std::chrono::nanoseconds initial = std::chrono::milliseconds{200};
    double factor = 2.0;
    std::chrono::nanoseconds max = std::chrono::seconds{30};
    resilience::jitter jitter = resilience::jitter::full;

    void validate() const {
        if (initial <= std::chrono::nanoseconds::zero())
            detail::bad_backoff("exponential_backoff",
                                "initial must be positive, got " + detail::describe(initial));
        if (!(factor >= 1.0) || !std::isfinite(factor))
            detail::bad_backoff("exponential_backoff",
                                "factor must be finite and at least 1, got " + detail::describe(factor));
        if (max < initial)
            detail::bad_backoff("exponential_backoff", "max must be at least initial (" +
                                                           detail::describe(initial) + "), got " +
                                                           detail::describe(max));
    }

    /// The delay after `attempt` failed. `previous` is the wait taken before that attempt in the
    /// same call (zero before the first retry); only `decorrelated` jitter reads it.
    template <random_source R>
    std::chrono::nanoseconds delay(int attempt, R& rng, std::chrono::nanoseconds previous) const {
        validate();
        const double cap = static_cast<double>(max.count());
        const double first = static_cast<double>(initial.count());
        if (jitter.kind() == jitter::mode::decorrelated) {
            const double from = std::max(static_cast<double>(previous.count()), first);
            const double high = std::min(cap, 3.0 * from);
            return detail::clamp_to_duration(first + detail::unit_random(rng) * (high - first), max);
        }
        // pow overflows to +inf for large attempts; min() then yields the cap (NaN cannot arise:
        // factor >= 1 and the exponent is finite).
        const double d = first * std::pow(factor, detail::attempts_past_first(attempt));
        return detail::spread(jitter, std::min(d, cap), max, rng);
    }
    /// The same with no previous wait: for `decorrelated`, a delay in `[initial, 3 x initial]`.
    template <random_source R>
    std::chrono::nanoseconds delay(int attempt, R& rng) const {
        return delay(attempt, rng, std::chrono::nanoseconds::zero());
    }
};

/// The listed delays in order, repeating the last once the list runs out. The list must not be
/// empty and no entry may be negative; `decorrelated` jitter is not supported.
struct list_backoff {
    std::vector<std::chrono::nanoseconds> delays{};
    resilience::jitter jitter = resilience::jitter::full;

    void validate() const {
        if (delays.empty())
            detail::bad_backoff("list_backoff", "delays must not be empty");
        for (std::size_t i = 0; i < delays.size(); ++i)
            if (delays[i] < std::chrono::nanoseconds::zero())
                detail::bad_backoff("list_backoff", "delays[" + std::to_string(i) +
                                                        "] must not be negative, got " +
                                                        detail::describe(delays[i]));
        detail::require_not_decorrelated("list_backoff", jitter);
    }
    template <random_source R>
    std::chrono::nanoseconds delay(int attempt, R& rng) const {
        validate();
        const std::size_t last = delays.size() - 1;
        const std::size_t i = attempt <= 1 ? 0 : std::min(static_cast<std::size_t>(attempt - 1), last);
        return detail::spread(jitter, static_cast<double>(delays[i].count()), delays[i], rng);
    }
};

namespace detail {

template <class T>
inline constexpr bool is_duration_v = false;
template <class Rep, class Period>
inline constexpr bool is_duration_v<std::chrono::duration<Rep, Period>> = true;

template <class T>
concept duration_like = is_duration_v<std::remove_cvref_t<T>>;

/// Any duration as nanoseconds in `[0, nanoseconds::max()]`, without overflow.
template <class Rep, class Period>
std::chrono::nanoseconds to_delay(std::chrono::duration<Rep, Period> d) noexcept {
    using D = std::chrono::duration<Rep, Period>;
    if constexpr (std::chrono::treat_as_floating_point_v<Rep>) {
        const double ns = std::chrono::duration<double, std::nano>(d).count();
        return clamp_to_duration(ns, std::chrono::nanoseconds::max());
    } else {
        if (d <= D::zero())
            return std::chrono::nanoseconds::zero();
        if (d >= std::chrono::duration_cast<D>(std::chrono::nanoseconds::max()))
            return std::chrono::nanoseconds::max();
        return std::chrono::duration_cast<std::chrono::nanoseconds>(d);
    }
}

template <class S>
concept schedule_with_previous = requires(const S& s, int a, random_ref& r, std::chrono::nanoseconds p) {
    { s.delay(a, r, p) } -> duration_like;
};
template <class S>
concept schedule_object = requires(const S& s, int a, random_ref& r) {
    { s.delay(a, r) } -> duration_like;
};
template <class F>
concept schedule_of_failure = std::invocable<const F&, int, const failure&> &&
                              duration_like<std::invoke_result_t<const F&, int, const failure&>>;
template <class F>
concept schedule_of_attempt =
    std::invocable<const F&, int> && duration_like<std::invoke_result_t<const F&, int>>;

struct backoff_model {
    virtual ~backoff_model() = default;
    virtual std::chrono::nanoseconds delay(int attempt, random_ref rng, const failure& f,
                                           std::chrono::nanoseconds previous) const = 0;
    virtual bool may_wait() const noexcept = 0;
};

// Whether a schedule may give a wait longer than zero: false only for the library's schedules
// whose every delay is zero; a schedule of the user's may give anything.
template <class S>
bool schedule_may_wait(const S&) noexcept {
    return true;
}
inline bool schedule_may_wait(const constant_backoff& s) noexcept {
    return s.interval > std::chrono::nanoseconds::zero();
}
inline bool schedule_may_wait(const linear_backoff& s) noexcept {
    return s.max > std::chrono::nanoseconds::zero() &&
           (s.initial > std::chrono::nanoseconds::zero() || s.step > std::chrono::nanoseconds::zero());
}
inline bool schedule_may_wait(const list_backoff& s) noexcept {
    for (const std::chrono::nanoseconds d : s.delays)
        if (d > std::chrono::nanoseconds::zero())
            return true;
    return false;
}

template <class S>
struct backoff_impl final : backoff_model {
    explicit backoff_impl(S s) : schedule(std::move(s)) {}
    std::chrono::nanoseconds delay(int attempt, random_ref rng, const failure& f,
                                   std::chrono::nanoseconds previous) const override {
        if constexpr (schedule_with_previous<S>)
            return to_delay(schedule.delay(attempt, rng, previous));
        else if constexpr (schedule_object<S>)
            return to_delay(schedule.delay(attempt, rng));
        else if constexpr (schedule_of_failure<S>)
            return to_delay(schedule(attempt, f));
        else
            return to_delay(schedule(attempt));
    }
    bool may_wait() const noexcept override { return schedule_may_wait(schedule); }
    S schedule;
};

} // namespace detail

/// What `backoff` accepts: a schedule object with `delay(int attempt, Rng& rng)` (optionally also
/// `delay(int, Rng&, nanoseconds previous)`; `Rng` is a `random_ref`, so make it a template or
/// take `random_ref&`), or a callable taking `(int attempt)` or `(int attempt, const failure&)`.
/// Each returns any `std::chrono::duration`.
template <class S>
concept backoff_schedule =
    std::copy_constructible<std::remove_cvref_t<S>> &&
    (detail::schedule_object<S> || detail::schedule_of_failure<S> || detail::schedule_of_attempt<S>);

class backoff;

namespace detail {
// A schedule other than `backoff` itself (which has the shape of one), so copies stay copies.
template <class S>
concept foreign_schedule = !std::same_as<S, backoff> && backoff_schedule<S>;
} // namespace detail

/// A retry's schedule, type-erased so `retry_options` stays a plain (non-template) aggregate.
/// Holds any `backoff_schedule`; validates it on construction (`std::invalid_argument`). Copies
/// share the one immutable schedule, so they are cheap and may be used from many threads at once;
/// a user callable must therefore be callable as `const` and safe to call concurrently.
/// Default-constructed it is `exponential_backoff{}` (200ms, x2, 30s, full jitter) and holds
/// nothing on the heap. It is consulted only on the failure path, so the virtual call costs nothing
/// on success.
///
/// A custom schedule's result is read as nanoseconds in `[0, nanoseconds::max()]` (negative means 0).
/// A callable taking the failure receives an empty `failure` (`has_exception()` false) when the
/// attempt returned a value that the classifier sent back for another try.
class backoff {
public:
    backoff() noexcept = default;

    // Implicit on purpose, so that `.backoff = rs::constant_backoff{1s}` reads well.
    template <detail::foreign_schedule S>
    backoff(S schedule) {
        if constexpr (requires(const S& s) { s.validate(); })
            schedule.validate();
        model_ = std::make_shared<const detail::backoff_impl<S>>(std::move(schedule));
    }

    /// The wait after `attempt` (1-based) failed with `f`. `previous` is the wait taken before that
    /// attempt in the same call; only decorrelated jitter reads it, so a retry keeps it in the
    /// call's own frame and the schedule itself stays stateless and shareable.
    template <random_source R>
    std::chrono::nanoseconds
    delay(int attempt, R& rng, const failure& f = failure{},
          std::chrono::nanoseconds previous = std::chrono::nanoseconds::zero()) const {
        random_ref ref{rng};
        if (!model_)
            return exponential_backoff{}.delay(attempt, ref, previous);
        return model_->delay(attempt, ref, f, previous);
    }

    /// False when every wait it gives is zero (`constant_backoff{}`, a `list_backoff` of zeros, a
    /// `linear_backoff` with no `initial` nor `step`): a retry with it never sleeps. A schedule of
    /// your own may give any wait, so it answers true.
    [[nodiscard]] bool may_wait() const noexcept { return !model_ || model_->may_wait(); }

private:
    std::shared_ptr<const detail::backoff_model> model_;
};

} // namespace resilience
