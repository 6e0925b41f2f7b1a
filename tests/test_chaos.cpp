// SPDX-License-Identifier: MIT
// chaos::fault, chaos::latency, chaos::outcome: validation, exact injection counts for a seed, the
// toggle flipped while calls run, injected delays at exact virtual instants and their cancellation,
// substitute results, and composition with retry and timeout.

#include "catch.hpp"
#include "support.hpp"

#include <resilience/chaos.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/retry.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>
#include <resilience/when_all.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace test_chaos {

namespace rs = resilience;
namespace chaos = resilience::chaos;
using namespace std::chrono_literals;
using resilience_tests::invalid_argument_message;
using resilience_tests::stop_at;
using rs::testing::simulation;
using rs::testing::virtual_clock;
using std::chrono::nanoseconds;

static_assert(rs::policy<chaos::fault<>>);
static_assert(rs::policy<chaos::fault<rs::seeded_random>>);
static_assert(rs::policy<chaos::latency<virtual_clock>>);
static_assert(rs::policy<chaos::outcome<int>>);
// What a substitute may stand for, checked at compile time (see also compile_fail/).
static_assert(chaos::detail::substitutes_for<int, int>);
static_assert(chaos::detail::substitutes_for<const char*, std::string>);
static_assert(chaos::detail::substitutes_for<rs::failure, std::vector<int>>);
static_assert(!chaos::detail::substitutes_for<int, std::vector<int>>); // explicit constructors do not count
static_assert(!chaos::detail::substitutes_for<std::string, int>);
static_assert(!chaos::detail::substitutes_for<rs::outcome<long>, int>);

namespace {

// How many of `n` draws from seeded_random{seed} fall under `rate`: what a stage injects.
int replayed(std::uint64_t seed, double rate, int n) {
    rs::seeded_random replay{seed};
    int hits = 0;
    for (int i = 0; i < n; ++i)
        hits += rs::detail::unit_random(replay) < rate ? 1 : 0;
    return hits;
}

struct boom : std::runtime_error {
    boom() : std::runtime_error("boom") {}
};

} // namespace

TEST_CASE("chaos: an injection rate outside [0, 1] is refused, naming the field", "[chaos]") {
    const std::string high = invalid_argument_message([] { chaos::fault{{.injection_rate = 1.5}}; });
    CHECK(high == "resilience::chaos::fault: injection_rate must be in [0, 1], got 1.5");
    const std::string named = invalid_argument_message([] {
        chaos::outcome{1, {.name = "bad", .injection_rate = -0.1}};
    });
    CHECK(named == "resilience::chaos::outcome (bad): injection_rate must be in [0, 1], got -0.1");
    CHECK_THROWS_AS(chaos::latency(1s, {.injection_rate = std::nan("")}), std::invalid_argument);
    const std::string negative =
        invalid_argument_message([] { chaos::latency(-1ms, {.injection_rate = 1}); });
    CHECK(negative == "resilience::chaos::latency: delay must not be negative, got -1000000ns");
    CHECK_THROWS_AS(chaos::fault(rs::failure{}), std::invalid_argument);
    CHECK_THROWS_AS(chaos::fault(std::exception_ptr{}), std::invalid_argument);
    CHECK_NOTHROW(chaos::fault{{.injection_rate = 0}});
    CHECK_NOTHROW(chaos::fault{{.injection_rate = 1}});
    CHECK(chaos::injection_options{}.injection_rate == 0.001); // Simmy's default
}

TEST_CASE("chaos: a fault at rate 0.25 over 10000 seeded calls injects an exact count", "[chaos]") {
    simulation sim;
    chaos::fault f{boom{}, {.injection_rate = 0.25}, rs::seeded_random{42}};
    int ran = 0;
    int failed = 0;
    const auto action = [&]() -> rs::task<int> {
        ++ran;
        co_return 1;
    };
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 10000; ++i)
            if (!(co_await f.execute_outcome(action)))
                ++failed;
    }());
    CHECK(failed == 2433);
    CHECK(failed == replayed(42, 0.25, 10000));
    CHECK(ran == 10000 - failed); // an injected call never reaches the action
}

TEST_CASE("chaos: an outcome at rate 0.5 and a latency at rate 0.1 inject exact counts", "[chaos]") {
    simulation sim;
    chaos::outcome substitute{-1, {.injection_rate = 0.5}, rs::seeded_random{42}};
    chaos::latency slow{1s, {.injection_rate = 0.1}, sim.clock(), rs::seeded_random{42}};
    const auto action = []() -> rs::task<int> { co_return 1; };
    int substituted = 0;
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 10000; ++i)
            if (co_await substitute.execute(action) == -1)
                ++substituted;
        for (int i = 0; i < 10000; ++i)
            co_await slow.execute(action);
    }());
    CHECK(substituted == 4978);
    CHECK(substituted == replayed(42, 0.5, 10000));
    // Each delayed call took exactly one second, the others none.
    CHECK(sim.now() == 961 * 1s);
    CHECK(961 == replayed(42, 0.1, 10000));
}

TEST_CASE("chaos: the same seed replays the same decisions, and calls made while off draw nothing",
          "[chaos]") {
    simulation sim;
    chaos::toggle on;
    chaos::fault f{boom{}, {.injection_rate = 0.5, .enabled = on}, rs::seeded_random{7}};
    const auto action = []() -> rs::task<int> { co_return 1; };
    std::string pattern;
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 12; ++i) {
            pattern += (co_await f.execute_outcome(action)) ? '0' : '1';
            on.disable(); // a call in between with the switch off: it runs, and draws nothing
            CHECK((co_await f.execute_outcome(action)).has_value());
            on.enable();
        }
    }());
    std::string expected;
    rs::seeded_random replay{7};
    for (int i = 0; i < 12; ++i)
        expected += rs::detail::unit_random(replay) < 0.5 ? '1' : '0';
    CHECK(pattern == expected);
    CHECK(pattern == "110011111110");
}

TEST_CASE("chaos: the toggle turns injection off and on while calls run", "[chaos]") {
    simulation sim;
    chaos::toggle rehearsal{false};
    CHECK_FALSE(rehearsal.enabled());
    // Two stages on one switch.
    rs::pipeline p{chaos::latency{2s, {.injection_rate = 1, .enabled = rehearsal}, sim.clock()},
                   chaos::fault{boom{}, {.injection_rate = 1, .enabled = rehearsal}}};
    CHECK(p.get<0>().options().enabled == rehearsal);
    const auto action = []() -> rs::task<int> { co_return 1; };
    struct call {
        nanoseconds start, end;
        bool failed;
    };
    std::vector<call> calls;
    // A call every second from 0 to 9 s, each on its own; the rehearsal runs from 2.5 s to 6.5 s.
    const auto caller = [&](int i) -> rs::task<void> {
        co_await sim.sleep_for(i * 1s);
        const nanoseconds start = sim.now();
        const bool failed = !(co_await p.execute_outcome(action));
        calls.push_back({start, sim.now(), failed});
    };
    const auto flip = [&]() -> rs::task<void> {
        co_await sim.sleep_for(2500ms);
        rehearsal.enable();
        co_await sim.sleep_for(4s);
        rehearsal.set(false);
    };
    for (int i = 0; i < 10; ++i)
        sim.spawn(caller(i));
    sim.spawn(flip());
    sim.run_all();
    REQUIRE(calls.size() == 10);
    for (const call& c : calls) {
        // Each stage reads the switch as the call passes it. Calls at 3, 4, 5 and 6 s find it on
        // at the latency stage: two seconds of delay (the call at 6 s is not spared by the switch
        // turned off at 6.5 s: it decided at 6 s). Those of 3 and 4 s reach the fault stage at 5
        // and 6 s, still on, and fail; those of 5 and 6 s reach it at 7 and 8 s, off, and pass.
        const bool delayed = c.start >= 3s && c.start <= 6s;
        const bool failed = c.start >= 3s && c.start <= 4s;
        CHECK(c.failed == failed);
        CHECK(c.end - c.start == (delayed ? 2s : 0s));
    }
}

TEST_CASE("chaos: injected latency ends at its exact virtual instant, then the call goes on", "[chaos]") {
    simulation sim;
    chaos::latency slow{std::chrono::milliseconds{1500}, {.injection_rate = 1}, sim.clock()};
    CHECK(slow.delay() == 1500ms);
    nanoseconds action_started{-1};
    const auto action = [&]() -> rs::task<int> {
        action_started = sim.now();
        co_await sim.sleep_for(250ms);
        co_return 5;
    };
    const auto later = [&]() -> rs::task<int> {
        co_await sim.sleep_for(10s);
        co_return co_await slow.execute(action);
    };
    CHECK(sim.run(later()) == 5);
    CHECK(action_started == 11500ms);
    CHECK(sim.now() == 11750ms);
}

TEST_CASE("chaos: a stop during injected latency ends the call at that instant without running the action",
          "[chaos]") {
    simulation sim;
    chaos::latency slow{5s, {.name = "slow", .injection_rate = 1}, sim.clock()};
    int ran = 0;
    const auto action = [&]() -> rs::task<int> {
        ++ran;
        co_return 1;
    };
    resilience::stop_source caller;
    auto [r, ignored] =
        sim.run(rs::when_all(slow.execute_outcome(action, caller.get_token()), stop_at(sim, caller, 1200ms)));
    CHECK(sim.now() == 1200ms);
    REQUIRE(r.has_failure());
    CHECK(rs::is_cancellation(r.error()));
    const auto* e = r.error().as<rs::cancelled_error>();
    REQUIRE(e != nullptr);
    CHECK(e->policy_name() == "slow");
    CHECK(ran == 0);
}

TEST_CASE("chaos: a timeout outside injected latency ends it at the deadline as a timeout", "[chaos]") {
    simulation sim;
    rs::pipeline p{rs::timeout{2s, sim.clock()}, chaos::latency{5s, {.injection_rate = 1}, sim.clock()}};
    int ran = 0;
    const auto action = [&]() -> rs::task<int> {
        ++ran;
        co_return 1;
    };
    auto r = sim.run(p.execute_outcome(action));
    CHECK(sim.now() == 2s);
    REQUIRE(r.has_failure());
    CHECK(r.error().is<rs::timeout_error>());
    CHECK(ran == 0);
}

TEST_CASE("chaos: an outcome stands in for the action's result, of the action's type", "[chaos]") {
    simulation sim;
    int ran = 0;
    const auto number = [&]() -> rs::task<int> {
        ++ran;
        co_return 1;
    };
    const auto text = [&]() -> rs::task<std::string> {
        ++ran;
        co_return "real";
    };
    const auto nothing = [&]() -> rs::task<void> {
        ++ran;
        co_return;
    };
    // A value, copied out each time.
    CHECK(sim.run(chaos::outcome{42, {.injection_rate = 1}}.execute(number)) == 42);
    // Converted implicitly to the result type.
    CHECK(sim.run(chaos::outcome{"stale", {.injection_rate = 1}}.execute(text)) == "stale");
    // A callable given the call's context (here the attempt of a retry around it).
    std::vector<int> attempts;
    rs::pipeline retried{rs::retry{{.max_attempts = 2, .backoff = rs::constant_backoff{0s}}, sim.clock()},
                         chaos::outcome{[&](const rs::context& ctx) {
                                            attempts.push_back(ctx.attempt());
                                            return rs::outcome<int>{rs::failure::make(boom{})};
                                        },
                                        {.injection_rate = 1}}};
    auto r = sim.run(retried.execute_outcome(number));
    CHECK(r.error().is<boom>());
    CHECK(attempts == std::vector<int>{1, 2});
    // A failure, and for a void action a callable returning nothing.
    CHECK(sim.run(chaos::outcome{rs::failure::make(boom{}), {.injection_rate = 1}}.execute_outcome(number))
              .error()
              .is<boom>());
    int called = 0;
    sim.run(chaos::outcome{[&] { ++called; }, {.injection_rate = 1}}.execute(nothing));
    CHECK(called == 1);
    // What the callable throws is the call's failure.
    auto thrown =
        sim.run(chaos::outcome{[]() -> int { throw boom{}; }, {.injection_rate = 1}}.execute_outcome(number));
    CHECK(thrown.error().is<boom>());
    CHECK(ran == 0);
    // At rate 0 the action answers.
    CHECK(sim.run(chaos::outcome{42, {.injection_rate = 0}}.execute(number)) == 1);
    CHECK(ran == 1);
}

TEST_CASE("chaos: what a fault injects, from an object, a failure, a pointer or a callable", "[chaos]") {
    simulation sim;
    const auto action = []() -> rs::task<int> { co_return 1; };
    // An exception object: a fresh copy each time.
    chaos::fault object{boom{}, {.injection_rate = 1}};
    auto a = sim.run(object.execute_outcome(action));
    auto b = sim.run(object.execute_outcome(action));
    CHECK(a.error().is<boom>());
    CHECK(a.error().exception() != b.error().exception());
    // A failure: the same exception object each time, and its code kept.
    const rs::failure timed_out = rs::failure::make(rs::timeout_error{});
    chaos::fault same{timed_out, {.injection_rate = 1}};
    auto c = sim.run(same.execute_outcome(action));
    CHECK(c.error().exception() == timed_out.exception());
    CHECK(c.error().code() == rs::errc::timeout);
    // An exception_ptr.
    const std::exception_ptr ptr = std::make_exception_ptr(boom{});
    CHECK(sim.run(chaos::fault{ptr, {.injection_rate = 1}}.execute_outcome(action)).error().exception() ==
          ptr);
    // A callable, with or without the context.
    chaos::fault by_attempt{
        [](const rs::context& ctx) { return std::runtime_error("attempt " + std::to_string(ctx.attempt())); },
        {.injection_rate = 1}};
    CHECK(sim.run(by_attempt.execute_outcome(action)).error().what() == std::string("attempt 1"));
    chaos::fault nullary{[] { return rs::failure::make(boom{}); }, {.injection_rate = 1}};
    CHECK(sim.run(nullary.execute_outcome(action)).error().is<boom>());
    // Nothing: chaos::injected_fault.
    chaos::fault plain{{.injection_rate = 1}};
    CHECK_THROWS_AS(sim.run(plain.execute(action)), chaos::injected_fault);
}

TEST_CASE("chaos: on_inject hears each injection, and what it throws is the call's failure", "[chaos]") {
    simulation sim;
    int told = 0;
    int ran = 0;
    const auto action = [&]() -> rs::task<int> {
        ++ran;
        co_return 1;
    };
    chaos::fault counted{boom{},
                         {.injection_rate = 1, .on_inject = [&](const chaos::injection_event&) { ++told; }}};
    (void)sim.run(counted.execute_outcome(action));
    (void)sim.run(counted.execute_outcome(action));
    CHECK(told == 2);
    chaos::latency refusing{
        1s,
        {.injection_rate = 1,
         .on_inject = [](const chaos::injection_event&) { throw std::logic_error("not now"); }},
        sim.clock()};
    auto r = sim.run(refusing.execute_outcome(action));
    CHECK(r.error().is<std::logic_error>());
    CHECK(sim.now() == 0s);
    CHECK(ran == 0);
    // A throwing callback of the other stages: the same.
    chaos::fault throwing_fault{boom{}, {.injection_rate = 1, .on_inject = [](const chaos::injection_event&) {
                                             throw std::logic_error("no");
                                         }}};
    CHECK(sim.run(throwing_fault.execute_outcome(action)).error().is<std::logic_error>());
    chaos::outcome throwing_outcome{7, {.injection_rate = 1, .on_inject = [](const chaos::injection_event&) {
                                            throw std::logic_error("no");
                                        }}};
    CHECK(sim.run(throwing_outcome.execute_outcome(action)).error().is<std::logic_error>());
    CHECK(ran == 0);
}

TEST_CASE("chaos: on_inject is told once per injection, before it, with the stage, the kind and the context",
          "[chaos]") {
    simulation sim;
    struct seen {
        chaos::injection_kind kind;
        std::string name;
        int attempt;
        nanoseconds delay;
        nanoseconds at;
    };
    std::vector<seen> events;
    const auto record = [&](const chaos::injection_event& e) {
        events.push_back(
            {e.kind(), std::string(e.policy_name()), e.context().attempt(), e.delay(), sim.now()});
    };
    const auto action = [&]() -> rs::task<int> { co_return 1; };

    // The latency stage is told at the instant the delay starts, and the call goes on 2 s later.
    sim.run([&]() -> rs::task<void> {
        co_await sim.sleep_for(5s);
        chaos::latency slow{2s, {.name = "slow", .injection_rate = 1, .on_inject = record}, sim.clock()};
        const int v = co_await slow.execute(action); // not inside CHECK, which names its argument twice
        CHECK(v == 1);
        CHECK(sim.now() == 7s);
    }());
    REQUIRE(events.size() == 1);
    CHECK(events[0].kind == chaos::injection_kind::latency);
    CHECK(events[0].name == "slow");
    CHECK(events[0].attempt == 1);
    CHECK(events[0].delay == 2s);
    CHECK(events[0].at == 5s);

    // Inside a retry, each attempt's injection is told with that attempt's context.
    events.clear();
    rs::pipeline p{
        rs::retry{{.max_attempts = 2, .backoff = rs::constant_backoff{100ms, rs::jitter::none}}, sim.clock()},
        chaos::fault{boom{}, {.name = "faulty", .injection_rate = 1, .on_inject = record}}};
    const nanoseconds start = sim.now();
    CHECK(sim.run(p.execute_outcome(action)).error().is<boom>());
    REQUIRE(events.size() == 2);
    CHECK(events[0].kind == chaos::injection_kind::fault);
    CHECK(events[0].name == "faulty");
    CHECK(events[0].attempt == 1);
    CHECK(events[0].delay == 0s);
    CHECK(events[0].at == start);
    CHECK(events[1].attempt == 2);
    CHECK(events[1].at == start + 100ms);

    // The outcome stage; a call the draw spares is not told.
    events.clear();
    chaos::outcome seven{7, {.name = "wrong", .injection_rate = 1, .on_inject = record}};
    CHECK(sim.run(seven.execute(action)) == 7);
    chaos::outcome never{7, {.injection_rate = 0, .on_inject = record}};
    CHECK(sim.run(never.execute(action)) == 1);
    REQUIRE(events.size() == 1);
    CHECK(events[0].kind == chaos::injection_kind::outcome);
    CHECK(events[0].name == "wrong");
    CHECK(std::string(chaos::to_string(chaos::injection_kind::latency)) == "latency");
}

TEST_CASE("chaos: a fault injected at rate 1 inside a retry is retried until the attempts run out",
          "[chaos]") {
    simulation sim;
    int injected = 0;
    int ran = 0;
    rs::pipeline p{
        rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{100ms, rs::jitter::none}}, sim.clock()},
        chaos::fault{[&] {
                         ++injected;
                         return boom{};
                     },
                     {.injection_rate = 1}}};
    const auto action = [&]() -> rs::task<int> {
        ++ran;
        co_return 1;
    };
    auto r = sim.run(p.execute_outcome(action));
    REQUIRE(r.has_failure());
    CHECK(r.error().is<boom>());
    CHECK(injected == 3);
    CHECK(ran == 0);
    CHECK(sim.now() == 200ms); // two waits of 100 ms between three attempts
}

TEST_CASE("chaos: at rate 0.5 a retry gets through on the first attempt the draw spares", "[chaos]") {
    simulation sim;
    // seeded_random{7} injects into the first two draws and spares the third ("110...").
    int ran = 0;
    rs::pipeline p{rs::retry{{.max_attempts = 5, .backoff = rs::constant_backoff{0s}}, sim.clock()},
                   chaos::fault{boom{}, {.injection_rate = 0.5}, rs::seeded_random{7}}};
    const auto action = [&]() -> rs::task<int> {
        ++ran;
        co_return 9;
    };
    CHECK(sim.run(p.execute(action)) == 9);
    CHECK(ran == 1);
}

TEST_CASE("chaos: a toggle flipped from another thread while calls run on a loop", "[chaos][concurrency]") {
    chaos::toggle on{false};
    const chaos::fault f{boom{}, {.injection_rate = 1, .enabled = on}};
    const auto action = []() -> rs::task<int> { co_return 1; };
    std::atomic<bool> done{false};
    std::thread flipper([&] {
        for (int i = 0; !done.load(); ++i)
            on.set(i % 2 == 0);
    });
    int failed = 0;
    int passed = 0;
    rs::sync_wait([&]() -> rs::task<void> {
        for (int i = 0; i < 20000; ++i) {
            if (co_await f.execute_outcome(action))
                ++passed;
            else
                ++failed;
        }
    }());
    done = true;
    flipper.join();
    CHECK(failed + passed == 20000);
    on.disable();
    CHECK(rs::sync_wait(f.execute(action)) == 1);
    on.enable();
    CHECK_THROWS_AS(rs::sync_wait(f.execute(action)), boom);
}

} // namespace test_chaos
