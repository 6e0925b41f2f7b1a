// SPDX-License-Identifier: MIT
/// \file detail/timer_wheel.hpp
/// The event loop's timers: a hierarchical timing wheel of intrusive lists, exact to the nanosecond.
///
/// Why a wheel. A loop may hold a million timers (a timeout per call in flight) that are mostly
/// cancelled, rarely fired. A binary heap costs O(log n) cache misses per arm and per cancel; the wheel
/// costs a few instructions whatever n is, and no allocation per timer: the node lives in its owner and
/// the wheel only links it into a list (the list heads come from the thread's frame cache, four levels
/// at a time, the first time a loop reaches those levels: a loop made per call stays cheap).
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
/// unlink; the cancel that empties a slot clears its bit, and knows the slot from the timer itself (the
/// wheel notes it in the node whenever it links one).
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

#include "frame_allocator.hpp"
#include "inlining.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace resilience::inline v0_2::detail {

/// Where a timer is linked: a list, circular through its head.
struct timer_link {
    timer_link* prev;
    timer_link* next;
};

/// A timer owned by whoever armed it (usually an awaiter in a coroutine frame). The loop links it into
/// its wheel until the timer fires or is removed; `fire` runs on the loop's thread. While armed it must
/// not move, and `when` must not change.
///
/// `fire` finds its way back to whoever armed the timer from the node: the owner derives from
/// `timer_node` (`static_cast` back), or holds it beside a pointer to itself. A class deriving from
/// it may put a field of 4 bytes or less first: it takes the node's tail padding, after `slot_index`.
struct timer_node : timer_link {
    timer_node() noexcept : timer_link{nullptr, nullptr} {}
    std::chrono::nanoseconds when{};
    void (*fire)(timer_node*) = nullptr;
    /// What a home that is not an event loop keeps of the timer while armed (detail/home_loop.hpp).
    void* home_data = nullptr;
    /// Set by the wheel: the slot the timer is linked into (level * 64 + digit), or -1 in the late
    /// FIFO, so that the cancel that empties a slot need not work out where the timer sits.
    int slot_index = -1;
    bool armed() const noexcept { return prev != nullptr; }
};

/// The timers of one event loop (see the file comment). Single-threaded. Must not move.
class timer_wheel {
public:
    /// `now`: the loop's time; no timer armed later aims before it, except late ones on purpose.
    explicit timer_wheel(std::chrono::nanoseconds now) noexcept : cur_(key(now)) {
        late_.prev = late_.next = &late_;
    }
    timer_wheel(const timer_wheel&) = delete;
    timer_wheel& operator=(const timer_wheel&) = delete;
    ~timer_wheel() {
        for (int level = 0; level < reserved_; level += levels_per_block)
            frame_cache::deallocate(level_[level], block_bytes);
    }

    std::size_t size() const noexcept { return size_; }
    bool empty() const noexcept { return size_ == 0; }

    /// Arms `t` (not armed) for `t->when`, which must not change while it is armed. May allocate (the
    /// list heads of the levels up to `t`'s, once per wheel, from the thread's frame cache), so that
    /// cascading, which only moves timers down, never has to.
    void insert(timer_node* t) {
        const std::uint64_t k = key(t->when);
        if (k < cur_) {
            link_late(t);
        } else {
            const int level = level_of(k);
            if (level >= reserved_) [[unlikely]]
                reserve(level);
            link_into(t, level, digit_of(k, level));
        }
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
        if (p == n && t->slot_index >= 0) { // only the head is left: clear the slot's bit
            const auto where = static_cast<unsigned>(t->slot_index);
            const unsigned level = where / width;
            const std::uint64_t left = occupied_[level] & ~(std::uint64_t{1} << (where % width));
            occupied_[level] = left;
            if (!left)
                levels_ &= ~(std::uint32_t{1} << level);
        }
    }

    /// The next timer due at `now` or before, unlinked, in firing order (late ones first, then by
    /// deadline, ties in arming order); null when none is, and the wheel's time is then `now`. Call it
    /// again after firing what it returns: firing may arm and cancel timers.
    timer_node* pop_due(std::chrono::nanoseconds now) noexcept {
        const std::uint64_t target = key(now);
        for (;;) {
            if (late_.next != &late_)
                return pop_front(late_);
            if (!levels_)
                break;
            const int level = std::countr_zero(levels_);
            const int digit = std::countr_zero(occupied_[level]);
            const std::uint64_t start = slot_start(level, digit);
            if (start > target)
                break;
            cur_ = start;
            if (level == 0)
                return pop_front(slot(0, digit));
            cascade(level, digit);
        }
        if (target > cur_)
            cur_ = target;
        return nullptr;
    }

    /// The earliest deadline, exactly, moving the wheel's time up to it (or the wheel's time when late
    /// timers wait). Only for a clock that jumps there next: virtual time. Precondition: not empty.
    std::chrono::nanoseconds advance_to_next() noexcept {
        for (;;) {
            if (late_.next != &late_ || !levels_) // (the second: never, when not empty)
                return instant(cur_);
            const int level = std::countr_zero(levels_);
            const int digit = std::countr_zero(occupied_[level]);
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
        if (late_.next != &late_ || !levels_) // (the second: never, when not empty)
            return instant(cur_);
        const int level = std::countr_zero(levels_);
        const int digit = std::countr_zero(occupied_[level]);
        const std::uint64_t start = slot_start(level, digit);
        if (level == 0)
            return instant(start);
        const timer_link& head = level_[level][digit];
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

    // A slot's list head is valid only while the slot's bit is set: set up when a timer first goes
    // there, so a level's heads cost nothing until then. They come in blocks of four levels (4 KiB, the
    // frame cache's largest size).
    static constexpr int levels_per_block = 4;
    static constexpr std::size_t block_bytes = sizeof(timer_link) * width * levels_per_block;

    // Order-preserving: negative times first.
    static constexpr std::uint64_t sign = std::uint64_t{1} << 63;
    static std::uint64_t key(std::chrono::nanoseconds t) noexcept {
        return static_cast<std::uint64_t>(t.count()) ^ sign;
    }
    static std::chrono::nanoseconds instant(std::uint64_t k) noexcept {
        return std::chrono::nanoseconds(static_cast<std::int64_t>(k ^ sign));
    }

    // The highest digit where `k` (not before the wheel's time) differs from it.
    int level_of(std::uint64_t k) const noexcept {
        // `| 1`: equal keys (no digit differs) go to level 0, as do keys differing in bit 0 only.
        return level_of_bit[std::bit_width((k ^ cur_) | 1) - 1];
    }
    // The level of each bit of a key: a table read instead of a division by `bits`.
    static constexpr auto level_of_bit = [] {
        std::array<std::uint8_t, 64> levels{};
        for (int b = 0; b < 64; ++b)
            levels[static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(b / bits);
        return levels;
    }();
    static int digit_of(std::uint64_t k, int level) noexcept {
        return static_cast<int>((k >> (level * bits)) & (width - 1));
    }

    timer_link& slot(int level, int digit) noexcept { return level_[level][digit]; }

    // The first key of slot `digit` of `level`: the wheel's time above that level, `digit` at it, zeros
    // below.
    std::uint64_t slot_start(int level, int digit) const noexcept {
        const int above = (level + 1) * bits;
        const std::uint64_t high = above >= 64 ? 0 : (cur_ >> above) << above;
        return high | (static_cast<std::uint64_t>(digit) << (level * bits));
    }

    // Levels 0 to `level` get their heads, uninitialised. Once per wheel and level: out of line.
    RESILIENCE_DETAIL_NOINLINE void reserve(int level) {
        while (reserved_ <= level) {
            auto* heads = static_cast<timer_link*>(frame_cache::allocate(block_bytes));
            std::uninitialized_default_construct_n(heads, width * levels_per_block);
            for (int i = 0; i < levels_per_block && reserved_ < depth; ++i)
                level_[reserved_++] = heads + i * width;
        }
    }

    // Precondition: the levels `t` may go to are reserved.
    void place(timer_node* t) noexcept {
        const std::uint64_t k = key(t->when);
        if (k < cur_) {
            link_late(t);
            return;
        }
        const int level = level_of(k);
        link_into(t, level, digit_of(k, level));
    }

    void link_late(timer_node* t) noexcept {
        t->slot_index = -1;
        link_back(late_, t);
    }
    // Precondition: `level` is reserved.
    void link_into(timer_node* t, int level, int digit) noexcept {
        timer_link& head = slot(level, digit);
        const std::uint64_t bit = std::uint64_t{1} << digit;
        const std::uint64_t occupied = occupied_[level];
        t->slot_index = level * width + digit;
        if (!(occupied & bit)) {
            head.prev = head.next = &head;
            occupied_[level] = occupied | bit;
            levels_ |= std::uint32_t{1} << level;
        }
        link_back(head, t);
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

    // Empties a slot whose start `cur_` has reached into lower levels, keeping its order.
    void cascade(int level, int digit) noexcept {
        timer_link& head = slot(level, digit);
        timer_link* l = head.next;
        occupied_[level] &= ~(std::uint64_t{1} << digit);
        if (!occupied_[level])
            levels_ &= ~(std::uint32_t{1} << level);
        while (l != &head) {
            timer_link* next = l->next;
            place(static_cast<timer_node*>(l));
            l = next;
        }
    }

    timer_link* level_[depth] = {};      // the heads of each level, once reserved
    int reserved_ = 0;                   // levels reserved: 0 to reserved_ - 1
    std::uint64_t occupied_[depth] = {}; // bit d of level L: slot d holds a timer
    std::uint32_t levels_ = 0;           // bit L: level L holds a timer
    timer_link late_;                    // FIFO of timers armed before the wheel's time
    std::uint64_t cur_;                  // the wheel's time (a key); never ahead of the loop's
    std::size_t size_ = 0;
};

} // namespace resilience::detail
