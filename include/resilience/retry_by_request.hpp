// SPDX-License-Identifier: MIT
/// \file retry_by_request.hpp
/// Retry chosen by request type: `retry_safe<Request>`, the mark of a request that may run twice,
/// and `retrying_handler`, which runs a handler under a retry for marked requests and once for the
/// rest.
#pragma once

#include "concepts.hpp"
#include "context.hpp"
#include "retry.hpp"
#include "stop_token.hpp"
#include "task.hpp"

#include <functional>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2 {

namespace detail {

// `Request::retry_safe`, when it is a constant that converts to bool; false otherwise (a
// non-constant member cannot mark a type, and is no error either).
template <class Request>
constexpr bool member_retry_safe() noexcept {
    if constexpr (requires { typename std::bool_constant<static_cast<bool>(Request::retry_safe)>; })
        return static_cast<bool>(Request::retry_safe);
    else
        return false;
}

} // namespace detail

/// True for a request type that is safe to run twice: a read, or a write the receiver makes
/// idempotent (an idempotency key it honours). Marked in the type,
///
///     struct get_price { std::string sku; static constexpr bool retry_safe = true; };
///
/// (inherited by derived types), or, for a type you cannot change, by specializing this variable
/// (which may also unmark a derived type):
///
///     template <> inline constexpr bool rs::retry_safe<vendor::lookup> = true;
///
/// Not marked: not retried. Only you know whether running a request twice does it twice (a second
/// charge of a card, a second e-mail), so nothing is marked by default.
template <class Request>
inline constexpr bool retry_safe = detail::member_retry_safe<Request>();

namespace detail {

/// Calls a handler the way it asks: with the request and the attempt's context, its stop token,
/// or the request alone.
template <class Handler, class Request>
decltype(auto) call_handler(const Handler& h, const Request& request, const context& ctx) {
    if constexpr (std::is_invocable_v<const Handler&, const Request&, const context&>)
        return std::invoke(h, request, ctx);
    else if constexpr (std::is_invocable_v<const Handler&, const Request&, stop_token>)
        return std::invoke(h, request, ctx.stop_token());
    else {
        static_assert(std::is_invocable_v<const Handler&, const Request&>,
                      "rs::retrying_handler: the handler must be callable as const with (const Request&, "
                      "rs::context const&), (const Request&, stop_token) or (const Request&)");
        return std::invoke(h, request);
    }
}

template <class Handler, class Request>
using handler_result_t = await_result_t<decltype(call_handler(
    std::declval<const Handler&>(), std::declval<const Request&>(), std::declval<const context&>()))>;

/// One attempt of a marked request: the handler on the request, both owned by the caller's frame.
template <class Handler, class Request>
struct handler_attempt {
    const Handler* handler;
    const Request* request;
    decltype(auto) operator()(const context& ctx) const { return call_handler(*handler, *request, ctx); }
};

} // namespace detail

/// Wraps a request handler (in a mediator, a command bus, a dispatcher) so that a request of a type
/// marked `retry_safe` runs under `policy`, a `retry` by default, and any other request runs once,
/// exactly as the handler would run it, without the policy.
///
/// The handler is called as `const`, with `(const Request&, const rs::context&)`, with
/// `(const Request&, stop_token)` or with `(const Request&)`, and returns an awaitable; one
/// overloaded for several request types serves them all. A call `h(request, token)` keeps its own
/// copy of the request (moved in) for all its attempts; the caller's stop token reaches each one.
///
/// What is retried is the policy's to say, and the default `retry` says what is safe: never a
/// cancellation (no retry ever retries one), never a `std::logic_error` or anything derived from it
/// (`std::invalid_argument`, `std::domain_error`, ...: `rs::is_transient`), since a request refused
/// for what it is will be refused again. So a deterministic error of your own (validation, not
/// found, forbidden, conflict) should derive from `std::logic_error` to stay out of every retry.
/// A `should_handle` of your own replaces that rule: keep it in yours. An `expected_like` result
/// holding an error is retried by the default too (see `classifier`).
///
/// Put only what a retry may repeat inside the handler: checks of who may call and what is valid
/// belong outside, run once per request. A handler that itself calls out through a retrying client
/// multiplies the attempts (4 here times 4 there is 16 calls): budget them together.
///
/// Holds the handler and the policy by value; calls refer to both, so the `retrying_handler` must
/// outlive every call made through it (as a policy called as an lvalue must):
///
///     const rs::retrying_handler handle{handlers{}, rs::retry{{.max_attempts = 3}}};
///     const get_price query{"sku-1"};
///     co_await handle(query);                            // OK: retried; handle outlives the call
///     co_await handle(charge);                           // OK: not marked, runs once
///     rs::task<price> bad() { return rs::retrying_handler{handlers{}}(get_price{}); }
///                                                        // dangling: the temporary dies first
///
/// On g++ 12, name a request before awaiting it: a braced aggregate with members that have
/// destructors, written inside a `co_await` expression (`co_await handle(get_price{"sku"})`), is
/// destroyed twice by that compiler (see docs/core.md, compiler notes).
template <class Handler, class Policy = retry<>>
class retrying_handler {
public:
    explicit retrying_handler(Handler handler, Policy policy = Policy{})
        : handler_(std::move(handler)), policy_(std::move(policy)) {}

    /// Runs `request`: under the policy when `retry_safe<Request>`, once otherwise. Yields what the
    /// handler yields, or throws what it (or the policy, giving up) throws.
    template <class Request>
    task<detail::handler_result_t<Handler, Request>> operator()(Request request,
                                                                stop_token token = {}) const {
        if constexpr (retry_safe<Request>) {
            // Made before the co_await, so no temporary of the awaited expression outlives a suspension.
            auto call = policy_.execute(detail::handler_attempt<Handler, Request>{&handler_, &request},
                                        std::move(token));
            co_return co_await std::move(call);
        } else {
            const context ctx{std::move(token)};
            auto once = detail::call_handler(handler_, std::as_const(request), ctx);
            co_return co_await std::move(once);
        }
    }

    [[nodiscard]] const Handler& handler() const noexcept { return handler_; }
    [[nodiscard]] const Policy& policy() const noexcept { return policy_; }

private:
    Handler handler_;
    Policy policy_;
};

template <class Handler>
retrying_handler(Handler) -> retrying_handler<Handler, retry<>>;
template <class Handler, class Policy>
retrying_handler(Handler, Policy) -> retrying_handler<Handler, Policy>;

} // namespace resilience
