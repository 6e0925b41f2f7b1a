// SPDX-License-Identifier: MIT
// Compile cost of one five-policy pipeline called once with `execute`, against include_only.cpp
// (see bench/README.md, "Build cost"). With -DRESILIENCE_BENCH_OUTCOME the one call is
// `execute_outcome`; with -DRESILIENCE_BENCH_BOTH it makes both calls.
#include "pipeline_of_five.hpp"

namespace rs = resilience;
using bench_compile::dependency;

int main() {
    auto p = bench_compile::pipeline_of_five();
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
