// SPDX-License-Identifier: MIT
// A quote service caches a dependency's answers for 10 s. The dependency goes down between t = 60 s
// and t = 180 s (every call hangs), and a client asks for the quote every second for five minutes;
// each refresh is bounded by a timeout. Stale values answer while a refresh runs in the background
// (stale-while-revalidate) and in place of the failed refreshes (stale-if-error), a failure is
// remembered for 10 s instead of being retried on every request, and the client sees no error at
// all. Everything runs on virtual time: the five simulated minutes take a few milliseconds, and every
// figure is the same on every run.
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>

#include <fmt/format.h>

#include <chrono>
#include <string>

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

// Answers in 50 ms with the minute's price, except between t = 60 s and t = 180 s, when it hangs.
class quote_dependency {
public:
    explicit quote_dependency(rs::testing::simulation& sim) : sim_(&sim) {}

    rs::task<int> price(resilience::stop_token stop) {
        ++calls_;
        const bool down = sim_->now() >= 60s && sim_->now() < 180s;
        co_await sim_->sleep_for(down ? std::chrono::nanoseconds(1h) : std::chrono::nanoseconds(50ms), stop);
        if (stop.stop_requested())
            throw rs::cancelled_error{};
        co_return 100 + static_cast<int>(sim_->now() / 1min);
    }
    int calls() const { return calls_; }

private:
    rs::testing::simulation* sim_;
    int calls_ = 0;
};

// What the cache reported over one period.
struct tally {
    int hits = 0, revalidating = 0, on_error = 0, misses = 0;
};

} // namespace

int main() {
    rs::testing::simulation sim;
    quote_dependency dependency{sim};
    tally period;
    rs::cache<std::string, int, rs::testing::virtual_clock> quotes{
        {.name = "quotes",
         .ttl = 10s,
         .stale_while_revalidate = 5s,
         .stale_if_error = 5min,
         .negative_ttl = 10s,
         .telemetry =
             [&](const rs::telemetry_event& e) {
                 if (e.kind == rs::telemetry_kind::cache_hit)
                     ++period.hits;
                 else if (e.kind == rs::telemetry_kind::cache_miss)
                     ++period.misses;
                 else if (e.note == "stale_while_revalidate")
                     ++period.revalidating;
                 else
                     ++period.on_error;
             }},
        sim.clock()};

    // The timeout bounds each refresh. The action owns nothing but references to what outlives every
    // call (the dependency, the timeout): a refresh in the background runs after the request that
    // started it has returned.
    const rs::timeout bounded{2s, sim.clock()};
    const auto fetch = [&bounded, &dependency](resilience::stop_token st) {
        return bounded.execute([&dependency](resilience::stop_token s) { return dependency.price(s); }, st);
    };

    int requests = 0, errors = 0, total_on_error = 0, total_revalidating = 0;
    auto client = [&]() -> rs::task<void> {
        fmt::print("{:>9}  {:>5} {:>6} {:>12} {:>13} {:>6}  {:>6}\n", "period", "hits", "misses",
                   "stale (swr)", "stale (error)", "errors", "calls");
        int calls_before = 0, errors_before = 0;
        for (int second = 0; second <= 300; ++second) { // one request a second, for five minutes
            co_await sim.sleep_for(second * 1s - sim.now());
            if (second > 0 && second % 30 == 0) {
                fmt::print("{:>4}-{:>3}s  {:>5} {:>6} {:>12} {:>13} {:>6}  {:>6}\n", second - 30, second,
                           period.hits, period.misses, period.revalidating, period.on_error,
                           errors - errors_before, dependency.calls() - calls_before);
                total_on_error += period.on_error;
                total_revalidating += period.revalidating;
                period = tally{};
                calls_before = dependency.calls();
                errors_before = errors;
            }
            if (second == 300)
                break;
            auto result = co_await quotes.run_outcome("ACME", fetch);
            ++requests;
            if (!result)
                ++errors;
        }
    };
    sim.run(client());

    fmt::print(
        "\n{} requests, {} errors, {} calls to the dependency, {} answered by a stale value on error\n",
        requests, errors, dependency.calls(), total_on_error);
    // What the example shows: no request failed, stale values answered while refreshing and through the
    // outage, and the dependency saw a small fraction of the requests.
    const bool holds =
        errors == 0 && total_on_error > 0 && total_revalidating > 0 && dependency.calls() * 5 < requests;
    return holds ? 0 : 1;
}
