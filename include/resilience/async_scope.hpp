// SPDX-License-Identifier: MIT
/// \file async_scope.hpp
/// `async_scope`: a group of calls started to run on their own, which can be asked to stop and awaited
/// until the last has ended: the graceful drain of a service.
///
///     rs::async_scope scope;
///     scope.spawn(loop, [&](stop_token st) { return policy.execute(handle_request, st); });
///     ...
///     scope.request_stop();      // every call's token is stopped: waits end, attempts are stopped
///     co_await scope.join();     // resumes when the last call has ended
///
/// On Asio, `rs::asio::spawn(scope, executor, make, token)` (in `asio.hpp`) starts a call the same way.
///
/// Locking: `scope_state::mutex_` guards the count of calls (`calls_`) and the queue of joiners
/// (`joiners_`); every function takes it itself, so none is named `_locked`. `refs_` is an atomic, and the
/// stop source is thread-safe itself.
#pragma once

#include "concepts.hpp"
#include "engine/std_token.hpp"
#include "engine/waiter_queue.hpp"
#include "event_loop.hpp"
#include "stop_token.hpp"
#include "task.hpp"

#include <atomic>
#include <concepts>
#include <coroutine>
#include <cstddef>
#include <functional>
#include <mutex>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2 {

class async_scope;

namespace detail {

/// What a scope shares with its calls and its joiners: the count of calls, the stop source and the
/// joiners waiting for the count to fall to zero. Reference counted, so a scope may go first.
class scope_state {
public:
    scope_state() = default;
    scope_state(const scope_state&) = delete;
    scope_state& operator=(const scope_state&) = delete;

    void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
    void release() noexcept {
        if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1)
            delete this;
    }

    void enter() noexcept {
        std::lock_guard lock(mutex_);
        ++calls_;
    }
    /// A call ended (or was destroyed unstarted): the last one wakes every joiner, outside the lock.
    void leave() noexcept {
        waiter* woken = nullptr;
        {
            std::lock_guard lock(mutex_);
            if (--calls_ != 0)
                return;
            // The joiners leave the queue here; each is woken once, through a list of their own.
            while (waiter* w = joiners_.front()) {
                joiners_.erase(*w);
                w->state = waiter_state::granted;
                w->next = woken;
                woken = w;
            }
        }
        while (woken) {
            waiter* w = woken;
            woken = w->next; // read first: once woken, the node may be gone
            w->wake();
        }
    }

    std::size_t calls() const noexcept {
        std::lock_guard lock(mutex_);
        return calls_;
    }
    stop_source& stop() noexcept { return stop_; }

    /// Queues `w` unless no call is in the scope; says whether it was queued.
    bool wait(waiter& w) {
        std::lock_guard lock(mutex_);
        if (calls_ == 0)
            return false;
        w.state = waiter_state::queued;
        joiners_.push_back(w);
        return true;
    }
    /// A joiner destroyed while it waits leaves the queue.
    void withdraw(waiter& w) noexcept {
        std::lock_guard lock(mutex_);
        if (w.state == waiter_state::queued) {
            joiners_.erase(w);
            w.state = waiter_state::stopped;
        }
    }

private:
    ~scope_state() = default;

    std::atomic<std::size_t> refs_{1};
    mutable std::mutex mutex_;
    std::size_t calls_ = 0;
    stop_source stop_;
    waiter_queue joiners_;
};

/// One call's place in a scope: counted from its making (so a call not started yet is waited for) to
/// its destruction, whether the call ran to its end or was destroyed unfinished (its loop or
/// io_context destroyed). Move-only; a moved-from guard counts nothing.
class scope_guard {
public:
    explicit scope_guard(scope_state* s) noexcept : state_(s) {
        state_->add_ref();
        state_->enter();
    }
    scope_guard(scope_guard&& o) noexcept : state_(std::exchange(o.state_, nullptr)) {}
    scope_guard& operator=(scope_guard&&) = delete;
    ~scope_guard() {
        if (state_) {
            scope_state* s = std::exchange(state_, nullptr);
            s->leave();
            s->release();
        }
    }
    stop_token token() const noexcept { return state_->stop().get_token(); }

private:
    scope_state* state_;
};

template <class A>
task<await_result_t<A>> scoped_awaitable(scope_guard guard, A awaitable) {
    (void)guard; // lives in this frame: the call leaves the scope when the frame goes
    co_return co_await std::move(awaitable);
}

template <class F>
task<await_result_t<std::invoke_result_t<F&, stop_token>>> scoped_call(scope_guard guard, F make) {
    // `make` lives in this frame until the call ends, as `execute` keeps its action.
    co_return co_await std::invoke(make, guard.token());
}

struct scope_access;

template <class F>
concept scope_callable = !awaitable<F> && takes_a_stop_token<F> &&
                         awaitable<std::invoke_result_t<rs_token_maker_t<F>&, stop_token>>;

} // namespace detail

/// A group of calls that run on their own (spawned on an `event_loop`, or on Asio with
/// `rs::asio::spawn`), with one stop source for all of them and a way to await the end of the last.
/// It does not collect results: a spawned call's value is dropped, and its failure goes where its
/// runtime sends failures (`event_loop::run()` rethrows it; on Asio, the completion token gets it), so
/// a call that must not fail handles its own (`execute_outcome`, a fallback, a try block).
///
/// A call is in the scope from `spawn` (or `nest`) to its end, or to its destruction when its loop or
/// io_context is destroyed with it unfinished; `join()` waits for every such call, started or not.
/// Each call made by a function of a `stop_token` is given the scope's token, which
/// `request_stop()` stops: the policies then end their waits and stop their attempts, and the calls
/// end as stopped calls do (usually with `rs::cancelled_error`).
///
/// Thread-safe. The scope may be destroyed before its calls have ended: its destructor requests stop,
/// and the calls keep what they share with it alive until they end (the scope does not wait). The
/// loop or io_context that runs a call still owns it, as usual.
///
///     // OK: a graceful end; stop, then wait for the last call, then let the members go.
///     scope.request_stop();
///     co_await scope.join();
///     // OK too: the scope goes first, stopping the calls; their loop or io_context, destroyed
///     // next, destroys whatever has not ended.
class async_scope {
public:
    async_scope() : state_(new detail::scope_state) {}
    async_scope(const async_scope&) = delete;
    async_scope& operator=(const async_scope&) = delete;
    /// Requests stop on the calls still in the scope and lets them end on their own.
    ~async_scope() {
        state_->stop().request_stop();
        state_->release();
    }

    /// Counts `f` in the scope and returns the awaitable to run: `f` is an awaitable, or a function
    /// of a `stop_token` that returns one, called with the scope's token when the returned task
    /// starts and kept alive until it ends. The call is in the scope from now until that task ends or
    /// is destroyed (started or not). For a runtime of your own; `spawn` uses it.
    template <class F>
    requires awaitable<std::decay_t<F>> || detail::scope_callable<std::decay_t<F>>
    auto nest(F&& f) {
        if constexpr (awaitable<std::decay_t<F>>)
            return detail::scoped_awaitable(detail::scope_guard{state_}, std::decay_t<F>(std::forward<F>(f)));
        else
            return detail::scoped_call(detail::scope_guard{state_},
                                       detail::rs_token_maker(std::decay_t<F>(std::forward<F>(f))));
    }

    /// Starts `f` (see `nest`) on `loop` as `loop.spawn` does: `run()` waits for it, and rethrows what
    /// escapes it.
    template <class F>
    requires awaitable<std::decay_t<F>> || detail::scope_callable<std::decay_t<F>>
    void spawn(event_loop& loop, F&& f) {
        loop.spawn(nest(std::forward<F>(f)));
    }

    /// Stops the token every call of the scope was given (and every later call's: it is born
    /// stopped). Returns whether this request was the first.
    bool request_stop() noexcept { return detail::request_stop_held(state_->stop()); }
    bool stop_requested() const noexcept { return state_->stop().stop_requested(); }
    /// The token given to the scope's calls.
    stop_token get_stop_token() const noexcept { return state_->stop().get_token(); }

    /// Calls in the scope now.
    [[nodiscard]] std::size_t size() const noexcept { return state_->calls(); }

    class join_awaiter;
    /// An awaitable that completes when no call is in the scope (at once if none is). It does not
    /// close the scope: calls spawned afterwards are not waited for by a join already complete. The
    /// joiner resumes on the `event_loop` it suspended on, or, outside any loop (on Asio threads),
    /// inline on the thread where the last call ends. A joiner destroyed while it waits (its
    /// io_context destroyed, say) leaves the queue.
    [[nodiscard]] join_awaiter join() const noexcept;

private:
    friend struct detail::scope_access;
    detail::scope_state* state_;
};

namespace detail {
/// For runtimes that run a scope's calls their own way (`rs::asio::spawn`): a call's place in it.
struct scope_access {
    static scope_guard guard(async_scope& scope) { return scope_guard{scope.state_}; }
};
} // namespace detail

class async_scope::join_awaiter {
public:
    explicit join_awaiter(detail::scope_state* s) noexcept : state_(s) { state_->add_ref(); }
    /// Before it is awaited only (as `async_run` moves its awaitable into the operation).
    join_awaiter(join_awaiter&& o) noexcept : state_(std::exchange(o.state_, nullptr)) {}
    join_awaiter& operator=(join_awaiter&&) = delete;
    ~join_awaiter() {
        if (state_) {
            state_->withdraw(node_);
            state_->release();
        }
    }

    bool await_ready() const noexcept { return state_->calls() == 0; }
    bool await_suspend(std::coroutine_handle<> h) {
        node_.handle = h;
        node_.loop = detail::home_loop::current();
        return state_->wait(node_);
    }
    void await_resume() const noexcept {}

private:
    detail::scope_state* state_;
    detail::waiter node_;
};

inline async_scope::join_awaiter async_scope::join() const noexcept {
    return join_awaiter{state_};
}

} // namespace resilience
