// SPDX-License-Identifier: MIT
/// \file single_flight/state.hpp
/// `detail::single_flight_state`: what the copies of a `single_flight` share (its options and the
/// calls in flight, by key), and how a caller owns a call or attaches to one (`entry`); the policy
/// is single_flight/single_flight.hpp.
///
/// Locking: `single_flight_state::mutex` guards `calls` (the map of keys to their calls), in each
/// `call` its list of attached callers (`waiting`), `attached` and `owner_attached`, and in each
/// `waiter` its links (`prev`, `next`), `attached` and `cancelled`. The functions named `..._locked`
/// (`link_locked`, `unlink_locked`, `erase_if_current_locked`, `last_detached_locked`) are called
/// with it held; `settle`, `owner_stops`, `waiter_stops`, `abandon` and `entry::await_suspend` take
/// it themselves, and release it before they resume a caller or request a stop. What is read
/// without it says so where it is declared (`call::result`, `waiter::cancelled`, `waiter::phase`).
#pragma once

#include "../context.hpp"
#include "../detail/home_loop.hpp"
#include "../detail/intrusive_list.hpp"
#include "../error.hpp"
#include "../outcome.hpp"
#include "../stop_token.hpp"
#include "options.hpp"

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

namespace resilience::inline v0_2::detail {

/// What the copies of a `single_flight<Key, T, Hash, KeyEqual>` share, held by each handle and by
/// each call (`std::shared_ptr`): the options, and one shared call per key in flight.
template <class Key, class T, class Hash, class KeyEqual>
struct single_flight_state {
    struct call;
    struct waiter;
    class entry;

    single_flight_state(single_flight_options o, Hash hash, KeyEqual equal)
        : options(std::move(o)), calls(0, std::move(hash), std::move(equal)) {}
    const single_flight_options options;
    std::mutex mutex;
    std::unordered_map<Key, std::shared_ptr<call>, Hash, KeyEqual> calls; // guarded by `mutex`

    // One shared call. `stop` and `key` are set once; `result` is written by the owner before it
    // settles and only read after; everything else is guarded by `mutex`.
    struct call {
        explicit call(const Key& k) : key(k) {}
        const Key key;
        stop_source stop;
        intrusive_list<waiter> waiting; // the attached callers' awaiters
        std::size_t attached = 0;       // callers that have not stopped, the owner included
        bool owner_attached = true;
        std::optional<outcome<T>> result; // empty once settled: the owner's frame was destroyed
    };

    // The part of an attached caller's awaiter that the owner and stop callbacks see.
    struct waiter {
        std::coroutine_handle<> handle;
        home_loop* loop = nullptr;
        std::shared_ptr<call> owner; // keeps the result readable until this caller has copied it
        waiter* prev = nullptr;      // guarded by `mutex`, as is `next`
        waiter* next = nullptr;
        bool attached = false;  // guarded by `mutex`
        bool cancelled = false; // guarded by `mutex`; read without it after release
        // Whoever releases the waiter while its await_suspend is still running must not resume it
        // (await_suspend then declines to suspend): 0 registering, 1 suspended, 2 released.
        std::atomic<int> phase{0};
    };

    static void link_locked(call& c, waiter& w) noexcept {
        c.waiting.push_front(w);
        w.attached = true;
        ++c.attached;
    }
    static void unlink_locked(call& c, waiter& w) noexcept {
        c.waiting.erase(w);
        w.attached = false;
        --c.attached;
    }
    // Frees the key of `c`, if `c` still holds it. Finding it runs the key's hash and equality, which
    // may throw; a call that stayed in the map would hold its key for good (its later callers would
    // attach to a call that never ends), so it is then found by address instead.
    void erase_if_current_locked(const call& c) noexcept {
        try {
            const auto it = calls.find(c.key);
            if (it != calls.end() && it->second.get() == &c)
                calls.erase(it);
            return;
        } catch (...) {
        }
        for (auto it = calls.begin(); it != calls.end(); ++it) {
            if (it->second.get() == &c) {
                calls.erase(it);
                return;
            }
        }
    }

    // Hands the waiter back to its coroutine. Nothing may touch `w` after the exchange: once
    // released, its frame may resume and end at any moment.
    static void release(waiter& w) { // posting may allocate
        const std::coroutine_handle<> h = w.handle;
        home_loop* const loop = w.loop;
        if (w.phase.exchange(2, std::memory_order_acq_rel) != 1)
            return;
        if (loop)
            loop->post_resume(h);
        else
            resume_homeless(h);
    }

    // The shared call is over (the owner has written `result`, or its frame is being destroyed):
    // free the key and release every attached caller. Says whether the owner had stopped, and
    // whether anybody else will read `result`.
    struct settled {
        bool owner_stopped;
        bool shared;
    };
    settled settle(call& c) {
        waiter* list = nullptr;
        bool owner_stopped = false;
        {
            std::lock_guard lock(mutex);
            erase_if_current_locked(c);
            list = c.waiting.take_all();
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
    // `mutex`; the caller requests the stop once the lock is released, when this says so.
    bool last_detached_locked(call& c) noexcept {
        if (c.attached != 0)
            return false;
        erase_if_current_locked(c);
        return true;
    }

    // The owner's stop: it stays to run the call, but no longer counts as waiting for it.
    void owner_stops(call& c) noexcept {
        bool last = false;
        {
            std::lock_guard lock(mutex);
            if (!c.owner_attached)
                return; // settled already
            c.owner_attached = false;
            --c.attached;
            last = last_detached_locked(c);
        }
        // The request may end the shared call, and the owner's frame that holds `c`, inline.
        if (last)
            request_stop_held(c.stop);
    }

    // An attached caller's stop: it leaves at once.
    void waiter_stops(waiter& w) {
        std::shared_ptr<call> c;
        bool last = false;
        {
            std::lock_guard lock(mutex);
            if (!w.attached)
                return; // settled already: the owner releases it
            c = w.owner;
            unlink_locked(*c, w);
            w.cancelled = true;
            last = last_detached_locked(*c);
        }
        if (last)
            request_stop_held(c->stop);
        release(w);
    }

    // An attached caller's frame destroyed while suspended: detach it without waking it.
    void abandon(waiter& w) noexcept {
        std::shared_ptr<call> c;
        bool last = false;
        {
            std::lock_guard lock(mutex);
            if (!w.attached)
                return;
            c = w.owner;
            unlink_locked(*c, w);
            last = last_detached_locked(*c);
        }
        if (last)
            request_stop_held(c->stop);
    }

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
        entry(single_flight_state& st, const Key& key, stop_token token) noexcept
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
                st_.settle(*w_.owner);
                request_stop_held(w_.owner->stop); // for anything the call handed its token to
                return;
            }
            if (!suspended_)
                return;
            stop_cb_.reset();
            st_.abandon(w_);
        }

        bool await_ready() const noexcept { return false; }
        bool await_suspend(std::coroutine_handle<> h) {
            w_.handle = h;
            w_.loop = home_loop::current();
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
                    link_locked(*w_.owner, w_);
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
        stop_token call_token() const noexcept { return w_.owner->stop.get_token(); }

        /// The owner's: the shared call ended with `result`. Releases the attached callers and
        /// returns what the owner itself gets.
        outcome<T> finish(outcome<T> result) {
            stop_cb_.reset(); // waits for a callback running on another thread
            call& c = *w_.owner;
            // Written before settling, which publishes it to the callers it releases; nobody
            // writes it afterwards, so they copy it alongside the owner.
            c.result.emplace(std::move(result));
            const settled s = st_.settle(c);
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
                st_.owner_stops(*w_.owner);
            else
                st_.waiter_stops(w_);
        }

    private:
        single_flight_state& st_;
        const Key& key_;
        stop_token token_;
        waiter w_{};
        std::optional<stop_callback<on_stop>> stop_cb_{};
        bool owns_ = false; // set before the stop callback is registered, never changed after
        bool suspended_ = false;
        bool finished_ = false;
    };
};

} // namespace resilience::detail
