// SPDX-License-Identifier: MIT
/// \file any_policy.hpp
/// `any_policy<T>`: any policy or pipeline for actions that produce `T`, behind one type, for class
/// members, registries and plugin boundaries where spelling the pipeline's type is a burden.
#pragma once

#include "context.hpp"
#include "detail/shared_handle.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "task.hpp"

#include <memory>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2 {

namespace detail {

/// The rest of a call, seen through a type-erased policy: calls the `next` it was made from,
/// which lives in the frame of the `any_policy::run` that made it, for as long as the call runs.
template <class T>
class erased_next {
public:
    template <class Next>
    explicit erased_next(Next& next) noexcept : next_(&next), call_(&call<Next>) {}

    task<outcome<T>> operator()(const context& ctx) const { return call_(next_, ctx); }

private:
    template <class Next>
    static task<outcome<T>> call(void* next, const context& ctx) {
        co_return co_await (*static_cast<Next*>(next))(ctx);
    }

    void* next_;
    task<outcome<T>> (*call_)(void*, const context&);
};

} // namespace detail

/// Holds any policy (a pipeline included) that can run actions producing `T`, and is itself a
/// policy: `execute`, `execute_outcome` and `run`, and it composes in pipelines.
///
///     class inventory_client {
///         rs::any_policy<stock> policy_;   // no template argument lists the pipeline
///     public:
///         explicit inventory_client(rs::any_policy<stock> p) : policy_(std::move(p)) {}
///         rs::task<stock> get(sku id) { return policy_.execute(fetch, id); }
///     };
///     inventory_client client{rs::pipeline{rs::retry{}, rs::timeout{2s}}};
///
/// Copies share the policy they hold, as copies of a stateful handle share its state (a copy of a
/// breaker inside is the same breaker). The held policy is immutable once wrapped. It is a handle
/// (docs/core.md, "Lifetimes"): a call made on it copies it, so the held policy lives until the
/// call has ended, and the `any_policy` may be destroyed or reassigned meanwhile. Inside a
/// pipeline, it is one of the pipeline's policies, and the pipeline's rule applies.
///
/// What it costs: one virtual call and one coroutine frame more per call (recycled, no
/// allocation after warm-up; see bench/README.md, `any_policy_pipeline`), and the held pipeline
/// runs as a stage of its own, not flattened into the caller's pipeline. Where the type can be
/// named, a `decltype` alias costs nothing:
///
///     inline const auto make_policy = [] { return rs::pipeline{rs::retry{}, rs::timeout{2s}}; };
///     using client_policy = decltype(make_policy());
template <class T>
class any_policy;

namespace detail {
template <class T>
struct any_policy_concept : shared_state {
    virtual ~any_policy_concept() = default;
    virtual task<outcome<T>> run(erased_next<T> next, const context& ctx) const = 0;
    virtual sleeper may_sleep_on_default_clock() const noexcept = 0;
};
} // namespace detail

template <class T>
class any_policy : public policy_base<any_policy<T>>,
                   public detail::shared_handle<any_policy<T>, detail::any_policy_concept<T>> {
    using concept_t = detail::any_policy_concept<T>;
    using handle = detail::shared_handle<any_policy<T>, concept_t>;

public:
    using value_type = T;

    /// Wraps `p` (copied in). `P` must be a policy (built on `rs::policy_base`, as every policy of
    /// the library and every pipeline is) that runs actions producing `T`. The constraint only
    /// looks at the base class: checking the whole `policy` concept here would make the check
    /// depend on itself when a tuple of `any_policy` references is copied.
    template <class P>
    requires(!std::is_same_v<std::remove_cvref_t<P>, any_policy> &&
             std::is_base_of_v<policy_base<std::remove_cvref_t<P>>, std::remove_cvref_t<P>>)
    any_policy(P&& p) // NOLINT(google-explicit-constructor): a policy converts, as a lambda to std::function
        : handle(new model<std::remove_cvref_t<P>>(std::forward<P>(p))) {
        static_assert(policy<std::remove_cvref_t<P>>, "resilience::any_policy: the argument is not a policy");
    }

    /// The waiting form of the protocol (see policy.hpp): the held policy runs `next` once.
    template <class Next>
    task<detail::next_outcome_t<Next>> run(Next next, const context& ctx) const {
        static_assert(std::is_same_v<detail::next_value_t<Next>, T>,
                      "resilience::any_policy<T>: the action must produce exactly T");
        co_return co_await this->held().run(detail::erased_next<T>{next}, ctx);
    }

    /// What the held policy answers (see `detail::default_clock_sleeper`).
    [[nodiscard]] detail::sleeper may_sleep_on_default_clock() const noexcept {
        return this->held().may_sleep_on_default_clock();
    }

    // Copies that hold the same policy are equal (`==`, and `std::hash`: from `detail::shared_handle`).

private:
    template <class P>
    struct model final : concept_t {
        template <class Q>
        explicit model(Q&& q) : policy(std::forward<Q>(q)) {}
        task<outcome<T>> run(detail::erased_next<T> next, const context& ctx) const override {
            return detail::as_stage_task<outcome<T>>(policy.run(std::move(next), ctx));
        }
        detail::sleeper may_sleep_on_default_clock() const noexcept override {
            return detail::default_clock_sleeper(policy);
        }
        P policy;
    };
};

} // namespace resilience
