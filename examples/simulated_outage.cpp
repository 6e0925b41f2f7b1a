// SPDX-License-Identifier: MIT
// A dependency goes down for two minutes while a client keeps calling it through
// retry -> circuit breaker -> timeout. Everything runs on virtual time, so the ten simulated minutes
// take a few milliseconds, and every instant printed is exact and the same on every run.
#include <resilience/fmt.hpp>
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>

#include <fmt/format.h>

#include <chrono>
#include <stdexcept>

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

using seconds = std::chrono::duration<double>;

// Healthy (50 ms answers) except between t = 60 s and t = 180 s, when every call hangs.
class flaky_dependency {
public:
    explicit flaky_dependency(rs::testing::simulation& sim) : sim_(&sim) {}

    rs::task<int> call(resilience::stop_token stop) {
        ++calls_;
        const bool down = sim_->now() >= 60s && sim_->now() < 180s;
        co_await sim_->sleep_for(down ? std::chrono::nanoseconds(1h) : std::chrono::nanoseconds(50ms), stop);
        if (stop.stop_requested())
            throw rs::cancelled_error{};
        co_return 200;
    }
    int calls() const { return calls_; }

private:
    rs::testing::simulation* sim_;
    int calls_ = 0;
};

} // namespace

int main() {
    rs::testing::simulation sim;
    flaky_dependency dependency{sim};
    auto at = [&] { return fmt::format("t={:7.2f}s", seconds(sim.now()).count()); };

    rs::circuit_breaker breaker{{.failure_threshold = 3,
                                 .break_duration = 20s,
                                 .break_duration_growth = 2.0,
                                 .max_break_duration = 60s,
                                 .on_state_change =
                                     [&](const rs::state_change_event& e) {
                                         fmt::print("{}  breaker {} -> {}\n", at(), rs::to_string(e.from()),
                                                    rs::to_string(e.to()));
                                     }},
                                sim.clock()};
    rs::pipeline policy{
        rs::retry{{.max_attempts = 3, .backoff = rs::exponential_backoff{.initial = 500ms, .max = 4s}},
                  sim.clock(),
                  rs::seeded_random{42}},
        breaker,
        rs::timeout{2s, sim.clock()},
    };

    int ok = 0, refused = 0, failed = 0;
    auto client = [&]() -> rs::task<void> {
        while (sim.now() < 10min) { // one request every 5 s, for ten minutes
            auto result = co_await policy.execute_outcome(
                [&](resilience::stop_token st) { return dependency.call(st); });
            if (result)
                ++ok;
            else if (result.error().code() == rs::errc::circuit_open)
                ++refused;
            else
                ++failed;
            co_await sim.sleep_for(5s);
        }
    };
    sim.run(client());

    fmt::print("\n{} requests: {} answered, {} failed after retries, {} refused by the open breaker\n",
               ok + failed + refused, ok, failed, refused);
    fmt::print("the dependency saw {} calls in ten minutes, two of which it spent down\n",
               dependency.calls());
    return 0;
}
