// SPDX-License-Identifier: MIT
#include "second_unit.hpp"

#include <resilience/event_loop.hpp>

#include <stdexcept>

namespace second_unit {

int fail_through(resilience::circuit_breaker<>& breaker, int calls) {
    int failed = 0;
    for (int i = 0; i < calls; ++i) {
        const auto r = resilience::sync_wait(breaker.execute_outcome([]() -> resilience::task<int> {
            throw std::runtime_error("down");
            co_return 0;
        }));
        failed += r.has_failure() ? 1 : 0;
    }
    return failed;
}

resilience::bulkhead<> make_bulkhead(std::size_t max) {
    return resilience::bulkhead<>{{.max_concurrent_calls = max}};
}

} // namespace second_unit
