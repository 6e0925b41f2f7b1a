// SPDX-License-Identifier: MIT
/// \file grpc.hpp
/// Optional gRPC integration (target `resilience::grpc`, on gRPC's C++ library): `rs::grpc::unary`,
/// which awaits a unary RPC of the callback API from a coroutine, with the attempt's stop token
/// cancelling the RPC and the attempt's deadline becoming the RPC's; and `status_classifier`, a
/// `should_handle` that follows gRPC's own retry design (retryable status codes, server pushback,
/// no retry of a call the server may have started unless the method is safe to run twice).
///
///     rs::retry retry{{.max_attempts = 4, .should_handle = rs::grpc::status_classifier<EchoReply>{}}};
///     rs::grpc::reply<EchoReply> r = co_await retry.execute([&](const rs::context& ctx) {
///         return rs::grpc::unary(ctx, stub->async(), &Echo::Stub::async::Say, request);
///     });
///     if (r.ok()) use(r.response);
///
/// Never included by <resilience/resilience.hpp>. Docs: docs/grpc.md.
///
/// Locking: each `unary_state`'s `mutex` is held by the RPC's completion from its change of `phase` until
/// its post to the waiter's loop is made, and by the waiter's destructor for its own change of `phase`, so
/// that a waiter torn down with its loop never meets a completion halfway; `phase` is an atomic, read
/// without it. No function is called with it held, so none is named `_locked`.
#pragma once

#include "classifier.hpp"
#include "clock.hpp"
#include "context.hpp"
#include "detail/home_loop.hpp"
#include "error.hpp"
#include "outcome.hpp"
#include "stop_token.hpp"
#include "task.hpp"

#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>
#include <grpcpp/support/string_ref.h>

#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace resilience::inline v0_2::grpc {

// ------------------------------------------------------------------------------------------------
// Pushback: what the server's `grpc-retry-pushback-ms` asks for.

/// The trailing metadata key by which a server tells a client when to retry (gRPC's retry design,
/// "Pushback").
inline constexpr std::string_view pushback_key = "grpc-retry-pushback-ms";

/// What a server's pushback says.
enum class pushback_kind {
    none,  ///< the server sent none: the backoff decides
    delay, ///< retry after `pushback::delay`, not after the backoff
    stop,  ///< do not retry (a negative or malformed value, as gRPC's design reads it)
};

/// A pushback as read from the trailing metadata.
struct pushback {
    pushback_kind kind = pushback_kind::none;
    std::chrono::milliseconds delay{}; ///< meaningful for `pushback_kind::delay` only
    friend bool operator==(const pushback&, const pushback&) = default;
};

/// The longest pushback read: `std::chrono::nanoseconds::max()` in whole milliseconds (about 292
/// years), so that any delay converts to a verdict's delay without overflow.
inline constexpr std::chrono::milliseconds max_pushback =
    std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::nanoseconds::max());

/// Reads a `grpc-retry-pushback-ms` value: one or more ASCII digits is a delay of that many
/// milliseconds (`0` is "retry at once"); anything else (a minus sign, `-1`, an empty value, a
/// unit, spaces, a fraction, a number above `max_pushback`) is "do not retry": gRPC's design reads
/// a negative or unparseable pushback as the server asking the client not to retry. No
/// allocation, no locale, no exception.
[[nodiscard]] constexpr pushback parse_pushback(std::string_view value) noexcept {
    if (value.empty())
        return {.kind = pushback_kind::stop, .delay = {}};
    std::int64_t n = 0;
    for (const char c : value) {
        if (c < '0' || c > '9')
            return {.kind = pushback_kind::stop, .delay = {}};
        n = n * 10 + (c - '0');
        if (n > max_pushback.count())
            return {.kind = pushback_kind::stop, .delay = {}}; // checked at every digit: no overflow
    }
    return {.kind = pushback_kind::delay, .delay = std::chrono::milliseconds{n}};
}

/// The pushback in a call's trailing metadata (`ClientContext::GetServerTrailingMetadata()`), or
/// `pushback_kind::none` when there is none. With several values, the first is read.
template <class Metadata>
[[nodiscard]] pushback read_pushback(const Metadata& trailing) {
    const auto it = trailing.find(::grpc::string_ref{pushback_key.data(), pushback_key.size()});
    if (it == trailing.end())
        return {};
    return parse_pushback(std::string_view{it->second.data(), it->second.size()});
}

// ------------------------------------------------------------------------------------------------
// The result of one RPC.

/// What one unary RPC ended with: its status, the response (meaningful when `ok()`), the server's
/// pushback and whether the server is known to have started the call. A plain value.
template <class Response>
struct reply {
    ::grpc::Status status{};
    Response response{};
    /// Read from the trailing metadata (see `parse_pushback`).
    resilience::grpc::pushback pushback{};
    /// The server sent initial metadata with at least one entry, or a response: it began the call,
    /// which gRPC's design then calls committed (see `status_classifier` for what it changes).
    bool server_started = false;

    [[nodiscard]] bool ok() const noexcept { return status.ok(); }
};

// ------------------------------------------------------------------------------------------------
// The classifier.

/// What a `status_classifier` retries.
struct classifier_options {
    /// The status codes worth another attempt (gRPC's `retryableStatusCodes`). Each must be a
    /// status code other than `OK`; the constructor throws `std::invalid_argument` otherwise.
    std::vector<::grpc::StatusCode> retryable_codes{::grpc::StatusCode::UNAVAILABLE};
    /// The method may run twice (it is idempotent, or the server deduplicates): a call the server
    /// had started is retried too. `false`: such a call is not (gRPC's design: a committed call is
    /// never retried).
    bool safe_to_retry = false;
    /// A `grpc-retry-pushback-ms` sets the retry's wait (capped by `retry_options::max_delay`), and a
    /// negative or malformed one stops the retries. `false`: the backoff decides, whatever the
    /// server asked.
    bool use_pushback = true;
};

/// A ready `should_handle` for actions returning `reply<Response>` (what `unary` makes), following
/// gRPC's retry design. A reply is handled (retried; counted as a failure by a breaker) when all of:
/// - its status code is one of `retryable_codes` (by default `UNAVAILABLE` only; `OK` never is);
/// - the server had not started the call (`reply::server_started` is false: no initial metadata,
///   no response; what a transport failure or a server's early refusal gives), or the options say
///   `safe_to_retry`;
/// - the server did not push back with "do not retry" (a negative or malformed
///   `grpc-retry-pushback-ms`), unless `use_pushback` is false.
/// A pushback delay becomes the verdict's delay, so the retry waits that long instead of its
/// backoff (capped by `max_delay`). A failure (an exception, such as the `cancelled_error` of a
/// stopped call) is judged by `rs::is_transient`. Copies share nothing mutable; it is called as
/// `const`, from any thread that runs a call.
template <class Response>
class status_classifier {
public:
    status_classifier() : status_classifier(classifier_options{}) {}
    explicit status_classifier(classifier_options options) : options_(std::move(options)) {
        for (const ::grpc::StatusCode code : options_.retryable_codes) {
            const int c = static_cast<int>(code);
            if (c <= 0 || c > static_cast<int>(::grpc::StatusCode::UNAUTHENTICATED))
                throw std::invalid_argument(
                    "resilience::grpc::status_classifier: retryable_codes holds " + std::to_string(c) +
                    (c == 0 ? " (OK, which is never retried)" : " (not a status code)"));
            mask_ |= std::uint32_t{1} << c;
        }
    }

    /// The verdict on one outcome (see the class comment).
    verdict operator()(const outcome<reply<Response>>& o) const {
        if (o.has_failure())
            return verdict{.handle = is_transient(o.error()), .delay = std::nullopt};
        return judge(*o);
    }

    /// The verdict on a reply alone.
    [[nodiscard]] verdict judge(const reply<Response>& r) const noexcept {
        return judge(r.status.error_code(), r.pushback, r.server_started);
    }
    /// The verdict on a status code, a pushback and whether the server had started the call.
    [[nodiscard]] verdict judge(::grpc::StatusCode code, const pushback& p,
                                bool server_started) const noexcept {
        const int c = static_cast<int>(code);
        if (c <= 0 || c >= 32 || !(mask_ & (std::uint32_t{1} << c)))
            return {};
        if (server_started && !options_.safe_to_retry)
            return {};
        if (!options_.use_pushback)
            return verdict{.handle = true, .delay = std::nullopt};
        if (p.kind == pushback_kind::stop)
            return {};
        if (p.kind == pushback_kind::delay)
            return verdict{.handle = true, .delay = std::chrono::nanoseconds{p.delay}};
        return verdict{.handle = true, .delay = std::nullopt};
    }

    /// Is `code` one of the retryable codes?
    [[nodiscard]] bool retryable(::grpc::StatusCode code) const noexcept {
        const int c = static_cast<int>(code);
        return c > 0 && c < 32 && (mask_ & (std::uint32_t{1} << c));
    }
    [[nodiscard]] const classifier_options& options() const noexcept { return options_; }

private:
    classifier_options options_;
    std::uint32_t mask_ = 0;
};

// ------------------------------------------------------------------------------------------------
// Awaiting a unary RPC.

/// How much later than the attempt's deadline the RPC's is set: the attempt's policy (a timeout) ends
/// the RPC at its deadline with a stop, so the call reports `timeout_error`; were gRPC's own deadline
/// the same instant, the RPC could end first with `DEADLINE_EXCEEDED`, a reply the timeout would not
/// see as its own. The server sees the deadline this much later. An event loop late by more than this
/// lets gRPC's deadline win: the reply `DEADLINE_EXCEEDED` is then returned (not retried by default).
inline constexpr std::chrono::milliseconds deadline_margin{20};

/// What `unary` does to the `ClientContext` before it starts the RPC, after the deadline is set: a
/// callable taking `grpc::ClientContext&` (metadata, compression, `set_wait_for_ready`...). It may
/// set a deadline of its own; the earlier of it and the attempt's is kept.
struct no_setup {
    void operator()(::grpc::ClientContext&) const noexcept {}
};

namespace detail {

/// What the RPC and its waiter share. Held by the RPC's completion too, so that a waiter destroyed
/// before the RPC ends (its event loop torn down) leaves gRPC nothing freed to write to.
template <class Response, class Request>
struct unary_state {
    explicit unary_state(Request r) : request(std::move(r)) {}
    ::grpc::ClientContext client;
    Request request; // gRPC may read it until the RPC ends (an interceptor that serializes late)
    Response response{};
    ::grpc::Status status{};
    std::coroutine_handle<> waiter{};
    resilience::detail::home_loop* loop = nullptr;
    // waiting -> done (the RPC ended) or waiting -> abandoned (the waiter was destroyed first).
    enum : int { waiting, done, abandoned };
    std::atomic<int> phase{waiting};
    // Held by the completion from its change of phase until its post to `loop` is made, and by the
    // waiter's destructor for its change: a waiter destroyed with its loop (the loop's thread tearing
    // both down) either sees `done` after the post was made, or makes the completion see `abandoned`
    // before it touches the loop.
    std::mutex mutex;
};

/// Suspends until the RPC started by `start` ends, then resumes on the event loop the coroutine
/// was suspended on (posted), or, outside any loop, on gRPC's callback thread.
template <class Response, class Request, class Start>
struct unary_awaiter {
    using state_type = unary_state<Response, Request>;
    std::shared_ptr<state_type> state;
    Start* start;

    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) {
        state->waiter = h;
        state->loop = resilience::detail::home_loop::current();
        // After this call, `this` may be gone (the RPC may end, and the coroutine go on, at once).
        (*start)(&state->client, &state->request, &state->response, [s = state](::grpc::Status status) {
            s->status = std::move(status);
            std::unique_lock lock(s->mutex);
            if (s->phase.exchange(state_type::done, std::memory_order_acq_rel) == state_type::abandoned)
                return;
            if (s->loop) {
                s->loop->post_resume(s->waiter);
                return;
            }
            lock.unlock(); // the coroutine goes on here, and destroys its awaiter, which takes the lock
            s->waiter.resume();
        });
    }
    void await_resume() const noexcept {}
    unary_awaiter(std::shared_ptr<state_type> s, Start* st) noexcept : state(std::move(s)), start(st) {}
    unary_awaiter(const unary_awaiter&) = delete;
    unary_awaiter& operator=(const unary_awaiter&) = delete;
    ~unary_awaiter() {
        // Destroyed while the RPC runs: its coroutine is being destroyed. Cancel the RPC, which
        // keeps the state until it ends, and never resume the coroutine.
        if (!state)
            return;
        bool running = false;
        {
            std::lock_guard lock(state->mutex);
            running = state->phase.exchange(state_type::abandoned, std::memory_order_acq_rel) ==
                      state_type::waiting;
        }
        if (running)
            state->client.TryCancel(); // outside the lock: it may end the RPC on this thread
    }
};

/// `d` (time since `clock`'s epoch) as a time on the system clock, which gRPC's deadlines are on;
/// empty when it is too far away to matter (beyond ten years: no deadline).
template <class Clock>
std::optional<std::chrono::system_clock::time_point> system_deadline(std::chrono::nanoseconds d,
                                                                     const Clock& clock) {
    using namespace std::chrono;
    const nanoseconds now = duration_cast<nanoseconds>(clock.now().time_since_epoch());
    const nanoseconds left = d > now ? d - now : nanoseconds::zero();
    if (left > duration_cast<nanoseconds>(hours{24 * 366 * 10}))
        return std::nullopt;
    return system_clock::now() + duration_cast<system_clock::duration>(left);
}

template <class Response, class Request, class Start, class Setup>
task<reply<Response>> unary_call(Start start, Request request, Setup setup, stop_token token,
                                 std::optional<std::chrono::system_clock::time_point> deadline) {
    auto state = std::make_shared<unary_state<Response, Request>>(std::move(request));
    ::grpc::ClientContext& client = state->client;
    setup(client);
    if (deadline && *deadline + deadline_margin < client.deadline())
        client.set_deadline(*deadline + deadline_margin);
    {
        // Stops the RPC when the attempt is stopped; one stopped already cancels it as it starts.
        stop_callback cancel{token, [&client]() noexcept { client.TryCancel(); }};
        co_await unary_awaiter<Response, Request, Start>{state, &start};
    }
    const ::grpc::StatusCode code = state->status.error_code();
    if (token.stop_requested() &&
        (code == ::grpc::StatusCode::CANCELLED || code == ::grpc::StatusCode::DEADLINE_EXCEEDED))
        throw cancelled_error{};
    reply<Response> r;
    r.status = std::move(state->status);
    r.server_started = r.status.ok() || !client.GetServerInitialMetadata().empty();
    r.pushback = read_pushback(client.GetServerTrailingMetadata());
    if (r.status.ok())
        r.response = std::move(state->response);
    co_return r;
}

template <class Clock>
std::optional<std::chrono::system_clock::time_point> deadline_of(const context& ctx, const Clock& clock) {
    if (const auto d = ctx.deadline_for(clock))
        return system_deadline(*d, clock);
    return std::nullopt;
}

} // namespace detail

/// Awaits one unary RPC started by `start(grpc::ClientContext*, const Request*, Response*,
/// std::function<void(grpc::Status)> done)` (the callback API: `stub->async()->Method(...)`), as the
/// attempt described by `ctx`:
/// - the attempt's stop token cancels the RPC (`ClientContext::TryCancel`); a stopped RPC that ends
///   `CANCELLED` or `DEADLINE_EXCEEDED` fails with `rs::cancelled_error`, so a timeout reports
///   `timeout_error` and a caller's stop is a cancellation, as for any action;
/// - the attempt's deadline (`ctx.deadline_for(clock)`: the innermost timeout's, or the one a
///   retry inside a timeout sees) becomes the RPC's: the time left on `clock` from now, on the
///   system clock gRPC's deadlines are on. Without one, the RPC has no deadline but `setup`'s;
/// - `setup(grpc::ClientContext&)` adds what else the call needs (see `no_setup`).
/// Every other outcome, failed statuses included, is a `reply` (no exception): classify it with
/// `status_classifier`. `ctx` is read when `unary` is called, and `request` is copied (or moved)
/// into the call, so the task needs neither afterwards; `start` is kept in it, so what `start`
/// refers to (the stub) must outlive the task. The coroutine resumes on the event loop it awaited
/// from (the RPC's completion is posted there), or, outside any loop, on gRPC's callback thread.
template <class Response, class Request, class Start, class Setup = no_setup, class Clock = steady_clock>
requires std::invocable<Start&, ::grpc::ClientContext*, const Request*, Response*,
                        std::function<void(::grpc::Status)>>
[[nodiscard]] task<reply<Response>> unary(const context& ctx, Start start, Request request, Setup setup = {},
                                          const Clock& clock = {}) {
    return detail::unary_call<Response>(std::move(start), std::move(request), std::move(setup),
                                        ctx.stop_token(), detail::deadline_of(ctx, clock));
}

/// The same, naming the stub's asynchronous method: `unary(ctx, stub->async(), &Svc::Stub::async::Say,
/// request)`. The callback form of the method is picked from its overloads; `async` (the stub) must
/// outlive the task.
template <class Async, class Request, class Response, class Setup = no_setup, class Clock = steady_clock>
[[nodiscard]] task<reply<Response>>
unary(const context& ctx, Async* async,
      void (Async::*method)(::grpc::ClientContext*, const Request*, Response*,
                            std::function<void(::grpc::Status)>),
      std::type_identity_t<Request> request, Setup setup = {}, const Clock& clock = {}) {
    auto start = [async, method](::grpc::ClientContext* c, const Request* q, Response* a,
                                 std::function<void(::grpc::Status)> done) {
        (async->*method)(c, q, a, std::move(done));
    };
    return unary<Response>(ctx, start, std::move(request), std::move(setup), clock);
}

} // namespace resilience::grpc
