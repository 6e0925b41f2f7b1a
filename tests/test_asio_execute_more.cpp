// SPDX-License-Identifier: MIT
// rs::asio::execute / rs::boost_asio::execute, what a user relies on beyond test_asio_execute.cpp: every
// completion token, cancellation both ways (the caller's slot, the policies' stops of an attempt), the
// default clock sleeping on the call's executor for every policy that waits (also through async_run and
// spawn), shared handles on an io_context run by 4 threads, where a granted waiter resumes, teardown
// with calls in flight, and a completed call leaving nothing armed. Real timers kept short; nothing
// asserts how long anything took beyond "not before the deadline" and "long before a 1h timer".
#include "catch.hpp"
#include "support.hpp"

#include "asio_flavour.hpp"
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>

#if !defined(RESILIENCE_TEST_BOOST_ASIO)
#include <asio/experimental/as_tuple.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <variant>
#include <vector>

namespace test_asio_execute_more {

namespace rs = resilience;
using namespace std::chrono_literals;
using std::chrono::steady_clock;

struct flaky_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

using resilience_tests::holds;

// Runs `io` until it runs out of work (10s at most): true when it did, that is when nothing is left
// armed or counted on it.
bool runs_dry(net::io_context& io) {
    io.run_for(10s);
    return io.stopped();
}

TEST_CASE("asio execute more: rs::task actions need no Asio coroutines: a callback, use_future, use_task",
          "[asio][execute][tokens]") {
    net::io_context io;
    rs::pipeline policy{rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms}}},
                        rs::timeout{1s}};
    int calls = 0;
    auto action = [&]() -> rs::task<int> {
        if (++calls % 2 == 1)
            throw flaky_error("odd");
        co_return 12;
    };
    int value = 0;
    rsa::execute(io, policy, action, [&](std::exception_ptr e, int v) {
        CHECK_FALSE(e);
        value = v;
    });
    std::future<int> future = rsa::execute(io.get_executor(), policy, action, net::use_future);
    std::tuple<std::exception_ptr, int> via_task;
    auto outer = [&]() -> rs::task<void> {
        via_task = co_await rsa::execute(io.get_executor(), policy, action, rsa::use_task);
    };
    rsa::async_run(
        io.get_executor(), [&](resilience::stop_token) { return outer(); },
        [](std::exception_ptr e) { CHECK_FALSE(e); });
    CHECK(runs_dry(io));
    CHECK(value == 12);
    CHECK(future.get() == 12);
    CHECK_FALSE(std::get<0>(via_task));
    CHECK(std::get<1>(via_task) == 12);
    CHECK(calls == 6);
}

#if RESILIENCE_TEST_HAS_CO_AWAIT

#if defined(RESILIENCE_TEST_BOOST_ASIO)
using net::as_tuple;
#else
using net::experimental::as_tuple;
#endif

// What the attempts of a call did: how many started, how many saw their Asio wait aborted.
struct probe {
    std::atomic<int> attempts{0};
    std::atomic<int> aborted{0};
};

// One attempt: waits `d` on an Asio timer of its executor, then answers `value`.
net::awaitable<int> wait_then(probe& p, steady_clock::duration d, int value) {
    ++p.attempts;
    net::steady_timer t{co_await net::this_coro::executor, d};
    try {
        co_await t.async_wait(net::use_awaitable);
    } catch (const net_system_error& e) {
        if (e.code() == net::error::operation_aborted)
            ++p.aborted;
        throw;
    }
    co_return value;
}

// One attempt that fails at once.
net::awaitable<int> fail_now(probe& p) {
    ++p.attempts;
    throw flaky_error("attempt " + std::to_string(p.attempts.load()));
    co_return 0;
}

// ---------------------------------------------------------------------------------------------------------
// 1. Tokens

#if defined(RESILIENCE_TEST_BOOST_ASIO)
TEST_CASE("asio execute more: deferred, then awaited with use_awaitable, runs on the awaiting coroutine's "
          "executor",
          "[asio][execute][tokens]") {
    net::io_context io;
    rs::retry policy{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms, rs::jitter::none}}};
    probe p;
    int calls = 0;
    auto action = [&]() -> net::awaitable<int> {
        if (++calls == 1)
            return fail_now(p);
        return wait_then(p, 1ms, 5);
    };
    int got = 0;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            auto op = rsa::execute(policy, action, net::deferred);
            CHECK(calls == 0); // deferred: nothing started until it is awaited
            got = co_await std::move(op)(net::use_awaitable);
        },
        net::detached);
    CHECK(runs_dry(io));
    CHECK(got == 5);
    CHECK(calls == 2);
}
#endif

TEST_CASE("asio execute more: as_tuple(use_awaitable) hands the failure over as an exception_ptr",
          "[asio][execute][tokens]") {
    net::io_context io;
    rs::retry policy{{.max_attempts = 2, .backoff = rs::constant_backoff{1ms}}};
    probe p;
    auto fails = [&] { return fail_now(p); };
    auto answers = [&] { return wait_then(p, 0ms, 4); };
    std::exception_ptr error, no_error;
    int failed_value = -1, value = -1;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            std::tie(error, failed_value) =
                co_await rsa::execute(policy, fails, as_tuple(net::use_awaitable));
            std::tie(no_error, value) = co_await rsa::execute(policy, answers, as_tuple(net::use_awaitable));
        },
        net::detached);
    CHECK(runs_dry(io));
    REQUIRE(error);
    CHECK(holds<flaky_error>(error));
    CHECK(failed_value == 0);
    CHECK_FALSE(no_error);
    CHECK(value == 4);
    CHECK(p.attempts == 3);
}

TEST_CASE("asio execute more: redirect_error(use_awaitable, ec) passes the value through, but with an "
          "exception_ptr signature a failure is still thrown, as for co_spawn",
          "[asio][execute][tokens]") {
    net::io_context io;
    rs::retry policy{{.max_attempts = 1}};
    probe p;
    auto answers = [&] { return wait_then(p, 0ms, 6); };
    auto fails = [&] { return fail_now(p); };
    net_error_code ec;
    int value = 0;
    bool thrown = false;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            value = co_await rsa::execute(policy, answers, net::redirect_error(net::use_awaitable, ec));
            try {
                (void)co_await rsa::execute(policy, fails, net::redirect_error(net::use_awaitable, ec));
            } catch (const flaky_error&) {
                thrown = true;
            }
        },
        net::detached);
    CHECK(runs_dry(io));
    CHECK(value == 6);
    CHECK_FALSE(ec);
    CHECK(thrown);
}

TEST_CASE("asio execute more: a callback runs on its associated executor, not the call's",
          "[asio][execute][tokens]") {
    net::io_context io, handler_io;
    rs::retry policy{{.max_attempts = 2, .backoff = rs::constant_backoff{1ms}}};
    probe p;
    int calls = 0;
    auto action = [&]() -> net::awaitable<int> {
        if (++calls == 1)
            return fail_now(p);
        return wait_then(p, 0ms, 8);
    };
    int value = 0;
    bool on_handler_io = false;
    rsa::execute(io.get_executor(), policy, action,
                 net::bind_executor(handler_io, [&](std::exception_ptr e, int v) {
                     CHECK_FALSE(e);
                     value = v;
                     on_handler_io = handler_io.get_executor().running_in_this_thread();
                 }));
    while (calls < 2)
        io.run_one();
    io.poll();
    CHECK(value == 0); // the call is done; its handler waits for handler_io
    CHECK(runs_dry(handler_io));
    CHECK(value == 8);
    CHECK(on_handler_io);
    CHECK(runs_dry(io));

    // The form without an executor takes the handler's: a callback bound to a strand.
    auto strand = net::make_strand(io);
    bool on_strand = false;
    io.restart();
    rsa::execute(policy, action, net::bind_executor(strand, [&](std::exception_ptr, int v) {
                     value = v;
                     on_strand = strand.running_in_this_thread();
                 }));
    CHECK(runs_dry(io));
    CHECK(value == 8);
    CHECK(on_strand);
}

TEST_CASE("asio execute more: use_future with an executor, a failure from get() and a void action",
          "[asio][execute][tokens]") {
    net::io_context io;
    rs::retry policy{{.max_attempts = 2, .backoff = rs::constant_backoff{1ms}}};
    probe p;
    auto fails = [&] { return fail_now(p); };
    int done = 0;
    auto void_action = [&]() -> net::awaitable<void> {
        ++done;
        co_return;
    };
    std::future<int> failed = rsa::execute(io.get_executor(), policy, fails, net::use_future);
    std::future<void> finished = rsa::execute(io, policy, void_action, net::use_future);
    CHECK(runs_dry(io));
    CHECK_THROWS_AS(failed.get(), flaky_error);
    CHECK(p.attempts == 2);
    finished.get();
    CHECK(done == 1);
}

TEST_CASE("asio execute more: awaitable<void> actions complete with void(std::exception_ptr)",
          "[asio][execute][tokens]") {
    net::io_context io;
    rs::pipeline policy{rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms}}},
                        rs::timeout{1s}};
    int calls = 0;
    auto second_time = [&]() -> net::awaitable<void> {
        if (++calls % 2 == 1)
            throw flaky_error("odd");
        co_return;
    };
    int always_calls = 0;
    auto always = [&]() -> net::awaitable<void> {
        ++always_calls;
        throw flaky_error("always");
        co_return;
    };
    std::exception_ptr callback_error = std::make_exception_ptr(0), failed_error;
    int callbacks = 0;
    rsa::execute(io, policy, second_time, [&](std::exception_ptr e) {
        callback_error = e;
        ++callbacks;
    });
    rsa::execute(io.get_executor(), policy, always, [&](std::exception_ptr e) { failed_error = e; });
    bool awaited = false, rethrown = false;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            co_await rsa::execute(policy, second_time, net::use_awaitable);
            awaited = true;
            try {
                co_await rsa::execute(policy, always, net::use_awaitable);
            } catch (const flaky_error&) {
                rethrown = true;
            }
        },
        net::detached);
    CHECK(runs_dry(io));
    CHECK(callbacks == 1);
    CHECK_FALSE(callback_error);
    CHECK(holds<flaky_error>(failed_error));
    CHECK(awaited);
    CHECK(rethrown);
    CHECK(calls == 4);
    CHECK(always_calls == 6);
}

TEST_CASE("asio execute more: every kind of policy in the form without an executor, handles included",
          "[asio][execute][tokens]") {
    // A handle has execute(f) and ==, which Asio's executor concept takes for an executor: it must
    // still be the policy of execute(policy, action, token).
    net::io_context io;
    const rs::bulkhead<> bulkhead{{.max_concurrent_calls = 2}};
    const rs::circuit_breaker<> breaker{{.failure_threshold = 5}};
    const rs::rate_limiter<> limiter{{.token_limit = 10, .tokens_per_second = 10}};
    const rs::any_policy<int> erased = rs::retry{{.max_attempts = 2}};
    const rs::pipeline pipeline{rs::retry{{.max_attempts = 2}}, breaker, bulkhead, limiter};
    probe p;
    auto action = [&] { return wait_then(p, 0ms, 1); };
    int sum = 0;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            sum += co_await rsa::execute(bulkhead, action, net::use_awaitable);
            sum += co_await rsa::execute(breaker, action, net::use_awaitable);
            sum += co_await rsa::execute(limiter, action, net::use_awaitable);
            sum += co_await rsa::execute(erased, action, net::use_awaitable);
            sum += co_await rsa::execute(pipeline, action, net::use_awaitable);
        },
        net::detached);
    CHECK(runs_dry(io));
    CHECK(sum == 5);
}

// ---------------------------------------------------------------------------------------------------------
// 2. Cancellation from the caller

// One call through a retry (5 attempts, short backoff) of attempts that wait 1h: the handler's slot
// gets `type` emitted once the first attempt waits. What the call completed with, and its probe.
struct cancelled_call {
    probe p;
    std::exception_ptr error;
    int value = -1;
    bool completed = false;
};

void cancel_while_attempt_waits(cancelled_call& c, net::cancellation_type_t type,
                                steady_clock::duration attempt_time) {
    net::io_context io;
    rs::retry policy{{.max_attempts = 5, .backoff = rs::constant_backoff{1ms}}};
    net::cancellation_signal signal;
    auto action = [&]() -> net::awaitable<int> {
        if (c.p.attempts == 0) // emitted from outside the call, once this attempt waits on its timer
            net::post(io, [&] { signal.emit(type); });
        return wait_then(c.p, attempt_time, 9);
    };
    rsa::execute(io.get_executor(), policy, action,
                 net::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr e, int v) {
                     c.error = e;
                     c.value = v;
                     c.completed = true;
                 }));
    CHECK(runs_dry(io));
}

TEST_CASE("asio execute more: terminal cancellation on the handler's slot ends the call with "
          "cancelled_error, aborts the attempt's timer, retries nothing",
          "[asio][execute][cancellation]") {
    cancelled_call c;
    cancel_while_attempt_waits(c, net::cancellation_type::terminal, 1h);
    REQUIRE(c.completed);
    CHECK(holds<rs::cancelled_error>(c.error));
    CHECK(c.p.attempts == 1);
    CHECK(c.p.aborted == 1);
}

TEST_CASE("asio execute more: partial cancellation on the handler's slot is honoured as terminal is",
          "[asio][execute][cancellation]") {
    cancelled_call c;
    cancel_while_attempt_waits(c, net::cancellation_type::partial, 1h);
    REQUIRE(c.completed);
    CHECK(holds<rs::cancelled_error>(c.error));
    CHECK(c.p.attempts == 1);
    CHECK(c.p.aborted == 1);
}

TEST_CASE("asio execute more: total cancellation alone is ignored: the call finishes normally",
          "[asio][execute][cancellation]") {
    cancelled_call c;
    cancel_while_attempt_waits(c, net::cancellation_type::total, 20ms);
    REQUIRE(c.completed);
    CHECK_FALSE(c.error);
    CHECK(c.value == 9);
    CHECK(c.p.attempts == 1);
    CHECK(c.p.aborted == 0);
}

TEST_CASE("asio execute more: awaitable_operators ||: a short timer wins over a long call, whose attempt "
          "is aborted and not retried",
          "[asio][execute][cancellation]") {
    using namespace net::experimental::awaitable_operators;
    net::io_context io;
    rs::pipeline policy{rs::retry{{.max_attempts = 5, .backoff = rs::constant_backoff{1ms}}},
                        rs::timeout{1h}};
    probe p;
    auto slow = [&] { return wait_then(p, 1h, 1); };
    std::optional<std::size_t> winner;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            net::steady_timer short_timer{co_await net::this_coro::executor, 10ms};
            auto result = co_await (rsa::execute(policy, slow, net::use_awaitable) ||
                                    short_timer.async_wait(net::use_awaitable));
            winner = result.index();
        },
        net::detached);
    const auto started = steady_clock::now();
    CHECK(runs_dry(io)); // neither the 1h attempt nor the 1h timeout is left behind
    CHECK(steady_clock::now() - started < 5s);
    CHECK(winner == 1u);
    CHECK(p.attempts == 1);
    CHECK(p.aborted == 1);
}

// ---------------------------------------------------------------------------------------------------------
// 3. Cancellation to the attempt

TEST_CASE("asio execute more: a hedge's loser gets operation_aborted when the winner answers, and the delay "
          "is slept on the executor",
          "[asio][execute][cancellation]") {
    net::io_context io;
    rs::hedge policy{{.max_attempts = 2, .delay = 20ms}};
    probe p;
    auto action = [&]() -> net::awaitable<int> {
        if (p.attempts == 0)
            return wait_then(p, 1h, 1); // the first attempt hangs
        return wait_then(p, 1ms, 2);
    };
    int value = 0;
    const auto started = steady_clock::now();
    rsa::execute(io, policy, action, [&](std::exception_ptr e, int v) {
        CHECK_FALSE(e);
        value = v;
    });
    CHECK(runs_dry(io));
    CHECK(steady_clock::now() - started >= 20ms);
    CHECK(value == 2);
    CHECK(p.attempts == 2);
    CHECK(p.aborted == 1);
}

TEST_CASE("asio execute more: a timeout inside a retry aborts each attempt's Asio wait, then the retry "
          "gives up with timeout_error",
          "[asio][execute][cancellation]") {
    net::io_context io;
    rs::pipeline policy{rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms}}},
                        rs::timeout{10ms}};
    probe p;
    auto slow = [&] { return wait_then(p, 1h, 1); };
    std::exception_ptr error;
    const auto started = steady_clock::now();
    rsa::execute(io, policy, slow, [&](std::exception_ptr e, int) { error = e; });
    CHECK(runs_dry(io));
    CHECK(steady_clock::now() - started >= 30ms);
    CHECK(holds<rs::timeout_error>(error));
    CHECK(p.attempts == 3);
    CHECK(p.aborted == 3);
}

// ---------------------------------------------------------------------------------------------------------
// 4. The default clock sleeps on the call's executor

TEST_CASE("asio execute more: a bulkhead's queue timeout on the default clock refuses a queued call",
          "[asio][execute][default-clock]") {
    net::io_context io;
    rs::bulkhead<> policy{{.max_concurrent_calls = 1, .queue_limit = 1, .queue_timeout = 20ms}};
    probe holder, queued;
    auto holds_slot = [&] { return wait_then(holder, 60ms, 1); };
    auto behind = [&] { return wait_then(queued, 0ms, 2); };
    std::exception_ptr holder_error = std::make_exception_ptr(0), queued_error;
    int holder_value = 0;
    steady_clock::time_point refused;
    rsa::execute(io, policy, holds_slot, [&](std::exception_ptr e, int v) {
        holder_error = e;
        holder_value = v;
    });
    const auto started = steady_clock::now();
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            // Queued once the holder is in: the holder's call starts first on the same io_context,
            // and waits on its timer by the time this runs.
            net::steady_timer t{co_await net::this_coro::executor, 1ms};
            co_await t.async_wait(net::use_awaitable);
            REQUIRE(holder.attempts == 1);
            try {
                (void)co_await rsa::execute(policy, behind, net::use_awaitable);
            } catch (...) {
                queued_error = std::current_exception();
                refused = steady_clock::now();
            }
        },
        net::detached);
    CHECK(runs_dry(io));
    CHECK_FALSE(holder_error);
    CHECK(holder_value == 1);
    REQUIRE(queued_error);
    try {
        std::rethrow_exception(queued_error);
    } catch (const rs::bulkhead_rejected_error& e) {
        CHECK(e.reason() == rs::rejection_reason::queue_timeout);
    } catch (...) {
        FAIL("not a bulkhead_rejected_error");
    }
    CHECK(refused - started >= 20ms);
    CHECK(queued.attempts == 0);
}

TEST_CASE("asio execute more: a rate limiter that queues waits for its tokens on the default clock",
          "[asio][execute][default-clock]") {
    net::io_context io;
    // One token at a time, one every 20ms: the third call waits for two refills.
    rs::rate_limiter<> policy{{.token_limit = 1, .tokens_per_second = 50, .queue_limit = 5}};
    probe p;
    auto action = [&] { return wait_then(p, 0ms, 3); };
    int sum = 0;
    std::vector<steady_clock::time_point> answered;
    const auto started = steady_clock::now();
    for (int i = 0; i < 3; ++i)
        rsa::execute(io, policy, action, [&](std::exception_ptr e, int v) {
            CHECK_FALSE(e);
            sum += v;
            answered.push_back(steady_clock::now());
        });
    CHECK(runs_dry(io));
    CHECK(sum == 9);
    REQUIRE(answered.size() == 3);
    CHECK(*std::max_element(answered.begin(), answered.end()) - started >= 40ms);
}

// An rs::task action for async_run and spawn: fails `failures` times, then answers 11.
struct task_flaky {
    int failures;
    std::shared_ptr<int> calls = std::make_shared<int>(0);
    rs::task<int> operator()(resilience::stop_token) const {
        if (++*calls <= failures)
            throw flaky_error("attempt");
        co_return 11;
    }
};

TEST_CASE("asio execute more: async_run and spawn calls sleep on the default clock too (retry backoff, "
          "timeout)",
          "[asio][execute][default-clock]") {
    net::io_context io;
    rs::pipeline policy{
        rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{10ms, rs::jitter::none}}},
        rs::timeout{1s}};
    const task_flaky run_action{2}, spawn_action{2};
    rs::async_scope scope;
    int run_value = 0, spawn_value = 0;
    const auto started = steady_clock::now();
    rsa::async_run(
        io.get_executor(), [&](resilience::stop_token st) { return policy.execute(run_action, st); },
        [&](std::exception_ptr e, int v) {
            CHECK_FALSE(e);
            run_value = v;
        });
    rsa::spawn(
        scope, io.get_executor(), [&](resilience::stop_token st) { return policy.execute(spawn_action, st); },
        [&](std::exception_ptr e, int v) {
            CHECK_FALSE(e);
            spawn_value = v;
        });
    CHECK(runs_dry(io));
    CHECK(steady_clock::now() - started >= 20ms);
    CHECK(run_value == 11);
    CHECK(spawn_value == 11);
    CHECK(*run_action.calls == 3);
    CHECK(*spawn_action.calls == 3);

    // A timeout on the default clock, through async_run, ends an rs::task attempt that waits.
    rs::timeout limit{10ms};
    bool timed_out = false;
    io.restart();
    rsa::async_run(
        io.get_executor(),
        [&](resilience::stop_token st) {
            return limit.execute(
                [](resilience::stop_token attempt) -> rs::task<int> {
                    co_await rs::steady_clock{}.sleep_for(1h, attempt);
                    if (attempt.stop_requested()) // a value returned anyway would be the answer
                        throw rs::cancelled_error{};
                    co_return 1;
                },
                st);
        },
        [&](std::exception_ptr e, int) { timed_out = holds<rs::timeout_error>(e); });
    CHECK(runs_dry(io));
    CHECK(timed_out);
}

// ---------------------------------------------------------------------------------------------------------
// 5. Several threads

TEST_CASE("asio execute more: 200 calls through shared handles on an io_context run by 4 threads",
          "[asio][execute][threads]") {
    net::io_context io{4};
    rs::circuit_breaker<> breaker{{.failure_threshold = 1000}};
    rs::bulkhead<> bulkhead{{.max_concurrent_calls = 8, .queue_limit = rs::unbounded_queue}};
    rs::rate_limiter<> limiter{
        {.token_limit = 50, .tokens_per_second = 20000, .queue_limit = rs::unbounded_queue}};
    rs::pipeline policy{rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms}}}, breaker,
                        bulkhead, limiter, rs::timeout{5s}};
    constexpr int calls = 200;
    std::atomic<int> attempts{0}, inside{0}, most_inside{0};
    std::vector<std::atomic<int>> tries(calls);
    auto attempt = [&](int i) -> net::awaitable<int> {
        ++attempts;
        const int now_inside = ++inside;
        int seen = most_inside.load();
        while (now_inside > seen && !most_inside.compare_exchange_weak(seen, now_inside)) {
        }
        net::steady_timer t{co_await net::this_coro::executor, 1ms};
        co_await t.async_wait(net::use_awaitable);
        --inside;
        if (++tries[static_cast<std::size_t>(i)] == 1 && i % 3 == 0)
            throw flaky_error("first attempt of a third of the calls");
        co_return i;
    };
    std::atomic<long> sum{0};
    std::atomic<int> failures{0}, completed{0};
    for (int i = 0; i < calls; ++i)
        rsa::execute(
            io, policy, [&attempt, i] { return attempt(i); },
            [&](std::exception_ptr e, int v) {
                if (e)
                    ++failures;
                sum += v;
                ++completed;
            });
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&] { io.run(); });
    for (auto& t : threads)
        t.join();
    CHECK(completed == calls);
    CHECK(failures == 0);
    CHECK(sum == long{calls} * (calls - 1) / 2);
    CHECK(attempts == calls + (calls + 2) / 3);
    CHECK(most_inside <= 8);
}

TEST_CASE("asio execute more: a call granted a bulkhead slot by a call ending elsewhere goes on on its own "
          "executor",
          "[asio][execute][threads]") {
    net::io_context io{4};
    rs::bulkhead<> policy{{.max_concurrent_calls = 1, .queue_limit = rs::unbounded_queue}};
    constexpr int calls = 20;
    std::atomic<int> on_own = 0, elsewhere = 0, completed = 0;
    for (int i = 0; i < calls; ++i) {
        // Each call on a strand of its own: while its action runs, only that strand may be running
        // on the thread, whichever call's end granted it the slot.
        auto strand = net::make_strand(io);
        auto action = [&, strand]() -> rs::task<int> {
            (strand.running_in_this_thread() ? on_own : elsewhere)++;
            co_await rs::steady_clock{}.sleep_for(1ms, {}); // holding the slot: the others queue
            (strand.running_in_this_thread() ? on_own : elsewhere)++;
            co_return 1;
        };
        rsa::execute(strand, policy, action, [&](std::exception_ptr e, int) {
            CHECK_FALSE(e);
            ++completed;
        });
    }
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&] { io.run(); });
    for (auto& t : threads)
        t.join();
    CHECK(completed == calls);
    CHECK(on_own == 2 * calls);
    CHECK(elsewhere == 0);
}

// ---------------------------------------------------------------------------------------------------------
// 6. Teardown with calls in flight

// Something a call's handler holds: gone once the handler is, which an io_context destroyed with the
// call in flight must do, without running it.
struct handler_probe {
    std::shared_ptr<int> held = std::make_shared<int>(0);
    std::weak_ptr<int> watch = held;
    bool ran = false;
};

TEST_CASE("asio execute more: an io_context destroyed with calls in a backoff, in a bulkhead queue and in "
          "an attempt frees them all, starts no attempt, the policies outliving it",
          "[asio][execute][teardown]") {
    rs::retry backoff_policy{{.max_attempts = 3, .backoff = rs::constant_backoff{1h}}};
    rs::bulkhead<> bulkhead{{.max_concurrent_calls = 1, .queue_limit = 1, .queue_timeout = 1h}};
    rs::pipeline pending_policy{rs::retry{{.max_attempts = 3}}, rs::timeout{1h}};
    probe backing_off, holding, queued, pending;
    handler_probe h1, h2, h3, h4;
    {
        net::io_context io;
        auto handler = [](handler_probe& h) {
            return [&h, held = h.held](std::exception_ptr, int) { h.ran = true; };
        };
        rsa::execute(
            io, backoff_policy, [&] { return fail_now(backing_off); }, handler(h1));
        rsa::execute(
            io, bulkhead, [&] { return wait_then(holding, 1h, 1); }, handler(h2));
        rsa::execute(
            io, bulkhead, [&] { return wait_then(queued, 0ms, 1); }, handler(h3));
        rsa::execute(
            io, pending_policy, [&] { return wait_then(pending, 1h, 1); }, handler(h4));
        for (handler_probe* h : {&h1, &h2, &h3, &h4})
            h->held.reset();
        while (backing_off.attempts + holding.attempts + pending.attempts < 3)
            io.run_one();
        io.poll(); // everything in place: one in its backoff, one queued, two attempts waiting
        CHECK(bulkhead.queued() == 1);
    }
    for (handler_probe* h : {&h1, &h2, &h3, &h4}) {
        CHECK(h->watch.expired());
        CHECK_FALSE(h->ran);
    }
    CHECK(backing_off.attempts == 1);
    CHECK(holding.attempts == 1);
    CHECK(queued.attempts == 0);
    CHECK(pending.attempts == 1);
    // The bulkhead's slot and queue place came back with the calls.
    CHECK(bulkhead.in_flight() == 0);
    CHECK(bulkhead.queued() == 0);
}

TEST_CASE("asio execute more: policies destroyed before the io_context that holds their calls",
          "[asio][execute][teardown]") {
    probe backing_off, holding, queued, pending;
    handler_probe h1, h2, h3, h4;
    std::optional<net::io_context> io{std::in_place};
    {
        rs::retry backoff_policy{{.max_attempts = 3, .backoff = rs::constant_backoff{1h}}};
        rs::bulkhead<> bulkhead{{.max_concurrent_calls = 1, .queue_limit = 1, .queue_timeout = 1h}};
        rs::pipeline pending_policy{rs::retry{{.max_attempts = 3}}, rs::timeout{1h}};
        auto handler = [](handler_probe& h) {
            return [&h, held = h.held](std::exception_ptr, int) { h.ran = true; };
        };
        rsa::execute(
            *io, backoff_policy, [&] { return fail_now(backing_off); }, handler(h1));
        rsa::execute(
            *io, bulkhead, [&] { return wait_then(holding, 1h, 1); }, handler(h2));
        rsa::execute(
            *io, bulkhead, [&] { return wait_then(queued, 0ms, 1); }, handler(h3));
        // An rvalue pipeline: moved into the call.
        rsa::execute(
            *io, rs::pipeline{rs::retry{{.max_attempts = 3}}, rs::timeout{1h}},
            [&] { return wait_then(pending, 1h, 1); }, handler(h4));
        for (handler_probe* h : {&h1, &h2, &h3, &h4})
            h->held.reset();
        while (backing_off.attempts + holding.attempts + pending.attempts < 3)
            io->run_one();
        io->poll();
    } // the policies go first, the calls still suspended in the io_context
    io.reset();
    for (handler_probe* h : {&h1, &h2, &h3, &h4}) {
        CHECK(h->watch.expired());
        CHECK_FALSE(h->ran);
    }
    CHECK(backing_off.attempts == 1);
    CHECK(holding.attempts == 1);
    CHECK(queued.attempts == 0);
    CHECK(pending.attempts == 1);
}

// ---------------------------------------------------------------------------------------------------------
// 7. A completed call leaves nothing behind

TEST_CASE("asio execute more: a completed call leaves no timer armed: run() returns long before a 1h "
          "timeout, hedge delay or queue timeout",
          "[asio][execute][teardown]") {
    net::io_context io;
    rs::pipeline policy{
        rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1h}}},
        rs::hedge{{.max_attempts = 2, .delay = 1h}},
        rs::bulkhead<>{{.max_concurrent_calls = 1, .queue_limit = 4, .queue_timeout = 1h}},
        rs::rate_limiter<>{
            {.token_limit = 100, .tokens_per_second = 1, .queue_limit = 4, .queue_timeout = 1h}},
        rs::timeout{1h}};
    probe p;
    auto action = [&] { return wait_then(p, 1ms, 5); };
    int sum = 0;
    for (int i = 0; i < 3; ++i) // two of them queue in the bulkhead, then get the slot
        rsa::execute(io, policy, action, [&](std::exception_ptr e, int v) {
            CHECK_FALSE(e);
            sum += v;
        });
    const auto started = steady_clock::now();
    CHECK(runs_dry(io));
    CHECK(steady_clock::now() - started < 5s);
    CHECK(sum == 15);
    CHECK(p.attempts == 3);
}

#endif

} // namespace test_asio_execute_more
