// SPDX-License-Identifier: MIT
/// \file chaos.hpp
/// `chaos::fault`, `chaos::latency`, `chaos::outcome`: pipeline stages that inject failures, delays
/// and substitute results at a given rate, to rehearse what a pipeline does when its dependency
/// misbehaves (as Polly's Simmy does).
///
/// Each stage takes `injection_options`: a name, the share of calls to inject into
/// (`injection_rate`), a `toggle` that turns injection on and off while calls run, and a callback
/// told of each injection (`on_inject`, with an `injection_event`). A call passing a stage that is
/// off, or that the draw spares, goes on inward as if the stage were not there: one relaxed atomic
/// load, plus one random draw while it is on.
///
/// Where a stage sits decides what it rehearses. Innermost (next to the action) it stands for the
/// dependency: every policy outside sees the injected fault, delay or result as the dependency's.
///
///     rs::chaos::toggle rehearsal{false};     // off until a rehearsal turns it on
///     rs::pipeline p{rs::retry{}, rs::timeout{2s},
///                    rs::chaos::latency{5s, {.injection_rate = 0.1, .enabled = rehearsal}},
///                    rs::chaos::fault{boom{}, {.injection_rate = 0.05, .enabled = rehearsal}}};
///     rehearsal.enable();
#pragma once

#include "clock.hpp"
#include "concepts.hpp"
#include "context.hpp"
#include "detail/label.hpp"
#include "detail/time.hpp"
#include "engine/default_clock.hpp"
#include "error.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "random.hpp"
#include "task.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2::chaos {

/// An on/off switch shared by its copies: hand one to several stages (or to a whole set of
/// pipelines) and turn all their injection on or off at once, from any thread, while calls run.
/// A call reads it once, as it passes the stage. Starts on unless told otherwise.
class toggle {
public:
    explicit toggle(bool enabled = true) : on_(std::make_shared<std::atomic<bool>>(enabled)) {}

    void enable() const noexcept { set(true); }
    void disable() const noexcept { set(false); }
    void set(bool enabled) const noexcept { on_->store(enabled, std::memory_order_relaxed); }
    [[nodiscard]] bool enabled() const noexcept { return on_->load(std::memory_order_relaxed); }

    /// Copies of one toggle are equal: they are the same switch.
    friend bool operator==(const toggle& a, const toggle& b) noexcept { return a.on_ == b.on_; }

private:
    std::shared_ptr<std::atomic<bool>> on_;
};

/// What a chaos stage injects.
enum class injection_kind : unsigned char {
    fault,   ///< a failure (`chaos::fault`)
    latency, ///< a delay (`chaos::latency`)
    outcome, ///< a substitute result (`chaos::outcome`)
};

constexpr const char* to_string(injection_kind k) noexcept {
    switch (k) {
    case injection_kind::fault:
        return "fault";
    case injection_kind::latency:
        return "latency";
    case injection_kind::outcome:
        return "outcome";
    }
    return "unknown";
}

/// What a chaos stage reports to `on_inject`, just before it injects. Refers to the call's context
/// and to the stage's name: valid only during the callback; copy what you need to keep.
class injection_event {
public:
    injection_event(injection_kind kind, const resilience::context& ctx, std::chrono::nanoseconds delay = {},
                    std::string_view policy_name = {}) noexcept
        : kind_(kind), ctx_(&ctx), delay_(delay), name_(policy_name) {}

    /// What is injected.
    [[nodiscard]] injection_kind kind() const noexcept { return kind_; }
    /// The call's context, as the stage saw it.
    [[nodiscard]] const resilience::context& context() const noexcept { return *ctx_; }
    /// For `latency`, the delay injected; zero for the others.
    [[nodiscard]] std::chrono::nanoseconds delay() const noexcept { return delay_; }
    /// The `name` option of the stage that reports (empty when unnamed).
    [[nodiscard]] std::string_view policy_name() const noexcept { return name_; }

private:
    injection_kind kind_;
    const resilience::context* ctx_;
    std::chrono::nanoseconds delay_;
    std::string_view name_;
};

/// What every chaos stage takes. Validated by the stage's constructor (`std::invalid_argument`
/// naming the field and the value).
struct injection_options {
    /// Carried by the errors the stage makes (`cancelled_error` for a call stopped while an
    /// injected delay runs), by `injection_event`s and by `name()`.
    std::string name{};
    /// The share of calls to inject into, in [0, 1]: 0 never, 1 always. Default 0.001, Simmy's.
    double injection_rate = 0.001;
    /// Injection happens only while this is on. Default: a switch of the stage's own, on.
    toggle enabled{};
    /// Told of each injection, before it happens, on the caller's coroutine; must not block. What
    /// it throws becomes the call's failure (nothing is injected, the action does not run).
    std::function<void(const injection_event&)> on_inject{};
};

/// What `fault` injects when it is given nothing to inject.
class injected_fault : public std::runtime_error {
public:
    injected_fault() : std::runtime_error("resilience::chaos: injected fault") {}
};

namespace detail {

/// "resilience::chaos::fault (name)": how a stage signs its messages.
inline std::string label(const char* stage, const std::string& name) {
    return ::resilience::detail::policy_label((std::string("chaos::") + stage).c_str(), name);
}

inline void validate(const injection_options& o, const char* stage) {
    if (!(o.injection_rate >= 0.0 && o.injection_rate <= 1.0))
        throw std::invalid_argument(label(stage, o.name) + ": injection_rate must be in [0, 1], got " +
                                    resilience::detail::format_number(o.injection_rate));
}

/// Tells `on_inject`, if set; what it throws goes to the caller.
inline void tell(const injection_options& o, injection_kind kind, const context& ctx,
                 std::chrono::nanoseconds delay = {}) {
    if (o.on_inject)
        o.on_inject(injection_event{kind, ctx, delay, o.name});
}

/// The decision every stage makes: is the switch on, and does this call's draw fall under the rate?
/// Draws only when the answer is not known without drawing (a rate strictly between 0 and 1).
template <class Random>
bool should_inject(const injection_options& o, Random& rng) {
    if (o.injection_rate <= 0.0 || !o.enabled.enabled())
        return false;
    if (o.injection_rate >= 1.0)
        return true;
    return ::resilience::detail::unit_random(rng) < o.injection_rate;
}

inline failure to_failure(failure f) noexcept {
    return f;
}
inline failure to_failure(std::exception_ptr e) noexcept {
    return failure{std::move(e)};
}
template <class E>
requires std::is_class_v<E> && (!std::is_same_v<E, failure>)
failure to_failure(E e) {
    return failure::make(std::move(e));
}

/// Turns what `fault` was given into a function making one failure per injection.
template <class What>
std::function<failure(const context&)> fault_maker(What what, const std::string& name) {
    if constexpr (std::is_same_v<What, failure>) {
        if (!what.has_exception())
            throw std::invalid_argument(label("fault", name) + ": the failure to inject is empty");
        return [f = std::move(what)](const context&) { return f; };
    } else if constexpr (std::is_same_v<What, std::exception_ptr>) {
        if (!what)
            throw std::invalid_argument(label("fault", name) + ": the exception to inject is null");
        return [e = std::move(what)](const context&) { return failure{e}; };
    } else if constexpr (std::is_invocable_v<const What&, const context&>) {
        return [w = std::move(what)](const context& ctx) { return to_failure(std::invoke(w, ctx)); };
    } else if constexpr (std::is_invocable_v<const What&>) {
        return [w = std::move(what)](const context&) { return to_failure(std::invoke(w)); };
    } else {
        static_assert(
            std::is_class_v<What>,
            "resilience::chaos::fault: inject an exception object, an rs::failure, a "
            "std::exception_ptr, or a callable (taking nothing or rs::context const&) returning one");
        return [w = std::move(what)](const context&) { return failure::make(w); };
    }
}

} // namespace detail

/// Fails a share of calls without running the rest of the pipeline: the stages inside it and the
/// action never see an injected call. What it injects, each time anew:
/// - an exception object (`std::runtime_error{"boom"}`, an `rs::error` subtype): a copy is thrown;
/// - an `rs::failure` or a `std::exception_ptr`: that same exception object every time;
/// - a callable taking nothing or `const rs::context&` (the call's) and returning one of these.
/// Given nothing, it injects `chaos::injected_fault`. The failure travels as a value: through
/// `execute_outcome` it is returned, through `execute` thrown; a retry outside sees it as the
/// dependency's failure (and retries it if its classifier says so).
///
/// Never waits: a call costs no frame of its own. A value; copies share the toggle and, for the
/// callable, its captures. `Random` draws the decision, once per call while the switch is on
/// and the rate strictly between 0 and 1: the default `thread_random` may be shared across
/// threads; a `seeded_random` gives the same decisions for the same sequence of calls, and must
/// not be used from two threads at once.
///
///     rs::chaos::fault f{rs::timeout_error{}, {.injection_rate = 0.2}};
template <random_source Random = thread_random>
class fault : public policy_base<fault<Random>> {
public:
    /// Injects `chaos::injected_fault`.
    explicit fault(injection_options options = {}, Random rng = Random{})
        : fault(injected_fault{}, std::move(options), std::move(rng)) {}
    /// Injects `what` (see the class comment). Validates `options`.
    template <class What>
    requires(!std::is_same_v<std::remove_cvref_t<What>, injection_options> &&
             !std::is_same_v<std::remove_cvref_t<What>, fault>)
    explicit fault(What what, injection_options options = {}, Random rng = Random{})
        : options_(std::move(options)), rng_(std::move(rng)) {
        detail::validate(options_, "fault");
        make_ = detail::fault_maker(std::move(what), options_.name);
    }

    [[nodiscard]] const injection_options& options() const noexcept { return options_; }
    [[nodiscard]] const std::string& name() const noexcept { return options_.name; }

    // ---- the policy protocol (see policy.hpp) ----
    static constexpr bool enter_never_waits = true;
    struct call_state {};

    template <class R>
    step enter(call_state&, const context& ctx, std::optional<resilience::outcome<R>>& result) const {
        if (!detail::should_inject(options_, rng_))
            return step::proceed;
        try {
            detail::tell(options_, injection_kind::fault, ctx);
            result.emplace(make_(ctx));
        } catch (...) {
            result.emplace(failure::current());
        }
        return step::done;
    }
    template <class R>
    step leave(call_state&, const context&, resilience::outcome<R>&) const noexcept {
        return step::proceed;
    }

private:
    injection_options options_;
    std::function<failure(const context&)> make_;
    mutable Random rng_; // drawn from by a const `enter`
};

fault() -> fault<thread_random>;
fault(injection_options) -> fault<thread_random>;
template <random_source R>
fault(injection_options, R) -> fault<R>;
template <class What>
fault(What) -> fault<thread_random>;
template <class What>
fault(What, injection_options) -> fault<thread_random>;
template <class What, random_source R>
fault(What, injection_options, R) -> fault<R>;

/// Delays a share of calls by `delay` on the clock before letting them go on inward: a slow
/// dependency, on demand. The wait is a sleep on `C` (so it is exact on virtual time) that
/// listens to the call's stop token: a caller that stops, or a timeout outside whose deadline
/// passes, ends the wait at that instant, and the call ends with `cancelled_error` (which a
/// timeout outside reports as its `timeout_error`) without running the rest of the pipeline.
///
/// A call that the switch or the draw spares goes straight on, in the pipeline's frame. While the
/// switch is on (and the rate is not 0), every call passing takes the waiting form, one coroutine
/// frame more, and draws there. A value; `Random` as for `fault`.
///
///     rs::chaos::latency slow{3s, {.injection_rate = 0.1}, sim.clock()};
template <clock C = steady_clock, random_source Random = thread_random>
class latency : public policy_base<latency<C, Random>> {
public:
    /// `delay` must not be negative, and a floating-point one must be finite (NaN and infinities are
    /// refused, as `timeout` refuses them); a duration beyond what nanoseconds hold is taken as that
    /// much.
    template <class Rep, class Period>
    explicit latency(std::chrono::duration<Rep, Period> delay, injection_options options = {}, C clock = C{},
                     Random rng = Random{})
        : delay_(checked_delay(delay, options)), options_(std::move(options)), clock_(std::move(clock)),
          rng_(std::move(rng)) {
        detail::validate(options_, "latency");
    }

    [[nodiscard]] std::chrono::nanoseconds delay() const noexcept { return delay_; }
    [[nodiscard]] const injection_options& options() const noexcept { return options_; }
    [[nodiscard]] const std::string& name() const noexcept { return options_.name; }
    [[nodiscard]] const C& clock() const noexcept { return clock_; }

    // ---- the policy protocol (see policy.hpp) ----
    struct call_state {};

    /// Whether a call through it may sleep on the default clock: it is on, at a rate above 0, with
    /// a delay above 0 (see `::resilience::detail::default_clock_sleeper`).
    [[nodiscard]] ::resilience::detail::sleeper may_sleep_on_default_clock() const noexcept {
        if (!::resilience::detail::is_default_clock(clock_) || options_.injection_rate <= 0.0 ||
            delay_ <= std::chrono::nanoseconds::zero() || !options_.enabled.enabled())
            return {};
        return {"chaos::latency", "its delay"};
    }

    /// Off (or at rate 0): straight on. On: the decision is drawn in `run`, which may wait.
    template <class R>
    step enter(call_state&, const context&, std::optional<resilience::outcome<R>>&) const {
        if (options_.injection_rate <= 0.0 || !options_.enabled.enabled())
            return step::proceed;
        return step::wait;
    }
    template <class R>
    step leave(call_state&, const context&, resilience::outcome<R>&) const noexcept {
        return step::proceed;
    }

    /// The waiting form: draws, sleeps `delay` if chosen, then runs `next`.
    template <class Next>
    task<::resilience::detail::next_outcome_t<Next>> run(Next next, const context& ctx) const {
        if (detail::should_inject(options_, rng_)) {
            if (options_.on_inject) {
                std::optional<failure> thrown;
                try {
                    detail::tell(options_, injection_kind::latency, ctx, delay_);
                } catch (...) {
                    thrown.emplace(failure::current());
                }
                if (thrown)
                    co_return std::move(*thrown);
            }
            if (!ctx.stop_requested() && delay_ > std::chrono::nanoseconds::zero())
                co_await clock_.sleep_until(::resilience::detail::add_saturating(clock_.now(), delay_),
                                            ctx.stop_token());
            if (ctx.stop_requested())
                co_return failure::make(cancelled_error{options_.name});
        }
        co_return co_await next(ctx);
    }

private:
    // Refused before converting: a NaN would become 0 ns, and a negative delay of less than a
    // nanosecond would round to 0 ns and pass.
    template <class Rep, class Period>
    static std::chrono::nanoseconds checked_delay(std::chrono::duration<Rep, Period> delay,
                                                  const injection_options& options) {
        const std::string field = detail::label("latency", options.name) + ": delay";
        const std::chrono::nanoseconds ns = ::resilience::detail::finite_nanoseconds(delay, field);
        if (delay < std::chrono::duration<Rep, Period>::zero()) {
            std::string got;
            if constexpr (std::chrono::treat_as_floating_point_v<Rep>)
                got = ::resilience::detail::describe_duration(delay);
            else
                got = std::to_string(ns.count()) + "ns";
            throw std::invalid_argument(field + " must not be negative, got " + got);
        }
        return ns;
    }

    std::chrono::nanoseconds delay_;
    injection_options options_;
    C clock_;
    mutable Random rng_; // drawn from by a const `run`
};

template <class Rep, class Period>
latency(std::chrono::duration<Rep, Period>) -> latency<steady_clock, thread_random>;
template <class Rep, class Period>
latency(std::chrono::duration<Rep, Period>, injection_options) -> latency<steady_clock, thread_random>;
template <class Rep, class Period, clock C>
latency(std::chrono::duration<Rep, Period>, injection_options, C) -> latency<C, thread_random>;
template <class Rep, class Period, clock C, random_source R>
latency(std::chrono::duration<Rep, Period>, injection_options, C, R) -> latency<C, R>;

namespace detail {

// What `outcome`'s substitute gives for a call: the value or function result itself.
template <class S>
decltype(auto) produce(const S& s, const context& ctx) {
    if constexpr (std::is_invocable_v<const S&, const context&>)
        return std::invoke(s, ctx);
    else if constexpr (std::is_invocable_v<const S&>)
        return std::invoke(s);
    else
        return (s);
}

template <class S>
using produced_t = decltype(produce(std::declval<const S&>(), std::declval<const context&>()));

// Can what `S` produces stand for the result of an action returning `R`? Only by an implicit
// conversion to `R` (not any constructor of it), or as an outcome or a failure already.
template <class P, class R>
inline constexpr bool stands_for = std::is_same_v<std::remove_cvref_t<P>, resilience::outcome<R>> ||
                                   std::is_same_v<std::remove_cvref_t<P>, failure> ||
                                   (std::is_void_v<R> ? std::is_void_v<P> : std::is_convertible_v<P, R>);
template <class S, class R>
inline constexpr bool substitutes_for = stands_for<produced_t<S>, R>;

// The call's result from what the substitute produced (`stands_for` holds).
template <class R, class P>
resilience::outcome<R> as_outcome(P&& p) {
    if constexpr (std::is_same_v<std::remove_cvref_t<P>, resilience::outcome<R>> ||
                  std::is_same_v<std::remove_cvref_t<P>, failure>) {
        return resilience::outcome<R>(std::forward<P>(p));
    } else {
        R r = std::forward<P>(p); // the implicit conversion, and no other
        return resilience::outcome<R>(std::move(r));
    }
}

} // namespace detail

/// Answers a share of calls with a substitute result instead of running the rest of the pipeline:
/// a dependency that answers wrongly (an HTTP 500 returned as a value, an empty list, stale data).
/// The substitute is a value (copied out each time), or a callable taking nothing or
/// `const rs::context&` and returning the result. Whatever it gives must convert to the
/// action's `rs::outcome<R>`: a value convertible to `R`, an `rs::outcome<R>`, or an
/// `rs::failure` (for a `void` action, a callable returning `void` also does). That is checked
/// when a pipeline is built for an action, at compile time, by a `static_assert` naming the rule.
/// What the callable throws becomes the call's failure.
///
/// Never waits: a call costs no frame of its own. A value; `Random` as for `fault`.
///
///     rs::chaos::outcome server_error{response{.status = 500}, {.injection_rate = 0.1}};
template <class Substitute, random_source Random = thread_random>
class outcome : public policy_base<outcome<Substitute, Random>> {
    static_assert(!std::is_reference_v<Substitute>,
                  "resilience::chaos::outcome: the substitute is held by value");

public:
    explicit outcome(Substitute substitute, injection_options options = {}, Random rng = Random{})
        : substitute_(std::move(substitute)), options_(std::move(options)), rng_(std::move(rng)) {
        detail::validate(options_, "outcome");
    }

    [[nodiscard]] const Substitute& substitute() const noexcept { return substitute_; }
    [[nodiscard]] const injection_options& options() const noexcept { return options_; }
    [[nodiscard]] const std::string& name() const noexcept { return options_.name; }

    // ---- the policy protocol (see policy.hpp) ----
    static constexpr bool enter_never_waits = true;
    struct call_state {};

    template <class R>
    step enter(call_state&, const context& ctx, std::optional<resilience::outcome<R>>& result) const {
        static_assert(detail::substitutes_for<Substitute, R>,
                      "resilience::chaos::outcome: the substitute must give what the action returns: a value "
                      "convertible to its result type R, an rs::outcome<R> or an rs::failure");
        if constexpr (!detail::substitutes_for<Substitute, R>) {
            return step::proceed; // the static_assert above has said why this cannot build
        } else {
            if (!detail::should_inject(options_, rng_))
                return step::proceed;
            return inject(ctx, result);
        }
    }
    template <class R>
    step leave(call_state&, const context&, resilience::outcome<R>&) const noexcept {
        return step::proceed;
    }

private:
    template <class R>
    step inject(const context& ctx, std::optional<resilience::outcome<R>>& result) const {
        try {
            detail::tell(options_, injection_kind::outcome, ctx);
            if constexpr (std::is_void_v<detail::produced_t<Substitute>>) {
                detail::produce(substitute_, ctx);
                result.emplace();
            } else {
                result.emplace(detail::as_outcome<R>(detail::produce(substitute_, ctx)));
            }
        } catch (...) {
            result.emplace(failure::current());
        }
        return step::done;
    }

    Substitute substitute_;
    injection_options options_;
    mutable Random rng_; // drawn from by a const `enter`
};

template <class Substitute>
outcome(Substitute) -> outcome<Substitute, thread_random>;
template <class Substitute>
outcome(Substitute, injection_options) -> outcome<Substitute, thread_random>;
template <class Substitute, random_source R>
outcome(Substitute, injection_options, R) -> outcome<Substitute, R>;

} // namespace resilience::chaos
