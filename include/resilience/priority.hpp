// SPDX-License-Identifier: MIT
/// \file priority.hpp
/// Priorities under load: the property that gives a call its class (`rs::priority`), and the
/// `priority_classes` option that the bulkhead (fixed and adaptive), `rate_limiter` and
/// `sliding_window_limiter` take as `.priorities`, so that under saturation they refuse the lower
/// classes first and keep a share of their limit for the higher ones. docs/priorities.md has the
/// model, a worked example and figures.
///
///     rs::bulkhead db{{.max_concurrent_calls = 20, .queue_limit = 40,
///                      .priorities = {.classes = 2, .reserved = {0, 0.25}}}};
///     rs::context ctx;
///     ctx.set_property(rs::priority, 1);              // this call is of class 1, the higher one
///     co_await db.execute(checkout, ctx);
#pragma once

#include "context.hpp"
#include "detail/time.hpp"
#include "properties.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace resilience::inline v0_2 {

/// The priority of a call, as a property of the context it is started with
/// (`ctx.set_property(rs::priority, 1)`, properties.hpp): the class the policies with
/// `priorities` admit it in. Classes are numbered from 0, the lowest (shed first), to
/// `classes - 1`, the highest. A value below 0 counts as class 0 and one above the highest class as
/// the highest class; a call without the property is of the policy's `default_class`.
inline constexpr property_key<int> priority{"priority"};

/// The most classes a `priority_classes` may have.
inline constexpr std::size_t max_priority_classes = 8;

/// The `priorities` option of `bulkhead_options`, `rate_limiter_options` and
/// `sliding_window_limiter_options`. The default, `classes = 0`, turns priorities off: every call is
/// admitted as before, and pays nothing for the feature.
///
/// With `classes = n`, each call is in a class from 0 (lowest) to n - 1 (highest), by its
/// `rs::priority` property, and:
/// - **Reserved shares.** A call of class k takes a slot (a token, a permit) only while enough of the
///   limit stays free for the shares reserved by the classes above it: it is admitted when, after
///   taking one, at least `floor(limit * (reserved[k+1] + ... + reserved[n-1]))` remain. The limit is
///   the bulkhead's current limit (with `adapt`, wherever the algorithm has moved it), the
///   limiter's `token_limit` or `permit_limit`. The highest class may take the last one. So under
///   saturation the lower classes are refused (or wait) first, and the reserved share stays
///   available to the classes above, while nothing is held back from anyone when load is light.
///   With nothing reserved (`reserved` empty or all zeros) admission is the same for every class
///   and only the queue order below tells them apart: strict priority.
/// - **Queue order.** Waiters are served highest class first, in arrival order within a class. A
///   call never waits behind a waiter of a lower class, and never passes one of its own class or
///   above. A freed slot (a token, a permit) goes to the first waiter when its class may take it.
/// - **Displacement.** A call that finds the queue full (`queue_limit` waiters) takes the place of
///   the last-arrived waiter of the lowest class present, if that class is below its own; the
///   waiter it displaces is refused at that instant with `rejection_reason::queue_full`, as if it
///   had just found the queue full. With no lower class waiting, the arriving call is refused.
///
/// Checked at construction (`std::invalid_argument` naming the field and the value): `classes` at
/// most `max_priority_classes`; `reserved` empty or one share per class, each in [0, 1), the
/// lowest class's 0 (no class is below it to keep out), the shares adding up to less than 1;
/// `default_class` a class (0 when `classes` is 0).
struct priority_classes {
    /// How many classes, at most `max_priority_classes`. 0 (the default): priorities off.
    std::size_t classes = 0;
    /// The share of the limit reserved for each class, lowest class first (`reserved[0]`, for
    /// class 0, must be 0). Empty: nothing reserved, strict priority in the queue only.
    std::vector<double> reserved{};
    /// The class of a call whose context has no `rs::priority`.
    int default_class = 0;
};

namespace detail {

/// A checked `priority_classes`, in the form admission uses: for each class, the share of the
/// limit the classes above it keep. Default-constructed: priorities off.
class priority_table {
public:
    priority_table() = default;
    /// From options that `validate` accepted.
    explicit priority_table(const priority_classes& p) noexcept
        : classes_(static_cast<std::uint8_t>(p.classes)),
          default_(static_cast<std::uint8_t>(p.default_class)) {
        double above = 0;
        for (std::size_t k = p.classes; k-- > 0;) {
            above_[k] = above;
            if (!p.reserved.empty())
                above += p.reserved[k];
        }
    }

    /// Checks `p` (see `priority_classes`): `std::invalid_argument` naming the field and the value,
    /// after `prefix` (the policy's label and ": ").
    static void validate(const priority_classes& p, const std::string& prefix) {
        const std::string who = prefix + "priorities.";
        if (p.classes > max_priority_classes)
            throw std::invalid_argument(who + "classes must be at most " +
                                        std::to_string(max_priority_classes) + ", got " +
                                        std::to_string(p.classes));
        if (!p.reserved.empty() && p.reserved.size() != p.classes)
            throw std::invalid_argument(who + "reserved must be empty or have one share per class (" +
                                        std::to_string(p.classes) + "), got " +
                                        std::to_string(p.reserved.size()) + " shares");
        double sum = 0;
        for (std::size_t k = 0; k < p.reserved.size(); ++k) {
            const double share = p.reserved[k];
            if (!(share >= 0 && share < 1)) // also NaN
                throw std::invalid_argument(who + "reserved[" + std::to_string(k) +
                                            "] must be in [0, 1), got " + format_number(share));
            if (k == 0 && share != 0)
                throw std::invalid_argument(who +
                                            "reserved[0] must be 0 (no class is below the lowest), got " +
                                            format_number(share));
            sum += share;
        }
        if (!(sum < 1))
            throw std::invalid_argument(who + "reserved must add up to less than 1, got " +
                                        format_number(sum));
        const int top = static_cast<int>(p.classes) - 1;
        if (p.default_class < 0 || p.default_class > std::max(top, 0))
            throw std::invalid_argument(who + "default_class must be a class, from 0 to " +
                                        std::to_string(std::max(top, 0)) + ", got " +
                                        std::to_string(p.default_class));
    }

    /// Whether priorities are on.
    [[nodiscard]] bool enabled() const noexcept { return classes_ != 0; }
    [[nodiscard]] unsigned classes() const noexcept { return classes_; }

    /// The class of a call started with `ctx` (see `rs::priority`). Priorities on.
    [[nodiscard]] unsigned class_of(const context& ctx) const noexcept {
        const int* p = ctx.property(priority);
        if (!p)
            return default_;
        if (*p <= 0)
            return 0;
        return *p >= classes_ ? classes_ - 1u : static_cast<unsigned>(*p);
    }

    /// How many of `limit` whole slots (tokens, permits) a call of class `k` must leave free for the
    /// classes above it: the limit times their shares, rounded down, and always less than `limit`.
    /// The product is taken with a relative tolerance of 1e-9, so that a share written in decimal
    /// gives the whole number it reads as (0.29 of 100 is 29, not 28.999999999999996 rounded down).
    [[nodiscard]] std::uint64_t keep(unsigned k, std::uint64_t limit) const noexcept {
        const double share = above_[k];
        if (share == 0 || limit == 0)
            return 0;
        const double exact = static_cast<double>(limit) * share;
        const double whole = std::floor(exact + exact * 1e-9);
        // Compared before it converts: with a limit near 2^64 the tolerance may carry it past what a
        // std::uint64_t holds.
        if (!(whole < static_cast<double>(limit)))
            return limit - 1;
        const auto kept = static_cast<std::uint64_t>(whole);
        return kept < limit ? kept : limit - 1;
    }

private:
    std::uint8_t classes_ = 0;
    std::uint8_t default_ = 0;
    std::array<double, max_priority_classes> above_{}; // for each class, the shares of those above it
};

} // namespace detail

} // namespace resilience
