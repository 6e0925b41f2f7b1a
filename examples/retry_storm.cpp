// SPDX-License-Identifier: MIT
// A retry storm at scale, on virtual time. A fleet of 100,000 callers, spread over 100 client
// processes, each calls one dependency every 20 s. The dependency serves 6,000 calls a second (20%
// above the fleet's 5,000) in arrival order, so a call waits behind the queue ahead of it; every
// attempt has a 1 s timeout. Between t = 10 s and t = 15 s the dependency's capacity halves. Then it
// comes back, and the question is whether the dependency does.
//
// The same fleet runs once per configuration of its client processes:
//   no retries           one attempt: the baseline
//   retries alone        3 attempts, 100 ms then 200 ms, no jitter
//   retries + jitter     the same backoff, full jitter
//   + retry budget       one budget per process (ratio 0.1, capacity 10)
//   + budget + breaker   and one circuit breaker per process
//   + budget + throttle  and one adaptive throttle per process instead of the breaker
//   + all three          budget, breaker and throttle
// For each: a table per second of what the dependency was offered (first attempts and retries), what it
// answered in time, what failed, and whether (and when) it recovered after its capacity came back.
// docs/overload.md reads the numbers.
//
// Runs on virtual time with seeded random sources, so the numbers are the same on every run.
// Exits non-zero unless both configurations with a throttle recover and, in every second of every
// budgeted configuration, retries stay within the budget's own bound (see `check_budget`).
//
//     retry_storm [--clients N] [--table] [figure.svg]
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rs = resilience;
using namespace std::chrono_literals;
using std::chrono::nanoseconds;

namespace {

// ---- the scenario: every number of it, in one place ----------------------------------------

constexpr int processes = 100;        // client processes; each has its own policies
constexpr nanoseconds period = 20s;   // each caller calls once per period
constexpr double headroom = 1.2;      // capacity over the fleet's steady offered load
constexpr nanoseconds service = 50ms; // latency of a call that finds no queue
constexpr nanoseconds attempt_timeout = 1s;
constexpr nanoseconds drop_at = 10s;    // the capacity halves here...
constexpr nanoseconds restore_at = 15s; // ...and comes back here
constexpr nanoseconds duration = 60s;   // callers start calls until then
constexpr int max_attempts = 3;
constexpr double budget_ratio = 0.1;
constexpr double budget_capacity = 10;
constexpr double throttle_k = 2.0;
constexpr nanoseconds throttle_window = 2s;
constexpr double healthy_share = 0.99; // a second is healthy when this share of its calls succeed
constexpr std::uint64_t seed = 2024;
constexpr int seconds_kept = 70; // calls started before 60 s end by 64 s

int second_of(nanoseconds t) {
    return std::min(static_cast<int>(t / 1s), seconds_kept - 1);
}

// ---- what is counted, per second of virtual time -------------------------------------------

struct second_stats {
    std::int64_t first = 0;     // first attempts that reached the dependency
    std::int64_t retries = 0;   // retries that reached the dependency
    std::int64_t accepted = 0;  // attempts the dependency answered before their deadline
    std::int64_t calls = 0;     // calls started (each records itself with its process's budget)
    std::int64_t succeeded = 0; // of the calls started in this second, those that succeeded
    std::int64_t failed = 0;    // calls that ended in failure in this second
    std::int64_t refused = 0;   // of those, the ones a breaker or throttle refused locally
    std::int64_t granted = 0;   // retries the policies decided on (after the budget's withdrawal)
    double tokens = 0;          // budget tokens left in all processes as the second began
    nanoseconds queue{};        // the dependency's queue wait as the second began

    std::int64_t offered() const { return first + retries; }
};

struct run_result {
    std::string name;
    bool budgeted = false;
    bool throttled = false;
    std::vector<second_stats> seconds = std::vector<second_stats>(seconds_kept);
    std::optional<int> recovered_at; // the first second from which every second to the end is healthy
    std::int64_t peak_offered = 0;
    std::int64_t total_offered = 0;
    std::int64_t total_failed = 0;
    std::int64_t total_refused = 0;
};

// ---- the dependency ------------------------------------------------------------------------

// A server that works through its calls in arrival order at `capacity` calls a second, each taking
// `service` once its turn comes: a call's latency is the queue ahead of it plus `service`. It does
// not know when a caller gives up, so a call whose caller timed out still costs it its share of
// capacity, which is what lets a queue of abandoned calls outlive the cause that built it.
class dependency {
public:
    dependency(rs::testing::simulation& sim, double capacity, run_result& out)
        : sim_(&sim), capacity_(capacity), out_(&out) {}

    // The answer to one attempt: a plain awaiter rather than a coroutine, so an attempt costs no frame
    // of its own and a timed-out one one exception (thrown here) rather than two (thrown in a
    // coroutine, then rethrown to its awaiter). A million attempts time out in a storm.
    class answer {
    public:
        answer(dependency& dep, const rs::context& ctx, nanoseconds at)
            : dep_(&dep), ctx_(&ctx),
              sleep_(dep.sim_->clock().sleep_until(time_point{at}, ctx.stop_token())) {}
        bool await_ready() { return sleep_.await_ready(); }
        auto await_suspend(std::coroutine_handle<> h) { return sleep_.await_suspend(h); }
        int await_resume() {
            sleep_.await_resume();
            if (ctx_->stop_requested())
                throw rs::cancelled_error{};
            ++dep_->out_->seconds[static_cast<std::size_t>(second_of(dep_->sim_->now()))].accepted;
            return 200;
        }

    private:
        using time_point = rs::testing::virtual_clock::time_point;
        dependency* dep_;
        const rs::context* ctx_;
        decltype(std::declval<rs::testing::virtual_clock>().sleep_until(time_point{}, {})) sleep_;
    };

    /// Queues an attempt: it is answered once the calls ahead of it and its own work are done.
    answer call(const rs::context& ctx) {
        const nanoseconds now = sim_->now();
        auto& here = out_->seconds[static_cast<std::size_t>(second_of(now))];
        ++(ctx.attempt() == 1 ? here.first : here.retries);
        const nanoseconds start = std::max(now, free_at_);
        free_at_ = start + turn(start);
        return answer{*this, ctx, free_at_ + service};
    }

    /// How long the calls already queued will keep a new one waiting.
    nanoseconds queue() const { return std::max(nanoseconds{}, free_at_ - sim_->now()); }

private:
    // One call's share of the capacity in force at `t`.
    nanoseconds turn(nanoseconds t) const {
        const double c = t >= drop_at && t < restore_at ? capacity_ / 2 : capacity_;
        return nanoseconds(static_cast<std::int64_t>(1e9 / c));
    }

    rs::testing::simulation* sim_;
    double capacity_;
    run_result* out_;
    nanoseconds free_at_{};
};

// What each attempt calls: a small value, copied into each call.
struct attempt_action {
    dependency* dep;
    dependency::answer operator()(const rs::context& ctx) const { return dep->call(ctx); }
};

// ---- the fleet -----------------------------------------------------------------------------

struct fleet {
    int clients;
    double capacity;                 // calls a second
    std::vector<nanoseconds> phases; // each caller's first call, seeded
};

fleet make_fleet(int clients) {
    fleet f{clients, headroom * clients / std::chrono::duration<double>(period).count(), {}};
    rs::seeded_random rng{seed};
    f.phases.reserve(static_cast<std::size_t>(clients));
    for (int i = 0; i < clients; ++i)
        f.phases.push_back(
            nanoseconds(static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(period.count()))));
    return f;
}

// One caller: a call every `period` from its phase on, each through its process's policy.
template <class Policy>
rs::task<void> caller(rs::testing::simulation& sim, const Policy& policy, dependency& dep, run_result& out,
                      nanoseconds phase) {
    for (nanoseconds t = phase; t < duration; t += period) {
        auto until = sim.clock().sleep_until(rs::testing::virtual_clock::time_point{t}, {});
        co_await until;
        const int started = second_of(t);
        auto call = policy.execute_outcome(attempt_action{&dep});
        const rs::outcome<int> result = co_await std::move(call);
        if (result) {
            ++out.seconds[static_cast<std::size_t>(started)].succeeded;
            continue;
        }
        auto& ended = out.seconds[static_cast<std::size_t>(second_of(sim.now()))];
        ++ended.failed;
        const rs::errc code = result.error().code();
        if (code == rs::errc::circuit_open || code == rs::errc::throttled)
            ++ended.refused;
    }
}

// At every whole second: the budget tokens left in every process and the dependency's queue.
rs::task<void> sampler(rs::testing::simulation& sim, const std::vector<rs::retry_budget>& budgets,
                       const dependency& dep, run_result& out) {
    for (int s = 0; s < seconds_kept; ++s) {
        auto until = sim.clock().sleep_until(rs::testing::virtual_clock::time_point{nanoseconds(s * 1s)}, {});
        co_await until;
        auto& here = out.seconds[static_cast<std::size_t>(s)];
        for (const auto& b : budgets)
            here.tokens += b.tokens();
        here.queue = dep.queue();
    }
}

// What one process's policies are built from.
struct process_parts {
    rs::testing::virtual_clock clock;
    rs::retry_options retry;
    rs::seeded_random rng;
    int index;
};

// One process's breaker: opens when half the attempts of the last 2 s failed (20 at least), for 1 s.
// The throttle's refusals never reached the dependency, so they do not count against it.
auto make_breaker(const process_parts& parts) {
    return rs::circuit_breaker{
        {.sampling = rs::breaker_sampling{.window = 2s, .minimum_throughput = 20, .failure_ratio = 0.5},
         .break_duration = 1s,
         .should_handle =
             [](const rs::failure& f) { return f.code() != rs::errc::throttled && !rs::is_cancellation(f); }},
        parts.clock};
}

// One process's throttle, with its own seeded draws.
auto make_throttle(const process_parts& parts) {
    return rs::adaptive_throttle{{.k = throttle_k, .window = throttle_window, .segments = 10},
                                 parts.clock,
                                 rs::seeded_random{seed ^ static_cast<std::uint64_t>(parts.index)}};
}

struct configuration {
    const char* name;
    int attempts; // max_attempts: 1 never retries
    bool jitter;
    bool budget;
    bool throttled; // with an adaptive throttle: must recover, or the run fails
};

// Runs the fleet through policies that `make(parts)` builds once per process.
template <class Make>
run_result simulate(const fleet& f, const configuration& config, Make make) {
    rs::testing::simulation sim;
    run_result out;
    out.name = config.name;
    out.budgeted = config.budget;
    out.throttled = config.throttled;
    dependency dep{sim, f.capacity, out};

    std::vector<rs::retry_budget> budgets;
    using policy_type = decltype(make(std::declval<process_parts>()));
    std::vector<policy_type> policies;
    policies.reserve(processes);
    for (int p = 0; p < processes; ++p) {
        rs::retry_options retry{
            .max_attempts = config.attempts,
            .backoff = rs::exponential_backoff{.initial = 100ms,
                                               .factor = 2.0,
                                               .max = 1s,
                                               .jitter = config.jitter ? rs::jitter::full : rs::jitter::none},
            .on_retry =
                [&sim, &out](const rs::retry_event&) {
                    ++out.seconds[static_cast<std::size_t>(second_of(sim.now()))].granted;
                },
        };
        if (config.budget) {
            budgets.emplace_back(
                rs::retry_budget_options{.ratio = budget_ratio, .capacity = budget_capacity});
            retry.budget = budgets.back();
        }
        policies.push_back(make(process_parts{
            sim.clock(), std::move(retry), rs::seeded_random{seed + static_cast<std::uint64_t>(p) + 1}, p}));
    }

    sim.spawn(sampler(sim, budgets, dep, out));
    for (int i = 0; i < f.clients; ++i)
        sim.spawn(caller(sim, policies[static_cast<std::size_t>(i % processes)], dep, out,
                         f.phases[static_cast<std::size_t>(i)]));
    sim.run_all();

    // Every call started in a second counts itself there (calls() from the budget would do as well).
    for (int i = 0; i < f.clients; ++i)
        for (nanoseconds t = f.phases[static_cast<std::size_t>(i)]; t < duration; t += period)
            ++out.seconds[static_cast<std::size_t>(second_of(t))].calls;

    const int first_after = static_cast<int>(restore_at / 1s);
    const int last = static_cast<int>(duration / 1s);
    for (int s = last - 1; s >= first_after; --s) {
        const auto& here = out.seconds[static_cast<std::size_t>(s)];
        if (static_cast<double>(here.succeeded) < healthy_share * static_cast<double>(here.calls))
            break;
        out.recovered_at = s;
    }
    for (const auto& s : out.seconds) {
        out.peak_offered = std::max(out.peak_offered, s.offered());
        out.total_offered += s.offered();
        out.total_failed += s.failed;
        out.total_refused += s.refused;
    }
    return out;
}

// ---- the checks ----------------------------------------------------------------------------

// The budget's own bound, second by second. Every call deposits `ratio` tokens into its process's
// budget and every retry withdraws a whole one first, never below zero. So in any interval, the
// retries a process grants are at most the tokens it held as the interval began plus `ratio` times
// the calls it started in it. Summed over the processes, for every second s:
//     granted(s) <= tokens(s) + ratio * calls(s)                                   (exact)
// and since no process holds more than `capacity` tokens,
//     offered(s) <= (1 + ratio) * calls(s) + processes * capacity                 (what the dependency sees)
// where offered counts every attempt that reached the dependency in s. The second form also allows for
// the retries granted late in one second whose backoff carries them into the next: at most the
// tokens a process could have spent, which the allowance covers while the budget is drained.
bool check_budget(const run_result& r) {
    if (!r.budgeted)
        return true;
    bool ok = true;
    for (std::size_t s = 0; s < r.seconds.size(); ++s) {
        const auto& here = r.seconds[s];
        const double exact = here.tokens + budget_ratio * static_cast<double>(here.calls);
        if (static_cast<double>(here.granted) > exact + 1e-6) {
            fmt::print(stderr,
                       "retry_storm: {}: second {} granted {} retries, more than {:.1f} tokens held + {} x "
                       "{} calls\n",
                       r.name, s, here.granted, here.tokens, budget_ratio, here.calls);
            ok = false;
        }
        const double offered_bound =
            (1 + budget_ratio) * static_cast<double>(here.calls) + processes * budget_capacity;
        if (static_cast<double>(here.offered()) > offered_bound) {
            fmt::print(stderr, "retry_storm: {}: second {} offered {} attempts, more than {:.0f}\n", r.name,
                       s, here.offered(), offered_bound);
            ok = false;
        }
    }
    return ok;
}

// ---- output --------------------------------------------------------------------------------

std::string recovery(const run_result& r) {
    if (!r.recovered_at)
        return "never";
    return fmt::format("{} s after", *r.recovered_at - static_cast<int>(restore_at / 1s));
}

void print_table(const run_result& r) {
    fmt::print("\n{}\n", r.name);
    fmt::print("{:>4} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9}\n", "s", "first", "retries",
               "offered", "accepted", "queue", "calls", "failed", "refused", "granted", "tokens");
    const int last = static_cast<int>(duration / 1s);
    for (int s = 0; s < last; ++s) {
        const auto& h = r.seconds[static_cast<std::size_t>(s)];
        fmt::print("{:>4} {:>8} {:>8} {:>8} {:>9} {:>8.2f}s {:>8} {:>8} {:>8} {:>8} {:>9.1f}\n", s, h.first,
                   h.retries, h.offered(), h.accepted, std::chrono::duration<double>(h.queue).count(),
                   h.calls, h.failed, h.refused, h.granted, h.tokens);
    }
}

// Offered load per second, one line per configuration, with the capacity and the first attempts.
std::string figure(const fleet& f, const std::vector<run_result>& runs) {
    static constexpr const char* colours[] = {"#7f8c8d", "#c0392b", "#e67e22", "#2c6fbb",
                                              "#16a085", "#8e44ad", "#e84393"};
    const int last = static_cast<int>(duration / 1s);
    std::int64_t peak = 0;
    for (const auto& r : runs)
        peak = std::max(peak, r.peak_offered);
    // A round step (1, 2 or 5 times a power of ten) that reaches past the peak in at most ten ticks.
    double step = 1;
    for (int i = 0; static_cast<double>(peak) * 1.05 > 10 * step; ++i)
        step *= i % 3 == 1 ? 2.5 : 2.0; // 1, 2, 5, 10, 20, 50, ...
    const double top_value = std::ceil(static_cast<double>(peak) * 1.05 / step) * step;
    constexpr double left = 80, right = 210, top = 60, plot_w = 760, plot_h = 380, bottom = 50;
    const auto x = [&](double s) { return left + s / last * plot_w; };
    const auto y = [&](double v) { return top + plot_h - v / top_value * plot_h; };

    std::string svg = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
        "font-family=\"sans-serif\" font-size=\"12\">\n"
        "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        "<text x=\"{2}\" y=\"22\" font-size=\"15\">{3} callers in {4} processes; the dependency's capacity "
        "halves "
        "from t = {5} s to t = {6} s</text>\n"
        "<text x=\"{2}\" y=\"40\">Attempts offered to the dependency per second (first attempts and "
        "retries), "
        "one line per client configuration</text>\n",
        left + plot_w + right, top + plot_h + bottom, left, f.clients, processes, drop_at / 1s,
        restore_at / 1s);
    // The dip, shaded; axes; ticks every 5 s and every `step` attempts.
    svg +=
        fmt::format("<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"#f1c40f\" "
                    "fill-opacity=\"0.2\"/>\n",
                    x(static_cast<double>(drop_at / 1s)), top,
                    x(static_cast<double>(restore_at / 1s)) - x(static_cast<double>(drop_at / 1s)), plot_h);
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#444\"/>\n"
                       "<line x1=\"{0}\" y1=\"{2}\" x2=\"{3}\" y2=\"{2}\" stroke=\"#444\"/>\n",
                       left, top, top + plot_h, left + plot_w);
    for (int s = 0; s <= last; s += 5)
        svg += fmt::format(
            "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#444\"/>"
            "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\" font-size=\"10\">{4} s</text>\n",
            x(s), top + plot_h, top + plot_h + 4, top + plot_h + 16, s);
    for (double v = 0; v <= top_value + 1; v += step)
        svg +=
            fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
                        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\" font-size=\"10\">{5:.0f}</text>\n",
                        left, y(v), left + plot_w, left - 6, y(v) + 3, v);
    svg += fmt::format("<text x=\"20\" y=\"{0}\" transform=\"rotate(-90 20 {0})\" text-anchor=\"middle\">"
                       "attempts per second</text>\n",
                       top + plot_h / 2);
    // The capacity, dashed: full, half during the dip, full again.
    const double full = f.capacity, half = f.capacity / 2;
    const double d = static_cast<double>(drop_at / 1s), u = static_cast<double>(restore_at / 1s);
    svg += fmt::format(
        "<polyline fill=\"none\" stroke=\"#000\" stroke-dasharray=\"6 4\" points=\""
        "{:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}\"/>\n",
        x(0), y(full), x(d), y(full), x(d), y(half), x(u), y(half), x(u), y(full), x(last), y(full));
    // One line per configuration: each second's value drawn at the second's middle.
    for (std::size_t c = 0; c < runs.size(); ++c) {
        std::string points;
        for (int s = 0; s < last; ++s)
            points +=
                fmt::format("{:.1f},{:.1f} ", x(s + 0.5),
                            y(static_cast<double>(runs[c].seconds[static_cast<std::size_t>(s)].offered())));
        svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n",
                           colours[c % std::size(colours)], points);
    }
    // The legend, with each configuration's recovery.
    const double lx = left + plot_w + 15;
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#000\" stroke-dasharray=\"6 4\"/>"
        "<text x=\"{3}\" y=\"{4}\">capacity</text>\n",
        lx, top + 10, lx + 24, lx + 30, top + 14);
    for (std::size_t c = 0; c < runs.size(); ++c) {
        const double ly = top + 40 + static_cast<double>(c) * 34;
        svg += fmt::format(
            "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"2\"/>"
            "<text x=\"{4}\" y=\"{5}\">{6}</text>"
            "<text x=\"{4}\" y=\"{7}\" font-size=\"10\" fill=\"#555\">recovered: {8}</text>\n",
            lx, ly, lx + 24, colours[c % std::size(colours)], lx + 30, ly + 4, runs[c].name, ly + 17,
            recovery(runs[c]));
    }
    svg += "</svg>\n";
    return svg;
}

int usage() {
    std::fprintf(stderr, "usage: retry_storm [--clients N] [--table] [figure.svg]\n");
    return 2;
}

} // namespace

int main(int argc, char** argv) {
    int clients = 100'000;
    bool tables = false;
    const char* svg_path = nullptr;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--clients" && i + 1 < argc) {
            const std::string_view n = argv[++i];
            const auto [end, err] = std::from_chars(n.data(), n.data() + n.size(), clients);
            if (err != std::errc{} || end != n.data() + n.size() || clients < processes)
                return usage();
        } else if (arg == "--table") {
            tables = true;
        } else if (!arg.starts_with("--") && !svg_path) {
            svg_path = argv[i];
        } else {
            return usage();
        }
    }

    const fleet f = make_fleet(clients);
    const auto plain = [](process_parts parts) {
        return rs::pipeline{rs::retry{std::move(parts.retry), parts.clock, parts.rng},
                            rs::timeout{attempt_timeout, parts.clock}};
    };
    const auto with_breaker = [](process_parts parts) {
        return rs::pipeline{rs::retry{std::move(parts.retry), parts.clock, parts.rng}, make_breaker(parts),
                            rs::timeout{attempt_timeout, parts.clock}};
    };
    const auto with_throttle = [](process_parts parts) {
        return rs::pipeline{rs::retry{std::move(parts.retry), parts.clock, parts.rng}, make_throttle(parts),
                            rs::timeout{attempt_timeout, parts.clock}};
    };
    const auto with_both = [](process_parts parts) {
        return rs::pipeline{rs::retry{std::move(parts.retry), parts.clock, parts.rng}, make_breaker(parts),
                            make_throttle(parts), rs::timeout{attempt_timeout, parts.clock}};
    };

    std::vector<run_result> runs;
    runs.push_back(simulate(f, {"no retries", 1, false, false, false}, plain));
    runs.push_back(simulate(f, {"retries alone", max_attempts, false, false, false}, plain));
    runs.push_back(simulate(f, {"retries + jitter", max_attempts, true, false, false}, plain));
    runs.push_back(simulate(f, {"+ retry budget", max_attempts, true, true, false}, plain));
    runs.push_back(simulate(f, {"+ budget + breaker", max_attempts, true, true, false}, with_breaker));
    runs.push_back(simulate(f, {"+ budget + throttle", max_attempts, true, true, true}, with_throttle));
    runs.push_back(simulate(f, {"+ all three", max_attempts, true, true, true}, with_both));

    fmt::print("{} callers in {} processes, one call each every {} s ({:.0f} calls/s); the dependency serves "
               "{:.0f}/s, {:.0f}/s from t = {} s to t = {} s; {} attempts of {} ms timeout (seed {})\n",
               clients, processes, period / 1s, clients / std::chrono::duration<double>(period).count(),
               f.capacity, f.capacity / 2, drop_at / 1s, restore_at / 1s, max_attempts,
               std::chrono::duration_cast<std::chrono::milliseconds>(attempt_timeout).count(), seed);
    fmt::print("\n{:<22} {:>8} {:>13} {:>13} {:>10} {:>20}\n", "configuration", "peak/s", "offered, all",
               "failed calls", "(refused)", "healthy again");
    for (const auto& r : runs)
        fmt::print("{:<22} {:>8} {:>13} {:>13} {:>10} {:>20}\n", r.name, r.peak_offered, r.total_offered,
                   r.total_failed, r.total_refused,
                   r.recovered_at ? fmt::format("at {} s ({})", *r.recovered_at, recovery(r)) : "never");
    if (tables)
        for (const auto& r : runs)
            print_table(r);

    if (svg_path) {
        std::ofstream out(svg_path);
        out << figure(f, runs);
        out.close();
        if (!out) {
            std::fprintf(stderr, "retry_storm: could not write %s\n", svg_path);
            return 1;
        }
        fmt::print("\nfigure written to {}\n", svg_path);
    }

    bool ok = true;
    for (const auto& r : runs)
        ok = check_budget(r) && ok;
    for (const auto& r : runs)
        if (r.throttled && !r.recovered_at) {
            fmt::print(stderr, "retry_storm: {} did not recover\n", r.name);
            ok = false;
        }
    return ok ? 0 : 1;
}
