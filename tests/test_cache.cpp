// SPDX-License-Identifier: MIT
// The cache on virtual time: fresh, stale and expired entries at exact instants, shared refreshes,
// stale-while-revalidate in the background and in the foreground, stale-if-error, negative caching,
// eviction, per-entry ttl from Cache-Control, the policy form, teardown and lifetimes, a hit without
// allocation, two loops on threads, reconfiguration (what carries over, bad options, calls in flight,
// four threads calling while another reconfigures), and the cache against its reference model
// (tests/cache_model.hpp), reconfigured in half the scenarios.
//
// A failing model scenario prints its seed; replay it alone with
//     RESILIENCE_MODEL_SEED=<seed> RESILIENCE_MODEL_SCENARIOS=1 resilience_tests "[model][cache]"

#include "alloc_counter.hpp"
#include "cache_model.hpp"
#include "catch.hpp"
#include "model_scenarios.hpp"
#include "support.hpp"

#include <resilience/cache.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/http.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/retry.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/telemetry.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace test_cache {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_tests::stop_at;
using resilience_tests::yield_now;
using rs::testing::simulation;
using std::chrono::nanoseconds;

namespace {

using quotes = rs::cache<std::string, int, rs::testing::virtual_clock>;

// A dependency: call n (1-based) takes `latency`, then returns n, or throws when n is in `failing`.
// Ends at once with cancelled_error when stopped. Copies share the counts.
class source {
public:
    explicit source(simulation& sim, nanoseconds latency = 100ms, std::set<int> failing = {})
        : state_(std::make_shared<state>(state{&sim, latency, std::move(failing), {}, 0})) {}

    rs::task<int> operator()(resilience::stop_token stop) const { return call(state_, std::move(stop)); }

    int calls() const { return static_cast<int>(state_->starts.size()); }
    const std::vector<nanoseconds>& starts() const { return state_->starts; }
    int stopped() const { return state_->stopped; }

private:
    struct state {
        simulation* sim;
        nanoseconds latency;
        std::set<int> failing;
        std::vector<nanoseconds> starts;
        int stopped;
    };
    static rs::task<int> call(std::shared_ptr<state> s, resilience::stop_token stop) {
        s->starts.push_back(s->sim->now());
        const int n = static_cast<int>(s->starts.size());
        co_await s->sim->sleep_for(s->latency, stop);
        if (stop.stop_requested()) {
            ++s->stopped;
            throw rs::cancelled_error{};
        }
        if (s->failing.contains(n))
            throw std::runtime_error("down " + std::to_string(n));
        co_return n;
    }
    std::shared_ptr<state> state_;
};

// What one caller saw, and when.
struct record {
    std::optional<int> value;
    std::exception_ptr error;
    nanoseconds at{-1};
    bool cancelled() const { return error && rs::is_cancellation(rs::failure{error}); }
    std::string what() const { return error ? rs::failure{error}.what() : "value"; }
};

template <class A>
rs::task<void> caller(simulation& sim, quotes c, std::string key, A act, record& out,
                      resilience::stop_token token = {}) {
    try {
        out.value = co_await c.run(std::move(key), act, std::move(token));
    } catch (...) {
        out.error = std::current_exception();
    }
    out.at = sim.now();
}

template <class P, class A>
rs::task<void> policy_caller(simulation& sim, P p, A act, record& out, resilience::stop_token token = {}) {
    try {
        out.value = co_await p.execute(act, std::move(token));
    } catch (...) {
        out.error = std::current_exception();
    }
    out.at = sim.now();
}

rs::task<void> after(simulation& sim, nanoseconds d, rs::task<void> then) {
    co_await sim.sleep_for(d);
    co_await std::move(then);
}

rs::task<void> at(simulation& sim, nanoseconds when, std::function<void()> f) {
    co_await sim.sleep_for(when - sim.now());
    f();
}

// What a listener heard.
struct heard {
    rs::telemetry_kind kind;
    std::string note;
    nanoseconds duration;
    nanoseconds at;
    bool error;
};
rs::telemetry_listener recorder(std::vector<heard>& out) {
    return [&out](const rs::telemetry_event& e) {
        CHECK(e.policy == "cache");
        out.push_back({e.kind, std::string(e.note), e.duration, e.at, e.error != nullptr});
    };
}

// Suspends for good: nothing ever resumes it, only the destruction of its loop ends it.
struct never {
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<>) const noexcept {}
    void await_resume() const noexcept {}
};

} // namespace

// ---------------------------------------------------------------------------------------------------------
// Fresh and expired

TEST_CASE("cache: a fresh entry answers without calling until its ttl ends, then one call refreshes it",
          "[cache]") {
    simulation sim;
    std::vector<heard> events;
    quotes c{{.name = "quotes", .ttl = 1s, .telemetry = recorder(events)}, sim.clock()};
    source s{sim};
    record r[5];
    sim.spawn(caller(sim, c, "ACME", s, r[0]));
    sim.spawn(after(sim, 500ms, caller(sim, c, "ACME", s, r[1])));
    sim.spawn(after(sim, 1099ms, caller(sim, c, "ACME", s, r[2])));
    sim.spawn(after(sim, 1100ms, caller(sim, c, "ACME", s, r[3]))); // stored at 100ms: expired at 1.1s
    sim.spawn(after(sim, 1250ms, caller(sim, c, "ACME", s, r[4])));
    sim.run_all();
    CHECK(s.calls() == 2);
    CHECK((r[0].value == 1 && r[0].at == 100ms));
    CHECK((r[1].value == 1 && r[1].at == 500ms));
    CHECK((r[2].value == 1 && r[2].at == 1099ms));
    CHECK((r[3].value == 2 && r[3].at == 1200ms));
    CHECK((r[4].value == 2 && r[4].at == 1250ms));
    REQUIRE(events.size() == 5);
    CHECK((events[0].kind == rs::telemetry_kind::cache_miss && events[0].at == 0ms));
    CHECK((events[1].kind == rs::telemetry_kind::cache_hit && events[1].at == 500ms && !events[1].error));
    CHECK((events[2].kind == rs::telemetry_kind::cache_hit && events[2].at == 1099ms));
    CHECK((events[3].kind == rs::telemetry_kind::cache_miss && events[3].at == 1100ms));
    CHECK((events[4].kind == rs::telemetry_kind::cache_hit && events[4].duration == 0ns));
    CHECK(c.size() == 1);
}

TEST_CASE("cache: concurrent callers of a key share one call, other keys make their own", "[cache]") {
    simulation sim;
    quotes c{{.ttl = 1s}, sim.clock()};
    source s{sim};
    record r[4];
    sim.spawn(caller(sim, c, "a", s, r[0]));
    sim.spawn(caller(sim, c, "a", s, r[1]));
    sim.spawn(caller(sim, c, "b", s, r[2]));
    sim.spawn(caller(sim, c, "a", s, r[3]));
    std::size_t in_flight_midway = 0;
    sim.spawn(at(sim, 50ms, [&] { in_flight_midway = c.in_flight(); }));
    sim.run_all();
    CHECK(s.calls() == 2);
    CHECK(in_flight_midway == 2);
    CHECK(c.in_flight() == 0);
    for (auto& rec : r)
        CHECK(rec.at == 100ms);
    CHECK((r[0].value == r[1].value && r[1].value == r[3].value));
    CHECK(r[2].value != r[0].value);
    CHECK(c.size() == 2);
}

TEST_CASE("cache: copies of the handle share the entries and the options", "[cache]") {
    simulation sim;
    const quotes c{{.name = "rates", .ttl = 1s}, sim.clock()};
    const quotes copy = c;
    source s{sim};
    CHECK(sim.run(c.run("k", s)) == 1);
    CHECK(sim.run(copy.run("k", s)) == 1);
    CHECK(s.calls() == 1);
    CHECK(copy.options().ttl == 1s);
    CHECK(copy.name() == "rates");
}

// ---------------------------------------------------------------------------------------------------------
// Stale while revalidate

TEST_CASE("cache: within stale_while_revalidate the stale value answers at once while one refresh runs "
          "in the background",
          "[cache][stale]") {
    simulation sim;
    std::vector<heard> events;
    quotes c{{.ttl = 1s, .stale_while_revalidate = 5s, .telemetry = recorder(events)}, sim.clock()};
    source s{sim};
    CHECK(sim.run(c.run("k", s)) == 1); // stored at 100ms, fresh until 1.1s
    events.clear();
    record r[4];
    sim.spawn(after(sim, 2s - sim.now(), caller(sim, c, "k", s, r[0])));
    sim.spawn(after(sim, 2s - sim.now(), caller(sim, c, "k", s, r[1])));
    sim.spawn(after(sim, 2050ms - sim.now(), caller(sim, c, "k", s, r[2])));
    sim.spawn(after(sim, 2200ms - sim.now(), caller(sim, c, "k", s, r[3])));
    std::size_t in_flight_midway = 0;
    sim.spawn(at(sim, 2050ms, [&] { in_flight_midway = c.in_flight(); }));
    sim.run_all();
    CHECK(s.calls() == 2);
    CHECK(s.starts()[1] == 2s); // one refresh, started by the first stale caller
    CHECK(in_flight_midway == 1);
    CHECK((r[0].value == 1 && r[0].at == 2s));
    CHECK((r[1].value == 1 && r[1].at == 2s));
    CHECK((r[2].value == 1 && r[2].at == 2050ms)); // the refresh is in flight: no second one
    CHECK((r[3].value == 2 && r[3].at == 2200ms)); // stored at 2.1s
    REQUIRE(events.size() == 4);
    for (int i = 0; i < 3; ++i) {
        CHECK(events[i].kind == rs::telemetry_kind::stale_served);
        CHECK(events[i].note == "stale_while_revalidate");
        CHECK_FALSE(events[i].error);
    }
    CHECK((events[0].duration == 900ms && events[2].duration == 950ms)); // how long past its freshness
    CHECK(events[3].kind == rs::telemetry_kind::cache_hit);
}

TEST_CASE("cache: past stale_while_revalidate the callers wait for the refresh", "[cache][stale]") {
    simulation sim;
    quotes c{{.ttl = 1s, .stale_while_revalidate = 1s}, sim.clock()};
    source s{sim};
    CHECK(sim.run(c.run("k", s)) == 1); // stale window from 1.1s to 2.1s
    record before_end, after_end;
    sim.spawn(after(sim, 2099ms - sim.now(), caller(sim, c, "k", s, before_end)));
    sim.run_all();
    sim.spawn(after(sim, 5s - sim.now(), caller(sim, c, "k", s, after_end)));
    sim.run_all();
    CHECK((before_end.value == 1 && before_end.at == 2099ms));
    CHECK((after_end.value == 3 && after_end.at == 5100ms)); // refreshed at 2.099s (call 2), expired again
    CHECK(s.calls() == 3);
}

TEST_CASE("cache: through the policy form the first caller of the revalidate window refreshes in the "
          "foreground and the others get the stale value",
          "[cache][stale][policy]") {
    simulation sim;
    quotes c{{.ttl = 1s, .stale_while_revalidate = 5s}, sim.clock()};
    source s{sim};
    {
        const auto p = c.policy("k");
        CHECK(sim.run(p.execute(s)) == 1);
    }
    record first, second, third;
    sim.spawn(after(sim, 2s - sim.now(), policy_caller(sim, c.policy("k"), s, first)));
    sim.spawn(after(sim, 2050ms - sim.now(), policy_caller(sim, c.policy("k"), s, second)));
    sim.spawn(after(sim, 2150ms - sim.now(), policy_caller(sim, c.policy("k"), s, third)));
    sim.run_all();
    CHECK((first.value == 2 && first.at == 2100ms)); // made the refresh, and waited for it
    CHECK((second.value == 1 && second.at == 2050ms));
    CHECK((third.value == 2 && third.at == 2150ms));
    CHECK(s.calls() == 2);
}

TEST_CASE("cache: a caller outside any event loop refreshes a stale entry in the foreground",
          "[cache][stale]") {
    rs::cache<int, int> c{{.ttl = 1ns, .stale_while_revalidate = 1h}};
    std::atomic<int> calls{0};
    const auto action = [&calls]() -> rs::task<int> { co_return ++calls; };
    CHECK(rs::sync_wait(c.run(1, action)) == 1);
    resilience_tests::foreign_thread away;
    int got = 0;
    const auto away_from_loops = [&]() -> rs::task<void> {
        co_await away.resume_here(); // no event loop runs on this thread
        got = co_await c.run(1, action);
    };
    rs::sync_wait(away_from_loops());
    CHECK(got == 2); // not the stale 1: it made the refresh and waited for it
    CHECK(calls == 2);
}

// ---------------------------------------------------------------------------------------------------------
// Stale if error, negative caching

TEST_CASE("cache: a failed refresh within stale_if_error answers every caller with the stale value, "
          "reported with its failure",
          "[cache][stale]") {
    simulation sim;
    std::vector<heard> events;
    quotes c{{.ttl = 1s, .stale_if_error = 10s, .telemetry = recorder(events)}, sim.clock()};
    source s{sim, 100ms, {2, 3}};
    CHECK(sim.run(c.run("k", s)) == 1); // fresh until 1.1s, usable on error until 11.1s
    events.clear();
    record r[2], late, later;
    sim.spawn(after(sim, 2s - sim.now(), caller(sim, c, "k", s, r[0])));
    sim.spawn(after(sim, 2s - sim.now(), caller(sim, c, "k", s, r[1])));
    sim.run_all();
    for (auto& rec : r)
        CHECK((rec.value == 1 && rec.at == 2100ms));
    REQUIRE(events.size() == 4);
    CHECK((events[0].kind == rs::telemetry_kind::cache_miss &&
           events[1].kind == rs::telemetry_kind::cache_miss));
    for (int i = 2; i < 4; ++i) {
        CHECK(events[i].kind == rs::telemetry_kind::stale_served);
        CHECK(events[i].note == "stale_if_error");
        CHECK(events[i].error);
        CHECK(events[i].duration == 1s); // 2.1s less 1.1s
        CHECK(events[i].at == 2100ms);
    }
    sim.spawn(after(sim, 20s - sim.now(), caller(sim, c, "k", s, late))); // past the allowance
    sim.run_all();
    CHECK(late.what() == "down 3");
    CHECK(late.at == 20100ms);
    sim.spawn(caller(sim, c, "k", s, later));
    sim.run_all();
    CHECK(later.value == 4);
    CHECK(s.calls() == 4);
}

TEST_CASE("cache: a caller that stops leaves at once, and a cancelled refresh is neither stale-served nor "
          "stored",
          "[cache][stale]") {
    simulation sim;
    quotes c{{.ttl = 1s, .stale_if_error = 1h, .negative_ttl = 1h}, sim.clock()};
    source s{sim};
    CHECK(sim.run(c.run("k", s)) == 1);
    const nanoseconds t0 = 2s;
    record owner, joiner, other, fresh;
    resilience::stop_source stop_owner, stop_joiner;
    sim.spawn(after(sim, t0 - sim.now(), caller(sim, c, "k", s, owner, stop_owner.get_token())));
    sim.spawn(after(sim, t0 + 10ms - sim.now(), caller(sim, c, "k", s, joiner, stop_joiner.get_token())));
    sim.spawn(after(sim, t0 + 20ms - sim.now(), caller(sim, c, "k", s, other)));
    sim.spawn(stop_at(sim, stop_joiner, t0 + 30ms));
    sim.spawn(stop_at(sim, stop_owner, t0 + 40ms));
    sim.run_all();
    CHECK((joiner.cancelled() && joiner.at == t0 + 30ms));
    CHECK((owner.cancelled() && owner.at == t0 + 100ms)); // it runs the call: it stays until it ends
    CHECK((other.value == 2 && other.at == t0 + 100ms));
    CHECK(s.stopped() == 0);

    // Every caller stops: the refresh is stopped, and what it ends with is not stored.
    record alone;
    resilience::stop_source stop_alone;
    const nanoseconds t1 = 5s;
    sim.spawn(after(sim, t1 - sim.now(), caller(sim, c, "k", s, alone, stop_alone.get_token())));
    sim.spawn(stop_at(sim, stop_alone, t1 + 30ms));
    sim.run_all();
    CHECK((alone.cancelled() && alone.at == t1 + 30ms));
    CHECK(s.stopped() == 1);

    // An action that gives up by itself: its cancellation is neither stale-served nor remembered.
    const auto gives_up = [&sim]() -> rs::task<int> {
        co_await sim.sleep_for(100ms);
        throw rs::cancelled_error{};
        co_return 0;
    };
    record gave_up;
    sim.spawn(after(sim, 10s - sim.now(), caller(sim, c, "k", gives_up, gave_up)));
    sim.run_all();
    CHECK((gave_up.cancelled() && gave_up.at == 10100ms));
    sim.spawn(caller(sim, c, "k", s, fresh));
    sim.run_all();
    CHECK((fresh.value == 4 && fresh.at == 10200ms)); // a new call: nothing remembered
}

TEST_CASE("cache: a refresh every caller stopped stores nothing, even when its action ends with a value",
          "[cache]") {
    simulation sim;
    quotes c{{.ttl = 1h}, sim.clock()};
    auto deaf = rs::testing::scripted_action{
        sim.clock(), rs::testing::script<int>{.latency = 100ms, .value = 7, .ignore_stop = true}};
    record gone, run_policy, next;
    resilience::stop_source stop, stop_policy;
    sim.spawn(caller(sim, c, "k", deaf, gone, stop.get_token()));
    sim.spawn(policy_caller(sim, c.policy("p"), deaf, run_policy, stop_policy.get_token()));
    sim.spawn(stop_at(sim, stop, 30ms));
    sim.spawn(stop_at(sim, stop_policy, 30ms));
    sim.run_all();
    CHECK((gone.cancelled() && gone.at == 100ms)); // it made the call: it stays until the action ends
    CHECK((run_policy.cancelled() && run_policy.at == 100ms));
    CHECK(c.size() == 0);
    sim.spawn(caller(sim, c, "k", deaf, next));
    sim.run_all();
    CHECK((next.value == 7 && next.at == 200ms));
    CHECK(deaf.calls() == 3);
    CHECK(c.size() == 1);
}

TEST_CASE("cache: a failure is remembered for negative_ttl and answered without calling",
          "[cache][negative]") {
    simulation sim;
    std::vector<heard> events;
    quotes c{{.ttl = 1s, .negative_ttl = 500ms, .telemetry = recorder(events)}, sim.clock()};
    source s{sim, 100ms, {1}};
    record first, remembered, again;
    sim.spawn(caller(sim, c, "k", s, first));
    sim.spawn(after(sim, 300ms, caller(sim, c, "k", s, remembered)));
    sim.spawn(after(sim, 600ms, caller(sim, c, "k", s, again))); // remembered from 100ms until 600ms
    sim.run_all();
    CHECK(first.what() == "down 1");
    CHECK(first.at == 100ms);
    CHECK(remembered.error == first.error); // the same exception object
    CHECK(remembered.at == 300ms);
    CHECK((again.value == 2 && again.at == 700ms));
    CHECK(s.calls() == 2);
    REQUIRE(events.size() == 3);
    CHECK((events[1].kind == rs::telemetry_kind::cache_hit && events[1].error));
}

TEST_CASE("cache: a remembered failure within stale_if_error is answered by the stale value",
          "[cache][negative]") {
    simulation sim;
    std::vector<heard> events;
    quotes c{{.ttl = 1s, .stale_if_error = 10s, .negative_ttl = 1s, .telemetry = recorder(events)},
             sim.clock()};
    source s{sim, 100ms, {2}};
    CHECK(sim.run(c.run("k", s)) == 1);
    record failed, remembered;
    sim.spawn(after(sim, 2s - sim.now(), caller(sim, c, "k", s, failed)));
    sim.spawn(after(sim, 2500ms - sim.now(), caller(sim, c, "k", s, remembered)));
    events.clear();
    sim.run_all();
    CHECK((failed.value == 1 && failed.at == 2100ms));
    CHECK((remembered.value == 1 && remembered.at == 2500ms)); // no call: the failure is remembered
    CHECK(s.calls() == 2);
    REQUIRE(events.size() == 3);
    CHECK((events[2].kind == rs::telemetry_kind::stale_served && events[2].note == "stale_if_error"));
    CHECK((events[2].error && events[2].duration == 1400ms));
}

TEST_CASE("cache: cancellations and the library's own refusals are not remembered by default, and a "
          "classifier can say otherwise",
          "[cache][negative]") {
    simulation sim;
    int calls = 0;
    const auto refused = [&]() -> rs::task<int> {
        ++calls;
        throw rs::bulkhead_rejected_error{};
        co_return 0;
    };
    quotes by_default{{.ttl = 1s, .negative_ttl = 1h}, sim.clock()};
    CHECK(sim.run(by_default.run_outcome("k", refused)).error().is<rs::bulkhead_rejected_error>());
    CHECK(sim.run(by_default.run_outcome("k", refused)).has_failure());
    CHECK(calls == 2);
    CHECK(by_default.size() == 0);

    quotes told{{.ttl = 1s, .negative_ttl = 1h, .should_handle = [](const rs::failure&) { return true; }},
                sim.clock()};
    CHECK(sim.run(told.run_outcome("k", refused)).has_failure());
    CHECK(sim.run(told.run_outcome("k", refused)).error().is<rs::bulkhead_rejected_error>());
    CHECK(calls == 3);

    // A timeout is the dependency's failure: remembered.
    quotes timed{{.ttl = 1s, .negative_ttl = 1h}, sim.clock()};
    source slow{sim, 100ms};
    const rs::pipeline p{timed.policy("k"), rs::timeout{50ms, sim.clock()}};
    CHECK(sim.run(p.execute_outcome(slow)).error().is<rs::timeout_error>());
    CHECK(sim.run(p.execute_outcome(slow)).error().is<rs::timeout_error>());
    CHECK(slow.calls() == 1);
}

namespace {

// A response the HTTP traits read: a status and a Cache-Control field.
struct reply {
    int status = 200;
    std::string body;
    std::optional<std::string> cache_control{};
};

// Answers with `replies` in turn (the last one from then on), each after 100ms.
class web {
public:
    web(simulation& sim, std::vector<reply> replies)
        : state_(std::make_shared<state>(state{&sim, std::move(replies), 0})) {}
    rs::task<reply> operator()() const { return call(state_); }
    int calls() const { return state_->calls; }

private:
    struct state {
        simulation* sim;
        std::vector<reply> replies;
        int calls;
    };
    static rs::task<reply> call(std::shared_ptr<state> s) {
        const auto n = static_cast<std::size_t>(s->calls++);
        co_await s->sim->sleep_for(100ms);
        co_return s->replies[std::min(n, s->replies.size() - 1)];
    }
    std::shared_ptr<state> state_;
};

} // namespace

TEST_CASE("cache: a value the classifier handles is a failure: never stored, remembered, and replaced by a "
          "stale value",
          "[cache][negative]") {
    simulation sim;
    rs::cache<std::string, reply, rs::testing::virtual_clock> pages{
        {.ttl = 1s,
         .stale_if_error = 1h,
         .negative_ttl = 2s,
         .should_handle = [](const rs::outcome<reply>& o) { return !o || o->status >= 500; }},
        sim.clock()};
    web upstream{sim, {{200, "first"}, {503, "busy"}, {200, "second"}}};
    CHECK(sim.run(pages.run("/", upstream)).body == "first");
    sim.run([&]() -> rs::task<void> { co_await sim.sleep_for(5s); }());
    CHECK(sim.run(pages.run("/", upstream)).body == "first"); // the 503 is replaced by the stale value
    CHECK(sim.run(pages.run("/", upstream)).body == "first"); // and remembered: no call
    CHECK(upstream.calls() == 2);
    sim.run([&]() -> rs::task<void> { co_await sim.sleep_for(3s); }());
    CHECK(sim.run(pages.run("/", upstream)).body == "second");

    // Without a stale value, the handled value itself is the answer, remembered like a failure.
    rs::cache<std::string, reply, rs::testing::virtual_clock> bare{
        {.ttl = 1s,
         .negative_ttl = 2s,
         .should_handle = [](const rs::outcome<reply>& o) { return !o || o->status >= 500; }},
        sim.clock()};
    web down{sim, {{503, "busy"}, {200, "up"}}};
    CHECK(sim.run(bare.run("/", down)).status == 503);
    CHECK(sim.run(bare.run("/", down)).status == 503);
    CHECK(down.calls() == 1);
}

// ---------------------------------------------------------------------------------------------------------
// Size, ttl per entry, invalidation

TEST_CASE("cache: beyond max_entries the least recently used entry is evicted", "[cache]") {
    simulation sim;
    quotes c{{.ttl = 1h, .max_entries = 2}, sim.clock()};
    source s{sim};
    CHECK(sim.run(c.run("a", s)) == 1);
    CHECK(sim.run(c.run("b", s)) == 2);
    CHECK(sim.run(c.run("a", s)) == 1); // a hit: "a" is now the most recently used
    CHECK(sim.run(c.run("c", s)) == 3); // evicts "b"
    CHECK(c.size() == 2);
    CHECK(sim.run(c.run("a", s)) == 1);
    CHECK(sim.run(c.run("c", s)) == 3);
    CHECK(s.calls() == 3);
    CHECK(sim.run(c.run("b", s)) == 4); // called again; evicts "a"
    CHECK(sim.run(c.run("c", s)) == 3);
    CHECK(sim.run(c.run("a", s)) == 5);
    CHECK(c.size() == 2);
}

TEST_CASE("cache: ttl_of gives each value its own time to live, from Cache-Control max-age through the HTTP "
          "traits",
          "[cache][http]") {
    simulation sim;
    rs::cache<std::string, reply, rs::testing::virtual_clock> pages{
        {.ttl = 1s, .ttl_of = [](const reply& r) { return rs::http::max_age(r); }}, sim.clock()};
    web upstream{
        sim,
        {{200, "long", "public, max-age=3"}, {200, "default"}, {200, "zero", "max-age=0"}, {200, "last"}}};
    CHECK(sim.run(pages.run("/", upstream)).body == "long"); // at 100ms, fresh until 3.1s
    sim.run([&]() -> rs::task<void> { co_await sim.sleep_for(2900ms); }());
    CHECK(sim.run(pages.run("/", upstream)).body == "long"); // at 3s
    sim.run([&]() -> rs::task<void> { co_await sim.sleep_for(100ms); }());
    CHECK(sim.run(pages.run("/", upstream)).body == "default"); // at 3.1s: expired; fresh until 4.2s
    sim.run([&]() -> rs::task<void> { co_await sim.sleep_for(999ms); }());
    CHECK(sim.run(pages.run("/", upstream)).body == "default");
    sim.run([&]() -> rs::task<void> { co_await sim.sleep_for(1ms); }());
    CHECK(sim.run(pages.run("/", upstream)).body == "zero"); // stored already expired
    CHECK(sim.run(pages.run("/", upstream)).body == "last");
    CHECK(upstream.calls() == 4);
}

TEST_CASE("cache: invalidate and clear forget entries, and a refresh in flight then stores nothing",
          "[cache]") {
    simulation sim;
    quotes c{{.ttl = 1h}, sim.clock()};
    source s{sim};
    CHECK(sim.run(c.run("a", s)) == 1);
    CHECK(sim.run(c.run("b", s)) == 2);
    c.invalidate("a");
    c.invalidate("absent");
    CHECK(c.size() == 1);
    CHECK(sim.run(c.run("a", s)) == 3);
    CHECK(sim.run(c.run("b", s)) == 2);

    record during;
    sim.spawn(caller(sim, c, "c", s, during));
    sim.spawn(at(sim, sim.now() + 50ms, [&] { c.clear(); }));
    sim.run_all();
    CHECK(during.value == 4); // its callers get it
    CHECK(c.size() == 0);     // but it is not stored
    CHECK(sim.run(c.run("c", s)) == 5);
}

// ---------------------------------------------------------------------------------------------------------
// The policy form

TEST_CASE("cache: the policy form answers from the entry or refreshes it with the whole wrapped call, shared",
          "[cache][policy]") {
    simulation sim;
    quotes c{{.ttl = 1s}, sim.clock()};
    STATIC_REQUIRE(rs::policy<quotes::keyed_policy>);
    auto act = rs::testing::scripted_action{
        sim.clock(), rs::testing::script<int>{.failures = 2, .latency = 100ms, .value = 42}};
    const rs::retry retry{{.max_attempts = 3, .backoff = rs::constant_backoff{10ms, rs::jitter::none}},
                          sim.clock()};
    record r[3], hit;
    for (auto& rec : r)
        sim.spawn(policy_caller(sim, rs::pipeline{c.policy("k"), retry}, act, rec));
    sim.run_all();
    CHECK(act.calls() == 3); // one retried call, not three
    for (auto& rec : r)
        CHECK((rec.value == 42 && rec.at == 320ms));
    sim.spawn(after(sim, 500ms, policy_caller(sim, rs::pipeline{c.policy("k"), retry}, act, hit)));
    sim.run_all();
    CHECK((hit.value == 42 && hit.at == 820ms));
    CHECK(act.calls() == 3);
    CHECK(c.policy("k").key() == "k");
}

TEST_CASE("cache: behind a telemetry stage the policy form reports to its listener", "[cache][policy]") {
    simulation sim;
    std::vector<heard> events;
    quotes c{{.ttl = 1s}, sim.clock()};
    source s{sim};
    const rs::telemetry stage{
        [&](const rs::telemetry_event& e) {
            if (e.policy == "cache")
                events.push_back({e.kind, std::string(e.note), e.duration, e.at, false});
        },
        sim.clock()};
    const rs::pipeline p{stage, c.policy("k")};
    CHECK(sim.run(p.execute(s)) == 1);
    CHECK(sim.run(p.execute(s)) == 1);
    REQUIRE(events.size() == 2);
    CHECK(events[0].kind == rs::telemetry_kind::cache_miss);
    CHECK((events[1].kind == rs::telemetry_kind::cache_hit && events[1].at == 100ms));
}

// ---------------------------------------------------------------------------------------------------------
// Listeners, options

TEST_CASE("cache: a listener that throws ends the call with its exception, a hit's as well", "[cache]") {
    simulation sim;
    bool throwing = false;
    quotes c{{.ttl = 1s,
              .telemetry =
                  [&](const rs::telemetry_event&) {
                      if (throwing)
                          throw std::runtime_error("listener");
                  }},
             sim.clock()};
    source s{sim};
    CHECK(sim.run(c.run("k", s)) == 1);
    throwing = true;
    const auto hit = sim.run(c.run_outcome("k", s));
    CHECK(hit.error().what() == std::string("listener"));
    const auto miss = sim.run(c.run_outcome("other", s));
    CHECK(miss.error().what() == std::string("listener"));
    CHECK(s.calls() == 1); // a miss whose report threw makes no call
    const auto p = c.policy("k");
    CHECK(sim.run(p.execute_outcome(s)).error().what() == std::string("listener"));
}

TEST_CASE("cache: options are validated at construction, naming the field and the value", "[cache]") {
    using resilience_tests::invalid_argument_message;
    using ints = rs::cache<int, int>;
    CHECK(invalid_argument_message([] { ints{{.name = "q", .ttl = 0s}}; }) ==
          "resilience::cache (q): ttl must be positive, got 0ns");
    CHECK(invalid_argument_message([] { ints{{.ttl = -1s}}; }) ==
          "resilience::cache: ttl must be positive, got -1000000000ns");
    CHECK(invalid_argument_message([] { ints{{.stale_while_revalidate = -1ns}}; }) ==
          "resilience::cache: stale_while_revalidate must be zero or positive, got -1ns");
    CHECK(invalid_argument_message([] { ints{{.stale_if_error = -2ns}}; }) ==
          "resilience::cache: stale_if_error must be zero or positive, got -2ns");
    CHECK(invalid_argument_message([] { ints{{.max_entries = 0}}; }) ==
          "resilience::cache: max_entries must be positive, got 0");
    CHECK(invalid_argument_message([] { ints{{.negative_ttl = -3ns}}; }) ==
          "resilience::cache: negative_ttl must be zero or positive, got -3ns");
    CHECK_THAT(
        invalid_argument_message(
            [] { ints{{.should_handle = [](const rs::outcome<long>& o) { return !o; }}}; }),
        Catch::Matchers::Contains("should_handle classifies rs::outcome<long> but the cache holds int"));
    CHECK_NOTHROW(ints{{.ttl = 1ns, .max_entries = 1}});
}

// ---------------------------------------------------------------------------------------------------------
// Keys whose own operations throw

namespace {

// Which of a `touchy_key`'s operations throws.
enum class key_fault { none, copy, hash, equality };

// A key whose copy, hash or equality throws while its `fault` says so, as a key that allocates when
// copied, or hashes something that can fail, may. Its moves never throw.
struct touchy_key {
    std::string name;
    const key_fault* fault;
    touchy_key(std::string n, const key_fault& f) : name(std::move(n)), fault(&f) {}
    touchy_key(const touchy_key& o) : name(o.name), fault(o.fault) {
        if (*fault == key_fault::copy)
            throw std::runtime_error("key copy");
    }
    touchy_key(touchy_key&&) noexcept = default;
    touchy_key& operator=(const touchy_key&) = delete;
    touchy_key& operator=(touchy_key&&) = delete;
    friend bool operator==(const touchy_key& a, const touchy_key& b) {
        if (*a.fault == key_fault::equality)
            throw std::runtime_error("key equality");
        return a.name == b.name;
    }
};
struct touchy_hash {
    std::size_t operator()(const touchy_key& k) const {
        if (*k.fault == key_fault::hash)
            throw std::runtime_error("key hash");
        return std::hash<std::string>{}(k.name);
    }
};
using touchy_cache = rs::cache<touchy_key, int, rs::testing::virtual_clock, touchy_hash>;

template <class A>
rs::task<void> touchy_caller(simulation& sim, touchy_cache c, touchy_key key, A act, record& out) {
    try {
        out.value = co_await c.run(std::move(key), act);
    } catch (...) {
        out.error = std::current_exception();
    }
    out.at = sim.now();
}
template <class A>
rs::task<void> touchy_policy_caller(simulation& sim, touchy_cache c, touchy_key key, A act, record& out) {
    try {
        out.value = co_await c.policy(std::move(key)).execute(act);
    } catch (...) {
        out.error = std::current_exception();
    }
    out.at = sim.now();
}

// Gets the stale value, which starts a background refresh, then breaks the key before the loop's next
// turn, where that refresh runs: every operation of the key in the refresh throws.
rs::task<void> stale_then_break(touchy_cache c, touchy_key key, source s, key_fault& fault, key_fault broken,
                                std::optional<int>& got) {
    got = co_await c.run(std::move(key), s);
    fault = broken;
}

// After 100ms, breaks the key, then returns `value`: the refresh stores it with a key that throws.
rs::task<int> breaking_call(simulation& sim, key_fault& fault, key_fault broken, int value) {
    co_await sim.sleep_for(100ms);
    fault = broken;
    co_return value;
}
struct breaking_action {
    simulation* sim;
    key_fault* fault;
    key_fault broken;
    int value;
    rs::task<int> operator()() const { return breaking_call(*sim, *fault, broken, value); }
};

// The background refresh of a stale entry, its key broken: a failed refresh, and nothing else.
void background_refresh_with_broken_key(key_fault broken) {
    simulation sim;
    key_fault fault = key_fault::none;
    std::vector<heard> events;
    const touchy_cache c{{.ttl = 1s, .stale_while_revalidate = 10s, .telemetry = recorder(events)},
                         sim.clock()};
    source s{sim};
    const touchy_key k{"k", fault};
    CHECK(sim.run(c.run(k, s)) == 1); // stored at 100ms: stale from 1.1s to 11.1s
    events.clear();
    std::optional<int> stale;
    sim.spawn(after(sim, 2s - sim.now(), stale_then_break(c, k, s, fault, broken, stale)));
    CHECK_NOTHROW(sim.run_all()); // nothing escapes onto the loop (and nothing terminates)
    fault = key_fault::none;
    CHECK(stale == 1);
    // A key that throws when copied or hashed fails the refresh before its call; one that throws when
    // compared, when the call's value is stored.
    CHECK(s.calls() == (broken == key_fault::equality ? 2 : 1));
    CHECK(sim.now() == (broken == key_fault::equality ? 2100ms : 2s));
    CHECK(c.in_flight() == 0);
    CHECK(c.size() == 1);
    REQUIRE(events.size() == 1); // the stale answer; the failed refresh reports nothing itself
    CHECK((events[0].kind == rs::telemetry_kind::stale_served && events[0].note == "stale_while_revalidate"));

    // The stale value keeps serving, and the next caller of the key starts a refresh that works.
    events.clear();
    const int made = s.calls();
    record later, fresh;
    sim.spawn(after(sim, 3s - sim.now(), touchy_caller(sim, c, k, s, later)));
    sim.spawn(after(sim, 3200ms - sim.now(), touchy_caller(sim, c, k, s, fresh)));
    sim.run_all();
    CHECK((later.value == 1 && later.at == 3s));
    CHECK((fresh.value == made + 1 && fresh.at == 3200ms)); // stored at 3.1s
    CHECK(s.calls() == made + 1);
    CHECK(c.in_flight() == 0);
    REQUIRE(events.size() == 2);
    CHECK((events[0].kind == rs::telemetry_kind::stale_served && events[0].note == "stale_while_revalidate"));
    CHECK(events[1].kind == rs::telemetry_kind::cache_hit);
}

// A refresh in the foreground, by one caller and one that joined it, whose key breaks while it runs:
// both get one answer (the key's exception, or the value if storing it needed nothing that threw), the
// key is free again, and its next caller refreshes.
template <class Caller>
void foreground_refresh_with_broken_key(key_fault broken, Caller call) {
    simulation sim;
    key_fault fault = key_fault::none;
    const touchy_cache c{{.ttl = 1s}, sim.clock()};
    const touchy_key k{"k", fault};
    record owner, joined, next;
    sim.spawn(call(sim, c, k, breaking_action{&sim, &fault, broken, 7}, owner));
    sim.spawn(after(sim, 50ms, call(sim, c, k, breaking_action{&sim, &fault, broken, 8}, joined)));
    CHECK_NOTHROW(sim.run_all());
    fault = key_fault::none;
    CHECK(c.in_flight() == 0);
    CHECK((owner.at == 100ms && joined.at == 100ms));
    CHECK(owner.value == joined.value);
    CHECK(owner.what() == joined.what());
    if (broken == key_fault::equality) { // the table was empty: storing compared nothing
        CHECK(owner.value == 7);
    } else {
        CHECK(owner.what() == (broken == key_fault::copy ? "key copy" : "key hash"));
    }
    sim.spawn(
        after(sim, 2s - sim.now(), call(sim, c, k, breaking_action{&sim, &fault, key_fault::none, 9}, next)));
    CHECK_NOTHROW(sim.run_all());
    CHECK((next.value == 9 && next.at == 2100ms));
    CHECK(c.in_flight() == 0);
}

} // namespace

TEST_CASE("cache: a key whose copy throws fails the background refresh, and the stale value keeps serving",
          "[cache][stale][key]") {
    background_refresh_with_broken_key(key_fault::copy);
}

TEST_CASE("cache: a key whose hash throws fails the background refresh, and the stale value keeps serving",
          "[cache][stale][key]") {
    background_refresh_with_broken_key(key_fault::hash);
}

TEST_CASE("cache: a key whose equality throws fails the background refresh, and the stale value keeps "
          "serving",
          "[cache][stale][key]") {
    background_refresh_with_broken_key(key_fault::equality);
}

TEST_CASE("cache: a key that breaks while its refresh runs in the foreground ends the refresh once for its "
          "callers, through run and through the policy form",
          "[cache][key]") {
    const auto by_run = [](simulation& sim, const touchy_cache& c, const touchy_key& k, breaking_action a,
                           record& out) { return touchy_caller(sim, c, k, a, out); };
    const auto by_policy = [](simulation& sim, const touchy_cache& c, const touchy_key& k, breaking_action a,
                              record& out) { return touchy_policy_caller(sim, c, k, a, out); };
    for (const key_fault broken : {key_fault::copy, key_fault::hash, key_fault::equality}) {
        INFO("fault " << static_cast<int>(broken));
        foreground_refresh_with_broken_key(broken, by_run);
        foreground_refresh_with_broken_key(broken, by_policy);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Lifetimes and teardown

TEST_CASE("cache: a loop destroyed with a background refresh pending destroys it and wakes its waiters",
          "[cache][lifetime]") {
    REQUIRE(resilience_tests::tracked::live == 0);
    simulation sim;
    std::optional<quotes> c;
    c.emplace(rs::cache_options<int>{.ttl = 1s, .stale_while_revalidate = 1s}, sim.clock());
    source s{sim};
    CHECK(sim.run(c->run("k", s)) == 1);                                // fresh until 1.1s
    sim.run([&]() -> rs::task<void> { co_await sim.sleep_for(1s); }()); // at 1.1s: stale

    int parked_calls = 0;
    const auto parked = [&parked_calls]() -> rs::task<int> {
        ++parked_calls;
        const resilience_tests::tracked held; // a heap block: leaked if the frame were
        co_await never{};
        co_return 0;
    };
    std::optional<simulation> doomed;
    doomed.emplace();
    record stale, waiting, fresh;
    doomed->spawn(caller(*doomed, *c, "k", parked, stale)); // answers 1, spawns the refresh on `doomed`
    CHECK_THROWS_AS(doomed->run_all(), std::logic_error);   // stuck on the refresh, which never ends
    CHECK((stale.value == 1 && parked_calls == 1));
    CHECK(c->in_flight() == 1);
    CHECK(resilience_tests::tracked::live == 1);

    // Past the window a caller joins the refresh in flight; the loop that owns it then goes.
    sim.spawn(after(sim, 2s, caller(sim, *c, "k", s, waiting)));
    sim.spawn(at(sim, sim.now() + 3s, [&] {
        c.reset(); // the last handle first: the refresh holds the state
        doomed.reset();
    }));
    sim.run_all();
    CHECK((waiting.cancelled() && waiting.at == 4100ms));
    CHECK(resilience_tests::tracked::live == 0);
    CHECK(parked_calls == 1);
}

TEST_CASE("cache: the last handle may go while calls and a background refresh run", "[cache][lifetime]") {
    simulation sim;
    source s{sim};
    record first, stale;
    {
        const quotes c{{.ttl = 1s, .stale_while_revalidate = 1h}, sim.clock()};
        CHECK(sim.run(c.run("k", s)) == 1);
        sim.spawn(after(sim, 2s, caller(sim, c, "k", s, first)));
        auto call = c.run("k", s); // made now, run later
        sim.spawn([](rs::task<int> t, record& out, simulation& on) -> rs::task<void> {
            co_await on.sleep_for(3s);
            out.value = co_await std::move(t);
            out.at = on.now();
        }(std::move(call), stale, sim));
    } // no handle left
    sim.run_all();
    CHECK((first.value == 1 && first.at == 2100ms)); // stale, and a background refresh from 2.1s
    CHECK((stale.value == 2 && stale.at == 3100ms)); // what that refresh stored
    CHECK(s.calls() == 2);
}

// ---------------------------------------------------------------------------------------------------------
// No allocation on a hit

#ifdef RESILIENCE_TESTS_COUNT_ALLOCATIONS
TEST_CASE("cache: a hit allocates nothing, through run and through the policy form", "[cache][alloc]") {
    rs::cache<int, int> c{{.ttl = 1h, .stale_while_revalidate = 1h}};
    const auto action = []() -> rs::task<int> { co_return 42; };
    std::size_t by_run = 1, by_policy = 1, by_pipeline = 1;
    rs::event_loop loop;
    loop.run([&]() -> rs::task<void> {
        const auto p = c.policy(7);
        const rs::pipeline with_retry{c.policy(7), rs::retry{}};
        for (int i = 0; i < 100; ++i) { // fills the entry, warms the frame cache
            (void)co_await c.run(7, action);
            (void)co_await p.execute(action);
            (void)co_await with_retry.execute(action);
        }
        int sum = 0;
        {
            resilience_tests::counting_allocations counting;
            for (int i = 0; i < 1000; ++i)
                sum += co_await c.run(7, action);
            by_run = counting.count();
        }
        {
            resilience_tests::counting_allocations counting;
            for (int i = 0; i < 1000; ++i)
                sum += co_await p.execute(action);
            by_policy = counting.count();
        }
        {
            resilience_tests::counting_allocations counting;
            for (int i = 0; i < 1000; ++i)
                sum += co_await with_retry.execute(action);
            by_pipeline = counting.count();
        }
        CHECK(sum == 3000 * 42);
    }());
    CHECK(by_run == 0);
    CHECK(by_policy == 0);
    CHECK(by_pipeline == 0);
}
#endif

// ---------------------------------------------------------------------------------------------------------
// Two loops on threads

namespace {

constexpr int keys = 4;

// Yields a few times so that calls overlap, then returns a value that encodes its key.
struct counted_action {
    std::atomic<int>* started;
    int key;
    rs::task<int> operator()(resilience::stop_token) const { return call(started, key); }
    static rs::task<int> call(std::atomic<int>* started, int key) {
        const int id = started->fetch_add(1) + 1;
        for (int i = 0; i < 3; ++i)
            co_await yield_now{};
        co_return id* keys + key;
    }
};

struct caller_result {
    int completions = 0;
    int value = -1;
    bool failed = false;
};

rs::task<void> concurrent_caller(rs::cache<int, int> c, std::atomic<int>* started, int index,
                                 caller_result* out) {
    const int key = index % keys;
    for (int i = 0; i < (index / keys) % 40; ++i)
        co_await yield_now{}; // spread the arrivals
    auto r = co_await c.run_outcome(key, counted_action{started, key});
    if (r)
        out->value = *r;
    else
        out->failed = true;
    ++out->completions;
}

} // namespace

TEST_CASE("cache: callers on two loops share entries and refreshes, and every caller completes once",
          "[cache][concurrency]") {
    // Tiny windows on the real clock: entries go fresh, stale and expired while the callers run, and
    // background refreshes are spawned on both loops.
    rs::cache<int, int> c{{.ttl = 20us, .stale_while_revalidate = 20us, .max_entries = 3}};
    std::atomic<int> started{0};
    std::vector<caller_result> results(4000);
    {
        rs::event_loop loops[2];
        const int per_loop = static_cast<int>(results.size()) / 2;
        for (int l = 0; l < 2; ++l)
            for (int i = 0; i < per_loop; ++i) {
                const int index = l * per_loop + i;
                loops[l].spawn(
                    concurrent_caller(c, &started, index, &results[static_cast<std::size_t>(index)]));
            }
        resilience_tests::run_on_threads(loops[0], loops[1]);
    }
    for (std::size_t i = 0; i < results.size(); ++i) {
        const auto& r = results[i];
        REQUIRE(r.completions == 1);
        REQUIRE_FALSE(r.failed);
        REQUIRE(r.value % keys == static_cast<int>(i) % keys); // a value of its own key
        REQUIRE(r.value / keys <= started.load());
    }
    CHECK(started.load() >= keys);
    CHECK(started.load() <= static_cast<int>(results.size()));
    CHECK(c.in_flight() == 0);
    CHECK(c.size() <= 3);
}

// ---------------------------------------------------------------------------------------------------------
// Reconfiguring

namespace {

// The name a cancelled caller's `cancelled_error` carries.
std::string cancelled_by(const record& r) {
    if (!r.error)
        return "(no error)";
    try {
        std::rethrow_exception(r.error);
    } catch (const rs::cancelled_error& e) {
        return e.policy_name();
    } catch (...) {
    }
    return "(not a cancellation)";
}

} // namespace

TEST_CASE("cache reconfigure: the entries stay, each value keeps the expiry it was stored with, and a new "
          "ttl applies to the values stored from then on",
          "[cache][reconfigure]") {
    simulation sim;
    quotes c{{.ttl = 1s}, sim.clock()};
    source s{sim};
    record r[7];
    sim.spawn(caller(sim, c, "k", s, r[0])); // stored at 100ms: fresh until 1.1s
    sim.spawn(at(sim, 500ms, [&] { c.reconfigure({.ttl = 5s}); }));
    sim.spawn(after(sim, 1099ms, caller(sim, c, "k", s, r[1])));
    sim.spawn(after(sim, 1100ms, caller(sim, c, "k", s, r[2]))); // stored at 1.2s under 5s: until 6.2s
    sim.spawn(at(sim, 2s, [&] { c.reconfigure({.ttl = 1s}); }));
    sim.spawn(after(sim, 6199ms, caller(sim, c, "k", s, r[3])));
    sim.spawn(after(sim, 6200ms, caller(sim, c, "k", s, r[4]))); // stored at 6.3s under 1s: until 7.3s
    sim.spawn(after(sim, 7299ms, caller(sim, c, "k", s, r[5])));
    sim.spawn(after(sim, 7300ms, caller(sim, c, "k", s, r[6])));
    sim.run_all();
    CHECK((r[0].value == 1 && r[0].at == 100ms));
    CHECK((r[1].value == 1 && r[1].at == 1099ms));
    CHECK((r[2].value == 2 && r[2].at == 1200ms));
    CHECK((r[3].value == 2 && r[3].at == 6199ms));
    CHECK((r[4].value == 3 && r[4].at == 6300ms));
    CHECK((r[5].value == 3 && r[5].at == 7299ms));
    CHECK((r[6].value == 4 && r[6].at == 7400ms));
    CHECK(s.calls() == 4);
    CHECK(c.options().ttl == 1s);
}

TEST_CASE("cache reconfigure: a smaller max_entries evicts the least recently used entries down to it at "
          "once, a larger one evicts nothing",
          "[cache][reconfigure]") {
    simulation sim;
    quotes c{{.ttl = 1h, .max_entries = 4}, sim.clock()};
    source s{sim};
    for (const char* k : {"a", "b", "c", "d"})
        (void)sim.run(c.run(k, s));               // calls 1 to 4, until 400ms
    CHECK(sim.run(c.run("a", s)) == 1);           // a hit: from the least recently used, b c d a
    c.reconfigure({.ttl = 1h, .max_entries = 2}); // evicts b and c
    CHECK(c.size() == 2);
    CHECK(sim.run(c.run("d", s)) == 4);
    CHECK(sim.run(c.run("a", s)) == 1); // d a
    CHECK(s.calls() == 4);
    CHECK(sim.run(c.run("b", s)) == 5); // evicts d
    CHECK(sim.run(c.run("a", s)) == 1);
    CHECK(sim.run(c.run("d", s)) == 6); // evicts b
    CHECK(sim.now() == 600ms);
    c.reconfigure({.ttl = 1h, .max_entries = 3});
    CHECK(c.size() == 2);
    CHECK(sim.run(c.run("c", s)) == 7);
    CHECK(c.size() == 3);
    CHECK(sim.run(c.run("a", s)) == 1);
    CHECK(sim.run(c.run("d", s)) == 6);
    CHECK(sim.run(c.run("c", s)) == 7);
    CHECK(s.calls() == 7);
    CHECK(sim.now() == 700ms);
}

TEST_CASE(
    "cache reconfigure: an entry a smaller max_entries evicts while its refresh is in flight is handled "
    "as eviction handles it: the refresh answers its callers and stores when it ends",
    "[cache][reconfigure]") {
    simulation sim;
    quotes c{{.ttl = 1s, .max_entries = 2}, sim.clock()};
    source s{sim};
    CHECK(sim.run(c.run("a", s)) == 1); // fresh until 1.1s
    CHECK(sim.run(c.run("b", s)) == 2); // fresh until 1.2s
    record ra, rb, hit_b, again_a;
    std::size_t size_after = 0, in_flight_after = 0, size_between = 0;
    sim.spawn(after(sim, 2s - sim.now(), caller(sim, c, "a", s, ra)));     // call 3, until 2.1s
    sim.spawn(after(sim, 2050ms - sim.now(), caller(sim, c, "b", s, rb))); // call 4, until 2.15s
    sim.spawn(at(sim, 2060ms, [&] {
        c.reconfigure({.ttl = 1s, .max_entries = 1}); // evicts "a" (least recently used), in flight
        size_after = c.size();
        in_flight_after = c.in_flight();
    }));
    sim.spawn(at(sim, 2120ms, [&] { size_between = c.size(); }));
    sim.spawn(after(sim, 2200ms - sim.now(), caller(sim, c, "b", s, hit_b)));
    sim.spawn(after(sim, 2200ms - sim.now(), caller(sim, c, "a", s, again_a)));
    sim.run_all();
    CHECK(size_after == 1);
    CHECK(in_flight_after == 2);
    CHECK((ra.value == 3 && ra.at == 2100ms)); // stored, evicting "b", whose refresh is in flight
    CHECK(size_between == 1);
    CHECK((rb.value == 4 && rb.at == 2150ms)); // stored, evicting "a"
    CHECK((hit_b.value == 4 && hit_b.at == 2200ms));
    CHECK((again_a.value == 5 && again_a.at == 2300ms));
    CHECK(s.calls() == 5);
    CHECK(c.size() == 1);
}

TEST_CASE("cache reconfigure: a new stale_while_revalidate judges the lookups made from then on, from each "
          "value's own expiry",
          "[cache][reconfigure][stale]") {
    simulation sim;
    std::vector<heard> events;
    quotes c{{.ttl = 1s, .telemetry = recorder(events)}, sim.clock()};
    source s{sim};
    CHECK(sim.run(c.run("a", s)) == 1); // fresh until 1.1s
    CHECK(sim.run(c.run("b", s)) == 2); // fresh until 1.2s
    events.clear();
    record stale_a, late_b, closed_a;
    sim.spawn(at(sim, 1500ms, [&] {
        c.reconfigure({.ttl = 1s, .stale_while_revalidate = 1s, .telemetry = recorder(events)});
    }));
    // Within a's window (to 2.1s): the stale value, and a background refresh, call 3, fresh from 2.199s
    // until 3.199s.
    sim.spawn(after(sim, 2099ms - sim.now(), caller(sim, c, "a", s, stale_a)));
    sim.spawn(after(sim, 2200ms - sim.now(), caller(sim, c, "b", s, late_b))); // the end of b's: call 4
    sim.spawn(at(sim, 2500ms, [&] { c.reconfigure({.ttl = 1s, .telemetry = recorder(events)}); }));
    sim.spawn(after(sim, 3200ms - sim.now(), caller(sim, c, "a", s, closed_a))); // no window now: call 5
    sim.run_all();
    CHECK((stale_a.value == 1 && stale_a.at == 2099ms));
    CHECK((late_b.value == 4 && late_b.at == 2300ms));
    CHECK((closed_a.value == 5 && closed_a.at == 3300ms));
    REQUIRE(s.calls() == 5);
    CHECK(s.starts()[2] == 2099ms);
    REQUIRE(events.size() == 3);
    CHECK((events[0].kind == rs::telemetry_kind::stale_served && events[0].duration == 999ms));
    CHECK((events[1].kind == rs::telemetry_kind::cache_miss && events[1].at == 2200ms));
    CHECK((events[2].kind == rs::telemetry_kind::cache_miss && events[2].at == 3200ms));
}

TEST_CASE("cache reconfigure: a new stale_if_error decides for the refreshes that start from then on",
          "[cache][reconfigure][stale]") {
    simulation sim;
    quotes c{{.ttl = 1s, .stale_if_error = 10s}, sim.clock()};
    source s{sim, 100ms, {2, 3, 4}};
    CHECK(sim.run(c.run("k", s)) == 1); // fresh until 1.1s
    record narrowed, widened, at_the_end;
    sim.spawn(at(sim, 1500ms, [&] { c.reconfigure({.ttl = 1s}); }));
    sim.spawn(after(sim, 2s - sim.now(), caller(sim, c, "k", s, narrowed))); // call 2 fails, nothing stale
    sim.spawn(at(sim, 3s, [&] { c.reconfigure({.ttl = 1s, .stale_if_error = 5s}); })); // to 6.1s
    sim.spawn(after(sim, 4s - sim.now(), caller(sim, c, "k", s, widened)));            // call 3 fails
    sim.spawn(after(sim, 6s - sim.now(), caller(sim, c, "k", s, at_the_end)));         // call 4 fails at 6.1s
    sim.run_all();
    CHECK((narrowed.what() == "down 2" && narrowed.at == 2100ms));
    CHECK((widened.value == 1 && widened.at == 4100ms));
    CHECK((at_the_end.what() == "down 4" && at_the_end.at == 6100ms));
    CHECK(s.calls() == 4);
}

TEST_CASE("cache reconfigure: a new negative_ttl judges each remembered failure from the instant it was "
          "remembered, and zero forgets them",
          "[cache][reconfigure][negative]") {
    simulation sim;
    quotes c{{.ttl = 1s, .negative_ttl = 500ms}, sim.clock()};
    source s{sim, 100ms, {1, 3}};
    record first, kept, last, forgotten, b_first, b_forgotten;
    sim.spawn(caller(sim, c, "a", s, first)); // call 1 fails at 100ms: remembered until 600ms
    sim.spawn(at(sim, 200ms, [&] { c.reconfigure({.ttl = 1s, .negative_ttl = 2s}); })); // until 2.1s
    sim.spawn(after(sim, 1s, caller(sim, c, "a", s, kept)));
    sim.spawn(after(sim, 2099ms, caller(sim, c, "a", s, last)));
    sim.spawn(after(sim, 2100ms, caller(sim, c, "a", s, forgotten))); // call 2
    sim.spawn(after(sim, 3s, caller(sim, c, "b", s, b_first)));       // call 3 fails: until 5.1s
    sim.spawn(at(sim, 3500ms, [&] { c.reconfigure({.ttl = 1s}); }));
    sim.spawn(after(sim, 4s, caller(sim, c, "b", s, b_forgotten))); // call 4
    sim.run_all();
    CHECK((first.what() == "down 1" && first.at == 100ms));
    CHECK((kept.error == first.error && kept.at == 1s));
    CHECK((last.error == first.error && last.at == 2099ms));
    CHECK((forgotten.value == 2 && forgotten.at == 2200ms));
    CHECK((b_first.what() == "down 3" && b_first.at == 3100ms));
    CHECK((b_forgotten.value == 4 && b_forgotten.at == 4100ms));
    CHECK(s.calls() == 4);
}

TEST_CASE("cache reconfigure: bad options are refused as at construction, naming the field and the value, "
          "and the old ones stay in force",
          "[cache][reconfigure]") {
    using resilience_tests::invalid_argument_message;
    simulation sim;
    std::vector<heard> events;
    quotes c{{.name = "q", .ttl = 1s, .max_entries = 2, .telemetry = recorder(events)}, sim.clock()};
    source s{sim};
    CHECK(sim.run(c.run("a", s)) == 1); // fresh until 1.1s
    CHECK(sim.run(c.run("b", s)) == 2);
    CHECK(invalid_argument_message([&] { c.reconfigure({.name = "q", .ttl = 0s}); }) ==
          "resilience::cache (q): ttl must be positive, got 0ns");
    CHECK(invalid_argument_message([&] { c.reconfigure({.name = "r", .ttl = 1h, .max_entries = 0}); }) ==
          "resilience::cache (r): max_entries must be positive, got 0");
    CHECK(invalid_argument_message([&] { c.reconfigure({.ttl = 1h, .stale_while_revalidate = -1ns}); }) ==
          "resilience::cache: stale_while_revalidate must be zero or positive, got -1ns");
    CHECK(invalid_argument_message([&] { c.reconfigure({.ttl = 1h, .stale_if_error = -2ns}); }) ==
          "resilience::cache: stale_if_error must be zero or positive, got -2ns");
    CHECK(invalid_argument_message([&] {
              c.reconfigure({.ttl = 1h, .max_entries = 1, .negative_ttl = -3ns});
          }) == "resilience::cache: negative_ttl must be zero or positive, got -3ns");
    CHECK_THAT(
        invalid_argument_message([&] {
            c.reconfigure({.ttl = 1h, .should_handle = [](const rs::outcome<long>& o) { return !o; }});
        }),
        Catch::Matchers::Contains("should_handle classifies rs::outcome<long> but the cache holds int"));
    // By behaviour: nothing evicted, still a second of freshness, two entries, its name and listener.
    CHECK(c.size() == 2);
    events.clear();
    sim.run([&]() -> rs::task<void> { co_await sim.sleep_for(1100ms - sim.now()); }());
    CHECK(sim.run(c.run("a", s)) == 3); // expired at 1.1s
    CHECK(sim.now() == 1200ms);
    CHECK(sim.run(c.run("c", s)) == 4);
    CHECK(c.size() == 2);
    resilience::stop_source stopped;
    stopped.request_stop();
    record gave_up;
    sim.run(caller(sim, c, "a", s, gave_up, stopped.get_token()));
    CHECK(cancelled_by(gave_up) == "q");
    REQUIRE(events.size() == 2);
    CHECK((events[0].kind == rs::telemetry_kind::cache_miss && events[0].at == 1100ms));
    CHECK(c.name() == "q");
    CHECK(c.options().ttl == 1s);
}

TEST_CASE("cache reconfigure: a call in flight finishes under the options it started with: its refresh's "
          "ttl, stale_if_error and negative_ttl, and its listener",
          "[cache][reconfigure]") {
    simulation sim;
    std::vector<heard> old_heard, new_heard;
    const rs::cache_options<int> old_options{
        .name = "old", .ttl = 1s, .stale_if_error = 10s, .telemetry = recorder(old_heard)};
    const rs::cache_options<int> new_options{
        .name = "new", .ttl = 5s, .negative_ttl = 1h, .telemetry = recorder(new_heard)};
    quotes c{old_options, sim.clock()};
    source s{sim, 100ms, {3}};
    // A miss at 0 makes call 1 under the old options; the new ones come at 50ms, and a caller joins at
    // 60ms under them. The value is stored at 100ms with the old ttl: fresh until 1.1s.
    record owner, joiner, expired;
    sim.spawn(caller(sim, c, "k", s, owner));
    sim.spawn(at(sim, 50ms, [&] { c.reconfigure(new_options); }));
    sim.spawn(after(sim, 60ms, policy_caller(sim, c.policy("k"), s, joiner)));
    sim.spawn(after(sim, 1100ms, caller(sim, c, "k", s, expired))); // call 2, under 5s: until 6.2s
    sim.run_all();
    CHECK((owner.value == 1 && owner.at == 100ms));
    CHECK((joiner.value == 1 && joiner.at == 100ms));
    CHECK((expired.value == 2 && expired.at == 1200ms));
    REQUIRE(old_heard.size() == 1);
    CHECK((old_heard[0].kind == rs::telemetry_kind::cache_miss && old_heard[0].at == 0ms));
    REQUIRE(new_heard.size() == 2);
    CHECK((new_heard[0].kind == rs::telemetry_kind::cache_miss && new_heard[0].at == 60ms));
    CHECK((new_heard[1].kind == rs::telemetry_kind::cache_miss && new_heard[1].at == 1100ms));

    // Back to the old options: call 3, made at 7s under them, fails at 7.1s after the new ones came
    // (no stale_if_error, failures remembered). It decides by its own: the stale value (6.2s + 10s)
    // for its callers, and no failure remembered.
    c.reconfigure(old_options);
    old_heard.clear();
    new_heard.clear();
    record failing_owner, failing_joiner, next;
    sim.spawn(after(sim, 7s - sim.now(), caller(sim, c, "k", s, failing_owner)));
    sim.spawn(at(sim, 7050ms, [&] { c.reconfigure(new_options); }));
    sim.spawn(after(sim, 7060ms - sim.now(), caller(sim, c, "k", s, failing_joiner)));
    sim.spawn(after(sim, 7200ms - sim.now(), caller(sim, c, "k", s, next))); // nothing remembered: call 4
    sim.run_all();
    CHECK((failing_owner.value == 2 && failing_owner.at == 7100ms));
    CHECK((failing_joiner.value == 2 && failing_joiner.at == 7100ms));
    CHECK((next.value == 4 && next.at == 7300ms));
    REQUIRE(old_heard.size() == 2);
    CHECK(old_heard[0].kind == rs::telemetry_kind::cache_miss);
    CHECK((old_heard[1].kind == rs::telemetry_kind::stale_served && old_heard[1].note == "stale_if_error" &&
           old_heard[1].duration == 900ms && old_heard[1].error));
    REQUIRE(new_heard.size() == 3);
    CHECK(new_heard[0].kind == rs::telemetry_kind::cache_miss);
    CHECK((new_heard[1].kind == rs::telemetry_kind::stale_served && new_heard[1].at == 7100ms));
    CHECK((new_heard[2].kind == rs::telemetry_kind::cache_miss && new_heard[2].at == 7200ms));
    CHECK(s.calls() == 4);
}

TEST_CASE("cache reconfigure: a caller's cancellation carries the name of the options it started with",
          "[cache][reconfigure]") {
    simulation sim;
    quotes c{{.name = "first", .ttl = 1s}, sim.clock()};
    source s{sim};
    c.reconfigure({.name = "second", .ttl = 1s});
    record owner, joiner, unnamed;
    resilience::stop_source stop_owner, stop_joiner, stop_unnamed;
    sim.spawn(caller(sim, c, "k", s, owner, stop_owner.get_token())); // makes call 1 under "second"
    sim.spawn(at(sim, 10ms, [&] { c.reconfigure({.name = "third", .ttl = 1s}); }));
    sim.spawn(after(sim, 20ms, caller(sim, c, "k", s, joiner, stop_joiner.get_token())));
    sim.spawn(at(sim, 25ms, [&] { c.reconfigure({.ttl = 1s}); }));
    sim.spawn(after(sim, 26ms, policy_caller(sim, c.policy("k"), s, unnamed, stop_unnamed.get_token())));
    sim.spawn(stop_at(sim, stop_joiner, 30ms));
    sim.spawn(stop_at(sim, stop_unnamed, 35ms));
    sim.spawn(stop_at(sim, stop_owner, 40ms));
    sim.run_all();
    CHECK((cancelled_by(joiner) == "third" && joiner.at == 30ms));
    CHECK((cancelled_by(unnamed).empty() && unnamed.at == 35ms));
    CHECK((cancelled_by(owner) == "second" && owner.at == 40ms)); // the last one: the call is stopped
    CHECK(s.stopped() == 1);
    CHECK(c.name().empty());
}

TEST_CASE("cache reconfigure: a background refresh in flight finishes under the options of the caller that "
          "started it",
          "[cache][reconfigure][stale]") {
    simulation sim;
    quotes c{{.ttl = 1s, .stale_while_revalidate = 5s}, sim.clock()};
    source s{sim};
    CHECK(sim.run(c.run("k", s)) == 1); // fresh until 1.1s
    record stale, hit, stale_again, long_fresh;
    sim.spawn(after(sim, 2s - sim.now(), caller(sim, c, "k", s, stale))); // call 2 in the background
    sim.spawn(at(sim, 2050ms, [&] { c.reconfigure({.ttl = 10s, .stale_while_revalidate = 5s}); }));
    // Call 2 stores at 2.1s under the old ttl: fresh until 3.1s.
    sim.spawn(after(sim, 3099ms - sim.now(), caller(sim, c, "k", s, hit)));
    sim.spawn(after(sim, 3100ms - sim.now(), caller(sim, c, "k", s, stale_again))); // call 3: until 13.2s
    sim.spawn(after(sim, 13199ms - sim.now(), caller(sim, c, "k", s, long_fresh)));
    sim.run_all();
    CHECK((stale.value == 1 && stale.at == 2s));
    CHECK((hit.value == 2 && hit.at == 3099ms));
    CHECK((stale_again.value == 2 && stale_again.at == 3100ms));
    CHECK((long_fresh.value == 3 && long_fresh.at == 13199ms));
    REQUIRE(s.calls() == 3);
    CHECK((s.starts()[1] == 2s && s.starts()[2] == 3100ms));
}

TEST_CASE("cache reconfigure: options() shows the new options through every copy, and a copy taken before "
          "keeps the old ones",
          "[cache][reconfigure]") {
    const rs::cache<int, int> c{{.name = "before", .ttl = 1s}};
    const rs::cache<int, int> copy = c;
    const rs::cache_options<int> before = c.options();
    copy.reconfigure({.name = "after", .ttl = 2s, .max_entries = 7});
    CHECK((before.name == "before" && before.ttl == 1s));
    CHECK((c.options().name == "after" && c.options().ttl == 2s && c.options().max_entries == 7));
    CHECK(c.name() == "after");
    CHECK(copy.name() == "after");
}

namespace {

// Like `counted_action`, but every fifth call fails.
struct flaky_action {
    std::atomic<int>* started;
    int key;
    rs::task<int> operator()(resilience::stop_token) const { return call(started, key); }
    static rs::task<int> call(std::atomic<int>* started, int key) {
        const int id = started->fetch_add(1) + 1;
        for (int i = 0; i < 3; ++i)
            co_await yield_now{};
        if (id % 5 == 0)
            throw std::runtime_error("flaky");
        co_return id* keys + key;
    }
};

// What one caller of the threaded test saw: calls made and ended, values, and any value of another key.
struct reconfigured_results {
    int calls = 0;
    int completions = 0;
    int values = 0;
    bool wrong_key = false;
};

// Calls its key again and again, through `run` or the policy form, until `changes` reconfigurations
// have been made (at least ten times, at most 5,000), so that the reconfigurations happen while it calls.
rs::task<void> reconfigured_caller(rs::cache<int, int> c, std::atomic<int>* started,
                                   const std::atomic<int>* reconfigurations, int changes, int index,
                                   reconfigured_results* out) {
    const int key = index % keys;
    for (int i = 0; i < 10 || (i < 5'000 && reconfigurations->load() < changes); ++i) {
        ++out->calls;
        rs::outcome<int> r = rs::failure::make(std::logic_error("not called"));
        if ((index + i) % 3 == 0) {
            const auto p = c.policy(key);
            r = co_await p.execute_outcome(flaky_action{started, key});
        } else {
            r = co_await c.run_outcome(key, flaky_action{started, key});
        }
        // Not the failure's contents: an exception the cache remembers is freed by whichever thread
        // drops it last, through a count ThreadSanitizer does not see (libstdc++'s exception_ptr).
        if (r) {
            ++out->values;
            if (*r % keys != key)
                out->wrong_key = true;
        }
        (void)c.options().name.size(); // the options in force, read while they are replaced
        ++out->completions;
    }
}

} // namespace

TEST_CASE("cache reconfigure: four threads call while another reconfigures, and every call ends once with a "
          "value of its own key or a failure",
          "[cache][reconfigure][concurrency]") {
    std::atomic<int> heard{0};
    const rs::cache_options<int> shapes[] = {
        {.name = "a", .ttl = 20us, .stale_while_revalidate = 20us, .max_entries = 3},
        {.name = "b", .ttl = 5us, .stale_if_error = 50us, .max_entries = 1, .negative_ttl = 10us},
        {.name = "c",
         .ttl = 50us,
         .stale_while_revalidate = 5us,
         .stale_if_error = 5us,
         .max_entries = 4,
         .negative_ttl = 1us,
         .telemetry =
             [&heard](const rs::telemetry_event&) { heard.fetch_add(1, std::memory_order_relaxed); }},
    };
    constexpr int changes = 500, per_loop = 16;
    const rs::cache<int, int> c{shapes[0]};
    std::atomic<int> started{0}, reconfigurations{0};
    std::vector<reconfigured_results> results(4 * per_loop);
    {
        rs::event_loop l0, l1, l2, l3;
        rs::event_loop* const all[] = {&l0, &l1, &l2, &l3};
        for (int l = 0; l < 4; ++l)
            for (int i = 0; i < per_loop; ++i) {
                const int index = l * per_loop + i;
                all[l]->spawn(reconfigured_caller(c, &started, &reconfigurations, changes, index,
                                                  &results[static_cast<std::size_t>(index)]));
            }
        std::thread changer([&] {
            while (started.load() == 0)
                std::this_thread::yield(); // from the first call on, while the callers call
            for (int n = 1; n <= changes; ++n) {
                c.reconfigure(shapes[n % 3]);
                reconfigurations.fetch_add(1);
            }
        });
        resilience_tests::run_on_threads(l0, l1, l2, l3);
        changer.join();
    }
    int calls = 0, values = 0;
    for (const auto& r : results) {
        REQUIRE(r.completions == r.calls);
        REQUIRE_FALSE(r.wrong_key);
        calls += r.calls;
        values += r.values;
    }
    CHECK(calls >= 4 * per_loop * 10);
    CHECK(values > 0);
    CHECK(reconfigurations.load() == changes);
    CHECK(c.in_flight() == 0);
    CHECK(c.size() <= 4);
    CHECK(c.name() == "c"); // the last one: shapes[500 % 3]
}

// ---------------------------------------------------------------------------------------------------------
// The model

TEST_CASE("model: the cache answers, refreshes, remembers and evicts as its model", "[model][cache]") {
    resilience_models::run_scenarios(1000, resilience_models::check_cache);
}

} // namespace test_cache
