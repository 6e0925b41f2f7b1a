// SPDX-License-Identifier: MIT
// A balancer's pick among ten endpoints, against one reading of the steady clock in the same run (a
// pick reads the clock once itself), and a call through a balancer against the bare call. See
// bench/README.md for how to read and reproduce the figures.
#include "harness.hpp"

#include <resilience/balancer.hpp>

#include <string>
#include <vector>

namespace rs = resilience;

namespace {

std::vector<std::string> ten() {
    std::vector<std::string> v;
    for (int i = 0; i < 10; ++i)
        v.push_back("10.0.0." + std::to_string(i + 1) + ":8080");
    return v;
}

// Every row's step is inlined in its loop, as the compiler does by itself for the clock row's: a call
// to the step, with its registers saved and restored, is the harness's and not the measured operation's.
#if defined(__GNUC__)
#define BENCH_STEP [&]() __attribute__((always_inline))
#else
#define BENCH_STEP [&]()
#endif

// Runs `step` once per iteration, after a warm-up one, with the allocations per iteration reported.
template <class Step>
void counted(benchmark::State& state, Step step) {
    step();
    const std::size_t before = bench::allocations.load(std::memory_order_relaxed);
    for (auto _ : state)
        step();
    state.counters["allocs/call"] =
        static_cast<double>(bench::allocations.load(std::memory_order_relaxed) - before) /
        static_cast<double>(state.iterations());
}

void steady_clock_now(benchmark::State& state) {
    counted(
        state, BENCH_STEP { benchmark::DoNotOptimize(rs::steady_clock{}.now()); });
}
BENCHMARK(steady_clock_now);

// A pick as a call makes it, on the set it holds for its whole length: the clock read, the choice,
// the endpoint counted in flight and given back.
void pick(benchmark::State& state, rs::balance_pick how) {
    rs::balancer<std::string> lb{ten(), {.pick = how}};
    const auto held = rs::detail::balancer_access::pin(lb);
    counted(
        state, BENCH_STEP { benchmark::DoNotOptimize(rs::detail::balancer_access::pick_once(lb, *held)); });
}
void pick_among_ten_least_loaded(benchmark::State& state) {
    pick(state, rs::balance_pick::least_loaded);
}
BENCHMARK(pick_among_ten_least_loaded);
void pick_among_ten_round_robin(benchmark::State& state) {
    pick(state, rs::balance_pick::round_robin);
}
BENCHMARK(pick_among_ten_round_robin);
void pick_among_ten_random(benchmark::State& state) {
    pick(state, rs::balance_pick::random);
}
BENCHMARK(pick_among_ten_random);

// A lease (`lb.pick()`), dropped unreported: the pick, with the pin on the set and the hold on the
// balancer that keep a lease safe on its own.
void lease_among_ten(benchmark::State& state) {
    rs::balancer<std::string> lb{ten()};
    counted(
        state, BENCH_STEP {
            auto lease = lb.pick();
            benchmark::DoNotOptimize(&lease.endpoint());
        });
}
BENCHMARK(lease_among_ten);

// A lease reported as a success: the latency estimate updated, the ejection counts kept.
void lease_and_report_among_ten(benchmark::State& state) {
    rs::balancer<std::string> lb{ten()};
    counted(
        state, BENCH_STEP {
            auto lease = lb.pick();
            benchmark::DoNotOptimize(&lease.endpoint());
            lease.succeeded();
        });
}
BENCHMARK(lease_and_report_among_ten);

void bare_call(benchmark::State& state) {
    bench::bare_call(state);
}
BENCHMARK(bare_call);

// The ready action through a balancer, reading its endpoint.
void balancer_alone(benchmark::State& state) {
    rs::balancer<std::string> lb{ten()};
    bench::run_on_loop(state, [&](benchmark::State*) -> rs::task<void> {
        benchmark::DoNotOptimize(co_await lb.execute([](const rs::context& c) {
            benchmark::DoNotOptimize(rs::endpoint<std::string>(c).size());
            return bench::ready_dependency();
        }));
    });
}
BENCHMARK(balancer_alone);

} // namespace

RESILIENCE_BENCH_MAIN("steady_clock_now")
