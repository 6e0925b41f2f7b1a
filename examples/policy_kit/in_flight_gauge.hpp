// SPDX-License-Identifier: MIT
/// \file examples/policy_kit/in_flight_gauge.hpp
/// The smallest useful policy: counts the calls inside it now and the most there ever were. Fast
/// protocol only, never waits. docs/writing_a_policy.md quotes it; tests/test_writing_a_policy.cpp
/// tests it.
#pragma once

#include <resilience/policy_kit.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <utility>

namespace example {

/// Counts the calls between its `enter` and its `leave`. A handle: copies share the counts, which
/// are atomic, so calls on any thread may go through it.
class in_flight_gauge : public resilience::policy_base<in_flight_gauge> {
    struct counts {
        std::atomic<std::size_t> now{0};
        std::atomic<std::size_t> peak{0};
    };

public:
    [[nodiscard]] std::size_t in_flight() const noexcept { return counts_->now.load(); }
    [[nodiscard]] std::size_t peak() const noexcept { return counts_->peak.load(); }

    // ---- the policy protocol (see policy.hpp and docs/writing_a_policy.md) ----
    static constexpr bool enter_never_waits = true; // so the pipeline never needs a `run`
    static constexpr bool copied_into_calls = true; // a handle: `gauge.execute(f)` copies it
    struct call_state {
        std::shared_ptr<counts> held; // set once entered: the call keeps the counts alive
        void give_back() noexcept {
            if (held)
                --std::exchange(held, nullptr)->now;
        }
        // `leave` did not run: the call's frame was destroyed (its event loop torn down).
        ~call_state() { give_back(); }
    };

    template <class R>
    resilience::step enter(call_state& c, const resilience::context&,
                           std::optional<resilience::outcome<R>>&) const {
        const std::size_t now = ++counts_->now;
        std::size_t peak = counts_->peak.load();
        while (peak < now && !counts_->peak.compare_exchange_weak(peak, now)) {
        }
        c.held = counts_;
        return resilience::step::proceed;
    }

    template <class R>
    resilience::step leave(call_state& c, const resilience::context&,
                           resilience::outcome<R>&) const noexcept {
        c.give_back();
        return resilience::step::proceed;
    }

private:
    std::shared_ptr<counts> counts_ = std::make_shared<counts>();
};

} // namespace example
