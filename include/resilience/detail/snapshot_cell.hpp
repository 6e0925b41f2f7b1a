// SPDX-License-Identifier: MIT
/// \file detail/snapshot_cell.hpp
/// `snapshot_cell<B>`: the options block in force for a shared state, replaced whole by a
/// reconfiguration, and each replaced block freed once no call pins it any more.
///
/// Locking: `list_mutex_` guards the blocks replaced but not yet retired (`pending_`); `sweep_locked` is
/// called with it held. `pin_locked` is the exception the name announces: it is called with the OWNER's
/// mutex held (the one its `replace` is called under), which keeps `current_` from changing. `current_`,
/// `admitting_` and `pending_flag_` are atomics, read without either lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace resilience::inline v0_2::detail {

/// The base of a block a `snapshot_cell` holds: the count of the calls that pin it, and a bit that
/// says the block is no longer in force and may be freed by the last of them.
class pinnable {
public:
    pinnable() noexcept = default;
    pinnable(const pinnable&) = delete;
    pinnable& operator=(const pinnable&) = delete;

private:
    template <class B>
    friend class snapshot_cell;
    template <class B>
    friend class pinned;

    static constexpr std::uint64_t retired = std::uint64_t{1} << 63;
    mutable std::atomic<std::uint64_t> pins_{0};
};

/// One pin on a block: the block stays alive while it lives. Move-only; empty when default-made.
/// Giving it back touches nothing but the block, so a call destroyed after its state is gone
/// may still hold one.
template <class B>
class pinned {
public:
    pinned() noexcept = default;
    pinned(pinned&& o) noexcept : b_(std::exchange(o.b_, nullptr)) {}
    pinned& operator=(pinned&& o) noexcept {
        if (this != &o) {
            reset();
            b_ = std::exchange(o.b_, nullptr);
        }
        return *this;
    }
    ~pinned() { reset(); }

    /// Another pin on the same block (empty if this one is).
    pinned share() const noexcept {
        if (b_)
            b_->pins_.fetch_add(1, std::memory_order_relaxed);
        return pinned(b_);
    }

    const B* get() const noexcept { return b_; }
    const B* operator->() const noexcept { return b_; }
    const B& operator*() const noexcept { return *b_; }
    explicit operator bool() const noexcept { return b_ != nullptr; }

    void reset() noexcept {
        if (const B* b = std::exchange(b_, nullptr))
            unpin(b);
    }
    /// Gives up the pin without giving it back: the caller gives it back with `unpin`.
    [[nodiscard]] const B* release() noexcept { return std::exchange(b_, nullptr); }
    /// Gives back a pin taken with `release`.
    static void unpin(const B* b) noexcept {
        // Acquire-release: the last pin frees the block after every other pinner's reads.
        if (b->pins_.fetch_sub(1, std::memory_order_acq_rel) == (pinnable::retired | 1))
            delete b;
    }

private:
    template <class>
    friend class snapshot_cell;
    explicit pinned(const B* b) noexcept : b_(b) {}
    const B* b_ = nullptr;
};

/// The block in force (`B` derives from `pinnable`), published for calls that read it without the
/// owner's lock, and the blocks it replaced that calls still pin.
///
/// A call that needs the block after its admission pins it: `pin()` without a lock, or
/// `pin_locked()` under the owner's lock (the lock `replace` is called under). A block replaced is
/// retired, and freed by whoever leaves it with no pin and retired: `replace` itself when no call
/// pins it, else the last `pinned` given back. Calls that read the block only under the owner's
/// lock need no pin, and a call that needs nothing of it past its admission need not touch it.
///
/// The race between loading the pointer and pinning it: a lock-free pinner counts itself in
/// `admitting_` before its load and out after its pin. `replace` takes the old block out of
/// `current_` first, and retires it (so that an unpinned block is freed) only once it has seen
/// `admitting_` at zero after that: every pinner that could have loaded the old block counted
/// itself in before its load, so before the exchange (all sequentially consistent), hence before
/// the zero was seen, and so had pinned before counting itself out. A pinner counting in later
/// loads the new block. When `admitting_` is not zero, the old block waits in `pending_`, and
/// whoever next sees it zero with blocks pending retires them (`sweep`): the next `replace`, or
/// the pinner that brings `admitting_` to zero (the flag `pending_flag_` and the count are a
/// Dekker pair, each side writes its own and then reads the other's, so at least one sweeps).
/// Only the pinned path pays this; nothing is paid by a call that does not pin.
template <class B>
class snapshot_cell {
public:
    explicit snapshot_cell(std::unique_ptr<B> first) noexcept : current_(first.release()) {}
    snapshot_cell(const snapshot_cell&) = delete;
    snapshot_cell& operator=(const snapshot_cell&) = delete;
    ~snapshot_cell() {
        // No handle is left, so nobody is admitting: every pending block can be retired.
        sweep_locked();
        retire(current_.load(std::memory_order_relaxed));
    }

    /// The block in force, for use under the owner's lock only: nothing replaces it while that is
    /// held.
    const B* locked() const noexcept { return current_.load(std::memory_order_relaxed); }

    /// Pins the block in force, under the owner's lock.
    pinned<B> pin_locked() const noexcept {
        const B* const b = current_.load(std::memory_order_relaxed);
        b->pins_.fetch_add(1, std::memory_order_relaxed);
        return pinned<B>(b);
    }

    /// Pins the block in force, without a lock (see the class comment).
    pinned<B> pin() noexcept {
        admitting_.fetch_add(1, std::memory_order_seq_cst);
        const B* const b = current_.load(std::memory_order_seq_cst);
        // Relaxed: the block was built before it was published (the load above), and it is freed
        // only by an acquire-release step that sees this pin given back.
        b->pins_.fetch_add(1, std::memory_order_relaxed);
        if (admitting_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
            pending_flag_.load(std::memory_order_seq_cst)) [[unlikely]]
            sweep();
        return pinned<B>(b);
    }

    /// Makes room for the next `replace`, under the owner's lock, so that it cannot throw. Throws
    /// only `std::bad_alloc`.
    void reserve() {
        std::lock_guard lock(list_mutex_);
        pending_.reserve(pending_.size() + 1);
    }

    /// Puts `next` in force, under the owner's lock. Throws only `std::bad_alloc` (a place in the
    /// pending list; never after `reserve`), and then nothing changed.
    void replace(std::unique_ptr<B> next) {
        std::lock_guard lock(list_mutex_);
        pending_.reserve(pending_.size() + 1);
        const B* const old = current_.exchange(next.release(), std::memory_order_seq_cst);
        pending_.push_back(old);
        pending_flag_.store(true, std::memory_order_seq_cst);
        if (admitting_.load(std::memory_order_seq_cst) == 0)
            sweep_locked();
    }

private:
    void sweep() {
        std::lock_guard lock(list_mutex_);
        if (admitting_.load(std::memory_order_seq_cst) == 0)
            sweep_locked();
    }
    // `list_mutex_` held, `admitting_` seen at zero since every pending block left `current_`.
    void sweep_locked() noexcept {
        for (const B* b : pending_)
            retire(b);
        pending_.clear();
        pending_flag_.store(false, std::memory_order_relaxed);
    }
    static void retire(const B* b) noexcept {
        if ((b->pins_.fetch_or(pinnable::retired, std::memory_order_acq_rel) & ~pinnable::retired) == 0)
            delete b;
    }

    std::atomic<const B*> current_;
    std::atomic<std::uint32_t> admitting_{0};
    std::atomic<bool> pending_flag_{false};
    std::mutex list_mutex_;
    std::vector<const B*> pending_; // out of `current_`, not yet retired; guarded by `list_mutex_`
};

} // namespace resilience::detail
