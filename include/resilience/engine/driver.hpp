// SPDX-License-Identifier: MIT
/// \file engine/driver.hpp
/// The driver: runs one call through a pipeline's stages (or one policy) in one coroutine frame, by
/// the protocol described in policy.hpp (`run_action`, engine/run_action.hpp, starts it).
#pragma once

#include "../concepts.hpp"
#include "../context.hpp"
#include "../detail/home_loop.hpp"
#include "../detail/inlining.hpp"
#include "../detail/stages.hpp"
#include "../outcome.hpp"
#include "../task.hpp"
#include "action.hpp"
#include "call_edges.hpp"
#include "frame_admission.hpp"
#include "protocol.hpp"

#include <array>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2::detail {

/// Runs one call through `Stages` (a tuple of references to policies) in one coroutine frame:
/// every stage's `enter` inward, the innermost step, every `leave` outward. A stage that waits
/// for admission through `frame_wait` waits in this frame; any other stage that must wait costs
/// more: its `run` (or `resume`) is awaited, with the stages inside it run by another `drive`.
template <class Stages, class Leaf>
struct driver {
    static constexpr std::size_t size = std::tuple_size_v<Stages>;
    using outcome_type = await_result_t<std::invoke_result_t<Leaf&, const context&>>;
    using value_type = typename outcome_type::value_type;
    template <std::size_t J>
    using policy_at = std::remove_cvref_t<std::tuple_element_t<J, Stages>>;

    // ---- the stages' states, in the call's frame ----
    // Each is constructed when the call reaches its stage, just before its `enter`, and destroyed
    // with the frame: constructing them all up front compiles to zeroing the whole block, which
    // costs more than the states' own work on the fast path. They are a member of the driver
    // rather than a class template of their own shared by drivers with the same states: with
    // that, g++ stopped inlining the outermost `enter_all` into the drive (its size estimate went
    // past `max-inline-insns-single`) and the common path got slower.
    template <class Seq>
    struct states_of;
    template <std::size_t... Js>
    struct states_of<std::index_sequence<Js...>> {
        using type = state_pack<typename state_of<policy_at<Js>>::type...>;
    };
    template <std::size_t J>
    using state_type = typename state_of<policy_at<J>>::type;
    static constexpr bool uses_call_scratch = any_stage_uses_call_scratch<Stages>;
    static_assert(size <= 64, "resilience::pipeline: at most 64 stages");

    /// A stage's index where the drive keeps one (`k`): 32 bits, so that it shares a word of the frame
    /// with the step, a flag and the states' bits. `none`: no stage.
    using stage_index = std::uint32_t;
    static constexpr stage_index none = static_cast<stage_index>(-1);
    // The states' bits: as narrow as the stages allow, so that they share the word of `k`.
    using made_mask =
        std::conditional_t<size <= 8, std::uint8_t,
                           std::conditional_t<size <= 16, std::uint16_t,
                                              std::conditional_t<size <= 32, std::uint32_t, std::uint64_t>>>;

    // ---- the contexts the stages see, in the call's frame ----
    // Stage J sees `at[context_slot(J)]`, and the leaf `at[context_slot(size)]` (`contexts_at`). A
    // stage whose `enter` answers a `step` hands the stages inside it the context it was given: they
    // share its slot, so the frame keeps one pointer per stage that may derive a context (a timeout, a
    // retry), rather than one per stage; slot 0 is the call's own context, which needs no pointer.
    template <std::size_t J>
    static constexpr bool derives_context() {
        if constexpr (!fast_policy<policy_at<J>>) {
            return false; // its `run` is given the context; the stages inside run in a drive of their own
        } else if constexpr (goes_again_in_frame<policy_at<J>, state_type<J>, value_type>) {
            return true; // its `again` names the context of each round
        } else {
            using P = policy_at<J>;
            if constexpr (requires(const P& p, state_type<J>& st, const context& c,
                                   std::optional<outcome_type>& r) { p.enter(st, c, r); })
                return !std::is_same_v<std::remove_cvref_t<decltype(std::declval<const P&>().enter(
                                           std::declval<state_type<J>&>(), std::declval<const context&>(),
                                           std::declval<std::optional<outcome_type>&>()))>,
                                       step>; // an `entry`, or anything else that may carry a context
            else
                return true; // the 0.1 form writes the inner context
        }
    }
    template <std::size_t... Js>
    static constexpr std::array<std::size_t, size + 1> context_slots(std::index_sequence<Js...>) {
        std::array<std::size_t, size + 1> slots{};
        std::size_t n = 0;
        ((slots[Js] = n, n += derives_context<Js>() ? 1 : 0), ...);
        slots[size] = n;
        return slots;
    }
    static constexpr std::array<std::size_t, size + 1> slot_table =
        context_slots(std::make_index_sequence<size>{});
    static constexpr std::size_t context_slot(std::size_t j) noexcept { return slot_table[j]; }
    static constexpr std::size_t context_places = slot_table[size] + 1;

    /// The stages' states, and the drive's progress through the stages (in one struct, so that the
    /// small fields share the word after the states: g++ gives every local of a coroutine a place of
    /// its own, each rounded up to its alignment).
    struct states {
        typename states_of<std::make_index_sequence<size>>::type p;
        made_mask made = 0; // bit J: stage J's state is constructed (only those with a destructor)
        step s = step::done;
        bool running = false; // the stage `k` waits in its `run`
        stage_index k = size; // the stage that must wait, or `none` when the call is over
        // The contexts of the slots after the call's own (`contexts_at`), which the frame holds already.
        [[no_unique_address]] slot_places<context_places - 1> places;
        // The call's scratch word, for a pipeline with a stage that asks for one (none: no room).
        [[no_unique_address]] scratch_place<uses_call_scratch> scratch;

        // What frame_admission.hpp asks of the states.
        template <std::size_t J>
        using type_at = state_type<J>;
        static constexpr std::size_t context_slot(std::size_t j) noexcept { return driver::context_slot(j); }
        template <std::size_t J>
        auto& get() noexcept {
            return state_in_pack<J>(p).value;
        }

        states() noexcept {}
        states(const states&) = delete;
        states& operator=(const states&) = delete;
        ~states() { destroy_range<0, false>(); }

        template <std::size_t J>
        void make() {
            // Default-initialised: std::construct_at would value-initialise, zeroing it first.
            ::new (static_cast<void*>(&state_in_pack<J>(p).value)) state_type<J>;
            if constexpr (!std::is_trivially_destructible_v<state_type<J>>)
                made |= static_cast<made_mask>(made_mask{1} << J);
        }
        // The states of stages [Lo, N), innermost first, as the stages leave; `Forget` clears their bits
        // (for the states of the stages inside a stage that goes round again: `destroy_range<K + 1>`).
        template <std::size_t Lo, bool Forget = true, std::size_t N = size>
        void destroy_range() noexcept {
            if constexpr (N > Lo) {
                if constexpr (!std::is_trivially_destructible_v<state_type<N - 1>>) {
                    constexpr made_mask bit = static_cast<made_mask>(made_mask{1} << (N - 1));
                    if (made & bit) {
                        std::destroy_at(&state_in_pack<N - 1>(p).value);
                        if constexpr (Forget)
                            made = static_cast<made_mask>(made & ~bit);
                    }
                }
                destroy_range<Lo, Forget, N - 1>();
            }
        }
    };
    template <std::size_t J>
    static auto& state(states& st) noexcept {
        return state_in_pack<J>(st.p).value;
    }

    using all_stages = std::make_index_sequence<size>;
    /// Where a drive starts: stage 0 for a call (known when compiling, so the common path folds
    /// to straight-line code), or a stage known at run time for the stages inside a waiting one.
    using outermost = std::integral_constant<std::size_t, 0>;
    /// Stage 0 too, for the drive of a whole call made by `execute` (not a stage's `run` inside
    /// another call): where the rule for a call its caller stopped is applied, once (see
    /// `caller_stopped`), and where a call with nowhere to sleep is refused (`nowhere_to_sleep`).
    struct whole_call : outermost {};
    // A function rather than `j < from`, which g++ warns about when `from` is the constant 0.
    static constexpr bool outside(std::size_t j, std::size_t from, std::size_t end) noexcept {
        return j < from || j >= end;
    }

    // Stage J's `enter` (a stage of the waiting form always waits). True when it proceeded;
    // otherwise `s` says how it stopped and `st.k` is J. One that throws refuses the call with what
    // it threw (`call_edges::threw`), and the stages outside it leave, as after any refusal.
    template <std::size_t J>
    RESILIENCE_DETAIL_ALWAYS_INLINE static bool entered(const Stages& stages, states& st, contexts_at at,
                                                        std::optional<outcome_type>& result, step& s) {
        if constexpr (enter_nothrow<policy_at<J>, outcome_type>) {
            enter_stage<J>(stages, st, at, result, s);
        } else {
            try {
                enter_stage<J>(stages, st, at, result, s);
            } catch (...) {
                call_edges<outcome_type>::threw(result);
                s = step::done;
            }
        }
        if (s == step::proceed)
            return true;
        st.k = J;
        return false;
    }
    template <std::size_t J>
    RESILIENCE_DETAIL_ALWAYS_INLINE static void enter_stage(const Stages& stages, states& st, contexts_at at,
                                                            std::optional<outcome_type>& result, step& s) {
        constexpr std::size_t here = context_slot(J), inside = context_slot(J + 1);
        if constexpr (inside != here)
            at.place(inside) = &at[here];
        if constexpr (fast_policy<policy_at<J>>) {
            st.template make<J>();
            const policy_at<J>& p = std::get<J>(stages);
            if constexpr (requires { p.enter(state<J>(st), at[here], result); }) {
                const entry e = p.enter(state<J>(st), at[here], result);
                s = e.what;
                if constexpr (inside != here) {
                    if (e.inner)
                        at.place(inside) = e.inner;
                }
            } else {
                // The 0.1 form, `enter(state, ctx, const context*& inner, result)`: deprecated, still run.
                s = p.enter(state<J>(st), at[here], at.place(inside), result);
            }
        } else {
            s = step::wait;
        }
    }
    // Enters the stages from `from` inward; stops at the first that does not proceed, leaving
    // how in `st.s` and its index in `st.k` (`size` when all did).
    template <class From, std::size_t... Js>
    static void enter_all(From from, const Stages& stages, states& st, contexts_at at,
                          std::optional<outcome_type>& result, std::index_sequence<Js...>) {
        step s = step::proceed; // a local until the end: one store to the frame, not one a stage
        st.k = size;
        (void)((outside(Js, from, size) || entered<Js>(stages, st, at, result, s)) && ...);
        st.s = s;
    }

    // Stage J's `leave`: true when the call goes on outward; false when the stage must wait, its
    // `resume` coming next, and then `w` is J. One that throws, against the protocol, goes on outward
    // with what it threw as the call's outcome.
    // Inlined (as `entered`): g++ would otherwise call the outermost stage's out of line, through a
    // copy of `at`, on every call (+28 instructions for five policies).
    template <std::size_t J>
    RESILIENCE_DETAIL_ALWAYS_INLINE static bool left(const Stages& stages, states& st, contexts_at at,
                                                     outcome_type& result, stage_index& w) {
        if constexpr (fast_policy<policy_at<J>>) {
            step s = step::proceed;
            if constexpr (leave_nothrow<policy_at<J>, outcome_type>) {
                s = std::get<J>(stages).leave(state<J>(st), at[context_slot(J)], result);
            } else {
                try {
                    s = std::get<J>(stages).leave(state<J>(st), at[context_slot(J)], result);
                } catch (...) {
                    call_edges<outcome_type>::threw(result);
                }
            }
            if (s == step::wait) {
                w = J;
                return false;
            }
        }
        return true;
    }
    // Leaves the stages inside `end` down to `from`, innermost first; returns the first that must
    // wait, or `none`.
    template <class End, class From, std::size_t... Js>
    static stage_index leave_all(End end, From from, const Stages& stages, states& st, contexts_at at,
                                 outcome_type& result, std::index_sequence<Js...>) {
        stage_index w = none;
        (void)((outside(size - 1 - Js, from, end) || left<size - 1 - Js>(stages, st, at, result, w)) && ...);
        return w;
    }

    /// `next` for the stages from `from` inward, then the leaf, in a frame of their own.
    struct inner_next {
        Stages stages;
        Leaf leaf;
        std::size_t from;
        task<outcome_type> operator()(const context& ctx) const {
            return drive<false>(stages_ref<Stages>{stages}, borrowed_next<Leaf>{leaf},
                                context_access::derive(ctx), from);
        }
    };
    template <std::size_t J>
    static auto next_after(const Stages& stages, const Leaf& leaf) {
        if constexpr (J + 1 == size)
            return leaf;
        else
            return inner_next{stages, leaf, J + 1};
    }

    // Waiting for admission in this frame (engine/frame_admission.hpp).
    using admission = frame_admission<Stages, states, outcome_type>;

    // ---- going round again in this frame (a retry: `again`, see policy.hpp) ----
    template <std::size_t... Js>
    static constexpr std::uint64_t again_stages(std::index_sequence<Js...>) {
        return (std::uint64_t{0} | ... |
                (admission::template goes_again_here<Js>() ? std::uint64_t{1} << Js : std::uint64_t{0}));
    }
    static constexpr std::uint64_t again_mask = again_stages(all_stages{});
    static constexpr bool any_goes_again = again_mask != 0;

    // Whether stage J may wait in a frame of its own: its `run` (a waiting-form policy, or one whose `enter`
    // may wait but not always here) or its `resume` (a `leave` that waits, not to go round again here).
    template <std::size_t J>
    static constexpr bool waits_in_a_frame_of_its_own() {
        using P = policy_at<J>;
        if constexpr (!fast_policy<P> || (enter_may_wait<P> && !(always_waits_in_frame<P> &&
                                                                 admission::template admits_here<J>())))
            return true;
        else if constexpr (admission::template goes_again_here<J>())
            return false;
        else
            return requires(const P& p, state_type<J>& st, const Stages& stages, const Leaf& leaf,
                            const context& c,
                            outcome_type r) { p.resume(st, next_after<J>(stages, leaf), c, std::move(r)); };
    }
    template <std::size_t... Js>
    static constexpr bool any_waits_in_own_frame(std::index_sequence<Js...>) {
        return (false || ... || waits_in_a_frame_of_its_own<Js>());
    }
    static constexpr bool any_stage_frame = any_waits_in_own_frame(all_stages{});

    // Stage `k`'s `again`, after its `leave` waited: the states of the stages inside it go first (they
    // ran their last round, and may refer to the context that `again` replaces); when it goes round
    // again, the stages inside it see the context it names.
    RESILIENCE_DETAIL_NOINLINE static step again_stage(std::size_t k, const Stages& stages, states& st,
                                                       contexts_at at, outcome_type& result) {
        return visit_stage<step>(
            k,
            [&](auto j) {
                constexpr std::size_t J = decltype(j)::value;
                if constexpr (admission::template goes_again_here<J>()) {
                    constexpr std::size_t here = context_slot(J), inside = context_slot(J + 1);
                    st.template destroy_range<J + 1>();
                    entry e = step::done;
                    try {
                        e = std::get<J>(stages).again(state<J>(st), at[here], result);
                    } catch (...) { // against the protocol: the call ends with what it threw
                        call_edges<outcome_type>::threw(result);
                    }
                    if constexpr (inside != here) {
                        if (e.what != step::done)
                            at.place(inside) = e.inner ? e.inner : &at[here];
                    }
                    return e.what;
                } else {
                    return step::done; // unreachable: only a stage with `again` gets here
                }
            },
            all_stages{});
    }
    // After the stages left as far as stage `k`, whose `leave` waited: while that is a stage that goes
    // round again here, its `again` decides. True when the stages inside it go round again: entered
    // already (`st.s` and `st.k` say how far, as after the first `enter_all`), or after its
    // `frame_wait` (`st.s` is `step::wait`, `st.k` the stage). False when the call is over (`st.k` is
    // `none`) or the stage that must wait is one of the others (its `resume`).
    // Out of line: the call gets here only when a stage's `leave` waited.
    template <class From>
    RESILIENCE_DETAIL_NOINLINE static bool goes_round(From from, const Stages& stages, states& st,
                                                      contexts_at at, std::optional<outcome_type>& result) {
        while (st.k != none && !st.running && ((again_mask >> st.k) & 1) != 0) {
            const step s = again_stage(st.k, stages, st, at, *result);
            if (s == step::proceed) {
                enter_all(std::size_t{st.k + 1}, stages, st, at, result, all_stages{});
                return true;
            }
            if (s == step::wait) {
                st.s = step::wait;
                return true;
            }
            st.k = leave_all(st.k, std::size_t{from}, stages, st, at, *result, all_stages{});
        }
        return false;
    }

    // After stage `k` is done (its `run` or `resume`, or a wait with nothing to go on in): the stages
    // outside it leave; true when one of them goes round again (`goes_round`).
    template <class From>
    static bool leave_outward(From from, const Stages& stages, states& st, contexts_at at,
                              std::optional<outcome_type>& result) {
        st.k = leave_all(st.k, std::size_t{from}, stages, st, at, *result, all_stages{});
        if constexpr (any_goes_again)
            return st.k != none && goes_round(from, stages, st, at, result);
        else
            return false;
    }

    /// `nowhere_to_sleep` for the drive of a whole call made without a home; false for any other drive
    /// (an inner one runs inside a call that was not refused), which then does not compile the refusal.
    template <class From, class S>
    static bool refused_without_home(const resume_on_loop& back, const S& stages,
                                     std::optional<outcome_type>& result) {
        if constexpr (std::is_same_v<From, whole_call>)
            return back.loop == nullptr && call_edges<outcome_type>::nowhere_to_sleep(stages, result);
        else
            return false;
    }

    // The call's shared clock reading (`call_now`) holds only while the call runs without
    // suspending: it is dropped before a stage that may wait reads the time, and after every wait.
    static void drop_reading(time_cache& cache) noexcept { cache.clear(); }
    /// Awaits the leaf's call or a stage's task and puts what it yields in the call's result, yielding
    /// nothing: g++ keeps the result of every `co_await`, and every temporary of its expression, in
    /// a place of its own in the frame; made in place, neither the value nor the awaiter has one.
    template <class Awaiter>
    struct emplacing {
        Awaiter a;
        std::optional<outcome_type>* result;
        template <class Holder>
        emplacing(Holder& holder, const context& ctx, std::optional<outcome_type>& r)
            : a(holder.leaf()(ctx)), result(&r) {}
        emplacing(task<outcome_type>& t, std::optional<outcome_type>& r)
            : a(std::move(t).operator co_await()), result(&r) {}
        bool await_ready() { return a.await_ready(); }
        template <class Promise>
        decltype(auto) await_suspend(std::coroutine_handle<Promise> h) {
            return a.await_suspend(h);
        }
        void await_resume() {
            try {
                result->emplace(a.await_resume());
            } catch (...) { // a stage's own frame let it out (a clock whose sleep threw): the call's failure
                call_edges<outcome_type>::threw(*result);
            }
        }
    };
    using leaf_awaiter = decltype(std::declval<Leaf&>()(std::declval<const context&>()));
    // The leaf of a call is the action's awaiter (`guarded_call`); the leaf of an inner drive, the
    // stages inside it, gives a task, awaited as a stage's task is; a `next` given to a policy's
    // `run` may give any awaitable of an outcome.
    static constexpr bool leaf_is_awaiter = requires(leaf_awaiter& a) { a.await_ready(); };
    static constexpr bool leaf_is_task = std::is_same_v<leaf_awaiter, task<outcome_type>>;
    using task_awaiter = decltype(std::declval<task<outcome_type>>().operator co_await());

    // The waiting paths, out of the drive's body so that every drive of the pipeline (with and
    // without throwing, and the inner ones) shares one instance of each.
    // Stage `k`'s `run` (`run_after_wait`), for a stage whose `enter` waited: the call from there in.
    static task<outcome_type> run_stage(std::size_t k, const Stages& stages, contexts_at at,
                                        const Leaf& leaf) {
        return visit_stage<task<outcome_type>>(
            k,
            [&](auto j) -> task<outcome_type> {
                constexpr std::size_t J = decltype(j)::value;
                if constexpr (enter_may_wait<policy_at<J>> && !always_waits_in_frame<policy_at<J>>)
                    return as_stage_task<outcome_type>(run_after_wait(
                        std::get<J>(stages), next_after<J>(stages, leaf), at[context_slot(J)]));
                else
                    return task<outcome_type>{}; // unreachable: it never waits, or only in the frame
            },
            all_stages{});
    }
    // `run_stage` out of line, for a pipeline whose waiting stages mostly wait in its frame: clang
    // would otherwise build the stage's `run` coroutine in the drive's own frame, making every
    // call's frame as large as a waiting one's.
    RESILIENCE_DETAIL_NOINLINE static task<outcome_type>
    run_stage_out_of_line(std::size_t k, const Stages& stages, contexts_at at, const Leaf& leaf) {
        return run_stage(k, stages, at, leaf);
    }
    // Stage `w`'s `resume`, for a stage whose `leave` waited: it may run the stages inside again.
    static task<outcome_type> resume_stage(std::size_t w, const Stages& stages, states& st, contexts_at at,
                                           const Leaf& leaf, outcome_type& result) {
        return visit_stage<task<outcome_type>>(
            w,
            [&](auto j) -> task<outcome_type> {
                constexpr std::size_t J = decltype(j)::value;
                if constexpr (requires {
                                  std::get<J>(stages).resume(state<J>(st), next_after<J>(stages, leaf),
                                                             at[context_slot(J)], std::move(result));
                              })
                    return std::get<J>(stages).resume(state<J>(st), next_after<J>(stages, leaf),
                                                      at[context_slot(J)], std::move(result));
                else
                    return task<outcome_type>{}; // unreachable: its `leave` never waits
            },
            all_stages{});
    }

    // The stages handed down (a reference to them, in the frame's own parameter), the ones a
    // pipeline keeps (a reference), or made from the policy the call holds.
    template <class Source>
    static decltype(auto) stages_from(const Source& source) {
        if constexpr (requires { source.stages; })
            return (source.stages);
        else
            return stages_of(source.get());
    }

    static contexts_at contexts(const context& ctx, states& st) noexcept { return {&ctx, st.places.data()}; }
    // How a wait for admission in this frame ended; out of line, so that the drive's body is as without it.
    template <class Source>
    RESILIENCE_DETAIL_NOINLINE static step admitted_how(typename admission::wait_in_frame& w,
                                                        const Source& source, const context& ctx, states& st,
                                                        std::optional<outcome_type>& r) {
        return w.settle(stages_from(source), st, contexts(ctx, st), r);
    }
    // The leaf's context: a function, so that no `contexts_at` is kept in the frame for the `co_await`.
    static const context& leaf_context(const context& ctx, states& st) noexcept {
        return contexts(ctx, st)[context_slot(size)];
    }

    /// `ctx`: the caller's context, or, for a drive inside another call (a stage's `run` or
    /// `resume`), one derived from that call's, which outlives it. It is the call's own context,
    /// used in place: moving it would cost a store-forwarding stall right after the frame's ramp.
    /// `from`: the first stage, `outermost` for a call, a `std::size_t` for an inner drive.
    template <bool Throw, class Source, class Holder, class From>
    static task<std::conditional_t<Throw, value_type, outcome_type>> drive(Source source, Holder holder,
                                                                           context ctx, From from) {
        // The frame keeps every local and every awaited temporary in a place of its own (g++ does not
        // share places between scopes), so the body has one `co_await` of each kind: the leaf, a
        // stage's `run` or `resume`, the admission, and what follows each wait.
        // The stages are read from `source` where they are used, not kept in a local: a tuple of
        // references to what `source` holds, which a local would keep a second time in the frame.
        time_cache cache;
        // What follows every wait of the call (its admission, the action, a stage's `run` or
        // `resume`): the clock reading taken before it is dropped (`drop_reading`), and `co_await
        // back` takes the call back to the loop it was made on (null: outside any loop) when the wait
        // ended on another thread. Awaited by name, it takes one place in the frame, not one a wait.
        resume_on_loop back{home_loop::current()};
        states st;
        attach_scratch(cache, ctx, st.scratch);
        context_access::attach(ctx, &cache);
        if constexpr (!std::is_same_v<From, whole_call>) {
            if (context_slot(from) != 0) // a drive from further in: its own context in its stage's slot
                contexts(ctx, st).place(context_slot(from)) = &ctx;
        }
        std::optional<outcome_type> result;
        // A call made on a loop (the common case) pays one test of a register here; one refused
        // enters no stage (`k` 0: none to leave).
        if (refused_without_home<From>(back, stages_from(source), result)) [[unlikely]] {
            st.k = 0;
        } else {
            enter_all(from, stages_from(source), st, contexts(ctx, st), result, all_stages{});
        }
        // Once round for a call; again from here each time a stage's `again` (a retry) sends the stages
        // inside it round again, in this frame.
        for (;;) {
            if constexpr (admission::any_waits_in_frame) {
                // A stage that waits for admission here (or before going round again): once
                // admitted, the call goes on inward from the stage after it, still in this frame.
                while (st.s == step::wait && admission::stage_waits_in_frame(st.k, stages_from(source),
                                                                             contexts(ctx, st), st.s, result))
                    [[unlikely]] {
                    drop_reading(cache);
                    try {
                        typename admission::wait_in_frame admitted{st.k, stages_from(source), st,
                                                                   contexts(ctx, st), result};
                        do // `step::wait`: not decided yet, await it again
                            co_await admitted;
                        while ((st.s = admitted_how(admitted, source, ctx, st, result)) == step::wait);
                    } catch (...) { // the wait itself failed (a clock whose sleep threw): the call ends so
                        st.s = step::done;
                        call_edges<outcome_type>::threw(result);
                    }
                    drop_reading(cache);
                    co_await back;
                    if (st.s == step::proceed) // `k` is read before enter_all writes it
                        enter_all(std::size_t{st.k + 1}, stages_from(source), st, contexts(ctx, st), result,
                                  all_stages{});
                }
            }
            // From here `k` is the stage that must wait (its `run` when its `enter` waited, its
            // `resume` or `again` when its `leave` did), after which the stages outside it leave;
            // `none` when the call is over. The leaf is made from `holder` where it is used, so that
            // it takes no place.
            if (st.s == step::proceed) {
                if constexpr (leaf_is_awaiter) {
                    co_await emplacing<leaf_awaiter>{holder, leaf_context(ctx, st), result};
                } else if constexpr (leaf_is_task) {
                    task<outcome_type> inner = holder.leaf()(leaf_context(ctx, st));
                    co_await emplacing<task_awaiter>{inner, result};
                } else {
                    result.emplace(co_await holder.leaf()(leaf_context(ctx, st)));
                }
                drop_reading(cache);
                co_await back;
                // The common path: every stage proceeded, so every stage leaves, innermost first.
                st.k = leave_all(std::integral_constant<std::size_t, size>{}, from, stages_from(source), st,
                                 contexts(ctx, st), *result, all_stages{});
            } else {
                drop_reading(cache);
                if (st.s == step::wait)
                    st.running = true; // stage `k` waits in its `run`
                else                   // outward from the stage inside the one that stopped
                    st.k = leave_all(st.k, std::size_t{from}, stages_from(source), st, contexts(ctx, st),
                                     *result, all_stages{});
            }
            if constexpr (any_goes_again) {
                if (st.k != none && goes_round(from, stages_from(source), st, contexts(ctx, st), result))
                    continue;
            }
            if constexpr (
                any_stage_frame) { // a stage that waits in a frame of its own: its `run` or `resume`
                if (st.k != none) [[unlikely]] {
                    task<outcome_type> waiting;
                    bool threw = false; // a `run` or `resume` that is no coroutine threw before its task
                    do {
                        try {
                            if (st.running)
                                waiting = admission::any_waits_in_frame
                                              ? run_stage_out_of_line(st.k, stages_from(source),
                                                                      contexts(ctx, st), holder.leaf())
                                              : run_stage(st.k, stages_from(source), contexts(ctx, st),
                                                          holder.leaf());
                            else
                                waiting = resume_stage(st.k, stages_from(source), st, contexts(ctx, st),
                                                       holder.leaf(), *result);
                        } catch (...) {
                            call_edges<outcome_type>::threw(result);
                            threw = true;
                        }
                        st.running = false;
                        if (waiting.valid()) [[likely]] {
                            co_await emplacing<task_awaiter>{waiting, result};
                            drop_reading(cache);
                            co_await back;
                            waiting = task<outcome_type>{}; // done: its frame is freed, on the call's loop
                        } else if (!std::exchange(threw, false)) { // a `step::wait` with nothing to go on in
                            call_edges<outcome_type>::no_way_on(result);
                        }
                        if (leave_outward(from, stages_from(source), st, contexts(ctx, st), result))
                            goto go_round; // `continue` would continue this loop
                    } while (st.k != none);
                }
            }
            if constexpr (!any_stage_frame) {
                while (st.k != none) [[unlikely]] { // a stage answered `step::wait` with nothing to go on in
                    st.running = false;
                    call_edges<outcome_type>::no_way_on(result);
                    if (leave_outward(from, stages_from(source), st, contexts(ctx, st), result))
                        goto go_round;
                }
            }
            break;
            [[maybe_unused]] go_round
                :; // the stages inside a stage that goes round were entered, or wait to be
        }
        if constexpr (std::is_same_v<From, whole_call>) {
            if (result->has_failure()) [[unlikely]]
                call_edges<outcome_type>::caller_stopped(ctx, *result, stages_from(source));
        }
        if constexpr (Throw)
            co_return std::move(*result).value();
        else
            co_return std::move(*result);
    }
};

} // namespace resilience::detail
