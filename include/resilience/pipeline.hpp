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

    template <class Next>
    auto run(Next next, const context& ctx) const {
        return run_from<0>(std::move(next), ctx);
    }

    /// The I-th policy, outermost first.
    template <std::size_t I>
    const auto& get() const noexcept {
        return std::get<I>(policies_);
    }

private:
    template <std::size_t I, class Next>
    struct stage {
        const pipeline* self;
        Next next;
        auto operator()(const context& ctx) const { return self->template run_from<I>(next, ctx); }
    };

    template <std::size_t I, class Next>
    auto run_from(Next next, const context& ctx) const {
        if constexpr (I + 1 == sizeof...(Ps))
            return std::get<I>(policies_).run(std::move(next), ctx);
        else
            return std::get<I>(policies_).run(stage<I + 1, Next>{this, std::move(next)}, ctx);
    }

    std::tuple<Ps...> policies_;
};

template <class... Ps>
pipeline(Ps...) -> pipeline<Ps...>;

} // namespace resilience
