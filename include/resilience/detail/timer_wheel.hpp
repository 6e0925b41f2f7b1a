// SPDX-License-Identifier: MIT
/// \file detail/timer_wheel.hpp
/// The event loop's timers: a hierarchical timing wheel of intrusive lists, exact to the nanosecond.
///
/// Why a wheel. A loop may hold a million timers (a timeout per call in flight) that are mostly
/// cancelled, rarely fired. A binary heap costs O(log n) cache misses per arm and per cancel; the wheel
/// costs a few instructions and no allocation, whatever n is: the node lives in its owner, and the wheel
/// only links it into a list.
///
/// How. Times are 64-bit keys (nanoseconds, sign bit flipped so that negative times order first) read
/// as 11 digits of 6 bits. Level L has 64 slots, one per value of digit L. A timer goes to level L, the
/// highest digit where its key differs from the wheel's time `cur`, into the slot of its own digit L; so
/// it agrees with `cur` on every digit above L and is later than `cur` on digit L. Hence:
/// - every timer of level L is earlier than every timer of level L + 1, and within a level a lower slot
///   is earlier: the earliest slot is the lowest set bit of the lowest non-empty level, found with two
///   count-trailing-zeros on a per-level occupancy bitmap (plus one summary word), O(1);
/// - a level-0 slot holds timers of one exact instant, in arming order: equal deadlines always share a
///   slot (where a timer sits depends only on its key and `cur`), arming appends, and moving a slot
///   keeps its order. That is the tie rule the loop promises (same instant: arming order).
/// Time moves by cascading: when `cur` reaches the start of the earliest slot of a level L > 0, that slot
/// is emptied into lower levels relative to the new `cur`. A timer only ever moves down, at most 10
/// times, so expiry is O(1) amortised however far away a deadline is (292 years fits). Cancelling is an
/// unlink; an emptied list clears its bit, found from the list's own sentinel.
///
/// Exact instants. Virtual time jumps to the next deadline, so it may cascade straight down to it:
/// `advance_to_next` moves `cur` to the earliest slot's start until that slot is at level 0, whose start
/// is the deadline itself. Real time may not run `cur` ahead of the clock (a timer armed meanwhile could
/// be earlier), so `wake_at` gives the deadline exactly when the earliest slot is at level 0 or holds at
/// most `exact_scan` timers (it reads them), and otherwise that slot's start, a lower bound: the loop
/// wakes there, cascades, and looks again. So a sleeping loop never wakes late, and early only on the
/// way down to a crowded slot, at most once per level, paid for by the many timers that slot holds.
///
/// A timer armed for an instant before `cur` (only a raw `add_timer` with a past deadline does that:
/// sleeps and timeouts always aim past the loop's time) joins a FIFO of late timers, all due at once:
/// they fire at the next turn, in arming order, before any other due timer.
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace resilience::detail {

/// Where a timer is linked: a slot's circular list, whose sentinel is a bare link.
struct timer_link {
    timer_link* prev = nullptr;
    timer_link* next = nullptr;
};

/// A timer owned by whoever armed it (usually an awaiter in a coroutine frame). The loop links it into
/// its wheel until the timer fires or is removed; `fire` runs on the loop's thread. Must not move while
/// armed.
struct timer_node : timer_link {
    std::chrono::nanoseconds when{};
    void (*fire)(timer_node*) = nullptr;
    void* owner = nullptr; ///< for `fire` to find its way back to whoever armed the timer
    bool armed() const noexcept { return prev != nullptr; }
};

/// The timers of one event loop (see the file comment). Single-threaded.
class timer_wheel {
public:
    /// `now`: the loop's time; no timer armed later aims before it, except late ones on purpose.
    explicit timer_wheel(std::chrono::nanoseconds now) noexcept : cur_(key(now)) {}
    timer_wheel(const timer_wheel&) = delete;
    timer_wheel& operator=(const timer_wheel&) = delete;

    std::size_t size() const noexcept { return size_; }
    bool empty() const noexcept { return size_ == 0; }

    /// Arms `t` (not armed) for `t->when`. Allocates only the first time (the slots, once per wheel).
    void insert(timer_node* t) {
        if (!s_)
            s_ = std::make_unique<slots>();
        place(t);
        ++size_;
    }

    /// Disarms `t` if it is armed.
    void erase(timer_node* t) noexcept {
        if (!t->armed())
            return;
        timer_link* p = t->prev;
        timer_link* n = t->next;
        p->next = n;
        n->prev = p;
        t->prev = t->next = nullptr;
        --size_;
        if (p == n) // only the sentinel is left
            emptied(p);
    }

    /// The next timer due at `now` or before, unlinked, in firing order (late ones first, then by
    /// deadline, ties in arming order); null when none is, and the wheel's time is then `now`. Call it
    /// again after firing what it returns: firing may arm and cancel timers.
    timer_node* pop_due(std::chrono::nanoseconds now) noexcept {
        const std::uint64_t target = key(now);
        if (s_) {
            for (;;) {
                if (s_->late.next != &s_->late)
                    return pop_front(s_->late);
                if (!s_->levels)
                    break;
                const int level = std::countr_zero(s_->levels);
                const int digit = std::countr_zero(s_->occupied[level]);
                const std::uint64_t start = slot_start(level, digit);
                if (start > target)
                    break;
                cur_ = start;
                if (level == 0)
                    return pop_front(slot(0, digit));
                cascade(level, digit);
            }
        }
        if (target > cur_)
            cur_ = target;
        return nullptr;
    }

    /// The earliest deadline, exactly, moving the wheel's time up to it (or the wheel's time when late
    /// timers wait). Only for a clock that jumps there next: virtual time. Precondition: not empty.
    std::chrono::nanoseconds advance_to_next() noexcept {
        for (;;) {
            if (s_->late.next != &s_->late || !s_->levels) // (the second: never, when not empty)
                return instant(cur_);
            const int level = std::countr_zero(s_->levels);
            const int digit = std::countr_zero(s_->occupied[level]);
            const std::uint64_t start = slot_start(level, digit);
            if (level == 0)
                return instant(start);
            cur_ = start;
            cascade(level, digit);
        }
    }

    /// When a real-time loop should wake: the earliest deadline, or a lower bound of it when that
    /// would take reading a long list (see the file comment). Precondition: not empty.
    std::chrono::nanoseconds wake_at() const noexcept {
        if (s_->late.next != &s_->late || !s_->levels) // (the second: never, when not empty)
            return instant(cur_);
        const int level = std::countr_zero(s_->levels);
        const int digit = std::countr_zero(s_->occupied[level]);
        const std::uint64_t start = slot_start(level, digit);
        if (level == 0)
            return instant(start);
        const timer_link& head = s_->slot[level * width + digit];
        std::uint64_t earliest = ~std::uint64_t{0};
        std::size_t seen = 0;
        for (const timer_link* l = head.next; l != &head; l = l->next) {
            if (++seen > exact_scan)
                return instant(start);
            earliest = std::min(earliest, key(static_cast<const timer_node*>(l)->when));
        }
        return instant(earliest);
    }

private:
    static constexpr int bits = 6;
    static constexpr int width = 1 << bits; // slots per level
    static constexpr int depth = (64 + bits - 1) / bits;
    static constexpr std::size_t exact_scan = 8;

    struct slots {
        slots() noexcept {
            for (auto& s : slot)
                s.prev = s.next = &s;
            late.prev = late.next = &late;
        }
        slots(const slots&) = delete;
        slots& operator=(const slots&) = delete;

        timer_link slot[depth * width];
        timer_link late;                    // FIFO of timers armed before the wheel's time
        std::uint64_t occupied[depth] = {}; // bit d of level L: slot d holds a timer
        std::uint32_t levels = 0;           // bit L: level L holds a timer
    };

    // Order-preserving: negative times first.
    static constexpr std::uint64_t sign = std::uint64_t{1} << 63;
    static std::uint64_t key(std::chrono::nanoseconds t) noexcept {
        return static_cast<std::uint64_t>(t.count()) ^ sign;
    }
    static std::chrono::nanoseconds instant(std::uint64_t k) noexcept {
        return std::chrono::nanoseconds(static_cast<std::int64_t>(k ^ sign));
    }

    timer_link& slot(int level, int digit) noexcept { return s_->slot[level * width + digit]; }

    // The first key of slot `digit` of `level`: the wheel's time above that level, `digit` at it, zeros
    // below.
    std::uint64_t slot_start(int level, int digit) const noexcept {
        const int above = (level + 1) * bits;
        const std::uint64_t high = above >= 64 ? 0 : (cur_ >> above) << above;
        return high | (static_cast<std::uint64_t>(digit) << (level * bits));
    }

    void place(timer_node* t) noexcept {
        const std::uint64_t k = key(t->when);
        if (k < cur_) {
            link_back(s_->late, t);
            return;
        }
        const std::uint64_t differ = k ^ cur_;
        const int level = differ == 0 ? 0 : (static_cast<int>(std::bit_width(differ)) - 1) / bits;
        const int digit = static_cast<int>((k >> (level * bits)) & (width - 1));
        link_back(slot(level, digit), t);
        s_->occupied[level] |= std::uint64_t{1} << digit;
        s_->levels |= std::uint32_t{1} << level;
    }

    static void link_back(timer_link& head, timer_node* t) noexcept {
        t->prev = head.prev;
        t->next = &head;
        head.prev->next = t;
        head.prev = t;
    }

    timer_node* pop_front(timer_link& head) noexcept {
        auto* t = static_cast<timer_node*>(head.next);
        erase(t);
        return t;
    }

    void emptied(timer_link* sentinel) noexcept {
        if (sentinel == &s_->late)
            return;
        const auto i = static_cast<std::size_t>(sentinel - s_->slot);
        const std::size_t level = i / width;
        s_->occupied[level] &= ~(std::uint64_t{1} << (i % width));
        if (!s_->occupied[level])
            s_->levels &= ~(std::uint32_t{1} << level);
    }

    // Empties a slot whose start `cur_` has reached into lower levels, keeping its order.
    void cascade(int level, int digit) noexcept {
        timer_link& head = slot(level, digit);
        timer_link* l = head.next;
        head.prev = head.next = &head;
        emptied(&head);
        while (l != &head) {
            timer_link* next = l->next;
            place(static_cast<timer_node*>(l));
            l = next;
        }
    }

    std::unique_ptr<slots> s_; // on the first timer: a loop that arms none stays small
    std::uint64_t cur_;        // the wheel's time (a key); never ahead of the loop's
    std::size_t size_ = 0;
};

} // namespace resilience::detail
