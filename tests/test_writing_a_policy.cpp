// SPDX-License-Identifier: MIT
// The policies that docs/writing_a_policy.md builds (examples/policy_kit/), tested on virtual time, and
// the page itself: every ```cpp block in it is a verbatim excerpt of those files or of this one.
#include "catch.hpp"
#include "support.hpp"

#include "../examples/policy_kit/in_flight_gauge.hpp"
#include "../examples/policy_kit/priority_shedder.hpp"

#include <resilience/pipeline.hpp>
#include <resilience/policy_kit.hpp>
#include <resilience/registry.hpp>
#include <resilience/retry.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace test_writing_a_policy {

namespace rs = resilience;
using namespace std::chrono_literals;
using example::priority;
using rs::testing::script;
using rs::testing::scripted_action;
using shedder = example::priority_shedder<rs::testing::virtual_clock>;

static_assert(rs::policy<shedder>);
static_assert(rs::policy<example::in_flight_gauge>);
static_assert(rs::kit::fast_policy<shedder> && rs::kit::enter_may_wait<shedder>); // so it has a `run`
static_assert(rs::kit::fast_policy<example::in_flight_gauge> &&
              !rs::kit::enter_may_wait<example::in_flight_gauge>);

namespace {

/// How one call ended, and when.
struct ended {
    std::optional<rs::outcome<int>> result;
    std::chrono::nanoseconds at{-1};
};

/// One call through `p` of an action that takes `latency` (and stops when asked), recorded in `out`.
template <class P>
rs::task<void> call_through(rs::testing::simulation& sim, P p, std::chrono::nanoseconds latency, ended& out,
                            rs::stop_token stop = {}) {
    scripted_action action{sim.clock(), script<int>{.latency = latency, .value = 1}};
    out.result.emplace(co_await p.execute_outcome(action, stop));
    out.at = sim.now();
}

rs::task<void> stop_after(rs::testing::simulation& sim, std::chrono::nanoseconds d, rs::stop_source& stop) {
    co_await sim.sleep_for(d);
    stop.request_stop();
}

const example::shed_error* shed(const ended& e) {
    return e.result && e.result->has_failure() ? e.result->error().as<example::shed_error>() : nullptr;
}

/// The events a listener heard: kind, duration, instant, reason.
struct heard {
    rs::telemetry_kind kind;
    std::chrono::nanoseconds duration, at;
    rs::rejection_reason reason;
    bool has_error;
};

} // namespace

TEST_CASE("priority_shedder: a sheddable call is shed on arrival when only reserved slots are free",
          "[writing_a_policy]") {
    rs::testing::simulation sim;
    shedder sheddable{{.name = "db", .capacity = 3, .reserved = 1}, sim.clock()};
    shedder critical = sheddable.with_priority(priority::critical);
    ended a, b, c, d;
    sim.spawn(call_through(sim, sheddable, 2s, a));
    sim.spawn(call_through(sim, sheddable, 2s, b));
    sim.spawn(call_through(sim, sheddable, 2s, c)); // two of three taken: the last is reserved
    sim.spawn(call_through(sim, critical, 2s, d));  // takes it
    sim.run_for(1s);
    CHECK(sheddable.in_flight() == 3);
    REQUIRE(shed(c) != nullptr);
    CHECK(c.at == 0s);
    CHECK(shed(c)->reason() == rs::rejection_reason::no_capacity);
    CHECK(shed(c)->call_priority() == priority::sheddable);
    CHECK(std::string(shed(c)->what()) == "priority_shedder (db): sheddable call shed (no_capacity)");
    sim.run_all();
    CHECK((a.at == 2s && b.at == 2s && d.at == 2s));
    CHECK((a.result->has_value() && d.result->has_value()));
    CHECK(sheddable.in_flight() == 0);
}

TEST_CASE("priority_shedder: a critical call waits for the first slot given back and runs from that instant",
          "[writing_a_policy]") {
    rs::testing::simulation sim;
    std::vector<heard> events;
    shedder s{{.capacity = 1,
               .reserved = 0,
               .max_wait = 5s,
               .telemetry =
                   [&](const rs::telemetry_event& e) {
                       events.push_back({e.kind, e.duration, e.at, e.reason, e.error != nullptr});
                   }},
              sim.clock()};
    ended a, b, c;
    sim.spawn(call_through(sim, s, 2s, a));
    sim.spawn(call_through(sim, s.with_priority(priority::critical), 1s, b));
    sim.spawn(call_through(sim, s.with_priority(priority::critical), 1s, c));
    sim.run_for(1s);
    CHECK(s.queued() == 2);
    sim.run_all();
    CHECK(a.at == 2s);
    CHECK(b.at == 3s); // admitted at 2s, in arrival order
    CHECK(c.at == 4s);
    CHECK((b.result->has_value() && c.result->has_value()));
    REQUIRE(events.size() == 2);
    CHECK(
        (events[0].kind == rs::telemetry_kind::queue_wait && events[0].duration == 2s && events[0].at == 2s));
    CHECK(
        (events[1].kind == rs::telemetry_kind::queue_wait && events[1].duration == 3s && events[1].at == 3s));
    CHECK((s.in_flight() == 0 && s.queued() == 0));
}

TEST_CASE("priority_shedder: a critical call that waits max_wait in vain is shed at that instant",
          "[writing_a_policy]") {
    rs::testing::simulation sim;
    std::vector<heard> events;
    std::vector<rs::rejection_reason> told; // on_rejected: why each call was shed
    shedder s{{.name = "db",
               .capacity = 1,
               .reserved = 0,
               .max_wait = 500ms,
               .on_rejected = [&](const rs::rejection_event& e) { told.push_back(e.reason()); },
               .telemetry =
                   [&](const rs::telemetry_event& e) {
                       events.push_back({e.kind, e.duration, e.at, e.reason, e.error != nullptr});
                   }},
              sim.clock()};
    ended a, b;
    sim.spawn(call_through(sim, s, 2s, a));
    sim.spawn(call_through(sim, s.with_priority(priority::critical), 1s, b));
    sim.run_all();
    REQUIRE(shed(b) != nullptr);
    CHECK(b.at == 500ms);
    CHECK(shed(b)->reason() == rs::rejection_reason::queue_timeout);
    CHECK(told == std::vector<rs::rejection_reason>{rs::rejection_reason::queue_timeout});
    REQUIRE(events.size() == 1);
    CHECK(events[0].kind == rs::telemetry_kind::rejection);
    CHECK((events[0].duration == 500ms && events[0].at == 500ms && events[0].has_error));
    CHECK(events[0].reason == rs::rejection_reason::queue_timeout);
    CHECK(a.at == 2s);
    CHECK((s.in_flight() == 0 && s.queued() == 0));
}

TEST_CASE("priority_shedder: a caller that stops while waiting is cancelled at that instant",
          "[writing_a_policy]") {
    rs::testing::simulation sim;
    shedder s{{.capacity = 1, .reserved = 0, .max_wait = 5s}, sim.clock()};
    rs::stop_source stop;
    ended a, b;
    sim.spawn(call_through(sim, s, 2s, a));
    sim.spawn(call_through(sim, s.with_priority(priority::critical), 1s, b, stop.get_token()));
    sim.spawn(stop_after(sim, 300ms, stop));
    sim.run_for(1s);
    REQUIRE(b.result);
    CHECK(b.at == 300ms);
    CHECK(b.result->error().code() == rs::errc::cancelled);
    CHECK(s.queued() == 0);
    sim.run_all();
    CHECK(a.at == 2s);
    CHECK(s.in_flight() == 0);

    // Stopped before it arrives: refused in `enter`, the action never runs.
    {
        rs::stop_source stopped;
        stopped.request_stop();
        scripted_action action{sim.clock(), script<int>{.value = 1}};
        const rs::outcome<int> r = sim.run(s.execute_outcome(action, stopped.get_token()));
        CHECK(r.error().code() == rs::errc::cancelled);
        CHECK(action.calls() == 0);
    }
}

TEST_CASE("priority_shedder: a callback or listener that throws ends the call with its exception",
          "[writing_a_policy]") {
    rs::testing::simulation sim;
    SECTION("on_rejected: the call fails with it, and the listener hears nothing") {
        int heard_events = 0;
        shedder s{
            {.capacity = 1,
             .reserved = 0,
             .on_rejected = [](const rs::rejection_event&) { throw std::domain_error("from on_rejected"); },
             .telemetry = [&](const rs::telemetry_event&) { ++heard_events; }},
            sim.clock()};
        ended a, b;
        sim.spawn(call_through(sim, s, 1s, a));
        sim.spawn(call_through(sim, s, 1s, b));
        sim.run_all();
        REQUIRE(b.result->has_failure());
        CHECK(b.result->error().is<std::domain_error>());
        CHECK(heard_events == 0);
        CHECK(s.in_flight() == 0);
    }
    SECTION("the listener, when a waiting call is admitted: the call fails with it, the slot goes back") {
        shedder s{{.capacity = 1,
                   .reserved = 0,
                   .max_wait = 5s,
                   .telemetry =
                       [](const rs::telemetry_event& e) {
                           if (e.kind == rs::telemetry_kind::queue_wait)
                               throw std::domain_error("from the listener");
                       }},
                  sim.clock()};
        ended a, b;
        sim.spawn(call_through(sim, s, 2s, a));
        sim.spawn(call_through(sim, s.with_priority(priority::critical), 1s, b));
        sim.run_all();
        CHECK(b.at == 2s);
        CHECK(b.result->error().is<std::domain_error>());
        CHECK(s.in_flight() == 0);
    }
}

TEST_CASE("priority_shedder: a retry around it retries a shed call unless its classifier says no",
          "[writing_a_policy]") {
    rs::testing::simulation sim;
    const rs::failure refusal = rs::failure::make(example::shed_error{"db", priority::sheddable, {}});
    CHECK(refusal.code() == rs::errc{}); // not one of the library's codes
    CHECK(rs::is_transient(refusal));    // so the default classifier retries it

    int shed_calls = 0;
    shedder s{
        {.capacity = 1, .reserved = 0, .on_rejected = [&](const rs::rejection_event&) { ++shed_calls; }},
        sim.clock()};
    ended holder;
    sim.spawn(call_through(sim, s, 10s, holder)); // holds the one slot

    ended by_default, told_not_to;
    rs::retry retry_all{{.max_attempts = 3, .backoff = rs::constant_backoff{100ms, rs::jitter::none}},
                        sim.clock()};
    sim.spawn(call_through(sim, rs::pipeline{retry_all, s}, 1s, by_default));
    sim.run_for(1s);
    CHECK(shed_calls == 3);
    CHECK(by_default.at == 200ms);

    shed_calls = 0;
    rs::retry retry_others{
        {.max_attempts = 3,
         .backoff = rs::constant_backoff{100ms, rs::jitter::none},
         .should_handle =
             [](const rs::failure& f) { return !f.is<example::shed_error>() && rs::is_transient(f); }},
        sim.clock()};
    sim.spawn(call_through(sim, rs::pipeline{retry_others, s}, 1s, told_not_to));
    sim.run_for(1s);
    CHECK(shed_calls == 1);
    CHECK(shed(told_not_to) != nullptr);
    sim.run_all();
}

TEST_CASE("priority_shedder: a call's frame destroyed with its loop gives back its slot and its queue place",
          "[writing_a_policy]") {
    std::optional<shedder> s;
    ended a, b;
    {
        rs::testing::simulation sim;
        s.emplace(example::priority_shedder_options{.capacity = 1, .reserved = 0, .max_wait = 1h},
                  sim.clock());
        sim.spawn(call_through(sim, *s, 10s, a));
        sim.spawn(call_through(sim, s->with_priority(priority::critical), 1s, b));
        sim.run_for(1s);
        CHECK((s->in_flight() == 1 && s->queued() == 1));
    } // the loop destroys both calls, neither resumed
    CHECK(!a.result);
    CHECK(!b.result);
    CHECK(s->in_flight() == 0);
    CHECK(s->queued() == 0);
}

TEST_CASE("priority_shedder: validation names the field and the value", "[writing_a_policy]") {
    using resilience_tests::invalid_argument_message;
    CHECK(invalid_argument_message([] {
              example::priority_shedder{{.name = "db", .capacity = 0, .reserved = 0}};
          }) == "priority_shedder (db): capacity must be at least 1, got 0");
    CHECK(invalid_argument_message([] { example::priority_shedder{{.capacity = 4, .reserved = 4}}; }) ==
          "priority_shedder: reserved must be less than capacity (4), got 4");
    CHECK(invalid_argument_message([] { example::priority_shedder{{.max_wait = -1ns}}; }) ==
          "priority_shedder: max_wait must not be negative, got -1ns");
}

// A registry of your own handles: `keyed_registry` takes any copyable handle; `Idle` says which entries it
// may forget (the default: any).
struct shedder_idle {
    bool operator()(const example::priority_shedder<>& s) const {
        return s.in_flight() == 0 && s.queued() == 0;
    }
};

TEST_CASE("priority_shedder: one per tenant, from a keyed_registry", "[writing_a_policy]") {
    rs::keyed_registry<example::priority_shedder<>, std::string, std::hash<std::string>,
                       std::equal_to<std::string>, shedder_idle>
        per_tenant{100, [](const std::string& tenant) {
                       return example::priority_shedder<>{{.name = tenant, .capacity = 8, .reserved = 2}};
                   }};
    const example::priority_shedder<> first = per_tenant.get("acme");
    CHECK(per_tenant.get("acme").options().capacity == 8);
    CHECK(&per_tenant.get("acme").options() == &first.options()); // the same shared state
    CHECK(per_tenant.get("globex").name() == "globex");
}

TEST_CASE("in_flight_gauge: counts the calls inside it, in a pipeline's frame", "[writing_a_policy]") {
    rs::testing::simulation sim;
    example::in_flight_gauge gauge;
    rs::pipeline p{gauge, rs::timeout{5s, sim.clock()}};
    ended a, b, c;
    sim.spawn(call_through(sim, p, 1s, a));
    sim.spawn(call_through(sim, p, 2s, b));
    sim.spawn(call_through(sim, gauge, 3s, c)); // on its own too
    sim.run_for(1500ms);
    CHECK(gauge.in_flight() == 2);
    sim.run_all();
    CHECK(gauge.in_flight() == 0);
    CHECK(gauge.peak() == 3);
}

TEST_CASE("policy kit: the hooks behave as the library's own policies' do", "[writing_a_policy]") {
    rs::testing::simulation sim;
    SECTION("call_now outside a call reads the clock") {
        sim.run_for(3s);
        CHECK(rs::kit::call_now(sim.clock(), rs::context{}).time_since_epoch() == 3s);
        CHECK(rs::kit::after(sim.clock(), 2s).time_since_epoch() == 5s);
        CHECK(rs::kit::after(sim.clock(), std::chrono::nanoseconds::max()) ==
              rs::testing::virtual_clock::time_point::max());
    }
    SECTION("mismatch: empty for a classifier that can judge R, else the failure that names both types") {
        const rs::classifier longs = [](const rs::outcome<long>& o) { return !o; };
        CHECK(!rs::kit::mismatch<long>(longs, "priority_shedder", "db"));
        CHECK(!rs::kit::mismatch<int>(rs::classifier{}, "priority_shedder", "db"));
        const std::optional<rs::failure> bad = rs::kit::mismatch<int>(longs, "priority_shedder", "db");
        REQUIRE(bad);
        CHECK(bad->is<std::invalid_argument>());
    }
    SECTION("settled moves a refusal into the result and keeps the step; cancel names the policy") {
        std::optional<rs::outcome<int>> result;
        std::optional<rs::failure> refusal;
        CHECK(rs::kit::settled(rs::step::proceed, refusal, result) == rs::step::proceed);
        CHECK(!result);
        refusal.emplace(rs::failure::make(std::runtime_error("full")));
        CHECK(rs::kit::settled(rs::step::done, refusal, result) == rs::step::done);
        REQUIRE(result);
        CHECK(result->error().is<std::runtime_error>());
        std::optional<rs::outcome<int>> stopped;
        CHECK(rs::kit::cancel(stopped, "db") == rs::step::done);
        REQUIRE(stopped);
        REQUIRE(stopped->error().is<rs::cancelled_error>());
        CHECK(stopped->error().as<rs::cancelled_error>()->policy_name() == "db");
    }
    SECTION("invoke_callback returns what the callback threw, and skips an empty one") {
        const std::function<void(int)> empty;
        CHECK(!rs::kit::invoke_callback(empty, 1));
        const auto thrower = [](int) { throw std::domain_error("boom"); };
        const std::optional<rs::failure> thrown = rs::kit::invoke_callback(thrower, 1);
        REQUIRE(thrown);
        CHECK(thrown->is<std::domain_error>());
    }
    SECTION("refused reports the refusal and returns it, or what the listener threw") {
        std::vector<rs::telemetry_kind> kinds;
        const rs::telemetry_listener listener = [&](const rs::telemetry_event& e) {
            kinds.push_back(e.kind);
        };
        const rs::failure f = rs::kit::refused(&listener, sim.clock(),
                                               rs::kit::event(rs::telemetry_kind::rejection, "mine", "", 1),
                                               rs::failure::make(std::runtime_error("no")));
        CHECK(kinds == std::vector<rs::telemetry_kind>{rs::telemetry_kind::rejection});
        CHECK(f.is<std::runtime_error>());
        const rs::telemetry_listener throwing = [](const rs::telemetry_event&) {
            throw std::domain_error("x");
        };
        CHECK(rs::kit::refused(&throwing, sim.clock(),
                               rs::kit::event(rs::telemetry_kind::rejection, "mine", "", 1),
                               rs::failure::make(std::runtime_error("no")))
                  .is<std::domain_error>());
    }
}

// Every ```cpp block of docs/writing_a_policy.md must be a verbatim excerpt of the example headers or of
// this file: the page shows the code that is compiled and tested here.
TEST_CASE("writing_a_policy.md: every code block is an excerpt of compiled code", "[writing_a_policy]") {
    const std::filesystem::path root = std::filesystem::path(__FILE__).parent_path().parent_path();
    const auto read = [](const std::filesystem::path& p) {
        std::ifstream in(p);
        REQUIRE(in);
        std::ostringstream text;
        text << in.rdbuf();
        return text.str();
    };
    const std::string page = read(root / "docs" / "writing_a_policy.md");
    const std::string sources = read(root / "examples" / "policy_kit" / "priority_shedder.hpp") +
                                read(root / "examples" / "policy_kit" / "in_flight_gauge.hpp") +
                                read(root / "tests" / "test_writing_a_policy.cpp");
    int blocks = 0;
    for (std::size_t at = page.find("```cpp\n"); at != std::string::npos; at = page.find("```cpp\n", at)) {
        const std::size_t begin = at + 7;
        const std::size_t end = page.find("```", begin);
        REQUIRE(end != std::string::npos);
        const std::string block = page.substr(begin, end - begin);
        INFO("block " << blocks + 1 << ":\n" << block);
        CHECK(sources.find(block) != std::string::npos);
        ++blocks;
        at = end + 3;
    }
    CHECK(blocks >= 8);
}

} // namespace test_writing_a_policy
