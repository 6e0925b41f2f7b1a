// SPDX-License-Identifier: MIT
// The simulation's clock without its loop's timers: the clock concept and nothing more, so a policy on
// it sleeps through `sleep_until` alone (a bulkhead's queue timeout by a watchdog beside the queued call,
// `any_clock` with no timer loop to hand out).
#pragma once

#include <resilience/clock.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>

#include <utility>

namespace resilience_tests {

struct loopless_clock {
    resilience::testing::virtual_clock inner;
    using duration = resilience::testing::virtual_clock::duration;
    using time_point = resilience::testing::virtual_clock::time_point;
    time_point now() const { return inner.now(); }
    auto sleep_until(time_point tp, resilience::stop_token st) const {
        return inner.sleep_until(tp, std::move(st));
    }
};
static_assert(resilience::clock<loopless_clock> && !resilience::detail::loop_timer_clock<loopless_clock>);

} // namespace resilience_tests
