// SPDX-License-Identifier: MIT
// Who owns a call's coroutines while it waits on Asio: an io_context destroyed with operations pending
// destroys them, with everything they own, as it destroys any pending handler. Run under the asan preset
// (LeakSanitizer is part of it) these tests also show that nothing leaks and nothing is touched after it
// is freed; on any build they count the objects the waiting coroutines own.
#include "catch.hpp"
#include "support.hpp"

#include "asio_flavour.hpp"
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <coroutine>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>

namespace test_asio_lifetime {

namespace rs = resilience;
using resilience_tests::tracked;
using namespace std::chrono_literals;

namespace {

using stream = net::local::stream_protocol::socket;

// An attempt that opens its own connection (a socket pair here) and waits for a reply that never comes.
auto read_forever(net::io_context& io) {
    return [&io]() -> rs::task<int> {
        tracked owned;
        stream client{io}, server{io};
        net::local::connect_pair(client, server);
        std::array<char, 16> buf{};
        auto [ec, n] = co_await client.async_read_some(net::buffer(buf), rsa::use_task);
        if (ec)
            throw net_system_error(ec);
        co_return static_cast<int>(n);
    };
}

// Operations that break the usual pattern, written the way any Asio operation is: an initiating
// function that throws, one that drops its handler, one that completes inside the initiating function.
template <class Token>
auto refusing_op(Token&& token) {
    return net::async_initiate<Token, void(net_error_code)>(
        [](auto handler) {
            (void)handler;
            throw std::runtime_error("refused");
        },
        token);
}
template <class Token>
auto dropping_op(Token&& token) {
    return net::async_initiate<Token, void(net_error_code)>([](auto handler) { (void)handler; }, token);
}
template <class Token>
auto inline_op(Token&& token) {
    return net::async_initiate<Token, void(net_error_code, int)>(
        [](auto handler) { std::move(handler)(net_error_code{}, 7); }, token);
}

// Resumes the awaiting coroutine on a thread of its own, as a bulkhead releasing a slot there would.
struct resume_elsewhere {
    std::thread& thread;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) { start(thread, h); }
    // Out of line, so that nothing of the thread's start lives in the coroutine's frame, which the
    // thread may end before the start returns.
    [[gnu::noinline]] static void start(std::thread& slot, std::coroutine_handle<> h) {
        slot = std::thread([h] { h.resume(); });
    }
    void await_resume() const noexcept {}
};

} // namespace

TEST_CASE("asio: destroying the io_context with a use_task read pending destroys the waiting call",
          "[asio][lifetime]") {
    REQUIRE(tracked::live == 0);
    bool completed = false;
    {
        auto io = std::make_unique<net::io_context>();
        rsa::clock clock{io->get_executor()};
        // Two operations pending at the end: the attempt's read and the timeout's timer.
        rs::pipeline policy{rs::retry{{.max_attempts = 2}, clock}, rs::timeout{1h, clock}};
        rsa::async_run(io->get_executor(), policy.execute(read_forever(*io)),
                       [&](std::exception_ptr, int) { completed = true; });
        io->poll(); // runs until the read and the timer wait
        CHECK(tracked::live == 1);
        io->stop();
        io.reset();
    }
    CHECK(tracked::live == 0);
    CHECK_FALSE(completed); // destroyed, not called, as Asio does with any pending handler
}

TEST_CASE("asio: destroying the io_context during a retry's backoff destroys the waiting call",
          "[asio][lifetime]") {
    REQUIRE(tracked::live == 0);
    int attempts = 0;
    auto io = std::make_unique<net::io_context>();
    rsa::clock clock{io->get_executor()};
    rs::retry retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1h}}, clock};
    auto fails = [&]() -> rs::task<int> {
        ++attempts;
        throw std::runtime_error("503");
        co_return 0;
    };
    auto call = [&]() -> rs::task<int> {
        tracked owned; // in the caller's frame, above the retry's
        co_return co_await retry.execute(fails);
    };
    rsa::async_run(io->get_executor(), call(), [](std::exception_ptr, int) {});
    io->poll();
    CHECK(attempts == 1);
    CHECK(tracked::live == 1);
    io.reset();
    CHECK(tracked::live == 0);
}

TEST_CASE("asio: an async_run awaited with use_task inside another is destroyed with it",
          "[asio][lifetime]") {
    REQUIRE(tracked::live == 0);
    auto io = std::make_unique<net::io_context>();
    auto inner = [](net::io_context& ctx) -> rs::task<int> {
        auto attempt = read_forever(ctx);
        co_return co_await attempt();
    };
    auto outer = [&]() -> rs::task<void> {
        tracked owned;
        auto [error, n] = co_await rsa::async_run(io->get_executor(), inner(*io), rsa::use_task);
        (void)error;
        (void)n;
    };
    rsa::async_run(io->get_executor(), outer(), [](std::exception_ptr) {});
    io->poll();
    CHECK(tracked::live == 2);
    io.reset();
    CHECK(tracked::live == 0);
}

TEST_CASE("asio: an io_context destroyed before an async_run started destroys the awaitable unstarted",
          "[asio][lifetime]") {
    REQUIRE(tracked::live == 0);
    bool ran = false;
    auto io = std::make_unique<net::io_context>();
    auto call = [](std::shared_ptr<tracked>, bool& flag) -> rs::task<void> {
        flag = true;
        co_return;
    };
    rsa::async_run(io->get_executor(), call(std::make_shared<tracked>(), ran), [](std::exception_ptr) {});
    CHECK(tracked::live == 1);
    io.reset();
    CHECK_FALSE(ran);
    CHECK(tracked::live == 0);
}

#if defined(                                                                                                 \
    RESILIENCE_TEST_HAS_CO_AWAIT) // net::awaitable: g++ only with Debian's Asio 1.22 (see docs/asio.md)
TEST_CASE("asio: an Asio coroutine awaiting async_run is destroyed with the call", "[asio][lifetime]") {
    REQUIRE(tracked::live == 0);
    auto io = std::make_unique<net::io_context>();
    rsa::clock clock{io->get_executor()};
    rs::timeout limit{1h, clock};
    net::co_spawn(
        *io,
        [&]() -> net::awaitable<void> {
            tracked owned; // in Asio's frame: freed by Asio once our operation drops its handler
            co_await rsa::async_run(io->get_executor(), limit.execute(read_forever(*io)), net::use_awaitable);
        },
        net::detached);
    io->poll();
    CHECK(tracked::live == 2);
    io.reset();
    CHECK(tracked::live == 0);
}
#endif

TEST_CASE("asio: an initiating function that throws hands the exception to the coroutine, which goes on",
          "[asio][lifetime]") {
    // Its handler was destroyed uncalled, but the call is not lost: had it been taken for lost, the
    // call would be destroyed while suspended below, and resumed afterwards on the other thread.
    net::io_context io;
    std::thread other;
    std::string caught;
    int result = 0;
    auto call = [&]() -> rs::task<int> {
        try {
            co_await refusing_op(rsa::use_task);
        } catch (const std::runtime_error& e) {
            caught = e.what();
        }
        co_await resume_elsewhere{other};
        co_return 42;
    };
    rsa::async_run(io.get_executor(), call(), [&](std::exception_ptr, int v) { result = v; });
    io.run_for(10s);
    other.join();
    CHECK(caught == "refused");
    CHECK(result == 42);
}

TEST_CASE(
    "asio: an operation that drops its handler is reported, and one that completes inline resumes at once",
    "[asio][lifetime]") {
    net::io_context io;
    std::string reported;
    int inline_value = 0;
    auto call = [&]() -> rs::task<void> {
        try {
            co_await dropping_op(rsa::use_task);
        } catch (const std::logic_error& e) {
            reported = e.what();
        }
        auto [ec, v] = co_await inline_op(rsa::use_task);
        inline_value = ec ? -1 : v;
    };
    bool completed = false;
    rsa::async_run(io.get_executor(), call(), [&](std::exception_ptr e) { completed = (e == nullptr); });
    io.run_for(10s);
    // The message names the flavour's namespace.
    CHECK(reported.rfind(std::string("resilience::") + asio_flavour_namespace + "::use_task: the operation",
                         0) == 0);
    CHECK(inline_value == 7);
    CHECK(completed);
}

TEST_CASE("asio: use_task in a coroutine driven by rs::sync_wait, with the io_context on another thread",
          "[asio][lifetime]") {
    net::io_context io;
    auto work = net::make_work_guard(io);
    std::thread runner([&] { io.run(); });
    net::steady_timer timer{io, 1ms};
    resilience::stop_source never;
    auto waits = [&]() -> rs::task<net_error_code> {
        auto [ec] = co_await timer.async_wait(rsa::use_task(never.get_token()));
        co_return ec;
    };
    net_error_code ec = rs::sync_wait(waits());
    work.reset();
    runner.join();
    CHECK(!ec);
}

} // namespace test_asio_lifetime
