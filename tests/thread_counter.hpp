// SPDX-License-Identifier: MIT
// A count kept per thread while a scope asks for it: the shape of the allocation and catch counters
// (alloc_counter.hpp, throw_counter.hpp), whose hooks add one to `thread_counter<Tag>::count` when
// `enabled`.
#pragma once

#include <cstddef>

namespace resilience_tests {

/// The count of one kind of event on this thread; `Tag` names the kind.
template <class Tag>
struct thread_counter {
    static inline thread_local bool enabled = false;
    static inline thread_local std::size_t count = 0;
};

/// While alive, counts this thread's events of the kind `Tag`, from zero.
template <class Tag>
class counting_scope {
public:
    counting_scope() noexcept {
        thread_counter<Tag>::count = 0;
        thread_counter<Tag>::enabled = true;
    }
    ~counting_scope() { thread_counter<Tag>::enabled = false; }
    counting_scope(const counting_scope&) = delete;
    counting_scope& operator=(const counting_scope&) = delete;
    std::size_t count() const noexcept { return thread_counter<Tag>::count; }
};

} // namespace resilience_tests
