// SPDX-License-Identifier: MIT
/// \file telemetry_event.hpp
/// Structured events from every policy (`telemetry_event`) to a listener (`telemetry_listener`),
/// set per policy (each options struct's `telemetry`) or once for a whole pipeline (the
/// `telemetry` stage of telemetry.hpp, placed first). Policies include this header; the stage is
/// composition, and includes the policy protocol.
///
///     std::atomic<int> retries{0};
///     rs::pipeline p{
///         rs::telemetry{[&](const rs::telemetry_event& e) {
///             if (e.kind == rs::telemetry_kind::retry)
///                 ++retries;
///         }},
///         rs::retry{}, breaker, rs::timeout{2s},
///     };
///
/// What each policy reports, and when; `duration` and `error` mean what each kind says:
///
/// - `attempt` (retry): an attempt ended, however it ended. `duration`: its length; `error`: its
///   failure, null for a value; `handled`: the retry's classifier handled its outcome (whether or
///   not another attempt follows; a cancellation, or an attempt its caller stopped, is not judged).
/// - `retry` (retry): the next attempt is decided, before the wait. `duration`: the wait; `error`:
///   the failure retried, null for a value the classifier handled; `handled` is true.
/// - `timeout` (timeout): an attempt ended after its deadline (the timeout waits for it).
///   `duration`: the timeout's length; `error`: the `timeout_error`, null for a value that came late.
/// - `state_change` (circuit_breaker): `from` and `to`.
/// - `rejection` (circuit_breaker, bulkhead, rate_limiter, sliding_window_limiter, adaptive_throttle;
///   retry_budget,
///   through the retry or hedge it refused): a call, a retry or a hedge was refused. `duration`: the
///   time it waited in a queue first; `error`: the refusal (for a budget: the failure that asked for
///   the retry or hedge, null for a delay or a handled value; `handled` is true when the classifier
///   asked for it, false for a hedge's delay); `reason` for a bulkhead or a limiter.
/// - `hedge` (hedge): an extra attempt starts; `attempt` is its number. `duration`: the delay that
///   passed, zero when an outcome brought it forward; `error`: that outcome's failure; `handled`:
///   an outcome the classifier handled brought it forward (false for the delay).
/// - `queue_wait` (bulkhead, rate_limiter, sliding_window_limiter): a call that found no room was
///   admitted. `duration`: how long it waited.
/// - `fallback` (fallback): the substitute is about to answer. `error`: the failure it answers, null
///   for a value the classifier handled; `handled` is true. A fallback has no clock: `at` is zero.
/// - `call` (telemetry): a call through the stage ended. `duration`: its length; `error`: its
///   failure, null for a value; `handled`: the stage's `should_handle` handled its outcome (by
///   default a failure other than a cancellation, or an `expected_like` value holding an error).
/// - `backend_lost` (the limits shared through Redis, redis.hpp): the shared store stopped answering;
///   until it is back the policy does what `note` says ("fail_open", "fail_closed" or
///   "local_share"). `error`: the failure that showed it.
/// - `backend_restored` (the same): the store answers again; `note` says what the policy did
///   meanwhile.
/// - `cache_hit` (cache): an entry answered without a call: a fresh value, or a failure remembered
///   (negative caching), which is then `error`. `duration` zero.
/// - `cache_miss` (cache): no usable entry; the call was made, or joined a refresh in flight.
/// - `stale_served` (cache): an expired value answered; `note` is "stale_while_revalidate" (a refresh
///   runs meanwhile) or "stale_if_error" (the refresh failed, or a failure is remembered; `error` is
///   that failure). `duration`: how long past its freshness the value was.
///
/// `reason` is meaningful for bulkhead and limiter rejections (for the others it is
/// `no_capacity`: refused at once, without waiting). `attempt` is the attempt number the policy
/// saw (`context::attempt()`), except for `hedge` (above); zero for a state change.
/// `at` is the reporting policy's clock, as time since its epoch.
///
/// The listener is called synchronously, on the thread and coroutine of the call that made the
/// event, so it must not block; policies shared by several threads call it from all of them, so it
/// must be thread-safe then. A breaker's state changes are reported one at a time, in order, to the
/// listener of the call that made or first saw them (its own `telemetry` first).
///
/// A listener that throws is treated as every user callback of the library: its exception becomes
/// the call's failure, after the policy's own bookkeeping (a slot given back, a result recorded), and
/// ends the call (a retry does not retry it). `execute_outcome` returns it; nothing escapes it.
///
/// Cost: with no listener set, an emission point on a success path is a test of an empty listener
/// and of one pointer in the context, and the event is built only when somebody listens. The
/// success path allocates nothing either way (bench/policies.cpp: `pipeline_of_five`,
/// `pipeline_of_five_telemetry`).
#pragma once

#include "clock.hpp"
#include "concepts.hpp"
#include "context.hpp"
#include "detail/time.hpp"
#include "error.hpp"
#include "outcome.hpp"

#include <chrono>
#include <concepts>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2 {

// Declared opaque here (a scoped enum's underlying type is int unless it says otherwise), defined
// in circuit_breaker/options.hpp: events carry a breaker's states without every policy including it.
enum class circuit_state;

/// What happened (see the table in the file comment).
enum class telemetry_kind : unsigned char {
    attempt,      ///< an attempt of a retry ended
    retry,        ///< a retry is about to wait for its next attempt
    timeout,      ///< an attempt ended after its deadline
    state_change, ///< a circuit breaker changed state
    rejection,    ///< a call, a retry or a hedge was refused
    hedge,        ///< a hedge starts an extra attempt
    queue_wait,   ///< a call was admitted after waiting in a queue
    fallback,     ///< a fallback answers with its substitute
    call,         ///< a call through a `telemetry` stage ended
    backend_lost, ///< a shared limit's store (Redis) stopped answering; `note` says what the policy does meanwhile
    backend_restored, ///< that store answers again
    cache_hit,        ///< a cache answered with a fresh entry, without calling
    cache_miss,       ///< a cache found no usable entry and called (or joined the call in flight)
    stale_served, ///< a cache answered with an expired entry; `note` says why ("stale_while_revalidate", "stale_if_error")
    endpoint_ejected,  ///< a balancer ejected `endpoint`; `note` says why, `duration` for how long
    endpoint_returned, ///< a balancer's ejection of `endpoint` is over
};

/// "attempt", "retry", ...: a static string, for logs and metric labels.
constexpr const char* to_string(telemetry_kind k) noexcept {
    switch (k) {
    case telemetry_kind::attempt:
        return "attempt";
    case telemetry_kind::retry:
        return "retry";
    case telemetry_kind::timeout:
        return "timeout";
    case telemetry_kind::state_change:
        return "state_change";
    case telemetry_kind::rejection:
        return "rejection";
    case telemetry_kind::hedge:
        return "hedge";
    case telemetry_kind::queue_wait:
        return "queue_wait";
    case telemetry_kind::fallback:
        return "fallback";
    case telemetry_kind::call:
        return "call";
    case telemetry_kind::backend_lost:
        return "backend_lost";
    case telemetry_kind::backend_restored:
        return "backend_restored";
    case telemetry_kind::cache_hit:
        return "cache_hit";
    case telemetry_kind::cache_miss:
        return "cache_miss";
    case telemetry_kind::stale_served:
        return "stale_served";
    case telemetry_kind::endpoint_ejected:
        return "endpoint_ejected";
    case telemetry_kind::endpoint_returned:
        return "endpoint_returned";
    }
    return "unknown";
}

/// One thing a policy did. Passed to the listener by const reference and valid only during that
/// call: `policy` is a static string, but `name` refers to the policy's options and `error` to the
/// call's own outcome. Copy what you keep (`std::string(e.name)`, `e.error->exception()`).
struct telemetry_event {
    telemetry_kind kind{};
    /// Which policy: "retry", "circuit_breaker", "timeout", "bulkhead", "rate_limiter",
    /// "sliding_window_limiter", "adaptive_throttle", "retry_budget", "hedge", "fallback", "telemetry",
    /// "redis_rate_limiter", "redis_bulkhead", "cache" or "balancer".
    std::string_view policy{};
    /// The reporting policy's `name` option (for a budget: the retry's or hedge's); may be empty.
    std::string_view name{};
    /// The attempt (see the file comment): 1 for the first.
    int attempt = 0;
    /// See the file comment: a length, a wait, or zero.
    std::chrono::nanoseconds duration{};
    /// The failure the event is about, or null.
    const failure* error = nullptr;
    /// Whether the reporting policy's classifier (`should_handle`) handled the outcome the event is
    /// about, a value as well as a failure: true for a 503 the retry retries, false for an attempt
    /// that succeeded, and false where no classifier judged (see the file comment).
    bool handled = false;
    /// For `state_change`: the state left and the state entered (see circuit_breaker.hpp).
    circuit_state from{};
    circuit_state to{};
    /// For a bulkhead's or a limiter's `rejection`: why.
    rejection_reason reason = rejection_reason::no_capacity;
    /// For `backend_lost` and `backend_restored`: what the policy does without its store (a static
    /// string); for `endpoint_ejected`, why ("consecutive_failures", "success_rate"); empty otherwise.
    std::string_view note{};
    /// For `endpoint_ejected` and `endpoint_returned`: the endpoint, when its type converts to a
    /// `std::string_view` (a host name, an address); empty otherwise.
    std::string_view endpoint{};
    /// When, on the reporting policy's clock: time since its epoch (virtual time in a simulation).
    std::chrono::nanoseconds at{};
    /// The properties of the call the event is about (properties.hpp: a request id, a tenant), as its
    /// caller set them on the call's context; empty for an event that no one call made (a breaker's
    /// state change is reported with the properties of the call that made or first saw it).
    properties_view properties{};
};

/// Hears `telemetry_event`s. Made from any callable `f` with `f(const telemetry_event&)` callable
/// as const; empty by default (nothing is reported, nothing is paid).
///
/// Copies share the one callable they were made from (it is allocated once, when the listener is
/// made, and reference-counted): a retry copied into two pipelines reports to the same counters,
/// and copying a policy never copies a listener's state. Calling it is one indirect call, with no
/// allocation. That is why this is not a `std::function`: copies of a `std::function` copy the
/// callable, so a counter held by value would be split between copies of a policy, and a copy
/// could allocate.
///
///     rs::telemetry_listener count{[&n](const rs::telemetry_event&) { ++n; }};  // OK: n outlives the policy
///     rs::telemetry_listener bad{[](const rs::telemetry_event& e) { keep = e.name; }};
///                                              // dangling: e.name is valid only during the call
class telemetry_listener {
public:
    telemetry_listener() noexcept = default;
    // Implicit, so that `.telemetry = [&](const rs::telemetry_event& e) {...}` reads well.
    template <class F>
    requires(!std::same_as<std::remove_cvref_t<F>, telemetry_listener> &&
             std::invocable<const std::remove_cvref_t<F>&, const telemetry_event&>)
    telemetry_listener(F&& f)
        : owner_(std::make_shared<const std::remove_cvref_t<F>>(std::forward<F>(f))),
          call_(&invoke<std::remove_cvref_t<F>>) {}

    /// True when it was made from a callable.
    explicit operator bool() const noexcept { return call_ != nullptr; }
    /// True when both are empty, or copies of one listener (they share its callable).
    [[nodiscard]] bool same_as(const telemetry_listener& o) const noexcept {
        return owner_ == o.owner_ && call_ == o.call_;
    }
    /// Calls the callable; what it throws propagates. Precondition: not empty.
    void operator()(const telemetry_event& e) const { call_(owner_.get(), e); }

private:
    template <class F>
    static void invoke(const void* f, const telemetry_event& e) {
        std::invoke(*static_cast<const F*>(f), e);
    }

    std::shared_ptr<const void> owner_;
    void (*call_)(const void*, const telemetry_event&) = nullptr;
};

namespace detail {

/// Where an emission point reports: a listener (or none), and the properties of the call, which the
/// event is stamped with. Made from a listener alone where no call is at hand.
class listener_ref {
public:
    listener_ref() noexcept = default;
    listener_ref(std::nullptr_t) noexcept {}
    listener_ref(const telemetry_listener* l) noexcept : listener_(l) {}
    listener_ref(const telemetry_listener* l, const property_node* props) noexcept
        : listener_(l), props_(props) {}

    explicit operator bool() const noexcept { return listener_ != nullptr; }
    /// Calls the listener with `e`, stamped with the call's properties. Precondition: a listener.
    void operator()(telemetry_event& e) const {
        e.properties = properties_access::view(props_);
        (*listener_)(e);
    }
    const telemetry_listener* get() const noexcept { return listener_; }
    /// The call's properties, which the events reported through this carry.
    const property_node* properties() const noexcept { return props_; }
    properties_view view() const noexcept { return properties_access::view(props_); }
    /// The same call's properties, reported to `l` instead (a policy's own listener over the call's).
    listener_ref to(const telemetry_listener* l) const noexcept { return listener_ref(l, props_); }
    // The listener alone, without the call's properties (events then carry none).
    operator const telemetry_listener*() const noexcept { return listener_; }

private:
    const telemetry_listener* listener_ = nullptr;
    const property_node* props_ = nullptr;
};

/// The listener a policy reports to: its own, else the call's (set by a `telemetry` stage around
/// it), else none; with the call's properties.
inline listener_ref listener_for(const telemetry_listener& own, const context& ctx) noexcept {
    return listener_ref(own ? &own : context_access::telemetry(ctx), context_access::properties(ctx));
}

template <class TimePoint>
std::chrono::nanoseconds since_epoch(TimePoint t) noexcept {
    return saturating_nanoseconds(t.time_since_epoch());
}

/// An event of the usual shape, built in one line at an emission point.
inline telemetry_event event(telemetry_kind kind, std::string_view policy, std::string_view name, int attempt,
                             std::chrono::nanoseconds duration = {},
                             const failure* error = nullptr) noexcept {
    return {.kind = kind,
            .policy = policy,
            .name = name,
            .attempt = attempt,
            .duration = duration,
            .error = error};
}
inline telemetry_event state_change(std::string_view name, circuit_state from, circuit_state to) noexcept {
    return {.kind = telemetry_kind::state_change,
            .policy = "circuit_breaker",
            .name = name,
            .from = from,
            .to = to};
}

/// Reports `e` to `l` (if any), stamped with `clock`'s time. What the listener throws propagates.
template <class C>
void emit(listener_ref l, const C& clock, telemetry_event e) {
    if (!l)
        return;
    e.at = since_epoch(clock.now());
    l(e);
}
template <class C>
void emit(const telemetry_listener& own, const context& ctx, const C& clock, telemetry_event e) {
    emit(listener_for(own, ctx), clock, std::move(e));
}

/// `emit`, with what the listener (or the clock) throws returned instead of thrown.
template <class C>
std::optional<failure> emit_caught(listener_ref l, const C& clock, telemetry_event e) noexcept {
    try {
        emit(l, clock, std::move(e));
        return std::nullopt;
    } catch (...) {
        return failure::current();
    }
}

/// Reports `e` about the outcome `result` (its failure is `e.error` unless the event names one);
/// what the listener throws replaces `result`. False then.
template <class C, class R>
RESILIENCE_DETAIL_NOINLINE bool report(listener_ref l, const C& clock, telemetry_event e,
                                       outcome<R>& result) noexcept {
    if (!l)
        return true;
    if (!e.error && result.has_failure())
        e.error = &result.error();
    if (std::optional<failure> thrown = emit_caught(l, clock, std::move(e))) {
        result = outcome<R>{std::move(*thrown)};
        return false;
    }
    return true;
}

/// `report_ended`'s part that does not depend on the result type: returns what the listener or the
/// clock threw.
template <class C>
RESILIENCE_DETAIL_NOINLINE std::optional<failure>
reported_ended(listener_ref l, const C& clock, typename C::time_point begun, telemetry_event& e) noexcept {
    try {
        const typename C::time_point now = clock.now();
        e.duration = saturating_nanoseconds(now - begun);
        e.at = since_epoch(now);
        l(e);
        return std::nullopt;
    } catch (...) {
        return failure::current();
    }
}

/// Reports that `result` ended something that began at `begun` on `clock` (`duration` is its
/// length, `at` its end); what the listener throws replaces `result`. False then. Inline: the call out
/// of line is `reported_ended`'s, made once whatever the result type.
template <class C, class R>
bool report_ended(listener_ref l, const C& clock, typename C::time_point begun, telemetry_event e,
                  outcome<R>& result) noexcept {
    if (!l)
        return true;
    if (!e.error && result.has_failure())
        e.error = &result.error();
    if (std::optional<failure> thrown = reported_ended(l, clock, begun, e)) {
        result = outcome<R>{std::move(*thrown)};
        return false;
    }
    return true;
}

/// Reports the refusal `f` (as `e.error`) and returns it, or what the listener threw instead.
template <class C>
RESILIENCE_DETAIL_NOINLINE failure refused(listener_ref l, const C& clock, telemetry_event e,
                                           failure f) noexcept {
    if (!l)
        return f;
    e.error = &f;
    if (std::optional<failure> thrown = emit_caught(l, clock, std::move(e)))
        return std::move(*thrown);
    return f;
}

} // namespace detail

} // namespace resilience
