// SPDX-License-Identifier: MIT
/// \file hedge/hedge.hpp
/// `hedge`: starts another attempt while a slow one is still running, keeps the first success, and
/// stops and awaits the others.
#pragma once

#include "../clock.hpp"
#include "../concepts.hpp"
#include "../context.hpp"
#include "../detail/label.hpp"
#include "../engine/default_clock.hpp"
#include "../error.hpp"
#include "../outcome.hpp"
#include "../policy.hpp"
#include "../task.hpp"
#include "options.hpp"
#include "race.hpp"

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <utility>

namespace resilience::inline v0_2 {

/// Sends the same work again when an attempt is slow, and keeps the first answer. A retry waits for
/// a failure, and a slow call is not one: waiting for it is how a p99 becomes a timeout.
///
/// - The first attempt starts at once. While no attempt has succeeded, another starts every
///   `delay` (measured from the last start), or at once when an attempt fails with an outcome
///   `should_handle` handles, up to `max_attempts` in all and while `budget` has a token for it.
/// - The first success wins. Every other attempt is asked to stop through its own stop token and
///   *awaited* before the call returns: no attempt outlives the call, so an action may safely
///   reference the caller's locals. The winner's token is never stopped.
/// - A failure `should_handle` does not handle (by default: a cancellation) ends the call with that
///   failure, after the others are stopped and awaited.
/// - If every attempt fails, the failure that came last is the call's failure, exactly as it was
///   (or the last value it handled: an outcome classifier's, or an `expected_like` error).
/// - A stop requested by the caller stops every attempt (each attempt's token is linked to the
///   caller's), starts no more, and, once they have finished, ends the call with the first value
///   one of them returned all the same, or else `cancelled_error` (never with what a stopped
///   attempt threw). A caller already stopped is refused without running the action.
///
/// Each attempt sees `ctx.attempt()` = 1, 2, ... (send each to another replica) and a stop token of
/// its own. Only hedge what is safe to run twice: reads, or writes an idempotency key makes safe.
///
/// Cost: one coroutine frame for the hedge and one per attempt (recycled: nothing is allocated
/// after warm-up), one timer armed and disarmed per call whose first attempt does not finish at
/// once, and no stop source unless an attempt asks for its token. `max_attempts` 1 runs the call
/// in the pipeline's own frame, like a plain call.
///
/// A stateless value; `C` serves every use of time. On a clock whose timers are an event loop's
/// the delay is a timer of the loop the call runs on; any other clock sleeps beside the attempts.
/// Attempts may finish on other threads: the hedge always carries on on the caller's loop. Called as
/// an lvalue, the hedge must outlive its calls; on an rvalue it is moved into the call:
///
///     rs::hedge h{{.max_attempts = 3, .delay = 200ms}};
///     auto v = co_await h.execute(read_replica);                             // OK: h outlives the call
///     rs::task<int> also_ok() { return rs::hedge{}.execute(read_replica); }  // OK: moved into the call
///     rs::task<int> bad(rs::hedge<> h) { return h.execute(read_replica); }   // dangling: h dies first
template <clock C = steady_clock>
class hedge : public policy_base<hedge<C>> {
public:
    hedge() : hedge(hedge_options{}) {}
    /// Validates `options`: a bad value throws `std::invalid_argument` naming the field and value.
    explicit hedge(hedge_options options, C clock = C{})
        : options_(std::move(options)), clock_(std::move(clock)) {
        const auto bad = [this](const std::string& what) {
            throw std::invalid_argument(detail::policy_label("hedge", options_.name) + ": " + what);
        };
        if (options_.max_attempts < 1)
            bad("max_attempts must be at least 1, got " + std::to_string(options_.max_attempts));
        if (!options_.delay.is_schedule() && options_.delay.duration() < std::chrono::nanoseconds::zero())
            bad("delay must not be negative, got " + std::to_string(options_.delay.duration().count()) +
                "ns");
    }

    [[nodiscard]] const hedge_options& options() const noexcept { return options_; }
    [[nodiscard]] const C& clock() const noexcept { return clock_; }
    /// The `name` option (empty when unnamed).
    [[nodiscard]] const std::string& name() const noexcept { return options_.name; }

    /// Whether a call through this hedge may sleep on the default clock: a second attempt may
    /// follow a delay longer than zero and not "never" (a schedule may give any delay; see
    /// `detail::default_clock_sleeper`).
    [[nodiscard]] detail::sleeper may_sleep_on_default_clock() const noexcept {
        if (!detail::is_default_clock(clock_) || options_.max_attempts < 2)
            return {};
        const hedge_delay& d = options_.delay;
        if (!d.is_schedule() && (d.duration() <= std::chrono::nanoseconds::zero() ||
                                 d.duration() == std::chrono::nanoseconds::max()))
            return {};
        return {"hedge", "its delay"};
    }

    // ---- the policy protocol (see policy.hpp) ----
    // Racing attempts need frames of their own, so a hedge that may hedge always waits (`run`);
    // with `max_attempts` 1 it admits the call in the pipeline's frame, as a retry of one attempt.
    struct call_state {
        context inner; // attempt 1, when the context coming in says otherwise
    };

    template <class R>
    entry enter(call_state& s, const context& ctx, std::optional<outcome<R>>& result) const {
        if (options_.max_attempts > 1)
            return step::wait;
        if (auto refused = admit<R>(ctx)) {
            result.emplace(std::move(*refused));
            return step::done;
        }
        if (ctx.attempt() != 1) {
            s.inner = detail::context_access::derive_attempt(ctx, 1);
            return entry::proceed_in(s.inner);
        }
        return step::proceed;
    }

    template <class R>
    step leave(call_state&, const context&, const outcome<R>&) const noexcept {
        return step::proceed;
    }

    /// The whole call: the race of attempts.
    template <class Next>
    task<detail::next_outcome_t<Next>> run(Next next, const context& ctx) const {
        using O = detail::next_outcome_t<Next>;
        if (auto refused = admit<typename O::value_type>(ctx))
            co_return O{std::move(*refused)};
        if (options_.max_attempts == 1) {
            const context first = detail::context_access::derive_attempt(ctx, 1);
            co_return co_await next(first);
        }
        detail::hedge_race<C, Next, O> race{options_, clock_, next, ctx};
        race.begin();
        while (race.busy()) {
            co_await race.wait();
            race.drain();
        }
        co_return race.finish();
    }

private:
    // Refuses a call the hedge cannot run; otherwise records it with the budget.
    template <class R>
    std::optional<failure> admit(const context& ctx) const {
        if (ctx.stop_requested())
            return failure::make(cancelled_error{options_.name});
        if (!options_.should_handle.template accepts<R>())
            return failure::make(std::invalid_argument(
                detail::policy_label("hedge", options_.name) + ": should_handle classifies rs::outcome<" +
                detail::type_name(*options_.should_handle.value_type()) + "> but the action returns " +
                detail::type_name(typeid(R))));
        if (options_.budget)
            options_.budget->record_call();
        return std::nullopt;
    }

    hedge_options options_;
    C clock_;
};

hedge() -> hedge<steady_clock>;
hedge(hedge_options) -> hedge<steady_clock>;
template <clock C>
hedge(hedge_options, C) -> hedge<C>;

} // namespace resilience
