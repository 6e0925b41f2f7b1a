// SPDX-License-Identifier: MIT
// Why retries are jittered. 2000 clients fail at the same instant against a dependency that stays down,
// and each retries four times on one exponential backoff (1 s, 2 s, 4 s, 8 s) with one of four jitter
// modes. Without jitter every client comes back in the same instant, four times over; the wider the
// jitter spreads each wait, the lower the busiest 100 ms of retries the dependency has to absorb.
//
// Runs on virtual time with a seeded random source, so the table and the figure are the same on every
// run. Prints the table, writes an SVG figure (one panel per mode, retries per 100 ms) to argv[1], and
// exits non-zero unless the busiest window falls strictly from one mode to the next:
// none > proportional(0.2) > equal > full.
//
//     jitter_figure docs/images/jitter.svg
#include <resilience/backoff.hpp>
#include <resilience/retry.hpp>
#include <resilience/testing/simulation.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace rs = resilience;
using namespace std::chrono_literals;
using std::chrono::nanoseconds;

namespace {

constexpr int clients = 2000;
constexpr int max_attempts = 5; // the first call and four retries
constexpr nanoseconds window = 100ms;
constexpr std::uint64_t seed = 2024;

struct jitter_mode {
    const char* name;
    const char* spread; // what a wait d becomes
    rs::jitter jitter;
};

struct run_result {
    std::vector<nanoseconds> retries; // the instant of every retry, in order
    int busiest = 0;                  // retries in the busiest `window`
    nanoseconds busiest_at{};         // where that window starts
};

// The most instants of `sorted` that fall in any half-open interval [t, t + window).
void find_busiest(run_result& r) {
    const auto& t = r.retries;
    std::size_t from = 0;
    for (std::size_t to = 0; to < t.size(); ++to) {
        while (t[to] - t[from] >= window)
            ++from;
        const int n = static_cast<int>(to - from + 1);
        if (n > r.busiest) {
            r.busiest = n;
            r.busiest_at = t[from];
        }
    }
}

run_result simulate(const jitter_mode& mode) {
    rs::testing::simulation sim;
    run_result result;
    rs::retry policy{
        {.max_attempts = max_attempts,
         .backoff = rs::exponential_backoff{.initial = 1s, .factor = 2.0, .max = 8s, .jitter = mode.jitter}},
        sim.clock(),
        rs::seeded_random{seed}};
    // The dependency is down throughout: every attempt fails at once. Retries (attempt 2 on) are logged.
    auto down = [&sim, &result](const rs::context& ctx) -> rs::task<int> {
        if (ctx.attempt() > 1)
            result.retries.push_back(sim.now());
        throw std::runtime_error("unavailable");
        co_return 0;
    };
    auto client = [](rs::task<rs::outcome<int>> call) -> rs::task<void> { (void)co_await std::move(call); };
    for (int i = 0; i < clients; ++i)
        sim.spawn(client(policy.execute_outcome(down)));
    sim.run_all();
    std::sort(result.retries.begin(), result.retries.end());
    find_busiest(result);
    return result;
}

double seconds(nanoseconds d) {
    return std::chrono::duration<double>(d).count();
}

// One panel per mode, stacked: a bar per `window` of retries, all on one scale so heights compare.
std::string figure(const std::vector<jitter_mode>& modes, const std::vector<run_result>& runs) {
    nanoseconds last{};
    for (const auto& r : runs)
        last = std::max(last, r.retries.back());
    const auto bins =
        static_cast<std::size_t>(std::chrono::ceil<std::chrono::seconds>(last + window) / window);
    constexpr double left = 70, right = 20, top = 60, panel = 130, gap = 40, plot_width = 800;
    const double bar = plot_width / static_cast<double>(bins);
    const double height = top + static_cast<double>(modes.size()) * (panel + gap) + 10;
    const double scale = panel / static_cast<double>(clients); // bars share one scale: all clients = full

    std::string svg = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
        "font-family=\"sans-serif\" font-size=\"12\">\n"
        "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        "<text x=\"{2}\" y=\"22\" font-size=\"15\">{3} clients fail at t = 0 and retry 4 times "
        "on an exponential backoff (1 s, 2 s, 4 s, 8 s)</text>\n"
        "<text x=\"{2}\" y=\"40\">Retries per 100 ms, one panel per jitter mode, all on one scale. "
        "Shaded: the busiest 100 ms.</text>\n",
        left + plot_width + right, height, left, clients);
    for (std::size_t m = 0; m < modes.size(); ++m) {
        const double y0 = top + static_cast<double>(m) * (panel + gap) + 20; // the panel's top
        const double base = y0 + panel;
        std::vector<int> count(bins, 0);
        for (nanoseconds t : runs[m].retries)
            ++count[static_cast<std::size_t>(t / window)];
        svg +=
            fmt::format("<text x=\"{}\" y=\"{}\" font-weight=\"bold\">{} jitter, wait in {}: busiest 100 ms "
                        "holds {} retries</text>\n",
                        left, y0 - 6, modes[m].name, modes[m].spread, runs[m].busiest);
        // Axes, with the scale on the left and a tick every second.
        svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#444\"/>\n"
                           "<line x1=\"{0}\" y1=\"{2}\" x2=\"{3}\" y2=\"{2}\" stroke=\"#444\"/>\n"
                           "<text x=\"{4}\" y=\"{5}\" text-anchor=\"end\">{6}</text>\n"
                           "<text x=\"{4}\" y=\"{2}\" text-anchor=\"end\">0</text>\n",
                           left, y0, base, left + plot_width, left - 6, y0 + 10, clients);
        for (std::size_t s = 0; s * 10 <= bins; ++s) {
            const double x = left + static_cast<double>(s * 10) * bar;
            svg += fmt::format(
                "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#444\"/>"
                "<text x=\"{0}\" y=\"{3}\" text-anchor=\"middle\" font-size=\"10\">{4} s</text>\n",
                x, base, base + 4, base + 15, s);
        }
        // The busiest window, which need not start on a bar's edge, as a band behind the bars.
        svg +=
            fmt::format("<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"#e74c3c\" "
                        "fill-opacity=\"0.3\"/>\n",
                        left + seconds(runs[m].busiest_at) / seconds(window) * bar, y0, bar, panel);
        for (std::size_t b = 0; b < bins; ++b) {
            if (count[b] == 0)
                continue;
            const double h = std::max(1.0, count[b] * scale);
            svg += fmt::format(
                "<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"#2c6fbb\"/>\n",
                left + static_cast<double>(b) * bar, base - h, std::max(bar - 1.0, 1.0), h);
        }
    }
    svg += "</svg>\n";
    return svg;
}

} // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: jitter_figure <output.svg>\n");
        return 2;
    }
    const std::vector<jitter_mode> modes{
        {"no", "d exactly", rs::jitter::none},
        {"proportional (0.2)", "[0.8 d, d]", rs::jitter::proportional(0.2)},
        {"equal", "[d/2, d]", rs::jitter::equal},
        {"full", "[0, d]", rs::jitter::full},
    };
    std::vector<run_result> runs;
    for (const auto& m : modes)
        runs.push_back(simulate(m));

    fmt::print(
        "{} clients fail together at t = 0 and retry {} times, exponential backoff from 1 s (seed {})\n\n",
        clients, max_attempts - 1, seed);
    fmt::print("{:<20} {:<12} {:>8} {:>16} {:>10} {:>12}\n", "jitter", "wait d in", "retries",
               "busiest 100 ms", "starting", "of clients");
    for (std::size_t m = 0; m < modes.size(); ++m)
        fmt::print("{:<20} {:<12} {:>8} {:>16} {:>9.3f}s {:>11.1f}%\n", modes[m].name, modes[m].spread,
                   runs[m].retries.size(), runs[m].busiest, seconds(runs[m].busiest_at),
                   100.0 * runs[m].busiest / clients);

    std::ofstream out(argv[1]);
    out << figure(modes, runs);
    out.close();
    if (!out) {
        std::fprintf(stderr, "jitter_figure: could not write %s\n", argv[1]);
        return 1;
    }
    fmt::print("\nfigure written to {}\n", argv[1]);

    for (std::size_t m = 1; m < runs.size(); ++m)
        if (!(runs[m].busiest < runs[m - 1].busiest)) {
            fmt::print(stderr,
                       "jitter_figure: the busiest window did not fall from {} to {} jitter ({} -> {})\n",
                       modes[m - 1].name, modes[m].name, runs[m - 1].busiest, runs[m].busiest);
            return 1;
        }
    return 0;
}
