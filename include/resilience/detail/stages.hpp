// SPDX-License-Identifier: MIT
/// \file detail/stages.hpp
/// The stages a call passes through (a pipeline's policies, flattened, or the one policy), where a
/// call finds its policy (the caller's object, or its own copy), and how the driver picks the stage
/// whose index it knows only at run time.
#pragma once

#include "config.hpp"
#include "shared_handle.hpp"

#include <concepts>
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2::detail {

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

/// Writes `p.name()` to `*out` when `p` has a name and `out` is not null.
template <class P>
void name_of(const P& p, std::string* out) {
    if constexpr (requires { std::string{p.name()}; })
        if (out)
            *out = std::string{p.name()};
}

/// What a policy answers when asked whether a call through it may sleep on the default clock
/// (`rs::steady_clock`, which sleeps on the event loop running the call, see
/// `default_clock_sleeper`): nothing (`kind` null), or the policy's kind ("retry") and what sleeps
/// ("its backoff"), for the message that refuses a call with nowhere to sleep.
struct sleeper {
    const char* kind = nullptr;
    const char* why = nullptr;
    explicit operator bool() const noexcept { return kind != nullptr; }
};

/// Whether a call through `p` may sleep on the default clock, from the options in force now: what
/// `p.may_sleep_on_default_clock()` answers (a policy of the library whose clock is the default one
/// and whose options allow a sleep; a wrapper asks what it holds). A policy without that member
/// never sleeps there as far as the library can tell (a user's own), so it answers nothing.
template <class P>
sleeper default_clock_sleeper(const P& p) noexcept {
    if constexpr (requires {
                      { p.may_sleep_on_default_clock() } -> std::same_as<sleeper>;
                  })
        return p.may_sleep_on_default_clock();
    else
        return {};
}
/// The first of `stages` (a tuple of policies) that may sleep on the default clock, and its `name()`
/// when it has one.
template <class Stages, std::size_t... Js>
sleeper first_default_clock_sleeper(const Stages& stages, std::string* name, std::index_sequence<Js...>) {
    sleeper found;
    (void)((found = default_clock_sleeper(std::get<Js>(stages)),
            found && (name_of(std::get<Js>(stages), name), true)) ||
           ...);
    return found;
}
template <class Stages>
sleeper first_default_clock_sleeper(const Stages& stages, std::string* name = nullptr) {
    return first_default_clock_sleeper(stages, name, std::make_index_sequence<std::tuple_size_v<Stages>>{});
}

/// The message of the `std::logic_error` refusing a call that has nowhere to sleep (see
/// `driver::nowhere_to_sleep`): which policy may sleep, why, and the ways to give the call
/// somewhere to sleep.
RESILIENCE_DECL std::string nowhere_to_sleep_message(const sleeper& found, const std::string& name);

/// Calls `f(std::integral_constant<std::size_t, k>{})` for a stage index `k` known at run time:
/// a fold over the indices, so each `f` is instantiated once, with no chain of instantiations.
template <class R, class F, std::size_t... Js>
R visit_stage(std::size_t k, F&& f, std::index_sequence<Js...>) {
    R r{};
    (void)((k == Js && (r = f(std::integral_constant<std::size_t, Js>{}), true)) || ...);
    return r;
}

} // namespace resilience::detail

#if RESILIENCE_INCLUDE_DEFINITIONS
#include "../impl/stages.ipp"
#endif
