// SPDX-License-Identifier: MIT
// Stop tokens and Asio per-operation cancellation, both ways, on a real io_context with local socket
// pairs: a stopped attempt token ends a pending read (`use_task(st)`), and Asio cancellation of an
// `async_run` operation stops the policy call it runs. Real time only where an Asio timer must run;
// every check is on an outcome, none on a duration.
#include "catch.hpp"
#include "support.hpp"

#include <resilience/asio.hpp>
#include <resilience/resilience.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/io_context.hpp>
#include <asio/local/connect_pair.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>
#if defined(ASIO_HAS_CO_AWAIT)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/use_awaitable.hpp>
#endif

#include <array>
#include <atomic>
#include <chrono>
#include <exception>
#include <latch>
#include <memory>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <variant>
#include <vector>

namespace test_asio_cancellation {

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

using stream = ::asio::local::stream_protocol::socket;

struct socket_pair {
    stream client, server;
    explicit socket_pair(::asio::io_context& io) : client(io), server(io) {
        ::asio::local::connect_pair(client, server);
    }
};

template <class E>
bool holds(const std::exception_ptr& e) {
    try {
        std::rethrow_exception(e);
    } catch (const E&) {
        return true;
    } catch (...) {
        return false;
    }
}

} // namespace

// ---------------------------------------------------------------------------------------------------------
// Stop token -> Asio

TEST_CASE("asio: a timeout ends a pending use_task(st) read with operation_aborted", "[asio][cancellation]") {
    ::asio::io_context io;
    socket_pair pair{io};
    rs::asio::clock clock{io.get_executor()};
    rs::timeout limit{20ms, clock};
    std::error_code read_ec;
    auto reads = [&](std::stop_token st) -> rs::task<std::size_t> {
        std::array<char, 16> buf{};
        auto [ec, n] = co_await pair.client.async_read_some(::asio::buffer(buf), rs::asio::use_task(st));
        read_ec = ec;
        if (ec)
            throw std::system_error(ec);
        co_return n;
    };
    std::exception_ptr error;
    bool completed = false;
    rs::asio::async_run(io.get_executor(), limit.execute(reads), [&](std::exception_ptr e, std::size_t) {
        error = e;
        completed = true;
    });
    io.run_for(10s);
    REQUIRE(completed);
    CHECK(read_ec == ::asio::error::operation_aborted);
    CHECK(holds<rs::timeout_error>(error));

    // The socket is still usable: cancelling the read took nothing else with it.
    io.restart();
    std::size_t got = 0;
    auto again = [&]() -> rs::task<void> {
        std::array<char, 16> buf{};
        auto [ec, n] = co_await pair.client.async_read_some(::asio::buffer(buf), rs::asio::use_task);
        got = ec ? 0 : n;
    };
    rs::asio::async_run(io.get_executor(), again(), [](std::exception_ptr) {});
    ::asio::write(pair.server, ::asio::buffer(std::string("pong")));
    io.run_for(10s);
    CHECK(got == 4);
}

TEST_CASE("asio: a stop requested from another thread ends a pending read", "[asio][cancellation]") {
    ::asio::io_context io;
    socket_pair pair{io};
    std::stop_source stop;
    std::error_code read_ec;
    bool resumed = false;
    auto reads = [&]() -> rs::task<void> {
        std::array<char, 16> buf{};
        auto [ec, n] =
            co_await pair.client.async_read_some(::asio::buffer(buf), rs::asio::use_task(stop.get_token()));
        (void)n;
        read_ec = ec;
        resumed = true;
    };
    rs::asio::async_run(io.get_executor(), reads(), [](std::exception_ptr) {});
    io.poll(); // the read is pending now
    REQUIRE_FALSE(resumed);
    std::thread([&] { stop.request_stop(); }).join();
    io.run_for(10s);
    CHECK(resumed);
    CHECK(read_ec == ::asio::error::operation_aborted);
}

TEST_CASE("asio: an operation started with a token already stopped is cancelled at once",
          "[asio][cancellation]") {
    ::asio::io_context io;
    ::asio::steady_timer timer{io, std::chrono::steady_clock::now() + 1h};
    std::stop_source stop;
    stop.request_stop();
    std::error_code wait_ec;
    auto waits = [&]() -> rs::task<void> {
        auto [ec] = co_await timer.async_wait(rs::asio::use_task(stop.get_token()));
        wait_ec = ec;
    };
    rs::asio::async_run(io.get_executor(), waits(), [](std::exception_ptr) {});
    io.run_for(10s);
    CHECK(wait_ec == ::asio::error::operation_aborted);
}

TEST_CASE("asio: a stop after the operation completed reaches nothing", "[asio][cancellation]") {
    // The attempt's socket is gone by the time its token is stopped: an emission now would reach a
    // destroyed socket (AddressSanitizer would say so).
    ::asio::io_context io;
    std::stop_source stop;
    std::size_t got = 0;
    auto reads = [&]() -> rs::task<void> {
        auto pair = std::make_unique<socket_pair>(io);
        ::asio::write(pair->server, ::asio::buffer(std::string("hi")));
        std::array<char, 16> buf{};
        auto [ec, n] =
            co_await pair->client.async_read_some(::asio::buffer(buf), rs::asio::use_task(stop.get_token()));
        got = ec ? 0 : n;
        pair.reset();
        stop.request_stop();
    };
    rs::asio::async_run(io.get_executor(), reads(), [](std::exception_ptr) {});
    io.run_for(10s);
    CHECK(got == 2);
}

TEST_CASE("asio: a retry with a timeout per attempt cancels each stalled read until one is answered",
          "[asio][cancellation]") {
    ::asio::io_context io;
    rs::asio::clock clock{io.get_executor()};
    rs::pipeline policy{rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms}}, clock},
                        rs::timeout{20ms, clock}};
    int attempts = 0;
    std::vector<std::error_code> seen;
    auto attempt = [&](std::stop_token st) -> rs::task<std::string> {
        ++attempts;
        socket_pair pair{io}; // a connection of this attempt's own
        if (attempts == 3)
            ::asio::write(pair.server, ::asio::buffer(std::string("quote")));
        std::array<char, 16> buf{};
        auto [ec, n] = co_await pair.client.async_read_some(::asio::buffer(buf), rs::asio::use_task(st));
        seen.push_back(ec);
        if (ec)
            throw std::system_error(ec);
        co_return std::string(buf.data(), n);
    };
    std::string result;
    std::exception_ptr error;
    rs::asio::async_run(io.get_executor(), policy.execute(attempt), [&](std::exception_ptr e, std::string v) {
        error = e;
        result = std::move(v);
    });
    io.run_for(10s);
    CHECK(error == nullptr);
    CHECK(result == "quote");
    REQUIRE(seen.size() == 3);
    CHECK(seen[0] == ::asio::error::operation_aborted);
    CHECK(seen[1] == ::asio::error::operation_aborted);
    CHECK(!seen[2]);
}

TEST_CASE("asio: pending reads on a two-thread io_context all end when stopped from a third thread",
          "[asio][cancellation][concurrency]") {
    ::asio::io_context io;
    constexpr int readers = 50;
    std::vector<std::unique_ptr<socket_pair>> pairs;
    for (int i = 0; i < readers; ++i)
        pairs.push_back(std::make_unique<socket_pair>(io));
    std::stop_source stop;
    std::atomic<int> aborted{0}, finished{0};
    auto reads = [&](stream& s) -> rs::task<void> {
        std::array<char, 16> buf{};
        auto [ec, n] = co_await s.async_read_some(::asio::buffer(buf), rs::asio::use_task(stop.get_token()));
        (void)n;
        if (ec == ::asio::error::operation_aborted)
            aborted.fetch_add(1);
    };
    for (auto& p : pairs)
        rs::asio::async_run(io.get_executor(), reads(p->client),
                            [&](std::exception_ptr) { finished.fetch_add(1); });
    std::thread a([&] { io.run_for(10s); }), b([&] { io.run_for(10s); });
    std::thread stopper([&] { stop.request_stop(); }); // races with the reads still starting
    stopper.join();
    a.join(); // run_for returns once the last handler ran: the reads were the only work
    b.join();
    CHECK(finished.load() == readers);
    CHECK(aborted.load() == readers);
}

// ---------------------------------------------------------------------------------------------------------
// Asio -> stop token

TEST_CASE("asio: cancelling an async_run operation through its slot stops the policy call",
          "[asio][cancellation]") {
    ::asio::io_context io;
    socket_pair pair{io};
    rs::asio::clock clock{io.get_executor()};
    rs::retry retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms}}, clock};
    ::asio::cancellation_signal cancel;
    int attempts = 0;
    std::error_code read_ec;
    bool token_stopped = false;
    auto reads = [&](std::stop_token st) -> rs::task<std::size_t> {
        ++attempts;
        ::asio::post(io, [&] { cancel.emit(::asio::cancellation_type::terminal); }); // runs once we wait
        std::array<char, 16> buf{};
        auto [ec, n] = co_await pair.client.async_read_some(::asio::buffer(buf), rs::asio::use_task(st));
        read_ec = ec;
        token_stopped = st.stop_requested();
        if (ec)
            throw std::system_error(ec);
        co_return n;
    };
    std::exception_ptr error;
    bool completed = false;
    rs::asio::async_run(
        io.get_executor(), [&](std::stop_token st) { return retry.execute(reads, st); },
        ::asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, std::size_t) {
            error = e;
            completed = true;
        }));
    io.run_for(10s);
    REQUIRE(completed);
    CHECK(attempts == 1); // a stopped call is not retried
    CHECK(token_stopped);
    CHECK(read_ec == ::asio::error::operation_aborted);
    CHECK(error != nullptr);
}

TEST_CASE("asio: async_run ignores a request for total cancellation only", "[asio][cancellation]") {
    ::asio::io_context io;
    ::asio::cancellation_signal cancel;
    std::stop_token seen;
    ::asio::steady_timer gate{io, std::chrono::steady_clock::now() + 1h};
    auto waits = [&](std::stop_token st) -> rs::task<int> {
        seen = st;
        auto [ec] = co_await gate.async_wait(rs::asio::use_task(st));
        co_return ec ? 1 : 0;
    };
    int result = -1;
    rs::asio::async_run(
        io.get_executor(), waits,
        ::asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr, int v) { result = v; }));
    io.poll();
    REQUIRE(seen.stop_possible());
    cancel.emit(::asio::cancellation_type::total); // emitted on the io_context's thread (this one)
    CHECK_FALSE(seen.stop_requested());
    cancel.emit(::asio::cancellation_type::partial);
    CHECK(seen.stop_requested());
    io.run_for(10s);
    CHECK(result == 1);
}

TEST_CASE("asio: without a connected slot the callable form passes a token that never stops",
          "[asio][cancellation]") {
    ::asio::io_context io;
    bool possible = true;
    int result = 0;
    rs::asio::async_run(
        io.get_executor(),
        [&](std::stop_token st) -> rs::task<int> {
            possible = st.stop_possible();
            co_return 7;
        },
        [&](std::exception_ptr, int v) { result = v; });
    io.run_for(10s);
    CHECK_FALSE(possible);
    CHECK(result == 7);
}

TEST_CASE("asio: async_run keeps a coroutine lambda given as make alive until the call ends",
          "[asio][cancellation]") {
    ::asio::io_context io;
    ::asio::steady_timer gate{io, 1ms};
    std::string seen;
    rs::asio::async_run(
        io.get_executor(),
        [&gate, &seen, owned = std::string(40, 'x')](std::stop_token st) -> rs::task<void> {
            co_await gate.async_wait(rs::asio::use_task(st));
            seen = owned; // a capture, read after the coroutine first suspended
        },
        [](std::exception_ptr) {});
    io.run_for(10s);
    CHECK(seen == std::string(40, 'x'));
}

TEST_CASE("asio: what make throws is the operation's failure", "[asio][cancellation]") {
    ::asio::io_context io;
    std::exception_ptr error;
    rs::asio::async_run(
        io.get_executor(), [](std::stop_token) -> rs::task<int> { throw std::runtime_error("no call"); },
        [&](std::exception_ptr e, int) { error = e; });
    io.run_for(10s);
    REQUIRE(error != nullptr);
    CHECK_THROWS_WITH(std::rethrow_exception(error), "no call");
}

namespace {
// The `make` of an operation whose action ends inside its stop request (`ends_inside_its_stop`), and
// whose destruction, on the thread that ended the call, waits until `cleared` is counted down.
struct make_held_until_cleared {
    ::asio::io_context* io;
    ::asio::cancellation_signal* cancel;
    std::atomic<bool>* emitting;
    std::latch* cleared;
    bool live = true;

    make_held_until_cleared(::asio::io_context& i, ::asio::cancellation_signal& c, std::atomic<bool>& e,
                            std::latch& l)
        : io(&i), cancel(&c), emitting(&e), cleared(&l) {}
    make_held_until_cleared(make_held_until_cleared&& o) noexcept
        : io(o.io), cancel(o.cancel), emitting(o.emitting), cleared(o.cleared),
          live(std::exchange(o.live, false)) {}
    make_held_until_cleared& operator=(make_held_until_cleared&&) = delete;
    ~make_held_until_cleared() {
        if (live)
            cleared->wait();
    }
    rs::task<int> operator()(std::stop_token st) {
        ::asio::post(*io, [c = cancel, e = emitting] { // runs once the action waits
            e->store(true);
            e->notify_one();
            c->emit(::asio::cancellation_type::terminal);
        });
        return resilience_tests::ends_inside_its_stop(std::move(st));
    }
};
} // namespace

TEST_CASE("asio: a cancellation that ends the call inline, its completion run on another thread of the "
          "io_context meanwhile, is reported as the operation's failure",
          "[asio][cancellation]") {
    // The emitting thread ends the call from inside the stop request and waits, tearing down the
    // call's frame, until the other thread has run the completion, which clears the slot: the stop
    // source installed there goes while the request still has a callback of the action's to run.
    ::asio::io_context io;
    auto work = ::asio::make_work_guard(io);
    ::asio::cancellation_signal cancel;
    std::atomic<bool> emitting{false};
    std::latch cleared{1};
    std::exception_ptr error;
    rs::asio::async_run(io.get_executor(), make_held_until_cleared{io, cancel, emitting, cleared},
                        ::asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, int) {
                            error = e;
                            cleared.count_down();
                        }));
    std::thread emitter([&] { io.run(); });
    emitting.wait(false);
    io.run_one(); // the completion, posted while the emitter is still inside the request
    work.reset();
    emitter.join();
    REQUIRE(error != nullptr);
    CHECK(holds<rs::cancelled_error>(error));
}

#if defined(ASIO_HAS_CO_AWAIT) // asio::awaitable: g++ only with Debian's Asio 1.22 (see docs/asio.md)
TEST_CASE("asio: the losing side of an Asio || stops the policy call and its pending read",
          "[asio][cancellation]") {
    using namespace ::asio::experimental::awaitable_operators;
    ::asio::io_context io;
    socket_pair pair{io};
    rs::asio::clock clock{io.get_executor()};
    rs::timeout limit{1h, clock};
    std::error_code read_ec;
    auto reads = [&](std::stop_token st) -> rs::task<std::size_t> {
        std::array<char, 16> buf{};
        auto [ec, n] = co_await pair.client.async_read_some(::asio::buffer(buf), rs::asio::use_task(st));
        read_ec = ec;
        if (ec)
            throw std::system_error(ec);
        co_return n;
    };
    std::size_t winner = 99;
    ::asio::co_spawn(
        io,
        [&]() -> ::asio::awaitable<void> {
            ::asio::steady_timer deadline{io, 10ms};
            auto r =
                co_await (rs::asio::async_run(
                              io.get_executor(), [&](std::stop_token st) { return limit.execute(reads, st); },
                              ::asio::use_awaitable) ||
                          deadline.async_wait(::asio::use_awaitable));
            winner = r.index();
        },
        ::asio::detached);
    io.run_for(10s);
    CHECK(winner == 1);
    CHECK(read_ec == ::asio::error::operation_aborted);
}
#endif

} // namespace test_asio_cancellation
