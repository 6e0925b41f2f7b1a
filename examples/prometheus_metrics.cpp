// SPDX-License-Identifier: MIT
// Prometheus series from a pipeline's telemetry (resilience::prometheus, on prometheus-cpp). One
// `rs::prometheus::metrics` listens to telemetry -> retry -> circuit breaker -> timeout and watches the
// breaker; a prometheus-cpp Exposer serves them on a loopback port. Twenty calls run on virtual time
// against a dependency that hangs on every fifth call (the timeout stops it, the retry tries again),
// then the program prints the URL and what a scrape of it would return, and exits: non-zero if the
// series do not show the twenty calls, the four timeouts and the four retries (calls 5, 10, 15 and 20 of the
// dependency hang).
//
//     prometheus_metrics             # prints, exits
//     prometheus_metrics --serve 60  # and serves /metrics for 60 s more, for curl or a Prometheus
#include <resilience/prometheus.hpp>
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>

#include <prometheus/exposer.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <iostream>
#include <string>
#include <thread>

namespace rs = resilience;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
    rs::testing::simulation sim; // virtual time: the calls below take no real time
    int calls = 0;
    auto dependency = [&](resilience::stop_token stop) -> rs::task<int> {
        const bool hang = ++calls % 5 == 0;
        co_await sim.sleep_for(hang ? std::chrono::nanoseconds(1h) : std::chrono::nanoseconds(20ms), stop);
        if (stop.stop_requested())
            throw rs::cancelled_error{};
        co_return 42;
    };

    rs::prometheus::metrics metrics; // the series, in a prometheus::Registry of its own
    rs::circuit_breaker breaker{{.name = "prices", .failure_threshold = 3}, sim.clock()};
    metrics.watch(breaker); // its state, read at each scrape
    const rs::pipeline policy{
        rs::telemetry{{.name = "quotes", .listener = metrics.listener()}, sim.clock()}, // every stage reports
        rs::retry{{.name = "quotes", .max_attempts = 3}, sim.clock()},
        breaker,
        rs::timeout{{.name = "quotes", .timeout = 200ms}, sim.clock()},
    };
    prometheus::Exposer exposer{"127.0.0.1:0"}; // port 0: any free port
    metrics.expose(exposer);                    // GET /metrics: the series and the watched gauges

    for (int i = 0; i < 20; ++i)
        sim.run(policy.execute(dependency));

    std::cout << "serving http://127.0.0.1:" << exposer.GetListeningPorts().at(0) << "/metrics\n\n";
    const std::string text = prometheus::TextSerializer{}.Serialize(metrics.collect());
    std::cout << text;

    const bool ok =
        text.find("resilience_call_duration_seconds_count{handled=\"false\",name=\"quotes\",outcome="
                  "\"success\",policy=\"telemetry\"} 20\n") != std::string::npos &&
        text.find("resilience_events_total{event=\"timeout\",name=\"quotes\",policy=\"timeout\"} 4\n") !=
            std::string::npos &&
        text.find("resilience_events_total{event=\"retry\",name=\"quotes\",policy=\"retry\"} 4\n") !=
            std::string::npos &&
        text.find(
            "resilience_circuit_state{name=\"prices\",policy=\"circuit_breaker\",state=\"closed\"} 1\n") !=
            std::string::npos;
    if (argc == 3 && std::string(argv[1]) == "--serve")
        std::this_thread::sleep_for(std::chrono::seconds(std::stoi(argv[2])));
    if (!ok)
        std::cerr << "prometheus_metrics: the series do not show what they should\n";
    return ok ? 0 : 1;
}
