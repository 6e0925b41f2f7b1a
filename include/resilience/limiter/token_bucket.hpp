// SPDX-License-Identifier: MIT
/// \file limiter/token_bucket.hpp
/// `token_bucket`: the meter of `rate_limiter`, a `lock_free_meter` (see state.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace resilience::inline v0_2::detail {

/// A token bucket in time form: the bucket holds `(now - empty_at) / interval` tokens, capped at
/// `capacity` (the `token_limit`). Keeping the instant the bucket was empty instead of a token count makes
/// every due time one addition, exact on virtual time whenever `interval` is a whole number of nanoseconds
/// (10 per second: 100 ms), and within a nanosecond otherwise.
///
/// That instant is the bucket's whole state, so it lives in one atomic word, as the bits of the
/// double, and a token is taken with one compare-and-swap (a `lock_free_meter`). While the mutex
/// side holds the bucket, the word holds `held_bits` instead and the instant is in `empty_at_`.
///
/// The capacity and the interval change only by `reconfigure`, with the bucket held; they are
/// atomics (read relaxed, after the word's acquire) because the lock-free side reads them. A take
/// that read the word before a reconfiguration and the parameters after fails its
/// compare-and-swap, since the word was held in between, unless the reconfiguration put back the
/// very same instant: the bucket was then left as it was and cannot hold more tokens at that
/// take's reading (made before the reconfiguration) under either parameters.
class token_bucket {
public:
    token_bucket(std::size_t capacity, double tokens_per_second) noexcept
        : capacity_(static_cast<double>(capacity)), interval_(1e9 / tokens_per_second),
          empty_at_(-static_cast<double>(capacity) * (1e9 / tokens_per_second)),
          word_(std::bit_cast<std::uint64_t>(empty_at_)) {}
    // Moved only before it is shared.
    token_bucket(token_bucket&& other) noexcept
        : capacity_(other.capacity_.load(std::memory_order_relaxed)),
          interval_(other.interval_.load(std::memory_order_relaxed)), empty_at_(other.empty_at_),
          held_(other.held_), word_(other.word_.load(std::memory_order_relaxed)) {}

    bool try_take_shared(std::chrono::nanoseconds now) noexcept {
        std::uint64_t seen = word_.load(std::memory_order_acquire);
        while (seen != held_bits) {
            double empty_at = std::bit_cast<double>(seen);
            if (!take(empty_at, now, capacity(), interval()))
                return false;
            if (word_.compare_exchange_weak(seen, std::bit_cast<std::uint64_t>(empty_at),
                                            std::memory_order_acq_rel, std::memory_order_acquire))
                return true;
        }
        return false;
    }
    void hold() noexcept {
        if (!held_) {
            empty_at_ = std::bit_cast<double>(word_.exchange(held_bits, std::memory_order_acq_rel));
            held_ = true;
        }
    }
    void unhold() noexcept {
        if (held_) {
            word_.store(std::bit_cast<std::uint64_t>(empty_at_), std::memory_order_release);
            held_ = false;
        }
    }

    bool try_take(std::chrono::nanoseconds now) noexcept {
        return take(empty_at_, now, capacity(), interval());
    }
    double available_at(std::chrono::nanoseconds now, std::size_t ahead) noexcept {
        const double iv = interval();
        refill(empty_at_, now, capacity(), iv);
        return std::max(static_cast<double>(now.count()), empty_at_ + static_cast<double>(ahead + 1) * iv);
    }
    double remaining(std::chrono::nanoseconds now) noexcept {
        refill(empty_at_, now, capacity(), interval());
        return std::clamp((static_cast<double>(now.count()) - empty_at_) / interval(), 0.0, capacity());
    }

    /// New parameters from `now` on; the bucket is held (under the limiter's mutex). The tokens
    /// earned up to `now` are counted at the old rate (a full bucket holds the old capacity),
    /// fractions included, then kept, capped at the new capacity; from `now` on they accrue at
    /// the new rate. A bucket whose rate does not change keeps its instant as it is when the
    /// tokens fit the new capacity, so its due times stay exact.
    void reconfigure(std::size_t capacity, double tokens_per_second, std::chrono::nanoseconds now) noexcept {
        const double old_capacity = this->capacity(), old_interval = interval();
        const double new_capacity = static_cast<double>(capacity), new_interval = 1e9 / tokens_per_second;
        refill(empty_at_, now, old_capacity, old_interval);
        const double t = static_cast<double>(now.count());
        const double earned = std::max(t - empty_at_, 0.0); // in nanoseconds at the old rate
        if (earned / old_interval > new_capacity)
            empty_at_ = t - new_capacity * new_interval;
        else if (new_interval != old_interval)
            empty_at_ = t - earned * (new_interval / old_interval);
        capacity_.store(new_capacity, std::memory_order_relaxed);
        interval_.store(new_interval, std::memory_order_relaxed);
    }

private:
    // A signalling NaN: arithmetic never produces one, so no instant the bucket computes has these bits.
    static constexpr std::uint64_t held_bits = 0x7ff0'0000'0000'0001;

    double capacity() const noexcept { return capacity_.load(std::memory_order_relaxed); }
    double interval() const noexcept { return interval_.load(std::memory_order_relaxed); }

    static bool take(double& empty_at, std::chrono::nanoseconds now, double capacity,
                     double interval) noexcept {
        refill(empty_at, now, capacity, interval);
        if (static_cast<double>(now.count()) < empty_at + interval)
            return false;
        empty_at += interval;
        return true;
    }

    // A full bucket stays full: time spent idle beyond that adds nothing. Less than a nanosecond
    // of overflow is kept, though: it is what rounding a due time up to a whole nanosecond adds,
    // and dropping it would push every later token back by that much again, a drift.
    static void refill(double& empty_at, std::chrono::nanoseconds now, double capacity,
                       double interval) noexcept {
        const double full_since = static_cast<double>(now.count()) - capacity * interval;
        if (full_since - empty_at >= 1.0)
            empty_at = full_since;
    }

    std::atomic<double> capacity_;    // tokens; written only by `reconfigure`
    std::atomic<double> interval_;    // nanoseconds per token; written only by `reconfigure`
    double empty_at_;                 // nanoseconds since the limiter was made; the state while `held_`
    bool held_ = false;               // guarded by the limiter's mutex
    std::atomic<std::uint64_t> word_; // `empty_at` as bits, or `held_bits`
};

} // namespace resilience::detail
