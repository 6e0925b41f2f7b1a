// SPDX-License-Identifier: MIT
// One rule for a call its caller stopped (docs/core.md, "A call its caller stopped"): it ends with a
// value an attempt returned, or with rs::cancelled_error; never with what the stopped attempt threw,
// never after another attempt, and never with a fallback's substitute or a cache's stale value. Each
// policy on virtual time: the caller stops at 1s while an attempt (10s long) is in flight, or while
// the call waits (a backoff, a queue, a hedge's delay, injected latency).
#include "catch.hpp"
#include "support.hpp"

#include <resilience/adaptive_throttle.hpp>
#include <resilience/any_policy.hpp>
#include <resilience/async_generator.hpp>
#include <resilience/backoff.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/cache.hpp>
#include <resilience/chaos.hpp>
#include <resilience/circuit_breaker.hpp>
#include <resilience/fallback.hpp>
#include <resilience/hedge.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/random.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/reloadable.hpp>
#include <resilience/retry.hpp>
#include <resilience/retry_budget.hpp>
#include <resilience/retry_stream.hpp>
#include <resilience/single_flight.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/telemetry.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>
#include <resilience/when_all.hpp>

#include <cerrno>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace test_caller_stop {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_tests::stop_at;
using rs::testing::simulation;
using std::chrono::nanoseconds;

namespace {

/// What an attempt does once its token is stopped.
enum class ending {
    aborted, ///< throws system_error(ECANCELED), as an Asio operation does (operation_aborted)
    custom,  ///< throws an error of its own
    value,   ///< returns 7 all the same
};
const ending every_ending[] = {ending::aborted, ending::custom, ending::value};

const char* name_of(ending e) {
    switch (e) {
    case ending::aborted:
        return "operation_aborted";
    case ending::custom:
        return "custom error";
    case ending::value:
        return "value";
    }
    return "?";
}

struct stopped_custom : std::runtime_error {
    stopped_custom() : std::runtime_error("custom failure of a stopped attempt") {}
};
struct transient : std::runtime_error {
    transient() : std::runtime_error("transient") {}
};

/// A dependency: each call waits `latency` on the simulation listening to its token, then returns 1
/// (or throws `transient` when `fail_unstopped`); stopped, it ends at that instant as `how` says.
/// Copies share the log.
class attempt {
public:
    attempt(simulation& sim, ending how, nanoseconds latency = 10s, bool fail_unstopped = false)
        : s_(std::make_shared<state>(state{&sim, how, latency, fail_unstopped})) {}

    rs::task<int> operator()(resilience::stop_token token) const {
        const std::shared_ptr<state> s = s_;
        s->starts.push_back(s->sim->now());
        co_await s->sim->sleep_for(s->latency, token);
        if (!token.stop_requested()) {
            if (s->fail_unstopped)
                throw transient{};
            co_return 1;
        }
        switch (s->how) {
        case ending::aborted:
            throw std::system_error(ECANCELED, std::system_category(), "operation_aborted");
        case ending::custom:
            throw stopped_custom{};
        case ending::value:
            break;
        }
        co_return 7;
    }

    int calls() const { return static_cast<int>(s_->starts.size()); }
    const std::vector<nanoseconds>& starts() const { return s_->starts; }

private:
    struct state {
        simulation* sim;
        ending how;
        nanoseconds latency;
        bool fail_unstopped;
        std::vector<nanoseconds> starts{};
    };
    std::shared_ptr<state> s_;
};

void check_cancelled(const rs::outcome<int>& r) {
    REQUIRE(r.has_failure());
    CHECK(r.error().code() == rs::errc::cancelled);
    const auto* e = r.error().as<rs::cancelled_error>();
    REQUIRE(e != nullptr);
    CHECK(e->code() == std::errc::operation_canceled);
}

/// The call `execute_outcome(act, token)` made by `policy`, stopped at 1s; returns its outcome.
template <class P>
rs::outcome<int> stopped_call(simulation& sim, const P& policy, const attempt& act, nanoseconds at = 1s) {
    resilience::stop_source caller;
    auto [r, ignored] =
        sim.run(rs::when_all(policy.execute_outcome(act, caller.get_token()), stop_at(sim, caller, at)));
    return std::move(r);
}

/// The rule for a policy made by `make(sim)`, for each way the stopped attempt may end: a value is
/// returned (when `value_returned`) and anything else ends with cancelled_error, at the instant of the
/// stop, after exactly one attempt.
template <class Make>
void check_rule(Make make, bool value_returned = true) {
    for (const ending how : every_ending) {
        INFO("the stopped attempt ends with: " << name_of(how));
        simulation sim;
        const auto policy = make(sim);
        const attempt act{sim, how};
        const rs::outcome<int> r = stopped_call(sim, policy, act);
        CHECK(sim.now() == 1s);
        CHECK(act.calls() == 1);
        if (how == ending::value && value_returned) {
            REQUIRE(r.has_value());
            CHECK(*r == 7);
        } else {
            check_cancelled(r);
        }
    }
    // The throwing form throws it.
    simulation sim;
    const auto policy = make(sim);
    const attempt act{sim, ending::custom};
    resilience::stop_source caller;
    CHECK_THROWS_AS(sim.run(rs::when_all(policy.execute(act, caller.get_token()), stop_at(sim, caller, 1s))),
                    rs::cancelled_error);
}

} // namespace

TEST_CASE("caller stop: cancelled_error's code compares equal to std::errc::operation_canceled",
          "[caller_stop]") {
    const rs::cancelled_error e{"payments"};
    CHECK(e.code() == std::errc::operation_canceled);
    CHECK(e.code() == rs::errc::cancelled);
    CHECK(std::error_code{rs::errc::cancelled} == std::errc::operation_canceled);
    CHECK(rs::is_cancellation(rs::failure::make(rs::cancelled_error{})));
}

TEST_CASE("caller stop: retry ends with cancelled_error or the value, and retries nothing", "[caller_stop]") {
    check_rule([](simulation& sim) {
        return rs::retry{{.max_attempts = 5,
                          .backoff = rs::constant_backoff{1s, rs::jitter::none},
                          .should_handle = rs::classifier{[](const rs::failure&) { return true; }}},
                         sim.clock()};
    });
}

TEST_CASE("caller stop: retry stopped during its backoff ends with cancelled_error, not the last failure",
          "[caller_stop]") {
    simulation sim;
    rs::retry r{{.max_attempts = 5, .backoff = rs::constant_backoff{5s, rs::jitter::none}}, sim.clock()};
    const attempt act{sim, ending::custom, 0s, true}; // fails at once with `transient`
    const rs::outcome<int> out = stopped_call(sim, r, act);
    CHECK(sim.now() == 1s);
    CHECK(act.calls() == 1);
    check_cancelled(out);
}

TEST_CASE("caller stop: retry with a budget takes no token for a stopped call", "[caller_stop]") {
    simulation sim;
    rs::retry_budget budget{{.ratio = 0.2, .capacity = 3}};
    rs::retry r{{.max_attempts = 5, .backoff = rs::constant_backoff{1s, rs::jitter::none}, .budget = budget},
                sim.clock()};
    const attempt act{sim, ending::custom};
    const double before = budget.tokens();
    check_cancelled(stopped_call(sim, r, act));
    CHECK(act.calls() == 1);
    CHECK(budget.tokens() >= before); // the call deposited, no retry withdrew
    check_rule([&](simulation& s) {
        return rs::retry{
            {.max_attempts = 5, .backoff = rs::constant_backoff{1s, rs::jitter::none}, .budget = budget},
            s.clock()};
    });
}

TEST_CASE("caller stop: timeout ends with cancelled_error or the value, never timeout_error",
          "[caller_stop]") {
    check_rule([](simulation& sim) { return rs::timeout{5s, sim.clock()}; });
}

TEST_CASE("caller stop: a caller that stops after the deadline has passed still gets cancelled_error",
          "[caller_stop]") {
    simulation sim;
    rs::timeout limit{1s, sim.clock()};
    // Ignores its token: the deadline at 1s does not end it, the caller stops at 3s, it fails at 5s.
    auto deaf = [&]() -> rs::task<int> {
        co_await sim.sleep_for(5s);
        throw stopped_custom{};
    };
    resilience::stop_source caller;
    auto [r, ignored] =
        sim.run(rs::when_all(limit.execute_outcome(deaf, caller.get_token()), stop_at(sim, caller, 3s)));
    CHECK(sim.now() == 5s);
    check_cancelled(r);
}

TEST_CASE("caller stop: a timeout's own stop is unchanged: timeout_error with the attempt's failure as cause",
          "[caller_stop]") {
    simulation sim;
    rs::timeout limit{1s, sim.clock()};
    const attempt act{sim, ending::aborted};
    const rs::outcome<int> r = sim.run(limit.execute_outcome(act));
    CHECK(sim.now() == 1s);
    REQUIRE(r.has_failure());
    const auto* e = r.error().as<rs::timeout_error>();
    REQUIRE(e != nullptr);
    CHECK_THROWS_AS(std::rethrow_exception(e->cause()), std::system_error);
}

TEST_CASE("caller stop: circuit_breaker ends with cancelled_error or the value, and counts no failure",
          "[caller_stop]") {
    check_rule([](simulation& sim) { return rs::circuit_breaker{{.failure_threshold = 1}, sim.clock()}; });
    simulation sim;
    rs::circuit_breaker b{{.failure_threshold = 1}, sim.clock()};
    const attempt act{sim, ending::custom};
    check_cancelled(stopped_call(sim, b, act));
    CHECK(b.state() == rs::circuit_state::closed);
    CHECK(b.metrics().consecutive_failures == 0);
}

TEST_CASE("caller stop: bulkhead, admitted, ends with cancelled_error or the value and frees its slot",
          "[caller_stop]") {
    check_rule([](simulation& sim) { return rs::bulkhead{{.max_concurrent_calls = 1}, sim.clock()}; });
    simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1}, sim.clock()};
    check_cancelled(stopped_call(sim, bh, attempt{sim, ending::aborted}));
    CHECK(bh.in_flight() == 0);
}

TEST_CASE("caller stop: bulkhead, waiting in its queue, ends with cancelled_error at the stop",
          "[caller_stop]") {
    simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 1}, sim.clock()};
    const attempt holder{sim, ending::value};
    const attempt queued{sim, ending::value};
    resilience::stop_source caller;
    auto [first, second, ignored] =
        sim.run(rs::when_all(bh.execute_outcome(holder), bh.execute_outcome(queued, caller.get_token()),
                             stop_at(sim, caller, 1s)));
    REQUIRE(first.has_value());
    CHECK(*first == 1);
    check_cancelled(second);
    CHECK(queued.calls() == 0);
}

TEST_CASE("caller stop: rate_limiter, admitted or queued, follows the rule", "[caller_stop]") {
    check_rule([](simulation& sim) {
        return rs::rate_limiter{{.token_limit = 1, .tokens_per_second = 1}, sim.clock()};
    });
    simulation sim;
    rs::rate_limiter limiter{{.token_limit = 1, .tokens_per_second = 0.01, .queue_limit = 1}, sim.clock()};
    const attempt first{sim, ending::value, 0s};
    const attempt queued{sim, ending::value};
    resilience::stop_source caller;
    auto [a, b, ignored] =
        sim.run(rs::when_all(limiter.execute_outcome(first),
                             limiter.execute_outcome(queued, caller.get_token()), stop_at(sim, caller, 1s)));
    REQUIRE(a.has_value());
    CHECK(*a == 1);
    check_cancelled(b);
    CHECK(queued.calls() == 0);
}

TEST_CASE("caller stop: sliding_window_limiter, admitted or queued, follows the rule", "[caller_stop]") {
    check_rule([](simulation& sim) {
        return rs::sliding_window_limiter{{.permit_limit = 1, .window = 1min}, sim.clock()};
    });
    simulation sim;
    rs::sliding_window_limiter limiter{{.permit_limit = 1, .window = 1min, .queue_limit = 1}, sim.clock()};
    const attempt first{sim, ending::value, 0s};
    const attempt queued{sim, ending::value};
    resilience::stop_source caller;
    auto [a, b, ignored] =
        sim.run(rs::when_all(limiter.execute_outcome(first),
                             limiter.execute_outcome(queued, caller.get_token()), stop_at(sim, caller, 1s)));
    REQUIRE(a.has_value());
    CHECK(*a == 1);
    check_cancelled(b);
    CHECK(queued.calls() == 0);
}

TEST_CASE("caller stop: adaptive_throttle follows the rule", "[caller_stop]") {
    check_rule([](simulation& sim) { return rs::adaptive_throttle{{}, sim.clock(), rs::seeded_random{1}}; });
}

TEST_CASE("caller stop: hedge ends with cancelled_error or a value, and starts no other attempt",
          "[caller_stop]") {
    check_rule([](simulation& sim) { return rs::hedge{{.max_attempts = 3, .delay = 2s}, sim.clock()}; });
}

TEST_CASE("caller stop: hedge with two attempts in flight ends with cancelled_error, or a value one returned",
          "[caller_stop]") {
    for (const ending how : every_ending) {
        INFO("the stopped attempts end with: " << name_of(how));
        simulation sim;
        rs::hedge h{{.max_attempts = 3, .delay = 2s}, sim.clock()};
        const attempt act{sim, how};
        const rs::outcome<int> r = stopped_call(sim, h, act, 3s);
        CHECK(sim.now() == 3s);
        CHECK(act.calls() == 2);
        if (how == ending::value) {
            REQUIRE(r.has_value());
            CHECK(*r == 7);
        } else
            check_cancelled(r);
    }
}

TEST_CASE("caller stop: fallback gives no substitute, whatever the stopped attempt threw", "[caller_stop]") {
    check_rule([](simulation&) {
        return rs::fallback{-1, rs::fallback_options{.should_handle = rs::classifier{
                                                         [](const rs::failure&) { return true; }}}};
    });
    check_rule([](simulation&) { return rs::fallback{-1}; });
}

TEST_CASE(
    "caller stop: single_flight's owner ends with cancelled_error, and an attached caller leaves at once",
    "[caller_stop]") {
    using flights = rs::single_flight<std::string, int>;
    check_rule([](simulation&) { return flights{}.policy("k"); }, false);

    simulation sim;
    flights sf;
    const attempt owner_act{sim, ending::value, 5s};
    const attempt joined_act{sim, ending::value};
    resilience::stop_source caller;
    auto [owned, joined, ignored] = sim.run(rs::when_all(
        sf.policy("k").execute_outcome(owner_act),
        sf.policy("k").execute_outcome(joined_act, caller.get_token()), stop_at(sim, caller, 1s)));
    REQUIRE(owned.has_value());
    CHECK(*owned == 1);
    check_cancelled(joined);
    CHECK(joined_act.calls() == 0);
}

TEST_CASE("caller stop: cache serves no stale value for a caller that stopped its refresh", "[caller_stop]") {
    using quotes = rs::cache<std::string, int, rs::testing::virtual_clock>;
    for (const ending how : every_ending) {
        INFO("the stopped refresh ends with: " << name_of(how));
        simulation sim;
        quotes c{{.ttl = 1s, .stale_if_error = 1h}, sim.clock()};
        CHECK(sim.run(c.run("k", []() -> rs::task<int> { co_return 5; })) == 5);
        sim.run(sim.sleep_for(2s)); // expired: the next call refreshes, with a stale value in reserve
        const attempt act{sim, how};
        resilience::stop_source caller;
        auto [by_policy, ignored] = sim.run(
            rs::when_all(c.policy("k").execute_outcome(act, caller.get_token()), stop_at(sim, caller, 3s)));
        CHECK(sim.now() == 3s);
        check_cancelled(by_policy);
        resilience::stop_source other;
        auto [by_run, ignored2] = sim.run(
            rs::when_all(c.run_outcome("k", act, other.get_token()), stop_at(sim, other, sim.now() + 1s)));
        check_cancelled(by_run);
        CHECK(act.calls() == 2);
    }
}

TEST_CASE("caller stop: chaos latency stopped during its delay ends with cancelled_error, the action not run",
          "[caller_stop]") {
    simulation sim;
    rs::chaos::latency slow{5s, {.injection_rate = 1.0}, sim.clock()};
    const attempt act{sim, ending::value};
    check_cancelled(stopped_call(sim, slow, act));
    CHECK(sim.now() == 1s);
    CHECK(act.calls() == 0);
    check_rule([](simulation& s) { return rs::chaos::latency{5s, {.injection_rate = 0.0}, s.clock()}; });
}

TEST_CASE("caller stop: a pipeline of fallback, retry, breaker, timeout and bulkhead follows the rule",
          "[caller_stop]") {
    check_rule([](simulation& sim) {
        return rs::pipeline{
            rs::fallback{-1},
            rs::retry{{.max_attempts = 5, .backoff = rs::constant_backoff{1s, rs::jitter::none}},
                      sim.clock()},
            rs::circuit_breaker{{.failure_threshold = 1}, sim.clock()}, rs::timeout{5s, sim.clock()},
            rs::bulkhead{{.max_concurrent_calls = 1}, sim.clock()}};
    });
}

TEST_CASE("caller stop: a pipeline with a retry outside a timeout stopped in its backoff ends with "
          "cancelled_error, not the timeout_error",
          "[caller_stop]") {
    simulation sim;
    rs::pipeline p{
        rs::retry{{.max_attempts = 5, .backoff = rs::constant_backoff{5s, rs::jitter::none}}, sim.clock()},
        rs::timeout{1s, sim.clock()}};
    const attempt act{sim, ending::aborted};
    const rs::outcome<int> r = stopped_call(sim, p, act, 3s); // the attempt timed out at 1s
    CHECK(sim.now() == 3s);
    CHECK(act.calls() == 1);
    check_cancelled(r);
}

TEST_CASE("caller stop: any_policy and reloadable follow the rule", "[caller_stop]") {
    check_rule([](simulation& sim) {
        return rs::any_policy<int>{
            rs::pipeline{rs::retry{{.max_attempts = 5, .backoff = rs::constant_backoff{1s, rs::jitter::none}},
                                   sim.clock()},
                         rs::timeout{5s, sim.clock()}}};
    });
    check_rule([](simulation& sim) {
        return rs::reloadable{rs::retry{
            {.max_attempts = 5, .backoff = rs::constant_backoff{1s, rs::jitter::none}}, sim.clock()}};
    });
}

TEST_CASE("caller stop: a telemetry stage's call event reports the cancelled_error the call ends with, "
          "not handled",
          "[caller_stop]") {
    for (const ending how : every_ending) {
        INFO("the stopped attempt ends with: " << name_of(how));
        simulation sim;
        std::vector<rs::telemetry_event> calls;
        std::vector<std::optional<rs::failure>> errors;
        const rs::pipeline p{
            rs::telemetry{{.name = "orders",
                           .listener =
                               [&](const rs::telemetry_event& e) {
                                   if (e.kind != rs::telemetry_kind::call)
                                       return;
                                   calls.push_back(e);
                                   errors.push_back(e.error ? std::optional<rs::failure>(*e.error)
                                                            : std::nullopt);
                               }},
                          sim.clock()},
            rs::retry{{.max_attempts = 5, .backoff = rs::constant_backoff{1s, rs::jitter::none}},
                      sim.clock()}};
        const rs::outcome<int> r = stopped_call(sim, p, attempt{sim, how});
        REQUIRE(calls.size() == 1);
        CHECK(calls[0].duration == 1s);
        // Not a failure the dependency had: a dashboard of handled calls does not count it.
        CHECK_FALSE(calls[0].handled);
        if (how == ending::value) {
            REQUIRE(r.has_value());
            CHECK_FALSE(errors[0]);
        } else {
            check_cancelled(r);
            REQUIRE(errors[0]);
            CHECK(errors[0]->is<rs::cancelled_error>());
        }
    }
}

TEST_CASE("caller stop: the cancelled_error made for a stopped call names the outermost policy",
          "[caller_stop]") {
    simulation sim;
    rs::pipeline p{rs::retry{{.name = "outer"}, sim.clock()}, rs::timeout{{.name = "inner"}, sim.clock()}};
    const rs::outcome<int> r = stopped_call(sim, p, attempt{sim, ending::custom});
    check_cancelled(r);
    CHECK(r.error().as<rs::cancelled_error>()->policy_name() == "outer");
}

namespace {

// A source of `n` items, one a second; stopped, it throws as `how` says.
rs::async_generator<int> slow_items(simulation& sim, resilience::stop_token token, ending how, bool fails) {
    co_yield 1;
    co_await sim.sleep_for(10s, token);
    if (token.stop_requested()) {
        if (how == ending::aborted)
            throw std::system_error(ECANCELED, std::system_category(), "operation_aborted");
        throw stopped_custom{};
    }
    if (fails)
        throw transient{};
    co_yield 2;
}

rs::task<std::vector<int>> drain(rs::async_generator<int> g, std::optional<rs::failure>& failed) {
    std::vector<int> got;
    try {
        while (std::optional<int> i = co_await g.next())
            got.push_back(*i);
    } catch (...) {
        failed.emplace(rs::failure::current());
    }
    co_return got;
}

} // namespace

TEST_CASE("caller stop: retry_stream ends with cancelled_error, stopped in a source or in its backoff",
          "[caller_stop]") {
    for (const ending how : {ending::aborted, ending::custom}) {
        INFO("the stopped source ends with: " << name_of(how));
        simulation sim;
        resilience::stop_source consumer;
        int made = 0;
        auto stream = rs::retry_stream(
            [&](resilience::stop_token t) {
                ++made;
                return slow_items(sim, t, how, false);
            },
            {.max_attempts = 3, .partial = rs::partial_stream::restart_from_start}, sim.clock(),
            consumer.get_token());
        std::optional<rs::failure> failed;
        auto [got, ignored] =
            sim.run(rs::when_all(drain(std::move(stream), failed), stop_at(sim, consumer, 1s)));
        CHECK(got == std::vector<int>{1});
        CHECK(made == 1);
        REQUIRE(failed);
        CHECK(failed->is<rs::cancelled_error>());
    }
    simulation sim;
    resilience::stop_source consumer;
    int made = 0;
    auto stream = rs::retry_stream(
        [&](resilience::stop_token t) {
            ++made;
            return slow_items(sim, t, ending::custom, true);
        },
        {.max_attempts = 3,
         .backoff = rs::constant_backoff{5s, rs::jitter::none},
         .partial = rs::partial_stream::restart_from_start},
        sim.clock(), consumer.get_token());
    std::optional<rs::failure> failed;
    auto [got, ignored] =
        sim.run(rs::when_all(drain(std::move(stream), failed), stop_at(sim, consumer, 12s)));
    CHECK(sim.now() == 12s);
    CHECK(made == 1);
    REQUIRE(failed);
    CHECK(failed->is<rs::cancelled_error>());
}

} // namespace test_caller_stop
