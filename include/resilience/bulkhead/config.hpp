// SPDX-License-Identifier: MIT
/// \file bulkhead/config.hpp
/// One configuration of a bulkhead as its calls see it (`bulkhead_config`: the options and what is
/// derived from them, immutable once published), and the test that tells a reconfiguration that
/// changes nothing (`same_bulkhead_options`).
#pragma once

#include "../classifier.hpp"
#include "../context.hpp"
#include "../detail/config.hpp"
#include "../detail/snapshot_cell.hpp"
#include "../priority.hpp"
#include "../queue_discipline.hpp"
#include "adaptive_limit.hpp"
#include "options.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>
#include <variant>

namespace resilience::inline v0_2::detail {

/// One configuration of a bulkhead, as its calls see it: the options and what is derived from
/// them, immutable. A call that needs it past its admission pins the block in force where it
/// starts and keeps it to its end (see `bulkhead_state::cell`), so it never sees a mix of two
/// configurations.
struct bulkhead_config : pinnable {
    explicit bulkhead_config(bulkhead_options o)
        : options(std::move(o)), should_handle(limit_classifier(options.adapt)),
          adaptive(should_handle != nullptr), times_calls(needs_latency(options.adapt)),
          priority(options.priorities), discipline(discipline_rule::of(options.queue_discipline)) {}

    const bulkhead_options options;
    const classifier* const should_handle; // the algorithm's, in `options`; null without `adapt`
    const bool adaptive;
    const bool times_calls;        // the algorithm needs each call's latency: its admission reads the clock
    const priority_table priority; // `options.priorities`, as admission uses it
    const discipline_rule discipline; // `options.queue_discipline`, as the queue applies it
    /// `adapt` or `priorities`: `bulkhead::enter` takes the longer way (one test on its fast path).
    const bool long_entry = adaptive || priority.enabled();

    /// The rank a call started with `ctx` waits at: its class with priorities, else 0.
    unsigned char rank_of(const context& ctx) const noexcept {
        return priority.enabled() ? static_cast<unsigned char>(priority.class_of(ctx)) : 0;
    }

    /// True when a sample like this changes nothing, whatever the algorithm's state: an AIMD quick
    /// success while nothing waits. Lets a call's end skip the lock.
    bool inert(std::chrono::nanoseconds latency, bool failed, bool limited) const noexcept {
        if (const aimd* a = std::get_if<aimd>(&options.adapt))
            return !failed && !limited && !(a->slow_call_duration && latency >= *a->slow_call_duration);
        return false;
    }

    /// `inert` in one word, for a call's end to read without pinning the block in force: 0 without
    /// `adapt`; else `aimd_bit` for AIMD, with its `slow_call_duration` in nanoseconds below it
    /// (`no_slow` when none), or `other_bit` for another algorithm.
    static constexpr std::uint64_t aimd_bit = std::uint64_t{1} << 63;
    static constexpr std::uint64_t other_bit = std::uint64_t{1} << 62;
    static constexpr std::uint64_t no_slow = other_bit - 1;
    std::uint64_t sample_word() const noexcept {
        if (const aimd* a = std::get_if<aimd>(&options.adapt)) {
            if (!a->slow_call_duration)
                return aimd_bit | no_slow;
            const auto ns = std::max<std::int64_t>(a->slow_call_duration->count(), 0);
            return aimd_bit | std::min<std::uint64_t>(static_cast<std::uint64_t>(ns), no_slow - 1);
        }
        return adaptive ? other_bit : 0;
    }
    /// `inert`, from a `sample_word()`.
    static bool inert(std::uint64_t word, std::chrono::nanoseconds latency, bool failed,
                      bool limited) noexcept {
        if (!(word & aimd_bit))
            return false;
        const std::uint64_t slow = word & no_slow;
        return !failed && !limited &&
               !(slow != no_slow &&
                 static_cast<std::uint64_t>(std::max<std::int64_t>(latency.count(), 0)) >= slow);
    }

private:
    static bool needs_latency(const adaptive_limit& a) noexcept {
        if (const aimd* m = std::get_if<aimd>(&a))
            return m->slow_call_duration.has_value();
        return std::holds_alternative<gradient>(a);
    }
};

/// Whether options `a` and `b` are the same: a reconfiguration from one to the
/// other changes nothing. Classifiers and listeners compare by identity (copies of one are the same);
/// options with an `on_rejected` are never the same as any (it cannot be compared).
inline bool same_bulkhead_options(const bulkhead_options& a, const bulkhead_options& b) noexcept {
    if (a.on_rejected || b.on_rejected || a.name != b.name ||
        a.max_concurrent_calls != b.max_concurrent_calls || a.queue_limit != b.queue_limit ||
        a.queue_timeout != b.queue_timeout || a.priorities.classes != b.priorities.classes ||
        a.priorities.reserved != b.priorities.reserved ||
        a.priorities.default_class != b.priorities.default_class ||
        discipline_rule::of(a.queue_discipline) != discipline_rule::of(b.queue_discipline) ||
        !a.telemetry.same_as(b.telemetry) || a.adapt.index() != b.adapt.index())
        return false;
    if (const aimd* x = std::get_if<aimd>(&a.adapt)) {
        const aimd& y = std::get<aimd>(b.adapt);
        return x->min == y.min && x->max == y.max && x->slow_call_duration == y.slow_call_duration &&
               x->decrease == y.decrease && x->should_handle.same_as(y.should_handle);
    }
    if (const gradient* x = std::get_if<gradient>(&a.adapt)) {
        const gradient& y = std::get<gradient>(b.adapt);
        return x->min == y.min && x->max == y.max && x->short_samples == y.short_samples &&
               x->long_samples == y.long_samples && x->tolerance == y.tolerance &&
               x->smoothing == y.smoothing && x->headroom == y.headroom &&
               x->should_handle.same_as(y.should_handle);
    }
    return true;
}

/// Throws `std::invalid_argument` naming the field and the value for the first thing wrong with `o`
/// (a bulkhead's constructor and `reconfigure` check with it).
RESILIENCE_DECL void validate_bulkhead_options(const bulkhead_options& o);

} // namespace resilience::detail

#if RESILIENCE_INCLUDE_DEFINITIONS
#include "config.ipp"
#endif
