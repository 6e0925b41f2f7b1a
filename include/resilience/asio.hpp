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
/// **Who owns a waiting coroutine.** An `async_run` operation owns the coroutines it runs, as Asio's
/// `co_spawn` owns an `asio::awaitable`'s. While they wait on Asio (a `use_task` operation, a sleep on
/// this clock), the pending Asio handlers share that ownership: when one of them is destroyed without
/// having been called (its io_context destroyed with the operation pending, say), the call can never
/// finish, and once no handler of the call is pending any more, the call's outermost coroutine is
/// destroyed, which destroys the task it awaits, and so on down the chain, as `rs::event_loop`'s
/// destructor does with the coroutines spawned on it. Destroying only the innermost frame, the one
/// a handler would resume, would leave the frames awaiting it holding a dangling task. The
/// `async_run` completion handler is then destroyed uncalled, as Asio does with the handler of any
/// operation that can no longer complete (an `asio::awaitable` waiting on it is destroyed in turn).
/// A `use_task` operation belongs to the `async_run` operation whose coroutines were running on
/// this thread, resumed by this header, when it started. One started elsewhere (in a coroutine
/// driven by `rs::sync_wait` or `rs::event_loop`, or resumed from another thread by a bulkhead that
/// handed it a slot) belongs to whoever drives that coroutine: its handler destroyed uncalled
/// destroys nothing. The rule goes by thread, so a coroutine of another call that this call resumes
/// inline (handing on a bulkhead slot it released) and that starts an operation right then is
/// counted as this call's: that operation's loss ends this call too. Nothing else may destroy a
/// coroutine while it waits on a `use_task` operation, and, as with `rs::event_loop`'s destructor,
/// nothing else may be about to resume a call when it is destroyed (a bulkhead handing it a slot
/// from another thread at that moment would reach a freed frame).
#pragma once

#include "clock.hpp"
#include "concepts.hpp"
#include "detail/stop.hpp"
#include "task.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
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
// Ownership of the coroutines of an async_run operation (see the file comment).

/// What an `async_run` operation shares with the Asio handlers its coroutines wait on. Reference
/// counted, because a handler may outlive the coroutines (it is destroyed after it resumed them).
/// `pending` counts the handlers that may still resume a coroutine of the call, and the resumptions
/// running now; `lost` says a handler was destroyed uncalled. The outermost frame is destroyed when
/// `pending` falls to zero with `lost` set: then no handler of the call can touch a frame any more.
class call_root {
public:
    call_root() = default;
    call_root(const call_root&) = delete;
    call_root& operator=(const call_root&) = delete;

    void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
    void release() noexcept {
        if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1)
            delete this;
    }

    void hold() noexcept { pending_.fetch_add(1, std::memory_order_relaxed); }
    /// A hold ended normally: its handler ran and the coroutine it resumed has suspended or ended.
    void unhold() noexcept {
        // abandon() stores `lost` before its own decrement, so whoever brings the count to zero
        // sees it.
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1 && lost_.load(std::memory_order_acquire))
            destroy_frame();
    }
    /// A hold ended with its handler destroyed uncalled.
    void abandon() noexcept {
        lost_.store(true, std::memory_order_release);
        unhold();
    }

    void attach(std::coroutine_handle<> frame) noexcept {
        frame_.store(frame.address(), std::memory_order_release);
    }
    /// The outermost frame is going away by itself (finished, or being destroyed here).
    void detach() noexcept { frame_.store(nullptr, std::memory_order_release); }

private:
    ~call_root() = default;

    void destroy_frame() noexcept {
        if (void* f = frame_.exchange(nullptr, std::memory_order_acq_rel))
            std::coroutine_handle<>::from_address(f).destroy();
    }

    std::atomic<std::size_t> refs_{1};
    std::atomic<std::size_t> pending_{0};
    std::atomic<bool> lost_{false};
    std::atomic<void*> frame_{nullptr};
};

/// A counted reference to a `call_root`.
class root_ref {
public:
    root_ref() = default;
    explicit root_ref(call_root* r) noexcept : root_(r) {} // adopts a reference
    root_ref(const root_ref& o) noexcept : root_(o.root_) {
        if (root_)
            root_->add_ref();
    }
    root_ref(root_ref&& o) noexcept : root_(std::exchange(o.root_, nullptr)) {}
    root_ref& operator=(root_ref o) noexcept {
        std::swap(root_, o.root_);
        return *this;
    }
    ~root_ref() {
        if (root_)
            root_->release();
    }
    call_root* get() const noexcept { return root_; }
    call_root* release() noexcept { return std::exchange(root_, nullptr); }

private:
    call_root* root_ = nullptr;
};

/// A handler's share in a call (`call_root::hold`), if the call has a root. Destroying it without
/// `end()` says that the handler was destroyed uncalled.
class root_hold {
public:
    root_hold() = default;
    explicit root_hold(call_root* r) noexcept : root_(r) {
        if (r) {
            r->add_ref();
            r->hold();
        }
    }
    root_hold(root_hold&& o) noexcept : root_(std::exchange(o.root_, nullptr)) {}
    root_hold& operator=(root_hold&&) = delete;
    ~root_hold() {
        if (root_) {
            root_->abandon();
            root_->release();
        }
    }
    call_root* get() const noexcept { return root_; }
    void end() noexcept {
        if (call_root* r = std::exchange(root_, nullptr)) {
            r->unhold();
            r->release();
        }
    }

private:
    call_root* root_ = nullptr;
};

/// The call whose coroutines this thread is running, resumed by this header; null elsewhere.
inline thread_local call_root* running_root = nullptr;

struct running_scope {
    call_root* previous;
    explicit running_scope(call_root* r) noexcept : previous(std::exchange(running_root, r)) {}
    running_scope(const running_scope&) = delete;
    running_scope& operator=(const running_scope&) = delete;
    ~running_scope() { running_root = previous; }
};

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
/// operation's handler resumes the coroutine with the completion arguments. The handler owns a
/// share of the call (`root_hold`) and, with a stop token, the operation's cancellation slot.
template <class Initiation, class InitArgs, class... Args>
class operation {
public:
    using result_type = std::tuple<std::decay_t<Args>...>;

    operation(Initiation initiation, InitArgs args, std::stop_token token)
        : initiation_(std::move(initiation)), args_(std::move(args)), token_(std::move(token)) {}

    bool await_ready() const noexcept { return false; }

    bool await_suspend(std::coroutine_handle<> h) {
        waiter_ = h;
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
                std::move(initiation_)(handler{this, root_hold{running_root}, stop}, std::move(a)...);
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

    class handler {
    public:
        using cancellation_slot_type = ::asio::cancellation_slot;

        handler(operation* self, root_hold hold, std::shared_ptr<signal_type> stop) noexcept
            : self_(self), hold_(std::move(hold)), stop_(std::move(stop)) {}
        handler(handler&& o) noexcept
            : self_(o.self_), hold_(std::move(o.hold_)), stop_(std::move(o.stop_)),
              live_(std::exchange(o.live_, false)) {}
        handler& operator=(handler&&) = delete;
        ~handler() {
            if (live_ && initiating && initiating->operation == self_) {
                // Dropped by a failing initiating function: the coroutine is not suspended for
                // good and goes on (with the exception, if any); this is not a lost call.
                initiating->dropped = true;
                hold_.end();
            }
            // Otherwise a live handler's hold_ reports the call lost as it goes.
        }

        cancellation_slot_type get_cancellation_slot() const noexcept {
            return stop_ ? stop_->slot() : cancellation_slot_type{};
        }

        void operator()(Args... completion) {
            live_ = false;
            if (stop_)
                stop_->finish();
            self_->result_.emplace(std::forward<Args>(completion)...);
            if (initiating && initiating->operation == self_) {
                initiating->completed = true; // await_suspend resumes the coroutine itself
                hold_.end();
                return;
            }
            root_hold hold = std::move(hold_);
            {
                running_scope scope{hold.get()};
                self_->waiter_.resume(); // `self_` may be gone after this
            }
            hold.end();
        }

    private:
        operation* self_;
        root_hold hold_;
        std::shared_ptr<signal_type> stop_;
        bool live_ = true;
    };

    Initiation initiation_;
    InitArgs args_;
    std::stop_token token_;
    std::coroutine_handle<> waiter_;
    std::optional<result_type> result_;
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
/// Ownership of the waiting coroutine: see the file comment.
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

/// The outermost coroutine of an `async_run` operation. It starts suspended, so the call's root can
/// name it before it runs, and frees itself when it ends.
struct root_task {
    struct promise_type : resilience::detail::recycled_frame {
        call_root* root = nullptr; // a counted reference, set before the first resumption
        root_task get_return_object() noexcept {
            return {std::coroutine_handle<promise_type>::from_promise(*this)};
        }
        std::suspend_always initial_suspend() const noexcept { return {}; }
        std::suspend_never final_suspend() const noexcept { return {}; }
        void return_void() noexcept {}
        void unhandled_exception() noexcept { std::terminate(); } // run_and_complete catches everything
        ~promise_type() {
            if (root) {
                root->detach();
                root->release();
            }
        }
    };
    std::coroutine_handle<promise_type> handle;
};

/// Installed in the cancellation slot of an `async_run` handler (callable form): an Asio
/// cancellation request stops the call. Runs where the slot's signal is emitted; whatever the
/// stop resumes there belongs to this call.
struct stop_on_cancel {
    stop_on_cancel(std::stop_source s, root_ref r) noexcept : source(std::move(s)), root(std::move(r)) {}
    std::stop_source source;
    root_ref root;
    void operator()(::asio::cancellation_type_t type) {
        if ((type & honoured_cancellation) != ::asio::cancellation_type::none) {
            running_scope scope{root.get()};
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

// In the executor's context: makes the outermost coroutine, gives it the call's root, and runs it
// until it first waits, as the call's running resumption.
template <class Make, class Handler>
void start(Make make, std::stop_token token, Handler handler, ::asio::any_io_executor io, root_ref root,
           bool clear_slot) {
    root_task task =
        run_and_complete(std::move(make), std::move(token), std::move(handler), std::move(io), clear_slot);
    call_root* r = root.get();
    r->attach(task.handle);
    task.handle.promise().root = root.release();
    root_hold running{r};
    {
        running_scope scope{r};
        task.handle.resume();
    }
    running.end();
}

// The initiation: a root for the call, the slot connected when there is a stop source to stop,
// and the start posted to the executor. Until it runs, the posted function owns `make` (and the
// awaitable in it) and the handler: destroyed unrun, it destroys them.
template <class Make, class Handler>
void launch(const ::asio::any_io_executor& ex, Make make, Handler handler, std::stop_source stop) {
    root_ref root{new call_root};
    std::stop_token token = stop.get_token();
    const bool connect = stop.stop_possible();
    if (connect)
        ::asio::get_associated_cancellation_slot(handler).template emplace<stop_on_cancel>(std::move(stop),
                                                                                           root);
    ::asio::post(ex, [ex, m = std::move(make), t = std::move(token), h = std::move(handler),
                      root = std::move(root), connect]() mutable {
        start(std::move(m), std::move(t), std::move(h), ex, std::move(root), connect);
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

} // namespace resilience::asio
