// SPDX-License-Identifier: MIT
/// \file engine/protocol.hpp
/// The vocabulary of the fast protocol (described in policy.hpp), as the driver checks it: `step`,
/// what makes a policy fast, how it says that its `enter` never waits or that it can wait in the
/// pipeline's frame, and the one clock reading that the policies of a call share.
#pragma once

#include "../context.hpp"
#include "../outcome.hpp"
#include "../task.hpp"

#include <cassert>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <new>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2 {

/// A policy's answer to the pipeline on its fast path (see policy.hpp).
enum class step : unsigned char {
    proceed, ///< `enter`: admitted, go on inward. `leave`: finished here, go on outward.
    done,    ///< `enter`: not admitted; the result holds why (a refusal, a cancellation).
    wait,    ///< `enter`: cannot decide without suspending: the pipeline calls `run` instead.
             ///< `leave`: has more to do (a retry, a timer to disarm): the pipeline calls `resume`.
};

/// What a fast policy's `enter` answers: a `step`, and, when it proceeds, the context the stages
/// inside it see. A `step` converts to it (the stages inside then see the context `enter` was
/// given); `entry::proceed_in(c)` proceeds and hands them `c`, a context kept in the call's state
/// (a retry's attempt context, a timeout's deadline and stop).
struct entry {
    constexpr entry(step s) noexcept : what(s) {} // NOLINT(google-explicit-constructor): a step is an entry
    static constexpr entry proceed_in(const context& inner) noexcept { return entry{step::proceed, &inner}; }
    /// For `again` (see policy.hpp): the stages inside go round again after the policy's `frame_wait`,
    /// and see `inner`, a context kept in the call's state.
    static constexpr entry wait_then_in(const context& inner) noexcept { return entry{step::wait, &inner}; }

    step what;
    const context* inner = nullptr; // null: the context `enter` was given

private:
    constexpr entry(step s, const context* c) noexcept : what(s), inner(c) {}
};

namespace detail {

/// A policy with the fast protocol: `call_state`, `enter`, `leave`, `resume` (see policy.hpp).
template <class P>
concept fast_policy = requires { typename P::call_state; };

/// A fast policy whose `enter` never answers `step::wait` says so
/// (`static constexpr bool enter_never_waits = true;`), and the pipeline then does not even
/// instantiate its `run` for the call: less to compile.
template <class P>
inline constexpr bool enter_may_wait = !requires { requires P::enter_never_waits; };

/// A `frame_wait<R>` that needs more room for some calls than for others (a bulkhead's queue timeout
/// or listener) asks for it: `static std::size_t extra_bytes(const P&, S&, const context&)`, asked
/// before it is made (0: none), and `std::size_t extra_bytes() const noexcept`, the same answer,
/// asked before it is destroyed. The pipeline makes it in a block long enough for both and gives
/// it the room as a fifth argument to its constructor (null: none), at `room_after(this)`.
template <class A, class P, class S, class R>
concept asks_for_room = requires(const A& a, const P& p, S& s, const context& c) {
    { A::extra_bytes(p, s, c) } -> std::convertible_to<std::size_t>;
    { a.extra_bytes() } noexcept -> std::convertible_to<std::size_t>;
    requires std::is_constructible_v<A, const P&, S&, const context&, std::optional<outcome<R>>&, void*>;
};
/// An awaiter that means to ask for room (it declares an `extra_bytes` of either kind) but does not
/// have all of `asks_for_room`: refused, since it would be made without its room.
template <class A, class P, class S>
inline constexpr bool means_room = requires(A& a, const P& p, S& s, const context& c) {
    A::extra_bytes(p, s, c);
} || requires(A& a) { a.extra_bytes(); };

/// How the pipeline makes a policy's `frame_wait<R>`: from (policy, call state, context, result), and
/// the room it asked for.
template <class A, class P, class S, class R>
concept frame_wait_makeable =
    std::is_constructible_v<A, const P&, S&, const context&, std::optional<outcome<R>>&> ||
    asks_for_room<A, P, S, R>;

/// A fast policy whose `enter` may wait and that can also wait for admission without a frame of
/// its own: `waits_in_frame` and `frame_wait<R>` (see policy.hpp).
template <class P, class S, class R>
concept frame_waiting = requires(const P& p, const context& c) {
    { p.waits_in_frame(c) } -> std::same_as<bool>;
    typename P::template frame_wait<R>;
    requires frame_wait_makeable<typename P::template frame_wait<R>, P, S, R>;
};

/// Whether a policy's `enter` (either form) is declared `noexcept` for result type `O`, and its
/// `call_state` made without throwing (true for the waiting form, which has neither): the pipeline
/// catches what any other makes or `enter` throws (a clock whose reading threw, a policy's own
/// defect) and refuses the call with it, as a failure; a `noexcept` one costs no handler.
template <class P, class O>
inline constexpr bool enter_nothrow = [] {
    if constexpr (!fast_policy<P>) {
        return true;
    } else {
        using S = typename P::call_state;
        if constexpr (!std::is_nothrow_default_constructible_v<S>)
            return false;
        else if constexpr (requires(const P& p, S& s, const context& c, std::optional<O>& r) {
                               p.enter(s, c, r);
                           })
            return requires(const P& p, S& s, const context& c, std::optional<O>& r) {
                { p.enter(s, c, r) } noexcept;
            };
        else
            return requires(const P& p, S& s, const context& c, const context*& in, std::optional<O>& r) {
                { p.enter(s, c, in, r) } noexcept;
            };
    }
}();

/// Whether a fast policy's `leave` is declared `noexcept` for result type `O` (see `enter_nothrow`):
/// one that is not, and throws against the protocol's rule, has its exception made the call's
/// outcome, and the stages outside it leave with that.
template <class P, class O>
inline constexpr bool leave_nothrow =
    requires(const P& p, typename P::call_state& s, const context& c, O& r) {
        { p.leave(s, c, r) } noexcept;
    };

/// A frame-waiting policy whose `waits_in_frame` says true for every call says so, with `static
/// constexpr bool always_waits_in_frame = true;` (the rate limiters): a pipeline then never compiles its
/// `run`, which only a caller of `run` itself (`any_policy`, a test) needs.
template <class P>
inline constexpr bool always_waits_in_frame = requires { requires P::always_waits_in_frame; };

/// A policy whose `enter` may wait can name, with `run_waited(next, ctx)`, what a pipeline runs once
/// its `enter` has answered `step::wait`, when that is less than its `run`: the timeout's `run` also
/// serves a caller of `run` itself on a clock that has loop timers, through a drive of its own, which a
/// pipeline never takes there (its `enter` armed the timer instead of waiting).
template <class P, class Next>
concept runs_waited = requires(const P& p, Next n, const context& c) { p.run_waited(std::move(n), c); };

/// What a pipeline runs for a stage whose `enter` waited: its `run_waited`, else its `run`.
template <class P, class Next>
auto run_after_wait(const P& p, Next&& next, const context& ctx) {
    if constexpr (runs_waited<P, std::remove_cvref_t<Next>>)
        return p.run_waited(std::forward<Next>(next), ctx);
    else
        return p.run(std::forward<Next>(next), ctx);
}

/// What a policy's `run` (or `run_after_wait`) gave, as the `task<Outcome>` a pipeline or an
/// `any_policy` awaits: itself when it is one, else a task that awaits it.
template <class Outcome, class Awaitable>
task<Outcome> awaiting_task(Awaitable a) {
    co_return co_await std::move(a);
}
template <class Outcome, class Awaitable>
task<Outcome> as_stage_task(Awaitable&& a) {
    if constexpr (std::is_same_v<std::remove_cvref_t<Awaitable>, task<Outcome>>)
        return std::forward<Awaitable>(a);
    else
        return awaiting_task<Outcome>(std::forward<Awaitable>(a));
}

/// A fast policy whose `leave` may wait and that then decides in `again` whether the stages inside it
/// go round again, waiting in the pipeline's frame in between (`frame_wait<R>`): a retry (see policy.hpp).
template <class P, class S, class R>
concept goes_again_in_frame = requires(const P& p, S& s, const context& c, outcome<R>& r) {
    { p.again(s, c, r) } -> std::same_as<entry>;
    typename P::template frame_wait<R>;
    requires frame_wait_makeable<typename P::template frame_wait<R>, P, S, R>;
};

/// Where the room of an awaiter that asked for it begins: at the first multiple of
/// `alignof(std::max_align_t)` past the awaiter's end, in the block the pipeline made it in.
template <class A>
inline constexpr std::size_t room_offset =
    (sizeof(A) + alignof(std::max_align_t) - 1) / alignof(std::max_align_t) * alignof(std::max_align_t);
template <class A>
void* room_after(A* awaiter) noexcept {
    return reinterpret_cast<unsigned char*>(awaiter) + room_offset<A>;
}
template <class A>
const void* room_after(const A* awaiter) noexcept {
    return reinterpret_cast<const unsigned char*>(awaiter) + room_offset<A>;
}
/// The awaiter whose room begins at `room`: the inverse of `room_after` (a timer kept in the room
/// finds its awaiter so).
template <class A>
A* awaiter_of_room(void* room) noexcept {
    return std::launder(reinterpret_cast<A*>(static_cast<unsigned char*>(room) - room_offset<A>));
}

/// The state a stage keeps in the call's frame: its `call_state`, or an empty one for a policy of
/// the waiting form.
template <class P>
struct state_of {
    struct type {};
};
template <fast_policy P>
struct state_of<P> {
    using type = typename P::call_state;
};

/// The place of one stage's state in the call's frame: constructed when the call reaches the stage (a
/// union member, so that the frame is not zeroed up front), destroyed by the driver.
template <class T>
struct state_place {
    state_place() noexcept {}
    state_place(const state_place&) = delete;
    state_place& operator=(const state_place&) = delete;
    ~state_place() {}
    union {
        T value;
    };
};
/// The places of the stages' states, outermost first.
template <class... Ts>
struct state_pack {};
template <class T, class... Ts>
struct state_pack<T, Ts...> {
    state_place<T> head;
    [[no_unique_address]] state_pack<Ts...> tail; // the last one's empty tail takes no word of the frame
};
/// The place of stage J's state in `p`.
template <std::size_t J, class P>
auto& state_in_pack(P& p) noexcept {
    if constexpr (J == 0)
        return p.head;
    else
        return state_in_pack<J - 1>(p.tail);
}

/// The time on `clock` for a policy admitting a call: the call's shared reading when one of the
/// same clock (see `reading_key`, in context.hpp) was taken while admitting it, else a fresh one (then shared).
template <class C>
typename C::time_point call_now(const C& clock, const context& ctx) {
    if constexpr (std::is_same_v<typename C::duration, std::chrono::nanoseconds>) {
        time_cache* cache = context_access::cache(ctx);
        const void* key = reading_key(clock);
        if (cache && cache->clock == key)
            return typename C::time_point{cache->at};
        const typename C::time_point t = clock.now();
        if (cache) {
            cache->clock = key;
            cache->at = t.time_since_epoch();
        }
        return t;
    } else {
        return clock.now();
    }
}

/// Whether stage `P` keeps a word for the whole call (`static constexpr bool uses_call_scratch = true;`,
/// a balancer's endpoints tried): the call's outermost drive then keeps one in its frame.
template <class P>
inline constexpr bool stage_uses_call_scratch = requires { requires P::uses_call_scratch; };

template <class Stages, class = std::make_index_sequence<std::tuple_size_v<Stages>>>
inline constexpr bool any_stage_uses_call_scratch = false;
template <class Stages, std::size_t... Js>
inline constexpr bool any_stage_uses_call_scratch<Stages, std::index_sequence<Js...>> =
    (false || ... || stage_uses_call_scratch<std::remove_cvref_t<std::tuple_element_t<Js, Stages>>>);

/// A drive's room for the call's scratch word (`call_scratch`, context.hpp): none unless a stage uses it.
template <bool Used>
struct scratch_place {
    call_scratch word;
};
template <>
struct scratch_place<false> {};

/// Points `cache`, a drive's, at the call's scratch word: the one of the drive `ctx` comes from (a
/// hedge's attempt, a stage's `run`), else `own`, when this drive is the call's outermost.
template <bool Used>
void attach_scratch(time_cache& cache, const context& ctx, scratch_place<Used>& own) noexcept {
    if constexpr (Used) {
        call_scratch* const outer = context_access::scratch(ctx);
        cache.scratch = outer ? outer : &own.word;
    }
}

/// The pointers of `contexts_at`'s slots after the first, kept with a drive's states: none, and no room
/// at all (`[[no_unique_address]]`), for a pipeline whose stages derive no context.
template <std::size_t N>
struct slot_places {
    const context* slot[N];
    const context** data() noexcept { return slot; }
};
template <>
struct slot_places<0> {
    const context** data() noexcept { return nullptr; }
};

/// The contexts a call's stages see, by slot (`driver::context_slot`): slot 0 is the drive's own
/// context, which the frame holds already; each later slot is a pointer in the frame (`places[slot - 1]`),
/// written by the stage that derives its context. A drive that starts further in (a stage's `run`)
/// also writes its own context into the slot of the stage it starts from.
struct contexts_at {
    const context* own;
    const context** places;
    const context& operator[](std::size_t slot) const noexcept {
        return slot == 0 ? *own : *places[slot - 1];
    }
    /// Slot `slot`, to write: never 0 (a stage writes only the slots inside its own).
    const context*& place(std::size_t slot) const noexcept {
        assert(slot != 0);
        return places[slot - 1];
    }
};

} // namespace detail

} // namespace resilience
