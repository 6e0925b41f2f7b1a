// SPDX-License-Identifier: MIT
/// \file engine/action.hpp
/// How a call runs the user's action: the three shapes an action may have, the rules `execute`
/// checks at compile time (one `static_assert` per rule), the awaiter that turns whatever the
/// action throws into a failure (`guarded_call`), and `execute(f, args...)`'s bound action.
#pragma once

#include "../concepts.hpp"
#include "../context.hpp"
#include "../detail/inline_start.hpp"
#include "../outcome.hpp"
#include "../stop_token.hpp"
#include "../task.hpp"
#include "std_token.hpp"

#include <coroutine>
#include <cstddef>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2::detail {

/// Calls an action the way it asks to be called: with the context, with the stop token, or bare.
template <class A>
decltype(auto) invoke_action(A& a, const context& ctx) {
    if constexpr (std::is_invocable_v<A&, const context&>)
        return std::invoke(a, ctx);
    else if constexpr (std::is_invocable_v<A&, stop_token>)
        return std::invoke(a, ctx.stop_token());
#if RESILIENCE_HAS_STD_STOP_TOKEN
    else if constexpr (std::is_invocable_v<A&, std::stop_token>)
        return with_std_token(std::ref(a), ctx.stop_token());
#endif
    else {
        static_assert(std::is_invocable_v<A&>,
                      "an action must be callable with (rs::context const&), (stop_token) or ()");
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
    std::is_invocable_v<A&, const context&> || std::is_invocable_v<A&, stop_token> ||
#if RESILIENCE_HAS_STD_STOP_TOKEN
    std::is_invocable_v<A&, std::stop_token> ||
#endif
    std::is_invocable_v<A&>;

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
                  "resilience: an action must be callable with (rs::context const&), (stop_token) or () "
                  "(with execute(f, args...), with (args..., ctx), (args..., stop_token) or (args...))");
    if constexpr (callable_action<A>) {
        static_assert(
            checked_action<A>::returns_awaitable,
            "resilience: an action must return an awaitable such as rs::task<T> (it returns a plain "
            "value: make it a coroutine that co_returns the value)");
        static_assert(!std::is_reference_v<action_awaitable_t<A>>,
                      "resilience: an action must return its awaitable by value, not a reference");
    }
}

/// What a call with `A` returns when `A` is not an action: `check_action` stops the build with the rule
/// it breaks, and the task of `invalid_action` keeps the caller's code from adding errors of its own.
template <bool Throw, class A>
auto refuse_action() {
    check_action<A>();
    return task<std::conditional_t<Throw, invalid_action, outcome<invalid_action>>>{};
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
#if defined(__GNUC__) && !defined(__clang__) && !defined(__INTEL_COMPILER) && __GNUC__ < 13 &&               \
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
    std::is_class_v<T> && !std::is_trivially_destructible_v<T> &&
    (std::is_aggregate_v<T> || is_closure_type<T>());
#else
template <class T>
inline constexpr bool destroyed_twice_as_temporary = false;
#endif

/// Refuses an action passed to `execute(action)` that g++ 12 would destroy twice (see above).
/// `A` is the forwarding reference's deduced type: an lvalue reference for an lvalue.
template <class A>
constexpr void check_action_temporary() noexcept {
    static_assert(
        std::is_lvalue_reference_v<A> || !destroyed_twice_as_temporary<std::remove_cv_t<A>>,
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
        "resilience: on g++ before 13, a temporary lambda (or aggregate) that owns something with a "
        "destructor, "
        "passed to execute(f, args...), is destroyed twice when written inside co_await (a g++ bug: double "
        "free). Pass the function itself and its data as arguments (execute(f, args...) with f a function or "
        "a lambda without such captures), or name the callable and pass it as an lvalue; "
        "RESILIENCE_ALLOW_CLOSURE_CAPTURES turns this check off (docs/core.md#compiler-notes)");
}

/// `execute(f, args...)` keeps a copy of `f` and of each argument for the length of the call (as
/// `std::bind` and `std::thread` do), so they can all be kept.
template <class... Ts>
inline constexpr bool bound_arguments_storable = (std::is_constructible_v<std::decay_t<Ts>, Ts> && ...);

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

public:
    using value_type = action_result_t<A>;

    guarded_call(A* action, const context& ctx) noexcept : start_{&ctx, action} {}
    // Moved only before it is awaited (into when_all and the like): nothing has started yet.
    guarded_call(guarded_call&& other) noexcept : start_(other.start_) {}
    guarded_call& operator=(guarded_call&&) = delete;
    ~guarded_call() {
        if (made_ & failed)
            std::destroy_at(&early_);
        if constexpr (!self_awaiting && !awaiter_by_reference) {
            if (made_ & awaiter_made)
                std::destroy_at(&awaiter_);
        }
        if (made_ & awaitable_made)
            std::destroy_at(&awaitable_);
    }

    bool await_ready() noexcept {
        try {
            const start what = start_; // its place is the failure's from here on
            ::new (static_cast<void*>(&awaitable_)) awaitable_type(invoke_action(*what.action, *what.ctx));
            made_ |= awaitable_made;
            if constexpr (awaiter_by_reference) {
                awaiter_ = &get_awaiter(std::move(awaitable_));
            } else if constexpr (!self_awaiting) {
                ::new (static_cast<void*>(&awaiter_)) awaiter_type(get_awaiter(std::move(awaitable_)));
                made_ |= awaiter_made;
            }
            return awaiter().await_ready();
        } catch (...) {
            fail();
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
                fail();
                return false; // resume the awaiting coroutine at once: await_resume reports the failure
            }
        } else {
            std::coroutine_handle<> next;
            try {
                next = awaiter().await_suspend(h);
            } catch (...) {
                fail();
                return suspend_unless_done(false, h);
            }
            return transfer_to(next, h);
        }
    }

    outcome<value_type> await_resume() noexcept {
        if (made_ & failed)
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
            return awaitable_;
        else if constexpr (awaiter_by_reference)
            return *awaiter_;
        else
            return awaiter_;
    }
    void fail() noexcept {
        ::new (static_cast<void*>(&early_)) failure(failure::current());
        made_ |= failed;
    }

    // What `await_ready` starts the action with, then what stopped it, if anything did: the two share
    // a place, and the awaitable and its awaiter are made in place, with one byte saying what is made
    // (the frame of every call holds this awaiter: see engine/driver.hpp, `emplacing`).
    struct start {
        const context* ctx; // outlives the awaiter: it is the awaiting frame's, or its caller's
        A* action;
    };
    static constexpr unsigned char awaitable_made = 1, awaiter_made = 2, failed = 4;
    union {
        start start_;
        failure early_;
    };
    union {
        awaitable_type awaitable_;
    };
    // Self-awaiting: nothing (the awaitable is the awaiter).
    using awaiter_slot =
        std::conditional_t<self_awaiting, char,
                           std::conditional_t<awaiter_by_reference, awaiter_type*, awaiter_type>>;
    union {
        awaiter_slot awaiter_;
    };
    unsigned char made_ = 0;
};

/// The innermost `next`: runs the user's action once (see `guarded_call`).
template <class A>
struct guarded {
    A* action;
    using value_type = action_result_t<A>;
    guarded_call<A> operator()(const context& ctx) const { return guarded_call<A>{action, ctx}; }
};

/// `execute(f, args...)`'s action: `f` with copies of the arguments, called with them (as lvalues,
/// since a retry calls it again) and then with the attempt's context or stop token when `f` takes
/// one. Built inside the library, so no closure with members is a temporary of the caller's
/// `co_await` expression (which g++ 12 destroys twice).
template <class F, class... Args>
struct bound_action {
    [[no_unique_address]] F f; // a function object without state adds nothing (see `erasable_action`)
    std::tuple<Args...> args;
    decltype(auto) operator()(const context& ctx) {
        return std::apply(
            [&](Args&... a) -> decltype(auto) {
                if constexpr (std::is_invocable_v<F&, Args&..., const context&>)
                    return std::invoke(f, a..., ctx);
                else if constexpr (std::is_invocable_v<F&, Args&..., stop_token>)
                    return std::invoke(f, a..., ctx.stop_token());
#if RESILIENCE_HAS_STD_STOP_TOKEN
                else if constexpr (std::is_invocable_v<F&, Args&..., std::stop_token>)
                    return with_std_token(
                        [&](std::stop_token t) { return std::invoke(f, a..., std::move(t)); },
                        ctx.stop_token());
#endif
                else {
                    static_assert(
                        std::is_invocable_v<F&, Args&...>,
                        "execute(f, args...): f must be callable with (args..., rs::context const&), "
                        "(args..., stop_token) or (args...)");
                    return std::invoke(f, a...);
                }
            },
            args);
    }
};

template <class T>
inline constexpr bool is_call_context_v = std::is_same_v<std::remove_cvref_t<T>, stop_token> ||
#if RESILIENCE_HAS_STD_STOP_TOKEN
                                          std::is_same_v<std::remove_cvref_t<T>, std::stop_token> ||
#endif
                                          std::is_same_v<std::remove_cvref_t<T>, context>;

/// Whether an lvalue of `F` can be called with `Bound...` and then the attempt's context, its stop
/// token, or nothing: the calls `bound_action` makes.
template <class F, class... Bound>
inline constexpr bool bound_invocable =
    std::is_invocable_v<F&, Bound..., const context&> || std::is_invocable_v<F&, Bound..., stop_token> ||
#if RESILIENCE_HAS_STD_STOP_TOKEN
    std::is_invocable_v<F&, Bound..., std::stop_token> ||
#endif
    std::is_invocable_v<F&, Bound...>;

/// The rules of `execute(f, args...)` for `f` and the arguments bound to it (`Bound`, as passed),
/// in the order they are checked.
template <class F, class... Bound>
struct bound_call_rules {
    static constexpr bool storable = bound_arguments_storable<F, Bound...>;
    // Every attempt passes the same kept copies again, so as lvalues.
    static constexpr bool reusable = bound_invocable<std::decay_t<F>, std::decay_t<Bound>&...>;
    // Callable with the copies moved in: the arguments are right but one cannot be passed twice.
    static constexpr bool callable_once = bound_invocable<std::decay_t<F>, std::decay_t<Bound>&&...>;
    static constexpr bool valid = storable && reusable;
};

/// `bound_call_rules` for `execute(f, ts...)`: a trailing stop token or context is the caller's,
/// not bound to `f`.
template <class F, class... Ts>
struct bound_rules_of {
    using all = std::tuple<Ts...>;
    static constexpr std::size_t bound =
        sizeof...(Ts) - (is_call_context_v<std::tuple_element_t<sizeof...(Ts) - 1, all>> ? 1 : 0);
    template <std::size_t... Is>
    static auto pick(std::index_sequence<Is...>) -> bound_call_rules<F, std::tuple_element_t<Is, all>...>;
    using type = decltype(pick(std::make_index_sequence<bound>{}));
};
template <class F, class... Ts>
using bound_rules_t = typename bound_rules_of<F, Ts...>::type;

/// The action `execute(f, args...)` runs: `f` itself when there are no arguments or only the caller's
/// stop token or context; else `f` bound to copies of the arguments before a trailing stop token or
/// context (`bound_action`), or `invalid_action` when they break a rule of `bound_call_rules`.
template <class F, class... Ts>
struct entry_action {
    using type = std::decay_t<F>;
};
template <class F, class T, class... Ts>
requires(!(sizeof...(Ts) == 0 && is_call_context_v<T>))
struct entry_action<F, T, Ts...> {
    using all = std::tuple<T, Ts...>;
    static constexpr std::size_t bound = bound_rules_of<F, T, Ts...>::bound;
    template <std::size_t... Is>
    static auto pick(std::index_sequence<Is...>)
        -> bound_action<std::decay_t<F>, std::decay_t<std::tuple_element_t<Is, all>>...>;
    using type = std::conditional_t<bound_rules_t<F, T, Ts...>::valid,
                                    decltype(pick(std::make_index_sequence<bound>{})), invalid_action>;
};

/// What `execute(f, args...)` (`Throw`) or `execute_outcome(f, args...)` returns, named without
/// instantiating the call, so that checking the `policy` concept against a probe action compiles
/// nothing of a policy's body.
template <bool Throw, class F, class... Ts>
using entry_task_t =
    task<std::conditional_t<Throw, checked_result_t<typename entry_action<F, Ts...>::type>,
                            outcome<checked_result_t<typename entry_action<F, Ts...>::type>>>>;

/// Names the first of the `Rules` that `execute(f, args...)` breaks, in a `static_assert`. The
/// caller then returns a task of `invalid_action` instead of a call, so that this is the only error:
/// `invalid_action` converts to whatever the caller's code expects.
template <class Rules>
constexpr void refuse_bound_call() noexcept {
    static_assert(
        Rules::storable,
        "resilience: execute(f, args...) copies (or moves) the function and each argument into the "
        "call, which may outlive the expression that made it (as std::bind and std::thread do); one "
        "of them cannot be copied or moved (an io_context, a socket, a mutex?). Pass it by reference "
        "with std::ref(x) or std::cref(x), and keep it alive until the call ends, or capture a "
        "reference in a named lambda (docs/core.md#calling-a-function-with-arguments)");
    if constexpr (Rules::storable) {
        static_assert(
            Rules::reusable || !Rules::callable_once,
            "resilience: execute(f, args...) keeps one copy of each argument and passes that same copy "
            "to f at every attempt (a retry calls f again), as an lvalue, so f cannot take a move-only "
            "argument (a std::unique_ptr?) by value or by &&. Wrap it in a std::shared_ptr, take it by "
            "const reference, or capture it in a named callable passed as std::ref(callable) "
            "(docs/core.md#calling-a-function-with-arguments)");
        static_assert(Rules::reusable || Rules::callable_once,
                      "resilience: execute(f, args...): f must be callable with (args..., rs::context "
                      "const&), (args..., stop_token) or (args...)");
    }
}

/// Splits `execute(f, args..., [token or context])`: the trailing stop token or context is the
/// caller's, everything before it is bound to `f`.
template <class F, class Tuple, std::size_t... Is>
auto bind_action(F&& f, Tuple&& all, std::index_sequence<Is...>) {
    return bound_action<std::decay_t<F>,
                        std::decay_t<std::tuple_element_t<Is, std::remove_cvref_t<Tuple>>>...>{
        std::forward<F>(f), {std::get<Is>(std::forward<Tuple>(all))...}};
}

/// A small action that returns `task<R>`, with its type erased: a call through a policy runs the
/// same code for every such action of the same result type (see `erasable_action`), so a second
/// call site of a pipeline compiles `invoke_as` and not the call's whole body again. The action is
/// kept in place, in the call's frame. The cost is an indirect call per attempt and per move (and one
/// to destroy an action that has a destructor).
template <class R>
class erased_action {
public:
    /// What an erased action may occupy: four pointers (a `std::string` captured by value, a
    /// `[&]` lambda using four names, `execute(f, args...)` with a function and three numbers).
    static constexpr std::size_t capacity = 4 * sizeof(void*);

    template <class A>
    requires(!std::is_same_v<std::remove_cvref_t<A>, erased_action>)
    explicit erased_action(A&& a) noexcept : ops_(&ops_of<std::remove_cvref_t<A>>) {
        ::new (static_cast<void*>(bytes_)) std::remove_cvref_t<A>(std::forward<A>(a));
    }
    erased_action(erased_action&& other) noexcept : ops_(other.ops_) { ops_->move(bytes_, other.bytes_); }
    erased_action& operator=(erased_action&&) = delete;
    ~erased_action() {
        if (ops_->destroy != nullptr)
            ops_->destroy(bytes_);
    }

    task<R> operator()(const context& ctx) { return ops_->invoke(static_cast<void*>(bytes_), ctx); }

private:
    // Moving and destroying go through the action's own functions too: copying the whole buffer
    // would read bytes the action never wrote, and its bytes just after they were written.
    struct ops {
        task<R> (*invoke)(void*, const context&);
        void (*move)(void* to, void* from) noexcept;
        void (*destroy)(void*) noexcept; // null: trivially destructible
    };
    template <class A>
    static A& as(void* a) noexcept {
        return *std::launder(static_cast<A*>(a));
    }
    template <class A>
    static constexpr ops ops_of{
        [](void* a, const context& ctx) -> task<R> { return invoke_action(as<A>(a), ctx); },
        [](void* to, void* from) noexcept { ::new (to) A(std::move(as<A>(from))); },
        std::is_trivially_destructible_v<A> ? nullptr
                                            : +[](void* a) noexcept { std::destroy_at(&as<A>(a)); }};

    const ops* ops_;
    alignas(void*) unsigned char bytes_[capacity];
};

/// Whether `A` is run as an `erased_action`: it returns exactly `task<R>`, fits in its capacity
/// aligned as a pointer, and moving it cannot throw. `RESILIENCE_NO_ACTION_ERASURE` turns it off:
/// every action type then instantiates a call body of its own, as in 0.1, and saves the indirect call.
template <class A>
constexpr bool erasable_action() noexcept {
#if defined(RESILIENCE_NO_ACTION_ERASURE)
    return false;
#else
    if constexpr (!std::is_same_v<action_awaitable_t<A>, task<action_result_t<A>>>)
        return false;
    else if constexpr (std::is_same_v<A, erased_action<action_result_t<A>>>)
        return false; // already erased
    else
        return sizeof(A) <= erased_action<action_result_t<A>>::capacity && alignof(A) <= alignof(void*) &&
               std::is_nothrow_move_constructible_v<A>;
#endif
}

/// What a call keeps of `action`: an `erased_action` when `erasable_action()` says so, else the
/// action itself (handed on by reference: moved once, into the call).
template <class A>
decltype(auto)
stored_action(A&& action) noexcept(std::is_nothrow_constructible_v<std::remove_cvref_t<A>, A>) {
    using T = std::remove_cvref_t<A>;
    if constexpr (erasable_action<T>())
        return erased_action<action_result_t<T>>{std::forward<A>(action)};
    else
        return std::forward<A>(action);
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
    // By reference: the drive makes its leaf from the holder where it calls it, and a `next` that is a
    // coroutine with captures (a user's, given to `run`) must outlive the task it makes.
    Next& leaf() noexcept { return next; }
};

} // namespace resilience::detail
