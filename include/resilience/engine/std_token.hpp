// SPDX-License-Identifier: MIT
/// \file engine/std_token.hpp
/// The edge where a callable takes the standard library's `std::stop_token` instead of the
/// library's own (stop_token.hpp): an action, or the `make` of `async_run`, `spawn` and
/// `async_scope`. Such a callable is called with a standard token that the call's token stops,
/// and its awaitable is awaited in a small frame that keeps the bridge alive until it ends.
#pragma once

#include "../concepts.hpp"
#include "../stop_token.hpp"
#include "../task.hpp"

#include <functional>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2::detail {

#if RESILIENCE_HAS_STD_STOP_TOKEN
/// Calls `f` with a standard token linked to `t` and awaits what it returns.
template <class F>
auto with_std_token(F f, stop_token t)
    -> task<await_result_t<std::invoke_result_t<std::remove_reference_t<F>&, std::stop_token>>> {
    std_stop_link link(t);
    co_return co_await std::invoke(f, link.get_token());
}

/// A `make(std::stop_token)` as a `make(rs::stop_token)`.
template <class F>
struct std_token_maker {
    F make;
    auto operator()(stop_token t) { return with_std_token(std::ref(make), std::move(t)); }
};
#endif

/// Whether `F` can be called with a stop token: the library's, or the standard library's.
template <class F>
inline constexpr bool takes_a_stop_token = std::is_invocable_v<F&, stop_token>
#if RESILIENCE_HAS_STD_STOP_TOKEN
                                           || std::is_invocable_v<F&, std::stop_token>
#endif
    ;

/// What a callable taking a stop token becomes to take the library's: itself when it does.
template <class F>
#if RESILIENCE_HAS_STD_STOP_TOKEN
using rs_token_maker_t = std::conditional_t<std::is_invocable_v<F&, stop_token>, F, std_token_maker<F>>;
#else
using rs_token_maker_t = F;
#endif

/// `f`, moved into an `rs_token_maker_t<F>`. Takes `f` by reference: a function taking it by value
/// and returning it is one g++ 12 at -O1 judges to have no effect on memory, and then loses track of
/// what the callable's captures point to (a caller's variable written by the call reads as before).
template <class F>
requires(!std::is_reference_v<F>)
rs_token_maker_t<F> rs_token_maker(F&& f) {
    return rs_token_maker_t<F>{std::move(f)};
}

} // namespace resilience::detail
