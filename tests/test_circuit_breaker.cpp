// SPDX-License-Identifier: MIT
// circuit_breaker: trip rules, breaks, probes, classification, state reads, and sharing across threads.

#include "catch.hpp"
#include "support.hpp"

#include <resilience/circuit_breaker.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/when_all.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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
    return [&sim, latency, fail, id](std::stop_token st) -> rs::task<int> {
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
            CHECK(refusal(*r)->retry_after() == 0ns); // half-open and full
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

TEST_CASE("circuit_breaker: a count window opens on its failure rate without a run of failures, once it "
          "holds minimum_calls",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{
        {.failure_threshold = 5,
         .window = rs::breaker_window{.size = 10, .minimum_calls = 6, .failure_rate = 0.5}},
        sim.clock()};
    sim.run([&]() -> rs::task<void> {
        // S F S F S: 2 of 5 failed, and at the 4th call half had failed but the window was too small.
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

TEST_CASE("circuit_breaker: a count window slides: only the last size calls count", "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{{.window = rs::breaker_window{.size = 4, .failure_rate = 0.75}}, sim.clock()};
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

TEST_CASE("circuit_breaker: a time window forgets calls older than within", "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{
        {.window = rs::breaker_window{.within = 10s, .buckets = 10, .minimum_calls = 4, .failure_rate = 0.5}},
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

TEST_CASE("circuit_breaker: a time window counts a call until its bucket leaves the window",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{
        {.window = rs::breaker_window{.within = 10s, .buckets = 5, .minimum_calls = 2, .failure_rate = 1.0}},
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
    rs::circuit_breaker breaker{{.window = rs::breaker_window{.size = 4,
                                                              .failure_rate = 0.5,
                                                              .slow_call_duration = 1s,
                                                              .slow_call_rate = 0.5},
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
        {.window = rs::breaker_window{.size = 10, .failure_rate = 1.0, .slow_call_duration = 1s}},
        sim.clock()};
    sim.run([&]() -> rs::task<void> {
        (void)co_await breaker.execute_outcome(timed(sim, 1s, true));
        const auto m = breaker.metrics();
        CHECK(m.calls == 1);
        CHECK(m.failures == 1);
        CHECK(m.slow_calls == 1);
    }());
}

TEST_CASE("circuit_breaker: a failure is_failure declines passes through untouched and is not recorded",
          "[circuit_breaker]") {
    simulation sim;
    rs::circuit_breaker breaker{
        {.failure_threshold = 1,
         .window = rs::breaker_window{.size = 5, .minimum_calls = 1, .failure_rate = 1.0},
         .is_failure = [](const rs::failure& f) { return !f.is<std::invalid_argument>(); }},
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
         .window = rs::breaker_window{.size = 5, .minimum_calls = 1, .failure_rate = 1.0}},
        sim.clock()};
    sim.run([&]() -> rs::task<void> {
        // The caller stops a running call.
        std::stop_source caller;
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
         .on_state_change = [&](circuit_state from, circuit_state to) { changes.emplace_back(from, to); }},
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
    rs::circuit_breaker breaker{{.failure_threshold = 2,
                                 .break_duration = 1s,
                                 .on_state_change = [&](S from, S to) { changes.emplace_back(from, to); }},
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
    auto observe = [&](S from, S to) {
        deepest = std::max(deepest, ++depth);
        changes.emplace_back(from, to);
        if (to == S::open)
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
        {.window = rs::breaker_window{.size = 4, .failure_rate = 0.75}, .break_duration = 1s}, sim.clock()};
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
        REQUIRE(refusal(r));
        CHECK(refusal(r)->retry_after() == 0ns);
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
         .window = rs::breaker_window{.size = 5, .failure_rate = 1.0, .slow_call_duration = 1s}},
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
                CHECK(refusal(r)->retry_after() == 0ns);
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
         .is_failure =
             [](const rs::failure& f) { return !f.is<std::invalid_argument>() && !rs::is_cancellation(f); }},
        sim.clock()};
    sim.run([&]() -> rs::task<void> {
        (void)co_await breaker.execute_outcome(fail_now());
        co_await sim.sleep_for(10s);

        std::stop_source caller;
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
    using rs::breaker_window;
    CHECK(error_of({}) == p + "no trip condition: set failure_threshold or window, got neither");
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
    CHECK(error_of({.window = breaker_window{.failure_rate = 0.5}}) ==
          p + "window needs exactly one of window.size and window.within, got neither");
    CHECK(error_of({.window = breaker_window{.size = 5, .within = 1s, .failure_rate = 0.5}}) ==
          p + "window needs exactly one of window.size and window.within, got both");
    CHECK(error_of({.window = breaker_window{.size = 0, .failure_rate = 0.5}}) ==
          p + "window.size must be positive, got 0");
    CHECK(error_of({.window = breaker_window{.within = -1s, .failure_rate = 0.5}}) ==
          p + "window.within must be positive, got -1000000000ns");
    CHECK(error_of({.window = breaker_window{.within = 1s, .buckets = 0, .failure_rate = 0.5}}) ==
          p + "window.buckets must be positive, got 0");
    CHECK(error_of({.window = breaker_window{.within = 5ns, .buckets = 10, .failure_rate = 0.5}}) ==
          p + "window.buckets must not exceed window.within in nanoseconds (5), got 10");
    CHECK(error_of({.window = breaker_window{.size = 10, .minimum_calls = 11, .failure_rate = 0.5}}) ==
          p + "window.minimum_calls must not exceed window.size (10), got 11");
    CHECK(error_of({.window = breaker_window{.size = 10, .minimum_calls = 0, .failure_rate = 0.5}}) ==
          p + "window.minimum_calls must be positive, got 0");
    CHECK(error_of({.window = breaker_window{.size = 10, .failure_rate = 0.0}}) ==
          p + "window.failure_rate must be in (0, 1], got 0");
    CHECK(error_of({.window = breaker_window{.size = 10, .failure_rate = 1.5}}) ==
          p + "window.failure_rate must be in (0, 1], got 1.5");
    CHECK(
        error_of({.window = breaker_window{.size = 10, .slow_call_duration = 1s, .slow_call_rate = -0.1}}) ==
        p + "window.slow_call_rate must be in (0, 1], got -0.1");
    CHECK(error_of({.window = breaker_window{.size = 10, .slow_call_rate = 0.5}}) ==
          p + "window.slow_call_rate needs window.slow_call_duration, got none");
    CHECK(error_of({.window = breaker_window{.size = 10, .slow_call_duration = 0s, .slow_call_rate = 0.5}}) ==
          p + "window.slow_call_duration must be positive, got 0ns");
    CHECK(error_of({.failure_threshold = 1, .window = breaker_window{.size = 10}}) ==
          p + "window needs window.failure_rate or window.slow_call_rate, got neither");
    CHECK(error_of({.failure_threshold = 1}) == "no error");
    CHECK(error_of({.window = breaker_window{
                        .within = 1s, .slow_call_duration = 1s, .slow_call_rate = 1.0}}) == "no error");
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
    std::suspend_never sleep_until(time_point, std::stop_token) const {
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
        return [this](circuit_state from, circuit_state to) {
            std::lock_guard lock(mutex);
            seen.emplace_back(from, to);
        };
    }
};

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
            if (!e || e->retry_after() != 0ns)
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
        {.window = rs::breaker_window{.size = 100000, .minimum_calls = 100000, .failure_rate = 1.0}}, clock};
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
