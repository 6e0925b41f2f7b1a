// SPDX-License-Identifier: MIT
/// \file asio_flavour/async_run.hpp
/// `async_run`, which runs a resilience awaitable as an Asio asynchronous operation, `spawn`, which
/// starts one in an `rs::async_scope`, and the io_context service that owns the calls they start.
///
/// A body of the Asio integration, written once for both Asio flavours: <resilience/asio.hpp> and
/// <resilience/boost_asio.hpp> include it with RESILIENCE_ASIO_FLAVOUR (the namespace it goes in,
/// under resilience::) and RESILIENCE_ASIO_NET (the Asio it is built on, unqualified) defined, and Asio's headers
/// already included. No include guard: it is included once per flavour.
///
/// Locking: `call_registry::mutex_` guards the list of calls (`calls_`, `live_`, each `call_node`'s `prev`,
/// `next` and `orphaned`), the strands made so far (`strands_`), the timer wheel (`wheel_`, and each armed
/// `timer_node`'s links and `home_data`), `timer_`, `waiting_for_` and `generation_`. A member function whose
/// name ends in `_locked` is called with it held and never takes it; every other one takes it itself.
/// `next_strand_` and `destroyed_` are atomics, read and written without it.

#if !defined(RESILIENCE_ASIO_FLAVOUR) || !defined(RESILIENCE_ASIO_NET) ||                                    \
    !defined(RESILIENCE_ASIO_FLAVOUR_NAME)
#error "include <resilience/asio.hpp> (standalone Asio) or <resilience/boost_asio.hpp> (Boost.Asio)"
#endif

#include "../async_scope.hpp"
#include "../concepts.hpp"
#include "../detail/intrusive_list.hpp"
#include "../detail/timer_wheel.hpp"
#include "../engine/std_token.hpp"
#include "../stop_token.hpp"
#include "../task.hpp"

#include <atomic>
#include <chrono>
#include <concepts>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2::RESILIENCE_ASIO_FLAVOUR {

namespace detail {

/// Cancellation requests honoured by the call side: a stop request ends a call as soon as it can,
/// leaving the policies' shared state consistent, which is what `terminal` and `partial` ask for. A
/// request for `total` cancellation only (no side effect at all) is ignored: an attempt may have
/// done part of its work.
inline constexpr net::cancellation_type_t honoured_cancellation =
    net::cancellation_type::terminal | net::cancellation_type::partial;

/// What the registry knows of a live `async_run` call: its outermost frame, on an intrusive list.
/// `prev`, `next` and `orphaned` are guarded by the registry's mutex.
struct call_node : resilience::detail::recycled_frame {
    class call_registry* registry = nullptr;
    call_node* prev = nullptr;
    call_node* next = nullptr;
    bool orphaned = false; ///< taken off the list by the registry's shutdown, which destroys it
    void* frame = nullptr;
};

/// The execution-context service that owns the `async_run` calls started on its context: a call is on
/// its list from its start to the end of its outermost frame, and the context's shutdown destroys every
/// call still on it, wherever it waits (docs/asio.md, "Who owns a waiting call", says what that covers).
class call_registry final : public net::execution_context::service {
public:
    using key_type = call_registry;
    static inline net::execution_context::id id;

    explicit call_registry(net::execution_context& context) : service(context) {}

    /// The registry of `executor`'s execution context, made on first use. The last one found on this
    /// thread is remembered (a service lookup locks the context's registry of services), for as long as
    /// no registry anywhere has been destroyed: a context at the same address later is another one.
    static call_registry& of(const net::any_io_executor& executor) {
        net::execution_context& context = net::query(executor, net::execution::context);
        thread_local struct {
            net::execution_context* context;
            call_registry* registry;
            std::uint64_t epoch;
        } last{};
        const std::uint64_t epoch = destroyed_.load(std::memory_order_acquire);
        if (last.context == &context && last.epoch == epoch)
            return *last.registry;
        call_registry& r = net::use_service<call_registry>(context);
        last = {&context, &r, epoch};
        return r;
    }

    ~call_registry() override { destroyed_.fetch_add(1, std::memory_order_acq_rel); }

    /// A strand for a call on this context that must make its own serial order: one of a few, made
    /// once and shared by turns. A strand only orders handlers, so calls sharing one stay independent
    /// (and a call costs no strand of its own: its allocation was the largest cost of a call).
    net::strand<net::any_io_executor> strand_for(const net::any_io_executor& ex) {
        const std::size_t i = next_strand_.fetch_add(1, std::memory_order_relaxed) % strand_count;
        std::lock_guard lock(mutex_);
        if (!strands_[i])
            strands_[i].emplace(net::make_strand(
                net::any_io_executor(net::prefer(ex, net::execution::outstanding_work.untracked))));
        return *strands_[i];
    }

    void add(call_node* n) noexcept {
        std::lock_guard lock(mutex_);
        ++live_;
        n->registry = this;
        calls_.push_front(*n);
    }
    /// The call's outermost frame ends (finished, or destroyed by `shutdown`).
    void remove(call_node* n) noexcept {
        std::lock_guard lock(mutex_);
        if (n->orphaned)
            return;
        calls_.erase(*n);
        if (--live_ == 0)
            idle_locked();
    }

    /// Calls on the list now (tests and diagnostics).
    std::size_t size() const {
        std::lock_guard lock(mutex_);
        std::size_t count = 0;
        for (call_node* n = calls_.front(); n; n = n->next)
            ++count;
        return count;
    }

    // ---- the timers of the calls on this context (a call's home arms them: call_home::add_timer) ----
    //
    // One wheel (detail/timer_wheel.hpp) for every call, under the registry's mutex, and one Asio timer
    // that waits for its earliest deadline. Arming a deadline later than the one the Asio timer waits
    // for, and disarming any, touch only the wheel: a call whose timeout does not fire costs no Asio
    // timer operation, no allocation and no system call. The Asio timer may then wake for nothing; it
    // waits on for what is left. It is cancelled once no call is left on the context and the wheel is
    // empty, so that a context whose calls have all ended runs out of work. A timer due is fired on
    // its call's serialising executor, posted there with a record that its call's disarming (on that
    // executor too) cancels.

    /// Arms `t` to fire on `home` at `t->when` (time since `std::chrono::steady_clock`'s epoch).
    void add_timer(call_home* home, const net::any_io_executor& io, resilience::detail::timer_node* t) {
        std::lock_guard lock(mutex_);
        t->home_data = home;
        wheel_.insert(t);
        if (t->when < waiting_for_) {
            try {
                wait_for_locked(t->when, io);
            } catch (...) {
                wheel_.erase(t);
                t->home_data = nullptr;
                throw;
            }
        }
    }

    /// Disarms `t` (on its home's serialising executor, or at teardown).
    void remove_timer(resilience::detail::timer_node* t) noexcept {
        std::lock_guard lock(mutex_);
        if (t->slot_index == in_flight && t->home_data) {
            static_cast<firing*>(t->home_data)->node = nullptr; // its posted fire finds nothing to do
            t->home_data = nullptr;
            t->prev = nullptr;
            return;
        }
        wheel_.erase(t);
        t->home_data = nullptr;
    }

private:
    static constexpr int in_flight = -2; // a node's `slot_index` once popped and posted to its home

    // A due timer on its way to its home; freed with the posted function that carries it.
    struct firing {
        resilience::detail::timer_node* node;
        call_home* home;
        firing(resilience::detail::timer_node* n, call_home* h) noexcept : node(n), home(h) {}
        firing(const firing&) = delete;
        firing& operator=(const firing&) = delete;
        ~firing() {
            if (node) { // never run (the context shut down): the node is no longer armed
                node->home_data = nullptr;
                node->prev = nullptr;
                node->slot_index = -1;
            }
        }
    };

    // Under the lock: the Asio timer waits for `when` from now on.
    void wait_for_locked(std::chrono::nanoseconds when, const net::any_io_executor& io) {
        if (!timer_)
            timer_.emplace(io);
        timer_->expires_at(std::chrono::steady_clock::time_point(
            std::chrono::duration_cast<std::chrono::steady_clock::duration>(when)));
        const std::uint64_t generation = ++generation_;
        timer_->async_wait([this, generation](const auto&) { expired(generation); });
        waiting_for_ = when;
    }

    // The Asio timer's wait ended (at its time, or cancelled by a later `wait_for_locked` or by `idle_locked`).
    void expired(std::uint64_t generation) {
        std::lock_guard lock(mutex_);
        if (generation != generation_)
            return; // superseded
        waiting_for_ = std::chrono::nanoseconds::max();
        const auto now = std::chrono::steady_clock::now().time_since_epoch();
        while (resilience::detail::timer_node* n = wheel_.pop_due(now)) {
            auto* home = static_cast<call_home*>(n->home_data);
            // Still armed (for its owner's destructor) until it has fired on its home.
            n->prev = n;
            n->slot_index = in_flight;
            auto record = std::make_unique<firing>(n, home);
            n->home_data = record.get();
            home->where().visit([&](const auto& serial) {
                net::post(serial, [this, r = std::move(record)] {
                    resilience::detail::timer_node* node = nullptr;
                    {
                        // The node's fields are the registry's (see Locking): a disarm on this
                        // executor later must find it neither in flight nor in the wheel.
                        std::lock_guard fired_lock(mutex_);
                        node = r->node;
                        if (!node)
                            return; // disarmed meanwhile
                        r->node = nullptr;
                        node->home_data = nullptr;
                        node->prev = nullptr;
                        node->slot_index = -1;
                    }
                    resilience::detail::home_loop::scope here(r->home);
                    node->fire(node);
                });
            });
        }
        if (!wheel_.empty())
            wait_for_locked(wheel_.wake_at(), timer_->get_executor());
    }

    // Under the lock: no call left; the Asio timer stops waiting, so the context can run out of work.
    void idle_locked() noexcept {
        if (waiting_for_ == std::chrono::nanoseconds::max() || !wheel_.empty())
            return;
        ++generation_;
        waiting_for_ = std::chrono::nanoseconds::max();
        try {
            timer_->cancel();
        } catch (...) {
        }
    }

    void shutdown() override {
        // One at a time, the lock released while a frame goes: its destruction may end or start
        // others, which take the lock.
        for (;;) {
            call_node* n = nullptr;
            {
                std::lock_guard lock(mutex_);
                n = calls_.pop_front();
                if (!n)
                    break;
                n->orphaned = true;
            }
            std::coroutine_handle<>::from_address(n->frame).destroy();
        }
        // Every call is gone, and their timers with them. The Asio timer goes now, while its service
        // (shut down, its pending wait dropped) still exists: it may be destroyed before this one.
        std::lock_guard lock(mutex_);
        timer_.reset();
        waiting_for_ = std::chrono::nanoseconds::max();
        for (auto& s : strands_) // their service too may be destroyed before this one
            s.reset();
    }

    static inline std::atomic<std::uint64_t> destroyed_{0}; // registries destroyed, ever

    mutable std::mutex mutex_;
    resilience::detail::intrusive_list<call_node> calls_;
    std::size_t live_ = 0; // calls on the list
    // The strands calls take turns on (`strand_for`), made on first use; untracked (the calls count
    // their own work).
    static constexpr std::size_t strand_count = 32;
    std::optional<net::strand<net::any_io_executor>> strands_[strand_count];
    std::atomic<std::size_t> next_strand_{0};
    resilience::detail::timer_wheel wheel_{std::chrono::steady_clock::now().time_since_epoch()};
    std::optional<net::steady_timer> timer_;                                 // made on the first timer armed
    std::chrono::nanoseconds waiting_for_ = std::chrono::nanoseconds::max(); // max: not waiting
    std::uint64_t generation_ = 0; // of the Asio timer's current wait
};

inline call_executor::call_executor(const net::any_io_executor& ex) : io_(ex) {
    const executor_traits t = traits_of(ex);
    if (!t.serial)
        strand_.emplace(call_registry::of(ex).strand_for(ex));
    here_ = t.serial && t.here;
}

inline void call_home::add_timer(home_loop* h, timer_node* t) {
    auto* self = static_cast<call_home*>(h);
    self->registry_->add_timer(self, self->where_.io(), t);
}

inline void call_home::remove_timer(home_loop* h, timer_node* t) noexcept {
    static_cast<call_home*>(h)->registry_->remove_timer(t);
}

/// The outermost coroutine of an `async_run` operation. It starts suspended, so the registry can
/// name it before it runs, and frees itself when it ends.
struct root_task {
    struct promise_type : call_node {
        std::optional<call_home> home; ///< where the call runs (made when it starts, on its strand)
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

/// Calls being started inside their initiating function on this thread (see `launch`): one that
/// completes meanwhile posts its handler.
inline thread_local int starting_inline = 0;

/// The promise of the running `root_task`, read without suspending.
struct this_promise {
    root_task::promise_type* p = nullptr;
    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<root_task::promise_type> h) noexcept {
        p = &h.promise();
        return false;
    }
    root_task::promise_type* await_resume() const noexcept { return p; }
};

/// Installed in the cancellation slot of an `async_run` handler (callable form): an Asio
/// cancellation request stops the call. Runs where the slot's signal is emitted.
struct stop_on_cancel {
    explicit stop_on_cancel(stop_source s) noexcept : source(std::move(s)) {}
    stop_source source;
    void operator()(net::cancellation_type_t type) {
        if ((type & honoured_cancellation) != net::cancellation_type::none) {
            // The request may end the call inline, and its completion, run meanwhile on another
            // thread of the handler's executor, clear the slot and this object with it.
            resilience::detail::request_stop_held(source);
        }
    }
};

// Makes the awaitable with `make(token)` and runs it, then completes on the handler's associated
// executor: dispatched when the call ends in one of its own handlers (on its serialising executor, its
// home current), as co_spawn completes, else posted (never inside the initiating function, nor inside
// whatever requested a stop). An exception thrown by the handler comes out of that executor's run(),
// as with any Asio handler. `make` lives in this frame until the end, so a coroutine
// lambda's captures stay valid; what it throws is the operation's failure. Work is held on the I/O
// executor and on the handler's executor until the handler has run, so neither io_context runs out of
// work while the awaitable waits on something outside Asio. The slot this operation filled is cleared
// where Asio emits on it, before the handler runs.
template <class Make, class Handler>
root_task run_and_complete(Make make, stop_token token, Handler handler, net::any_io_executor io,
                           bool clear_slot) {
    using R = await_result_t<std::invoke_result_t<Make&, stop_token>>;
    auto io_work = net::make_work_guard(io);
    auto handler_ex = net::get_associated_executor(handler, io);
    // Work on the handler's executor too, unless it is the I/O executor (the usual case), held already.
    std::optional<decltype(net::make_work_guard(handler_ex))> handler_work;
    if constexpr (std::is_same_v<decltype(handler_ex), net::any_io_executor>) {
        if (!(handler_ex == io))
            handler_work.emplace(handler_ex);
    } else {
        handler_work.emplace(handler_ex);
    }
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
    root_task::promise_type* const self = co_await this_promise{};
    const bool in_own_handler = starting_inline == 0 && self->home && call_home::current() == &*self->home;
    const auto deliver = [&](auto complete) {
        if (!in_own_handler) {
            net::post(handler_ex, std::move(complete));
            return;
        }
        resilience::detail::home_loop::scope outside(nullptr); // the handler's code is not the call's
        try {
            net::dispatch(handler_ex, std::move(complete));
        } catch (...) {
            // Out of the handler's executor's run(), as a posted handler's would be, not into this frame.
            net::post(handler_ex, [e = std::current_exception()] { std::rethrow_exception(e); });
        }
    };
    if constexpr (std::is_void_v<R>) {
        deliver([h = std::move(handler), error, clear_slot, w1 = std::move(io_work),
                 w2 = std::move(handler_work)]() mutable {
            if (clear_slot)
                net::get_associated_cancellation_slot(h).clear();
            std::move(h)(error);
        });
    } else {
        if (!value)
            value.emplace(); // the handler signature needs a value even on failure
        deliver([h = std::move(handler), error, v = std::move(*value), clear_slot, w1 = std::move(io_work),
                 w2 = std::move(handler_work)]() mutable {
            if (clear_slot)
                net::get_associated_cancellation_slot(h).clear();
            std::move(h)(error, std::move(v));
        });
    }
}

// The `make` of an awaitable given ready-made.
template <class A>
struct ready_awaitable {
    A awaitable;
    A&& operator()(stop_token) noexcept { return std::move(awaitable); }
};

// On the call's strand: makes the outermost coroutine, puts it on the context's registry, and runs
// it, its home current, until it first waits.
template <class Make, class Handler>
void start(Make make, stop_token token, Handler handler, net::any_io_executor io, call_executor where,
           bool clear_slot) {
    call_registry& registry = call_registry::of(io);
    root_task task =
        run_and_complete(std::move(make), std::move(token), std::move(handler), std::move(io), clear_slot);
    auto& promise = task.handle.promise();
    promise.frame = task.handle.address();
    promise.home.emplace(std::move(where));
    promise.home->attach(&registry);
    registry.add(&promise);
    resilience::detail::home_loop::scope here(&*promise.home);
    task.handle.resume();
}

// The initiation: the slot connected when there is a stop source to stop, and the start posted to
// the executor. Until it runs, the posted function owns `make` (and the awaitable in it) and the
// handler: destroyed unrun, it destroys them. When the call's serialising executor is the one running
// this thread (a coroutine's `co_await execute(...)` on an io_context with concurrency hint 1, or on
// a strand), the call starts here instead, until it first waits: its handler is then posted if it
// ends before this returns.
template <class Make, class Handler>
void launch(const net::any_io_executor& ex, Make make, Handler handler, stop_source stop) {
    stop_token token = stop.get_token();
    const bool connect = stop.stop_possible();
    if (connect)
        net::get_associated_cancellation_slot(handler).template emplace<stop_on_cancel>(std::move(stop));
    call_executor where(ex);
    if (where.made_here()) {
        struct count {
            count() noexcept { ++starting_inline; }
            ~count() { --starting_inline; }
            count(const count&) = delete;
            count& operator=(const count&) = delete;
        } starting;
        start(std::move(make), std::move(token), std::move(handler), ex, std::move(where), connect);
        return;
    }
    where.visit([&](const auto& serial) {
        net::post(serial, [ex, where, m = std::move(make), t = std::move(token), h = std::move(handler),
                           connect]() mutable {
            start(std::move(m), std::move(t), std::move(h), ex, std::move(where), connect);
        });
    });
}

// `launch`, with a stop source to stop when the handler's cancellation slot is connected (a
// cancellation emitted there requests stop on the call's token), and none otherwise. The initiation
// of every stoppable call: `async_run` of a maker, and both forms of `execute`.
template <class Make, class Handler>
void launch_stoppable(const net::any_io_executor& ex, Make make, Handler handler) {
    stop_source stop{nostopstate};
    if (net::get_associated_cancellation_slot(handler).is_connected())
        stop = stop_source{};
    launch(ex, std::move(make), std::move(handler), std::move(stop));
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
auto async_run(net::any_io_executor executor, A awaitable, CompletionToken&& token) {
    using signature = typename detail::completion_signature<await_result_t<A>>::type;
    return net::async_initiate<CompletionToken, signature>(
        [ex = std::move(executor)](auto handler, A aw) {
            detail::launch(ex, detail::ready_awaitable<A>{std::move(aw)}, std::move(handler),
                           stop_source{nostopstate});
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
///     rsnet::async_run(ex, [&](stop_token st) { return policy.execute(fetch, st); }, token);
template <class F, class CompletionToken>
requires(!awaitable<F>) && resilience::detail::takes_a_stop_token<F> &&
        awaitable<std::invoke_result_t<resilience::detail::rs_token_maker_t<F>&, stop_token>>
auto async_run(net::any_io_executor executor, F make, CompletionToken&& token) {
    using M = resilience::detail::rs_token_maker_t<F>;
    using signature =
        typename detail::completion_signature<await_result_t<std::invoke_result_t<M&, stop_token>>>::type;
    return net::async_initiate<CompletionToken, signature>(
        [ex = std::move(executor)](auto handler, M m) {
            detail::launch_stoppable(ex, std::move(m), std::move(handler));
        },
        token, resilience::detail::rs_token_maker(std::move(make)));
}

namespace detail {

// The `make` of a call spawned in a scope: holds the call's place in the scope for as long as the
// operation lives, and gives `make` a token stopped by the scope or by Asio cancellation.
template <class F>
class scoped_make {
    struct forward {
        stop_source* target;
        void operator()() const noexcept { resilience::detail::request_stop_held(*target); }
    };

public:
    scoped_make(resilience::detail::scope_guard guard, F make)
        : guard_(std::move(guard)), make_(std::move(make)) {}
    // Moved only before it is called (into the operation), when no link exists yet.
    scoped_make(scoped_make&& o) : guard_(std::move(o.guard_)), make_(std::move(o.make_)) {}
    scoped_make& operator=(scoped_make&&) = delete;

    auto operator()(stop_token cancel) {
        stop_token scope_token = guard_.token();
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
    std::optional<stop_source> linked_;
    std::optional<stop_callback<forward>> from_scope_; // after linked_: go first
    std::optional<stop_callback<forward>> from_asio_;
};

} // namespace detail

/// Starts a call in `scope` as `async_run(executor, make, token)` does: `make(stop_token)` is called
/// when the operation starts, with a token that `scope.request_stop()` stops, and so does Asio
/// cancellation of the operation (a connected slot on `token`). The call is in the scope from now
/// until its awaitable has ended and its completion has been posted to the handler's executor, or
/// until the io_context destroys it; `co_await scope.join()` (or `async_run(ex, scope.join(), token)`
/// from Asio code) waits for that. Given an awaitable instead, the call is counted but cannot be stopped.
///
///     rsnet::spawn(scope, io.get_executor(),
///                     [&](stop_token st) { return policy.execute(serve, st); },
///                     [](std::exception_ptr e) { if (e) log(e); });
template <class F, class CompletionToken>
requires awaitable<F> || resilience::detail::scope_callable<F>
auto spawn(async_scope& scope, net::any_io_executor executor, F make, CompletionToken&& token) {
    if constexpr (awaitable<F>)
        return async_run(std::move(executor), scope.nest(std::move(make)),
                         std::forward<CompletionToken>(token));
    else
        return async_run(std::move(executor),
                         detail::scoped_make<resilience::detail::rs_token_maker_t<F>>{
                             resilience::detail::scope_access::guard(scope),
                             resilience::detail::rs_token_maker(std::move(make))},
                         std::forward<CompletionToken>(token));
}

} // namespace resilience::RESILIENCE_ASIO_FLAVOUR
