// SPDX-License-Identifier: MIT
// The balancer's outlier ejection against a reference model, over seeded random scenarios: endpoints
// that fail with odds of their own, calls at random instants on virtual time, options drawn at random.
// The model says, call by call, which endpoints may be picked (the one picked must be among them), and
// which ejections and returns happen, when, why, for how long; the balancer's callback must say the
// same. Replay one: RESILIENCE_MODEL_SEED=<seed> RESILIENCE_MODEL_SCENARIOS=1 resilience_tests "[model]".
#include "model_scenarios.hpp"

#include <resilience/balancer.hpp>
#include <resilience/testing/simulation.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace test_balancer_model {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_models::chooser;
using resilience_models::comparison;
using resilience_models::event;
using ns = std::int64_t;

// What outlier ejection does, written from Envoy's description rather than from the balancer's code:
// every quantity is a plain field, every rule one function.
struct model {
    struct endpoint {
        int consecutive = 0;
        int times = 0;
        bool out = false; // ejected, its return not yet seen
        ns until = 0;
        int calls = 0, successes = 0; // in the current interval
    };
    rs::outlier_ejection_options x;
    std::vector<endpoint> e;
    ns next_interval;
    std::vector<event> heard;

    model(const rs::outlier_ejection_options& o, std::size_t n)
        : x(o), e(n), next_interval(o.interval.count()) {}

    int out_count() const {
        return static_cast<int>(std::count_if(e.begin(), e.end(), [](const endpoint& p) { return p.out; }));
    }
    // Whether it ejected `i`.
    bool eject(std::size_t i, ns now, const char* why) {
        if (e[i].out)
            return false;
        const int out = out_count();
        if (out > 0 && out * 100.0 >= x.max_ejection_percent * static_cast<double>(e.size()))
            return false;
        ++e[i].times;
        const ns longest = std::max(x.max_ejection_time.count(), x.base_ejection_time.count());
        const ns d = std::min<ns>(longest, x.base_ejection_time.count() * e[i].times);
        e[i].out = true;
        e[i].until = now + d;
        e[i].consecutive = 0;
        heard.push_back({static_cast<int>(i), now, why, d, std::to_string(e[i].times)});
        return true;
    }
    // What the first call at `now` sees before it picks: returns, then an interval's end.
    void before_pick(ns now) {
        for (std::size_t i = 0; i < e.size(); ++i)
            if (e[i].out && e[i].until <= now) {
                e[i].out = false;
                e[i].consecutive = 0;
                heard.push_back({static_cast<int>(i), now, "returned", 0, std::to_string(e[i].times)});
            }
        if (now < next_interval)
            return;
        const ns intervals = (now - next_interval) / x.interval.count() + 1;
        next_interval += intervals * x.interval.count();
        std::vector<double> rate(e.size(), -1);
        double sum = 0, squares = 0;
        int hosts = 0;
        for (std::size_t i = 0; i < e.size(); ++i) {
            if (e[i].calls > 0 && e[i].calls >= x.success_rate_request_volume) {
                rate[i] = static_cast<double>(e[i].successes) / e[i].calls;
                sum += rate[i];
                squares += rate[i] * rate[i];
                ++hosts;
            }
            e[i].calls = e[i].successes = 0;
            if (!e[i].out)
                e[i].times = static_cast<int>(std::max<ns>(0, e[i].times - intervals));
        }
        if (x.success_rate_stdev_factor <= 0 || hosts == 0 || hosts < x.success_rate_minimum_hosts)
            return;
        const double mean = sum / hosts;
        const double floor =
            mean - x.success_rate_stdev_factor * std::sqrt(std::max(0.0, squares / hosts - mean * mean));
        for (std::size_t i = 0; i < e.size(); ++i)
            if (rate[i] >= 0 && rate[i] < floor)
                eject(i, now, "success_rate");
    }
    // Whether endpoint `i` may be picked at `now` (after `before_pick`).
    bool may_pick(std::size_t i, ns now) const {
        const int out = out_count();
        if (out == 0 || out == static_cast<int>(e.size()))
            return true;
        const bool panic = (static_cast<double>(e.size()) - out) * 100.0 <
                           x.panic_threshold_percent * static_cast<double>(e.size());
        return panic || !(e[i].out && e[i].until > now);
    }
    void ended(std::size_t i, ns now, bool failed) {
        ++e[i].calls;
        if (!failed) {
            ++e[i].successes;
            e[i].consecutive = 0;
        } else if (++e[i].consecutive >= x.consecutive_failures && x.consecutive_failures > 0) {
            if (!eject(i, now, "consecutive_failures"))
                e[i].consecutive = 0; // a run that ejects nobody ends, as in Envoy
        }
    }
};

TEST_CASE("model: the balancer ejects and returns endpoints as its model", "[model][balancer]") {
    resilience_models::run_scenarios(300, [](chooser& pick) {
        const std::size_t n = static_cast<std::size_t>(pick.between(2, 8));
        rs::outlier_ejection_options x;
        x.consecutive_failures = static_cast<int>(pick.between(0, 5));
        x.interval = std::chrono::milliseconds(pick.between(1, 3) * 1000);
        x.base_ejection_time = std::chrono::milliseconds(pick.between(1, 5) * 1000);
        x.max_ejection_time = std::chrono::milliseconds(pick.between(1, 20) * 1000);
        const double percents[] = {0.0, 10.0, 34.0, 50.0, 100.0};
        x.max_ejection_percent = pick.pick(percents);
        const double panics[] = {0.0, 50.0, 75.0};
        x.panic_threshold_percent = pick.pick(panics);
        const double factors[] = {0.0, 0.5, 1.0, 1.9};
        x.success_rate_stdev_factor = pick.pick(factors);
        x.success_rate_request_volume = static_cast<int>(pick.between(1, 6));
        x.success_rate_minimum_hosts = static_cast<int>(pick.between(1, 4));
        // Each endpoint fails with odds of its own: never, half the time, or always.
        std::vector<int> fails(n);
        for (int& f : fails) {
            const int odds[] = {0, 0, 50, 100};
            f = pick.pick(odds);
        }
        std::ostringstream setup;
        setup << n << " endpoints, consecutive " << x.consecutive_failures << ", interval "
              << x.interval.count() << "ns, base " << x.base_ejection_time.count() << "ns, max "
              << x.max_ejection_time.count() << "ns, max % " << x.max_ejection_percent << ", panic % "
              << x.panic_threshold_percent << ", k " << x.success_rate_stdev_factor << ", volume "
              << x.success_rate_request_volume << ", hosts " << x.success_rate_minimum_hosts << ", fail %";
        for (int f : fails)
            setup << ' ' << f;

        rs::testing::simulation sim;
        std::vector<std::string> names;
        for (std::size_t i = 0; i < n; ++i)
            names.push_back(std::to_string(i));
        std::vector<event> heard;
        rs::balancer_options o{.pick = rs::balance_pick::random};
        o.outlier_ejection = x;
        o.on_ejection = [&](const rs::ejection_event& e) {
            const char* what = e.returned() ? "returned" : rs::to_string(e.reason());
            heard.push_back({std::stoi(std::string(e.endpoint())), sim.now().count(), what,
                             e.duration().count(), std::to_string(e.times_ejected())});
        };
        rs::balancer<std::string, rs::testing::virtual_clock, rs::seeded_random> lb{
            names, o, sim.clock(), rs::seeded_random{static_cast<std::uint64_t>(pick.between(1, 1'000'000))}};
        model m{x, n};
        comparison c{setup.str(), {}, {}};
        const int calls = static_cast<int>(pick.between(50, 400));
        for (int k = 0; k < calls; ++k) {
            sim.run_for(std::chrono::milliseconds(pick.between(0, 300)));
            const ns now = sim.now().count();
            m.before_pick(now);
            const int roll = static_cast<int>(pick.between(0, 99));
            std::size_t picked = n;
            (void)sim.run(lb.execute_outcome(lb.bind([&](const std::string& h) -> rs::task<int> {
                picked = static_cast<std::size_t>(std::stoi(h));
                if (roll < fails[picked])
                    throw std::runtime_error("down");
                co_return 1;
            })));
            REQUIRE(picked < n);
            if (!m.may_pick(picked, now))
                c.actual.push_back({k, now, "picked an endpoint out", 0, std::to_string(picked)});
            m.ended(picked, now, roll < fails[picked]);
        }
        c.expected = m.heard;
        for (const event& e : heard)
            c.actual.push_back(e);
        return c;
    });
}

} // namespace test_balancer_model
