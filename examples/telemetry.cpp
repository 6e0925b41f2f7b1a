// SPDX-License-Identifier: MIT
// Ten clients call a dependency through telemetry -> retry -> circuit breaker -> timeout. The dependency
// hangs from t = 3 s to t = 6 s. One listener, set once for the whole pipeline, counts what every stage
// reports, and the program prints a table per second of virtual time: calls, failures, retries, timeouts,
// rejections and the breaker's state, then the breaker's state changes as fmt prints the events. Each
// call carries its request id as a property of its context (properties.hpp), so every event names the
// call it is about: the program lists the requests the open breaker refused, and fmt's lines end with
// the id.
//
// Everything runs on virtual time (ten simulated seconds take a few milliseconds), so every figure is
// the same on every run. The program exits non-zero if the table does not show what it should: calls
// answered before the outage, the breaker opening during it and refusing calls, and closed again with
// every call answered once the dependency is back.
#include <resilience/fmt.hpp>
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <iterator>
#include <string>
#include <vector>

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

constexpr auto outage_start = 3s;
constexpr auto outage_end = 6s;
constexpr int seconds = 10;

// Answers in 20 ms, except during the outage, when it hangs until it is stopped.
class dependency {
public:
    explicit dependency(rs::testing::simulation& sim) : sim_(&sim) {}
    rs::task<int> call(resilience::stop_token stop) const {
        const bool down = sim_->now() >= outage_start && sim_->now() < outage_end;
        co_await sim_->sleep_for(down ? std::chrono::nanoseconds(1h) : std::chrono::nanoseconds(20ms), stop);
        if (stop.stop_requested())
            throw rs::cancelled_error{};
        co_return 200;
    }

private:
    rs::testing::simulation* sim_;
};

// The request id every call carries, set by the client that makes it.
inline constexpr rs::property_key<std::string> request_id{"request_id"};

// What one second of virtual time saw.
struct second {
    int calls = 0, failures = 0, retries = 0, timeouts = 0, rejections = 0;
    std::vector<rs::circuit_state> entered; // the breaker's states entered during the second, in order
};

} // namespace

int main() {
    rs::testing::simulation sim;
    const dependency service{sim};

    std::array<second, seconds + 1> table{};
    std::vector<std::string> changes;
    std::vector<std::string> refused; // the request ids of the calls the breaker refused
    std::string first_refusal;        // how fmt prints the first of those events
    // The listener: a plain function of the event, called synchronously by whichever stage reports.
    const auto count = [&](const rs::telemetry_event& e) {
        second& s = table[static_cast<std::size_t>(std::min<long long>(e.at / 1s, seconds))];
        switch (e.kind) {
        case rs::telemetry_kind::call:
            ++s.calls;
            s.failures += e.error ? 1 : 0;
            break;
        case rs::telemetry_kind::retry:
            ++s.retries;
            break;
        case rs::telemetry_kind::timeout:
            ++s.timeouts;
            break;
        case rs::telemetry_kind::rejection:
            ++s.rejections;
            refused.push_back(e.properties.get_or(request_id, "?"));
            if (first_refusal.empty())
                first_refusal = fmt::format("{}", e);
            break;
        case rs::telemetry_kind::state_change:
            s.entered.push_back(e.to);
            changes.push_back(fmt::format("{}", e)); // the event is valid only now: keep its text
            break;
        default:
            break;
        }
    };

    const rs::pipeline policy{
        rs::telemetry{{.name = "orders", .listener = count}, sim.clock()},
        rs::retry{{.max_attempts = 3, .backoff = rs::exponential_backoff{.initial = 50ms, .max = 400ms}},
                  sim.clock(),
                  rs::seeded_random{7}},
        rs::circuit_breaker{{.name = "orders-db", .failure_threshold = 5, .break_duration = 1s}, sim.clock()},
        rs::timeout{{.name = "per-attempt", .timeout = 250ms}, sim.clock()},
    };

    // Ten clients, each calling every 100 ms for ten seconds.
    const auto client = [&](int id) -> rs::task<void> {
        co_await sim.sleep_for(id * 10ms); // spread them over the first 100 ms
        for (int n = 1; sim.now() < std::chrono::seconds(seconds); ++n) {
            rs::context ctx;
            ctx.set_property(request_id, fmt::format("client{}-{}", id, n));
            // The listener sees how it ended, and which request it was.
            (void)co_await policy.execute_outcome([&](resilience::stop_token st) { return service.call(st); },
                                                  ctx);
            co_await sim.sleep_for(100ms);
        }
    };
    for (int id = 0; id < 10; ++id)
        sim.spawn(client(id));
    sim.run_all();

    fmt::print("{:>6} {:>6} {:>9} {:>8} {:>9} {:>11}  {}\n", "second", "calls", "failures", "retries",
               "timeouts", "rejections", "breaker (states entered)");
    rs::circuit_state state = rs::circuit_state::closed;
    bool ok = true;
    const auto expect = [&](bool holds, const std::string& what) {
        if (!holds) {
            fmt::print(stderr, "not as expected: {}\n", what);
            ok = false;
        }
    };
    int opened_in_outage = 0, refused_in_outage = 0;
    for (int t = 0; t < seconds; ++t) {
        const second& s = table[static_cast<std::size_t>(t)];
        if (!s.entered.empty())
            state = s.entered.back();
        fmt::print("{:>6} {:>6} {:>9} {:>8} {:>9} {:>11}  {}{}\n", t, s.calls, s.failures, s.retries,
                   s.timeouts, s.rejections, state,
                   s.entered.empty() ? std::string{} : fmt::format(" ({})", fmt::join(s.entered, ", ")));
        const bool before = std::chrono::seconds(t + 1) <= outage_start;
        const bool during = std::chrono::seconds(t) >= outage_start && std::chrono::seconds(t) < outage_end;
        const bool recovered = std::chrono::seconds(t) >= outage_end + 2s;
        expect(s.calls > 0, fmt::format("calls in second {}", t));
        if (before || recovered)
            expect(s.failures == 0 && s.rejections == 0 && state == rs::circuit_state::closed,
                   fmt::format("every call answered with the breaker closed in second {}", t));
        if (during) {
            for (rs::circuit_state entered : s.entered)
                opened_in_outage += entered == rs::circuit_state::open ? 1 : 0;
            refused_in_outage += s.rejections;
        }
    }
    expect(opened_in_outage > 0, "the breaker opened during the outage");
    expect(refused_in_outage > 0, "the open breaker refused calls during the outage");
    expect(state == rs::circuit_state::closed, "the breaker closed again");

    expect(!refused.empty() && std::ranges::none_of(refused, [](const std::string& id) { return id == "?"; }),
           "every refusal names its request");

    fmt::print("\nthe breaker's state changes, as fmt prints the events:\n");
    for (const std::string& line : changes)
        fmt::print("  {}\n", line);
    fmt::print(
        "\nthe first requests the open breaker refused: {}\n",
        fmt::join(refused.begin(),
                  refused.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(refused.size(), 5)),
                  ", "));
    fmt::print("the first refusal, as fmt prints it:\n  {}\n", first_refusal);
    return ok ? 0 : 1;
}
