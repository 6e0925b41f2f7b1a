// SPDX-License-Identifier: MIT
/// \file single_flight/single_flight.hpp
/// `single_flight`: concurrent calls with the same key share one call of the action and its result.
///
/// Locking: the one mutex is `single_flight_state::mutex` (single_flight/state.hpp, which says what
/// it guards and which functions run with it held); `in_flight()` and `contains()` take it
/// themselves.
#pragma once

#include "../context.hpp"
#include "../error.hpp"
#include "../outcome.hpp"
#include "../policy.hpp"
#include "../stop_token.hpp"
#include "../task.hpp"
#include "options.hpp"
#include "state.hpp"

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2 {

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
///   while the action or a callback runs; the key's `Hash`, `KeyEqual` and copy constructor do run
///   under the lock (they find and keep the key), so they must not call back into this single_flight.
///
/// Lifetimes. The action lives in the owner's frame and is awaited there, and the owner returns
/// only after the shared call has ended, so the action may reference the caller's locals exactly
/// as with `execute`:
///
///     int limit = 10;
///     co_await flights.run(key, [&](stop_token st) { return fetch(limit, st); });  // OK
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

    using state = detail::single_flight_state<Key, T, Hash, KeyEqual>;
    using entry = typename state::entry;

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
    /// called like a policy's action (with a `context`, a `stop_token`, or nothing), in the
    /// frame of the caller that owns the call, and gets the shared call's stop token, stopped only
    /// when every caller has stopped. When `token` is stopped this caller gets `cancelled_error`:
    /// at once if it is attached, when the shared call ends if it owns it.
    template <class A>
    task<T> run(Key key, A action, stop_token token = {}) const {
        return run_with(state_, std::move(key), std::move(action), std::move(token));
    }

    /// Like `run`, but reports the failure (including this caller's cancellation) as a value.
    template <class A>
    task<outcome<T>> run_outcome(Key key, A action, stop_token token = {}) const {
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
    static task<T> run_with(std::shared_ptr<state> st, Key key, A action, stop_token token) {
        outcome<T> result =
            co_await run_outcome_with(std::move(st), std::move(key), std::move(action), std::move(token));
        if constexpr (std::is_void_v<T>)
            std::move(result).value();
        else
            co_return std::move(result).value();
    }
    template <class A>
    static task<outcome<T>> run_outcome_with(std::shared_ptr<state> st, Key key, A action, stop_token token) {
        if (token.stop_requested())
            co_return failure::make(cancelled_error{st->options.name});
        // Named: an owner goes on using it after the co_await, to settle the call.
        entry joined{*st, key, std::move(token)};
        std::optional<outcome<T>> shared = co_await joined;
        if (shared)
            co_return std::move(*shared);
        const context ctx{joined.call_token()};
        // guarded_call turns whatever the action throws into a failure, so the call always settles.
        // The action may produce anything convertible to T; the callers share a T.
        co_return joined.finish(detail::converted_outcome<T>(co_await detail::guarded_call<A>{&action, ctx}));
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
