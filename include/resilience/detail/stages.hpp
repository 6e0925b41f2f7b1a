// SPDX-License-Identifier: MIT
/// \file detail/stages.hpp
/// The stages a call passes through (a pipeline's policies, flattened, or the one policy), where a
/// call finds its policy (the caller's object, or its own copy), and how the driver picks the stage
/// whose index it knows only at run time.
#pragma once

#include "shared_handle.hpp"

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace resilience::detail {

/// The policies a call passes through, outermost first: a pipeline's, flattened (so nested
/// pipelines cost nothing), or the policy itself, by reference.
/// A pipeline made its tuple when it was built and hands out a reference to it: a call through a
/// pipeline refers to the pipeline (which it needs while it may be resumed) and builds no tuple of
/// its own. A call made on a handle refers to its own copy of it (see `copied_into_calls`).
template <class P>
decltype(auto) stages_of(const P& p) noexcept {
    if constexpr (requires { p.stages(); })
        return p.stages();
    else
        return std::tuple<const P&>(p);
}
/// The tuple type of `stages_of(p)`.
template <class P>
using stages_t = std::remove_cvref_t<decltype(stages_of(std::declval<const P&>()))>;
/// Whether `stages_of(p)` is a reference to a tuple that `p` keeps (a pipeline's).
template <class P>
inline constexpr bool keeps_stages = std::is_reference_v<decltype(stages_of(std::declval<const P&>()))>;

/// Whether a call made on an lvalue `P` copies it into its frame rather than referring to it: a
/// handle to shared state (`shared_handle`), or a policy that says so
/// (`static constexpr bool copied_into_calls = true;`, as single_flight's keyed policy). Such a call
/// then needs nothing of the caller's: the lifetime rule (detail/shared_handle.hpp).
template <class P>
inline constexpr bool copied_into_calls = is_shared_handle<P> || requires { requires P::copied_into_calls; };

/// Where a call finds its policy: the caller's object (needed while the call may be resumed), or a policy
/// moved (or, for a handle, copied) into the call's own frame (`std::move(p).execute(...)`,
/// `execute` on a temporary, or on a handle).
template <class P>
struct policy_ref {
    const P* p;
    const P& get() const noexcept { return *p; }
};
template <class P>
struct policy_owned {
    P p;
    const P& get() const noexcept { return p; }
};
/// The stages of an inner `drive`, handed down from the frame that owns them.
template <class Stages>
struct stages_ref {
    Stages stages;
};

/// Calls `f(std::integral_constant<std::size_t, k>{})` for a stage index `k` known at run time:
/// a fold over the indices, so each `f` is instantiated once, with no chain of instantiations.
template <class R, class F, std::size_t... Js>
R visit_stage(std::size_t k, F&& f, std::index_sequence<Js...>) {
    R r{};
    (void)((k == Js && (r = f(std::integral_constant<std::size_t, Js>{}), true)) || ...);
    return r;
}

} // namespace resilience::detail
