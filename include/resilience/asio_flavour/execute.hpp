// SPDX-License-Identifier: MIT
/// \file asio_flavour/execute.hpp
/// `execute(executor, policy, action, token)` and `execute(policy, action, token)`: one call through a
/// policy as an Asio asynchronous operation, whose action may return an Asio awaitable.
///
/// A body of the Asio integration, written once for both Asio flavours: <resilience/asio.hpp> and
/// <resilience/boost_asio.hpp> include it with RESILIENCE_ASIO_FLAVOUR (the namespace it goes in,
/// under resilience::) and RESILIENCE_ASIO_NET (the Asio it is built on, unqualified) defined, and Asio's headers
/// already included. No include guard: it is included once per flavour.

#if !defined(RESILIENCE_ASIO_FLAVOUR) || !defined(RESILIENCE_ASIO_NET) ||                                    \
    !defined(RESILIENCE_ASIO_FLAVOUR_NAME)
#error "include <resilience/asio.hpp> (standalone Asio) or <resilience/boost_asio.hpp> (Boost.Asio)"
#endif

#include "../concepts.hpp"
#include "../context.hpp"
#include "../detail/frame_allocator.hpp"
#include "../engine/action.hpp"
#include "../policy.hpp"
#include "../stop_token.hpp"
#include "../task.hpp"

#include <concepts>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2::RESILIENCE_ASIO_FLAVOUR {

namespace detail {

template <class T>
struct net_awaitable_traits {
    static constexpr bool is_net_awaitable = false;
};
#if RESILIENCE_ASIO_HAS_CO_AWAIT
template <class T, class E>
struct net_awaitable_traits<net::awaitable<T, E>> {
    static constexpr bool is_net_awaitable = true;
    using value_type = T;
    using executor_type = E;
};
#endif

/// An Asio awaitable of some Asio (this flavour's or the other's): it names a value and an executor type.
template <class T>
concept some_asio_awaitable = requires {
    typename T::value_type;
    typename T::executor_type;
};

/// Allocates from the thread's frame cache (detail/frame_allocator.hpp): an attempt's shared link.
template <class T>
struct frame_cache_allocator {
    using value_type = T;
    frame_cache_allocator() noexcept = default;
    template <class U>
    frame_cache_allocator(const frame_cache_allocator<U>&) noexcept {}
    T* allocate(std::size_t n) {
        return static_cast<T*>(resilience::detail::frame_cache::allocate(n * sizeof(T)));
    }
    void deallocate(T* p, std::size_t n) noexcept {
        resilience::detail::frame_cache::deallocate(p, n * sizeof(T));
    }
    template <class U>
    bool operator==(const frame_cache_allocator<U>&) const noexcept {
        return true;
    }
};

#if RESILIENCE_ASIO_HAS_CO_AWAIT // co_spawn of an awaitable: only where this Asio has awaitables
/// The result of one attempt's awaitable as a resilience awaitable: the awaitable runs as a coroutine
/// of its own (`co_spawn`) on the call's serialising executor (`call_executor`: the call's executor when
/// that serialises it, else the call's strand of it), and completes there; the attempt's stop token,
/// when stopped, emits a `terminal` cancellation to it from there, so the Asio operation it waits for
/// ends at once. The attempt never outlives the call: the stop reaches it, and the policy waits for it to end.
template <class T, class Awaitable>
class attempt_awaiter {
    struct link {
        attempt_awaiter* self = nullptr; // null once the awaiter is gone (its call destroyed)
        bool done = false;               // the coroutine ended: nothing more to emit (serialised)
        net::cancellation_signal signal;
    };
    using stored = std::conditional_t<std::is_void_v<T>, char, T>;

public:
    attempt_awaiter(Awaitable aw, const call_executor& where, stop_token token)
        : awaitable_(std::move(aw)), where_(&where), token_(std::move(token)) {}
    attempt_awaiter(attempt_awaiter&&) = default;
    attempt_awaiter& operator=(attempt_awaiter&&) = delete;
    ~attempt_awaiter() {
        stop_.reset();
        if (link_)
            link_->self = nullptr; // destroyed with its call (io_context teardown): nobody to resume
    }

    bool await_ready() const noexcept { return false; }

    void await_suspend(std::coroutine_handle<> h) {
        waiter_ = h;
        home_ = call_home::current();
        link_ = std::allocate_shared<link>(frame_cache_allocator<link>{});
        link_->self = this;
        // The attempt runs on the call's serialising executor, as its cancellation is emitted there:
        // Asio requires the two to be serialised (the coroutine installs and clears its operations'
        // cancellation handlers as it runs, and the emission calls them). On a multi-threaded
        // io_context's own executor they would not be: an emission would race with the coroutine
        // running on another thread. The completion has no executor of its own, so co_spawn runs it
        // there too and takes an emission straight to the coroutine, without a dispatch.
        where_->visit([&](const auto& serial) {
            net::co_spawn(serial, std::move(awaitable_),
                          net::bind_cancellation_slot(link_->signal.slot(), completion{link_}));
        });
        // co_spawn never completes inside its initiating function: the awaiter is suspended by now.
        if (token_.stop_possible())
            stop_.emplace(token_, on_stop{link_, where_});
    }

    T await_resume() {
        stop_.reset();
        if (error_)
            std::rethrow_exception(error_);
        if constexpr (!std::is_void_v<T>)
            return std::move(*value_);
    }

private:
    struct on_stop {
        std::shared_ptr<link> l;
        const call_executor* where; // the call's: outlives the awaiter, which outlives this
        void operator()() const {
            // Any thread: the emission goes to where the attempt runs.
            where->visit([&](const auto& serial) {
                net::post(serial, [l = l] {
                    if (!l->done)
                        l->signal.emit(net::cancellation_type::terminal);
                });
            });
        }
    };

    struct completion {
        std::shared_ptr<link> l;
        void finish() {
            l->done = true;
            attempt_awaiter* const self = l->self;
            if (!self)
                return;
            resilience::detail::home_loop::scope here(self->home_);
            self->waiter_.resume(); // `self` may be gone after this
        }
        void operator()(std::exception_ptr e)
        requires std::is_void_v<T>
        {
            if (l->self)
                l->self->error_ = std::move(e);
            finish();
        }
        template <class V>
        void operator()(std::exception_ptr e, V&& v)
        requires(!std::is_void_v<T>)
        {
            if (attempt_awaiter* const self = l->self) {
                if (e)
                    self->error_ = std::move(e);
                else
                    self->value_.emplace(std::forward<V>(v));
            }
            finish();
        }
    };

    Awaitable awaitable_;
    const call_executor* where_;
    stop_token token_;
    std::coroutine_handle<> waiter_;
    call_home* home_ = nullptr;
    std::shared_ptr<link> link_;
    std::exception_ptr error_;
    std::optional<stored> value_;
    std::optional<stop_callback<on_stop>> stop_;
};

/// An attempt as an `rs::task<T>`: the same type for every action of one result type, so that the
/// action (`asio_action`) is kept type-erased in the call's frame and the call's body is compiled once
/// per policy and result type, as for an action returning a task (engine/action.hpp). The awaiter is a
/// named local: g++ before 13 destroys a temporary written inside the `co_await` twice.
template <class T, class Awaitable>
task<T> attempt_task(Awaitable aw, const call_executor& where, stop_token token) {
    attempt_awaiter<T, Awaitable> attempt{std::move(aw), where, std::move(token)};
    if constexpr (std::is_void_v<T>)
        co_await attempt;
    else
        co_return co_await attempt;
}

#endif

/// What an action returned, checked: an Asio awaitable of this flavour, or a resilience awaitable.
template <class R>
constexpr void check_attempt() noexcept {
    if constexpr (!net_awaitable_traits<R>::is_net_awaitable && !resilience::awaitable<R>) {
        static_assert(
            !some_asio_awaitable<R>,
            "rs::" RESILIENCE_ASIO_FLAVOUR_NAME "::execute: the action returns an awaitable of "
            "another Asio; accepted: an awaitable of this flavour's Asio (" RESILIENCE_ASIO_FLAVOUR_NAME
            " is " RESILIENCE_ASIO_NET_NAME "::awaitable<T>) or rs::task<T>");
        static_assert(some_asio_awaitable<R>,
                      "rs::" RESILIENCE_ASIO_FLAVOUR_NAME "::execute: the action returns a plain value, not "
                      "something to await; accepted: " RESILIENCE_ASIO_NET_NAME
                      "::awaitable<T> (a coroutine of that Asio) or rs::task<T>");
    }
}

/// What an action refused by `check_attempt` returns to the policy instead, so that the policy's code
/// compiles around it and the assertion is the one error the user reads (not the core's "returns a
/// plain value" for another Asio's awaitable). Never run: the program does not compile.
template <class T>
struct refused_attempt {
    bool await_ready() const noexcept { return true; }
    void await_suspend(std::coroutine_handle<>) const noexcept {}
    T await_resume() const { std::terminate(); }
};

/// The action as the policy sees it: each call of it (one per attempt) calls the user's action, and
/// an Asio awaitable it returns runs on the call's serialising executor (its strand).
template <class F>
class asio_action {
public:
    asio_action(F f, const call_executor& where) : f_(std::move(f)), where_(&where) {}

    auto operator()(const context& ctx) {
        using R = decltype(resilience::detail::invoke_action(f_, ctx));
#if RESILIENCE_ASIO_HAS_CO_AWAIT
        if constexpr (net_awaitable_traits<R>::is_net_awaitable) {
            return attempt_task<typename net_awaitable_traits<R>::value_type, R>(
                resilience::detail::invoke_action(f_, ctx), *where_, ctx.stop_token());
        } else
#endif
            if constexpr (resilience::awaitable<R>) {
            return resilience::detail::invoke_action(f_, ctx);
        } else {
            check_attempt<R>();
            if constexpr (some_asio_awaitable<R>)
                return refused_attempt<typename R::value_type>{};
            else
                return refused_attempt<R>{};
        }
    }

private:
    F f_;
    const call_executor* where_; // the call's home's: outlives the call's policy frames
};

template <class F>
using user_result_t =
    decltype(resilience::detail::invoke_action(std::declval<F&>(), std::declval<const context&>()));

/// The value the call completes with.
template <class P, class F>
using execute_result_t = await_result_t<decltype(std::declval<P&>().execute(std::declval<asio_action<F>>(),
                                                                            std::declval<stop_token>()))>;

/// Starts the call (in `async_run`'s frame, on the call's strand, its home current): the policy's
/// call with the wrapped action. Holds the policy for the call: a copy of an rvalue, or a reference.
template <class P, class F>
class execute_make {
public:
    execute_make(P policy, F f) : policy_(std::forward<P>(policy)), f_(std::move(f)) {}
    execute_make(execute_make&&) = default;
    execute_make& operator=(execute_make&&) = delete;

    auto operator()(stop_token token) {
        call_home* const home = call_home::current();
        return policy().execute(asio_action<F>{std::move(f_), home->where()}, std::move(token));
    }

private:
    auto& policy() noexcept {
        if constexpr (std::is_lvalue_reference_v<P>)
            return policy_.get();
        else
            return policy_;
    }
    std::conditional_t<std::is_lvalue_reference_v<P>, std::reference_wrapper<std::remove_reference_t<P>>,
                       std::remove_cvref_t<P>>
        policy_;
    F f_;
};

template <class T>
inline constexpr bool makes_something_to_await = false;
template <>
inline constexpr bool makes_something_to_await<use_task_t> = true;
template <>
inline constexpr bool makes_something_to_await<use_task_with_stop_t> = true;
#if RESILIENCE_ASIO_HAS_CO_AWAIT
template <class E>
inline constexpr bool makes_something_to_await<net::use_awaitable_t<E>> = true;
#endif
#if RESILIENCE_ASIO_HAS_DEFERRED
template <>
inline constexpr bool makes_something_to_await<net::deferred_t> = true;
#endif

/// Whether `E` runs its work on the system context (`system_executor`, `use_future`'s): no place for a call.
template <class E>
constexpr bool runs_on_system_context() noexcept {
    if constexpr (requires { net::query(std::declval<const E&>(), net::execution::context); })
        return std::is_same_v<
            std::remove_cvref_t<decltype(net::query(std::declval<const E&>(), net::execution::context))>,
            net::system_context>;
    else
        return false;
}

struct no_associated_executor {};

/// `use_future`: its handler's executor runs on the system context, though its `execution::context`
/// query names only an `execution_context`, so the token itself is recognised.
template <class T>
inline constexpr bool is_use_future = false;
#if RESILIENCE_ASIO_HAS_USE_FUTURE
template <class A>
inline constexpr bool is_use_future<net::use_future_t<A>> = true;
#endif

/// What the first argument of `execute` names when it is an executor. A handle with `execute(f)` and
/// `==` (a bulkhead, a circuit breaker, a limiter, `any_policy`) looks like an Asio executor to
/// Asio's own concept, and is a policy.
template <class E>
concept executor_argument =
    !resilience::policy<E> && (net::execution::executor<E> || net::is_executor<E>::value);

template <class Policy, class Action, class Token>
constexpr void check_execute() noexcept {
    if constexpr (makes_something_to_await<std::decay_t<Token>>)
        resilience::detail::check_action_temporary<Action>();
}

template <class R>
constexpr void check_result() noexcept {
    static_assert(std::is_void_v<R> || std::is_default_constructible_v<R>,
                  "rs::" RESILIENCE_ASIO_FLAVOUR_NAME "::execute: the call's value type must be default "
                  "constructible: the completion signature void(std::exception_ptr, T) carries a value on "
                  "failure too, as co_spawn's does (return std::optional<T> from the action otherwise)");
}

} // namespace detail

/// One call through `policy` as an Asio asynchronous operation, completing `token` with
/// `(std::exception_ptr, T)` (`(std::exception_ptr)` for `void`), as `co_spawn` does: with
/// `use_awaitable` a failure is rethrown in the awaiting coroutine; `deferred`, `use_future`, a
/// callback, `as_tuple` and `use_task` work too (`redirect_error` redirects nothing, as with `co_spawn`). `T` must be default constructible.
///
/// `action` (called once per attempt, with `(rs::context const&)`, `(stop_token)` or `()`) returns
/// `awaitable<T>` of this Asio, or `rs::task<T>`. Attempts and the policies' sleeps run on a strand
/// of `executor`; a policy on the default clock sleeps on that executor's timers. An attempt a policy
/// stops (a timeout, a hedge's loser, the call's own stop) gets a `terminal` cancellation. The
/// handler runs on its associated executor (by default `executor`), never inside this function.
/// Cancellation on the token's slot (`terminal` or `partial`) stops the call, which then completes
/// with `rs::cancelled_error`. `policy`: an lvalue is used in place (it must outlive the call, as
/// for `execute`); an rvalue is moved into the call. docs/asio.md.
///
///     auto body = co_await rs::boost_asio::execute(ex, policy, fetch, boost::asio::use_awaitable);
template <class Executor, class Policy, class Action, class CompletionToken>
requires detail::executor_argument<Executor>
auto execute(const Executor& executor, Policy&& policy, Action&& action, CompletionToken&& token) {
    using action_type = std::decay_t<Action>;
    detail::check_execute<Policy, Action, CompletionToken>();
    using R = detail::execute_result_t<Policy, action_type>;
    detail::check_result<R>();
    using signature = typename detail::completion_signature<R>::type;
    net::any_io_executor ex(executor);
    return net::async_initiate<CompletionToken, signature>(
        [ex = std::move(ex)](auto handler, detail::execute_make<Policy, action_type> make) {
            detail::launch_stoppable(ex, std::move(make), std::move(handler));
        },
        token,
        detail::execute_make<Policy, action_type>{std::forward<Policy>(policy),
                                                  action_type(std::forward<Action>(action))});
}

/// The same on an execution context's executor (`io_context&`).
template <class ExecutionContext, class Policy, class Action, class CompletionToken>
requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
auto execute(ExecutionContext& context, Policy&& policy, Action&& action, CompletionToken&& token) {
    return execute(context.get_executor(), std::forward<Policy>(policy), std::forward<Action>(action),
                   std::forward<CompletionToken>(token));
}

/// The same, on the executor associated with the completion handler when the operation is initiated:
/// with `use_awaitable`, the awaiting coroutine's (`deferred` then awaited works the same way). A
/// handler without an executor of its own (a plain callback, `use_future`) is refused at compile time.
///
///     auto body = co_await rs::boost_asio::execute(policy, fetch, boost::asio::use_awaitable);
template <class Policy, class Action, class CompletionToken>
requires(!detail::executor_argument<std::decay_t<Policy>> &&
         !std::is_convertible_v<Policy&, net::execution_context&>)
auto execute(Policy&& policy, Action&& action, CompletionToken&& token) {
    using action_type = std::decay_t<Action>;
    detail::check_execute<Policy, Action, CompletionToken>();
    using R = detail::execute_result_t<Policy, action_type>;
    detail::check_result<R>();
    using signature = typename detail::completion_signature<R>::type;
    return net::async_initiate<CompletionToken, signature>(
        [](auto handler, detail::execute_make<Policy, action_type> make) {
            using handler_executor =
                net::associated_executor_t<decltype(handler), detail::no_associated_executor>;
            static_assert(!std::is_same_v<handler_executor, detail::no_associated_executor> &&
                              !detail::runs_on_system_context<handler_executor>() &&
                              !detail::is_use_future<std::decay_t<CompletionToken>>,
                          "rs::" RESILIENCE_ASIO_FLAVOUR_NAME "::execute(policy, action, token): this "
                          "token's handler has no executor of its own to run the call on; pass an "
                          "executor: execute(executor, policy, action, token)");
            const net::any_io_executor ex(net::get_associated_executor(handler));
            detail::launch_stoppable(ex, std::move(make), std::move(handler));
        },
        token,
        detail::execute_make<Policy, action_type>{std::forward<Policy>(policy),
                                                  action_type(std::forward<Action>(action))});
}

} // namespace resilience::RESILIENCE_ASIO_FLAVOUR
