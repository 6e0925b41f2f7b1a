// SPDX-License-Identifier: MIT
/// \file any_clock.hpp
/// `any_clock`: any clock behind one type, so code that takes a clock need not be a template.
#pragma once

#include "clock.hpp"
#include "concepts.hpp"
#include "detail/inline_start.hpp"
#include "event_loop.hpp"
#include "stop_token.hpp"

#include <chrono>
#include <concepts>
#include <coroutine>
#include <cstddef>
#include <new>
#include <optional>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2 {

class any_clock;

namespace detail {

/// What `any_clock` can hold: a clock whose time converts to nanoseconds without loss and whose
/// `now` and `sleep_until` may be called on a const object (policies hold their clock const).
template <class C>
concept erasable_clock = !std::same_as<C, any_clock> && clock<C> &&
                         std::convertible_to<typename C::duration, std::chrono::nanoseconds> &&
                         requires(const C& c, typename C::time_point tp, stop_token st) {
                             { c.now() } -> std::same_as<typename C::time_point>;
                             { c.sleep_until(tp, st) } -> awaitable;
                         };

template <class C>
inline constexpr char any_clock_key = 0;

/// One sleep of a wrapped clock: the awaitable its `sleep_until` returned, and the awaiter that
/// awaitable yields, made when the sleep is awaited (where the clock expects it to be made).
template <class C>
class held_sleep {
    using awaitable_type = decltype(std::declval<const C&>().sleep_until(
        std::declval<typename C::time_point>(), std::declval<stop_token>()));
    static_assert(!std::is_reference_v<awaitable_type>,
                  "any_clock: sleep_until must return its awaitable by value");
    static constexpr bool self_awaiting =
        !has_member_co_await<awaitable_type> && !has_free_co_await<awaitable_type>;
    using raw_awaiter = decltype(get_awaiter(std::declval<awaitable_type>()));
    static constexpr bool by_reference = !self_awaiting && std::is_reference_v<raw_awaiter>;
    using awaiter_type =
        std::conditional_t<self_awaiting, awaitable_type, std::remove_reference_t<raw_awaiter>>;
    using awaiter_slot =
        std::conditional_t<self_awaiting, char,
                           std::conditional_t<by_reference, awaiter_type*, std::optional<awaiter_type>>>;

public:
    held_sleep(const C& clock, typename C::time_point tp, stop_token&& token)
        : awaitable_(clock.sleep_until(tp, std::move(token))) {}

    bool ready() {
        if constexpr (by_reference)
            awaiter_ = &get_awaiter(std::move(awaitable_));
        else if constexpr (!self_awaiting)
            awaiter_.emplace(emplace_from{[&] { return get_awaiter(std::move(awaitable_)); }});
        return static_cast<bool>(awaiter().await_ready());
    }
    start_result suspend(std::coroutine_handle<> h) {
        using result = decltype(awaiter().await_suspend(h));
        // Once a void or true await_suspend returns, the sleeper may already be running elsewhere:
        // nothing here is touched after the call.
        if constexpr (std::is_void_v<result>) {
            awaiter().await_suspend(h);
            return suspend_unless_done(true, h);
        } else if constexpr (std::is_same_v<result, bool>) {
            return suspend_unless_done(awaiter().await_suspend(h), h);
        } else {
            return transfer_to(awaiter().await_suspend(h), h);
        }
    }
    void resume() { static_cast<void>(awaiter().await_resume()); }

private:
    awaiter_type& awaiter() noexcept {
        if constexpr (self_awaiting)
            return awaitable_;
        else
            return *awaiter_;
    }

    awaitable_type awaitable_; // declared first: the awaiter may refer to it, so it goes last
    awaiter_slot awaiter_{};
};

} // namespace detail

/// Any clock behind one copyable type, for code that must take a clock without being a template:
/// a service that runs on `rs::steady_clock` in production and on a simulation's clock in tests.
///
///     rs::any_clock clock = sim.clock();                 // or rs::steady_clock{}, the default
///     rs::retry<rs::any_clock> r{{.max_attempts = 3}, clock};
///
/// Guarantees:
/// - Reads the same instants as the clock it holds: `now()` is that clock's time since its epoch,
///   in nanoseconds (exact for every clock whose tick is a whole number of nanoseconds, the only
///   ones it accepts), at the cost of one indirect call.
/// - `sleep_until(tp, token)` is the held clock's sleep: same wake-up instant (a coarser clock is
///   asked for the first tick at or after `tp`, never an earlier one), same thread, same stop
///   behaviour, same exceptions. It costs no allocation for the library's clocks; an awaiter too
///   large for the inline buffer of the sleep is allocated.
/// - `timer_loop()` is the held clock's (see `detail::loop_timer_clock`), so a timeout keeps its
///   timer fast path. It is null when the held clock sleeps by other means (Asio's clock, a clock
///   of your own), and inside an Asio call; `rs::timeout` then watches the call with a coroutine
///   sleeping on the clock beside it (docs/timeout.md, "Cost").
/// - Copies hold copies of the clock (in place when it fits in three pointers, as every clock of
///   this library does). Thread-safe as the held clock is: every call is a const call on it.
///
/// One limit: policies sharing one reading of the clock while admitting a call
/// (`detail::call_now`) recognise a clock by its type, so the policies of one pipeline should not
/// hold `any_clock`s over clocks with different epochs.
class any_clock {
public:
    using rep = std::chrono::nanoseconds::rep;
    using period = std::chrono::nanoseconds::period;
    using duration = std::chrono::nanoseconds;
    /// Time since the held clock's epoch.
    using time_point = std::chrono::time_point<any_clock, duration>;
    static constexpr bool is_steady = true;
    /// `timer_loop()` is null when the held clock has no loop timers (see `detail::loop_timer_clock`).
    static constexpr bool timer_loop_may_be_null = true;

    class sleep_awaiter;

    /// Holds `rs::steady_clock`, the default clock of every policy.
    any_clock() noexcept : any_clock(steady_clock{}) {}

    /// Holds a copy of `clock`. Implicit, so a clock passes where an `any_clock` is expected.
    template <class C>
    requires detail::erasable_clock<std::remove_cvref_t<C>>
    any_clock(C&& clock) noexcept(holds_without_throwing<C>) : vt_(&vtable_for<std::remove_cvref_t<C>>) {
        using held = std::remove_cvref_t<C>;
        if constexpr (fits_in_place<held>)
            ::new (static_cast<void*>(store_.bytes)) held(std::forward<C>(clock));
        else
            ::new (static_cast<void*>(store_.bytes)) held*(new held(std::forward<C>(clock)));
    }

    any_clock(const any_clock& other) : vt_(other.vt_) { vt_->copy(other.store_, store_); }
    any_clock& operator=(const any_clock& other) {
        if (this != &other) {
            any_clock copy(other); // may throw: *this is untouched until it has succeeded
            vt_->destroy(store_);
            copy.vt_->relocate(copy.store_, store_);
            vt_ = std::exchange(copy.vt_, nullptr);
        }
        return *this;
    }
    ~any_clock() {
        if (vt_) // null only in the copy that operator= has emptied
            vt_->destroy(store_);
    }

    /// The held clock's time since its epoch.
    time_point now() const { return time_point{vt_->now(store_)}; }

    /// The held clock's sleep until `tp` (or until `token` is stopped).
    sleep_awaiter sleep_until(time_point tp, stop_token token) const;
    sleep_awaiter sleep_for(duration d, stop_token token) const;

    /// The held clock's event loop for timers, or null when it has none (see the class comment).
    event_loop* timer_loop() const { return vt_->timer_loop(store_); }

    /// Which readings a call may share with this clock (see `detail::call_now`): those of clocks
    /// holding the same clock type.
    const void* reading_key() const noexcept { return vt_->key; }

    /// The held clock, when it is a `C`; null otherwise.
    template <class C>
    const C* target() const noexcept {
        if (vt_->key != &detail::any_clock_key<C>)
            return nullptr;
        return &get<C>(store_);
    }

private:
    static constexpr std::size_t inline_size = 3 * sizeof(void*);
    struct storage {
        alignas(void*) unsigned char bytes[inline_size];
    };
    template <class C>
    static constexpr bool fits_in_place = (sizeof(C) <= inline_size) && (alignof(C) <= alignof(void*)) &&
                                          std::is_nothrow_move_constructible_v<C>;
    template <class C>
    static constexpr bool holds_without_throwing =
        std::is_nothrow_constructible_v<std::remove_cvref_t<C>, C> && (fits_in_place<std::remove_cvref_t<C>>);

    struct vtable {
        std::chrono::nanoseconds (*now)(const storage&);
        event_loop* (*timer_loop)(const storage&);
        void (*sleep)(const storage&, sleep_awaiter&, std::chrono::nanoseconds, stop_token&&);
        void (*copy)(const storage&, storage&);
        void (*relocate)(storage&, storage&) noexcept;
        void (*destroy)(storage&) noexcept;
        const char* key;
    };

    template <class C>
    static const C& get(const storage& s) noexcept {
        if constexpr (fits_in_place<C>)
            return *std::launder(reinterpret_cast<const C*>(s.bytes));
        else
            return **std::launder(reinterpret_cast<C* const*>(s.bytes));
    }

    template <class C>
    static void sleep_on(const storage& s, sleep_awaiter& into, std::chrono::nanoseconds when,
                         stop_token&& token);

    template <class C>
    static constexpr vtable vtable_for{
        .now = [](const storage& s) -> std::chrono::nanoseconds {
            return get<C>(s).now().time_since_epoch();
        },
        .timer_loop = [](const storage& s) -> event_loop* {
            if constexpr (detail::loop_timer_clock<C>)
                return get<C>(s).timer_loop();
            else
                return nullptr;
        },
        .sleep = &sleep_on<C>,
        .copy =
            [](const storage& from, storage& to) {
                if constexpr (fits_in_place<C>)
                    ::new (static_cast<void*>(to.bytes)) C(get<C>(from));
                else
                    ::new (static_cast<void*>(to.bytes)) C*(new C(get<C>(from)));
            },
        .relocate =
            [](storage& from, storage& to) noexcept {
                if constexpr (fits_in_place<C>) {
                    C& source = const_cast<C&>(get<C>(from));
                    ::new (static_cast<void*>(to.bytes)) C(std::move(source));
                    source.~C();
                } else {
                    ::new (static_cast<void*>(to.bytes)) C*(&const_cast<C&>(get<C>(from)));
                }
            },
        .destroy =
            [](storage& s) noexcept {
                if constexpr (fits_in_place<C>)
                    const_cast<C&>(get<C>(s)).~C();
                else
                    delete &get<C>(s);
            },
        .key = &detail::any_clock_key<C>,
    };

    const vtable* vt_;
    storage store_;
};

/// A sleep of the clock an `any_clock` holds. Made by `sleep_until` and awaited where it was made
/// (it cannot be copied or moved: the held clock's awaiter may be registered by address).
class any_clock::sleep_awaiter {
public:
    sleep_awaiter(const sleep_awaiter&) = delete;
    sleep_awaiter& operator=(const sleep_awaiter&) = delete;
    ~sleep_awaiter() {
        if (ops_)
            ops_->destroy(held_);
    }

    bool await_ready() { return ops_->ready(held_); }
    detail::start_result await_suspend(std::coroutine_handle<> h) { return ops_->suspend(held_, h); }
    void await_resume() { ops_->resume(held_); }

private:
    friend class any_clock;

    // Large enough for the sleeps of `steady_clock` and `testing::virtual_clock`. A larger sleep (an
    // `asio::clock` sleep, which holds its timer) is allocated once per sleep.
    static constexpr std::size_t inline_size = sizeof(detail::held_sleep<steady_clock>) > 128
                                                   ? sizeof(detail::held_sleep<steady_clock>)
                                                   : 128;
    template <class C>
    static constexpr bool fits_in_place = sizeof(detail::held_sleep<C>) <= inline_size &&
                                          alignof(detail::held_sleep<C>) <= alignof(std::max_align_t);

    struct operations {
        bool (*ready)(void*);
        detail::start_result (*suspend)(void*, std::coroutine_handle<>);
        void (*resume)(void*);
        void (*destroy)(void*) noexcept;
    };
    template <class C>
    static constexpr operations operations_for{
        .ready = [](void* p) { return static_cast<detail::held_sleep<C>*>(p)->ready(); },
        .suspend =
            [](void* p, std::coroutine_handle<> h) {
                return static_cast<detail::held_sleep<C>*>(p)->suspend(h);
            },
        .resume = [](void* p) { static_cast<detail::held_sleep<C>*>(p)->resume(); },
        .destroy =
            [](void* p) noexcept {
                if constexpr (fits_in_place<C>)
                    static_cast<detail::held_sleep<C>*>(p)->~held_sleep();
                else
                    delete static_cast<detail::held_sleep<C>*>(p);
            },
    };

    sleep_awaiter(const any_clock& clock, std::chrono::nanoseconds when, stop_token&& token) {
        clock.vt_->sleep(clock.store_, *this, when, std::move(token));
    }

    template <class C>
    void start(const C& clock, typename C::time_point tp, stop_token&& token) {
        if constexpr (fits_in_place<C>)
            held_ = ::new (static_cast<void*>(buffer_)) detail::held_sleep<C>(clock, tp, std::move(token));
        else
            held_ = new detail::held_sleep<C>(clock, tp, std::move(token));
        ops_ = &operations_for<C>; // set last: a throw above leaves nothing to destroy
    }

    alignas(std::max_align_t) unsigned char buffer_[inline_size];
    const operations* ops_ = nullptr;
    void* held_ = nullptr;
};

template <class C>
void any_clock::sleep_on(const storage& s, sleep_awaiter& into, std::chrono::nanoseconds when,
                         stop_token&& token) {
    // A coarser clock wakes at its first tick at or after the instant asked for, never before it.
    const auto tp = typename C::time_point{std::chrono::ceil<typename C::duration>(when)};
    into.start(get<C>(s), tp, std::move(token));
}

inline any_clock::sleep_awaiter any_clock::sleep_until(time_point tp, stop_token token) const {
    return sleep_awaiter{*this, tp.time_since_epoch(), std::move(token)};
}
inline any_clock::sleep_awaiter any_clock::sleep_for(duration d, stop_token token) const {
    return sleep_until(now() + d, std::move(token));
}

static_assert(clock<any_clock>);
static_assert(detail::loop_timer_clock<any_clock> && detail::timer_loop_may_be_null<any_clock>);

} // namespace resilience
