// SPDX-License-Identifier: MIT
// Compile cost of one five-policy pipeline called once with `execute`, against include_only.cpp
// (see bench/README.md, "Build cost"). With -DRESILIENCE_BENCH_OUTCOME the one call is
// `execute_outcome`; with -DRESILIENCE_BENCH_BOTH it makes both calls.
#include <resilience/resilience.hpp>

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {
rs::task<int> dependency() {
    co_return 42;
}
} // namespace

int main() {
    rs::pipeline p{rs::retry{}, rs::circuit_breaker{{.failure_threshold = 5}}, rs::timeout{1s},
                   rs::bulkhead{{.max_concurrent_calls = 8}},
                   rs::rate_limiter{{.token_limit = 10, .tokens_per_second = 10}}};
    const auto action = [] { return dependency(); };
#if defined(RESILIENCE_BENCH_OUTCOME)
    auto o = rs::sync_wait(p.execute_outcome(action));
    return o.has_value() && *o == 42 ? 0 : 1;
#elif defined(RESILIENCE_BENCH_BOTH)
    int v = rs::sync_wait(p.execute(action));
    auto o = rs::sync_wait(p.execute_outcome(action));
    return v == 42 && o.has_value() ? 0 : 1;
#else
    int v = rs::sync_wait(p.execute(action));
    return v == 42 ? 0 : 1;
#endif
}
