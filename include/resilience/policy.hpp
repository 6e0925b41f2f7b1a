// SPDX-License-Identifier: MIT
/// \file policy.hpp
/// The `policy` concept, the protocol policies implement, and `policy_base`, which turns that
/// protocol into the public calls and runs a whole pipeline in one coroutine frame.
///
/// The public calls, on every policy and pipeline:
///
///     co_await p.execute(action);                  // R, or rethrows the failure unchanged
///     co_await p.execute(action, stop_token);      // the caller's stop token reaches every attempt
///     co_await p.execute(action, ctx);             // from inside another attempt
///     co_await p.execute_outcome(action);          // outcome<R>, never throws for the action's failure
///
/// A call its caller stopped ends with a value an attempt returned or with `cancelled_error`, never
/// with what a stopped attempt threw (docs/core.md, "A call its caller stopped"); the driver applies
/// that where the call ends (`call_edges::caller_stopped`), so no policy has to.
///
/// The action is copied (an lvalue) or moved (an rvalue) into the call and kept alive until the
/// call ends; on g++ before 13, a temporary closure that owns something with a destructor is
/// refused (see `check_action_temporary`). Lifetimes follow one rule
/// (docs/core.md, "Lifetimes"): a call keeps alive every piece of shared state it touches until it
/// has ended, and the destruction of a call, resumed or not, touches nothing else. So a handle to
/// shared state (breaker, bulkhead, limiter, throttle, `any_policy`) called as an lvalue is copied
/// into the call, and may be destroyed or reassigned while the call runs. Any other policy (a
/// pipeline, a retry, a timeout) is configuration: called as an lvalue, it must stay alive while
/// the call may still be resumed, as an Asio I/O object for its operations (destroying it first,
/// and then the loop that holds the suspended call, is fine); called on an rvalue, it is moved
/// into the call:
///
///     rs::task<int> ok(rs::retry<>& r) { co_return co_await r.execute(fetch); }   // OK: r outlives the call
///     rs::task<int> also_ok() { return rs::retry<>{}.execute(fetch); }           // OK: moved into the call
///     rs::task<int> handle(rs::circuit_breaker<> b) { return b.execute(fetch); } // OK: b is copied in
///     rs::task<int> bad(rs::retry<> r) { return r.execute(fetch); }               // dangling: r dies first
///
/// How a policy is built: two ways, which compose freely in one pipeline.
///
/// 1. The waiting form, one member template (simple; one coroutine frame per call through it):
///
///        template <class Next>
///        task<outcome<R>> run(Next next, const context& ctx);
///
///    `next(ctx)` runs the rest of the pipeline (inner policies, then the action) once and yields
///    `outcome<R>` (`next_outcome_t<Next>`): failures travel as values, so a refusal reported
///    through `execute_outcome` never throws.
///
/// 2. The fast form, for calls that need no waiting. A `call_state` type (one per call, in the
///    pipeline's frame, default-constructed) and three const members:
///
///        entry enter(call_state&, const context& ctx, std::optional<outcome<R>>& result);
///        step leave(call_state&, const context& ctx, outcome<R>& result);
///        task<outcome<R>> resume(call_state&, Next next, const context& ctx, outcome<R> result);  // if leave may wait
///
///    `enter` admits the call without suspending: `step::proceed` (the stages inside see `ctx`, or
///    the context kept in the state that `entry::proceed_in(c)` names), `step::done` (refused:
///    `result` says why), or `step::wait` (it cannot decide without waiting: the pipeline then calls the
///    policy's `run`, which must exist and handle the whole call; a policy whose `enter` never
///    waits declares `static constexpr bool enter_never_waits = true;` instead, and one that does
///    neither does not compile). `leave` sees the result on the way out and may change it:
///    `step::proceed`, or `step::wait` to go on in `resume`, which may suspend and may call `next`
///    again. `leave` is called exactly once for every
///    `enter` that proceeded (once per round for a policy with `again`, below), unless the call's
///    frame is destroyed first (its event loop torn down): a state that holds something (a slot, a
///    timer) gives it back in its destructor.
///    `policy_base` gives a policy whose `enter` never waits a `run` made from these three.
///
///    A policy that runs the stages inside it again (a retry) can do so in the pipeline's frame,
///    with `again` and `frame_wait<R>` in place of `resume` (its `enter` must never wait):
///
///        entry again(call_state&, const context& ctx, outcome<R>& result);
///
///    After `leave` answered `step::wait`, `again` decides: `step::done` (the call goes on outward
///    with `result`), `entry::proceed_in(c)` (the stages inside run again at once, seeing `c`, kept
///    in the state), or `entry::wait_then_in(c)` (they run again after `frame_wait<R>`, made as
///    for admission below, yields `step::proceed`; on `step::done` the call goes on outward with
///    `result`). The
///    stages inside are entered afresh each round, their states made anew; the policy's own `enter`
///    runs once and its `leave` once per round, so what `enter` takes is given back once, in the
///    last round's `leave` (the one that does not wait) or the state's destructor.
///
///    A policy whose `enter` may wait can also wait without a frame of its own, as the bulkhead and
///    the rate limiters do: `bool waits_in_frame(const context&)` says whether it can for a call,
///    and `frame_wait<R>`, constructed from `(policy, call_state&, ctx, std::optional<outcome<R>>&
///    result)`, is the awaiter that waits, yielding `step::proceed` (admitted: the call goes on
///    inward in the pipeline's frame), `step::done` (refused: `result` says why) or `step::wait`
///    (not decided yet: the pipeline awaits the same object again). Its `await_resume` may take
///    the same four arguments as its constructor, so that it need not keep them. The pipeline makes
///    it in a block from the frame cache, only for a call that waits, with room after it for a call
///    it asks for more (`extra_bytes`, engine/protocol.hpp: a bulkhead's queue timeout or listener).
///    A policy whose `waits_in_frame` says true for every call may declare `static constexpr bool
///    always_waits_in_frame = true;`: a pipeline then never compiles its `run`, and it needs none
///    of its own (`policy_base`'s, a pipeline of one, serves a caller outside a pipeline).
///    A policy whose `run` serves more than a pipeline needs once its `enter` has waited may name
///    that part `run_waited(next, ctx)`, which the pipeline calls instead (the timeout: its watch
///    beside the call; engine/protocol.hpp, `runs_waited`).
///
/// A call through `pipeline{p1, p2, ..., pn}` (nested pipelines flattened) runs in one frame:
/// `p1.enter`, ..., `pn.enter`, the action, `pn.leave`, ..., `p1.leave`. A policy that waits
/// for admission through `frame_wait`, or before going round again (`again`), waits in that frame;
/// any other policy that waits costs a frame more: its `run` or `resume`, with the policies inside
/// it run in a frame of their own. A
/// policy of the waiting form always waits, so everything inside it runs the same way, in a frame
/// of its own, and is fast again.
///
/// Policies may share one clock reading while a call is admitted: `kit::call_now(clock, ctx)`
/// reads the clock once per call for every policy using the same clock type; the reading is
/// dropped as soon as the call suspends, so time read later is read afresh.
///
/// The machinery is in detail/: `step` and the protocol's compile-time checks in protocol.hpp,
/// how an action is called in action.hpp, the driver that runs a call's stages and keeps their
/// states in driver.hpp (with stages.hpp and, for waiting in the call's frame, frame_admission.hpp).
#pragma once

#include "concepts.hpp"
#include "context.hpp"
#include "detail/stages.hpp"
#include "engine/action.hpp"
#include "engine/protocol.hpp"
#include "engine/run_action.hpp"
#include "outcome.hpp"
#include "stop_token.hpp"
#include "task.hpp"

#include <concepts>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2 {

/// What `next(ctx)` yields in a policy's `run`: `outcome<R>`, the result type a custom policy returns
/// (`task<next_outcome_t<Next>>`).
template <class Next>
using next_outcome_t = detail::next_outcome_t<Next>;

namespace detail {

// Stand-ins used to check the `policy` concept. Defined, because checking a policy whose `run`
// has a deduced return type instantiates bodies that call them; they are never run, so each returns
// an empty task. Not coroutines: g++ 12 compiles an inline coroutine's body into every file at -O0
// whether or not anything calls it, and these would be in every file that includes a policy.
struct probe_action {
    task<int> operator()() const noexcept { return {}; }
};
struct probe_next {
    task<outcome<int>> operator()(const context&) const noexcept { return {}; }
};

} // namespace detail

/// Gives a policy its public calls. `Derived` provides either the fast protocol (`call_state`,
/// `enter`, `leave`, `resume`) or `run(next, ctx)` alone (see the file comment).
template <class Derived>
class policy_base {
public:
    /// Runs `f` under this policy; returns its value or rethrows the final failure as it was
    /// (`cancelled_error` when the caller stopped the call and no attempt returned a value). One entry,
    /// in three spellings:
    ///
    ///     co_await p.execute(action);              // action(ctx), action(stop_token) or action()
    ///     co_await p.execute(action, token_or_ctx); // the caller's stop token, or the context of the
    ///                                               // attempt this call runs in, reaches every attempt
    ///     co_await p.execute(f, args...);           // f(args..., ctx | stop_token | nothing) with copies
    ///                                               // of args kept for the call; a trailing stop token
    ///                                               // or context is the caller's, as above
    ///
    /// Called on an lvalue, a handle to shared state is copied into the call, and any other policy
    /// must stay alive while the call may be resumed; called on an rvalue (a temporary,
    /// `std::move(p)`), the policy is moved into the call. See the file comment.
    ///
    /// The action (or `f` and `args`) is copied (an lvalue) or moved (an rvalue) into the call, which
    /// keeps it until it ends. On g++ before 13, a temporary closure or aggregate that owns something
    /// with a destructor does not compile: g++ destroys it twice inside `co_await` (see
    /// RESILIENCE_ALLOW_CLOSURE_CAPTURES). The bound form is the one safe on every compiler for an
    /// action that needs data:
    ///
    ///     co_await r.execute([&](stop_token st) { return fetch(host, st); });   // OK: captures a reference
    ///     co_await r.execute(fetch, host);                                           // OK everywhere: fetch(host, st)
    ///     co_await r.execute([host](stop_token st) { return fetch(host, st); }); // g++ 12: does not compile
    template <class F, class... Args>
    detail::entry_task_t<true, F, Args...> execute(F&& f, Args&&... args) const& {
        return start<true>(ref(), std::forward<F>(f), std::forward<Args>(args)...);
    }
    template <class F, class... Args>
    detail::entry_task_t<true, F, Args...> execute(F&& f, Args&&... args) && {
        return start<true>(owned(), std::forward<F>(f), std::forward<Args>(args)...);
    }

    /// Like `execute`, but reports the final failure as a value (`outcome<R>`) instead of throwing it.
    template <class F, class... Args>
    detail::entry_task_t<false, F, Args...> execute_outcome(F&& f, Args&&... args) const& {
        return start<false>(ref(), std::forward<F>(f), std::forward<Args>(args)...);
    }
    template <class F, class... Args>
    detail::entry_task_t<false, F, Args...> execute_outcome(F&& f, Args&&... args) && {
        return start<false>(owned(), std::forward<F>(f), std::forward<Args>(args)...);
    }

    /// The suspending form of the protocol, made from the fast one: runs `next` (the rest of a
    /// pipeline) once under this policy, as a pipeline of one. A policy whose `enter` may answer
    /// `step::wait` either waits in that pipeline's frame (`always_waits_in_frame`: a bulkhead, a
    /// rate limiter) or defines its own `run`, which hides this one; one whose `enter` never does
    /// says so (`static constexpr bool enter_never_waits = true;`). A policy that does none of these
    /// does not compile: this `run` would hand the wait back to the policy's `run`, itself, without
    /// end.
    template <class Next>
    task<detail::next_outcome_t<Next>> run(Next next, const context& ctx) const {
        // `&Derived::run<Next>` names this very member (a pointer to a member of policy_base) when
        // Derived has no run of its own; a run of its own, whatever its form, names something else.
        constexpr bool inherited = requires {
            requires std::is_same_v<decltype(&Derived::template run<Next>),
                                    decltype(&policy_base::template run<Next>)>;
        };
        static_assert(
            !(inherited && detail::fast_policy<Derived> && detail::enter_may_wait<Derived> &&
              !detail::always_waits_in_frame<Derived>),
            "resilience: a policy whose enter may answer step::wait needs a run(next, ctx) of its own, "
            "which the pipeline calls to handle the call when enter waits (policy_base's run would "
            "enter the policy again, without end). Define template <class Next> "
            "rs::task<rs::next_outcome_t<Next>> run(Next next, const rs::context& ctx) const, or, if "
            "enter never answers step::wait, say so: static constexpr bool enter_never_waits = true;");
        using drv = detail::driver<detail::stages_t<Derived>, Next>;
        return drv::template drive<false>(ref(), detail::borrowed_next<Next>{std::move(next)},
                                          detail::context_access::derive(ctx), typename drv::outermost{});
    }

private:
    const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
    detail::policy_ref<Derived> ref() const noexcept { return {&self()}; }
    detail::policy_owned<Derived> owned() { return {std::move(static_cast<Derived&>(*this))}; }

    // Every call comes in here: `f` alone, or with the caller's stop token or context, is the action;
    // with arguments, `f` and copies of them make one (`bound_action`). The action and its context
    // then go to `Derived::launch`: `policy_base`'s own below, unless the policy has one of its own
    // (a `reloadable` pins its snapshot there).
    template <bool Throw, class Source, class F, class... Args>
    static auto start(Source source, F&& f, Args&&... args) {
        if constexpr (sizeof...(Args) == 0 ||
                      (sizeof...(Args) == 1 && (detail::is_call_context_v<Args> && ...))) {
            detail::check_action_temporary<F>();
            return Derived::template launch<Throw>(std::move(source), std::decay_t<F>(std::forward<F>(f)),
                                                   context{std::forward<Args>(args)...});
        } else {
            detail::check_bound_temporaries<F, Args...>();
            using rules = detail::bound_rules_t<F, Args...>;
            if constexpr (!rules::valid) {
                detail::refuse_bound_call<rules>();
                return task<
                    std::conditional_t<Throw, detail::invalid_action, outcome<detail::invalid_action>>>{};
            } else {
                auto all = std::forward_as_tuple(std::forward<Args>(args)...);
                constexpr std::size_t n = sizeof...(Args);
                using last = std::tuple_element_t<n - 1, decltype(all)>;
                if constexpr (detail::is_call_context_v<last>) {
                    context ctx{std::get<n - 1>(all)};
                    return Derived::template launch<Throw>(
                        std::move(source),
                        detail::bind_action(std::forward<F>(f), std::move(all),
                                            std::make_index_sequence<n - 1>{}),
                        std::move(ctx));
                } else {
                    return Derived::template launch<Throw>(std::move(source),
                                                           detail::bind_action(std::forward<F>(f),
                                                                               std::move(all),
                                                                               std::make_index_sequence<n>{}),
                                                           context{});
                }
            }
        }
    }

protected:
    /// Runs `action` in `ctx` under the policy `source` holds (by reference or owned): the driver,
    /// in one frame for the whole call. A policy that must do something first (pin a snapshot)
    /// hides it with a `launch` of its own.
    template <bool Throw, class Source, class A>
    static auto launch(Source source, A action, context ctx) {
        return detail::run_action<Throw>(std::move(source), std::move(action), std::move(ctx));
    }
};

/// A policy: wraps an action (a callable returning an awaitable) and is itself callable through
/// `execute`, `execute_outcome` and `run`, so policies compose. Checked with a probe action that
/// returns `task<int>`, since a policy is a template over every action type. Copyable, because a
/// pipeline holds its policies by value (a stateful policy's copy is a handle to the same state).
template <class P>
concept policy = std::copy_constructible<P> && requires(const P& p, detail::probe_action a, stop_token st,
                                                        const context& c, detail::probe_next n) {
    { p.execute(a) } -> awaitable_of<int>;
    { p.execute(a, st) } -> awaitable_of<int>;
    { p.execute_outcome(a) } -> awaitable_of<outcome<int>>;
    { p.run(n, c) } -> awaitable_of<outcome<int>>;
};

} // namespace resilience
