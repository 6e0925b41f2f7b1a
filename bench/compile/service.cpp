// SPDX-License-Identifier: MIT
// Compile cost of a service's translation unit, as a team writes one: two calls to a dependency over
// Asio sockets, each through a pipeline of five on the Asio clock (bulkhead, retry with the HTTP
// classifier, breaker, hedge, timeout per attempt), started from Asio code with async_run. Built with
// -DRESILIENCE_BENCH_BARE, the same file makes the same calls without the library's policies: the
// difference is what the pipeline costs such a file (see bench/README.md, "Build cost").
//
// -DRESILIENCE_BENCH_EXECUTE: the same service in Asio's own style, as the Asio integration lets a team
// keep it: the requests are asio::awaitable coroutines with use_awaitable, the policies are on their
// default clock, and each call is rs::asio::execute(io, policy, action, handler); with
// -DRESILIENCE_BENCH_BARE as well, the same awaitables started with asio::co_spawn instead.
#include <asio.hpp>
#include <resilience/asio.hpp>
#include <resilience/http.hpp>
#if !defined(RESILIENCE_BENCH_BARE)
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>
#endif

#include <array>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <system_error>

namespace rs = resilience;
using namespace std::chrono_literals;
using asio::ip::tcp;

#if defined(RESILIENCE_BENCH_EXECUTE) && !defined(ASIO_HAS_CO_AWAIT)
#error                                                                                                       \
    "-DRESILIENCE_BENCH_EXECUTE needs asio::awaitable, which this Asio turns off for this compiler (Asio 1.22 with clang 14)"
#endif

namespace {

struct reply {
    int status = 0;
    std::optional<std::string> retry_after;
    std::string body;
};

struct profile {
    std::string name;
    int visits = 0;
};

// The reply in the first `n` bytes read: the status code after "HTTP/1.1 ", and the whole as its body.
reply parse_reply(const std::array<char, 512>& buf, std::size_t n) {
    reply r;
    r.status = n >= 12 ? std::stoi(std::string(buf.data() + 9, 3)) : 0;
    r.body.assign(buf.data(), n);
    return r;
}

#if defined(RESILIENCE_BENCH_EXECUTE)

// One request on a connection of its own; a cancelled attempt's operations end with operation_aborted.
asio::awaitable<reply> fetch(tcp::endpoint server, std::string path) {
    tcp::socket socket{co_await asio::this_coro::executor};
    co_await socket.async_connect(server, asio::use_awaitable);
    const std::string request = "GET " + path + " HTTP/1.1\r\n\r\n";
    co_await asio::async_write(socket, asio::buffer(request), asio::use_awaitable);
    std::array<char, 512> buf{};
    const std::size_t n = co_await socket.async_read_some(asio::buffer(buf), asio::use_awaitable);
    co_return parse_reply(buf, n);
}

asio::awaitable<profile> load_profile(tcp::endpoint server) {
    reply r = co_await fetch(server, "/profile");
    co_return profile{r.body, r.status};
}

} // namespace

int main() {
    asio::io_context io;
    const tcp::endpoint server{asio::ip::address_v4::loopback(), 8080};
    int answered = 0;
    const auto on_reply = [&](std::exception_ptr error, reply r) { answered += !error && r.status == 200; };
    const auto on_profile = [&](std::exception_ptr error, profile p) { answered += !error && p.visits >= 0; };
    auto quote = [&] { return fetch(server, "/quote"); };
    auto visits = [&] { return load_profile(server); };

#if defined(RESILIENCE_BENCH_BARE)
    asio::co_spawn(io, quote(), on_reply);
    asio::co_spawn(io, visits(), on_profile);
#else
    rs::pipeline policy{
        rs::bulkhead{{.max_concurrent_calls = 32, .queue_limit = 64}},
        rs::retry{{.max_attempts = 3, .should_handle = rs::http::response_classifier<reply>{}}},
        rs::circuit_breaker{{.failure_threshold = 5}},
        rs::hedge{{.max_attempts = 2, .delay = 50ms}},
        rs::timeout{300ms},
    };
    rs::asio::execute(io, policy, quote, on_reply);
    rs::asio::execute(io, policy, visits, on_profile);
#endif
    io.run();
    std::printf("%d answered\n", answered);
    return 0;
}

#else

// One request on a connection of its own; the stop token reaches every socket operation.
rs::task<reply> fetch(asio::io_context& io, tcp::endpoint server, std::string path,
                      resilience::stop_token st) {
    tcp::socket socket{io};
    auto [connect_ec] = co_await socket.async_connect(server, rs::asio::use_task(st));
    if (connect_ec)
        throw std::system_error(connect_ec);
    const std::string request = "GET " + path + " HTTP/1.1\r\n\r\n";
    auto [write_ec, written] =
        co_await asio::async_write(socket, asio::buffer(request), rs::asio::use_task(st));
    if (write_ec)
        throw std::system_error(write_ec);
    std::array<char, 512> buf{};
    auto [read_ec, n] = co_await socket.async_read_some(asio::buffer(buf), rs::asio::use_task(st));
    if (read_ec)
        throw std::system_error(read_ec);
    co_return parse_reply(buf, n);
}

rs::task<profile> load_profile(asio::io_context& io, tcp::endpoint server, resilience::stop_token st) {
    reply r = co_await fetch(io, server, "/profile", st);
    co_return profile{r.body, r.status};
}

} // namespace

int main() {
    asio::io_context io;
    const tcp::endpoint server{asio::ip::address_v4::loopback(), 8080};
    int answered = 0;

#if defined(RESILIENCE_BENCH_BARE)
    rs::asio::async_run(
        io.get_executor(), [&](resilience::stop_token st) { return fetch(io, server, "/quote", st); },
        [&](std::exception_ptr error, reply r) { answered += !error && r.status == 200; });
    rs::asio::async_run(
        io.get_executor(), [&](resilience::stop_token st) { return load_profile(io, server, st); },
        [&](std::exception_ptr error, profile p) { answered += !error && p.visits >= 0; });
#else
    rs::asio::clock clock{io.get_executor()};
    rs::pipeline policy{
        rs::bulkhead{{.max_concurrent_calls = 32, .queue_limit = 64}, clock},
        rs::retry{{.max_attempts = 3, .should_handle = rs::http::response_classifier<reply>{}}, clock},
        rs::circuit_breaker{{.failure_threshold = 5}, clock},
        rs::hedge{{.max_attempts = 2, .delay = 50ms}, clock},
        rs::timeout{300ms, clock},
    };
    rs::asio::async_run(
        io.get_executor(),
        [&](resilience::stop_token st) {
            return policy.execute(
                [&](resilience::stop_token attempt) { return fetch(io, server, "/quote", attempt); }, st);
        },
        [&](std::exception_ptr error, reply r) { answered += !error && r.status == 200; });
    rs::asio::async_run(
        io.get_executor(),
        [&](resilience::stop_token st) {
            return policy.execute(
                [&](resilience::stop_token attempt) { return load_profile(io, server, attempt); }, st);
        },
        [&](std::exception_ptr error, profile p) { answered += !error && p.visits >= 0; });
#endif
    io.run();
    std::printf("%d answered\n", answered);
    return 0;
}

#endif
