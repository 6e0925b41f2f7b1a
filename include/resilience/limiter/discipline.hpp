// SPDX-License-Identifier: MIT
/// \file limiter/discipline.hpp
/// `hand_over_locked`: a limiter's hand-over of a permit under a queue discipline (CoDel, adaptive
/// LIFO; queue_discipline.hpp), for the head of its queue (limiter/state.hpp's `serve_head`).
///
/// Locking: no mutex of its own; `hand_over_locked` is called with the limiter's mutex held (and its
/// meter held), as its name says, and never takes it.
#pragma once

#include "../engine/waiter_queue.hpp"
#include "../queue_discipline.hpp"

#include <chrono>
#include <cstddef>
#include <optional>

namespace resilience::inline v0_2::detail {

/// The head `head` of `s`'s queue, its turn running at `now`, finds the permit of its class there
/// (`keep` more left for the classes above): the discipline decides who gets it (`serve_class`). The
/// waiter served spends it, the head or another (adaptive LIFO's newest, or under CoDel the oldest
/// left when the head itself was shed); those shed are told when a permit would be there for them
/// behind the waiters of their class and above still queued. Whoever else moved on is chained into
/// `woken` (linked through `waiter::next`) unless `driving` (it sees its state itself), and the turn
/// passes on (`next`, to wake) when the head left. Returns the head's state: `granted`, `shed`, or
/// still `turn` when another was served (the head looks again at once).
///
/// Relies on the meters' contract that a permit is there (`try_take` succeeds) exactly when
/// `available_at(now, 0)` is not after `now`, so that the waiter the discipline chose always gets
/// one.
template <class State>
waiter_state hand_over_locked(State& s, timed_waiter& head, std::chrono::nanoseconds now, std::size_t keep,
                              waiter*& next, waiter*& woken) {
    const auto waited = [now](const waiter& w) -> std::optional<std::chrono::nanoseconds> {
        return now - static_cast<const timed_waiter&>(w).queued_at;
    };
    const auto tell = [&woken, &head](waiter& w) {
        if (&w != &head && !w.driving) {
            w.next = woken;
            woken = &w;
        }
    };
    waiter* shed = nullptr;
    if (waiter* served = serve_class(s.queue, s.standing, s.discipline, now, shed, waited)) {
        s.meter.try_take(now); // there: see above
        served->state = waiter_state::granted;
        tell(*served);
    }
    const std::chrono::nanoseconds behind = s.wait_for_locked(now, s.queue.count_from(head.rank) + keep);
    while (waiter* w = shed) {
        shed = w->next;
        static_cast<timed_waiter&>(*w).retry_after = behind;
        tell(*w);
    }
    if (head.state == waiter_state::turn)
        return waiter_state::turn;
    next = s.queue.give_turn();
    return head.state;
}

} // namespace resilience::detail
