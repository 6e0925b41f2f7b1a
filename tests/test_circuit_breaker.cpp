// SPDX-License-Identifier: MIT
// circuit_breaker: trip rules, breaks, probes, classification, state reads, and sharing across threads.

#include "catch.hpp"
#include "support.hpp"

#include <resilience/circuit_breaker.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/when_all.hpp>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace test_circuit_breaker {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_tests::completion_counts;
using resilience_tests::run_on_threads;
using resilience_tests::yield_now;
using rs::circuit_state;
using rs::testing::simulation;

namespace {

struct boom : std::runtime_error {
    explicit boom(int i = 0) : std::runtime_error("boom " + std::to_string(i)), id(i) {}
    int id;
};

// Fails at once with boom{id}.
auto fail_now(int id = 0) {
    return [id]() -> rs::task<int> {
        throw boom{id};
        co_return 0;
    };
}
auto succeed_now() {
    return []() -> rs::task<int> { co_return 7; };
}
// Takes `latency` of virtual time, then fails with boom{id} or returns 7; a stop ends the wait with
// cancelled_error.
auto timed(simulation& sim, std::chrono::nanoseconds latency, bool fail, int id = 0) {
    return [&sim, latency, fail, id](resilience::stop_token st) -> rs::task<int> {
        co_await sim.sleep_for(latency, st);
        if (st.stop_requested())
            throw rs::cancelled_error{};
        if (fail)
            throw boom{id};
        co_return 7;
    };
}

// The refusal an outcome holds, or null.
const rs::circuit_open_error* refusal(const rs::outcome<int>& r) {
    return r.has_failure() ? r.error().as<rs::circuit_open_error>() : nullptr;
}

using virtual_breaker = rs::circuit_breaker<rs::testing::virtual_clock>;

} // namespace

static_assert(rs::policy<rs::circuit_breaker<>>);
static_assert(rs::policy<virtual_breaker>);

TEST_CASE("circuit_breaker: deduces its clock and copies are the same breaker", "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker plain{{.failure_threshold = 1}};
    static_assert(std::is_same_v<decltype(plain), rs::circuit_breaker<rs::steady_clock>>);
    rs::circuit_breaker b{{.failure_threshold = 1}, sim.clock()};
    static_assert(std::is_same_v<decltype(b), virtual_breaker>);

    auto copy = b;
    (void)sim.run(copy.execute_outcome(fail_now()));
    CHECK(b.state() == circuit_state::open);
    b.reset();
    CHECK(copy.state() == circuit_state::closed);
}

TEST_CASE("circuit_breaker: opens after failure_threshold consecutive failures and refuses the next call "
          "without running it",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{{.failure_threshold = 3, .break_duration = 30s}, sim.clock()};
    sim.run([&]() -> rs::task<void> {
        for (int i = 1; i <= 2; ++i) {
            auto r = co_await breaker.execute_outcome(fail_now(i));
            CHECK(r.error().as<boom>()->id == i);
            CHECK(breaker.state() == circuit_state::closed);
        }
        co_await sim.sleep_for(1s);
        auto third = co_await breaker.execute_outcome(fail_now(3));
        REQUIRE(third.error().is<boom>()); // the failure that trips it is reported as itself
        CHECK(breaker.state() == circuit_state::open);

        bool ran = false;
        auto r = co_await breaker.execute_outcome([&]() -> rs::task<int> {
            ran = true;
            co_return 1;
        });
        CHECK_FALSE(ran);
        REQUIRE(r.has_failure());
        CHECK(r.error().code() == rs::errc::circuit_open);
        const auto* e = refusal(r);
        REQUIRE(e);
        CHECK(e->retry_after() == 30s);
        CHECK(e->cause() == third.error().exception());
        CHECK(rs::failure(e->cause()).as<boom>()->id == 3);
    }());
}

TEST_CASE("circuit_breaker: a recorded success ends the run of consecutive failures", "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{{.failure_threshold = 3}, sim.clock()};
    sim.run([&]() -> rs::task<void> {
        (void)co_await breaker.execute_outcome(fail_now());
        (void)co_await breaker.execute_outcome(fail_now());
        CHECK(breaker.metrics().consecutive_failures == 2);
        auto after_success = co_await breaker.execute_outcome(succeed_now());
        CHECK(after_success.value() == 7);
        CHECK(breaker.metrics().consecutive_failures == 0);
        (void)co_await breaker.execute_outcome(fail_now());
        (void)co_await breaker.execute_outcome(fail_now());
        CHECK(breaker.state() == circuit_state::closed);
        (void)co_await breaker.execute_outcome(fail_now());
        CHECK(breaker.state() == circuit_state::open);
    }());
}

TEST_CASE("circuit_breaker: retry_after is the exact time left in the break", "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{{.failure_threshold = 1, .break_duration = 30s}, sim.clock()};
    sim.run([&]() -> rs::task<void> {
        co_await sim.sleep_for(3s);
        (void)co_await breaker.execute_outcome(fail_now());
        co_await sim.sleep_for(7s);
        CHECK(sim.now() == 10s);
        auto r = co_await breaker.execute_outcome(succeed_now());
        REQUIRE(refusal(r));
        CHECK(refusal(r)->retry_after() == 23s);

        co_await sim.sleep_for(23s - 1ns);
        auto last = co_await breaker.execute_outcome(succeed_now());
        REQUIRE(refusal(last));
        CHECK(refusal(last)->retry_after() == 1ns);

        co_await sim.sleep_for(1ns);
        CHECK(sim.now() == 33s);
        auto probe = co_await breaker.execute_outcome(succeed_now());
        CHECK(probe.value() == 7); // the probe
        CHECK(breaker.state() == circuit_state::closed);
    }());
}

TEST_CASE("circuit_breaker: half-open admits exactly probes calls and closes once all of them succeed",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{{.failure_threshold = 1, .break_duration = 10s, .probes = 2}, sim.clock()};
    rs::testing::scripted_action probe{sim.clock(), rs::testing::script<int>{
                                                        .value = 42,
                                                        .steps = {{100ms, false}, {200ms, false}},
                                                    }};
    sim.run([&]() -> rs::task<void> {
        auto opening = co_await breaker.execute_outcome(fail_now(9));
        co_await sim.sleep_for(10s);
        CHECK(breaker.state() == circuit_state::half_open);

        auto check_in_between = [&]() -> rs::task<rs::outcome<int>> {
            co_await sim.sleep_for(150ms); // the first probe has passed, the second is still running
            CHECK(breaker.state() == circuit_state::half_open);
            co_return co_await breaker.execute_outcome(succeed_now());
        };
        auto [a, b, c, d] =
            co_await rs::when_all(breaker.execute_outcome(probe), breaker.execute_outcome(probe),
                                  breaker.execute_outcome(probe), check_in_between());
        CHECK(a.value() == 42);
        CHECK(b.value() == 42);
        CHECK(probe.calls() == 2);
        for (const auto* r : {&c, &d}) {
            REQUIRE(refusal(*r));
            CHECK(refusal(*r)->retry_after() == 10s); // half-open and full: the current break
            CHECK(refusal(*r)->cause() == opening.error().exception());
        }
        CHECK(sim.now() == 10s + 200ms);
        CHECK(breaker.state() == circuit_state::closed);
        CHECK(breaker.metrics().consecutive_opens == 0);
    }());
}

TEST_CASE("circuit_breaker: a failed probe re-opens it and each consecutive break grows up to the cap",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{{.failure_threshold = 1,
                                 .break_duration = 10s,
                                 .break_duration_growth = 2.0,
                                 .max_break_duration = 35s},
                                sim.clock()};
    sim.run([&]() -> rs::task<void> {
        // Opens, and returns the break it reports right after.
        auto fail_and_read_break = [&](int id) -> rs::task<std::chrono::nanoseconds> {
            auto f = co_await breaker.execute_outcome(fail_now(id));
            CHECK(f.error().as<boom>()->id == id); // the probe ran
            auto r = co_await breaker.execute_outcome(succeed_now());
            CHECK(refusal(r)->cause() == f.error().exception());
            co_return refusal(r)->retry_after();
        };
        auto first = co_await fail_and_read_break(1);
        CHECK(first == 10s);
        co_await sim.sleep_for(10s);
        auto second = co_await fail_and_read_break(2);
        CHECK(second == 20s);
        CHECK(breaker.metrics().consecutive_opens == 2);
        co_await sim.sleep_for(20s);
        auto third = co_await fail_and_read_break(3);
        CHECK(third == 35s); // 40s, capped
        co_await sim.sleep_for(35s);
        auto fourth = co_await fail_and_read_break(4);
        CHECK(fourth == 35s);
        CHECK(sim.now() == 65s);
        CHECK(breaker.metrics().consecutive_opens == 4);

        co_await sim.sleep_for(35s);
        auto probe = co_await breaker.execute_outcome(succeed_now());
        CHECK(probe.value() == 7);
        CHECK(breaker.state() == circuit_state::closed);
        auto after_close = co_await fail_and_read_break(5);
        CHECK(after_close == 10s); // closing started the schedule over
    }());
}

TEST_CASE("circuit_breaker: a break that grows past what the clock holds saturates instead of overflowing",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{
        {.failure_threshold = 1, .break_duration = 1s, .break_duration_growth = 1000.0}, sim.clock()};
    sim.run([&]() -> rs::task<void> {
        const std::chrono::nanoseconds expected[] = {1s, 1000s, 1000000s, 1000000000s};
        for (const auto e : expected) {
            (void)co_await breaker.execute_outcome(fail_now());
            auto r = co_await breaker.execute_outcome(succeed_now());
            REQUIRE(refusal(r));
            CHECK(refusal(r)->retry_after() == e);
            co_await sim.sleep_for(refusal(r)->retry_after());
        }
        // The fifth break would be 10^12 s: more than 64-bit nanoseconds hold.
        (void)co_await breaker.execute_outcome(fail_now());
        auto r = co_await breaker.execute_outcome(succeed_now());
        REQUIRE(refusal(r));
        CHECK(refusal(r)->retry_after() == std::chrono::nanoseconds::max() - sim.now());
        CHECK(breaker.metrics().consecutive_opens == 5);
        CHECK(breaker.state() == circuit_state::open);
    }());
}

TEST_CASE("circuit_breaker: a count sample opens on its failure rate without a run of failures, once it "
          "holds minimum_throughput",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{
        {.failure_threshold = 5,
         .sampling = rs::breaker_sampling{.calls = 10, .minimum_throughput = 6, .failure_ratio = 0.5}},
        sim.clock()};
    sim.run([&]() -> rs::task<void> {
        // S F S F S: 2 of 5 failed, and at the 4th call half had failed but the sample was too small.
        for (int i = 1; i <= 5; ++i) {
            if (i % 2 == 1)
                (void)co_await breaker.execute_outcome(succeed_now());
            else
                (void)co_await breaker.execute_outcome(fail_now(i));
            CHECK(breaker.state() == circuit_state::closed);
        }
        auto sixth = co_await breaker.execute_outcome(fail_now(6));
        CHECK(breaker.state() == circuit_state::open);
        const auto m = breaker.metrics();
        CHECK(m.calls == 6);
        CHECK(m.failures == 3);
        CHECK(m.consecutive_failures == 1);
        auto r = co_await breaker.execute_outcome(succeed_now());
        REQUIRE(refusal(r));
        CHECK(refusal(r)->cause() == sixth.error().exception());
    }());
}

TEST_CASE("circuit_breaker: a count sample slides: only the last `calls` calls count", "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{{.sampling = rs::breaker_sampling{.calls = 4, .failure_ratio = 0.75}},
                                sim.clock()};
    sim.run([&]() -> rs::task<void> {
        // F F S S S S: the early failures slide out; then F F F: 3 of the last 4.
        for (bool fail : {true, true, false, false, false, false, true, true}) {
            if (fail)
                (void)co_await breaker.execute_outcome(fail_now());
            else
                (void)co_await breaker.execute_outcome(succeed_now());
        }
        CHECK(breaker.metrics().calls == 4);
        CHECK(breaker.metrics().failures == 2);
        CHECK(breaker.state() == circuit_state::closed);
        (void)co_await breaker.execute_outcome(fail_now());
        CHECK(breaker.state() == circuit_state::open);
    }());
}

TEST_CASE("circuit_breaker: a time window forgets calls older than its window", "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{{.sampling = rs::breaker_sampling{.window = 10s,
                                                                  .segments = 10,
                                                                  .minimum_throughput = 4,
                                                                  .failure_ratio = 0.5}},
                                sim.clock()};
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 3; ++i)
            (void)co_await breaker.execute_outcome(fail_now());
        co_await sim.sleep_for(10s - 1ns);
        CHECK(breaker.metrics().calls == 3); // still within 10s
        co_await sim.sleep_for(1ns);
        CHECK(breaker.metrics().calls == 0); // 10s old: forgotten
        CHECK(breaker.metrics().failures == 0);
        (void)co_await breaker.execute_outcome(fail_now()); // would be 4 of 4 had the old ones stayed
        CHECK(breaker.state() == circuit_state::closed);
        CHECK(breaker.metrics().calls == 1);

        co_await sim.sleep_for(500ms);
        (void)co_await breaker.execute_outcome(succeed_now());
        (void)co_await breaker.execute_outcome(succeed_now());
        CHECK(breaker.state() == circuit_state::closed); // 1 of 3
        (void)co_await breaker.execute_outcome(fail_now());
        CHECK(breaker.state() == circuit_state::open); // 2 of 4
        CHECK(sim.now() == 10500ms);
    }());
}

TEST_CASE("circuit_breaker: a time window counts a call until its segment leaves the window",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{{.sampling = rs::breaker_sampling{.window = 10s,
                                                                  .segments = 5,
                                                                  .minimum_throughput = 2,
                                                                  .failure_ratio = 1.0}},
                                sim.clock()};
    sim.run([&]() -> rs::task<void> {
        co_await sim.sleep_for(1999ms); // in the bucket [0s, 2s)
        (void)co_await breaker.execute_outcome(fail_now());
        co_await sim.sleep_for(10s - 1999ms - 1ns); // just before the bucket leaves: 8s+1ns later
        CHECK(breaker.metrics().calls == 1);
        (void)co_await breaker.execute_outcome(fail_now());
        CHECK(breaker.state() == circuit_state::open);
    }());
}

TEST_CASE("circuit_breaker: a slow-call rate opens it, with no failure as cause even if some failed",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{{.sampling = rs::breaker_sampling{.calls = 4,
                                                                  .failure_ratio = 0.5,
                                                                  .slow_call_duration = 1s,
                                                                  .slow_call_ratio = 0.5},
                                 .break_duration = 5s},
                                sim.clock()};
    sim.run([&]() -> rs::task<void> {
        auto slow = co_await breaker.execute_outcome(timed(sim, 2s, false));
        CHECK(slow.value() == 7);                                        // slow success
        (void)co_await breaker.execute_outcome(timed(sim, 999ms, true)); // a failure, not slow
        (void)co_await breaker.execute_outcome(timed(sim, 1s, false));   // slow: at least 1s
        CHECK(breaker.state() == circuit_state::closed);
        CHECK(breaker.metrics().slow_calls == 2);
        (void)co_await breaker.execute_outcome(succeed_now());
        CHECK(breaker.state() == circuit_state::open); // 2 of 4 slow; 1 of 4 failed, below its rate
        CHECK(breaker.metrics().failures == 1);
        auto r = co_await breaker.execute_outcome(succeed_now());
        REQUIRE(refusal(r));
        CHECK(refusal(r)->cause() == nullptr);
        CHECK(refusal(r)->retry_after() == 5s);

        // A slow probe re-opens it, again without a cause.
        co_await sim.sleep_for(5s);
        auto slow_probe = co_await breaker.execute_outcome(timed(sim, 3s, false));
        CHECK(slow_probe.value() == 7);
        CHECK(breaker.state() == circuit_state::open);
        auto again = co_await breaker.execute_outcome(succeed_now());
        REQUIRE(refusal(again));
        CHECK(refusal(again)->cause() == nullptr);
    }());
}

TEST_CASE("circuit_breaker: a slow failure counts as a failure and as slow", "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{
        {.sampling = rs::breaker_sampling{.calls = 10, .failure_ratio = 1.0, .slow_call_duration = 1s}},
        sim.clock()};
    sim.run([&]() -> rs::task<void> {
        (void)co_await breaker.execute_outcome(timed(sim, 1s, true));
        const auto m = breaker.metrics();
        CHECK(m.calls == 1);
        CHECK(m.failures == 1);
        CHECK(m.slow_calls == 1);
    }());
}

TEST_CASE("circuit_breaker: a failure should_handle declines passes through untouched and is not recorded",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{
        {.failure_threshold = 1,
         .sampling = rs::breaker_sampling{.calls = 5, .minimum_throughput = 1, .failure_ratio = 1.0},
         .should_handle = [](const rs::failure& f) { return !f.is<std::invalid_argument>(); }},
        sim.clock()};
    std::exception_ptr thrown;
    auto bad_request = [&]() -> rs::task<int> {
        try {
            throw std::invalid_argument("bad request");
        } catch (...) {
            thrown = std::current_exception();
            throw;
        }
        co_return 0;
    };
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 3; ++i) {
            auto r = co_await breaker.execute_outcome(bad_request);
            REQUIRE(r.has_failure());
            CHECK(r.error().exception() == thrown); // the very exception the action threw
        }
        CHECK(breaker.state() == circuit_state::closed);
        CHECK(breaker.metrics().calls == 0); // not even recorded as a success
        CHECK(breaker.metrics().consecutive_failures == 0);
    }());
    CHECK_THROWS_AS(sim.run(breaker.execute(bad_request)), std::invalid_argument);
    (void)sim.run(breaker.execute_outcome(fail_now()));
    CHECK(breaker.state() == circuit_state::open);
}

TEST_CASE("circuit_breaker: cancellation is not counted against the dependency", "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{
        {.failure_threshold = 1,
         .sampling = rs::breaker_sampling{.calls = 5, .minimum_throughput = 1, .failure_ratio = 1.0}},
        sim.clock()};
    sim.run([&]() -> rs::task<void> {
        // The caller stops a running call.
        resilience::stop_source caller;
        auto [r, ignored] =
            co_await rs::when_all(breaker.execute_outcome(timed(sim, 1s, true), caller.get_token()),
                                  resilience_tests::stop_at(sim, caller, 500ms));
        (void)ignored;
        CHECK(r.error().is<rs::cancelled_error>());
        CHECK(sim.now() == 500ms);
        // An action that reports cancellation on its own.
        auto self_cancelled = co_await breaker.execute_outcome([]() -> rs::task<int> {
            throw rs::cancelled_error{};
            co_return 0;
        });
        CHECK(self_cancelled.error().is<rs::cancelled_error>());
        // A caller already stopped: the call does not start.
        bool ran = false;
        auto early = co_await breaker.execute_outcome(
            [&]() -> rs::task<int> {
                ran = true;
                co_return 1;
            },
            caller.get_token());
        CHECK_FALSE(ran);
        CHECK(early.error().code() == rs::errc::cancelled);

        CHECK(breaker.state() == circuit_state::closed);
        CHECK(breaker.metrics().calls == 0);
    }());
}

TEST_CASE("circuit_breaker: reading state and metrics changes nothing", "[circuit_breaker]") {
    simulation sim;
    std::vector<std::pair<circuit_state, circuit_state>> changes;
    rs::circuit_breaker breaker{
        {.failure_threshold = 1,
         .break_duration = 10s,
         .on_state_change = [&](const rs::state_change_event& e) { changes.emplace_back(e.from(), e.to()); }},
        sim.clock()};
    sim.run([&]() -> rs::task<void> {
        (void)co_await breaker.execute_outcome(fail_now());
        co_await sim.sleep_for(10s - 1ns);
        CHECK(breaker.state() == circuit_state::open);
        co_await sim.sleep_for(1ns);
        for (int i = 0; i < 100; ++i) {
            CHECK(breaker.state() == circuit_state::half_open);
            CHECK(breaker.metrics().state == circuit_state::half_open);
        }
        CHECK(breaker.metrics().consecutive_opens == 1);
        CHECK(changes.size() == 1); // open -> half_open is only reported when a call arrives
        // No read took the single probe slot.
        auto probe = co_await breaker.execute_outcome(succeed_now());
        CHECK(probe.value() == 7);
        CHECK(breaker.state() == circuit_state::closed);
    }());
    using S = circuit_state;
    CHECK(changes == std::vector<std::pair<S, S>>{
                         {S::closed, S::open}, {S::open, S::half_open}, {S::half_open, S::closed}});
}

TEST_CASE("circuit_breaker: on_state_change reports every change in order", "[circuit_breaker]") {
    simulation sim;
    using S = circuit_state;
    std::vector<std::pair<S, S>> changes;
    rs::circuit_breaker breaker{
        {.failure_threshold = 2,
         .break_duration = 1s,
         .on_state_change = [&](const rs::state_change_event& e) { changes.emplace_back(e.from(), e.to()); }},
        sim.clock()};
    sim.run([&]() -> rs::task<void> {
        (void)co_await breaker.execute_outcome(fail_now());
        (void)co_await breaker.execute_outcome(fail_now());
        co_await sim.sleep_for(1s);
        (void)co_await breaker.execute_outcome(fail_now()); // probe fails
        co_await sim.sleep_for(2s);
        (void)co_await breaker.execute_outcome(succeed_now()); // probe passes
        breaker.isolate();
        breaker.isolate(); // already isolated: no change
        breaker.reset();
        breaker.reset(); // already closed: no change
    }());
    CHECK(changes == std::vector<std::pair<S, S>>{{S::closed, S::open},
                                                  {S::open, S::half_open},
                                                  {S::half_open, S::open},
                                                  {S::open, S::half_open},
                                                  {S::half_open, S::closed},
                                                  {S::closed, S::isolated},
                                                  {S::isolated, S::closed}});
}

TEST_CASE("circuit_breaker: on_state_change may call back into the breaker and is never nested",
          "[circuit_breaker]") {
    simulation sim;
    using S = circuit_state;
    std::vector<std::pair<S, S>> changes;
    int depth = 0, deepest = 0;
    std::shared_ptr<virtual_breaker> self;
    auto observe = [&](const rs::state_change_event& e) {
        deepest = std::max(deepest, ++depth);
        changes.emplace_back(e.from(), e.to());
        if (e.to() == S::open)
            self->isolate(); // re-entrant: no deadlock; told after this call returns
        --depth;
    };
    self = std::make_shared<virtual_breaker>(
        rs::circuit_breaker_options{.failure_threshold = 1, .on_state_change = observe}, sim.clock());
    (void)sim.run(self->execute_outcome(fail_now()));
    CHECK(self->state() == S::isolated);
    CHECK(changes == std::vector<std::pair<S, S>>{{S::closed, S::open}, {S::open, S::isolated}});
    CHECK(deepest == 1);
}

TEST_CASE("circuit_breaker: isolate holds it open until reset, and reset clears the window",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{
        {.sampling = rs::breaker_sampling{.calls = 4, .failure_ratio = 0.75}, .break_duration = 1s},
        sim.clock()};
    sim.run([&]() -> rs::task<void> {
        breaker.isolate();
        CHECK(breaker.state() == circuit_state::isolated);
        co_await sim.sleep_for(1h);
        bool ran = false;
        auto r = co_await breaker.execute_outcome([&]() -> rs::task<int> {
            ran = true;
            co_return 1;
        });
        CHECK_FALSE(ran);
        REQUIRE(refusal(r)); // a circuit_open_error still, for code that catches that
        REQUIRE(r.error().as<rs::circuit_isolated_error>());
        CHECK(r.error().code() == rs::errc::circuit_isolated);
        CHECK(refusal(r)->retry_after() == std::chrono::nanoseconds::max()); // no wait helps
        CHECK(refusal(r)->cause() == nullptr);
        CHECK(breaker.state() == circuit_state::isolated);

        breaker.reset();
        CHECK(breaker.state() == circuit_state::closed);
        for (int i = 0; i < 3; ++i)
            (void)co_await breaker.execute_outcome(fail_now());
        CHECK(breaker.metrics().failures == 3);
        breaker.reset(); // closed already: still forgets the window
        CHECK(breaker.metrics().calls == 0);
        (void)co_await breaker.execute_outcome(fail_now()); // 1 of 1, not 4 of 4
        CHECK(breaker.state() == circuit_state::closed);

        for (int i = 0; i < 3; ++i)
            (void)co_await breaker.execute_outcome(fail_now());
        CHECK(breaker.state() == circuit_state::open);
        breaker.reset();
        CHECK(breaker.state() == circuit_state::closed);
        auto after_reset = co_await breaker.execute_outcome(succeed_now());
        CHECK(after_reset.value() == 7);
    }());
}

TEST_CASE("circuit_breaker: metrics is a snapshot of the window and the runs", "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{
        {.failure_threshold = 10,
         .sampling = rs::breaker_sampling{.calls = 5, .failure_ratio = 1.0, .slow_call_duration = 1s}},
        sim.clock()};
    CHECK(breaker.metrics().state == circuit_state::closed);
    CHECK(breaker.metrics().calls == 0);
    sim.run([&]() -> rs::task<void> {
        (void)co_await breaker.execute_outcome(timed(sim, 2s, false)); // slow success
        (void)co_await breaker.execute_outcome(fail_now());
        (void)co_await breaker.execute_outcome(succeed_now());
        (void)co_await breaker.execute_outcome(fail_now());
        (void)co_await breaker.execute_outcome(fail_now());
        (void)co_await breaker.execute_outcome(
            timed(sim, 1s, true)); // slow failure; the first call slides out
    }());
    const auto m = breaker.metrics();
    CHECK(m.state == circuit_state::closed);
    CHECK(m.calls == 5);
    CHECK(m.failures == 4);
    CHECK(m.slow_calls == 1);
    CHECK(m.consecutive_failures == 3);
    CHECK(m.consecutive_opens == 0);
}

TEST_CASE("circuit_breaker: execute_outcome reports a refusal as a value, execute throws it",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{{.failure_threshold = 1, .break_duration = 4s}, sim.clock()};
    (void)sim.run(breaker.execute_outcome(fail_now()));
    bool ran = false;
    auto action = [&]() -> rs::task<int> {
        ran = true;
        co_return 1;
    };
    rs::outcome<int> r = 0;
    REQUIRE_NOTHROW(r = sim.run(breaker.execute_outcome(action)));
    CHECK_FALSE(ran);
    REQUIRE(r.has_failure());
    CHECK(r.error().code() == rs::errc::circuit_open);
    try {
        (void)sim.run(breaker.execute(action));
        FAIL("execute did not throw");
    } catch (const rs::circuit_open_error& e) {
        CHECK(e.code() == rs::errc::circuit_open);
        CHECK(e.retry_after() == 4s);
    }
    CHECK_FALSE(ran);
}

TEST_CASE("circuit_breaker: a result from a call admitted before a change of state is dropped",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{{.failure_threshold = 2, .break_duration = 5s}, sim.clock()};
    sim.run([&]() -> rs::task<void> {
        auto old_success = [&]() -> rs::task<rs::outcome<int>> {
            co_return co_await breaker.execute_outcome(timed(sim, 10s, false)); // admitted at 0s, done at 10s
        };
        auto scenario = [&]() -> rs::task<void> {
            co_await sim.sleep_for(1s);
            (void)co_await breaker.execute_outcome(fail_now());
            (void)co_await breaker.execute_outcome(fail_now());
            CHECK(breaker.state() == circuit_state::open); // open at 1s until 6s
            co_await sim.sleep_for(5s);
            auto probe = [&]() -> rs::task<rs::outcome<int>> {
                co_return co_await breaker.execute_outcome(timed(sim, 10s, true, 77)); // 6s -> 16s
            };
            auto later = [&]() -> rs::task<void> {
                co_await sim.sleep_for(5s); // 11s: the old success came back at 10s
                CHECK(breaker.state() == circuit_state::half_open);
                auto r = co_await breaker.execute_outcome(succeed_now());
                REQUIRE(refusal(r)); // the probe slot is still taken
                CHECK(refusal(r)->retry_after() == 5s);
            };
            auto [p, ignored] = co_await rs::when_all(probe(), later());
            (void)ignored;
            CHECK(p.error().as<boom>()->id == 77);
            CHECK(breaker.state() == circuit_state::open);
            auto r = co_await breaker.execute_outcome(succeed_now());
            REQUIRE(refusal(r));
            CHECK(refusal(r)->retry_after() == 5s); // opened again at 16s, for the same break
            CHECK(breaker.metrics().consecutive_opens == 2);
        };
        auto [old, ignored] = co_await rs::when_all(old_success(), scenario());
        (void)ignored;
        CHECK(old.value() == 7); // the caller still gets its value
        CHECK(sim.now() == 16s);
    }());
}

TEST_CASE("circuit_breaker: a failure from before reset does not count after it", "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{{.failure_threshold = 1}, sim.clock()};
    sim.run([&]() -> rs::task<void> {
        auto resetter = [&]() -> rs::task<void> {
            co_await sim.sleep_for(1s);
            breaker.reset();
        };
        auto [r, ignored] = co_await rs::when_all(breaker.execute_outcome(timed(sim, 2s, true)), resetter());
        (void)ignored;
        CHECK(r.error().is<boom>());
        CHECK(breaker.state() == circuit_state::closed);
        CHECK(breaker.metrics().consecutive_failures == 0);
    }());
}

TEST_CASE("circuit_breaker: a cancelled or declined probe frees its slot for another caller",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{
        {.failure_threshold = 1,
         .break_duration = 10s,
         .should_handle =
             [](const rs::failure& f) { return !f.is<std::invalid_argument>() && !rs::is_cancellation(f); }},
        sim.clock()};
    sim.run([&]() -> rs::task<void> {
        (void)co_await breaker.execute_outcome(fail_now());
        co_await sim.sleep_for(10s);

        resilience::stop_source caller;
        auto second_caller = [&]() -> rs::task<void> {
            co_await sim.sleep_for(500ms);
            auto busy = co_await breaker.execute_outcome(succeed_now());
            REQUIRE(refusal(busy)); // the slot is taken
            caller.request_stop();
        };
        auto [stopped, ignored] = co_await rs::when_all(
            breaker.execute_outcome(timed(sim, 5s, false), caller.get_token()), second_caller());
        (void)ignored;
        CHECK(stopped.error().is<rs::cancelled_error>());
        CHECK(breaker.state() == circuit_state::half_open);

        // A probe whose failure is declined frees the slot too.
        auto declined = co_await breaker.execute_outcome([]() -> rs::task<int> {
            throw std::invalid_argument("not the dependency's fault");
            co_return 0;
        });
        CHECK(declined.error().is<std::invalid_argument>());
        CHECK(breaker.state() == circuit_state::half_open);

        auto probe = co_await breaker.execute_outcome(succeed_now());
        CHECK(probe.value() == 7);
        CHECK(breaker.state() == circuit_state::closed);
        CHECK(sim.now() == 10500ms);
    }());
}

TEST_CASE("circuit_breaker: ten callers on virtual time: nothing runs while open, and every change "
          "happens at its exact instant",
          "[circuit_breaker]") {
    simulation sim;
    using S = circuit_state;
    using std::chrono::nanoseconds;
    std::vector<std::tuple<S, S, nanoseconds>> changes;
    rs::circuit_breaker breaker{
        {.failure_threshold = 5,
         .break_duration = 2s,
         .on_state_change =
             [&](const rs::state_change_event& e) { changes.emplace_back(e.from(), e.to(), sim.now()); }},
        sim.clock()};
    // Each call takes 5ms; the dependency is down for calls starting in [1s, 4s).
    std::vector<nanoseconds> ran;
    std::vector<std::pair<nanoseconds, nanoseconds>> refused; // (when, retry_after)
    auto dependency = [&]() -> rs::task<int> {
        const nanoseconds start = sim.now();
        ran.push_back(start);
        co_await sim.sleep_for(5ms);
        if (start >= 1s && start < 4s)
            throw boom{};
        co_return 7;
    };
    // Caller i calls at i*10ms and every 100ms after, until 6s: together, one call every 10ms.
    auto caller = [&](int i) -> rs::task<void> {
        co_await sim.sleep_for(i * 10ms);
        while (sim.now() < 6s) {
            const nanoseconds at = sim.now();
            auto r = co_await breaker.execute_outcome(dependency);
            if (const auto* e = refusal(r))
                refused.emplace_back(at, e->retry_after());
            co_await sim.sleep_for(at + 100ms - sim.now());
        }
    };
    for (int i = 0; i < 10; ++i)
        sim.spawn(caller(i));
    sim.run_all();

    // The fifth failure (the call of 1040ms) opens it at 1045ms; the probe of 3050ms fails at 3055ms;
    // the probe of 5060ms passes at 5065ms.
    CHECK(changes == std::vector<std::tuple<S, S, nanoseconds>>{{S::closed, S::open, 1045ms},
                                                                {S::open, S::half_open, 3050ms},
                                                                {S::half_open, S::open, 3055ms},
                                                                {S::open, S::half_open, 5060ms},
                                                                {S::half_open, S::closed, 5065ms}});
    std::vector<nanoseconds> expected_ran;
    for (nanoseconds t = 0ms; t < 6s; t += 10ms)
        if (t <= 1040ms || t == 3050ms || t >= 5060ms)
            expected_ran.push_back(t);
    CHECK(ran == expected_ran);
    CHECK(refused.size() == 600 - expected_ran.size());
    int wrong_retry_after = 0;
    for (auto [at, retry_after] : refused)
        wrong_retry_after += at + retry_after == (at < 3050ms ? 3045ms : 5055ms) ? 0 : 1;
    CHECK(wrong_retry_after == 0);
}

namespace {
using virtual_core = rs::detail::breaker_core<rs::testing::virtual_clock>;
using virtual_instant = rs::testing::virtual_clock::time_point;
using rs::detail::breaker_verdict;
} // namespace

TEST_CASE("circuit_breaker: admit(now) judges the break and times the call by the caller's own reading",
          "[circuit_breaker]") {
    simulation sim;
    SECTION("the break is judged at the reading, not at the clock") {
        virtual_core core{{.failure_threshold = 1, .break_duration = 10s}, sim.clock()};
        auto first = core.admit(virtual_instant{0s});
        REQUIRE(first.admitted);
        core.record(first, breaker_verdict::failure, nullptr); // opens at 0s until 10s
        auto early = core.admit(virtual_instant{10s - 1ns});
        CHECK_FALSE(early.admitted);
        CHECK(early.retry_after == 1ns);
        core.record(early, breaker_verdict::success, nullptr); // refused: nothing to record
        CHECK(core.metrics().consecutive_failures == 1);
        auto probe = core.admit(virtual_instant{10s});
        CHECK(probe.admitted);
        CHECK(probe.probe);
        auto second = core.admit(virtual_instant{10s});
        CHECK_FALSE(second.admitted);     // the one probe slot is taken
        CHECK(second.retry_after == 10s); // the break just served
        CHECK(sim.now() == 0s);           // the clock never moved
        core.record(probe, breaker_verdict::success, nullptr);
        CHECK(core.state() == circuit_state::closed);
    }
    SECTION("a slow call is timed from the reading") {
        virtual_core core{
            {.sampling = rs::breaker_sampling{.calls = 2, .slow_call_duration = 1s, .slow_call_ratio = 0.5}},
            sim.clock()};
        sim.run([&]() -> rs::task<void> {
            const virtual_instant before = sim.clock().now();
            co_await sim.sleep_for(600ms);
            auto own = core.admit();         // reads 600ms itself
            auto given = core.admit(before); // the caller read 0s
            co_await sim.sleep_for(400ms);
            core.record(own, breaker_verdict::success, nullptr); // 400ms: not slow
            CHECK(core.metrics().slow_calls == 0);
            core.record(given, breaker_verdict::success, nullptr); // 1s: slow, and 1 of 2 opens it
            CHECK(core.metrics().slow_calls == 1);
            CHECK(core.state() == circuit_state::open);
        }());
    }
}

TEST_CASE("circuit_breaker: a success admitted before a reset does not end the run of failures after it",
          "[circuit_breaker]") {
    simulation sim;
    virtual_core core{{.failure_threshold = 3}, sim.clock()};
    auto old = core.admit();
    REQUIRE(old.admitted);
    core.reset(); // closed already: a new generation all the same
    core.record(core.admit(), breaker_verdict::failure, nullptr);
    core.record(old, breaker_verdict::success, nullptr); // from the generation before: dropped
    CHECK(core.metrics().consecutive_failures == 1);
    core.record(core.admit(), breaker_verdict::ignored, nullptr);
    CHECK(core.metrics().consecutive_failures == 1);
    core.record(core.admit(), breaker_verdict::failure, nullptr);
    core.record(core.admit(), breaker_verdict::failure, nullptr);
    CHECK(core.state() == circuit_state::open);
    CHECK(core.metrics().consecutive_failures == 3);
}

namespace {
std::string error_of(rs::circuit_breaker_options o) {
    try {
        rs::circuit_breaker b{std::move(o)};
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "no error";
}
} // namespace

TEST_CASE("circuit_breaker: bad options are refused, naming the field and the value", "[circuit_breaker]") {
    const std::string p = "resilience::circuit_breaker: ";
    using rs::breaker_sampling;
    CHECK(error_of({}) == "no error"); // Polly's default window
    CHECK(error_of({.break_duration = 0s}) == p + "break_duration must be positive, got 0ns");
    CHECK(error_of({.name = "db", .probes = 0}) ==
          "resilience::circuit_breaker (db): probes must be at least 1, got 0");
    CHECK(error_of({.failure_threshold = 0}) == p + "failure_threshold must be positive, got 0");
    CHECK(error_of({.failure_threshold = -3}) == p + "failure_threshold must be positive, got -3");
    CHECK(error_of({.failure_threshold = 1, .break_duration = 0s}) ==
          p + "break_duration must be positive, got 0ns");
    CHECK(error_of({.failure_threshold = 1, .break_duration = -5ns}) ==
          p + "break_duration must be positive, got -5ns");
    CHECK(error_of({.failure_threshold = 1, .break_duration_growth = 0.5}) ==
          p + "break_duration_growth must be finite and at least 1, got 0.5");
    CHECK(error_of({.failure_threshold = 1, .break_duration = 10ns, .max_break_duration = 5ns}) ==
          p + "max_break_duration must be at least break_duration (10ns), got 5ns");
    CHECK(error_of({.failure_threshold = 1, .max_break_duration = -1ns}) ==
          p + "max_break_duration must be positive, got -1ns");
    CHECK(error_of({.failure_threshold = 1, .probes = 0}) == p + "probes must be at least 1, got 0");
    CHECK(error_of({.sampling = breaker_sampling{.failure_ratio = 0.5}}) ==
          p + "sampling needs exactly one of sampling.calls and sampling.window, got neither");
    CHECK(error_of({.sampling = breaker_sampling{.calls = 5, .window = 1s, .failure_ratio = 0.5}}) ==
          p + "sampling needs exactly one of sampling.calls and sampling.window, got both");
    CHECK(error_of({.sampling = breaker_sampling{.calls = 0, .failure_ratio = 0.5}}) ==
          p + "sampling.calls must be positive, got 0");
    CHECK(error_of({.sampling = breaker_sampling{.window = -1s, .failure_ratio = 0.5}}) ==
          p + "sampling.window must be positive, got -1000000000ns");
    CHECK(error_of({.sampling = breaker_sampling{.window = 1s, .segments = 0, .failure_ratio = 0.5}}) ==
          p + "sampling.segments must be positive, got 0");
    CHECK(error_of({.sampling = breaker_sampling{.window = 5ns, .segments = 10, .failure_ratio = 0.5}}) ==
          p + "sampling.segments must not exceed sampling.window in nanoseconds (5), got 10");
    CHECK(error_of(
              {.sampling = breaker_sampling{.calls = 10, .minimum_throughput = 11, .failure_ratio = 0.5}}) ==
          p + "sampling.minimum_throughput must not exceed sampling.calls (10), got 11");
    CHECK(error_of(
              {.sampling = breaker_sampling{.calls = 10, .minimum_throughput = 0, .failure_ratio = 0.5}}) ==
          p + "sampling.minimum_throughput must be positive, got 0");
    CHECK(error_of({.sampling = breaker_sampling{.calls = 10, .failure_ratio = 0.0}}) ==
          p + "sampling.failure_ratio must be in (0, 1], got 0");
    CHECK(error_of({.sampling = breaker_sampling{.calls = 10, .failure_ratio = 1.5}}) ==
          p + "sampling.failure_ratio must be in (0, 1], got 1.5");
    CHECK(error_of({.sampling =
                        breaker_sampling{.calls = 10, .slow_call_duration = 1s, .slow_call_ratio = -0.1}}) ==
          p + "sampling.slow_call_ratio must be in (0, 1], got -0.1");
    CHECK(error_of({.sampling = breaker_sampling{.calls = 10, .slow_call_ratio = 0.5}}) ==
          p + "sampling.slow_call_ratio needs sampling.slow_call_duration, got none");
    CHECK(error_of({.sampling =
                        breaker_sampling{.calls = 10, .slow_call_duration = 0s, .slow_call_ratio = 0.5}}) ==
          p + "sampling.slow_call_duration must be positive, got 0ns");
    CHECK(error_of({.failure_threshold = 1, .sampling = breaker_sampling{.calls = 10}}) ==
          p + "sampling needs sampling.failure_ratio or sampling.slow_call_ratio, got neither");
    CHECK(error_of({.failure_threshold = 1}) == "no error");
    CHECK(error_of({.sampling = breaker_sampling{
                        .window = 1s, .slow_call_duration = 1s, .slow_call_ratio = 1.0}}) == "no error");
}

TEST_CASE("circuit_breaker: default options are Polly's, and trip at its thresholds at exact instants",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{{}, sim.clock()};
    const auto& o = breaker.options();
    CHECK_FALSE(o.failure_threshold);
    REQUIRE(o.sampling);
    CHECK(o.sampling->window == 30s);
    CHECK(o.sampling->failure_ratio == 0.1);
    CHECK(o.sampling->minimum_throughput == 100);
    CHECK(o.break_duration == 5s);
    STATIC_REQUIRE(std::is_same_v<decltype(rs::circuit_breaker{}), rs::circuit_breaker<rs::steady_clock>>);

    SECTION("the hundredth call opens it, as soon as a tenth of the window has failed") {
        std::vector<std::chrono::nanoseconds> opened;
        sim.run([&]() -> rs::task<void> {
            // One call every 10ms: the first ten fail, then successes. 10 of 99 is a tenth and more,
            // but 99 calls are below minimum_throughput; the hundredth call, a success, makes 10 of 100.
            rs::outcome<int> last_failure = 0;
            for (int k = 0; k < 100; ++k) {
                CHECK(breaker.state() == circuit_state::closed);
                if (k < 10) {
                    last_failure = co_await breaker.execute_outcome(fail_now(k));
                } else {
                    auto r = co_await breaker.execute_outcome(succeed_now());
                    CHECK(r.value() == 7);
                }
                if (k < 99)
                    co_await sim.sleep_for(10ms);
            }
            CHECK(sim.now() == 990ms);
            CHECK(breaker.state() == circuit_state::open);
            auto r = co_await breaker.execute_outcome(succeed_now());
            REQUIRE(refusal(r));
            CHECK(refusal(r)->retry_after() == 5s);
            CHECK(refusal(r)->cause() == last_failure.error().exception()); // the latest failure
            co_await sim.sleep_for(5s - 1ns);
            auto late = co_await breaker.execute_outcome(succeed_now());
            REQUIRE(refusal(late));
            CHECK(refusal(late)->retry_after() == 1ns);
            co_await sim.sleep_for(1ns);
            auto probe = co_await breaker.execute_outcome(succeed_now());
            CHECK(probe.value() == 7); // the probe, at 5.99s
            CHECK(breaker.state() == circuit_state::closed);
        }());
    }
    SECTION("calls leave the sample a window after their segment began") {
        sim.run([&]() -> rs::task<void> {
            for (int k = 0; k < 99; ++k)
                (void)co_await breaker.execute_outcome(fail_now(k)); // all at 0s: 99 of 99 failed
            CHECK(breaker.state() == circuit_state::closed);
            co_await sim.sleep_for(30s - 1ns);
            CHECK(breaker.metrics().calls == 99);
            co_await sim.sleep_for(1ns);
            CHECK(breaker.metrics().calls == 0);
            (void)co_await breaker.execute_outcome(fail_now()); // 1 of 1, not 100 of 100
            CHECK(breaker.state() == circuit_state::closed);
        }());
    }
}

TEST_CASE("circuit_breaker: a refusal's retry_after is never zero: the current break while half-open and "
          "full, nanoseconds::max() while isolated",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{{.failure_threshold = 1, .break_duration = 10s, .break_duration_growth = 2.0},
                                sim.clock()};
    sim.run([&]() -> rs::task<void> {
        auto opening = co_await breaker.execute_outcome(fail_now(1)); // 0s: open for 10s
        co_await sim.sleep_for(10s);
        (void)co_await breaker.execute_outcome(fail_now(2)); // a failed probe: open for 20s
        co_await sim.sleep_for(20s);
        CHECK(breaker.state() == circuit_state::half_open);
        auto probe_then_look = [&]() -> rs::task<void> {
            co_await sim.sleep_for(1s);
            auto busy = co_await breaker.execute_outcome(succeed_now());
            REQUIRE(refusal(busy));
            CHECK(busy.error().code() == rs::errc::circuit_open);
            CHECK(refusal(busy)->retry_after() == 20s); // the break just served, not the 10s first one
            CHECK(rs::is_transient(busy.error()) == false);
        };
        auto [probe, ignored] =
            co_await rs::when_all(breaker.execute_outcome(timed(sim, 2s, false)), probe_then_look());
        (void)ignored;
        CHECK(probe.value() == 7);
        CHECK(breaker.state() == circuit_state::closed);
        (void)opening;

        breaker.isolate();
        co_await sim.sleep_for(1h);
        auto isolated = co_await breaker.execute_outcome(succeed_now());
        const auto* e = isolated.error().as<rs::circuit_isolated_error>();
        REQUIRE(e);
        CHECK(e->retry_after() == std::chrono::nanoseconds::max());
        CHECK(e->code() == rs::errc::circuit_isolated);
        CHECK(std::string(e->what()) == "circuit isolated");
        CHECK_FALSE(rs::is_transient(isolated.error()));
        try {
            (void)co_await breaker.execute(succeed_now());
            FAIL("an isolated breaker admitted a call");
        } catch (const rs::circuit_open_error& caught) { // existing catch blocks still match
            CHECK(caught.retry_after() == std::chrono::nanoseconds::max());
        }
    }());
}

TEST_CASE("circuit_breaker: its name is in its refusals, its metrics and name()", "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{{.name = "db", .failure_threshold = 1, .break_duration = 3s}, sim.clock()};
    CHECK(breaker.name() == "db");
    CHECK(breaker.metrics().name == "db");
    sim.run([&]() -> rs::task<void> {
        (void)co_await breaker.execute_outcome(fail_now());
        auto open = co_await breaker.execute_outcome(succeed_now());
        REQUIRE(refusal(open));
        CHECK(refusal(open)->policy_name() == "db");
        CHECK(std::string(refusal(open)->what()) == "db: circuit open");

        breaker.isolate();
        auto isolated = co_await breaker.execute_outcome(succeed_now());
        REQUIRE(isolated.error().as<rs::circuit_isolated_error>());
        CHECK(isolated.error().as<rs::circuit_isolated_error>()->policy_name() == "db");
        CHECK(std::string(isolated.error().what()) == "db: circuit isolated");

        resilience::stop_source caller;
        caller.request_stop();
        auto cancelled = co_await breaker.execute_outcome(succeed_now(), caller.get_token());
        REQUIRE(cancelled.error().as<rs::cancelled_error>());
        CHECK(cancelled.error().as<rs::cancelled_error>()->policy_name() == "db");
    }());
    CHECK(rs::circuit_breaker{}.name().empty());
}

namespace {
struct reply {
    int status = 0;
};
auto answer(int status) {
    return [status]() -> rs::task<reply> { co_return reply{status}; };
}
} // namespace

TEST_CASE("circuit_breaker: a returned value should_handle handles counts as a failure with a null cause, "
          "and is still returned",
          "[circuit_breaker]") {
    simulation sim;
    const rs::classifier unavailable = [](const rs::outcome<reply>& o) {
        return !o || o.value().status == 503;
    };
    rs::circuit_breaker breaker{{.failure_threshold = 2, .break_duration = 10s, .should_handle = unavailable},
                                sim.clock()};
    sim.run([&]() -> rs::task<void> {
        auto first = co_await breaker.execute_outcome(answer(503));
        CHECK(first.value().status == 503);
        CHECK(breaker.metrics().consecutive_failures == 1);
        auto fine = co_await breaker.execute_outcome(answer(200)); // a success
        CHECK(fine.value().status == 200);
        CHECK(breaker.metrics().consecutive_failures == 0);
        (void)co_await breaker.execute_outcome(answer(503));
        auto second = co_await breaker.execute_outcome(answer(503));
        CHECK(second.value().status == 503); // the caller still sees what the dependency said
        CHECK(breaker.state() == circuit_state::open);
        auto refused = co_await breaker.execute_outcome(answer(200));
        REQUIRE(refused.has_failure());
        const auto* e = refused.error().as<rs::circuit_open_error>();
        REQUIRE(e);
        CHECK(e->retry_after() == 10s);
        CHECK(e->cause() == nullptr); // no failure opened it

        // A handled value from a probe re-opens it.
        co_await sim.sleep_for(10s);
        auto probe = co_await breaker.execute_outcome(answer(503));
        CHECK(probe.value().status == 503);
        CHECK(breaker.state() == circuit_state::open);
        CHECK(breaker.metrics().consecutive_opens == 2);
    }());

    // An action of another result type cannot be judged: refused before it runs, nothing recorded.
    breaker.reset();
    bool ran = false;
    auto other = sim.run(breaker.execute_outcome([&]() -> rs::task<int> {
        ran = true;
        co_return 1;
    }));
    CHECK_FALSE(ran);
    REQUIRE(other.error().as<std::invalid_argument>());
    CHECK(other.error().what() ==
          std::string(
              "resilience::circuit_breaker: should_handle classifies "
              "rs::outcome<test_circuit_breaker::(anonymous namespace)::reply> but the action returns int"));
    // A caller that has stopped too still learns of the setup mistake, not of a cancellation.
    resilience::stop_source stopped;
    stopped.request_stop();
    auto other_stopped = sim.run(breaker.execute_outcome(
        [&]() -> rs::task<int> {
            ran = true;
            co_return 1;
        },
        stopped.get_token()));
    CHECK_FALSE(ran);
    REQUIRE(other_stopped.error().as<std::invalid_argument>());
    CHECK(other_stopped.error().what() == std::string(other.error().what()));
    CHECK(breaker.metrics().consecutive_failures == 0);
}

TEST_CASE("circuit_breaker: a throwing should_handle makes its exception the call's failure and frees the "
          "probe slot",
          "[circuit_breaker]") {
    simulation sim;
    bool throw_now = false;
    rs::circuit_breaker breaker{{.failure_threshold = 1,
                                 .break_duration = 10s,
                                 .should_handle =
                                     [&throw_now](const rs::failure&) {
                                         if (throw_now)
                                             throw std::domain_error("classifier");
                                         return true;
                                     }},
                                sim.clock()};
    sim.run([&]() -> rs::task<void> {
        (void)co_await breaker.execute_outcome(fail_now());
        co_await sim.sleep_for(10s);
        throw_now = true;
        auto probe = co_await breaker.execute_outcome(fail_now()); // execute_outcome does not throw
        REQUIRE(probe.has_failure());
        CHECK(probe.error().is<std::domain_error>());
        CHECK(breaker.state() == circuit_state::half_open); // recorded as neither
        throw_now = false;
        auto next = co_await breaker.execute_outcome(succeed_now()); // the freed slot
        CHECK(next.value() == 7);
        CHECK(breaker.state() == circuit_state::closed);
    }());
}

TEST_CASE(
    "circuit_breaker: a throwing on_state_change fails the call that ran it, after the change, and from "
    "isolate() and reset() it reaches the caller",
    "[circuit_breaker]") {
    simulation sim;
    using S = circuit_state;
    std::vector<std::pair<S, S>> told;
    rs::circuit_breaker breaker{{.failure_threshold = 1,
                                 .break_duration = 10s,
                                 .on_state_change =
                                     [&told](const rs::state_change_event& e) {
                                         told.emplace_back(e.from(), e.to());
                                         throw std::domain_error(std::string("told ") +
                                                                 rs::to_string(e.to()));
                                     }},
                                sim.clock()};
    sim.run([&]() -> rs::task<void> {
        // The failure that opens it comes back as the observer's exception.
        auto opening = co_await breaker.execute_outcome(fail_now());
        CHECK(opening.error().what() == std::string("told open"));
        CHECK(breaker.state() == S::open);

        // The call that turns it half-open never runs, and gives its probe slot back.
        co_await sim.sleep_for(10s);
        bool ran = false;
        auto first = co_await breaker.execute_outcome([&]() -> rs::task<int> {
            ran = true;
            co_return 1;
        });
        CHECK_FALSE(ran);
        CHECK(first.error().what() == std::string("told half_open"));
        CHECK(breaker.state() == S::half_open);

        // A probe that closes it: its value is replaced too.
        auto closing = co_await breaker.execute_outcome(succeed_now());
        CHECK(closing.error().what() == std::string("told closed"));
        CHECK(breaker.state() == S::closed);
    }());
    CHECK_THROWS_WITH(breaker.isolate(), "told isolated");
    CHECK(breaker.state() == S::isolated);
    CHECK_THROWS_WITH(breaker.reset(), "told closed");
    CHECK(breaker.state() == S::closed);
    CHECK(told == std::vector<std::pair<S, S>>{{S::closed, S::open},
                                               {S::open, S::half_open},
                                               {S::half_open, S::closed},
                                               {S::closed, S::isolated},
                                               {S::isolated, S::closed}});
}

TEST_CASE("circuit_breaker: on_state_change is told the breaker's name with each change",
          "[circuit_breaker]") {
    simulation sim;
    std::vector<std::string> names;
    rs::circuit_breaker breaker{
        {.name = "db",
         .failure_threshold = 1,
         .on_state_change = [&](const rs::state_change_event& e) { names.emplace_back(e.policy_name()); }},
        sim.clock()};
    (void)sim.run(breaker.execute_outcome(fail_now()));
    breaker.reset();
    CHECK(names == std::vector<std::string>{"db", "db"});
}

namespace {
// What on_rejected was told, and when.
struct told_rejection {
    std::string name;
    rs::rejection_reason reason;
    std::chrono::nanoseconds retry_after;
    std::chrono::nanoseconds at;
};
} // namespace

TEST_CASE("circuit_breaker: on_rejected is told once per refusal, with the reason and retry_after of the "
          "refusal's error, and never of a call it admitted or never judged",
          "[circuit_breaker]") {
    simulation sim;
    std::vector<told_rejection> told;
    std::vector<rs::telemetry_event> heard;
    rs::circuit_breaker breaker{
        {.name = "db",
         .failure_threshold = 1,
         .break_duration = 10s,
         .on_rejected =
             [&](const rs::rejection_event& e) {
                 told.push_back({std::string(e.policy_name()), e.reason(), e.retry_after(), sim.now()});
             },
         .telemetry =
             [&](const rs::telemetry_event& e) {
                 if (e.kind == rs::telemetry_kind::rejection)
                     heard.push_back(e);
             }},
        sim.clock()};
    std::vector<rs::outcome<int>> refusals;
    sim.run([&]() -> rs::task<void> {
        CHECK((co_await breaker.execute_outcome(succeed_now())).value() == 7);
        (void)co_await breaker.execute_outcome(fail_now()); // 0s: open until 10s
        CHECK(told.empty());

        co_await sim.sleep_for(3s);
        refusals.push_back(co_await breaker.execute_outcome(succeed_now())); // open: 7s left
        REQUIRE(told.size() == 1);

        // A caller already stopped: refused before the breaker judges anything.
        resilience::stop_source stopped;
        stopped.request_stop();
        CHECK((co_await breaker.execute_outcome(succeed_now(), stopped.get_token())).error().code() ==
              rs::errc::cancelled);
        CHECK(told.size() == 1);

        // Half-open with its one probe slot taken: refused with the break just served.
        co_await sim.sleep_for(7s);
        auto refused_while_probing = [&]() -> rs::task<void> {
            co_await sim.sleep_for(1s);
            refusals.push_back(co_await breaker.execute_outcome(succeed_now()));
        };
        auto [probe, ignored] =
            co_await rs::when_all(breaker.execute_outcome(timed(sim, 2s, false)), refused_while_probing());
        (void)ignored;
        CHECK(probe.value() == 7); // the probe itself: admitted, not told
        CHECK(breaker.state() == circuit_state::closed);
        REQUIRE(told.size() == 2);

        breaker.isolate();
        refusals.push_back(co_await breaker.execute_outcome(succeed_now()));
        REQUIRE(told.size() == 3);
        breaker.reset();
        CHECK((co_await breaker.execute_outcome(succeed_now())).value() == 7);
    }());
    REQUIRE(told.size() == 3);
    REQUIRE(refusals.size() == 3);
    const std::vector<rs::rejection_reason> reasons{rs::rejection_reason::circuit_open,
                                                    rs::rejection_reason::circuit_open,
                                                    rs::rejection_reason::circuit_isolated};
    const std::vector<std::chrono::nanoseconds> waits{7s, 10s, std::chrono::nanoseconds::max()};
    const std::vector<std::chrono::nanoseconds> when{3s, 11s, 12s};
    for (std::size_t i = 0; i < told.size(); ++i) {
        CAPTURE(i);
        CHECK(told[i].name == "db");
        CHECK(told[i].reason == reasons[i]);
        CHECK(told[i].retry_after == waits[i]);
        CHECK(told[i].at == when[i]);
        const auto* e = refusal(refusals[i]);
        REQUIRE(e);
        CHECK(e->reason() == told[i].reason);
        CHECK(e->retry_after() == told[i].retry_after);
    }
    // The listener hears each refusal after on_rejected, with the same reason.
    REQUIRE(heard.size() == 3);
    for (std::size_t i = 0; i < heard.size(); ++i)
        CHECK(heard[i].reason == reasons[i]);
}

TEST_CASE("circuit_breaker: a throwing on_rejected ends the refused call with its exception, the listener "
          "hearing nothing, and the breaker goes on",
          "[circuit_breaker]") {
    simulation sim;
    int told = 0, heard = 0;
    rs::circuit_breaker breaker{{.failure_threshold = 1,
                                 .break_duration = 10s,
                                 .on_rejected =
                                     [&](const rs::rejection_event& e) {
                                         ++told;
                                         throw std::domain_error(std::string("told ") +
                                                                 rs::to_string(e.reason()));
                                     },
                                 .telemetry =
                                     [&](const rs::telemetry_event& e) {
                                         if (e.kind == rs::telemetry_kind::rejection)
                                             ++heard;
                                     }},
                                sim.clock()};
    sim.run([&]() -> rs::task<void> {
        (void)co_await breaker.execute_outcome(fail_now()); // open until 10s
        bool ran = false;
        auto refused = co_await breaker.execute_outcome([&]() -> rs::task<int> {
            ran = true;
            co_return 1;
        });
        CHECK_FALSE(ran);
        REQUIRE(refused.has_failure());
        CHECK(refused.error().is<std::domain_error>());
        CHECK(refused.error().what() == std::string("told circuit_open"));
        try {
            (void)co_await breaker.execute(succeed_now());
            FAIL("an open breaker admitted a call");
        } catch (const std::domain_error& e) {
            CHECK(e.what() == std::string("told circuit_open"));
        }
        CHECK(told == 2);
        CHECK(heard == 0);

        // Half-open: the probe is unaffected by a refusal beside it that threw.
        co_await sim.sleep_for(10s);
        auto refused_while_probing = [&]() -> rs::task<void> {
            co_await sim.sleep_for(1s);
            auto r = co_await breaker.execute_outcome(succeed_now());
            CHECK(r.error().is<std::domain_error>());
        };
        auto [probe, ignored] =
            co_await rs::when_all(breaker.execute_outcome(timed(sim, 2s, false)), refused_while_probing());
        (void)ignored;
        CHECK(probe.value() == 7);
        CHECK(breaker.state() == circuit_state::closed);
        CHECK(told == 3);

        breaker.isolate();
        auto isolated = co_await breaker.execute_outcome(succeed_now());
        CHECK(isolated.error().what() == std::string("told circuit_isolated"));
        CHECK(breaker.state() == circuit_state::isolated);
    }());
    CHECK(told == 4);
    CHECK(heard == 0);
}

// ---- concurrency: two event loops on two threads share one breaker -------------------------------------

namespace {

// A clock several threads may read: time moves only when the test says so, and nothing sleeps on it.
struct manual_clock {
    using rep = std::int64_t;
    using period = std::nano;
    using duration = std::chrono::nanoseconds;
    using time_point = std::chrono::time_point<manual_clock, duration>;

    std::shared_ptr<std::atomic<std::int64_t>> ns = std::make_shared<std::atomic<std::int64_t>>(0);

    time_point now() const noexcept { return time_point{duration{ns->load()}}; }
    void advance(duration d) const noexcept { ns->fetch_add(d.count()); }
    std::suspend_never sleep_until(time_point, resilience::stop_token) const {
        throw std::logic_error("manual_clock: nothing may sleep on this clock");
    }
};
static_assert(rs::clock<manual_clock>);

// Parks actions until every one of `total` calls has been decided (parked, or refused), then
// resumes each parked one on its own loop: no probe can finish while callers are still arriving.
class gate {
public:
    explicit gate(int total) : total_(total) {}

    void decided() { release(count_one(nullptr)); }

    auto park() {
        struct awaiter {
            gate* g;
            bool await_ready() const noexcept { return false; }
            void await_suspend(std::coroutine_handle<> h) { g->release(g->count_one(h)); }
            void await_resume() const noexcept {}
        };
        return awaiter{this};
    }

private:
    struct parked {
        rs::event_loop* loop;
        std::coroutine_handle<> handle;
    };
    std::vector<parked> count_one(std::coroutine_handle<> h) {
        std::lock_guard lock(mutex_);
        if (h)
            parked_.push_back({rs::event_loop::current(), h});
        if (++decided_ == total_)
            return std::move(parked_);
        return {};
    }
    static void release(std::vector<parked> go) {
        for (auto& p : go)
            p.loop->post(p.handle);
    }

    std::mutex mutex_;
    int total_, decided_ = 0;
    std::vector<parked> parked_;
};

// Collects on_state_change reports, which may come from either thread.
struct state_changes {
    std::mutex mutex;
    std::vector<std::pair<circuit_state, circuit_state>> seen;

    auto recorder() {
        return [this](const rs::state_change_event& e) {
            std::lock_guard lock(mutex);
            seen.emplace_back(e.from(), e.to());
        };
    }
};

// Runs body(0) to body(n - 1) on n threads at once and joins them. The bodies make their calls each in
// its own sync_wait, and must not use Catch's assertions, which are for the test's own thread.
template <class Body>
void on_threads(int n, Body body) {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i)
        threads.emplace_back([&body, i] { body(i); });
    for (auto& t : threads)
        t.join();
}

// Spawns call(0) to call(per_loop - 1) on `a`, and call(per_loop) to call(2 * per_loop - 1) on `b`.
template <class Call>
void spawn_halves(rs::event_loop& a, rs::event_loop& b, int per_loop, Call& call) {
    for (int i = 0; i < per_loop; ++i) {
        a.spawn(call(i));
        b.spawn(call(per_loop + i));
    }
}

} // namespace

TEST_CASE("circuit_breaker: half-open admits exactly probes calls among 2000 callers on two threads",
          "[circuit_breaker][concurrency]") {
    constexpr int per_loop = 1000, total = 2 * per_loop, probes = 3;
    using S = circuit_state;
    manual_clock clock;
    state_changes changes;
    rs::circuit_breaker breaker{{.failure_threshold = 1,
                                 .break_duration = 1s,
                                 .probes = probes,
                                 .on_state_change = changes.recorder()},
                                clock};
    (void)rs::sync_wait(breaker.execute_outcome(fail_now()));
    clock.advance(1s);
    REQUIRE(breaker.state() == S::half_open);

    gate g{total};
    std::atomic<int> actions{0}, admitted{0}, refused{0}, wrong_refusals{0};
    completion_counts completed(total);
    auto call = [&](int id) -> rs::task<void> {
        auto r = co_await breaker.execute_outcome([&]() -> rs::task<int> {
            actions.fetch_add(1);
            co_await g.park();
            co_return id;
        });
        if (r.has_value()) {
            if (r.value() != id)
                wrong_refusals.fetch_add(1);
            admitted.fetch_add(1);
        } else {
            const auto* e = r.error().as<rs::circuit_open_error>();
            if (!e || e->retry_after() != 1s)
                wrong_refusals.fetch_add(1);
            refused.fetch_add(1);
            g.decided();
        }
        completed.record(static_cast<std::size_t>(id));
    };
    rs::event_loop a, b;
    spawn_halves(a, b, per_loop, call);
    run_on_threads(a, b);

    CHECK(actions.load() == probes);
    CHECK(admitted.load() == probes);
    CHECK(refused.load() == total - probes);
    CHECK(wrong_refusals.load() == 0);
    CHECK(completed.exactly_once() == total);
    CHECK(breaker.state() == S::closed);
    CHECK(changes.seen == std::vector<std::pair<S, S>>{
                              {S::closed, S::open}, {S::open, S::half_open}, {S::half_open, S::closed}});
}

TEST_CASE("circuit_breaker: failures racing on two threads open it once, and every call completes once",
          "[circuit_breaker][concurrency]") {
    constexpr int per_loop = 1000, total = 2 * per_loop;
    using S = circuit_state;
    manual_clock clock;
    state_changes changes;
    rs::circuit_breaker breaker{{.failure_threshold = 50, .on_state_change = changes.recorder()}, clock};
    std::atomic<int> ran{0}, failed{0}, refused{0}, other{0};
    completion_counts completed(total);
    auto call = [&](int id) -> rs::task<void> {
        auto r = co_await breaker.execute_outcome([&]() -> rs::task<int> {
            ran.fetch_add(1);
            co_await yield_now{};
            throw boom{id};
            co_return 0;
        });
        if (r.has_failure() && r.error().code() == rs::errc::circuit_open)
            refused.fetch_add(1);
        else if (r.has_failure() && r.error().is<boom>())
            failed.fetch_add(1);
        else
            other.fetch_add(1);
        completed.record(static_cast<std::size_t>(id));
    };
    rs::event_loop a, b;
    spawn_halves(a, b, per_loop, call);
    run_on_threads(a, b);

    CHECK(ran.load() >= 50);
    CHECK(failed.load() == ran.load());
    CHECK(ran.load() + refused.load() == total);
    CHECK(other.load() == 0);
    CHECK(completed.exactly_once() == total);
    CHECK(breaker.state() == S::open);
    CHECK(changes.seen == std::vector<std::pair<S, S>>{{S::closed, S::open}});
}

TEST_CASE("circuit_breaker: window counters add up under calls from two threads",
          "[circuit_breaker][concurrency]") {
    constexpr int per_loop = 2000, total = 2 * per_loop;
    manual_clock clock;
    rs::circuit_breaker breaker{
        {.sampling =
             rs::breaker_sampling{.calls = 100000, .minimum_throughput = 100000, .failure_ratio = 1.0}},
        clock};
    std::atomic<int> done{0};
    auto call = [&](int id) -> rs::task<void> {
        (void)co_await breaker.execute_outcome([id]() -> rs::task<int> {
            co_await yield_now{};
            if (id % 2 == 1)
                throw boom{id};
            co_return id;
        });
        done.fetch_add(1);
    };
    rs::event_loop a, b;
    spawn_halves(a, b, per_loop, call);
    run_on_threads(a, b);

    CHECK(done.load() == total);
    const auto m = breaker.metrics();
    CHECK(m.calls == total);
    CHECK(m.failures == per_loop);
    CHECK(m.state == circuit_state::closed);
}

TEST_CASE("circuit_breaker: four threads on one closed breaker: no failure is lost, a success ends the run "
          "before it, and failure_threshold failures in a row open it",
          "[circuit_breaker][concurrency]") {
    constexpr int threads = 4, failures_each = 4, threshold = threads * failures_each + 1, rounds = 300;
    using S = circuit_state;
    manual_clock clock;
    state_changes changes;
    std::atomic<bool> open_told{false};
    rs::circuit_breaker breaker{{.failure_threshold = threshold,
                                 .break_duration = 1s,
                                 .on_state_change =
                                     [&, record = changes.recorder()](const rs::state_change_event& e) {
                                         record(e);
                                         if (e.to() == S::open)
                                             open_told.store(true);
                                     }},
                                clock};
    auto call = [&](bool fail) {
        return fail ? rs::sync_wait(breaker.execute_outcome(fail_now()))
                    : rs::sync_wait(breaker.execute_outcome(succeed_now()));
    };

    // Between phases, with every thread waiting: after the failures, all threshold - 1 of them make
    // one run; after one success per thread, there is none.
    std::atomic<int> refused_while_closed{0}, wrong_run{0}, wrong_state{0};
    int checks = 0;
    std::barrier phase{threads, [&]() noexcept {
                           if (checks < 2 * rounds) {
                               const auto m = breaker.metrics();
                               const std::uint64_t run = checks % 2 == 0 ? threshold - 1 : 0;
                               wrong_run += m.consecutive_failures == run ? 0 : 1;
                               wrong_state += m.state == S::closed ? 0 : 1;
                           }
                           ++checks;
                       }};
    // Then three threads send threshold failures each while the fourth sends two successes: with
    // 3 * threshold failures and at most two successes between them, some run reaches threshold.
    std::atomic<int> ran_after_open_told{0}, admitted_at_end{0}, wrong_refusal{0};
    auto final_call = [&](bool fail) {
        const bool told = open_told.load();
        bool ran = false;
        auto r = rs::sync_wait(breaker.execute_outcome([&ran, fail]() -> rs::task<int> {
            ran = true;
            if (fail)
                throw boom{};
            co_return 7;
        }));
        ran_after_open_told += told && ran ? 1 : 0;
        return r;
    };

    on_threads(threads, [&](int self) {
        for (int r = 0; r < rounds; ++r) {
            for (int i = 0; i < failures_each; ++i)
                refused_while_closed += call(true).error().is<boom>() ? 0 : 1;
            phase.arrive_and_wait();
            refused_while_closed += call(false).has_value() ? 0 : 1;
            phase.arrive_and_wait();
        }
        const bool failing = self != threads - 1;
        for (int i = 0; i < (failing ? threshold : 2); ++i)
            (void)final_call(failing);
        phase.arrive_and_wait();
        auto last = final_call(false);
        if (last.has_value())
            ++admitted_at_end;
        else if (!refusal(last) || refusal(last)->retry_after() != 1s)
            ++wrong_refusal; // the clock never moves: the whole break is left
    });

    CHECK(refused_while_closed.load() == 0);
    CHECK(wrong_run.load() == 0);
    CHECK(wrong_state.load() == 0);
    CHECK(ran_after_open_told.load() == 0);
    CHECK(admitted_at_end.load() == 0);
    CHECK(wrong_refusal.load() == 0);
    const auto m = breaker.metrics();
    CHECK(m.state == S::open);
    CHECK(m.consecutive_failures == threshold); // the run that opened it; later results were stale
    CHECK(m.consecutive_opens == 1);
    CHECK(changes.seen == std::vector<std::pair<S, S>>{{S::closed, S::open}});
}

TEST_CASE("circuit_breaker: four threads through open, half-open and closed, round after round: refused "
          "while open, exactly probes admitted half-open, every change told in order",
          "[circuit_breaker][concurrency]") {
    constexpr int threads = 4, probes = 2, threshold = 3, rounds = 200;
    using S = circuit_state;
    manual_clock clock;
    state_changes changes;
    rs::circuit_breaker breaker{{.failure_threshold = threshold,
                                 .break_duration = 1s,
                                 .probes = probes,
                                 .on_state_change = changes.recorder()},
                                clock};
    auto open_it = [&] {
        for (int i = 0; i < threshold; ++i)
            (void)rs::sync_wait(breaker.execute_outcome(fail_now()));
    };
    open_it();
    std::vector<std::pair<S, S>> expected{{S::closed, S::open}};

    // Each round: every thread calls once while open (all refused), the clock moves past the break,
    // then every thread calls once while half-open. Probes park until all four calls are decided, so
    // none can finish and close it while others still arrive. Even rounds' probes pass and the round
    // ends by opening it again; odd rounds' probes fail, and the first failure re-opens it.
    std::atomic<int> admitted{0}, ran_while_open{0}, wrong_refusal{0}, wrong_result{0};
    int wrong_probes = 0, wrong_state = 0, round = 0;
    bool half_open_next = true;
    std::barrier decided{threads};
    std::barrier phase{threads, [&]() noexcept {
                           if (half_open_next) {
                               wrong_state += breaker.state() == S::open ? 0 : 1;
                               clock.advance(1s);
                               wrong_state += breaker.state() == S::half_open ? 0 : 1;
                           } else {
                               wrong_probes += admitted.exchange(0) == probes ? 0 : 1;
                               expected.emplace_back(S::open, S::half_open);
                               if (round % 2 == 0) {
                                   wrong_state += breaker.state() == S::closed ? 0 : 1;
                                   expected.emplace_back(S::half_open, S::closed);
                                   open_it();
                                   expected.emplace_back(S::closed, S::open);
                               } else {
                                   wrong_state += breaker.state() == S::open ? 0 : 1;
                                   expected.emplace_back(S::half_open, S::open);
                               }
                               ++round;
                           }
                           half_open_next = !half_open_next;
                       }};

    on_threads(threads, [&](int) {
        for (int r = 0; r < rounds; ++r) {
            bool ran = false;
            auto closed_door = rs::sync_wait(breaker.execute_outcome([&ran]() -> rs::task<int> {
                ran = true;
                co_return 0;
            }));
            ran_while_open += ran ? 1 : 0;
            const auto* e = refusal(closed_door);
            wrong_refusal += e && e->retry_after() == 1s ? 0 : 1; // the clock stands at the opening
            phase.arrive_and_wait();

            const bool pass = r % 2 == 0;
            auto r2 = rs::sync_wait(breaker.execute_outcome([&, pass, r]() -> rs::task<int> {
                admitted.fetch_add(1);
                decided.arrive_and_wait();
                if (!pass)
                    throw boom{r};
                co_return r;
            }));
            if (const auto* busy = refusal(r2)) {
                wrong_refusal += busy->retry_after() == 1s && busy->cause() ? 0 : 1;
                (void)decided.arrive();
            } else if (pass ? !r2.has_value() : !r2.error().is<boom>()) {
                ++wrong_result;
            }
            phase.arrive_and_wait();
        }
    });

    CHECK(ran_while_open.load() == 0);
    CHECK(wrong_refusal.load() == 0);
    CHECK(wrong_result.load() == 0);
    CHECK(wrong_probes == 0);
    CHECK(wrong_state == 0);
    CHECK(round == rounds);
    CHECK(changes.seen == expected);
}

TEST_CASE("circuit_breaker: four threads admitting and recording straight on the core: every failure counts "
          "once and a success ends the run recorded before it",
          "[circuit_breaker][concurrency]") {
    // Without an event loop per call, calls from different threads overlap often enough to catch a
    // run counter that loses increments or a success that misses them.
    constexpr int threads = 4, failures_each = 10, threshold = threads * failures_each + 1, rounds = 5000;
    using breaker_verdict = rs::detail::breaker_verdict;
    manual_clock clock;
    rs::detail::breaker_core<manual_clock> core{{.failure_threshold = threshold}, clock};
    std::atomic<int> refused{0};
    int wrong_run = 0, wrong_state = 0, checks = 0;
    std::barrier phase{threads, [&]() noexcept {
                           const auto m = core.metrics();
                           const std::uint64_t run = checks++ % 2 == 0 ? threshold - 1 : 0;
                           wrong_run += m.consecutive_failures == run ? 0 : 1;
                           wrong_state += m.state == circuit_state::closed ? 0 : 1;
                       }};
    auto once = [&](breaker_verdict v) {
        const auto t = core.admit();
        refused += t.admitted ? 0 : 1;
        core.record(t, v, nullptr);
    };
    on_threads(threads, [&](int) {
        for (int r = 0; r < rounds; ++r) {
            for (int i = 0; i < failures_each; ++i)
                once(breaker_verdict::failure);
            phase.arrive_and_wait();
            once(breaker_verdict::success);
            phase.arrive_and_wait();
        }
    });
    CHECK(refused.load() == 0);
    CHECK(wrong_run == 0);
    CHECK(wrong_state == 0);
    CHECK(checks == 2 * rounds);
}

TEST_CASE(
    "circuit_breaker: copies compare equal and hash alike, and a call outlives the copy it was made through",
    "[circuit_breaker]") {
    rs::testing::simulation sim;
    rs::circuit_breaker<rs::testing::virtual_clock> breaker{{.failure_threshold = 1}, sim.clock()};
    const rs::circuit_breaker<rs::testing::virtual_clock> other{{.failure_threshold = 1}, sim.clock()};
    auto copy = std::make_unique<rs::circuit_breaker<rs::testing::virtual_clock>>(breaker);
    CHECK(*copy == breaker);
    CHECK_FALSE(other == breaker);
    CHECK(std::hash<rs::circuit_breaker<rs::testing::virtual_clock>>{}(*copy) ==
          std::hash<rs::circuit_breaker<rs::testing::virtual_clock>>{}(breaker));
    auto call = copy->execute([&]() -> rs::task<int> {
        co_await sim.sleep_for(1s);
        throw std::runtime_error("down");
    });
    copy.reset(); // the handle the call was made through is gone; `breaker` keeps the state
    CHECK_THROWS_AS(sim.run(std::move(call)), std::runtime_error);
    CHECK(breaker.state() == rs::circuit_state::open); // the call's failure reached the shared state
}

} // namespace test_circuit_breaker
