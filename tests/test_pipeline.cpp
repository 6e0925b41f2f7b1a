// SPDX-License-Identifier: MIT
#include "catch.hpp"
#include "support.hpp"

#include <resilience/bulkhead.hpp>
#include <resilience/circuit_breaker.hpp>
#include <resilience/hedge.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/policy_kit.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/retry.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <algorithm>
#include <atomic>
#include <coroutine>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace test_pipeline {

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {
// A policy that records when calls pass through it, to observe the nesting order.
class recorder : public rs::policy_base<recorder> {
public:
    recorder(std::string name, std::vector<std::string>& log) : name_(std::move(name)), log_(&log) {}
    template <class Next>
    rs::task<rs::next_outcome_t<Next>> run(Next next, const rs::context& ctx) const {
        log_->push_back(name_ + " enter");
        auto result = co_await next(ctx);
        log_->push_back(name_ + " leave");
        co_return result;
    }

private:
    std::string name_;
    std::vector<std::string>* log_;
};
} // namespace

static_assert(rs::policy<recorder>);
static_assert(rs::policy<rs::pipeline<recorder, rs::timeout<>>>);

TEST_CASE("pipeline: the first policy listed is the outermost", "[pipeline]") {
    std::vector<std::string> log;
    rs::pipeline p{recorder{"a", log}, recorder{"b", log}, recorder{"c", log}};
    int v = rs::sync_wait(p.execute([&]() -> rs::task<int> {
        log.push_back("action");
        co_return 5;
    }));
    CHECK(v == 5);
    CHECK(log == std::vector<std::string>{"a enter", "b enter", "c enter", "action", "c leave", "b leave",
                                          "a leave"});
}

TEST_CASE("pipeline: a pipeline is a policy, so pipelines nest", "[pipeline]") {
    std::vector<std::string> log;
    rs::pipeline inner{recorder{"b", log}, recorder{"c", log}};
    rs::pipeline outer{recorder{"a", log}, inner};
    rs::sync_wait(outer.execute([&]() -> rs::task<void> {
        log.push_back("action");
        co_return;
    }));
    CHECK(log == std::vector<std::string>{"a enter", "b enter", "c enter", "action", "c leave", "b leave",
                                          "a leave"});
}

TEST_CASE("pipeline: failures pass outward unchanged and execute_outcome does not throw", "[pipeline]") {
    std::vector<std::string> log;
    rs::pipeline p{recorder{"a", log}, recorder{"b", log}};
    // Thrown from inside the coroutine, after it started...
    auto result = rs::sync_wait(p.execute_outcome([]() -> rs::task<int> {
        throw std::runtime_error("dependency down");
        co_return 0;
    }));
    REQUIRE(result.has_failure());
    CHECK(result.error().what() == std::string("dependency down"));
    CHECK(log.back() == "a leave");

    // ...or by an action that throws when called, before it returns any awaitable.
    auto refused =
        rs::sync_wait(p.execute_outcome([]() -> rs::task<int> { throw std::runtime_error("no socket"); }));
    REQUIRE(refused.has_failure());
    CHECK(refused.error().what() == std::string("no socket"));
}

TEST_CASE("pipeline: the action may take a context, a stop token or nothing", "[pipeline]") {
    rs::testing::simulation sim;
    rs::pipeline p{rs::timeout{1s, sim.clock()}};
    CHECK(sim.run(p.execute([](const rs::context& c) -> rs::task<int> { co_return c.attempt(); })) == 1);
    CHECK(
        sim.run(p.execute([](resilience::stop_token t) -> rs::task<bool> { co_return t.stop_possible(); })));
    CHECK(sim.run(p.execute([]() -> rs::task<int> { co_return 3; })) == 3);
}

TEST_CASE("pipeline: a coroutine lambda is kept alive for the whole call", "[pipeline]") {
    rs::testing::simulation sim;
    rs::pipeline p{rs::timeout{1s, sim.clock()}};
    // The caller's lambda object dies before the call runs, but execute holds its own copy until
    // the call ends, so the capture is still there after the suspension.
    std::optional<rs::task<std::size_t>> call;
    {
        const auto action = [text = std::string(100, 'x'), &sim]() -> rs::task<std::size_t> {
            co_await sim.sleep_for(10ms);
            co_return text.size();
        };
        call.emplace(p.execute(action));
    }
    CHECK(sim.run(std::move(*call)) == 100);
#if !RESILIENCE_DETAIL_REFUSE_TEMPORARY_CLOSURES
    // The same with a temporary, which dies at the end of the full expression. (g++ before 13
    // refuses it: see docs/core.md#compiler-notes.)
    auto temporary = p.execute([text = std::string(100, 'x'), &sim]() -> rs::task<std::size_t> {
        co_await sim.sleep_for(10ms);
        co_return text.size();
    });
    CHECK(sim.run(std::move(temporary)) == 100);
#endif
}

namespace {
// The shapes [expr.await] allows beyond the usual task: await_suspend returning a typed handle, and
// an operator co_await that hands back an awaiter living inside the awaitable.
struct typed_handle_awaiter {
    bool await_ready() const noexcept { return false; }
    std::noop_coroutine_handle await_suspend(std::coroutine_handle<> h) {
        rs::event_loop::current()->post(h); // resumed by the loop; a typed handle goes back
        return std::noop_coroutine();
    }
    int await_resume() const noexcept { return 7; }
};
struct awaiter_by_reference {
    struct inner {
        bool await_ready() const noexcept { return true; }
        void await_suspend(std::coroutine_handle<>) const noexcept {}
        int await_resume() const noexcept { return 8; }
    } awaiter;
    inner& operator co_await() && noexcept { return awaiter; }
};
} // namespace

TEST_CASE("pipeline: actions may return any awaitable shape the language allows", "[pipeline]") {
    rs::testing::simulation sim;
    rs::pipeline p{rs::timeout{1s, sim.clock()}};
    CHECK(sim.run(p.execute([] { return typed_handle_awaiter{}; })) == 7);
    CHECK(sim.run(p.execute([] { return awaiter_by_reference{}; })) == 8);
}

namespace {
// The fast form of the protocol (docs/pipeline.md): logs enter and leave; with `again` set, a
// failed call goes on in `resume`, which runs the inner stages once more.
class fast_recorder : public rs::policy_base<fast_recorder> {
public:
    fast_recorder(std::string name, std::vector<std::string>& log, bool again = false)
        : name_(std::move(name)), log_(&log), again_(again) {}

    struct call_state {
        int entered = 0;
    };
    static constexpr bool enter_never_waits = true;

    template <class R>
    rs::step enter(call_state& s, const rs::context& ctx, std::optional<rs::outcome<R>>& result) const {
        if (ctx.stop_requested()) {
            result.emplace(rs::failure::make(rs::cancelled_error{}));
            return rs::step::done;
        }
        ++s.entered;
        log_->push_back(name_ + " enter");
        return rs::step::proceed;
    }
    template <class R>
    rs::step leave(call_state& s, const rs::context&, rs::outcome<R>& result) const {
        log_->push_back(name_ + " leave");
        return again_ && !result && s.entered == 1 ? rs::step::wait : rs::step::proceed;
    }
    template <class Next, class R>
    rs::task<rs::outcome<R>> resume(call_state& s, Next next, const rs::context& ctx, rs::outcome<R>) const {
        ++s.entered;
        log_->push_back(name_ + " again");
        co_return co_await next(ctx);
    }

private:
    std::string name_;
    std::vector<std::string>* log_;
    bool again_;
};

// The example of docs/pipeline.md, as written there.
class count_failures : public rs::policy_base<count_failures> {
public:
    explicit count_failures(std::shared_ptr<std::atomic<int>> n) : failures_(std::move(n)) {}

    struct call_state {};
    static constexpr bool enter_never_waits = true; // enter answers proceed or done, never wait

    template <class R>
    rs::step enter(call_state&, const rs::context& ctx, std::optional<rs::outcome<R>>& result) const {
        if (ctx.stop_requested()) { // refuse: say why in `result`
            result.emplace(rs::failure::make(rs::cancelled_error{}));
            return rs::step::done;
        }
        return rs::step::proceed; // admitted: the inner policies run next
    }

    template <class R>
    rs::step leave(call_state&, const rs::context&, rs::outcome<R>& result) const {
        if (!result)
            failures_->fetch_add(1, std::memory_order_relaxed);
        return rs::step::proceed; // done here: carry on outward
    }

private:
    std::shared_ptr<std::atomic<int>> failures_;
};

// A steady clock on a simulation that counts its readings.
struct counting_clock {
    using duration = rs::testing::virtual_clock::duration;
    using time_point = rs::testing::virtual_clock::time_point;
    rs::testing::virtual_clock inner;
    std::shared_ptr<int> reads = std::make_shared<int>(0);
    time_point now() const noexcept {
        ++*reads;
        return inner.now();
    }
    auto sleep_until(time_point tp, resilience::stop_token token) const noexcept {
        return inner.sleep_until(tp, token);
    }
    rs::event_loop* timer_loop() const noexcept { return inner.timer_loop(); }
};
} // namespace

static_assert(rs::policy<fast_recorder>);
static_assert(rs::policy<count_failures>);
static_assert(rs::policy<rs::pipeline<fast_recorder, recorder, fast_recorder>>);

TEST_CASE("pipeline: fast and waiting policies keep their order when mixed", "[pipeline]") {
    std::vector<std::string> log;
    rs::pipeline p{fast_recorder{"a", log}, recorder{"b", log}, fast_recorder{"c", log},
                   rs::pipeline{fast_recorder{"d", log}, recorder{"e", log}}};
    int v = rs::sync_wait(p.execute([&]() -> rs::task<int> {
        log.push_back("action");
        co_return 5;
    }));
    CHECK(v == 5);
    CHECK(log == std::vector<std::string>{"a enter", "b enter", "c enter", "d enter", "e enter", "action",
                                          "e leave", "d leave", "c leave", "b leave", "a leave"});
}

namespace {
// An action that logs each call and fails the first, then returns 9.
auto fails_first_time(std::vector<std::string>& log, int& calls) {
    return [&log, &calls]() -> rs::task<int> {
        log.push_back("action");
        if (++calls == 1)
            throw std::runtime_error("first");
        co_return 9;
    };
}
} // namespace

TEST_CASE("pipeline: a fast policy that goes on in resume runs the stages inside it again", "[pipeline]") {
    std::vector<std::string> log;
    rs::pipeline p{fast_recorder{"outer", log, true}, fast_recorder{"inner", log}};
    int calls = 0;
    int v = rs::sync_wait(p.execute(fails_first_time(log, calls)));
    CHECK(v == 9);
    CHECK(log == std::vector<std::string>{"outer enter", "inner enter", "action", "inner leave",
                                          "outer leave", "outer again", "inner enter", "action",
                                          "inner leave"});
}

TEST_CASE(
    "pipeline: a stage that goes on in resume inside a waiting one runs only the stages inside it again",
    "[pipeline]") {
    std::vector<std::string> log;
    rs::pipeline p{fast_recorder{"a", log}, recorder{"b", log}, fast_recorder{"c", log, true},
                   fast_recorder{"d", log}};
    int calls = 0;
    auto r = rs::sync_wait(p.execute_outcome(fails_first_time(log, calls)));
    CHECK(r.value() == 9);
    CHECK(log == std::vector<std::string>{"a enter", "b enter", "c enter", "d enter", "action", "d leave",
                                          "c leave", "c again", "d enter", "action", "d leave", "b leave",
                                          "a leave"});
}

TEST_CASE("pipeline: a refusal in enter reaches execute_outcome as a value and skips the inner stages",
          "[pipeline]") {
    std::vector<std::string> log;
    auto failures = std::make_shared<std::atomic<int>>(0);
    rs::pipeline p{fast_recorder{"a", log}, count_failures{failures}, fast_recorder{"b", log}};
    resilience::stop_source stop;
    stop.request_stop();
    bool ran = false;
    auto r = rs::sync_wait(p.execute_outcome(
        [&]() -> rs::task<int> {
            ran = true;
            co_return 1;
        },
        stop.get_token()));
    REQUIRE(r.has_failure());
    CHECK(r.error().code() == rs::errc::cancelled);
    CHECK_FALSE(ran);
    CHECK(log.empty()); // the outermost refused first
    auto failed =
        rs::sync_wait(p.execute_outcome([]() -> rs::task<int> { throw std::runtime_error("down"); }));
    CHECK(failed.has_failure());
    CHECK(failures->load() == 1);
    CHECK(log == std::vector<std::string>{"a enter", "b enter", "b leave", "a leave"});
}

namespace {
rs::task<std::string> greet(std::string who, int times, resilience::stop_token token) {
    std::string s;
    for (int i = 0; i < times; ++i)
        s += who;
    co_return token.stop_possible() ? s + "!" : s;
}
rs::task<int> attempt_of(int offset, const rs::context& ctx) {
    co_return offset + ctx.attempt();
}
rs::task<int> plain(int v) {
    co_return v;
}
} // namespace

TEST_CASE("pipeline: execute(f, args...) calls f with copies of the arguments, then the attempt's token",
          "[pipeline]") {
    rs::testing::simulation sim;
    rs::pipeline p{rs::timeout{1s, sim.clock()}};
    std::string who = "ab";
    CHECK(sim.run(p.execute(greet, who, 2)) == "abab!");
    CHECK(sim.run(p.execute(plain, 7)) == 7);
    auto outcome = sim.run(p.execute_outcome(plain, 8));
    CHECK(outcome.value() == 8);
}

TEST_CASE("pipeline: execute(f, args..., token) takes the trailing token as the caller's", "[pipeline]") {
    rs::testing::simulation sim;
    rs::retry r{{.max_attempts = 3, .backoff = rs::constant_backoff{0ms}}, sim.clock()};
    resilience::stop_source caller;
    caller.request_stop();
    auto refused = sim.run(r.execute_outcome(greet, std::string("x"), 1, caller.get_token()));
    REQUIRE(refused.has_failure());
    CHECK(refused.error().code() == rs::errc::cancelled);
}

namespace {
// Counts the live copies of an action's state and the copies made: an action holds one while the
// call runs, and none once it has ended.
struct tally {
    int live = 0;
    int copies = 0;
};
struct counted {
    tally* t;
    explicit counted(tally& to) noexcept : t(&to) { ++t->live; }
    counted(const counted& o) noexcept : t(o.t) {
        ++t->live;
        ++t->copies;
    }
    counted(counted&& o) noexcept : t(o.t) { ++t->live; }
    counted& operator=(const counted&) = delete;
    ~counted() { --t->live; }
};
// Actions with constructors (g++ 12 refuses a moved closure that owns something; see
// docs/core.md#compiler-notes): one that fits the erased storage, one far larger.
struct small_action {
    counted c;
    int* attempts;
    small_action(tally& t, int& n) : c(t), attempts(&n) {}
    rs::task<int> operator()(rs::stop_token) const {
        if (++*attempts < 2)
            throw std::runtime_error("again");
        co_return c.t->live;
    }
};
struct large_action {
    counted c;
    std::string pad = std::string(40, 'p');
    std::string more = std::string(40, 'q');
    int* attempts;
    large_action(tally& t, int& n) : c(t), attempts(&n) {}
    rs::task<std::size_t> operator()() const {
        if (++*attempts < 4)
            throw std::runtime_error("again");
        co_return pad.size() + more.size();
    }
};
} // namespace

// An action is kept in the call's frame whatever its size and whether copying it is trivial (small
// ones with their type erased, detail::erased_action; large ones as they are): each must be called
// at every attempt with the state it was given, moved in and never copied, and destroyed with the call.
TEST_CASE("pipeline: an action of any size is moved into the call, called at every attempt and destroyed "
          "with the call",
          "[pipeline]") {
    rs::testing::simulation sim;
    rs::pipeline p{rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{5ms}}, sim.clock()},
                   rs::timeout{1s, sim.clock()}};
    SECTION("trivially copyable, no capture") {
        int attempts = 0;
        CHECK(sim.run(p.execute([]() -> rs::task<int> { co_return 7; })) == 7);
        CHECK(sim.run(p.execute([&attempts]() -> rs::task<int> {
            if (++attempts < 3)
                throw std::runtime_error("again");
            co_return attempts;
        })) == 3);
    }
    SECTION("with a destructor, small and large") {
        tally small_state;
        tally large_state;
        int attempts = 0;
        {
            small_action small{small_state, attempts};
            large_action large{large_state, attempts};
            auto first = p.execute(std::move(small));
            auto second = p.execute(std::move(large));
            // The caller's moved-from objects and the calls' own: nothing was copied.
            CHECK(small_state.live == 2);
            CHECK(large_state.live == 2);
            CHECK(sim.run(std::move(first)) == 2); // the caller's moved-from one and the call's
            CHECK(small_state.live == 1);          // the call ended: its own is gone
            CHECK(sim.run(std::move(second)) == 80u);
            CHECK(large_state.live == 1);
        }
        CHECK(small_state.live == 0);
        CHECK(large_state.live == 0);
        CHECK(small_state.copies == 0);
        CHECK(large_state.copies == 0);
        CHECK(attempts == 4);
    }
    SECTION("execute(f, args...) with an argument that owns memory") {
        tally state;
        {
            const auto f = [](const counted& c, const std::string& s) -> rs::task<std::size_t> {
                co_return s.size() + static_cast<std::size_t>(c.t->live);
            };
            auto call = p.execute(f, counted{state}, std::string(30, 'z'));
            CHECK(state.live == 1);
            CHECK(sim.run(std::move(call)) == 31u);
            CHECK(state.live == 0);
        }
        CHECK(state.copies == 0);
    }
}

TEST_CASE("pipeline: execute(f, args...) keeps the arguments for every attempt of a retry", "[pipeline]") {
    rs::testing::simulation sim;
    rs::retry r{{.max_attempts = 3, .backoff = rs::constant_backoff{0ms}}, sim.clock()};
    int calls = 0;
    auto flaky = [&calls](const std::string& s, const rs::context& ctx) -> rs::task<std::size_t> {
        if (++calls < 3)
            throw std::runtime_error("again");
        co_return s.size() * 10 + static_cast<std::size_t>(ctx.attempt());
    };
    CHECK(sim.run(r.execute(flaky, std::string(50, 'y'))) == 503);
    CHECK(sim.run(r.execute(attempt_of, 100)) == 101);
}

namespace {
// Takes what cannot be copied, by reference: the caller passes std::ref (a copy is refused at compile time,
// tests/compile_fail/execute_argument_not_copyable.cpp).
rs::task<int> count_under(std::mutex& m, int& count) {
    const std::lock_guard lock(m);
    co_return ++count;
}
} // namespace

TEST_CASE("pipeline: execute(f, std::ref(x)) hands f the caller's object itself, attempt after attempt",
          "[pipeline]") {
    rs::testing::simulation sim;
    rs::retry r{{.max_attempts = 3,
                 .backoff = rs::constant_backoff{0ms},
                 .should_handle = [](const rs::outcome<int>& o) { return !o || o.value() < 3; }},
                sim.clock()};
    std::mutex m;
    int count = 0;
    CHECK(sim.run(r.execute(count_under, std::ref(m), std::ref(count))) == 3);
    CHECK(count == 3);
}

namespace {
// Takes a move-only argument by reference: every attempt gets the one the call keeps (by value it
// is refused at compile time, tests/compile_fail/execute_argument_move_only.cpp).
rs::task<int> read_owned(const std::unique_ptr<int>& p, const rs::context& ctx) {
    if (ctx.attempt() < 3)
        throw std::runtime_error("again");
    co_return *p + ctx.attempt();
}
} // namespace

TEST_CASE("pipeline: execute(f, args...) with a move-only argument: f taking it by reference, or a named "
          "callable owning it passed with std::ref, sees it at every attempt",
          "[pipeline]") {
    rs::testing::simulation sim;
    rs::retry r{{.max_attempts = 3, .backoff = rs::constant_backoff{0ms}}, sim.clock()};
    CHECK(sim.run(r.execute(read_owned, std::make_unique<int>(40))) == 43);
    const auto owner = [p = std::make_unique<int>(50)](const rs::context& ctx) { return read_owned(p, ctx); };
    CHECK(sim.run(r.execute(std::ref(owner))) == 53);
    const auto shared = [](std::shared_ptr<int> p, const rs::context& ctx) -> rs::task<int> {
        co_return *p + ctx.attempt();
    };
    CHECK(sim.run(r.execute(shared, std::make_shared<int>(60))) == 61);
}

namespace {
// Returns a call made on temporary policies: the policies are moved into the call's frame.
rs::task<int> call_on_temporaries(rs::testing::simulation& sim, int& calls) {
    return rs::pipeline{
        rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1s, rs::jitter::none}}, sim.clock()},
        rs::timeout{10s, sim.clock()}}
        .execute([&calls, &sim]() -> rs::task<int> {
            co_await sim.sleep_for(100ms);
            if (++calls < 3)
                throw std::runtime_error("again");
            co_return calls;
        });
}
} // namespace

TEST_CASE("pipeline: execute on a temporary policy moves it into the call", "[pipeline]") {
    rs::testing::simulation sim;
    int calls = 0;
    auto call = call_on_temporaries(sim, calls); // the pipeline is gone; its retry and timeout are not
    CHECK(sim.run(std::move(call)) == 3);
    CHECK(sim.now() == 2300ms);
    rs::retry r{{.max_attempts = 2, .backoff = rs::constant_backoff{0ms}}, sim.clock()};
    auto moved = std::move(r).execute([]() -> rs::task<int> { co_return 5; });
    CHECK(sim.run(std::move(moved)) == 5);
}

TEST_CASE("pipeline: a copy, a move and an assignment each run calls through their own policies",
          "[pipeline]") {
    // A pipeline keeps the stages its calls pass through (references to its own members): each copy
    // must make its own, and an assignment must remake them.
    rs::testing::simulation sim;
    const rs::circuit_breaker<rs::testing::virtual_clock> first{{.failure_threshold = 5}, sim.clock()};
    const rs::circuit_breaker<rs::testing::virtual_clock> second{{.failure_threshold = 5}, sim.clock()};
    using two_policies = rs::pipeline<rs::circuit_breaker<rs::testing::virtual_clock>,
                                      rs::timeout<rs::testing::virtual_clock>>;
    // The failure counted, and the time left to the deadline, for one failing call through `p`.
    const auto failing_call = [&sim](const two_policies& p) {
        std::chrono::nanoseconds left{};
        auto r = sim.run(p.execute_outcome([&sim, &left](const rs::context& ctx) -> rs::task<int> {
            left = *ctx.deadline() - sim.now();
            throw std::runtime_error("down");
            co_return 0;
        }));
        CHECK(r.has_failure());
        return left;
    };
    auto original = std::make_unique<two_policies>(first, rs::timeout{1s, sim.clock()});
    two_policies copy = *original;
    two_policies source = *original;
    two_policies moved = std::move(source);
    original.reset(); // the copies do not refer to it
    CHECK(failing_call(copy) == 1s);
    CHECK(failing_call(moved) == 1s);
    CHECK(first.metrics().consecutive_failures == 2);

    two_policies assigned{second, rs::timeout{3s, sim.clock()}};
    CHECK(failing_call(assigned) == 3s);
    CHECK(second.metrics().consecutive_failures == 1);
    assigned = copy; // now the first breaker and a 1-second timeout
    CHECK(failing_call(assigned) == 1s);
    CHECK(first.metrics().consecutive_failures == 3);
    CHECK(second.metrics().consecutive_failures == 1);
    assigned = two_policies{second, rs::timeout{2s, sim.clock()}};
    CHECK(failing_call(assigned) == 2s);
    CHECK(second.metrics().consecutive_failures == 2);
}

namespace {
// Passes calls through; its assignment throws when the assigned one says so.
struct refuses_assignment : rs::policy_base<refuses_assignment> {
    bool refuse = false;
    explicit refuses_assignment(bool r) : refuse(r) {}
    refuses_assignment(const refuses_assignment&) = default;
    refuses_assignment& operator=(const refuses_assignment& other) {
        if (other.refuse)
            throw std::runtime_error("not assignable");
        refuse = other.refuse;
        return *this;
    }
    template <class Next>
    rs::task<rs::next_outcome_t<Next>> run(Next next, const rs::context& ctx) const {
        co_return co_await next(ctx);
    }
};
} // namespace

TEST_CASE("pipeline: an assignment that throws halfway leaves calls going through the policies it holds",
          "[pipeline]") {
    rs::testing::simulation sim;
    using breaker = rs::circuit_breaker<rs::testing::virtual_clock>;
    const breaker first{{.failure_threshold = 5}, sim.clock()};
    const breaker second{{.failure_threshold = 5}, sim.clock()};
    rs::pipeline p{first, refuses_assignment{false}};
    const rs::pipeline q{second, refuses_assignment{true}};
    CHECK_THROWS_AS(p = q, std::runtime_error);
    REQUIRE(p.get<0>() == second); // assigned before the second element threw
    auto r = sim.run(p.execute_outcome([]() -> rs::task<int> {
        throw std::runtime_error("down");
        co_return 0;
    }));
    CHECK(r.has_failure());
    CHECK(second.metrics().consecutive_failures == 1);
    CHECK(first.metrics().consecutive_failures == 0);
}

TEST_CASE("pipeline: a timeout, a limiter and a slow-call breaker read the clock once per call",
          "[pipeline]") {
    rs::testing::simulation sim;
    counting_clock clock{sim.clock()};
    rs::pipeline p{rs::retry{rs::retry_options{}, clock},
                   rs::circuit_breaker{{.sampling = rs::breaker_sampling{.calls = 10,
                                                                         .failure_ratio = 0.5,
                                                                         .slow_call_duration = 1s,
                                                                         .slow_call_ratio = 0.5}},
                                       clock},
                   rs::timeout{1s, clock},
                   rs::rate_limiter{{.token_limit = 100, .tokens_per_second = 1}, clock}};
    const int before = *clock.reads;
    CHECK(sim.run(p.execute([]() -> rs::task<int> { co_return 4; })) == 4);
    // One reading admits the call (timeout deadline, limiter refill, breaker start); the breaker
    // reads once more to time the finished call.
    CHECK(*clock.reads - before == 2);
}

namespace {
// A call that arrives at `arrive`, notes when its action starts under `id`, runs for `hold` (listening
// to its stop token) and notes how and when the call ended.
struct timed_call {
    int id = 0;
    std::chrono::nanoseconds arrive{};
    std::chrono::nanoseconds hold{};
};
struct call_log {
    resilience_tests::instant_log started;
    std::vector<std::pair<int, std::chrono::nanoseconds>> ended;
    std::vector<std::string> how;
};
template <class P>
rs::task<void> timed(rs::testing::simulation& sim, const P& p, call_log& log, timed_call c) {
    co_await sim.sleep_for(c.arrive);
    auto action = [&sim, &log, c](resilience::stop_token st) -> rs::task<int> {
        log.started.emplace_back(c.id, sim.now());
        co_await sim.sleep_for(c.hold, st);
        if (st.stop_requested())
            throw rs::cancelled_error{};
        co_return c.id;
    };
    auto r = co_await p.execute_outcome(std::move(action));
    log.ended.emplace_back(c.id, sim.now());
    log.how.push_back(r.has_value()                                          ? "value"
                      : r.error().template is<rs::timeout_error>()           ? "timeout"
                      : r.error().template is<rs::bulkhead_rejected_error>() ? "rejected"
                                                                             : "other");
}
} // namespace

TEST_CASE("pipeline: a call queued in a bulkhead, once admitted, goes on through the stages inside it, "
          "waiting again in a rate limiter there",
          "[pipeline][bulkhead][rate_limiter]") {
    rs::testing::simulation sim;
    // One slot; one token, then one every 100 ms.
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 5}, sim.clock()};
    rs::rate_limiter lim{{.token_limit = 1, .tokens_per_second = 10, .queue_limit = 5}, sim.clock()};
    rs::pipeline p{bh, lim, rs::timeout{1s, sim.clock()}};
    call_log log;
    sim.spawn(timed(sim, p, log, {.id = 1, .hold = 50ms}));                 // slot and token at 0
    sim.spawn(timed(sim, p, log, {.id = 2, .arrive = 10ms, .hold = 50ms})); // slot at 50, token at 100
    sim.spawn(timed(sim, p, log, {.id = 3, .arrive = 20ms, .hold = 50ms})); // slot at 150, token at 200
    sim.run_all();
    using ms = std::chrono::milliseconds;
    CHECK(log.started == resilience_tests::instant_log{{1, ms{0}}, {2, ms{100}}, {3, ms{200}}});
    CHECK(log.ended == resilience_tests::instant_log{{1, ms{50}}, {2, ms{150}}, {3, ms{250}}});
    CHECK(log.how == std::vector<std::string>{"value", "value", "value"});
    CHECK(bh.in_flight() == 0);
    CHECK(bh.queued() == 0);
    CHECK(lim.queued() == 0);
}

TEST_CASE("pipeline: a retry around a bulkhead queues its next attempt for a slot like any call",
          "[pipeline][bulkhead][retry]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 5}, sim.clock()};
    rs::pipeline p{rs::retry{{.max_attempts = 2, .backoff = rs::constant_backoff{0ms}}, sim.clock()}, bh};
    // The first attempt holds the slot for 50 ms and fails; call 2 queued at 10 ms takes the slot at 50 ms
    // for 100 ms, so the second attempt queues and runs at 150 ms.
    auto flaky = rs::testing::scripted_action{
        sim.clock(), rs::testing::script<int>{.failures = 1, .latency = 50ms, .value = 7}};
    std::optional<rs::outcome<int>> first;
    sim.spawn([](const auto& policy, auto act, std::optional<rs::outcome<int>>& out) -> rs::task<void> {
        out.emplace(co_await policy.execute_outcome(std::move(act)));
    }(p, flaky, first));
    call_log log;
    sim.spawn(timed(sim, p, log, {.id = 2, .arrive = 10ms, .hold = 100ms}));
    sim.run_all();
    REQUIRE(first.has_value());
    CHECK(first->value() == 7);
    CHECK(flaky.calls() == 2);
    CHECK(log.started == resilience_tests::instant_log{{2, std::chrono::milliseconds{50}}});
    CHECK(sim.now() == 200ms); // the second attempt ran from 150 ms to 200 ms
    CHECK(bh.in_flight() == 0);
}

TEST_CASE("pipeline: a timeout around a bulkhead ends a queued call at its deadline and takes it out of "
          "the queue",
          "[pipeline][bulkhead][timeout]") {
    rs::testing::simulation sim;
    rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 5}, sim.clock()};
    rs::pipeline p{rs::timeout{30ms, sim.clock()}, bh};
    call_log log;
    std::size_t queued_at_15 = 99, queued_at_45 = 99, queued_at_55 = 99;
    sim.spawn(timed(sim, bh, log, {.id = 1, .hold = 100ms}));               // holds the slot, no timeout
    sim.spawn(timed(sim, p, log, {.id = 2, .arrive = 10ms, .hold = 10ms})); // queued from 10 ms to 40 ms
    sim.spawn(timed(sim, p, log, {.id = 3, .arrive = 20ms, .hold = 10ms})); // queued from 20 ms to 50 ms
    sim.spawn([](rs::testing::simulation& s, const rs::bulkhead<rs::testing::virtual_clock>& b,
                 std::size_t& at_15, std::size_t& at_45, std::size_t& at_55) -> rs::task<void> {
        co_await s.sleep_for(15ms);
        at_15 = b.queued();
        co_await s.sleep_for(30ms);
        at_45 = b.queued();
        co_await s.sleep_for(10ms);
        at_55 = b.queued();
    }(sim, bh, queued_at_15, queued_at_45, queued_at_55));
    sim.run_all();
    using ms = std::chrono::milliseconds;
    CHECK(queued_at_15 == 1);
    CHECK(queued_at_45 == 1);
    CHECK(queued_at_55 == 0);
    CHECK(log.started == resilience_tests::instant_log{{1, ms{0}}}); // the queued calls never ran
    CHECK(log.ended == resilience_tests::instant_log{{2, ms{40}}, {3, ms{50}}, {1, ms{100}}});
    CHECK(log.how == std::vector<std::string>{"timeout", "timeout", "value"});
    CHECK(bh.in_flight() == 0);
}

// A stage of the fast form that hands the stages inside it a context of its own: `enter` answers
// `rs::entry::proceed_in` with a context kept in its call state.
const rs::property_key<int> stage_tag{"stage_tag"};
class tagging_stage : public rs::policy_base<tagging_stage> {
public:
    explicit tagging_stage(int tag) : tag_(tag) {}
    struct call_state {
        rs::context inner;
    };
    static constexpr bool enter_never_waits = true;

    template <class R>
    rs::entry enter(call_state& s, const rs::context& ctx, std::optional<rs::outcome<R>>&) const {
        s.inner = ctx.with_property(stage_tag, tag_);
        return rs::entry::proceed_in(s.inner);
    }
    template <class R>
    rs::step leave(call_state&, const rs::context&, rs::outcome<R>&) const {
        return rs::step::proceed;
    }

private:
    int tag_;
};

// The same in the 0.1 form of `enter`, the inner context an out-parameter: deprecated, still run.
class tagging_stage_0_1 : public rs::policy_base<tagging_stage_0_1> {
public:
    explicit tagging_stage_0_1(int tag) : tag_(tag) {}
    struct call_state {
        rs::context inner;
    };
    static constexpr bool enter_never_waits = true;

    template <class R>
    rs::step enter(call_state& s, const rs::context& ctx, const rs::context*& inner,
                   std::optional<rs::outcome<R>>&) const {
        s.inner = ctx.with_property(stage_tag, tag_);
        inner = &s.inner;
        return rs::step::proceed;
    }
    template <class R>
    rs::step leave(call_state&, const rs::context&, rs::outcome<R>&) const {
        return rs::step::proceed;
    }

private:
    int tag_;
};

TEST_CASE("pipeline: a fast stage's enter may hand the stages inside it a context of its own", "[pipeline]") {
    rs::testing::simulation sim;
    const auto read_tag = [](const rs::context& ctx) -> rs::task<int> {
        co_return ctx.property_or(stage_tag, 0);
    };
    // Inside a retry (which gives the attempt its own context) and around one, in the new form and the
    // 0.1 form; the innermost tag wins.
    rs::pipeline p{tagging_stage{1}, rs::retry{{.max_attempts = 2}, sim.clock()}, tagging_stage{2}};
    CHECK(sim.run(p.execute(read_tag)) == 2);
    rs::pipeline q{tagging_stage_0_1{3}, rs::retry{{.max_attempts = 2}, sim.clock()}};
    CHECK(sim.run(q.execute(read_tag)) == 3);
    CHECK(sim.run(tagging_stage{4}.execute(read_tag)) == 4);
    CHECK(sim.run(rs::pipeline{tagging_stage_0_1{5}, tagging_stage{6}}.execute(read_tag)) == 6);
    CHECK(sim.run(rs::pipeline{tagging_stage{7}, tagging_stage_0_1{8}}.execute(read_tag)) == 8);
}

// A stage that breaks the protocol: its `leave` (or, declaring that its `enter` never waits, its
// `enter`) answers `step::wait`, with neither `resume` nor `again` to go on in.
class waits_with_nothing : public rs::policy_base<waits_with_nothing> {
public:
    explicit waits_with_nothing(bool in_enter) : in_enter_(in_enter) {}
    struct call_state {};
    static constexpr bool enter_never_waits = true;

    template <class R>
    rs::step enter(call_state&, const rs::context&, std::optional<rs::outcome<R>>&) const {
        return in_enter_ ? rs::step::wait : rs::step::proceed;
    }
    template <class R>
    rs::step leave(call_state&, const rs::context&, rs::outcome<R>&) const {
        return rs::step::wait;
    }

private:
    bool in_enter_;
};

namespace {
// A clock on a simulation whose sleeps cannot be had: `sleep_until` throws, as that of a clock whose
// timers are gone would. It has no loop timers: a timeout on it watches the call beside it.
struct broken_sleep_clock {
    using duration = rs::testing::virtual_clock::duration;
    using time_point = rs::testing::virtual_clock::time_point;
    rs::testing::virtual_clock inner;
    bool broken = true;
    time_point now() const noexcept { return inner.now(); }
    auto sleep_until(time_point tp, resilience::stop_token token) const {
        if (broken)
            throw std::runtime_error("no timers left");
        return inner.sleep_until(tp, std::move(token));
    }
};
static_assert(rs::clock<broken_sleep_clock> && !rs::detail::loop_timer_clock<broken_sleep_clock>);

// Calls `act` through `policy` at `at` on `clock`'s simulation, keeping the outcome in `out`.
template <class P, class A>
rs::task<void> call_at(rs::testing::virtual_clock clock, std::chrono::milliseconds at, const P& policy, A act,
                       std::optional<rs::outcome<int>>& out) {
    co_await clock.sleep_until(rs::testing::virtual_clock::time_point{at}, resilience::stop_token{});
    out.emplace(co_await policy.execute_outcome(std::move(act)));
}

bool ended_with_the_clocks_error(const rs::outcome<int>& r) {
    const auto* e = r.has_failure() ? r.error().as<std::runtime_error>() : nullptr;
    return e && std::string(e->what()) == "no timers left";
}

// Through `policy`, a call at 0 ms that is admitted and holds what it took (a slot, a token) for
// `holds`, then one at 10 ms that must wait for it on a broken clock: the first ends with its value,
// the second with the clock's error, without running.
template <class P>
void second_fails_waiting(rs::testing::simulation& sim, const P& policy, std::chrono::milliseconds holds) {
    rs::testing::scripted_action first{sim.clock(), rs::testing::script<int>{.latency = holds, .value = 1}};
    rs::testing::scripted_action second{sim.clock(), rs::testing::script<int>{.value = 2}};
    std::optional<rs::outcome<int>> got_first, got_second;
    sim.spawn(call_at(sim.clock(), 0ms, policy, first, got_first));
    sim.spawn(call_at(sim.clock(), 10ms, policy, second, got_second));
    sim.run_all();
    REQUIRE(got_first.has_value());
    CHECK(got_first->value() == 1);
    REQUIRE(got_second.has_value());
    CHECK(ended_with_the_clocks_error(*got_second));
    CHECK(second.calls() == 0); // it never got what it waited for
}
} // namespace

TEST_CASE("pipeline: a clock whose sleep throws ends the call with that exception, returned by "
          "execute_outcome and thrown by execute, and the stages outside still leave",
          "[pipeline][retry][timeout][hedge][bulkhead][rate_limiter]") {
    rs::testing::simulation sim;
    const broken_sleep_clock clock{sim.clock()};
    const auto failures = std::make_shared<std::atomic<int>>(0);
    SECTION("a retry's backoff, slept in the call's frame") {
        rs::pipeline p{
            count_failures{failures},
            rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1s, rs::jitter::none}}, clock}};
        rs::testing::scripted_action flaky{sim.clock(), rs::testing::script<int>{.failures = 1, .value = 7}};
        CHECK(ended_with_the_clocks_error(sim.run(p.execute_outcome(flaky))));
        CHECK(flaky.calls() == 1); // no second attempt without its backoff
        CHECK(failures->load() == 1);
        rs::testing::scripted_action again{sim.clock(), rs::testing::script<int>{.failures = 1, .value = 7}};
        CHECK_THROWS_WITH(sim.run(p.execute(again)), "no timers left");
        CHECK(failures->load() == 2);
    }
    SECTION("a timeout's watch beside the call, in a frame of its own") {
        rs::pipeline p{count_failures{failures}, rs::timeout{1s, clock}};
        rs::testing::scripted_action slow{sim.clock(),
                                          rs::testing::script<int>{.latency = 200ms, .value = 5}};
        CHECK(ended_with_the_clocks_error(sim.run(p.execute_outcome(slow))));
        CHECK(sim.now() == 200ms); // the attempt, which the timeout could not time, was waited for
        CHECK(failures->load() == 1);
        CHECK_THROWS_WITH(sim.run(p.execute(slow)), "no timers left");
        CHECK(failures->load() == 2);
    }
    SECTION("a hedge's delay before its second attempt") {
        rs::pipeline p{count_failures{failures}, rs::hedge{{.max_attempts = 2, .delay = 50ms}, clock}};
        rs::testing::scripted_action slow{sim.clock(),
                                          rs::testing::script<int>{.latency = 200ms, .value = 5}};
        CHECK(ended_with_the_clocks_error(sim.run(p.execute_outcome(slow))));
        CHECK(slow.calls() == 1); // the first attempt, stopped; no second
        CHECK(sim.now() < 200ms);
        CHECK(failures->load() == 1);
    }
    SECTION("a bulkhead's queue timeout, watched beside a call queued in the call's frame") {
        rs::bulkhead bh{{.max_concurrent_calls = 1, .queue_limit = 1, .queue_timeout = 1s}, clock};
        second_fails_waiting(sim, rs::pipeline{count_failures{failures}, bh}, 100ms);
        CHECK(failures->load() == 1);
        CHECK(bh.in_flight() == 0);
        CHECK(bh.queued() == 0);
    }
    SECTION("a rate limiter's wait for a token, in the call's frame") {
        rs::rate_limiter lim{{.token_limit = 1, .tokens_per_second = 1, .queue_limit = 1}, clock};
        second_fails_waiting(sim, rs::pipeline{count_failures{failures}, lim}, 0ms);
        CHECK(failures->load() == 1);
        CHECK(lim.queued() == 0);
    }
    CHECK(sim.loop().timers() == 0);
}

TEST_CASE("pipeline: a stage that answers wait with nothing to go on in ends the call with a logic_error",
          "[pipeline]") {
    rs::testing::simulation sim;
    const auto is_logic_error = [](const rs::outcome<int>& r) {
        if (!r.has_failure())
            return false;
        try {
            std::rethrow_exception(r.failure().exception());
        } catch (const std::logic_error&) {
            return true;
        } catch (...) {
        }
        return false;
    };
    for (const bool in_enter : {false, true}) {
        CAPTURE(in_enter);
        int ran = 0;
        const auto action = [&ran]() -> rs::task<int> {
            ++ran;
            co_return 1;
        };
        // The stages outside it still leave, and see the error: in a pipeline whose stages never wait
        // in a frame of their own, and in one with a stage that may (a `resume`).
        const auto failures = std::make_shared<std::atomic<int>>(0);
        rs::pipeline plain{count_failures{failures}, waits_with_nothing{in_enter}};
        CHECK(is_logic_error(sim.run(plain.execute_outcome(action))));
        CHECK(failures->load() == 1);
        std::vector<std::string> log;
        rs::pipeline with_resume{fast_recorder{"outer", log, true}, waits_with_nothing{in_enter}};
        CHECK(is_logic_error(sim.run(with_resume.execute_outcome(action))));
        CHECK(log ==
              std::vector<std::string>{"outer enter", "outer leave", "outer again"}); // its resume ends it
        CHECK(ran == (in_enter ? 0 : 3));
    }
}

// A turnstile: calls wait for it to open in the pipeline's frame (`frame_wait`), or are refused when it
// closes for good. `Room`: its awaiter is told the call in `await_resume` (it keeps a pointer to the
// call's state and result only to check that they are the ones it was made with) and asks for `room`
// bytes after itself, which it fills with the call's number and checks on the way out; otherwise it
// answers from `await_resume()`, from the references it keeps. With `recheck`, an awaiter resumed at
// the opening answers `step::wait` once, and is awaited again. `Always`: it says that every call waits in
// the frame (`always_waits_in_frame`), and its `run` does not compile.
struct turnstile_gate {
    bool open = false, closed = false, recheck = false;
    int made = 0, destroyed = 0, next_id = 0, resumed = 0;
    std::vector<std::coroutine_handle<>> waiting;
    std::vector<int> admitted;   // the ids of the calls whose awaiter let them in, in order
    std::vector<bool> room_kept; // whether each call's room held its number on the way out

    void open_now() {
        open = true;
        for (auto h : std::exchange(waiting, {}))
            h.resume();
    }
    void close_for_good() {
        closed = true;
        for (auto h : std::exchange(waiting, {}))
            h.resume();
    }
};

template <bool Room, bool Always = false>
class turnstile : public rs::policy_base<turnstile<Room, Always>> {
public:
    static constexpr bool always_waits_in_frame = Always;
    turnstile(std::shared_ptr<turnstile_gate> g, std::size_t room) : gate_(std::move(g)), room_(room) {}
    struct call_state {
        int id = -1;
    };

    template <class R>
    rs::step enter(call_state& c, const rs::context&, std::optional<rs::outcome<R>>&) const {
        c.id = gate_->next_id++;
        return gate_->open ? rs::step::proceed : rs::step::wait;
    }
    template <class R>
    rs::step leave(call_state&, const rs::context&, rs::outcome<R>&) const {
        return rs::step::proceed;
    }
    bool waits_in_frame(const rs::context&) const noexcept { return true; }
    template <class Next>
    rs::task<rs::next_outcome_t<Next>> run(Next, const rs::context&) const {
        static_assert(!Always || sizeof(Next) == 0, "a pipeline compiled the run of a policy that always "
                                                    "waits in its frame");
        throw std::logic_error("turnstile: every call waits in the pipeline's frame");
    }

    template <class R>
    class frame_wait {
    public:
        frame_wait(const turnstile& t, call_state& c, const rs::context&,
                   std::optional<rs::outcome<R>>& result)
        requires(!Room)
            : gate_(*t.gate_), call_(&c), result_(&result), room_(0) {
            ++gate_.made;
        }
        frame_wait(const turnstile& t, call_state& c, const rs::context&,
                   std::optional<rs::outcome<R>>& result, void* room)
        requires Room
            : gate_(*t.gate_), call_(&c), result_(&result), room_(t.room_) {
            ++gate_.made;
            REQUIRE(room == (room_ == 0 ? nullptr : rs::kit::room_after(this)));
            if (room)
                std::fill_n(static_cast<unsigned char*>(room), room_, static_cast<unsigned char>(c.id + 1));
        }
        frame_wait(const frame_wait&) = delete;
        frame_wait& operator=(const frame_wait&) = delete;
        ~frame_wait() {
            ++gate_.destroyed;
            std::erase(gate_.waiting, handle_);
        }
        static std::size_t extra_bytes(const turnstile& t, call_state&, const rs::context&)
        requires Room
        {
            return t.room_;
        }
        std::size_t extra_bytes() const noexcept
        requires Room
        {
            return room_;
        }

        bool await_ready() const noexcept { return gate_.open || gate_.closed; }
        void await_suspend(std::coroutine_handle<> h) {
            handle_ = h;
            gate_.waiting.push_back(h);
        }
        rs::step await_resume()
        requires(!Room)
        {
            return answer(*call_, *result_);
        }
        rs::step await_resume(const turnstile&, call_state& c, const rs::context&,
                              std::optional<rs::outcome<R>>& result)
        requires Room
        {
            REQUIRE(&c == call_); // the call's own state and result, as it was made with
            REQUIRE(&result == result_);
            if (room_ != 0) {
                const auto* at = static_cast<const unsigned char*>(rs::kit::room_after(this));
                gate_.room_kept.push_back(
                    std::all_of(at, at + room_, [&](unsigned char b) { return b == c.id + 1; }));
            }
            return answer(c, result);
        }

    private:
        rs::step answer(call_state& c, std::optional<rs::outcome<R>>& result) {
            handle_ = {};
            ++gate_.resumed;
            if (gate_.recheck && !rechecked_) {
                rechecked_ = true;
                return rs::step::wait; // awaited again: ready at once, the gate being open
            }
            if (gate_.closed) {
                result.emplace(rs::failure::make(std::runtime_error("turnstile closed")));
                return rs::step::done;
            }
            gate_.admitted.push_back(c.id);
            return rs::step::proceed;
        }

        turnstile_gate& gate_;
        call_state* call_;
        std::optional<rs::outcome<R>>* result_;
        std::size_t room_;
        std::coroutine_handle<> handle_{};
        bool rechecked_ = false;
    };

private:
    std::shared_ptr<turnstile_gate> gate_;
    std::size_t room_;
};

TEST_CASE(
    "pipeline: a custom frame_wait waits in the call's frame, given its call on the way out and the room "
    "it asked for",
    "[pipeline]") {
    rs::testing::simulation sim;
    int ran = 0;
    const auto action = [&ran, &sim]() -> rs::task<int> {
        ++ran;
        co_return static_cast<int>(sim.now() / 1ms);
    };
    const auto call = [&](auto p, std::optional<rs::outcome<int>>& out) -> rs::task<void> {
        out.emplace(co_await p.execute_outcome(action));
    };
    const auto opens_at = [&](std::chrono::nanoseconds t, turnstile_gate& g) -> rs::task<void> {
        co_await sim.sleep_for(t);
        g.open_now();
    };
    for (const std::size_t room : {std::size_t{0}, std::size_t{40}, std::size_t{200}}) {
        for (const bool recheck : {false, true}) {
            CAPTURE(room, recheck);
            ran = 0;
            // Alone (one stage waits here), and beside another stage that waits here (the block then
            // holds which one waits).
            const auto g = std::make_shared<turnstile_gate>();
            const auto other = std::make_shared<turnstile_gate>();
            g->recheck = recheck;
            rs::pipeline alone{turnstile<true>{g, room}};
            rs::pipeline two{turnstile<false>{other, 0}, turnstile<true>{g, room}};
            std::optional<rs::outcome<int>> a, b, c;
            const auto t0 = sim.now();
            sim.spawn(call(alone, a));
            sim.spawn(call(alone, b));
            sim.spawn(call(two, c)); // waits at `other` first, then at `g`
            sim.spawn(opens_at(5ms, *other));
            sim.spawn(opens_at(7ms, *g));
            sim.run_until(t0 + 6ms);
            CHECK(ran == 0);
            CHECK(g->waiting.size() == 3);
            CHECK(other->waiting.empty()); // opened at 5 ms: the third call now waits at `g` too
            sim.run_all();
            REQUIRE(a.has_value());
            REQUIRE(b.has_value());
            REQUIRE(c.has_value());
            const int opened = static_cast<int>((t0 + 7ms) / 1ms);
            CHECK(a->value() == opened);
            CHECK(b->value() == opened);
            CHECK(c->value() == opened);
            CHECK(ran == 3);
            CHECK(g->admitted == std::vector<int>{0, 1, 2});
            CHECK(g->resumed == (recheck ? 6 : 3));
            CHECK(g->room_kept == std::vector<bool>(room == 0 ? 0 : g->resumed, true));
            CHECK(g->made == 3);
            CHECK(g->destroyed == 3);
            CHECK(other->admitted == std::vector<int>{0});
        }
    }
}

TEST_CASE("pipeline: a policy that always waits in the call's frame has no run compiled for it",
          "[pipeline]") {
    rs::testing::simulation sim;
    const auto g = std::make_shared<turnstile_gate>();
    // Inside a retry and beside a bulkhead, as a rate limiter would be; its run would not compile.
    rs::pipeline p{rs::retry{{}, sim.clock()}, rs::bulkhead{{.max_concurrent_calls = 1}, sim.clock()},
                   turnstile<false, true>{g, 0}};
    std::optional<rs::outcome<int>> out;
    const auto action = [&sim]() -> rs::task<int> { co_return static_cast<int>(sim.now() / 1ms); };
    const auto call = [&]() -> rs::task<void> { out.emplace(co_await p.execute_outcome(action)); };
    const auto open_later = [&]() -> rs::task<void> {
        co_await sim.sleep_for(3ms);
        g->open_now();
    };
    const auto t0 = sim.now();
    sim.spawn(call());
    sim.spawn(open_later());
    sim.run_all();
    REQUIRE(out.has_value());
    CHECK(out->value() == static_cast<int>((t0 + 3ms) / 1ms));
    CHECK(g->made == 1);
    CHECK(g->destroyed == 1);
}

TEST_CASE("pipeline: a custom frame_wait refuses through the result it is given, and a torn-down loop "
          "destroys it where it waits",
          "[pipeline]") {
    const auto check = [](auto make_turnstile, bool room) {
        CAPTURE(room);
        int ran = 0;
        const auto action = [&ran]() -> rs::task<int> {
            ++ran;
            co_return 1;
        };
        const auto call = [&](auto p, std::optional<rs::outcome<int>>& out) -> rs::task<void> {
            out.emplace(co_await p.execute_outcome(action));
        };
        const auto g = std::make_shared<turnstile_gate>();
        std::optional<rs::outcome<int>> refused, never;
        {
            rs::testing::simulation sim;
            const auto failures = std::make_shared<std::atomic<int>>(0);
            rs::pipeline p{count_failures{failures}, make_turnstile(g)};
            sim.spawn(call(p, refused));
            sim.run_for(1ms);
            CHECK(g->waiting.size() == 1);
            g->close_for_good();
            sim.run_for(1ms); // resumed off the loop: the call goes back to it
            REQUIRE(refused.has_value());
            REQUIRE(refused->has_failure());
            CHECK_THROWS_WITH(std::rethrow_exception(refused->failure().exception()), "turnstile closed");
            CHECK(failures->load() == 1); // the stage outside it left, and saw the refusal
            CHECK(g->room_kept == std::vector<bool>(room ? 1 : 0, true));
            g->closed = false;
            sim.spawn(call(p, never));
            sim.run_for(1ms);
            CHECK(g->waiting.size() == 1);
        } // the loop torn down with the second call waiting
        CHECK(!never.has_value());
        CHECK(g->made == 2);
        CHECK(g->destroyed == 2);
        CHECK(g->waiting.empty());
        CHECK(ran == 0);
    };
    check([](std::shared_ptr<turnstile_gate> g) { return turnstile<true>{std::move(g), 48}; }, true);
    check([](std::shared_ptr<turnstile_gate> g) { return turnstile<false>{std::move(g), 0}; }, false);
}
} // namespace test_pipeline
