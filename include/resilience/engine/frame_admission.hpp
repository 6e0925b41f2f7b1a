// SPDX-License-Identifier: MIT
/// \file engine/frame_admission.hpp
/// Waiting for admission inside the pipeline's frame: for a stage whose `enter` answered
/// `step::wait` and that has `waits_in_frame` and `frame_wait<R>` (see policy.hpp), the call
/// suspends in its own frame on that stage's awaiter, and goes on inward from there once admitted.
/// A stage whose `again` answered `step::wait` (a retry's backoff) waits the same way, and the
/// stages inside it go round again from there.
#pragma once

#include "../context.hpp"
#include "../detail/frame_allocator.hpp"
#include "../detail/inline_start.hpp"
#include "../detail/inlining.hpp"
#include "../detail/stages.hpp"
#include "../outcome.hpp"
#include "call_edges.hpp"
#include "protocol.hpp"

#include <algorithm>
#include <cassert>
#include <coroutine>
#include <cstddef>
#include <memory>
#include <new>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2::detail {

/// What the driver of a call through `Stages` (a tuple of references to policies) needs to wait
/// for a stage's admission in its own frame. `States` is the driver's states of the stages
/// (`type_at<J>`, the type of stage J's, and `get<J>()`), `Outcome` the call's `outcome<R>`.
template <class Stages, class States, class Outcome>
struct frame_admission {
    static constexpr std::size_t size = std::tuple_size_v<Stages>;
    using all_stages = std::make_index_sequence<size>;
    using outcome_type = Outcome;
    using value_type = typename Outcome::value_type;
    template <std::size_t J>
    using policy_at = std::remove_cvref_t<std::tuple_element_t<J, Stages>>;

    /// Whether stage J goes round again after a wait here (`again`, a retry's backoff). A fast policy
    /// with an `again` of another form than the protocol's would never be asked: refused.
    template <std::size_t J>
    static constexpr bool goes_again_here() {
        using P = policy_at<J>;
        if constexpr (fast_policy<P>) {
            using S = typename States::template type_at<J>;
            constexpr bool has_again =
                requires(const P& p, S& st, const context& c, Outcome& r) { p.again(st, c, r); };
            constexpr bool fits = goes_again_in_frame<P, S, value_type>;
            static_assert(!has_again || fits,
                          "resilience: a policy's `again` must be `entry again(call_state&, const context&, "
                          "outcome<R>&) const`, with a `frame_wait<R>` constructible from (policy, "
                          "call_state&, const context&, std::optional<outcome<R>>&) (see policy.hpp)");
            return fits;
        } else {
            return false;
        }
    }
    /// Whether stage J can wait here: for admission (its `enter` may wait and it has the members for
    /// it), or before it goes round again.
    template <std::size_t J>
    static constexpr bool admits_here() {
        if constexpr (goes_again_here<J>()) {
            static_assert(
                !enter_may_wait<policy_at<J>>,
                "resilience: a policy with `again` waits in the frame only before going round "
                "again; its `enter` must never wait (static constexpr bool enter_never_waits = true;)");
            return true;
        } else if constexpr (fast_policy<policy_at<J>> && enter_may_wait<policy_at<J>>) {
            constexpr bool can =
                frame_waiting<policy_at<J>, typename States::template type_at<J>, value_type>;
            static_assert(can || !always_waits_in_frame<policy_at<J>>,
                          "resilience: a policy that says always_waits_in_frame needs waits_in_frame and a "
                          "frame_wait<R> for this result type (see policy.hpp)");
            return can;
        } else {
            return false;
        }
    }
    template <std::size_t J>
    using admission_at = typename policy_at<J>::template frame_wait<value_type>;
    // The size (or alignment) of stage J's admission awaiter, 0 if it has none.
    template <std::size_t J, bool Align>
    static constexpr std::size_t admission_extent() {
        if constexpr (admits_here<J>())
            return Align ? alignof(admission_at<J>) : sizeof(admission_at<J>);
        else
            return 0;
    }
    template <bool Align, std::size_t... Js>
    static constexpr std::size_t largest_admission(std::index_sequence<Js...>) {
        std::size_t n = 0;
        ((n = std::max(n, admission_extent<Js, Align>())), ...);
        return n;
    }
    static constexpr std::size_t admission_bytes = largest_admission<false>(all_stages{});
    static constexpr bool any_waits_in_frame = admission_bytes > 0;
    template <std::size_t... Js>
    static constexpr std::size_t count_admitting(std::index_sequence<Js...>) {
        return (std::size_t{0} + ... + std::size_t{admits_here<Js>()});
    }
    template <std::size_t... Js>
    static constexpr std::size_t first_admitting(std::index_sequence<Js...>) {
        std::size_t j = size;
        ((j = j == size && admits_here<Js>() ? Js : j), ...);
        return j;
    }
    // With one stage that waits here (a pipeline with one bulkhead or one limiter), which one is known;
    // with more, the one that waits is kept at the start of its awaiter's block.
    static constexpr bool one_admits = count_admitting(all_stages{}) == 1;
    static constexpr std::size_t the_admitting = first_admitting(all_stages{});
    static_assert(largest_admission<true>(all_stages{}) <= alignof(std::max_align_t),
                  "resilience: a policy's frame_wait must not be over-aligned");

    /// Whether stage `k`, whose `enter` waited, waits for admission here rather than in its `run`;
    /// always, for a stage whose `again` waits.
    /// A `waits_in_frame` that throws refuses the call with what it threw: false, `s` is
    /// `step::done` and `result` holds it.
    RESILIENCE_DETAIL_NOINLINE static bool stage_waits_in_frame(std::size_t k, const Stages& stages,
                                                                const contexts_at& at, step& s,
                                                                std::optional<Outcome>& result) {
        try {
            return visit_stage<bool>(
                k,
                [&](auto j) {
                    constexpr std::size_t J = decltype(j)::value;
                    if constexpr (goes_again_here<J>())
                        return true;
                    else if constexpr (admits_here<J>())
                        return std::get<J>(stages).waits_in_frame(at[States::context_slot(J)]);
                    else
                        return false;
                },
                all_stages{});
        } catch (...) {
            call_edges<Outcome>::threw(result);
            s = step::done;
            return false;
        }
    }
    /// Whether stage J's awaiter asks for room past itself for some calls (`asks_for_room`).
    template <std::size_t J>
    static constexpr bool asks_room() {
        if constexpr (admits_here<J>()) {
            using A = admission_at<J>;
            using S = typename States::template type_at<J>;
            constexpr bool asks = asks_for_room<A, policy_at<J>, S, value_type>;
            static_assert(
                asks || !means_room<A, policy_at<J>, S>,
                "resilience: a frame_wait that asks for room needs `static std::size_t "
                "extra_bytes(const P&, call_state&, const context&)`, `std::size_t extra_bytes() const "
                "noexcept` and a constructor taking the room as a fifth argument (void*)");
            return asks;
        } else {
            return false;
        }
    }

    /// Awaits stage `k`'s admission (out of line: the drive's common path stays small enough for
    /// the compiler to inline what it calls). The stage's awaiter is made in a block from the frame cache,
    /// taken only by a call that waits (so a call that does not carries no room for it), after the
    /// stage's index when more than one stage may wait here, and with the room it asked for after
    /// it; it is destroyed with this awaiter, also when the frame is destroyed while it waits. One
    /// pointer, as every byte of this awaiter is in every call's frame. Awaiting it yields nothing:
    /// `settle` then asks the stage's awaiter how the wait ended.
    struct wait_in_frame {
        // With more than one stage that may wait here, the block begins with the waiting stage's index.
        static constexpr std::size_t awaiter_at = one_admits ? 0 : alignof(std::max_align_t);
        void* space;

        RESILIENCE_DETAIL_NOINLINE wait_in_frame(std::size_t stage, const Stages& stages, States& st,
                                                 const contexts_at& at, std::optional<outcome_type>& result)
            : space(nullptr) {
            if constexpr (one_admits)
                assert(stage == the_admitting);
            on_stage(stage, [&](auto j) {
                constexpr std::size_t J = decltype(j)::value;
                const policy_at<J>& p = std::get<J>(stages);
                auto& s = st.template get<J>();
                const context& c = at[States::context_slot(J)];
                std::size_t room = 0;
                if constexpr (asks_room<J>())
                    room = admission_at<J>::extra_bytes(p, s, c);
                const std::size_t bytes = block_bytes<J>(room);
                space = frame_cache::allocate(bytes);
                if constexpr (!one_admits)
                    ::new (space) std::size_t(stage);
                unsigned char* const place = static_cast<unsigned char*>(space) + awaiter_at;
                try {
                    if constexpr (asks_room<J>())
                        ::new (place) admission_at<J>(
                            p, s, c, result, room == 0 ? nullptr : place + room_offset<admission_at<J>>);
                    else
                        ::new (place) admission_at<J>(p, s, c, result);
                } catch (...) {
                    frame_cache::deallocate(space, bytes);
                    throw;
                }
            });
        }
        wait_in_frame(const wait_in_frame&) = delete;
        wait_in_frame& operator=(const wait_in_frame&) = delete;
        RESILIENCE_DETAIL_NOINLINE ~wait_in_frame() {
            on_stage(stage(), [&](auto j) {
                constexpr std::size_t J = decltype(j)::value;
                auto* const a = get<J>();
                std::size_t room = 0;
                if constexpr (asks_room<J>())
                    room = a->extra_bytes();
                std::destroy_at(a);
                frame_cache::deallocate(space, block_bytes<J>(room));
            });
        }
        RESILIENCE_DETAIL_NOINLINE bool await_ready() {
            bool ready = true;
            on_stage(stage(), [&](auto j) { ready = get<decltype(j)::value>()->await_ready(); });
            return ready;
        }
        RESILIENCE_DETAIL_NOINLINE start_result await_suspend(std::coroutine_handle<> h) {
            start_result next = suspend_unless_done(false, h);
            on_stage(stage(), [&](auto j) {
                auto& a = *get<decltype(j)::value>();
                using result = decltype(a.await_suspend(h));
                if constexpr (std::is_void_v<result>) {
                    a.await_suspend(h);
                    next = suspend_unless_done(true, h);
                } else if constexpr (std::is_same_v<result, bool>) {
                    next = suspend_unless_done(a.await_suspend(h), h);
                } else {
                    next = transfer_to(a.await_suspend(h), h);
                }
            });
            return next;
        }
        void await_resume() const noexcept {}
        /// How the wait ended, from the stage's awaiter: its `await_resume`, given what it was made
        /// from when it takes that (so that it need not keep references to them).
        RESILIENCE_DETAIL_NOINLINE step settle(const Stages& stages, States& st, const contexts_at& at,
                                               std::optional<outcome_type>& result) {
            step s = step::done;
            on_stage(stage(), [&](auto j) {
                constexpr std::size_t J = decltype(j)::value;
                auto& a = *get<J>();
                if constexpr (requires(const policy_at<J>& p, typename States::template type_at<J>& x,
                                       const context& c) { a.await_resume(p, x, c, result); })
                    s = a.await_resume(std::get<J>(stages), st.template get<J>(), at[States::context_slot(J)],
                                       result);
                else
                    s = a.await_resume();
            });
            return s;
        }

    private:
        // The block's length for stage J's awaiter, with `room` bytes after it.
        template <std::size_t J>
        static constexpr std::size_t block_bytes(std::size_t room) noexcept {
            return room == 0 ? awaiter_at + sizeof(admission_at<J>)
                             : awaiter_at + room_offset<admission_at<J>> + room;
        }
        std::size_t stage() const noexcept {
            if constexpr (one_admits)
                return the_admitting;
            else
                return *std::launder(static_cast<std::size_t*>(space));
        }
        template <std::size_t J>
        admission_at<J>* get() const noexcept {
            return std::launder(
                reinterpret_cast<admission_at<J>*>(static_cast<unsigned char*>(space) + awaiter_at));
        }
        // Calls `f(std::integral_constant<std::size_t, k>{})`: stage `k` admits here (`waits_in_frame`).
        template <class F>
        static void on_stage(std::size_t k, F&& f) {
            if constexpr (one_admits) {
                (void)k;
                f(std::integral_constant<std::size_t, the_admitting>{});
            } else {
                visit_stage<bool>(
                    k,
                    [&](auto j) {
                        if constexpr (admits_here<decltype(j)::value>())
                            f(j);
                        return true;
                    },
                    all_stages{});
            }
        }
    };
};

} // namespace resilience::detail
