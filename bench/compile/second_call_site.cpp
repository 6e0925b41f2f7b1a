// SPDX-License-Identifier: MIT
// Compile cost of a second call site: five_policies.cpp's pipeline and call, and a second `execute`
// of it with another action type (a lambda that captures a request by reference and calls another
// dependency), against the same file with -DRESILIENCE_BENCH_BARE_SECOND, which makes the second call
// without the pipeline (so the difference is what the call site adds, not the dependency's own
// code; see bench/README.md, "Build cost"). With -DRESILIENCE_BENCH_BOUND the second call is
// `execute(f, args...)` with a std::string argument.
#include "pipeline_of_five.hpp"

#include <string>

namespace rs = resilience;
using bench_compile::dependency;

namespace {
rs::task<int> lookup(const std::string& key, rs::stop_token) {
    co_return static_cast<int>(key.size());
}
} // namespace

int main() {
    auto p = bench_compile::pipeline_of_five();
    const auto action = [] { return dependency(); };
    int v = rs::sync_wait(p.execute(action));
    const std::string key = "user:42";
#if defined(RESILIENCE_BENCH_BARE_SECOND)
    int w = rs::sync_wait(lookup(key, rs::stop_token{}));
#elif defined(RESILIENCE_BENCH_BOUND)
    int w =
        rs::sync_wait(p.execute([](const std::string& k, rs::stop_token t) { return lookup(k, t); }, key));
#else
    const auto second = [&key](rs::stop_token t) { return lookup(key, t); };
    int w = rs::sync_wait(p.execute(second));
#endif
    return v == 42 && w == 7 ? 0 : 1;
}
