// SPDX-License-Identifier: MIT
/// \file asio_flavour/use_task.hpp
/// `use_task` and `use_task(stop_token)`: the completion tokens with which a resilience coroutine
/// awaits an Asio operation, and the operation's awaiter that carries a stop request to Asio
/// per-operation cancellation.
///
/// A body of the Asio integration, written once for both Asio flavours: <resilience/asio.hpp> and
/// <resilience/boost_asio.hpp> include it with RESILIENCE_ASIO_FLAVOUR (the namespace it goes in,
/// under resilience::) and RESILIENCE_ASIO_NET (the Asio it is built on, unqualified) defined, and Asio's headers
/// already included. No include guard: it is included once per flavour.

#if !defined(RESILIENCE_ASIO_FLAVOUR) || !defined(RESILIENCE_ASIO_NET) ||                                    \
    !defined(RESILIENCE_ASIO_FLAVOUR_NAME)
#error "include <resilience/asio.hpp> (standalone Asio) or <resilience/boost_asio.hpp> (Boost.Asio)"
#endif

#include "../stop_token.hpp"

#include <atomic>
#include <coroutine>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2::RESILIENCE_ASIO_FLAVOUR {

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

    net::cancellation_slot slot() noexcept { return signal_.slot(); }

    /// After the operation started (its handler's slot is in place): stops it when `token` stops.
    void arm(stop_token token) {
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
            net::post(executor_, [self = this->shared_from_this()] { self->emit(); });
        }
    }

    void emit() {
        std::lock_guard lock(mutex_);
        if (!done_)
            signal_.emit(net::cancellation_type::terminal);
    }

    Executor executor_;
    std::recursive_mutex mutex_;
    net::cancellation_signal signal_;
    bool done_ = false;
    bool arming_ = false;
    bool stop_noted_ = false;
    std::optional<stop_callback<on_stop>> callback_; // last: goes first
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

    operation(Initiation initiation, InitArgs args, stop_token token)
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
        stop_token token = std::move(token_);
        std::shared_ptr<signal_type> stop;
        if (token.stop_possible())
            stop = std::make_shared<signal_type>(io_executor_of(initiation_));
        initiation_record record{this, initiating};
        initiating = &record;
        struct restore {
            initiation_record* outer;
            ~restore() { initiating = outer; }
        } restore_guard{record.outer};
        std::apply([&](auto&... a) { std::move(initiation_)(handler{link_, stop}, std::move(a)...); }, args_);
        // From here the coroutine may be running on another thread, or gone: only locals are touched.
        if (record.completed || record.dropped)
            return false; // resume now: with the result, or to report the dropped handler
        if (stop)
            stop->arm(std::move(token));
        return true;
    }

    result_type await_resume() {
        if (!result_)
            throw std::logic_error("resilience::" RESILIENCE_ASIO_FLAVOUR_NAME
                                   "::use_task: the operation destroyed its completion "
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
        using cancellation_slot_type = net::cancellation_slot;

        handler(std::shared_ptr<link> l, std::shared_ptr<signal_type> stop) noexcept
            : link_(std::move(l)), stop_(std::move(stop)) {}
        handler(handler&& o) noexcept
            : link_(std::move(o.link_)), stop_(std::move(o.stop_)), live_(std::exchange(o.live_, false)) {}
        handler& operator=(handler&&) = delete;
        ~handler() {
            // Dropped by a failing initiating function: the coroutine is not suspended for good
            // and goes on (with the exception, if any). Dropped later (its io_context shutting
            // down, say): the call waits until whoever owns it destroys it.
            if (live_ && initiating && link_ &&
                initiating->operation == link_->self.load(std::memory_order_acquire))
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
    stop_token token_;
    std::coroutine_handle<> waiter_;
    std::optional<result_type> result_;
    std::shared_ptr<link> link_;
};

template <class... Args, class Initiation, class... InitArgs>
auto make_operation(Initiation initiation, stop_token token, InitArgs... args) {
    using stored = std::tuple<std::decay_t<InitArgs>...>;
    return operation<Initiation, stored, Args...>{std::move(initiation), stored{std::move(args)...},
                                                  std::move(token)};
}

} // namespace detail

/// A completion token that makes an Asio operation awaitable inside a resilience coroutine: the
/// operation starts when awaited, the coroutine resumes in its handler (in the I/O object's
/// executor), and the completion arguments come back as a tuple.
///
///     auto [ec, n] = co_await socket.async_read_some(buffer, rsnet::use_task);
///     auto [ec, n] = co_await socket.async_read_some(buffer, rsnet::use_task(st)); // stoppable
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
    use_task_with_stop_t operator()(stop_token token) const noexcept;
#if RESILIENCE_HAS_STD_STOP_TOKEN
    /// The same with a standard library token (bridged: see stop_token.hpp).
    use_task_with_stop_t operator()(const std::stop_token& token) const;
#endif
};
inline constexpr use_task_t use_task{};

/// `use_task(token)`: see `use_task_t`.
struct use_task_with_stop_t {
    stop_token token;
};

inline use_task_with_stop_t use_task_t::operator()(stop_token token) const noexcept {
    return use_task_with_stop_t{std::move(token)};
}
#if RESILIENCE_HAS_STD_STOP_TOKEN
inline use_task_with_stop_t use_task_t::operator()(const std::stop_token& token) const {
    return use_task_with_stop_t{from_std(token)};
}
#endif

} // namespace resilience::RESILIENCE_ASIO_FLAVOUR

// Asio's hook for the tokens: `op(args..., use_task)` returns the awaiter of the operation.
template <class... Args>
class RESILIENCE_ASIO_NET::async_result<resilience::RESILIENCE_ASIO_FLAVOUR::use_task_t, void(Args...)> {
public:
    template <class Initiation, class... InitArgs>
    static auto initiate(Initiation initiation, resilience::RESILIENCE_ASIO_FLAVOUR::use_task_t,
                         InitArgs... args) {
        return resilience::RESILIENCE_ASIO_FLAVOUR::detail::make_operation<Args...>(
            std::move(initiation), ::resilience::stop_token{}, std::move(args)...);
    }
};

template <class... Args>
class RESILIENCE_ASIO_NET::async_result<resilience::RESILIENCE_ASIO_FLAVOUR::use_task_with_stop_t,
                                        void(Args...)> {
public:
    template <class Initiation, class... InitArgs>
    static auto initiate(Initiation initiation,
                         resilience::RESILIENCE_ASIO_FLAVOUR::use_task_with_stop_t token, InitArgs... args) {
        return resilience::RESILIENCE_ASIO_FLAVOUR::detail::make_operation<Args...>(
            std::move(initiation), std::move(token.token), std::move(args)...);
    }
};
