// SPDX-License-Identifier: MIT
/// \file limiter/rate_limiter.hpp
/// `rate_limiter`: a token bucket refilled lazily from the clock, with a first-come-first-served queue.
#pragma once

#include "../clock.hpp"
#include "../detail/config.hpp"
#include "errors.hpp"
#include "handle.hpp"
#include "options.hpp"
#include "token_bucket.hpp"

#include <chrono>
#include <cstddef>
#include <string_view>
#include <utility>

namespace resilience::inline v0_2 {

/// Limits how often calls start: a token bucket of `token_limit` tokens (full at first) refilled
/// at `tokens_per_second`. Each admitted call spends exactly one token before it starts.
/// - Refilled lazily from the clock, never by a timer: an idle limiter costs nothing, and the
///   bucket never holds more than `token_limit` however long it idles.
/// - A call that finds no token waits, when `queue_limit` allows, in a queue served in arrival
///   order: while anyone waits, a new call queues behind them even if a token is there, so a
///   stream of new calls cannot starve the oldest. Only the front waiter watches the clock: it
///   sleeps until its token is due (exact on virtual time); when it is served or leaves, the next
///   one takes over. A waiter whose caller stops leaves the queue at once and fails with
///   `cancelled_error`.
/// - A call that may not wait (`queue_limit` 0 or reached) or that waited `queue_timeout` fails
///   with `rate_limited_error`, returned as a value through the pipeline, whose `reason()` says
///   which and whose `retry_after()` is how long until a token would be there for it, counting
///   the waiters before it. `on_rejected` is told of it before it is returned.
/// - With `priorities` (priority.hpp), a call of a class takes a token only while the tokens
///   reserved by the classes above it stay in the bucket; the queue is served highest class first
///   (arrival order above is then within a class), a newcomer queued in front of the waiter
///   watching the clock takes over from it, and a full queue gives up its lowest class's last
///   waiter to a newcomer of a higher class (`queue_full`). Without them a call pays one relaxed
///   load for the feature.
///
/// A copyable handle: copies share one bucket, which is thread-safe; event loops on several
/// threads may share it, and each waiter is resumed on the loop it waited on. While nobody waits,
/// a call takes its token with one atomic compare-and-swap, without a lock. A call made through a
/// handle needs only the shared state to live (some copy of the handle), not that handle object.
/// `C` serves every use of time (see `clock`); copies share one clock object, which must be
/// usable from every thread that calls through the limiter.
///
///     rs::rate_limiter api{{.token_limit = 10, .tokens_per_second = 5, .queue_limit = 100}};
///     auto r = co_await api.execute(call);              // waits for a token when needed
///     co_await api.take(stop);                          // or spend one directly
template <clock C = steady_clock>
class rate_limiter
    : public detail::limiter_handle<rate_limiter<C>, C, detail::token_bucket, rate_limiter_options> {
    using base = detail::limiter_handle<rate_limiter<C>, C, detail::token_bucket, rate_limiter_options>;

public:
    /// The `policy` of its telemetry events.
    static constexpr std::string_view telemetry_policy = "rate_limiter";

    RESILIENCE_DETAIL_CONSTRUCTOR explicit rate_limiter(rate_limiter_options options, C clock = C{})
        : base(meter_of(options), std::move(clock), options) {}

    /// Tokens in the bucket now (fractional while refilling), at most `token_limit`.
    [[nodiscard]] double tokens() const { return this->held().remaining(); }

    /// Puts `options` in force for every copy, while calls run. They are checked as the
    /// constructor checks them: invalid ones throw `std::invalid_argument` (naming the field and
    /// the value) and the options in force stay. Thread-safe against calls and other
    /// reconfigurations.
    ///
    /// New calls see the new options at once; a call already waiting finishes under the options
    /// it started waiting with (its name, `on_rejected`, listener), and an admitted call has
    /// nothing left to do with the limiter. What carries over:
    /// - the tokens: those earned up to the change are counted at the old rate (a full bucket
    ///   holds the old `token_limit`), fractions included, then kept, capped at the new
    ///   `token_limit`; from the change on, tokens accrue at the new `tokens_per_second`. A larger
    ///   `token_limit` adds no token at once: the bucket fills up to it at the new rate;
    /// - the queue: waiters stay queued, in their order, with their deadlines; the first one
    ///   times its token again by the new rate (it may come sooner or later than it was due);
    /// - a smaller `queue_limit` turns no waiter away: newcomers are refused until the queue is
    ///   under it; a `queue_timeout` applies to callers queued after the change.
    ///
    /// Memory: the options replaced are freed once no call that waited under them is still
    /// running (a call that takes its token at once keeps none). Options the same as those in
    /// force (the same values, a listener copied from those in force, and no `on_rejected`, which
    /// cannot be compared) change nothing and allocate nothing. With `priorities`, each distinct
    /// setting of them and `token_limit` keeps a small table of the classes' shares until the
    /// limiter goes.
    ///
    ///     api.reconfigure({.token_limit = 20, .tokens_per_second = 10, .queue_limit = 100});
    void reconfigure(rate_limiter_options options) const {
        detail::validate_rate_limiter_options(options);
        const std::size_t capacity = options.token_limit;
        const double rate = options.tokens_per_second;
        this->reconfigure_with(std::move(options),
                               [capacity, rate](detail::token_bucket& b, std::chrono::nanoseconds now) {
                                   b.reconfigure(capacity, rate, now);
                               });
    }

private:
    static detail::token_bucket meter_of(const rate_limiter_options& o) {
        detail::validate_rate_limiter_options(o);
        return detail::token_bucket{o.token_limit, o.tokens_per_second};
    }
};

rate_limiter(rate_limiter_options) -> rate_limiter<steady_clock>;
template <clock C>
rate_limiter(rate_limiter_options, C) -> rate_limiter<C>;

} // namespace resilience

// The compiled mode instantiates these once, in resilience::compiled: declared `extern template` in a
// user's file, defined in the library's (detail/config.hpp, RESILIENCE_INSTANTIATE).
#if RESILIENCE_EXTERN_TEMPLATES
namespace resilience::inline v0_2 {
RESILIENCE_INSTANTIATE class rate_limiter<steady_clock>;
RESILIENCE_INSTANTIATE class detail::limiter_handle<rate_limiter<steady_clock>, steady_clock,
                                                    detail::token_bucket, rate_limiter_options>;
RESILIENCE_INSTANTIATE struct detail::limiter_state<steady_clock, detail::token_bucket>;
RESILIENCE_INSTANTIATE struct detail::limiter_shared<steady_clock, detail::token_bucket,
                                                     rate_limiter_options>;
RESILIENCE_INSTANTIATE void detail::delete_state(
    detail::limiter_shared<steady_clock, detail::token_bucket, rate_limiter_options>*) noexcept;
RESILIENCE_INSTANTIATE class detail::queue_awaiter<detail::limiter_state<steady_clock, detail::token_bucket>,
                                                   false>;
RESILIENCE_INSTANTIATE class detail::queue_awaiter<detail::limiter_state<steady_clock, detail::token_bucket>,
                                                   true>;
RESILIENCE_INSTANTIATE void detail::stop_waiter(detail::limiter_state<steady_clock, detail::token_bucket>&,
                                                detail::waiter&);
RESILIENCE_INSTANTIATE class detail::snapshot_cell<detail::limiter_options_block<rate_limiter_options>>;
RESILIENCE_INSTANTIATE class detail::pinned<detail::limiter_options_block<rate_limiter_options>>;
} // namespace resilience
#endif
