// SPDX-License-Identifier: MIT
#include "alloc_counter.hpp"
#include "catch.hpp"
#include "support.hpp"

#include <resilience/backoff.hpp>
#include <resilience/circuit_breaker/errors.hpp>
#include <resilience/error.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/limiter/errors.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/retry.hpp>
#include <resilience/retry_budget.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>
#include <resilience/when_all.hpp>

#include <chrono>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace test_retry {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_tests::invalid_argument_message;
using resilience_tests::stop_at;
using rs::testing::script;
using rs::testing::scripted_action;
using std::chrono::nanoseconds;

static_assert(rs::policy<rs::retry<>>);
static_assert(rs::policy<rs::retry<rs::testing::virtual_clock, rs::seeded_random>>);
static_assert(std::is_aggregate_v<rs::retry_options>);
static_assert(std::is_aggregate_v<rs::exponential_backoff>);

namespace {

const rs::exponential_backoff exact_200ms{200ms, 2.0, 30s, rs::jitter::none};

// An action that records when each attempt started and what the context said, then fails.
struct recording_action {
    rs::testing::simulation* sim;
    std::vector<nanoseconds>* starts;
    std::vector<int>* attempts;
    rs::task<int> operator()(const rs::context& ctx) const {
        starts->push_back(sim->now());
        attempts->push_back(ctx.attempt());
        throw std::runtime_error("down");
        co_return 0;
    }
};

} // namespace

TEST_CASE("retry: CTAD deduces the clock and the random source from the constructor", "[retry]") {
    rs::testing::simulation sim;
    rs::retry a{};
    rs::retry b{{.max_attempts = 3}};
    rs::retry c{{.max_attempts = 3}, sim.clock()};
    rs::retry d{{.max_attempts = 3}, sim.clock(), rs::seeded_random{7}};
    STATIC_REQUIRE(std::is_same_v<decltype(a), rs::retry<rs::steady_clock, rs::thread_random>>);
    STATIC_REQUIRE(std::is_same_v<decltype(b), rs::retry<>>);
    STATIC_REQUIRE(std::is_same_v<decltype(c), rs::retry<rs::testing::virtual_clock, rs::thread_random>>);
    STATIC_REQUIRE(std::is_same_v<decltype(d), rs::retry<rs::testing::virtual_clock, rs::seeded_random>>);
    CHECK(a.options().max_attempts == 3);
    CHECK(d.options().max_delay == 30s);
}

TEST_CASE("retry: attempts follow the backoff at exact instants, each with its own attempt number",
          "[retry]") {
    rs::testing::simulation sim;
    std::vector<nanoseconds> starts;
    std::vector<int> attempts;
    rs::retry r{{.max_attempts = 4, .backoff = exact_200ms}, sim.clock()};
    CHECK_THROWS_AS(sim.run(r.execute(recording_action{&sim, &starts, &attempts})), std::runtime_error);
    CHECK(starts == std::vector<nanoseconds>{0ms, 200ms, 600ms, 1400ms});
    CHECK(attempts == std::vector<int>{1, 2, 3, 4});
    CHECK(sim.now() == 1400ms);
}

TEST_CASE("retry: a success after failures is returned at its own instant", "[retry]") {
    rs::testing::simulation sim;
    scripted_action flaky{sim.clock(), script<int>{.failures = 2, .latency = 100ms, .value = 42}};
    rs::retry r{{.max_attempts = 3, .backoff = exact_200ms}, sim.clock()};
    CHECK(sim.run(r.execute(flaky)) == 42);
    // 0-100 fails, wait 200; 300-400 fails, wait 400; 800-900 succeeds.
    CHECK(sim.now() == 900ms);
    CHECK(flaky.calls() == 3);
}

TEST_CASE("retry: max_attempts = 1 never retries", "[retry]") {
    rs::testing::simulation sim;
    scripted_action down{sim.clock(), script<int>{.failures = 100, .latency = 10ms}};
    rs::retry r{{.max_attempts = 1, .backoff = exact_200ms}, sim.clock()};
    CHECK_THROWS_AS(sim.run(r.execute(down)), rs::testing::scripted_failure);
    CHECK(down.calls() == 1);
    CHECK(sim.now() == 10ms);
}

TEST_CASE("retry: a failure the classifier rejects is rethrown at once", "[retry]") {
    rs::testing::simulation sim;
    scripted_action down{sim.clock(), script<int>{.failures = 100, .latency = 10ms}};
    int asked = 0;
    rs::retry r{{.max_attempts = 5,
                 .backoff = exact_200ms,
                 .should_handle =
                     [&asked](const rs::failure&) {
                         ++asked;
                         return false;
                     }},
                sim.clock()};
    CHECK_THROWS_AS(sim.run(r.execute(down)), rs::testing::scripted_failure);
    CHECK(down.calls() == 1);
    CHECK(asked == 1);
    CHECK(sim.now() == 10ms);
}

TEST_CASE("retry: the failure rethrown is the very exception object the action threw", "[retry]") {
    struct tagged : std::runtime_error {
        explicit tagged(int n) : std::runtime_error("tagged " + std::to_string(n)), id(n) {}
        int id;
    };
    rs::testing::simulation sim;
    std::vector<std::exception_ptr> thrown;
    auto action = [&]() -> rs::task<int> {
        thrown.push_back(std::make_exception_ptr(tagged{static_cast<int>(thrown.size()) + 1}));
        std::rethrow_exception(thrown.back());
        co_return 0;
    };
    auto address_of = [](const std::exception_ptr& p) -> const void* {
        try {
            std::rethrow_exception(p);
        } catch (const tagged& t) {
            return &t;
        }
    };

    SECTION("when the attempts run out") {
        rs::retry r{{.max_attempts = 3, .backoff = exact_200ms}, sim.clock()};
        try {
            sim.run(r.execute(action));
            FAIL("expected the last failure");
        } catch (const tagged& e) {
            REQUIRE(thrown.size() == 3);
            CHECK(e.id == 3);
            CHECK(&e == address_of(thrown.back()));
        }
        auto out = sim.run(r.execute_outcome(action));
        REQUIRE(out.has_failure());
        CHECK(out.error().exception() == thrown.back());
    }
    SECTION("when the classifier says no") {
        rs::retry r{{.max_attempts = 3, .should_handle = [](const rs::failure&) { return false; }},
                    sim.clock()};
        auto out = sim.run(r.execute_outcome(action));
        REQUIRE(thrown.size() == 1);
        CHECK(out.error().exception() == thrown.front());
    }
    SECTION("when the budget is empty") {
        rs::retry_budget budget{{.ratio = 0.1, .capacity = 1}};
        REQUIRE(budget.try_withdraw());
        rs::retry r{{.max_attempts = 3, .budget = budget}, sim.clock()};
        auto out = sim.run(r.execute_outcome(action));
        REQUIRE(thrown.size() == 1);
        CHECK(out.error().exception() == thrown.front());
    }
}

TEST_CASE("retry: the default classifier does not retry logic errors, cancellation or an open circuit",
          "[retry]") {
    rs::testing::simulation sim;
    rs::retry r{{.max_attempts = 5, .backoff = exact_200ms}, sim.clock()};
    int calls = 0;
    auto throwing = [&](auto make) {
        return [&calls, make]() -> rs::task<int> {
            ++calls;
            throw make();
            co_return 0;
        };
    };

    calls = 0;
    CHECK_THROWS_AS(sim.run(r.execute(throwing([] { return std::logic_error("bug"); }))), std::logic_error);
    CHECK(calls == 1);
    calls = 0;
    CHECK_THROWS_AS(sim.run(r.execute(throwing([] { return std::invalid_argument("bad"); }))),
                    std::invalid_argument);
    CHECK(calls == 1);
    calls = 0;
    CHECK_THROWS_AS(sim.run(r.execute(throwing([] { return rs::cancelled_error{}; }))), rs::cancelled_error);
    CHECK(calls == 1);
    calls = 0;
    CHECK_THROWS_AS(sim.run(r.execute(throwing([] {
        return rs::circuit_open_error{"", 1s};
    }))),
                    rs::circuit_open_error);
    CHECK(calls == 1);
    CHECK(sim.now() == 0ns);

    calls = 0;
    CHECK_THROWS_AS(sim.run(r.execute(throwing([] { return std::runtime_error("flaky"); }))),
                    std::runtime_error);
    CHECK(calls == 5);
    calls = 0;
    CHECK_THROWS_AS(sim.run(r.execute(throwing([] { return rs::timeout_error{}; }))), rs::timeout_error);
    CHECK(calls == 5);

    CHECK(rs::is_transient(rs::failure::make(std::runtime_error("x"))));
    CHECK_FALSE(rs::is_transient(rs::failure::make(std::out_of_range("x"))));
    CHECK_FALSE(rs::is_transient(rs::failure{}));
}

TEST_CASE("retry: cancellation is not retried even when the classifier would retry everything", "[retry]") {
    rs::testing::simulation sim;
    int asked = 0;
    rs::retry r{{.max_attempts = 5,
                 .should_handle =
                     [&asked](const rs::failure&) {
                         ++asked;
                         return true;
                     }},
                sim.clock()};
    int calls = 0;
    auto cancelled = [&]() -> rs::task<int> {
        ++calls;
        throw rs::cancelled_error{};
        co_return 0;
    };
    CHECK_THROWS_AS(sim.run(r.execute(cancelled)), rs::cancelled_error);
    CHECK(calls == 1);
    CHECK(asked == 0);
}

TEST_CASE("retry: a verdict's delay overrides the backoff and is capped by max_delay", "[retry]") {
    rs::testing::simulation sim;
    std::vector<nanoseconds> starts;
    std::vector<int> attempts;
    SECTION("under the cap: the verdict's delay is used as is") {
        rs::retry r{{.max_attempts = 3,
                     .backoff = exact_200ms,
                     .should_handle =
                         [](const rs::failure&) { return rs::verdict{.handle = true, .delay = 1500ms}; }},
                    sim.clock()};
        CHECK_THROWS_AS(sim.run(r.execute(recording_action{&sim, &starts, &attempts})), std::runtime_error);
        CHECK(starts == std::vector<nanoseconds>{0s, 1500ms, 3000ms});
    }
    SECTION("over the cap: max_delay") {
        rs::retry r{
            {.max_attempts = 3,
             .backoff = exact_200ms,
             .max_delay = 2s,
             .should_handle = [](const rs::failure&) { return rs::verdict{.handle = true, .delay = 1h}; }},
            sim.clock()};
        CHECK_THROWS_AS(sim.run(r.execute(recording_action{&sim, &starts, &attempts})), std::runtime_error);
        CHECK(starts == std::vector<nanoseconds>{0s, 2s, 4s});
    }
    SECTION("no delay in the verdict: the backoff") {
        rs::retry r{{.max_attempts = 3,
                     .backoff = exact_200ms,
                     .should_handle = [](const rs::failure&) { return rs::verdict{.handle = true}; }},
                    sim.clock()};
        CHECK_THROWS_AS(sim.run(r.execute(recording_action{&sim, &starts, &attempts})), std::runtime_error);
        CHECK(starts == std::vector<nanoseconds>{0s, 200ms, 600ms});
    }
    SECTION("a negative delay means no wait") {
        rs::retry r{
            {.max_attempts = 2,
             .backoff = exact_200ms,
             .should_handle = [](const rs::failure&) { return rs::verdict{.handle = true, .delay = -1s}; }},
            sim.clock()};
        CHECK_THROWS_AS(sim.run(r.execute(recording_action{&sim, &starts, &attempts})), std::runtime_error);
        CHECK(starts == std::vector<nanoseconds>{0s, 0s});
    }
}

namespace {
struct response {
    int status = 0;
};

// Answers with the given statuses in turn (the last one repeating), one per call, after 50ms.
struct status_sequence {
    rs::testing::simulation* sim;
    std::vector<int> statuses;
    int* calls;
    rs::task<response> operator()() const {
        const std::size_t i = std::min(static_cast<std::size_t>(*calls), statuses.size() - 1);
        ++*calls;
        co_await sim->sleep_for(50ms);
        co_return response{statuses[i]};
    }
};

// Retries a 503 (after the server's Retry-After, here 1s) and any failure; accepts the rest.
rs::verdict retry_unavailable(const rs::outcome<response>& o) {
    if (!o)
        return {.handle = true};
    if (o.value().status == 503)
        return {.handle = true, .delay = 1s};
    return {};
}
} // namespace

TEST_CASE("retry: an outcome classifier retries a returned value", "[retry]") {
    rs::testing::simulation sim;
    int calls = 0;
    rs::retry r{{.max_attempts = 5, .backoff = exact_200ms, .should_handle = retry_unavailable}, sim.clock()};
    const status_sequence statuses{&sim, {503, 503, 200}, &calls}; // named: see docs/core.md#compiler-notes
    const response got = sim.run(r.execute(statuses));
    CHECK(got.status == 200);
    CHECK(calls == 3);
    CHECK(sim.now() == 50ms + 1s + 50ms + 1s + 50ms);
}

TEST_CASE("retry: when attempts run out on a rejected value, that value is the result", "[retry]") {
    rs::testing::simulation sim;
    int calls = 0;
    std::vector<int> seen_statuses;
    rs::retry r{
        {.max_attempts = 3,
         .should_handle = [](const rs::outcome<response>& o) { return !o || o.value().status >= 500; },
         .on_retry =
             [&](const rs::retry_event& e) {
                 CHECK(e.error() == nullptr);
                 REQUIRE(e.value<response>() != nullptr);
                 CHECK(e.value<int>() == nullptr);
                 seen_statuses.push_back(e.value<response>()->status);
             }},
        sim.clock(),
        rs::seeded_random{1}};
    const status_sequence statuses{&sim, {500, 502, 503, 200}, &calls};
    const response got = sim.run(r.execute(statuses));
    CHECK(got.status == 503);
    CHECK(calls == 3);
    CHECK(seen_statuses == std::vector<int>{500, 502});
}

TEST_CASE("retry: an outcome classifier also sees failures", "[retry]") {
    rs::testing::simulation sim;
    scripted_action flaky{sim.clock(), script<int>{.failures = 2, .value = 7}};
    int failures_seen = 0;
    rs::retry r{{.max_attempts = 5,
                 .backoff = exact_200ms,
                 .should_handle =
                     [&failures_seen](const rs::outcome<int>& o) {
                         if (!o)
                             ++failures_seen;
                         return !o || o.value() != 7;
                     }},
                sim.clock()};
    CHECK(sim.run(r.execute(flaky)) == 7);
    CHECK(failures_seen == 2);
    CHECK(sim.now() == 600ms);
}

TEST_CASE("retry: an outcome classifier for another result type fails the call with invalid_argument",
          "[retry]") {
    rs::testing::simulation sim;
    scripted_action act{sim.clock(), script<int>{.value = 1}};
    rs::retry r{{.should_handle = [](const rs::outcome<long>& o) { return !o; }}, sim.clock()};
    CHECK(r.options().should_handle.sees_values());
    const std::string message = invalid_argument_message([&] { sim.run(r.execute(act)); });
    CHECK(message.find(
              "resilience::retry: should_handle classifies rs::outcome<long> but the action returns int") ==
          0);
    // A caller that has stopped too still learns of the setup mistake, not of a cancellation.
    resilience::stop_source stopped;
    stopped.request_stop();
    const std::string when_stopped =
        invalid_argument_message([&] { sim.run(r.execute(act, stopped.get_token())); });
    CHECK(when_stopped == message);
    CHECK(act.calls() == 0);
}

TEST_CASE("retry: actions returning void are retried, with failure or outcome<void> classifiers", "[retry]") {
    rs::testing::simulation sim;
    int calls = 0;
    auto flaky = [&]() -> rs::task<void> {
        if (++calls < 3)
            throw std::runtime_error("not yet");
        co_return;
    };
    rs::retry plain{{.max_attempts = 3, .backoff = exact_200ms}, sim.clock()};
    sim.run(plain.execute(flaky));
    CHECK(calls == 3);
    CHECK(sim.now() == 600ms);

    calls = 0;
    int values_seen = 0;
    // Four attempts allowed, so the value of the third is classified (after the last attempt the
    // classifier is not asked: no retry could follow).
    rs::retry seeing{{.max_attempts = 4,
                      .backoff = exact_200ms,
                      .should_handle =
                          [&values_seen](const rs::outcome<void>& o) {
                              if (o)
                                  ++values_seen;
                              return !o;
                          }},
                     sim.clock()};
    sim.run(seeing.execute(flaky));
    CHECK(calls == 3);
    CHECK(values_seen == 1);
}

TEST_CASE("retry: an exception thrown by the classifier ends the call with that exception", "[retry]") {
    rs::testing::simulation sim;
    scripted_action down{sim.clock(), script<int>{.failures = 100}};
    rs::retry r{{.max_attempts = 4,
                 .should_handle = [](const rs::failure&) -> bool { throw std::length_error("classifier"); }},
                sim.clock()};
    CHECK_THROWS_AS(sim.run(r.execute(down)), std::length_error);
    CHECK(down.calls() == 1);
}

TEST_CASE("retry: max_elapsed stops before a wait that would carry the call past it", "[retry]") {
    rs::testing::simulation sim;
    scripted_action down{sim.clock(), script<int>{.failures = 100, .latency = 100ms}};
    SECTION("the next wait would cross it") {
        // Attempts at 0, 1.1s, 2.2s; the third fails at 2.3s and 2.3s + 1s > 2.5s.
        rs::retry r{{.max_attempts = 10,
                     .backoff = rs::constant_backoff{1s, rs::jitter::none},
                     .max_elapsed = 2500ms},
                    sim.clock()};
        CHECK_THROWS_AS(sim.run(r.execute(down)), rs::testing::scripted_failure);
        CHECK(down.calls() == 3);
        CHECK(sim.now() == 2300ms);
    }
    SECTION("a wait that ends exactly at the limit is allowed") {
        rs::retry r{{.max_attempts = 10,
                     .backoff = rs::constant_backoff{1s, rs::jitter::none},
                     .max_elapsed = 2200ms},
                    sim.clock()};
        CHECK_THROWS_AS(sim.run(r.execute(down)), rs::testing::scripted_failure);
        CHECK(down.calls() == 3);
        CHECK(sim.now() == 2300ms);
    }
    SECTION("zero means unbounded") {
        rs::retry r{
            {.max_attempts = 10, .backoff = rs::constant_backoff{1h, rs::jitter::none}, .max_delay = 1h},
            sim.clock()};
        CHECK_THROWS_AS(sim.run(r.execute(down)), rs::testing::scripted_failure);
        CHECK(down.calls() == 10);
        CHECK(sim.now() == 9h + 1s);
    }
}

TEST_CASE("retry: a caller's stop during a long backoff ends the call at that instant with cancelled_error",
          "[retry]") {
    rs::testing::simulation sim;
    std::vector<std::exception_ptr> thrown;
    auto action = [&]() -> rs::task<int> {
        thrown.push_back(
            std::make_exception_ptr(std::runtime_error("attempt " + std::to_string(thrown.size() + 1))));
        std::rethrow_exception(thrown.back());
        co_return 0;
    };
    rs::retry r{{.max_attempts = 5, .backoff = rs::constant_backoff{10min, rs::jitter::none}}, sim.clock()};
    resilience::stop_source caller;
    auto [ignored, out] =
        sim.run(rs::when_all(stop_at(sim, caller, 5s), r.execute_outcome(action, caller.get_token())));
    (void)ignored;
    CHECK(sim.now() == 5s);
    REQUIRE(thrown.size() == 1);
    REQUIRE(out.has_failure());
    CHECK(out.error().is<rs::cancelled_error>()); // not the last failure: the caller stopped
    CHECK(sim.loop().timers() == 0);              // the backoff's timer is gone
}

TEST_CASE("retry: a caller's stop during an attempt is not retried", "[retry]") {
    rs::testing::simulation sim;
    scripted_action slow{sim.clock(), script<int>{.latency = 10s}};
    rs::retry r{
        {.max_attempts = 5, .backoff = exact_200ms, .should_handle = [](const rs::failure&) { return true; }},
        sim.clock()};
    resilience::stop_source caller;
    sim.spawn(stop_at(sim, caller, 3s));
    CHECK_THROWS_AS(sim.run(r.execute(slow, caller.get_token())), rs::cancelled_error);
    CHECK(sim.now() == 3s);
    CHECK(slow.calls() == 1);
}

TEST_CASE("retry: a stop requested before the call starts runs nothing", "[retry]") {
    rs::testing::simulation sim;
    scripted_action act{sim.clock(), script<int>{.value = 1}};
    rs::retry r{{}, sim.clock()};
    resilience::stop_source caller;
    caller.request_stop();
    CHECK_THROWS_AS(sim.run(r.execute(act, caller.get_token())), rs::cancelled_error);
    CHECK(act.calls() == 0);
}

TEST_CASE("retry: on_retry reports the failed attempt, its failure and the chosen delay", "[retry]") {
    rs::testing::simulation sim;
    scripted_action down{sim.clock(), script<int>{.failures = 100}};
    std::vector<int> attempts;
    std::vector<nanoseconds> delays;
    std::vector<int> failed_calls;
    rs::retry r{{.max_attempts = 4,
                 .backoff = exact_200ms,
                 .on_retry =
                     [&](const rs::retry_event& e) {
                         attempts.push_back(e.attempt());
                         delays.push_back(e.delay());
                         REQUIRE(e.error() != nullptr);
                         failed_calls.push_back(e.error()->as<rs::testing::scripted_failure>()->call());
                         CHECK(e.value<int>() == nullptr);
                     }},
                sim.clock()};
    CHECK_THROWS_AS(sim.run(r.execute(down)), rs::testing::scripted_failure);
    CHECK(attempts == std::vector<int>{1, 2, 3}); // no retry follows the fourth, so no event
    CHECK(delays == std::vector<nanoseconds>{200ms, 400ms, 800ms});
    CHECK(failed_calls == std::vector<int>{1, 2, 3});
}

TEST_CASE("retry: an exception thrown by on_retry ends the call with that exception", "[retry]") {
    rs::testing::simulation sim;
    scripted_action down{sim.clock(), script<int>{.failures = 100}};
    rs::retry r{
        {.max_attempts = 4, .on_retry = [](const rs::retry_event&) { throw std::domain_error("hook"); }},
        sim.clock()};
    CHECK_THROWS_AS(sim.run(r.execute(down)), std::domain_error);
    CHECK(down.calls() == 1);
}

TEST_CASE("retry: jittered waits are drawn from the injected generator, reproducibly", "[retry]") {
    auto delays_with_seed = [](std::uint64_t seed) {
        rs::testing::simulation sim;
        scripted_action down{sim.clock(), script<int>{.failures = 100}};
        std::vector<nanoseconds> delays;
        rs::retry r{{.max_attempts = 6,
                     .backoff = rs::exponential_backoff{100ms, 2.0, 1s},
                     .on_retry = [&](const rs::retry_event& e) { delays.push_back(e.delay()); }},
                    sim.clock(),
                    rs::seeded_random{seed}};
        CHECK_THROWS(sim.run(r.execute(down)));
        nanoseconds total{};
        for (auto d : delays)
            total += d;
        CHECK(sim.now() == total);
        return delays;
    };
    const auto a = delays_with_seed(9);
    CHECK(a == delays_with_seed(9));
    CHECK(a != delays_with_seed(10));
    REQUIRE(a.size() == 5);
    const nanoseconds ceilings[] = {100ms, 200ms, 400ms, 800ms, 1s};
    for (std::size_t i = 0; i < a.size(); ++i) {
        CHECK(a[i] >= 0ns);
        CHECK(a[i] <= ceilings[i]);
    }
}

TEST_CASE("retry: decorrelated jitter grows from the previous wait of the same call", "[retry]") {
    rs::testing::simulation sim;
    scripted_action down{sim.clock(), script<int>{.failures = 1'000'000}};
    std::vector<nanoseconds> delays;
    rs::retry r{{.max_attempts = 200,
                 .backoff = rs::exponential_backoff{100ms, 2.0, 5s, rs::jitter::decorrelated},
                 .on_retry = [&](const rs::retry_event& e) { delays.push_back(e.delay()); }},
                sim.clock(),
                rs::seeded_random{3}};
    CHECK_THROWS(sim.run(r.execute(down)));
    REQUIRE(delays.size() == 199);
    nanoseconds previous = 100ms;
    bool near_cap = false;
    for (auto d : delays) {
        CHECK(d >= 100ms);
        CHECK(d <= 5s);
        CHECK(d <= 3 * previous);
        near_cap = near_cap || d > 4s;
        previous = std::max(d, nanoseconds{100ms});
    }
    CHECK(near_cap);
    // A second call starts again from initial: its first wait is at most 3 x initial.
    delays.clear();
    CHECK_THROWS(sim.run(r.execute(down)));
    CHECK(delays.front() <= 300ms);
}

TEST_CASE("retry: a custom schedule can read the failure", "[retry]") {
    rs::testing::simulation sim;
    int calls = 0;
    auto limited = [&]() -> rs::task<int> {
        if (++calls < 3)
            throw rs::rate_limited_error{"", std::chrono::milliseconds{calls * 700}};
        co_return 5;
    };
    rs::retry r{{.max_attempts = 3,
                 .backoff = [](int, const rs::failure& f) -> nanoseconds {
                     auto* e = f.as<rs::rate_limited_error>();
                     return e ? e->retry_after() : 1h;
                 }},
                sim.clock()};
    CHECK(sim.run(r.execute(limited)) == 5);
    CHECK(sim.now() == 700ms + 1400ms);
}

TEST_CASE("retry: a budget stops retries and is shared across calls and retries", "[retry]") {
    rs::testing::simulation sim;
    scripted_action down{sim.clock(), script<int>{.failures = 1000}};
    rs::retry_budget budget{{.ratio = 0.5, .capacity = 2}};
    std::vector<int> exhausted_after;
    auto options = rs::retry_options{.max_attempts = 5,
                                     .backoff = rs::constant_backoff{100ms, rs::jitter::none},
                                     .budget = budget,
                                     .on_budget_exhausted = [&](const rs::retry_event& e) {
                                         exhausted_after.push_back(e.attempt());
                                         CHECK(e.delay() == 0ns);
                                         CHECK(e.error() != nullptr);
                                     }};
    rs::retry first{options, sim.clock()};
    rs::retry second{options, sim.clock()};

    // The budget starts full (2): two retries, then it is empty.
    CHECK_THROWS_AS(sim.run(first.execute(down)), rs::testing::scripted_failure);
    CHECK(down.calls() == 3);
    CHECK(sim.now() == 200ms);
    // This call earns 0.5: not a whole retry.
    CHECK_THROWS_AS(sim.run(first.execute(down)), rs::testing::scripted_failure);
    CHECK(down.calls() == 4);
    // Another retry sharing the budget: its call completes a token, so one retry.
    CHECK_THROWS_AS(sim.run(second.execute(down)), rs::testing::scripted_failure);
    CHECK(down.calls() == 6);
    CHECK(sim.now() == 300ms);
    CHECK(exhausted_after == std::vector<int>{3, 1, 2});
    CHECK(budget.calls() == 3);
    CHECK(budget.granted() == 3);
}

TEST_CASE("retry: a refused retry does not spend a budget token when max_elapsed ends the loop first",
          "[retry]") {
    rs::testing::simulation sim;
    scripted_action down{sim.clock(), script<int>{.failures = 1000}};
    rs::retry_budget budget{{.ratio = 0.1, .capacity = 5}};
    rs::retry r{{.max_attempts = 5,
                 .backoff = rs::constant_backoff{1s, rs::jitter::none},
                 .max_elapsed = 1500ms,
                 .budget = budget},
                sim.clock()};
    CHECK_THROWS(sim.run(r.execute(down)));
    CHECK(down.calls() == 2);
    CHECK(budget.granted() == 1);
    CHECK(budget.tokens() == 4.0);
}

TEST_CASE("retry: bad options throw std::invalid_argument naming the field and the value", "[retry]") {
    CHECK(invalid_argument_message([] { rs::retry r{{.max_attempts = 0}}; }) ==
          "resilience::retry: max_attempts must be at least 1, got 0");
    CHECK(invalid_argument_message([] { rs::retry r{{.max_attempts = -3}}; }) ==
          "resilience::retry: max_attempts must be at least 1, got -3");
    CHECK(invalid_argument_message([] { rs::retry r{{.max_elapsed = -1ms}}; }) ==
          "resilience::retry: max_elapsed must not be negative, got -1000000ns");
    CHECK(invalid_argument_message([] { rs::retry r{{.max_delay = -1ns}}; }) ==
          "resilience::retry: max_delay must not be negative, got -1ns");
    CHECK(invalid_argument_message([] {
              rs::retry r{{.backoff = rs::exponential_backoff{.factor = 0.5}}};
          }) == "resilience::exponential_backoff: factor must be finite and at least 1, got 0.5");
}

TEST_CASE("retry: inside a pipeline each attempt gets its own timeout deadline", "[retry][pipeline]") {
    rs::testing::simulation sim;
    std::vector<nanoseconds> starts;
    std::vector<std::optional<nanoseconds>> deadlines;
    std::vector<int> attempts;
    // Two attempts that stall past the timeout, then one that answers in 100ms.
    auto action = [&](const rs::context& ctx) -> rs::task<int> {
        starts.push_back(sim.now());
        deadlines.push_back(ctx.deadline());
        attempts.push_back(ctx.attempt());
        const nanoseconds latency = attempts.size() < 3 ? nanoseconds{5s} : nanoseconds{100ms};
        co_await sim.sleep_for(latency, ctx.stop_token());
        if (ctx.stop_token().stop_requested())
            throw rs::cancelled_error{};
        co_return 11;
    };
    rs::pipeline policy{rs::retry{{.max_attempts = 3, .backoff = exact_200ms}, sim.clock()},
                        rs::timeout{1s, sim.clock()}};
    CHECK(sim.run(policy.execute(action)) == 11);
    // 0-1s times out, wait 200ms; 1.2s-2.2s times out, wait 400ms; 2.6s-2.7s succeeds.
    CHECK(starts == std::vector<nanoseconds>{0s, 1200ms, 2600ms});
    CHECK(deadlines == std::vector<std::optional<nanoseconds>>{1s, 2200ms, 3600ms});
    CHECK(attempts == std::vector<int>{1, 2, 3});
    CHECK(sim.now() == 2700ms);
}

TEST_CASE("retry: a timeout outside the retry bounds the whole retried call", "[retry][pipeline]") {
    rs::testing::simulation sim;
    scripted_action down{sim.clock(), script<int>{.failures = 1000, .latency = 100ms}};
    rs::pipeline policy{rs::timeout{1s, sim.clock()},
                        rs::retry{{.max_attempts = 100, .backoff = exact_200ms}, sim.clock()}};
    // Attempts at 0, 300ms and 800ms. The wait after the third (it fails at 900ms) would end past the
    // timeout's deadline: the retry reads the deadline and does not wait, so the call ends at once with
    // that failure itself (see test_retry_deadline.cpp), not at 1s with the timeout's timeout_error.
    CHECK_THROWS_AS(sim.run(policy.execute(down)), rs::testing::scripted_failure);
    CHECK(sim.now() == 900ms);
    CHECK(down.calls() == 3);
}

TEST_CASE("retry: max_delay caps the backoff's waits as well as a verdict's", "[retry]") {
    rs::testing::simulation sim;
    std::vector<nanoseconds> starts;
    std::vector<int> attempts;
    std::vector<nanoseconds> told;
    rs::retry r{{.max_attempts = 5,
                 .backoff = rs::exponential_backoff{1s, 2.0, 1h, rs::jitter::none},
                 .max_delay = 3s,
                 .on_retry = [&](const rs::retry_event& e) { told.push_back(e.delay()); }},
                sim.clock()};
    CHECK_THROWS_AS(sim.run(r.execute(recording_action{&sim, &starts, &attempts})), std::runtime_error);
    // Waits of 1s, 2s, then 4s and 8s cut to 3s.
    CHECK(told == std::vector<nanoseconds>{1s, 2s, 3s, 3s});
    CHECK(starts == std::vector<nanoseconds>{0s, 1s, 3s, 6s, 9s});

    starts.clear();
    rs::retry no_wait{{.max_attempts = 3, .backoff = exact_200ms, .max_delay = 0s}, sim.clock()};
    const nanoseconds before = sim.now();
    CHECK_THROWS_AS(sim.run(no_wait.execute(recording_action{&sim, &starts, &attempts})), std::runtime_error);
    CHECK(starts == std::vector<nanoseconds>{before, before, before});
}

TEST_CASE("retry: its name is in its events, the errors it makes and its messages", "[retry]") {
    rs::testing::simulation sim;
    scripted_action down{sim.clock(), script<int>{.failures = 100}};
    std::vector<std::string> names;
    rs::retry r{{.name = "payments",
                 .max_attempts = 2,
                 .backoff = exact_200ms,
                 .on_retry = [&](const rs::retry_event& e) { names.emplace_back(e.policy_name()); }},
                sim.clock()};
    CHECK(r.name() == "payments");
    CHECK_THROWS(sim.run(r.execute(down)));
    CHECK(names == std::vector<std::string>{"payments"});

    resilience::stop_source caller;
    caller.request_stop();
    auto refused = sim.run(r.execute_outcome(down, caller.get_token()));
    REQUIRE(refused.error().as<rs::cancelled_error>());
    CHECK(refused.error().as<rs::cancelled_error>()->policy_name() == "payments");
    CHECK(std::string(refused.error().what()) == "payments: cancelled");

    rs::retry mismatched{{.name = "payments", .should_handle = [](const rs::outcome<long>& o) { return !o; }},
                         sim.clock()};
    CHECK(invalid_argument_message([&] { sim.run(mismatched.execute(down)); })
              .find("resilience::retry (payments): should_handle classifies rs::outcome<long> but the action "
                    "returns int") == 0);
    CHECK(invalid_argument_message([] { rs::retry bad{{.name = "payments", .max_attempts = 0}}; }) ==
          "resilience::retry (payments): max_attempts must be at least 1, got 0");
    CHECK(rs::retry{}.name().empty());
}

TEST_CASE("retry: an isolated breaker's refusal is not transient, however it was made", "[retry]") {
    CHECK_FALSE(rs::is_transient(rs::failure::make(rs::circuit_isolated_error{})));
    // Made without failure::make, so it carries no code: judged by its type.
    CHECK_FALSE(rs::is_transient(rs::failure{std::make_exception_ptr(rs::circuit_isolated_error{"db"})}));
    CHECK_FALSE(rs::is_transient(rs::failure{std::make_exception_ptr(rs::circuit_open_error{"", 1s})}));
}

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
TEST_CASE("retry: retry_classifier still names rs::classifier, for one version", "[retry]") {
    STATIC_REQUIRE(std::is_same_v<rs::retry_classifier, rs::classifier>);
    const rs::retry_classifier old = [](const rs::failure&) { return true; };
    rs::retry r{{.should_handle = old}};
    CHECK_FALSE(r.options().should_handle.empty());
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#ifdef RESILIENCE_TESTS_COUNT_ALLOCATIONS
TEST_CASE("retry: the success path allocates nothing after warm-up", "[retry][alloc]") {
    rs::event_loop loop;
    const rs::retry<> r{{.max_attempts = 3, .budget = rs::retry_budget{}}};
    std::size_t allocations = 0;
    auto ok = []() -> rs::task<int> { co_return 1; };
    loop.run([&]() -> rs::task<void> {
        for (int i = 0; i < 50; ++i)
            (void)co_await r.execute(ok); // warm the frame cache
        resilience_tests::counting_allocations counting;
        int sum = 0;
        for (int i = 0; i < 1000; ++i)
            sum += co_await r.execute(ok);
        allocations = counting.count();
        CHECK(sum == 1000);
    }());
    CHECK(allocations == 0);
}
#endif

// ---------------------------------------------------------------------------------------------------------
// The attempts after the first run in the call's own frame: the pipeline enters the stages inside the
// retry afresh each round (policy.hpp, `again`).

namespace {
// A policy of the waiting form (only `run`) that records the attempt number of each call through it.
class attempt_log : public rs::policy_base<attempt_log> {
public:
    explicit attempt_log(std::vector<int>& seen) : seen_(&seen) {}
    template <class Next>
    rs::task<rs::next_outcome_t<Next>> run(Next next, const rs::context& ctx) const {
        seen_->push_back(ctx.attempt());
        co_return co_await next(ctx);
    }

private:
    std::vector<int>* seen_;
};
} // namespace

TEST_CASE("retry: nested retries: the inner one makes all its attempts again in each round of the outer",
          "[retry][pipeline]") {
    rs::testing::simulation sim;
    std::vector<nanoseconds> starts;
    std::vector<int> attempts;
    rs::pipeline policy{
        rs::retry{{.max_attempts = 2, .backoff = rs::constant_backoff{1s, rs::jitter::none}}, sim.clock()},
        rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{100ms, rs::jitter::none}},
                  sim.clock()}};
    CHECK_THROWS_AS(sim.run(policy.execute(recording_action{&sim, &starts, &attempts})), std::runtime_error);
    // The inner retry's three attempts at 0, 100 and 200 ms; the outer's backoff of 1 s; three more.
    CHECK(starts == std::vector<nanoseconds>{0ms, 100ms, 200ms, 1200ms, 1300ms, 1400ms});
    CHECK(attempts == std::vector<int>{1, 2, 3, 1, 2, 3});
    CHECK(sim.now() == 1400ms);
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("retry: a policy of the waiting form inside a retry runs once per attempt, with its number",
          "[retry][pipeline]") {
    rs::testing::simulation sim;
    std::vector<int> seen;
    scripted_action flaky{sim.clock(), script<int>{.failures = 2, .latency = 10ms, .value = 7}};
    rs::pipeline policy{
        rs::retry{{.max_attempts = 4, .backoff = rs::constant_backoff{50ms, rs::jitter::none}}, sim.clock()},
        attempt_log{seen}, rs::timeout{1s, sim.clock()}};
    CHECK(sim.run(policy.execute(flaky)) == 7);
    CHECK(seen == std::vector<int>{1, 2, 3});
    CHECK(flaky.calls() == 3);
    CHECK(sim.now() == 130ms); // 0-10 fails, 60-70 fails, 120-130 answers
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("retry: with no wait between attempts, the next attempt starts at the instant the last failed",
          "[retry]") {
    rs::testing::simulation sim;
    std::vector<nanoseconds> starts;
    std::vector<int> attempts;
    rs::retry r{{.max_attempts = 3, .backoff = rs::constant_backoff{0ms, rs::jitter::none}}, sim.clock()};
    CHECK_THROWS_AS(sim.run(r.execute(recording_action{&sim, &starts, &attempts})), std::runtime_error);
    CHECK(starts == std::vector<nanoseconds>{0ms, 0ms, 0ms});
    CHECK(attempts == std::vector<int>{1, 2, 3});
}

TEST_CASE("retry: a loop destroyed while calls sleep in their backoff destroys them, and no attempt follows",
          "[retry]") {
    int calls = 0;
    {
        rs::testing::simulation sim;
        const rs::pipeline policy{
            rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{10s, rs::jitter::none}},
                      sim.clock()},
            rs::timeout{1s, sim.clock()}};
        auto action = [&]() -> rs::task<int> {
            ++calls;
            throw std::runtime_error("down");
            co_return 0;
        };
        for (int i = 0; i < 3; ++i)
            sim.spawn(policy.execute(action));
        sim.run_for(5s);
        CHECK(calls == 3);
        CHECK(sim.loop().timers() == 3); // one backoff each
    } // the loop destroys the three calls, their sleeps with them (ASan checks that nothing leaks)
    CHECK(calls == 3);
}

namespace {
// The simulation's clock, whose sleep is a coroutine of its own (`rs::task<void>`), as a user's clock
// may be: what `co_await` gives refers to the task, so a retry waiting in the call's frame keeps both.
struct coroutine_sleep_clock {
    using duration = std::chrono::nanoseconds;
    using time_point = rs::testing::virtual_clock::time_point;
    rs::testing::virtual_clock inner;
    time_point now() const { return inner.now(); }
    rs::task<void> sleep_until(time_point tp, rs::stop_token st) const {
        co_await inner.sleep_until(tp, std::move(st));
    }
};
} // namespace

TEST_CASE("retry: a clock whose sleep is a coroutine backs off at the same instants", "[retry]") {
    rs::testing::simulation sim;
    std::vector<nanoseconds> starts;
    std::vector<int> attempts;
    rs::retry r{{.max_attempts = 4, .backoff = exact_200ms}, coroutine_sleep_clock{sim.clock()}};
    CHECK_THROWS_AS(sim.run(r.execute(recording_action{&sim, &starts, &attempts})), std::runtime_error);
    CHECK(starts == std::vector<nanoseconds>{0ms, 200ms, 600ms, 1400ms});
    CHECK(attempts == std::vector<int>{1, 2, 3, 4});

    // Stopped during its second backoff: the sleep's coroutine ends at the stop, and so does the call.
    starts.clear();
    attempts.clear();
    resilience::stop_source caller;
    auto [ignored, out] = sim.run(
        rs::when_all(stop_at(sim, caller, sim.now() + 300ms),
                     r.execute_outcome(recording_action{&sim, &starts, &attempts}, caller.get_token())));
    (void)ignored;
    CHECK(starts == std::vector<nanoseconds>{1400ms, 1600ms});
    REQUIRE(out.has_failure());
    CHECK(out.error().is<rs::cancelled_error>());
    CHECK(sim.now() == 1700ms);
    CHECK(sim.loop().timers() == 0);
}

} // namespace test_retry
