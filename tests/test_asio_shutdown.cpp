// SPDX-License-Identifier: MIT
// A service that owns an io_context, its policies and its pipelines, torn down with calls in flight: the
// members destroyed in their natural order (the io_context, declared first, goes last), the io_context
// destroyed first, and a graceful drain through an async_scope. The calls wait in every kind of place: a
// retry's backoff, a hedge's delay, a bulkhead's queue, a rate limiter's queue, a read on a loopback
// socket. Run under the asan preset (LeakSanitizer is part of it) these show that every call is destroyed
// or ended, nothing leaks and nothing is touched after it is freed; on any build they count the objects
// the waiting calls own.
#include "catch.hpp"
#include "support.hpp"

#include "asio_flavour.hpp"
#include <resilience/async_scope.hpp>
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace test_asio_shutdown {

namespace rs = resilience;
using resilience_tests::tracked;
using namespace std::chrono_literals;
using tcp = net::ip::tcp;

namespace {

constexpr int calls_per_place = 20;

// Where the calls of a scenario wait.
enum class place { backoff, hedge, bulkhead, rate_limiter, socket, all };

// The server the attempts connect to and read from: it listens and never sends (the kernel completes
// the connections; nobody accepts them). Its io_context never runs.
struct silent_server {
    net::io_context io;
    tcp::acceptor listener{io, tcp::endpoint{net::ip::address_v4::loopback(), 0}};
};

// The service: the io_context first (the clock needs it), then the clock, the policies and the
// pipelines. The io_context is held in an optional only so that a test can destroy it first.
struct service {
    explicit service(silent_server& s) : server(s) {}

    silent_server& server;
    std::optional<net::io_context> io_holder{std::in_place};
    net::io_context& io = *io_holder;
    rsa::clock clock{io.get_executor()};
    rs::bulkhead<rsa::clock> slots{{.max_concurrent_calls = 1, .queue_limit = 1000}, clock};
    rs::rate_limiter<rsa::clock> tokens{
        {.token_limit = 1, .tokens_per_second = 1.0 / 3600, .queue_limit = 1000}, clock};
    rs::pipeline<rs::retry<rsa::clock>> backing_off{rs::retry{
        {.max_attempts = 5, .backoff = rs::constant_backoff{1h, rs::jitter::none}, .max_delay = 1h}, clock}};
    rs::pipeline<rs::hedge<rsa::clock>, rs::timeout<rsa::clock>> hedging{
        rs::hedge{{.max_attempts = 2, .delay = 1h}, clock}, rs::timeout{2h, clock}};
    rs::pipeline<rs::bulkhead<rsa::clock>> bounded{slots};
    rs::pipeline<rs::rate_limiter<rsa::clock>> throttled{tokens};
    rs::pipeline<rs::timeout<rsa::clock>> reading{rs::timeout{1h, clock}};

    int reads = 0;     // attempts that reached their read
    int failures = 0;  // attempts that failed at once (the retry's)
    int ended = 0;     // calls that ended (with a value or a failure)
    int completed = 0; // completion handlers called

    // An attempt: connects to the listener and reads what never comes.
    rs::task<int> read_forever(resilience::stop_token st) {
        tracked owned;
        tcp::socket socket{io};
        auto [connect_ec] =
            co_await socket.async_connect(server.listener.local_endpoint(), rsa::use_task(st));
        if (connect_ec)
            throw net_system_error(connect_ec);
        std::array<char, 16> buf{};
        ++reads;
        auto [ec, n] = co_await socket.async_read_some(net::buffer(buf), rsa::use_task(st));
        if (ec)
            throw net_system_error(ec);
        co_return static_cast<int>(n);
    }
    rs::task<int> fail_now() {
        ++failures;
        throw std::runtime_error("503");
        co_return 0;
    }

    // A call through the pipeline for `where`, as a function of the call's stop token.
    auto call(place where) {
        return [this, where](resilience::stop_token st) -> rs::task<int> {
            tracked owned; // in the caller's frame, above the policies'
            auto attempt = [this](resilience::stop_token a) { return read_forever(a); };
            int v = 0;
            try {
                switch (where) {
                case place::backoff:
                    v = co_await backing_off.execute([this] { return fail_now(); }, st);
                    break;
                case place::hedge:
                    v = co_await hedging.execute(attempt, st);
                    break;
                case place::bulkhead:
                    v = co_await bounded.execute(attempt, st);
                    break;
                case place::rate_limiter:
                    v = co_await throttled.execute(attempt, st);
                    break;
                default:
                    v = co_await reading.execute(attempt, st);
                    break;
                }
            } catch (...) {
                ++ended;
                throw;
            }
            ++ended;
            co_return v;
        };
    }

    std::vector<place> places(place where) const {
        if (where != place::all)
            return {where};
        return {place::backoff, place::hedge, place::bulkhead, place::rate_limiter, place::socket};
    }

    // Starts the calls with async_run, or in `scope` when given.
    void start(place where, rs::async_scope* scope = nullptr) {
        for (place p : places(where))
            for (int i = 0; i < calls_per_place; ++i) {
                auto done = [this](std::exception_ptr, int) { ++completed; };
                if (scope)
                    rsa::spawn(*scope, io.get_executor(), call(p), done);
                else
                    rsa::async_run(io.get_executor(), call(p), done);
            }
    }

    // Runs the io_context until every call waits where it should.
    void settle(place where) {
        const auto in_place = [&] {
            int want_reads = 0, want_failures = 0;
            for (place p : places(where)) {
                if (p == place::backoff)
                    want_failures += calls_per_place;
                else if (p == place::bulkhead || p == place::rate_limiter)
                    want_reads += 1;
                else
                    want_reads += calls_per_place;
            }
            const bool queues_full =
                (where != place::bulkhead && where != place::all) || slots.queued() == calls_per_place - 1;
            const bool limiter_full = (where != place::rate_limiter && where != place::all) ||
                                      tokens.queued() == calls_per_place - 1;
            return reads == want_reads && failures == want_failures && queues_full && limiter_full;
        };
        while (!in_place())
            REQUIRE(io.run_one_for(10s) == 1);
        io.poll(); // anything posted on the way
        CHECK(in_place());
        CHECK(ended == 0);
        // A frame of the caller's and one per attempt in flight.
        int expected = 0;
        for (place p : places(where))
            expected +=
                calls_per_place + (p == place::backoff                                ? 0
                                   : p == place::bulkhead || p == place::rate_limiter ? 1
                                                                                      : calls_per_place);
        CHECK(tracked::live == expected);
    }
};

const char* name_of(place p) {
    switch (p) {
    case place::backoff:
        return "a retry's backoff";
    case place::hedge:
        return "a hedge's delay";
    case place::bulkhead:
        return "a bulkhead's queue";
    case place::rate_limiter:
        return "a rate limiter's queue";
    case place::socket:
        return "a socket read";
    default:
        return "every place at once";
    }
}

} // namespace

TEST_CASE("asio shutdown: an io_context destroyed first destroys every call, wherever it waits",
          "[asio][shutdown]") {
    for (place where :
         {place::backoff, place::hedge, place::bulkhead, place::rate_limiter, place::socket, place::all}) {
        DYNAMIC_SECTION(name_of(where)) {
            REQUIRE(tracked::live == 0);
            silent_server server;
            auto s = std::make_unique<service>(server);
            s->start(where);
            s->settle(where);
            // The io_context goes first; the policies outlive it. Without its ownership of the calls,
            // those queued in the bulkhead or the limiter (owned by no Asio handler) leaked.
            s->io_holder.reset();
            CHECK(tracked::live == 0);
            CHECK(s->completed == 0); // destroyed, not called, as Asio does with pending handlers
            CHECK(s->slots.queued() == 0);
            CHECK(s->tokens.queued() == 0);
        }
    }
    CHECK(tracked::live == 0);
}

TEST_CASE("asio shutdown: a service destroyed in its natural member order destroys its calls last",
          "[asio][shutdown]") {
    for (place where :
         {place::backoff, place::hedge, place::bulkhead, place::rate_limiter, place::socket, place::all}) {
        DYNAMIC_SECTION(name_of(where)) {
            REQUIRE(tracked::live == 0);
            silent_server server;
            auto s = std::make_unique<service>(server);
            s->start(where);
            s->settle(where);
            // The pipelines and policies go first, then the io_context with the calls: a call queued
            // in the bulkhead or the limiter keeps that state alive until it is destroyed.
            s.reset();
            CHECK(tracked::live == 0);
        }
    }
}

TEST_CASE("asio shutdown: a graceful drain through an async_scope ends every call before the service goes",
          "[asio][shutdown]") {
    for (place where :
         {place::backoff, place::hedge, place::bulkhead, place::rate_limiter, place::socket, place::all}) {
        DYNAMIC_SECTION(name_of(where)) {
            REQUIRE(tracked::live == 0);
            silent_server server;
            auto s = std::make_unique<service>(server);
            rs::async_scope scope;
            s->start(where, &scope);
            s->settle(where);
            const int calls = static_cast<int>(s->places(where).size()) * calls_per_place;
            CHECK(scope.size() == static_cast<std::size_t>(calls));

            bool joined = false;
            rsa::async_run(s->io.get_executor(), scope.join(), [&](std::exception_ptr e) {
                CHECK(!e);
                joined = true;
            });
            s->io.poll();
            CHECK_FALSE(joined);
            scope.request_stop();
            s->io.run(); // returns once every call and the join have completed: nothing waits any more
            CHECK(joined);
            CHECK(scope.size() == 0);
            CHECK(s->ended == calls);
            CHECK(s->completed == calls);
            CHECK(tracked::live == 0);
            s.reset(); // no call left: any member order is fine
        }
    }
}

TEST_CASE("asio shutdown: a call spawned in a scope is stopped by Asio cancellation too",
          "[asio][shutdown]") {
    REQUIRE(tracked::live == 0);
    silent_server server;
    service s{server};
    rs::async_scope scope;
    net::cancellation_signal cancel;
    std::exception_ptr error;
    rsa::spawn(scope, s.io.get_executor(), s.call(place::socket),
               net::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, int) { error = e; }));
    while (s.reads != 1)
        REQUIRE(s.io.run_one_for(10s) == 1);
    CHECK(tracked::live == 2);
    net::post(s.io, [&] { cancel.emit(net::cancellation_type::terminal); });
    s.io.run();
    CHECK(error);
    CHECK_FALSE(scope.stop_requested());
    CHECK(scope.size() == 0);
    CHECK(tracked::live == 0);
}

TEST_CASE("asio shutdown: an io_context destroyed with a join pending destroys the joiner",
          "[asio][shutdown]") {
    REQUIRE(tracked::live == 0);
    rs::async_scope scope;
    bool joined = false;
    silent_server server;
    {
        service s{server};
        s.start(place::socket, &scope);
        s.settle(place::socket);
        rsa::async_run(s.io.get_executor(), scope.join(), [&](std::exception_ptr) { joined = true; });
        s.io.poll();
    }
    CHECK_FALSE(joined);
    CHECK(scope.size() == 0);
    CHECK(tracked::live == 0);
}

TEST_CASE("asio shutdown: a call destroyed with its io_context while it awaits an operation of another one",
          "[asio][shutdown]") {
    REQUIRE(tracked::live == 0);
    net::io_context other; // runs after the call's io_context is gone
    net::steady_timer due{other, std::chrono::steady_clock::time_point{}}; // already due
    bool resumed = false;
    {
        net::io_context io;
        auto waits_elsewhere = [](net::steady_timer& timer, bool& done) -> rs::task<void> {
            tracked in_frame;
            co_await timer.async_wait(rsa::use_task);
            done = true;
        };
        rsa::async_run(io.get_executor(), waits_elsewhere(due, resumed), net::detached);
        io.poll(); // the call starts and waits on the other context's timer
        CHECK(tracked::live == 1);
    } // the io_context destroys the call, with the operation in its frame
    CHECK(tracked::live == 0);
    CHECK(other.poll() == 1); // the timer's handler runs and finds nobody to resume
    CHECK_FALSE(resumed);
}

} // namespace test_asio_shutdown
