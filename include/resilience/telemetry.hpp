// SPDX-License-Identifier: MIT
/// \file telemetry.hpp
/// The `telemetry` stage: one listener for a whole pipeline. The events, the listener and what each
/// policy reports are in telemetry_event.hpp.
#pragma once

#include "classifier.hpp"
#include "clock.hpp"
#include "concepts.hpp"
#include "context.hpp"
#include "detail/time.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "policy_kit.hpp"
#include "telemetry_event.hpp"

#include <string>
#include <utility>

namespace resilience::inline v0_2 {

/// The listener set once for a whole pipeline. Put first, it hands `listener` to every stage inside
/// it through the call's context (one pointer, read only where a policy reports), and reports a
/// `call` event when each call ends, with the call's length, its outcome and whether
/// `should_handle` handles that outcome (`telemetry_event::handled`). A stage with a listener of
/// its own (its options' `telemetry`) reports there instead. Stages outside it do not see it; an
/// inner `telemetry` stage takes over for the stages inside it.
struct telemetry_options {
    /// The `name` of its `call` events; empty: unnamed.
    std::string name{};
    /// Hears every event of the stages inside; empty: the stage does nothing at all.
    telemetry_listener listener{};
    /// Which outcomes of a call its `call` event marks `handled` (a failed call, for a dashboard):
    /// give it the classifier of the retry or breaker inside, so that a 503 they handle counts as one
    /// here too. Empty: a failure other than a cancellation, and an `expected_like` value holding an
    /// error. Asked only when a listener is set, about an outcome that is not a plain value. An
    /// outcome classifier works only with actions returning exactly its type (any other action fails
    /// at once with `std::invalid_argument`, as with every policy); what it throws becomes the
    /// call's failure.
    classifier should_handle{};
};

/// See `telemetry_options`. A stateless value; `C` times the calls. The listener is referred to by
/// the calls made through the stage, so the stage (like every policy) must outlive them.
///
///     rs::pipeline p{rs::telemetry{on_event}, rs::retry{}, breaker};  // every stage reports to on_event
///     rs::pipeline q{rs::retry{}, rs::telemetry{on_event}, breaker};  // the retry does not
template <clock C = steady_clock>
class telemetry : public policy_base<telemetry<C>> {
public:
    explicit telemetry(telemetry_options options, C clock = C{})
        : options_(std::move(options)), clock_(std::move(clock)) {}
    explicit telemetry(telemetry_listener listener, C clock = C{})
        : telemetry(telemetry_options{.listener = std::move(listener)}, std::move(clock)) {}

    [[nodiscard]] const telemetry_options& options() const noexcept { return options_; }
    [[nodiscard]] const telemetry_listener& listener() const noexcept { return options_.listener; }
    [[nodiscard]] const std::string& name() const noexcept { return options_.name; }
    [[nodiscard]] const C& clock() const noexcept { return clock_; }

    // ---- the policy protocol (see policy.hpp) ----
    static constexpr bool enter_never_waits = true;
    struct call_state {
        context inner; // the caller's, with the listener
        typename C::time_point start;
    };

    template <class R>
    entry enter(call_state& s, const context& ctx, std::optional<outcome<R>>& result) const {
        if (!options_.listener)
            return step::proceed;
        if (!options_.should_handle.template accepts<R>()) [[unlikely]] {
            result.emplace(options_.should_handle.template mismatch<R>("telemetry", options_.name));
            return step::done;
        }
        s.start = kit::call_now(clock_, ctx);
        s.inner = detail::context_access::derive(ctx);
        detail::context_access::set_telemetry(s.inner, &options_.listener);
        return entry::proceed_in(s.inner);
    }

    template <class R>
    step leave(call_state& s, const context& ctx, outcome<R>& result) const noexcept {
        if (options_.listener && ctx.stop_requested() && result.has_failure() &&
            detail::stands_for_a_stop(result.error())) [[unlikely]]
            return leave_stopped(s, ctx, result);
        if (options_.listener)
            detail::report_ended(
                detail::listener_ref(&options_.listener, detail::context_access::properties(ctx)), clock_,
                s.start,
                telemetry_event{.kind = telemetry_kind::call,
                                .policy = "telemetry",
                                .name = options_.name,
                                .attempt = ctx.attempt(),
                                .handled = handled(ctx, result)},
                result);
        return step::proceed;
    }

private:
    // A call stopped from outside this stage ends with `cancelled_error` (the driver makes it so where
    // the call ends, after this stage has left: docs/core.md, "A call its caller stopped"), so that is
    // what its event reports, not what the stopped attempt threw, and a caller's stop is not a failure
    // the classifier handled. `result` passes on unchanged, unless the listener throws.
    template <class R>
    RESILIENCE_DETAIL_NOINLINE step leave_stopped(call_state& s, const context& ctx,
                                                  outcome<R>& result) const noexcept {
        try {
            outcome<R> ended{failure::make(cancelled_error{options_.name})};
            if (!detail::report_ended(
                    detail::listener_ref(&options_.listener, detail::context_access::properties(ctx)), clock_,
                    s.start,
                    telemetry_event{.kind = telemetry_kind::call,
                                    .policy = "telemetry",
                                    .name = options_.name,
                                    .attempt = ctx.attempt(),
                                    .handled = false},
                    ended))
                result = std::move(ended); // the listener threw: that ends the call
        } catch (...) { // no memory for the error: no event, and the call ends as it would unheard
        }
        return step::proceed;
    }

    // Did `should_handle` handle the call's outcome? One that throws makes its exception the outcome,
    // reported as not handled.
    template <class R>
    bool handled(const context& ctx, outcome<R>& result) const noexcept {
        if (options_.should_handle.plain_success(result))
            return false;
        try {
            return options_.should_handle
                .classify(
                    result, [](const failure& f) noexcept { return !is_cancellation(f); }, &ctx)
                .handle;
        } catch (...) {
            result = outcome<R>{failure::current()};
            return false;
        }
    }

    telemetry_options options_;
    C clock_;
};

telemetry(telemetry_options) -> telemetry<steady_clock>;
telemetry(telemetry_listener) -> telemetry<steady_clock>;
template <clock C>
telemetry(telemetry_options, C) -> telemetry<C>;
template <clock C>
telemetry(telemetry_listener, C) -> telemetry<C>;

} // namespace resilience
