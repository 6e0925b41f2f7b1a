// SPDX-License-Identifier: MIT
/// \file policy_kit.hpp
/// `resilience::kit`: the hooks a policy of your own needs beyond `policy_base` and the protocol of
/// policy.hpp: the call's clock reading, answers from `enter` (a stop, a refusal), a classifier's
/// type check, user callbacks that throw, and telemetry. docs/writing_a_policy.md builds a whole
/// policy with them and states the protocol's rules; the library's own policies use the same hooks.
///
/// Every function here is a thin wrapper: it costs what the hook costs inside the library.
#pragma once

#include "classifier.hpp"
#include "context.hpp"
#include "detail/time.hpp"
#include "error.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "telemetry_event.hpp"

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2::kit {

// ---- the protocol, as types ----

/// A policy with the fast protocol: it has a `call_state` (and so `enter` and `leave`).
template <class P>
concept fast_policy = detail::fast_policy<P>;

/// False for a fast policy that declares `static constexpr bool enter_never_waits = true;`: the
/// pipeline then never calls its `run`. True for every other policy, which needs a `run` of its own
/// (or is of the waiting form, where `run` is all there is).
template <class P>
inline constexpr bool enter_may_wait = detail::enter_may_wait<P>;

/// For a `frame_wait<R>` that asked for room after itself (`extra_bytes`, docs/pipeline.md): where
/// that room begins, the first multiple of `alignof(std::max_align_t)` past the awaiter's end.
template <class A>
void* room_after(A* awaiter) noexcept {
    return detail::room_after(awaiter);
}

// ---- time ----

/// The time on `clock` for a policy admitting a call (in `enter` or `leave`): one reading shared by
/// every policy of the call that uses a clock of the same type, taken by the first that asks. The
/// reading is dropped when the call suspends, so a policy that waited (in `run`, `resume` or a
/// `frame_wait`) must read `clock.now()` instead.
template <class C>
typename C::time_point call_now(const C& clock, const context& ctx) {
    return detail::call_now(clock, ctx);
}

/// `clock.now() + d`, saturating at the clock's last time point: the deadline of a wait of `d` (not
/// negative) that begins now, safe for a `d` of `nanoseconds::max()` ("wait for ever").
template <class C>
typename C::time_point after(const C& clock, std::chrono::nanoseconds d) {
    return detail::add_saturating(clock.now(), d);
}

// ---- answers from `enter` ----

/// Ends the call in `enter` with `cancelled_error` made by the policy named `policy_name` (a caller
/// that stopped before the policy admitted it); returns `step::done`. Check with
/// `ctx.stop_requested()`, which makes no stop token. Out of line, so that the admissions that check
/// for a stop stay small.
template <class R>
RESILIENCE_DETAIL_NOINLINE step cancel(std::optional<outcome<R>>& result, const std::string& policy_name) {
    result.emplace(detail::cancelled_failure(policy_name));
    return step::done;
}

/// Ends the call in `enter` with `why` (a refusal of the policy's own, see `refused` to report it);
/// returns `step::done`. The action does not run, and `execute_outcome` returns `why` without
/// throwing.
template <class R>
step refuse(std::optional<outcome<R>>& result, failure why) {
    result.emplace(std::move(why));
    return step::done;
}

/// For a policy whose admission or wait is written once for every result type (docs/writing_a_policy.md,
/// rule 10: it answers the `step` and puts a refusal or a stop in `refusal`): moves that failure, if
/// there is one, into the call's `result`, and returns `how`. The only part of such a policy made
/// once per result type.
template <class R>
step settled(step how, std::optional<failure>& refusal, std::optional<outcome<R>>& result) {
    if (refusal)
        result.emplace(std::move(*refusal));
    return how;
}

/// For a policy with a `classifier` option: empty when `c` can judge the outcomes of an action
/// returning `R`; else the failure to end the call with before the action runs
/// (`std::invalid_argument` naming both types, as the library's policies report it). A classifier
/// is not a template, so this is known only when the call is made: check it in `enter` (or at the
/// top of `run`), before anything else.
template <class R>
std::optional<failure> mismatch(const classifier& c, const char* policy, const std::string& name) {
    if (c.template accepts<R>())
        return std::nullopt;
    return c.template mismatch<R>(policy, name);
}

// ---- user callbacks ----

/// Calls a user callback (a `std::function` or anything callable; an empty one is skipped) and
/// returns what it threw, as a failure, instead of throwing it. The rule of the library: a callback
/// that throws ends the call with its exception as the call's failure, after the policy's own
/// bookkeeping (a slot given back, a count recorded); so a policy calls its callbacks through this
/// and, when it returns a failure, finishes its bookkeeping and makes that failure the result.
template <class F, class... Args>
std::optional<failure> invoke_callback(const F& f, const Args&... args) noexcept {
    try {
        if constexpr (std::is_constructible_v<bool, const F&>) {
            if (!static_cast<bool>(f))
                return std::nullopt;
        }
        std::invoke(f, args...);
        return std::nullopt;
    } catch (...) {
        return failure::current();
    }
}

// ---- telemetry ----

/// Where a policy reports: a listener, or none (false: then build no event, nobody listens), with the
/// properties of the call, which the events reported through it carry (`telemetry_event::properties`).
/// Made from a `const telemetry_listener*` too (no properties), for events no one call makes.
using listener = detail::listener_ref;

/// The listener a policy reports to: its own (`options.telemetry`), else the one a `telemetry`
/// stage around the call put in the context, else none; with the call's properties.
inline listener listener_for(const telemetry_listener& own, const context& ctx) noexcept {
    return detail::listener_for(own, ctx);
}

/// An event of the usual shape. `policy` is a static string naming the kind of policy
/// ("priority_shedder"); `name` is its `name` option (the event refers to it: it must live as long as
/// the policy does); `attempt` is `ctx.attempt()`. Set the other fields (`reason`, `note`, `handled`
/// when your classifier judged the outcome) on the returned value; `at` is stamped when it is reported.
inline telemetry_event event(telemetry_kind kind, std::string_view policy, std::string_view name, int attempt,
                             std::chrono::nanoseconds duration = {},
                             const failure* error = nullptr) noexcept {
    return detail::event(kind, policy, name, attempt, duration, error);
}

/// Reports `e` to `l` (nothing if none), stamped with `clock`'s time; returns what the listener
/// threw, as a failure, instead of throwing it (make it the call's result: see `invoke_callback`).
template <class C>
std::optional<failure> emit(listener l, const C& clock, telemetry_event e) noexcept {
    return detail::emit_caught(l, clock, std::move(e));
}

/// Reports `e` about the outcome `result` (its failure becomes `e.error` unless `e` names one), for
/// `leave`: false when the listener threw, whose exception has then replaced `result`.
template <class C, class R>
bool report(listener l, const C& clock, telemetry_event e, outcome<R>& result) noexcept {
    return detail::report(l, clock, std::move(e), result);
}

/// As `report`, for something that began at `begun` on `clock` and ends now with `result`:
/// `e.duration` is its length.
template <class C, class R>
bool report_ended(listener l, const C& clock, typename C::time_point begun, telemetry_event e,
                  outcome<R>& result) noexcept {
    return detail::report_ended(l, clock, begun, std::move(e), result);
}

/// Reports the refusal `f` (as `e.error`, usually a `telemetry_kind::rejection`) and returns the
/// failure to end the call with: `f`, or what the listener threw instead.
template <class C>
failure refused(listener l, const C& clock, telemetry_event e, failure f) noexcept {
    return detail::refused(l, clock, std::move(e), std::move(f));
}

} // namespace resilience::kit
