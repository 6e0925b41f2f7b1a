// SPDX-License-Identifier: MIT
// The examples of docs/asio.md, compiled and run against a quote server on a loopback TCP socket. Each
// example's code is copied from the page unchanged, except for durations; when you change one, change
// the other. The page's `fetch_quote` stands in the first case as the page has it; the later cases call
// the same steps as `fetch_quote_from`. Those marked g++ only in the page are built where Asio declares
// net::awaitable.
#include "catch.hpp"

#include "asio_flavour.hpp"
#include <resilience/async_scope.hpp>
#include <resilience/resilience.hpp>

#include <array>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <stop_token>
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

struct outcome_log {
    explicit outcome_log(test_server& s) : server(&s) {}
    std::optional<double> quote;
    std::exception_ptr error;
    test_server* server;
    void show(double q) {
        quote = q;
        server->stop();
    }
    void report(std::exception_ptr e) {
        error = e;
        server->stop();
    }
};

// The page's `fetch_quote` (the first case below has its text): one attempt, on a connection of its own
// to `server` (as it is when the attempt starts), the attempt's token reaching each operation. The
// read's error code is written to `*read_ec` when one is given.
rs::task<double> fetch_quote_from(net::io_context& io, const tcp::endpoint& server, std::stop_token st,
                                  net_error_code* read_ec = nullptr) {
    tcp::socket socket{io};
    auto [connect_ec] = co_await socket.async_connect(server, rsa::use_task(st));
    if (connect_ec)
        throw net_system_error(connect_ec);
    std::array<char, 64> buf{};
    auto [ec, n] = co_await socket.async_read_some(net::buffer(buf), rsa::use_task(st));
    if (read_ec)
        *read_ec = ec;
    if (ec)
        throw net_system_error(ec);
    co_return std::stod(std::string(buf.data(), n));
}

} // namespace

TEST_CASE("docs/asio.md: a call from Asio code, g++ and clang", "[asio][docs]") {
    net::io_context io;
    test_server server{io, true};
    outcome_log log{server};
    auto show = [&](double q) { log.show(q); };
    auto report = [&](std::exception_ptr e) { log.report(e); };
    tcp::endpoint quote_server = server.endpoint();

    // ---- from the page ----
    rsa::clock clock{io.get_executor()};
    rs::pipeline policy{rs::retry{{.max_attempts = 3}, clock}, rs::timeout{2s, clock}};

    // One attempt, on a connection of its own. The attempt's token reaches each operation: when the
    // timeout stops the attempt, the pending connect or read ends at once with operation_aborted.
    auto fetch_quote = [&](std::stop_token st) -> rs::task<double> {
        tcp::socket socket{io};
        auto [connect_ec] = co_await socket.async_connect(quote_server, rsa::use_task(st));
        if (connect_ec)
            throw net_system_error(connect_ec);
        std::array<char, 64> buf{};
        auto [read_ec, n] = co_await socket.async_read_some(net::buffer(buf), rsa::use_task(st));
        if (read_ec)
            throw net_system_error(read_ec);
        co_return std::stod(std::string(buf.data(), n));
    };

    rsa::async_run(
        io.get_executor(), [&](std::stop_token st) { return policy.execute(fetch_quote, st); },
        [&](std::exception_ptr error, double quote) {
            if (error)
                report(error);
            else
                show(quote);
        });
    // ---- end ----
    io.run_for(10s);
    REQUIRE(log.quote);
    CHECK(*log.quote == 101.5);
}

TEST_CASE("docs/asio.md: a posted cancel that shares the per-attempt socket", "[asio][docs]") {
    net::io_context io;
    test_server server{io, false};
    tcp::endpoint quote_server = server.endpoint();
    rsa::clock clock{io.get_executor()};
    rs::timeout limit{20ms, clock};
    net_error_code read_ec;
    auto attempt = [&](std::stop_token st) -> rs::task<void> {
        // ---- from the page ----
        auto socket = std::make_shared<tcp::socket>(io);
        std::stop_callback on_stop{st, [socket] {
                                       net::post(socket->get_executor(),
                                                 [socket] { socket->cancel(); }); // keeps the socket alive
                                   }};
        // ---- end ----
        auto [connect_ec] = co_await socket->async_connect(quote_server, rsa::use_task);
        if (connect_ec)
            throw net_system_error(connect_ec);
        std::array<char, 64> buf{};
        auto [ec, n] = co_await socket->async_read_some(net::buffer(buf), rsa::use_task);
        (void)n;
        read_ec = ec;
    };
    bool done = false;
    rsa::async_run(io.get_executor(), limit.execute(attempt), [&](std::exception_ptr) {
        done = true;
        server.stop();
    });
    io.run_for(10s);
    CHECK(done);
    CHECK(read_ec == net::error::operation_aborted);
}

TEST_CASE("docs/asio.md: cancel_after's stand-in on Asio 1.22, g++ and clang", "[asio][docs]") {
    net::io_context io;
    test_server server{io, false}; // never answers: the deadline comes first
    outcome_log log{server};
    auto show = [&](double q) { log.show(q); };
    auto report = [&](std::exception_ptr e) { log.report(e); };
    tcp::endpoint quote_server = server.endpoint();
    rsa::clock clock{io.get_executor()};
    rs::pipeline policy{rs::retry{{.max_attempts = 3}, clock}, rs::timeout{1h, clock}};
    net_error_code read_ec;
    auto fetch_quote = [&](std::stop_token st) { return fetch_quote_from(io, quote_server, st, &read_ec); };

    // ---- from the page (500ms there) ----
    net::cancellation_signal cancel;
    net::steady_timer deadline{io, 20ms};
    deadline.async_wait([&](net_error_code ec) {
        if (!ec)
            cancel.emit(net::cancellation_type::terminal);
    });
    rsa::async_run(
        io.get_executor(), [&](std::stop_token st) { return policy.execute(fetch_quote, st); },
        net::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr error, double quote) {
            deadline.cancel();
            error ? report(error) : show(quote);
        }));
    // ---- end ----
    io.run_for(10s);
    CHECK(log.error != nullptr);
    CHECK_FALSE(log.quote);
    CHECK(read_ec == net::error::operation_aborted);
}

#if defined(RESILIENCE_TEST_HAS_CO_AWAIT)
TEST_CASE("docs/asio.md: from an net::awaitable, and racing a deadline with ||, g++ only", "[asio][docs]") {
    using namespace net::experimental::awaitable_operators;
    net::io_context io;
    test_server answering{io, true}, silent{io, false};
    tcp::endpoint quote_server = answering.endpoint();
    rsa::clock clock{io.get_executor()};
    rs::pipeline policy{rs::retry{{.max_attempts = 3}, clock}, rs::timeout{2s, clock}};
    auto fetch_quote = [&](std::stop_token st) { return fetch_quote_from(io, quote_server, st); };
    std::optional<double> shown;
    auto show = [&](double q) {
        shown = q;
        io.stop(); // the servers still accept: end this run here
    };
    std::size_t winner = 99;

    // ---- from the page ----
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            double quote = co_await rsa::async_run(
                io.get_executor(), [&](std::stop_token st) { return policy.execute(fetch_quote, st); },
                net::use_awaitable);
            show(quote);
        },
        net::detached);
    // ---- end ----
    io.run_for(10s);
    REQUIRE(shown);
    CHECK(*shown == 101.5);

    io.restart();
    quote_server = silent.endpoint();
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            // ---- from the page (500ms there) ----
            auto call = [&](std::stop_token st) { return policy.execute(fetch_quote, st); };
            net::steady_timer deadline{io, 20ms};
            auto first = co_await (rsa::async_run(io.get_executor(), call, net::use_awaitable) ||
                                   deadline.async_wait(net::use_awaitable));
            // ---- end ----
            winner = first.index();
            answering.stop();
            silent.stop();
        },
        net::detached);
    io.run_for(10s);
    CHECK(winner == 1);
}
#endif

namespace {
// The page's service (section "Shutting down").
struct quote_service {
    net::io_context io; // first: the clock needs it; destroyed last
    rsa::clock clock{io.get_executor()};
    rs::bulkhead<rsa::clock> slots{{.max_concurrent_calls = 8, .queue_limit = 100}, clock};
    rs::pipeline<rs::retry<rsa::clock>, rs::bulkhead<rsa::clock>, rs::timeout<rsa::clock>> policy{
        rs::retry{{.max_attempts = 3}, clock}, slots, rs::timeout{2s, clock}};
};
} // namespace

TEST_CASE("docs/asio.md: shutting down, a drain through an async_scope, g++ and clang", "[asio][docs]") {
    quote_service svc;
    test_server server{svc.io, false}; // holds every connection open, unanswered
    tcp::endpoint quote_server = server.endpoint();
    int shown = 0, reported = 0;
    bool was_drained = false;
    auto show = [&](double) { ++shown; };
    auto report = [&](std::exception_ptr) { ++reported; };
    auto drained = [&] {
        was_drained = true;
        server.stop();
    };
    auto fetch_quote = [&](std::stop_token st) { return fetch_quote_from(svc.io, quote_server, st); };

    // ---- from the page ----
    rs::async_scope scope;
    auto serve = [&](std::stop_token st) { return svc.policy.execute(fetch_quote, st); };
    for (int i = 0; i < 5; ++i)
        rsa::spawn(scope, svc.io.get_executor(), serve,
                   [&](std::exception_ptr error, double quote) { error ? report(error) : show(quote); });
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
    CHECK(shown == 0);
    CHECK(scope.size() == 0);
    CHECK(svc.slots.in_flight() == 0);
}

} // namespace test_asio_docs
