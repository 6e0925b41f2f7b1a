// SPDX-License-Identifier: MIT
/// \file stop_token.hpp
/// The library's own stop token: `rs::stop_source`, `rs::stop_token` and `rs::stop_callback`, with
/// the interface of `std::stop_source`, `std::stop_token` and `std::stop_callback`.
///
/// Why not the standard ones: libc++ has no `<stop_token>` before 17 and hides it behind
/// `-fexperimental-library` until 20, so a core built on it does not build with Xcode's Apple Clang.
/// This one needs only `<atomic>` and `<thread>`, and its stop state comes from the library's
/// per-thread frame cache, so a steady stream of calls that each need a source reuses earlier
/// states instead of calling `malloc` (a `std::stop_source` allocates its state every time).
///
/// The state is shared, as the standard's is: a source or token copy keeps it alive. The library
/// relies on that where a stop request may end the call that owns the source (a callback that
/// resumes an awaiting coroutine): it requests through a copy it holds, so the request never runs
/// on a freed state (`detail::request_stop_held`).
///
/// Where the standard library has `std::stop_token` (`RESILIENCE_HAS_STD_STOP_TOKEN`), the edges
/// still take it: a caller's `std::stop_token` passed to `execute` stops the call (`from_std`), and
/// an action written to take a `std::stop_token` gets one that the call's token stops. That bridge
/// costs those actions a `std::stop_source`; actions that take `rs::stop_token`, a context or
/// nothing pay nothing for it.
///
/// Locking: each stop state has one spin lock, bit `locked_bit` of `word_`. It guards the list of
/// registered callbacks (`head_` and every listed node's `next`/`prev`) and `requester_`. The
/// `requested_bit` of the same word and the counts are atomics read without it.
#pragma once

#include <resilience/detail/frame_allocator.hpp>

#include <atomic>
#include <concepts>
#include <cstdint>
#include <functional>
#include <new>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>
#include <version>

#if defined(__cpp_lib_jthread)
#include <stop_token>
#define RESILIENCE_HAS_STD_STOP_TOKEN 1
#else
#define RESILIENCE_HAS_STD_STOP_TOKEN 0
#endif

namespace resilience::inline v0_2 {

/// Tag for a `stop_source` made without a state (one that can never stop).
struct nostopstate_t {
    explicit nostopstate_t() = default;
};
inline constexpr nostopstate_t nostopstate{};

class stop_token;
class stop_source;
template <class F>
class stop_callback;

namespace detail {

/// A registered callback, as the stop state sees it.
struct stop_callback_node {
    using run_fn = void (*)(stop_callback_node*) noexcept;
    explicit stop_callback_node(run_fn f) noexcept : run(f) {}

    run_fn run;
    stop_callback_node* next = nullptr;
    stop_callback_node** prev = nullptr; // the link pointing here while listed; null otherwise
    bool* destroyed = nullptr;           // while it runs: set by its own destructor, run inside it
    std::atomic<bool> finished{false};   // its run is over, or it will never run
};

/// A stop state: the request flag, the callbacks to run on a request, and the counts of the
/// references (sources and tokens) and of the sources alone (a state without sources and not
/// stopped can never stop).
class stop_state {
public:
    using destroy_fn = void (*)(stop_state*) noexcept;

    /// A plain state with one source referring to it.
    static stop_state* make() {
        void* p = frame_cache::allocate(sizeof(stop_state));
        return ::new (p) stop_state(&destroy_plain, 1);
    }

    void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
    /// A reference, unless none is left (the state is being destroyed).
    bool try_add_ref() noexcept {
        std::uint32_t r = refs_.load(std::memory_order_relaxed);
        while (r != 0)
            if (refs_.compare_exchange_weak(r, r + 1, std::memory_order_relaxed))
                return true;
        return false;
    }
    void release() noexcept {
        if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1)
            destroy_(this);
    }
    void add_source() noexcept { sources_.fetch_add(1, std::memory_order_relaxed); }
    void release_source() noexcept { sources_.fetch_sub(1, std::memory_order_acq_rel); }

    bool stop_requested() const noexcept {
        return (word_.load(std::memory_order_acquire) & requested_bit) != 0;
    }
    bool stop_possible() const noexcept {
        return stop_requested() || sources_.load(std::memory_order_acquire) != 0;
    }

    /// Sets the flag and runs the callbacks, one after the other, on this thread. The caller holds
    /// a reference for the length of it: a callback may drop every other one.
    bool request_stop() noexcept {
        const std::uint32_t w = lock();
        if (w & requested_bit) {
            unlock();
            return false;
        }
        requester_ = std::this_thread::get_id();
        word_.store(requested_bit | locked_bit, std::memory_order_release);
        while (stop_callback_node* n = head_) {
            head_ = n->next;
            if (head_)
                head_->prev = &head_;
            n->prev = nullptr;
            bool destroyed = false;
            n->destroyed = &destroyed;
            unlock();
            n->run(n);
            if (!destroyed)
                n->finished.store(true, std::memory_order_release); // from here on `n` may be gone
            lock();
        }
        unlock();
        return true;
    }

    /// Whether any callback is listed (and not yet run).
    bool has_callbacks() noexcept {
        lock();
        const bool any = head_ != nullptr;
        unlock();
        return any;
    }

    /// Lists `n`, or runs it now when a stop was already requested: true when listed.
    bool add(stop_callback_node* n) noexcept {
        const std::uint32_t w = lock();
        if (w & requested_bit) {
            unlock();
            n->run(n);
            n->finished.store(true, std::memory_order_release);
            return false;
        }
        if (sources_.load(std::memory_order_acquire) == 0) {
            unlock();
            n->finished.store(true, std::memory_order_release); // can never run
            return false;
        }
        n->next = head_;
        n->prev = &head_;
        if (head_)
            head_->prev = &n->next;
        head_ = n;
        unlock();
        return true;
    }

    /// Unlists `n`; if its run has begun on another thread, waits until it is over. Called from
    /// inside its own run, marks it destroyed (the request then no longer touches it).
    void remove(stop_callback_node* n) noexcept {
        lock();
        if (n->prev) {
            *n->prev = n->next;
            if (n->next)
                n->next->prev = n->prev;
            unlock();
            return;
        }
        const bool ran_here = requester_ == std::this_thread::get_id();
        unlock();
        if (n->finished.load(std::memory_order_acquire))
            return;
        if (ran_here) {
            // Inside its own run (the request is on this thread and has not marked it finished): the
            // request set `destroyed` before it ran it, on this same thread.
            *n->destroyed = true;
            return;
        }
        while (!n->finished.load(std::memory_order_acquire))
            std::this_thread::yield();
    }

protected:
    stop_state(destroy_fn destroy, std::uint32_t sources) noexcept : sources_(sources), destroy_(destroy) {}
    ~stop_state() = default;

private:
    static constexpr std::uint32_t requested_bit = 1;
    static constexpr std::uint32_t locked_bit = 2;

    static void destroy_plain(stop_state* s) noexcept {
        s->~stop_state();
        frame_cache::deallocate(s, sizeof(stop_state));
    }
    // Returns the word as it was before the lock was taken.
    std::uint32_t lock() noexcept {
        std::uint32_t w = word_.load(std::memory_order_relaxed);
        for (;;) {
            if (w & locked_bit) {
                std::this_thread::yield();
                w = word_.load(std::memory_order_relaxed);
            } else if (word_.compare_exchange_weak(w, w | locked_bit, std::memory_order_acquire,
                                                   std::memory_order_relaxed)) {
                return w;
            }
        }
    }
    void unlock() noexcept { word_.fetch_and(~locked_bit, std::memory_order_release); }

    std::atomic<std::uint32_t> word_{0};
    std::atomic<std::uint32_t> refs_{1};
    std::atomic<std::uint32_t> sources_;
    stop_callback_node* head_ = nullptr; // guarded by the lock
    std::thread::id requester_{};        // guarded by the lock
    destroy_fn destroy_;
};

struct stop_access;

} // namespace detail

namespace detail {

/// A counted reference to a stop state, the one member of a token and of a source: a copy takes
/// another reference (`Counts::take`), destruction gives it back (`Counts::give`), a move passes it on.
template <class Counts>
class state_ref {
public:
    state_ref() noexcept = default;
    /// Takes over a reference the caller made.
    explicit state_ref(stop_state* adopted) noexcept : s_(adopted) {}
    state_ref(const state_ref& o) noexcept : s_(o.s_) {
        if (s_)
            Counts::take(*s_);
    }
    state_ref(state_ref&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
    state_ref& operator=(state_ref o) noexcept { // a copy or a move, then the old reference goes with `o`
        std::swap(s_, o.s_);
        return *this;
    }
    ~state_ref() {
        if (s_)
            Counts::give(*s_);
    }

    stop_state* get() const noexcept { return s_; }
    void swap(state_ref& o) noexcept { std::swap(s_, o.s_); }

private:
    stop_state* s_ = nullptr;
};

/// What a token's reference counts: the state's life.
struct token_counts {
    static void take(stop_state& s) noexcept { s.add_ref(); }
    static void give(stop_state& s) noexcept { s.release(); }
};

/// What a source's reference counts: the state's life, and the sources that may still ask to stop.
struct source_counts {
    static void take(stop_state& s) noexcept {
        s.add_ref();
        s.add_source();
    }
    static void give(stop_state& s) noexcept {
        s.release_source();
        s.release();
    }
};

} // namespace detail

/// Observes whether its source was asked to stop. Copyable; a default-made one can never stop.
class stop_token {
public:
    stop_token() noexcept = default;

    [[nodiscard]] bool stop_requested() const noexcept { return s_.get() && s_.get()->stop_requested(); }
    [[nodiscard]] bool stop_possible() const noexcept { return s_.get() && s_.get()->stop_possible(); }
    void swap(stop_token& o) noexcept { s_.swap(o.s_); }
    friend void swap(stop_token& a, stop_token& b) noexcept { a.swap(b); }
    [[nodiscard]] friend bool operator==(const stop_token& a, const stop_token& b) noexcept {
        return a.s_.get() == b.s_.get();
    }

private:
    friend class stop_source;
    template <class F>
    friend class stop_callback;
    friend struct detail::stop_access;
    // Takes over a reference the caller made.
    explicit stop_token(detail::stop_state* adopted) noexcept : s_(adopted) {}

    detail::state_ref<detail::token_counts> s_;
};

namespace detail {
struct stop_access {
    static stop_token adopt(stop_state* s) noexcept { return stop_token(s); }
    static stop_state* state(const stop_token& t) noexcept { return t.s_.get(); }
};
} // namespace detail

/// Asks its tokens to stop. Copies share one state; `stop_source{nostopstate}` has none.
class stop_source {
public:
    stop_source() : s_(detail::stop_state::make()) {}
    explicit stop_source(nostopstate_t) noexcept {}

    [[nodiscard]] stop_token get_token() const noexcept {
        if (s_.get())
            s_.get()->add_ref();
        return stop_token(s_.get());
    }
    /// True when this call made the request. Runs the callbacks on this thread before it returns.
    bool request_stop() noexcept { return s_.get() && s_.get()->request_stop(); }
    [[nodiscard]] bool stop_requested() const noexcept { return s_.get() && s_.get()->stop_requested(); }
    [[nodiscard]] bool stop_possible() const noexcept { return s_.get() != nullptr; }
    void swap(stop_source& o) noexcept { s_.swap(o.s_); }
    friend void swap(stop_source& a, stop_source& b) noexcept { a.swap(b); }
    [[nodiscard]] friend bool operator==(const stop_source& a, const stop_source& b) noexcept {
        return a.s_.get() == b.s_.get();
    }

private:
    detail::state_ref<detail::source_counts> s_;
};

/// Runs `F` once when the token's source is asked to stop (at once, in the constructor, if it
/// already was), on the thread that asks. Its destructor unregisters it, and waits for a run in
/// progress on another thread; from inside its own run it may be destroyed.
template <class F>
class stop_callback : private detail::stop_callback_node {
public:
    using callback_type = F;

    template <class C>
    requires std::constructible_from<F, C>
    explicit stop_callback(const stop_token& t, C&& c) noexcept(std::is_nothrow_constructible_v<F, C>)
        : stop_callback_node(&invoke), f_(std::forward<C>(c)) {
        if (detail::stop_state* const s = t.s_.get(); s && s->add(this)) {
            s->add_ref();
            s_ = s;
        }
    }
    stop_callback(const stop_callback&) = delete;
    stop_callback& operator=(const stop_callback&) = delete;
    ~stop_callback() {
        if (s_) {
            s_->remove(this);
            s_->release();
        }
    }

private:
    static void invoke(detail::stop_callback_node* n) noexcept {
        std::invoke(std::move(static_cast<stop_callback*>(n)->f_));
    }

    F f_;
    detail::stop_state* s_ = nullptr;
};

template <class F>
stop_callback(stop_token, F) -> stop_callback<F>;

// Per-attempt stop sources, requesting a stop through a held copy, and linking a source to a parent token.
namespace detail {

/// Requests a stop through a copy of `source`, which holds the stop state until the request is done.
/// A request runs the token's callbacks one after the other, and one of them may resume a coroutine
/// that ends the whole call inline (an awaiter resumed from a stop callback, as some I/O wrappers do),
/// destroying whatever held `source` and every token of it while callbacks remain to run: without the
/// copy, the request would go on in a freed state. A stop the library requests on a source it does
/// not hold in a local of its own goes through here (or through `pooled_stop_source::request_stop`).
inline bool request_stop_held(stop_source source) noexcept {
    return source.request_stop();
}

/// An attempt's own stop source. Its state comes from the per-thread frame cache (above),
/// so a policy that gives each attempt a source pays no `malloc` per call once
/// the cache is warm.
class pooled_stop_source {
public:
    pooled_stop_source() = default;
    pooled_stop_source(const pooled_stop_source&) = delete;
    pooled_stop_source& operator=(const pooled_stop_source&) = delete;

    stop_token get_token() const noexcept { return source_.get_token(); }
    stop_source& source() noexcept { return source_; }
    bool request_stop() noexcept { return request_stop_held(source_); }
    bool stop_requested() const noexcept { return source_.stop_requested(); }

private:
    stop_source source_;
};

/// Forwards a stop request from a parent token to a child source for as long as it lives.
class stop_link {
    struct forward {
        pooled_stop_source* child;
        void operator()() const noexcept { child->request_stop(); }
    };

public:
    stop_link(const stop_token& parent, pooled_stop_source& child) {
        if (parent.stop_possible())
            link_.emplace(parent, forward{&child});
    }

private:
    std::optional<stop_callback<forward>> link_;
};

} // namespace detail

#if RESILIENCE_HAS_STD_STOP_TOKEN

namespace detail {

/// A stop state that a `std::stop_token` stops, for as long as any of its references lives.
class std_stop_bridge final : public stop_state {
public:
    static stop_token make(const std::stop_token& from);

private:
    struct forward {
        std_stop_bridge* self;
        void operator()() const noexcept {
            // Holds a reference for the length of the request (a callback may drop every other
            // one), unless the state is already being destroyed: then its destructor is waiting
            // here for this to end, and nobody is left to tell.
            if (!self->try_add_ref())
                return;
            self->request_stop();
            self->release(); // may destroy the state, and this callback with it: allowed
        }
    };
    std_stop_bridge() noexcept : stop_state(&destroy, 1) {}
    static void destroy(stop_state* s) noexcept {
        auto* b = static_cast<std_stop_bridge*>(s);
        b->~std_stop_bridge();
        frame_cache::deallocate(b, sizeof(std_stop_bridge));
    }

    std::optional<std::stop_callback<forward>> link_;
};

inline stop_token std_stop_bridge::make(const std::stop_token& from) {
    if (!from.stop_possible())
        return stop_token{};
    void* p = frame_cache::allocate(sizeof(std_stop_bridge));
    auto* b = ::new (p) std_stop_bridge();
    stop_token t = stop_access::adopt(b); // the one reference: the state lives as long as its tokens
    b->link_.emplace(from, forward{b});
    return t;
}

} // namespace detail

/// A token that `from` stops (a bridge from the standard library's token).
[[nodiscard]] inline stop_token from_std(const std::stop_token& from) {
    return detail::std_stop_bridge::make(from);
}

/// A `std::stop_source` that an `rs::stop_token` stops, for an action or API that takes a
/// `std::stop_token`. Costs a `std::stop_source` when the token can stop, nothing otherwise.
class std_stop_link {
public:
    explicit std_stop_link(const stop_token& t) {
        if (t.stop_possible()) {
            source_ = std::stop_source{};
            link_.emplace(t, forward{source_});
        }
    }
    std_stop_link(const std_stop_link&) = delete;
    std_stop_link& operator=(const std_stop_link&) = delete;

    [[nodiscard]] std::stop_token get_token() const noexcept {
        return link_ ? source_.get_token() : std::stop_token{};
    }

private:
    struct forward {
        std::stop_source source;
        void operator()() const noexcept {
            std::stop_source held = source; // the request may end whatever holds this link
            held.request_stop();
        }
    };
    std::stop_source source_{std::nostopstate};
    std::optional<stop_callback<forward>> link_;
};

#endif

} // namespace resilience
