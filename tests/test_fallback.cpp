// SPDX-License-Identifier: MIT
#include "catch.hpp"
#include "support.hpp"

#include <resilience/fallback.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/retry.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace test_fallback {

namespace rs = resilience;
using namespace std::chrono_literals;
using std::chrono::nanoseconds;

namespace {

// Fails once after `latency` with a scripted_failure.
auto failing(rs::testing::simulation& sim, std::chrono::nanoseconds latency = 100ms) {
    return rs::testing::scripted_action{sim.clock(),
                                        rs::testing::script<int>{.failures = 1, .latency = latency}};
}

} // namespace

TEST_CASE("fallback: a failed call is answered with the substitute value at the failure's instant",
          "[fallback]") {
    rs::testing::simulation sim;
    auto act = failing(sim);
    rs::fallback fb{42};
    CHECK(sim.run(fb.execute(act)) == 42);
    CHECK(sim.now() == 100ms);
    CHECK(act.calls() == 1);
}

TEST_CASE("fallback: a function of the failure sees the original exception", "[fallback]") {
    rs::testing::simulation sim;
    auto act = failing(sim);
    int seen_call = 0;
    std::string seen_what;
    rs::fallback fb{[&](const rs::failure& f) {
        if (auto* e = f.as<rs::testing::scripted_failure>())
            seen_call = e->call();
        seen_what = f.what();
        return -1;
    }};
    CHECK(sim.run(fb.execute(act)) == -1);
    CHECK(seen_call == 1);
    CHECK(seen_what == "scripted failure on call 1");
}

TEST_CASE("fallback: a substitute returning an awaitable is awaited on virtual time", "[fallback]") {
    rs::testing::simulation sim;
    auto act = failing(sim);
    rs::fallback fb{[&sim](const rs::failure&) -> rs::task<int> {
        co_await sim.sleep_for(30ms);
        co_return 7;
    }};
    CHECK(sim.run(fb.execute(act)) == 7);
    CHECK(sim.now() == 130ms);
}

TEST_CASE("fallback: a no-argument substitute and a substitute taking the context both work", "[fallback]") {
    rs::testing::simulation sim;
    auto act = failing(sim);
    rs::fallback nullary{[] { return std::string("cached"); }};
    CHECK(sim.run(nullary.execute([&](resilience::stop_token st) -> rs::task<std::string> {
        co_await act(st);
        co_return "fresh";
    })) == "cached");

    resilience::stop_source caller;
    bool saw_caller_token = false;
    rs::fallback with_ctx{[&](const rs::failure&, const rs::context& ctx) {
        saw_caller_token = ctx.stop_token() == caller.get_token();
        return 5;
    }};
    CHECK(sim.run(with_ctx.execute(failing(sim), caller.get_token())) == 5);
    CHECK(saw_caller_token);
}

TEST_CASE("fallback: a throwing substitute replaces the failure", "[fallback]") {
    rs::testing::simulation sim;
    auto act = failing(sim);
    rs::fallback fb{[](const rs::failure&) -> int { throw std::domain_error("no cache either"); }};
    auto result = sim.run(fb.execute_outcome(act));
    REQUIRE(result.has_failure());
    CHECK(result.error().is<std::domain_error>());
    CHECK_FALSE(result.error().is<rs::testing::scripted_failure>());
    CHECK(result.error().what() == std::string("no cache either"));
    CHECK_THROWS_AS(sim.run(fb.execute(failing(sim))), std::domain_error);
}

TEST_CASE("fallback: an awaitable substitute that throws replaces the failure at its own instant",
          "[fallback]") {
    rs::testing::simulation sim;
    rs::fallback fb{[&sim](const rs::failure&) -> rs::task<int> {
        co_await sim.sleep_for(20ms);
        throw std::domain_error("late");
    }};
    CHECK_THROWS_AS(sim.run(fb.execute(failing(sim))), std::domain_error);
    CHECK(sim.now() == 120ms);
}

TEST_CASE("fallback: should_handle narrows, a declined failure passes through as the same exception object",
          "[fallback]") {
    rs::testing::simulation sim;
    int substitutes = 0;
    rs::fallback fb{[&](const rs::failure&) {
                        ++substitutes;
                        return 0;
                    },
                    {.should_handle = [](const rs::failure& f) { return f.is<std::runtime_error>(); }}};

    const auto original = std::make_exception_ptr(std::logic_error("bad input"));
    auto declined = sim.run(fb.execute_outcome([&]() -> rs::task<int> {
        co_await sim.sleep_for(10ms);
        std::rethrow_exception(original);
    }));
    REQUIRE(declined.has_failure());
    CHECK(declined.error().exception() == original);
    CHECK(substitutes == 0);
    CHECK(sim.now() == 10ms);

    CHECK(sim.run(fb.execute(failing(sim))) == 0); // scripted_failure is a runtime_error
    CHECK(substitutes == 1);
}

TEST_CASE("fallback: a cancelled_error from the action passes through by default", "[fallback]") {
    rs::testing::simulation sim;
    int substitutes = 0;
    rs::fallback fb{[&](const rs::failure&) {
        ++substitutes;
        return 0;
    }};
    CHECK_THROWS_AS(sim.run(fb.execute([]() -> rs::task<int> {
        throw rs::cancelled_error{};
        co_return 1;
    })),
                    rs::cancelled_error);
    CHECK(substitutes == 0);

    // A predicate that accepts everything may answer a cancelled_error the caller did not ask for.
    rs::fallback all{9, {.should_handle = [](const rs::failure&) { return true; }}};
    CHECK(sim.run(all.execute([]() -> rs::task<int> {
        throw rs::cancelled_error{};
        co_return 1;
    })) == 9);
}

TEST_CASE("fallback: a caller's stop passes through at its instant, whatever should_handle says",
          "[fallback]") {
    rs::testing::simulation sim;
    auto act =
        rs::testing::scripted_action{sim.clock(), rs::testing::script<int>{.latency = 100ms, .value = 1}};
    int substitutes = 0;
    rs::fallback fb{[&](const rs::failure&) {
                        ++substitutes;
                        return 0;
                    },
                    {.should_handle = [](const rs::failure&) { return true; }}};
    resilience::stop_source caller;
    sim.spawn(resilience_tests::stop_at(sim, caller, 50ms));
    auto result = sim.run(fb.execute_outcome(act, caller.get_token()));
    REQUIRE(result.has_failure());
    CHECK(rs::is_cancellation(result.error()));
    CHECK(sim.now() == 50ms);
    CHECK(act.stopped() == 1);
    CHECK(substitutes == 0);
}

TEST_CASE("fallback: a success is returned untouched and the substitute never runs", "[fallback]") {
    rs::testing::simulation sim;
    auto act =
        rs::testing::scripted_action{sim.clock(), rs::testing::script<int>{.latency = 40ms, .value = 3}};
    int substitutes = 0;
    rs::fallback fb{[&](const rs::failure&) {
        ++substitutes;
        return 0;
    }};
    CHECK(sim.run(fb.execute(act)) == 3);
    CHECK(sim.now() == 40ms);
    CHECK(substitutes == 0);
}

TEST_CASE("fallback: outermost in a pipeline, answers a timeout at the exact instant it fires",
          "[fallback]") {
    rs::testing::simulation sim;
    auto act =
        rs::testing::scripted_action{sim.clock(), rs::testing::script<int>{.latency = 300ms, .value = 1}};
    bool saw_timeout = false;
    rs::pipeline p{rs::fallback{[&](const rs::failure& f) {
                       saw_timeout = f.is<rs::timeout_error>();
                       return -1;
                   }},
                   rs::timeout{100ms, sim.clock()}};
    CHECK(sim.run(p.execute(act)) == -1);
    CHECK(sim.now() == 100ms);
    CHECK(saw_timeout);
    CHECK(act.stopped() == 1);
}

TEST_CASE("fallback: void actions take a substitute returning void or an awaitable of void", "[fallback]") {
    rs::testing::simulation sim;
    auto fail_void = [&sim]() -> rs::task<void> {
        co_await sim.sleep_for(10ms);
        throw std::runtime_error("down");
    };
    int plain = 0;
    rs::fallback fb_plain{[&](const rs::failure&) { ++plain; }};
    sim.run(fb_plain.execute(fail_void));
    CHECK(plain == 1);
    CHECK(sim.now() == 10ms);

    rs::fallback fb_async{[&sim](const rs::failure&) -> rs::task<void> { co_await sim.sleep_for(5ms); }};
    sim.run(fb_async.execute(fail_void));
    CHECK(sim.now() == 25ms);

    int ran = 0;
    sim.run(fb_plain.execute([&]() -> rs::task<void> {
        ++ran;
        co_return;
    }));
    CHECK(ran == 1);
    CHECK(plain == 1);
}

TEST_CASE("fallback: the substitute's result converts to the action's result type", "[fallback]") {
    rs::testing::simulation sim;
    rs::fallback fb{"stale"}; // const char*, converted to std::string
    auto result = sim.run(fb.execute([]() -> rs::task<std::string> {
        throw std::runtime_error("down");
        co_return "fresh";
    }));
    CHECK(result == "stale");
    STATIC_REQUIRE(rs::policy<rs::fallback<int>>);
    STATIC_REQUIRE(rs::policy<decltype(fb)>);
}

TEST_CASE("fallback: outermost over a retry, answers once the last attempt has failed", "[fallback]") {
    rs::testing::simulation sim;
    auto act =
        rs::testing::scripted_action{sim.clock(), rs::testing::script<int>{.failures = 5, .latency = 100ms}};
    int substitutes = 0;
    rs::pipeline p{
        rs::fallback{[&](const rs::failure& f) {
            ++substitutes;
            return f.as<rs::testing::scripted_failure>()->call() * -1;
        }},
        rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{10ms, rs::jitter::none}}, sim.clock()}};
    CHECK(sim.run(p.execute(act)) == -3); // the substitute saw the last attempt's failure
    CHECK(sim.now() == 320ms);
    CHECK(act.calls() == 3);
    CHECK(substitutes == 1);
}

namespace {
struct page {
    int status = 0;
    std::string body;
};
// Answers with `status` after 20ms.
auto serve(rs::testing::simulation& sim, int status) {
    return [&sim, status]() -> rs::task<page> {
        co_await sim.sleep_for(20ms);
        co_return page{status, "live"};
    };
}
bool unavailable(const rs::outcome<page>& o) {
    return !o || o.value().status == 503;
}
} // namespace

TEST_CASE("fallback: a returned value should_handle handles gets the substitute, which may see it",
          "[fallback]") {
    rs::testing::simulation sim;
    int seen_status = 0;
    rs::fallback fb{[&](const rs::outcome<page>& o) {
                        seen_status = o ? o.value().status : -1;
                        return page{200, "cached"};
                    },
                    {.should_handle = unavailable}};
    const page replaced = sim.run(fb.execute(serve(sim, 503)));
    CHECK(replaced.body == "cached");
    CHECK(seen_status == 503);
    CHECK(sim.now() == 20ms);
    const page kept = sim.run(fb.execute(serve(sim, 200)));
    CHECK(kept.body == "live");
    CHECK(seen_status == 503); // not asked
    // The outcome form sees a failure too.
    const page after_failure = sim.run(fb.execute([]() -> rs::task<page> {
        throw std::runtime_error("down");
        co_return page{};
    }));
    CHECK(after_failure.body == "cached");
    CHECK(seen_status == -1);
}

TEST_CASE("fallback: a failure-taking substitute answering a handled value receives an empty failure",
          "[fallback]") {
    rs::testing::simulation sim;
    bool had_exception = true;
    rs::fallback fb{[&](const rs::failure& f, const rs::context&) {
                        had_exception = f.has_exception();
                        return page{200, "cached"};
                    },
                    {.should_handle = unavailable}};
    CHECK(sim.run(fb.execute(serve(sim, 503))).body == "cached");
    CHECK_FALSE(had_exception);
}

TEST_CASE("fallback: should_handle may be an rs::classifier: an empty one is the default, one of another "
          "result type fails the call before it runs",
          "[fallback]") {
    rs::testing::simulation sim;
    rs::fallback by_default{5, rs::fallback_options{}};
    CHECK(sim.run(by_default.execute(failing(sim))) == 5);
    CHECK_THROWS_AS(sim.run(by_default.execute([]() -> rs::task<int> {
        throw rs::cancelled_error{};
        co_return 1;
    })),
                    rs::cancelled_error);

    rs::fallback typed{5, {.name = "prices", .should_handle = [](const rs::outcome<long>& o) { return !o; }}};
    auto act = failing(sim);
    const std::string message =
        resilience_tests::invalid_argument_message([&] { sim.run(typed.execute(act)); });
    CHECK(message ==
          "resilience::fallback (prices): should_handle classifies rs::outcome<long> but the action "
          "returns int");
    CHECK(act.calls() == 0);
}

TEST_CASE("fallback: a throwing should_handle replaces the outcome with its exception", "[fallback]") {
    rs::testing::simulation sim;
    int substitutes = 0;
    rs::fallback fb{
        [&] {
            ++substitutes;
            return 0;
        },
        {.should_handle = [](const rs::failure&) -> bool { throw std::domain_error("classifier"); }}};
    auto result = sim.run(fb.execute_outcome(failing(sim)));
    REQUIRE(result.has_failure());
    CHECK(result.error().is<std::domain_error>());
    CHECK(substitutes == 0);
}

TEST_CASE("fallback: fallback_options names it, and its fields are the ones given", "[fallback]") {
    const rs::fallback named{42, {.name = "prices"}};
    STATIC_REQUIRE(std::is_same_v<std::remove_const_t<decltype(named)>, rs::fallback<int, rs::classifier>>);
    CHECK(named.name() == "prices");
    CHECK(named.options().name == "prices");
    CHECK(named.options().should_handle.empty());
    CHECK_FALSE(named.options().on_fallback);
    CHECK(rs::fallback{42}.name().empty());
    // The field order, for positional and designated initialisation alike.
    const rs::fallback_options positional{"x", rs::classifier{}, [](const rs::fallback_event&) {}, {}};
    CHECK(positional.name == "x");
    CHECK(positional.on_fallback);
}

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
TEST_CASE("fallback: the positional constructor, deprecated, still takes a predicate and a name",
          "[fallback]") {
    rs::testing::simulation sim;
    rs::fallback named{42, {}, "prices"};
    STATIC_REQUIRE(std::is_same_v<decltype(named), rs::fallback<int>>);
    CHECK(named.name() == "prices");
    CHECK(sim.run(named.execute(failing(sim))) == 42);
    int asked = 0;
    rs::fallback typed{7, [&asked](const rs::failure&) {
                           ++asked;
                           return false;
                       }};
    CHECK_THROWS_AS(sim.run(typed.execute(failing(sim))), rs::testing::scripted_failure);
    CHECK(asked == 1);
    CHECK(typed.options().should_handle.empty()); // the predicate keeps its own type
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

TEST_CASE("fallback: on_fallback is told once, when the substitute answers, with the failure it replaces",
          "[fallback]") {
    rs::testing::simulation sim;
    struct seen {
        std::string name;
        int attempt;
        std::string what;
        bool had_value;
        nanoseconds at;
    };
    std::vector<seen> events;
    nanoseconds substituted_at{-1};
    rs::fallback fb{[&](const rs::failure&) {
                        substituted_at = sim.now();
                        return -1;
                    },
                    {.name = "prices", .on_fallback = [&](const rs::fallback_event& e) {
                         events.push_back({std::string(e.policy_name()), e.attempt(),
                                           e.error() ? e.error()->what() : "", e.value<int>() != nullptr,
                                           sim.now()});
                     }}};
    auto act = failing(sim);
    CHECK(sim.run(fb.execute(act)) == -1);
    REQUIRE(events.size() == 1);
    CHECK(events[0].name == "prices");
    CHECK(events[0].attempt == 1);
    CHECK(events[0].what == "scripted failure on call 1");
    CHECK_FALSE(events[0].had_value);
    CHECK(events[0].at == 100ms);
    CHECK(substituted_at == 100ms);

    // A success is not replaced, and not told.
    auto fine =
        rs::testing::scripted_action{sim.clock(), rs::testing::script<int>{.latency = 10ms, .value = 3}};
    CHECK(sim.run(fb.execute(fine)) == 3);
    CHECK(events.size() == 1);
}

TEST_CASE("fallback: on_fallback sees a handled value it replaces", "[fallback]") {
    rs::testing::simulation sim;
    int seen_status = 0;
    bool had_error = true;
    nanoseconds at{-1};
    rs::fallback fb{page{200, "cached"},
                    {.should_handle = unavailable, .on_fallback = [&](const rs::fallback_event& e) {
                         had_error = e.error() != nullptr;
                         seen_status = e.value<page>() ? e.value<page>()->status : -1;
                         CHECK(e.value<int>() == nullptr);
                         at = sim.now();
                     }}};
    CHECK(sim.run(fb.execute(serve(sim, 503))).body == "cached");
    CHECK(seen_status == 503);
    CHECK_FALSE(had_error);
    CHECK(at == 20ms);
}

TEST_CASE("fallback: a throwing on_fallback ends the call with its exception, and the substitute is not used",
          "[fallback]") {
    rs::testing::simulation sim;
    int substitutes = 0;
    rs::fallback fb{
        [&] {
            ++substitutes;
            return 0;
        },
        {.on_fallback = [](const rs::fallback_event&) { throw std::domain_error("on_fallback"); }}};
    auto result = sim.run(fb.execute_outcome(failing(sim)));
    REQUIRE(result.has_failure());
    CHECK(result.error().is<std::domain_error>());
    CHECK(substitutes == 0);
    CHECK(sim.now() == 100ms);
}

} // namespace test_fallback
