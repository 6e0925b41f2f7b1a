// SPDX-License-Identifier: MIT
/// \file asio.hpp
/// Optional Asio integration (standalone Asio 1.22 or later): a clock whose sleeps are Asio timers,
/// `async_run`, which runs a resilience awaitable as an Asio asynchronous operation, and `use_task`,
/// the completion token that lets a resilience coroutine await an Asio operation.
///
///     asio::io_context io;
///     rs::asio::clock clock{io.get_executor()};
///     rs::pipeline policy{rs::retry{{.max_attempts = 3}, clock}, rs::timeout{2s, clock}};
///
///     // an action: its stop token reaches the read as Asio per-operation cancellation
///     auto fetch = [&](std::stop_token st) -> rs::task<std::size_t> {
///         auto [ec, n] = co_await socket.async_read_some(asio::buffer(buf), rs::asio::use_task(st));
///         if (ec) throw std::system_error(ec);
///         co_return n;
///     };
///     // from Asio code, with any completion token; Asio cancellation of the operation stops the call
///     rs::asio::async_run(io.get_executor(), [&](std::stop_token st) { return policy.execute(fetch, st); },
///                         [](std::exception_ptr e, std::size_t n) { ... });
///
/// Policies that run on Asio threads must be given this clock: the default `steady_clock` sleeps on
/// the library's own `event_loop`, which Asio threads do not run.
///
/// An io_context owns the calls started on it with `async_run` and destroys them, wherever they wait,
/// when it is destroyed, as it destroys its own pending operations (see `detail::call_registry`);
/// `rs::asio::spawn` starts a call in an `rs::async_scope`, for a graceful drain before that.
#pragma once

#include "async_scope.hpp"
#include "clock.hpp"
#include "concepts.hpp"
#include "detail/stop.hpp"
#include "task.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/execution/context.hpp>
#include <asio/execution_context.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <asio/query.hpp>
#include <asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <concepts>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <tuple>
#include <type_traits>
#include <utility>

namespace resilience::asio {

struct use_task_t;
struct use_task_with_stop_t;

namespace detail {

// ---------------------------------------------------------------------------------------------------------
// use_task's initiation

/// The `use_task` operation whose initiating function is running on this thread: its handler,
/// called or destroyed before that function returns, must not resume or give up the coroutine,
/// which has not finished suspending. Found by address; never dereferenced through this record.
struct initiation_record {
    const void* operation;
    initiation_record* outer;
    bool completed = false; ///< the handler ran inside the initiating function
    bool dropped = false;   ///< the handler was destroyed uncalled inside it
};
inline thread_local initiation_record* initiating = nullptr;

// ---------------------------------------------------------------------------------------------------------
// Stop token -> Asio per-operation cancellation.

/// No executor to emit on: the operation's initiation does not name the I/O object's.
struct no_executor {};

/// Cancellation requests honoured by the call side: a stop request ends a call as soon as it can,
/// leaving the policies' shared state consistent, which is what `terminal` and `partial` ask for. A
/// request for `total` cancellation only (no side effect at all) is ignored: an attempt may have
/// done part of its work.
inline constexpr ::asio::cancellation_type_t honoured_cancellation =
    ::asio::cancellation_type::terminal | ::asio::cancellation_type::partial;

/// The cancellation signal of one `use_task(token)` operation, shared by its handler, the stop
/// callback on `token` and the emissions in flight. A stop request posts the emission to the I/O
/// object's executor (Asio cancellation slots are not thread-safe, and their handlers may touch the
/// I/O object); the emission happens only while the operation's handler has not run, under a mutex
/// the handler takes too, so it never reaches an I/O object that a resumed coroutine destroyed.
/// Recursive, because an operation may complete inside `emit`.
template <class Executor>
class stop_signal : public std::enable_shared_from_this<stop_signal<Executor>> {
public:
    explicit stop_signal(Executor ex) : executor_(std::move(ex)) {}
    stop_signal(const stop_signal&) = delete;
    stop_signal& operator=(const stop_signal&) = delete;

    ::asio::cancellation_slot slot() noexcept { return signal_.slot(); }

    /// After the operation started (its handler's slot is in place): stops it when `token` stops.
    void arm(std::stop_token token) {
        std::lock_guard lock(mutex_);
        if (done_)
            return;
        // A token already stopped runs on_stop inside emplace: it only notes the request, which is
        // made here once the callback exists (an inline completion may then destroy it).
        arming_ = true;
        callback_.emplace(std::move(token), on_stop{this});
        arming_ = false;
        if (stop_noted_)
            request();
    }

    /// The handler is running: no emission from now on, and no more stop callback.
    void finish() noexcept {
        {
            std::lock_guard lock(mutex_);
            done_ = true;
        }
        callback_.reset(); // outside the lock: waits for an on_stop running on another thread
    }

private:
    struct on_stop {
        stop_signal* state;
        void operator()() const {
            // Copied first: finishing inside an inline emission destroys this callback object.
            std::shared_ptr<stop_signal> self = state->weak_from_this().lock();
            if (!self)
                return; // being destroyed: its operation is over
            std::lock_guard lock(self->mutex_);
            if (self->arming_)
                self->stop_noted_ = true;
            else
                self->request();
        }
    };

    // With the mutex held.
    void request() {
        if (done_)
            return;
        if constexpr (std::is_same_v<Executor, no_executor>) {
            emit();
        } else {
            ::asio::post(executor_, [self = this->shared_from_this()] { self->emit(); });
        }
    }

    void emit() {
        std::lock_guard lock(mutex_);
        if (!done_)
            signal_.emit(::asio::cancellation_type::terminal);
    }

    Executor executor_;
    std::recursive_mutex mutex_;
    ::asio::cancellation_signal signal_;
    bool done_ = false;
    bool arming_ = false;
    bool stop_noted_ = false;
    std::optional<std::stop_callback<on_stop>> callback_; // last: goes first
};

template <class Initiation>
auto io_executor_of(const Initiation& initiation) {
    if constexpr (requires {
                      typename Initiation::executor_type;
                      initiation.get_executor();
                  })
        return initiation.get_executor();
    else
        return no_executor{};
}

// ---------------------------------------------------------------------------------------------------------
// use_task: an Asio operation awaited by a resilience coroutine.

/// The awaiter of `co_await op(args..., use_task)`: starts the operation when awaited, and the
/// operation's handler resumes the coroutine with the completion arguments. The handler owns, with a
/// stop token, the operation's cancellation slot; destroyed uncalled, it touches no coroutine.
template <class Initiation, class InitArgs, class... Args>
class operation {
public:
    using result_type = std::tuple<std::decay_t<Args>...>;

    operation(Initiation initiation, InitArgs args, std::stop_token token)
        : initiation_(std::move(initiation)), args_(std::move(args)), token_(std::move(token)) {}
    // Moved only before it is awaited (into a sleep's awaiter, say): no link yet.
    operation(operation&&) = default;
    operation& operator=(operation&&) = delete;
    // Destroyed with its call (by the call's io_context, say) while the operation is still pending on
    // another execution context: the handler, when that context runs it, finds nobody to resume.
    ~operation() {
        if (link_)
            link_->self.store(nullptr, std::memory_order_release);
    }

    bool await_ready() const noexcept { return false; }

    bool await_suspend(std::coroutine_handle<> h) {
        waiter_ = h;
        link_ = std::make_shared<link>(this);
        std::stop_token token = std::move(token_);
        std::shared_ptr<signal_type> stop;
        if (token.stop_possible())
            stop = std::make_shared<signal_type>(io_executor_of(initiation_));
        initiation_record record{this, initiating};
        initiating = &record;
        struct restore {
            initiation_record* outer;
            ~restore() { initiating = outer; }
        } restore_guard{record.outer};
        std::apply(
            [&](auto&... a) {
                std::move(initiation_)(handler{link_, stop}, std::move(a)...);
            },
            args_);
        // From here the coroutine may be running on another thread, or gone: only locals are touched.
        if (record.completed || record.dropped)
            return false; // resume now: with the result, or to report the dropped handler
        if (stop)
            stop->arm(std::move(token));
        return true;
    }

    result_type await_resume() {
        if (!result_)
            throw std::logic_error("resilience::asio::use_task: the operation destroyed its completion "
                                   "handler without calling it");
        return std::move(*result_);
    }

private:
    using signal_type = stop_signal<decltype(io_executor_of(std::declval<const Initiation&>()))>;

    /// Shared by the operation and its handler: the operation, until it is destroyed.
    struct link {
        explicit link(operation* op) noexcept : self(op) {}
        std::atomic<operation*> self;
    };

    class handler {
    public:
        using cancellation_slot_type = ::asio::cancellation_slot;

        handler(std::shared_ptr<link> l, std::shared_ptr<signal_type> stop) noexcept
            : link_(std::move(l)), stop_(std::move(stop)) {}
        handler(handler&& o) noexcept
            : link_(std::move(o.link_)), stop_(std::move(o.stop_)), live_(std::exchange(o.live_, false)) {}
        handler& operator=(handler&&) = delete;
        ~handler() {
            // Dropped by a failing initiating function: the coroutine is not suspended for good
            // and goes on (with the exception, if any). Dropped later (its io_context shutting
            // down, say): the call waits until whoever owns it destroys it.
            if (live_ && initiating && link_ && initiating->operation == link_->self.load(std::memory_order_acquire))
                initiating->dropped = true;
        }

        cancellation_slot_type get_cancellation_slot() const noexcept {
            return stop_ ? stop_->slot() : cancellation_slot_type{};
        }

        void operator()(Args... completion) {
            live_ = false;
            if (stop_)
                stop_->finish();
            operation* const self = link_->self.load(std::memory_order_acquire);
            if (!self)
                return; // the call was destroyed before its operation completed: nothing to resume
            self->result_.emplace(std::forward<Args>(completion)...);
            if (initiating && initiating->operation == self) {
                initiating->completed = true; // await_suspend resumes the coroutine itself
                return;
            }
            self->waiter_.resume(); // `self` may be gone after this
        }

    private:
        std::shared_ptr<link> link_;
        std::shared_ptr<signal_type> stop_;
        bool live_ = true;
    };

    Initiation initiation_;
    InitArgs args_;
    std::stop_token token_;
    std::coroutine_handle<> waiter_;
    std::optional<result_type> result_;
    std::shared_ptr<link> link_;
};

template <class... Args, class Initiation, class... InitArgs>
auto make_operation(Initiation initiation, std::stop_token token, InitArgs... args) {
    using stored = std::tuple<std::decay_t<InitArgs>...>;
    return operation<Initiation, stored, Args...>{std::move(initiation), stored{std::move(args)...},
                                                  std::move(token)};
}

} // namespace detail

/// A completion token that makes an Asio operation awaitable inside a resilience coroutine: the
/// operation starts when awaited, the coroutine resumes in its handler (in the I/O object's
/// executor), and the completion arguments come back as a tuple.
///
///     auto [ec, n] = co_await socket.async_read_some(buffer, rs::asio::use_task);
///     auto [ec, n] = co_await socket.async_read_some(buffer, rs::asio::use_task(st)); // stoppable
///
/// `use_task(st)` connects the operation's cancellation slot to the stop token `st` (usually the
/// attempt's): when `st` is stopped while the operation is pending, a `terminal` cancellation is
/// emitted on the slot from the I/O object's executor, so a timeout or a caller's stop ends a
/// pending read with `asio::error::operation_aborted`. An operation whose initiation does not name
/// the I/O object's executor is cancelled on the thread that requests the stop. The emission never
/// races with the operation's completion: it happens only before the handler has run.
/// A coroutine waiting here belongs to whoever drives it: an `async_run` call, to its io_context.
struct use_task_t {
    constexpr use_task_t() = default;
    /// This token, with the operation cancelled when `token` is stopped.
    use_task_with_stop_t operator()(std::stop_token token) const noexcept;
};
inline constexpr use_task_t use_task{};

/// `use_task(token)`: see `use_task_t`.
struct use_task_with_stop_t {
    std::stop_token token;
};

inline use_task_with_stop_t use_task_t::operator()(std::stop_token token) const noexcept {
    return use_task_with_stop_t{std::move(token)};
}

} // namespace resilience::asio

// The completion tokens, declared before anything in this header awaits an operation with them.
template <class... Args>
class asio::async_result<resilience::asio::use_task_t, void(Args...)> {
public:
    template <class Initiation, class... InitArgs>
    static auto initiate(Initiation initiation, resilience::asio::use_task_t, InitArgs... args) {
        return resilience::asio::detail::make_operation<Args...>(std::move(initiation), std::stop_token{},
                                                                 std::move(args)...);
    }
};

template <class... Args>
class asio::async_result<resilience::asio::use_task_with_stop_t, void(Args...)> {
public:
    template <class Initiation, class... InitArgs>
    static auto initiate(Initiation initiation, resilience::asio::use_task_with_stop_t token,
                         InitArgs... args) {
        return resilience::asio::detail::make_operation<Args...>(std::move(initiation),
                                                                 std::move(token.token), std::move(args)...);
    }
};

namespace resilience::asio {

/// A clock that sleeps on Asio steady timers bound to an executor; the sleeping coroutine resumes
/// in that executor's context (the io_context's threads). `std::chrono::steady_clock` time.
/// Copyable; the execution context must outlive every sleep. A stop request from any thread
/// cancels the timer through the executor. A pending sleep is an Asio operation like any
/// `use_task` one: an io_context destroyed during a backoff destroys the waiting call.
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
    // The timer lives in the sleeping frame; its wait is a `use_task(token)` operation, so the
    // stop request, the resumption in the executor's context and the ownership are all that one's.
    class sleep_awaiter {
    public:
        sleep_awaiter(::asio::any_io_executor ex, time_point tp, std::stop_token token)
            : executor_(std::move(ex)), when_(tp), token_(std::move(token)) {}

        bool await_ready() const noexcept {
            return token_.stop_requested() || when_ <= std::chrono::steady_clock::now();
        }
        bool await_suspend(std::coroutine_handle<> h) {
            timer_.emplace(executor_, when_);
            wait_.emplace(resilience::detail::emplace_from{
                [&] { return timer_->async_wait(use_task_with_stop_t{std::move(token_)}); }});
            return wait_->await_suspend(h);
        }
        void await_resume() {
            if (wait_)
                (void)wait_->await_resume(); // aborted or expired: the caller checks its token
        }

    private:
        using wait_operation =
            decltype(std::declval<::asio::steady_timer&>().async_wait(std::declval<use_task_with_stop_t>()));

        ::asio::any_io_executor executor_;
        time_point when_;
        std::stop_token token_;
        std::optional<::asio::steady_timer> timer_;
        std::optional<wait_operation> wait_;
    };

    ::asio::any_io_executor executor_;
};

static_assert(resilience::clock<clock>);

namespace detail {

// ---------------------------------------------------------------------------------------------------------
// async_run: a resilience awaitable as an Asio operation.

/// What the registry knows of a live `async_run` call: its outermost frame, on an intrusive list.
/// `prev`, `next` and `orphaned` are guarded by the registry's mutex.
struct call_node : resilience::detail::recycled_frame {
    class call_registry* registry = nullptr;
    call_node* prev = nullptr;
    call_node* next = nullptr;
    bool orphaned = false; ///< taken off the list by the registry's shutdown, which destroys it
    void* frame = nullptr;
};

/// The execution-context service that owns the `async_run` calls started on its context. A call is
/// on the list from its start (in the context) to the end of its outermost frame; when the context
/// shuts down (its destructor, after every thread has left `run()`), `shutdown()` destroys each call
/// still on the list, with the whole chain of tasks it awaits and everything their frames own, wherever
/// they wait: on an Asio operation, a sleep, a bulkhead or limiter queue, a hedge's delay. Destroying
/// one call may resume another inline (a bulkhead slot handed on), which then waits again or ends; the
/// loop goes on until the list is empty. Handlers of the calls' pending operations, destroyed by the
/// context's other services before or after, touch no frame; a handler lost any other way (an I/O
/// object of another io_context destroyed with it) leaves its call waiting until this context goes.
/// The `async_run` completion handler is destroyed uncalled with its call, like the handler of any
/// Asio operation that can no longer complete. A call that has not started yet is owned by the
/// posted function that starts it, which the context's scheduler destroys. As with
/// `rs::event_loop`'s destructor, nothing may be about to resume a call when it is destroyed (a
/// bulkhead handing it a slot from a thread of another loop at that moment would reach a freed frame).
class call_registry final : public ::asio::execution_context::service {
public:
    using key_type = call_registry;
    static inline ::asio::execution_context::id id;

    explicit call_registry(::asio::execution_context& context) : service(context) {}

    /// The registry of `executor`'s execution context, made on first use.
    static call_registry& of(const ::asio::any_io_executor& executor) {
        return ::asio::use_service<call_registry>(::asio::query(executor, ::asio::execution::context));
    }

    void add(call_node* n) noexcept {
        std::lock_guard lock(mutex_);
        n->registry = this;
        n->prev = nullptr;
        n->next = head_;
        if (head_)
            head_->prev = n;
        head_ = n;
    }
    /// The call's outermost frame ends (finished, or destroyed by `shutdown`).
    void remove(call_node* n) noexcept {
        std::lock_guard lock(mutex_);
        if (n->orphaned)
            return;
        if (n->prev)
            n->prev->next = n->next;
        else
            head_ = n->next;
        if (n->next)
            n->next->prev = n->prev;
    }

    /// Calls on the list now (tests and diagnostics).
    std::size_t size() const {
        std::lock_guard lock(mutex_);
        std::size_t count = 0;
        for (call_node* n = head_; n; n = n->next)
            ++count;
        return count;
    }

private:
    void shutdown() override {
        // One at a time, the lock released while a frame goes: its destruction may end or start
        // others, which take the lock.
        for (;;) {
            call_node* n = nullptr;
            {
                std::lock_guard lock(mutex_);
                n = head_;
                if (!n)
                    return;
                head_ = n->next;
                if (head_)
                    head_->prev = nullptr;
                n->prev = n->next = nullptr;
                n->orphaned = true;
            }
            std::coroutine_handle<>::from_address(n->frame).destroy();
        }
    }

    mutable std::mutex mutex_;
    call_node* head_ = nullptr;
};

/// The outermost coroutine of an `async_run` operation. It starts suspended, so the registry can
/// name it before it runs, and frees itself when it ends.
struct root_task {
    struct promise_type : call_node {
        root_task get_return_object() noexcept {
            return {std::coroutine_handle<promise_type>::from_promise(*this)};
        }
        std::suspend_always initial_suspend() const noexcept { return {}; }
        std::suspend_never final_suspend() const noexcept { return {}; }
        void return_void() noexcept {}
        void unhandled_exception() noexcept { std::terminate(); } // run_and_complete catches everything
        ~promise_type() {
            if (registry)
                registry->remove(this);
        }
    };
    std::coroutine_handle<promise_type> handle;
};

/// Installed in the cancellation slot of an `async_run` handler (callable form): an Asio
/// cancellation request stops the call. Runs where the slot's signal is emitted.
struct stop_on_cancel {
    explicit stop_on_cancel(std::stop_source s) noexcept : source(std::move(s)) {}
    std::stop_source source;
    void operator()(::asio::cancellation_type_t type) {
        if ((type & honoured_cancellation) != ::asio::cancellation_type::none) {
            // The request may end the call inline, and its completion, run meanwhile on another
            // thread of the handler's executor, clear the slot and this object with it.
            resilience::detail::request_stop_held(source);
        }
    }
};

// Makes the awaitable with `make(token)` and runs it, then posts the completion to the handler's
// associated executor, outside this coroutine: an exception thrown by the handler comes out of that
// executor's run(), as with any Asio handler. `make` lives in this frame until the end, so a coroutine
// lambda's captures stay valid; what it throws is the operation's failure. Work is held on the I/O
// executor and on the handler's executor until the handler has run, so neither io_context runs out of
// work while the awaitable waits on something outside Asio. The slot this operation filled is cleared
// where Asio emits on it, before the handler runs.
template <class Make, class Handler>
root_task run_and_complete(Make make, std::stop_token token, Handler handler, ::asio::any_io_executor io,
                           bool clear_slot) {
    using R = await_result_t<std::invoke_result_t<Make&, std::stop_token>>;
    auto io_work = ::asio::make_work_guard(io);
    auto handler_ex = ::asio::get_associated_executor(handler, io);
    auto handler_work = ::asio::make_work_guard(handler_ex);
    std::exception_ptr error;
    std::optional<std::conditional_t<std::is_void_v<R>, char, R>> value;
    try {
        auto&& awaitable = std::invoke(make, std::move(token));
        if constexpr (std::is_void_v<R>) {
            co_await std::move(awaitable);
        } else {
            value.emplace(co_await std::move(awaitable));
        }
    } catch (...) {
        error = std::current_exception();
    }
    if constexpr (std::is_void_v<R>) {
        ::asio::post(handler_ex, [h = std::move(handler), error, clear_slot, w1 = std::move(io_work),
                                  w2 = std::move(handler_work)]() mutable {
            if (clear_slot)
                ::asio::get_associated_cancellation_slot(h).clear();
            std::move(h)(error);
        });
    } else {
        if (!value)
            value.emplace(); // the handler signature needs a value even on failure
        ::asio::post(handler_ex, [h = std::move(handler), error, v = std::move(*value), clear_slot,
                                  w1 = std::move(io_work), w2 = std::move(handler_work)]() mutable {
            if (clear_slot)
                ::asio::get_associated_cancellation_slot(h).clear();
            std::move(h)(error, std::move(v));
        });
    }
}

// The `make` of an awaitable given ready-made.
template <class A>
struct ready_awaitable {
    A awaitable;
    A&& operator()(std::stop_token) noexcept { return std::move(awaitable); }
};

// In the executor's context: makes the outermost coroutine, puts it on the context's registry, and
// runs it until it first waits.
template <class Make, class Handler>
void start(Make make, std::stop_token token, Handler handler, ::asio::any_io_executor io, bool clear_slot) {
    call_registry& registry = call_registry::of(io);
    root_task task =
        run_and_complete(std::move(make), std::move(token), std::move(handler), std::move(io), clear_slot);
    task.handle.promise().frame = task.handle.address();
    registry.add(&task.handle.promise());
    task.handle.resume();
}

// The initiation: the slot connected when there is a stop source to stop, and the start posted to
// the executor. Until it runs, the posted function owns `make` (and the awaitable in it) and the
// handler: destroyed unrun, it destroys them.
template <class Make, class Handler>
void launch(const ::asio::any_io_executor& ex, Make make, Handler handler, std::stop_source stop) {
    std::stop_token token = stop.get_token();
    const bool connect = stop.stop_possible();
    if (connect)
        ::asio::get_associated_cancellation_slot(handler).template emplace<stop_on_cancel>(std::move(stop));
    ::asio::post(ex, [ex, m = std::move(make), t = std::move(token), h = std::move(handler), connect]() mutable {
        start(std::move(m), std::move(t), std::move(h), ex, connect);
    });
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
/// into the operation and kept alive until it finishes. This form cannot be cancelled through
/// Asio (the awaitable was made without a stop token): use the next one for that.
template <awaitable A, class CompletionToken>
auto async_run(::asio::any_io_executor executor, A awaitable, CompletionToken&& token) {
    using signature = typename detail::completion_signature<await_result_t<A>>::type;
    return ::asio::async_initiate<CompletionToken, signature>(
        [ex = std::move(executor)](auto handler, A aw) {
            detail::launch(ex, detail::ready_awaitable<A>{std::move(aw)}, std::move(handler),
                           std::stop_source{std::nostopstate});
        },
        token, std::move(awaitable));
}

/// As above, with the awaitable made by `make(stop_token)`: `make` is moved into the operation,
/// called once when it starts (in `executor`'s context) and kept alive until the call ends, as
/// `execute` keeps its action, so a coroutine lambda is fine here; what it throws is the
/// operation's failure. Asio per-operation cancellation of this operation (the token's
/// cancellation slot: a losing operand of `||`, `asio::bind_cancellation_slot`, `cancel_after` in
/// Asio 1.31 and later) requests stop on that token, so the call ends as its policies end a
/// stopped call (usually with `rs::cancelled_error`). `terminal` and `partial` cancellation are
/// honoured; `total` only is not, since an attempt may already have had effects. Without a
/// connected slot the token never stops.
///
///     rs::asio::async_run(ex, [&](std::stop_token st) { return policy.execute(fetch, st); }, token);
template <class F, class CompletionToken>
requires(!awaitable<F>) && std::invocable<F&, std::stop_token> &&
        awaitable<std::invoke_result_t<F&, std::stop_token>>
auto async_run(::asio::any_io_executor executor, F make, CompletionToken&& token) {
    using signature = typename detail::completion_signature<
        await_result_t<std::invoke_result_t<F&, std::stop_token>>>::type;
    return ::asio::async_initiate<CompletionToken, signature>(
        [ex = std::move(executor)](auto handler, F f) {
            std::stop_source stop{std::nostopstate};
            if (::asio::get_associated_cancellation_slot(handler).is_connected())
                stop = std::stop_source{};
            detail::launch(ex, std::move(f), std::move(handler), std::move(stop));
        },
        token, std::move(make));
}

namespace detail {

// The `make` of a call spawned in a scope: holds the call's place in the scope for as long as the
// operation lives, and gives `make` a token stopped by the scope or by Asio cancellation.
template <class F>
class scoped_make {
    struct forward {
        std::stop_source* target;
        void operator()() const noexcept { resilience::detail::request_stop_held(*target); }
    };

public:
    scoped_make(resilience::detail::scope_guard guard, F make)
        : guard_(std::move(guard)), make_(std::move(make)) {}
    // Moved only before it is called (into the operation), when no link exists yet.
    scoped_make(scoped_make&& o) : guard_(std::move(o.guard_)), make_(std::move(o.make_)) {}
    scoped_make& operator=(scoped_make&&) = delete;

    auto operator()(std::stop_token cancel) {
        std::stop_token scope_token = guard_.token();
        if (!cancel.stop_possible())
            return std::invoke(make_, std::move(scope_token));
        linked_.emplace();
        from_scope_.emplace(std::move(scope_token), forward{&*linked_});
        from_asio_.emplace(std::move(cancel), forward{&*linked_});
        return std::invoke(make_, linked_->get_token());
    }

private:
    resilience::detail::scope_guard guard_;
    F make_;
    std::optional<std::stop_source> linked_;
    std::optional<std::stop_callback<forward>> from_scope_; // after linked_: go first
    std::optional<std::stop_callback<forward>> from_asio_;
};

} // namespace detail

/// Starts a call in `scope` as `async_run(executor, make, token)` does: `make(stop_token)` is called
/// when the operation starts, with a token that `scope.request_stop()` stops, and so does Asio
/// cancellation of the operation (a connected slot on `token`). The call is in the scope from now
/// until its awaitable has ended and its completion has been posted to the handler's executor, or
/// until the io_context destroys it; `co_await scope.join()` (or `async_run(ex, scope.join(), token)`
/// from Asio code) waits for that. Given an awaitable instead, the call is counted but cannot be stopped.
///
///     rs::asio::spawn(scope, io.get_executor(),
///                     [&](std::stop_token st) { return policy.execute(serve, st); },
///                     [](std::exception_ptr e) { if (e) log(e); });
template <class F, class CompletionToken>
requires awaitable<F> || resilience::detail::scope_callable<F>
auto spawn(async_scope& scope, ::asio::any_io_executor executor, F make, CompletionToken&& token) {
    if constexpr (awaitable<F>)
        return async_run(std::move(executor), scope.nest(std::move(make)), std::forward<CompletionToken>(token));
    else
        return async_run(std::move(executor),
                         detail::scoped_make<F>{resilience::detail::scope_access::guard(scope), std::move(make)},
                         std::forward<CompletionToken>(token));
}

} // namespace resilience::asio
