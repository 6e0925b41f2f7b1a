// SPDX-License-Identifier: MIT
// The timers of calls started by rs::asio::execute / rs::boost_asio::execute on the default clock: one
// wheel and one Asio timer per io_context (asio_flavour/async_run.hpp, `call_registry`), armed for the
// earliest deadline. Real timers kept short; nothing asserts how long anything took beyond "not before
// the deadline" and "well before a deadline that must not be waited for".
#include "catch.hpp"

#include "asio_flavour.hpp"
#include <resilience/resilience.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace test_asio_timers {

namespace rs = resilience;
using namespace std::chrono_literals;

// Without Asio awaitables too (standalone Asio 1.22 with clang): an rs::task action.
TEST_CASE("asio timers: an rs::task action's backoffs sleep on the context's timers, and an unfired "
          "deadline leaves nothing armed",
          "[asio][execute][timers]") {
    net::io_context io{GENERATE(1, -1)};
    rs::pipeline policy{
        rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{5ms, rs::jitter::none}}},
        rs::timeout{1h}};
    int attempts = 0;
    auto action = [&]() -> rs::task<int> {
        if (++attempts < 3)
            throw std::runtime_error("not yet");
        co_return 9;
    };
    int got = 0;
    std::exception_ptr error;
    rsa::execute(io, policy, action, [&](std::exception_ptr e, int v) {
        error = e;
        got = v;
    });
    const auto started = std::chrono::steady_clock::now();
    io.run_for(30s);
    const auto took = std::chrono::steady_clock::now() - started;
    CHECK_FALSE(error);
    CHECK(got == 9);
    CHECK(attempts == 3);
    CHECK(io.stopped()); // run returned: the hour-long deadline's Asio timer was cancelled
    CHECK(took >= 10ms); // two backoffs of 5 ms, slept on Asio timers
    CHECK(took < 20s);
}

#if RESILIENCE_TEST_HAS_CO_AWAIT

// An attempt that waits `delay` on an Asio timer (ended early, with operation_aborted, when cancelled).
struct sleeper {
    std::chrono::milliseconds delay;
    net::awaitable<int> operator()() const {
        net::steady_timer t{co_await net::this_coro::executor, delay};
        co_await t.async_wait(net::use_awaitable);
        co_return 1;
    }
};

net::awaitable<int> ready() {
    co_return 42;
}

// Concurrency hints below: -1, the default (a call serialises itself on a strand); 1, one thread (the
// call runs on the io_context's executor itself, started inside the initiating function).

TEST_CASE("asio timers: a call whose timeout did not fire leaves no timer armed", "[asio][execute][timers]") {
    net::io_context io{GENERATE(1, -1)};
    rs::pipeline policy{rs::retry{}, rs::timeout{1h}};
    int got = 0;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            for (int i = 0; i < 3; ++i)
                got += co_await rsa::execute(
                    policy, [] { return ready(); }, net::use_awaitable);
        },
        net::detached);
    const auto started = std::chrono::steady_clock::now();
    io.run_for(30s);
    CHECK(got == 126);
    CHECK(io.stopped()); // run returned: the hour-long deadline's Asio timer was cancelled
    CHECK(std::chrono::steady_clock::now() - started < 20s);
}

TEST_CASE("asio timers: a deadline armed after a later one fires first", "[asio][execute][timers]") {
    net::io_context io{GENERATE(1, -1)};
    rs::timeout long_timeout{1h};
    rs::timeout short_timeout{20ms};
    std::vector<std::string> order;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            const int v = co_await rsa::execute(long_timeout, sleeper{300ms}, net::use_awaitable);
            order.push_back("long " + std::to_string(v));
        },
        net::detached);
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            const auto started = std::chrono::steady_clock::now();
            try {
                (void)co_await rsa::execute(short_timeout, sleeper{1h}, net::use_awaitable);
                order.push_back("short: no timeout");
            } catch (const rs::timeout_error&) {
                order.push_back(
                    std::chrono::steady_clock::now() - started >= 20ms
                        ? "short timed out"
                        : "short: too early " +
                              std::to_string((std::chrono::steady_clock::now() - started).count()));
            }
        },
        net::detached);
    io.run_for(30s);
    CHECK(order == std::vector<std::string>{"short timed out", "long 1"});
    CHECK(io.stopped());
}

TEST_CASE("asio timers: a timeout on coarse_steady_clock times out on the context's timers, and one "
          "that did not fire leaves nothing armed",
          "[asio][execute][timers]") {
    // Both steady clocks always have a timer to arm (the loop's, or here the context's), so a pipeline
    // compiles no watch beside the call for them; a clock that may have none keeps it.
    static_assert(rs::timeout<rs::steady_clock>::enter_never_waits &&
                  rs::timeout<rs::coarse_steady_clock>::enter_never_waits &&
                  !rs::timeout<rs::any_clock>::enter_never_waits);
    // Its deadline is taken from a coarse reading, which may lag by a tick or two (docs/core.md): no
    // check of how early it fired, only that it did, long before the action's hour.
    net::io_context io{GENERATE(1, -1)};
    rs::timeout<rs::coarse_steady_clock> short_timeout{20ms, rs::coarse_steady_clock{}};
    rs::timeout<rs::coarse_steady_clock> long_timeout{1h, rs::coarse_steady_clock{}};
    std::vector<std::string> order;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            try {
                (void)co_await rsa::execute(short_timeout, sleeper{1h}, net::use_awaitable);
                order.push_back("short: no timeout");
            } catch (const rs::timeout_error&) {
                order.push_back("short timed out");
            }
            order.push_back("long " + std::to_string(co_await rsa::execute(long_timeout, sleeper{5ms},
                                                                           net::use_awaitable)));
        },
        net::detached);
    const auto started = std::chrono::steady_clock::now();
    io.run_for(30s);
    CHECK(order == std::vector<std::string>{"short timed out", "long 1"});
    CHECK(io.stopped()); // run returned: the hour-long deadline's timer was cancelled
    CHECK(std::chrono::steady_clock::now() - started < 20s);
}

TEST_CASE("asio timers: retry backoffs sleep on the context's timers", "[asio][execute][timers]") {
    net::io_context io{GENERATE(1, -1)};
    rs::retry policy{{.max_attempts = 3, .backoff = rs::constant_backoff{5ms, rs::jitter::none}}};
    int attempts = 0;
    auto flaky = [&]() -> net::awaitable<int> {
        if (++attempts < 3)
            throw std::runtime_error("not yet");
        co_return 7;
    };
    int got = 0;
    net::co_spawn(
        io, [&]() -> net::awaitable<void> { got = co_await rsa::execute(policy, flaky, net::use_awaitable); },
        net::detached);
    const auto started = std::chrono::steady_clock::now();
    io.run_for(30s);
    CHECK(got == 7);
    CHECK(attempts == 3);
    CHECK(std::chrono::steady_clock::now() - started >= 10ms);
    CHECK(io.stopped());
}

TEST_CASE("asio timers: deadlines of calls on an io_context run by four threads", "[asio][execute][timers]") {
    net::io_context io{4};
    rs::timeout policy{15ms};
    rs::timeout generous{1h};
    std::atomic<int> timed_out{0}, answered{0}, wrong{0};
    constexpr int calls = 24;
    for (int i = 0; i < calls; ++i) {
        net::co_spawn(
            io,
            [&, i]() -> net::awaitable<void> {
                try {
                    if (i % 2 == 0) {
                        (void)co_await rsa::execute(policy, sleeper{1h}, net::use_awaitable);
                        ++wrong;
                    } else {
                        answered += co_await rsa::execute(generous, sleeper{std::chrono::milliseconds{i}},
                                                          net::use_awaitable);
                    }
                } catch (const rs::timeout_error&) {
                    ++timed_out;
                } catch (...) {
                    ++wrong;
                }
            },
            net::detached);
    }
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t)
        threads.emplace_back([&] { io.run_for(30s); });
    io.run_for(30s);
    for (auto& t : threads)
        t.join();
    CHECK(timed_out == calls / 2);
    CHECK(answered == calls / 2);
    CHECK(wrong == 0);
    CHECK(io.stopped());
}

#endif

} // namespace test_asio_timers
