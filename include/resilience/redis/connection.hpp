// SPDX-License-Identifier: MIT
/// \file redis/connection.hpp
/// `redis::connection`: an asynchronous, pipelined Redis connection on an Asio executor. It reports
/// `redis::error`s (error.hpp) and returns `redis::reply`s (resp.hpp, read by hiredis's RESP reader);
/// the socket and the timers are Asio's, so no thread ever blocks.
///
/// The Redis headers' coroutines, and the functions that reach one, are templates (over a parameter
/// with a default, or deduced from their arguments) although nothing about them varies: g++ 12 at -O0
/// compiles every inline coroutine that is not a template into each file that includes its header,
/// called or not, with everything it instantiates (`<resilience/redis.hpp>` made a Debug object of
/// 480 KB and took 5 s to compile; as templates, 3 s and next to nothing, as with any optimisation).
#pragma once

#include "../asio.hpp"
#include "../backoff.hpp"
#include "../detail/label.hpp"
#include "../error.hpp"
#include "../random.hpp"
#include "../stop_token.hpp"
#include "../task.hpp"
#include "error.hpp"
#include "resp.hpp"

#include <asio/connect.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>

#include <array>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace resilience::inline v0_2::redis {

/// How to reach the server and what to do when it cannot be reached.
struct connection_options {
    /// Carried by the errors (`what()`).
    std::string name{};
    /// A host name or an address. Must not be empty.
    std::string host = "127.0.0.1";
    /// Must not be 0.
    std::uint16_t port = 6379;
    /// How long a command may wait for its reply, connecting included. Past it the command fails
    /// with `errc::timeout` and the connection is dropped (Redis answers in order: the replies
    /// behind a late one are late too), with every command in flight failing the same way.
    /// Must be positive.
    std::chrono::nanoseconds command_timeout = std::chrono::milliseconds{250};
    /// The wait after the n-th failed connect (or a timed-out connection) before the next connect
    /// is tried; meanwhile commands fail at once with `errc::unavailable`, so an outage costs a
    /// caller nothing but a check. A connection lost by an I/O error is reconnected at once, on
    /// the next command.
    backoff reconnect = exponential_backoff{std::chrono::milliseconds{50}, 2.0, std::chrono::seconds{2}};

    /// `redis://host:port` (or `host:port`, or `host`; the port defaults to 6379). An IPv6 address
    /// is written in brackets: `redis://[::1]:6379`. A database may be given only as `/0` (the
    /// connection sends no `SELECT`), and no user or password (it sends no `AUTH`): anything else
    /// throws `std::invalid_argument` rather than connecting somewhere other than meant.
    static connection_options from_url(std::string_view url) {
        const std::string who = "resilience::redis::connection_options::from_url: ";
        connection_options o;
        if (url.starts_with("redis://"))
            url.remove_prefix(8);
        if (const auto slash = url.find('/'); slash != std::string_view::npos) {
            const std::string db{url.substr(slash + 1)};
            if (!db.empty() && db != "0")
                throw std::invalid_argument(who + "db must be 0 (no SELECT is sent), got \"" + db + "\"");
            url = url.substr(0, slash);
        }
        if (url.find('@') != std::string_view::npos) // its text, a password, is left out of the message
            throw std::invalid_argument(who +
                                        "user info (\"user:password@\") is not supported (no AUTH is sent)");
        std::string_view port = url;
        if (url.starts_with('[')) {
            const auto close = url.find(']');
            if (close == std::string_view::npos || (close + 1 < url.size() && url[close + 1] != ':'))
                throw std::invalid_argument(who + "bad bracketed host, got \"" + std::string{url} + "\"");
            o.host = std::string{url.substr(1, close - 1)};
            port = url.substr(close + 1);
        } else {
            const auto colon = url.rfind(':');
            o.host = std::string{url.substr(0, colon)};
            port = colon == std::string_view::npos ? std::string_view{} : url.substr(colon);
        }
        if (!port.empty()) { // ":port"
            const std::string digits{port.substr(1)};
            std::size_t used = 0;
            unsigned long p = 0;
            try {
                p = std::stoul(digits, &used);
            } catch (const std::exception&) {
                used = 0;
            }
            if (used != digits.size() || p == 0 || p > 65535)
                throw std::invalid_argument(who + "port must be from 1 to 65535, got \"" + digits + "\"");
            o.port = static_cast<std::uint16_t>(p);
        }
        return o;
    }
};

namespace detail {

/// One command sent: its reply or failure, and the coroutine waiting for it (none for `send`).
/// It stays in the connection's queue until its reply arrives, even when its caller has left
/// (stopped): replies are matched to commands by their order.
struct pending {
    std::chrono::steady_clock::time_point deadline{};
    std::optional<reply> result{};
    std::exception_ptr failure{};
    bool done = false;
    std::coroutine_handle<> waiter{};

    // Ends the wait (once): resumes the caller, inline. The caller's call is owned by its io_context
    // (see asio.hpp), not by this entry.
    void finish() {
        done = true;
        if (waiter)
            std::exchange(waiter, {}).resume();
    }
    void fail(std::exception_ptr e) {
        if (done)
            return;
        failure = std::move(e);
        finish();
    }
};

/// The connection itself. Touched only on its executor's thread; Asio handlers hold it alive.
class connection_state : public std::enable_shared_from_this<connection_state> {
public:
    connection_state(::asio::any_io_executor ex, connection_options o)
        : executor_(std::move(ex)), options_(std::move(o)), watchdog_(executor_) {}
    connection_state(const connection_state&) = delete;
    connection_state& operator=(const connection_state&) = delete;

    ~connection_state() {
        // Destroyed with callers still waiting (their io_context is going away): their calls are
        // destroyed by it, as it destroys every call started on it; none is resumed from here.
        for (auto& p : queue_)
            p->waiter = {};
    }

    const ::asio::any_io_executor& executor() const noexcept { return executor_; }
    const connection_options& options() const noexcept { return options_; }
    bool connected() const noexcept { return state_ == state::open; }
    std::size_t in_flight() const noexcept { return queue_.size(); }
    std::uint64_t commands() const noexcept { return commands_; }

    /// Queues `args` (connecting first if needed) and returns its entry; already failed when the
    /// connection is waiting out its backoff.
    std::shared_ptr<pending> submit(const std::vector<std::string>& args) {
        auto p = std::make_shared<pending>();
        const auto now = std::chrono::steady_clock::now();
        p->deadline = now + options_.command_timeout;
        if (state_ == state::backing_off) {
            if (now < retry_at_) {
                p->done = true;
                p->failure = std::make_exception_ptr(error{
                    errc::unavailable,
                    prefix() + "reconnecting in " +
                        std::to_string(
                            std::chrono::duration_cast<std::chrono::milliseconds>(retry_at_ - now).count()) +
                        "ms: " + last_failure_});
                return p;
            }
            state_ = state::idle;
        }
        append_command(out_, args);
        queue_.push_back(p);
        ++commands_;
        if (state_ == state::idle) {
            connect();
        } else if (state_ == state::open) {
            flush();
            read();
        }
        arm_watchdog();
        return p;
    }

    /// Time until the next connect may be tried (zero unless backing off).
    std::chrono::nanoseconds reconnect_in() const noexcept {
        if (state_ != state::backing_off)
            return std::chrono::nanoseconds::zero();
        const auto left = retry_at_ - std::chrono::steady_clock::now();
        return left > std::chrono::nanoseconds::zero() ? left : std::chrono::nanoseconds::zero();
    }

    /// Drops the connection (the next command reconnects); commands in flight fail with
    /// `connection_lost`.
    void close() { lost(errc::connection_lost, "closed", false); }

private:
    enum class state : unsigned char { idle, connecting, open, backing_off };

    // One socket and what goes with it; a reconnect makes a new one, so a handler of an old socket
    // finds itself stale by comparing with `link_`.
    struct link {
        explicit link(const ::asio::any_io_executor& ex) : socket(ex), resolver(ex) {}
        ::asio::ip::tcp::socket socket;
        ::asio::ip::tcp::resolver resolver;
        reply_reader reader;
        std::string writing;
        bool reading = false;
        std::array<char, 16384> buffer{};
    };

    std::string prefix() const {
        return (options_.name.empty() ? std::string{} : options_.name + ": ") + options_.host + ":" +
               std::to_string(options_.port) + ": ";
    }

    void connect() {
        state_ = state::connecting;
        auto l = std::make_shared<link>(executor_);
        link_ = l;
        auto self = shared_from_this();
        auto on_connect = [self, l](const std::error_code& ec, const auto&...) {
            if (self->link_ != l)
                return;
            if (ec) {
                self->connect_failed(ec.message());
                return;
            }
            std::error_code ignored;
            l->socket.set_option(::asio::ip::tcp::no_delay{true}, ignored);
            self->state_ = state::open; // the backoff goes on growing until the server answers
            self->flush();
            self->read();
        };
        std::error_code ec;
        const auto address = ::asio::ip::make_address(options_.host, ec);
        if (!ec) {
            l->socket.async_connect(::asio::ip::tcp::endpoint{address, options_.port}, on_connect);
            return;
        }
        l->resolver.async_resolve(options_.host, std::to_string(options_.port),
                                  [self, l, on_connect](const std::error_code& rec,
                                                        ::asio::ip::tcp::resolver::results_type results) {
                                      if (self->link_ != l)
                                          return;
                                      if (rec) {
                                          self->connect_failed(rec.message());
                                          return;
                                      }
                                      ::asio::async_connect(l->socket, results, on_connect);
                                  });
    }

    void connect_failed(const std::string& why) { lost(errc::unavailable, "cannot connect: " + why, true); }

    void flush() {
        const std::shared_ptr<link>& l = link_;
        if (state_ != state::open || !l->writing.empty() || out_.empty())
            return;
        l->writing.swap(out_);
        ::asio::async_write(l->socket, ::asio::buffer(l->writing),
                            [self = shared_from_this(), l](const std::error_code& ec, std::size_t) {
                                if (self->link_ != l)
                                    return;
                                l->writing.clear();
                                if (ec) {
                                    self->lost(errc::connection_lost, ec.message(), false);
                                    return;
                                }
                                self->flush();
                            });
    }

    // Reads only while replies are due, so an idle connection has no operation pending (an
    // io_context with nothing else to do returns from run()).
    void read() {
        const std::shared_ptr<link>& l = link_;
        if (state_ != state::open || l->reading || queue_.empty())
            return;
        l->reading = true;
        l->socket.async_read_some(::asio::buffer(l->buffer), [self = shared_from_this(),
                                                              l](const std::error_code& ec, std::size_t n) {
            if (self->link_ != l)
                return;
            l->reading = false;
            if (ec) {
                self->lost(errc::connection_lost,
                           ec == ::asio::error::eof ? "closed by the server" : ec.message(), false);
                return;
            }
            l->reader.feed({l->buffer.data(), n});
            for (;;) {
                std::optional<reply> r = l->reader.next();
                if (l->reader.failed()) {
                    self->lost(errc::protocol, std::string{l->reader.error_text()}, false);
                    return;
                }
                if (!r)
                    break;
                self->attempts_ = 0; // an answer, not a connect, ends the outage
                if (self->queue_.empty()) {
                    self->lost(errc::protocol, "a reply nobody asked for", false);
                    return;
                }
                std::shared_ptr<pending> p = std::move(self->queue_.front());
                self->queue_.pop_front();
                if (self->queue_.empty())
                    self->watchdog_.cancel();
                if (!p->done) {
                    p->result.emplace(std::move(*r));
                    p->finish(); // may issue commands, or close this connection
                    if (self->link_ != l)
                        return;
                }
            }
            self->read();
        });
    }

    // The queue's front has the earliest deadline (one timeout for all, in sending order), so one
    // timer watches them all: it fires at the front's deadline, and is re-armed for the new front
    // when that one was answered meanwhile.
    void arm_watchdog() {
        if (watchdog_armed_ || queue_.empty())
            return;
        watchdog_armed_ = true;
        watchdog_.expires_at(queue_.front()->deadline);
        watchdog_.async_wait([self = shared_from_this()](const std::error_code&) {
            self->watchdog_armed_ = false;
            if (self->queue_.empty())
                return;
            if (self->queue_.front()->deadline <= std::chrono::steady_clock::now()) {
                const auto ms =
                    std::chrono::duration_cast<std::chrono::milliseconds>(self->options_.command_timeout);
                self->lost(errc::timeout, "no reply within " + std::to_string(ms.count()) + "ms", true);
                return;
            }
            self->arm_watchdog();
        });
    }

    // Drops the socket and fails every command in flight with `code`. `back_off`: the next connect
    // waits the reconnect backoff (a failed connect, a server that stopped answering); otherwise
    // the next command reconnects at once.
    void lost(errc code, const std::string& why, bool back_off) {
        if (link_) {
            std::error_code ignored;
            link_->socket.close(ignored);
            link_->resolver.cancel();
            link_.reset();
        }
        out_.clear();
        last_failure_ = why;
        if (back_off) {
            ++attempts_;
            thread_random rng;
            retry_at_ = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            options_.reconnect.delay(attempts_, rng));
            state_ = state::backing_off;
        } else {
            state_ = state::idle;
        }
        std::deque<std::shared_ptr<pending>> failed;
        failed.swap(queue_);
        watchdog_.cancel();
        const std::string text = prefix() + why;
        for (auto& p : failed)
            p->fail(std::make_exception_ptr(error{code, text})); // may submit commands again
    }

    ::asio::any_io_executor executor_;
    connection_options options_;
    state state_ = state::idle;
    std::shared_ptr<link> link_;
    std::string out_;                            // encoded commands not yet handed to the socket
    std::deque<std::shared_ptr<pending>> queue_; // sent or to send, in order, awaiting replies
    ::asio::steady_timer watchdog_;
    bool watchdog_armed_ = false;
    int attempts_ = 0; // failed connects and timed-out links since the server last answered
    std::uint64_t commands_ = 0;
    std::chrono::steady_clock::time_point retry_at_{};
    std::string last_failure_;
};

/// The wait for one command: resumed by the connection, or by the caller's stop (posted to the
/// connection's executor, where the entry is failed with `cancelled_error`). It does not hold the
/// connection: a connection destroyed with callers waiting gives up their calls (see
/// `connection_state`'s destructor).
class command_awaiter {
public:
    command_awaiter(::asio::any_io_executor ex, std::shared_ptr<pending> p, stop_token token)
        : executor_(std::move(ex)), p_(std::move(p)), token_(std::move(token)) {}
    command_awaiter(const command_awaiter&) = delete;
    command_awaiter& operator=(const command_awaiter&) = delete;
    ~command_awaiter() {
        if (!p_->done)
            p_->waiter = {}; // the caller's frame is being destroyed while it waits
    }

    bool await_ready() const noexcept { return p_->done; }
    void await_suspend(std::coroutine_handle<> h) {
        p_->waiter = h;
        if (token_.stop_possible())
            on_stop_.emplace(token_, on_stop{executor_, p_});
    }
    reply await_resume() {
        on_stop_.reset();
        if (p_->failure)
            std::rethrow_exception(p_->failure);
        return std::move(*p_->result);
    }

private:
    struct on_stop {
        ::asio::any_io_executor executor;
        std::shared_ptr<pending> p;
        void operator()() const {
            ::asio::post(executor, [p = p] { p->fail(std::make_exception_ptr(cancelled_error{"redis"})); });
        }
    };

    ::asio::any_io_executor executor_;
    std::shared_ptr<pending> p_;
    stop_token token_;
    std::optional<stop_callback<on_stop>> on_stop_;
};

} // namespace detail

/// An asynchronous Redis connection on an Asio executor. A copyable handle: copies share one
/// connection.
///
/// - **Pipelined.** Commands are written as they come, without waiting for earlier replies; replies
///   are matched to commands by their order, as Redis answers in order.
/// - **Lazy.** Nothing connects until the first command; an idle connection has no Asio operation
///   pending.
/// - **Reconnecting.** A failed connect, or a connection that stopped answering within
///   `command_timeout`, makes the next connect wait `reconnect`'s backoff; commands meanwhile fail
///   at once with `errc::unavailable`. A connection lost by an I/O error reconnects on the next command.
/// - **Never resent.** A command whose connection broke, or that got no reply in time, fails
///   (`connection_lost`, `timeout`) and is not sent again: it may have run. Whether to send it
///   again is the caller's decision, which only the caller can make safely.
/// - **Stoppable.** A caller's stop ends its wait at once with `rs::cancelled_error`; the command
///   itself, already sent, still runs, and its reply is read and dropped.
///
/// Everything runs on `executor`, which must be run by one thread at a time (an `io_context` run
/// by one thread, or a strand): commands must be issued from there, and callers are resumed there.
/// Its execution context must outlive every command.
///
///     asio::io_context io;
///     rs::redis::connection redis{io.get_executor(), {.port = 6379}};
///     rs::redis::reply r = co_await redis.command({"INCR", "visits"}, stop);   // inside async_run
class connection {
public:
    explicit connection(::asio::any_io_executor executor, connection_options options = {})
        : state_(std::make_shared<detail::connection_state>(std::move(executor),
                                                            validated(std::move(options)))) {}

    /// Sends one command (`args[0]` the command's name) and returns its reply, an error reply
    /// included (`reply::is_error()`). Throws `redis::error` when there is no reply (see the class
    /// comment), `rs::cancelled_error` when `token` stops the wait.
    template <class = void> // a template only for g++ -O0 (see the file comment)
    task<reply> command(std::vector<std::string> args, stop_token token = {}) const {
        return run(state_, std::move(args), std::move(token));
    }

    /// Sends one command and drops its reply: for a command whose result nobody needs (releasing a
    /// lease). It fails silently, as a command whose reply is dropped cannot say so.
    void send(const std::vector<std::string>& args) const { (void)state_->submit(args); }

    /// Drops the connection now; commands in flight fail with `connection_lost`, the next one
    /// reconnects.
    void close() const { state_->close(); }

    [[nodiscard]] bool connected() const noexcept { return state_->connected(); }
    /// Commands sent (or being sent) whose reply has not arrived yet.
    [[nodiscard]] std::size_t in_flight() const noexcept { return state_->in_flight(); }
    /// Commands written (or queued to be) since the connection was made: each is one round trip,
    /// shared with the commands pipelined beside it. Commands refused while backing off are not counted.
    [[nodiscard]] std::uint64_t commands() const noexcept { return state_->commands(); }
    /// Time until the next connect may be tried: zero unless waiting out the reconnect backoff.
    [[nodiscard]] std::chrono::nanoseconds reconnect_in() const noexcept { return state_->reconnect_in(); }
    [[nodiscard]] const ::asio::any_io_executor& executor() const noexcept { return state_->executor(); }
    [[nodiscard]] const connection_options& options() const noexcept { return state_->options(); }

    friend bool operator==(const connection& a, const connection& b) noexcept { return a.state_ == b.state_; }

private:
    static connection_options validated(connection_options o) {
        const std::string who = ::resilience::detail::policy_label("redis::connection", o.name) + ": ";
        if (o.host.empty())
            throw std::invalid_argument(who + "host must not be empty");
        if (o.port == 0)
            throw std::invalid_argument(who + "port must not be 0");
        if (o.command_timeout <= std::chrono::nanoseconds::zero() ||
            o.command_timeout > std::chrono::hours{24 * 365})
            throw std::invalid_argument(who + "command_timeout must be positive and at most a year, got " +
                                        std::to_string(o.command_timeout.count()) + "ns");
        return o;
    }

    template <class State> // State: detail::connection_state; a template for g++ -O0 (file comment)
    static task<reply> run(std::shared_ptr<State> s, std::vector<std::string> args, stop_token token) {
        if (token.stop_requested())
            throw cancelled_error{"redis"};
        detail::command_awaiter wait{s->executor(), s->submit(args), std::move(token)};
        s.reset(); // the wait does not hold the connection alive
        co_return co_await wait;
    }

    std::shared_ptr<detail::connection_state> state_;
};

} // namespace resilience::redis
