// SPDX-License-Identifier: MIT
/// \file engine/run_action.hpp
/// `run_action`, which `policy_base::execute` calls: checks the action, stores it, and starts the
/// driver (engine/driver.hpp) on the policy the call holds.
#pragma once

#include "../context.hpp"
#include "../detail/inlining.hpp"
#include "../detail/stages.hpp"
#include "action.hpp"
#include "driver.hpp"

#include <type_traits>
#include <utility>

namespace resilience::inline v0_2::detail {

template <class S>
inline constexpr bool is_policy_ref = false;
template <class P>
inline constexpr bool is_policy_ref<policy_ref<P>> = true;

// Inlined into `execute`: out of line, g++ passes the stored action through one more frame
// (callgrind, pipeline_of_five: 1,481 instructions per call inlined, 1,500 not).
template <bool Throw, class Source, class Action>
RESILIENCE_DETAIL_ALWAYS_INLINE auto run_valid_action(Source source, Action&& action, context ctx) {
    using A = std::remove_cvref_t<Action>;
    using policy_type = std::remove_cvref_t<decltype(source.get())>;
    using stages = stages_t<policy_type>;
    using drv = driver<stages, guarded<A>>;
    // The task is lazy: the caller's policy is read now, not when the task starts. A handle is
    // copied into the call, which then needs nothing of the caller's. A pipeline keeps its stages:
    // the call refers to them, in the pipeline it needs while it may be resumed; so does a
    // stateless policy's call, to the policy.
    if constexpr (is_policy_ref<Source> && copied_into_calls<policy_type>)
        return drv::template drive<Throw>(policy_owned<policy_type>{source.get()},
                                          owned_action<A>{std::move(action)}, std::move(ctx),
                                          typename drv::whole_call{});
    else if constexpr (is_policy_ref<Source> && !keeps_stages<policy_type>)
        return drv::template drive<Throw>(stages_ref<stages>{stages_of(source.get())},
                                          owned_action<A>{std::move(action)}, std::move(ctx),
                                          typename drv::whole_call{});
    else
        return drv::template drive<Throw>(std::move(source), owned_action<A>{std::move(action)},
                                          std::move(ctx), typename drv::whole_call{});
}

template <bool Throw, class Source, class A>
auto run_action(Source source, A action, context ctx) {
    if constexpr (!checked_action<A>::valid) {
        return refuse_action<Throw, A>();
    } else {
        // A small action shares one call body with every other of its result type (`erased_action`).
        return run_valid_action<Throw>(std::move(source), stored_action(std::move(action)), std::move(ctx));
    }
}

} // namespace resilience::detail
