// SPDX-License-Identifier: MIT
// Shared by the benchmarks: counts heap allocations, runs a benchmark body inside an event loop, and
// prints each result as a ratio to the bare call measured in the same run.
#pragma once

#include <resilience/event_loop.hpp>
#include <resilience/task.hpp>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <new>
#include <string>
#include <vector>

namespace bench {

/// Every operator new in the process, counted (relaxed: a tally, not a synchronisation point).
inline std::atomic<std::size_t> allocations{0};

/// Runs `body(state)` as a coroutine on a fresh real-time loop on the benchmark's thread, and reports
/// heap allocations per iteration after the loop's own warm-up. `done()` runs after the last iteration.
template <class Body, class Done = void (*)()>
void run_on_loop(
    benchmark::State& state, Body body, Done done = [] {}) {
    resilience::event_loop loop;
    loop.run([](benchmark::State& st, Body& b, Done& d) -> resilience::task<void> {
        // Warm the frame cache and any pools before counting.
        co_await b(nullptr);
        const std::size_t before = allocations.load(std::memory_order_relaxed);
        for (auto _ : st)
            co_await b(&st);
        const std::size_t after = allocations.load(std::memory_order_relaxed);
        st.counters["allocs/call"] =
            benchmark::Counter(static_cast<double>(after - before) / static_cast<double>(st.iterations()));
        d();
    }(state, body, done));
}

/// Prints the usual console output, then a summary: ns per call, ratio to the named baseline, and
/// allocations per call.
class ratio_reporter : public benchmark::ConsoleReporter {
public:
    explicit ratio_reporter(std::string baseline) : baseline_(std::move(baseline)) {}

    void ReportRuns(const std::vector<Run>& runs) override {
        ConsoleReporter::ReportRuns(runs);
        for (const auto& run : runs) {
            if (run.run_type != Run::RT_Iteration || run.error_occurred)
                continue;
            row r;
            r.ns = run.GetAdjustedRealTime();
            auto it = run.counters.find("allocs/call");
            r.allocs = it == run.counters.end() ? 0.0 : static_cast<double>(it->second);
            order_.push_back(run.benchmark_name());
            rows_[run.benchmark_name()] = r;
        }
    }

    void Finalize() override {
        ConsoleReporter::Finalize();
        const auto base = rows_.find(baseline_);
        fmt::print("\n{:<52} {:>12} {:>14} {:>12}\n", "benchmark", "ns/call", "x bare call", "allocs/call");
        for (const auto& name : order_) {
            const row& r = rows_[name];
            const double ratio = base == rows_.end() ? 0.0 : r.ns / base->second.ns;
            fmt::print("{:<52} {:>12.1f} {:>14.2f} {:>12.3f}\n", name, r.ns, ratio, r.allocs);
        }
    }

private:
    struct row {
        double ns = 0;
        double allocs = 0;
    };
    std::string baseline_;
    std::vector<std::string> order_;
    std::map<std::string, row> rows_;
};

} // namespace bench

/// Benchmarks' main: the ratio reporter with `baseline` as the bare call.
#define RESILIENCE_BENCH_MAIN(baseline)                                                                      \
    void* operator new(std::size_t n) {                                                                      \
        bench::allocations.fetch_add(1, std::memory_order_relaxed);                                          \
        if (void* p = std::malloc(n ? n : 1))                                                                \
            return p;                                                                                        \
        throw std::bad_alloc{};                                                                              \
    }                                                                                                        \
    void* operator new[](std::size_t n) {                                                                    \
        return ::operator new(n);                                                                            \
    }                                                                                                        \
    void operator delete(void* p) noexcept {                                                                 \
        std::free(p);                                                                                        \
    }                                                                                                        \
    void operator delete(void* p, std::size_t) noexcept {                                                    \
        std::free(p);                                                                                        \
    }                                                                                                        \
    void operator delete[](void* p) noexcept {                                                               \
        std::free(p);                                                                                        \
    }                                                                                                        \
    void operator delete[](void* p, std::size_t) noexcept {                                                  \
        std::free(p);                                                                                        \
    }                                                                                                        \
    int main(int argc, char** argv) {                                                                        \
        benchmark::Initialize(&argc, argv);                                                                  \
        if (benchmark::ReportUnrecognizedArguments(argc, argv))                                              \
            return 1;                                                                                        \
        bench::ratio_reporter reporter{baseline};                                                            \
        benchmark::RunSpecifiedBenchmarks(&reporter);                                                        \
        benchmark::Shutdown();                                                                               \
        return 0;                                                                                            \
    }
