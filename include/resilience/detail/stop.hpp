// SPDX-License-Identifier: MIT
/// \file detail/stop.hpp
/// Per-attempt stop sources, requesting a stop through a held copy, and linking a source to a parent token.
#pragma once

#include "../stop_token.hpp"

#include <optional>
#include <utility>

namespace resilience::inline v0_2::detail {

/// Requests a stop through a copy of `source`, which holds the stop state until the request is done.
/// A request runs the token's callbacks one after the other, and one of them may resume a coroutine
/// that ends the whole call inline (an awaiter resumed from a stop callback, as some I/O wrappers do),
/// destroying whatever held `source` and every token of it while callbacks remain to run: without the
/// copy, the request would go on in a freed state. A stop the library requests on a source it does
/// not hold in a local of its own goes through here (or through `pooled_stop_source::request_stop`).
inline bool request_stop_held(stop_source source) noexcept {
    return source.request_stop();
}

/// An attempt's own stop source. Its state comes from the per-thread frame cache (see
/// stop_token.hpp), so a policy that gives each attempt a source pays no `malloc` per call once
/// the cache is warm.
class pooled_stop_source {
public:
    pooled_stop_source() = default;
    pooled_stop_source(const pooled_stop_source&) = delete;
    pooled_stop_source& operator=(const pooled_stop_source&) = delete;

    stop_token get_token() const noexcept { return source_.get_token(); }
    stop_source& source() noexcept { return source_; }
    bool request_stop() noexcept { return request_stop_held(source_); }
    bool stop_requested() const noexcept { return source_.stop_requested(); }

private:
    stop_source source_;
};

/// Forwards a stop request from a parent token to a child source for as long as it lives.
class stop_link {
    struct forward {
        pooled_stop_source* child;
        void operator()() const noexcept { child->request_stop(); }
    };

public:
    stop_link(const stop_token& parent, pooled_stop_source& child) {
        if (parent.stop_possible())
            link_.emplace(parent, forward{&child});
    }

private:
    std::optional<stop_callback<forward>> link_;
};

} // namespace resilience::detail
