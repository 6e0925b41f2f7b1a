// SPDX-License-Identifier: MIT
/// \file adaptive_throttle/adaptive_throttle.hpp
/// `adaptive_throttle`: refuses calls locally, at random, in proportion to how much of what it sent
/// the dependency has been refusing lately, so an overloaded dependency is not sent what it would
/// refuse anyway. Its options are in options.hpp, its refusal in errors.hpp, its window in state.hpp.
#pragma once

#include "errors.hpp"
#include "options.hpp"
#include "state.hpp"

#include "../classifier.hpp"
#include "../clock.hpp"
#include "../concepts.hpp"
#include "../context.hpp"
#include "../outcome.hpp"
#include "../policy.hpp"
#include "../policy_kit.hpp"
#include "../random.hpp"
#include "../task.hpp"
#include "../telemetry_event.hpp"

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>

namespace resilience::inline v0_2 {

/// Client-side adaptive throttling, as the Google SRE book's "Handling Overload" chapter describes
/// it. Over a sliding `window`, the throttle counts the *requests* (every call made through it,
/// those it refuses itself included) and the *accepts* (the calls whose outcome `should_handle`
/// does not handle), and refuses each new call, before it is sent, with probability
///
///     p = max(0, (requests - k * accepts) / (requests + 1))
///
/// as the window stands when the call arrives (the call itself is counted after). While the
/// dependency accepts at least one call in `k`, `p` is 0 and nothing is refused; as it refuses
/// more, the throttle sends less, and it sends again as accepts come back. `p` stays below 1, so
/// some calls always go through to find out. A refused call fails with `throttled_error` (a failure
/// value: `execute_outcome` reports it without an exception), reported to the listener as a
/// `rejection`; `is_transient` says no, so a default retry around the throttle does not retry it.
///
/// - A request is counted when the call arrives; an accept when the call ends, at that instant.
///   Each stops counting exactly `segments` segments after the start of its own (see `segments`).
/// - Cancellation is not a refusal: a call that ends with a failure after it was stopped from outside
///   (its caller, a timeout around the throttle) is an accept. A call stopped before it arrives is refused
///   with `cancelled_error` and not counted.
/// - The draw uses `Random` under the throttle's lock, so even a `seeded_random` may be shared by
///   threads; the same calls at the same instants with the same seed give the same decisions. No
///   draw is made while `p` is 0.
///
/// A cheap copyable handle: copies are the same throttle, thread-safe, usable from many event
/// loops at once. The state lives as long as any copy or any call that uses it (docs/core.md,
/// "Lifetimes"). Admitting a call locks a mutex briefly and
/// reads the clock (the call's shared reading). Counting an accept reads the clock (a fresh reading)
/// and is one atomic increment, without the lock, unless the call ends in a later segment of the
/// window than any call before it. An admitted call allocates nothing; a refusal allocates its
/// `throttled_error`, and throws nothing.
///
///     rs::adaptive_throttle throttle{{.k = 2.0, .window = 2min}};
///     rs::pipeline p{rs::retry{}, throttle, rs::timeout{1s}};   // every attempt is a request
///     rs::outcome<page> r = co_await p.execute_outcome(fetch);
///     if (!r && r.error().code() == rs::errc::throttled) { /* not sent: the dependency is refusing */ }
template <clock C = steady_clock, random_source Random = thread_random>
class adaptive_throttle
    : public policy_base<adaptive_throttle<C, Random>>,
      public detail::shared_handle<adaptive_throttle<C, Random>, detail::throttle_core<C, Random>> {
    using core_type = detail::throttle_core<C, Random>;
    using handle = detail::shared_handle<adaptive_throttle<C, Random>, core_type>;
    using config = typename core_type::config_block;

public:
    /// The SRE book's values: see `adaptive_throttle_options`. (A constructor of its own rather than
    /// defaulted options, so that a clock or a source without a default is asked for only when used.)
    adaptive_throttle() : adaptive_throttle(adaptive_throttle_options{}) {}
    /// Validates `options` (`std::invalid_argument` naming the field and value). Starts no timer.
    explicit adaptive_throttle(adaptive_throttle_options options, C clock = C{}, Random rng = Random{})
        : handle(make_core(std::move(options), std::move(clock), std::move(rng))) {}

    // ---- the policy protocol (see policy.hpp): admitting and recording never wait ----
    static constexpr bool enter_never_waits = true;
    struct call_state {
        detail::pinned<config> cfg; // the options the call was admitted under, to its end
    };

    /// The call is judged under the options in force when it is admitted, which it pins in the
    /// same locked step (a stop or a classifier of another type: pinned before, to say so).
    template <class R>
    step enter(call_state& s, const context& ctx, std::optional<outcome<R>>& result) const {
        core_type& core = this->held();
        const std::type_info* const judged = core.value_type();
        if (ctx.stop_requested() || (judged && *judged != typeid(R))) [[unlikely]] {
            s.cfg = core.pin();
            const adaptive_throttle_options& o = s.cfg->options;
            if (ctx.stop_requested()) {
                result.emplace(failure::make(cancelled_error{o.name}));
                return step::done;
            }
            if (!o.should_handle.template accepts<R>()) {
                result.emplace(o.should_handle.template mismatch<R>("adaptive_throttle", o.name));
                return step::done;
            }
        }
        try {
            const std::optional<double> refused_with = core.admit(kit::call_now(core.clock(), ctx), s.cfg);
            const adaptive_throttle_options& o = s.cfg->options;
            // Reconfigured between the test above and the admission, to a classifier of another
            // type: the request is counted, the call is not run.
            if (!o.should_handle.template accepts<R>()) [[unlikely]] {
                result.emplace(o.should_handle.template mismatch<R>("adaptive_throttle", o.name));
                return step::done;
            }
            if (!refused_with)
                return step::proceed;
            if (o.on_rejected) // what it throws is the call's failure, below
                o.on_rejected(
                    rejection_event{o.name, rejection_reason::throttled}.with_properties(ctx.properties()));
            result.emplace(detail::refused(
                kit::listener_for(o.telemetry, ctx), core.clock(),
                detail::event(telemetry_kind::rejection, "adaptive_throttle", o.name, ctx.attempt()),
                failure::make(throttled_error{o.name, *refused_with})));
        } catch (...) {
            result.emplace(failure::current()); // the clock or `on_rejected` threw
        }
        return step::done;
    }

    /// Counts an accept unless `should_handle` handles the outcome. A classifier (or a clock) that
    /// throws makes its exception the call's failure, and nothing is counted.
    template <class R>
    step leave(call_state& s, const context& ctx, outcome<R>& result) const {
        core_type& core = this->held();
        try {
            if (accepted(s.cfg->options.should_handle, result, ctx))
                core.accept(*s.cfg, core.clock().now());
        } catch (...) {
            result = outcome<R>{failure::current()};
        }
        return step::proceed;
    }

    /// The rejection probability a call arriving now would be refused with. Changes nothing.
    [[nodiscard]] double probability() const {
        const auto c = counts();
        return detail::throttle_probability(c.requests, c.accepts, this->held().options().k);
    }
    /// The requests in the window now, refused ones included. Changes nothing.
    [[nodiscard]] std::uint64_t requests() const { return counts().requests; }
    /// The accepts in the window now. Changes nothing.
    [[nodiscard]] std::uint64_t accepts() const { return counts().accepts; }

    /// Puts new options in force while calls run, on every copy of the throttle. `options` is
    /// checked exactly as by the constructor (`std::invalid_argument` naming the field and the
    /// value); when it is refused, nothing changes. Thread-safe against calls and other
    /// reconfigurations (it takes the throttle's lock briefly).
    ///
    /// - Calls admitted from now on are judged under the new options; a call in flight finishes
    ///   under those it was admitted with (its `should_handle`, and the name and `on_rejected` of its
    ///   refusal).
    /// - The new `k` applies from the next call that arrives.
    /// - Carried over: the requests and accepts of the window, when `window` and `segments` are those
    ///   in force. Otherwise the throttle starts an empty window (the old counts were kept on another
    ///   grid), so it refuses nothing until the new window shows refusals again, and the accepts of
    ///   calls admitted before the change are not counted in it (their requests were not).
    /// - The random source is kept.
    ///
    /// Memory: the options replaced are freed once no call admitted under them is still running.
    /// Options the same as those in force (the same values, classifier and listener copies of those
    /// in force, and no `on_rejected`, which cannot be compared) change nothing and allocate
    /// nothing. A change of `window` or `segments` allocates the new window.
    void reconfigure(adaptive_throttle_options options) const {
        detail::validate_throttle_options(options);
        this->held().reconfigure(std::move(options));
    }

    /// A copy of the options in force: the constructor's or the latest `reconfigure`'s.
    [[nodiscard]] adaptive_throttle_options options() const { return this->held().options(); }
    [[nodiscard]] const C& clock() const noexcept { return this->held().clock(); }
    /// The `name` option (empty when unnamed).
    [[nodiscard]] std::string name() const { return this->held().options().name; }

private:
    typename core_type::snapshot counts() const { return this->held().counts(this->held().clock().now()); }

    // An accept unless the classifier handles it; a failure of a call its caller stopped is one.
    template <class R>
    static bool accepted(const classifier& handles, const outcome<R>& result, const context& ctx) {
        if (handles.plain_success(result) || (result.has_failure() && ctx.stop_requested()))
            return true;
        return !handles.classify(result, &not_cancellation, &ctx).handle;
    }
    static bool not_cancellation(const failure& f) noexcept { return !is_cancellation(f); }

    static core_type* make_core(adaptive_throttle_options options, C clock, Random rng) {
        detail::validate_throttle_options(options);
        return handle::make_state(std::move(options), std::move(clock), std::move(rng));
    }
};

// clang-format off
adaptive_throttle() -> adaptive_throttle<steady_clock, thread_random>;
adaptive_throttle(adaptive_throttle_options) -> adaptive_throttle<steady_clock, thread_random>;
template <clock C>
adaptive_throttle(adaptive_throttle_options, C) -> adaptive_throttle<C, thread_random>;
template <clock C, random_source R>
adaptive_throttle(adaptive_throttle_options, C, R) -> adaptive_throttle<C, R>;
// clang-format on

} // namespace resilience
