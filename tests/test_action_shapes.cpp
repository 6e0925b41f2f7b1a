// SPDX-License-Identifier: MIT
// Actions of every odd shape through every policy: a ready awaitable, await_suspend returning bool
// or a handle, throwing from await_suspend, `throw 42`, completing on another thread, ignoring
// stop, never finishing but honouring stop. Each call ends as documented, on the caller's loop.

#include "catch.hpp"
#include "support.hpp"

#include <resilience/adaptive_throttle.hpp>
#include <resilience/any_clock.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/circuit_breaker.hpp>
#include <resilience/clock.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/fallback.hpp>
#include <resilience/hedge.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/retry.hpp>
#include <resilience/single_flight.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>
#include <resilience/when_all.hpp>

#include <chrono>
#include <coroutine>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

namespace test_action_shapes {

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

// ---- the shapes ----

// Never suspends.
struct ready_value {
    bool await_ready() const noexcept { return true; }
    void await_suspend(std::coroutine_handle<>) const noexcept {}
    int await_resume() const noexcept { return 42; }
};

// await_suspend returning bool: `false` resumes at once, `true` suspends (resumed by a post).
struct bool_suspend {
    bool suspend;
    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<> h) const {
        if (suspend)
            rs::event_loop::current()->post(h);
        return suspend;
    }
    int await_resume() const noexcept { return 42; }
};

// await_suspend returning a handle: the awaiting coroutine itself (resumed at once, by symmetric
// transfer), or noop after posting it.
struct handle_suspend {
    bool self;
    bool await_ready() const noexcept { return false; }
    std::coroutine_handle<> await_suspend(std::coroutine_handle<> h) const {
        if (self)
            return h;
        rs::event_loop::current()->post(h);
        return std::noop_coroutine();
    }
    int await_resume() const noexcept { return 42; }
};

// Throws from await_suspend: the coroutine was not suspended after all.
struct throwing_suspend {
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<>) const { throw std::runtime_error("await_suspend threw"); }
    int await_resume() const noexcept { return 0; }
};

// An awaitable whose operator co_await hands back an awaiter by value, the two counting how many of
// them are alive. `fail`: 1 throws from operator co_await (the awaitable is made, its awaiter is not),
// 2 from the awaiter's await_ready (both are made), 0 neither.
struct counted_awaitable {
    static inline int alive = 0;
    int fail;
    explicit counted_awaitable(int f) : fail(f) { ++alive; }
    counted_awaitable(const counted_awaitable& o) : fail(o.fail) { ++alive; }
    ~counted_awaitable() { --alive; }
    struct awaiter {
        int fail;
        explicit awaiter(int f) : fail(f) { ++alive; }
        awaiter(const awaiter& o) : fail(o.fail) { ++alive; }
        ~awaiter() { --alive; }
        bool await_ready() const {
            if (fail == 2)
                throw std::runtime_error("await_ready threw");
            return false;
        }
        bool await_suspend(std::coroutine_handle<>) const noexcept { return false; }
        int await_resume() const noexcept { return 42; }
    };
    awaiter operator co_await() const {
        if (fail == 1)
            throw std::runtime_error("operator co_await threw");
        return awaiter{fail};
    }
};

// The same awaiter, handed back by reference from inside the awaitable (`counted_by_reference`), or
// the awaitable its own awaiter (`counted_own`): only `fail` 2 throws (from await_ready).
struct counted_by_reference {
    counted_awaitable::awaiter inner;
    explicit counted_by_reference(int f) : inner(f) {}
    counted_awaitable::awaiter& operator co_await() && noexcept { return inner; }
};
struct counted_own : counted_awaitable::awaiter {
    using awaiter::awaiter;
};

// An awaitable that is neither a task nor its own awaiter, yielding an outcome: what a `next` handed to a
// policy's `run` may return.
struct ready_outcome {
    int v;
    auto operator co_await() const noexcept {
        struct awaiter {
            int v;
            bool await_ready() const noexcept { return true; }
            void await_suspend(std::coroutine_handle<>) const noexcept {}
            rs::outcome<int> await_resume() const noexcept { return rs::outcome<int>{v}; }
        };
        return awaiter{v};
    }
};

// ---- expectations ----

enum class ends { value, runtime_error, forty_two, cancelled, timeout };

const char* name_of(ends e) {
    switch (e) {
    case ends::value:
        return "value";
    case ends::runtime_error:
        return "runtime_error";
    case ends::forty_two:
        return "throw 42";
    case ends::cancelled:
        return "cancelled";
    case ends::timeout:
        return "timeout_error";
    }
    return "?";
}

ends how(const rs::outcome<int>& r) {
    if (r.has_value())
        return r.value() == 42 ? ends::value : ends::forty_two; // fallback answers failures with 7
    const rs::failure& f = r.error();
    if (f.is<rs::timeout_error>())
        return ends::timeout;
    if (rs::is_cancellation(f))
        return ends::cancelled;
    try {
        f.rethrow();
    } catch (int v) {
        return v == 42 ? ends::forty_two : ends::runtime_error;
    } catch (const std::runtime_error&) {
        return ends::runtime_error;
    } catch (...) {
    }
    return ends::cancelled;
}

// Every policy (and a pipeline of several), on `clock`, set up so a lone call is admitted.
template <class C>
auto every_policy(C clock) {
    return std::tuple{
        rs::retry{{.max_attempts = 2, .backoff = rs::constant_backoff{1ms}}, clock},
        rs::circuit_breaker{{.failure_threshold = 100}, clock},
        rs::timeout{1h, clock},
        rs::bulkhead{{.max_concurrent_calls = 2}, clock},
        rs::rate_limiter{{.token_limit = 100, .tokens_per_second = 100}, clock},
        rs::sliding_window_limiter{{.permit_limit = 100, .window = 1s}, clock},
        rs::hedge{{.max_attempts = 2, .delay = 1h}, clock},
        rs::single_flight<int, int>{}.policy(1),
        // Counting no failure against the dependency, so it never starts refusing as the shapes fail.
        rs::adaptive_throttle{{.should_handle = rs::classifier{[](const rs::failure&) { return false; }}},
                              clock},
        rs::pipeline{rs::retry{{.max_attempts = 2, .backoff = rs::constant_backoff{1ms}}, clock},
                     rs::circuit_breaker{{.failure_threshold = 100}, clock}, rs::timeout{1h, clock},
                     rs::bulkhead{{.max_concurrent_calls = 2}, clock},
                     rs::rate_limiter{{.token_limit = 100, .tokens_per_second = 100}, clock}},
    };
}
constexpr const char* policy_names[] = {
    "retry",          "circuit_breaker", "timeout",       "bulkhead",          "rate_limiter",
    "sliding_window", "hedge",           "single_flight", "adaptive_throttle", "pipeline"};

template <class Each>
void for_each_policy(auto& policies, Each each) {
    std::apply(
        [&](auto&... p) {
            int i = 0;
            (each(policy_names[i++], p), ...);
        },
        policies);
}

} // namespace

TEST_CASE("action shapes: every policy runs odd awaitables to the documented end", "[action_shapes]") {
    rs::testing::simulation sim;
    auto policies = every_policy(sim.clock());
    const rs::fallback fallback{7};

    struct shape {
        const char* name;
        std::function<rs::task<int>()> make;
        ends expected;
    };
    const shape shapes[] = {
        {"ready awaitable",
         [] { return [](ready_value a) -> rs::task<int> { co_return co_await a; }(ready_value{}); },
         ends::value},
        {"await_suspend returns false",
         [] { return [](bool_suspend a) -> rs::task<int> { co_return co_await a; }({false}); }, ends::value},
        {"await_suspend returns true",
         [] { return [](bool_suspend a) -> rs::task<int> { co_return co_await a; }({true}); }, ends::value},
        {"await_suspend returns its own handle",
         [] { return [](handle_suspend a) -> rs::task<int> { co_return co_await a; }({true}); }, ends::value},
        {"await_suspend returns noop",
         [] { return [](handle_suspend a) -> rs::task<int> { co_return co_await a; }({false}); },
         ends::value},
        {"await_suspend throws",
         [] { return [](throwing_suspend a) -> rs::task<int> { co_return co_await a; }({}); },
         ends::runtime_error},
        {"throw 42 from the coroutine",
         []() -> rs::task<int> {
             throw 42;
             co_return 0;
         },
         ends::forty_two},
        {"throw 42 when called", []() -> rs::task<int> { throw 42; }, ends::forty_two},
    };

    // As awaited directly (the raw awaiters, not wrapped in a task), and as tasks.
    for (const shape& s : shapes) {
        for_each_policy(policies, [&](const char* policy, const auto& p) {
            INFO(policy << ": " << s.name);
            const auto r = sim.run(p.execute_outcome([&] { return s.make(); }));
            CHECK(name_of(how(r)) == std::string(name_of(s.expected)));
        });
        INFO("fallback: " << s.name);
        const auto r = sim.run(fallback.execute_outcome([&] { return s.make(); }));
        CHECK(r.has_value());
    }
    for_each_policy(policies, [&](const char* policy, const auto& p) {
        INFO(policy);
        CHECK(sim.run(p.execute_outcome([] { return ready_value{}; })).value() == 42);
        CHECK(sim.run(p.execute_outcome([] { return bool_suspend{true}; })).value() == 42);
        CHECK(sim.run(p.execute_outcome([] { return handle_suspend{true}; })).value() == 42);
        CHECK(how(sim.run(p.execute_outcome([] { return throwing_suspend{}; }))) == ends::runtime_error);
        // Throwing when called, before any awaitable exists.
        CHECK(how(sim.run(p.execute_outcome([]() -> ready_value { throw 42; }))) == ends::forty_two);
    });
}

TEST_CASE("action shapes: an awaitable whose operator co_await or whose awaiter throws ends the attempt "
          "with that failure, and what the call made of it is destroyed once",
          "[action_shapes]") {
    rs::testing::simulation sim;
    auto policies = every_policy(sim.clock());
    for (const int fail : {0, 1, 2}) {
        for_each_policy(policies, [&](const char* policy, const auto& p) {
            INFO(policy << ", throwing at step " << fail);
            const auto r = sim.run(p.execute_outcome([fail] { return counted_awaitable{fail}; }));
            CHECK(name_of(how(r)) == std::string(name_of(fail == 0 ? ends::value : ends::runtime_error)));
            const ends at_ready = fail == 2 ? ends::runtime_error : ends::value;
            const auto by_reference =
                sim.run(p.execute_outcome([fail] { return counted_by_reference{fail}; }));
            CHECK(name_of(how(by_reference)) == std::string(name_of(at_ready)));
            const auto own = sim.run(p.execute_outcome([fail] { return counted_own{fail}; }));
            CHECK(name_of(how(own)) == std::string(name_of(at_ready)));
            CHECK(counted_awaitable::alive == 0);
        });
    }
}

TEST_CASE("action shapes: a policy's run calls the next it is given: a coroutine lambda whose captures "
          "live as long as the call, or one giving any awaitable of an outcome",
          "[action_shapes]") {
    rs::testing::simulation sim;
    auto policies = every_policy(sim.clock());
    for_each_policy(policies, [&](const char* policy, const auto& p) {
        INFO(policy);
        const rs::context ctx;
        // The string is on the heap: a task reading it from a destroyed copy of the lambda reads freed
        // memory (AddressSanitizer reports it; the size read may be anything).
        const std::string text(64, 'x');
        const auto next = [text](const rs::context&) -> rs::task<rs::outcome<int>> {
            co_return static_cast<int>(text.size());
        };
        CHECK(sim.run(p.run(next, ctx)).value() == 64);
        CHECK(sim.run(p.run([](const rs::context&) { return ready_outcome{42}; }, ctx)).value() == 42);
    });
}

TEST_CASE("action shapes: ignoring stop, or never finishing but honouring it", "[action_shapes]") {
    rs::testing::simulation sim;
    auto policies = every_policy(sim.clock());
    for_each_policy(policies, [&](const char* policy, const auto& p) {
        INFO(policy);
        // The caller stops at 1 s. An action that ignores it finishes at 2 s with its value: the
        // policy waits for it (nothing outlives the call).
        {
            resilience::stop_source caller;
            const auto start = sim.now();
            auto [r, ignored] = sim.run(rs::when_all(p.execute_outcome(
                                                         [&]() -> rs::task<int> {
                                                             co_await sim.sleep_for(2s);
                                                             co_return 42;
                                                         },
                                                         caller.get_token()),
                                                     resilience_tests::stop_at(sim, caller, start + 1s)));
            CHECK(sim.now() - start == 2s);
            // The value is returned (docs/core.md, "A call its caller stopped"), a hedge's too; the
            // owner of a single flight that stopped ends as cancelled (docs/single_flight.md).
            const bool stop_wins = std::string(policy) == "single_flight";
            CHECK(how(r) == (stop_wins ? ends::cancelled : ends::value));
        }
        // One that would never finish but honours its token ends when the caller stops.
        {
            resilience::stop_source caller;
            const auto start = sim.now();
            auto [r, ignored] =
                sim.run(rs::when_all(p.execute_outcome(
                                         [&](resilience::stop_token st) -> rs::task<int> {
                                             co_await sim.sleep_for(std::chrono::hours{24 * 365}, st);
                                             if (st.stop_requested())
                                                 throw rs::cancelled_error{};
                                             co_return 42;
                                         },
                                         caller.get_token()),
                                     resilience_tests::stop_at(sim, caller, start + 1s)));
            CHECK(sim.now() - start == 1s);
            CHECK(how(r) == ends::cancelled);
        }
    });
    // Under a timeout, the deadline is what stops it.
    rs::timeout limit{1s, sim.clock()};
    const auto start = sim.now();
    const auto r = sim.run(limit.execute_outcome([&](resilience::stop_token st) -> rs::task<int> {
        co_await sim.sleep_for(std::chrono::hours{24 * 365}, st);
        throw rs::cancelled_error{};
    }));
    CHECK(sim.now() - start == 1s);
    CHECK(how(r) == ends::timeout);
}

namespace {

// Resumes the awaiting coroutine on a new thread, which the test joins.
struct on_new_thread {
    std::thread& thread;
    std::chrono::microseconds pause;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) { start(thread, pause, h); }
    // Out of line, so that nothing of the thread's start lives in the coroutine's frame: once the
    // thread runs, it may resume and end the awaiting coroutine, frame and awaiter included.
    [[gnu::noinline]] static void start(std::thread& slot, std::chrono::microseconds p,
                                        std::coroutine_handle<> h) {
        slot = std::thread([h, p] {
            if (p.count() > 0)
                std::this_thread::sleep_for(p);
            h.resume();
        });
    }
    void await_resume() const noexcept {}
};

// steady_clock's time and sleeps, without loop timers: a timeout on it takes its generic path.
struct plain_clock {
    using duration = rs::steady_clock::duration;
    using time_point = rs::steady_clock::time_point;
    time_point now() const noexcept { return rs::steady_clock{}.now(); }
    auto sleep_until(time_point tp, resilience::stop_token st) const {
        return rs::steady_clock{}.sleep_until(tp, std::move(st));
    }
};
static_assert(rs::clock<plain_clock> && !rs::detail::loop_timer_clock<plain_clock>);

// Resumes the awaiting coroutine on `loop`, from whatever thread it is on.
struct back_to {
    rs::event_loop& loop;
    bool await_ready() const noexcept { return rs::event_loop::current() == &loop; }
    void await_suspend(std::coroutine_handle<> h) const { loop.post(h); }
    void await_resume() const noexcept {}
};

// Runs `rounds` calls through `policy`, each finishing on a new thread after `pause`; returns how
// many of them resumed the caller on another thread than the loop's.
template <class Policy>
int calls_back_elsewhere(const Policy& policy, int rounds, std::chrono::microseconds pause, int& values) {
    rs::event_loop loop;
    int elsewhere = 0;
    loop.run([&]() -> rs::task<void> {
        const auto home = std::this_thread::get_id();
        for (int i = 0; i < rounds; ++i) {
            std::thread worker;
            const auto r = co_await policy.execute_outcome([&]() -> rs::task<int> {
                co_await on_new_thread{worker, pause};
                co_return 42;
            });
            if (std::this_thread::get_id() != home)
                ++elsewhere;
            if (r.has_value() && r.value() == 42)
                ++values;
            co_await back_to{loop}; // back to the loop (when it was not) before joining
            worker.join();
        }
    }());
    return elsewhere;
}

} // namespace

TEST_CASE("action shapes: a call completing on another thread returns on the caller's loop",
          "[action_shapes][concurrency]") {
    auto policies = every_policy(rs::steady_clock{});
    for_each_policy(policies, [&](const char* policy, const auto& p) {
        INFO(policy);
        int values = 0;
        CHECK(calls_back_elsewhere(p, 20, 0us, values) == 0);
        CHECK(values == 20);
    });
}

TEST_CASE("timeout: on a clock without loop timers, the caller resumes on its own loop",
          "[timeout][action_shapes][concurrency][regression]") {
    // The generic path joined the attempt and a watcher with when_all, which resumes the caller on
    // whichever finishes last: the attempt's thread when it finished there after the watcher.
    // Calls finishing at once race the watcher; calls finishing after the deadline lose to it.
    const rs::timeout<plain_clock> plain{200us, plain_clock{}};
    const rs::timeout<rs::any_clock> erased{200us, rs::any_clock{plain_clock{}}};
    const rs::timeout<plain_clock> roomy{1h, plain_clock{}};
    int values = 0;
    CHECK(calls_back_elsewhere(plain, 20, 2ms, values) == 0); // the deadline passes first
    CHECK(values == 20);                                      // a late value is still returned
    values = 0;
    CHECK(calls_back_elsewhere(erased, 20, 2ms, values) == 0);
    CHECK(values == 20);
    values = 0;
    CHECK(calls_back_elsewhere(roomy, 300, 0us, values) == 0); // the attempt finishes first
    CHECK(values == 300);
}

TEST_CASE("bulkhead: a queued caller handed its slot from another thread resumes on its own loop",
          "[bulkhead][action_shapes][concurrency]") {
    // The holder finishes on a worker thread, which releases the slot and hands it to the queued
    // caller there; with a queue_timeout the queued wait is joined with its watchdog. Both callers
    // must still end on the loop they called from, with and without loop timers on the clock.
    const auto check = [](const auto& bulkhead) {
        rs::event_loop loop;
        int elsewhere = 0, values = 0;
        for (int round = 0; round < 50; ++round) {
            std::thread worker;
            const auto caller = [&](bool holds) -> rs::task<void> {
                const auto home = std::this_thread::get_id();
                const auto r = co_await bulkhead.execute_outcome([&worker, holds]() -> rs::task<int> {
                    if (holds)
                        co_await on_new_thread{worker, 200us};
                    co_return 42;
                });
                if (std::this_thread::get_id() != home)
                    ++elsewhere;
                if (r.has_value() && r.value() == 42)
                    ++values;
            };
            auto holder = caller(true);
            auto queued = caller(false);
            loop.run(
                [&]() -> rs::task<void> { co_await rs::when_all(std::move(holder), std::move(queued)); }());
            worker.join();
        }
        CHECK(elsewhere == 0);
        CHECK(values == 100);
    };
    check(rs::bulkhead{{.max_concurrent_calls = 1, .queue_limit = 1}, plain_clock{}});
    check(rs::bulkhead{{.max_concurrent_calls = 1, .queue_limit = 1, .queue_timeout = 1h}, plain_clock{}});
    check(
        rs::bulkhead{{.max_concurrent_calls = 1, .queue_limit = 1, .queue_timeout = 1h}, rs::steady_clock{}});
}

} // namespace test_action_shapes
