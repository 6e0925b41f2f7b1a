// SPDX-License-Identifier: MIT
// A Beast HTTP client calling a flaky Beast server on loopback, first bare, then through a pipeline
// (retry with the HTTP classifier, circuit breaker, bulkhead, hedge, timeout per attempt), all of it
// written as Boost.Asio coroutines (net::awaitable, use_awaitable): <resilience/boost_asio.hpp> makes a
// call through the pipeline an Asio operation (rs::boost_asio::execute) whose action is the client's own
// awaitable, and <resilience/beast.hpp> lets the HTTP classifier read Beast's responses. Prints p50/p90/p99 and the share of successful calls for
// each run, and exits non-zero unless the pipeline answered more calls and cut the tail.
//
// The server answers each request, by a seeded draw: 200 after 2 ms (78%), 503 (8%), 200 after 400 ms
// (8%), 200 after 3 s (3%), or it closes the connection unanswered (3%). Unlike the other examples it
// runs in real time, on two io_contexts (server and client), in a few seconds.
//
//     $ ./build/release/examples/beast_client
#include <resilience/beast.hpp>
#include <resilience/boost_asio.hpp>
#include <resilience/resilience.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <random>
#include <thread>
#include <vector>

namespace rs = resilience;
namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;
using response = http::response<http::string_body>;

namespace {

// ---------------------------------------------------------------------------------------------------------
// The flaky server: one coroutine per connection, on its own io_context and thread.

enum class behaviour { fast, unavailable, slow, stall, drop };

class flaky_server {
public:
    explicit flaky_server(net::io_context& io) : acceptor_(io, {net::ip::make_address("127.0.0.1"), 0}) {}

    tcp::endpoint endpoint() const { return acceptor_.local_endpoint(); }

    net::awaitable<void> accept_loop() {
        for (;;) {
            auto [ec, socket] = co_await acceptor_.async_accept(net::as_tuple(net::use_awaitable));
            if (ec)
                co_return; // the acceptor was closed
            net::co_spawn(acceptor_.get_executor(), session(std::move(socket), draw()), net::detached);
        }
    }

private:
    behaviour draw() {
        const int p = std::uniform_int_distribution<int>{0, 99}(random_);
        if (p < 78)
            return behaviour::fast;
        if (p < 86)
            return behaviour::unavailable;
        if (p < 94)
            return behaviour::slow;
        if (p < 97)
            return behaviour::stall;
        return behaviour::drop;
    }

    static net::awaitable<void> session(tcp::socket socket, behaviour b) {
        boost::beast::flat_buffer buffer;
        http::request<http::empty_body> request;
        auto [read_ec, read_n] =
            co_await http::async_read(socket, buffer, request, net::as_tuple(net::use_awaitable));
        if (read_ec || b == behaviour::drop)
            co_return; // the socket closes unanswered
        net::steady_timer wait{socket.get_executor(), b == behaviour::slow    ? 400ms
                                                      : b == behaviour::stall ? 3s
                                                                              : 2ms};
        co_await wait.async_wait(net::as_tuple(net::use_awaitable));
        response reply{b == behaviour::unavailable ? http::status::service_unavailable : http::status::ok,
                       request.version()};
        reply.body() = b == behaviour::unavailable ? "try again" : "42.17";
        reply.prepare_payload();
        co_await http::async_write(socket, reply, net::as_tuple(net::use_awaitable));
    }

    tcp::acceptor acceptor_;
    std::mt19937 random_{2026};
};

// ---------------------------------------------------------------------------------------------------------
// The client: plain Beast over Boost.Asio coroutines, one connection per call. Nothing in it knows of
// the policies: when one stops an attempt (its timeout, a losing hedge), the operation it waits for
// ends at once with operation_aborted, which use_awaitable throws.

net::awaitable<response> get_quote(tcp::endpoint server) {
    tcp::socket socket{co_await net::this_coro::executor};
    co_await socket.async_connect(server, net::use_awaitable);
    http::request<http::empty_body> request{http::verb::get, "/quote/ACME", 11};
    request.set(http::field::host, "127.0.0.1");
    co_await http::async_write(socket, request, net::use_awaitable);
    boost::beast::flat_buffer buffer;
    response reply;
    co_await http::async_read(socket, buffer, reply, net::use_awaitable);
    co_return reply;
}

struct sample {
    std::chrono::nanoseconds latency;
    bool ok;
};

// `workers` coroutines of `calls_each` calls each, every call awaiting `call()`.
template <class Call>
std::vector<sample> run(net::io_context& io, Call call, int workers, int calls_each) {
    std::vector<sample> samples;
    auto worker = [&]() -> net::awaitable<void> {
        for (int i = 0; i < calls_each; ++i) {
            const auto start = std::chrono::steady_clock::now();
            bool ok = false;
            try {
                const response reply = co_await call();
                ok = reply.result() == http::status::ok;
            } catch (const std::exception&) {
                ok = false;
            }
            samples.push_back({std::chrono::steady_clock::now() - start, ok});
        }
    };
    for (int w = 0; w < workers; ++w)
        net::co_spawn(io, worker(), [](std::exception_ptr e) {
            if (e)
                std::rethrow_exception(e);
        });
    io.restart();
    io.run();
    return samples;
}

struct summary {
    double p50, p90, p99; // milliseconds
    double success_share;
};

summary summarise(const std::vector<sample>& samples) {
    std::vector<double> ms;
    std::size_t ok = 0;
    for (const sample& s : samples) {
        ms.push_back(std::chrono::duration<double, std::milli>(s.latency).count());
        ok += s.ok ? 1 : 0;
    }
    std::sort(ms.begin(), ms.end());
    auto rank = [&](double q) {
        return ms[std::min(ms.size() - 1, static_cast<std::size_t>(q * ms.size()))];
    };
    return {rank(0.50), rank(0.90), rank(0.99),
            static_cast<double>(ok) / static_cast<double>(samples.size())};
}

void print(const char* what, const summary& s) {
    fmt::print("{:<16} p50 {:>7.1f} ms   p90 {:>7.1f} ms   p99 {:>7.1f} ms   successful {:>5.1f}%\n", what,
               s.p50, s.p90, s.p99, 100.0 * s.success_share);
}

} // namespace

int main() {
    // The server, on its own thread until the end.
    net::io_context server_io;
    flaky_server server{server_io};
    const tcp::endpoint endpoint = server.endpoint();
    net::co_spawn(server_io, server.accept_loop(), net::detached);
    std::thread server_thread{[&] { server_io.run(); }};

    net::io_context io;
    constexpr int workers = 16;
    constexpr int calls_each = 12;

    // Bare: one attempt, however long it takes.
    const summary bare = summarise(run(
        io, [&] { return get_quote(endpoint); }, workers, calls_each));

    // Through the policies, outermost first. None is given a clock: in a call made by execute they
    // sleep (backoff, hedge delay, timeout) on timers of the call's executor.
    const auto transient = rs::http::response_classifier<response>{};
    rs::circuit_breaker breaker{
        {.name = "quotes",
         .sampling = rs::breaker_sampling{.calls = 50, .minimum_throughput = 20, .failure_ratio = 0.5},
         .break_duration = 1s,
         .should_handle = transient}};
    rs::pipeline policy{
        rs::retry{{.max_attempts = 3,
                   .backoff =
                       rs::exponential_backoff{
                           .initial = 20ms, .factor = 2.0, .max = 200ms, .jitter = rs::jitter::equal},
                   .should_handle = transient}},
        breaker,
        rs::bulkhead{{.max_concurrent_calls = 32}},
        rs::hedge{{.max_attempts = 2, .delay = 60ms, .should_handle = transient}},
        rs::timeout{150ms}, // per hedged attempt
    };
    // Each attempt calls get_quote again: a new connection per attempt.
    auto fetch = [&] { return get_quote(endpoint); };
    const summary guarded = summarise(run(
        io, [&] { return rs::boost_asio::execute(policy, fetch, net::use_awaitable); }, workers, calls_each));

    fmt::print("{} calls, {} at a time, against a server that is slow, stalls, fails and drops:\n",
               workers * calls_each, workers);
    print("bare", bare);
    print("with policies", guarded);

    server_io.stop();
    server_thread.join();

    const bool holds = guarded.success_share > bare.success_share && guarded.p99 < bare.p99;
    if (!holds)
        fmt::print("unexpected: the policies did not answer more calls with a shorter tail\n");
    return holds ? 0 : 1;
}
