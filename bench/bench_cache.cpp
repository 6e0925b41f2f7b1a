// SPDX-License-Identifier: MIT
// The cache's hit path (a fresh entry answers, no call), through `run` and through its policy form,
// alone and in a pipeline, against the bare call of the same action in the same run; and, for scale,
// a miss (the entry forgotten before every call, so each one calls and stores). The hit rows must
// show zero allocations per call. See bench/README.md for how to read and reproduce the figures.
#include "harness.hpp"

#include <resilience/cache.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/retry.hpp>
#include <resilience/timeout.hpp>

#include <mutex>
#include <unordered_map>
#include <utility>

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

using bench::bare_call;
using bench::through;
BENCHMARK(bare_call);

// A cache whose one entry (key 7) stays fresh for the whole run, filled by the warm-up call.
rs::cache<int, int> filled() {
    return rs::cache<int, int>{{.ttl = 1h}};
}

void cache_hit_run(benchmark::State& state) {
    const auto c = filled();
    bench::run_on_loop(state, [&](benchmark::State*) -> rs::task<void> {
        benchmark::DoNotOptimize(co_await c.run(7, bench::ready_action));
    });
}
BENCHMARK(cache_hit_run);

void cache_hit_policy(benchmark::State& state) {
    const auto c = filled();
    through(state, c.policy(7));
}
BENCHMARK(cache_hit_policy);

// The cache in front of a retry and a timeout: a hit answers in the cache's `enter`, so the
// stages inside it do nothing.
void cache_hit_pipeline(benchmark::State& state) {
    const auto c = filled();
    through(state, rs::pipeline{c.policy(7), rs::retry{}, rs::timeout{1s}});
}
BENCHMARK(cache_hit_pipeline);

// With a listener: each hit builds and reports a `cache_hit` event (one clock reading more).
void cache_hit_policy_telemetry(benchmark::State& state) {
    std::size_t events = 0;
    const rs::cache<int, int> c{
        {.ttl = 1h, .telemetry = [&events](const rs::telemetry_event&) { ++events; }}};
    through(state, c.policy(7));
    benchmark::DoNotOptimize(events);
}
BENCHMARK(cache_hit_policy_telemetry);

// By hand: the least a locked cache's hit can cost, whatever the library does: one clock reading,
// a mutex taken and given back around a hash table lookup and a freshness test, in the benchmark's
// own frame; no LRU order, no frame of a policy. The floor under the rows above on this machine.
void by_hand_locked_lookup(benchmark::State& state) {
    std::mutex mutex;
    std::unordered_map<int, std::pair<int, rs::steady_clock::time_point>> table;
    table.emplace(7, std::pair{42, rs::steady_clock{}.now() + 1h});
    bench::run_on_loop(state, [&](benchmark::State*) -> rs::task<void> {
        const auto now = rs::steady_clock{}.now();
        int value = 0;
        {
            std::lock_guard lock(mutex);
            const auto it = table.find(7);
            if (it != table.end() && now < it->second.second)
                value = it->second.first;
        }
        benchmark::DoNotOptimize(value);
        co_return;
    });
}
BENCHMARK(by_hand_locked_lookup);

// A miss every time: the entry is forgotten first, so each call refreshes (a shared call that nobody
// joins) and stores the value.
void cache_miss_run(benchmark::State& state) {
    const auto c = filled();
    bench::run_on_loop(state, [&](benchmark::State*) -> rs::task<void> {
        c.invalidate(7);
        benchmark::DoNotOptimize(co_await c.run(7, bench::ready_action));
    });
}
BENCHMARK(cache_miss_run);

} // namespace

RESILIENCE_BENCH_MAIN("bare_call")
