// SPDX-License-Identifier: MIT
/// \file engine/default_clock.hpp
/// `detail::is_default_clock`: whether a policy's clock is the default one, which sleeps on the
/// event loop running the call rather than anywhere of its own.
#pragma once

#include "../clock.hpp"

#include <concepts>
#include <type_traits>

namespace resilience::inline v0_2::detail {

/// True for `steady_clock` and `coarse_steady_clock` (and any clock deriving from them, which
/// sleeps as they do), and for an `any_clock` holding one of them: a clock whose sleeps need the
/// call to have somewhere to sleep (see `default_clock_sleeper`, detail/stages.hpp).
template <class C>
bool is_default_clock(const C& clock) noexcept {
    if constexpr (std::is_base_of_v<steady_clock, C>) {
        return true;
    } else if constexpr (requires {
                             { clock.template target<steady_clock>() } -> std::same_as<const steady_clock*>;
                             {
                                 clock.template target<coarse_steady_clock>()
                             } -> std::same_as<const coarse_steady_clock*>;
                         }) {
        return clock.template target<steady_clock>() != nullptr ||
               clock.template target<coarse_steady_clock>() != nullptr;
    } else {
        return false;
    }
}

} // namespace resilience::detail
