// SPDX-License-Identifier: MIT
// Compile cost of a second result type: five_policies.cpp's pipeline and call, and a second `execute`
// of it with an action returning `rs::task<long>`, against the same file with
// -DRESILIENCE_BENCH_BARE_SECOND, which awaits that action without the pipeline (so the difference is
// the call body the pipeline compiles for `long`; see bench/README.md, "Build cost").
#include "pipeline_of_five.hpp"

namespace rs = resilience;
using bench_compile::dependency;

namespace {
rs::task<long> count_rows() {
    co_return 7;
}
} // namespace

int main() {
    auto p = bench_compile::pipeline_of_five();
    const auto action = [] { return dependency(); };
    int v = rs::sync_wait(p.execute(action));
#if defined(RESILIENCE_BENCH_BARE_SECOND)
    long w = rs::sync_wait(count_rows());
#else
    long w = rs::sync_wait(p.execute([] { return count_rows(); }));
#endif
    return v == 42 && w == 7 ? 0 : 1;
}
