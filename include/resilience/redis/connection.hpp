// SPDX-License-Identifier: MIT
/// \file redis/connection.hpp
/// `redis::connection`: an asynchronous, pipelined Redis connection on an Asio executor, with the
/// errors it reports (`redis::error`) and the replies it parses (`redis::reply`, read by hiredis's
/// RESP reader; the socket and the timers are Asio's, so no thread ever blocks).
#pragma once

#include "../asio.hpp"
#include "../backoff.hpp"
#include "../error.hpp"
#include "../random.hpp"
#include "../task.hpp"

#include <asio/connect.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>

#include <hiredis/hiredis.h> // HIREDIS_MAJOR
#include <hiredis/read.h>

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
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace resilience::redis {

/// Why a Redis command failed without a reply from the server's script or command.
enum class errc {
    unavailable = 1, ///< no connection: the connect failed, or the connection waits out its reconnect backoff
    connection_lost, ///< the connection broke with the command in flight: it may or may not have run
    timeout,         ///< no reply within `command_timeout`: it may or may not have run
    protocol,        ///< the server sent something that is not RESP, or a reply nobody asked for
    server,          ///< the server answered with an error reply (its text is `what()`)
};

namespace detail {
class error_category_impl final : public std::error_category {
public:
    const char* name() const noexcept override { return "resilience.redis"; }
    std::string message(int value) const override {
        switch (static_cast<errc>(value)) {
        case errc::unavailable:
            return "redis unavailable";
        case errc::connection_lost:
            return "redis connection lost";
        case errc::timeout:
            return "redis command timed out";
        case errc::protocol:
            return "redis protocol error";
        case errc::server:
            return "redis error reply";
        }
        return "unknown redis error";
    }
};
} // namespace detail

/// The category of `redis::errc`; one object for the whole program.
inline const std::error_category& error_category() noexcept {
    static const detail::error_category_impl category;
    return category;
}
inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), error_category()};
}

/// A Redis command failed: `code()` is a `redis::errc`. A `std::system_error`, not an `rs::error`:
/// it says what happened to the connection, not what a policy decided (the policies turn it into
/// their own refusal, or let the call through, as their options say).
class error : public std::system_error {
public:
    explicit error(errc e, const std::string& what = {}) : std::system_error(make_error_code(e), what) {}
};

/// One RESP reply. Strings, statuses and errors keep their text in `str`; integers in `integer`;
/// arrays their elements. A `nil` is a null bulk string or a null array.
struct reply {
    enum class kind : unsigned char { string, array, integer, nil, status, error };
    kind type = kind::nil;
    std::string str{};
    long long integer = 0;
    std::vector<reply> elements{};

    [[nodiscard]] bool is_error() const noexcept { return type == kind::error; }
};

/// How to reach the server and what to do when it cannot be reached.
struct connection_options {
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
    /// Carried by the errors (`what()`).
    std::string name{};

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
            throw std::invalid_argument(who + "user info (\"user:password@\") is not supported (no AUTH is sent)");
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

// hiredis's reader builds our `reply` tree: a root is allocated, a child is constructed in place in
// its parent's elements (sized by the array header), so only roots are ever freed.
struct reply_builder {
    static reply* place(const redisReadTask* task) {
        if (task->parent != nullptr)
            return &static_cast<reply*>(task->parent->obj)->elements[static_cast<std::size_t>(task->idx)];
        return new reply;
    }
    static void* create_string(const redisReadTask* task, char* s, std::size_t n) noexcept {
        try {
            reply* r = place(task);
            r->type = task->type == REDIS_REPLY_ERROR    ? reply::kind::error
                      : task->type == REDIS_REPLY_STATUS ? reply::kind::status
                                                         : reply::kind::string;
            r->str.assign(s, n);
            return r;
        } catch (...) {
            return nullptr;
        }
    }
    // hiredis 1.0 changed the reader's callbacks: an array's size became a size_t, and RESP3's
    // doubles and booleans got callbacks of their own (never called here, as the connection speaks
    // RESP2; should one come, a double keeps its text and a boolean becomes 0 or 1).
#if defined(HIREDIS_MAJOR) && HIREDIS_MAJOR >= 1
    using array_size = std::size_t;
#else
    using array_size = int;
#endif
    static void* create_array(const redisReadTask* task, array_size n) noexcept {
        try {
            reply* r = place(task);
            r->type = reply::kind::array;
            r->elements.resize(static_cast<std::size_t>(n));
            return r;
        } catch (...) {
            return nullptr;
        }
    }
    static void* create_integer(const redisReadTask* task, long long v) noexcept {
        try {
            reply* r = place(task);
            r->type = reply::kind::integer;
            r->integer = v;
            return r;
        } catch (...) {
            return nullptr;
        }
    }
    static void* create_nil(const redisReadTask* task) noexcept {
        try {
            reply* r = place(task);
            r->type = reply::kind::nil;
            return r;
        } catch (...) {
            return nullptr;
        }
    }
    static void free_object(void* r) noexcept { delete static_cast<reply*>(r); }

#if defined(HIREDIS_MAJOR) && HIREDIS_MAJOR >= 1
    static void* create_double(const redisReadTask* task, double, char* s, std::size_t n) noexcept {
        try {
            reply* r = place(task);
            r->type = reply::kind::string;
            r->str.assign(s, n);
            return r;
        } catch (...) {
            return nullptr;
        }
    }
    static void* create_bool(const redisReadTask* task, int v) noexcept { return create_integer(task, v != 0); }

    static redisReplyObjectFunctions* functions() noexcept {
        static redisReplyObjectFunctions fns{&create_string, &create_array, &create_integer, &create_double,
                                             &create_nil,    &create_bool,  &free_object};
        return &fns;
    }
#else
    static redisReplyObjectFunctions* functions() noexcept {
        static redisReplyObjectFunctions fns{&create_string, &create_array, &create_integer, &create_nil,
                                             &free_object};
        return &fns;
    }
#endif
};

/// A command as RESP: an array of bulk strings.
inline void append_command(std::string& out, const std::vector<std::string>& args) {
    out += '*';
    out += std::to_string(args.size());
    out += "\r\n";
    for (const std::string& a : args) {
        out += '$';
        out += std::to_string(a.size());
        out += "\r\n";
        out += a;
        out += "\r\n";
    }
}

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
                p->failure = std::make_exception_ptr(
                    error{errc::unavailable, prefix() + "reconnecting in " +
                                                 std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                    retry_at_ - now)
                                                                    .count()) +
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
        explicit link(const ::asio::any_io_executor& ex)
            : socket(ex), resolver(ex), reader(redisReaderCreateWithFunctions(reply_builder::functions())) {
            if (!reader)
                throw std::bad_alloc{};
        }
        link(const link&) = delete;
        link& operator=(const link&) = delete;
        ~link() { redisReaderFree(reader); }
        ::asio::ip::tcp::socket socket;
        ::asio::ip::tcp::resolver resolver;
        redisReader* reader;
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
        l->resolver.async_resolve(
            options_.host, std::to_string(options_.port),
            [self, l, on_connect](const std::error_code& rec, ::asio::ip::tcp::resolver::results_type results) {
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
        l->socket.async_read_some(
            ::asio::buffer(l->buffer), [self = shared_from_this(), l](const std::error_code& ec, std::size_t n) {
                if (self->link_ != l)
                    return;
                l->reading = false;
                if (ec) {
                    self->lost(errc::connection_lost, ec == ::asio::error::eof ? "closed by the server" : ec.message(),
                               false);
                    return;
                }
                if (redisReaderFeed(l->reader, l->buffer.data(), n) != REDIS_OK) {
                    self->lost(errc::protocol, l->reader->errstr, false);
                    return;
                }
                for (;;) {
                    void* raw = nullptr;
                    if (redisReaderGetReply(l->reader, &raw) != REDIS_OK) {
                        self->lost(errc::protocol, l->reader->errstr, false);
                        return;
                    }
                    if (raw == nullptr)
                        break;
                    std::unique_ptr<reply> r{static_cast<reply*>(raw)};
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
                const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(self->options_.command_timeout);
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
    std::string out_; // encoded commands not yet handed to the socket
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
    command_awaiter(::asio::any_io_executor ex, std::shared_ptr<pending> p, std::stop_token token)
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
    std::stop_token token_;
    std::optional<std::stop_callback<on_stop>> on_stop_;
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
        : state_(std::make_shared<detail::connection_state>(std::move(executor), validated(std::move(options)))) {}

    /// Sends one command (`args[0]` the command's name) and returns its reply, an error reply
    /// included (`reply::is_error()`). Throws `redis::error` when there is no reply (see the class
    /// comment), `rs::cancelled_error` when `token` stops the wait.
    task<reply> command(std::vector<std::string> args, std::stop_token token = {}) const {
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
        const std::string who = "resilience::redis::connection: ";
        if (o.host.empty())
            throw std::invalid_argument(who + "host must not be empty");
        if (o.port == 0)
            throw std::invalid_argument(who + "port must not be 0");
        if (o.command_timeout <= std::chrono::nanoseconds::zero() || o.command_timeout > std::chrono::hours{24 * 365})
            throw std::invalid_argument(who + "command_timeout must be positive and at most a year, got " +
                                        std::to_string(o.command_timeout.count()) + "ns");
        return o;
    }

    static task<reply> run(std::shared_ptr<detail::connection_state> s, std::vector<std::string> args,
                           std::stop_token token) {
        if (token.stop_requested())
            throw cancelled_error{"redis"};
        detail::command_awaiter wait{s->executor(), s->submit(args), std::move(token)};
        s.reset(); // the wait does not hold the connection alive
        co_return co_await wait;
    }

    std::shared_ptr<detail::connection_state> state_;
};

} // namespace resilience::redis

template <>
struct std::is_error_code_enum<resilience::redis::errc> : std::true_type {};
