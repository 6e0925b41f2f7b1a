// SPDX-License-Identifier: MIT
/// \file retry_budget/retry_budget.hpp
/// `retry_budget`: a ceiling on retries shared by every call that uses it.
///
/// Locking: the one mutex is `retry_budget_state::reconfiguring` (retry_budget/state.hpp, which
/// says what it guards); `options()` and `reconfigure()` take it themselves, every other operation
/// is lock-free.
#pragma once

#include "../detail/label.hpp"
#include "../detail/shared_handle.hpp"
#include "options.hpp"
#include "state.hpp"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>

namespace resilience::inline v0_2 {

/// A ceiling on retries across every call that shares it. `max_attempts` bounds one call but
/// cannot see that every other caller is also retrying, which is how a struggling dependency gets
/// several times its normal load at the moment it can least take it; a budget sees the total.
///
/// Every call deposits `ratio` tokens (up to `capacity`); every retry must withdraw one whole
/// token first, and when none is left the retry does not happen. So over any run, retries granted
/// never exceed `capacity + ratio * calls`. It counts rather than measures time: no clock, no timer.
///
/// A cheap copyable handle: copies share one budget, which is thread-safe (lock-free atomics), so
/// any number of retries, on any number of threads and event loops, may hold it. Tokens are kept
/// in fixed point (10^-9 of a token), so deposits and withdrawals are exact and never drift.
/// Its operations are `const`: they change the shared budget, not the handle. The budget lives as
/// long as any copy (a retry or a hedge holds one in its options).
///
///     rs::retry_budget shared{{.ratio = 0.2, .capacity = 10}};
///     rs::retry a{{.budget = shared}};
///     rs::retry b{{.max_attempts = 5, .budget = shared}};   // a and b draw from one budget
///
/// Not a pipeline stage: hand it to the policies that retry (`retry_options::budget`).
class retry_budget : public detail::shared_handle<retry_budget, detail::retry_budget_state> {
    using state = detail::retry_budget_state;
    using handle = detail::shared_handle<retry_budget, state>;

public:
    /// Validates `options`: a bad value throws `std::invalid_argument` naming the field and value.
    explicit retry_budget(retry_budget_options options = {}) : handle(make(options)) {}

    /// Tokens left: the number of retries that may start now (its whole part). Never negative, never
    /// above `capacity` (the fixed-point count is exact; its conversion to `double` is kept at most
    /// `capacity`, which it could otherwise pass by a rounding).
    double tokens() const noexcept {
        const double capacity = budget().capacity.load(std::memory_order_relaxed);
        const double t =
            static_cast<double>(budget().units.load(std::memory_order_relaxed)) / units_per_token;
        return t < capacity ? t : capacity;
    }

    /// Records a call: deposits `ratio` tokens, keeping the total at most `capacity`.
    void record_call() const noexcept {
        state& s = budget();
        s.calls.fetch_add(1, std::memory_order_relaxed);
        const std::uint64_t version = s.version.load(std::memory_order_seq_cst);
        const std::int64_t ratio = s.ratio_units.load(std::memory_order_seq_cst);
        const std::int64_t capacity = s.capacity_units.load(std::memory_order_seq_cst);
        std::int64_t current = s.units.load(std::memory_order_relaxed);
        std::int64_t next;
        do {
            next = current + ratio < capacity ? current + ratio : capacity;
        } while (!s.units.compare_exchange_weak(current, next, std::memory_order_seq_cst,
                                                std::memory_order_relaxed));
        // Reconfigured meanwhile (the two values may even come from two configurations): the deposit
        // was capped at a capacity no longer in force. Either this load sees the new version and caps
        // again, or (all seq_cst) the deposit came before the reconfiguration's own capping, which saw it.
        if (s.version.load(std::memory_order_seq_cst) != version) [[unlikely]]
            cap(s);
    }

    /// Takes one token for a retry; false (and nothing taken) when less than one is left.
    bool try_withdraw() const noexcept {
        state& s = budget();
        std::int64_t current = s.units.load(std::memory_order_relaxed);
        do {
            if (current < units_per_token) {
                s.denied.fetch_add(1, std::memory_order_relaxed);
                return false;
            }
        } while (!s.units.compare_exchange_weak(current, current - units_per_token, std::memory_order_acq_rel,
                                                std::memory_order_relaxed));
        s.granted.fetch_add(1, std::memory_order_relaxed);
        return true;
    }

    std::uint64_t calls() const noexcept {
        return budget().calls.load(std::memory_order_relaxed);
    } ///< calls recorded
    std::uint64_t granted() const noexcept {
        return budget().granted.load(std::memory_order_relaxed);
    } ///< retries allowed
    std::uint64_t denied() const noexcept {
        return budget().denied.load(std::memory_order_relaxed);
    } ///< retries refused

    /// A copy of the options in force: the constructor's or the latest `reconfigure`'s.
    retry_budget_options options() const {
        state& s = budget();
        std::lock_guard lock(s.reconfiguring); // both from one configuration
        return {.ratio = s.ratio.load(std::memory_order_relaxed),
                .capacity = s.capacity.load(std::memory_order_relaxed)};
    }

    /// Puts new options in force for the operations that come after, on every copy of the budget.
    /// `options` is checked exactly as by the constructor (`std::invalid_argument` naming the field
    /// and the value); when it is refused, nothing changes. Thread-safe against every other
    /// operation, reconfigurations included.
    ///
    /// Carried over: the tokens, capped at the new `capacity` (a larger capacity adds none: tokens
    /// are earned by calls), and the counts `calls()`, `granted()` and `denied()`. The new `ratio`
    /// applies from the next call recorded. So the bound of the class comment holds from the change
    /// on, with the tokens left at the change in place of `capacity`.
    ///
    /// Memory: none; the options are a few numbers held in place.
    void reconfigure(retry_budget_options options) const {
        check(options);
        state& s = budget();
        std::lock_guard lock(s.reconfiguring);
        s.ratio.store(options.ratio, std::memory_order_relaxed);
        s.capacity.store(options.capacity, std::memory_order_relaxed);
        s.ratio_units.store(units_in(options.ratio), std::memory_order_seq_cst);
        s.capacity_units.store(units_in(options.capacity), std::memory_order_seq_cst);
        s.version.fetch_add(1, std::memory_order_seq_cst);
        cap(s);
    }

    // `==` (both handles share one budget) and `std::hash`: from `detail::shared_handle`.

private:
    static constexpr std::int64_t units_per_token = 1'000'000'000;

    state& budget() const noexcept { return held(); }

    // Checked first: the units are computed only from valid options.
    static state* make(const retry_budget_options& o) {
        check(o);
        return handle::make_state(o, units_in(o.ratio), units_in(o.capacity));
    }

    // Brings the tokens down to the capacity in force, if they are above it.
    static void cap(state& s) noexcept {
        std::int64_t current = s.units.load(std::memory_order_seq_cst);
        for (;;) {
            const std::int64_t capacity = s.capacity_units.load(std::memory_order_seq_cst);
            if (current <= capacity ||
                s.units.compare_exchange_weak(current, capacity, std::memory_order_seq_cst,
                                              std::memory_order_seq_cst))
                return;
        }
    }

    // The whole units in `x` tokens (0 < x <= 1e9), rounded down exactly. `x * 10^9` in `double` may
    // round up to the next integer (above 2^53 it always lands on one), which would let the budget
    // hold a little more than `capacity`. A fused multiply-add gives what is left of the exact product
    // above that integer, negative when it rounded up, with the sign right.
    static std::int64_t units_in(double x) noexcept {
        const double scale = static_cast<double>(units_per_token);
        const double whole = std::floor(x * scale);
        const double left = std::fma(x, scale, -whole); // x * 10^9 - whole, rounded once
        return static_cast<std::int64_t>(whole) + static_cast<std::int64_t>(std::floor(left));
    }

    static const retry_budget_options& check(const retry_budget_options& o) {
        auto fail = [](const char* field, const char* rule, double got) {
            std::ostringstream msg;
            msg << detail::policy_label("retry_budget", {}) << ": " << field << ' ' << rule << ", got "
                << got;
            throw std::invalid_argument(msg.str());
        };
        if (!(o.ratio > 0.0 && o.ratio <= 1.0))
            fail("ratio", "must be in (0, 1]", o.ratio);
        if (o.ratio < 1e-9)
            fail("ratio", "must be at least 1e-9", o.ratio);
        if (!(o.capacity > 0.0))
            fail("capacity", "must be positive", o.capacity);
        if (!(o.capacity <= 1e9))
            fail("capacity", "must be at most 1e9", o.capacity);
        return o;
    }
};

} // namespace resilience
