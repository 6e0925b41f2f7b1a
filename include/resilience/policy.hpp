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
///        step enter(call_state&, const context& ctx, const context*& inner, std::optional<outcome<R>>& result);
///        step leave(call_state&, const context& ctx, outcome<R>& result);
///        task<outcome<R>> resume(call_state&, Next next, const context& ctx, outcome<R> result);  // if leave may wait
///
///    `enter` admits the call without suspending: `step::proceed` (the stages inside see `*inner`,
///    which it may point at a context kept in the state), `step::done` (refused: `result` says
///    why), or `step::wait` (it cannot decide without waiting: the pipeline then calls the
///    policy's `run`, which must exist and handle the whole call; a policy whose `enter` never
///    waits declares `static constexpr bool enter_never_waits = true;` instead, and one that does
///    neither does not compile). `leave` sees the result on the way out and may change it:
///    `step::proceed`, or `step::wait` to go on in `resume`, which may suspend and may call `next`
///    again (a retry). `leave` is called exactly once for every
///    `enter` that proceeded, unless the call's frame is destroyed first (its event loop torn
///    down): a state that holds something (a slot, a timer) gives it back in its destructor.
///    `policy_base` gives a policy whose `enter` never waits a `run` made from these three.
///
///    A policy whose `enter` may wait can also wait without a frame of its own, as the bulkhead and
///    the rate limiters do: `bool waits_in_frame(const context&)` says whether it can for a call,
///    and `frame_wait<R>`, constructed from `(policy, call_state&, ctx, std::optional<outcome<R>>&
///    result)`, is the awaiter that waits, yielding `step::proceed` (admitted: the call goes on
///    inward in the pipeline's frame), `step::done` (refused: `result` says why) or `step::wait`
///    (not decided yet: the pipeline awaits the same object again). The pipeline makes it in a
///    block from the frame cache, only for a call that waits.
///
/// A call through `pipeline{p1, p2, ..., pn}` (nested pipelines flattened) runs in one frame:
/// `p1.enter`, ..., `pn.enter`, the action, `pn.leave`, ..., `p1.leave`. A policy that waits
/// for admission through `frame_wait` waits in that frame; any other policy that waits costs a
/// frame more: its `run` or `resume`, with the policies inside it run in a frame of their own. A
/// policy of the waiting form always waits, so everything inside it runs the same way, in a frame
/// of its own, and is fast again.
///
/// Policies may share one clock reading while a call is admitted: `detail::call_now(clock, ctx)`
/// reads the clock once per call for every policy using the same clock type; the reading is
/// dropped as soon as the call suspends, so time read later is read afresh.
#pragma once

#include "concepts.hpp"
#include "context.hpp"
#include "detail/shared_handle.hpp"
#include "event_loop.hpp"
#include "outcome.hpp"
#include "task.hpp"

#include <algorithm>
#include <concepts>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <stop_token>
#include <tuple>
#include <type_traits>
#include <utility>

namespace resilience {

namespace detail {

/// Resumes the awaiting coroutine on `loop` (posted), for a call whose action finished on another
/// thread: a call returns on the loop it was made on, whatever thread its action ended on.
struct resume_on_loop {
    event_loop* loop;
    bool await_ready() const noexcept { return event_loop::current() == loop; }
    void await_suspend(std::coroutine_handle<> h) const { loop->post(h); }
    void await_resume() const noexcept {}
};

/// Calls an action the way it asks to be called: with the context, with the stop token, or bare.
template <class A>
decltype(auto) invoke_action(A& a, const context& ctx) {
    if constexpr (std::is_invocable_v<A&, const context&>)
        return std::invoke(a, ctx);
    else if constexpr (std::is_invocable_v<A&, std::stop_token>)
        return std::invoke(a, ctx.stop_token());
    else {
        static_assert(std::is_invocable_v<A&>,
                      "an action must be callable with (rs::context const&), (std::stop_token) or ()");
        return std::invoke(a);
    }
}

template <class A>
using action_awaitable_t = decltype(invoke_action(std::declval<A&>(), std::declval<const context&>()));

/// The type an action's awaitable produces: what `execute` returns.
template <class A>
using action_result_t = await_result_t<action_awaitable_t<A>>;

/// What `execute` returns for an action that breaks the rules below: the call's body then stops at
/// a `static_assert` that names the rule, instead of the signature failing to form (which makes a
/// compiler list every overload it tried, without saying why).
struct invalid_action {
    // Converts to whatever the caller expected (declared only: never called), so the caller's own
    // code adds no error of its own beside the one that names the rule.
    template <class T>
    operator T() const noexcept;
};

template <class A>
inline constexpr bool callable_action =
    std::is_invocable_v<A&, const context&> || std::is_invocable_v<A&, std::stop_token> || std::is_invocable_v<A&>;

template <class T, bool Valid>
struct result_if {
    using type = invalid_action;
};
template <class T>
struct result_if<T, true> {
    using type = await_result_t<T>;
};
template <class A, bool = callable_action<A>>
struct checked_action {
    static constexpr bool valid = false;
    using result = invalid_action;
};
template <class A>
struct checked_action<A, true> {
    using awaitable_type = action_awaitable_t<A>;
    static constexpr bool returns_awaitable = awaitable<awaitable_type>;
    static constexpr bool valid = returns_awaitable && !std::is_reference_v<awaitable_type>;
    using result = typename result_if<awaitable_type, valid>::type;
};
/// `action_result_t<A>`, or `invalid_action` when `A` is not an action: what `execute` declares.
template <class A>
using checked_result_t = typename checked_action<A>::result;

/// The rules an action must follow, each a `static_assert` naming it.
template <class A>
void check_action() {
    static_assert(callable_action<A>,
                  "resilience: an action must be callable with (rs::context const&), (std::stop_token) or () "
                  "(with execute(f, args...), with (args..., ctx), (args..., stop_token) or (args...))");
    if constexpr (callable_action<A>) {
        static_assert(checked_action<A>::returns_awaitable,
                      "resilience: an action must return an awaitable such as rs::task<T> (it returns a plain "
                      "value: make it a coroutine that co_returns the value)");
        static_assert(!std::is_reference_v<action_awaitable_t<A>>,
                      "resilience: an action must return its awaitable by value, not a reference");
    }
}

// ---- g++ before 13: no closure temporary that g++ destroys twice ----
//
// g++ 12 miscompiles a lambda-expression or an aggregate initialisation (braces or parentheses)
// written as a temporary inside a `co_await` expression: it builds the object, copies its bytes to
// another slot of the coroutine frame, hands that copy to the callee, and at the end of the full
// expression destroys both. Whatever `execute` does with its argument (takes it by value, by
// reference, moves from it), one of the two destructions frees what the other already freed: for
// a closure that captures a `std::string` or a `shared_ptr`, a double free. Nothing in the
// callee can undo it, so `execute` refuses, on those compilers, what it cannot tell apart from it:
// an rvalue closure or aggregate that is not trivially destructible (an action or an argument of
// `execute(f, args...)`). Trivially destructible ones (`[&]`, `[this]`, captures of ints and
// pointers) are destroyed twice harmlessly and pass; so do lvalues (copied by a constructor) and
// classes with constructors. Define RESILIENCE_ALLOW_CLOSURE_CAPTURES to turn the check off
// (for code that never writes such a temporary inside `co_await`).
#if defined(__GNUC__) && !defined(__clang__) && !defined(__INTEL_COMPILER) && __GNUC__ < 13 &&                 \
    !defined(RESILIENCE_ALLOW_CLOSURE_CAPTURES)
#define RESILIENCE_DETAIL_REFUSE_TEMPORARY_CLOSURES 1
#else
#define RESILIENCE_DETAIL_REFUSE_TEMPORARY_CLOSURES 0
#endif

#if RESILIENCE_DETAIL_REFUSE_TEMPORARY_CLOSURES
/// Whether `T` is a lambda's closure type. g++ has no trait for it; its spelling of the type in
/// `__PRETTY_FUNCTION__` ("[with T = f()::<lambda(int)>]") ends in the `<lambda(...)>` that
/// names it, where a class that merely has a closure among its template arguments does not.
template <class T>
constexpr bool is_closure_type() noexcept {
    constexpr const char* name = __PRETTY_FUNCTION__;
    constexpr std::size_t length = sizeof(__PRETTY_FUNCTION__) - 1;
    // The type runs from after "T = " to the final ']'.
    std::size_t end = length;
    while (end > 0 && name[end - 1] != ']')
        --end;
    if (end < 2 || name[end - 2] != '>')
        return false;
    std::size_t i = end - 2; // the last '>' of the type: find the '<' it closes
    int depth = 0;
    for (;;) {
        if (name[i] == '>')
            ++depth;
        else if (name[i] == '<' && --depth == 0)
            break;
        if (i == 0)
            return false;
        --i;
    }
    constexpr char lambda[] = "<lambda(";
    for (std::size_t k = 0; k + 1 < sizeof lambda; ++k)
        if (i + k >= end || name[i + k] != lambda[k])
            return false;
    return true;
}

/// An rvalue of this type, written inside a `co_await` expression, is destroyed twice by g++ 12.
template <class T>
inline constexpr bool destroyed_twice_as_temporary =
    std::is_class_v<T> && !std::is_trivially_destructible_v<T> && (std::is_aggregate_v<T> || is_closure_type<T>());
#else
template <class T>
inline constexpr bool destroyed_twice_as_temporary = false;
#endif

/// Refuses an action passed to `execute(action)` that g++ 12 would destroy twice (see above).
/// `A` is the forwarding reference's deduced type: an lvalue reference for an lvalue.
template <class A>
constexpr void check_action_temporary() noexcept {
    static_assert(std::is_lvalue_reference_v<A> || !destroyed_twice_as_temporary<std::remove_cv_t<A>>,
                  "resilience: on g++ before 13, a temporary lambda (or aggregate) that owns something with a "
                  "destructor, passed to execute, is destroyed twice when written inside co_await (a g++ bug: "
                  "double free). Write execute(f, args...), which calls f(args..., stop_token) with copies of "
                  "args, or pass a named callable as an lvalue; RESILIENCE_ALLOW_CLOSURE_CAPTURES turns this "
                  "check off (docs/core.md#compiler-notes)");
}
/// The same for `execute(f, args...)`: `f` and every argument.
template <class F, class... Args>
constexpr void check_bound_temporaries() noexcept {
    static_assert(
        (std::is_lvalue_reference_v<F> || !destroyed_twice_as_temporary<std::remove_cv_t<F>>)&&(
            (std::is_lvalue_reference_v<Args> || !destroyed_twice_as_temporary<std::remove_cv_t<Args>>)&&...),
        "resilience: on g++ before 13, a temporary lambda (or aggregate) that owns something with a destructor, "
        "passed to execute(f, args...), is destroyed twice when written inside co_await (a g++ bug: double "
        "free). Pass the function itself and its data as arguments (execute(f, args...) with f a function or "
        "a lambda without such captures), or name the callable and pass it as an lvalue; "
        "RESILIENCE_ALLOW_CLOSURE_CAPTURES turns this check off (docs/core.md#compiler-notes)");
}

/// What `next(ctx)` yields once awaited: `outcome<R>`.
template <class Next>
using next_outcome_t = await_result_t<std::invoke_result_t<Next&, const context&>>;
template <class Next>
using next_value_t = typename next_outcome_t<Next>::value_type;

/// Awaits one call of the user's action and yields `outcome<R>`: whatever the action throws, when
/// called or while awaited, becomes a failure. A plain awaiter rather than a coroutine, so the
/// innermost step of every call costs no frame. It lives in the awaiting coroutine's frame for the
/// whole `co_await`, which is what keeps the action's awaitable alive until the action finishes;
/// the context it hands the action lives in the same frame or an enclosing one.
template <class A>
class guarded_call {
    using awaitable_type = action_awaitable_t<A>;
    static_assert(!std::is_reference_v<awaitable_type>, "an action must return its awaitable by value");
    using raw_awaiter = decltype(get_awaiter(std::declval<awaitable_type>()));
    // An awaitable without operator co_await is its own awaiter; an operator co_await may hand back
    // an awaiter by value (kept here) or by reference (pointed to: it lives in the awaitable).
    static constexpr bool self_awaiting =
        !has_member_co_await<awaitable_type> && !has_free_co_await<awaitable_type>;
    static constexpr bool awaiter_by_reference = !self_awaiting && std::is_reference_v<raw_awaiter>;
    using awaiter_type =
        std::conditional_t<self_awaiting, awaitable_type, std::remove_reference_t<raw_awaiter>>;
    using awaiter_slot = std::conditional_t<
        self_awaiting, char,
        std::conditional_t<awaiter_by_reference, awaiter_type*, std::optional<awaiter_type>>>;

public:
    using value_type = action_result_t<A>;

    guarded_call(A* action, const context& ctx) noexcept : ctx_(&ctx), action_(action) {}
    // Moved only before it is awaited (into when_all and the like): nothing has started yet.
    guarded_call(guarded_call&& other) noexcept : ctx_(other.ctx_), action_(other.action_) {}
    guarded_call& operator=(guarded_call&&) = delete;

    bool await_ready() noexcept {
        try {
            awaitable_.emplace(emplace_from{[&] { return invoke_action(*action_, *ctx_); }});
            if constexpr (awaiter_by_reference)
                awaiter_ = &get_awaiter(std::move(*awaitable_));
            else if constexpr (!self_awaiting)
                awaiter_.emplace(emplace_from{[&] { return get_awaiter(std::move(*awaitable_)); }});
            return awaiter().await_ready();
        } catch (...) {
            early_ = failure::current();
            return true;
        }
    }

    template <class Promise>
    auto await_suspend(std::coroutine_handle<Promise> h) noexcept {
        using result = decltype(awaiter().await_suspend(h));
        // One return type for both paths: bool, or what a handle becomes (the awaiter may return any
        // coroutine_handle<P>; see detail/inline_start.hpp).
        if constexpr (std::is_void_v<result> || std::is_same_v<result, bool>) {
            try {
                if constexpr (std::is_void_v<result>) {
                    awaiter().await_suspend(h);
                    return true;
                } else {
                    return static_cast<bool>(awaiter().await_suspend(h));
                }
            } catch (...) {
                early_ = failure::current();
                return false; // resume the awaiting coroutine at once: await_resume reports the failure
            }
        } else {
            std::coroutine_handle<> next;
            try {
                next = awaiter().await_suspend(h);
            } catch (...) {
                early_ = failure::current();
                return suspend_unless_done(false, h);
            }
            return transfer_to(next, h);
        }
    }

    outcome<value_type> await_resume() noexcept {
        if (early_.has_exception())
            return std::move(early_);
        try {
            if constexpr (std::is_void_v<value_type>) {
                awaiter().await_resume();
                return outcome<void>{};
            } else {
                return outcome<value_type>(awaiter().await_resume());
            }
        } catch (...) {
            return failure::current();
        }
    }

private:
    awaiter_type& awaiter() noexcept {
        if constexpr (self_awaiting)
            return *awaitable_;
        else
            return *awaiter_; // the optional's value, or the pointed-to awaiter
    }

    const context* ctx_; // outlives the awaiter: it is the awaiting frame's, or its caller's
    A* action_;
    std::optional<awaitable_type> awaitable_;
    awaiter_slot awaiter_{};
    failure early_;
};

/// The innermost `next`: runs the user's action once (see `guarded_call`).
template <class A>
struct guarded {
    A* action;
    using value_type = action_result_t<A>;
    guarded_call<A> operator()(const context& ctx) const { return guarded_call<A>{action, ctx}; }
};

} // namespace detail

/// What `next(ctx)` yields in a policy's `run`: `outcome<R>`, the result type a custom policy returns
/// (`task<next_outcome_t<Next>>`).
template <class Next>
using next_outcome_t = detail::next_outcome_t<Next>;

/// A policy's answer to the pipeline on its fast path (see the file comment).
enum class step : unsigned char {
    proceed, ///< `enter`: admitted, go on inward. `leave`: finished here, go on outward.
    done,    ///< `enter`: not admitted; the result holds why (a refusal, a cancellation).
    wait,    ///< `enter`: cannot decide without suspending: the pipeline calls `run` instead.
             ///< `leave`: has more to do (a retry, a timer to disarm): the pipeline calls `resume`.
};

namespace detail {

/// A policy with the fast protocol: `call_state`, `enter`, `leave`, `resume` (file comment).
template <class P>
concept fast_policy = requires { typename P::call_state; };

/// A fast policy whose `enter` never answers `step::wait` says so
/// (`static constexpr bool enter_never_waits = true;`), and the pipeline then does not even
/// instantiate its `run` for the call: less to compile.
template <class P>
inline constexpr bool enter_may_wait = !requires { requires P::enter_never_waits; };

/// A fast policy whose `enter` may wait and that can also wait for admission without a frame of
/// its own: `waits_in_frame` and `frame_wait<R>` (see the file comment).
template <class P, class S, class R>
concept frame_waiting = requires(const P& p, const context& c) {
    { p.waits_in_frame(c) } -> std::same_as<bool>;
    typename P::template frame_wait<R>;
    requires std::is_constructible_v<typename P::template frame_wait<R>, const P&, S&, const context&,
                                     std::optional<outcome<R>>&>;
};

template <class P>
struct state_of {
    struct type {};
};
template <fast_policy P>
struct state_of<P> {
    using type = typename P::call_state;
};

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
inline constexpr bool copied_into_calls = is_shared_handle<P> || requires {
    requires P::copied_into_calls;
};

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

/// `execute(f, args...)`'s action: `f` with copies of the arguments, called with them (as lvalues,
/// since a retry calls it again) and then with the attempt's context or stop token when `f` takes
/// one. Built inside the library, so no closure with members is a temporary of the caller's
/// `co_await` expression (which g++ 12 destroys twice).
template <class F, class... Args>
struct bound_action {
    F f;
    std::tuple<Args...> args;
    decltype(auto) operator()(const context& ctx) {
        return std::apply(
            [&](Args&... a) -> decltype(auto) {
                if constexpr (std::is_invocable_v<F&, Args&..., const context&>)
                    return std::invoke(f, a..., ctx);
                else if constexpr (std::is_invocable_v<F&, Args&..., std::stop_token>)
                    return std::invoke(f, a..., ctx.stop_token());
                else {
                    static_assert(std::is_invocable_v<F&, Args&...>,
                                  "execute(f, args...): f must be callable with (args..., rs::context const&), "
                                  "(args..., std::stop_token) or (args...)");
                    return std::invoke(f, a...);
                }
            },
            args);
    }
};

template <class T>
inline constexpr bool is_call_context_v =
    std::is_same_v<std::remove_cvref_t<T>, std::stop_token> || std::is_same_v<std::remove_cvref_t<T>, context>;

/// Splits `execute(f, args..., [token or context])`: the trailing stop token or context is the
/// caller's, everything before it is bound to `f`.
template <class F, class Tuple, std::size_t... Is>
auto bind_action(F&& f, Tuple&& all, std::index_sequence<Is...>) {
    return bound_action<std::decay_t<F>, std::decay_t<std::tuple_element_t<Is, std::remove_cvref_t<Tuple>>>...>{
        std::forward<F>(f), {std::get<Is>(std::forward<Tuple>(all))...}};
}

/// Owns the user's action for the length of the call; the innermost step calls it.
template <class A>
struct owned_action {
    A action;
    guarded<A> leaf() noexcept { return guarded<A>{&action}; }
};
/// A `next` handed to a policy's `run`: the innermost step is whatever it runs.
template <class Next>
struct borrowed_next {
    Next next;
    Next leaf() const { return next; }
};

/// Calls `f(std::integral_constant<std::size_t, k>{})` for a stage index `k` known at run time:
/// a fold over the indices, so each `f` is instantiated once, with no chain of instantiations.
template <class R, class F, std::size_t... Js>
R visit_stage(std::size_t k, F&& f, std::index_sequence<Js...>) {
    R r{};
    (void)((k == Js && (r = f(std::integral_constant<std::size_t, Js>{}), true)) || ...);
    return r;
}

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

    // The stages' states. Each is constructed when the call reaches its stage, just before its
    // `enter`, and destroyed with the frame: constructing them all up front compiles to zeroing
    // the whole block (hundreds of bytes with a timeout in it), which costs more than the states'
    // own work on the fast path.
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
    template <class... Ts>
    struct pack {};
    template <class T, class... Ts>
    struct pack<T, Ts...> {
        slot<T> head;
        pack<Ts...> tail;
    };
    template <class Seq>
    struct states_of;
    template <std::size_t... Js>
    struct states_of<std::index_sequence<Js...>> {
        using type = pack<typename state_of<policy_at<Js>>::type...>;
    };
    template <std::size_t J, class P>
    static auto& state_slot(P& p) noexcept {
        if constexpr (J == 0)
            return p.head;
        else
            return state_slot<J - 1>(p.tail);
    }
    template <std::size_t J>
    using state_type = typename state_of<policy_at<J>>::type;
    static_assert(size <= 64, "resilience::pipeline: at most 64 stages");

    struct states {
        typename states_of<std::make_index_sequence<size>>::type p;
        std::uint64_t made = 0; // bit J: stage J's state is constructed (only those with a destructor)

        states() noexcept {}
        states(const states&) = delete;
        states& operator=(const states&) = delete;
        ~states() { destroy<size>(); }

        template <std::size_t J>
        void make() {
            // Default-initialised: std::construct_at would value-initialise, zeroing it first.
            ::new (static_cast<void*>(&state_slot<J>(p).value)) state_type<J>;
            if constexpr (!std::is_trivially_destructible_v<state_type<J>>)
                made |= std::uint64_t{1} << J;
        }
        // Innermost first, as the stages leave.
        template <std::size_t N>
        void destroy() noexcept {
            if constexpr (N > 0) {
                if constexpr (!std::is_trivially_destructible_v<state_type<N - 1>>) {
                    if (made & (std::uint64_t{1} << (N - 1)))
                        std::destroy_at(&state_slot<N - 1>(p).value);
                }
                destroy<N - 1>();
            }
        }
    };
    template <std::size_t J>
    static auto& state(states& st) noexcept {
        return state_slot<J>(st.p).value;
    }

    static constexpr std::size_t none = static_cast<std::size_t>(-1);
    using all_stages = std::make_index_sequence<size>;
    /// Where a drive starts: stage 0 for a call (known when compiling, so the common path folds
    /// to straight-line code), or a stage known at run time for the stages inside a waiting one.
    using outermost = std::integral_constant<std::size_t, 0>;
    // A function rather than `j < from`, which g++ warns about when `from` is the constant 0.
    static constexpr bool outside(std::size_t j, std::size_t from, std::size_t end) noexcept {
        return j < from || j >= end;
    }

    // Stage J's `enter` (a stage of the waiting form always waits). True when it proceeded;
    // otherwise `s` says how it stopped and `k` is J.
    template <std::size_t J>
    static bool entered(const Stages& stages, states& st, const context** at, std::optional<outcome_type>& result,
                        step& s, std::size_t& k) {
        at[J + 1] = at[J];
        if constexpr (fast_policy<policy_at<J>>) {
            st.template make<J>();
            s = std::get<J>(stages).enter(state<J>(st), *at[J], at[J + 1], result);
        } else {
            s = step::wait;
        }
        if (s == step::proceed)
            return true;
        k = J;
        return false;
    }
    // Enters the stages from `from` inward; stops at the first that does not proceed, leaving
    // its index in `k` (`size` when all did).
    template <class From, std::size_t... Js>
    static step enter_all(From from, const Stages& stages, states& st, const context** at,
                          std::optional<outcome_type>& result, std::size_t& k, std::index_sequence<Js...>) {
        step s = step::proceed;
        k = size;
        (void)((outside(Js, from, size) || entered<Js>(stages, st, at, result, s, k)) && ...);
        return s;
    }

    // Stage J's `leave`: true when it must wait, its `resume` coming next.
    template <std::size_t J>
    static bool leave_waits(const Stages& stages, states& st, const context** at, outcome_type& result) {
        if constexpr (fast_policy<policy_at<J>>)
            return std::get<J>(stages).leave(state<J>(st), *at[J], result) == step::wait;
        else
            return false;
    }
    // Leaves the stages inside `end` down to `from`, innermost first; returns the first that must
    // wait, or `none`.
    template <class End, class From, std::size_t... Js>
    static std::size_t leave_all(End end, From from, const Stages& stages, states& st, const context** at,
                                 outcome_type& result, std::index_sequence<Js...>) {
        std::size_t w = none;
        (void)((outside(size - 1 - Js, from, end) || !leave_waits<size - 1 - Js>(stages, st, at, result) ||
                (w = size - 1 - Js, false)) &&
               ...);
        return w;
    }

    /// `next` for the stages from `from` inward, then the leaf, in a frame of their own.
    struct inner_next {
        Stages stages;
        Leaf leaf;
        std::size_t from;
        task<outcome_type> operator()(const context& ctx) const {
            return drive<false>(stages_ref<Stages>{stages}, borrowed_next<Leaf>{leaf}, context_access::derive(ctx),
                                from);
        }
    };
    template <std::size_t J>
    static auto next_after(const Stages& stages, const Leaf& leaf) {
        if constexpr (J + 1 == size)
            return leaf;
        else
            return inner_next{stages, leaf, J + 1};
    }

    // ---- waiting for admission in this frame (a stage with `frame_wait`, see the file comment) ----
    // Stage J waits here if its `enter` may wait and it has the members for it.
    template <std::size_t J>
    static constexpr bool admits_here() {
        if constexpr (fast_policy<policy_at<J>> && enter_may_wait<policy_at<J>>)
            return frame_waiting<policy_at<J>, state_type<J>, value_type>;
        else
            return false;
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
    static_assert(largest_admission<true>(all_stages{}) <= alignof(std::max_align_t),
                  "resilience: a policy's frame_wait must not be over-aligned");

    // Whether stage `k`, whose `enter` waited, waits for admission here rather than in its `run`.
    RESILIENCE_DETAIL_NOINLINE static bool stage_waits_in_frame(std::size_t k, const Stages& stages,
                                                                const context* const* at) {
        return visit_stage<bool>(
            k,
            [&](auto j) {
                constexpr std::size_t J = decltype(j)::value;
                if constexpr (admits_here<J>())
                    return std::get<J>(stages).waits_in_frame(*at[J]);
                else
                    return false;
            },
            all_stages{});
    }
    /// Awaits stage `k`'s admission (out of line: the drive's common path stays small enough for
    /// the compiler to inline what it calls). The stage's awaiter is made in a block from the frame cache,
    /// taken only by a call that waits (so a call that does not carries no room for it), with
    /// the stage's index after it; it is destroyed with this awaiter, also when the frame is destroyed
    /// while it waits. One pointer, as every byte of this awaiter is in every call's frame.
    struct wait_in_frame {
        // The stage's index follows the awaiter.
        static constexpr std::size_t index_at =
            (admission_bytes + alignof(std::size_t) - 1) / alignof(std::size_t) * alignof(std::size_t);
        static constexpr std::size_t block = index_at + sizeof(std::size_t);
        void* space;

        RESILIENCE_DETAIL_NOINLINE wait_in_frame(std::size_t stage, const Stages& stages, states& st,
                                                 const context* const* at,
                                                 std::optional<outcome_type>& result)
            : space(frame_cache::allocate(block)) {
            ::new (static_cast<unsigned char*>(space) + index_at) std::size_t(stage);
            try {
                on_stage([&](auto j) {
                    constexpr std::size_t J = decltype(j)::value;
                    ::new (space) admission_at<J>(std::get<J>(stages), state<J>(st), *at[J], result);
                });
            } catch (...) {
                frame_cache::deallocate(space, block);
                throw;
            }
        }
        wait_in_frame(const wait_in_frame&) = delete;
        wait_in_frame& operator=(const wait_in_frame&) = delete;
        RESILIENCE_DETAIL_NOINLINE ~wait_in_frame() {
            on_stage([&](auto j) { std::destroy_at(get<decltype(j)::value>()); });
            frame_cache::deallocate(space, block);
        }
        RESILIENCE_DETAIL_NOINLINE bool await_ready() {
            bool ready = true;
            on_stage([&](auto j) { ready = get<decltype(j)::value>()->await_ready(); });
            return ready;
        }
        RESILIENCE_DETAIL_NOINLINE start_result await_suspend(std::coroutine_handle<> h) {
            start_result next = suspend_unless_done(false, h);
            on_stage([&](auto j) {
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
        RESILIENCE_DETAIL_NOINLINE step await_resume() {
            step s = step::done;
            on_stage([&](auto j) { s = get<decltype(j)::value>()->await_resume(); });
            return s;
        }

    private:
        std::size_t stage() const noexcept {
            unsigned char* const at = static_cast<unsigned char*>(space) + index_at;
            return *std::launder(reinterpret_cast<std::size_t*>(at));
        }
        template <std::size_t J>
        admission_at<J>* get() const noexcept {
            return std::launder(static_cast<admission_at<J>*>(space));
        }
        // Calls `f(std::integral_constant<std::size_t, k>{})`: stage `k` admits here (`waits_in_frame`).
        template <class F>
        void on_stage(F&& f) const {
            visit_stage<bool>(
                stage(),
                [&](auto j) {
                    if constexpr (admits_here<decltype(j)::value>())
                        f(j);
                    return true;
                },
                all_stages{});
        }
    };

    template <class Awaitable>
    static task<outcome_type> as_task(Awaitable a) {
        co_return co_await std::move(a);
    }
    template <class Awaitable>
    static task<outcome_type> uniform(Awaitable&& a) {
        if constexpr (std::is_same_v<std::remove_cvref_t<Awaitable>, task<outcome_type>>)
            return std::forward<Awaitable>(a);
        else
            return as_task(std::forward<Awaitable>(a));
    }

    // The waiting paths, out of the drive's body so that every drive of the pipeline (with and
    // without throwing, and the inner ones) shares one instance of each.

    // Stage `k`'s `run`, for a stage whose `enter` waited: it handles the call from there inward.
    static task<outcome_type> run_stage(std::size_t k, const Stages& stages, const context** at, const Leaf& leaf) {
        return visit_stage<task<outcome_type>>(
            k,
            [&](auto j) -> task<outcome_type> {
                constexpr std::size_t J = decltype(j)::value;
                if constexpr (enter_may_wait<policy_at<J>>)
                    return uniform(std::get<J>(stages).run(next_after<J>(stages, leaf), *at[J]));
                else
                    return task<outcome_type>{}; // unreachable: its `enter` never waits
            },
            all_stages{});
    }
    // `run_stage` out of line, for a pipeline whose waiting stages mostly wait in its frame: clang
    // would otherwise build the stage's `run` coroutine in the drive's own frame (1.3 KB for a
    // bulkhead's), making every call's frame as large as a waiting one's.
    RESILIENCE_DETAIL_NOINLINE static task<outcome_type>
    run_stage_out_of_line(std::size_t k, const Stages& stages, const context** at, const Leaf& leaf) {
        return run_stage(k, stages, at, leaf);
    }
    // Stage `w`'s `resume`, for a stage whose `leave` waited: it may run the stages inside again.
    static task<outcome_type> resume_stage(std::size_t w, const Stages& stages, states& st, const context** at,
                                           const Leaf& leaf, outcome_type& result) {
        return visit_stage<task<outcome_type>>(
            w,
            [&](auto j) -> task<outcome_type> {
                constexpr std::size_t J = decltype(j)::value;
                if constexpr (requires {
                                  std::get<J>(stages).resume(state<J>(st), next_after<J>(stages, leaf), *at[J],
                                                             std::move(result));
                              })
                    return std::get<J>(stages).resume(state<J>(st), next_after<J>(stages, leaf), *at[J],
                                                      std::move(result));
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

    /// `ctx`: the caller's context, or, for a drive inside another call (a stage's `run` or
    /// `resume`), one derived from that call's, which outlives it. It is the call's own context,
    /// used in place: moving it would cost a store-forwarding stall right after the frame's ramp.
    /// `from`: the first stage, `outermost` for a call, a `std::size_t` for an inner drive.
    template <bool Throw, class Source, class Holder, class From>
    static task<std::conditional_t<Throw, value_type, outcome_type>> drive(Source source, Holder holder, context ctx,
                                                                           From from) {
        decltype(auto) stages = stages_from(source);
        time_cache cache;
        event_loop* const home = event_loop::current(); // where the call returns (null: outside any loop)
        context& root = ctx;
        context_access::attach(root, &cache);
        auto leaf = holder.leaf();
        states st;
        const context* at[size + 1];
        at[from] = &root;
        std::optional<outcome_type> result;
        std::size_t k = size;
        step s = enter_all(from, stages, st, at, result, k, all_stages{});
        if constexpr (any_waits_in_frame) {
            // A stage that waits for admission here: once admitted, the call goes on inward from
            // the stage after it, still in this frame.
            while (s == step::wait && stage_waits_in_frame(k, stages, at)) [[unlikely]] {
                cache.clear();
                {
                    wait_in_frame admission{k, stages, st, at, result};
                    do // `step::wait`: not decided yet, await it again
                        s = co_await admission;
                    while (s == step::wait);
                }
                if (home && event_loop::current() != home)
                    co_await resume_on_loop{home}; // admitted on another thread
                cache.clear(); // a reading taken while waiting is stale now
                if (s == step::proceed) // `k` is read before enter_all writes it
                    s = enter_all(std::size_t{k + 1}, stages, st, at, result, k, all_stages{});
            }
        }
        std::size_t w = none;
        if (s == step::proceed) {
            result.emplace(co_await leaf(*at[size]));
            if (home && event_loop::current() != home)
                co_await resume_on_loop{home}; // the action ended on another thread
            cache.clear();
            // The common path: every stage proceeded, so every stage leaves, innermost first.
            w = leave_all(std::integral_constant<std::size_t, size>{}, from, stages, st, at, *result, all_stages{});
        } else {
            cache.clear();
            if (s == step::wait) {
                task<outcome_type> waiting = any_waits_in_frame ? run_stage_out_of_line(k, stages, at, leaf)
                                                                : run_stage(k, stages, at, leaf);
                result.emplace(co_await std::move(waiting));
                if (home && event_loop::current() != home)
                    co_await resume_on_loop{home}; // the stage's wait ended on another thread
                cache.clear();
            }
            // Outward from the stage inside the one that stopped.
            w = leave_all(k, std::size_t{from}, stages, st, at, *result, all_stages{});
        }
        while (w != none) {
            task<outcome_type> resuming = resume_stage(w, stages, st, at, leaf, *result);
            outcome_type r = co_await std::move(resuming);
            result.emplace(std::move(r));
            if (home && event_loop::current() != home)
                co_await resume_on_loop{home}; // the stage's wait ended on another thread
            w = leave_all(w, std::size_t{from}, stages, st, at, *result, all_stages{});
        }
        // Every co_await above is followed by the return home, so the common path pays nothing here.
        if constexpr (Throw)
            co_return std::move(*result).value();
        else
            co_return std::move(*result);
    }
};

template <class S>
inline constexpr bool is_policy_ref = false;
template <class P>
inline constexpr bool is_policy_ref<policy_ref<P>> = true;

template <bool Throw, class Source, class A>
auto run_valid_action(Source source, A action, context ctx) {
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
                                          typename drv::outermost{});
    else if constexpr (is_policy_ref<Source> && !keeps_stages<policy_type>)
        return drv::template drive<Throw>(stages_ref<stages>{stages_of(source.get())},
                                          owned_action<A>{std::move(action)}, std::move(ctx), typename drv::outermost{});
    else
        return drv::template drive<Throw>(std::move(source), owned_action<A>{std::move(action)}, std::move(ctx),
                                          typename drv::outermost{});
}

template <bool Throw, class Source, class A>
auto run_action(Source source, A action, context ctx) {
    if constexpr (!checked_action<A>::valid) {
        check_action<A>();
        return task<std::conditional_t<Throw, invalid_action, outcome<invalid_action>>>{};
    } else {
        return run_valid_action<Throw>(std::move(source), std::move(action), std::move(ctx));
    }
}

// Stand-ins used to check the `policy` concept. Defined, because checking a policy whose `run`
// has a deduced return type instantiates bodies that call them (they are never run).
struct probe_action {
    task<int> operator()() const { co_return 0; }
};
struct probe_next {
    task<outcome<int>> operator()(const context&) const { co_return outcome<int>{0}; }
};

} // namespace detail

/// Gives a policy its public calls. `Derived` provides either the fast protocol (`call_state`,
/// `enter`, `leave`, `resume`) or `run(next, ctx)` alone (see the file comment).
template <class Derived>
class policy_base {
public:
    /// Runs `action` under this policy; returns its value or rethrows the final failure as it was.
    /// Called on an lvalue, a handle to shared state is copied into the call, and any other policy
    /// must stay alive while the call may be resumed; called on an rvalue (a temporary,
    /// `std::move(p)`), the policy is moved into the call. See the file comment.
    ///
    /// The action is copied (an lvalue) or moved (an rvalue) into the call, which keeps it until it
    /// ends. On g++ before 13, a temporary closure or aggregate that owns something with a
    /// destructor does not compile (g++ destroys it twice inside `co_await`; see
    /// `execute(f, args...)` below and RESILIENCE_ALLOW_CLOSURE_CAPTURES):
    ///
    ///     co_await r.execute([&](std::stop_token st) { return fetch(host, st); });   // OK: captures a reference
    ///     co_await r.execute([host](std::stop_token st) { return fetch(host, st); }); // g++ 12: does not compile
    template <class A>
    task<detail::checked_result_t<std::decay_t<A>>> execute(A&& action, context ctx) const& {
        detail::check_action_temporary<A>();
        return detail::run_action<true>(ref(), std::decay_t<A>(std::forward<A>(action)), std::move(ctx));
    }
    template <class A>
    task<detail::checked_result_t<std::decay_t<A>>> execute(A&& action, std::stop_token token = {}) const& {
        detail::check_action_temporary<A>();
        return detail::run_action<true>(ref(), std::decay_t<A>(std::forward<A>(action)), context{std::move(token)});
    }
    template <class A>
    task<detail::checked_result_t<std::decay_t<A>>> execute(A&& action, context ctx) && {
        detail::check_action_temporary<A>();
        return detail::run_action<true>(owned(), std::decay_t<A>(std::forward<A>(action)), std::move(ctx));
    }
    template <class A>
    task<detail::checked_result_t<std::decay_t<A>>> execute(A&& action, std::stop_token token = {}) && {
        detail::check_action_temporary<A>();
        return detail::run_action<true>(owned(), std::decay_t<A>(std::forward<A>(action)), context{std::move(token)});
    }

    /// The form that is safe on every compiler for an action that needs data: `f` is called as
    /// `f(args..., ctx_or_token)` (or `f(args...)`), with copies of `args` kept for the whole call.
    /// A trailing `std::stop_token` or `context` is the caller's, as in the forms above. Prefer it
    /// to a lambda that captures by value, written inside `co_await`: g++ 12 destroys such a lambda
    /// twice (a double free), so on g++ before 13 `execute` refuses it at compile time.
    ///
    ///     co_return co_await r.execute(fetch, host);            // OK everywhere: fetch(host, st)
    ///     co_return co_await r.execute([host](std::stop_token st) { return fetch(host, st); });
    ///                                                          // double free on g++ 12: refused
    template <class F, class Arg, class... Args>
    requires(!(sizeof...(Args) == 0 && detail::is_call_context_v<Arg>))
    auto execute(F&& f, Arg&& arg, Args&&... args) const& {
        detail::check_bound_temporaries<F, Arg, Args...>();
        return call_bound<true>(ref(), std::forward<F>(f),
                                std::forward_as_tuple(std::forward<Arg>(arg), std::forward<Args>(args)...));
    }
    template <class F, class Arg, class... Args>
    requires(!(sizeof...(Args) == 0 && detail::is_call_context_v<Arg>))
    auto execute(F&& f, Arg&& arg, Args&&... args) && {
        detail::check_bound_temporaries<F, Arg, Args...>();
        return call_bound<true>(owned(), std::forward<F>(f),
                                std::forward_as_tuple(std::forward<Arg>(arg), std::forward<Args>(args)...));
    }

    /// Like `execute`, but reports the final failure as a value instead of throwing it.
    template <class A>
    task<outcome<detail::checked_result_t<std::decay_t<A>>>> execute_outcome(A&& action, context ctx) const& {
        detail::check_action_temporary<A>();
        return detail::run_action<false>(ref(), std::decay_t<A>(std::forward<A>(action)), std::move(ctx));
    }
    template <class A>
    task<outcome<detail::checked_result_t<std::decay_t<A>>>> execute_outcome(A&& action,
                                                                             std::stop_token token = {}) const& {
        detail::check_action_temporary<A>();
        return detail::run_action<false>(ref(), std::decay_t<A>(std::forward<A>(action)), context{std::move(token)});
    }
    template <class A>
    task<outcome<detail::checked_result_t<std::decay_t<A>>>> execute_outcome(A&& action, context ctx) && {
        detail::check_action_temporary<A>();
        return detail::run_action<false>(owned(), std::decay_t<A>(std::forward<A>(action)), std::move(ctx));
    }
    template <class A>
    task<outcome<detail::checked_result_t<std::decay_t<A>>>> execute_outcome(A&& action,
                                                                             std::stop_token token = {}) && {
        detail::check_action_temporary<A>();
        return detail::run_action<false>(owned(), std::decay_t<A>(std::forward<A>(action)),
                                         context{std::move(token)});
    }
    template <class F, class Arg, class... Args>
    requires(!(sizeof...(Args) == 0 && detail::is_call_context_v<Arg>))
    auto execute_outcome(F&& f, Arg&& arg, Args&&... args) const& {
        detail::check_bound_temporaries<F, Arg, Args...>();
        return call_bound<false>(ref(), std::forward<F>(f),
                                 std::forward_as_tuple(std::forward<Arg>(arg), std::forward<Args>(args)...));
    }
    template <class F, class Arg, class... Args>
    requires(!(sizeof...(Args) == 0 && detail::is_call_context_v<Arg>))
    auto execute_outcome(F&& f, Arg&& arg, Args&&... args) && {
        detail::check_bound_temporaries<F, Arg, Args...>();
        return call_bound<false>(owned(), std::forward<F>(f),
                                 std::forward_as_tuple(std::forward<Arg>(arg), std::forward<Args>(args)...));
    }

    /// The suspending form of the protocol, made from the fast one: runs `next` (the rest of a
    /// pipeline) once under this policy. A policy whose `enter` may answer `step::wait` defines
    /// its own `run`, which hides this one; one whose `enter` never does says so
    /// (`static constexpr bool enter_never_waits = true;`). A policy that does neither does not
    /// compile: this `run` enters the policy again, so an `enter` answering `step::wait` would
    /// call it again, without end.
    template <class Next>
    task<detail::next_outcome_t<Next>> run(Next next, const context& ctx) const {
        // `&Derived::run<Next>` names this very member (a pointer to a member of policy_base) when
        // Derived has no run of its own; a run of its own, whatever its form, names something else.
        constexpr bool inherited = requires {
            requires std::is_same_v<decltype(&Derived::template run<Next>), decltype(&policy_base::template run<Next>)>;
        };
        static_assert(!(inherited && detail::fast_policy<Derived> && detail::enter_may_wait<Derived>),
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

    template <bool Throw, class Source, class F, class Tuple>
    static auto call_bound(Source source, F&& f, Tuple all) {
        constexpr std::size_t n = std::tuple_size_v<Tuple>;
        using last = std::tuple_element_t<n - 1, Tuple>;
        if constexpr (detail::is_call_context_v<last>) {
            context ctx{std::get<n - 1>(all)};
            return detail::run_action<Throw>(
                std::move(source),
                detail::bind_action(std::forward<F>(f), std::move(all), std::make_index_sequence<n - 1>{}),
                std::move(ctx));
        } else {
            return detail::run_action<Throw>(
                std::move(source),
                detail::bind_action(std::forward<F>(f), std::move(all), std::make_index_sequence<n>{}), context{});
        }
    }
};

/// A policy: wraps an action (a callable returning an awaitable) and is itself callable through
/// `execute`, `execute_outcome` and `run`, so policies compose. Checked with a probe action that
/// returns `task<int>`, since a policy is a template over every action type. Copyable, because a
/// pipeline holds its policies by value (a stateful policy's copy is a handle to the same state).
template <class P>
concept policy = std::copy_constructible<P> &&
    requires(const P& p, detail::probe_action a, std::stop_token st, const context& c, detail::probe_next n) {
    { p.execute(a) } -> awaitable_of<int>;
    { p.execute(a, st) } -> awaitable_of<int>;
    { p.execute_outcome(a) } -> awaitable_of<outcome<int>>;
    { p.run(n, c) } -> awaitable_of<outcome<int>>;
};

} // namespace resilience
