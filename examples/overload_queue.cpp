// SPDX-License-Identifier: MIT
// A server's queue under overload, on virtual time: FIFO against CoDel and adaptive LIFO.
//
// The server is a bulkhead of 16 slots (its worker pool) with room to queue 100,000 requests; a
// request takes 10 ms, so the server answers 1,600 a second. Requests arrive as a Poisson process at
// twice that for 60 s, then at half of it for 60 s. Each client gives up 1 s after it asked; the server
// is remote and does not know: a request whose client left still waits its turn and is served. Goodput
// is the answers that reached their client in time, per second.
//
// Under FIFO the queue grows by 1,600 requests a second and every request waits longer than the one
// before: after the first second, nothing the server answers is still wanted, and once the overload
// ends it spends a minute more answering nobody. CoDel sheds the requests that have already waited
// past its target while the queue stands, so the ones it serves are fresh; adaptive LIFO serves the
// newest first while overloaded. Exits non-zero unless CoDel and adaptive LIFO keep goodput at 90 % of
// capacity or more during the overload and drain the queue within 1 s of its end.
#include <resilience/bulkhead.hpp>
#include <resilience/testing/simulation.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rs = resilience;
using namespace std::chrono_literals;
using std::chrono::nanoseconds;
using vclock = rs::testing::virtual_clock;

namespace {

constexpr std::size_t slots = 16;
constexpr nanoseconds service = 10ms;
constexpr double capacity = slots / 0.010; // answers a second
constexpr nanoseconds patience = 1s;
// 60 s each; a tenth with `--quick` (under a sanitizer, where a minute of arrivals takes long).
nanoseconds overload_for = 60s, calm_for = 60s;

double uniform(rs::seeded_random& rng) {
    return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
}

struct tally {
    std::uint64_t in_time_overload = 0; // answers in time, during the overload
    std::uint64_t in_time_calm = 0;
    std::uint64_t late = 0; // answered after their client left
    std::uint64_t shed = 0;
    nanoseconds drained_at = nanoseconds::max(); // the first instant after the overload with nobody queued
};

// One request: queued at the server, served (10 ms) if admitted; counted in time when the answer
// comes within the client's patience.
rs::task<void> request(rs::testing::simulation& sim, const rs::bulkhead<vclock>& server, tally& t) {
    const nanoseconds asked = sim.now();
    auto r = co_await server.execute_outcome([&sim]() -> rs::task<int> {
        co_await sim.sleep_for(service);
        co_return 200;
    });
    if (!r.has_value()) {
        ++t.shed;
        co_return;
    }
    if (sim.now() - asked > patience)
        ++t.late;
    else if (asked < overload_for)
        ++t.in_time_overload;
    else
        ++t.in_time_calm;
}

rs::task<void> arrivals(rs::testing::simulation& sim, const rs::bulkhead<vclock>& server, tally& t,
                        rs::seeded_random& rng) {
    while (sim.now() < overload_for + calm_for) {
        const double rate = sim.now() < overload_for ? 2.0 * capacity : 0.5 * capacity;
        co_await sim.sleep_for(nanoseconds(static_cast<std::int64_t>(-std::log(uniform(rng)) / rate * 1e9)));
        sim.spawn(request(sim, server, t));
    }
}

// Watches the queue after the overload, every millisecond, for the instant it is first empty.
rs::task<void> watch_drain(rs::testing::simulation& sim, const rs::bulkhead<vclock>& server, tally& t) {
    co_await sim.sleep_for(overload_for);
    while (server.queued() > 0 && sim.now() < overload_for + calm_for)
        co_await sim.sleep_for(1ms);
    if (server.queued() == 0)
        t.drained_at = sim.now();
}

tally run(const char* discipline, std::uint64_t seed) {
    rs::testing::simulation sim;
    rs::bulkhead_options o{.name = "server", .max_concurrent_calls = slots, .queue_limit = 100'000};
    if (std::string(discipline) == "codel")
        o.queue_discipline = rs::codel{};
    else if (std::string(discipline) == "adaptive_lifo")
        o.queue_discipline = rs::adaptive_lifo{};
    const rs::bulkhead<vclock> server{o, sim.clock()};
    tally t;
    rs::seeded_random rng{seed};
    sim.spawn(arrivals(sim, server, t, rng));
    sim.spawn(watch_drain(sim, server, t));
    sim.run_all();
    return t;
}

} // namespace

int main(int argc, char** argv) {
    if (argc == 2 && std::string(argv[1]) == "--quick") {
        overload_for = 6s;
        calm_for = 6s;
    } else if (argc != 1) {
        fmt::print(stderr, "usage: overload_queue [--quick]\n");
        return 2;
    }
    fmt::print(
        "A server of 16 slots, 10 ms a request ({:.0f} answers/s), queue of 100,000; arrivals at 2x for "
        "60 s,\nthen 0.5x for 60 s; each client gives up after 1 s. Goodput: answers in time, per "
        "second.\n\n",
        capacity);
    fmt::print("{:<14} {:>22} {:>14} {:>10} {:>10} {:>22}\n", "discipline", "goodput in overload",
               "of capacity", "late", "shed", "queue empty after end");
    bool held = true;
    for (const char* d : {"fifo", "codel", "adaptive_lifo"}) {
        const tally t = run(d, 42);
        const double goodput = static_cast<double>(t.in_time_overload) / (overload_for / 1.0s);
        const bool drained = t.drained_at != nanoseconds::max();
        const nanoseconds drain = drained ? t.drained_at - overload_for : nanoseconds::max();
        fmt::print("{:<14} {:>20.0f}/s {:>13.1f}% {:>10} {:>10} {:>22}\n", d, goodput,
                   100.0 * goodput / capacity, t.late, t.shed,
                   drained ? fmt::format("{:.3f} s", static_cast<double>(drain.count()) / 1e9)
                           : fmt::format("not within {} s", calm_for / 1s));
        if (std::string(d) != "fifo" && (goodput < 0.9 * capacity || drain > 1s))
            held = false;
    }
    if (!held) {
        fmt::print("\na discipline missed its target above\n");
        return 1;
    }
    return 0;
}
