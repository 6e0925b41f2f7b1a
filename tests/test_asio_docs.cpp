// SPDX-License-Identifier: MIT
// The examples of docs/asio.md, compiled and run against a quote server on a loopback TCP socket, on both
// Asio flavours. Each example's code is copied from the page unchanged, except for durations and the
// flavour's names (`rsa::` for the page's `rs::boost_asio::`, `net_system_error` for
// `boost::system::system_error`); when you change one, change the other. The page's Beast `response` is
// a quote here (`double`), and its `get_quote` reads one from a plain socket. The awaitable examples are
// built where Asio declares net::awaitable (Boost.Asio with g++ and clang; standalone Asio 1.22 with g++).
#include "catch.hpp"

#include "asio_flavour.hpp"
#if defined(RESILIENCE_TEST_HAS_CO_AWAIT) && !defined(RESILIENCE_TEST_BOOST_ASIO)
#include <asio/experimental/as_tuple.hpp>
#endif
#include <resilience/async_scope.hpp>
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>

#include <array>
#include <chrono>
#include <exception>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace test_asio_docs {

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

using net::ip::tcp;

// Accepts connections on 127.0.0.1; answers each with a quote, or holds it open unanswered.
class test_server {
public:
    test_server(net::io_context& io, bool answers)
        : acceptor_(io, tcp::endpoint(net::ip::address_v4::loopback(), 0)), answers_(answers) {
        accept();
    }
    tcp::endpoint endpoint() const { return acceptor_.local_endpoint(); }
    void stop() {
        acceptor_.close();
        held_.clear();
    }

private:
    void accept() {
        acceptor_.async_accept([this](net_error_code ec, tcp::socket s) {
            if (ec)
                return;
            auto conn = std::make_shared<tcp::socket>(std::move(s));
            if (answers_)
                net::async_write(*conn, net::buffer(reply_), [conn](net_error_code, std::size_t) {});
            else
                held_.push_back(conn);
            accept();
        });
    }

    tcp::acceptor acceptor_;
    bool answers_;
    std::string reply_ = "101.5";
    std::vector<std::shared_ptr<tcp::socket>> held_;
};

#if defined(RESILIENCE_TEST_HAS_CO_AWAIT)
#if !defined(RESILIENCE_TEST_BOOST_ASIO)
// Standalone Asio 1.22 has as_tuple in experimental only (the page's Boost 1.81 has net::as_tuple).
namespace as_tuple_home = net::experimental;
#else
namespace as_tuple_home = net;
#endif

using response = double; // the page's Beast response

// The page's get_quote, on a plain socket: one connection per call, reading the quote it is sent. The
// read's error code is written to `*read_ec` when one is given.
net::awaitable<response> get_quote(tcp::endpoint server, net_error_code* read_ec = nullptr) {
    tcp::socket socket{co_await net::this_coro::executor};
    co_await socket.async_connect(server, net::use_awaitable);
    std::array<char, 64> buf{};
    auto [ec, n] =
        co_await socket.async_read_some(net::buffer(buf), as_tuple_home::as_tuple(net::use_awaitable));
    if (read_ec)
        *read_ec = ec;
    if (ec)
        throw net_system_error(ec);
    co_return std::stod(std::string(buf.data(), n));
}
#endif

} // namespace

#if defined(RESILIENCE_TEST_HAS_CO_AWAIT)
TEST_CASE("docs/asio.md: the call with each token, its policies given no clock", "[asio][docs]") {
    net::io_context io;
    test_server quotes{io, true};
    const tcp::endpoint server = quotes.endpoint();
    rs::pipeline policy{rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{1ms}}},
                        rs::timeout{2s}};
    auto fetch = [&] { return get_quote(server); };
    std::vector<response> shown;
    std::exception_ptr reported;
    auto show = [&](response r) { shown.push_back(r); };
    auto report = [&](std::exception_ptr e) { reported = e; };
    std::optional<std::future<response>> future;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            // ---- from the page ----
            // In a coroutine: on its executor, a failure rethrown here.
            response a = co_await rsa::execute(policy, fetch, net::use_awaitable);
            // The failure as a value instead.
            auto [error, b] =
                co_await rsa::execute(policy, fetch, as_tuple_home::as_tuple(net::use_awaitable));
            // From a callback or a thread outside the io_context: name the executor.
            rsa::execute(io, policy, fetch,
                         [&](std::exception_ptr e, response r) { e ? report(e) : show(r); });
            std::future<response> f = rsa::execute(io.get_executor(), policy, fetch, net::use_future);
            // ---- end ----
            show(a);
            CHECK_FALSE(error);
            show(b);
            future = std::move(f);
        },
        net::detached);
    // The server accepts until it is stopped: run until the four calls have ended, then stop it, so
    // that the loop runs out of work rather than for its whole 10 s.
    auto all_ended = [&] {
        return shown.size() + (reported ? 1 : 0) == 3 && future &&
               future->wait_for(0s) == std::future_status::ready;
    };
    while (!all_ended() && io.run_one_for(10s) > 0) {
    }
    quotes.stop();
    io.run_for(10s);
    CHECK_FALSE(reported);
    CHECK(shown == std::vector<response>{101.5, 101.5, 101.5});
    REQUIRE(future);
    CHECK(future->get() == 101.5);
}

TEST_CASE("docs/asio.md: a deadline raced with ||, the call stopped and ended", "[asio][docs]") {
    using namespace net::experimental::awaitable_operators;
    net::io_context io;
    test_server silent{io, false};
    const tcp::endpoint server = silent.endpoint();
    rs::pipeline policy{rs::retry{{.max_attempts = 3}}, rs::timeout{1h}};
    net_error_code read_ec;
    auto fetch = [&] { return get_quote(server, &read_ec); };
    std::size_t winner = 99;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            // ---- from the page (500ms there) ----
            net::steady_timer deadline{co_await net::this_coro::executor, 20ms};
            auto first = co_await (rsa::execute(policy, fetch, net::use_awaitable) ||
                                   deadline.async_wait(net::use_awaitable));
            // ---- end ----
            winner = first.index();
            silent.stop();
        },
        net::detached);
    io.run_for(10s);
    CHECK(winner == 1);
    CHECK(read_ec == net::error::operation_aborted);
    CHECK(io.stopped()); // the call left nothing behind
}

TEST_CASE("docs/asio.md: a cancellation bound to the handler's slot ends the call with cancelled_error",
          "[asio][docs]") {
    net::io_context io;
    test_server silent{io, false};
    const tcp::endpoint server = silent.endpoint();
    rs::pipeline policy{rs::retry{{.max_attempts = 3}}, rs::timeout{1h}};
    net_error_code read_ec;
    auto fetch = [&] { return get_quote(server, &read_ec); };
    std::exception_ptr reported;
    bool shown = false;
    auto report = [&](std::exception_ptr e) {
        reported = e;
        silent.stop();
    };
    auto show = [&](response) { shown = true; };
    // ---- from the page ----
    net::cancellation_signal cancel;
    rsa::execute(io, policy, fetch,
                 net::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, response r) {
                     e ? report(e) : show(r); // rs::cancelled_error once cancelled
                 }));
    // ---- end ----
    net::steady_timer later{io, 20ms};
    later.async_wait([&](net_error_code) {
        // ---- from the page ----
        cancel.emit(net::cancellation_type::terminal);
        // ---- end ----
    });
    io.run_for(10s);
    CHECK_FALSE(shown);
    REQUIRE(reported);
    CHECK_THROWS_AS(std::rethrow_exception(reported), rs::cancelled_error);
    CHECK(read_ec == net::error::operation_aborted);
}
#endif

namespace {
// The page's service (section "Lifetime and teardown"), on the default clock.
// ---- from the page ----
struct quote_service {
    net::io_context io;
    rs::bulkhead<> slots{{.max_concurrent_calls = 8, .queue_limit = 100}};
    rs::pipeline<rs::retry<>, rs::bulkhead<>, rs::timeout<>> policy{rs::retry{{.max_attempts = 3}}, slots,
                                                                    rs::timeout{2s}};
};
// ---- end ----
} // namespace

#if defined(RESILIENCE_TEST_HAS_CO_AWAIT)
TEST_CASE("docs/asio.md: the service destroyed with calls in flight, its policies first", "[asio][docs]") {
    std::optional<quote_service> svc{std::in_place};
    std::optional<test_server> silent{std::in_place, svc->io, false};
    const tcp::endpoint server = silent->endpoint();
    auto fetch = [&] { return get_quote(server); };
    int completed = 0;
    for (int i = 0; i < 5; ++i)
        rsa::execute(svc->io, svc->policy, fetch, [&](std::exception_ptr, response) { ++completed; });
    while (svc->slots.in_flight() < 5)
        REQUIRE(svc->io.run_one_for(10s) == 1);
    svc->io.poll();
    silent.reset();
    svc.reset(); // the pipeline and the bulkhead go first, then the io_context destroys the calls
    CHECK(completed == 0);
}
#endif

TEST_CASE("docs/asio.md: shutting down, a drain through an async_scope, g++ and clang", "[asio][docs]") {
    quote_service svc;
    test_server silent{svc.io, false}; // holds every connection open, unanswered
    const tcp::endpoint server = silent.endpoint();
    int reported = 0;
    bool was_drained = false;
    auto report = [&](std::exception_ptr e) {
        CHECK_THROWS_AS(std::rethrow_exception(e), rs::cancelled_error);
        ++reported;
    };
    auto drained = [&] {
        was_drained = true;
        silent.stop();
    };

    // ---- from the page ----
    // An attempt as an rs::task: the attempt's token cancels its pending operations.
    auto fetch_quote = [&](resilience::stop_token attempt) -> rs::task<double> {
        tcp::socket socket{svc.io};
        auto [connect_ec] = co_await socket.async_connect(server, rsa::use_task(attempt));
        if (connect_ec)
            throw net_system_error(connect_ec);
        std::array<char, 64> buf{};
        auto [read_ec, n] = co_await socket.async_read_some(net::buffer(buf), rsa::use_task(attempt));
        if (read_ec)
            throw net_system_error(read_ec);
        co_return std::stod(std::string(buf.data(), n));
    };
    rs::async_scope scope;
    auto serve = [&](resilience::stop_token st) { return svc.policy.execute(fetch_quote, st); };
    for (int i = 0; i < 5; ++i)
        rsa::spawn(scope, svc.io.get_executor(), serve, [&](std::exception_ptr error, double) {
            if (error)
                report(error); // rs::cancelled_error for the calls the drain stopped
        });
    // ---- end ----
    while (svc.slots.in_flight() < 5)
        REQUIRE(svc.io.run_one_for(10s) == 1);
    svc.io.poll();
    CHECK(scope.size() == 5);
    // ---- from the page ----
    scope.request_stop();
    rsa::async_run(svc.io.get_executor(), scope.join(), [&](std::exception_ptr) { drained(); });
    svc.io.run(); // returns once every call and the join have completed
    // ---- end ----
    CHECK(was_drained);
    CHECK(reported == 5);
    CHECK(scope.size() == 0);
    CHECK(svc.slots.in_flight() == 0);
}

} // namespace test_asio_docs
