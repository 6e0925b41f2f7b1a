// SPDX-License-Identifier: MIT
/// \file circuit_breaker/circuit_breaker.hpp
/// `circuit_breaker`: stops calling a dependency that keeps failing or dragging, then probes it back.
///
/// This file is the policy. Its states, options, events and metrics are in options.hpp, its refusals
/// in errors.hpp; the state the copies of a breaker share, with its state machine and its probes, in
/// state.hpp, one call's hold on it in call.hpp, and its samples in window.hpp.
#pragma once

#include "../classifier.hpp"
#include "../clock.hpp"
#include "../concepts.hpp"
#include "../context.hpp"
#include "../detail/config.hpp"
#include "../detail/shared_handle.hpp"
#include "../detail/snapshot_cell.hpp"
#include "../error.hpp"
#include "../outcome.hpp"
#include "../policy.hpp"
#include "../policy_kit.hpp"
#include "../task.hpp"
#include "../telemetry_event.hpp"
#include "call.hpp"
#include "errors.hpp"
#include "options.hpp"
#include "state.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace resilience::inline v0_2 {

/// Stops calling a dependency that keeps failing (or answering too slowly), refusing calls at
/// once for a while, then lets a few probe calls decide whether it has recovered.
///
/// - **closed**: calls run. It opens when `failure_threshold` consecutive failures are recorded,
///   or when, with at least `minimum_throughput` in the sample, the share of failures reaches
///   `failure_ratio` or the share of slow calls reaches `slow_call_ratio`: whichever comes first.
///   Rules are checked after each recorded call.
/// - **open**: every call is refused without running, with a `circuit_open_error` carrying
///   `retry_after()` (the exact time left) and `cause()` (the failure that opened it; null when
///   slowness or a handled value did). The break lasts `break_duration`, growing on consecutive
///   re-openings.
/// - **half_open**: once the break is over, exactly `probes` calls are admitted (even under many
///   concurrent callers; others are refused with `retry_after()` the current break duration);
///   when all of them succeed it closes, and any failure (or, with a `slow_call_ratio`, a slow
///   success) re-opens it. A probe whose result is not recorded (cancelled, or declined by
///   `should_handle`) frees its slot.
/// - **isolated**: refused with `circuit_isolated_error` (`retry_after()` is
///   `nanoseconds::max()`: no wait helps) until `reset()`, by hand.
///
/// Each refusal is told to `on_rejected`, then to the listener, and is a failure value
/// (`failure::make`), so `execute_outcome` reports it without an exception. An outcome is recorded
/// as a failure when `should_handle` handles it (default: every failure but cancellation, and an
/// `expected_like` value holding an error), and a failure never
/// when the caller's own stop token was stopped; a declined failure passes through unchanged, a
/// handled value is still returned. A result from a call admitted before the last change of state
/// is dropped. Time rules are read lazily from the clock: nothing runs while idle, and the move
/// from open to half-open happens (and is reported to `on_state_change`) when the first call after
/// the break arrives; `state()` already shows it without changing anything. Errors it makes carry
/// its `name`.
///
/// A cheap copyable handle: copies are the same breaker, thread-safe, usable from many event
/// loops at once. The state lives as long as any copy or any call that uses it (docs/core.md,
/// "Lifetimes"): reassigning the handle to reload the options is safe while calls run (the calls made
/// before finish on the old breaker), and `reconfigure` changes the options of this very breaker,
/// keeping its state (docs/reconfiguration.md). A closed breaker
/// admits with one atomic load, and a success that ends no run of failures and has no sample to enter is
/// recorded without a lock. Failures, samples and every other state lock a mutex briefly, never across the
/// action or user callbacks. The closed-state path allocates nothing.
///
///     rs::circuit_breaker breaker{{.failure_threshold = 5, .break_duration = 30s}};
///     rs::outcome<page> r = co_await breaker.execute_outcome(fetch);
///     if (!r && r.error().code() == rs::errc::circuit_open) { /* refused without an exception */ }
template <clock C = steady_clock>
class circuit_breaker : public policy_base<circuit_breaker<C>>,
                        public detail::shared_handle<circuit_breaker<C>, detail::breaker_core<C>> {
    using handle = detail::shared_handle<circuit_breaker<C>, detail::breaker_core<C>>;
    using config = typename detail::breaker_core<C>::config_block; // the options, and what comes of them

public:
    /// Polly's defaults: see `circuit_breaker_options`.
    circuit_breaker() : circuit_breaker(circuit_breaker_options{}) {}
    /// Validates `options` (`std::invalid_argument` naming the field and value). Starts no timer.
    RESILIENCE_DETAIL_CONSTRUCTOR explicit circuit_breaker(circuit_breaker_options options, C clock = C{})
        : handle(make_core(detail::with_default_trip(std::move(options)), std::move(clock))) {}

    // ---- the policy protocol (see policy.hpp): admitting and recording never wait ----
    static constexpr bool enter_never_waits = true;
    struct call_state {
        detail::pinned<config> options; // the options the call was admitted under; none if plain
        detail::breaker_call<C> call;   // records "ignored" if the call never finishes
    };

    template <class R>
    step enter(call_state& s, const context& ctx, std::optional<outcome<R>>& result) const {
        detail::breaker_core<C>& core = this->held();
        const detail::listener_ref sink(detail::context_access::telemetry(ctx),
                                        detail::context_access::properties(ctx));
        // Closed under plain options: admitted at two loads, judged under the plain block, and
        // nothing pinned (see `breaker_config::plain`).
        if (typename detail::breaker_core<C>::admission a; !ctx.stop_requested() && core.admit_plain(a)) {
            s.call.start(core, a, sink);
            return step::proceed;
        }
        return enter_pinned(s, ctx, result, sink);
    }

    /// Records the result. A classifier or `on_state_change` that throws replaces the result with
    /// its exception, once the result is recorded (as neither success nor failure when the
    /// classifier threw, so a probe slot is freed).
    template <class R>
    step leave(call_state& s, const context& ctx, outcome<R>& result) const {
        detail::breaker_core<C>& core = this->held();
        if (s.call.config().options.should_handle.plain_success(result)) {
            try {
                s.call.finish(core, detail::breaker_verdict::success, nullptr);
            } catch (...) {
                result = outcome<R>{failure::current()};
            }
            return step::proceed;
        }
        leave_judged(s, ctx, result);
        return step::proceed;
    }

    /// The state now, with open turned half-open once the break is over. Changes nothing.
    [[nodiscard]] circuit_state state() const { return this->held().state(); }
    /// A snapshot taken at one instant. Changes nothing.
    [[nodiscard]] circuit_metrics metrics() const { return this->held().metrics(); }
    /// Holds the circuit open, refusing every call with `circuit_isolated_error`, until `reset()`.
    /// An exception from `on_state_change` reaches the caller, after the change.
    void isolate() const { this->held().isolate(); }
    /// Closes the circuit and forgets everything: the sample, runs of failures and openings.
    /// Results of calls still in flight are dropped. An exception from `on_state_change`
    /// reaches the caller, after the change.
    void reset() const { this->held().reset(); }

    /// Puts new options in force while calls run, keeping the breaker's state. `options` is checked
    /// exactly as by the constructor (`std::invalid_argument` naming the field and the value) and
    /// gets the same default trip; when it is refused, nothing changes. Thread-safe against calls
    /// and other reconfigurations (it takes the breaker's lock briefly).
    ///
    /// - Calls admitted from now on are judged under the new options; a call in flight finishes
    ///   under those it was admitted with: its classification (`should_handle`), its slowness, its
    ///   `on_rejected`, and the name in its errors.
    /// - What the breaker does next follows the new options: the rules the next result is recorded
    ///   under (a run already at a lowered `failure_threshold` opens at the next recorded failure,
    ///   not at once), the length of the next break, the probes half-open admits. Changes of state
    ///   are told to the `on_state_change` and `telemetry` of the options in force when they happen.
    /// - Carried over: the state. Open stays open until the end of its break as scheduled; isolated
    ///   stays isolated; half-open keeps its probes in flight, and admits more only while fewer than
    ///   the new `probes` have been admitted, closing once the new `probes` have succeeded (at once,
    ///   told to `on_state_change` before `reconfigure` returns, when as many have already). The run
    ///   of consecutive failures and the count of consecutive openings are kept (so the growth of
    ///   the breaks goes on from where it was, with the new `break_duration`, growth and cap), and
    ///   so are the cause the circuit opened with and the generation (results of calls admitted
    ///   before the change still count).
    /// - The sample is kept when the new options sample alike (the same `calls`, or the same
    ///   `window` and `segments`, and the same `slow_call_duration`; the ratios and
    ///   `minimum_throughput` may change, and apply from the next recorded call). Otherwise the
    ///   breaker starts a fresh, empty sample, which only calls admitted from now on enter: the old
    ///   counts were taken over another window, or under another idea of slow.
    ///
    /// Memory: the options replaced are freed once no call admitted under them is still running
    /// (a call in flight keeps those it was admitted with). Options the same as those in force (the
    /// same values, and classifier and listener copies of those in force, and no `on_state_change`
    /// or `on_rejected`, which cannot be compared) change nothing and allocate nothing. A change
    /// that starts a new sample allocates it.
    void reconfigure(circuit_breaker_options options) const {
        options = detail::with_default_trip(std::move(options));
        detail::validate_breaker_options(options);
        this->held().reconfigure(std::move(options));
    }

    /// A copy of the options in force: as given to the constructor or the latest `reconfigure`,
    /// with Polly's default `sampling` filled in when they set no trip condition.
    [[nodiscard]] circuit_breaker_options options() const { return this->held().options(); }
    [[nodiscard]] const C& clock() const noexcept { return this->held().clock(); }
    /// The `name` option (empty when unnamed).
    [[nodiscard]] std::string name() const { return this->held().options().name; }

private:
    // Every admission but a closed breaker's under plain options: the call pins the options in
    // force, which it is judged under to its end (see `reconfigure`). What depends on the result
    // type is only where a refusal goes: the admission itself is made once per breaker type, and
    // this part is inline, so that a call makes one call out of line, to `admit_pinned`.
    template <class R>
    step enter_pinned(call_state& s, const context& ctx, std::optional<outcome<R>>& result,
                      detail::listener_ref sink) const {
        std::optional<failure> refusal;
        return kit::settled(admit_pinned(s, ctx, sink, typeid(R), refusal), refusal, result);
    }

    // `returned`: the action's result type, which the classifier must accept. A refusal is put in
    // `refusal`, with `step::done`.
    RESILIENCE_DETAIL_NOINLINE step admit_pinned(call_state& s, const context& ctx, detail::listener_ref sink,
                                                 const std::type_info& returned,
                                                 std::optional<failure>& refusal) const {
        detail::breaker_core<C>& core = this->held();
        s.options = core.pin();
        const config* const cfg = s.options.get();
        if (ctx.stop_requested() || !cfg->options.should_handle.accepts(returned)) {
            refusal.emplace(detail::refused_before_admission(&cfg->options.should_handle, returned,
                                                             "circuit_breaker", cfg->options.name));
            return step::done;
        }
        // Closed, with no call to time: admitted at one load, nothing else to decide.
        if (typename detail::breaker_core<C>::admission a; !cfg->times_calls() && core.admit_closed(a, cfg)) {
            s.call.start(core, a, sink);
            return step::proceed;
        }
        try {
            // The call's shared clock reading serves a slow-call rule's start time.
            auto ticket = cfg->times_calls() ? core.admit_under(cfg, kit::call_now(core.clock(), ctx), sink)
                                             : core.admit_under(cfg, sink);
            if (ticket.admitted) {
                s.call.start(core, ticket, sink);
                // Stopped while being admitted (by `on_state_change` or a listener as the breaker
                // turned half-open, or from another thread): runs nothing, and its probe slot goes back.
                if (ctx.stop_requested()) [[unlikely]] {
                    s.call.finish(core, detail::breaker_verdict::ignored, nullptr);
                    refusal.emplace(detail::cancelled_failure(cfg->options.name));
                    return step::done;
                }
                return step::proceed;
            }
            refusal.emplace(refuse(ticket, ctx));
        } catch (...) {
            // on_state_change or on_rejected threw (a probe slot is already given back), or the clock did
            refusal.emplace(failure::current());
        }
        return step::done;
    }

    // The refusals, out of the admission path.
    // Tells `on_rejected`, then the listener; what `on_rejected` throws propagates (the listener
    // hears nothing then), what the listener throws is returned instead of the refusal. Under the
    // options the call came with.
    failure refuse(const typename detail::breaker_core<C>::ticket& t, const context& ctx) const {
        const detail::breaker_core<C>& core = this->held();
        const circuit_breaker_options& o = t.config->options;
        const rejection_reason why =
            t.isolated ? rejection_reason::circuit_isolated : rejection_reason::circuit_open;
        if (o.on_rejected)
            o.on_rejected(rejection_event{o.name, why, t.retry_after}.with_properties(ctx.properties()));
        failure f = t.isolated ? failure::make(circuit_isolated_error{o.name})
                               : failure::make(circuit_open_error{o.name, t.retry_after, t.cause});
        const detail::listener_ref listener = kit::listener_for(o.telemetry, ctx);
        if (!listener)
            return f;
        telemetry_event e =
            detail::event(telemetry_kind::rejection, "circuit_breaker", o.name, ctx.attempt());
        e.reason = why;
        return detail::refused(listener, core.clock(), std::move(e), std::move(f));
    }

    // A failure, or a value the classifier looks at: judged, then recorded.
    template <class R>
    void leave_judged(call_state& s, const context& ctx, outcome<R>& result) const {
        detail::breaker_verdict v = detail::breaker_verdict::ignored;
        std::exception_ptr cause;
        std::optional<failure> thrown;
        if (!(result.has_failure() && ctx.stop_requested())) {
            try {
                v = detail::verdict_of(s.call.config(), result, &ctx);
                if (v == detail::breaker_verdict::failure && result.has_failure())
                    cause = result.error().exception();
            } catch (...) {
                v = detail::breaker_verdict::ignored;
                thrown.emplace(failure::current());
            }
        }
        try {
            s.call.finish(this->held(), v, cause);
        } catch (...) {
            if (!thrown)
                thrown.emplace(failure::current());
        }
        if (thrown)
            result = outcome<R>{std::move(*thrown)};
    }

    static detail::breaker_core<C>* make_core(circuit_breaker_options options, C clock) {
        detail::validate_breaker_options(options);
        return handle::make_state(std::move(options), std::move(clock));
    }
};

// clang-format off
circuit_breaker() -> circuit_breaker<steady_clock>;
circuit_breaker(circuit_breaker_options) -> circuit_breaker<steady_clock>;
template <clock C>
circuit_breaker(circuit_breaker_options, C) -> circuit_breaker<C>;
// clang-format on

} // namespace resilience

// The compiled mode instantiates these once, in resilience::compiled: declared `extern template` in a
// user's file, defined in the library's (detail/config.hpp, RESILIENCE_INSTANTIATE).
#if RESILIENCE_EXTERN_TEMPLATES
namespace resilience::inline v0_2 {
RESILIENCE_INSTANTIATE class circuit_breaker<steady_clock>;
RESILIENCE_INSTANTIATE class detail::breaker_core<steady_clock>;
RESILIENCE_INSTANTIATE void detail::delete_state(detail::breaker_core<steady_clock>*) noexcept;
RESILIENCE_INSTANTIATE struct detail::breaker_plain<void>;
} // namespace resilience
#endif
