// The names the ```cpp blocks of README.md and docs/ take for granted, for scripts/check_docs.py.
// Declarations only: the blocks are compiled with -fsyntax-only, never linked or run.
//
// Each block is compiled in a namespace of its own nested in doc_prelude, so it sees every name below and
// a name it declares itself hides the prelude's. A block that needs another meaning of a name (a `fetch`
// that makes an int, Asio's objects) names a context above it, `<!-- doc-prelude: ints -->`: its
// namespace is then nested in doc_prelude::ctx_ints, whose names hide the common ones. A context may also
// define DOC_PRELUDE_LATE_<name>, declarations placed after the block's own (see ctx_http).
#pragma once

#include <resilience/resilience.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>

#include <array>
#include <atomic>
#include <cassert>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#ifdef DOC_CHECK_ASIO
#include <asio.hpp>
#if defined(ASIO_HAS_CO_AWAIT) // asio::awaitable: not with every compiler and library (clang 14 + libstdc++)
#include <asio/experimental/awaitable_operators.hpp>
#endif
#include <resilience/asio.hpp>
#include <resilience/redis.hpp>
#endif
#ifdef DOC_CHECK_BOOST_ASIO
#include <boost/asio.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <resilience/beast.hpp>
#include <resilience/boost_asio.hpp>

#include <future>
#endif

// Test assertions as the pages write them (Catch2's), reduced to their expression.
#define REQUIRE(...) static_cast<void>(__VA_ARGS__)
#define CHECK(...) static_cast<void>(__VA_ARGS__)

namespace doc_check {

/// The function a block's statements run in when they use co_await or co_return: a coroutine that
/// accepts `co_return` of any value, so a block may return what its page's function would.
struct any_task {
    struct promise_type {
        any_task get_return_object() noexcept { return {}; }
        std::suspend_never initial_suspend() noexcept { return {}; }
        std::suspend_never final_suspend() noexcept { return {}; }
        template <class T>
        void return_value(T&&) noexcept {}
        void unhandled_exception() noexcept {}
    };
};

} // namespace doc_check

#if !defined(__cpp_lib_expected)
// The pages use std::expected (C++23) as an example of a result type; a C++20 library has none, so the
// check declares what the pages use of it. Syntax only: never linked.
namespace std {
template <class T, class E>
class expected {
public:
    using value_type = T;
    using error_type = E;
    expected(T v);
    bool has_value() const noexcept;
    explicit operator bool() const noexcept;
    const T& value() const;
    const E& error() const;
    const T* operator->() const;
    const T& operator*() const;
};
} // namespace std
#endif

// A vendor's response type of its own (docs/http.md specialises response_traits for it).
namespace vendor {
struct reply {
    int code() const;
    const char* header(std::string_view name) const;
};
} // namespace vendor

// Each block's namespace is nested in doc_prelude (in doc_prelude::ctx_<name> when the block names a
// context), so a name the block declares hides these.
namespace doc_prelude {
namespace rs = resilience;
namespace chaos = resilience::chaos;
using namespace std::chrono_literals;

// Anything a page logs, reports or shows.
template <class... A>
void log(A&&...);
template <class... A>
void report(A&&...);
template <class... A>
void show(A&&...);
template <class... A>
void write(A&&...);

// User-side types, in a namespace of their own so that argument-dependent lookup of a call on them
// finds no prelude function beside the one a block declares.
namespace types {
struct page {
    int status = 200;
    std::string title;
};
using page_t = page;
struct quote {};
struct user {};
struct prefs {};
struct rows {};
struct row {};
struct price {};
struct rates {};
struct invoice {};
struct receipt {};
struct stock {};
struct item_id {};
using order_id = std::string;
struct order_t {};
struct connection {};
struct response {
    int status = 200;
};
struct http_response {
    int status = 200;
    std::chrono::nanoseconds retry_after{};
};
struct api_error {
    bool retryable = false;
};
struct metrics {
    void record(const rs::telemetry_event& e);
};
// A database that streams rows (docs/stream_retry.md).
struct cursor {
    rs::task<std::optional<row>> fetch(rs::stop_token st);
};
struct db {
    rs::task<cursor> open_cursor(std::size_t from, rs::stop_token st);
    rs::task<void> reconnect(rs::stop_token st);
    rs::task<row> get(std::size_t i);
    std::size_t size() const;
};
} // namespace types
using namespace types;

// User-side calls, each an attempt that takes the attempt's stop token.
rs::task<page> fetch(rs::stop_token st);
rs::task<page> get(std::string url, rs::stop_token st = {});
rs::task<rows> query(rs::stop_token st);
rs::task<int> action(rs::stop_token st);
rs::task<int> slow_action(rs::stop_token st);
rs::task<int> failing_action(rs::stop_token st);
rs::task<int> any_action(rs::stop_token st);
rs::task<int> fetch_with_policy();
rs::task<int> fetch_quote(std::string symbol, rs::stop_token st);
rs::task<int> use(const std::string& s, rs::stop_token st);
rs::task<user> load(std::string id, rs::stop_token st = {});
rs::task<user> load_user(std::string id);
rs::task<prefs> load_prefs(std::string id);
rs::task<stock> get_stock(item_id id, rs::stop_token st);
rs::task<invoice> fetch_invoice(int id, rs::stop_token st);
rs::task<receipt> charge(order_t order, rs::stop_token st);
template <class Breaker>
rs::task<void> call_through(Breaker& breaker);
struct serve_t {
    rs::task<void> operator()(connection c) const;
    rs::task<void> operator()(rs::stop_token st) const;
};
extern const serve_t serve;
page cached_page();
rates cached_rates();
page cached();
rows service_busy(rs::rejection_reason reason);
quote cached_quote();
void schedule_retry(std::chrono::nanoseconds after);
std::string pick_region();
rs::circuit_breaker_options load_options();

struct price_source {
    rs::task<quote> fetch(std::string symbol, rs::stop_token st);
};
extern price_source prices;
struct rates_api {
    rs::task<rates> fetch_rates(rs::stop_token st);
};
extern rates_api api;
extern std::shared_ptr<rates_api> client_;
struct page_cache {
    rates last_rates() const;
    page page_for(int status) const;
    rs::task<rates> load();
};
extern page_cache cache;
struct replica {
    rs::task<std::string> get(const std::string& key, rs::stop_token st);
};
extern std::vector<replica> replicas;

extern db d;
rs::async_generator<row> read_rows(db& d, std::size_t from, rs::stop_token st);

// The objects a page's fragment refers to.
extern rs::testing::simulation sim;
extern rs::event_loop loop;
extern rs::circuit_breaker<> breaker;
extern rs::pipeline<rs::retry<>, rs::circuit_breaker<>, rs::timeout<>> policy;
extern rs::single_flight<std::string, rates> flights;
extern rs::circuit_breaker_options new_options;
extern rs::stream_retry_options options;
extern rs::telemetry_listener on_event;
extern rs::telemetry_listener page_on_open;
extern std::vector<rs::task<int>> tasks;
extern const rs::context& ctx;
extern rs::steady_clock clock;
extern rs::stop_token st, stop, caller_token, consumer_token;
extern std::string id, url, s, key, host, table;
extern connection connection_a, connection_b;
extern order_t order;

// docs/single_flight.md and docs/fallback.md: actions that produce rates.
namespace ctx_rates {
struct fetch_t {
    rs::task<rates> operator()(rs::stop_token st) const;
    rs::task<rates> operator()(std::string region, rs::stop_token st) const;
};
extern const fetch_t fetch;
} // namespace ctx_rates

// Pages whose `fetch` produces an int.
namespace ctx_ints {
rs::task<int> fetch(rs::stop_token st);
} // namespace ctx_ints

// docs/http.md: the reply type of the page's first block, and a client that returns it.
namespace ctx_http {
struct reply {
    int status;
    std::optional<std::string> retry_after;
};
} // namespace ctx_http
// Declared after the block's own declarations (a block may declare its own `reply`).
#define DOC_PRELUDE_LATE_http                                                                                \
    struct http_client {                                                                                     \
        rs::task<reply> get(const std::string& url, rs::stop_token st);                                     \
    };                                                                                                       \
    extern http_client client;

#ifdef DOC_CHECK_ASIO
// docs/asio.md and docs/redis.md: the objects of the page's first example.
namespace ctx_asio {
using asio::ip::tcp;
extern asio::io_context io;
extern tcp::endpoint quote_server;
extern rs::pipeline<rs::retry<rs::asio::clock>, rs::timeout<rs::asio::clock>> policy;
extern std::function<rs::task<double>(rs::stop_token)> fetch_quote;
struct quote_service {
    asio::io_context io;
    rs::asio::clock clock{io.get_executor()};
    rs::pipeline<rs::retry<rs::asio::clock>, rs::bulkhead<rs::asio::clock>, rs::timeout<rs::asio::clock>>
        policy;
};
extern quote_service svc;
void drained();
} // namespace ctx_asio

namespace ctx_redis {
extern rs::redis::connection redis;
} // namespace ctx_redis
#endif

#ifdef DOC_CHECK_BOOST_ASIO
// docs/asio.md: the Beast client of examples/beast_client.cpp, and the page's service.
namespace ctx_boost_asio {
namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using response = http::response<http::string_body>;
extern net::io_context io;
extern tcp::endpoint server;
net::awaitable<response> get_quote(tcp::endpoint server);
extern std::function<net::awaitable<response>()> fetch;
extern rs::pipeline<rs::retry<>, rs::timeout<>> policy;
struct quote_service {
    net::io_context io;
    rs::bulkhead<> slots;
    rs::pipeline<rs::retry<>, rs::bulkhead<>, rs::timeout<>> policy;
};
extern quote_service svc;
void drained();
} // namespace ctx_boost_asio
#endif

} // namespace doc_prelude
