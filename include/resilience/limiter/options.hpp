// SPDX-License-Identifier: MIT
/// \file limiter/options.hpp
/// The options of `rate_limiter` and `sliding_window_limiter`, and their checks.
///
/// The two share their queue's fields (`queue_limit`, `queue_timeout`, `priorities`,
/// `queue_discipline`, `on_rejected`, `telemetry`), documented once, on `rate_limiter_options`. Each
/// struct still declares them itself: users write `{.token_limit = 10, .tokens_per_second = 5,
/// .queue_limit = 100}`, and a designated initializer names only a struct's own members, not those
/// of a base or of a member struct.
#pragma once

#include "../detail/label.hpp"
#include "../detail/time.hpp"
#include "../error.hpp"
#include "../priority.hpp"
#include "../queue_discipline.hpp"
#include "../telemetry_event.hpp"

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace resilience::inline v0_2 {

/// How a `rate_limiter` admits calls. `token_limit` and `tokens_per_second` have no usable default;
/// the constructor checks every field (`std::invalid_argument` naming the limiter, the field and the
/// value).
///
/// A user callback (`on_rejected`) that throws ends the call with its exception as the call's
/// failure instead of the refusal (the listener then hears nothing); `execute_outcome` returns it,
/// `execute` throws it.
struct rate_limiter_options {
    /// Carried by the errors it makes (`policy_name()`), by `rejection_event`s and by `name()`.
    std::string name{};
    /// The burst after idle: how many tokens the bucket holds. It starts full. Must be positive.
    /// No default, as for the rate: only the user knows what the dependency allows.
    std::size_t token_limit = 0;
    /// The sustained rate: tokens added per second, lazily, as time passes. Finite and at least
    /// `min_tokens_per_second`. No default: a guessed rate would either throttle a dependency that
    /// could take more or let through more than it can take, silently; so a limiter made without
    /// one throws.
    double tokens_per_second = 0;
    /// The slowest rate accepted: a token every 31.7 years. The bucket counts in nanoseconds per
    /// token; a slower rate is refused (`std::invalid_argument`) rather than rounded, since its
    /// interval would not fit the times the limiter computes (a rate of 1e-300 would make it
    /// infinite, and the bucket would admit everything).
    static constexpr double min_tokens_per_second = 1e-9;
    /// How many calls may wait for a token; beyond that a call is refused at once
    /// (`rejection_reason::queue_full`). The default 0 refuses as soon as the bucket is empty
    /// (`no_capacity`); `rs::unbounded_queue` never refuses for want of a queue place.
    std::size_t queue_limit = 0;
    /// How long a call may wait in the queue before it is refused (`queue_timeout`), at exactly
    /// that instant; a token due at that very instant is still taken. Empty (the default): as
    /// long as it takes. Must be positive when set.
    std::optional<std::chrono::nanoseconds> queue_timeout{};
    /// Priority classes (priority.hpp): the share of `token_limit` reserved for each class, and the queue
    /// served highest class first, a full queue giving up its lowest class's last waiter to a
    /// newcomer of a higher class. A call's class is its `rs::priority` property; `take` is of the
    /// `default_class`. Empty (the default): every call alike, in arrival order, at no cost.
    priority_classes priorities{};
    /// Which waiter a token due goes to, and which waiters are shed while the queue stands
    /// (queue_discipline.hpp): `rs::fifo{}` (the default: arrival order, none shed), `rs::codel{...}`
    /// or `rs::adaptive_lifo{...}`, each with a `target` wait (5 ms) and an `interval` (100 ms), both
    /// positive. A waiter shed is refused with `rejection_reason::shed`. With `priorities`, it applies
    /// within each class, and no waiter is shed while one of a lower class waits.
    resilience::queue_discipline queue_discipline{};
    /// Called when the limiter refuses a call, before the refusal is returned, with its `reason()`
    /// and `retry_after()`. Not called for `take`, which returns its refusal to its own caller.
    /// Runs on the caller's coroutine, without any lock held; must not block.
    std::function<void(const rejection_event&)> on_rejected{};
    /// Hears this limiter's `rejection`s and `queue_wait`s. Empty: the listener of a `telemetry`
    /// stage around the call, if any (see telemetry.hpp).
    telemetry_listener telemetry{};
};

/// How a `sliding_window_limiter` admits calls. `permit_limit` and `window` have no usable default;
/// the constructor checks every field (`std::invalid_argument` naming the limiter, the field and the
/// value). A throwing `on_rejected` ends the call as for `rate_limiter_options`.
struct sliding_window_limiter_options {
    /// Carried by the errors it makes (`policy_name()`), by `rejection_event`s and by `name()`.
    std::string name{};
    /// How many calls any window-long span may admit. Must be positive. No default, as for the
    /// window: only the user knows what the dependency allows, and a guess would silently either
    /// throttle it or overload it; so a limiter made without them throws.
    std::size_t permit_limit = 0;
    /// The span. Must be positive.
    std::chrono::nanoseconds window{};
    /// How finely the window slides: permits come back in steps of `window / segments`. Positive
    /// and at most `window` in nanoseconds and `max_segments`.
    std::size_t segments = 10;
    /// The most `segments` accepted: one counter each is kept, so the bound caps the memory.
    static constexpr std::size_t max_segments = 1'000'000;
    /// How many calls may wait for a permit, as `rate_limiter_options::queue_limit` for a token:
    /// the default 0 refuses as soon as no permit is free.
    std::size_t queue_limit = 0;
    /// As `rate_limiter_options::queue_timeout`.
    std::optional<std::chrono::nanoseconds> queue_timeout{};
    /// As `rate_limiter_options::priorities`, the shares being of `permit_limit`.
    priority_classes priorities{};
    /// As `rate_limiter_options::queue_discipline`, for a permit.
    resilience::queue_discipline queue_discipline{};
    /// As `rate_limiter_options::on_rejected`.
    std::function<void(const rejection_event&)> on_rejected{};
    /// As `rate_limiter_options::telemetry`.
    telemetry_listener telemetry{};
};

} // namespace resilience

namespace resilience::inline v0_2::detail {

/// Checks the queue options the limiters share (`priorities` included); `who` starts the message.
/// `redis::rate_limiter` checks its own with it too.
template <class Options>
void validate_queue_options(const Options& o, const std::string& who) {
    if (o.queue_timeout && *o.queue_timeout <= std::chrono::nanoseconds::zero())
        throw std::invalid_argument(who + "queue_timeout must be positive, got " +
                                    std::to_string(o.queue_timeout->count()) + "ns");
    if constexpr (requires { o.priorities; }) // the limits shared through Redis have none
        priority_table::validate(o.priorities, who);
    if constexpr (requires { o.queue_discipline; }) // nor a queue discipline
        validate_queue_discipline(o.queue_discipline, who);
}

/// Throws `std::invalid_argument` naming the limiter, the field and the value unless `o` is valid.
inline void validate_rate_limiter_options(const rate_limiter_options& o) {
    const std::string who = policy_label("rate_limiter", o.name) + ": ";
    if (o.token_limit == 0)
        throw std::invalid_argument(who + "token_limit must be positive, got 0");
    if (!std::isfinite(o.tokens_per_second) || !(o.tokens_per_second > 0))
        throw std::invalid_argument(who + "tokens_per_second must be finite and positive, got " +
                                    format_number(o.tokens_per_second));
    if (o.tokens_per_second < rate_limiter_options::min_tokens_per_second)
        throw std::invalid_argument(who + "tokens_per_second must be at least 1e-9 (a token every " +
                                    "31.7 years), got " + format_number(o.tokens_per_second));
    validate_queue_options(o, who);
}

/// Throws `std::invalid_argument` naming the limiter, the field and the value unless `o` is valid.
inline void validate_sliding_window_limiter_options(const sliding_window_limiter_options& o) {
    const std::string who = policy_label("sliding_window_limiter", o.name) + ": ";
    if (o.permit_limit == 0)
        throw std::invalid_argument(who + "permit_limit must be positive, got 0");
    if (o.window <= std::chrono::nanoseconds::zero())
        throw std::invalid_argument(who + "window must be positive, got " + std::to_string(o.window.count()) +
                                    "ns");
    if (o.segments == 0)
        throw std::invalid_argument(who + "segments must be positive, got 0");
    if (o.segments > sliding_window_limiter_options::max_segments)
        throw std::invalid_argument(who + "segments must be at most " +
                                    std::to_string(sliding_window_limiter_options::max_segments) + ", got " +
                                    std::to_string(o.segments));
    if (o.segments > static_cast<std::uint64_t>(o.window.count()))
        throw std::invalid_argument(who + "segments must be at most the window in nanoseconds (" +
                                    std::to_string(o.window.count()) + "), got " +
                                    std::to_string(o.segments));
    validate_queue_options(o, who);
}

} // namespace resilience::detail
