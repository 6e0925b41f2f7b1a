// SPDX-License-Identifier: MIT
// Properties a caller sets on a call's context (properties.hpp): seen by every attempt, by classifiers,
// by callbacks and in telemetry events; owned by the context the caller made, free when none is set.
#include "alloc_counter.hpp"
#include "catch.hpp"

#include <resilience/backoff.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/circuit_breaker.hpp>
#include <resilience/classifier.hpp>
#include <resilience/context.hpp>
#include <resilience/fallback.hpp>
#include <resilience/fmt.hpp>
#include <resilience/hedge.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/properties.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/retry.hpp>
#include <resilience/telemetry.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace test_properties {

namespace rs = resilience;
using namespace std::chrono_literals;
using rs::testing::script;
using rs::testing::scripted_action;

inline constexpr rs::property_key<std::string> request_id{"request_id"};
inline constexpr rs::property_key<std::string> tenant{"tenant"};
inline constexpr rs::property_key<int> priority{"priority"};
inline constexpr rs::property_key<bool> idempotent{"idempotent"};

const rs::backoff no_wait = rs::constant_backoff{0ms};

TEST_CASE("properties: a context without properties has none", "[properties]") {
    const rs::context ctx;
    CHECK(ctx.properties().empty());
    CHECK(ctx.property(request_id) == nullptr);
    CHECK(ctx.property_or(priority, 7) == 7);
}

TEST_CASE("properties: a key reads only its own value, the latest set, with its own type", "[properties]") {
    rs::context ctx;
    ctx.set_property(request_id, "r-1");
    ctx.set_property(priority, 2);
    ctx.set_property(request_id, std::string("r-2"));
    REQUIRE(ctx.property(request_id) != nullptr);
    CHECK(*ctx.property(request_id) == "r-2");
    CHECK(*ctx.property(priority) == 2);
    CHECK(ctx.property(tenant) == nullptr);
    CHECK(ctx.property_or(tenant, "none") == "none");

    // Each key once, in the order set (at its latest setting); a value that is not text has no text.
    std::vector<std::pair<std::string, std::string>> seen;
    ctx.properties().for_each([&](std::string_view name, std::string_view text) {
        seen.emplace_back(std::string(name), std::string(text));
    });
    CHECK(seen == std::vector<std::pair<std::string, std::string>>{{"priority", ""}, {"request_id", "r-2"}});
}

TEST_CASE("properties: a copy keeps what it had, and outlives the context it was copied from",
          "[properties]") {
    std::optional<rs::context> original{std::in_place};
    original->set_property(request_id, "r-1");
    const rs::context before = *original;
    const rs::context with_tenant = original->with_property(tenant, "acme");
    original->set_property(request_id, "r-2");
    CHECK(*before.property(request_id) == "r-1");
    CHECK(before.property(tenant) == nullptr);
    CHECK(*with_tenant.property(tenant) == "acme");
    CHECK(*with_tenant.property(request_id) == "r-1");
    CHECK(*original->property(request_id) == "r-2");
    original.reset();
    CHECK(*before.property(request_id) == "r-1"); // its own reference keeps the values
    rs::context moved = std::move(const_cast<rs::context&>(with_tenant));
    CHECK(*moved.property(tenant) == "acme");
}

namespace {
// Counts the values alive, to see that the last context that holds them destroys them.
struct counted {
    static inline int alive = 0;
    counted() { ++alive; }
    counted(const counted&) { ++alive; }
    ~counted() { --alive; }
};
inline constexpr rs::property_key<counted> counted_key{"counted"};
} // namespace

TEST_CASE("properties: the values are destroyed with the last context holding them", "[properties]") {
    {
        rs::context a;
        a.set_property(counted_key, counted{});
        CHECK(counted::alive == 1);
        rs::context b = a;
        a = rs::context{};
        CHECK(counted::alive == 1);
        rs::context c;
        c = std::move(b);
        CHECK(counted::alive == 1);
    }
    CHECK(counted::alive == 0);
}

TEST_CASE("properties: a key set a million times on one context is read, listed and destroyed",
          "[properties]") {
    // On the heap: g++ 12 -O2 warns that a std::optional<context> reset and then destroyed may be
    // read uninitialised (a false positive that comes and goes with inlining).
    auto ctx = std::make_unique<rs::context>();
    ctx->set_property(tenant, "acme");
    for (int i = 0; i < 1'000'000; ++i)
        ctx->set_property(priority, i);
    ctx->set_property(request_id, "r-1");
    CHECK(*ctx->property(priority) == 999'999);
    std::vector<std::string> names;
    ctx->properties().for_each([&](std::string_view name, std::string_view) { names.emplace_back(name); });
    CHECK(names == std::vector<std::string>{"tenant", "priority", "request_id"});
    ctx.reset();
}

TEST_CASE("properties: a list a million long, kept by copies, is listed and destroyed without recursion",
          "[properties]") {
    // Each copy keeps what it had, so every setting stays in the list until the last context goes.
    auto ctx = std::make_unique<rs::context>(); // on the heap, as above
    for (int i = 0; i < 1'000'000; ++i) {
        *ctx = ctx->with_property(priority, i);
        if (i == 500'000)
            *ctx = ctx->with_property(tenant, "acme");
    }
    CHECK(*ctx->property(priority) == 999'999);
    CHECK(*ctx->property(tenant) == "acme");
    std::vector<std::pair<std::string, std::string>> seen;
    ctx->properties().for_each([&](std::string_view name, std::string_view text) {
        seen.emplace_back(std::string(name), std::string(text));
    });
    CHECK(seen == std::vector<std::pair<std::string, std::string>>{{"tenant", "acme"}, {"priority", ""}});
    ctx.reset();
}

namespace {
// Twenty keys, more than `for_each` gathers on the stack; their values tell them apart.
template <int I>
inline constexpr rs::property_key<std::string> numbered{"n"};
template <int... I>
void set_numbered(rs::context& ctx, int plus, std::integer_sequence<int, I...>) {
    (ctx.set_property(numbered<I>, std::to_string(I + plus)), ...);
}
template <int... I>
void set_numbered_by_copies(rs::context& ctx, int plus, std::integer_sequence<int, I...>) {
    ((ctx = ctx.with_property(numbered<I>, std::to_string(I + plus))), ...);
}
} // namespace

TEST_CASE("properties: for_each lists many keys in the order of their latest settings, each once",
          "[properties]") {
    rs::context ctx;
    set_numbered(ctx, 0, std::make_integer_sequence<int, 20>{});
    ctx.set_property(request_id, "r-1");
    set_numbered_by_copies(ctx, 100, std::make_integer_sequence<int, 10>{}); // the first ten again
    ctx.set_property(numbered<15>, "115");
    std::vector<std::string> texts;
    ctx.properties().for_each([&](std::string_view, std::string_view text) { texts.emplace_back(text); });
    CHECK(texts == std::vector<std::string>{"10",  "11",  "12",  "13",  "14",  "16",  "17",
                                            "18",  "19",  "r-1", "100", "101", "102", "103",
                                            "104", "105", "106", "107", "108", "109", "115"});
    CHECK(*ctx.property(numbered<0>) == "100");
    CHECK(*ctx.property(numbered<19>) == "19");
}

TEST_CASE("properties: a key set again and again on one context keeps one value alive, once no copy holds "
          "the earlier ones",
          "[properties]") {
    REQUIRE(counted::alive == 0);
    {
        rs::context ctx;
        ctx.set_property(tenant, "acme");
        for (int i = 0; i < 1'000; ++i)
            ctx.set_property(counted_key, counted{});
        CHECK(counted::alive == 1);
        CHECK(*ctx.property(tenant) == "acme");

        // A copy keeps what it had; once it goes, the next setting drops every earlier one.
        std::optional<rs::context> copy{ctx};
        for (int i = 0; i < 1'000; ++i)
            ctx.set_property(counted_key, counted{});
        CHECK(counted::alive == 2); // the copy's, and the latest
        copy.reset();
        CHECK(counted::alive == 2); // the copy's is still in the list, shadowed
        ctx.set_property(counted_key, counted{});
        CHECK(counted::alive == 1);

        // Behind a copy of a later setting, the earlier ones stay: that copy reaches them.
        ctx.set_property(request_id, "r-1");
        const rs::context later = ctx;
        ctx.set_property(counted_key, counted{});
        CHECK(counted::alive == 2);
        CHECK(*ctx.property(tenant) == "acme");
        CHECK(*ctx.property(request_id) == "r-1");
        std::vector<std::string> names;
        ctx.properties().for_each([&](std::string_view name, std::string_view) { names.emplace_back(name); });
        CHECK(names == std::vector<std::string>{"tenant", "request_id", "counted"});
    }
    CHECK(counted::alive == 0);
}

TEST_CASE("properties: every attempt of a retry under a timeout sees the caller's properties",
          "[properties][retry][timeout]") {
    rs::testing::simulation sim;
    rs::pipeline p{rs::retry{{.max_attempts = 3, .backoff = no_wait}, sim.clock()},
                   rs::timeout{{.timeout = 1s}, sim.clock()}};
    rs::context ctx;
    ctx.set_property(request_id, "r-42");
    std::vector<std::string> seen;
    const int v = sim.run(p.execute(
        [&](const rs::context& c) -> rs::task<int> {
            seen.push_back(c.property_or(request_id, "-") + "#" + std::to_string(c.attempt()));
            if (c.attempt() < 3)
                throw std::runtime_error("flaky");
            co_return 7;
        },
        ctx));
    CHECK(v == 7);
    CHECK(seen == std::vector<std::string>{"r-42#1", "r-42#2", "r-42#3"});
}

TEST_CASE("properties: the hedged attempts see the caller's properties", "[properties][hedge]") {
    rs::testing::simulation sim;
    rs::hedge h{{.max_attempts = 2, .delay = 10ms}, sim.clock()};
    rs::context ctx;
    ctx.set_property(tenant, "acme");
    std::vector<std::string> seen;
    const int v = sim.run(h.execute(
        [&](const rs::context& c) -> rs::task<int> {
            seen.push_back(c.property_or(tenant, "-"));
            co_await sim.clock().sleep_for(c.attempt() == 1 ? 100ms : 5ms, c.stop_token());
            co_return c.attempt();
        },
        ctx));
    CHECK(v == 2);
    CHECK(sim.now() == 15ms);
    CHECK(seen == std::vector<std::string>{"acme", "acme"});
}

TEST_CASE("properties: a classifier taking the context retries only what the caller marked idempotent",
          "[properties][classifier][retry]") {
    rs::testing::simulation sim;
    rs::retry r{{.max_attempts = 3,
                 .backoff = no_wait,
                 .should_handle = [](const rs::failure&,
                                     const rs::context& c) { return c.property_or(idempotent, false); }},
                sim.clock()};
    for (const bool marked : {true, false}) {
        scripted_action down{sim.clock(), script<int>{.failures = 5, .latency = 10ms}};
        rs::context ctx;
        ctx.set_property(idempotent, marked);
        const rs::outcome<int> o = sim.run(r.execute_outcome(down, ctx));
        CHECK(o.has_failure());
        CHECK(down.calls() == (marked ? 3 : 1));
    }
}

TEST_CASE("properties: an outcome classifier taking the context reads them too", "[properties][classifier]") {
    rs::testing::simulation sim;
    std::vector<std::string> asked;
    rs::retry r{{.max_attempts = 3,
                 .backoff = no_wait,
                 .should_handle =
                     [&](const rs::outcome<int>& o, const rs::context& c) {
                         asked.push_back(c.property_or(request_id, "-"));
                         return o.has_value() && *o < 0;
                     }},
                sim.clock()};
    rs::context ctx;
    ctx.set_property(request_id, "r-9");
    int calls = 0;
    CHECK(sim.run(r.execute([&]() -> rs::task<int> { co_return ++calls == 1 ? -1 : 1; }, ctx)) == 1);
    CHECK(asked == std::vector<std::string>{"r-9", "r-9"});
}

TEST_CASE("properties: the callbacks' events carry them", "[properties][retry][fallback][timeout][hedge]") {
    rs::testing::simulation sim;
    std::vector<std::string> heard;
    const auto note = [&](std::string what, rs::properties_view p) {
        heard.push_back(what + ":" + p.get_or(request_id, "-"));
    };
    rs::pipeline p{
        rs::fallback{-1, rs::fallback_options{.on_fallback =
                                                  [&](const rs::fallback_event& e) {
                                                      note("fallback", e.properties());
                                                  }}},
        rs::retry{{.max_attempts = 2,
                   .backoff = no_wait,
                   .on_retry = [&](const rs::retry_event& e) { note("retry", e.properties()); }},
                  sim.clock()},
        rs::timeout{{.timeout = 50ms,
                     .on_timeout = [&](const rs::timeout_event& e) { note("timeout", e.properties()); }},
                    sim.clock()},
    };
    scripted_action stall{sim.clock(), script<int>{.latency = 1s}};
    rs::context ctx;
    ctx.set_property(request_id, "r-5");
    CHECK(sim.run(p.execute(stall, ctx)) == -1);
    CHECK(heard == std::vector<std::string>{"timeout:r-5", "retry:r-5", "timeout:r-5", "fallback:r-5"});

    heard.clear();
    rs::hedge h{{.max_attempts = 2,
                 .delay = 10ms,
                 .on_hedge = [&](const rs::hedge_event& e) { note("hedge", e.properties()); }},
                sim.clock()};
    scripted_action slow{sim.clock(), script<int>{.latency = 30ms, .value = 3}};
    CHECK(sim.run(h.execute(slow, ctx)) == 3);
    CHECK(heard == std::vector<std::string>{"hedge:r-5"});
}

TEST_CASE("properties: telemetry events carry the call's properties, and none for a call without",
          "[properties][telemetry]") {
    rs::testing::simulation sim;
    std::vector<std::string> heard;
    rs::pipeline p{rs::telemetry{[&](const rs::telemetry_event& e) {
                                     heard.push_back(std::string(rs::to_string(e.kind)) + ":" +
                                                     e.properties.get_or(request_id, "-"));
                                 },
                                 sim.clock()},
                   rs::retry{{.max_attempts = 2, .backoff = no_wait}, sim.clock()}};
    scripted_action flaky{sim.clock(), script<int>{.failures = 1, .latency = 10ms, .value = 1}};
    rs::context ctx;
    ctx.set_property(request_id, "r-7");
    CHECK(sim.run(p.execute(flaky, ctx)) == 1);
    CHECK(heard == std::vector<std::string>{"attempt:r-7", "retry:r-7", "attempt:r-7", "call:r-7"});
    heard.clear();
    CHECK(sim.run(p.execute(flaky)) == 1);
    CHECK(heard == std::vector<std::string>{"attempt:-", "call:-"});
}

TEST_CASE(
    "properties: the refusals of a breaker, a bulkhead and a limiter name the request, to on_rejected and "
    "to the listener",
    "[properties][circuit_breaker][bulkhead][rate_limiter]") {
    rs::testing::simulation sim;
    std::vector<std::string> heard;
    const auto told = [&](const rs::rejection_event& e) {
        heard.push_back("on_rejected:" + e.properties().get_or(request_id, "-"));
    };
    const rs::telemetry_listener listener{[&](const rs::telemetry_event& e) {
        heard.push_back(std::string(rs::to_string(e.kind)) + ":" + e.properties.get_or(request_id, "-"));
    }};
    rs::circuit_breaker breaker{
        {.failure_threshold = 1, .break_duration = 1s, .on_rejected = told, .telemetry = listener},
        sim.clock()};
    rs::bulkhead bulkhead{{.max_concurrent_calls = 1, .on_rejected = told, .telemetry = listener},
                          sim.clock()};
    rs::rate_limiter limiter{
        {.token_limit = 1, .tokens_per_second = 1, .on_rejected = told, .telemetry = listener}, sim.clock()};
    const auto with_id = [](const char* id) { return rs::context{}.with_property(request_id, id); };

    scripted_action down{sim.clock(), script<int>{.failures = 1, .latency = 10ms}};
    (void)sim.run(
        breaker.execute_outcome(down, with_id("first"))); // opens it: closed -> open, reported with "first"
    (void)sim.run(breaker.execute_outcome(down, with_id("second")));
    CHECK(heard == std::vector<std::string>{"state_change:first", "on_rejected:second", "rejection:second"});

    heard.clear();
    scripted_action slow{sim.clock(), script<int>{.latency = 100ms, .value = 1}};
    // Named: a coroutine lambda's captures live in the lambda object, which must outlive the call.
    const auto hold_the_slot = [&]() -> rs::task<void> {
        (void)co_await bulkhead.execute_outcome(slow, with_id("holder"));
    };
    sim.spawn(hold_the_slot());
    sim.run_for(1ms);
    (void)sim.run(bulkhead.execute_outcome(slow, with_id("refused")));
    (void)sim.run(limiter.execute_outcome(slow, with_id("admitted")));
    (void)sim.run(limiter.execute_outcome(slow, with_id("limited")));
    CHECK(heard == std::vector<std::string>{"on_rejected:refused", "rejection:refused", "on_rejected:limited",
                                            "rejection:limited"});
}

TEST_CASE("properties: a breaker's classifier taking the context counts only what the caller says is the "
          "dependency's fault",
          "[properties][classifier][circuit_breaker]") {
    static constexpr rs::property_key<bool> caller_error{"caller_error"};
    rs::testing::simulation sim;
    rs::circuit_breaker breaker{
        {.failure_threshold = 2,
         .should_handle = [](const rs::failure&,
                             const rs::context& c) { return !c.property_or(caller_error, false); }},
        sim.clock()};
    scripted_action down{sim.clock(), script<int>{.failures = 10, .latency = 10ms}};
    for (int i = 0; i < 3; ++i)
        (void)sim.run(breaker.execute_outcome(down, rs::context{}.with_property(caller_error, true)));
    CHECK(breaker.state() == rs::circuit_state::closed);
    for (int i = 0; i < 2; ++i)
        (void)sim.run(breaker.execute_outcome(down, rs::context{}));
    CHECK(breaker.state() == rs::circuit_state::open);
}

TEST_CASE("properties: fmt ends an event's line with the properties whose values are text",
          "[properties][telemetry][fmt]") {
    rs::testing::simulation sim;
    std::vector<std::string> lines;
    rs::retry r{{.name = "payments",
                 .max_attempts = 2,
                 .backoff = no_wait,
                 .telemetry =
                     [&](const rs::telemetry_event& e) {
                         if (e.kind == rs::telemetry_kind::retry)
                             lines.push_back(fmt::format("{}", e));
                     }},
                sim.clock()};
    scripted_action flaky{sim.clock(), script<int>{.failures = 1, .latency = 10ms, .value = 1}};
    rs::context ctx;
    ctx.set_property(request_id, "r-42");
    ctx.set_property(priority, 1); // not text: left out
    ctx.set_property(tenant, "acme");
    CHECK(sim.run(r.execute(flaky, ctx)) == 1);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].starts_with(
        "[10ms] retry(payments) retry: attempt 1 failed, next in 0ns: scripted failure"));
    CHECK(lines[0].ends_with(" {request_id=r-42, tenant=acme}"));
}

#ifdef RESILIENCE_TESTS_COUNT_ALLOCATIONS
TEST_CASE("properties: a call with properties set allocates nothing more than one without",
          "[properties][allocation]") {
    rs::testing::simulation sim;
    rs::pipeline p{rs::retry{{.max_attempts = 2, .backoff = no_wait}, sim.clock()},
                   rs::timeout{{.timeout = 1s}, sim.clock()}};
    auto action = [](const rs::context& c) -> rs::task<int> { co_return c.property_or(priority, 1); };
    rs::context ctx;
    {
        resilience_tests::counting_allocations counting;
        ctx.set_property(priority, 2);
        CHECK(counting.count() == 1); // the node
    }
    std::size_t with = 0;
    std::size_t without = 0;
    int sum = 0;
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 100; ++i) // warm-up: frames, pools
            sum += co_await p.execute(action, ctx) + co_await p.execute(action);
        {
            resilience_tests::counting_allocations counting;
            for (int i = 0; i < 1'000; ++i)
                sum += co_await p.execute(action, ctx);
            with = counting.count();
        }
        resilience_tests::counting_allocations counting;
        for (int i = 0; i < 1'000; ++i)
            sum += co_await p.execute(action);
        without = counting.count();
    }());
    CHECK(sum == 100 * 3 + 1'000 * 2 + 1'000);
    CHECK(with == 0);
    CHECK(without == 0);
}
#endif

} // namespace test_properties
