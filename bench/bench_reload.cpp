// SPDX-License-Identifier: MIT
// What `rs::reloadable<P>` costs on the success path: the five-policy pipeline of bench/policies.cpp called
// directly, the same pipeline through a reloadable (a pin of its snapshot per call), and through a pipeline
// whose one stage is the reloadable (a frame more), all against a bare co_await of the same action in the
// same run. See bench/README.md for how to read and reproduce the figures.
#include "harness.hpp"

#include <resilience/reloadable.hpp>
#include <resilience/resilience.hpp>

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

using bench::through;

// The five of bench/policies.cpp, with a limiter and a bulkhead that never refuse: the success path only.
auto five() {
    return rs::pipeline{rs::retry{}, rs::circuit_breaker{{.failure_threshold = 5}}, rs::timeout{1s},
                        rs::bulkhead{{.max_concurrent_calls = 1'000}},
                        rs::rate_limiter{{.token_limit = 1'000'000'000, .tokens_per_second = 1e12}}};
}

using bench::bare_call;
BENCHMARK(bare_call);

void pipeline_of_five(benchmark::State& state) {
    through(state, five());
}
BENCHMARK(pipeline_of_five);

// The same pipeline held by a reloadable: each call pins the current snapshot (one atomic increment
// and one decrement) and runs the five in one frame, as the pipeline alone does.
void pipeline_of_five_reloadable(benchmark::State& state) {
    through(state, rs::reloadable{five()});
}
BENCHMARK(pipeline_of_five_reloadable);

// The reloadable as the one stage of a pipeline: the stage's pass costs a frame of its own.
void pipeline_of_five_reloadable_stage(benchmark::State& state) {
    through(state, rs::pipeline{rs::reloadable{five()}});
}
BENCHMARK(pipeline_of_five_reloadable_stage);

// A reloadable around a single cheap policy: the pin against the little work left to hide it.
void retry_alone(benchmark::State& state) {
    through(state, rs::retry{});
}
BENCHMARK(retry_alone);

void retry_reloadable(benchmark::State& state) {
    through(state, rs::reloadable{rs::retry{}});
}
BENCHMARK(retry_reloadable);

} // namespace

RESILIENCE_BENCH_MAIN("bare_call")
