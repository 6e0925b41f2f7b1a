// SPDX-License-Identifier: MIT
/// \file retry_budget/state.hpp
/// `detail::retry_budget_state`: what the copies of a `retry_budget` share (its tokens, counts and
/// the options in force); the operations on it are the budget's (retry_budget/retry_budget.hpp).
///
/// Locking: `retry_budget_state::reconfiguring` guards the configuration: `ratio`, `capacity`,
/// `ratio_units`, `capacity_units` and `version` are stored only under it, so reconfigurations
/// follow one another, and `retry_budget::options()` reads `ratio` and `capacity` under it, so both
/// come from one configuration. Every other read of them (`record_call`, `cap`, `tokens`) is an atomic
/// read without the lock, as said where they are declared; `units` and the counts are lock-free
/// and guarded by nothing.
#pragma once

#include "../detail/shared_handle.hpp"
#include "options.hpp"

#include <atomic>
#include <cstdint>
#include <mutex>

namespace resilience::inline v0_2::detail {

/// What the copies of a `retry_budget` share. The options are scalars, kept in atomics (no block
/// to keep or free): `ratio_units` and `capacity_units`, their fixed-point values, read by
/// `record_call`, and `ratio` and `capacity` as given. A reconfiguration (under `reconfiguring`)
/// stores them all, then bumps `version`; sequentially consistent, with the updates of `units`, so
/// that a deposit racing with a reconfiguration that lowers the capacity cannot leave more than the
/// new capacity (see `retry_budget::record_call`).
struct retry_budget_state : shared_state {
    retry_budget_state(const retry_budget_options& o, std::int64_t ratio_u, std::int64_t capacity_u) noexcept
        : units(capacity_u), ratio_units(ratio_u), capacity_units(capacity_u), ratio(o.ratio),
          capacity(o.capacity) {}
    std::atomic<std::int64_t> units;
    std::atomic<std::uint64_t> calls{0}, granted{0}, denied{0};
    // Stored under `reconfiguring`; `record_call` and `cap` read them without it (atomic reads).
    std::atomic<std::int64_t> ratio_units, capacity_units;
    // Stored under `reconfiguring`; `tokens` reads `capacity` without it (an atomic read).
    std::atomic<double> ratio, capacity;
    // Bumped under `reconfiguring`; `record_call` reads it without it (atomic reads).
    std::atomic<std::uint64_t> version{0};
    std::mutex reconfiguring;
};

} // namespace resilience::detail
