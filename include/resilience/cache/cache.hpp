// SPDX-License-Identifier: MIT
/// \file cache/cache.hpp
/// `cache`: a keyed result cache that is a policy. A fresh entry answers without calling; an
/// expired one is refreshed by one call that concurrent callers join (a `single_flight` per key),
/// and a stale value may answer meanwhile (stale-while-revalidate) or in place of a failed refresh
/// (stale-if-error), as HTTP's RFC 5861 lets a cache do. docs/cache.md has the whole story.
///
/// This file holds the handle, the refreshes it makes (in the caller's frame or in the background)
/// and the policy form. The options and their checks are in options.hpp, the state the copies share
/// and its call paths (arrive, finish, deliver) in state.hpp, the entry table in table.hpp.
#pragma once

#include "options.hpp"
#include "state.hpp"

#include "../clock.hpp"
#include "../context.hpp"
#include "../engine/action.hpp"
#include "../error.hpp"
#include "../event_loop.hpp"
#include "../outcome.hpp"
#include "../policy.hpp"
#include "../policy_kit.hpp"
#include "../single_flight.hpp"
#include "../stop_token.hpp"
#include "../task.hpp"
#include "../telemetry_event.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2 {

/// `ttl_of` says) and, optionally, the last failure (for `negative_ttl`); at most `max_entries`
/// keys, the least recently used evicted first. A caller of a key finds its entry in one of these
/// states (docs/cache.md, "The states of an entry"):
///
/// - **fresh**: the value answers at once, no call (`cache_hit`). A hit allocates nothing.
/// - **failure remembered** (negative caching): the failure answers at once (`cache_hit`, with its
///   `error`), or, while the value is within `stale_if_error` of its expiry, the stale value does
///   (`stale_served`, "stale_if_error").
/// - **stale, within `stale_while_revalidate`**: the value answers at once (`stale_served`,
///   "stale_while_revalidate"), and one refresh is started if none is in flight (see below).
/// - otherwise (**no entry, or expired**): the caller makes the call, or joins the refresh of its
///   key in flight (`cache_miss`), and gets its result. A refresh that fails while the old value
///   is within `stale_if_error` of its expiry answers every caller that waited with that value
///   instead (`stale_served`, "stale_if_error", with the failure as `error`); a cancellation never
///   does.
///
/// Refreshes are shared as `single_flight` shares calls, and with its rules: the first caller of a
/// key runs the call in its own frame and the others attach to it; a caller that stops leaves at
/// once with `cancelled_error` (the one running the call, when the call ends); the call is stopped
/// when every caller has stopped, and its result is then not stored. A refresh's value is stored
/// when it ends (replacing the old value and any failure remembered); a failure is remembered
/// beside the old value. A refresh in flight when `invalidate` or `clear` is called stores nothing.
///
/// **Who owns a stale-while-revalidate refresh.** With `run`, the caller that finds the entry
/// stale answers at once, so the refresh cannot run in its frame: it is spawned on that caller's
/// `event_loop` (as `loop.spawn` does), with the caller's action moved into it and a hold on the
/// cache's state. The loop owns it: its `run()` returns only after the refresh has ended, and
/// destroying the loop destroys the refresh, whose waiting callers are then woken with
/// `cancelled_error` (as `single_flight` wakes them when its owner is torn down). Nobody stops it:
/// it lasts as long as its action, so give the action a timeout. A background refresh that fails, the
/// key's own copy, hash or equality included, is a failed refresh: the stale value keeps answering,
/// and nothing escapes onto the loop. A caller outside any
/// `event_loop` (an Asio thread), and every caller through `policy(key)` (whose call, the rest of
/// its pipeline, cannot outlive it), refreshes in the foreground instead: it makes the call and
/// waits for it, while the other callers of the window get the stale value at once.
///
/// Lifetimes. The cache's state is held by every call from the moment it is made, and by every
/// refresh until it ends, so the last handle may go first (docs/core.md, "Lifetimes"). A call
/// that makes or joins a refresh keeps its action in its frame, as `single_flight::run` does, so
/// the action may reference the caller's locals, with one exception: with
/// `stale_while_revalidate`, the action of a `run` that starts a background refresh is moved into
/// that refresh and runs after the call has returned. Such an action must own what it uses:
///
///     co_await quotes.run(symbol, [client = client_](stop_token st) { return client->get(st); });
///                                                            // OK: owns its shared_ptr (on g++ 12,
///                                                            // build it in a statement first)
///     co_await quotes.run(symbol, [&](stop_token st) { return client.get(st); });
///                                                            // dangling once the call returns, if
///                                                            // it starts a background refresh
///
/// `reconfigure` gives this very cache new options while calls run, keeping its entries (see there,
/// and docs/cache.md, "Reconfiguring").
///
/// A cheap copyable handle: copies share the entries and the options. Thread-safe; `Hash`, `KeyEqual` and the copy
/// of a `Key` into the table run under the cache's lock, so they must not call the cache; nothing
/// else of the user's does (not `T`'s copies or destructor, not the callbacks, not the listener).
/// `Key` must be copyable, hashable and comparable; `T` copyable (each caller gets its own copy).
/// `C` is the clock that says what is fresh (a simulation's, in tests).
template <class Key, class T, clock C = steady_clock, class Hash = std::hash<Key>,
          class KeyEqual = std::equal_to<Key>>
class cache {
    static_assert(std::is_copy_constructible_v<Key>, "resilience::cache: Key must be copyable");
    static_assert(std::is_invocable_r_v<std::size_t, const Hash&, const Key&>,
                  "resilience::cache: Key must be hashable (specialize std::hash<Key> or pass a Hash)");
    static_assert(std::is_invocable_r_v<bool, const KeyEqual&, const Key&, const Key&>,
                  "resilience::cache: Key must be equality-comparable (operator== or a KeyEqual)");
    static_assert(!std::is_reference_v<T> && !std::is_void_v<T>,
                  "resilience::cache: T must be a value type (a cache of void keeps nothing)");
    static_assert(std::is_copy_constructible_v<T>,
                  "resilience::cache: T must be copyable: every caller receives its own copy");

    // The state the copies share (state.hpp), and its names for what a call reads and makes.
    using state = detail::cache_state<Key, T, C, Hash, KeyEqual>;
    using refresh = typename state::refresh;
    using flights = typename state::flights;
    using config = typename state::config; // the options, as a call reads them
    using route = typename state::route;
    using arrival = typename state::arrival;

public:
    class keyed_policy;
    using clock_type = C;

    /// The default options (a minute of freshness, 1024 entries, no stale windows).
    cache()
    requires std::default_initializable<C> && std::default_initializable<Hash> &&
             std::default_initializable<KeyEqual>
        : cache(cache_options<T>{}) {}
    explicit cache(cache_options<T> options, C clock = C{}, Hash hash = Hash{}, KeyEqual equal = KeyEqual{})
        : state_(std::make_shared<state>(detail::validated_cache_options<T>(std::move(options)),
                                         std::move(clock), std::move(hash), std::move(equal))) {}

    /// A copy of the options in force: the constructor's or the latest `reconfigure`'s.
    [[nodiscard]] cache_options<T> options() const { return state_->pin()->options; }
    /// The name given in the options in force (empty by default).
    [[nodiscard]] std::string name() const { return state_->pin()->options.name; }

    /// Puts `options` in force for the calls made from now on, through every copy of this handle
    /// and every `policy(key)` made from one. Checks `options` exactly as the constructor does
    /// (`std::invalid_argument` naming the field and the value); on failure nothing changes.
    /// Thread-safe against calls and other reconfigurations. What carries over (docs/cache.md,
    /// "Reconfiguring"):
    ///
    /// - The entries stay, with their values, their remembered failures and their recently-used
    ///   order. Each value keeps the expiry it was stored with: a new `ttl` or `ttl_of` applies to
    ///   the values stored by refreshes that start from now on.
    /// - A smaller `max_entries` evicts the least recently used entries down to it at once (their
    ///   values are destroyed after `reconfigure` releases the cache's lock). An entry with a
    ///   refresh in flight is evicted like any other, as a new entry would evict it: the refresh
    ///   still answers its callers and stores its result when it ends, evicting the least recently
    ///   used entry if the cache is full.
    /// - The stale windows and `negative_ttl` judge the lookups made from now on, against the
    ///   instants the entries hold: a value stays usable until its expiry plus the lookup's window;
    ///   a failure is answered until the instant it was remembered plus the lookup's `negative_ttl`
    ///   (zero: remembered failures answer no more).
    /// - A call in flight finishes under the options it started with: its name (in its errors and
    ///   events), its listener, and the refresh it makes, which stores by them (`ttl`, `ttl_of`,
    ///   `should_handle`, `negative_ttl`) and decides by their `stale_if_error` whether a stale value
    ///   answers its failure, once for every caller that waited for it. A background refresh
    ///   finishes under the options of the caller that started it. Refreshes in flight stay joinable.
    ///   A call through `policy(key)` that its `enter` sends on to `run` (to refresh) reads the
    ///   options again there, where it starts over: `enter` answered nothing.
    ///
    /// Memory: the options replaced are freed once no call or refresh that started under them is
    /// still running. Options the same as those in force (the same values, classifier and listener
    /// copies of those in force, and no `ttl_of`, which cannot be compared) change nothing and
    /// allocate nothing.
    ///
    ///     quotes.reconfigure({.ttl = 30s, .stale_if_error = 10min, .max_entries = 500});
    void reconfigure(cache_options<T> options) const {
        state_->reconfigure(detail::validated_cache_options<T>(std::move(options)));
    }

    /// The value of `key`: from its entry, or from a call of `action` (made, or joined while a
    /// refresh of `key` is in flight), as the class comment says. Rethrows the failure the call
    /// ended with (the same exception object for every caller of one refresh) or the one
    /// remembered. The action is called like a policy's action (with a `context`, a
    /// `stop_token` or nothing) and must produce something convertible to `T`. When `token`
    /// is stopped this caller gets `cancelled_error` (at once if it waits for a refresh, when the
    /// call ends if it makes it).
    template <class A>
    task<T> run(Key key, A action, stop_token token = {}) const {
        static_assert(std::is_convertible_v<detail::action_result_t<A>, T>,
                      "resilience::cache: the action's result must convert to T");
        return run_with(state_, std::move(key), std::move(action), std::move(token));
    }
    /// Like `run`, but reports the failure (including this caller's cancellation) as a value.
    template <class A>
    task<outcome<T>> run_outcome(Key key, A action, stop_token token = {}) const {
        static_assert(std::is_convertible_v<detail::action_result_t<A>, T>,
                      "resilience::cache: the action's result must convert to T");
        return run_outcome_with(state_, std::move(key), std::move(action), std::move(token));
    }

    /// A policy that caches everything it wraps under `key`: `rs::pipeline{cache.policy(key),
    /// rs::retry{}, rs::timeout{1s}}` answers from the entry, or refreshes it with one retried,
    /// timed call shared by the callers of `key`. Build one per call (a handle and a key: cheap).
    keyed_policy policy(Key key) const { return keyed_policy{*this, std::move(key)}; }

    /// Entries stored, whatever their state.
    [[nodiscard]] std::size_t size() const { return state_->size(); }
    /// Keys with a refresh in flight that callers may join (a background refresh counts from
    /// when it starts, at the next turn of its loop).
    [[nodiscard]] std::size_t in_flight() const { return state_->refreshes.in_flight(); }
    /// Forgets `key`'s entry. A refresh of any key in flight now stores nothing when it ends.
    void invalidate(const Key& key) const { state_->invalidate(key); }
    /// Forgets every entry. A refresh in flight now stores nothing when it ends.
    void clear() const { state_->clear(); }

private:
    // The call of the action that a refresh makes, in the frame of the caller (or background
    // refresh) that owns the shared call.
    template <class A>
    struct refresh_action {
        state* st;
        const config* cfg; // the options of the call that makes the refresh
        const Key* key;
        A* action;
        task<refresh> operator()(const context& ctx) const {
            return refresh_by_action(*st, *cfg, *key, *action, ctx);
        }
    };
    template <class A>
    static task<refresh> refresh_by_action(state& st, const config& cfg, const Key& key, A& action,
                                           const context& ctx) {
        const std::uint64_t began = st.current_epoch();
        outcome<T> r = detail::converted_outcome<T>(co_await detail::guarded_call<A>{&action, ctx});
        if (ctx.stop_requested()) // every caller stopped: nobody waits, and a late value is not stored
            co_return refresh{std::move(r)};
        co_return st.finish(cfg, key, began, std::move(r));
    }

    // A background refresh's mark on its key (`cache_state::background_`), from its spawning to the end of
    // its frame, whether it ran or its loop destroyed it unstarted: a parameter of its coroutine. The
    // key it refreshes is the one in the mark.
    class background_mark {
    public:
        background_mark(std::shared_ptr<state> st, std::size_t hash, const Key* key) noexcept
            : st_(std::move(st)), hash_(hash), key_(key) {}
        background_mark(background_mark&& o) noexcept : st_(std::move(o.st_)), hash_(o.hash_), key_(o.key_) {}
        background_mark& operator=(background_mark&&) = delete;
        ~background_mark() {
            if (st_)
                st_->end_background(hash_, key_);
        }
        state& held() const noexcept { return *st_; }
        const Key& key() const noexcept { return *key_; }

    private:
        std::shared_ptr<state> st_;
        std::size_t hash_;
        const Key* key_;
    };
    // Finishes under `cfg`, the options of the caller that started it, which it pins. Whatever
    // fails, the key's own copy, hash or equality included, is a failed refresh, as its action's
    // failure is: the callers that joined it get the failure, the stale value keeps answering, and
    // nothing escapes onto the loop (whose `run` would throw it).
    template <class A>
    static task<void> background_refresh(background_mark mark, detail::pinned<config> cfg, A action) {
        state& st = mark.held();
        try {
            (void)co_await st.refreshes.run_outcome(mark.key(),
                                                    refresh_action<A>{&st, cfg.get(), &mark.key(), &action});
        } catch (...) {
        }
    }

    template <class A>
    static task<T> run_with(std::shared_ptr<state> st, Key key, A action, stop_token token) {
        outcome<T> r =
            co_await run_outcome_with(std::move(st), std::move(key), std::move(action), std::move(token));
        co_return std::move(r).value();
    }
    template <class A>
    static task<outcome<T>> run_outcome_with(std::shared_ptr<state> st, Key key, A action, stop_token token) {
        // The options this call runs under to its end, pinned once (see `reconfigure`).
        const detail::pinned<config> pin = st->pin();
        const config& cfg = *pin;
        if (token.stop_requested())
            co_return failure::make(cancelled_error{cfg.options.name});
        event_loop* const loop = event_loop::current();
        const detail::listener_ref heard = state::own_listener(cfg);
        arrival a = st->arrive(cfg, key, st->clock.now(), heard, 1, loop != nullptr);
        if (a.how == route::background) {
            background_mark mark{st, a.mark_hash, a.marked};
            try {
                loop->spawn(background_refresh(std::move(mark), pin.share(), std::move(action)));
            } catch (...) { // no memory to start it: the mark goes with it, a later caller tries again
            }
        }
        if (a.how != route::refresh)
            co_return std::move(*a.answer);
        outcome<refresh> shared = co_await st->refreshes.run_outcome(
            key, refresh_action<A>{st.get(), &cfg, &key, &action}, std::move(token));
        co_return st->deliver(cfg, std::move(shared), heard, 1);
    }

    std::shared_ptr<state> state_;
};

/// `cache` as a policy: caches everything it wraps under one key, so
/// `rs::pipeline{quotes.policy(symbol), rs::retry{}, rs::timeout{1s}}` answers from the entry, or
/// refreshes it with one retried, timed call that the callers of `symbol` share. Satisfies
/// `rs::policy`; the wrapped calls must produce exactly `T`.
///
/// The answers that need no waiting (fresh, failure remembered, stale) are given in `enter`, in
/// the pipeline's frame: no frame of its own, no allocation. A caller that must refresh goes on in
/// `run`, where the refresh is its `next` (the rest of its pipeline and its action) run in its
/// frame, shared as `single_flight::keyed_policy` shares it. Within `stale_while_revalidate` the
/// refresh runs in the foreground: the first caller of the window makes it and waits for it, and
/// the others get the stale value at once (a `next` cannot outlive its call, so nothing runs in
/// the background). Holds a handle to the cache (kept alive by it) and a copy of the key.
template <class Key, class T, clock C, class Hash, class KeyEqual>
class cache<Key, T, C, Hash, KeyEqual>::keyed_policy : public policy_base<keyed_policy> {
public:
    /// A call made on one copies it (a handle and a key), as a call made on a handle does.
    static constexpr bool copied_into_calls = true;

    keyed_policy(cache c, Key key) : cache_(std::move(c)), key_(std::move(key)) {}

    const Key& key() const noexcept { return key_; }

    // ---- the policy protocol (policy.hpp) ----
    struct call_state {};

    template <class R>
    step enter(call_state&, const context& ctx, std::optional<outcome<R>>& result) const {
        static_assert(std::is_same_v<R, T>,
                      "resilience::cache::keyed_policy: the wrapped call must produce exactly T");
        state& st = *cache_.state_;
        // Pinned for `enter` only: a call that waits pins the options again in `run`.
        const detail::pinned<config> pin = st.pin();
        const config& cfg = *pin;
        if (ctx.stop_requested())
            return kit::cancel(result, cfg.options.name);
        arrival a = st.arrive(cfg, key_, kit::call_now(st.clock, ctx),
                              kit::listener_for(cfg.options.telemetry, ctx), ctx.attempt(), false, false);
        if (a.how == route::refresh)
            return step::wait;
        result.emplace(std::move(*a.answer));
        return step::done;
    }
    template <class R>
    step leave(call_state&, const context&, outcome<R>&) const noexcept {
        return step::proceed; // never reached: `enter` answers or waits
    }

    template <class Next>
    task<detail::next_outcome_t<Next>> run(Next next, const context& ctx) const {
        static_assert(std::is_same_v<detail::next_value_t<Next>, T>,
                      "resilience::cache::keyed_policy: the wrapped call must produce exactly T");
        const std::shared_ptr<state> st = cache_.state_;
        // The options this call runs under to its end (its `enter` answered nothing).
        const detail::pinned<config> pin = st->pin();
        const config& cfg = *pin;
        if (ctx.stop_requested())
            co_return failure::make(cancelled_error{cfg.options.name});
        const kit::listener heard = kit::listener_for(cfg.options.telemetry, ctx);
        arrival a = st->arrive(cfg, key_, kit::call_now(st->clock, ctx), heard, ctx.attempt(), false);
        if (a.how != route::refresh)
            co_return std::move(*a.answer);
        const typename flights::keyed_policy shared_call = st->refreshes.policy(key_);
        outcome<refresh> shared =
            co_await shared_call.run(refresh_next<Next>{st.get(), &cfg, &key_, &next}, ctx);
        co_return st->deliver(cfg, std::move(shared), heard, ctx.attempt());
    }

private:
    template <class Next>
    struct refresh_next {
        state* st;
        const config* cfg; // the options of the call that makes the refresh
        const Key* key;
        Next* next;
        task<outcome<refresh>> operator()(const context& ctx) const {
            return refresh_by_next(*st, *cfg, *key, *next, ctx);
        }
    };
    template <class Next>
    static task<outcome<refresh>> refresh_by_next(state& st, const config& cfg, const Key& key, Next& next,
                                                  const context& ctx) {
        const std::uint64_t began = st.current_epoch();
        outcome<T> r = co_await next(ctx);
        if (ctx.stop_requested()) // every caller stopped: nobody waits, and a late value is not stored
            co_return outcome<refresh>{refresh{std::move(r)}};
        co_return outcome<refresh>{st.finish(cfg, key, began, std::move(r))};
    }

    cache cache_;
    Key key_;
};

} // namespace resilience
