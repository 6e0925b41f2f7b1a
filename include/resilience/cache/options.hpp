// SPDX-License-Identifier: MIT
/// \file cache/options.hpp
/// The options of a `cache` (cache.hpp), their checks, and when two sets of them are the same (a
/// reconfiguration between them changes nothing).
#pragma once

#include "../classifier.hpp"
#include "../detail/label.hpp"
#include "../telemetry_event.hpp"

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <utility>

namespace resilience::inline v0_2 {

/// Options of a `cache` of `T` values. Validated at construction: a bad value throws
/// `std::invalid_argument` naming the field and the value.
template <class T>
struct cache_options {
    /// Names the cache in its errors, events and messages. Empty: unnamed.
    std::string name{};
    /// How long a stored value is fresh (answers without a call), unless `ttl_of` says otherwise
    /// for it. Positive.
    std::chrono::nanoseconds ttl = std::chrono::minutes{1};
    /// How long after it expires a value still answers at once, while one refresh runs meanwhile
    /// (RFC 5861's stale-while-revalidate). Zero: callers of an expired entry wait for the refresh.
    /// Not negative.
    std::chrono::nanoseconds stale_while_revalidate{};
    /// How long after it expires a value may answer in place of a failed refresh (RFC 5861's
    /// stale-if-error). Zero: a failed refresh's failure is what its callers get. Not negative.
    std::chrono::nanoseconds stale_if_error{};
    /// Entries kept at most; a new one beyond this evicts the least recently used. Positive.
    std::size_t max_entries = 1024;
    /// How long a failure `should_handle` handles is remembered and answered without a call
    /// (negative caching). Zero: failures are not remembered. Not negative.
    std::chrono::nanoseconds negative_ttl{};
    /// Which outcomes are failures to remember for `negative_ttl`. Empty: every failure but a
    /// cancellation and the library's own refusals (open breaker, full bulkhead, rate limit,
    /// throttle); a timeout is remembered. A returned value it handles (an `outcome<T>` classifier
    /// saying a 503 response is handled, or an `expected_like` value holding an error) is a
    /// failure too: never stored as a value, remembered like a failure, and replaced by a stale
    /// value within `stale_if_error`. A cancellation is never remembered, whatever it says.
    classifier should_handle{};
    /// The time to live of one value, from the value itself (an HTTP response's
    /// `Cache-Control: max-age`: `.ttl_of = [](const reply& r) { return rs::http::max_age(r); }`).
    /// Empty, or nullopt for a value: `ttl`. Zero (and, clamped to zero, a negative result): the
    /// value is stored already expired, usable only within the stale windows. Called by the call
    /// that made the value, outside the cache's lock; what it throws becomes that call's failure.
    std::function<std::optional<std::chrono::nanoseconds>(const T&)> ttl_of{};
    /// Hears `cache_hit`, `cache_miss` and `stale_served` (see docs/cache.md, "Telemetry"). Empty:
    /// the listener of a `telemetry` stage around it, if any (in a pipeline).
    telemetry_listener telemetry{};
};

namespace detail {

/// Whether `a` and `b` (`cache_options<T>`) are the same options: a reconfiguration from one to
/// the other changes nothing. The classifier and the listener compare by identity (copies of one
/// are the same); options with a `ttl_of` are never the same as any (it cannot be compared).
template <class Options>
bool same_cache_options(const Options& a, const Options& b) noexcept {
    return !a.ttl_of && !b.ttl_of && a.name == b.name && a.ttl == b.ttl &&
           a.stale_while_revalidate == b.stale_while_revalidate && a.stale_if_error == b.stale_if_error &&
           a.max_entries == b.max_entries && a.negative_ttl == b.negative_ttl &&
           a.should_handle.same_as(b.should_handle) && a.telemetry.same_as(b.telemetry);
}

/// `o` (a `cache_options<T>`), or `std::invalid_argument` naming the first bad field and its value.
template <class T, class Options>
Options validated_cache_options(Options o) {
    const std::string label = policy_label("cache", o.name);
    const auto bad = [&](const char* field, const char* rule, std::chrono::nanoseconds v) {
        throw std::invalid_argument(label + ": " + field + " must be " + rule + ", got " +
                                    std::to_string(v.count()) + "ns");
    };
    if (o.ttl <= std::chrono::nanoseconds::zero())
        bad("ttl", "positive", o.ttl);
    if (o.stale_while_revalidate < std::chrono::nanoseconds::zero())
        bad("stale_while_revalidate", "zero or positive", o.stale_while_revalidate);
    if (o.stale_if_error < std::chrono::nanoseconds::zero())
        bad("stale_if_error", "zero or positive", o.stale_if_error);
    if (o.max_entries == 0)
        throw std::invalid_argument(label + ": max_entries must be positive, got 0");
    if (o.negative_ttl < std::chrono::nanoseconds::zero())
        bad("negative_ttl", "zero or positive", o.negative_ttl);
    if (!o.should_handle.template accepts<T>())
        throw std::invalid_argument(label + ": should_handle classifies rs::outcome<" +
                                    type_name(*o.should_handle.value_type()) + "> but the cache holds " +
                                    type_name(typeid(T)));
    return o;
}

} // namespace detail

} // namespace resilience
