// SPDX-License-Identifier: MIT
/// \file asio.hpp
/// Optional Asio integration (standalone Asio 1.22 or later): a clock whose sleeps are Asio timers,
/// and `async_run`, which runs a resilience awaitable from Asio code through a completion token.
///
///     asio::io_context io;
///     rs::asio::clock clock{io.get_executor()};
///     rs::pipeline policy{rs::retry{{.max_attempts = 3}, clock}, rs::timeout{2s, clock}};
///
///     // from an asio::awaitable coroutine (or with any other completion token):
///     int v = co_await rs::asio::async_run(io.get_executor(), policy.execute(fetch), asio::use_awaitable);
///
/// Policies that run on Asio threads must be given this clock: the default `steady_clock` sleeps on
/// the library's own `event_loop`, which Asio threads do not run.
#pragma once

#include "clock.hpp"
#include "concepts.hpp"
#include "task.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <coroutine>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <tuple>
#include <type_traits>
#include <utility>

namespace resilience::asio {

/// A clock that sleeps on Asio steady timers bound to an executor; the sleeping coroutine resumes
/// in that executor's context (the io_context's threads). `std::chrono::steady_clock` time.
/// Copyable; the execution context must outlive every sleep. A stop request from any thread
/// cancels the timer through the executor.
class clock {
public:
    using duration = std::chrono::steady_clock::duration;
    using time_point = std::chrono::steady_clock::time_point;

    explicit clock(::asio::any_io_executor executor) : executor_(std::move(executor)) {}

    time_point now() const noexcept { return std::chrono::steady_clock::now(); }
    const ::asio::any_io_executor& executor() const noexcept { return executor_; }

    auto sleep_until(time_point tp, std::stop_token token) const {
        return sleep_awaiter{executor_, tp, std::move(token)};
    }
    auto sleep_for(duration d, std::stop_token token) const {
        return sleep_until(now() + d, std::move(token));
    }

private:
    // Everything a sleep needs lives here, on the heap and under one mutex: the awaiting frame may be
    // resumed on another io thread (and freed) the moment the wait is armed, and a stop may arrive
    // from any thread at any time, even before the wait exists.
    struct sleep_state : std::enable_shared_from_this<sleep_state> {
        sleep_state(const ::asio::any_io_executor& ex, time_point tp, std::stop_token t,
                    std::coroutine_handle<> h)
            : timer(ex, tp), token(std::move(t)), waiter(h) {}

        struct on_stop {
            sleep_state* self;
            void operator()() const {
                std::lock_guard lock(self->mutex);
                self->stopped = true;
                if (self->waiting)
                    ::asio::post(self->timer.get_executor(), [s = self->shared_from_this()] {
                        std::lock_guard inner(s->mutex);
                        s->timer.cancel();
                    });
            }
        };

        // Runs in the executor's context.
        void start() {
            std::unique_lock lock(mutex);
            if (!stopped) {
                waiting = true;
                timer.async_wait([s = shared_from_this()](const std::error_code&) { s->waiter.resume(); });
                return;
            }
            lock.unlock();
            waiter.resume();
        }

        std::mutex mutex;
        ::asio::steady_timer timer;
        std::stop_token token;
        std::coroutine_handle<> waiter;
        bool stopped = false, waiting = false;
        std::optional<std::stop_callback<on_stop>> stop;
    };

    class sleep_awaiter {
    public:
        sleep_awaiter(::asio::any_io_executor ex, time_point tp, std::stop_token token)
            : executor_(std::move(ex)), when_(tp), token_(std::move(token)) {}

        bool await_ready() const noexcept {
            return token_.stop_requested() || when_ <= std::chrono::steady_clock::now();
        }
        void await_suspend(std::coroutine_handle<> h) {
            state_ = std::make_shared<sleep_state>(executor_, when_, token_, h);
            // Registered before the wait starts, so no stop is missed; a stop already requested
            // runs on_stop right here, which only records it.
            if (state_->token.stop_possible())
                state_->stop.emplace(state_->token, sleep_state::on_stop{state_.get()});
            // The last touch of this frame: from here on, another thread may resume it.
            ::asio::post(executor_, [s = state_] { s->start(); });
        }
        void await_resume() noexcept {
            if (state_)
                state_->stop.reset(); // waits for an on_stop running on another thread
        }

    private:
        ::asio::any_io_executor executor_;
        time_point when_;
        std::stop_token token_;
        std::shared_ptr<sleep_state> state_;
    };

    ::asio::any_io_executor executor_;
};

static_assert(resilience::clock<clock>);

namespace detail {

// Runs the awaitable as a detached coroutine; its last act hands the outcome to the handler.
struct detached_task {
    struct promise_type : resilience::detail::recycled_frame {
        detached_task get_return_object() noexcept { return {}; }
        std::suspend_never initial_suspend() const noexcept { return {}; }
        std::suspend_never final_suspend() const noexcept { return {}; }
        void return_void() noexcept {}
        void unhandled_exception() noexcept { std::terminate(); } // run_and_complete catches everything
    };
};

// Runs the awaitable, then posts the completion to the handler's associated executor, outside this
// coroutine: an exception thrown by the handler comes out of that executor's run(), as with any Asio
// handler. Work is held on the I/O executor and on the handler's executor until the handler has run,
// so neither io_context runs out of work while the awaitable waits on something outside Asio.
template <class A, class Handler>
detached_task run_and_complete(A awaitable, Handler handler, ::asio::any_io_executor io) {
    using R = await_result_t<A>;
    auto io_work = ::asio::make_work_guard(io);
    auto handler_ex = ::asio::get_associated_executor(handler, io);
    auto handler_work = ::asio::make_work_guard(handler_ex);
    std::exception_ptr error;
    std::optional<std::conditional_t<std::is_void_v<R>, char, R>> value;
    try {
        if constexpr (std::is_void_v<R>) {
            co_await std::move(awaitable);
        } else {
            value.emplace(co_await std::move(awaitable));
        }
    } catch (...) {
        error = std::current_exception();
    }
    if constexpr (std::is_void_v<R>) {
        ::asio::post(handler_ex, [h = std::move(handler), error, w1 = std::move(io_work),
                                  w2 = std::move(handler_work)]() mutable { std::move(h)(error); });
    } else {
        if (!value)
            value.emplace(); // the handler signature needs a value even on failure
        ::asio::post(handler_ex,
                     [h = std::move(handler), error, v = std::move(*value), w1 = std::move(io_work),
                      w2 = std::move(handler_work)]() mutable { std::move(h)(error, std::move(v)); });
    }
}

template <class R>
struct completion_signature {
    using type = void(std::exception_ptr, R);
};
template <>
struct completion_signature<void> {
    using type = void(std::exception_ptr);
};

} // namespace detail

/// Runs `awaitable` (a resilience task, or any awaitable) starting in `executor`'s context, and
/// completes `token` with `(std::exception_ptr, R)` (or `(std::exception_ptr)` for `void`). With
/// `asio::use_awaitable` the error is rethrown in the awaiting coroutine. `R` must be default
/// constructible, since Asio's signature carries a value on failure too. The awaitable is moved
/// into the operation and kept alive until it finishes.
template <awaitable A, class CompletionToken>
auto async_run(::asio::any_io_executor executor, A awaitable, CompletionToken&& token) {
    using R = await_result_t<A>;
    using signature = typename detail::completion_signature<R>::type;
    return ::asio::async_initiate<CompletionToken, signature>(
        [ex = std::move(executor)](auto handler, A aw) {
            ::asio::post(ex, [ex, aw = std::move(aw), handler = std::move(handler)]() mutable {
                detail::run_and_complete(std::move(aw), std::move(handler), ex);
            });
        },
        token, std::move(awaitable));
}

/// A completion token that makes an Asio operation awaitable inside a resilience coroutine: the
/// operation starts when awaited and its completion arguments come back as a tuple.
///
///     auto [ec, n] = co_await socket.async_read_some(buffer, rs::asio::use_task);
///     auto [ec] = co_await timer.async_wait(rs::asio::use_task);
///
/// The coroutine resumes in the handler, that is in the executor's context. Cancellation is the
/// caller's to wire: close or cancel the I/O object from a `std::stop_callback` on the attempt's
/// token, as with any Asio operation.
struct use_task_t {
    constexpr use_task_t() = default;
};
inline constexpr use_task_t use_task{};

} // namespace resilience::asio

template <class... Args>
class asio::async_result<resilience::asio::use_task_t, void(Args...)> {
public:
    template <class Initiation, class... InitArgs>
    static auto initiate(Initiation initiation, resilience::asio::use_task_t, InitArgs... args) {
        using results = std::tuple<std::decay_t<Args>...>;
        using stored = std::tuple<std::decay_t<InitArgs>...>;
        struct awaiter {
            Initiation initiation;
            stored init_args;
            std::optional<results> result;
            bool await_ready() const noexcept { return false; }
            void await_suspend(std::coroutine_handle<> h) {
                struct handler {
                    awaiter* self;
                    std::coroutine_handle<> waiter;
                    void operator()(Args... completion) {
                        self->result.emplace(std::move(completion)...);
                        waiter.resume();
                    }
                };
                std::apply(
                    [&](auto&... a) {
                        std::move(initiation)(handler{this, h}, std::move(a)...);
                    },
                    init_args);
            }
            results await_resume() { return std::move(*result); }
        };
        return awaiter{std::move(initiation), stored{std::move(args)...}, std::nullopt};
    }
};
