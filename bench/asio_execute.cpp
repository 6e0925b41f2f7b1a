// SPDX-License-Identifier: MIT
// What a call through `rs::boost_asio::execute` costs an Asio coroutine on the success path: an awaitable
// action that completes at once, through `pipeline{retry, timeout}` on the default clock, awaited with
// `use_awaitable`, against `co_spawn` of the same awaitable awaited with `use_awaitable` (the least an
// Asio coroutine pays to run another as an operation of its own). Both loops run in one coroutine on one
// io_context on this thread, in interleaved rounds (the order alternating), and the ratio is that of the
// least time per call of each side over the rounds. See bench/README.md ("Asio calls").
//
//     bench_asio_execute [--rounds=11] [--calls=100000] [--only=execute|co_spawn] [--concurrency-hint=1]
//
// `--only` runs one side, for a profiler (perf record, callgrind). The io_context is made with concurrency
// hint 1 (one thread runs it, as in Beast's examples) unless told otherwise: with another hint (-1, the
// default of `io_context()`) a call cannot know that no other thread runs the context, and serialises
// itself on a strand of its own.
#include <resilience/boost_asio.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/retry.hpp>
#include <resilience/timeout.hpp>

#include <boost/asio.hpp>

#include <fmt/format.h>

#include "replace_new.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace rs = resilience;
namespace net = boost::asio;
using namespace std::chrono_literals;

// Every operator new in the process, counted (the replacements are at the end of the file).
std::atomic<std::size_t> allocations{0};

// The dependency: an Asio coroutine that completes at once, so the figures are the call's own cost.
net::awaitable<int> ready() {
    co_return 42;
}
constexpr auto action = [] { return ready(); };

struct side {
    std::string_view name;
    std::vector<double> ns; // per call, one entry per round
    double allocs = 0;      // per call, the last round
    double least() const { return *std::min_element(ns.begin(), ns.end()); }
    double median() const {
        std::vector<double> v = ns;
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    }
};

struct options {
    int rounds = 11;
    long calls = 100'000;
    std::string only;
    int hint = 1;
};

long sink = 0;

// One round of one side: `calls` calls of `one()`, timed from inside the coroutine.
template <class One>
net::awaitable<void> round(side& s, long calls, One one) {
    const std::size_t allocated = allocations.load(std::memory_order_relaxed);
    const auto started = std::chrono::steady_clock::now();
    long sum = 0;
    for (long i = 0; i < calls; ++i)
        sum += co_await one();
    const auto took = std::chrono::steady_clock::now() - started;
    sink += sum;
    s.ns.push_back(std::chrono::duration<double, std::nano>(took).count() / static_cast<double>(calls));
    s.allocs = static_cast<double>(allocations.load(std::memory_order_relaxed) - allocated) /
               static_cast<double>(calls);
}

net::awaitable<void> measure(const options& opt, side& bare, side& exec) {
    const auto ex = co_await net::this_coro::executor;
    // Built once, used in place (an lvalue): what a service holds.
    rs::pipeline policy{rs::retry{}, rs::timeout{1s}};
    const auto baseline = [&]() -> net::awaitable<int> {
        co_return co_await net::co_spawn(ex, action(), net::use_awaitable);
    };
    const auto through = [&]() -> net::awaitable<int> {
        co_return co_await rs::boost_asio::execute(policy, action, net::use_awaitable);
    };
    const bool run_bare = opt.only.empty() || opt.only == "co_spawn";
    const bool run_exec = opt.only.empty() || opt.only == "execute";
    // Warm-up: the frames' caches and the io_context's operation recycling.
    side ignored;
    if (run_bare)
        co_await round(ignored, opt.calls / 10 + 1, baseline);
    if (run_exec)
        co_await round(ignored, opt.calls / 10 + 1, through);
    for (int r = 0; r < opt.rounds; ++r) {
        if (r % 2 == 0) {
            if (run_bare)
                co_await round(bare, opt.calls, baseline);
            if (run_exec)
                co_await round(exec, opt.calls, through);
        } else {
            if (run_exec)
                co_await round(exec, opt.calls, through);
            if (run_bare)
                co_await round(bare, opt.calls, baseline);
        }
    }
}

options parse(int argc, char** argv) {
    options opt;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (a.starts_with("--rounds="))
            opt.rounds = std::atoi(argv[i] + 9);
        else if (a.starts_with("--calls="))
            opt.calls = std::atol(argv[i] + 8);
        else if (a.starts_with("--only="))
            opt.only = std::string(a.substr(7));
        else if (a.starts_with("--concurrency-hint="))
            opt.hint = std::atoi(argv[i] + 19);
        else {
            fmt::print(stderr, "usage: {} [--rounds=11] [--calls=100000] [--only=execute|co_spawn]\n",
                       argv[0]);
            std::exit(2);
        }
    }
    if (opt.rounds < 1 || opt.calls < 1) {
        fmt::print(stderr, "--rounds and --calls must be positive\n");
        std::exit(2);
    }
    return opt;
}

} // namespace

int main(int argc, char** argv) {
    const options opt = parse(argc, argv);
    side bare{.name = "co_spawn_use_awaitable", .ns = {}};
    side exec{.name = "execute_retry_timeout", .ns = {}};
    net::io_context io{opt.hint};
    net::co_spawn(io, measure(opt, bare, exec), [](std::exception_ptr e) {
        if (e)
            std::rethrow_exception(e);
    });
    io.run();
    fmt::print("{} rounds of {} calls, interleaved, io_context{{{}}}; ns per call\n", opt.rounds, opt.calls,
               opt.hint);
    fmt::print("{:<28} {:>10} {:>10} {:>12}  rounds\n", "row", "least", "median", "allocs/call");
    for (const side* s : {&bare, &exec}) {
        if (s->ns.empty())
            continue;
        std::string all;
        for (double v : s->ns)
            all += fmt::format(" {:.0f}", v);
        fmt::print("{:<28} {:>10.1f} {:>10.1f} {:>12.2f} {}\n", s->name, s->least(), s->median(), s->allocs,
                   all);
    }
    if (!bare.ns.empty() && !exec.ns.empty())
        fmt::print("ratio (least / least): {:.2f}   (median / median: {:.2f})\n", exec.least() / bare.least(),
                   exec.median() / bare.median());
    return sink == 0; // never: keeps the sums
}

RESILIENCE_BENCH_REPLACE_NEW([](std::size_t) noexcept {
    allocations.fetch_add(1, std::memory_order_relaxed);
})
