// SPDX-License-Identifier: MIT
/// \file detail/frame_allocator.hpp
/// A per-thread recycling allocator for coroutine frames, so a steady stream of calls reuses the
/// frames of earlier calls instead of calling `malloc` each time.
#pragma once

#include <cstddef>
#include <new>
#include <utility>

namespace resilience::detail {

// Frames are grouped into 64-byte size classes up to 4 KiB; bigger ones go straight to the heap.
// Each class keeps at most `max_cached` free frames per thread, so a burst does not pin memory
// forever. A frame freed on another thread than the one that made it joins that other thread's
// cache: both are plain heap blocks, so that is safe.
class frame_cache {
public:
    static constexpr std::size_t granule = 64;
    static constexpr std::size_t classes = 64;
    static constexpr std::size_t max_cached = 512;

    static void* allocate(std::size_t n) {
        const std::size_t c = class_of(n);
        if (c < classes && alive_) {
            frame_cache& self = instance();
            if (node* head = self.free_[c]) {
                self.free_[c] = head->next;
                --self.count_[c];
                return head;
            }
            return ::operator new((c + 1) * granule);
        }
        return ::operator new(n);
    }

    static void deallocate(void* p, std::size_t n) noexcept {
        const std::size_t c = class_of(n);
        if (c < classes && alive_) {
            frame_cache& self = instance();
            if (self.count_[c] < max_cached) {
                auto* head = static_cast<node*>(p);
                head->next = self.free_[c];
                self.free_[c] = head;
                ++self.count_[c];
                return;
            }
        }
        ::operator delete(p);
    }

    ~frame_cache() {
        alive_ = false;
        for (node*& head : free_)
            while (head)
                ::operator delete(std::exchange(head, head->next));
    }

private:
    struct node {
        node* next;
    };
    static std::size_t class_of(std::size_t n) noexcept { return n == 0 ? 0 : (n - 1) / granule; }
    static frame_cache& instance() {
        thread_local frame_cache cache;
        return cache;
    }

    // Trivially destructible, so it stays readable while other thread_locals are being destroyed:
    // frames freed during thread exit after the cache is gone go back to the heap.
    static inline thread_local bool alive_ = true;
    node* free_[classes] = {};
    std::size_t count_[classes] = {};
};

/// Mixed into every promise type of the library.
struct recycled_frame {
    static void* operator new(std::size_t n) { return frame_cache::allocate(n); }
    static void operator delete(void* p, std::size_t n) noexcept { frame_cache::deallocate(p, n); }
};

} // namespace resilience::detail
