// SPDX-License-Identifier: MIT
// What a pipeline does with an exception that a stage lets out of the protocol's functions that do
// not wait (`enter`, `leave`, `again`): a clock whose reading throws, or a policy of the user's that
// breaks the rule that they put failures in the result. The call ends with it as its failure,
// `execute_outcome` returns it, `execute` throws it, and the stages outside still leave.
#include "catch.hpp"

#include <resilience/bulkhead.hpp>
#include <resilience/circuit_breaker.hpp>
#include <resilience/hedge.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/policy_kit.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/retry.hpp>
#include <resilience/retry_budget.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <coroutine>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace test_stage_throws {

namespace rs = resilience;
using namespace std::chrono_literals;

// A virtual clock with loop timers whose reading throws once `broken` is set.
struct breaking_clock {
    using duration = rs::testing::virtual_clock::duration;
    using time_point = rs::testing::virtual_clock::time_point;
    rs::testing::virtual_clock inner;
    std::shared_ptr<bool> broken = std::make_shared<bool>(false);
    time_point now() const {
        if (*broken)
            throw std::runtime_error("clock broke");
        return inner.now();
    }
    auto sleep_until(time_point tp, rs::stop_token token) const {
        return inner.sleep_until(tp, std::move(token));
    }
    rs::event_loop* timer_loop() const noexcept { return inner.timer_loop(); }
};
static_assert(rs::clock<breaking_clock> && rs::detail::loop_timer_clock<breaking_clock>);

// What the probes saw, in order: "<name> enter", "<name> leave: <what the outcome was>".
using journal = std::vector<std::string>;

std::string what_of(const rs::outcome<int>& r) {
    if (r.has_value())
        return std::to_string(r.value());
    const auto* e = r.error().as<std::exception>();
    return e ? e->what() : "?";
}

// A stage that logs its `enter` and its `leave` (with the outcome it was given), and may throw from
// either (or from `again`), as no policy should.
enum class throws_in { nothing, enter, leave, again };
class probe : public rs::policy_base<probe> {
public:
    probe(std::string name, journal& log, throws_in where = throws_in::nothing)
        : name_(std::move(name)), log_(&log), where_(where) {}

    static constexpr bool enter_never_waits = true;
    // Counts how many were made and destroyed, to show each is destroyed once.
    struct call_state {
        call_state() noexcept { ++made; }
        ~call_state() { ++destroyed; }
        call_state(const call_state&) = delete;
        call_state& operator=(const call_state&) = delete;
    };
    static inline int made = 0;
    static inline int destroyed = 0;

    template <class R>
    rs::step enter(call_state&, const rs::context&, std::optional<rs::outcome<R>>&) const {
        log_->push_back(name_ + " enter");
        if (where_ == throws_in::enter)
            throw std::runtime_error(name_ + "'s enter threw");
        return rs::step::proceed;
    }
    template <class R>
    rs::step leave(call_state&, const rs::context&, rs::outcome<R>& result) const {
        log_->push_back(name_ + " leave: " + what_of(result));
        if (where_ == throws_in::leave)
            throw std::runtime_error(name_ + "'s leave threw");
        return where_ == throws_in::again ? rs::step::wait : rs::step::proceed;
    }
    // With `throws_in::again` only, after a `leave` that waited.
    template <class R>
    rs::entry again(call_state&, const rs::context&, rs::outcome<R>&) const {
        log_->push_back(name_ + " again");
        throw std::runtime_error(name_ + "'s again threw");
    }
    template <class R>
    struct frame_wait { // never awaited here: `again` never sends the stages round
        frame_wait(const probe&, call_state&, const rs::context&, std::optional<rs::outcome<R>>&) {}
        bool await_ready() const noexcept { return true; }
        void await_suspend(std::coroutine_handle<>) const noexcept {}
        rs::step await_resume() const noexcept { return rs::step::proceed; }
    };

private:
    std::string name_;
    journal* log_;
    throws_in where_;
};
static_assert(rs::policy<probe>);
// A policy of the waiting form whose `run` is no coroutine, and throws before it makes its task.
class throws_before_its_task : public rs::policy_base<throws_before_its_task> {
public:
    template <class Next>
    rs::task<rs::next_outcome_t<Next>> run(Next, const rs::context&) const {
        throw std::runtime_error("run threw");
    }
};
static_assert(rs::policy<throws_before_its_task>);

// A fast policy whose `enter` waits, and whose `waits_in_frame` (asked where it waits) throws.
class asked_where_it_waits_throws : public rs::policy_base<asked_where_it_waits_throws> {
public:
    struct call_state {};
    template <class R>
    rs::step enter(call_state&, const rs::context&, std::optional<rs::outcome<R>>&) const {
        return rs::step::wait;
    }
    template <class R>
    rs::step leave(call_state&, const rs::context&, rs::outcome<R>&) const noexcept {
        return rs::step::proceed;
    }
    bool waits_in_frame(const rs::context&) const { throw std::runtime_error("waits_in_frame threw"); }
    template <class R>
    struct frame_wait { // never made: the pipeline asks where to wait first
        frame_wait(const asked_where_it_waits_throws&, call_state&, const rs::context&,
                   std::optional<rs::outcome<R>>&) {}
        bool await_ready() const noexcept { return true; }
        void await_suspend(std::coroutine_handle<>) const noexcept {}
        rs::step await_resume() const noexcept { return rs::step::proceed; }
    };
    template <class Next>
    rs::task<rs::next_outcome_t<Next>> run(Next next, const rs::context& ctx) const {
        co_return co_await next(ctx);
    }
};
static_assert(rs::policy<asked_where_it_waits_throws>);

// Which functions the pipeline guards: those not declared noexcept.
static_assert(!rs::detail::enter_nothrow<probe, rs::outcome<int>>);
static_assert(!rs::detail::leave_nothrow<probe, rs::outcome<int>>);
static_assert(
    rs::detail::leave_nothrow<rs::hedge<>, rs::outcome<int>>); // leave(..., const outcome&) noexcept
static_assert(rs::detail::leave_nothrow<rs::rate_limiter<>, rs::outcome<int>>);

TEST_CASE("stage throws: a clock whose reading throws ends the call with that exception, and the stages "
          "outside leave with it",
          "[pipeline][timeout][rate_limiter][clock]") {
    rs::testing::simulation sim;
    const breaking_clock clock{sim.clock()};
    journal log;
    const rs::bulkhead outer_slots{{.max_concurrent_calls = 1}, sim.clock()};
    int ran = 0;
    const auto action = [&ran]() -> rs::task<int> {
        ++ran;
        co_return 1;
    };
    const auto through = [&](const auto& reads_the_clock) {
        const rs::pipeline p{outer_slots, probe{"outer", log}, reads_the_clock, probe{"inner", log}};
        CHECK(sim.run(p.execute(action)) == 1); // the clock works: the call runs
        *clock.broken = true;
        log.clear();
        CHECK(what_of(sim.run(p.execute_outcome(action))) == "clock broke");
        CHECK(log == journal{"outer enter", "outer leave: clock broke"}); // nothing inside was entered
        CHECK_THROWS_WITH(sim.run(p.execute(action)), "clock broke");
        *clock.broken = false;
        CHECK(ran == 1);
        CHECK(outer_slots.in_flight() == 0); // the stages outside gave back what they took
        CHECK(sim.loop().timers() == 0);
    };
    SECTION("a timeout arming its deadline") {
        through(rs::timeout{1s, clock});
    }
    SECTION("a token bucket refilling") {
        through(rs::rate_limiter{{.token_limit = 10, .tokens_per_second = 10}, clock});
    }
    SECTION("a sliding window counting") {
        through(rs::sliding_window_limiter{{.permit_limit = 10, .window = 1s}, clock});
    }
}

TEST_CASE("stage throws: an enter, a run that is no coroutine (before its task) or a waits_in_frame that "
          "throws refuses the call with what it threw: the stages outside leave, the ones inside never run",
          "[pipeline]") {
    rs::testing::simulation sim;
    journal log;
    const rs::bulkhead slots{{.max_concurrent_calls = 1}, sim.clock()};
    int ran = 0;
    const auto action = [&ran]() -> rs::task<int> {
        ++ran;
        co_return 1;
    };
    // `own`: what the throwing stage logs itself.
    const auto refuses = [&](const auto& throwing, const std::string& thrown, const journal& own) {
        log.clear();
        const rs::pipeline p{slots, probe{"a", log}, throwing, probe{"c", log}};
        CHECK(what_of(sim.run(p.execute_outcome(action))) == thrown);
        journal expected{"a enter"};
        expected.insert(expected.end(), own.begin(), own.end());
        expected.push_back("a leave: " + thrown); // its own leave is not called
        CHECK(log == expected);
        CHECK_THROWS_WITH(sim.run(p.execute(action)), thrown);
        CHECK(ran == 0);
        CHECK(slots.in_flight() == 0);
    };
    SECTION("enter") {
        refuses(probe{"b", log, throws_in::enter}, "b's enter threw", {"b enter"});
    }
    SECTION("run") {
        refuses(throws_before_its_task{}, "run threw", {});
    }
    SECTION("waits_in_frame") {
        refuses(asked_where_it_waits_throws{}, "waits_in_frame threw", {});
    }
}

TEST_CASE("stage throws: an enter that throws is the call's failure to the stages outside: a breaker counts "
          "it, a retry retries it, and each attempt's state is destroyed once",
          "[pipeline][retry][circuit_breaker]") {
    rs::testing::simulation sim;
    journal log;
    const auto action = []() -> rs::task<int> { co_return 1; };
    SECTION("a breaker outside opens on it") {
        const rs::circuit_breaker breaker{{.failure_threshold = 2}, sim.clock()};
        const rs::pipeline p{breaker, probe{"b", log, throws_in::enter}};
        CHECK(what_of(sim.run(p.execute_outcome(action))) == "b's enter threw");
        CHECK(breaker.state() == rs::circuit_state::closed);
        CHECK(what_of(sim.run(p.execute_outcome(action))) == "b's enter threw");
        CHECK(breaker.state() == rs::circuit_state::open);
    }
    SECTION("a retry outside makes its attempts, each with a state of its own") {
        probe::made = probe::destroyed = 0;
        const rs::pipeline p{
            rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{0ms}}, sim.clock()},
            probe{"b", log, throws_in::enter}};
        CHECK(what_of(sim.run(p.execute_outcome(action))) == "b's enter threw");
        CHECK(log == journal{"b enter", "b enter", "b enter"}); // three attempts, no leave
        CHECK(probe::made == 3);
        CHECK(probe::destroyed == 3);
    }
}

TEST_CASE("stage throws: a retry whose clock throws as it notes the call's start counts no call against its "
          "budget",
          "[retry][retry_budget][clock]") {
    rs::testing::simulation sim;
    const breaking_clock clock{sim.clock()};
    const rs::retry_budget budget{{.ratio = 0.5, .capacity = 10}};
    const rs::retry retry{{.max_elapsed = 1s, .budget = budget}, clock};
    const auto action = []() -> rs::task<int> { co_return 1; };
    CHECK(sim.run(retry.execute(action)) == 1);
    CHECK(budget.calls() == 1);
    *clock.broken = true;
    CHECK(what_of(sim.run(retry.execute_outcome(action))) == "clock broke");
    CHECK(budget.calls() == 1);
}

TEST_CASE("stage throws: a clock whose reading throws spends no token of a rate limiter",
          "[rate_limiter][clock]") {
    rs::testing::simulation sim;
    const breaking_clock clock{sim.clock()};
    const rs::rate_limiter limiter{{.token_limit = 2, .tokens_per_second = 1}, clock};
    const auto action = []() -> rs::task<int> { co_return 1; };
    CHECK(sim.run(limiter.execute(action)) == 1);
    *clock.broken = true;
    CHECK(what_of(sim.run(limiter.execute_outcome(action))) == "clock broke");
    *clock.broken = false;
    CHECK(sim.run(limiter.execute(action)) == 1); // the second token, still there
    CHECK(sim.now() == 0ms);
}

TEST_CASE("stage throws: a leave or an again that throws makes what it threw the call's outcome, and the "
          "stages outside leave with it",
          "[pipeline]") {
    rs::testing::simulation sim;
    const rs::bulkhead slots{{.max_concurrent_calls = 1}, sim.clock()};
    const auto action = []() -> rs::task<int> { co_return 1; };
    for (const throws_in where : {throws_in::leave, throws_in::again}) {
        const bool in_leave = where == throws_in::leave;
        CAPTURE(in_leave);
        journal log;
        const rs::pipeline p{slots, probe{"a", log}, probe{"b", log, where}, probe{"c", log}};
        const std::string thrown = in_leave ? "b's leave threw" : "b's again threw";
        CHECK(what_of(sim.run(p.execute_outcome(action))) == thrown);
        journal expected{"a enter", "b enter", "c enter", "c leave: 1", "b leave: 1"};
        if (!in_leave)
            expected.push_back("b again");
        expected.push_back("a leave: " + thrown);
        CHECK(log == expected);
        CHECK_THROWS_WITH(sim.run(p.execute(action)), thrown);
        CHECK(slots.in_flight() == 0);
    }
}

} // namespace test_stage_throws
