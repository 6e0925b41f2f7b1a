// SPDX-License-Identifier: MIT
#include "catch.hpp"
#include "loopless_clock.hpp"
#include "support.hpp"

#include <resilience/pipeline.hpp>
#include <resilience/retry.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>
#include <resilience/when_all.hpp>

#include <atomic>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace test_timeout {

namespace rs = resilience;
using namespace std::chrono_literals;
using rs::testing::script;
using rs::testing::scripted_action;

static_assert(rs::policy<rs::timeout<>>);
static_assert(rs::policy<rs::timeout<rs::testing::virtual_clock>>);

TEST_CASE("timeout: fires at the deadline and stops the attempt", "[timeout]") {
    rs::testing::simulation sim;
    scripted_action slow{sim.clock(), script<int>{.latency = 10s, .value = 1}};
    rs::timeout limit{2s, sim.clock()};
    auto result = sim.run(limit.execute_outcome(slow));
    CHECK(sim.now() == 2s);
    REQUIRE(result.has_failure());
    CHECK(result.error().code() == rs::errc::timeout);
    auto* err = result.error().as<rs::timeout_error>();
    REQUIRE(err != nullptr);
    CHECK(err->cause() != nullptr); // the attempt's own failure (here: it was cancelled) is nested
    CHECK(slow.stopped() == 1);
    CHECK(slow.in_flight() == 0);
}

TEST_CASE("timeout: a failure before the deadline is reported at its own instant, unchanged", "[timeout]") {
    rs::testing::simulation sim;
    scripted_action flaky{sim.clock(), script<int>{.failures = 1, .latency = 300ms}};
    rs::timeout limit{2s, sim.clock()};
    CHECK_THROWS_AS(sim.run(limit.execute(flaky)), rs::testing::scripted_failure);
    CHECK(sim.now() == 300ms);
}

TEST_CASE("timeout: a value that arrives after the deadline is returned, not discarded", "[timeout]") {
    rs::testing::simulation sim;
    scripted_action stubborn{sim.clock(), script<int>{.latency = 3s, .value = 9, .ignore_stop = true}};
    rs::timeout limit{1s, sim.clock()};
    CHECK(sim.run(limit.execute(stubborn)) == 9);
    CHECK(sim.now() == 3s); // structured: it waited for the attempt instead of abandoning it
}

TEST_CASE("timeout: a failure after the deadline becomes timeout_error with that failure as cause",
          "[timeout]") {
    rs::testing::simulation sim;
    auto ignores_stop = [&]() -> rs::task<int> {
        co_await sim.sleep_for(5s);
        throw std::runtime_error("late failure");
    };
    rs::timeout limit{1s, sim.clock()};
    try {
        sim.run(limit.execute(ignores_stop));
        FAIL("expected a timeout");
    } catch (const rs::timeout_error& e) {
        CHECK(sim.now() == 5s);
        REQUIRE(e.cause() != nullptr);
        CHECK_THROWS_WITH(std::rethrow_exception(e.cause()), "late failure");
    }
}

TEST_CASE("timeout: a stop requested by the caller is cancellation, not a timeout", "[timeout]") {
    rs::testing::simulation sim;
    scripted_action slow{sim.clock(), script<int>{.latency = 10s}};
    rs::timeout limit{5s, sim.clock()};
    resilience::stop_source caller;
    auto stop_at_1s = [&]() -> rs::task<void> {
        co_await sim.sleep_for(1s);
        caller.request_stop();
    };
    auto [result, ignored] =
        sim.run(rs::when_all(limit.execute_outcome(slow, caller.get_token()), stop_at_1s()));
    CHECK(sim.now() == 1s);
    REQUIRE(result.has_failure());
    CHECK(rs::is_cancellation(result.error()));
    CHECK_FALSE(result.error().is<rs::timeout_error>());
}

TEST_CASE("timeout: a caller that already stopped is refused without running the action", "[timeout]") {
    rs::testing::simulation sim;
    scripted_action act{sim.clock(), script<int>{.value = 1}};
    resilience::stop_source caller;
    caller.request_stop();
    rs::timeout limit{1s, sim.clock()};
    auto result = sim.run(limit.execute_outcome(act, caller.get_token()));
    CHECK(rs::is_cancellation(result.error()));
    CHECK(act.calls() == 0);
}

TEST_CASE("timeout: the attempt sees its deadline and its own stop token in the context", "[timeout]") {
    rs::testing::simulation sim;
    rs::timeout limit{750ms, sim.clock()};
    std::optional<std::chrono::nanoseconds> seen;
    bool stoppable = false;
    sim.run([&]() -> rs::task<void> {
        co_await sim.sleep_for(250ms);
        co_await limit.execute([&](const rs::context& ctx) -> rs::task<void> {
            seen = ctx.deadline();
            stoppable = ctx.stop_token().stop_possible();
            co_return;
        });
    }());
    CHECK(seen == std::optional<std::chrono::nanoseconds>{1s});
    CHECK(stoppable);
}

TEST_CASE("timeout: nested timeouts keep the earlier deadline", "[timeout]") {
    rs::testing::simulation sim;
    scripted_action slow{sim.clock(), script<int>{.latency = 1h}};
    rs::pipeline outer_short{rs::timeout{1s, sim.clock()}, rs::timeout{10s, sim.clock()}};
    CHECK_THROWS_AS(sim.run(outer_short.execute(slow)), rs::timeout_error);
    CHECK(sim.now() == 1s);
    rs::pipeline inner_short{rs::timeout{10s, sim.clock()}, rs::timeout{1s, sim.clock()}};
    CHECK_THROWS_AS(sim.run(inner_short.execute(slow)), rs::timeout_error);
    CHECK(sim.now() == 2s);
}

TEST_CASE("timeout: a successful call leaves no timer behind", "[timeout]") {
    rs::testing::simulation sim;
    scripted_action fast{sim.clock(), script<int>{.latency = 10ms, .value = 3}};
    rs::timeout limit{1h, sim.clock()};
    CHECK(sim.run(limit.execute(fast)) == 3);
    CHECK(sim.now() == 10ms); // the hour-long timer was cancelled, not waited out
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("timeout: a non-positive duration is refused, naming the field", "[timeout]") {
    CHECK_THROWS_AS(rs::timeout{0s}, std::invalid_argument);
    CHECK_THAT(resilience_tests::invalid_argument_message([] { rs::timeout bad{-5ms}; }),
               Catch::Matchers::Contains("timeout must be positive") &&
                   Catch::Matchers::Contains("-5000000"));
}

TEST_CASE("timeout: default-constructed it allows 30 s, and its name is carried by its errors", "[timeout]") {
    CHECK(rs::timeout{}.options().timeout == 30s);
    rs::testing::simulation sim;
    rs::timeout named{{.name = "catalog", .timeout = 2s}, sim.clock()};
    CHECK(named.name() == "catalog");
    scripted_action slow{sim.clock(), script<int>{.latency = 10s}};
    auto result = sim.run(named.execute_outcome(slow));
    CHECK(sim.now() == 2s);
    auto* e = result.error().as<rs::timeout_error>();
    REQUIRE(e != nullptr);
    CHECK(e->policy_name() == "catalog");
    CHECK(std::string(e->what()).rfind("catalog: ", 0) == 0);
}

namespace {
// A clock with only what the `clock` concept asks for, so the timeout takes its generic path
// (a sleeping coroutine beside the attempt) instead of arming a loop timer directly.
using minimal_clock = resilience_tests::loopless_clock;
} // namespace

TEST_CASE("timeout: with any clock, fires at the deadline and reports failures at their instant",
          "[timeout]") {
    rs::testing::simulation sim;
    rs::timeout limit{1s, minimal_clock{sim.clock()}};

    scripted_action slow{sim.clock(), script<int>{.latency = 1h}};
    CHECK_THROWS_AS(sim.run(limit.execute(slow)), rs::timeout_error);
    CHECK(sim.now() == 1s);

    scripted_action flaky{sim.clock(), script<int>{.failures = 1, .latency = 200ms}};
    CHECK_THROWS_AS(sim.run(limit.execute(flaky)), rs::testing::scripted_failure);
    CHECK(sim.now() == 1s + 200ms);

    scripted_action stubborn{sim.clock(), script<int>{.latency = 3s, .value = 4, .ignore_stop = true}};
    CHECK(sim.run(limit.execute(stubborn)) == 4);
    CHECK(sim.now() == 4s + 200ms);
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("timeout: a call that completes on another thread disarms its timer safely",
          "[timeout][concurrency]") {
    rs::event_loop loop;
    rs::timeout limit{1h};
    resilience_tests::foreign_thread worker; // resumes the attempt off the loop's thread
    std::thread::id after_call;
    int v = loop.run([&]() -> rs::task<int> {
        int r = co_await limit.execute([&]() -> rs::task<int> {
            co_await worker.resume_here();
            co_return 8;
        });
        after_call = std::this_thread::get_id();
        co_return r;
    }());
    CHECK(v == 8);
    CHECK(after_call == std::this_thread::get_id()); // the timeout brought the caller back to its loop
    CHECK(loop.timers() == 0);
}

TEST_CASE("timeout: a token made on another thread while the deadline fires on the loop is always stopped",
          "[timeout][concurrency]") {
    // The attempt asks for its token off the loop's thread at about the moment its deadline fires
    // on the loop: whichever of the two comes second must stop the token, or the attempt below
    // would wait for it until it gives up.
    constexpr int rounds = 300;
    constexpr auto deadline = 200us;
    rs::event_loop loop;
    rs::timeout limit{deadline};
    int stopped = 0, timed_out = 0;
    bool lost = false; // a stop never came: the rounds after it do not wait for theirs
    loop.run([&]() -> rs::task<void> {
        for (int i = 0; i < rounds; ++i) {
            resilience_tests::foreign_thread worker;
            const auto start = std::chrono::steady_clock::now();
            const auto ask_at = start + (i % 40) * 10us; // from well before the deadline to well after
            auto r = co_await limit.execute_outcome([&](const rs::context& ctx) -> rs::task<int> {
                co_await worker.resume_here();
                while (std::chrono::steady_clock::now() < ask_at)
                    std::this_thread::yield();
                const resilience::stop_token token = ctx.stop_token();
                const auto give_up = std::chrono::steady_clock::now() + 10s;
                while (!lost && !token.stop_requested() && std::chrono::steady_clock::now() < give_up)
                    std::this_thread::yield();
                lost = lost || !token.stop_requested();
                co_return token.stop_requested() ? 1 : 0;
            });
            if (r.has_value())
                stopped += r.value(); // a value that comes after the deadline is returned
            else if (r.error().is<rs::timeout_error>())
                ++timed_out;
        }
    }());
    CHECK(stopped == rounds);
    CHECK(timed_out == 0);
    CHECK(loop.timers() == 0);
}

TEST_CASE(
    "timeout: once the deadline found no token yet, the token asked for next is born stopped, whichever "
    "thread made it",
    "[timeout][concurrency]") {
    // The attempt's stop state (detail::lazy_stop) alone: another thread asks for the token at
    // about the moment the deadline passes here. When the deadline found no token, the token this
    // thread asks for next must already be stopped, even if the other thread made it a moment
    // before and this thread only finds it.
    resilience::stop_source caller;
    const rs::context parent{caller.get_token()};
    constexpr int rounds = 50000;
    std::atomic<rs::detail::lazy_stop*> current{nullptr};
    std::atomic<int> started{0}, asked{0}, delay{0};
    std::thread other([&] {
        for (int seen = 0; seen < rounds;) {
            const int r = started.load(std::memory_order_acquire);
            if (r == seen) {
                std::this_thread::yield();
                continue;
            }
            seen = r;
            (void)current.load(std::memory_order_acquire)->token();
            asked.store(r, std::memory_order_release);
        }
    });
    int found_none = 0, unstopped = 0, lost = 0;
    for (int r = 1; r <= rounds; ++r) {
        std::optional<rs::detail::lazy_stop> stop;
        stop.emplace(&parent);
        current.store(&*stop, std::memory_order_release);
        started.store(r, std::memory_order_release);
        for (int spin = (r * 37) % 700; spin > 0; --spin) // a different moment each round
            delay.fetch_add(1, std::memory_order_relaxed);
        resilience::stop_source found = stop->expire();
        if (!found.stop_possible()) {
            ++found_none;
            unstopped += stop->token().stop_requested() ? 0 : 1;
        } else {
            found.request_stop(); // as the timer does with what the deadline found
        }
        while (asked.load(std::memory_order_acquire) != r)
            std::this_thread::yield();
        lost += stop->token().stop_requested() ? 0 : 1;
    }
    other.join();
    INFO("rounds whose deadline found no token: " << found_none);
    CHECK(unstopped == 0);
    CHECK(lost == 0);
}

TEST_CASE("timeout: an attempt that finishes inside its own stop request is reported as timed out",
          "[timeout]") {
    rs::testing::simulation sim;
    rs::timeout limit{300ms, sim.clock()};
    auto result = sim.run(limit.execute_outcome([](resilience::stop_token st) -> rs::task<int> {
        co_await resilience_tests::resumed_by_stop{st};
        co_return 1;
    }));
    CHECK(sim.now() == 300ms);
    REQUIRE(result.has_failure());
    CHECK(result.error().is<rs::timeout_error>());
}

// In the next two, the stop reaches the attempt through the link from the caller's token (or the
// outer timeout's) to the attempt's own, and finishes the whole call inside that forwarding, while
// the attempt's token still has a callback of the action's to go through: the attempt's stop state
// must outlive the call that made it until the forwarding is done with it.
TEST_CASE("timeout: a caller's stop that finishes the call inside its forwarding to the attempt, another "
          "callback on the attempt's token pending, is cancellation at that instant",
          "[timeout]") {
    rs::testing::simulation sim;
    auto check = [&](const auto& limit) {
        const auto start = sim.now();
        resilience::stop_source caller;
        auto [result, ignored] = sim.run(
            rs::when_all(limit.execute_outcome(resilience_tests::ends_inside_its_stop, caller.get_token()),
                         resilience_tests::stop_at(sim, caller, start + 3s)));
        CHECK(sim.now() == start + 3s);
        REQUIRE(result.has_failure());
        CHECK(rs::is_cancellation(result.error()));
        CHECK_FALSE(result.error().template is<rs::timeout_error>());
    };
    SECTION("its deadline a timer on the loop") {
        check(rs::timeout{1h, sim.clock()});
    }
    SECTION("on a clock without loop timers, watched beside the attempt with a stop_link of its own") {
        check(rs::timeout{1h, resilience_tests::shifted_clock{sim.clock()}});
    }
}

TEST_CASE("timeout: an outer deadline that finishes the call inside its forwarding to an inner timeout's "
          "attempt, another callback pending, is a timeout at the outer deadline",
          "[timeout]") {
    rs::testing::simulation sim;
    rs::pipeline nested{rs::timeout{1s, sim.clock()}, rs::timeout{1h, sim.clock()}};
    auto result = sim.run(nested.execute_outcome(resilience_tests::ends_inside_its_stop));
    CHECK(sim.now() == 1s);
    REQUIRE(result.has_failure());
    CHECK(result.error().is<rs::timeout_error>());
}

TEST_CASE("timeout: a duration too long for nanoseconds, or for the clock, means no deadline", "[timeout]") {
    CHECK(rs::timeout{std::chrono::hours{24 * 365 * 1000}}.options().timeout ==
          std::chrono::nanoseconds::max());
    rs::testing::simulation sim;
    rs::timeout forever{std::chrono::nanoseconds::max(), sim.clock()};
    scripted_action slow{sim.clock(), script<int>{.latency = 1h, .value = 5}};
    sim.run([&]() -> rs::task<void> { co_await sim.sleep_for(1s); }()); // now + max must not wrap
    CHECK(sim.run(forever.execute(slow)) == 5); // a wrapped deadline would have fired at once
    CHECK(sim.now() == 1h + 1s);
}

TEST_CASE("timeout: a token asked for after the deadline is already stopped", "[timeout]") {
    rs::testing::simulation sim;
    rs::timeout limit{1s, sim.clock()};
    bool stopped_when_asked = false;
    auto result = sim.run(limit.execute_outcome([&](const rs::context& ctx) -> rs::task<int> {
        // Busy past the deadline without looking at the token: nothing has made it yet.
        co_await sim.sleep_for(3s);
        CHECK(ctx.stop_requested());
        stopped_when_asked = ctx.stop_token().stop_requested();
        co_return 1;
    }));
    CHECK(stopped_when_asked);
    CHECK(sim.now() == 3s);
    CHECK(result.has_value()); // a value that arrives late is still returned
}

TEST_CASE("timeout: a token asked for before the deadline is stopped at the deadline", "[timeout]") {
    rs::testing::simulation sim;
    rs::timeout limit{2s, sim.clock()};
    std::optional<std::chrono::nanoseconds> stopped_at;
    auto result = sim.run(limit.execute_outcome([&](const rs::context& ctx) -> rs::task<int> {
        co_await sim.sleep_for(500ms);
        resilience::stop_callback on_stop{ctx.stop_token(), [&] { stopped_at = sim.now(); }};
        co_await sim.sleep_for(10s, ctx.stop_token());
        co_return 1;
    }));
    CHECK(stopped_at == std::optional<std::chrono::nanoseconds>{2s});
    CHECK(sim.now() == 2s);
    CHECK(result.has_value());
}

TEST_CASE("timeout: the attempt's token, made late, still follows the caller's stop", "[timeout]") {
    rs::testing::simulation sim;
    rs::timeout limit{1h, sim.clock()};
    resilience::stop_source caller;
    auto stop_at_3s = [&]() -> rs::task<void> {
        co_await sim.sleep_for(3s);
        caller.request_stop();
    };
    auto work = [&](const rs::context& ctx) -> rs::task<int> {
        co_await sim.sleep_for(1s); // the token is made only now, linked to the caller's
        co_await sim.sleep_for(1h, ctx.stop_token());
        co_return ctx.stop_requested() ? -1 : 1;
    };
    auto [result, ignored] =
        sim.run(rs::when_all(limit.execute_outcome(work, caller.get_token()), stop_at_3s()));
    CHECK(sim.now() == 3s);
    REQUIRE(result.has_value());
    CHECK(result.value() == -1);
}

TEST_CASE("timeout: an attempt that only polls sees, through an inner timeout, the outer deadline and the "
          "caller's stop at their instants",
          "[timeout]") {
    rs::testing::simulation sim;
    std::vector<bool> polls;
    auto poll_at = [&](std::vector<std::chrono::nanoseconds> instants) {
        return [&sim, &polls, instants](const rs::context& ctx) -> rs::task<int> {
            for (const auto at : instants) {
                co_await sim.sleep_for(at - sim.now()); // no token: the attempt never makes one
                polls.push_back(ctx.stop_requested());
            }
            co_return 1;
        };
    };
    SECTION("the outer deadline, passed while the inner one is far away") {
        rs::pipeline nested{rs::timeout{1s, sim.clock()}, rs::timeout{10s, sim.clock()}};
        const auto polling = poll_at({0s, 999ms, 1s, 2s}); // named: see docs/core.md#compiler-notes
        auto result = sim.run(nested.execute_outcome(polling));
        CHECK(polls == std::vector<bool>{false, false, true, true});
        CHECK(sim.now() == 2s);
        CHECK(result.has_value()); // a value that arrives late is still returned
    }
    SECTION("the caller's stop, with neither deadline passed") {
        rs::pipeline nested{rs::timeout{1h, sim.clock()}, rs::timeout{2h, sim.clock()}};
        resilience::stop_source caller;
        auto stop_at_3s = [&]() -> rs::task<void> {
            co_await sim.sleep_for(3s);
            caller.request_stop();
        };
        const auto polling = poll_at({2s, 3s, 4s});
        auto [result, ignored] =
            sim.run(rs::when_all(nested.execute_outcome(polling, caller.get_token()), stop_at_3s()));
        CHECK(polls == std::vector<bool>{false, true, true}); // the stop, armed first, comes first at 3s
        CHECK(sim.now() == 4s);
        CHECK(result.has_value());
    }
}

TEST_CASE("timeout: nested timeouts hand the inner attempt a token stopped by the earlier deadline",
          "[timeout]") {
    rs::testing::simulation sim;
    rs::pipeline nested{rs::timeout{1s, sim.clock()}, rs::timeout{10s, sim.clock()}};
    auto result = sim.run(nested.execute_outcome([&](resilience::stop_token token) -> rs::task<int> {
        co_await sim.sleep_for(1h, token);
        co_return token.stop_requested() ? -1 : 1;
    }));
    CHECK(sim.now() == 1s);
    REQUIRE(result.has_value());
    CHECK(result.value() == -1);
}

namespace {
struct timeout_seen {
    std::string name;
    std::chrono::nanoseconds timeout;
    int attempt;
    bool timeout_error;
    std::chrono::nanoseconds at;
};

// Runs the on_timeout checks on `clock`: the loop timer's path (`virtual_clock`) and the generic one.
template <class Clock>
void check_on_timeout(rs::testing::simulation& sim, Clock clock) {
    std::vector<timeout_seen> events;
    rs::timeout limit{{.name = "catalog",
                       .timeout = 2s,
                       .on_timeout =
                           [&](const rs::timeout_event& e) {
                               events.push_back({std::string(e.policy_name()), e.timeout(), e.attempt(),
                                                 e.error() && e.error()->template is<rs::timeout_error>(),
                                                 sim.now()});
                           }},
                      clock};
    CHECK(limit.options().name == "catalog");
    CHECK(limit.options().timeout == 2s);

    // An attempt that stops when asked: told once, at the deadline.
    scripted_action slow{sim.clock(), script<int>{.latency = 10s}};
    const auto start = sim.now();
    auto result = sim.run(limit.execute_outcome(slow));
    REQUIRE(result.has_failure());
    CHECK(result.error().template is<rs::timeout_error>());
    REQUIRE(events.size() == 1);
    CHECK(events[0].name == "catalog");
    CHECK(events[0].timeout == 2s);
    CHECK(events[0].attempt == 1);
    CHECK(events[0].timeout_error);
    CHECK(events[0].at == start + 2s);

    // An attempt that ignores its stop and returns a value late: told when it ends, without an error.
    scripted_action stubborn{sim.clock(), script<int>{.latency = 3s, .value = 9, .ignore_stop = true}};
    const auto second = sim.now();
    CHECK(sim.run(limit.execute(stubborn)) == 9);
    REQUIRE(events.size() == 2);
    CHECK_FALSE(events[1].timeout_error);
    CHECK(events[1].at == second + 3s);

    // Not told: a call that ends in time, a failure in time, a caller that stops.
    scripted_action fast{sim.clock(), script<int>{.latency = 1s, .value = 1}};
    CHECK(sim.run(limit.execute(fast)) == 1);
    scripted_action flaky{sim.clock(), script<int>{.failures = 1, .latency = 1s}};
    CHECK_THROWS_AS(sim.run(limit.execute(flaky)), rs::testing::scripted_failure);
    resilience::stop_source caller;
    auto [stopped, ignored] = sim.run(rs::when_all(limit.execute_outcome(slow, caller.get_token()),
                                                   resilience_tests::stop_at(sim, caller, 500ms)));
    CHECK(rs::is_cancellation(stopped.error()));
    CHECK(events.size() == 2);
}
} // namespace

TEST_CASE(
    "timeout: on_timeout is told once, when the timed-out attempt ends, with the timeout's name, length "
    "and attempt",
    "[timeout]") {
    rs::testing::simulation sim;
    SECTION("on loop timers") {
        check_on_timeout(sim, sim.clock());
    }
    SECTION("on any clock") {
        check_on_timeout(sim, minimal_clock{sim.clock()});
    }
}

TEST_CASE("timeout: on_timeout sees the attempt number a retry gave", "[timeout]") {
    rs::testing::simulation sim;
    std::vector<int> attempts;
    std::vector<std::chrono::nanoseconds> at;
    rs::pipeline p{
        rs::retry{{.max_attempts = 2, .backoff = rs::constant_backoff{100ms, rs::jitter::none}}, sim.clock()},
        rs::timeout{{.timeout = 1s,
                     .on_timeout =
                         [&](const rs::timeout_event& e) {
                             attempts.push_back(e.attempt());
                             at.push_back(sim.now());
                         }},
                    sim.clock()}};
    scripted_action slow{sim.clock(), script<int>{.latency = 10s}};
    CHECK_THROWS_AS(sim.run(p.execute(slow)), rs::timeout_error);
    CHECK(attempts == std::vector<int>{1, 2});
    CHECK(at == std::vector<std::chrono::nanoseconds>{1s, 2s + 100ms});
}

TEST_CASE("timeout: a throwing on_timeout ends the call with its exception, at the deadline", "[timeout]") {
    rs::testing::simulation sim;
    int listened = 0;
    rs::timeout limit{{.timeout = 2s,
                       .on_timeout = [](const rs::timeout_event&) { throw std::domain_error("on_timeout"); },
                       .telemetry = [&](const rs::telemetry_event&) { ++listened; }},
                      sim.clock()};
    scripted_action slow{sim.clock(), script<int>{.latency = 10s}};
    auto result = sim.run(limit.execute_outcome(slow));
    REQUIRE(result.has_failure());
    CHECK(result.error().is<std::domain_error>());
    CHECK(sim.now() == 2s);
    CHECK(slow.in_flight() == 0);
    CHECK(listened == 0); // the call ended with the callback's exception, before the report
}

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
TEST_CASE("timeout: duration(), deprecated, is options().timeout", "[timeout]") {
    CHECK(rs::timeout{3s}.duration() == 3s);
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

} // namespace test_timeout
