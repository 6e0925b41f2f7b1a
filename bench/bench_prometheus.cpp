// SPDX-License-Identifier: MIT
// The success path with resilience::prometheus listening, against the same pipeline without a listener,
// with a listener that only counts events, and the bare call, in the same run (bench/README.md). Each
// call through the five-policy pipeline inside a `telemetry` stage makes two events: the retry's
// `attempt` and the stage's `call`, each one histogram observation in prometheus-cpp.
#include "harness.hpp"

#include <resilience/prometheus.hpp>
#include <resilience/resilience.hpp>

#include <cstddef>

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

using bench::through; // bench/harness.hpp: a ready action through the policy

// The five of bench/policies.cpp's pipeline_of_five, none of which refuses in these runs.
auto five() {
    return rs::pipeline{
        rs::retry{{.name = "api"}}, rs::circuit_breaker{{.name = "api", .failure_threshold = 5}},
        rs::timeout{1s}, rs::bulkhead{{.name = "api", .max_concurrent_calls = 1'000}},
        rs::rate_limiter{{.name = "api", .token_limit = 1'000'000'000, .tokens_per_second = 1e12}}};
}

using bench::bare_call;
BENCHMARK(bare_call);

void pipeline_of_five(benchmark::State& state) {
    through(state, five());
}
BENCHMARK(pipeline_of_five);

// A listener that counts events: what listening costs without any metrics library.
void pipeline_of_five_counting_listener(benchmark::State& state) {
    std::size_t events = 0;
    through(state,
            rs::pipeline{rs::telemetry{{.name = "api",
                                        .listener = [&events](const rs::telemetry_event&) { ++events; }}},
                         five()});
    benchmark::DoNotOptimize(events);
}
BENCHMARK(pipeline_of_five_counting_listener);

// rs::prometheus::metrics listening: a cached label set per event, one histogram observation each.
void pipeline_of_five_prometheus(benchmark::State& state) {
    const rs::prometheus::metrics metrics;
    through(state, rs::pipeline{rs::telemetry{{.name = "api", .listener = metrics.listener()}}, five()});
}
BENCHMARK(pipeline_of_five_prometheus);

// One event recorded directly, without a call around it: the listener's own cost.
void prometheus_record_one_event(benchmark::State& state) {
    const rs::prometheus::metrics metrics;
    const std::string name = "api";
    const rs::telemetry_event e{
        .kind = rs::telemetry_kind::attempt, .policy = "retry", .name = name, .attempt = 1, .duration = 1ms};
    bench::run_on_loop(state, [&](benchmark::State*) -> rs::task<void> {
        metrics(e);
        co_return;
    });
}
BENCHMARK(prometheus_record_one_event);

} // namespace

RESILIENCE_BENCH_MAIN("bare_call")
