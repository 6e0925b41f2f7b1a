// SPDX-License-Identifier: MIT
/// \file detail/stage_state.hpp
/// `stage_states<Ts...>`: the states of a call's stages (each fast policy's `call_state`), kept in
/// the call's frame and constructed one by one as the call reaches each stage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <tuple>
#include <type_traits>

namespace resilience::detail {

/// The states of a call's stages, outermost first. Stage J's state is constructed when the call
/// reaches the stage, just before its `enter` (`make<J>()`), and destroyed with the frame,
/// innermost first, as the stages leave: constructing them all up front compiles to zeroing the
/// whole block, which costs more than the states' own work on the fast path. Only the states with
/// a destructor are remembered as made (a bit each: at most 64 stages).
template <class... Ts>
class stage_states {
    static_assert(sizeof...(Ts) <= 64, "resilience::pipeline: at most 64 stages");

    // Room for one state, constructed by `make`.
    template <class T>
    struct slot {
        slot() noexcept {}
        slot(const slot&) = delete;
        slot& operator=(const slot&) = delete;
        ~slot() {}
        union {
            T value;
        };
    };
    template <class... Us>
    struct pack {};
    template <class U, class... Us>
    struct pack<U, Us...> {
        slot<U> head;
        pack<Us...> tail;
    };
    template <std::size_t J, class P>
    static auto& slot_at(P& p) noexcept {
        if constexpr (J == 0)
            return p.head;
        else
            return slot_at<J - 1>(p.tail);
    }

public:
    /// The type of stage J's state.
    template <std::size_t J>
    using type_at = std::tuple_element_t<J, std::tuple<Ts...>>;

    stage_states() noexcept {}
    stage_states(const stage_states&) = delete;
    stage_states& operator=(const stage_states&) = delete;
    ~stage_states() { destroy<sizeof...(Ts)>(); }

    /// Constructs stage J's state (once per call).
    template <std::size_t J>
    void make() {
        // Default-initialised: std::construct_at would value-initialise, zeroing it first.
        ::new (static_cast<void*>(&slot_at<J>(p_).value)) type_at<J>;
        if constexpr (!std::is_trivially_destructible_v<type_at<J>>)
            made_ |= std::uint64_t{1} << J;
    }
    /// Stage J's state, once made.
    template <std::size_t J>
    type_at<J>& get() noexcept {
        return slot_at<J>(p_).value;
    }

private:
    // Innermost first, as the stages leave.
    template <std::size_t N>
    void destroy() noexcept {
        if constexpr (N > 0) {
            if constexpr (!std::is_trivially_destructible_v<type_at<N - 1>>) {
                if (made_ & (std::uint64_t{1} << (N - 1)))
                    std::destroy_at(&slot_at<N - 1>(p_).value);
            }
            destroy<N - 1>();
        }
    }

    pack<Ts...> p_;
    std::uint64_t made_ = 0; // bit J: stage J's state is constructed (only those with a destructor)
};

} // namespace resilience::detail
