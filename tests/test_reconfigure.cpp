// SPDX-License-Identifier: MIT
// Live reconfiguration (docs/reconfiguration.md) of the circuit breaker, the retry budget, the adaptive
// throttle and registry entries: what carries over, what the new options change and from when, calls in
// flight finishing under the options they started with, bad options refused with the old ones still in
// force (checked by behaviour), a seeded model of the breaker reconfigured between calls, and threads
// calling while another thread reconfigures.

#include "catch.hpp"
#include "models.hpp"
#include "support.hpp"

#include <resilience/adaptive_throttle.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/circuit_breaker.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/registry.hpp>
#include <resilience/retry_budget.hpp>
#include <resilience/testing/simulation.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace test_reconfigure {

namespace rs = resilience;
namespace rm = resilience_models;
using namespace std::chrono_literals;
using resilience_tests::invalid_argument_message;
using rs::circuit_state;
using rs::testing::simulation;
using vclock = rs::testing::virtual_clock;
using breaker = rs::circuit_breaker<vclock>;

namespace {

// An action that runs for `d` of virtual time, then returns 7 or throws `E`.
struct ok_after {
    simulation* sim;
    std::chrono::nanoseconds d = 0ns;
    rs::task<int> operator()() const {
        if (d > 0ns)
            co_await sim->sleep_for(d);
        co_return 7;
    }
};
template <class E = std::runtime_error>
struct fail_after {
    simulation* sim;
    std::chrono::nanoseconds d = 0ns;
    rs::task<int> operator()() const {
        if (d > 0ns)
            co_await sim->sleep_for(d);
        throw E("scripted failure");
        co_return 0;
    }
};

// Awaits `call` and keeps what it ended with.
rs::task<void> keep(rs::task<rs::outcome<int>> call, std::optional<rs::outcome<int>>& out) {
    out.emplace(co_await std::move(call));
}

bool open_refusal(const std::optional<rs::outcome<int>>& r) {
    return r && r->has_failure() && r->error().is<rs::circuit_open_error>();
}
std::chrono::nanoseconds retry_after(const rs::outcome<int>& r) {
    const auto* e = r.error().as<rs::circuit_open_error>();
    return e ? e->retry_after() : -1ns;
}

} // namespace

// ---------------------------------------------------------------------------------------------------------
// Circuit breaker

TEST_CASE("reconfigure: an open breaker stays open to its scheduled end, and its next breaks follow the "
          "new options, their growth going on",
          "[reconfigure][circuit_breaker]") {
    simulation sim;
    breaker b{{.failure_threshold = 1, .break_duration = 10s, .break_duration_growth = 2.0}, sim.clock()};
    CHECK(sim.run(b.execute_outcome(fail_after<>{&sim})).has_failure()); // opens at 0s until 10s
    sim.run_for(2s);
    b.reconfigure({.failure_threshold = 1, .break_duration = 1s, .break_duration_growth = 3.0});
    CHECK(b.options().break_duration == 1s);
    sim.run_for(3s);
    auto refused = sim.run(b.execute_outcome(ok_after{&sim}));
    CHECK(retry_after(refused) == 5s); // the break scheduled under the old options
    sim.run_until(10s);
    CHECK(b.state() == circuit_state::half_open);
    CHECK(sim.run(b.execute_outcome(fail_after<>{&sim})).has_failure()); // the probe fails at 10s
    // The second opening in a row: 1s * 3^1, where a fresh breaker would break for 1s.
    CHECK(retry_after(sim.run(b.execute_outcome(ok_after{&sim}))) == 3s);
    CHECK(b.metrics().consecutive_opens == 2);
    sim.run_until(13s);
    CHECK(sim.run(b.execute_outcome(ok_after{&sim})).has_value());
    CHECK(b.state() == circuit_state::closed);
}

TEST_CASE("reconfigure: an isolated breaker stays isolated until reset", "[reconfigure][circuit_breaker]") {
    simulation sim;
    breaker b{{.failure_threshold = 3}, sim.clock()};
    b.isolate();
    b.reconfigure({.failure_threshold = 1, .break_duration = 1s});
    sim.run_for(1h);
    auto r = sim.run(b.execute_outcome(ok_after{&sim}));
    CHECK(r.has_failure());
    CHECK(r.error().is<rs::circuit_isolated_error>());
    b.reset();
    CHECK(sim.run(b.execute_outcome(ok_after{&sim})).has_value());
}

TEST_CASE("reconfigure: half-open keeps its probes in flight and counts new ones against the new probes",
          "[reconfigure][circuit_breaker]") {
    simulation sim;
    std::vector<std::pair<std::chrono::nanoseconds, circuit_state>> changes;
    auto told = [&](const rs::state_change_event& e) { changes.emplace_back(sim.now(), e.to()); };
    std::optional<rs::outcome<int>> a, b2, c, d, e;
    SECTION("more probes: admitted beside the one in flight, all needed to close") {
        breaker b{{.failure_threshold = 1, .break_duration = 1s, .probes = 1, .on_state_change = told},
                  sim.clock()};
        CHECK(sim.run(b.execute_outcome(fail_after<>{&sim})).has_failure());
        sim.run_until(1s);
        sim.spawn(keep(b.execute_outcome(ok_after{&sim, 10s}), a)); // probe 1, ends at 11s
        sim.run_for(0s);
        sim.spawn(keep(b.execute_outcome(ok_after{&sim}), b2)); // the one slot is taken
        sim.run_for(0s);
        CHECK(open_refusal(b2));
        b.reconfigure({.failure_threshold = 1, .break_duration = 1s, .probes = 3, .on_state_change = told});
        sim.run_until(2s);
        sim.spawn(keep(b.execute_outcome(ok_after{&sim, 10s}), c)); // probe 2, ends at 12s
        sim.run_until(3s);
        sim.spawn(keep(b.execute_outcome(ok_after{&sim, 10s}), d)); // probe 3, ends at 13s
        sim.spawn(keep(b.execute_outcome(ok_after{&sim}), e));      // a fourth: refused
        sim.run_until(12s);
        CHECK(open_refusal(e));
        CHECK(b.state() == circuit_state::half_open); // two of three passed
        sim.run_all();
        CHECK(a->has_value());
        CHECK(c->has_value());
        CHECK(d->has_value());
        CHECK(changes ==
              std::vector<std::pair<std::chrono::nanoseconds, circuit_state>>{
                  {0s, circuit_state::open}, {1s, circuit_state::half_open}, {13s, circuit_state::closed}});
    }
    SECTION("fewer probes: none admitted beyond them, and the first success closes") {
        breaker b{{.failure_threshold = 1, .break_duration = 1s, .probes = 3, .on_state_change = told},
                  sim.clock()};
        CHECK(sim.run(b.execute_outcome(fail_after<>{&sim})).has_failure());
        sim.run_until(1s);
        sim.spawn(keep(b.execute_outcome(ok_after{&sim, 10s}), a)); // ends at 11s
        sim.spawn(keep(b.execute_outcome(ok_after{&sim, 11s}), c)); // ends at 12s
        sim.run_for(0s);
        b.reconfigure({.failure_threshold = 1, .break_duration = 1s, .probes = 1, .on_state_change = told});
        sim.spawn(keep(b.execute_outcome(ok_after{&sim}), e)); // two taken, one allowed now: refused
        sim.run_for(0s);
        CHECK(open_refusal(e));
        sim.run_until(11s);
        CHECK(b.state() == circuit_state::closed);
        sim.run_all();
        CHECK(c->has_value()); // its result came after the close: dropped, the value still returned
        CHECK(changes ==
              std::vector<std::pair<std::chrono::nanoseconds, circuit_state>>{
                  {0s, circuit_state::open}, {1s, circuit_state::half_open}, {11s, circuit_state::closed}});
    }
    SECTION("as many probes as have passed already: closed by the reconfiguration") {
        breaker b{{.failure_threshold = 1, .break_duration = 1s, .probes = 3, .on_state_change = told},
                  sim.clock()};
        CHECK(sim.run(b.execute_outcome(fail_after<>{&sim})).has_failure());
        sim.run_until(1s);
        CHECK(sim.run(b.execute_outcome(ok_after{&sim, 1s})).has_value()); // passed at 2s
        CHECK(sim.run(b.execute_outcome(ok_after{&sim, 1s})).has_value()); // passed at 3s
        CHECK(b.state() == circuit_state::half_open);
        sim.run_until(5s);
        b.reconfigure({.failure_threshold = 1, .break_duration = 1s, .probes = 2, .on_state_change = told});
        CHECK(b.state() == circuit_state::closed);
        CHECK(b.metrics().consecutive_opens == 0);
        CHECK(changes ==
              std::vector<std::pair<std::chrono::nanoseconds, circuit_state>>{
                  {0s, circuit_state::open}, {1s, circuit_state::half_open}, {5s, circuit_state::closed}});
    }
}

TEST_CASE("reconfigure: the run of consecutive failures is kept and judged by the new threshold at the "
          "next failure",
          "[reconfigure][circuit_breaker]") {
    simulation sim;
    breaker b{{.failure_threshold = 5}, sim.clock()};
    for (int i = 0; i < 3; ++i)
        CHECK(sim.run(b.execute_outcome(fail_after<>{&sim})).has_failure());
    SECTION("raised past the run") {
        b.reconfigure({.failure_threshold = 6});
        CHECK(b.metrics().consecutive_failures == 3);
        for (int i = 0; i < 2; ++i)
            CHECK(sim.run(b.execute_outcome(fail_after<>{&sim})).has_failure());
        CHECK(b.state() == circuit_state::closed);
        CHECK(sim.run(b.execute_outcome(fail_after<>{&sim})).has_failure()); // the sixth in a row
        CHECK(b.state() == circuit_state::open);
    }
    SECTION("lowered below the run: not at once, at the next failure") {
        b.reconfigure({.failure_threshold = 2});
        CHECK(b.state() == circuit_state::closed);
        CHECK(sim.run(b.execute_outcome(fail_after<>{&sim})).has_failure());
        CHECK(b.state() == circuit_state::open);
        CHECK(b.metrics().consecutive_failures == 4);
    }
    SECTION("lowered, then a success ends the run") {
        b.reconfigure({.failure_threshold = 2});
        CHECK(sim.run(b.execute_outcome(ok_after{&sim})).has_value());
        CHECK(b.metrics().consecutive_failures == 0);
        CHECK(sim.run(b.execute_outcome(fail_after<>{&sim})).has_failure());
        CHECK(b.state() == circuit_state::closed);
    }
}

TEST_CASE("reconfigure: the sample is kept when the window is the same, and a fresh one takes only calls "
          "admitted after",
          "[reconfigure][circuit_breaker]") {
    simulation sim;
    using rs::breaker_sampling;
    breaker b{{.sampling = breaker_sampling{.calls = 4, .failure_ratio = 0.5}}, sim.clock()};
    CHECK(sim.run(b.execute_outcome(fail_after<>{&sim})).has_failure());
    CHECK(sim.run(b.execute_outcome(ok_after{&sim})).has_value());
    CHECK(sim.run(b.execute_outcome(ok_after{&sim})).has_value());
    CHECK(b.metrics().calls == 3);
    SECTION("another ratio: the same window, judged by the new ratio from the next call") {
        b.reconfigure({.sampling = breaker_sampling{.calls = 4, .failure_ratio = 0.25}});
        CHECK(b.metrics().calls == 3);
        CHECK(b.metrics().failures == 1);
        CHECK(b.state() == circuit_state::closed);
        CHECK(sim.run(b.execute_outcome(ok_after{&sim})).has_value()); // 1 of 4 failed: 0.25
        CHECK(b.state() == circuit_state::open);
    }
    SECTION("another size: a fresh sample") {
        b.reconfigure({.sampling = breaker_sampling{.calls = 2, .failure_ratio = 0.5}});
        CHECK(b.metrics().calls == 0);
        CHECK(sim.run(b.execute_outcome(ok_after{&sim})).has_value());
        CHECK(sim.run(b.execute_outcome(fail_after<>{&sim})).has_failure()); // 1 of 2
        CHECK(b.state() == circuit_state::open);
    }
    SECTION("another idea of slow: a fresh sample, which the call in flight does not enter") {
        std::optional<rs::outcome<int>> in_flight;
        sim.spawn(keep(b.execute_outcome(fail_after<>{&sim, 1s}), in_flight));
        sim.run_for(500ms);
        b.reconfigure(
            {.sampling = breaker_sampling{
                 .calls = 4, .failure_ratio = 0.5, .slow_call_duration = 2s, .slow_call_ratio = 1.0}});
        sim.run_all();
        CHECK(in_flight->has_failure());
        CHECK(b.metrics().calls == 0);
        CHECK(b.metrics().consecutive_failures == 1); // the run counts it all the same
    }
    SECTION("no sample any more, then one again: fresh") {
        b.reconfigure({.failure_threshold = 10});
        CHECK(b.metrics().calls == 0);
        CHECK(sim.run(b.execute_outcome(ok_after{&sim})).has_value());
        b.reconfigure({.sampling = breaker_sampling{.calls = 4, .failure_ratio = 0.5}});
        CHECK(b.metrics().calls == 0);
    }
}

TEST_CASE("reconfigure: a breaker call in flight is classified, timed and named under the options it "
          "started with",
          "[reconfigure][circuit_breaker]") {
    simulation sim;
    const rs::classifier only_runtime_errors = [](const rs::failure& f) {
        return f.is<std::runtime_error>();
    };
    breaker b{{.name = "old", .failure_threshold = 1, .break_duration = 10s}, sim.clock()};
    std::optional<rs::outcome<int>> first, second;
    sim.spawn(
        keep(b.execute_outcome(fail_after<std::logic_error>{&sim, 1s}), first)); // handled when it starts
    sim.run_for(500ms);
    b.reconfigure(
        {.name = "new", .failure_threshold = 1, .break_duration = 10s, .should_handle = only_runtime_errors});
    sim.spawn(keep(b.execute_outcome(fail_after<std::logic_error>{&sim}), second)); // declined by the new one
    sim.run_for(0s);
    REQUIRE(second);
    CHECK(second->error().is<std::logic_error>());
    CHECK(b.state() == circuit_state::closed);
    sim.run_until(1s);
    CHECK(first->error().is<std::logic_error>());
    CHECK(b.state() == circuit_state::open); // recorded as the old classifier said
    auto refused = sim.run(b.execute_outcome(ok_after{&sim}));
    REQUIRE(refused.has_failure());
    CHECK(refused.error().as<rs::error>()->policy_name() == "new");
    CHECK(retry_after(refused) == 10s);
}

TEST_CASE("reconfigure: a call's slowness is judged by its own options, and state changes are told to "
          "the options in force",
          "[reconfigure][circuit_breaker]") {
    simulation sim;
    using rs::breaker_sampling;
    std::vector<std::string> told;
    auto to = [&](std::string who) {
        return [&told, who](const rs::state_change_event& e) {
            told.push_back(who + ":" + rs::to_string(e.to()) + ":" + std::string(e.policy_name()));
        };
    };
    const auto slow_rule =
        breaker_sampling{.calls = 1, .failure_ratio = 1.0, .slow_call_duration = 1s, .slow_call_ratio = 1.0};
    breaker b{{.name = "a", .sampling = slow_rule, .on_state_change = to("a")}, sim.clock()};
    std::optional<rs::outcome<int>> call;
    sim.spawn(keep(b.execute_outcome(ok_after{&sim, 1500ms}), call));
    sim.run_for(500ms);
    // The same sample (same window, same slow duration); only the name and the callback change.
    b.reconfigure({.name = "b", .sampling = slow_rule, .on_state_change = to("b")});
    sim.run_all();
    CHECK(call->has_value());
    CHECK(b.state() == circuit_state::open); // slow by its own options, 1 of 1
    CHECK(told == std::vector<std::string>{"b:open:b"});
}

TEST_CASE("reconfigure: bad breaker options are refused as at construction, the old ones in force",
          "[reconfigure][circuit_breaker]") {
    simulation sim;
    breaker b{{.name = "db", .failure_threshold = 2, .break_duration = 5s}, sim.clock()};
    CHECK(invalid_argument_message([&] { b.reconfigure({.name = "db", .failure_threshold = 0}); }) ==
          "resilience::circuit_breaker (db): failure_threshold must be positive, got 0");
    CHECK(invalid_argument_message([&] {
              b.reconfigure({.sampling = rs::breaker_sampling{
                                 .calls = 10, .minimum_throughput = 11, .failure_ratio = 0.5}});
          }) == "resilience::circuit_breaker: sampling.minimum_throughput must not exceed sampling.calls "
                "(10), got 11");
    CHECK(b.options().failure_threshold == 2);
    CHECK(b.options().break_duration == 5s);
    CHECK(sim.run(b.execute_outcome(fail_after<>{&sim})).has_failure());
    CHECK(b.state() == circuit_state::closed);
    CHECK(sim.run(b.execute_outcome(fail_after<>{&sim})).has_failure()); // two in a row: the old rule
    CHECK(retry_after(sim.run(b.execute_outcome(ok_after{&sim}))) == 5s);
}

TEST_CASE("reconfigure: a breaker's options() shows the new options, and a copy taken before keeps the old",
          "[reconfigure][circuit_breaker]") {
    simulation sim;
    breaker b{{.name = "first"}, sim.clock()};
    const rs::circuit_breaker_options first = b.options();
    REQUIRE(first.sampling); // Polly's default trip, filled in
    b.reconfigure({.name = "second"});
    CHECK(first.name == "first");
    CHECK(b.options().name == "second");
    CHECK(b.name() == "second");
    CHECK(b.options().sampling->window == 30s); // the default trip again
    CHECK(b.metrics().name == "second");
    const breaker copy = b;
    CHECK(copy.options().name == "second"); // every copy is the same breaker
}

// ---------------------------------------------------------------------------------------------------------
// The breaker against a model, reconfigured between calls made one after another.

namespace {

struct model_step {
    rm::breaker_call call;
    std::optional<rm::breaker_setup> reconfigure; // before the call, once its gap has passed
};

rs::circuit_breaker_options options_of(const rm::breaker_setup& s) {
    rs::circuit_breaker_options o;
    if (s.threshold > 0)
        o.failure_threshold = s.threshold;
    o.break_duration = std::chrono::nanoseconds{s.break_duration};
    o.break_duration_growth = s.growth;
    if (s.max_break)
        o.max_break_duration = std::chrono::nanoseconds{*s.max_break};
    o.probes = s.probes;
    if (s.window)
        o.sampling = rs::breaker_sampling{.calls = *s.window->size,
                                          .minimum_throughput = s.window->minimum_throughput,
                                          .failure_ratio = s.window->failure_ratio};
    return o;
}

std::string describe(const rm::breaker_setup& s) {
    std::ostringstream out;
    out << "{threshold " << s.threshold << ", break " << s.break_duration << ", growth " << s.growth
        << ", probes " << s.probes;
    if (s.window)
        out << ", window " << *s.window->size << " min " << s.window->minimum_throughput << " ratio "
            << *s.window->failure_ratio;
    return out.str() + "}";
}

rm::breaker_setup pick_setup(rm::chooser& pick) {
    rm::breaker_setup s;
    s.threshold = static_cast<int>(pick.between(0, 4));
    s.break_duration = pick.between(1, 50);
    s.growth = pick.coin(50) ? 1.0 : 2.0;
    if (pick.coin(30))
        s.max_break = s.break_duration * pick.between(1, 4);
    s.probes = static_cast<int>(pick.between(1, 3));
    if (s.threshold == 0 || pick.coin(50)) {
        rm::breaker_window_setup w;
        w.size = static_cast<int>(pick.between(1, 3)); // few sizes, so a change often keeps the window
        w.minimum_throughput = static_cast<int>(pick.between(1, *w.size));
        w.failure_ratio = static_cast<double>(pick.between(1, 4)) / 4.0;
        s.window = w;
    }
    return s;
}

// The model of tests/models.hpp, with options replaced between calls: the state carries over (open
// until its scheduled end, the run, the openings in a row, the probes passed), the next break and the
// rules follow the new options, and the window of recorded calls is kept when its size is the same.
std::vector<rm::event> model_reconfigured(rm::breaker_setup b, const std::vector<model_step>& steps) {
    std::vector<rm::event> out;
    enum { closed, open, half_open } state = closed;
    int run = 0, opens = 0, probes_passed = 0;
    rm::ns open_until = 0, now = 0;
    std::vector<rm::model_recorded_call> recorded;
    const auto name = [&](rm::ns t) -> std::string {
        if (state == open && t >= open_until)
            return "half_open";
        return state == closed ? "closed" : state == open ? "open" : "half_open";
    };
    const auto open_at = [&](rm::ns t) {
        ++opens;
        state = open;
        open_until = t + rm::model_break_for(b, opens);
        probes_passed = 0;
    };
    const auto window_opens = [&](rm::ns t) {
        if (!b.window)
            return false;
        const auto held = rm::model_window_calls(*b.window, recorded, t);
        if (static_cast<int>(held.size()) < b.window->minimum_throughput)
            return false;
        const auto failures = std::count_if(held.begin(), held.end(), [](const auto& r) { return r.failed; });
        return failures > 0 &&
               static_cast<double>(failures) / static_cast<double>(held.size()) >= *b.window->failure_ratio;
    };
    for (std::size_t i = 0; i < steps.size(); ++i) {
        const rm::breaker_call& c = steps[i].call;
        const int id = static_cast<int>(i);
        now += c.gap;
        if (const auto& next = steps[i].reconfigure) {
            const bool same_window = b.window.has_value() == next->window.has_value() &&
                                     (!b.window || *b.window->size == *next->window->size);
            if (!same_window)
                recorded.clear();
            else if (b.window)
                recorded = rm::model_window_calls(*next->window, recorded, now); // the last `size` only
            b = *next;
            if (state == half_open && probes_passed >= b.probes) { // the new test is passed already
                state = closed;
                opens = 0;
                run = 0;
                recorded.clear();
            }
        }
        if (state == open && now >= open_until)
            state = half_open;
        if (state == open) {
            out.push_back({id, now, "circuit_open", open_until - now, "open"});
            continue;
        }
        out.push_back({id, now, "admitted", -1, name(now)});
        now += c.latency;
        if (state == closed) {
            run = c.fails ? run + 1 : 0;
            if (b.threshold > 0 && c.fails && run >= b.threshold) {
                open_at(now);
            } else if (b.window) {
                recorded.push_back({now, c.fails, false});
                if (window_opens(now))
                    open_at(now);
            }
        } else if (c.fails) {
            open_at(now);
        } else if (++probes_passed >= b.probes) {
            state = closed;
            opens = 0;
            run = 0;
            recorded.clear();
        }
        out.push_back({id, now, c.fails ? "failure" : "value", -1, name(now)});
    }
    return out;
}

std::vector<rm::event> run_reconfigured(simulation& sim, const breaker& b,
                                        const std::vector<model_step>& steps) {
    std::vector<rm::event> out;
    sim.run([&]() -> rs::task<void> {
        for (std::size_t i = 0; i < steps.size(); ++i) {
            const int id = static_cast<int>(i);
            const rm::breaker_call c = steps[i].call;
            if (c.gap > 0)
                co_await sim.sleep_for(std::chrono::nanoseconds{c.gap});
            if (steps[i].reconfigure)
                b.reconfigure(options_of(*steps[i].reconfigure));
            auto action = [&out, &sim, &b, id, c]() -> rs::task<int> {
                out.push_back({id, sim.now().count(), "admitted", -1, rm::state_name(b.state())});
                if (c.latency > 0)
                    co_await sim.sleep_for(std::chrono::nanoseconds{c.latency});
                if (c.fails)
                    throw std::runtime_error("scripted failure");
                co_return id;
            };
            const auto r = co_await b.execute_outcome(action);
            if (r.has_value())
                out.push_back({id, sim.now().count(), "value", -1, rm::state_name(b.state())});
            else if (auto* e = r.error().template as<rs::circuit_open_error>())
                out.push_back({id, sim.now().count(), "circuit_open", e->retry_after().count(), "open"});
            else
                out.push_back({id, sim.now().count(), "failure", -1, rm::state_name(b.state())});
        }
    }());
    return out;
}

rm::comparison check_reconfigured(rm::chooser& pick) {
    const rm::breaker_setup first = pick_setup(pick);
    std::vector<model_step> steps(static_cast<std::size_t>(pick.between(10, 60)));
    std::string setup = describe(first);
    for (std::size_t i = 0; i < steps.size(); ++i) {
        model_step& s = steps[i];
        s.call.gap = pick.coin(40) ? 0 : pick.between(1, 60);
        s.call.latency = pick.between(0, 5);
        s.call.fails = pick.coin(45);
        if (pick.coin(15)) {
            s.reconfigure = pick_setup(pick);
            setup += " then before call " + std::to_string(i) + " " + describe(*s.reconfigure);
        }
    }
    simulation sim;
    const breaker b{options_of(first), sim.clock()};
    return {std::move(setup), model_reconfigured(first, steps), run_reconfigured(sim, b, steps)};
}

} // namespace

TEST_CASE("reconfigure: a breaker reconfigured between calls behaves as its model, on seeded scenarios",
          "[reconfigure][circuit_breaker][model]") {
    const int n = rm::scenario_count(300);
    for (int i = 0; i < n; ++i) {
        const std::uint64_t seed = rm::scenario_seed(i);
        rm::chooser pick{seed};
        const rm::comparison c = check_reconfigured(pick);
        if (!c.agree()) {
            INFO("seed " << seed << ": " << c.setup);
            INFO("model:\n" << rm::to_string(c.expected) << "policy:\n" << rm::to_string(c.actual));
            FAIL("the breaker and its model disagree");
        }
    }
    SUCCEED(n << " scenarios agree");
}

// ---------------------------------------------------------------------------------------------------------
// Retry budget

TEST_CASE("reconfigure: a retry budget keeps its tokens, capped at a smaller capacity, and its counts",
          "[reconfigure][retry_budget]") {
    rs::retry_budget budget{{.ratio = 0.2, .capacity = 10}};
    for (int i = 0; i < 3; ++i)
        CHECK(budget.try_withdraw());
    budget.record_call();
    CHECK(budget.tokens() == Approx(7.2));
    budget.reconfigure({.ratio = 0.5, .capacity = 4});
    CHECK(budget.tokens() == 4.0);
    budget.reconfigure({.ratio = 0.5, .capacity = 8});
    CHECK(budget.tokens() == 4.0); // a larger capacity adds nothing: tokens are earned
    budget.record_call();
    CHECK(budget.tokens() == 4.5); // the new ratio
    CHECK(budget.calls() == 2);
    CHECK(budget.granted() == 3);
    CHECK(budget.options().capacity == 8);
    int granted = 0;
    while (budget.try_withdraw())
        ++granted;
    CHECK(granted == 4);
    CHECK(budget.denied() == 1);
}

TEST_CASE("reconfigure: bad retry budget options are refused, the old ones in force",
          "[reconfigure][retry_budget]") {
    rs::retry_budget budget{{.ratio = 0.5, .capacity = 2}};
    const rs::retry_budget_options before = budget.options();
    CHECK(invalid_argument_message([&] { budget.reconfigure({.ratio = 0}); }) ==
          "resilience::retry_budget: ratio must be in (0, 1], got 0");
    CHECK(invalid_argument_message([&] { budget.reconfigure({.capacity = 2e9}); }) ==
          "resilience::retry_budget: capacity must be at most 1e9, got 2e+09");
    CHECK((budget.options().ratio == before.ratio && budget.options().capacity == before.capacity));
    CHECK(budget.try_withdraw());
    CHECK(budget.try_withdraw());
    CHECK_FALSE(budget.try_withdraw());
    budget.record_call();
    budget.record_call();
    CHECK(budget.tokens() == 1.0); // two deposits of the old ratio
}

TEST_CASE("reconfigure: four threads deposit and withdraw while another lowers and raises the capacity: "
          "never more tokens than the capacity in force",
          "[reconfigure][retry_budget][concurrency]") {
    rs::retry_budget budget{{.ratio = 1.0, .capacity = 10}};
    constexpr int threads = 4, rounds = 20'000, changes = 2'000;
    std::atomic<bool> done{false};
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t)
        workers.emplace_back([&, t] {
            for (int i = 0; i < rounds; ++i) {
                budget.record_call();
                if ((i + t) % 3 == 0)
                    (void)budget.try_withdraw();
            }
        });
    std::thread changer([&] {
        for (int i = 0; i < changes; ++i)
            budget.reconfigure({.ratio = 1.0, .capacity = i % 2 == 0 ? 2.0 : 10.0});
        budget.reconfigure({.ratio = 1.0, .capacity = 2});
        done = true;
    });
    for (auto& w : workers)
        w.join();
    changer.join();
    CHECK(done.load());
    int granted = 0;
    while (budget.try_withdraw())
        ++granted;
    CHECK(granted <= 2);
    CHECK(budget.calls() == threads * rounds);
}

// ---------------------------------------------------------------------------------------------------------
// Adaptive throttle

namespace {

// Draws 0 every time: a call meeting a probability above 0 is refused, one meeting 0 is not.
struct draws_zero {
    using result_type = std::uint64_t;
    static constexpr result_type min() noexcept { return 0; }
    static constexpr result_type max() noexcept { return std::numeric_limits<result_type>::max(); }
    result_type operator()() noexcept { return 0; }
};
using throttle = rs::adaptive_throttle<vclock, draws_zero>;

bool throttled(const rs::outcome<int>& r) {
    return r.has_failure() && r.error().code() == rs::errc::throttled;
}

} // namespace

TEST_CASE("reconfigure: a throttle judges the next call by the new k, over the same window",
          "[reconfigure][adaptive_throttle]") {
    simulation sim;
    throttle t{{.name = "api", .k = 2.0, .window = 1min, .segments = 6}, sim.clock()};
    CHECK(sim.run(t.execute_outcome(ok_after{&sim})).has_value());       // 1 request, 1 accept
    CHECK(sim.run(t.execute_outcome(fail_after<>{&sim})).has_failure()); // p 0
    CHECK(sim.run(t.execute_outcome(fail_after<>{&sim})).has_failure()); // p 0: 2 - 2 * 1
    CHECK(throttled(sim.run(t.execute_outcome(ok_after{&sim}))));        // p (3 - 2) / 4
    CHECK(t.requests() == 4);
    t.reconfigure({.name = "api2", .k = 4.0, .window = 1min, .segments = 6});
    CHECK(t.requests() == 4); // kept
    CHECK(t.accepts() == 1);
    CHECK(t.probability() == 0.0); // (4 - 4 * 1) / 5
    CHECK(sim.run(t.execute_outcome(ok_after{&sim})).has_value());
    t.reconfigure({.name = "api3", .k = 1.0, .window = 1min, .segments = 6});
    auto refused = sim.run(t.execute_outcome(ok_after{&sim})); // (5 - 2) / 6
    REQUIRE(throttled(refused));
    CHECK(refused.error().as<rs::error>()->policy_name() == "api3");
}

TEST_CASE("reconfigure: a throttle whose window changes starts an empty one, which the calls admitted "
          "before do not enter",
          "[reconfigure][adaptive_throttle]") {
    simulation sim;
    throttle t{{.k = 2.0, .window = 1min, .segments = 6}, sim.clock()};
    CHECK(sim.run(t.execute_outcome(ok_after{&sim})).has_value());
    std::optional<rs::outcome<int>> in_flight;
    sim.spawn(keep(t.execute_outcome(ok_after{&sim, 1s}), in_flight));
    sim.run_for(500ms);
    CHECK(t.requests() == 2);
    t.reconfigure({.k = 2.0, .window = 2min, .segments = 6});
    CHECK(t.requests() == 0);
    CHECK(t.probability() == 0.0);
    sim.run_all();
    CHECK(in_flight->has_value());
    CHECK(t.accepts() == 0); // counted in the window dropped
    CHECK(sim.run(t.execute_outcome(ok_after{&sim})).has_value());
    CHECK(t.requests() == 1);
    CHECK(t.accepts() == 1);
}

TEST_CASE("reconfigure: a throttle call in flight is classified by the options it started with",
          "[reconfigure][adaptive_throttle]") {
    simulation sim;
    const rs::classifier only_runtime_errors = [](const rs::failure& f) {
        return f.is<std::runtime_error>();
    };
    throttle t{{.k = 2.0, .window = 1min, .segments = 6}, sim.clock()};
    CHECK(sim.run(t.execute_outcome(ok_after{&sim})).has_value()); // 1 request, 1 accept
    std::optional<rs::outcome<int>> in_flight;
    sim.spawn(keep(t.execute_outcome(fail_after<std::logic_error>{&sim, 1s}), in_flight));
    sim.run_for(500ms);
    t.reconfigure({.k = 2.0, .window = 1min, .segments = 6, .should_handle = only_runtime_errors});
    sim.run_all();
    CHECK(in_flight->error().is<std::logic_error>());
    CHECK(t.accepts() == 1); // not accepted by the classifier it started with
    CHECK(sim.run(t.execute_outcome(fail_after<std::logic_error>{&sim})).has_failure()); // p (2 - 2) / 3
    CHECK(t.accepts() == 2); // the new one declines it: an accept
}

TEST_CASE("reconfigure: bad throttle options are refused, the old ones in force",
          "[reconfigure][adaptive_throttle]") {
    simulation sim;
    throttle t{{.name = "api", .k = 2.0, .window = 1min, .segments = 6}, sim.clock()};
    CHECK(invalid_argument_message([&] { t.reconfigure({.name = "api", .k = 0}); }) ==
          "resilience::adaptive_throttle (api): k must be positive and finite, got 0");
    CHECK(invalid_argument_message([&] { t.reconfigure({.window = 1min, .segments = 0}); }) ==
          "resilience::adaptive_throttle: segments must be positive, got 0");
    CHECK(t.options().k == 2.0);
    CHECK(sim.run(t.execute_outcome(ok_after{&sim})).has_value());
    CHECK(sim.run(t.execute_outcome(fail_after<>{&sim})).has_failure());
    CHECK(sim.run(t.execute_outcome(fail_after<>{&sim})).has_failure());
    CHECK(throttled(sim.run(t.execute_outcome(ok_after{&sim})))); // k 2: (3 - 2) / 4
}

// ---------------------------------------------------------------------------------------------------------
// Registry entries

TEST_CASE("reconfigure: a registry entry is reconfigured in place, seen by every handle handed out",
          "[reconfigure][registry]") {
    simulation sim;
    rs::registry<vclock> policies{{}, sim.clock()};
    const auto handed_out = policies.breaker("payments", {.failure_threshold = 5});
    CHECK(policies.reconfigure("payments", rs::circuit_breaker_options{.failure_threshold = 1}));
    CHECK(handed_out.options().failure_threshold == 1);
    CHECK(handed_out.name() == "payments"); // the registry name, as when it was made
    CHECK(sim.run(handed_out.execute_outcome(fail_after<>{&sim})).has_failure());
    CHECK(policies.breaker("payments").state() == circuit_state::open);
    CHECK(policies.breaker("payments") == handed_out);

    const auto budget = policies.retry_budget("retries", {.ratio = 0.5, .capacity = 10});
    CHECK(policies.reconfigure("retries", rs::retry_budget_options{.ratio = 0.5, .capacity = 3}));
    CHECK(budget.tokens() == 3.0);

    const auto pool = policies.bulkhead("db", {.max_concurrent_calls = 8});
    CHECK(policies.reconfigure("db", rs::bulkhead_options{.max_concurrent_calls = 2}));
    CHECK(pool.limit() == 2);

    const auto api = policies.rate_limiter("api", {.token_limit = 10, .tokens_per_second = 1});
    CHECK(policies.reconfigure("api", rs::rate_limiter_options{.token_limit = 4, .tokens_per_second = 1}));
    CHECK(api.tokens() == 4.0);
}

TEST_CASE("reconfigure: a registry entry's callbacks run by its reconfiguration may use the registry",
          "[reconfigure][registry]") {
    simulation sim;
    rs::registry<vclock> policies{{}, sim.clock()};
    const auto b = policies.breaker("payments", {.failure_threshold = 1, .break_duration = 1s, .probes = 2});
    CHECK(sim.run(b.execute_outcome(fail_after<>{&sim})).has_failure());
    sim.run_until(1s);
    CHECK(sim.run(b.execute_outcome(ok_after{&sim, 1s})).has_value()); // one probe of two passed
    REQUIRE(b.state() == circuit_state::half_open);
    std::size_t entries_seen = 0;
    // One probe is enough now: the reconfiguration closes the circuit, and the callback it runs looks at
    // the registry (whose lock the reconfiguration must not hold then).
    CHECK(policies.reconfigure(
        "payments", rs::circuit_breaker_options{.failure_threshold = 1,
                                                .break_duration = 1s,
                                                .probes = 1,
                                                .on_state_change = [&](const rs::state_change_event&) {
                                                    entries_seen = policies.snapshot().size();
                                                }}));
    CHECK(b.state() == circuit_state::closed);
    CHECK(entries_seen == 1);
}

TEST_CASE("reconfigure: a registry entry that does not exist yet is made from the options, which rule later "
          "lookups",
          "[reconfigure][registry]") {
    simulation sim;
    rs::registry<vclock> policies{{}, sim.clock()};
    CHECK_FALSE(policies.reconfigure("payments", rs::circuit_breaker_options{.failure_threshold = 2}));
    CHECK(policies.breaker("payments", {.failure_threshold = 9}).options().failure_threshold == 2);
    CHECK_FALSE(policies.reconfigure("payments", "eu", rs::circuit_breaker_options{.failure_threshold = 3}));
    CHECK(policies.breaker("payments", "eu", {}).options().failure_threshold == 3);
    CHECK(policies.breaker("payments", "eu", {}).name() == "payments/eu");
    CHECK(policies.reconfigure("payments", "eu", rs::circuit_breaker_options{.failure_threshold = 4}));
    CHECK(policies.breaker("payments", "eu", {}).options().failure_threshold == 4);
    CHECK(policies.breaker("payments", "us", {.failure_threshold = 7}).options().failure_threshold == 7);
    CHECK(policies.snapshot().size() == 3);
}

TEST_CASE("reconfigure: bad options for a registry entry are refused and change nothing",
          "[reconfigure][registry]") {
    simulation sim;
    rs::registry<vclock> policies{{}, sim.clock()};
    const auto b = policies.breaker("payments", {.failure_threshold = 2});
    CHECK(invalid_argument_message([&] {
              policies.reconfigure("payments", rs::circuit_breaker_options{.failure_threshold = -1});
          }) == "resilience::circuit_breaker (payments): failure_threshold must be positive, got -1");
    CHECK(invalid_argument_message([&] {
              policies.reconfigure("fresh", rs::circuit_breaker_options{.probes = 0});
          }) == "resilience::circuit_breaker (fresh): probes must be at least 1, got 0");
    CHECK(b.options().failure_threshold == 2);
    CHECK(policies.snapshot().size() == 1); // "fresh" was not registered
}

// ---------------------------------------------------------------------------------------------------------
// Threads

TEST_CASE("reconfigure: four threads call a breaker while another reconfigures it, without a race",
          "[reconfigure][circuit_breaker][concurrency]") {
    // Successes and failures alternate on each thread, so no rule below can open the circuit, whichever
    // options a call is classified under and whichever its result is recorded under: at most four
    // failures are recorded in a row, and every sample holds about as many successes as failures.
    const rs::classifier never = [](const rs::failure&) { return false; };
    const rs::circuit_breaker_options shapes[] = {
        {.name = "run", .failure_threshold = 1'000'000},
        {.name = "count", .sampling = rs::breaker_sampling{.calls = 100, .failure_ratio = 0.9}},
        {.name = "slow",
         .sampling =
             rs::breaker_sampling{
                 .calls = 100, .failure_ratio = 0.9, .slow_call_duration = 1h, .slow_call_ratio = 1.0}},
        {.name = "declines", .failure_threshold = 1'000'000, .should_handle = never},
    };
    rs::circuit_breaker<> b{shapes[0]};
    constexpr int threads = 4, calls = 4'000;
    std::atomic<int> values{0}, failures{0}, refused{0};
    std::atomic<bool> calling{true};
    std::thread changer([&] {
        for (int i = 1; calling.load(); ++i)
            b.reconfigure(shapes[i % 4]);
    });
    std::vector<std::thread> callers;
    for (int t = 0; t < threads; ++t)
        callers.emplace_back([&] {
            for (int i = 0; i < calls; ++i) {
                const bool fail = i % 2 == 1;
                auto r = rs::sync_wait(b.execute_outcome([fail]() -> rs::task<int> {
                    if (fail)
                        throw std::runtime_error("scripted failure");
                    co_return 1;
                }));
                // Not the failure's contents: an exception shared with the breaker (as the cause of an
                // opening) is freed by whichever thread drops it last, through a count ThreadSanitizer
                // does not see (libstdc++'s exception_ptr). A refusal of a success shows as a failure.
                if (r.has_value())
                    ++values;
                else if (fail)
                    ++failures;
                else
                    ++refused;
                (void)b.options().name.size();
            }
        });
    for (auto& c : callers)
        c.join();
    calling = false;
    changer.join();
    CHECK(values.load() == threads * calls / 2);
    CHECK(failures.load() == threads * calls / 2);
    CHECK(refused.load() == 0);
    CHECK(b.state() == circuit_state::closed);
}

} // namespace test_reconfigure
