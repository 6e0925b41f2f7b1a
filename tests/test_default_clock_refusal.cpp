// SPDX-License-Identifier: MIT
// A call on the default clock that has nowhere to sleep (no event loop runs on its thread, and nothing
// gave it a home) and may sleep there is refused when it starts, before its first attempt, with a
// std::logic_error naming the fix: never only once a retry first backs off or a timer first arms.
#include "catch.hpp"
#include "support.hpp"

#include <resilience/any_clock.hpp>
#include <resilience/any_policy.hpp>
#include <resilience/async_generator.hpp>
#include <resilience/backoff.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/chaos.hpp>
#include <resilience/circuit_breaker.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/hedge.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/reloadable.hpp>
#include <resilience/retry.hpp>
#include <resilience/retry_stream.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/task.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <chrono>
#include <coroutine>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace test_default_clock_refusal {

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

template <class T>
struct ended {
    bool done = false;
    std::optional<T> value;
    std::exception_ptr error;
};

template <class T>
resilience_tests::started_here start_here(rs::task<T> call, ended<T>& out) {
    try {
        out.value.emplace(co_await std::move(call));
    } catch (...) {
        out.error = std::current_exception();
    }
    out.done = true;
}

// Runs `call` to its end on this thread, with no event loop; it must not suspend.
template <class T>
ended<T> run_without_loop(rs::task<T> call) {
    REQUIRE(rs::event_loop::current() == nullptr);
    ended<T> out;
    start_here(std::move(call), out);
    REQUIRE(out.done);
    return out;
}

// The message of the std::logic_error `e` holds (fails the test otherwise).
std::string logic_error_message(const std::exception_ptr& e) {
    REQUIRE(e);
    try {
        std::rethrow_exception(e);
    } catch (const std::logic_error& l) {
        return l.what();
    } catch (...) {
    }
    FAIL("expected std::logic_error");
    return {};
}

// The refusal names the policy that may sleep, and each fix.
void check_names_the_fix(const std::string& m, const std::string& policy) {
    INFO(m);
    CHECK(m.rfind("resilience::" + policy, 0) == 0);
    CHECK(m.find("may sleep on the default clock") != std::string::npos);
    CHECK(m.find("nowhere to sleep") != std::string::npos);
    CHECK(m.find("rs::sync_wait") != std::string::npos);
    CHECK(m.find("rs::boost_asio::execute") != std::string::npos);
    CHECK(m.find("give the policy a clock") != std::string::npos);
}

// An action that counts its attempts and fails each (a transient failure for every classifier here).
struct failing {
    int* attempts;
    rs::task<int> operator()() const {
        ++*attempts;
        throw std::runtime_error("down");
        co_return 0;
    }
};
// An action that counts its attempts and answers 7.
struct answering {
    int* attempts;
    rs::task<int> operator()() const {
        ++*attempts;
        co_return 7;
    }
};

const auto every_failure = [](const rs::failure&) { return true; };

// `p` refuses a call with no loop before its first attempt, through both forms, naming `policy`.
template <class P>
void refused_at_start(const P& p, const std::string& policy) {
    int attempts = 0;
    const ended<int> thrown = run_without_loop(p.execute(failing{&attempts}));
    check_names_the_fix(logic_error_message(thrown.error), policy);
    const ended<rs::outcome<int>> reported = run_without_loop(p.execute_outcome(answering{&attempts}));
    REQUIRE(reported.value);
    REQUIRE(reported.value->has_failure());
    check_names_the_fix(logic_error_message(reported.value->error().exception()), policy);
    CHECK(attempts == 0);
}

// A source that yields 1 and 2, counting the times the factory was asked for it.
rs::async_generator<int> one_two() {
    co_yield 1;
    co_yield 2;
}
struct counted_source {
    int* made;
    rs::async_generator<int> operator()() const {
        ++*made;
        return one_two();
    }
};

// Pulls every item of `stream` on this thread, with no event loop.
rs::task<int> sum_of(rs::async_generator<int> stream) {
    int sum = 0;
    while (const std::optional<int> item = co_await stream.next())
        sum += *item;
    co_return sum;
}

} // namespace

TEST_CASE("default clock refusal: a retry_stream that may back off is refused at its first next() when no "
          "loop runs",
          "[default_clock_refusal]") {
    int made = 0;
    const ended<int> refused =
        run_without_loop(sum_of(rs::retry_stream(counted_source{&made}, {.name = "feed"})));
    check_names_the_fix(logic_error_message(refused.error), "retry_stream (feed)");
    CHECK(made == 0);

    // Without a backoff, or on another clock, it streams.
    const ended<int> streamed = run_without_loop(
        sum_of(rs::retry_stream(counted_source{&made}, {.backoff = rs::constant_backoff{}})));
    CHECK(streamed.value == 3);
    rs::testing::simulation sim;
    const ended<int> simulated =
        run_without_loop(sum_of(rs::retry_stream(counted_source{&made}, {}, sim.clock())));
    CHECK(simulated.value == 3);
    CHECK(made == 2);
}

TEST_CASE("default clock refusal: a retry with a backoff is refused before its first attempt when no loop "
          "runs",
          "[default_clock_refusal]") {
    refused_at_start(rs::retry{{.backoff = rs::constant_backoff{10ms}, .should_handle = every_failure}},
                     "retry");
    refused_at_start(rs::retry{{.name = "payments"}}, "retry (payments)");
    refused_at_start(rs::retry{{.backoff = rs::linear_backoff{.initial = 0ms, .step = 5ms}}}, "retry");
    // A classifier answering verdicts may set a wait whatever the backoff.
    refused_at_start(
        rs::retry{{.backoff = rs::constant_backoff{},
                   .should_handle = [](const rs::failure&) { return rs::verdict{.handle = true}; }}},
        "retry");
    // A schedule of the user's may give any wait.
    refused_at_start(rs::retry{{.backoff = [](int) { return 0ms; }}}, "retry");
}

TEST_CASE("default clock refusal: a timeout, a hedge, a bulkhead with a queue_timeout, limiters with a "
          "queue and an injected latency are refused before their first attempt when no loop runs",
          "[default_clock_refusal]") {
    refused_at_start(rs::timeout{1s}, "timeout");
    refused_at_start(rs::hedge{{.delay = 50ms}}, "hedge");
    refused_at_start(rs::hedge{{.delay = [](int) { return 0ms; }}}, "hedge");
    refused_at_start(rs::bulkhead{{.max_concurrent_calls = 4, .queue_limit = 8, .queue_timeout = 100ms}},
                     "bulkhead");
    refused_at_start(rs::rate_limiter{{.token_limit = 5, .tokens_per_second = 5, .queue_limit = 2}},
                     "rate_limiter");
    refused_at_start(rs::sliding_window_limiter{{.permit_limit = 5, .window = 1s, .queue_limit = 2}},
                     "sliding_window_limiter");
    refused_at_start(rs::chaos::latency{10ms, {.injection_rate = 0.5}}, "chaos::latency");
    // On an any_clock holding the default clock, or its coarse form.
    refused_at_start(rs::retry<rs::any_clock>{{}, rs::any_clock{}}, "retry");
    refused_at_start(rs::timeout<rs::any_clock>{{.timeout = 1s}, rs::coarse_steady_clock{}}, "timeout");
    refused_at_start(rs::timeout<rs::coarse_steady_clock>{{.timeout = 1s}}, "timeout");
}

TEST_CASE("default clock refusal: a pipeline is refused for the first of its policies that may sleep, also "
          "behind any_policy and reloadable",
          "[default_clock_refusal]") {
    const rs::circuit_breaker breaker{};
    const auto p = rs::pipeline{rs::retry{{.backoff = rs::constant_backoff{}}}, breaker,
                                rs::timeout{{.name = "db", .timeout = 2s}}};
    refused_at_start(p, "timeout (db)");
    refused_at_start(rs::any_policy<int>{p}, "timeout");
    const rs::reloadable<rs::pipeline<rs::retry<>>> r{rs::pipeline{rs::retry{}}};
    refused_at_start(r, "retry");
    refused_at_start(rs::pipeline{breaker, r}, "retry");

    // Reloaded without a backoff: it no longer sleeps, and runs with no loop.
    r.reload(rs::pipeline{rs::retry{{.backoff = rs::constant_backoff{}, .should_handle = every_failure}}});
    int attempts = 0;
    const ended<int> e = run_without_loop(r.execute(failing{&attempts}));
    CHECK(attempts == 3);
    REQUIRE(e.error);
    CHECK_THROWS_AS(std::rethrow_exception(e.error), std::runtime_error);
}

TEST_CASE("default clock refusal: a pipeline that never sleeps runs with no loop, retries and all",
          "[default_clock_refusal]") {
    const rs::circuit_breaker breaker{};
    const auto p = rs::pipeline{
        rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{}, .should_handle = every_failure}},
        breaker,
        rs::bulkhead{{.max_concurrent_calls = 4, .queue_limit = 8}}, // a queue, but no queue_timeout
        rs::rate_limiter{{.token_limit = 10, .tokens_per_second = 10}},
        rs::hedge{{.max_attempts = 1}},
        rs::chaos::latency{10ms, {.injection_rate = 0.0}}};
    int attempts = 0;
    const ended<int> failed = run_without_loop(p.execute(failing{&attempts}));
    CHECK(attempts == 3);
    REQUIRE(failed.error);
    CHECK_THROWS_AS(std::rethrow_exception(failed.error), std::runtime_error);

    attempts = 0;
    const ended<int> answered = run_without_loop(p.execute(answering{&attempts}));
    CHECK(answered.value == 7);
    CHECK(attempts == 1);

    // One attempt in all needs no backoff, whatever its schedule.
    attempts = 0;
    const ended<int> once = run_without_loop(rs::retry{{.max_attempts = 1}}.execute(answering{&attempts}));
    CHECK(once.value == 7);
    CHECK(attempts == 1);
}

TEST_CASE("default clock refusal: the same policies under sync_wait run as before",
          "[default_clock_refusal]") {
    const auto p =
        rs::pipeline{rs::retry{}, rs::timeout{1s}, rs::hedge{{.delay = 1s}},
                     rs::bulkhead{{.max_concurrent_calls = 4, .queue_limit = 8, .queue_timeout = 1s}},
                     rs::rate_limiter{{.token_limit = 5, .tokens_per_second = 5, .queue_limit = 2}}};
    int attempts = 0;
    CHECK(rs::sync_wait(p.execute(answering{&attempts})) == 7);
    CHECK(attempts == 1);
}

TEST_CASE("default clock refusal: a call on another thread with no loop is refused there too",
          "[default_clock_refusal]") {
    const rs::retry r{};
    int attempts = 0;
    std::string message;
    std::thread t([&] {
        const ended<int> e = run_without_loop(r.execute(failing{&attempts}));
        message = logic_error_message(e.error);
    });
    t.join();
    check_names_the_fix(message, "retry");
    CHECK(attempts == 0);
}

TEST_CASE("default clock refusal: policies on another clock are not refused", "[default_clock_refusal]") {
    rs::testing::simulation sim;
    const auto p = rs::pipeline{
        rs::retry{{}, sim.clock()},
        rs::bulkhead{{.max_concurrent_calls = 4, .queue_limit = 8, .queue_timeout = 1s}, sim.clock()},
        rs::rate_limiter{{.token_limit = 5, .tokens_per_second = 5, .queue_limit = 2}, sim.clock()},
        rs::chaos::latency{10ms, {.injection_rate = 0.0}, sim.clock()}};
    int attempts = 0;
    const ended<int> e = run_without_loop(p.execute(answering{&attempts}));
    CHECK(e.value == 7);
    CHECK(attempts == 1);
    const rs::retry<rs::any_clock> on_any{{}, rs::any_clock{sim.clock()}};
    const ended<int> f = run_without_loop(on_any.execute(answering{&attempts}));
    CHECK(f.value == 7);
    CHECK(attempts == 2);
}

} // namespace test_default_clock_refusal
