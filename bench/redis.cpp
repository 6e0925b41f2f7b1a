// SPDX-License-Identifier: MIT
// A limit shared through Redis costs a round trip per admission; this measures how close to the bare
// round trip it comes. Against a private redis-server on loopback, through one connection:
//
//   ping_one_at_a_time                  PING awaited before the next: the floor of a round trip
//   admission_one_at_a_time             one rs::redis::rate_limiter admission awaited before the next
//   ping_pipelined/N                    N PINGs in flight at once, per PING
//   admission_pipelined/N               N admissions in flight at once, per admission
//
// `round_trips/admission` counts the commands the connection sent per admission (1: one EVALSHA), and
// `ns/admission` (`ns/ping`) is the time per item; the summary's ns/call is per iteration, which for
// the pipelined rows is a batch of N. The server is started by the benchmark itself (redis-server on PATH).
#include "harness.hpp"
#include "redis/server_process.hpp"

#include <resilience/asio.hpp>
#include <resilience/redis.hpp>
#include <resilience/resilience.hpp>

#include <asio/io_context.hpp>

#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace rs = resilience;
namespace redis = resilience::redis;

namespace {

resilience_tests::redis_server& server() {
    static resilience_tests::redis_server s;
    return s;
}

rs::task<int> upstream() {
    co_return 1;
}

rs::task<int> admit(redis::rate_limiter limiter) {
    auto call = limiter.execute_outcome(upstream);
    const rs::outcome<int> r = co_await std::move(call);
    co_return r.has_value() ? 1 : 0;
}

rs::task<int> ping(redis::connection c) {
    auto sent = c.command({"PING"});
    const redis::reply r = co_await std::move(sent);
    co_return r.type == redis::reply::kind::status ? 1 : 0;
}

// Runs `step(n)` (a task of the number of successes among n) once per benchmark iteration on an
// io_context, and reports items (n per iteration) and commands per item.
template <class Step>
void on_io(benchmark::State& state, const char* item, Step step) {
    ::asio::io_context io;
    redis::connection c{io.get_executor(),
                        {.port = server().port(), .command_timeout = std::chrono::seconds{5}}};
    const redis::rate_limiter limiter{
        {.key = "bench", .token_limit = 1'000'000'000, .tokens_per_second = 1e9}, c};
    const int n = static_cast<int>(state.range(0));
    auto body = [](benchmark::State& st, Step& s, redis::connection conn, redis::rate_limiter l, int per,
                   const char* what) -> rs::task<int> {
        auto warm = s(conn, l, per); // loads the script, connects
        (void)co_await std::move(warm);
        const std::uint64_t before = conn.commands();
        const std::size_t allocated = bench::allocations.load(std::memory_order_relaxed);
        const auto start = std::chrono::steady_clock::now();
        std::int64_t ok = 0;
        for (auto _ : st) {
            auto one = s(conn, l, per);
            ok += co_await std::move(one);
        }
        const auto took = std::chrono::steady_clock::now() - start;
        const auto items = static_cast<double>(st.iterations() * per);
        if (ok != st.iterations() * per)
            st.SkipWithError("a call failed");
        st.SetItemsProcessed(st.iterations() * per);
        const std::string per_item = std::string("/") + what;
        st.counters["round_trips" + per_item] = static_cast<double>(conn.commands() - before) / items;
        st.counters["ns" + per_item] = static_cast<double>(std::chrono::nanoseconds{took}.count()) / items;
        st.counters["allocs" + per_item] =
            static_cast<double>(bench::allocations.load(std::memory_order_relaxed) - allocated) / items;
        co_return 0;
    };
    std::exception_ptr failed;
    rs::asio::async_run(io.get_executor(), body(state, step, c, limiter, n, item),
                        [&failed](std::exception_ptr e, int) { failed = e; });
    io.run();
    if (failed)
        std::rethrow_exception(failed);
}

// n calls of `one` at once.
template <class One>
rs::task<int> together(One one, redis::connection c, redis::rate_limiter l, int n) {
    std::vector<rs::task<int>> calls;
    calls.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i)
        calls.push_back(one(c, l));
    auto all = rs::when_all(std::move(calls));
    const std::vector<int> done = co_await std::move(all);
    int ok = 0;
    for (int d : done)
        ok += d;
    co_return ok;
}

void ping_one_at_a_time(benchmark::State& state) {
    on_io(state, "ping", [](redis::connection c, const redis::rate_limiter&, int) { return ping(c); });
}
BENCHMARK(ping_one_at_a_time)->Arg(1)->UseRealTime();

void admission_one_at_a_time(benchmark::State& state) {
    on_io(state, "admission", [](redis::connection, const redis::rate_limiter& l, int) { return admit(l); });
}
BENCHMARK(admission_one_at_a_time)->Arg(1)->UseRealTime();

void ping_pipelined(benchmark::State& state) {
    on_io(state, "ping", [](redis::connection c, const redis::rate_limiter& l, int n) {
        return together([](redis::connection conn, const redis::rate_limiter&) { return ping(conn); }, c, l,
                        n);
    });
}
BENCHMARK(ping_pipelined)->Arg(16)->Arg(64)->UseRealTime();

void admission_pipelined(benchmark::State& state) {
    on_io(state, "admission", [](redis::connection c, const redis::rate_limiter& l, int n) {
        return together([](redis::connection, const redis::rate_limiter& lim) { return admit(lim); }, c, l,
                        n);
    });
}
BENCHMARK(admission_pipelined)->Arg(16)->Arg(64)->UseRealTime();

} // namespace

RESILIENCE_BENCH_MAIN("ping_one_at_a_time/1/real_time")
