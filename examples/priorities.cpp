// SPDX-License-Identifier: MIT
// Priorities under load. A dependency serves 400 calls a second (20 at once, 50 ms each) and is sent
// 600: 100 a second of critical traffic (checkout) and 500 of sheddable traffic (recommendations). A
// bulkhead at the dependency's concurrency, or a rate limiter at its rate, each with a queue of 40 and a
// queue timeout of 100 ms, stands in front of it. Without priorities both kinds of traffic lose the same
// third of their calls and wait as long; with them (`.priorities`, priority.hpp) the sheddable traffic
// takes the whole loss and the critical traffic goes through at once.
//
// Runs 20 s of traffic on virtual time from seeded arrivals, so the table and the figure are the same
// on every run. Prints, per configuration and class, the share of calls that succeeded and the p50 and
// p99 latency of those (from arrival to the end of the call, queueing included). With an argument,
// writes the figure there (docs/images/priorities.svg). Exits non-zero unless, with priorities, the
// critical class succeeds at least 99% of the time and waits less than without, while the sheddable
// class takes the loss.
//
//     priorities [docs/images/priorities.svg]
#include <resilience/bulkhead.hpp>
#include <resilience/priority.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/testing/simulation.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace rs = resilience;
using namespace std::chrono_literals;
using std::chrono::nanoseconds;

namespace {

constexpr nanoseconds run_for = 20s;
constexpr double rates[2] = {500, 100}; // calls a second, by class: sheddable, critical
constexpr const char* class_names[2] = {"sheddable", "critical"};
constexpr std::uint64_t seed = 42;

struct arrival {
    nanoseconds at;
    int cls;           // 0 sheddable, 1 critical: the call's `rs::priority`
    nanoseconds serve; // how long the dependency takes with it
};

// Each class arrives as a Poisson stream at its rate; each call takes 40 to 60 ms once it runs. The
// draws are made from the generator's raw output (the standard fixes mt19937_64's sequence, not the
// distributions'), so the traffic is the same with every standard library.
std::vector<arrival> traffic() {
    std::mt19937_64 rng{seed};
    const auto uniform = [&rng] { return static_cast<double>(rng() >> 11) * 0x1p-53; }; // [0, 1)
    const auto serve = [&rng] {
        return nanoseconds{40'000'000 + static_cast<std::int64_t>(rng() % 20'000'001)};
    };
    std::vector<arrival> out;
    for (int c = 0; c < 2; ++c) {
        const auto gap = [&] { return -std::log(1 - uniform()) / rates[c]; }; // exponential, in seconds
        for (double t = gap(); t < std::chrono::duration<double>(run_for).count(); t += gap())
            out.push_back({nanoseconds{static_cast<std::int64_t>(t * 1e9)}, c, serve()});
    }
    std::sort(out.begin(), out.end(), [](const arrival& a, const arrival& b) { return a.at < b.at; });
    return out;
}

struct class_result {
    int calls = 0;
    std::vector<nanoseconds> latencies; // of the calls that succeeded, sorted
    double success() const { return calls ? 100.0 * static_cast<double>(latencies.size()) / calls : 0; }
    double percentile_ms(double p) const {
        if (latencies.empty())
            return 0;
        const auto i = static_cast<std::size_t>(std::ceil(p * static_cast<double>(latencies.size()))) - 1;
        return std::chrono::duration<double, std::milli>(latencies[std::min(i, latencies.size() - 1)])
            .count();
    }
};

struct run {
    std::string policy, setup;
    class_result by_class[2];
};

template <class Policy>
rs::task<void> caller(rs::testing::simulation& sim, const Policy& policy, arrival a, run& r) {
    co_await sim.sleep_for(a.at);
    rs::context ctx;
    ctx.set_property(rs::priority, a.cls);
    auto call_dependency = [&sim, serve = a.serve]() -> rs::task<int> {
        co_await sim.sleep_for(serve);
        co_return 1;
    };
    const auto result = co_await policy.execute_outcome(call_dependency, ctx);
    class_result& c = r.by_class[a.cls];
    ++c.calls;
    if (result.has_value())
        c.latencies.push_back(sim.now() - a.at);
}

// Plays the same traffic through the policy `make(sim)` builds.
template <class Make>
run simulate(const std::vector<arrival>& calls, std::string policy, std::string setup, Make make) {
    rs::testing::simulation sim;
    const auto p = make(sim);
    run r{std::move(policy), std::move(setup), {}};
    for (const arrival& a : calls)
        sim.spawn(caller(sim, p, a, r));
    sim.run_all();
    for (auto& c : r.by_class)
        std::sort(c.latencies.begin(), c.latencies.end());
    return r;
}

// Two panels side by side: the share of calls that succeeded, and the p50 and p99 latency of those; in
// each, a group of two bars (one per class) per configuration, the bulkhead's on the left.
std::string figure(const std::vector<run>& runs) {
    constexpr double left = 60, top = 84, panel_w = 480, panel_h = 260, gap = 70, bar_w = 22;
    const double group_w = panel_w / static_cast<double>(runs.size());
    const double width = left + 2 * panel_w + gap + 20;
    const double base = top + panel_h;
    const double height = base + 100;
    const char* colours[2] = {"#e67e22", "#2c6fbb"};
    double max_ms = 0;
    for (const run& r : runs)
        for (const class_result& c : r.by_class)
            max_ms = std::max(max_ms, c.percentile_ms(0.99));
    const double ms_top = std::ceil(max_ms / 50) * 50;

    std::string svg = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
        "font-family=\"sans-serif\" font-size=\"12\">\n"
        "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        "<text x=\"{2}\" y=\"22\" font-size=\"15\">A dependency that serves 400 calls/s is sent 600: 100/s "
        "critical, 500/s sheddable</text>\n"
        "<text x=\"{2}\" y=\"40\">In front of it a bulkhead (20 at once) or a rate limiter (400/s), each "
        "with "
        "a queue of 40 and a queue timeout of 100 ms; 20 s of seeded traffic</text>\n",
        width, height, left);
    // A panel's frame: its title, axes, grid lines at quarters, the scale at the top.
    const auto frame = [&](double x0, const char* title, const std::string& scale_top) {
        svg += fmt::format("<text x=\"{0}\" y=\"{1}\" font-weight=\"bold\">{2}</text>\n"
                           "<line x1=\"{0}\" y1=\"{3}\" x2=\"{0}\" y2=\"{4}\" stroke=\"#444\"/>\n"
                           "<line x1=\"{0}\" y1=\"{4}\" x2=\"{5}\" y2=\"{4}\" stroke=\"#444\"/>\n"
                           "<text x=\"{6}\" y=\"{7}\" text-anchor=\"end\">{8}</text>\n"
                           "<text x=\"{6}\" y=\"{4}\" text-anchor=\"end\">0</text>\n",
                           x0, top - 22, title, top, base, x0 + panel_w, x0 - 5, top + 4, scale_top);
        for (int q = 1; q <= 4; ++q)
            svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#ddd\"/>\n",
                               x0 + 1, base - panel_h * q / 4, x0 + panel_w);
        // The bulkhead's groups, then the limiter's.
        const double split = x0 + group_w * static_cast<double>(runs.size() / 2);
        svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#999\" "
                           "stroke-dasharray=\"4 3\"/>\n",
                           split, top, base + 34);
        for (std::size_t i = 0; i < runs.size(); ++i) {
            const double cx = x0 + group_w * (static_cast<double>(i) + 0.5);
            svg += fmt::format(
                "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"11\">{}</text>\n", cx,
                base + 15, runs[i].setup);
        }
        svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">bulkhead</text>"
                           "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">rate limiter</text>\n",
                           (x0 + split) / 2, base + 32, (split + x0 + panel_w) / 2, base + 32);
    };
    const double x_success = left, x_latency = left + panel_w + gap;
    frame(x_success, "Calls that succeeded (%)", "100");
    frame(x_latency, "Their latency (ms): bar p99, black tick p50", fmt::format("{:.0f}", ms_top));
    for (std::size_t i = 0; i < runs.size(); ++i) {
        for (int c = 0; c < 2; ++c) {
            const class_result& r = runs[i].by_class[c];
            const double x = group_w * (static_cast<double>(i) + 0.5) - bar_w - 1 + c * (bar_w + 2);
            const double hs = panel_h * r.success() / 100;
            svg += fmt::format(
                "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{}\" height=\"{:.1f}\" fill=\"{}\"/>"
                "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"9\">{:.0f}</text>\n",
                x_success + x, base - hs, bar_w, hs, colours[c], x_success + x + bar_w / 2, base - hs - 3,
                r.success());
            const double h99 = panel_h * r.percentile_ms(0.99) / ms_top;
            const double y50 = base - panel_h * r.percentile_ms(0.5) / ms_top;
            svg += fmt::format(
                "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{}\" height=\"{:.1f}\" fill=\"{}\"/>"
                "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"black\" "
                "stroke-width=\"2\"/>"
                "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"9\">{:.0f}</text>\n",
                x_latency + x, base - h99, bar_w, h99, colours[c], x_latency + x, y50, x_latency + x + bar_w,
                y50, x_latency + x + bar_w / 2, base - h99 - 3, r.percentile_ms(0.99));
        }
    }
    const double ly = base + 52;
    for (int c = 0; c < 2; ++c)
        svg += fmt::format("<rect x=\"{0}\" y=\"{1}\" width=\"14\" height=\"14\" fill=\"{2}\"/>"
                           "<text x=\"{3}\" y=\"{4}\">{5} ({6:.0f} calls/s)</text>\n",
                           left + c * 220, ly, colours[c], left + c * 220 + 20, ly + 12, class_names[c],
                           rates[c]);
    svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\">FIFO: no priorities. strict: "
                       "classes = 2, the queue served by class. reserved: also 10% of the limit kept free "
                       "for the critical class.</text>\n",
                       left, ly + 34);
    svg += "</svg>\n";
    return svg;
}

} // namespace

int main(int argc, char** argv) {
    if (argc > 2) {
        std::fprintf(stderr, "usage: priorities [output.svg]\n");
        return 2;
    }
    const std::vector<arrival> calls = traffic();
    const rs::priority_classes strict{.classes = 2};
    const rs::priority_classes reserved{.classes = 2, .reserved = {0, 0.1}};
    const auto bulkhead = [](rs::priority_classes p) {
        return [p](rs::testing::simulation& sim) {
            return rs::bulkhead{
                {.max_concurrent_calls = 20, .queue_limit = 40, .queue_timeout = 100ms, .priorities = p},
                sim.clock()};
        };
    };
    const auto limiter = [](rs::priority_classes p) {
        return [p](rs::testing::simulation& sim) {
            return rs::rate_limiter{{.token_limit = 20,
                                     .tokens_per_second = 400,
                                     .queue_limit = 40,
                                     .queue_timeout = 100ms,
                                     .priorities = p},
                                    sim.clock()};
        };
    };
    const std::vector<run> runs{
        simulate(calls, "bulkhead", "FIFO", bulkhead({})),
        simulate(calls, "bulkhead", "strict", bulkhead(strict)),
        simulate(calls, "bulkhead", "reserved", bulkhead(reserved)),
        simulate(calls, "rate limiter", "FIFO", limiter({})),
        simulate(calls, "rate limiter", "strict", limiter(strict)),
        simulate(calls, "rate limiter", "reserved", limiter(reserved)),
    };

    fmt::print(
        "{} calls in {} s (seed {}): {:.0f}/s sheddable, {:.0f}/s critical, against 400/s of capacity\n\n",
        calls.size(), std::chrono::duration_cast<std::chrono::seconds>(run_for).count(), seed, rates[0],
        rates[1]);
    fmt::print("| policy | priorities | class | calls | succeeded | p50 | p99 |\n");
    fmt::print("|---|---|---|---:|---:|---:|---:|\n");
    for (const run& r : runs)
        for (int c = 1; c >= 0; --c) {
            const class_result& k = r.by_class[c];
            fmt::print("| {} | {} | {} | {} | {:.1f}% | {:.0f} ms | {:.0f} ms |\n", r.policy, r.setup,
                       class_names[c], k.calls, k.success(), k.percentile_ms(0.5), k.percentile_ms(0.99));
        }

    if (argc == 2) {
        std::ofstream out(argv[1]);
        out << figure(runs);
        out.close();
        if (!out) {
            std::fprintf(stderr, "priorities: could not write %s\n", argv[1]);
            return 1;
        }
        fmt::print("\nfigure written to {}\n", argv[1]);
    }

    // What the example shows, checked: for each policy, against FIFO (runs[i]), with reserved shares.
    bool held = true;
    for (std::size_t i : {std::size_t{0}, std::size_t{3}}) {
        const run &fifo = runs[i], &with = runs[i + 2];
        const class_result &crit = with.by_class[1], &shed = with.by_class[0];
        if (!(crit.success() >= 99.0 && crit.percentile_ms(0.99) < fifo.by_class[1].percentile_ms(0.99) &&
              shed.success() < fifo.by_class[0].success())) {
            fmt::print(stderr,
                       "priorities: with priorities the {}'s critical calls did not keep their share\n",
                       with.policy);
            held = false;
        }
    }
    return held ? 0 : 1;
}
