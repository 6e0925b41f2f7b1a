// SPDX-License-Identifier: MIT
/// \file detail/shared_handle.hpp
/// What every handle to shared state is made of: a state that counts its holds, and
/// `shared_handle<Derived, State>`, the base of the handles (a breaker, a bulkhead, a limiter, a
/// throttle, a retry budget, a single_flight, an any_policy), which holds one of them.
///
/// The lifetime rule of the library (docs/core.md, "Lifetimes"): a call keeps alive every piece of
/// shared state it touches until it has ended, and the destruction of a call, resumed or not,
/// touches nothing else. Holds are how it keeps a state alive. Every handle is one hold. A call
/// takes more only where it would otherwise touch a state no handle keeps alive:
/// - a call made on a handle (`breaker.execute(f)`) copies the handle into its frame, from the
///   moment it is made (the task is lazy) until its frame is destroyed;
/// - a call made through a pipeline refers to the pipeline's handles, which it needs anyway as long
///   as it is still to be resumed (a pipeline is configuration); what it needs beyond that, for
///   being destroyed without being resumed, it holds: a bulkhead's slot (the slot count is the hold,
///   see `bulkhead_state`), a half-open breaker's probe, a place in a queue (while waiting).
/// So the fast paths of a call through a pipeline touch no count of their own.
#pragma once

#include <atomic>
#include <cassert>
#include <cstddef>
#include <functional>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2::detail {

class shared_state;
template <class State>
void add_hold(State& s, bool call = false) noexcept;
template <class State>
void drop_hold(State& s, bool call = false) noexcept;

/// The base of a shared state: the count of its holds (its handles and the calls holding it), one
/// at construction, given to the first handle. When the last hold goes, the state is deleted, or,
/// for a state with `bool last_hold_dropped() noexcept`, retired: that function says whether it
/// may be deleted now (true), or whether the calls it still counts another way will delete it
/// themselves (false; see `bulkhead_state`).
class shared_state {
public:
    shared_state() noexcept = default;
    shared_state(const shared_state&) = delete;
    shared_state& operator=(const shared_state&) = delete;

#ifndef NDEBUG
    // The second line behind the holds: a state never dies while a call still holds it.
    ~shared_state() { assert(call_holds_.load(std::memory_order_relaxed) == 0); }
#endif

private:
    template <class State>
    friend void add_hold(State&, bool) noexcept;
    template <class State>
    friend void drop_hold(State&, bool) noexcept;

    // On a cache line it shares only with the state's first members: a state puts there the words
    // its calls write anyway (a bulkhead's slots, a token bucket's), or nothing (a breaker, whose
    // calls only read it), so that calls made on handles, which count, make no other line bounce.
    alignas(64) std::atomic<std::size_t> holds_{1};
#ifndef NDEBUG
    std::atomic<std::size_t> call_holds_{0}; // the holds of calls among `holds_`
#endif
};

/// Deletes `s`, whose last hold just went (or, for a retiring state, whose last counted call did).
/// The operation that found it so must be acquire-release, so that every holder's writes happen
/// before (an acquire fence would do on most machines, but ThreadSanitizer does not see fences).
template <class State>
void delete_state(State* s) noexcept {
    delete s;
}

/// Takes a hold on `s`, which must already be held (by the caller's handle, or its call).
/// `call`: the hold is a call's, counted as such in debug builds.
template <class State>
void add_hold(State& s, bool call) noexcept {
    static_assert(std::is_base_of_v<shared_state, State>);
    s.holds_.fetch_add(1, std::memory_order_relaxed);
#ifndef NDEBUG
    if (call)
        s.call_holds_.fetch_add(1, std::memory_order_relaxed);
#else
    (void)call;
#endif
}

/// Gives back a hold on `s`; the last one deletes (or retires) it.
template <class State>
void drop_hold(State& s, bool call) noexcept {
#ifndef NDEBUG
    if (call)
        s.call_holds_.fetch_sub(1, std::memory_order_relaxed);
#else
    (void)call;
#endif
    if (s.holds_.fetch_sub(1, std::memory_order_acq_rel) != 1)
        return;
    if constexpr (requires { s.last_hold_dropped(); }) {
        if (!s.last_hold_dropped())
            return;
    }
    delete_state(&s);
}

/// A call's hold on a state: taken by `take` (or at construction), given back by the destructor.
/// Move-only. Declared before whatever in the call touches the state on its way out, so that it is
/// given back last.
template <class State>
class state_hold {
public:
    state_hold() noexcept = default;
    explicit state_hold(State& s) noexcept { take(s); }
    state_hold(state_hold&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
    state_hold& operator=(state_hold&& o) noexcept {
        if (this != &o) {
            reset();
            s_ = std::exchange(o.s_, nullptr);
        }
        return *this;
    }
    ~state_hold() { reset(); }

    void take(State& s) noexcept {
        reset();
        add_hold(s, true);
        s_ = &s;
    }
    void reset() noexcept {
        if (State* s = std::exchange(s_, nullptr))
            drop_hold(*s, true);
    }
    State* get() const noexcept { return s_; }

private:
    State* s_ = nullptr;
};

/// Marks the handles: `shared_handle` derives from it, and `std::hash` is defined for them all.
struct shared_handle_tag {};

/// The base of a handle to shared state. Holds the state (one hold per handle: copying a handle is
/// one atomic increment, destroying one a decrement), compares handles by the state they share,
/// and hashes them alike (`std::hash<Derived>`, below). A moved-from handle holds nothing; it may
/// be assigned to or destroyed, not used.
template <class Derived, class State>
class shared_handle : public shared_handle_tag {
public:
    shared_handle(const shared_handle& o) noexcept : state_(o.state_) {
        if (state_)
            add_hold(*state_);
    }
    shared_handle(shared_handle&& o) noexcept : state_(std::exchange(o.state_, nullptr)) {}
    shared_handle& operator=(const shared_handle& o) noexcept {
        shared_handle copy(o);
        std::swap(state_, copy.state_);
        return *this;
    }
    shared_handle& operator=(shared_handle&& o) noexcept {
        shared_handle taken(std::move(o));
        std::swap(state_, taken.state_);
        return *this;
    }
    ~shared_handle() {
        if (state_)
            drop_hold(*state_);
    }

    /// Handles are equal when they share one state: copies of one handle are the same policy.
    friend bool operator==(const Derived& a, const Derived& b) noexcept {
        return static_cast<const shared_handle&>(a).state_ == static_cast<const shared_handle&>(b).state_;
    }

protected:
    /// Takes over the hold of a state just made (`new State(...)`).
    explicit shared_handle(State* adopted) noexcept : state_(adopted) {}
    template <class... Args>
    static State* make_state(Args&&... args) {
        return new State(std::forward<Args>(args)...);
    }

    State& held() const noexcept { return *state_; }

private:
    friend struct handle_access;
    State* state_;
};

/// What `std::hash` looks at: the state's address.
struct handle_access {
    template <class Derived, class State>
    static const void* address(const shared_handle<Derived, State>& h) noexcept {
        return h.state_;
    }
};

/// Whether `P` is a handle to shared state: a call made on one copies it (see the file comment).
template <class P>
inline constexpr bool is_shared_handle = std::is_base_of_v<shared_handle_tag, P>;

} // namespace resilience::detail

/// Hashes a handle by the state its copies share, consistently with `==`.
template <class H>
requires resilience::detail::is_shared_handle<H>
struct std::hash<H> {
    std::size_t operator()(const H& h) const noexcept {
        return std::hash<const void*>{}(resilience::detail::handle_access::address(h));
    }
};
