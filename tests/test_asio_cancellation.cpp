// SPDX-License-Identifier: MIT
// Stop tokens and Asio per-operation cancellation, both ways, on a real io_context with local socket
// pairs: a stopped attempt token ends a pending read (`use_task(st)`), and Asio cancellation of an
// `async_run` operation stops the policy call it runs. Real time only where an Asio timer must run;
// every check is on an outcome, none on a duration.
#include "catch.hpp"
#include "support.hpp"

#include "asio_flavour.hpp"
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <exception>
#include <latch>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <variant>
#include <vector>

namespace test_asio_cancellation {

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

using stream = net::local::stream_protocol::socket;

struct socket_pair {
    stream client, server;
    explicit socket_pair(net::io_context& io) : client(io), server(io) {
        net::local::connect_pair(client, server);
    }
};

using resilience_tests::holds;

} // namespace

// ---------------------------------------------------------------------------------------------------------
// Stop token -> Asio

TEST_CASE("asio: a timeout ends a pending use_task(st) read with operation_aborted", "[asio][cancellation]") {
    net::io_context io;
    socket_pair pair{io};
    rsa::clock clock{io.get_executor()};
    rs::timeout limit{20ms, clock};
    net_error_code read_ec;
    auto reads = [&](resilience::stop_token st) -> rs::task<std::size_t> {
        std::array<char, 16> buf{};
        auto [ec, n] = co_await pair.client.async_read_some(net::buffer(buf), rsa::use_task(st));
        read_ec = ec;
        if (ec)
            throw net_system_error(ec);
        co_return n;
    };
    std::exception_ptr error;
    bool completed = false;
    rsa::async_run(io.get_executor(), limit.execute(reads), [&](std::exception_ptr e, std::size_t) {
        error = e;
        completed = true;
    });
    io.run_for(10s);
    REQUIRE(completed);
    CHECK(read_ec == net::error::operation_aborted);
    CHECK(holds<rs::timeout_error>(error));

    // The socket is still usable: cancelling the read took nothing else with it.
    io.restart();
    std::size_t got = 0;
    auto again = [&]() -> rs::task<void> {
        std::array<char, 16> buf{};
        auto [ec, n] = co_await pair.client.async_read_some(net::buffer(buf), rsa::use_task);
        got = ec ? 0 : n;
    };
    rsa::async_run(io.get_executor(), again(), [](std::exception_ptr) {});
    net::write(pair.server, net::buffer(std::string("pong")));
    io.run_for(10s);
    CHECK(got == 4);
}

TEST_CASE("asio: a stop requested from another thread ends a pending read", "[asio][cancellation]") {
    net::io_context io;
    socket_pair pair{io};
    resilience::stop_source stop;
    net_error_code read_ec;
    bool resumed = false;
    auto reads = [&]() -> rs::task<void> {
        std::array<char, 16> buf{};
        auto [ec, n] =
            co_await pair.client.async_read_some(net::buffer(buf), rsa::use_task(stop.get_token()));
        (void)n;
        read_ec = ec;
        resumed = true;
    };
    rsa::async_run(io.get_executor(), reads(), [](std::exception_ptr) {});
    io.poll(); // the read is pending now
    REQUIRE_FALSE(resumed);
    std::thread([&] { stop.request_stop(); }).join();
    io.run_for(10s);
    CHECK(resumed);
    CHECK(read_ec == net::error::operation_aborted);
}

TEST_CASE("asio: an operation started with a token already stopped is cancelled at once",
          "[asio][cancellation]") {
    net::io_context io;
    net::steady_timer timer{io, std::chrono::steady_clock::now() + 1h};
    resilience::stop_source stop;
    stop.request_stop();
    net_error_code wait_ec;
    auto waits = [&]() -> rs::task<void> {
        auto [ec] = co_await timer.async_wait(rsa::use_task(stop.get_token()));
        wait_ec = ec;
    };
    rsa::async_run(io.get_executor(), waits(), [](std::exception_ptr) {});
    io.run_for(10s);
    CHECK(wait_ec == net::error::operation_aborted);
}

TEST_CASE("asio: a stop after the operation completed reaches nothing", "[asio][cancellation]") {
    // The attempt's socket is gone by the time its token is stopped: an emission now would reach a
    // destroyed socket (AddressSanitizer would say so).
    net::io_context io;
    resilience::stop_source stop;
    std::size_t got = 0;
    auto reads = [&]() -> rs::task<void> {
        auto pair = std::make_unique<socket_pair>(io);
        net::write(pair->server, net::buffer(std::string("hi")));
        std::array<char, 16> buf{};
        auto [ec, n] =
            co_await pair->client.async_read_some(net::buffer(buf), rsa::use_task(stop.get_token()));
        got = ec ? 0 : n;
        pair.reset();
        stop.request_stop();
    };
    rsa::async_run(io.get_executor(), reads(), [](std::exception_ptr) {});
    io.run_for(10s);
    CHECK(got == 2);
}

TEST_CASE("asio: a retry with a timeout per attempt cancels each stalled read until one is answered",
          "[asio][cancellation]") {
    net::io_context io;
    rsa::clock clock{io.get_executor()};
    rs::pipeline policy{rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms}}, clock},
                        rs::timeout{20ms, clock}};
    int attempts = 0;
    std::vector<net_error_code> seen;
    auto attempt = [&](resilience::stop_token st) -> rs::task<std::string> {
        ++attempts;
        socket_pair pair{io}; // a connection of this attempt's own
        if (attempts == 3)
            net::write(pair.server, net::buffer(std::string("quote")));
        std::array<char, 16> buf{};
        auto [ec, n] = co_await pair.client.async_read_some(net::buffer(buf), rsa::use_task(st));
        seen.push_back(ec);
        if (ec)
            throw net_system_error(ec);
        co_return std::string(buf.data(), n);
    };
    std::string result;
    std::exception_ptr error;
    rsa::async_run(io.get_executor(), policy.execute(attempt), [&](std::exception_ptr e, std::string v) {
        error = e;
        result = std::move(v);
    });
    io.run_for(10s);
    CHECK(error == nullptr);
    CHECK(result == "quote");
    REQUIRE(seen.size() == 3);
    CHECK(seen[0] == net::error::operation_aborted);
    CHECK(seen[1] == net::error::operation_aborted);
    CHECK(!seen[2]);
}

TEST_CASE("asio: pending reads on a two-thread io_context all end when stopped from a third thread",
          "[asio][cancellation][concurrency]") {
    net::io_context io;
    constexpr int readers = 50;
    std::vector<std::unique_ptr<socket_pair>> pairs;
    for (int i = 0; i < readers; ++i)
        pairs.push_back(std::make_unique<socket_pair>(io));
    resilience::stop_source stop;
    std::atomic<int> aborted{0}, finished{0};
    auto reads = [&](stream& s) -> rs::task<void> {
        std::array<char, 16> buf{};
        auto [ec, n] = co_await s.async_read_some(net::buffer(buf), rsa::use_task(stop.get_token()));
        (void)n;
        if (ec == net::error::operation_aborted)
            aborted.fetch_add(1);
    };
    for (auto& p : pairs)
        rsa::async_run(io.get_executor(), reads(p->client),
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
    net::io_context io;
    socket_pair pair{io};
    rsa::clock clock{io.get_executor()};
    rs::retry retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms}}, clock};
    net::cancellation_signal cancel;
    int attempts = 0;
    net_error_code read_ec;
    bool token_stopped = false;
    auto reads = [&](resilience::stop_token st) -> rs::task<std::size_t> {
        ++attempts;
        net::post(io, [&] { cancel.emit(net::cancellation_type::terminal); }); // runs once we wait
        std::array<char, 16> buf{};
        auto [ec, n] = co_await pair.client.async_read_some(net::buffer(buf), rsa::use_task(st));
        read_ec = ec;
        token_stopped = st.stop_requested();
        if (ec)
            throw net_system_error(ec);
        co_return n;
    };
    std::exception_ptr error;
    bool completed = false;
    rsa::async_run(
        io.get_executor(), [&](resilience::stop_token st) { return retry.execute(reads, st); },
        net::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, std::size_t) {
            error = e;
            completed = true;
        }));
    io.run_for(10s);
    REQUIRE(completed);
    CHECK(attempts == 1); // a stopped call is not retried
    CHECK(token_stopped);
    CHECK(read_ec == net::error::operation_aborted);
    CHECK(error != nullptr);
}

TEST_CASE("asio: async_run ignores a request for total cancellation only", "[asio][cancellation]") {
    net::io_context io;
    net::cancellation_signal cancel;
    resilience::stop_token seen;
    net::steady_timer gate{io, std::chrono::steady_clock::now() + 1h};
    auto waits = [&](resilience::stop_token st) -> rs::task<int> {
        seen = st;
        auto [ec] = co_await gate.async_wait(rsa::use_task(st));
        co_return ec ? 1 : 0;
    };
    int result = -1;
    rsa::async_run(
        io.get_executor(), waits,
        net::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr, int v) { result = v; }));
    io.poll();
    REQUIRE(seen.stop_possible());
    cancel.emit(net::cancellation_type::total); // emitted on the io_context's thread (this one)
    CHECK_FALSE(seen.stop_requested());
    cancel.emit(net::cancellation_type::partial);
    CHECK(seen.stop_requested());
    io.run_for(10s);
    CHECK(result == 1);
}

TEST_CASE("asio: without a connected slot the callable form passes a token that never stops",
          "[asio][cancellation]") {
    net::io_context io;
    bool possible = true;
    int result = 0;
    rsa::async_run(
        io.get_executor(),
        [&](resilience::stop_token st) -> rs::task<int> {
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
    net::io_context io;
    net::steady_timer gate{io, 1ms};
    std::string seen;
    rsa::async_run(
        io.get_executor(),
        [&gate, &seen, owned = std::string(40, 'x')](resilience::stop_token st) -> rs::task<void> {
            co_await gate.async_wait(rsa::use_task(st));
            seen = owned; // a capture, read after the coroutine first suspended
        },
        [](std::exception_ptr) {});
    io.run_for(10s);
    CHECK(seen == std::string(40, 'x'));
}

TEST_CASE("asio: what make throws is the operation's failure", "[asio][cancellation]") {
    net::io_context io;
    std::exception_ptr error;
    rsa::async_run(
        io.get_executor(),
        [](resilience::stop_token) -> rs::task<int> { throw std::runtime_error("no call"); },
        [&](std::exception_ptr e, int) { error = e; });
    io.run_for(10s);
    REQUIRE(error != nullptr);
    CHECK_THROWS_WITH(std::rethrow_exception(error), "no call");
}

namespace {
// The `make` of an operation whose action ends inside its stop request (`ends_inside_its_stop`), and
// whose destruction, on the thread that ended the call, waits until `cleared` is counted down.
struct make_held_until_cleared {
    net::io_context* io;
    net::cancellation_signal* cancel;
    std::atomic<bool>* emitting;
    std::latch* cleared;
    bool live = true;

    make_held_until_cleared(net::io_context& i, net::cancellation_signal& c, std::atomic<bool>& e,
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
    rs::task<int> operator()(resilience::stop_token st) {
        net::post(*io, [c = cancel, e = emitting] { // runs once the action waits
            e->store(true);
            e->notify_one();
            c->emit(net::cancellation_type::terminal);
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
    net::io_context io;
    auto work = net::make_work_guard(io);
    net::cancellation_signal cancel;
    std::atomic<bool> emitting{false};
    std::latch cleared{1};
    std::exception_ptr error;
    rsa::async_run(io.get_executor(), make_held_until_cleared{io, cancel, emitting, cleared},
                   net::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, int) {
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

#if defined(                                                                                                 \
    RESILIENCE_TEST_HAS_CO_AWAIT) // net::awaitable: g++ only with Debian's Asio 1.22 (see docs/asio.md)
TEST_CASE("asio: the losing side of an Asio || stops the policy call and its pending read",
          "[asio][cancellation]") {
    using namespace net::experimental::awaitable_operators;
    net::io_context io;
    socket_pair pair{io};
    rsa::clock clock{io.get_executor()};
    rs::timeout limit{1h, clock};
    net_error_code read_ec;
    auto reads = [&](resilience::stop_token st) -> rs::task<std::size_t> {
        std::array<char, 16> buf{};
        auto [ec, n] = co_await pair.client.async_read_some(net::buffer(buf), rsa::use_task(st));
        read_ec = ec;
        if (ec)
            throw net_system_error(ec);
        co_return n;
    };
    std::size_t winner = 99;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            net::steady_timer deadline{io, 10ms};
            auto r = co_await (rsa::async_run(
                                   io.get_executor(),
                                   [&](resilience::stop_token st) { return limit.execute(reads, st); },
                                   net::use_awaitable) ||
                               deadline.async_wait(net::use_awaitable));
            winner = r.index();
        },
        net::detached);
    io.run_for(10s);
    CHECK(winner == 1);
    CHECK(read_ec == net::error::operation_aborted);
}
#endif

} // namespace test_asio_cancellation
