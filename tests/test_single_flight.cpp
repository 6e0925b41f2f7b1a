// SPDX-License-Identifier: MIT
#include "catch.hpp"
#include "support.hpp"

#include <resilience/event_loop.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/retry.hpp>
#include <resilience/single_flight.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace test_single_flight {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_tests::stop_at;
using resilience_tests::yield_now;

namespace {

using flights = rs::single_flight<std::string, int>;

// What one caller saw, and when.
struct record {
    std::optional<int> value;
    std::exception_ptr error;
    std::chrono::nanoseconds at{-1};
    bool cancelled() const {
        try {
            if (error)
                std::rethrow_exception(error);
        } catch (const rs::cancelled_error&) {
            return true;
        } catch (...) {
        }
        return false;
    }
};

template <class A>
rs::task<void> caller(rs::testing::simulation& sim, flights sf, std::string key, A act, record& out,
                      resilience::stop_token token = {}) {
    try {
        out.value = co_await sf.run(std::move(key), act, std::move(token));
    } catch (...) {
        out.error = std::current_exception();
    }
    out.at = sim.now();
}

template <class P, class A>
rs::task<void> policy_caller(rs::testing::simulation& sim, P p, A act, record& out,
                             resilience::stop_token token = {}) {
    try {
        out.value = co_await p.execute(act, std::move(token));
    } catch (...) {
        out.error = std::current_exception();
    }
    out.at = sim.now();
}

rs::task<void> after(rs::testing::simulation& sim, std::chrono::nanoseconds d, rs::task<void> then) {
    co_await sim.sleep_for(d);
    co_await std::move(then);
}

rs::task<void> at(rs::testing::simulation& sim, std::chrono::nanoseconds when, std::function<void()> f) {
    co_await sim.sleep_for(when);
    f();
}

auto slow(rs::testing::simulation& sim, int failures = 0) {
    return rs::testing::scripted_action{
        sim.clock(), rs::testing::script<int>{.failures = failures, .latency = 100ms, .value = 42}};
}

} // namespace

TEST_CASE("single_flight: concurrent callers of one key share one call and all get its value at its end",
          "[single_flight]") {
    rs::testing::simulation sim;
    flights sf;
    auto act = slow(sim);
    record r[3];
    for (auto& rec : r)
        sim.spawn(caller(sim, sf, "rates", act, rec));
    std::size_t in_flight_midway = 0;
    bool contained_midway = false;
    sim.spawn(at(sim, 50ms, [&] {
        in_flight_midway = sf.in_flight();
        contained_midway = sf.contains("rates");
    }));
    sim.run_all();
    CHECK(act.calls() == 1);
    for (auto& rec : r) {
        CHECK(rec.value == 42);
        CHECK(rec.at == 100ms);
    }
    CHECK(in_flight_midway == 1);
    CHECK(contained_midway);
    CHECK(sf.in_flight() == 0);
    CHECK_FALSE(sf.contains("rates"));
}

TEST_CASE("single_flight: options() gives its options, and copies share them", "[single_flight]") {
    const flights named{rs::single_flight_options{.name = "profiles"}};
    const flights copy = named;
    CHECK(copy.options().name == "profiles");
    CHECK(&copy.options() == &named.options());
    CHECK(flights{}.options().name.empty());
}

TEST_CASE("single_flight: different keys run separate calls", "[single_flight]") {
    rs::testing::simulation sim;
    flights sf;
    auto act = slow(sim);
    record r[3];
    sim.spawn(caller(sim, sf, "a", act, r[0]));
    sim.spawn(caller(sim, sf, "b", act, r[1]));
    sim.spawn(caller(sim, sf, "a", act, r[2]));
    std::size_t in_flight_midway = 0;
    sim.spawn(at(sim, 50ms, [&] { in_flight_midway = sf.in_flight(); }));
    sim.run_all();
    CHECK(act.calls() == 2);
    CHECK(in_flight_midway == 2);
    for (auto& rec : r) {
        CHECK(rec.value == 42);
        CHECK(rec.at == 100ms);
    }
}

TEST_CASE("single_flight: a failure is shared, the same exception object for every caller",
          "[single_flight]") {
    rs::testing::simulation sim;
    flights sf;
    auto act = slow(sim, 1);
    record r[3];
    for (auto& rec : r)
        sim.spawn(caller(sim, sf, "k", act, rec));
    sim.run_all();
    CHECK(act.calls() == 1);
    REQUIRE(r[0].error);
    CHECK(r[0].error == r[1].error);
    CHECK(r[0].error == r[2].error);
    CHECK_THROWS_AS(std::rethrow_exception(r[0].error), rs::testing::scripted_failure);
    for (auto& rec : r)
        CHECK(rec.at == 100ms);

    auto outcome = sim.run(sf.run_outcome("k", slow(sim, 1)));
    REQUIRE(outcome.has_failure());
    CHECK(outcome.error().is<rs::testing::scripted_failure>());
}

TEST_CASE("single_flight: nothing is kept once a call settles: the next caller starts a new call",
          "[single_flight]") {
    rs::testing::simulation sim;
    flights sf;
    auto act = slow(sim);
    record first, second;
    sim.spawn(caller(sim, sf, "k", act, first));
    sim.spawn(after(sim, 150ms, caller(sim, sf, "k", act, second)));
    bool contained_between = true;
    sim.spawn(at(sim, 120ms, [&] { contained_between = sf.contains("k"); }));
    sim.run_all();
    CHECK(act.calls() == 2);
    CHECK(first.at == 100ms);
    CHECK(second.at == 250ms);
    CHECK(second.value == 42);
    CHECK_FALSE(contained_between);
}

TEST_CASE("single_flight: a caller that stops leaves at once, the others still get the value",
          "[single_flight]") {
    rs::testing::simulation sim;
    flights sf;
    auto act = slow(sim);
    record r[3];
    resilience::stop_source stop;
    sim.spawn(caller(sim, sf, "k", act, r[0]));
    sim.spawn(caller(sim, sf, "k", act, r[1], stop.get_token()));
    sim.spawn(caller(sim, sf, "k", act, r[2]));
    sim.spawn(stop_at(sim, stop, 50ms));
    sim.run_all();
    CHECK(act.calls() == 1);
    CHECK(act.stopped() == 0);
    CHECK(r[1].cancelled());
    CHECK(r[1].at == 50ms);
    CHECK(r[0].value == 42);
    CHECK(r[0].at == 100ms);
    CHECK(r[2].value == 42);
    CHECK(r[2].at == 100ms);
}

// The owner runs the shared call in its own frame, so when it stops it stays until the call ends
// (it used to leave at once, the call running on detached): its result is then cancelled_error,
// while the caller still attached gets the value.
TEST_CASE("single_flight: when the owner stops while another caller is attached, the call runs on for it",
          "[single_flight]") {
    rs::testing::simulation sim;
    flights sf;
    auto act = slow(sim);
    record owner, other;
    resilience::stop_source stop;
    sim.spawn(caller(sim, sf, "k", act, owner, stop.get_token()));
    sim.spawn(after(sim, 10ms, caller(sim, sf, "k", act, other)));
    sim.spawn(stop_at(sim, stop, 20ms));
    bool contained_at_50 = false;
    sim.spawn(at(sim, 50ms, [&] { contained_at_50 = sf.contains("k"); }));
    sim.run_all();
    CHECK(owner.cancelled());
    CHECK(owner.at == 100ms);
    CHECK(other.value == 42);
    CHECK(other.at == 100ms);
    CHECK(contained_at_50); // the owner's stop does not free the key while another caller waits
    CHECK(act.calls() == 1);
    CHECK(act.stopped() == 0);
}

TEST_CASE("single_flight: the action may capture the owner's locals by reference, even when the owner stops",
          "[single_flight]") {
    rs::testing::simulation sim;
    flights sf;
    record owner, other;
    resilience::stop_source stop;
    auto owning = [&]() -> rs::task<void> {
        // On the heap, so a read after this frame ended would be a use after free under ASan.
        const std::string local(40, 'x');
        auto act = [&](resilience::stop_token) -> rs::task<int> {
            co_await sim.sleep_for(100ms);
            co_return static_cast<int>(local.size()) + 2; // read after the suspension
        };
        try {
            owner.value = co_await sf.run("k", act, stop.get_token());
        } catch (...) {
            owner.error = std::current_exception();
        }
        owner.at = sim.now();
    };
    auto unused = [](resilience::stop_token) -> rs::task<int> { co_return 0; };
    sim.spawn(owning());
    sim.spawn(after(sim, 10ms, caller(sim, sf, "k", unused, other)));
    sim.spawn(stop_at(sim, stop, 20ms));
    sim.run_all();
    CHECK(other.value == 42);
    CHECK(other.at == 100ms);
    CHECK(owner.cancelled());
    CHECK(owner.at == 100ms);
}

TEST_CASE("single_flight: when every caller has stopped, the shared call is stopped and the key is free",
          "[single_flight]") {
    rs::testing::simulation sim;
    flights sf;
    auto act = slow(sim);
    record r[2], fresh;
    resilience::stop_source s0, s1;
    sim.spawn(caller(sim, sf, "k", act, r[0], s0.get_token()));
    sim.spawn(caller(sim, sf, "k", act, r[1], s1.get_token()));
    sim.spawn(stop_at(sim, s0, 30ms));
    sim.spawn(stop_at(sim, s1, 50ms));
    bool contained_at_40 = false, contained_at_60 = true;
    int stopped_at_60 = 0;
    sim.spawn(at(sim, 40ms, [&] { contained_at_40 = sf.contains("k"); }));
    sim.spawn(at(sim, 60ms, [&] {
        contained_at_60 = sf.contains("k");
        stopped_at_60 = act.stopped();
    }));
    sim.spawn(after(sim, 70ms, caller(sim, sf, "k", act, fresh)));
    sim.run_all();
    // r[0] owns the call: its stop alone stopped nothing, and it stays until the call, stopped by the
    // last caller at 50ms, has ended (before the call ran in its frame it left at 30ms).
    CHECK(r[0].cancelled());
    CHECK(r[0].at == 50ms);
    CHECK(r[1].cancelled());
    CHECK(r[1].at == 50ms);
    CHECK(contained_at_40);
    CHECK_FALSE(contained_at_60);
    CHECK(stopped_at_60 == 1);
    CHECK(act.stopped() == 1);
    CHECK(act.calls() == 2); // the caller at 70ms started a fresh call
    CHECK(fresh.value == 42);
    CHECK(fresh.at == 170ms);
    CHECK(sf.in_flight() == 0);
}

TEST_CASE("single_flight: a last caller's stop that finishes the shared call inside its own request, "
          "another callback on the call's token pending, is cancellation at that instant",
          "[single_flight]") {
    // The owner's stop stops the shared call, whose action is resumed from inside that request and
    // ends the call, the owner and its frame before the call's stop state has run its other
    // callback: that state must outlive the call until the request is done with it.
    rs::testing::simulation sim;
    flights sf;
    record r;
    resilience::stop_source s;
    sim.spawn(caller(sim, sf, "k", resilience_tests::ends_inside_its_stop, r, s.get_token()));
    sim.spawn(stop_at(sim, s, 3s));
    sim.run_all();
    CHECK(r.cancelled());
    CHECK(r.at == 3s);
    CHECK_FALSE(sf.contains("k"));
    CHECK(sf.in_flight() == 0);
}

TEST_CASE("single_flight: a caller whose token is already stopped starts nothing", "[single_flight]") {
    rs::testing::simulation sim;
    flights sf;
    auto act = slow(sim);
    resilience::stop_source stop;
    stop.request_stop();
    CHECK_THROWS_AS(sim.run(sf.run("k", act, stop.get_token())), rs::cancelled_error);
    CHECK(act.calls() == 0);
    CHECK(sim.now() == 0ms);
    CHECK(sf.in_flight() == 0);
}

TEST_CASE("single_flight: copies of the handle share the calls", "[single_flight]") {
    rs::testing::simulation sim;
    flights sf;
    flights copy = sf;
    auto act = slow(sim);
    record a, b;
    sim.spawn(caller(sim, sf, "k", act, a));
    sim.spawn(caller(sim, copy, "k", act, b));
    sim.run_all();
    CHECK(act.calls() == 1);
    CHECK(a.value == 42);
    CHECK(b.value == 42);
}

TEST_CASE("single_flight: void results are shared too", "[single_flight]") {
    rs::testing::simulation sim;
    rs::single_flight<int, void> sf;
    int calls = 0;
    auto action = [&](resilience::stop_token) -> rs::task<void> {
        ++calls;
        co_await sim.sleep_for(100ms);
    };
    auto one = [&]() -> rs::task<void> { co_await sf.run(7, action); };
    sim.spawn(one());
    sim.spawn(one());
    sim.run_all();
    CHECK(calls == 1);
    CHECK(sim.now() == 100ms);
}

TEST_CASE("single_flight: the policy form shares the whole wrapped call among callers of its key",
          "[single_flight]") {
    rs::testing::simulation sim;
    flights sf;
    STATIC_REQUIRE(rs::policy<flights::keyed_policy>);
    auto act = slow(sim);
    record r[3];
    for (auto& rec : r)
        sim.spawn(policy_caller(sim, sf.policy("k"), act, rec));
    sim.run_all();
    CHECK(act.calls() == 1);
    for (auto& rec : r) {
        CHECK(rec.value == 42);
        CHECK(rec.at == 100ms);
    }

    // Inside a pipeline: the timeout runs once, and its failure is shared.
    record t[3];
    const auto start = sim.now();
    for (auto& rec : t)
        sim.spawn(policy_caller(sim, rs::pipeline{sf.policy("k"), rs::timeout{50ms, sim.clock()}}, act, rec));
    sim.run_all();
    CHECK(act.calls() == 2);
    CHECK(act.stopped() == 1);
    REQUIRE(t[0].error);
    CHECK_THROWS_AS(std::rethrow_exception(t[0].error), rs::timeout_error);
    for (auto& rec : t) {
        CHECK(rec.error == t[0].error);
        CHECK(rec.at == start + 50ms);
    }
}

TEST_CASE("single_flight: the policy form outside a retry shares the whole retried call", "[single_flight]") {
    rs::testing::simulation sim;
    flights sf;
    auto act = rs::testing::scripted_action{
        sim.clock(), rs::testing::script<int>{.failures = 2, .latency = 100ms, .value = 42}};
    record r[3];
    for (auto& rec : r)
        sim.spawn(policy_caller(
            sim,
            rs::pipeline{sf.policy("k"), rs::retry{{.max_attempts = 3,
                                                    .backoff = rs::constant_backoff{10ms, rs::jitter::none}},
                                                   sim.clock()}},
            act, rec));
    sim.run_all();
    CHECK(act.calls() == 3); // one retried call, not three
    for (auto& rec : r) {
        CHECK(rec.value == 42);
        CHECK(rec.at == 320ms);
    }
}

TEST_CASE("single_flight: in the policy form the starting caller stays until the shared call ends",
          "[single_flight]") {
    rs::testing::simulation sim;
    flights sf;
    auto act = slow(sim);

    SECTION("others still wait: it is detached, and returns when the call ends") {
        record starter, other;
        resilience::stop_source stop;
        sim.spawn(policy_caller(sim, sf.policy("k"), act, starter, stop.get_token()));
        sim.spawn(after(sim, 10ms, policy_caller(sim, sf.policy("k"), act, other)));
        sim.spawn(stop_at(sim, stop, 20ms));
        sim.run_all();
        CHECK(starter.cancelled());
        CHECK(starter.at == 100ms);
        CHECK(other.value == 42);
        CHECK(other.at == 100ms);
        CHECK(act.stopped() == 0);
    }
    SECTION("it is the last: the shared call is stopped and it returns as soon as that ends") {
        record starter, other;
        resilience::stop_source s0, s1;
        sim.spawn(policy_caller(sim, sf.policy("k"), act, starter, s0.get_token()));
        sim.spawn(after(sim, 10ms, policy_caller(sim, sf.policy("k"), act, other, s1.get_token())));
        sim.spawn(stop_at(sim, s1, 20ms));
        sim.spawn(stop_at(sim, s0, 30ms));
        sim.run_all();
        CHECK(other.cancelled());
        CHECK(other.at == 20ms);
        CHECK(starter.cancelled());
        CHECK(starter.at == 30ms);
        CHECK(act.stopped() == 1);
        CHECK_FALSE(sf.contains("k"));
    }
    CHECK(act.calls() == 1);
}

namespace {

// Suspends for good: nothing ever resumes it, only the destruction of its loop ends it.
struct never {
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<>) const noexcept {}
    void await_resume() const noexcept {}
};

} // namespace

TEST_CASE("single_flight: a loop destroyed with a shared call pending frees the key and wakes the attached "
          "callers",
          "[single_flight]") {
    flights sf;
    std::optional<rs::testing::simulation> doomed;
    doomed.emplace();
    int parked_calls = 0;
    auto parked = [&](resilience::stop_token) -> rs::task<int> {
        ++parked_calls;
        co_await never{};
        co_return 0;
    };
    record owner, attached_on_doomed, attached_elsewhere, fresh;
    // Spawned first, attaching at 10ms: destroyed after the owner (a loop destroys the coroutines it
    // holds newest first), so the owner's teardown releases it into the loop being destroyed.
    doomed->spawn(after(*doomed, 10ms, caller(*doomed, sf, "k", parked, attached_on_doomed)));
    SECTION("the owner called run") {
        doomed->spawn(caller(*doomed, sf, "k", parked, owner));
    }
    SECTION("the owner called through the policy form") {
        doomed->spawn(policy_caller(*doomed, sf.policy("k"), parked, owner));
    }
    // Nothing will resume the parked action: the loop says it is stuck and returns, the call pending.
    CHECK_THROWS_AS(doomed->run_all(), std::logic_error);
    CHECK(sf.contains("k"));

    rs::testing::simulation sim;
    auto act = slow(sim);
    bool contained_after_teardown = true;
    sim.spawn(caller(sim, sf, "k", act, attached_elsewhere));
    sim.spawn(at(sim, 10ms, [&] {
        doomed.reset();
        contained_after_teardown = sf.contains("k");
    }));
    sim.spawn(after(sim, 20ms, caller(sim, sf, "k", act, fresh)));
    sim.run_all();
    CHECK_FALSE(contained_after_teardown);
    CHECK(attached_elsewhere.cancelled());
    CHECK(attached_elsewhere.at == 10ms);
    CHECK(fresh.value == 42); // a fresh call, not the dead one
    CHECK(fresh.at == 120ms);
    CHECK(act.calls() == 1);
    CHECK(parked_calls == 1);
    CHECK(owner.at == -1ns); // neither the owner nor the caller on its loop ever resumed
    CHECK(attached_on_doomed.at == -1ns);
    CHECK(sf.in_flight() == 0);
}

// ---- concurrency ------------------------------------------------------------------------------------

namespace {

constexpr int keys = 4;

struct counters {
    std::atomic<int> started{0};
    std::atomic<int> finished{0};
    std::atomic<int> stopped{0};
};

// An action that yields a few times so calls overlap; returns a unique id that encodes its key.
struct counted_action {
    counters* c;
    int key;
    rs::task<int> operator()(resilience::stop_token st) const {
        const int id = c->started.fetch_add(1) + 1;
        struct done {
            counters* c;
            ~done() { c->finished.fetch_add(1); }
        } guard{c};
        for (int i = 0; i < 3; ++i) {
            co_await yield_now{};
            if (st.stop_requested()) {
                c->stopped.fetch_add(1);
                throw rs::cancelled_error{};
            }
        }
        co_return id* keys + key;
    }
};

struct caller_result {
    int completions = 0;
    int value = -1;
    bool cancelled = false;
    bool stop_was_requested = false;
    bool other_error = false;
};

// Requests a stop from the other loop's thread, owning its copy of the stop source.
void stop_from(rs::event_loop& other, const resilience::stop_source& src) {
    auto* owned = new resilience::stop_source(src);
    other.post(
        [](void* p) {
            auto* s = static_cast<resilience::stop_source*>(p);
            s->request_stop();
            delete s;
        },
        owned);
}

rs::task<void> concurrent_caller(flights sf, counters* c, int index, caller_result* out,
                                 rs::event_loop* other, bool stops) {
    const int key = index % keys;
    for (int i = 0; i < (index / keys) % 40; ++i)
        co_await yield_now{}; // spread the arrivals
    resilience::stop_source src;
    if (stops)
        stop_from(*other, src);
    try {
        out->value = co_await sf.run(std::to_string(key), counted_action{c, key}, src.get_token());
    } catch (const rs::cancelled_error&) {
        out->cancelled = true;
    } catch (...) {
        out->other_error = true;
    }
    out->stop_was_requested = src.stop_requested();
    ++out->completions;
}

void run_two_loops(flights sf, counters& c, std::vector<caller_result>& results, bool with_stops) {
    rs::event_loop loops[2];
    const int per_loop = static_cast<int>(results.size()) / 2;
    for (int l = 0; l < 2; ++l)
        for (int i = 0; i < per_loop; ++i) {
            const int index = l * per_loop + i;
            loops[l].spawn(concurrent_caller(sf, &c, index, &results[static_cast<std::size_t>(index)],
                                             &loops[1 - l], with_stops && index % 2 == 0));
        }
    resilience_tests::run_on_threads(loops[0], loops[1]);
    // A stop posted to a loop that had already finished is still pending: run it (it finds its
    // caller gone, and only releases the stop source it owns).
    loops[0].run();
    loops[1].run();
}

} // namespace

TEST_CASE("single_flight: callers on two loops share calls per key, every caller completes exactly once",
          "[single_flight][concurrency]") {
    flights sf;
    counters c;
    std::vector<caller_result> results(4000);
    run_two_loops(sf, c, results, false);

    std::map<int, int> receivers; // call id -> callers that received its value
    for (std::size_t i = 0; i < results.size(); ++i) {
        const auto& r = results[i];
        REQUIRE(r.completions == 1);
        REQUIRE_FALSE(r.cancelled);
        REQUIRE_FALSE(r.other_error);
        REQUIRE(r.value % keys == static_cast<int>(i) % keys); // the result of a call of its own key
        ++receivers[r.value];
    }
    int received = 0;
    for (const auto& [id, n] : receivers) {
        CHECK(id / keys <= c.started.load());
        received += n;
    }
    CHECK(received == static_cast<int>(results.size()));
    CHECK(c.started.load() > 0);
    CHECK(c.started.load() <= static_cast<int>(results.size()));
    CHECK(static_cast<int>(receivers.size()) == c.started.load()); // every call's value reached someone
    CHECK(c.finished.load() == c.started.load());
    CHECK(sf.in_flight() == 0);
}

TEST_CASE("single_flight: callers stopped from another thread leave alone, only their own stop cancels them",
          "[single_flight][concurrency]") {
    flights sf;
    counters c;
    std::vector<caller_result> results(4000);
    run_two_loops(sf, c, results, true);

    int cancelled = 0, valued = 0;
    for (std::size_t i = 0; i < results.size(); ++i) {
        const auto& r = results[i];
        REQUIRE(r.completions == 1);
        REQUIRE_FALSE(r.other_error);
        if (r.cancelled) {
            REQUIRE(r.stop_was_requested); // never another caller's cancellation
            REQUIRE(i % 2 == 0);
            ++cancelled;
        } else {
            REQUIRE(r.value % keys == static_cast<int>(i) % keys);
            ++valued;
        }
    }
    CHECK(cancelled + valued == static_cast<int>(results.size()));
    CHECK(valued >= static_cast<int>(results.size()) / 2);
    CHECK(c.started.load() > 0);
    CHECK(c.started.load() <= static_cast<int>(results.size()));
    CHECK(c.finished.load() == c.started.load());
    CHECK(sf.in_flight() == 0);
}

} // namespace test_single_flight
