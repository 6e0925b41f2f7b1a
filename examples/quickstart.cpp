// SPDX-License-Identifier: MIT
// The flagship example: a flaky dependency called bare, then through a pipeline that recovers.
// Runs on the embedded event loop in real time (about half a second). Build and run it with
//     scripts/dev example
#include <resilience/fmt.hpp>
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <chrono>
#include <stdexcept>
#include <string>

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

using ms = std::chrono::duration<double, std::milli>;
const auto started = std::chrono::steady_clock::now();
std::string at() {
    return fmt::format("[{:6.1f} ms]", ms(std::chrono::steady_clock::now() - started).count());
}

// A price service having a bad minute: the first call answers 503, the second stalls for two
// seconds, the third answers 503 again, and from the fourth on it is healthy. Every call takes
// 40 ms of "network" and listens to its stop token, as a real client should.
class price_service {
public:
    rs::task<double> quote(std::string symbol, resilience::stop_token stop) {
        const int call = ++calls_;
        const auto latency = call == 2 ? std::chrono::milliseconds(2s) : 40ms;
        co_await rs::steady_clock{}.sleep_for(latency, stop);
        if (stop.stop_requested()) {
            fmt::print("{}   call {}: asked to stop, giving up\n", at(), call);
            throw rs::cancelled_error{};
        }
        if (call == 1 || call == 3)
            throw std::runtime_error(fmt::format("503 Service Unavailable (call {})", call));
        co_return symbol == "ACME" ? 42.5 : 1.0;
    }
    int calls() const { return calls_; }

private:
    int calls_ = 0;
};

rs::task<void> demo() {
    price_service service;

    fmt::print("{} 1. calling the service bare\n", at());
    try {
        double price = co_await service.quote("ACME", {});
        fmt::print("{}   got {}\n", at(), price);
    } catch (const std::exception& e) {
        fmt::print("{}   failed: {}\n", at(), e.what());
    }

    fmt::print("\n{} 2. calling it through retry -> circuit breaker -> timeout\n", at());
    rs::circuit_breaker breaker{{.failure_threshold = 5, .break_duration = 30s}};
    rs::pipeline policy{
        rs::retry{{
            .max_attempts = 4,
            .backoff =
                rs::exponential_backoff{
                    .initial = 50ms, .factor = 2.0, .max = 1s, .jitter = rs::jitter::equal},
            .on_retry =
                [](const rs::retry_event& e) {
                    fmt::print("{}   attempt {} failed ({}); retrying in {:.1f} ms\n", at(), e.attempt(),
                               e.error() ? e.error()->what() : "rejected value", ms(e.delay()).count());
                },
        }},
        breaker,            // a handle: copies share one breaker
        rs::timeout{150ms}, // per attempt, since it sits inside the retry
    };

    rs::outcome<double> result = co_await policy.execute_outcome(
        [&](const rs::context& ctx) { return service.quote("ACME", ctx.stop_token()); });

    if (result)
        fmt::print("{}   recovered: ACME = {} after {} calls\n", at(), result.value(), service.calls());
    else
        fmt::print("{}   gave up: {}\n", at(), result.error());
    auto m = breaker.metrics();
    fmt::print("{}   breaker is {} ({} consecutive failures recorded)\n", at(),
               rs::to_string(breaker.state()), m.consecutive_failures);
}

} // namespace

int main() {
    rs::sync_wait(demo());
    return 0;
}
