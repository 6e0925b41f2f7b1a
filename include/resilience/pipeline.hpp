// SPDX-License-Identifier: MIT
/// \file pipeline.hpp
/// `pipeline<Ps...>`: policies composed outermost first; itself a policy, so pipelines nest.
#pragma once

#include "policy.hpp"

#include <cstddef>
#include <tuple>
#include <utility>

namespace resilience {

/// Composes policies: the first listed is the outermost. `pipeline{retry, breaker, timeout}` runs
/// the retry loop, whose every attempt passes the breaker, whose every admitted call runs under
/// the timeout. Holds its policies by value: a copy of a stateful policy (breaker, bulkhead, ...)
/// is a handle to the same state, so sharing a breaker between pipelines is copying it in.
/// A pipeline must outlive the calls made through it.
template <policy... Ps>
class pipeline : public policy_base<pipeline<Ps...>> {
    static_assert(sizeof...(Ps) > 0, "a pipeline needs at least one policy");

public:
    explicit pipeline(Ps... ps) : policies_(std::move(ps)...) {}

    /// The policies a call passes through, outermost first, nested pipelines flattened: the
    /// whole pipeline runs a call in one coroutine frame (see `policy_base`).
    auto stages() const noexcept {
        return std::apply([](const auto&... p) { return std::tuple_cat(detail::stages_of(p)...); }, policies_);
    }

    /// The I-th policy, outermost first.
    template <std::size_t I>
    const auto& get() const noexcept {
        return std::get<I>(policies_);
    }

private:
    std::tuple<Ps...> policies_;
};

template <class... Ps>
pipeline(Ps...) -> pipeline<Ps...>;

} // namespace resilience
