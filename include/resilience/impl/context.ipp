// SPDX-License-Identifier: MIT
// The definitions of <resilience/context.hpp> that do not depend on a user's type: included by the
// header (header-only), or compiled once into resilience::compiled (detail/config.hpp).
#pragma once

#include "../context.hpp"

namespace resilience::inline v0_2::detail {

RESILIENCE_DECL lazy_stop::made* lazy_stop::materialize() const {
    // The parent's token (its lazy stop's, which this may make first), if it can stop.
    const stop_token* parent = nullptr;
    if (parent_ & token_tag)
        parent = token_of(parent_);
    else if (parent_)
        parent = &reinterpret_cast<const lazy_stop*>(parent_)->token();
    void* space = frame_cache::allocate(sizeof(made));
    made* m = nullptr;
    try {
        m = ::new (space) made{};
    } catch (...) {
        frame_cache::deallocate(space, sizeof(made));
        throw;
    }
    if (parent && parent->stop_possible())
        m->link.emplace(*parent, forward{&m->source}); // stops it at once if the parent has stopped
    m->token = m->source.get_token();
    std::uintptr_t seen = word_.load(std::memory_order_acquire);
    for (;;) {
        if (made* first = block_of(seen)) {
            discard(m); // another thread asked at the same time, and published its block first
            return first;
        }
        if (seen & expired_flag)
            m->source.request_stop(); // the deadline has passed: published already stopped
        if (word_.compare_exchange_weak(seen, reinterpret_cast<std::uintptr_t>(m) | seen,
                                        std::memory_order_acq_rel, std::memory_order_acquire))
            return m;
    }
}

} // namespace resilience::detail
