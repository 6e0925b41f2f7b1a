// SPDX-License-Identifier: MIT
// Review of the Asio-native calls (issue 36): shared handles on an io_context run by several threads,
// policies that sleep on the call's executor, teardown with calls in flight.
#include "catch.hpp"
#include "support.hpp"

#include "asio_flavour.hpp"
#include <resilience/resilience.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace test_asio_review {

namespace rs = resilience;
using namespace std::chrono_literals;

struct flaky_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Runs `io` on `n` threads until it runs out of work; false if it had to be stopped after 20 s.
inline bool run_on_threads(net::io_context& io, int n) {
    std::atomic<bool> done{false}, stopped{false};
    std::thread watchdog([&] {
        const auto until = std::chrono::steady_clock::now() + 20s;
        while (!done.load() && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(5ms);
        if (!done.load()) {
            stopped = true;
            io.stop();
        }
    });
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i)
        threads.emplace_back([&] { io.run(); });
    for (auto& t : threads)
        t.join();
    done = true;
    watchdog.join();
    return !stopped.load();
}

// An rs::task action: no Asio awaitables needed.
TEST_CASE("asio review: shared retry, timeout and bulkhead on io_context run by 4 threads, rs::task "
          "actions",
          "[asio][review]") {
    net::io_context io{4};
    const rs::pipeline policy{
        rs::bulkhead{{.max_concurrent_calls = 2, .queue_limit = 64, .queue_timeout = 5s}},
        rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms, rs::jitter::none}}},
        rs::timeout{2s}};
    std::atomic<int> ok{0}, failed{0};
    constexpr int calls = 48;
    for (int i = 0; i < calls; ++i) {
        auto attempts = std::make_shared<int>(0);
        rsa::execute(
            io.get_executor(), policy,
            [attempts, i]() -> rs::task<int> {
                if (++*attempts == 1 && i % 2 == 0)
                    throw flaky_error("first");
                co_return i;
            },
            [&, i](std::exception_ptr e, int v) { (e || v != i ? failed : ok)++; });
    }
    CHECK(run_on_threads(io, 4));
    CHECK(ok == calls);
    CHECK(failed == 0);
}

resilience_tests::started_here start_here(rs::task<int> call, std::optional<int>& out) {
    out.emplace(co_await std::move(call));
}

#if RESILIENCE_TEST_HAS_CO_AWAIT

net::awaitable<int> after(std::chrono::milliseconds d, int v) {
    net::steady_timer t{co_await net::this_coro::executor, d};
    co_await t.async_wait(net::use_awaitable);
    co_return v;
}

TEST_CASE("asio review: shared pipeline with hedge and single_flight on io_context run by 4 threads",
          "[asio][review]") {
    net::io_context io{4};
    const rs::pipeline policy{
        rs::bulkhead{{.max_concurrent_calls = 3, .queue_limit = 64, .queue_timeout = 5s}},
        rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms, rs::jitter::none}}},
        rs::timeout{2s}, rs::hedge{{.max_attempts = 2, .delay = 2ms}}};
    std::atomic<int> ok{0}, failed{0};
    constexpr int calls = 40;
    for (int i = 0; i < calls; ++i) {
        auto attempts = std::make_shared<std::atomic<int>>(0);
        rsa::execute(
            io.get_executor(), policy,
            [attempts, i]() -> net::awaitable<int> {
                const int n = ++*attempts;
                if (n == 1 && i % 3 == 0)
                    throw flaky_error("first");
                co_return co_await after(n == 1 ? 5ms : 1ms, i);
            },
            [&, i](std::exception_ptr e, int v) { (e || v != i ? failed : ok)++; });
    }
    CHECK(run_on_threads(io, 4));
    CHECK(ok == calls);
    CHECK(failed == 0);
}

// A hedge's loser is cancelled from its call's strand; the attempt must run there too, or the emission
// races with the attempt's coroutine on another thread (its timer's cancellation handler freed under it).
TEST_CASE("asio review: an attempt's awaitable runs on its call's strand, where a policy cancels it (an "
          "io_context run by 4 threads)",
          "[asio][review]") {
    net::io_context io{4};
    const rs::hedge policy{{.max_attempts = 2, .delay = 1ms}};
    std::atomic<int> on_a_strand{0}, elsewhere{0}, completed{0};
    constexpr int calls = 16;
    for (int i = 0; i < calls; ++i) {
        auto attempts = std::make_shared<std::atomic<int>>(0);
        rsa::execute(
            io.get_executor(), policy,
            [&, attempts]() -> net::awaitable<int> {
                const auto ex = co_await net::this_coro::executor;
                const auto* strand = ex.target<net::strand<net::any_io_executor>>();
                (strand && strand->running_in_this_thread() ? on_a_strand : elsewhere)++;
                // The first attempt loses to the second and is cancelled in its wait.
                co_return co_await after(++*attempts == 1 ? 1h : 1ms, 1);
            },
            [&](std::exception_ptr e, int v) {
                CHECK_FALSE(e);
                CHECK(v == 1);
                ++completed;
            });
    }
    CHECK(run_on_threads(io, 4));
    CHECK(completed == calls);
    CHECK(on_a_strand == 2 * calls);
    CHECK(elsewhere == 0);
}

TEST_CASE("asio review: single_flight followers on other strands, then a retry backoff on the default "
          "clock, io_context run by 4 threads",
          "[asio][review]") {
    net::io_context io{4};
    rs::single_flight<int, int> flights;
    std::atomic<int> ok{0}, failed{0}, shared_calls{0};
    std::atomic<int> firsts[4] = {0, 0, 0, 0};
    constexpr int calls = 24;
    for (int i = 0; i < calls; ++i) {
        // retry outside the shared call: a follower that got the shared failure backs off on its own home.
        auto tries = &firsts[i % 4];
        rsa::execute(
            io.get_executor(),
            rs::pipeline{rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{2ms}}},
                         flights.policy(i % 4)},
            [&, tries]() -> net::awaitable<int> {
                ++shared_calls;
                const int n = ++*tries;
                co_await after(3ms, 0);
                if (n == 1)
                    throw flaky_error("first");
                co_return 5;
            },
            [&](std::exception_ptr e, int v) {
                if (e) {
                    try {
                        std::rethrow_exception(e);
                    } catch (const std::exception& x) {
                        WARN(x.what());
                    }
                }
                (e || v != 5 ? failed : ok)++;
            });
    }
    CHECK(run_on_threads(io, 4));
    CHECK(ok + failed == calls);
    CHECK(failed == 0);
}

TEST_CASE("asio review: an io_context destroyed with calls sleeping, queued and in an attempt frees all",
          "[asio][review]") {
    auto started = std::make_shared<std::atomic<int>>(0);
    // With a timer made before the first call, Asio's timer services shut down after the calls'
    // registry rather than before it.
    const bool timer_first = GENERATE(false, true);
    {
        const rs::pipeline policy{
            rs::bulkhead{{.max_concurrent_calls = 1, .queue_limit = 8, .queue_timeout = 1h}},
            rs::retry{{.max_attempts = 5, .backoff = rs::constant_backoff{1h}}}, rs::timeout{2h}};
        net::io_context io;
        std::optional<net::steady_timer> early;
        if (timer_first)
            early.emplace(io, 1h);
        for (int i = 0; i < 4; ++i)
            rsa::execute(
                io, policy,
                [started, i]() -> net::awaitable<int> {
                    ++*started;
                    if (i == 0)
                        throw flaky_error("backs off for an hour");
                    co_return co_await after(1h, 1);
                },
                [](std::exception_ptr, int) { FAIL("completed"); });
        // A call in an attempt, without the bulkhead.
        rsa::execute(
            io, rs::timeout{1h},
            [started]() -> net::awaitable<int> {
                ++*started;
                co_return co_await after(1h, 1);
            },
            [](std::exception_ptr, int) { FAIL("completed"); });
        io.run_for(50ms);
        CHECK(*started == 2);
    }
    CHECK(*started == 2);
}

TEST_CASE("asio review: a retry of 100 attempts with a callback bound to an unconnected cancellation slot, "
          "on io_context run by 4 threads",
          "[asio][review]") {
    net::io_context io{4};
    const rs::pipeline policy{rs::retry{{.max_attempts = 100, .backoff = rs::constant_backoff{1ms}}},
                              rs::timeout{1s}};
    std::atomic<bool> cancelled{false};
    std::atomic<int> attempts{0};
    rsa::execute(
        io, policy,
        [&](resilience::stop_token st) -> net::awaitable<int> {
            ++attempts;
            (void)st;
            co_await after(1ms, 0);
            throw flaky_error("again");
        },
        net::bind_cancellation_slot(net::cancellation_slot{}, [&](std::exception_ptr e, int) {
            try {
                if (e)
                    std::rethrow_exception(e);
            } catch (const flaky_error&) {
                cancelled = true;
            } catch (...) {
            }
        }));
    CHECK(run_on_threads(io, 4));
    CHECK(cancelled);
    CHECK(attempts == 100);
}

TEST_CASE("asio review: calls whose policies armed hour-long timers leave none behind: run() returns",
          "[asio][review]") {
    net::io_context io{4};
    const rs::pipeline policy{
        rs::bulkhead{{.max_concurrent_calls = 1, .queue_limit = 16, .queue_timeout = 1h}},
        rs::rate_limiter{
            {.token_limit = 2, .tokens_per_second = 200, .queue_limit = 16, .queue_timeout = 1h}},
        rs::timeout{1h}, rs::hedge{{.max_attempts = 2, .delay = 1h}}};
    std::atomic<int> ok{0};
    for (int i = 0; i < 8; ++i)
        rsa::execute(
            io, policy, [] { return after(1ms, 3); },
            [&](std::exception_ptr e, int v) { ok += !e && v == 3; });
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(run_on_threads(io, 4));
    CHECK(ok == 8);
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

TEST_CASE("asio review: timeouts that fire on attempts in flight, retried, on io_context run by 4 threads",
          "[asio][review]") {
    net::io_context io{4};
    const rs::pipeline policy{rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms}}},
                              rs::hedge{{.max_attempts = 2, .delay = 1ms}}, rs::timeout{3ms}};
    std::atomic<int> timed_out{0}, attempts{0};
    constexpr int calls = 24;
    for (int i = 0; i < calls; ++i)
        rsa::execute(
            io, policy,
            [&]() -> net::awaitable<int> {
                ++attempts;
                co_return co_await after(1h, 1);
            },
            [&](std::exception_ptr e, int) {
                try {
                    if (e)
                        std::rethrow_exception(e);
                } catch (const rs::timeout_error&) {
                    ++timed_out;
                } catch (...) {
                }
            });
    CHECK(run_on_threads(io, 4));
    CHECK(timed_out == calls);
    CHECK(attempts >= 3 * calls);
}

TEST_CASE("asio review: an io_context stopped while 4 threads run calls, then destroyed, frees all",
          "[asio][review]") {
    std::atomic<int> completed{0};
    {
        net::io_context io{4};
        // Destroyed before the io_context that holds the suspended calls, as docs/core.md allows.
        const rs::pipeline policy{
            rs::bulkhead{{.max_concurrent_calls = 4, .queue_limit = 64, .queue_timeout = 1h}},
            rs::retry{{.max_attempts = 1000, .backoff = rs::constant_backoff{1ms}}},
            rs::hedge{{.max_attempts = 2, .delay = 1ms}}, rs::timeout{2ms}};
        for (int i = 0; i < 32; ++i)
            rsa::execute(
                io, policy, []() -> net::awaitable<int> { co_return co_await after(1h, 1); },
                [&](std::exception_ptr, int) { ++completed; });
        std::vector<std::thread> threads;
        for (int i = 0; i < 4; ++i)
            threads.emplace_back([&] { io.run_for(60ms); });
        for (auto& t : threads)
            t.join();
    }
    CHECK(completed == 0);
}

// A call with no home, granted inline by an Asio call leaving a bulkhead, runs on under that call's
// home; what it queues for next must not come back to that home once the Asio call has ended.
TEST_CASE("asio review: a homeless call granted by an Asio call then queued again is not resumed on the "
          "ended call's home",
          "[asio][review]") {
    net::io_context io;
    const rs::bulkhead first{{.max_concurrent_calls = 1, .queue_limit = 4}};
    const rs::bulkhead second{{.max_concurrent_calls = 1, .queue_limit = 4}};
    int a = 0, d = 0;
    rsa::execute(
        io, second, [] { return after(1000ms, 4); }, [&](std::exception_ptr, int v) { d = v; });
    rsa::execute(
        io, first, [] { return after(500ms, 3); }, [&](std::exception_ptr, int v) { a = v; });
    // Until both calls are in their attempts (wide margins: a loaded machine may pause this thread).
    for (int i = 0; i < 400 && !(first.in_flight() == 1 && second.in_flight() == 1); ++i)
        io.run_one_for(1ms);
    REQUIRE(first.in_flight() == 1);
    REQUIRE(second.in_flight() == 1);
    std::optional<int> b;
    start_here(rs::pipeline{first, second}.execute([]() -> rs::task<int> { co_return 5; }), b);
    CHECK_FALSE(b);
    io.run_for(10s);
    CHECK(a == 3);
    CHECK(d == 4);
    CHECK(b == 5);
}

// The same through single_flight: a homeless follower released inline by an Asio owner.
TEST_CASE("asio review: a homeless single_flight follower released by an Asio owner then queued is not "
          "resumed on the ended call's home",
          "[asio][review]") {
    net::io_context io;
    rs::single_flight<int, int> flights;
    const rs::bulkhead second{{.max_concurrent_calls = 1, .queue_limit = 4}};
    int a = 0, d = 0;
    rsa::execute(
        io, second, [] { return after(1000ms, 4); }, [&](std::exception_ptr, int v) { d = v; });
    rsa::execute(
        io, flights.policy(1), [] { return after(500ms, 3); }, [&](std::exception_ptr, int v) { a = v; });
    // Until both calls are in their attempts (wide margins: a loaded machine may pause this thread).
    for (int i = 0; i < 400 && !(flights.in_flight() == 1 && second.in_flight() == 1); ++i)
        io.run_one_for(1ms);
    REQUIRE(flights.in_flight() == 1);
    REQUIRE(second.in_flight() == 1);
    std::optional<int> b;
    auto follower = [&]() -> rs::task<int> {
        const int shared = co_await flights.run(1, []() -> rs::task<int> { co_return 0; });
        co_return shared + co_await second.execute([]() -> rs::task<int> { co_return 2; });
    };
    start_here(follower(), b);
    CHECK_FALSE(b);
    io.run_for(10s);
    CHECK(a == 3);
    CHECK(d == 4);
    CHECK(b == 5);
}

#if defined(RESILIENCE_TEST_BOOST_ASIO)
TEST_CASE("asio review: calls lost by awaitable_operators' || on io_context run by 4 threads are "
          "stopped from the threads of the io_context",
          "[asio][review]") {
    using namespace net::experimental::awaitable_operators;
    net::io_context io{4};
    const rs::pipeline policy{
        rs::bulkhead{{.max_concurrent_calls = 2, .queue_limit = 64, .queue_timeout = 1h}},
        rs::retry{{.max_attempts = 1000, .backoff = rs::constant_backoff{1ms, rs::jitter::none}}},
        rs::timeout{1h}};
    std::atomic<int> lost{0}, attempts{0};
    constexpr int calls = 40;
    for (int i = 0; i < calls; ++i)
        net::co_spawn(
            io,
            [&, i]() -> net::awaitable<void> {
                auto r = co_await (rsa::execute(
                                       policy,
                                       [&, i]() -> net::awaitable<int> {
                                           ++attempts;
                                           if (i % 2)
                                               throw flaky_error("again");
                                           co_return co_await after(1h, 1);
                                       },
                                       net::use_awaitable) ||
                                   after(std::chrono::milliseconds(1 + i % 5), 2));
                lost += r.index() == 1;
            },
            net::detached);
    CHECK(run_on_threads(io, 4));
    CHECK(lost == calls);
}
#endif

#endif

} // namespace test_asio_review
