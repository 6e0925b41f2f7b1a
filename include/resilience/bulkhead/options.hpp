// SPDX-License-Identifier: MIT
/// \file bulkhead/options.hpp
/// `bulkhead_options`: what a `bulkhead` is built and reconfigured with. The algorithms `adapt`
/// may hold (`aimd`, `gradient`) are in bulkhead/adaptive_limit.hpp; the checks of these options
/// are `bulkhead`'s (bulkhead/bulkhead.hpp), run by its constructor and `reconfigure`.
#pragma once

#include "../error.hpp"
#include "../priority.hpp"
#include "../queue_discipline.hpp"
#include "../telemetry_event.hpp"
#include "adaptive_limit.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>

namespace resilience::inline v0_2 {

/// How a `bulkhead` behaves. `bulkhead_options{}` lets 25 calls run at once and queues none.
///
/// A user callback (`on_rejected`, the `should_handle` of `adapt`) that throws ends the call with its
/// exception as the call's failure, after the bulkhead's own bookkeeping (a slot taken is given
/// back); `execute_outcome` returns it, `execute` throws it.
struct bulkhead_options {
    /// Carried by the errors it makes (`policy_name()`), by `rejection_event`s and by `name()`.
    std::string name{};
    /// The largest limit a bulkhead holds, 2^62 - 1: the most `max_concurrent_calls`, `adapt.min`
    /// and `adapt.max` may be. A limit shares one atomic word with two flags (see
    /// bulkhead/state.hpp), so that a slot costs one atomic operation.
    static constexpr std::size_t max_limit = static_cast<std::size_t>(
        std::min<std::uint64_t>((std::uint64_t{1} << 62) - 1, std::numeric_limits<std::size_t>::max()));
    /// How many calls may run at once. Positive, at most `max_limit`. 25 is resilience4j's
    /// default: a guess, like any default here; size it to what the dependency can serve. With
    /// `adapt`, the starting limit, within the algorithm's [`min`, `max`].
    std::size_t max_concurrent_calls = 25;
    /// How many more calls may wait for a slot; beyond that a call is refused at once
    /// (`rejection_reason::queue_full`). The default 0 refuses as soon as every slot is busy
    /// (`no_capacity`); `rs::unbounded_queue` never refuses for want of a queue place.
    std::size_t queue_limit = 0;
    /// How long a call may wait in the queue before it is refused (`queue_timeout`), at exactly
    /// that instant. Empty (the default): as long as it takes. Must be positive when set.
    std::optional<std::chrono::nanoseconds> queue_timeout{};
    /// Moves the limit with what the dependency manages: `rs::aimd{...}` or `rs::gradient{...}`
    /// (see bulkhead/adaptive_limit.hpp). Empty (the default): the limit stays `max_concurrent_calls`.
    adaptive_limit adapt{};
    /// Priority classes (priority.hpp): the share of the limit reserved for each class, and the
    /// queue served highest class first, a full queue giving up its lowest class's last waiter to
    /// a newcomer of a higher class. A call's class is its `rs::priority` property. With `adapt`,
    /// the shares are of the limit wherever it has moved. Empty (the default): every call alike,
    /// in arrival order, at no cost.
    priority_classes priorities{};
    /// Which waiter a freed slot goes to, and which waiters are shed while the queue stands
    /// (queue_discipline.hpp): `rs::fifo{}` (the default: arrival order, none shed), `rs::codel{...}`
    /// or `rs::adaptive_lifo{...}`, each with a `target` wait (5 ms) and an `interval` (100 ms),
    /// both positive. A waiter shed is refused with `rejection_reason::shed`. With `priorities`, it
    /// applies within each class, and no waiter is shed while one of a lower class waits.
    resilience::queue_discipline queue_discipline{};
    /// Called when the bulkhead refuses a call (`no_capacity`, `queue_full`, `queue_timeout`, `shed`: the
    /// event's `reason()`), before the refusal is returned and before the telemetry listener hears
    /// it; never for a call admitted. Runs on the refused call's coroutine; must not block.
    std::function<void(const rejection_event&)> on_rejected{};
    /// Hears this bulkhead's `rejection`s and `queue_wait`s. Empty: the listener of a `telemetry`
    /// stage around the call, if any (see telemetry.hpp).
    telemetry_listener telemetry{};
};

} // namespace resilience
