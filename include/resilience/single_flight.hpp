// SPDX-License-Identifier: MIT
/// \file single_flight.hpp
/// `single_flight`: concurrent calls with the same key share one call of the action and its result.
#pragma once

#include "context.hpp"
#include "error.hpp"
#include "event_loop.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "task.hpp"

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace resilience {

namespace detail {

/// A coroutine that starts at once, with nobody awaiting it, and frees its own frame at the end.
/// Starts a shared call when the caller that needs it runs outside any event loop.
struct detached_task {
    struct promise_type : recycled_frame {
        detached_task get_return_object() const noexcept { return {}; }
        std::suspend_never initial_suspend() const noexcept { return {}; }
        std::suspend_never final_suspend() const noexcept { return {}; }
        void return_void() const noexcept {}
        // The only awaitable started this way catches everything itself.
        void unhandled_exception() const noexcept { std::terminate(); }
    };
};

inline detached_task start_detached(task<void> t) {
    co_await std::move(t);
}

} // namespace detail

/// Collapses concurrent calls that share a key into one call of the action, whose result (value or
/// failure) every caller receives: a failure is the same exception object for all of them. Nothing
/// is stored once the call settles: the next caller starts a new one. It is not a cache; there is
/// no expiry to configure.
///
/// - The first caller of a key starts the shared call as a coroutine of its own, spawned on that
///   caller's event loop (started inline when there is none); later callers of the key join it.
///   Their actions are never called (they are destroyed when their `run` ends).
/// - Each caller's stop token detaches that caller alone: it gets `cancelled_error` at once and
///   leaves. The shared call keeps running while at least one caller waits, even when the caller
///   that started it has left. When the last caller leaves, the shared call's stop token is
///   stopped and the key is free at once: the next caller starts a fresh call (the abandoned one
///   finishes in the background, its result delivered to nobody).
/// - Waiters are resumed on their own event loop (through `post`), whichever thread the shared
///   call finished on; a waiter outside any loop is resumed inline.
/// - Thread-safe: callers on different threads and loops share one call per key. No lock is held
///   while user code runs.
///
/// Lifetimes. `run` moves the action into the shared call, which keeps it alive until the call
/// ends; the shared call may outlive the caller that started it (it serves the others), so the
/// action must own what it uses:
///
///     flights.run(key, [client](std::stop_token st) { return client->fetch(st); });  // OK: owns a copy
///     flights.run(key, [&local](std::stop_token st) { return fetch(local, st); });    // dangling once
///                                                 // the starting caller leaves while others wait
///
/// The shared state is held by `std::shared_ptr` inside every caller and every shared call, so a
/// call in flight keeps it alive even if every handle has been destroyed. The policy form
/// (`policy(key)`) works differently, see `keyed_policy`.
///
/// A cheap copyable handle: copies share one set of calls. `Key` must be copyable, hashable by
/// `Hash` and comparable by `KeyEqual`; `T` must be copyable (each caller receives its own copy)
/// or `void`.
template <class Key, class T, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>>
class single_flight {
    static_assert(std::is_copy_constructible_v<Key>, "resilience::single_flight: Key must be copyable");
    static_assert(
        std::is_invocable_r_v<std::size_t, const Hash&, const Key&>,
        "resilience::single_flight: Key must be hashable (specialize std::hash<Key> or pass a Hash)");
    static_assert(std::is_invocable_r_v<bool, const KeyEqual&, const Key&, const Key&>,
                  "resilience::single_flight: Key must be equality-comparable (operator== or a KeyEqual)");
    static_assert(!std::is_reference_v<T>, "resilience::single_flight: T must not be a reference");
    static_assert(std::is_void_v<T> || std::is_copy_constructible_v<T>,
                  "resilience::single_flight: T must be copyable: every caller receives its own copy");

    struct call;
    struct state;
    struct waiter;

public:
    class keyed_policy;

    single_flight() : state_(std::make_shared<state>(Hash{}, KeyEqual{})) {}
    explicit single_flight(Hash hash, KeyEqual equal = KeyEqual{})
        : state_(std::make_shared<state>(std::move(hash), std::move(equal))) {}

    /// Runs `action` once for all concurrent callers of `key` and returns the shared value, or
    /// rethrows the shared failure (the same exception object for every caller). The action is
    /// called like a policy's action (with a `context`, a `std::stop_token`, or nothing) and gets
    /// the shared call's stop token, stopped only when every caller has left. When `token` is
    /// stopped this caller leaves at once with `cancelled_error`.
    template <class A>
    task<T> run(Key key, A action, std::stop_token token = {}) const {
        outcome<T> result = co_await run_outcome(std::move(key), std::move(action), std::move(token));
        if constexpr (std::is_void_v<T>)
            std::move(result).value();
        else
            co_return std::move(result).value();
    }

    /// Like `run`, but reports the failure (including this caller's cancellation) as a value.
    template <class A>
    task<outcome<T>> run_outcome(Key key, A action, std::stop_token token = {}) const {
        static_assert(std::is_convertible_v<detail::action_result_t<A>, T>,
                      "resilience::single_flight: the action's result must convert to T");
        std::shared_ptr<state> st = state_; // the call may outlive every handle
        if (token.stop_requested())
            co_return failure::make(cancelled_error{});
        auto start = [&](const std::shared_ptr<call>& c) {
            start_shared(st, c, run_action<A>{std::move(action)});
        };
        // A named awaiter: GCC 12 destroys the members of an aggregate awaiter temporary twice.
        join_awaiter<decltype(start)> joined{*st, key, std::move(token), false, start};
        co_return co_await joined;
    }

    /// A policy that runs everything it wraps under `key`: the `next` of the first caller becomes
    /// the shared call. Build one per call (it is a handle and a key: cheap) to key each call.
    keyed_policy policy(Key key) const { return keyed_policy{*this, std::move(key)}; }

    /// How many keys have a call that callers are waiting for. A call every caller has left is
    /// not counted, even while it is still finishing.
    std::size_t in_flight() const {
        std::lock_guard lock(state_->mutex);
        return state_->calls.size();
    }
    /// Whether a caller arriving now with `key` would join a call rather than start one.
    bool contains(const Key& key) const {
        std::lock_guard lock(state_->mutex);
        return state_->calls.find(key) != state_->calls.end();
    }

private:
    // One shared call. `stop` and `key` are set once; everything else is guarded by state::mutex.
    struct call {
        explicit call(const Key& k) : key(k) {}
        const Key key;
        std::stop_source stop;
        waiter* head = nullptr; // callers still attached (an intrusive list of their awaiters)
        std::size_t attached = 0;
        waiter* lender = nullptr; // policy form: the caller whose `next` runs as the shared call
        bool lender_left = false;
        std::optional<outcome<T>> result;
    };

    struct state {
        state(Hash hash, KeyEqual equal) : calls(0, std::move(hash), std::move(equal)) {}
        std::mutex mutex;
        std::unordered_map<Key, std::shared_ptr<call>, Hash, KeyEqual> calls;
    };

    // The part of a caller's awaiter that the shared call and stop callbacks see.
    struct waiter {
        std::coroutine_handle<> handle;
        event_loop* loop = nullptr;
        std::shared_ptr<call> owner; // keeps the result readable until this caller has copied it
        waiter* prev = nullptr;
        waiter* next = nullptr;
        bool attached = false;  // guarded by state::mutex
        bool cancelled = false; // guarded by state::mutex; read after release
        // Whoever releases the waiter while its await_suspend is still running must not resume it
        // (await_suspend then declines to suspend): 0 registering, 1 suspended, 2 released.
        std::atomic<int> phase{0};
    };

    static void link(call& c, waiter& w) noexcept {
        w.prev = nullptr;
        w.next = c.head;
        if (c.head)
            c.head->prev = &w;
        c.head = &w;
        w.attached = true;
        ++c.attached;
    }
    static void unlink(call& c, waiter& w) noexcept {
        if (w.prev)
            w.prev->next = w.next;
        else
            c.head = w.next;
        if (w.next)
            w.next->prev = w.prev;
        w.prev = w.next = nullptr;
        w.attached = false;
        --c.attached;
    }
    static void erase_if_current(state& st, const std::shared_ptr<call>& c) {
        auto it = st.calls.find(c->key);
        if (it != st.calls.end() && it->second == c)
            st.calls.erase(it);
    }

    // Hands the waiter back to its coroutine. Nothing may touch `w` after the exchange: once
    // released, its frame may resume and end at any moment.
    static void release(waiter& w) noexcept {
        const std::coroutine_handle<> h = w.handle;
        event_loop* const loop = w.loop;
        if (w.phase.exchange(2, std::memory_order_acq_rel) != 1)
            return;
        if (loop)
            loop->post(h);
        else
            h.resume();
    }

    // The shared call ended: record the result, free the key, release every attached caller.
    static void settle(state& st, const std::shared_ptr<call>& c, outcome<T> result) {
        waiter* list = nullptr;
        waiter* lender = nullptr;
        {
            std::lock_guard lock(st.mutex);
            c->result.emplace(std::move(result));
            erase_if_current(st, c);
            list = std::exchange(c->head, nullptr);
            for (waiter* w = list; w; w = w->next)
                w->attached = false;
            c->attached = 0;
            if (c->lender_left)
                lender = c->lender;
        }
        while (list) {
            waiter* next = list->next;
            release(*list);
            list = next;
        }
        if (lender)
            release(*lender);
    }

    // A destroyed waiter: detach it without waking it; the last one out stops the shared call.
    static void abandon(state& st, waiter& w) noexcept {
        std::shared_ptr<call> c;
        bool last = false;
        {
            std::lock_guard lock(st.mutex);
            if (!w.attached)
                return;
            c = w.owner;
            unlink(*c, w);
            if (c->lender == &w)
                c->lender = nullptr;
            if (c->attached == 0) {
                last = true;
                erase_if_current(st, c);
            }
        }
        if (last)
            c->stop.request_stop();
    }

    // A caller's stop callback: detach it; the last one out stops the shared call and frees the key.
    static void leave(state& st, waiter& w) noexcept {
        std::shared_ptr<call> c;
        bool last = false, release_now = true;
        {
            std::lock_guard lock(st.mutex);
            if (!w.attached)
                return; // settled already: the shared call releases it
            c = w.owner;
            unlink(*c, w);
            w.cancelled = true;
            if (c->attached == 0) {
                last = true;
                erase_if_current(st, c);
            }
            if (c->lender == &w) {
                c->lender_left = true; // its `next` is still running: released when the call ends
                release_now = false;
            }
        }
        if (last)
            c->stop.request_stop();
        if (release_now)
            release(w);
    }

    struct on_stop {
        state* st;
        waiter* w;
        void operator()() const noexcept { leave(*st, *w); }
    };

    // Joins (or starts) the call for `key`; completes with the shared outcome, or with
    // cancelled_error when `token` is stopped first.
    template <class Starter>
    struct join_awaiter {
        state& st;
        const Key& key;
        std::stop_token token;
        bool lends;
        Starter& start;
        waiter w{};
        std::optional<std::stop_callback<on_stop>> stop_cb{};
        bool suspended = false;

        bool await_ready() const noexcept { return false; }
        bool await_suspend(std::coroutine_handle<> h) {
            w.handle = h;
            w.loop = event_loop::current();
            bool first = false;
            {
                std::lock_guard lock(st.mutex);
                auto it = st.calls.find(key);
                if (it == st.calls.end()) {
                    it = st.calls.emplace(key, std::make_shared<call>(key)).first;
                    first = true;
                }
                w.owner = it->second;
                link(*w.owner, w);
                if (first && lends)
                    w.owner->lender = &w;
            }
            if (first) {
                try {
                    start(w.owner);
                } catch (...) {
                    settle(st, w.owner, failure::current());
                }
            }
            if (token.stop_possible())
                stop_cb.emplace(token, on_stop{&st, &w});
            suspended = true; // before the exchange: once suspended, another thread may resume it
            const bool suspends = w.phase.exchange(1, std::memory_order_acq_rel) != 2;
            if (!suspends)
                suspended = false;
            return suspends;
        }
        // Reached while suspended only when the waiting coroutine is destroyed without being
        // resumed (its event loop was torn down): it detaches without being woken, and, if it was
        // the last caller, the shared call is stopped as when the last caller leaves.
        ~join_awaiter() {
            if (!suspended)
                return;
            stop_cb.reset();
            abandon(st, w);
        }
        outcome<T> await_resume() {
            suspended = false;
            stop_cb.reset(); // waits for a callback running on another thread, so `w` outlives it
            if (w.cancelled)
                return failure::make(cancelled_error{});
            return *w.owner->result;
        }
    };

    // The shared call as a coroutine of its own: it outlives any one caller.
    template <class Produce>
    static task<void> shared_call(std::shared_ptr<state> st, std::shared_ptr<call> c, Produce produce) {
        std::optional<outcome<T>> result;
        try {
            result.emplace(co_await produce(c->stop.get_token()));
        } catch (...) {
            result.emplace(failure::current());
        }
        settle(*st, c, std::move(*result));
    }

    template <class Produce>
    static void start_shared(const std::shared_ptr<state>& st, const std::shared_ptr<call>& c,
                             Produce produce) {
        task<void> t = shared_call(st, c, std::move(produce));
        if (event_loop* loop = event_loop::current())
            loop->spawn(std::move(t));
        else
            detail::start_detached(std::move(t));
    }

    // `run`'s shared call: owns the action and calls it once.
    template <class A>
    struct run_action {
        A action;
        task<outcome<T>> operator()(std::stop_token token) {
            const context ctx{std::move(token)};
            try {
                if constexpr (std::is_void_v<T>) {
                    co_await detail::invoke_action(action, ctx);
                    co_return outcome<T>{};
                } else {
                    co_return outcome<T>(co_await detail::invoke_action(action, ctx));
                }
            } catch (...) {
                co_return failure::current();
            }
        }
    };

    // The policy form's shared call: the first caller's `next`, on the shared call's stop token.
    template <class Next>
    struct run_next {
        Next next;
        context ctx;
        task<outcome<T>> operator()(std::stop_token token) {
            const context child = ctx.with_stop_token(std::move(token));
            co_return co_await next(child);
        }
    };

    std::shared_ptr<state> state_;
};

/// `single_flight` as a policy: runs everything it wraps under one key, so
/// `rs::pipeline{flights.policy(key), rs::retry{}, rs::timeout{1s}}` shares the whole retried call
/// among concurrent callers of `key`. Satisfies `rs::policy`; the wrapped calls must produce `T`.
///
/// Semantics are those of `run`, with one difference forced by lifetimes: the shared call runs the
/// first caller's `next`, which refers to that caller's action and to the frames of the policies
/// around it, so that caller cannot leave before the shared call ends. When it stops, it is
/// detached (it gets `cancelled_error`, and if it was the last caller the shared call is stopped),
/// but its call returns only when the shared call has finished. Every other caller leaves at once.
/// In exchange the action may safely reference the caller's locals, as with every other policy.
/// Holds a handle to the single_flight (kept alive by it) and a copy of the key.
template <class Key, class T, class Hash, class KeyEqual>
class single_flight<Key, T, Hash, KeyEqual>::keyed_policy : public policy_base<keyed_policy> {
public:
    keyed_policy(single_flight flight, Key key) : flight_(std::move(flight)), key_(std::move(key)) {}

    const Key& key() const noexcept { return key_; }

    template <class Next>
    task<detail::next_outcome_t<Next>> run(Next next, const context& ctx) const {
        static_assert(std::is_same_v<detail::next_value_t<Next>, T>,
                      "resilience::single_flight::keyed_policy: the wrapped call must produce exactly T");
        std::shared_ptr<state> st = flight_.state_;
        if (ctx.stop_token().stop_requested())
            co_return failure::make(cancelled_error{});
        auto start = [&](const std::shared_ptr<call>& c) { start_shared(st, c, run_next<Next>{next, ctx}); };
        // A named awaiter: GCC 12 destroys the members of an aggregate awaiter temporary twice.
        join_awaiter<decltype(start)> joined{*st, key_, ctx.stop_token(), true, start};
        co_return co_await joined;
    }

private:
    single_flight flight_;
    Key key_;
};

} // namespace resilience
