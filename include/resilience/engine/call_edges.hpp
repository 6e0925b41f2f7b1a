// SPDX-License-Identifier: MIT
/// \file engine/call_edges.hpp
/// The rules the driver applies at a whole call's edges, once, so that no policy has to: a call with
/// nowhere to sleep is refused before its first stage enters, a call its caller stopped ends with a
/// value or with `cancelled_error`, a stage that waits with nothing to go on in ends it with a
/// `std::logic_error`, and a wait or a stage that throws ends it with what it threw, as a failure.
#pragma once

#include "../context.hpp"
#include "../detail/config.hpp"
#include "../detail/inlining.hpp"
#include "../detail/stages.hpp"
#include "../error.hpp"
#include "../outcome.hpp"

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>

namespace resilience::inline v0_2::detail {

/// Whether a call its caller stopped ends with `cancelled_error` in place of `f` (see
/// `call_edges::caller_stopped`): every failure but a cancellation already, and a `std::logic_error`: a
/// setup mistake (a classifier for another result type) or a bug is reported as it is, stopped or not.
RESILIENCE_DECL bool stands_for_a_stop(const failure& f) noexcept;

/// The rules, for a call whose outcome is `Outcome` (`outcome<R>`).
template <class Outcome>
struct call_edges {
    // A stage answered `step::wait` with nothing to go on in: a `leave` with neither `resume` nor
    // `again`, or an `enter` of a policy that said it never waits. The call goes on outward with a
    // `std::logic_error` saying so.
    RESILIENCE_DETAIL_NOINLINE static void no_way_on(std::optional<Outcome>& result) {
        result.emplace(failure::make(std::logic_error(
            "resilience: a policy answered step::wait with nothing to go on in: a leave without resume or "
            "again, or an enter of a policy that declares enter_never_waits")));
    }
    // A wait of the call let an exception out (a clock whose sleep threw, in a stage's frame or in the
    // call's), or a stage's `enter`, `waits_in_frame` or `run` did: the call goes on outward with it as
    // its failure, so that `execute_outcome` returns it and the stages outside still leave. Called in a
    // handler.
    RESILIENCE_DETAIL_NOINLINE static void threw(std::optional<Outcome>& result) noexcept {
        result.emplace(failure::current());
    }
    // The same for a call that already has an outcome: a stage's `leave` or `again` let an exception
    // out, against the protocol; it replaces the outcome, and the stages outside go on leaving with it.
    RESILIENCE_DETAIL_NOINLINE static void threw(Outcome& result) noexcept {
        result = Outcome{failure::current()};
    }
    // The name a call's own `cancelled_error` carries: the outermost policy's (valid to the end of the
    // full expression that asks: some policies return their name by value).
    template <class S>
    static decltype(auto) outermost_name(const S& stages) {
        if constexpr (std::tuple_size_v<S> > 0 && requires { std::string_view{std::get<0>(stages).name()}; })
            return std::get<0>(stages).name();
        else if constexpr (std::tuple_size_v<S> > 0 && requires { std::string{std::get<0>(stages).name()}; })
            return std::string{std::get<0>(stages).name()};
        else
            return std::string_view{};
    }
    /// A call its caller stopped ends with a value an attempt returned, or with `cancelled_error`:
    /// never with what a stopped attempt threw when asked to stop (an Asio `operation_aborted`, an
    /// error of its own), nor with a failure from before the stop that a wait after it (a backoff)
    /// would have returned. Applied once, where the call ends, so that no policy has to; a stop from
    /// inside (a timeout's, a hedge's loser) does not reach the caller's token and changes nothing.
    /// Policies still make sure nothing runs or stands in after the stop (no retry, no hedged
    /// attempt, no substitute, no stale value): this only decides what the call ends with.
    /// Out of line: only a failed call gets here.
    template <class S>
    RESILIENCE_DETAIL_NOINLINE static void caller_stopped(const context& caller, Outcome& result,
                                                          const S& stages) {
        if (!caller.stop_requested() || !stands_for_a_stop(result.error()))
            return;
        result = Outcome{cancelled_failure(outermost_name(stages))};
    }

    /// A call with nowhere to sleep (no event loop runs on this thread, and nothing that started
    /// it, such as `rs::boost_asio::execute`, gave it a home) is refused before its first stage
    /// enters when one of its stages may sleep on the default clock: otherwise it would serve the
    /// happy path and fail with "a sleep needs an event loop" only when a retry first backs off or
    /// a timer first arms, during the incident the policy was meant to absorb.
    /// When refused, `result` holds the `std::logic_error` naming the fix and the answer is true.
    /// It writes to the call's result rather than returning one, so that the refusal takes no place
    /// of its own in every call's frame. Out of line: only a call without a home gets here.
    template <class S>
    RESILIENCE_DETAIL_NOINLINE static bool nowhere_to_sleep(const S& stages, std::optional<Outcome>& result) {
        std::string name;
        const sleeper found = first_default_clock_sleeper(stages, &name);
        if (!found)
            return false;
        result.emplace(failure::make(std::logic_error(nowhere_to_sleep_message(found, name))));
        return true;
    }
};

} // namespace resilience::detail

#if RESILIENCE_INCLUDE_DEFINITIONS
#include "../impl/call_edges.ipp"
#endif
