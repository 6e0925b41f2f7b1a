// SPDX-License-Identifier: MIT
#include "alloc_counter.hpp"
#include "catch.hpp"

#include <resilience/backoff.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/circuit_breaker.hpp>
#include <resilience/classifier.hpp>
#include <resilience/error.hpp>
#include <resilience/fallback.hpp>
#include <resilience/hedge.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/retry.hpp>
#include <resilience/retry_budget.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/telemetry.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace test_telemetry {

namespace rs = resilience;
using namespace std::chrono_literals;
using rs::telemetry_kind;
using rs::testing::script;
using rs::testing::scripted_action;
using std::chrono::nanoseconds;

static_assert(rs::policy<rs::telemetry<>>);
static_assert(rs::policy<rs::telemetry<rs::testing::virtual_clock>>);
static_assert(std::is_aggregate_v<rs::telemetry_event>);
static_assert(std::is_aggregate_v<rs::telemetry_options>);

TEST_CASE("telemetry: options() gives the stage's options, name first", "[telemetry]") {
    int heard = 0;
    const rs::telemetry stage{
        rs::telemetry_options{"checkout", [&](const rs::telemetry_event&) { ++heard; }}};
    CHECK(stage.options().name == "checkout");
    CHECK(stage.name() == "checkout");
    REQUIRE(stage.options().listener);
    stage.options().listener(rs::telemetry_event{});
    CHECK(heard == 1);
}

namespace {

// An event, copied out of the listener call (the event itself is valid only during it).
struct seen {
    telemetry_kind kind{};
    std::string policy;
    std::string name;
    int attempt = 0;
    nanoseconds duration{};
    std::optional<rs::failure> error;
    rs::circuit_state from{}, to{};
    rs::rejection_reason reason{};
    nanoseconds at{};
    bool handled = false;

    template <class E>
    bool error_is() const {
        return error && error->is<E>();
    }
};

struct recorder {
    std::vector<seen> events;
    rs::telemetry_listener listener() {
        return [this](const rs::telemetry_event& e) {
            events.push_back(seen{e.kind, std::string(e.policy), std::string(e.name), e.attempt, e.duration,
                                  e.error ? std::optional<rs::failure>(*e.error) : std::nullopt, e.from, e.to,
                                  e.reason, e.at, e.handled});
        };
    }
    std::vector<telemetry_kind> kinds() const {
        std::vector<telemetry_kind> k;
        for (const seen& e : events)
            k.push_back(e.kind);
        return k;
    }
};

const rs::exponential_backoff exact_200ms{200ms, 2.0, 30s, rs::jitter::none};

// What a throwing listener throws: transient to a retry (a runtime_error), so that a retry going on
// after it would show.
struct listener_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

template <class P, class A>
rs::task<void> call_into(const P& policy, A action, std::optional<rs::outcome<int>>& out) {
    out = co_await policy.execute_outcome(std::move(action));
}

} // namespace

TEST_CASE("telemetry: a listener is empty by default and its copies share one callable", "[telemetry]") {
    rs::telemetry_listener none;
    CHECK_FALSE(none);
    int calls = 0;
    rs::telemetry_listener one{[&calls](const rs::telemetry_event&) { ++calls; }};
    const rs::telemetry_listener copy = one; // NOLINT: the copy is the point
    REQUIRE(one);
    REQUIRE(copy);
    one(rs::telemetry_event{});
    copy(rs::telemetry_event{});
    CHECK(calls == 2);
    CHECK(std::string(rs::to_string(telemetry_kind::queue_wait)) == "queue_wait");
    CHECK(std::string(rs::to_string(rs::rejection_reason::queue_full)) == "queue_full");
}

TEST_CASE("telemetry: retry reports each attempt and each retry with exact lengths, waits and instants",
          "[telemetry][retry]") {
    rs::testing::simulation sim;
    recorder rec;
    scripted_action flaky{sim.clock(), script<int>{.failures = 2, .latency = 100ms, .value = 42}};
    rs::retry r{{.name = "api", .max_attempts = 3, .backoff = exact_200ms, .telemetry = rec.listener()},
                sim.clock()};
    CHECK(sim.run(r.execute(flaky)) == 42);
    // 0-100 fails, wait 200; 300-400 fails, wait 400; 800-900 succeeds.
    REQUIRE(rec.kinds() == std::vector{telemetry_kind::attempt, telemetry_kind::retry,
                                       telemetry_kind::attempt, telemetry_kind::retry,
                                       telemetry_kind::attempt});
    const auto& e = rec.events;
    for (const seen& s : e) {
        CHECK(s.policy == "retry");
        CHECK(s.name == "api");
    }
    CHECK(e[0].attempt == 1);
    CHECK(e[0].duration == 100ms);
    CHECK(e[0].at == 100ms);
    CHECK(e[0].error_is<rs::testing::scripted_failure>());
    CHECK(e[1].attempt == 1);
    CHECK(e[1].duration == 200ms);
    CHECK(e[1].at == 100ms);
    CHECK(e[1].error_is<rs::testing::scripted_failure>());
    CHECK(e[2].attempt == 2);
    CHECK(e[2].duration == 100ms);
    CHECK(e[2].at == 400ms);
    CHECK(e[3].attempt == 2);
    CHECK(e[3].duration == 400ms);
    CHECK(e[3].at == 400ms);
    CHECK(e[4].attempt == 3);
    CHECK(e[4].duration == 100ms);
    CHECK(e[4].at == 900ms);
    CHECK_FALSE(e[4].error);
    // The classifier (the default: a transient failure) handled the two failures, not the value.
    CHECK(e[0].handled);
    CHECK(e[1].handled);
    CHECK(e[2].handled);
    CHECK(e[3].handled);
    CHECK_FALSE(e[4].handled);
}

TEST_CASE("telemetry: a retry budget that refuses is reported as a rejection by retry_budget",
          "[telemetry][retry]") {
    rs::testing::simulation sim;
    recorder rec;
    rs::retry_budget budget{{.ratio = 0.1, .capacity = 1}};
    REQUIRE(budget.try_withdraw()); // empty
    scripted_action down{sim.clock(), script<int>{.failures = 5, .latency = 10ms}};
    rs::retry r{{.name = "api", .max_attempts = 3, .budget = budget, .telemetry = rec.listener()},
                sim.clock()};
    CHECK_THROWS_AS(sim.run(r.execute(down)), rs::testing::scripted_failure);
    REQUIRE(rec.kinds() == std::vector{telemetry_kind::attempt, telemetry_kind::rejection});
    CHECK(rec.events[1].policy == "retry_budget");
    CHECK(rec.events[1].name == "api");
    CHECK(rec.events[1].attempt == 1);
    CHECK(rec.events[1].at == 10ms);
    CHECK(rec.events[1].error_is<rs::testing::scripted_failure>());
    CHECK(rec.events[0].handled);
    CHECK(rec.events[1].handled); // the classifier asked for the retry the budget refused
}

TEST_CASE("telemetry: a timeout reports the deadline that passed, with the outcome it left",
          "[telemetry][timeout]") {
    rs::testing::simulation sim;
    recorder rec;
    const rs::timeout deadline{{.name = "deadline", .timeout = 1s, .telemetry = rec.listener()}, sim.clock()};

    SECTION("an attempt stopped at its deadline") {
        scripted_action stall{sim.clock(), script<int>{.latency = 5s}};
        CHECK_THROWS_AS(sim.run(deadline.execute(stall)), rs::timeout_error);
        REQUIRE(rec.kinds() == std::vector{telemetry_kind::timeout});
        const seen& e = rec.events[0];
        CHECK(e.policy == "timeout");
        CHECK(e.name == "deadline");
        CHECK(e.attempt == 1);
        CHECK(e.duration == 1s);
        CHECK(e.at == 1s);
        CHECK(e.error_is<rs::timeout_error>());
    }
    SECTION("a value that arrives after the deadline is kept, and reported without an error") {
        scripted_action late{sim.clock(), script<int>{.latency = 1500ms, .value = 7, .ignore_stop = true}};
        CHECK(sim.run(deadline.execute(late)) == 7);
        REQUIRE(rec.kinds() == std::vector{telemetry_kind::timeout});
        CHECK(rec.events[0].at == 1500ms);
        CHECK(rec.events[0].duration == 1s);
        CHECK_FALSE(rec.events[0].error);
    }
    SECTION("an attempt that ends in time reports nothing") {
        scripted_action fast{sim.clock(), script<int>{.latency = 999ms, .value = 1}};
        CHECK(sim.run(deadline.execute(fast)) == 1);
        CHECK(rec.events.empty());
    }
}

TEST_CASE("telemetry: a breaker reports its state changes in order and the calls it refuses",
          "[telemetry][circuit_breaker]") {
    rs::testing::simulation sim;
    recorder rec;
    rs::circuit_breaker breaker{
        {.name = "db", .failure_threshold = 2, .break_duration = 5s, .telemetry = rec.listener()},
        sim.clock()};
    scripted_action flaky{sim.clock(), script<int>{.failures = 2, .latency = 10ms, .value = 1}};
    sim.run([&]() -> rs::task<void> {
        (void)co_await breaker.execute_outcome(flaky);
        (void)co_await breaker.execute_outcome(flaky); // opens at 20ms
        const rs::outcome<int> refused = co_await breaker.execute_outcome(flaky);
        CHECK(refused.error().is<rs::circuit_open_error>());
        co_await sim.sleep_for(5s);
        (void)co_await breaker.execute_outcome(flaky); // half-open at 5020ms, the probe closes it at 5030ms
    }());
    REQUIRE(rec.kinds() == std::vector{telemetry_kind::state_change, telemetry_kind::rejection,
                                       telemetry_kind::state_change, telemetry_kind::state_change});
    const auto& e = rec.events;
    for (const seen& s : e) {
        CHECK(s.policy == "circuit_breaker");
        CHECK(s.name == "db");
    }
    CHECK(e[0].from == rs::circuit_state::closed);
    CHECK(e[0].to == rs::circuit_state::open);
    CHECK(e[0].at == 20ms);
    CHECK(e[1].at == 20ms);
    CHECK(e[1].attempt == 1);
    CHECK(e[1].duration == 0ns);
    REQUIRE(e[1].error_is<rs::circuit_open_error>());
    CHECK(e[1].error->as<rs::circuit_open_error>()->retry_after() == 5s);
    CHECK(e[2].from == rs::circuit_state::open);
    CHECK(e[2].to == rs::circuit_state::half_open);
    CHECK(e[2].at == 5020ms);
    CHECK(e[3].from == rs::circuit_state::half_open);
    CHECK(e[3].to == rs::circuit_state::closed);
    CHECK(e[3].at == 5030ms);
}

TEST_CASE("telemetry: isolate and reset report to the breaker's own listener",
          "[telemetry][circuit_breaker]") {
    rs::testing::simulation sim;
    recorder rec;
    rs::circuit_breaker breaker{{.failure_threshold = 2, .telemetry = rec.listener()}, sim.clock()};
    breaker.isolate();
    breaker.reset();
    REQUIRE(rec.kinds() == std::vector{telemetry_kind::state_change, telemetry_kind::state_change});
    CHECK(rec.events[0].to == rs::circuit_state::isolated);
    CHECK(rec.events[1].from == rs::circuit_state::isolated);
    CHECK(rec.events[1].to == rs::circuit_state::closed);
}

TEST_CASE("telemetry: a bulkhead reports rejections with their reason and the exact time calls queued",
          "[telemetry][bulkhead]") {
    rs::testing::simulation sim;
    recorder rec;
    scripted_action busy{sim.clock(), script<int>{.latency = 1s, .value = 1}};
    std::optional<rs::outcome<int>> a, b, c;

    SECTION("queue_full at once, and a queue wait of exactly one second") {
        const rs::bulkhead slots{
            {.name = "slots", .max_concurrent_calls = 1, .queue_limit = 1, .telemetry = rec.listener()},
            sim.clock()};
        sim.spawn(call_into(slots, busy, a)); // holds the slot 0-1s
        sim.spawn(call_into(slots, busy, b)); // queued, admitted at 1s
        sim.spawn(call_into(slots, busy, c)); // no queue place
        sim.run_all();
        REQUIRE(rec.kinds() == std::vector{telemetry_kind::rejection, telemetry_kind::queue_wait});
        const seen& refused = rec.events[0];
        CHECK(refused.policy == "bulkhead");
        CHECK(refused.name == "slots");
        CHECK(refused.reason == rs::rejection_reason::queue_full);
        CHECK(refused.duration == 0ns);
        CHECK(refused.at == 0ns);
        CHECK(refused.error_is<rs::bulkhead_rejected_error>());
        const seen& waited = rec.events[1];
        CHECK(waited.policy == "bulkhead");
        CHECK(waited.duration == 1s);
        CHECK(waited.at == 1s);
        CHECK_FALSE(waited.error);
        CHECK(b->value() == 1);
        CHECK(c->error().is<rs::bulkhead_rejected_error>());
    }
    SECTION("queue_timeout after exactly the queue timeout") {
        const rs::bulkhead slots{{.max_concurrent_calls = 1,
                                  .queue_limit = 1,
                                  .queue_timeout = 300ms,
                                  .telemetry = rec.listener()},
                                 sim.clock()};
        sim.spawn(call_into(slots, busy, a));
        sim.spawn(call_into(slots, busy, b));
        sim.run_all();
        REQUIRE(rec.kinds() == std::vector{telemetry_kind::rejection});
        CHECK(rec.events[0].reason == rs::rejection_reason::queue_timeout);
        CHECK(rec.events[0].duration == 300ms);
        CHECK(rec.events[0].at == 300ms);
    }
    SECTION("a call that finds a free slot reports nothing") {
        const rs::bulkhead slots{{.max_concurrent_calls = 2, .telemetry = rec.listener()}, sim.clock()};
        sim.spawn(call_into(slots, busy, a));
        sim.spawn(call_into(slots, busy, b));
        sim.run_all();
        CHECK(rec.events.empty());
    }
}

namespace {
// The simulation's clock, until `failing` is set: then every reading throws.
struct failing_clock {
    using duration = rs::testing::virtual_clock::duration;
    using time_point = rs::testing::virtual_clock::time_point;
    rs::testing::virtual_clock inner;
    std::shared_ptr<bool> failing = std::make_shared<bool>(false);
    time_point now() const {
        if (*failing)
            throw std::runtime_error("clock: no reading");
        return inner.now();
    }
    auto sleep_until(time_point tp, resilience::stop_token token) const {
        return inner.sleep_until(tp, token);
    }
    rs::event_loop* timer_loop() const noexcept { return inner.timer_loop(); }
};

rs::task<void> call_caught(const rs::bulkhead<failing_clock>& b, std::function<rs::task<int>()> action,
                           std::string& ended) {
    try {
        auto r = co_await b.execute_outcome(std::move(action));
        ended = r.has_value() ? "value" : r.error().what();
    } catch (const std::exception& e) {
        ended = e.what();
    }
}
} // namespace

TEST_CASE("telemetry: a clock that fails while a bulkhead times a queue wait leaves the slot free",
          "[telemetry][bulkhead]") {
    rs::testing::simulation sim;
    const failing_clock clock{sim.clock()};
    const rs::bulkhead slots{
        {.max_concurrent_calls = 1, .queue_limit = 1, .telemetry = [](const rs::telemetry_event&) {}}, clock};
    std::string first, second;
    sim.spawn(call_caught(
        slots,
        [&]() -> rs::task<int> {
            co_await sim.sleep_for(1s);
            *clock.failing = true; // the queued call's admission reads the clock next, to time its wait
            co_return 1;
        },
        first));
    sim.spawn(call_caught(
        slots, []() -> rs::task<int> { co_return 2; }, second)); // queued until 1s
    sim.run_all();
    CHECK(first == "value");
    CHECK(second == "clock: no reading");
    CHECK(slots.in_flight() == 0);
    CHECK(slots.queued() == 0);
}

TEST_CASE("telemetry: a clock that fails as a call joins a bulkhead's queue ends that call and leaves the "
          "bulkhead as it was",
          "[telemetry][bulkhead]") {
    // With a listener the call reads the clock as it finds no slot, to time its wait (before the
    // queue's first answer); with a queue timeout it reads it to arm its deadline, once the queue said
    // it must wait. Either reading throws before the call is queued: it ends with the exception, and
    // the bulkhead keeps no trace of it.
    for (const bool timed : {false, true}) {
        CAPTURE(timed);
        rs::testing::simulation sim;
        const failing_clock clock{sim.clock()};
        rs::bulkhead_options o{.max_concurrent_calls = 1, .queue_limit = 1};
        if (timed)
            o.queue_timeout = 5s;
        else
            o.telemetry = [](const rs::telemetry_event&) {};
        const rs::bulkhead slots{o, clock};
        std::string first, second, third;
        sim.spawn(call_caught(
            slots,
            [&]() -> rs::task<int> {
                co_await sim.sleep_for(1s);
                co_return 1;
            },
            first));
        sim.run_until(sim.now() + 500ms);
        *clock.failing = true;
        sim.spawn(call_caught(
            slots, []() -> rs::task<int> { co_return 2; }, second));
        sim.run_until(sim.now() + 100ms);
        CHECK(second == "clock: no reading");
        CHECK(slots.in_flight() == 1);
        CHECK(slots.queued() == 0);
        *clock.failing = false;
        sim.spawn(call_caught(
            slots, []() -> rs::task<int> { co_return 3; }, third)); // queues, and gets the slot at 1 s
        sim.run_all();
        CHECK(first == "value");
        CHECK(third == "value");
        CHECK(slots.in_flight() == 0);
        CHECK(slots.queued() == 0);
    }
}

TEST_CASE("telemetry: the limiters report queue waits and rejections, each under its own name",
          "[telemetry][rate_limiter]") {
    rs::testing::simulation sim;
    recorder rec;
    scripted_action instant{sim.clock(), script<int>{.value = 1}};
    std::optional<rs::outcome<int>> a, b, c;

    SECTION("token bucket") {
        const rs::rate_limiter bucket{{.name = "api",
                                       .token_limit = 1,
                                       .tokens_per_second = 1,
                                       .queue_limit = 1,
                                       .telemetry = rec.listener()},
                                      sim.clock()};
        sim.spawn(call_into(bucket, instant, a)); // the one token
        sim.spawn(call_into(bucket, instant, b)); // waits for the next, due at 1s
        sim.spawn(call_into(bucket, instant, c)); // no queue place
        sim.run_all();
        REQUIRE(rec.kinds() == std::vector{telemetry_kind::rejection, telemetry_kind::queue_wait});
        CHECK(rec.events[0].policy == "rate_limiter");
        CHECK(rec.events[0].name == "api");
        CHECK(rec.events[0].reason == rs::rejection_reason::queue_full);
        CHECK(rec.events[0].at == 0ns);
        REQUIRE(rec.events[0].error_is<rs::rate_limited_error>());
        CHECK(rec.events[0].error->as<rs::rate_limited_error>()->retry_after() == 2s);
        CHECK(rec.events[1].policy == "rate_limiter");
        CHECK(rec.events[1].duration == 1s);
        CHECK(rec.events[1].at == 1s);
    }
    SECTION("sliding window") {
        const rs::sliding_window_limiter window{
            {.permit_limit = 1, .window = 1s, .telemetry = rec.listener()}, sim.clock()};
        sim.spawn(call_into(window, instant, a));
        sim.spawn(call_into(window, instant, b));
        sim.run_all();
        REQUIRE(rec.kinds() == std::vector{telemetry_kind::rejection});
        CHECK(rec.events[0].policy == "sliding_window_limiter");
        CHECK(rec.events[0].reason == rs::rejection_reason::no_capacity);
        CHECK(b->error().is<rs::rate_limited_error>());
    }
}

TEST_CASE("telemetry: a hedge reports each extra attempt with the delay that passed", "[telemetry][hedge]") {
    rs::testing::simulation sim;
    recorder rec;
    const rs::hedge h{{.name = "replicas", .max_attempts = 3, .delay = 100ms, .telemetry = rec.listener()},
                      sim.clock()};
    auto action = [&sim](const rs::context& ctx) -> rs::task<int> {
        co_await sim.sleep_for(ctx.attempt() == 1 ? 1s : 150ms, ctx.stop_token());
        co_return ctx.attempt();
    };
    CHECK(sim.run(h.execute(action)) == 2); // attempt 2 starts at 100ms, answers at 250ms
    REQUIRE(rec.kinds() == std::vector{telemetry_kind::hedge, telemetry_kind::hedge});
    CHECK(rec.events[0].policy == "hedge");
    CHECK(rec.events[0].name == "replicas");
    CHECK(rec.events[0].attempt == 2);
    CHECK(rec.events[0].duration == 100ms);
    CHECK(rec.events[0].at == 100ms);
    CHECK_FALSE(rec.events[0].error);
    CHECK_FALSE(rec.events[0].handled); // the delay brought it, not an outcome
    CHECK(rec.events[1].attempt == 3);
    CHECK(rec.events[1].at == 200ms);
}

TEST_CASE("telemetry: a hedge whose budget refuses an extra attempt reports a rejection by retry_budget",
          "[telemetry][hedge]") {
    rs::testing::simulation sim;
    recorder rec;
    rs::retry_budget budget{{.ratio = 0.1, .capacity = 1}};
    REQUIRE(budget.try_withdraw()); // empty
    const rs::hedge h{{.name = "replicas",
                       .max_attempts = 2,
                       .delay = 100ms,
                       .budget = budget,
                       .telemetry = rec.listener()},
                      sim.clock()};
    scripted_action slow{sim.clock(), script<int>{.latency = 300ms, .value = 5}};
    CHECK(sim.run(h.execute(slow)) == 5);
    REQUIRE(rec.kinds() == std::vector{telemetry_kind::rejection});
    CHECK(rec.events[0].policy == "retry_budget");
    CHECK(rec.events[0].name == "replicas");
    CHECK(rec.events[0].attempt == 2);
    CHECK(rec.events[0].at == 100ms);
    CHECK_FALSE(rec.events[0].error);
    CHECK_FALSE(rec.events[0].handled); // the delay asked for it, not an outcome
    CHECK(slow.calls() == 1);
}

TEST_CASE("telemetry: a fallback reports the failure its substitute answers", "[telemetry][fallback]") {
    rs::testing::simulation sim;
    recorder rec;
    const rs::fallback cached{[](const rs::failure&) { return 0; },
                              {.name = "cache", .telemetry = rec.listener()}};
    scripted_action down{sim.clock(), script<int>{.failures = 1, .latency = 10ms}};
    CHECK(sim.run(cached.execute(down)) == 0);
    REQUIRE(rec.kinds() == std::vector{telemetry_kind::fallback});
    CHECK(rec.events[0].policy == "fallback");
    CHECK(rec.events[0].name == "cache");
    CHECK(rec.events[0].attempt == 1);
    CHECK(rec.events[0].error_is<rs::testing::scripted_failure>());
    CHECK(rec.events[0].handled);
}

TEST_CASE("telemetry: an attempt's event says whether the retry's classifier handled it, value or failure",
          "[telemetry][retry]") {
    rs::testing::simulation sim;
    recorder rec;
    // A 503 is a value the classifier handles: retried, though nothing was thrown.
    const rs::retry r{{.max_attempts = 3,
                       .backoff = rs::constant_backoff{100ms, rs::jitter::none},
                       .should_handle = [](const rs::outcome<int>& o) { return o.has_value() && *o == 503; },
                       .telemetry = rec.listener()},
                      sim.clock()};
    int calls = 0;
    const auto unavailable_once = [&]() -> rs::task<int> { co_return ++calls == 1 ? 503 : 200; };
    CHECK(sim.run(r.execute(unavailable_once)) == 200);
    REQUIRE(rec.kinds() ==
            std::vector{telemetry_kind::attempt, telemetry_kind::retry, telemetry_kind::attempt});
    CHECK_FALSE(rec.events[0].error);
    CHECK(rec.events[0].handled);
    CHECK(rec.events[1].handled);
    CHECK_FALSE(rec.events[2].error);
    CHECK_FALSE(rec.events[2].handled);

    // The last attempt is judged too: the 503 the call gives back was handled.
    rec.events.clear();
    const auto unavailable = []() -> rs::task<int> { co_return 503; };
    CHECK(sim.run(r.execute(unavailable)) == 503);
    REQUIRE(rec.kinds() == std::vector{telemetry_kind::attempt, telemetry_kind::retry,
                                       telemetry_kind::attempt, telemetry_kind::retry,
                                       telemetry_kind::attempt});
    for (const seen& e : rec.events)
        CHECK(e.handled);

    // Failures: a transient one is handled, on the last attempt as well; a logic_error is not.
    recorder failures;
    const rs::retry defaults{{.max_attempts = 2,
                              .backoff = rs::constant_backoff{100ms, rs::jitter::none},
                              .telemetry = failures.listener()},
                             sim.clock()};
    scripted_action down{sim.clock(), script<int>{.failures = 5, .latency = 10ms}};
    CHECK_THROWS_AS(sim.run(defaults.execute(down)), rs::testing::scripted_failure);
    REQUIRE(failures.kinds() ==
            std::vector{telemetry_kind::attempt, telemetry_kind::retry, telemetry_kind::attempt});
    CHECK(failures.events[0].handled);
    CHECK(failures.events[2].handled);
    CHECK(failures.events[2].error_is<rs::testing::scripted_failure>());
    failures.events.clear();
    const auto bug = []() -> rs::task<int> { throw std::logic_error("bug"); };
    CHECK_THROWS_AS(sim.run(defaults.execute(bug)), std::logic_error);
    REQUIRE(failures.kinds() == std::vector{telemetry_kind::attempt});
    CHECK(failures.events[0].error_is<std::logic_error>());
    CHECK_FALSE(failures.events[0].handled);
}

TEST_CASE("telemetry: a classifier that throws on an attempt ends the call, the attempt reported unhandled",
          "[telemetry][retry]") {
    rs::testing::simulation sim;
    recorder rec;
    const rs::retry r{
        {.max_attempts = 3,
         .should_handle = [](const rs::failure&) -> bool { throw listener_error("classifier"); },
         .telemetry = rec.listener()},
        sim.clock()};
    scripted_action down{sim.clock(), script<int>{.failures = 5, .latency = 10ms}};
    const rs::outcome<int> out = sim.run(r.execute_outcome(down));
    REQUIRE(out.has_failure());
    CHECK(out.error().is<listener_error>());
    REQUIRE(rec.kinds() == std::vector{telemetry_kind::attempt});
    CHECK(rec.events[0].error_is<rs::testing::scripted_failure>());
    CHECK_FALSE(rec.events[0].handled);
    CHECK(down.calls() == 1);
}

TEST_CASE("telemetry: a hedge brought forward by a handled outcome says so", "[telemetry][hedge]") {
    rs::testing::simulation sim;
    recorder rec;
    const rs::hedge h{{.name = "replicas", .max_attempts = 2, .delay = 1s, .telemetry = rec.listener()},
                      sim.clock()};
    scripted_action flaky{sim.clock(), script<int>{.failures = 1, .latency = 10ms, .value = 4}};
    CHECK(sim.run(h.execute(flaky)) == 4);
    REQUIRE(rec.kinds() == std::vector{telemetry_kind::hedge});
    CHECK(rec.events[0].at == 10ms);
    CHECK(rec.events[0].error_is<rs::testing::scripted_failure>());
    CHECK(rec.events[0].handled);

    // The same failure asking a budget that refuses: the rejection says it was handled.
    recorder refused;
    rs::retry_budget budget{{.ratio = 0.1, .capacity = 1}};
    REQUIRE(budget.try_withdraw()); // empty
    const rs::hedge broke{{.max_attempts = 2, .delay = 1s, .budget = budget, .telemetry = refused.listener()},
                          sim.clock()};
    scripted_action once{sim.clock(), script<int>{.failures = 1, .latency = 10ms, .value = 4}};
    CHECK_THROWS_AS(sim.run(broke.execute(once)), rs::testing::scripted_failure);
    REQUIRE(refused.kinds() == std::vector{telemetry_kind::rejection});
    CHECK(refused.events[0].policy == "retry_budget");
    CHECK(refused.events[0].handled);
}

TEST_CASE("telemetry: a call's event says whether the stage's should_handle handled its outcome",
          "[telemetry]") {
    rs::testing::simulation sim;
    recorder rec;
    const auto value = [](int v) { return [v]() -> rs::task<int> { co_return v; }; };
    // The default: a failure is handled, a value is not, whatever it holds.
    const rs::telemetry plain{{.name = "plain", .listener = rec.listener()}, sim.clock()};
    CHECK(sim.run(plain.execute(value(503))) == 503);
    scripted_action down{sim.clock(), script<int>{.failures = 1, .latency = 10ms}};
    CHECK(sim.run(plain.execute_outcome(down)).has_failure());
    REQUIRE(rec.events.size() == 2);
    CHECK_FALSE(rec.events[0].handled);
    CHECK(rec.events[1].handled);

    // The classifier of the retry inside: a 503 the retry gave up on is a handled call.
    rec.events.clear();
    const auto unavailable = [](const rs::outcome<int>& o) { return o.has_value() && *o == 503; };
    const rs::pipeline p{
        rs::telemetry{{.name = "orders", .listener = rec.listener(), .should_handle = unavailable},
                      sim.clock()},
        rs::retry{{.max_attempts = 2, .backoff = rs::constant_backoff{0ms}, .should_handle = unavailable},
                  sim.clock()}};
    CHECK(sim.run(p.execute(value(503))) == 503);
    CHECK(sim.run(p.execute(value(200))) == 200);
    REQUIRE(rec.kinds() == std::vector{telemetry_kind::attempt, telemetry_kind::retry,
                                       telemetry_kind::attempt, telemetry_kind::call, telemetry_kind::attempt,
                                       telemetry_kind::call});
    CHECK(rec.events[3].handled);
    CHECK_FALSE(rec.events[3].error);
    CHECK_FALSE(rec.events[5].handled);

    // An outcome classifier of another type refuses the call before the action runs, as every policy's.
    rec.events.clear();
    int ran = 0;
    const auto longer = [&ran]() -> rs::task<long> {
        ++ran;
        co_return 1L;
    };
    const rs::telemetry typed{{.name = "typed", .listener = rec.listener(), .should_handle = unavailable},
                              sim.clock()};
    const rs::outcome<long> refused = sim.run(typed.execute_outcome(longer));
    REQUIRE(refused.has_failure());
    CHECK(refused.error().is<std::invalid_argument>());
    CHECK_THAT(std::string(refused.error().what()), Catch::Matchers::Contains("should_handle"));
    CHECK(ran == 0);
    CHECK(rec.events.empty());

    // One that throws makes its exception the call's failure, reported as not handled.
    const rs::telemetry throwing{
        {.listener = rec.listener(),
         .should_handle = [](const rs::failure&) -> bool { throw listener_error("classifier"); }},
        sim.clock()};
    scripted_action fails{sim.clock(), script<int>{.failures = 1, .latency = 10ms}};
    const rs::outcome<int> out = sim.run(throwing.execute_outcome(fails));
    REQUIRE(out.has_failure());
    CHECK(out.error().is<listener_error>());
    REQUIRE(rec.kinds() == std::vector{telemetry_kind::call});
    CHECK(rec.events[0].error_is<listener_error>());
    CHECK_FALSE(rec.events[0].handled);
}

TEST_CASE("telemetry: the pipeline's listener hears every stage inside it, then the call", "[telemetry]") {
    rs::testing::simulation sim;
    recorder rec;
    const rs::pipeline p{
        rs::telemetry{{.name = "checkout", .listener = rec.listener()}, sim.clock()},
        rs::retry{{.max_attempts = 2, .backoff = rs::constant_backoff{100ms, rs::jitter::none}}, sim.clock()},
        rs::circuit_breaker{{.failure_threshold = 1, .break_duration = 1s}, sim.clock()},
        rs::timeout{1s, sim.clock()},
    };
    scripted_action down{sim.clock(), script<int>{.failures = 5, .latency = 50ms}};
    const rs::outcome<int> r = sim.run(p.execute_outcome(down));
    REQUIRE(r.has_failure());
    CHECK(r.error().is<rs::circuit_open_error>());
    // 0-50ms fails and opens the breaker; the retry waits 100ms; the open breaker refuses attempt 2.
    REQUIRE(rec.kinds() == std::vector{telemetry_kind::state_change, telemetry_kind::attempt,
                                       telemetry_kind::retry, telemetry_kind::rejection,
                                       telemetry_kind::attempt, telemetry_kind::call});
    const auto& e = rec.events;
    CHECK(e[0].policy == "circuit_breaker");
    CHECK(e[0].to == rs::circuit_state::open);
    CHECK(e[0].at == 50ms);
    CHECK(e[1].policy == "retry");
    CHECK(e[1].duration == 50ms);
    CHECK(e[2].duration == 100ms);
    CHECK(e[3].policy == "circuit_breaker");
    CHECK(e[3].attempt == 2);
    CHECK(e[3].at == 150ms);
    CHECK(e[4].attempt == 2);
    CHECK(e[4].duration == 0ns);
    CHECK(e[4].error_is<rs::circuit_open_error>());
    CHECK(e[1].handled);
    CHECK_FALSE(e[4].handled); // an open circuit is not transient: the retry does not handle it
    CHECK(e[5].policy == "telemetry");
    CHECK(e[5].name == "checkout");
    CHECK(e[5].duration == 150ms);
    CHECK(e[5].at == 150ms);
    CHECK(e[5].error_is<rs::circuit_open_error>());
    CHECK(e[5].handled); // the stage's default: a failure that is not a cancellation
    CHECK(down.calls() == 1);
}

TEST_CASE("telemetry: a policy's own listener takes precedence over the pipeline's", "[telemetry]") {
    rs::testing::simulation sim;
    recorder own, shared;
    const rs::pipeline p{
        rs::telemetry{shared.listener(), sim.clock()},
        rs::retry{{.max_attempts = 2,
                   .backoff = rs::constant_backoff{100ms, rs::jitter::none},
                   .telemetry = own.listener()},
                  sim.clock()},
        rs::timeout{1s, sim.clock()},
    };
    scripted_action stall{sim.clock(), script<int>{.failures = 0, .latency = 5s}};
    CHECK_THROWS_AS(sim.run(p.execute(stall)), rs::timeout_error);
    CHECK(own.kinds() ==
          std::vector{telemetry_kind::attempt, telemetry_kind::retry, telemetry_kind::attempt});
    CHECK(shared.kinds() ==
          std::vector{telemetry_kind::timeout, telemetry_kind::timeout, telemetry_kind::call});
    REQUIRE(shared.events.size() == 3);
    CHECK(shared.events[1].attempt == 2);
    CHECK(shared.events[1].at == 2100ms);
    CHECK(shared.events[2].duration == 2100ms);
}

TEST_CASE("telemetry: stages outside the telemetry stage do not report to it", "[telemetry]") {
    rs::testing::simulation sim;
    recorder rec;
    const rs::pipeline p{
        rs::retry{{.max_attempts = 2, .backoff = rs::constant_backoff{100ms, rs::jitter::none}}, sim.clock()},
        rs::telemetry{rec.listener(), sim.clock()},
    };
    scripted_action flaky{sim.clock(), script<int>{.failures = 1, .latency = 10ms, .value = 3}};
    CHECK(sim.run(p.execute(flaky)) == 3);
    CHECK(rec.kinds() == std::vector{telemetry_kind::call, telemetry_kind::call});
    REQUIRE(rec.events.size() == 2);
    CHECK(rec.events[0].attempt == 1);
    CHECK(rec.events[1].attempt == 2);
    CHECK(rec.events[1].at == 120ms);
}

TEST_CASE("telemetry: a listener that throws makes its exception the call's failure, and ends it",
          "[telemetry]") {
    rs::testing::simulation sim;
    const auto throw_on = [](telemetry_kind kind) {
        return rs::telemetry_listener{[kind](const rs::telemetry_event& e) {
            if (e.kind == kind)
                throw listener_error(std::string("listener: ") + rs::to_string(kind));
        }};
    };
    scripted_action down{sim.clock(), script<int>{.failures = 5, .latency = 10ms, .value = 1}};
    const auto retry_of = [&](rs::telemetry_listener l) {
        return rs::retry{{.max_attempts = 3,
                          .backoff = rs::constant_backoff{100ms, rs::jitter::none},
                          .telemetry = std::move(l)},
                         sim.clock()};
    };
    std::optional<rs::outcome<int>> r;

    SECTION("on a retry event: the retry does not go on") {
        const auto retry = retry_of(throw_on(telemetry_kind::retry));
        REQUIRE_NOTHROW(r = sim.run(retry.execute_outcome(down)));
        CHECK(down.calls() == 1);
    }
    SECTION("on the first attempt's event, reported on the fast path") {
        const auto retry = retry_of(throw_on(telemetry_kind::attempt));
        REQUIRE_NOTHROW(r = sim.run(retry.execute_outcome(down)));
        CHECK(down.calls() == 1);
    }
    SECTION("on a call event of the pipeline's stage, after a success") {
        scripted_action fine{sim.clock(), script<int>{.value = 1}};
        const rs::pipeline p{rs::telemetry{throw_on(telemetry_kind::call), sim.clock()},
                             rs::timeout{1s, sim.clock()}};
        REQUIRE_NOTHROW(r = sim.run(p.execute_outcome(fine)));
        CHECK(fine.calls() == 1);
    }
    SECTION("on a breaker's state change: after the change") {
        const rs::circuit_breaker breaker{
            {.failure_threshold = 1, .telemetry = throw_on(telemetry_kind::state_change)}, sim.clock()};
        REQUIRE_NOTHROW(r = sim.run(breaker.execute_outcome(down)));
        CHECK(breaker.state() == rs::circuit_state::open);
    }
    SECTION("on a bulkhead's rejection: instead of the rejection") {
        const rs::bulkhead slots{
            {.max_concurrent_calls = 1, .telemetry = throw_on(telemetry_kind::rejection)}, sim.clock()};
        std::optional<rs::outcome<int>> first;
        sim.spawn(call_into(slots, down, first));
        sim.spawn(call_into(slots, down, r));
        REQUIRE_NOTHROW(sim.run_all());
        CHECK(slots.in_flight() == 0);
    }
    SECTION("on a bulkhead's queue wait: the slot is given back") {
        const rs::bulkhead slots{
            {.max_concurrent_calls = 1, .queue_limit = 1, .telemetry = throw_on(telemetry_kind::queue_wait)},
            sim.clock()};
        std::optional<rs::outcome<int>> first;
        sim.spawn(call_into(slots, down, first));
        sim.spawn(call_into(slots, down, r));
        REQUIRE_NOTHROW(sim.run_all());
        CHECK(down.calls() == 1);
        CHECK(slots.in_flight() == 0);
    }
    SECTION("on a limiter's rejection: instead of the rejection") {
        const rs::rate_limiter bucket{
            {.token_limit = 1, .tokens_per_second = 1, .telemetry = throw_on(telemetry_kind::rejection)},
            sim.clock()};
        std::optional<rs::outcome<int>> first;
        sim.spawn(call_into(bucket, down, first));
        sim.spawn(call_into(bucket, down, r)); // no token, no queue
        REQUIRE_NOTHROW(sim.run_all());
        CHECK(down.calls() == 1);
    }
    SECTION("on a limiter's queue wait: the call does not run, and its token stays spent") {
        const rs::rate_limiter bucket{{.token_limit = 1,
                                       .tokens_per_second = 1,
                                       .queue_limit = 1,
                                       .telemetry = throw_on(telemetry_kind::queue_wait)},
                                      sim.clock()};
        std::optional<rs::outcome<int>> first;
        sim.spawn(call_into(bucket, down, first));
        sim.spawn(call_into(bucket, down, r)); // waits for the token due at 1s, then the listener throws
        REQUIRE_NOTHROW(sim.run_all());
        CHECK(down.calls() == 1);
        CHECK(sim.now() == 1s);
        CHECK(bucket.tokens() == 0.0); // the token taken at 1s was spent
    }
    REQUIRE(r);
    REQUIRE(r->has_failure());
    REQUIRE(r->error().is<listener_error>());
    CHECK(std::string(r->error().what()).rfind("listener: ", 0) == 0);
}

TEST_CASE("telemetry: a stage with an empty listener passes the call through untouched", "[telemetry]") {
    rs::testing::simulation sim;
    const rs::pipeline p{rs::telemetry{rs::telemetry_listener{}, sim.clock()}, rs::retry{{}, sim.clock()}};
    scripted_action fine{sim.clock(), script<int>{.latency = 5ms, .value = 9}};
    CHECK(sim.run(p.execute(fine)) == 9);
    CHECK(sim.now() == 5ms);
}

#ifdef RESILIENCE_TESTS_COUNT_ALLOCATIONS
TEST_CASE("telemetry: the success path of five policies allocates nothing, with no listener or with one",
          "[telemetry][alloc]") {
    rs::testing::simulation sim;
    int events = 0;
    const rs::telemetry_listener count{[&events](const rs::telemetry_event&) { ++events; }};
    const auto five = [&] {
        return rs::pipeline{
            rs::retry{{.max_attempts = 3}, sim.clock()},
            rs::circuit_breaker{{.failure_threshold = 5}, sim.clock()}, rs::timeout{1s, sim.clock()},
            rs::bulkhead{{.max_concurrent_calls = 4}, sim.clock()},
            rs::rate_limiter{{.token_limit = 1'000'000, .tokens_per_second = 1e9}, sim.clock()}};
    };
    const auto plain = five();
    const rs::pipeline listened{rs::telemetry{count, sim.clock()}, five()};
    auto action = []() -> rs::task<int> { co_return 1; };
    std::size_t without = 0, with = 0;
    int sum = 0;
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 100; ++i) { // warm-up: frames, pools
            sum += co_await plain.execute(action);
            sum += co_await listened.execute(action);
        }
        {
            resilience_tests::counting_allocations counting;
            for (int i = 0; i < 1'000; ++i)
                sum += co_await plain.execute(action);
            without = counting.count();
        }
        resilience_tests::counting_allocations counting;
        for (int i = 0; i < 1'000; ++i)
            sum += co_await listened.execute(action);
        with = counting.count();
    }());
    CHECK(sum == 2'200);
    CHECK(without == 0);
    CHECK(with == 0);
    CHECK(events == 2 * 1'100); // each call: the retry's attempt, the stage's call
}
#endif

} // namespace test_telemetry
