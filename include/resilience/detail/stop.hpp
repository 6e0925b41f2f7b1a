// SPDX-License-Identifier: MIT
/// \file detail/stop.hpp
/// Per-attempt stop sources without a heap allocation per call, and linking them to a parent token.
#pragma once

#include <cstddef>
#include <optional>
#include <stop_token>
#include <utility>
#include <vector>

namespace resilience::detail {

/// Requests a stop through a copy of `source`, which holds the stop state until the request is done.
/// A request runs the token's callbacks one after the other, and one of them may resume a coroutine
/// that ends the whole call inline (an awaiter resumed from a stop callback, as some I/O wrappers do),
/// destroying whatever held `source` and every token of it while callbacks remain to run: without the
/// copy, the request would go on in a freed state. A stop the library requests on a source it does
/// not hold in a local of its own goes through here (or through `pooled_stop_source::request_stop`).
inline bool request_stop_held(std::stop_source source) noexcept {
    return source.request_stop();
}

/// A `std::stop_source` borrowed from a per-thread pool. Every `std::stop_source` allocates its
/// shared state; a policy that gives each attempt its own source would pay that on every call.
/// A source comes back to the pool only if nobody asked it to stop, so a reused source is
/// indistinguishable from a new one to the next attempt. (A token an action kept past the end of
/// its attempt could see a later attempt's stop; attempts never outlive their call, so only an
/// action that stashes its token somewhere global can notice.)
class pooled_stop_source {
public:
    pooled_stop_source() : source_(acquire()) {}
    pooled_stop_source(const pooled_stop_source&) = delete;
    pooled_stop_source& operator=(const pooled_stop_source&) = delete;
    ~pooled_stop_source() { release(std::move(source_)); }

    std::stop_token get_token() const noexcept { return source_.get_token(); }
    std::stop_source& source() noexcept { return source_; }
    bool request_stop() noexcept { return request_stop_held(source_); }
    bool stop_requested() const noexcept { return source_.stop_requested(); }

private:
    static constexpr std::size_t max_pooled = 256;
    static std::vector<std::stop_source>& pool() {
        thread_local std::vector<std::stop_source> p;
        return p;
    }
    static std::stop_source acquire() {
        auto& p = pool();
        if (p.empty())
            return std::stop_source{};
        std::stop_source s = std::move(p.back());
        p.pop_back();
        return s;
    }
    static void release(std::stop_source s) noexcept {
        if (s.stop_requested() || !s.stop_possible())
            return;
        try {
            auto& p = pool();
            if (p.size() < max_pooled)
                p.push_back(std::move(s));
        } catch (...) {
            // the pool could not grow: let the source go
        }
    }

    std::stop_source source_;
};

/// Forwards a stop request from a parent token to a child source for as long as it lives.
class stop_link {
    struct forward {
        pooled_stop_source* child;
        void operator()() const noexcept { child->request_stop(); }
    };

public:
    stop_link(const std::stop_token& parent, pooled_stop_source& child) {
        if (parent.stop_possible())
            link_.emplace(parent, forward{&child});
    }

private:
    std::optional<std::stop_callback<forward>> link_;
};

} // namespace resilience::detail
