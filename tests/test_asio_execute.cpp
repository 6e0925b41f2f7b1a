// SPDX-License-Identifier: MIT
// rs::asio::execute / rs::boost_asio::execute: a call through a policy as an Asio asynchronous
// operation with awaitable actions, on the default clock (the policies sleep on the call's executor).
// Real timers kept short; nothing asserts how long anything took beyond "not before the deadline".
#include "catch.hpp"

#include "asio_flavour.hpp"
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace test_asio_execute {

namespace rs = resilience;
using namespace std::chrono_literals;

struct flaky_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Without Asio awaitables too (standalone Asio 1.22 with clang): an rs::task action.
TEST_CASE("asio execute: an rs::task action works too", "[asio][execute]") {
    net::io_context io;
    rs::retry policy{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms}}};
    int calls = 0;
    auto action = [&]() -> rs::task<int> {
        if (++calls < 2)
            throw flaky_error("first");
        co_return 3;
    };
    int value = 0;
    rsa::execute(io, policy, action, [&](std::exception_ptr, int v) { value = v; });
    io.run_for(10s);
    CHECK(value == 3);
    CHECK(calls == 2);
}

#if RESILIENCE_TEST_HAS_CO_AWAIT

// An action that fails `failures` times, then answers 7, each attempt after an Asio timer of `delay`.
struct flaky {
    int failures;
    std::chrono::milliseconds delay{0};
    std::shared_ptr<int> calls = std::make_shared<int>(0);
    net::awaitable<int> operator()() const {
        const int n = ++*calls;
        if (delay > 0ms) {
            net::steady_timer t{co_await net::this_coro::executor, delay};
            co_await t.async_wait(net::use_awaitable);
        }
        if (n <= failures)
            throw flaky_error("attempt " + std::to_string(n));
        co_return 7;
    }
};

TEST_CASE("asio execute: an awaitable action that fits is kept type-erased, so every such action of one "
          "result type shares one call body",
          "[asio][execute]") {
    // What a second call site costs a build (docs/install.md): the action `execute` wraps must return an
    // rs::task<T> and fit the erased action's capacity (four pointers, the call's executor among them),
    // or each action type compiles a call body of its own.
    int calls = 0;
    const auto by_reference = [&calls]() -> net::awaitable<int> { co_return ++calls; };
    STATIC_REQUIRE(rs::detail::erasable_action<rsa::detail::asio_action<decltype(by_reference)>>());
    // flaky (a count, a duration and a shared_ptr) is past the capacity: it gets a call body of its own.
    STATIC_REQUIRE(!rs::detail::erasable_action<rsa::detail::asio_action<flaky>>());
}

TEST_CASE("asio execute: an awaitable action retried on the default clock, awaited with use_awaitable",
          "[asio][execute]") {
    net::io_context io;
    rs::pipeline policy{
        rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{5ms, rs::jitter::none}}},
        rs::timeout{1s}};
    flaky action{2};
    int got = 0;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> { got = co_await rsa::execute(policy, action, net::use_awaitable); },
        net::detached);
    const auto started = std::chrono::steady_clock::now();
    io.run_for(10s);
    CHECK(got == 7);
    CHECK(*action.calls == 3);
    CHECK(std::chrono::steady_clock::now() - started >= 10ms); // two backoffs, slept on Asio timers
}

TEST_CASE("asio execute: a failure is rethrown in the awaiting coroutine, a callback gets it as "
          "exception_ptr",
          "[asio][execute]") {
    net::io_context io;
    rs::retry policy{{.max_attempts = 2, .backoff = rs::constant_backoff{1ms}}};
    bool caught = false;
    const flaky always{5};
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            try {
                (void)co_await rsa::execute(policy, always, net::use_awaitable);
            } catch (const flaky_error&) {
                caught = true;
            }
        },
        net::detached);
    std::exception_ptr error;
    int value = -1;
    rsa::execute(io.get_executor(), policy, flaky{5}, [&](std::exception_ptr e, int v) {
        error = e;
        value = v;
    });
    io.run_for(10s);
    CHECK(caught);
    REQUIRE(error);
    CHECK_THROWS_AS(std::rethrow_exception(error), flaky_error);
    CHECK(value == 0);
}

TEST_CASE("asio execute: the handler never runs inside the initiating call", "[asio][execute]") {
    net::io_context io;
    rs::retry policy{{.max_attempts = 1}};
    bool returned = false, ran_after_return = false;
    rsa::execute(io.get_executor(), policy, flaky{0},
                 [&](std::exception_ptr, int) { ran_after_return = returned; });
    returned = true;
    io.run_for(10s);
    CHECK(ran_after_return);
}

TEST_CASE("asio execute: a timeout cancels the attempt's Asio operation with terminal cancellation",
          "[asio][execute]") {
    net::io_context io;
    rs::timeout policy{20ms};
    bool aborted = false;
    auto slow = [&]() -> net::awaitable<int> {
        net::steady_timer t{co_await net::this_coro::executor, 1h};
        try {
            co_await t.async_wait(net::use_awaitable);
        } catch (const net_system_error& e) {
            aborted = e.code() == net::error::operation_aborted;
            throw;
        }
        co_return 1;
    };
    bool timed_out = false;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            try {
                (void)co_await rsa::execute(policy, slow, net::use_awaitable);
            } catch (const rs::timeout_error&) {
                timed_out = true;
            }
        },
        net::detached);
    io.run_for(10s);
    CHECK(timed_out);
    CHECK(aborted);
    CHECK(io.stopped()); // nothing left behind: run returned once the work was done
}

TEST_CASE("asio execute: use_future, with an executor", "[asio][execute]") {
    net::io_context io;
    rs::retry policy{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms}}};
    std::future<int> f = rsa::execute(io.get_executor(), policy, flaky{1}, net::use_future);
    io.run_for(10s);
    CHECK(f.get() == 7);
}

TEST_CASE("asio execute: the same policy serves one io_context after another, and an event loop",
          "[asio][execute]") {
    rs::pipeline policy{rs::retry{{.max_attempts = 2, .backoff = rs::constant_backoff{1ms}}},
                        rs::timeout{1s}};
    const flaky once{1};
    for (int round = 0; round < 2; ++round) {
        net::io_context io;
        int value = 0;
        rsa::execute(io, policy, once, [&](std::exception_ptr, int v) { value = v; });
        io.run_for(10s);
        CHECK(value == 7);
        *once.calls = 0;
    }
    // The default clock sleeps on the loop when the call runs there (rs::task action).
    int attempts = 0;
    auto task_action = [&]() -> rs::task<int> {
        if (++attempts < 2)
            throw flaky_error("first");
        co_return 5;
    };
    CHECK(rs::sync_wait(policy.execute(task_action)) == 5);
    CHECK(attempts == 2);
}

TEST_CASE("asio execute: any_policy, reloadable and a registry's handle are policies here too",
          "[asio][execute]") {
    net::io_context io;
    rs::registry<> policies;
    auto breaker = policies.breaker("execute-breaker");
    rs::any_policy<int> erased{
        rs::pipeline{rs::retry{{.max_attempts = 2, .backoff = rs::constant_backoff{1ms}}}, rs::timeout{1s}}};
    rs::reloadable<rs::retry<>> reloaded{
        rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms}}}};
    const flaky once{1}, twice{2}, never{0};
    std::vector<int> got;
    auto keep = [&](std::exception_ptr e, int v) { got.push_back(e ? -1 : v); };
    rsa::execute(io, erased, once, keep);
    rsa::execute(io, reloaded, twice, keep);
    rsa::execute(io, breaker, never, keep);
    io.run_for(10s);
    CHECK(got.size() == 3);
    CHECK(std::count(got.begin(), got.end(), 7) == 3);
    CHECK(*once.calls == 2);
    CHECK(*twice.calls == 3);
}

#endif

} // namespace test_asio_execute
