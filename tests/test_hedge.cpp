// SPDX-License-Identifier: MIT
#include "alloc_counter.hpp"
#include "catch.hpp"
#include "loopless_clock.hpp"
#include "support.hpp"

#include <resilience/any_clock.hpp>
#include <resilience/backoff.hpp>
#include <resilience/error.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/hedge.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/retry.hpp>
#include <resilience/retry_budget.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>
#include <resilience/when_all.hpp>

#include <atomic>
#include <chrono>
#include <coroutine>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace test_hedge {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_tests::invalid_argument_message;
using resilience_tests::stop_at;
using rs::testing::simulation;
using std::chrono::nanoseconds;

static_assert(rs::policy<rs::hedge<>>);
static_assert(rs::policy<rs::hedge<rs::testing::virtual_clock>>);
static_assert(std::is_aggregate_v<rs::hedge_options>);

namespace {

constexpr nanoseconds never{-1};

// What one call of a replica does, by the order of the call (the first call, the second, ...).
struct plan {
    nanoseconds latency{};
    int value = 0;
    std::exception_ptr error{}; // rethrown at the end, unchanged, when set
    bool ignore_stop = false;   // keeps running when asked to stop
    nanoseconds wind_down{};    // once stopped, takes this long to finish
};

// What happened to one call, at which virtual instants.
struct record {
    int attempt = 0; // context::attempt() as the call saw it
    nanoseconds started = never, stopped = never, ended = never;
    bool stopped_at_end = false; // its token said stop when it finished
};

// A simulated service with replicas: call i follows plans[i] (the last plan once they run out) and
// leaves a record of itself.
class replicas {
public:
    replicas(simulation& sim, std::vector<plan> plans) : sim_(&sim), plans_(std::move(plans)) {}

    rs::task<int> call(const rs::context& ctx) {
        const std::size_t index = records_.size();
        const plan p = plans_[index < plans_.size() ? index : plans_.size() - 1];
        record& r = records_.emplace_back();
        r.attempt = ctx.attempt();
        r.started = sim_->now();
        ++in_flight_;
        struct leave {
            replicas* self;
            record* r;
            ~leave() {
                --self->in_flight_;
                r->ended = self->sim_->now();
            }
        } guard{this, &r};
        const resilience::stop_token token = ctx.stop_token();
        auto noted = [this, &r] { r.stopped = sim_->now(); };
        resilience::stop_callback<decltype(noted)> on_stop{token, noted};
        // Named, not a temporary of the co_await expression (g++ 12 destroys those twice).
        const resilience::stop_token listen = p.ignore_stop ? resilience::stop_token{} : token;
        co_await sim_->sleep_for(p.latency, listen);
        if (!p.ignore_stop && token.stop_requested()) {
            if (p.wind_down > nanoseconds::zero())
                co_await sim_->sleep_for(p.wind_down);
            throw rs::cancelled_error{};
        }
        r.stopped_at_end = token.stop_requested();
        if (p.error)
            std::rethrow_exception(p.error);
        co_return p.value;
    }
    auto action() {
        return [this](const rs::context& ctx) { return call(ctx); };
    }

    const record& operator[](std::size_t i) const { return records_.at(i); }
    std::size_t calls() const noexcept { return records_.size(); }
    int in_flight() const noexcept { return in_flight_; }
    std::vector<nanoseconds> starts() const {
        std::vector<nanoseconds> v;
        for (const record& r : records_)
            v.push_back(r.started);
        return v;
    }
    std::vector<nanoseconds> stops() const {
        std::vector<nanoseconds> v;
        for (const record& r : records_)
            v.push_back(r.stopped);
        return v;
    }

private:
    simulation* sim_;
    std::vector<plan> plans_;
    std::deque<record> records_; // a deque: records stay where they are as calls are added
    int in_flight_ = 0;
};

struct replica_error : std::runtime_error {
    explicit replica_error(int replica)
        : std::runtime_error("replica " + std::to_string(replica)), id(replica) {}
    int id;
};

std::exception_ptr replica_failure(int id) {
    return std::make_exception_ptr(replica_error{id});
}

const void* address_of(const std::exception_ptr& p) {
    try {
        std::rethrow_exception(p);
    } catch (const std::exception& e) {
        return &e;
    }
}

// What on_hedge heard, and when.
struct heard {
    int attempt;
    rs::hedge_reason reason;
    bool with_error;
    nanoseconds at;
    bool operator==(const heard&) const = default;
};

// Runs a call and notes, the moment it returns, the time and how many replica calls still run.
template <class Task>
rs::task<void> timed(simulation& sim, Task call, const replicas& service, nanoseconds& ended,
                     int& in_flight) {
    (void)co_await std::move(call);
    ended = sim.now();
    in_flight = service.in_flight();
}

} // namespace

TEST_CASE("hedge: a first attempt that answers before the delay is the only one", "[hedge]") {
    simulation sim;
    replicas service{sim, {{.latency = 80ms, .value = 1}}};
    int hedges = 0;
    rs::hedge h{{.delay = 100ms, .on_hedge = [&](const rs::hedge_event&) { ++hedges; }}, sim.clock()};
    CHECK(sim.run(h.execute(service.action())) == 1);
    CHECK(sim.now() == 80ms);
    CHECK(service.calls() == 1);
    CHECK(hedges == 0);
    CHECK(service[0].stopped == never); // the winner's token is never stopped
    CHECK(sim.loop().timers() == 0);    // the delay's timer was disarmed, not waited out
}

TEST_CASE("hedge: a slow attempt gets company at the delay, the first answer wins, the loser is stopped "
          "and awaited",
          "[hedge]") {
    simulation sim;
    // The first replica stalls, and takes 50 ms to wind down once asked to stop.
    replicas service{sim, {{.latency = 1s, .value = 1, .wind_down = 50ms}, {.latency = 100ms, .value = 2}}};
    rs::hedge h{{.max_attempts = 2, .delay = 300ms}, sim.clock()};
    nanoseconds ended = never;
    int in_flight_at_end = -1;
    rs::outcome<int> result = 0;
    sim.run([&]() -> rs::task<void> {
        auto call = h.execute_outcome(service.action());
        result = co_await std::move(call);
        ended = sim.now();
        in_flight_at_end = service.in_flight();
    }());
    REQUIRE(result.has_value());
    CHECK(*result == 2);
    CHECK(service.starts() == std::vector<nanoseconds>{0ms, 300ms});
    CHECK(service[1].ended == 400ms);
    CHECK(service[0].stopped == 400ms); // asked to stop the instant the winner answered
    CHECK(service[0].ended == 450ms);
    CHECK(ended == 450ms); // the call waited for the loser to finish
    CHECK(in_flight_at_end == 0);
    CHECK(service[1].stopped == never); // the winner's token was never stopped
    CHECK_FALSE(service[1].stopped_at_end);
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("hedge: the delay may be a schedule of the attempts already started", "[hedge]") {
    simulation sim;
    replicas service{sim, {{.latency = 1s, .value = 1}}};
    std::vector<int> asked;
    rs::hedge h{{.max_attempts = 3,
                 .delay =
                     [&](int started) {
                         asked.push_back(started);
                         return started == 1 ? nanoseconds{100ms} : nanoseconds{300ms};
                     }},
                sim.clock()};
    CHECK(sim.run(h.execute(service.action())) == 1);
    CHECK(asked == std::vector<int>{1, 2});
    CHECK(service.starts() == std::vector<nanoseconds>{0ms, 100ms, 400ms});
    // The first attempt answered at 1 s; the two others were stopped then.
    CHECK(service.stops() == std::vector<nanoseconds>{never, 1s, 1s});
    CHECK(sim.now() == 1s);
}

TEST_CASE("hedge: a failure brings the next attempt forward at once, and the delay starts again", "[hedge]") {
    simulation sim;
    replicas service{sim,
                     {{.latency = 50ms, .error = replica_failure(1)},
                      {.latency = 5s, .value = 2},
                      {.latency = 100ms, .value = 3}}};
    std::vector<heard> events;
    rs::hedge h{{.max_attempts = 3,
                 .delay = 1s,
                 .on_hedge =
                     [&](const rs::hedge_event& e) {
                         events.push_back({e.attempt(), e.reason(), e.error() != nullptr, sim.now()});
                     }},
                sim.clock()};
    CHECK(sim.run(h.execute(service.action())) == 3);
    CHECK(service.starts() == std::vector<nanoseconds>{0ms, 50ms, 1050ms});
    CHECK(events == std::vector<heard>{{2, rs::hedge_reason::failure, true, 50ms},
                                       {3, rs::hedge_reason::delay, false, 1050ms}});
    CHECK(service[1].stopped == 1150ms);
    CHECK(sim.now() == 1150ms);
}

TEST_CASE("hedge: a failure should_handle does not handle ends the call with that failure", "[hedge]") {
    simulation sim;
    SECTION("a classifier that says no") {
        const auto bad_request = std::make_exception_ptr(std::invalid_argument("bad request"));
        replicas service{sim, {{.latency = 1s, .value = 1}, {.latency = 50ms, .error = bad_request}}};
        rs::hedge h{
            {.delay = 200ms, .should_handle = [](const rs::failure& f) { return !f.is<std::logic_error>(); }},
            sim.clock()};
        auto result = sim.run(h.execute_outcome(service.action()));
        REQUIRE(result.has_failure());
        CHECK(result.error().exception() == bad_request); // passed straight through, unchanged
        CHECK(service[0].stopped == 250ms);
        CHECK(sim.now() == 250ms);
    }
    SECTION("by default, a cancellation the attempt made itself") {
        const auto gave_up = std::make_exception_ptr(rs::cancelled_error{"replica"});
        replicas service{sim, {{.latency = 40ms, .error = gave_up}}};
        rs::hedge h{{.max_attempts = 3, .delay = 200ms}, sim.clock()};
        auto result = sim.run(h.execute_outcome(service.action()));
        REQUIRE(result.has_failure());
        CHECK(result.error().exception() == gave_up);
        CHECK(service.calls() == 1);
        CHECK(sim.now() == 40ms);
    }
}

TEST_CASE("hedge: when every attempt fails, the one that failed last is the call's failure, unchanged",
          "[hedge]") {
    simulation sim;
    const std::exception_ptr errors[] = {replica_failure(1), replica_failure(2), replica_failure(3)};
    // Attempts start at 0, 100 and 200 ms and fail at 500, 600 and 550 ms: the second fails last.
    const std::vector<plan> plans{{.latency = 500ms, .error = errors[0]},
                                  {.latency = 500ms, .error = errors[1]},
                                  {.latency = 350ms, .error = errors[2]}};
    rs::hedge h{{.max_attempts = 3, .delay = 100ms}, sim.clock()};

    replicas first{sim, plans};
    auto result = sim.run(h.execute_outcome(first.action()));
    REQUIRE(result.has_failure());
    CHECK(result.error().exception() == errors[1]);
    CHECK(sim.now() == 600ms);

    replicas second{sim, plans};
    try {
        sim.run(h.execute(second.action()));
        FAIL("expected the last failure");
    } catch (const replica_error& e) {
        CHECK(e.id == 2);
        CHECK(&e == address_of(errors[1])); // the very same exception object
    }
    CHECK(sim.now() == 1200ms);
}

TEST_CASE("hedge: a caller's stop ends every attempt and the call at that instant, as cancellation",
          "[hedge]") {
    simulation sim;
    replicas service{sim, {{.latency = 10s, .value = 1}}};
    rs::hedge h{{.name = "reads", .max_attempts = 5, .delay = 100ms}, sim.clock()};
    resilience::stop_source caller;
    auto [result, ignored] = sim.run(
        rs::when_all(h.execute_outcome(service.action(), caller.get_token()), stop_at(sim, caller, 250ms)));
    (void)ignored;
    REQUIRE(result.has_failure());
    CHECK(rs::is_cancellation(result.error()));
    auto* e = result.error().as<rs::cancelled_error>();
    REQUIRE(e != nullptr);
    CHECK(e->policy_name() == "reads");
    CHECK(service.starts() == std::vector<nanoseconds>{0ms, 100ms, 200ms}); // none after the stop
    CHECK(service.stops() == std::vector<nanoseconds>{250ms, 250ms, 250ms});
    CHECK(sim.now() == 250ms);
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("hedge: a caller's stop that finishes the call inside its forwarding to an attempt, another "
          "callback on the attempt's token pending, is cancellation at that instant",
          "[hedge]") {
    // The stop reaches the attempt through the link from the caller's token to the attempt's own and
    // finishes the attempt, the hedge and the call before the attempt's stop state has run its other
    // callback: that state must outlive the call until the forwarding is done with it.
    simulation sim;
    rs::hedge h{{.max_attempts = 2, .delay = 1h}, sim.clock()};
    resilience::stop_source caller;
    auto [result, ignored] =
        sim.run(rs::when_all(h.execute_outcome(resilience_tests::ends_inside_its_stop, caller.get_token()),
                             stop_at(sim, caller, 3s)));
    (void)ignored;
    CHECK(sim.now() == 3s);
    REQUIRE(result.has_failure());
    CHECK(rs::is_cancellation(result.error()));
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("hedge: a caller's stop requested from the hedge's own callbacks starts no more attempts",
          "[hedge]") {
    // The stop comes between the hedge's decision to start an attempt and the start: the attempt must
    // not start (its action would run with a stopped token), and the call ends as cancellation then.
    simulation sim;
    resilience::stop_source caller;
    const auto stop_caller = [&caller] { caller.request_stop(); };
    const auto call = [&](replicas& service, rs::hedge_options options) {
        rs::hedge h{std::move(options), sim.clock()};
        return sim.run(h.execute_outcome(service.action(), caller.get_token()));
    };
    SECTION("on_hedge, at the delay") {
        replicas service{sim, {{.latency = 1s, .value = 1}}};
        auto result = call(
            service,
            {.max_attempts = 3, .delay = 100ms, .on_hedge = [&](const rs::hedge_event&) { stop_caller(); }});
        REQUIRE(result.has_failure());
        CHECK(rs::is_cancellation(result.error()));
        CHECK(service.starts() == std::vector<nanoseconds>{0ms});
        CHECK(service[0].stopped == 100ms);
        CHECK(sim.now() == 100ms);
    }
    SECTION("a telemetry listener, at the delay") {
        replicas service{sim, {{.latency = 1s, .value = 1}}};
        auto result = call(service, {.max_attempts = 3,
                                     .delay = 100ms,
                                     .telemetry = rs::telemetry_listener{[&](const rs::telemetry_event& e) {
                                         if (e.kind == rs::telemetry_kind::hedge)
                                             stop_caller();
                                     }}});
        REQUIRE(result.has_failure());
        CHECK(rs::is_cancellation(result.error()));
        CHECK(service.starts() == std::vector<nanoseconds>{0ms});
        CHECK(sim.now() == 100ms);
    }
    SECTION("should_handle, on a failure, before a budget token is taken") {
        replicas service{sim, {{.latency = 10ms, .error = replica_failure(1)}}};
        const rs::retry_budget budget{{.capacity = 1.0}}; // full, so the call's deposit keeps it at 1
        auto result =
            call(service,
                 {.max_attempts = 3, .delay = 1s, .budget = budget, .should_handle = [&](const rs::failure&) {
                      stop_caller();
                      return true;
                  }});
        REQUIRE(result.has_failure());
        CHECK(rs::is_cancellation(result.error()));
        CHECK(service.calls() == 1);
        CHECK(budget.tokens() == 1.0); // no token taken for the attempt that did not start
        CHECK(sim.now() == 10ms);
    }
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("hedge: a caller already stopped is refused without running the action", "[hedge]") {
    simulation sim;
    replicas service{sim, {{.value = 1}}};
    resilience::stop_source caller;
    caller.request_stop();
    for (int max_attempts : {1, 3}) {
        rs::hedge h{{.max_attempts = max_attempts}, sim.clock()};
        auto result = sim.run(h.execute_outcome(service.action(), caller.get_token()));
        REQUIRE(result.has_failure());
        CHECK(rs::is_cancellation(result.error()));
    }
    CHECK(service.calls() == 0);
}

TEST_CASE("hedge: each extra attempt takes a budget token, and without one it does not start", "[hedge]") {
    simulation sim;
    rs::retry_budget budget{{.ratio = 0.1, .capacity = 1}};
    int hedges = 0;
    rs::hedge h{{.delay = 100ms, .budget = budget, .on_hedge = [&](const rs::hedge_event&) { ++hedges; }},
                sim.clock()};

    replicas first{sim, {{.latency = 1s, .value = 1}, {.latency = 50ms, .value = 2}}};
    CHECK(sim.run(h.execute(first.action())) == 2);
    CHECK(first.calls() == 2);
    CHECK(budget.granted() == 1);
    CHECK(budget.tokens() < 1.0);

    replicas second{sim, {{.latency = 1s, .value = 1}, {.latency = 50ms, .value = 2}}};
    const nanoseconds start = sim.now();
    CHECK(sim.run(h.execute(second.action())) == 1); // no token: the slow attempt stays alone
    CHECK(second.calls() == 1);
    CHECK(sim.now() - start == 1s);
    CHECK(budget.denied() == 1);
    CHECK(budget.calls() == 2); // each call through the hedge records itself
    CHECK(hedges == 1);
}

TEST_CASE("hedge: a budget refusal on a failure leaves that failure as the answer", "[hedge]") {
    simulation sim;
    rs::retry_budget budget{{.ratio = 0.1, .capacity = 1}};
    REQUIRE(budget.try_withdraw()); // empty
    const auto down = replica_failure(1);
    replicas service{sim, {{.latency = 30ms, .error = down}, {.value = 2}}};
    rs::hedge h{{.max_attempts = 3, .delay = 1s, .budget = budget}, sim.clock()};
    auto result = sim.run(h.execute_outcome(service.action()));
    REQUIRE(result.has_failure());
    CHECK(result.error().exception() == down);
    CHECK(service.calls() == 1);
    CHECK(sim.now() == 30ms);
}

TEST_CASE("hedge: with max_attempts 1 it is a plain call", "[hedge]") {
    simulation sim;
    replicas service{sim, {{.latency = 5s, .value = 1}, {.latency = 20ms, .error = replica_failure(2)}}};
    rs::hedge h{{.max_attempts = 1, .delay = 100ms}, sim.clock()};
    // Attempt 1 even when the context coming in is another policy's third attempt.
    CHECK(sim.run(h.execute(service.action(), rs::context{}.with_attempt(3))) == 1);
    CHECK(sim.now() == 5s);
    CHECK_THROWS_AS(sim.run(h.execute(service.action())), replica_error);
    CHECK(sim.now() == 5s + 20ms);
    CHECK(service.calls() == 2);
    CHECK(service[0].attempt == 1);
}

TEST_CASE("hedge: context::attempt() numbers the attempts 1, 2, ...", "[hedge]") {
    simulation sim;
    replicas service{sim, {{.latency = 1s, .value = 1}}};
    rs::hedge h{{.max_attempts = 3, .delay = 100ms}, sim.clock()};
    CHECK(sim.run(h.execute(service.action(), rs::context{}.with_attempt(7))) == 1);
    REQUIRE(service.calls() == 3);
    CHECK(service[0].attempt == 1);
    CHECK(service[1].attempt == 2);
    CHECK(service[2].attempt == 3);
}

TEST_CASE("hedge: a zero delay starts every attempt at once", "[hedge]") {
    simulation sim;
    replicas service{
        sim,
        {{.latency = 300ms, .value = 1}, {.latency = 100ms, .value = 2}, {.latency = 200ms, .value = 3}}};
    std::vector<heard> events;
    rs::hedge h{{.max_attempts = 3,
                 .delay = 0s,
                 .on_hedge =
                     [&](const rs::hedge_event& e) {
                         events.push_back({e.attempt(), e.reason(), e.error() != nullptr, sim.now()});
                     }},
                sim.clock()};
    CHECK(sim.run(h.execute(service.action())) == 2);
    CHECK(service.starts() == std::vector<nanoseconds>{0ms, 0ms, 0ms});
    CHECK(service.stops() == std::vector<nanoseconds>{100ms, never, 100ms});
    CHECK(events == std::vector<heard>{{2, rs::hedge_reason::delay, false, 0ms},
                                       {3, rs::hedge_reason::delay, false, 0ms}});
}

TEST_CASE("hedge: a delay of nanoseconds::max() hedges on failures only", "[hedge]") {
    simulation sim;
    rs::hedge h{{.delay = nanoseconds::max()}, sim.clock()};
    replicas slow{sim, {{.latency = 1h, .value = 1}}};
    CHECK(sim.run(h.execute(slow.action())) == 1);
    CHECK(slow.calls() == 1);
    CHECK(sim.now() == 1h);

    replicas flaky{sim, {{.latency = 300ms, .error = replica_failure(1)}, {.latency = 10ms, .value = 2}}};
    CHECK(sim.run(h.execute(flaky.action())) == 2);
    CHECK(flaky.starts() == std::vector<nanoseconds>{1h, 1h + 300ms});
}

TEST_CASE("hedge: an outcome classifier hedges on returned values too", "[hedge]") {
    simulation sim;
    rs::hedge h{{.max_attempts = 3,
                 .delay = 1s,
                 .should_handle = [](const rs::outcome<int>& o) { return !o || *o < 0; }},
                sim.clock()};
    replicas busy_then_ok{sim, {{.latency = 10ms, .value = -503}, {.latency = 10ms, .value = 7}}};
    CHECK(sim.run(h.execute(busy_then_ok.action())) == 7);
    CHECK(busy_then_ok.starts() == std::vector<nanoseconds>{0ms, 10ms});

    replicas always_busy{
        sim,
        {{.latency = 10ms, .value = -1}, {.latency = 10ms, .value = -2}, {.latency = 10ms, .value = -3}}};
    CHECK(sim.run(h.execute(always_busy.action())) == -3); // the last value it handled

    rs::hedge wrong_type{{.should_handle = [](const rs::outcome<long>&) { return true; }}, sim.clock()};
    replicas untouched{sim, {{.value = 1}}};
    auto mismatch = sim.run(wrong_type.execute_outcome(untouched.action()));
    REQUIRE(mismatch.has_failure());
    CHECK_THAT(
        mismatch.error().what(),
        Catch::Matchers::Contains("resilience::hedge: should_handle classifies rs::outcome<long> but the "
                                  "action returns int"));
    CHECK(untouched.calls() == 0);
}

TEST_CASE("hedge: a callback that throws ends the call with its exception, after stopping the attempts",
          "[hedge]") {
    simulation sim;
    SECTION("on_hedge") {
        replicas service{sim, {{.latency = 1s, .value = 1}}};
        rs::hedge h{{.delay = 300ms,
                     .on_hedge = [](const rs::hedge_event&) { throw std::runtime_error("observer"); }},
                    sim.clock()};
        auto result = sim.run(h.execute_outcome(service.action()));
        REQUIRE(result.has_failure());
        CHECK(result.error().what() == std::string("observer"));
        CHECK(service.calls() == 1);
        CHECK(service[0].stopped == 300ms);
        CHECK(sim.now() == 300ms);
    }
    SECTION("a delay schedule") {
        replicas service{sim, {{.latency = 1s, .value = 1}}};
        rs::hedge h{{.delay = [](int) -> nanoseconds { throw std::runtime_error("schedule"); }}, sim.clock()};
        auto result = sim.run(h.execute_outcome(service.action()));
        REQUIRE(result.has_failure());
        CHECK(result.error().what() == std::string("schedule"));
        CHECK(service[0].stopped == 0ms);
    }
    SECTION("should_handle") {
        replicas service{sim, {{.latency = 1s, .value = 1}, {.latency = 10ms, .error = replica_failure(2)}}};
        rs::hedge h{{.delay = 100ms,
                     .should_handle = [](const rs::failure&) -> bool { throw std::runtime_error("judge"); }},
                    sim.clock()};
        auto result = sim.run(h.execute_outcome(service.action()));
        REQUIRE(result.has_failure());
        CHECK(result.error().what() == std::string("judge"));
        CHECK(service[0].stopped == 110ms);
        CHECK(sim.now() == 110ms);
    }
}

TEST_CASE("hedge: in a pipeline, under a retry and over a per-attempt timeout", "[hedge]") {
    simulation sim;
    // Two calls that hang, then one that answers in 50 ms.
    replicas service{
        sim, {{.latency = 1h, .value = 1}, {.latency = 1h, .value = 2}, {.latency = 50ms, .value = 3}}};
    rs::retry_budget shared{{.ratio = 0.5, .capacity = 10}};
    rs::pipeline policy{
        rs::retry{
            {.max_attempts = 2, .backoff = rs::constant_backoff{0s, rs::jitter::none}, .budget = shared},
            sim.clock()},
        rs::hedge{{.max_attempts = 2, .delay = 100ms, .budget = shared}, sim.clock()},
        rs::timeout{250ms, sim.clock()},
    };
    CHECK(sim.run(policy.execute(service.action())) == 3);
    // The hedge's two attempts both time out (at 250 and 350 ms); the retry runs the hedge again.
    CHECK(service.starts() == std::vector<nanoseconds>{0ms, 100ms, 350ms});
    CHECK(service.stops() == std::vector<nanoseconds>{250ms, 350ms, never});
    CHECK(service[0].attempt == 1);
    CHECK(service[1].attempt == 2);
    CHECK(service[2].attempt == 1);
    CHECK(sim.now() == 400ms);
    CHECK(shared.granted() == 2); // one retry and one hedge drew from the same ceiling
}

TEST_CASE("hedge: options are validated at construction, naming the field and the value", "[hedge]") {
    CHECK_THAT(invalid_argument_message([] { rs::hedge h{{.max_attempts = 0}}; }),
               Catch::Matchers::Contains("resilience::hedge: max_attempts must be at least 1, got 0"));
    CHECK_THAT(
        invalid_argument_message([] { rs::hedge h{{.name = "reads", .delay = -5ms}}; }),
        Catch::Matchers::Contains("resilience::hedge (reads): delay must not be negative, got -5000000ns"));
    rs::hedge defaults{};
    CHECK(defaults.options().max_attempts == 2);
    CHECK(defaults.options().delay(1) == 2s);
    CHECK(defaults.name().empty());
    rs::hedge named{{.name = "reads"}};
    CHECK(named.name() == "reads");
    CHECK(rs::hedge_delay{[](int) { return -1s; }}(1) == 0s); // a schedule's negative answer is no wait
}

namespace {
// A clock with only what the `clock` concept asks for, so the hedge takes its generic path
// (sleepers beside the attempts) instead of arming a loop timer directly.
using minimal_clock = resilience_tests::loopless_clock;
} // namespace

TEST_CASE("hedge: with any clock, the same instants", "[hedge]") {
    simulation sim;
    SECTION("the delay, the winner, the loser stopped") {
        replicas service{sim,
                         {{.latency = 1s, .value = 1, .wind_down = 50ms}, {.latency = 100ms, .value = 2}}};
        rs::hedge h{{.delay = 300ms}, minimal_clock{sim.clock()}};
        CHECK(sim.run(h.execute(service.action())) == 2);
        CHECK(service.starts() == std::vector<nanoseconds>{0ms, 300ms});
        CHECK(service.stops() == std::vector<nanoseconds>{400ms, never});
        CHECK(sim.now() == 450ms);
    }
    SECTION("a failure re-arms the delay earlier than the one it replaces") {
        replicas service{sim,
                         {{.latency = 50ms, .error = replica_failure(1)},
                          {.latency = 1s, .value = 2},
                          {.latency = 10ms, .value = 3}}};
        rs::hedge h{{.max_attempts = 3, .delay = [](int started) { return started == 1 ? 1s : 100ms; }},
                    minimal_clock{sim.clock()}};
        CHECK(sim.run(h.execute(service.action())) == 3);
        CHECK(service.starts() == std::vector<nanoseconds>{0ms, 50ms, 150ms});
        CHECK(service[1].stopped == 160ms);
        CHECK(sim.now() == 160ms); // the 1 s sleeper was stopped, not waited out
    }
    SECTION("a caller's stop") {
        replicas service{sim, {{.latency = 10s, .value = 1}}};
        rs::hedge h{{.max_attempts = 4, .delay = 100ms}, minimal_clock{sim.clock()}};
        resilience::stop_source caller;
        auto [result, ignored] = sim.run(rs::when_all(h.execute_outcome(service.action(), caller.get_token()),
                                                      stop_at(sim, caller, 150ms)));
        (void)ignored;
        CHECK(rs::is_cancellation(result.error()));
        CHECK(service.stops() == std::vector<nanoseconds>{150ms, 150ms});
        CHECK(sim.now() == 150ms);
    }
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("hedge: through rs::any_clock, with loop timers and without", "[hedge]") {
    simulation sim;
    SECTION("holding the simulation's clock: a timer of the loop") {
        replicas service{sim, {{.latency = 1s, .value = 1}, {.latency = 100ms, .value = 2}}};
        rs::hedge h{{.delay = 300ms}, rs::any_clock{sim.clock()}};
        CHECK(sim.run(h.execute(service.action())) == 2);
        CHECK(service.starts() == std::vector<nanoseconds>{0ms, 300ms});
        CHECK(sim.now() == 400ms);
    }
    SECTION("holding a clock without loop timers: sleepers") {
        REQUIRE(rs::any_clock{minimal_clock{sim.clock()}}.timer_loop() == nullptr);
        replicas service{sim, {{.latency = 1s, .value = 1}, {.latency = 100ms, .value = 2}}};
        rs::hedge h{{.delay = 300ms}, rs::any_clock{minimal_clock{sim.clock()}}};
        CHECK(sim.run(h.execute(service.action())) == 2);
        CHECK(service.starts() == std::vector<nanoseconds>{0ms, 300ms});
        CHECK(sim.now() == 400ms);
    }
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("hedge: an answer at the very instant of the delay wins alone", "[hedge]") {
    simulation sim;
    replicas service{sim, {{.latency = 100ms, .value = 1}}};
    rs::hedge h{{.delay = 100ms}, sim.clock()};
    // The attempt's timer was armed before the hedge's: at one instant, timers fire in arming order.
    CHECK(sim.run(h.execute(service.action())) == 1);
    CHECK(service.calls() == 1);
    CHECK(sim.now() == 100ms);
    CHECK(sim.loop().timers() == 0);
}

#ifdef RESILIENCE_TESTS_COUNT_ALLOCATIONS
TEST_CASE("hedge: the success path allocates nothing after warm-up", "[hedge][alloc]") {
    simulation sim;
    const rs::hedge h{{.max_attempts = 3, .delay = 1s}, sim.clock()};
    // Answers after 10 ms, asking for its stop token: the hedge arms its timer and disarms it.
    auto replica = [&](resilience::stop_token st) -> rs::task<int> {
        co_await sim.sleep_for(10ms, st);
        co_return 1;
    };
    auto at_once = []() -> rs::task<int> { co_return 1; };
    std::size_t allocations = 0;
    int sum = 0;
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 50; ++i)
            sum += co_await h.execute(replica) + co_await h.execute(at_once); // warm-up: frames, pools
        resilience_tests::counting_allocations counting;
        for (int i = 0; i < 500; ++i)
            sum += co_await h.execute(replica) + co_await h.execute(at_once);
        allocations = counting.count();
    }());
    CHECK(sum == 1100);
    CHECK(allocations == 0);
    CHECK(sim.now() == 5500ms);
    CHECK(sim.loop().timers() == 0);
}
#endif

namespace {
// Resumes the awaiting coroutine on a thread of its own; joins them all on destruction.
class thread_hops {
public:
    thread_hops() = default;
    thread_hops(const thread_hops&) = delete;
    thread_hops& operator=(const thread_hops&) = delete;
    ~thread_hops() {
        std::lock_guard lock(mutex_);
        for (auto& t : threads_)
            t.join();
    }
    auto hop() {
        struct awaiter {
            thread_hops* self;
            bool await_ready() const noexcept { return false; }
            void await_suspend(std::coroutine_handle<> h) {
                std::lock_guard lock(self->mutex_);
                self->threads_.emplace_back([h] { h.resume(); });
            }
            void await_resume() const noexcept {}
        };
        return awaiter{this};
    }

private:
    std::mutex mutex_;
    std::vector<std::thread> threads_;
};
} // namespace

TEST_CASE("hedge: attempts that finish on other threads, and the hedge carries on on its own loop",
          "[hedge][concurrency]") {
    const rs::hedge h{{.max_attempts = 3, .delay = 0s}};
    std::atomic<int> stopped{0};
    int wrong_thread = 0, wrong_value = 0;
    {
        thread_hops hops;
        rs::event_loop loop;
        loop.run([&]() -> rs::task<void> {
            const auto loop_thread = std::this_thread::get_id();
            // The first attempt waits to be stopped; the two others answer from threads of their own.
            auto replica = [&](const rs::context& ctx) -> rs::task<int> {
                if (ctx.attempt() == 1) {
                    try {
                        co_await resilience_tests::resumed_by_stop{ctx.stop_token()};
                    } catch (const rs::cancelled_error&) {
                        ++stopped;
                        throw;
                    }
                }
                co_await hops.hop();
                co_return ctx.attempt();
            };
            for (int i = 0; i < 100; ++i) {
                const int v = co_await h.execute(replica);
                wrong_thread += std::this_thread::get_id() != loop_thread;
                wrong_value += v != 2 && v != 3;
            }
        }());
        CHECK(loop.timers() == 0);
    }
    CHECK(wrong_thread == 0);
    CHECK(wrong_value == 0);
    CHECK(stopped == 100);
}

TEST_CASE("hedge: one hedge shared by calls on two loops and threads", "[hedge][concurrency]") {
    const rs::hedge h{{.max_attempts = 2, .delay = 0s}};
    thread_hops hops;
    std::atomic<int> answers{0};
    auto calls = [&]() -> rs::task<void> {
        auto replica = [&](const rs::context& ctx) -> rs::task<int> {
            co_await hops.hop();
            co_return ctx.attempt();
        };
        for (int i = 0; i < 100; ++i) {
            const int v = co_await h.execute(replica);
            answers += v == 1 || v == 2;
        }
    };
    rs::event_loop a, b;
    a.spawn(calls());
    b.spawn(calls());
    resilience_tests::run_on_threads(a, b);
    CHECK(answers == 200);
}

} // namespace test_hedge
