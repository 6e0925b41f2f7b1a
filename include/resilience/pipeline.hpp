// SPDX-License-Identifier: MIT
/// \file pipeline.hpp
/// `pipeline<Ps...>`: policies composed outermost first; itself a policy, so pipelines nest. A call
/// through it runs every stage in one coroutine frame (the driver, engine/driver.hpp): the
/// pipeline's part is to hand the driver its stages, flattened once when it is built.
#pragma once

#include "detail/stages.hpp"
#include "policy.hpp"

#include <cstddef>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2 {

namespace detail {

/// One element of a pipeline, checked: a compiler shows `pipeline_element<Index, Type>` with the
/// message, so the error says which element (counting from 0) is not a policy, and what it is.
template <std::size_t Index, class Type>
struct pipeline_element {
    static_assert(
        policy<Type>,
        "resilience::pipeline: this element is not a policy (its index, counting from 0, and its type "
        "are the arguments of pipeline_element<Index, Type> shown with this error). A policy is what "
        "the library's policies are, or a class deriving from rs::policy_base with run() or "
        "enter()/leave(): see docs/pipeline.md");
};
/// Every element, checked: instantiating it runs each element's check. A complete class even when
/// a check fails, so that the check's message is the only error.
template <class Indices, class... Ps>
struct pipeline_elements;
template <std::size_t... Is, class... Ps>
struct pipeline_elements<std::index_sequence<Is...>, Ps...> : pipeline_element<Is, Ps>... {};

/// The stages of the policies, outermost first, nested pipelines flattened (see `stages_of`).
template <class... Ps>
auto flatten_stages(const std::tuple<Ps...>& policies) noexcept {
    return std::apply([](const auto&... p) { return std::tuple_cat(stages_of(p)...); }, policies);
}

} // namespace detail

/// Composes policies: the first listed is the outermost. `pipeline{retry, breaker, timeout}` runs
/// the retry loop, whose every attempt passes the breaker, whose every admitted call runs under
/// the timeout. Holds its policies by value: a copy of a stateful policy (breaker, bulkhead, ...)
/// is a handle to the same state, so sharing a breaker between pipelines is copying it in.
/// A pipeline is configuration (docs/core.md, "Lifetimes"): a call made on it needs it while the
/// call may still be resumed, unless the pipeline was moved into the call
/// (`std::move(p).execute(f)`); the shared state behind its handles is kept alive by the calls
/// that use it, so destroying the pipeline and then the loop holding suspended calls is safe.
template <class... Ps>
class pipeline : public policy_base<pipeline<Ps...>> {
    static_assert(sizeof...(Ps) > 0, "resilience::pipeline: a pipeline needs at least one policy");
    static_assert(sizeof(detail::pipeline_elements<std::index_sequence_for<Ps...>, Ps...>) > 0);

public:
    explicit pipeline(Ps... ps) : policies_(std::move(ps)...) { stages_.emplace(flatten(policies_)); }
    // The stages refer to this pipeline's own policies: a copy or a move makes its own.
    pipeline(const pipeline& other)
    requires(std::is_copy_constructible_v<Ps> && ...)
        : policy_base<pipeline>(), policies_(other.policies_) {
        stages_.emplace(flatten(policies_));
    }
    pipeline(pipeline&& other) noexcept(std::is_nothrow_move_constructible_v<std::tuple<Ps...>>)
        : policy_base<pipeline>(), policies_(std::move(other.policies_)) {
        stages_.emplace(flatten(policies_));
    }
    // The stages are made again, also when an element's assignment throws halfway. Calls made
    // through the pipeline must have ended (or never be resumed), as for destroying it.
    pipeline& operator=(const pipeline& other)
    requires(std::is_copy_assignable_v<Ps> && ...)
    {
        const remake_stages remake{this};
        policies_ = other.policies_;
        return *this;
    }
    pipeline& operator=(pipeline&& other) noexcept(std::is_nothrow_move_assignable_v<std::tuple<Ps...>>)
    requires(std::is_move_assignable_v<Ps> && ...)
    {
        const remake_stages remake{this};
        policies_ = std::move(other.policies_);
        return *this;
    }
    ~pipeline() = default;

    /// The policies a call passes through, outermost first, nested pipelines flattened (see
    /// `detail::stages_of`): the whole pipeline runs a call in one coroutine frame. Made once, when
    /// the pipeline is: a call refers to them rather than making its own.
    const auto& stages() const noexcept { return *stages_; }

    /// The first of its policies, outermost first, that may sleep on the default clock (see
    /// `detail::default_clock_sleeper`); a call through the pipeline asks its stages directly.
    [[nodiscard]] detail::sleeper may_sleep_on_default_clock() const noexcept {
        return detail::first_default_clock_sleeper(stages());
    }

    /// The I-th policy, outermost first.
    template <std::size_t I>
    const auto& get() const noexcept {
        return std::get<I>(policies_);
    }

private:
    static auto flatten(const std::tuple<Ps...>& policies) noexcept {
        return detail::flatten_stages(policies);
    }
    struct remake_stages {
        pipeline* self;
        ~remake_stages() { self->stages_.emplace(flatten(self->policies_)); }
    };

    std::tuple<Ps...> policies_;
    // References to `policies_` (see `stages_of`); in an optional only so that the policies may be
    // built first.
    std::optional<decltype(detail::flatten_stages(std::declval<const std::tuple<Ps...>&>()))> stages_;
};

template <class... Ps>
pipeline(Ps...) -> pipeline<Ps...>;

} // namespace resilience
