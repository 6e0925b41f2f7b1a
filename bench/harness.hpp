// SPDX-License-Identifier: MIT
// Shared by the benchmarks: counts heap allocations, runs a benchmark body inside an event loop, and
// prints each result as a ratio to the bare call measured in the same run.
#pragma once

#include <resilience/event_loop.hpp>
#include <resilience/task.hpp>

#include "replace_new.hpp"

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <dlfcn.h>
#include <map>
#include <new>
#include <string>
#include <vector>

namespace bench {

/// Every operator new in the process, counted (relaxed: a tally, not a synchronisation point).
inline std::atomic<std::size_t> allocations{0};
/// Every exception caught by code compiled into the benchmark (the library's headers included),
/// counted by wrapping the C++ runtime's __cxa_begin_catch (see RESILIENCE_BENCH_MAIN): a failure
/// that travels as an exception is caught somewhere, so this counts them.
inline std::atomic<std::size_t> exceptions{0};

/// Runs `body(state)` as a coroutine on a fresh real-time loop on the benchmark's thread, and reports
/// heap allocations and caught exceptions per iteration after a warm-up call. `done()` runs after
/// the last iteration.
template <class Body, class Done = void (*)()>
void run_on_loop(
    benchmark::State& state, Body body, Done done = [] {}) {
    resilience::event_loop loop;
    loop.run([](benchmark::State& st, Body& b, Done& d) -> resilience::task<void> {
        co_await b(nullptr); // warms the frame cache and any pools
        const std::size_t allocated = allocations.load(std::memory_order_relaxed);
        const std::size_t caught = exceptions.load(std::memory_order_relaxed);
        for (auto _ : st)
            co_await b(&st);
        const auto per_call = [&](std::size_t now, std::size_t then) {
            return benchmark::Counter(static_cast<double>(now - then) / static_cast<double>(st.iterations()));
        };
        st.counters["allocs/call"] = per_call(allocations.load(std::memory_order_relaxed), allocated);
        st.counters["throws/call"] = per_call(exceptions.load(std::memory_order_relaxed), caught);
        d();
    }(state, body, done));
}

/// The dependency of the success-path rows: completes at once, since anything slower would hide the
/// policies' own cost. `ready_action` is the action that calls it.
inline resilience::task<int> ready_dependency() {
    co_return 42;
}
inline constexpr auto ready_action = [] { return ready_dependency(); };

/// A row: `ready_action` through `policy`, one call per iteration.
template <class Policy>
void through(benchmark::State& state, const Policy& policy) {
    run_on_loop(state, [&](benchmark::State*) -> resilience::task<void> {
        benchmark::DoNotOptimize(co_await policy.execute(ready_action));
    });
}

/// The baseline row: `ready_action` awaited directly.
inline void bare_call(benchmark::State& state) {
    run_on_loop(state, [](benchmark::State*) -> resilience::task<void> {
        benchmark::DoNotOptimize(co_await ready_action());
    });
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
            auto jt = run.counters.find("throws/call");
            r.throws = jt == run.counters.end() ? 0.0 : static_cast<double>(jt->second);
            order_.push_back(run.benchmark_name());
            rows_[run.benchmark_name()] = r;
        }
    }

    void Finalize() override {
        ConsoleReporter::Finalize();
        const auto base = rows_.find(baseline_);
        fmt::print("\n{:<48} {:>10} {:>12} {:>12} {:>12}\n", "benchmark", "ns/call", "x bare call",
                   "allocs/call", "throws/call");
        for (const auto& name : order_) {
            const row& r = rows_[name];
            const double ratio = base == rows_.end() ? 0.0 : r.ns / base->second.ns;
            fmt::print("{:<48} {:>10.1f} {:>12.2f} {:>12.3f} {:>12.3f}\n", name, r.ns, ratio, r.allocs,
                       r.throws);
        }
        // Throughput of two threads against one, for each `<x>_two_threads` row with a matching
        // `<x>_one_thread` row. With several threads Google Benchmark divides the wall time by the
        // calls of all threads together, so the ratio of the two rows' times is the throughput ratio
        // (2.00: two threads do twice the work of one in the same time).
        bool header = false;
        for (const auto& name : order_) {
            const auto at = name.find("_two_threads");
            if (at == std::string::npos)
                continue;
            const std::string prefix = name.substr(0, at);
            for (const auto& other : order_) {
                if (other.rfind(prefix + "_one_thread", 0) != 0)
                    continue;
                if (!header) {
                    fmt::print("\n{:<48} {:>26}\n", "two threads", "throughput x one thread");
                    header = true;
                }
                fmt::print("{:<48} {:>26.2f}\n", prefix, rows_[other].ns / rows_[name].ns);
            }
        }
    }

private:
    struct row {
        double ns = 0;
        double allocs = 0;
        double throws = 0;
    };
    std::string baseline_;
    std::vector<std::string> order_;
    std::map<std::string, row> rows_;
};

} // namespace bench

/// Benchmarks' main: the ratio reporter with `baseline` as the bare call, plus the counting
/// replacements of operator new and of __cxa_begin_catch (which forwards to the runtime's own, found
/// with dlsym; the executable's own catch blocks bind to this definition).
#define RESILIENCE_BENCH_MAIN(baseline)                                                                      \
    extern "C" void* __cxa_begin_catch(void* exception) noexcept {                                           \
        using begin_fn = void* (*)(void*) noexcept;                                                          \
        static const auto real = reinterpret_cast<begin_fn>(dlsym(RTLD_NEXT, "__cxa_begin_catch"));          \
        bench::exceptions.fetch_add(1, std::memory_order_relaxed);                                           \
        return real(exception);                                                                              \
    }                                                                                                        \
    RESILIENCE_BENCH_REPLACE_NEW(                                                                            \
        [](std::size_t) noexcept { bench::allocations.fetch_add(1, std::memory_order_relaxed); })            \
    int main(int argc, char** argv) {                                                                        \
        benchmark::Initialize(&argc, argv);                                                                  \
        if (benchmark::ReportUnrecognizedArguments(argc, argv))                                              \
            return 1;                                                                                        \
        bench::ratio_reporter reporter{baseline};                                                            \
        benchmark::RunSpecifiedBenchmarks(&reporter);                                                        \
        benchmark::Shutdown();                                                                               \
        return 0;                                                                                            \
    }
