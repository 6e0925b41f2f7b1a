// SPDX-License-Identifier: MIT
/// \file balancer/state.hpp
/// What the copies of a `balancer` share: its endpoints (`endpoint_entry`), the block of options and
/// endpoints in force (`balancer_block`, replaced whole by a change of either), and the picking,
/// the latency estimates and the outlier ejection over them (`balancer_state`).
///
/// Locking: `balancer_state::changing` guards the membership, the options, and every ejection and
/// return (`times_ejected`, `ejected`, `next_evaluation`'s and `next_return`'s updates, the interval
/// counts' reset); a call takes it only when an interval has ended or an ejection's time is over (the
/// first call at or after those instants), and at the failure that ejects. An entry's latency estimate
/// is updated by compare-and-swap (`record_latency`). Everything a pick reads is atomic, read without a
/// lock.
#pragma once

#include "../detail/inlining.hpp"
#include "../detail/shared_handle.hpp"
#include "../detail/snapshot_cell.hpp"
#include "../properties.hpp"
#include "options.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace resilience::inline v0_2 {

/// The key under which a balancer of endpoints of type `E` puts the endpoint it picked on the
/// context of the attempt (`ctx.property(rs::endpoint_key<E>)`; `rs::endpoint<E>(ctx)` reads it).
template <class E>
inline constexpr property_key<E> endpoint_key{"endpoint"};

namespace detail {

/// No instant yet: before every time (a stamp, a slow start, an ejection's end that never was).
inline constexpr std::int64_t never = std::numeric_limits<std::int64_t>::min();
/// No instant to come: after every time (no interval to end, no ejection to end).
inline constexpr std::int64_t no_time = std::numeric_limits<std::int64_t>::max();

/// `a + b`, saturating: an ejection of `nanoseconds::max()` ends at no time, rather than wrapping.
inline std::int64_t plus(std::int64_t a, std::int64_t b) noexcept {
    if (b > 0 && a > no_time - b)
        return no_time;
    if (b < 0 && a < never - b)
        return never;
    return a + b;
}

/// One endpoint and what the balancer knows of it; shared by every block that lists it (a reference
/// each), so that it outlives the calls made to it after it leaves the set.
template <class E>
struct endpoint_entry {
    endpoint_entry(E v, std::uint32_t n, std::int64_t ramp, std::int64_t latency)
        : value(std::move(v)), id(n), estimate(latency), ramp_from(ramp) {
        if constexpr (std::is_convertible_v<const E&, std::string_view>)
            text = std::string(std::string_view(value));
    }
    const E value;
    const std::uint32_t id; // its bit in a call's endpoints tried (`id % 64`)
    std::string text;       // the endpoint as text, for events: when `E` converts to a string_view
    std::atomic<std::uint32_t> refs{1}; // the blocks listing it

    // ---- the load (picks read these without a lock) ----
    std::atomic<std::int32_t> in_flight{0};
    std::atomic<std::int64_t> estimate;     // peak-EWMA latency, fixed point (see `estimate_bits`)
    std::atomic<std::int64_t> stamp{never}; // when `estimate` was last updated

    // ---- ejection ----
    std::atomic<std::int64_t> ejected_until{never};    // picked again from then on
    std::atomic<std::int64_t> ramp_from;               // slow start began then (`never`: none)
    std::atomic<std::int32_t> consecutive{0};          // failures since the last success
    std::atomic<std::uint32_t> calls{0}, successes{0}; // ended in the current interval
    int times_ejected = 0;                             // under `changing`
    bool ejected = false;                              // under `changing`: ejected, its return not yet seen

    static void add_ref(endpoint_entry* e) noexcept { e->refs.fetch_add(1, std::memory_order_relaxed); }
    static void drop(endpoint_entry* e) noexcept {
        if (e->refs.fetch_sub(1, std::memory_order_acq_rel) == 1)
            delete e;
    }
};

/// The options and the endpoints in force, published together: a call pins the block it was admitted
/// under and keeps its options and its endpoint to its end.
template <class E>
struct balancer_block : pinnable {
    balancer_block(balancer_options o, std::vector<endpoint_entry<E>*> e) noexcept
        : options(std::move(o)), endpoints(std::move(e)) {}
    ~balancer_block() {
        for (endpoint_entry<E>* e : endpoints)
            endpoint_entry<E>::drop(e);
    }
    const balancer_options options;
    const std::vector<endpoint_entry<E>*> endpoints;
};

/// Latency estimates are kept in fixed point, in 2^-16 of a nanosecond (`estimate_bits` fraction bits):
/// an estimate moves toward a faster sample by (estimate - sample) x (time since its last update) /
/// `decay_time`, which for calls ending every microsecond under a 10 s `decay_time` is a few millionths of
/// the gap, and whole nanoseconds would round those steps to nothing and leave the estimate stuck above
/// the endpoint's latency. An estimate is at least 1 ns and at most `max_estimate_ns` (2^40 ns, about 18
/// minutes): a longer sample counts as that long, a shorter one (zero, on a coarse or virtual clock) as
/// 1 ns, so that a busy endpoint's load always grows with its calls in flight. With at most
/// `max_counted_in_flight` calls counted (more count as that many), a load, whole nanoseconds times
/// calls, fits in 63 bits.
inline constexpr int estimate_bits = 16;
inline constexpr std::int64_t max_estimate_ns = std::int64_t{1} << 40;
inline constexpr std::int64_t max_counted_in_flight = std::int64_t{1} << 22;

/// `ns` nanoseconds as an estimate (fixed point), within [1 ns, `max_estimate_ns`].
constexpr std::int64_t to_estimate(std::int64_t ns) noexcept {
    return std::clamp<std::int64_t>(ns, 1, max_estimate_ns) << estimate_bits;
}

/// The latency `e` is taken to have at `now` (fixed point, see `estimate_bits`): its estimate, decayed
/// toward 1 ns with the time constant `decay` (nanoseconds) since it was last updated (so an endpoint
/// that was slow once is tried again). The decay is skipped within a 64th of `decay` of the update,
/// where it would change the estimate by less than 2%: a pick's common case, in integers.
template <class E>
RESILIENCE_DETAIL_ALWAYS_INLINE std::int64_t decayed_estimate(const endpoint_entry<E>& e, std::int64_t now,
                                                              std::int64_t decay) noexcept {
    const std::int64_t est = e.estimate.load(std::memory_order_relaxed);
    const std::int64_t stamp = e.stamp.load(std::memory_order_relaxed);
    // `stamp` is `never` (the smallest value) before the first update: no decay then either.
    if (stamp == never || now - stamp <= (decay >> 6)) [[likely]]
        return est;
    const double decayed =
        static_cast<double>(est) * std::exp(-static_cast<double>(now - stamp) / static_cast<double>(decay));
    return std::max(std::int64_t{1} << estimate_bits, static_cast<std::int64_t>(decayed));
}

/// Records a latency sample of `took` nanoseconds ended at `now`: a sample above the estimate replaces
/// it (the peak); one below moves it toward the sample by the weight the time since the last update
/// gives. Lock-free: the estimate is replaced by compare-and-swap, so that calls ending at once on
/// several threads each count (a peak is never overwritten by a lower sample computed from an older
/// estimate); the stamp only moves forward. A stamp read beside another call's estimate is off by that
/// call's instant at most, which changes the weight by as little.
template <class E>
void record_latency(endpoint_entry<E>& e, std::int64_t now, std::int64_t took, double tau) noexcept {
    const std::int64_t sample = to_estimate(took);
    const std::int64_t stamp = e.stamp.load(std::memory_order_relaxed);
    const double age = stamp == never || now <= stamp ? 0.0 : static_cast<double>(now - stamp);
    const double keep = age == 0.0 ? 1.0 : std::exp(-age / tau);
    std::int64_t est = e.estimate.load(std::memory_order_relaxed);
    std::int64_t next;
    do // from the estimate as it is now: a failed exchange reloads it (the result lies between the two)
        next = sample < est ? static_cast<std::int64_t>(static_cast<double>(est) * keep +
                                                        static_cast<double>(sample) * (1.0 - keep) + 0.5)
                            : sample;
    while (!e.estimate.compare_exchange_weak(est, next, std::memory_order_relaxed));
    std::int64_t seen = stamp;
    while (seen < now && !e.stamp.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
}

/// The share of its fair share `e` takes at `now` (slow start), in (0, 1].
template <class E>
double slow_start_weight(const endpoint_entry<E>& e, std::int64_t now, const balancer_options& o) noexcept {
    if (o.slow_start_window.count() <= 0)
        return 1.0;
    const std::int64_t from = e.ramp_from.load(std::memory_order_relaxed);
    if (from == never || now >= plus(from, o.slow_start_window.count()))
        return 1.0;
    const double ramp =
        now <= from ? 0.0
                    : static_cast<double>(now - from) / static_cast<double>(o.slow_start_window.count());
    return std::max(o.slow_start_min_weight, ramp);
}

/// What the copies of a `balancer` share.
template <class E, class C, class Random>
struct balancer_state : shared_state {
    using entry = endpoint_entry<E>;
    using block = balancer_block<E>;

    balancer_state(balancer_options o, std::vector<E> endpoints, C c, Random r)
        : clock(std::move(c)), rng(std::move(r)),
          epoch(std::chrono::duration_cast<std::chrono::nanoseconds>(clock.now().time_since_epoch()).count()),
          cell(first_block(std::move(o), std::move(endpoints))) {
        const balancer_options& in_force = cell.locked()->options;
        next_evaluation.store(
            in_force.outlier_ejection ? plus(epoch, in_force.outlier_ejection->interval.count()) : no_time,
            std::memory_order_relaxed);
        refresh_due();
    }

    std::unique_ptr<block> first_block(balancer_options o, std::vector<E> endpoints) {
        std::vector<entry*> list;
        list.reserve(endpoints.size());
        try {
            for (E& v : endpoints)
                list.push_back(new entry(std::move(v), next_id++, never, initial(o)));
            return std::make_unique<block>(std::move(o), std::move(list));
        } catch (...) {
            for (entry* e : list)
                entry::drop(e);
            throw;
        }
    }
    static std::int64_t initial(const balancer_options& o) noexcept {
        return to_estimate(o.initial_latency.count());
    }

    // ---- membership and options (under `changing`) ----

    /// Puts in force a block of `o` over `list` (entries it takes a reference of), and recounts the
    /// ejected endpoints among them.
    void publish_locked(balancer_options o, std::vector<entry*> list) {
        auto next = std::make_unique<block>(std::move(o), std::move(list));
        for (entry* e : next->endpoints) // from here the block gives them back, whatever happens
            entry::add_ref(e);
        std::uint32_t out = 0;
        for (const entry* e : next->endpoints)
            out += e->ejected ? 1 : 0;
        cell.replace(std::move(next));
        ejected_count.store(out, std::memory_order_relaxed);
        next_return.store(earliest_return_locked(*cell.locked()), std::memory_order_relaxed);
        refresh_due();
    }
    /// A number for a new endpoint: the smallest below 64 not in `used` (the numbers of the endpoints it
    /// joins, one bit each), which it then marks, so that a call's endpoints tried (a bit a number) stay
    /// apart however often the set changes; past 64 endpoints, a number of its own.
    std::uint32_t number_locked(std::uint64_t& used) {
        if (~used == 0)
            return std::max<std::uint32_t>(64, next_id++);
        std::uint32_t id = 0;
        while ((used >> id) & 1)
            ++id;
        used |= std::uint64_t{1} << id;
        return id;
    }
    entry* make_entry(E v, std::uint32_t id, const balancer_options& o, std::int64_t now) {
        return new entry(std::move(v), id, o.slow_start_window.count() > 0 ? now : never, initial(o));
    }
    /// The earliest end of an ejection in `b` (`no_time`: none ejected).
    static std::int64_t earliest_return_locked(const block& b) noexcept {
        std::int64_t at = no_time;
        for (const entry* e : b.endpoints)
            if (e->ejected)
                at = std::min<std::int64_t>(at, e->ejected_until.load(std::memory_order_relaxed));
        return at;
    }

    // ---- ejection (under `changing`) ----

    /// Ejects `e` at `now` for `why`, unless it is out already or the set has its share out; returns
    /// how long the ejection lasts (zero: not ejected).
    std::chrono::nanoseconds eject_locked(entry& e, const block& b, std::int64_t now,
                                          const outlier_ejection_options& x) {
        if (e.ejected)
            return {};
        std::size_t out = 0;
        for (const entry* o : b.endpoints)
            out += o->ejected ? 1 : 0;
        if (out > 0 && static_cast<double>(out) * 100.0 >=
                           x.max_ejection_percent * static_cast<double>(b.endpoints.size()))
            return {};
        ++e.times_ejected;
        const auto most = std::max(x.max_ejection_time, x.base_ejection_time);
        const auto d = x.base_ejection_time.count() > most.count() / e.times_ejected
                           ? most
                           : x.base_ejection_time * e.times_ejected;
        e.ejected = true;
        const std::int64_t until = plus(now, d.count());
        e.ejected_until.store(until, std::memory_order_relaxed);
        e.consecutive.store(0, std::memory_order_relaxed);
        ejected_count.fetch_add(1, std::memory_order_relaxed);
        if (until < next_return.load(std::memory_order_relaxed))
            next_return.store(until, std::memory_order_relaxed);
        refresh_due();
        return d;
    }

    /// The endpoints of `b` whose ejection is over at `now`: back, through slow start from the instant
    /// their ejection ended. Calls `heard(e)` for each.
    template <class Heard>
    void settle_returns_locked(const block& b, std::int64_t now, Heard&& heard) {
        for (entry* e : b.endpoints) {
            const std::int64_t until = e->ejected_until.load(std::memory_order_relaxed);
            if (e->ejected && until <= now) {
                e->ejected = false;
                e->consecutive.store(0, std::memory_order_relaxed);
                if (b.options.slow_start_window.count() > 0)
                    e->ramp_from.store(until, std::memory_order_relaxed);
                // Back as a new endpoint is taken to be: what it showed before (a timeout, a peak long
                // since decayed to nothing) says nothing of it now.
                e->estimate.store(initial(b.options), std::memory_order_relaxed);
                e->stamp.store(until, std::memory_order_relaxed);
                ejected_count.fetch_sub(1, std::memory_order_relaxed);
                heard(*e);
            }
        }
        next_return.store(earliest_return_locked(b), std::memory_order_relaxed);
        refresh_due();
    }

    /// The success-rate comparison of the intervals that ended by `now` (the first of them over the
    /// calls since the last comparison, the others over none), and one ejection forgiven per interval
    /// to the endpoints that stayed in. Calls `heard(e, d)` for each ejection.
    template <class Heard>
    void evaluate_locked(const block& b, std::int64_t now, Heard&& heard) {
        const outlier_ejection_options& x = *b.options.outlier_ejection;
        const std::int64_t at = next_evaluation.load(std::memory_order_relaxed);
        if (at == no_time || now < at)
            return;
        const std::int64_t step = x.interval.count();
        const std::int64_t passed = (now - at) / step + 1;
        next_evaluation.store(plus(at, passed * step), std::memory_order_relaxed);
        refresh_due();
        double sum = 0.0, squares = 0.0;
        std::size_t hosts = 0;
        rates.clear();
        for (entry* e : b.endpoints) {
            const std::uint32_t calls = e->calls.exchange(0, std::memory_order_relaxed);
            const std::uint32_t ok = e->successes.exchange(0, std::memory_order_relaxed);
            double rate = -1.0;
            if (calls > 0 && calls >= static_cast<std::uint32_t>(x.success_rate_request_volume)) {
                rate = static_cast<double>(std::min(ok, calls)) / static_cast<double>(calls);
                sum += rate;
                squares += rate * rate;
                ++hosts;
            }
            rates.push_back(rate);
            if (!e->ejected)
                e->times_ejected = static_cast<int>(std::max<std::int64_t>(0, e->times_ejected - passed));
        }
        if (x.success_rate_stdev_factor <= 0.0 || hosts == 0 ||
            hosts < static_cast<std::size_t>(x.success_rate_minimum_hosts))
            return;
        const double mean = sum / static_cast<double>(hosts);
        const double variance = std::max(0.0, squares / static_cast<double>(hosts) - mean * mean);
        const double floor = mean - x.success_rate_stdev_factor * std::sqrt(variance);
        for (std::size_t i = 0; i < b.endpoints.size(); ++i) {
            if (rates[i] >= 0.0 && rates[i] < floor) {
                const std::chrono::nanoseconds d = eject_locked(*b.endpoints[i], b, now, x);
                if (d.count() > 0)
                    heard(*b.endpoints[i], d);
            }
        }
    }

    const C clock;
    mutable Random rng;
    std::uint32_t next_id = 0; // under `changing` (and in the constructor)
    const std::int64_t epoch;  // intervals are counted from here
    snapshot_cell<block> cell;
    std::mutex changing;
    std::atomic<std::int64_t> next_evaluation{no_time}; // the end of the current interval (none: no_time)
    std::atomic<std::int64_t> next_return{no_time};     // the earliest end of an ejection (none: no_time)
    // The earlier of the two: a pick compares its time with this one word (`refresh_due` keeps it).
    std::atomic<std::int64_t> due{no_time};
    void refresh_due() noexcept {
        due.store(std::min(next_evaluation.load(std::memory_order_relaxed),
                           next_return.load(std::memory_order_relaxed)),
                  std::memory_order_relaxed);
    }
    std::atomic<std::uint32_t> ejected_count{0}; // entries of the set in force marked `ejected`
    std::atomic<std::uint64_t> turn{0};          // round robin's
    std::vector<double> rates;                   // under `changing`: `evaluate_locked`'s
};

} // namespace detail
} // namespace resilience
