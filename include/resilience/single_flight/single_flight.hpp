// SPDX-License-Identifier: MIT
/// \file single_flight/single_flight.hpp
/// `single_flight`: concurrent calls with the same key share one call of the action and its result.
#pragma once

#include "../context.hpp"
#include "../detail/stop.hpp"
#include "../error.hpp"
#include "../event_loop.hpp"
#include "../outcome.hpp"
#include "../policy.hpp"
#include "../task.hpp"

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace resilience {

/// Options of a `single_flight`. Nothing to tune: a shared call lasts as long as its action.
struct single_flight_options {
    /// Carried by the errors it makes (`policy_name()`) and by `name()`.
    std::string name{};
};

/// Collapses concurrent calls that share a key into one call of the action, whose result (value or
/// failure) every caller receives: a failure is the same exception object for all of them. Nothing
/// is stored once the call settles: the next caller starts a new one. It is not a cache; there is
/// no expiry to configure.
///
/// - The first caller of a key **owns** the shared call: it runs the action in its own frame, as
///   `execute` would. Later callers of the key **attach** to it: they suspend until it ends and
///   each takes a copy of the result. Their actions are never called (they are destroyed when
///   their `run` ends).
/// - Stops. The shared call's stop token is stopped only when every caller attached to it (the
///   owner included) has stopped; at that instant the key is freed, so the next caller starts a
///   fresh call instead of joining one being abandoned. An attached caller that stops leaves at
///   once with `cancelled_error`. The owner that stops is detached the same way (its result will be
///   `cancelled_error`), but, since the shared call runs in its frame, its `run` returns only when
///   the shared call has ended; the callers still attached get the real result.
/// - Teardown. If the owner's frame is destroyed before the call ends (its event loop destroyed
///   with the call pending), the key is freed and every attached caller is woken with
///   `cancelled_error` (a new object for each): none waits for a call that will never end.
/// - Attached callers are resumed on their own event loop (through `post`), whichever thread the
///   shared call ended on; one outside any loop is resumed inline.
/// - Thread-safe: callers on different threads and loops share one call per key. No lock is held
///   while user code runs.
///
/// Lifetimes. The action lives in the owner's frame and is awaited there, and the owner returns
/// only after the shared call has ended, so the action may reference the caller's locals exactly
/// as with `execute`:
///
///     int limit = 10;
///     co_await flights.run(key, [&](std::stop_token st) { return fetch(limit, st); });  // OK
///
/// The shared state is held by every call, from the moment it is made, so a call keeps it alive
/// even if every handle has been destroyed (docs/core.md, "Lifetimes"). The policy form
/// (`policy(key)`) follows the same rule, see `keyed_policy`.
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

    single_flight() : state_(std::make_shared<state>(single_flight_options{}, Hash{}, KeyEqual{})) {}
    explicit single_flight(Hash hash, KeyEqual equal = KeyEqual{})
        : state_(std::make_shared<state>(single_flight_options{}, std::move(hash), std::move(equal))) {}
    explicit single_flight(single_flight_options options, Hash hash = Hash{}, KeyEqual equal = KeyEqual{})
        : state_(std::make_shared<state>(std::move(options), std::move(hash), std::move(equal))) {}

    [[nodiscard]] const single_flight_options& options() const noexcept { return state_->options; }
    /// The name given in its options (empty by default).
    [[nodiscard]] const std::string& name() const noexcept { return state_->options.name; }

    /// Runs `action` once for all concurrent callers of `key` and returns the shared value, or
    /// rethrows the shared failure (the same exception object for every caller). The action is
    /// called like a policy's action (with a `context`, a `std::stop_token`, or nothing), in the
    /// frame of the caller that owns the call, and gets the shared call's stop token, stopped only
    /// when every caller has stopped. When `token` is stopped this caller gets `cancelled_error`:
    /// at once if it is attached, when the shared call ends if it owns it.
    template <class A>
    task<T> run(Key key, A action, std::stop_token token = {}) const {
        return run_with(state_, std::move(key), std::move(action), std::move(token));
    }

    /// Like `run`, but reports the failure (including this caller's cancellation) as a value.
    template <class A>
    task<outcome<T>> run_outcome(Key key, A action, std::stop_token token = {}) const {
        static_assert(std::is_convertible_v<detail::action_result_t<A>, T>,
                      "resilience::single_flight: the action's result must convert to T");
        return run_outcome_with(state_, std::move(key), std::move(action), std::move(token));
    }

    /// A policy that runs everything it wraps under `key`: the `next` of the caller that owns the
    /// call becomes the shared call. Build one per call (it is a handle and a key: cheap) to key
    /// each call.
    keyed_policy policy(Key key) const { return keyed_policy{*this, std::move(key)}; }

    /// How many keys have a call that callers are waiting for. A call every caller has stopped
    /// waiting for is not counted, even while it is still finishing.
    std::size_t in_flight() const {
        std::lock_guard lock(state_->mutex);
        return state_->calls.size();
    }
    /// Whether a caller arriving now with `key` would attach to a call rather than own one.
    bool contains(const Key& key) const {
        std::lock_guard lock(state_->mutex);
        return state_->calls.find(key) != state_->calls.end();
    }

private:
    // The state is copied into the call when it is made (the task is lazy): the call needs nothing
    // of the caller's, not even the handle it was made on, and may outlive every handle.
    template <class A>
    static task<T> run_with(std::shared_ptr<state> st, Key key, A action, std::stop_token token) {
        outcome<T> result =
            co_await run_outcome_with(std::move(st), std::move(key), std::move(action), std::move(token));
        if constexpr (std::is_void_v<T>)
            std::move(result).value();
        else
            co_return std::move(result).value();
    }
    template <class A>
    static task<outcome<T>> run_outcome_with(std::shared_ptr<state> st, Key key, A action,
                                             std::stop_token token) {
        if (token.stop_requested())
            co_return failure::make(cancelled_error{st->options.name});
        // Named: an owner goes on using it after the co_await, to settle the call.
        entry joined{*st, key, std::move(token)};
        std::optional<outcome<T>> shared = co_await joined;
        if (shared)
            co_return std::move(*shared);
        const context ctx{joined.call_token()};
        // guarded_call turns whatever the action throws into a failure, so the call always settles.
        co_return joined.finish(converted(co_await detail::guarded_call<A>{&action, ctx}));
    }

    // One shared call. `stop` and `key` are set once; `result` is written by the owner before it
    // settles and only read after; everything else is guarded by state::mutex.
    struct call {
        explicit call(const Key& k) : key(k) {}
        const Key key;
        std::stop_source stop;
        waiter* head = nullptr;   // attached callers (an intrusive list of their awaiters)
        std::size_t attached = 0; // callers that have not stopped, the owner included
        bool owner_attached = true;
        std::optional<outcome<T>> result; // empty once settled: the owner's frame was destroyed
    };

    struct state {
        state(single_flight_options o, Hash hash, KeyEqual equal)
            : options(std::move(o)), calls(0, std::move(hash), std::move(equal)) {}
        const single_flight_options options;
        std::mutex mutex;
        std::unordered_map<Key, std::shared_ptr<call>, Hash, KeyEqual> calls;
    };

    // The part of an attached caller's awaiter that the owner and stop callbacks see.
    struct waiter {
        std::coroutine_handle<> handle;
        detail::home_loop* loop = nullptr;
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
    // Frees the key of `c`, if `c` still holds it. Finding it runs the key's hash and equality, which
    // may throw; a call that stayed in the map would hold its key for good (its later callers would
    // attach to a call that never ends), so it is then found by address instead.
    static void erase_if_current(state& st, const call& c) noexcept {
        try {
            const auto it = st.calls.find(c.key);
            if (it != st.calls.end() && it->second.get() == &c)
                st.calls.erase(it);
            return;
        } catch (...) {
        }
        for (auto it = st.calls.begin(); it != st.calls.end(); ++it) {
            if (it->second.get() == &c) {
                st.calls.erase(it);
                return;
            }
        }
    }

    // Hands the waiter back to its coroutine. Nothing may touch `w` after the exchange: once
    // released, its frame may resume and end at any moment.
    static void release(waiter& w) { // posting may allocate
        const std::coroutine_handle<> h = w.handle;
        detail::home_loop* const loop = w.loop;
        if (w.phase.exchange(2, std::memory_order_acq_rel) != 1)
            return;
        if (loop)
            loop->post_resume(h);
        else
            detail::resume_homeless(h);
    }

    // The shared call is over (the owner has written `result`, or its frame is being destroyed):
    // free the key and release every attached caller. Says whether the owner had stopped, and
    // whether anybody else will read `result`.
    struct settled {
        bool owner_stopped;
        bool shared;
    };
    static settled settle(state& st, call& c) {
        waiter* list = nullptr;
        bool owner_stopped = false;
        {
            std::lock_guard lock(st.mutex);
            erase_if_current(st, c);
            list = std::exchange(c.head, nullptr);
            for (waiter* w = list; w; w = w->next)
                w->attached = false;
            c.attached = 0;
            owner_stopped = !std::exchange(c.owner_attached, false);
        }
        const settled s{owner_stopped, list != nullptr};
        while (list) {
            waiter* next = list->next;
            release(*list);
            list = next;
        }
        return s;
    }

    // One caller has just been detached (stopped, or its frame destroyed); the last one to go stops
    // the shared call and frees the key, so nobody attaches to a call being abandoned. Call under
    // st.mutex; the caller requests the stop once the lock is released, when this says so.
    static bool last_detached_locked(state& st, call& c) noexcept {
        if (c.attached != 0)
            return false;
        erase_if_current(st, c);
        return true;
    }

    // The owner's stop: it stays to run the call, but no longer counts as waiting for it.
    static void owner_stops(state& st, call& c) noexcept {
        bool last = false;
        {
            std::lock_guard lock(st.mutex);
            if (!c.owner_attached)
                return; // settled already
            c.owner_attached = false;
            --c.attached;
            last = last_detached_locked(st, c);
        }
        // The request may end the shared call, and the owner's frame that holds `c`, inline.
        if (last)
            detail::request_stop_held(c.stop);
    }

    // An attached caller's stop: it leaves at once.
    static void waiter_stops(state& st, waiter& w) {
        std::shared_ptr<call> c;
        bool last = false;
        {
            std::lock_guard lock(st.mutex);
            if (!w.attached)
                return; // settled already: the owner releases it
            c = w.owner;
            unlink(*c, w);
            w.cancelled = true;
            last = last_detached_locked(st, *c);
        }
        if (last)
            detail::request_stop_held(c->stop);
        release(w);
    }

    // An attached caller's frame destroyed while suspended: detach it without waking it.
    static void abandon(state& st, waiter& w) noexcept {
        std::shared_ptr<call> c;
        bool last = false;
        {
            std::lock_guard lock(st.mutex);
            if (!w.attached)
                return;
            c = w.owner;
            unlink(*c, w);
            last = last_detached_locked(st, *c);
        }
        if (last)
            detail::request_stop_held(c->stop);
    }

    class entry;
    struct on_stop {
        entry* e;
        void operator()() const { e->stopped(); }
    };

    // One caller's place in a call: owning it or attached to it. `co_await` attaches to the
    // key's call (completing with its outcome, or cancelled_error when `token` is stopped first),
    // or, when there is none, makes this caller the owner and completes at once with nothing: the
    // caller then runs the call and hands its result to `finish`. An owner whose call is stopped
    // already (every caller stopped while it joined: from a key function, or another thread)
    // completes with cancelled_error, the call settled and never started.
    class entry {
    public:
        entry(state& st, const Key& key, std::stop_token token) noexcept
            : st_(st), key_(key), token_(std::move(token)) {}
        entry(const entry&) = delete;
        entry& operator=(const entry&) = delete;

        // An owner's frame destroyed before its call ended (its event loop torn down): the key is
        // freed and the attached callers are woken, finding no result. An attached caller's frame
        // destroyed while it waits: it detaches without being woken.
        ~entry() {
            if (owns_) {
                if (finished_)
                    return;
                stop_cb_.reset();
                settle(st_, *w_.owner);
                detail::request_stop_held(w_.owner->stop); // for anything the call handed its token to
                return;
            }
            if (!suspended_)
                return;
            stop_cb_.reset();
            abandon(st_, w_);
        }

        bool await_ready() const noexcept { return false; }
        bool await_suspend(std::coroutine_handle<> h) {
            w_.handle = h;
            w_.loop = detail::home_loop::current();
            {
                std::lock_guard lock(st_.mutex);
                auto it = st_.calls.find(key_);
                if (it == st_.calls.end()) {
                    it = st_.calls.emplace(key_, std::make_shared<call>(key_)).first;
                    owns_ = true;
                    ++it->second->attached;
                    w_.owner = it->second;
                } else {
                    w_.owner = it->second;
                    link(*w_.owner, w_);
                }
            }
            // Registered here for both roles: a token stopped meanwhile fires at once, which for an
            // attached caller releases it before it suspends (then it does not suspend).
            if (token_.stop_possible())
                stop_cb_.emplace(token_, on_stop{this});
            if (owns_)
                return false;
            suspended_ = true; // before the exchange: once suspended, another thread may resume it
            const bool suspends = w_.phase.exchange(1, std::memory_order_acq_rel) != 2;
            if (!suspends)
                suspended_ = false;
            return suspends;
        }
        std::optional<outcome<T>> await_resume() {
            if (owns_) {
                if (call_token().stop_requested())
                    return finish(failure::make(cancelled_error{st_.options.name}));
                return std::nullopt;
            }
            suspended_ = false;
            stop_cb_.reset(); // waits for a callback running on another thread, so `w_` outlives it
            if (w_.cancelled || !w_.owner->result)
                return outcome<T>(failure::make(cancelled_error{st_.options.name}));
            return *w_.owner->result;
        }

        /// The owner's: the token to run the shared call with.
        std::stop_token call_token() const noexcept { return w_.owner->stop.get_token(); }

        /// The owner's: the shared call ended with `result`. Releases the attached callers and
        /// returns what the owner itself gets.
        outcome<T> finish(outcome<T> result) {
            stop_cb_.reset(); // waits for a callback running on another thread
            call& c = *w_.owner;
            // Written before settling, which publishes it to the callers it releases; nobody
            // writes it afterwards, so they copy it alongside the owner.
            c.result.emplace(std::move(result));
            const settled s = settle(st_, c);
            finished_ = true;
            if (s.owner_stopped)
                return failure::make(cancelled_error{st_.options.name});
            if (!s.shared)
                return std::move(*c.result);
            return *c.result;
        }

        /// The caller's token was stopped (from `on_stop`, on whichever thread stopped it).
        void stopped() {
            if (owns_)
                owner_stops(st_, *w_.owner);
            else
                waiter_stops(st_, w_);
        }

    private:
        state& st_;
        const Key& key_;
        std::stop_token token_;
        waiter w_{};
        std::optional<std::stop_callback<on_stop>> stop_cb_{};
        bool owns_ = false; // set before the stop callback is registered, never changed after
        bool suspended_ = false;
        bool finished_ = false;
    };

    // The action may produce anything convertible to T; the callers share a T.
    template <class R>
    static outcome<T> converted(outcome<R>&& r) {
        if constexpr (std::is_same_v<R, T>) {
            return std::move(r);
        } else {
            if (r.has_failure())
                return r.error();
            try {
                return outcome<T>(static_cast<T>(std::move(*r)));
            } catch (...) {
                return failure::current();
            }
        }
    }

    std::shared_ptr<state> state_;
};

/// `single_flight` as a policy: runs everything it wraps under one key, so
/// `rs::pipeline{flights.policy(key), rs::retry{}, rs::timeout{1s}}` shares the whole retried call
/// among concurrent callers of `key`. Satisfies `rs::policy`; the wrapped calls must produce `T`.
///
/// Semantics are those of `run`: the shared call is the owner's `next` (the rest of its pipeline
/// and its action), run in the owner's frame, so the action may reference the caller's locals as
/// with every other policy. The owner that stops gets `cancelled_error` when the shared call ends
/// (which is at once if nobody else waits: its stop then stops the shared call); an attached caller
/// that stops leaves at once. Holds a handle to the single_flight (kept alive by it) and a copy of
/// the key.
template <class Key, class T, class Hash, class KeyEqual>
class single_flight<Key, T, Hash, KeyEqual>::keyed_policy : public policy_base<keyed_policy> {
public:
    /// A call made on one copies it (a handle and a key), as a call made on a handle does.
    static constexpr bool copied_into_calls = true;

    keyed_policy(single_flight flight, Key key) : flight_(std::move(flight)), key_(std::move(key)) {}

    const Key& key() const noexcept { return key_; }

    template <class Next>
    task<detail::next_outcome_t<Next>> run(Next next, const context& ctx) const {
        static_assert(std::is_same_v<detail::next_value_t<Next>, T>,
                      "resilience::single_flight::keyed_policy: the wrapped call must produce exactly T");
        std::shared_ptr<state> st = flight_.state_;
        if (ctx.stop_token().stop_requested())
            co_return failure::make(cancelled_error{st->options.name});
        // Named: an owner goes on using it after the co_await, to settle the call.
        entry joined{*st, key_, ctx.stop_token()};
        std::optional<outcome<T>> shared = co_await joined;
        if (shared)
            co_return std::move(*shared);
        const context child = ctx.with_stop_token(joined.call_token());
        // Failures travel as values through `next`; what still escapes (say, no memory for a frame)
        // must settle the call too, so the attached callers get it rather than a cancellation.
        std::optional<outcome<T>> result;
        try {
            result.emplace(co_await next(child));
        } catch (...) {
            result.emplace(failure::current());
        }
        co_return joined.finish(std::move(*result));
    }

private:
    single_flight flight_;
    Key key_;
};

} // namespace resilience
