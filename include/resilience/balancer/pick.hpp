// SPDX-License-Identifier: MIT
/// \file balancer/pick.hpp
/// `detail::pick_endpoint`: one pick of a balancer, over the block in force, without a lock and
/// without an allocation.
///
/// Which endpoints may be picked: those not ejected (all of them in panic: fewer than
/// `panic_threshold_percent` of the set left), and among those the ones the call has not tried, when
/// any is left. Among them the pick is uniform (random), in turn (round robin), or the less loaded of
/// two drawn uniformly (least loaded). An endpoint in slow start is drawn with the probability of its
/// weight: a draw it loses is drawn again (at most `redraws` times, then kept), so its share of the
/// draws grows with its weight.
#pragma once

#include "../detail/inlining.hpp"
#include "../random.hpp"
#include "options.hpp"
#include "state.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace resilience::inline v0_2::detail {

template <class E>
class endpoint_filter {
public:
    endpoint_filter(const balancer_block<E>& b, std::int64_t now, std::uint64_t avoid,
                    bool any_ejected) noexcept
        : b_(b), now_(now) {
        const std::size_t n = b.endpoints.size();
        if (any_ejected) { // ejections run to their end, even when ejection has since been turned off
            std::size_t out = 0;
            for (const endpoint_entry<E>* e : b.endpoints)
                out += is_out(*e) ? 1 : 0;
            const double healthy = static_cast<double>(n - out) * 100.0;
            const double panic = b.options.outlier_ejection
                                     ? b.options.outlier_ejection->panic_threshold_percent
                                     : outlier_ejection_options{}.panic_threshold_percent;
            use_ejection_ = out > 0 && healthy >= panic * static_cast<double>(n);
            if (out == n) // a threshold of zero, every endpoint out: all of them
                use_ejection_ = false;
        }
        avoid_ = avoid;
        if (avoid_ != 0) {
            count_ = count();
            if (count_ == 0) // every endpoint that may be picked was tried: any of them
                avoid_ = 0;
        }
        if (avoid_ == 0)
            count_ = use_ejection_ ? count() : n;
    }
    /// How many may be picked.
    std::size_t size() const noexcept { return count_; }
    /// The `k`-th of them (`k < size()`). Never null: an endpoint ejected on another thread since they
    /// were counted leaves fewer, and then the last one that may be picked is taken (or the `k`-th of
    /// all, when none is left).
    endpoint_entry<E>* at(std::size_t k) const noexcept {
        if (!use_ejection_ && avoid_ == 0)
            return b_.endpoints[k];
        endpoint_entry<E>* last = nullptr;
        for (endpoint_entry<E>* e : b_.endpoints)
            if (may_pick(*e)) {
                if (k-- == 0)
                    return e;
                last = e;
            }
        return last ? last : b_.endpoints[k % b_.endpoints.size()];
    }

private:
    bool is_out(const endpoint_entry<E>& e) const noexcept {
        return e.ejected_until.load(std::memory_order_relaxed) > now_;
    }
    bool may_pick(const endpoint_entry<E>& e) const noexcept {
        return !(use_ejection_ && is_out(e)) && !((avoid_ >> (e.id % 64)) & 1);
    }
    std::size_t count() const noexcept {
        std::size_t m = 0;
        for (const endpoint_entry<E>* e : b_.endpoints)
            m += may_pick(*e) ? 1 : 0;
        return m;
    }

    const balancer_block<E>& b_;
    std::int64_t now_;
    std::uint64_t avoid_ = 0;
    bool use_ejection_ = false;
    std::size_t count_ = 0;
};

/// 64 uniform random bits from `rng`, whatever its range: the generator's own word when it gives 64
/// bits, else two draws of 32 (through `unit_random`, which respects `min()` and `max()`).
template <class Random>
RESILIENCE_DETAIL_ALWAYS_INLINE std::uint64_t random_bits(Random& rng) {
    using R = std::remove_cvref_t<Random>;
    if constexpr (R::min() == 0 && R::max() == std::numeric_limits<std::uint64_t>::max()) {
        return static_cast<std::uint64_t>(rng());
    } else {
        const auto half = [&] { return static_cast<std::uint64_t>(unit_random(rng) * 0x1p32); };
        const std::uint64_t high = half();
        return high << 32 | half();
    }
}

/// The load `least_loaded` compares: the decayed latency in whole nanoseconds (at least 1, so a busy
/// endpoint's load grows with its calls: none draws every call) times the calls in flight plus one, in
/// integers (a multiply and a compare: a pick waits on the latency of this arithmetic).
template <class E>
RESILIENCE_DETAIL_ALWAYS_INLINE std::int64_t endpoint_load(const endpoint_entry<E>& e, std::int64_t now,
                                                           std::int64_t decay) noexcept {
    const std::int64_t ns = decayed_estimate(e, now, decay) >> estimate_bits;
    const std::int64_t calls =
        std::int64_t{static_cast<std::uint32_t>(e.in_flight.load(std::memory_order_relaxed))} + 1;
    // A branch rather than a `min`: predicted, it keeps the count's compare off the path the pick waits on.
    if (calls > max_counted_in_flight) [[unlikely]]
        return ns * max_counted_in_flight;
    return ns * calls;
}

/// Whether a pick is the common case: two or more endpoints, none ejected, none ramping up, none tried
/// by the call. `pick_plain` then picks.
template <class E>
RESILIENCE_DETAIL_ALWAYS_INLINE bool plain_pick(const balancer_block<E>& b, std::uint64_t avoid,
                                                const std::atomic<std::uint32_t>& ejected) noexcept {
    return ejected.load(std::memory_order_relaxed) == 0 && avoid == 0 &&
           b.options.slow_start_window.count() <= 0 && b.endpoints.size() >= 2;
}

/// The turn's endpoint among `n`: in 32 bits, a division several times cheaper than in 64 (the turn's
/// wrap, once in 2^32 picks, restarts the cycle at the first endpoint: each endpoint gains or loses at
/// most one turn).
inline std::size_t turn_of(std::atomic<std::uint64_t>& turn, std::size_t n) noexcept {
    const auto t = static_cast<std::uint32_t>(turn.fetch_add(1, std::memory_order_relaxed));
    return t % static_cast<std::uint32_t>(n);
}

/// Uniform in [0, below) from 32 random bits, by a multiply rather than a division (Lemire's
/// reduction): a division costs as much as the rest of a pick. Its bias, below / 2^32, is nil here.
inline std::size_t reduce(std::uint64_t bits32, std::size_t below) noexcept {
    return static_cast<std::size_t>((bits32 * static_cast<std::uint64_t>(below)) >> 32);
}

/// The second of two distinct indices below `n` (at least 2), from 32 random bits, `a` being the first.
RESILIENCE_DETAIL_ALWAYS_INLINE std::size_t other_than(std::size_t a, std::uint64_t bits32,
                                                       std::size_t n) noexcept {
    const std::size_t c = reduce(bits32, n - 1);
    return c + (c >= a ? 1 : 0);
}

/// Of two endpoints, the less loaded at `now` (the first on a tie).
template <class E>
RESILIENCE_DETAIL_ALWAYS_INLINE endpoint_entry<E>* less_loaded(endpoint_entry<E>* first,
                                                               endpoint_entry<E>* second, std::int64_t now,
                                                               std::int64_t decay) noexcept {
    return endpoint_load(*second, now, decay) < endpoint_load(*first, now, decay) ? second : first;
}

/// The common case's pick (see `plain_pick`), by index among all the endpoints: for `least_loaded` the
/// less loaded of two drawn, else the turn's or one drawn. The same picks as `pick_endpoint`'s for the
/// same draws.
template <class E, class Random>
RESILIENCE_DETAIL_ALWAYS_INLINE endpoint_entry<E>* pick_plain(const balancer_block<E>& b, std::int64_t now,
                                                              Random& rng, std::atomic<std::uint64_t>& turn) {
    const std::size_t n = b.endpoints.size();
    if (b.options.pick == balance_pick::round_robin) [[unlikely]]
        return b.endpoints[turn_of(turn, n)];
    const std::uint64_t bits = random_bits(rng);
    const std::size_t a = reduce(bits >> 32, n);
    if (b.options.pick == balance_pick::random) [[unlikely]]
        return b.endpoints[a];
    return less_loaded(b.endpoints[a], b.endpoints[other_than(a, bits & 0xffff'ffffu, n)], now,
                       b.options.decay_time.count());
}

/// The endpoint for one attempt, or null when the set is empty. `avoid`: the call's endpoints tried
/// (bits `id % 64`); `turn`: round robin's counter.
template <class E, class Random>
RESILIENCE_DETAIL_ALWAYS_INLINE endpoint_entry<E>*
pick_endpoint(const balancer_block<E>& b, std::int64_t now, std::uint64_t avoid, Random& rng,
              std::atomic<std::uint64_t>& turn, const std::atomic<std::uint32_t>& ejected) {
    if (plain_pick(b, avoid, ejected))
        return pick_plain(b, now, rng, turn);
    const bool any_ejected = ejected.load(std::memory_order_relaxed) > 0;
    const endpoint_filter<E> may(b, now, avoid, any_ejected);
    const std::size_t m = may.size();
    if (m == 0)
        return nullptr;
    const balancer_options& o = b.options;
    constexpr int redraws = 16;
    const bool ramps = o.slow_start_window.count() > 0;
    // Kept with the probability of its slow-start weight.
    const auto keep = [&](const endpoint_entry<E>* e) {
        if (!ramps)
            return true;
        const double w = slow_start_weight(*e, now, o);
        return w >= 1.0 || unit_random(rng) < w;
    };
    const auto draw = [&](std::size_t below) { return reduce(random_bits(rng) >> 32, below); };
    switch (o.pick) {
    case balance_pick::round_robin: {
        endpoint_entry<E>* e = nullptr;
        for (int i = 0; i <= redraws; ++i) {
            e = may.at(turn_of(turn, m));
            if (keep(e))
                break;
        }
        return e;
    }
    case balance_pick::random: {
        endpoint_entry<E>* e = nullptr;
        for (int i = 0; i <= redraws; ++i)
            if (keep(e = may.at(draw(m))))
                break;
        return e;
    }
    case balance_pick::least_loaded:
        break;
    }
    if (m == 1)
        return may.at(0);
    // The two from one draw of 64 bits, the second among the others; drawn again in slow start.
    const std::uint64_t bits = random_bits(rng);
    std::size_t a = reduce(bits >> 32, m);
    if (ramps) // the first settled before the second is drawn among the others
        for (int i = 0; i < redraws && !keep(may.at(a)); ++i)
            a = draw(m);
    std::size_t c = other_than(a, bits & 0xffff'ffffu, m);
    if (ramps)
        for (int i = 0; i < redraws && !keep(may.at(c)); ++i)
            c = other_than(a, random_bits(rng) >> 32, m);
    return less_loaded(may.at(a), may.at(c), now, o.decay_time.count());
}

} // namespace resilience::detail
