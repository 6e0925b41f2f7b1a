// SPDX-License-Identifier: MIT
/// \file retry_stream.hpp
/// `retry_stream`: asks a source for its stream again when it breaks, including one already partly
/// consumed, and says precisely what the consumer then sees.
#pragma once

#include "async_generator.hpp"
#include "backoff.hpp"
#include "classifier.hpp"
#include "clock.hpp"
#include "concepts.hpp"
#include "detail/home_loop.hpp"
#include "detail/stages.hpp"
#include "detail/time.hpp"
#include "engine/default_clock.hpp"
#include "error.hpp"
#include "outcome.hpp"
#include "random.hpp"
#include "stop_token.hpp"

#include <chrono>
#include <concepts>
#include <cstddef>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>

namespace resilience::inline v0_2 {

/// What a break after the first item does. A retried call hides its failed attempts, because they
/// produced nothing the caller saw; a stream that breaks has already handed items downstream, so
/// no choice is right for every consumer, and the default is the one that cannot surprise.
enum class partial_stream {
    /// Retry only while the consumer has received nothing. A break after the first item is rethrown
    /// to the consumer, which keeps the items it already has: no item is ever delivered twice.
    rethrow_mid_stream,
    /// Retry a break after the first item too, by calling the factory again. The new source starts
    /// wherever the factory starts it: a factory that ignores `stream_context::items_yielded()`
    /// starts over and the consumer receives the items before the break **again**; a factory that
    /// skips that many items resumes, and the consumer receives each item once. The library never
    /// drops items itself: it cannot tell a resumed source from one that restarted.
    restart_from_start,
};

/// How a `retry_stream` behaves. `stream_retry_options{}` calls the factory up to four times in all
/// while the stream breaks before its first item, on the default exponential backoff (200ms, x2,
/// capped at 30s, full jitter). Validated by `retry_stream`, before anything is enumerated: a bad
/// value throws `std::invalid_argument` naming the field and the value.
struct stream_retry_options {
    /// Carried by the errors the stream makes (`cancelled_error::policy_name()`) and its messages.
    std::string name{};
    /// Attempts in all for the whole stream, the first included: calls of the factory, not items or
    /// breaks. Items received do not replenish it, so a source that keeps breaking after some
    /// progress cannot be restarted forever. `1` never retries. Must be at least 1.
    int max_attempts = 4;
    /// The wait before retry n (1-based over the whole stream): `backoff.delay(n, ...)`. Validated
    /// when assigned (see `backoff`).
    resilience::backoff backoff{};
    /// What a break after the first item does (see `partial_stream`).
    partial_stream partial = partial_stream::rethrow_mid_stream;
    /// Which failures to retry (see `classifier`). Empty: every failure but cancellation. A
    /// `verdict`'s `delay` replaces the backoff for that wait, as given (negative: no wait).
    /// Cancellation is never retried, whatever it says. An `outcome<T>` classifier must name the
    /// stream's item type; it is asked about failures only (items are never retried).
    classifier should_handle{};
};

/// What the factory of a `retry_stream` is told about the attempt it starts, so a source that can
/// skip a prefix can resume where the last one broke. A small value; the values are those at the
/// start of the attempt. A factory taking `const stream_context&` gets an object that lives until
/// the source it returns is destroyed, so a coroutine factory may keep the reference.
class stream_context {
public:
    stream_context() = default;
    stream_context(int attempt, std::size_t items_yielded, stop_token token) noexcept
        : token_(std::move(token)), items_(items_yielded), attempt_(attempt) {}

    /// 1 for the first call of the factory, 2 for the first retry, and so on.
    [[nodiscard]] int attempt() const noexcept { return attempt_; }
    /// Items the consumer has received from this stream so far, over every attempt. For a source
    /// that resumes, this is the offset to resume from.
    [[nodiscard]] std::size_t items_yielded() const noexcept { return items_; }
    /// The consumer's stop token (the one given to `retry_stream`).
    [[nodiscard]] const resilience::stop_token& stop_token() const noexcept { return token_; }
    [[nodiscard]] bool stop_requested() const noexcept { return token_.stop_requested(); }

private:
    resilience::stop_token token_;
    std::size_t items_ = 0;
    int attempt_ = 1;
};

namespace detail {
template <class O>
struct optional_value {};
template <class T>
struct optional_value<std::optional<T>> {
    using type = T;
};
} // namespace detail

/// What a `retry_stream` factory returns: an object with `next()`, an awaitable of `std::optional<T>`
/// that is empty once the stream has ended. `async_generator<T>` is one.
template <class S>
concept stream_source = requires(S& s) {
    { s.next() } -> awaitable;
    typename detail::optional_value<await_result_t<decltype(s.next())>>::type;
};

/// The item type of a `stream_source`.
template <stream_source S>
using stream_value_t =
    typename detail::optional_value<await_result_t<decltype(std::declval<S&>().next())>>::type;

namespace detail {

// The factory is called with a `stream_context` when it takes one, else with the consumer's stop
// token, else with nothing, as actions elsewhere in the library are.
template <class F>
decltype(auto) call_stream_factory(F& f, const stream_context& ctx) {
    if constexpr (std::invocable<F&, const stream_context&>)
        return f(ctx);
    else if constexpr (std::invocable<F&, stop_token>)
        return f(ctx.stop_token());
    else
        return f();
}

template <class F>
concept stream_factory_callable =
    std::invocable<F&, const stream_context&> || std::invocable<F&, stop_token> || std::invocable<F&>;

template <class F>
using stream_factory_result_t =
    decltype(call_stream_factory(std::declval<F&>(), std::declval<const stream_context&>()));

} // namespace detail

/// What `retry_stream` accepts: a callable taking `const stream_context&`, a `stop_token`, or
/// nothing, that returns a `stream_source` by value.
template <class F>
concept stream_factory = std::move_constructible<F> && detail::stream_factory_callable<F> &&
                         !std::is_reference_v<detail::stream_factory_result_t<F>> &&
                         stream_source<detail::stream_factory_result_t<F>>;

namespace detail {

template <class T, class Factory, class C, class Random>
async_generator<T> retry_stream_run(Factory factory, stream_retry_options options, C clock, stop_token stop,
                                    Random rng) {
    if (stop.stop_requested())
        throw cancelled_error{options.name};
    // As a call through a retry (engine/call_edges.hpp, `nowhere_to_sleep`): a stream that may back off
    // on the default clock with nowhere to sleep is refused before its first source, not at its
    // first backoff.
    if (home_loop::current() == nullptr && is_default_clock(clock) && options.max_attempts > 1 &&
        (options.backoff.may_wait() || options.should_handle.may_set_delay()))
        throw std::logic_error(nowhere_to_sleep_message({"retry_stream", "its backoff"}, options.name));
    std::size_t yielded = 0;
    std::chrono::nanoseconds previous{};
    for (int attempt = 1;; ++attempt) {
        std::exception_ptr error;
        try {
            // Both live until the end of the attempt: the source may refer to the context.
            const stream_context ctx{attempt, yielded, stop};
            auto source = call_stream_factory(factory, ctx);
            while (std::optional<T> item = co_await source.next()) {
                ++yielded;
                co_yield std::move(*item);
            }
            co_return;
        } catch (...) {
            error = std::current_exception(); // the source is already destroyed
        }

        // Cancellation is the consumer giving up, never the source failing: not retried, and
        // the classifier is not even asked; neither is it once the budget is spent.
        const failure f{error};
        // A consumer that stopped gets cancelled_error, not what its stopped source threw.
        if (stop.stop_requested() && !is_cancellation(f))
            throw cancelled_error{options.name};
        if (attempt >= options.max_attempts ||
            (yielded > 0 && options.partial == partial_stream::rethrow_mid_stream) || is_cancellation(f))
            std::rethrow_exception(error);
        const verdict v = options.should_handle.classify(
            outcome<T>{f}, [](const failure& g) noexcept { return !is_cancellation(g); });
        if (!v.handle)
            std::rethrow_exception(error);

        std::chrono::nanoseconds wait{};
        if (v.delay)
            wait = *v.delay > std::chrono::nanoseconds::zero() ? *v.delay : std::chrono::nanoseconds::zero();
        else
            wait = options.backoff.delay(attempt, rng, f, previous);
        previous = wait;
        if (wait > std::chrono::nanoseconds::zero())
            co_await clock.sleep_until(add_saturating(clock.now(), wait), stop);
        if (stop.stop_requested()) // during the wait, or before a retry that needed none
            throw cancelled_error{options.name};
    }
}

} // namespace detail

/// A stream that asks `factory` for its source again when the source breaks. The returned
/// generator calls `factory` at its first `next()` and passes the source's items through; when
/// the source throws (or the factory does), the failure ends the stream, rethrown exactly as it
/// was (the same exception object), unless every one of these allows a retry:
/// - nothing was delivered yet, or `partial` is `restart_from_start` (see `partial_stream`);
/// - it is not a cancellation (`cancelled_error`), and the consumer has not asked to stop;
/// - fewer than `max_attempts` attempts were made, counted over the whole stream;
/// - `should_handle` handles it.
/// Then, after the backoff's wait on `clock`, the factory is called again with the next
/// `stream_context` (attempt number, items delivered so far, the stop token).
///
/// Cancellation: `stop` is the consumer's token, handed to every source. A stop during a backoff
/// wait ends the wait at once and the stream with `cancelled_error`; so does a stop found after a
/// failure when no wait was needed, whatever the stopped source threw (an `operation_aborted`, an
/// error of its own): never retried. A stop before the first `next()` ends the stream with
/// `cancelled_error` without calling the factory. A `cancelled_error` a source throws is passed on
/// as it is, never retried. Items delivered before the stop stay delivered.
///
/// Options are validated here, at the call, before anything is enumerated (`std::invalid_argument`).
///
/// Lifetimes: the factory, the options and the clock are moved into the generator and live as long
/// as it does, so a coroutine lambda with captures is safe as the factory. Each source is destroyed
/// before its failure is judged, at the end of the stream, and with the generator when the consumer
/// stops pulling half-way. The generator must outlive each `co_await gen.next()`.
///
///     auto rows = rs::retry_stream(
///         [&db](const rs::stream_context& c) { return db.read_from(c.items_yielded(), c.stop_token()); },
///         {.max_attempts = 6, .partial = rs::partial_stream::restart_from_start});  // OK: db outlives rows
///     while (auto row = co_await rows.next()) use(*row);
///
/// `C` serves the backoff waits (`rs::testing::virtual_clock` in tests); `Random` draws the jitter.
/// Cost: one frame for the stream besides the source's; no allocation per item.
template <class Factory, clock C = steady_clock, random_source Random = thread_random>
requires stream_factory<Factory>
async_generator<stream_value_t<detail::stream_factory_result_t<Factory>>>
retry_stream(Factory factory, stream_retry_options options, C clock = C{}, stop_token stop = {},
             Random rng = Random{}) {
    using T = stream_value_t<detail::stream_factory_result_t<Factory>>;
    const auto bad = [&options](const std::string& what) {
        throw std::invalid_argument(detail::policy_label("retry_stream", options.name) + ": " + what);
    };
    if (options.max_attempts < 1)
        bad("max_attempts must be at least 1, got " + std::to_string(options.max_attempts));
    if (options.partial != partial_stream::rethrow_mid_stream &&
        options.partial != partial_stream::restart_from_start)
        bad("partial must be rethrow_mid_stream or restart_from_start, got " +
            std::to_string(static_cast<int>(options.partial)));
    if (!options.should_handle.template accepts<T>())
        bad("should_handle classifies rs::outcome<" + detail::type_name(*options.should_handle.value_type()) +
            "> but the stream yields " + detail::type_name(typeid(T)));
    return detail::retry_stream_run<T>(std::move(factory), std::move(options), std::move(clock),
                                       std::move(stop), std::move(rng));
}

/// `retry_stream` on `steady_clock` with the consumer's stop token.
template <class Factory>
requires stream_factory<Factory>
async_generator<stream_value_t<detail::stream_factory_result_t<Factory>>>
retry_stream(Factory factory, stream_retry_options options, stop_token stop) {
    return retry_stream(std::move(factory), std::move(options), steady_clock{}, std::move(stop));
}

} // namespace resilience
