// SPDX-License-Identifier: MIT
// What a hedge does to tail latency, and what it costs. A client sends a thousand requests, one after
// another, to a service that usually answers in 20 to 30 ms but stalls for 800 ms on one call in
// thirty. First bare, then through a hedge that sends a second copy of a request still unanswered
// after 60 ms (about the healthy p99) and stops the copy that loses. Everything runs on virtual
// time with a seeded random source, so the table below is the same on every run, and it takes a few
// milliseconds. Exits non-zero if the hedge does not bring the p99 down.
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace rs = resilience;
using namespace std::chrono_literals;
using std::chrono::nanoseconds;

namespace {

constexpr int requests = 1000;
constexpr double stall_ratio = 1.0 / 30;
constexpr nanoseconds stall = 800ms;

// The backend: each call draws its own fate from a seeded generator, and listens to its stop token.
class backend {
public:
    backend(rs::testing::simulation& sim, std::uint64_t seed) : sim_(&sim), rng_(seed) {}

    rs::task<int> call(resilience::stop_token stop) {
        ++calls_;
        const nanoseconds latency =
            uniform() < stall_ratio ? stall : 20ms + nanoseconds(static_cast<std::int64_t>(uniform() * 10e6));
        co_await sim_->sleep_for(latency, stop);
        if (stop.stop_requested())
            throw rs::cancelled_error{};
        co_return 200;
    }
    int calls() const { return calls_; }

private:
    double uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

    rs::testing::simulation* sim_;
    rs::seeded_random rng_;
    int calls_ = 0;
};

struct summary {
    nanoseconds p50, p99, max;
    int calls;
};

// No policy at all: the action as it is.
struct bare : rs::policy_base<bare> {
    template <class Next>
    rs::task<rs::next_outcome_t<Next>> run(Next next, const rs::context& ctx) const {
        co_return co_await next(ctx);
    }
};

// Sends the requests one after another through the policy `make` builds on the simulation's clock,
// timing each on virtual time.
template <class MakePolicy>
summary measure(MakePolicy make) {
    rs::testing::simulation sim;
    backend service{sim, 2024};
    const auto policy = make(sim.clock());
    std::vector<nanoseconds> latencies;
    latencies.reserve(requests);
    auto fetch = [&](resilience::stop_token stop) { return service.call(stop); };
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < requests; ++i) {
            const nanoseconds start = sim.now();
            (void)co_await policy.execute(fetch);
            latencies.push_back(sim.now() - start);
        }
    }());
    std::sort(latencies.begin(), latencies.end());
    const auto at = [&](double q) { return latencies[static_cast<std::size_t>(q * requests) - 1]; };
    return {at(0.50), at(0.99), latencies.back(), service.calls()};
}

double ms(nanoseconds d) {
    return std::chrono::duration<double, std::milli>(d).count();
}

} // namespace

int main() {
    const summary without = measure([](rs::testing::virtual_clock) { return bare{}; });
    const summary with = measure([](rs::testing::virtual_clock clock) {
        return rs::hedge{{.max_attempts = 2, .delay = 60ms}, clock};
    });

    fmt::print("{} sequential requests; one backend call in {:.0f} stalls for {:.0f} ms\n\n", requests,
               1 / stall_ratio, ms(stall));
    fmt::print("{:<16}{:>10}{:>10}{:>10}{:>16}\n", "", "p50", "p99", "max", "backend calls");
    const auto row = [](const char* name, const summary& s) {
        fmt::print("{:<16}{:>7.1f} ms{:>7.1f} ms{:>7.1f} ms{:>16}\n", name, ms(s.p50), ms(s.p99), ms(s.max),
                   s.calls);
    };
    row("no policy", without);
    row("hedge 60 ms", with);
    fmt::print("\nThe median does not move: a healthy call answers long before the hedge would fire.\n"
               "The tail loses {:.0f} ms at p99, for {} extra backend calls ({:.1f}%).\n",
               ms(without.p99 - with.p99), with.calls - without.calls,
               100.0 * (with.calls - without.calls) / without.calls);
    if (with.max >= stall)
        fmt::print(
            "The max is a request whose two copies both stalled: a third attempt would be the answer.\n");

    if (!(with.p99 < without.p99)) {
        fmt::print(stderr, "hedge_tail_latency: the hedged p99 is not below the bare one\n");
        return 1;
    }
    return 0;
}
