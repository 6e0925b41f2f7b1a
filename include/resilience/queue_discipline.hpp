// SPDX-License-Identifier: MIT
/// \file queue_discipline.hpp
/// Queue disciplines: which waiter a freed slot goes to, and which waiters are shed, when a queue
/// stands. `rs::fifo` (arrival order, the default), `rs::codel` (arrival order, shedding the waiters
/// that have waited too long once the queue has stood for an interval) and `rs::adaptive_lifo`
/// (CoDel's shedding, and newest first while the queue stands). The bulkhead and the limiters take
/// one as their `queue_discipline` option; docs/bulkhead.md has the rules and an example, and
/// docs/rate_limiter.md what they are for a limiter.
///
///     rs::bulkhead db{{.max_concurrent_calls = 16, .queue_limit = 256,
///                      .queue_discipline = rs::codel{.target = 5ms, .interval = 100ms}}};
#pragma once

#include "detail/time.hpp"
#include "engine/waiter_queue.hpp"

#include <chrono>
#include <cstddef>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace resilience::inline v0_2 {

/// Waiters are served in arrival order (by class first, with priorities), and none is shed: a wait
/// ends only with a slot, a stop, a queue timeout or a displacement. The default.
struct fifo {};

/// CoDel, after Nichols and Jacobson's "Controlling Queue Delay" (2012) and folly's `Codel`: a
/// queue that briefly fills to absorb a burst is good; one that *stands*, so that even its shortest
/// waits stay above `target` for a whole `interval`, only adds delay, and its oldest waiters are
/// shed. Served in arrival order. The exact rules are `detail::standing_queue`'s and
/// docs/bulkhead.md's:
/// - each time a slot (a limiter's token or permit) is handed to a class, the wait of that class's
///   oldest waiter is the sample: at most `target` ends the standing (and any shedding); above it,
///   the queue is standing from then on, and overloaded once it has stood for `interval` (every
///   sample since above `target`, the class's queue never empty);
/// - while overloaded, each hand-over first sheds the class's waiters that have waited more than
///   `target` (refused with `rejection_reason::shed`), then serves the oldest left.
/// Defaults as folly's and the paper's: 5 ms and 100 ms.
struct codel {
    /// The wait a standing queue is allowed: above it, a queue is standing, and while overloaded
    /// a waiter is shed. Positive.
    std::chrono::nanoseconds target = std::chrono::milliseconds{5};
    /// How long the queue must stand before it sheds. Positive.
    std::chrono::nanoseconds interval = std::chrono::milliseconds{100};
};

/// Adaptive LIFO, after "Fail at Scale" (Facebook, 2015): as `codel` (the same detection and the
/// same shedding), but while overloaded a freed slot goes to the newest waiter, whose caller is
/// the likeliest to be still waiting for the answer; in arrival order otherwise.
struct adaptive_lifo {
    /// As `codel::target`.
    std::chrono::nanoseconds target = std::chrono::milliseconds{5};
    /// As `codel::interval`.
    std::chrono::nanoseconds interval = std::chrono::milliseconds{100};
};

/// The `queue_discipline` option: `rs::fifo{}` (the default), `rs::codel{...}` or
/// `rs::adaptive_lifo{...}`.
using queue_discipline = std::variant<fifo, codel, adaptive_lifo>;

namespace detail {

/// A queue discipline as a queue applies it: off for `fifo`.
struct discipline_rule {
    std::chrono::nanoseconds target{};
    std::chrono::nanoseconds interval{};
    bool on = false;   ///< `codel` or `adaptive_lifo`: waiters carry the instant they queued
    bool lifo = false; ///< `adaptive_lifo`

    static discipline_rule of(const queue_discipline& d) noexcept {
        if (const codel* c = std::get_if<codel>(&d))
            return {c->target, c->interval, true, false};
        if (const adaptive_lifo* a = std::get_if<adaptive_lifo>(&d))
            return {a->target, a->interval, true, true};
        return {};
    }
    bool operator==(const discipline_rule&) const = default;
};

/// Throws `std::invalid_argument` naming the field and the value for the first thing wrong with `d`;
/// `who` starts the message (the policy and its name, then ": ").
inline void validate_queue_discipline(const queue_discipline& d, const std::string& who) {
    const discipline_rule r = discipline_rule::of(d);
    if (!r.on)
        return;
    const auto positive = [&who](const char* field, std::chrono::nanoseconds v) {
        if (v <= std::chrono::nanoseconds::zero())
            throw std::invalid_argument(who + "queue_discipline." + field + " must be positive, got " +
                                        std::to_string(v.count()) + "ns");
    };
    positive("target", r.target);
    positive("interval", r.interval);
}

/// Whether one class's queue stands, by CoDel's rule (see `codel`), from the samples its owner
/// takes each time a slot is handed to the class. Its owner's lock guards it.
class standing_queue {
public:
    /// Takes the sample `waited` (the class's oldest waiter's wait) at `now`, and says whether the
    /// queue is overloaded: it has stood (every sample above the target) for the interval.
    bool sample(std::chrono::nanoseconds waited, std::chrono::nanoseconds now,
                const discipline_rule& r) noexcept {
        if (waited <= r.target) {
            reset();
            return false;
        }
        if (overloaded_from_ == not_standing) {
            const auto max = std::chrono::nanoseconds::max();
            overloaded_from_ = now > max - r.interval ? max : now + r.interval;
        }
        return now >= overloaded_from_;
    }
    /// The class's queue emptied (or the rule changed): nothing stands.
    void reset() noexcept { overloaded_from_ = not_standing; }

private:
    // No instant plus a positive interval comes to it.
    static constexpr std::chrono::nanoseconds not_standing = std::chrono::nanoseconds::min();
    // When the standing queue, if it stays, becomes overloaded; `not_standing` while none stands.
    std::chrono::nanoseconds overloaded_from_ = not_standing;
};

/// How long `w` has waited at `now` (nanoseconds since the clock's epoch), if its waiting call keeps
/// the instant it queued (a `TimePoint`, `w.since_offset` bytes past the node); else nothing.
template <class TimePoint>
std::optional<std::chrono::nanoseconds> waited_beside(const waiter& w,
                                                      std::chrono::nanoseconds now) noexcept {
    if (w.since_offset == 0)
        return std::nullopt;
    const auto* since = std::launder(
        reinterpret_cast<const TimePoint*>(reinterpret_cast<const unsigned char*>(&w) + w.since_offset));
    return now - saturating_nanoseconds(since->time_since_epoch());
}

/// One hand-over, under `rule` at `now`, to the class of `queue`'s front waiter (the highest class
/// waiting), with the owner's lock held; `waited(w)` is how long `w` has waited then, if it is known.
/// The sample is that class's oldest waiter's wait; while the class is overloaded, its waiters that
/// waited more than the target are taken out, marked `shed` and pushed onto `shed` (linked through
/// `waiter::next`), unless a waiter of a lower class is queued (a higher class is never shed before
/// a lower one); then adaptive LIFO takes the newest, CoDel the oldest. Returns the waiter taken out
/// to serve, or null when the class was shed whole. A class left empty stands no more. A waiter
/// whose wait is not known (queued under `fifo`, before a reconfiguration) is neither a sample nor
/// shed. The caller marks the one served, and wakes the ones shed once the lock is released (unless
/// `driving`: they see it themselves).
template <class Waited>
waiter* serve_class(waiter_queue& queue, standing_queue (&standing)[waiter_ranks],
                    const discipline_rule& rule, std::chrono::nanoseconds now, waiter*& shed,
                    Waited waited) noexcept {
    const std::size_t k = queue.front()->rank;
    const std::optional<std::chrono::nanoseconds> oldest = waited(*queue.front());
    const bool overloaded = oldest && standing[k].sample(*oldest, now, rule);
    if (overloaded && queue.size() == queue.count_of(k)) {
        // In arrival order: the class's waiters from the first that waited the target or less
        // arrived later, and stay.
        for (waiter* w = queue.front(); w;) {
            const std::optional<std::chrono::nanoseconds> wait = waited(*w);
            if (!wait || *wait <= rule.target)
                break;
            waiter* const after = w->next;
            queue.erase(*w);
            w->state = waiter_state::shed;
            w->next = std::exchange(shed, w);
            w = after;
        }
    }
    waiter* next = nullptr;
    if (queue.count_of(k) != 0) {
        next = overloaded && rule.lifo ? queue.last_of(k) : queue.front();
        queue.erase(*next);
    }
    if (queue.count_of(k) == 0)
        standing[k].reset();
    return next;
}

/// Resets the standing of every class with nobody queued: a class whose queue emptied, however,
/// stands no more. With the owner's lock held.
inline void reset_idle_classes(const waiter_queue& queue, standing_queue (&standing)[waiter_ranks]) noexcept {
    for (std::size_t r = 0; r < waiter_ranks; ++r)
        if (queue.count_of(r) == 0)
            standing[r].reset();
}

} // namespace detail

} // namespace resilience
