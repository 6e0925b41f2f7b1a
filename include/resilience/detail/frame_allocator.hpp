// SPDX-License-Identifier: MIT
/// \file detail/frame_allocator.hpp
/// A per-thread recycling allocator for coroutine frames, so a steady stream of calls reuses the
/// frames of earlier calls instead of calling `malloc` each time.
#pragma once

#include "inlining.hpp"

#include <cstddef>
#include <new>
#include <utility>

namespace resilience::inline v0_2::detail {

// Frames are grouped into 16-byte size classes up to 4 KiB; bigger ones go straight to the heap. 16 bytes
// is the heap's own step and the alignment a frame needs, so a frame takes the bytes it asks for rounded
// up to that, and every byte a frame is made smaller is a byte less per waiting call (bench/README.md,
// "Frames in 16-byte classes").
// Each class keeps at most `max_cached` free frames per thread, so a burst does not pin memory
// forever. A frame freed on another thread than the one that made it joins that other thread's
// cache: both are plain heap blocks, so that is safe.
class frame_cache {
public:
    static constexpr std::size_t granule = 16;
    static constexpr std::size_t classes = 256;
    static constexpr std::size_t max_cached = 512;

    static void* allocate(std::size_t n) {
        const std::size_t c = class_of(n);
        if (c >= classes)
            return ::operator new(n);
        if (state_ != state::gone) {
            if (node* head = lists_.free[c]) {
                lists_.free[c] = head->next;
                --lists_.count[c];
                return head;
            }
        }
        // Always the whole class, even on an exiting thread: the frame may be freed on a live thread
        // and join its cache, where it must hold any frame of its class.
        return ::operator new((c + 1) * granule);
    }

    // The common case, small enough that g++ inlines it where a frame is freed (its size a constant
    // there): the thread's cache is live and the class has room. Anything else goes out of line.
    static void deallocate(void* p, std::size_t n) noexcept {
        const std::size_t c = class_of(n);
        if (c < classes && state_ == state::live && lists_.count[c] < max_cached) [[likely]] {
            push(p, c);
            return;
        }
        deallocate_rarely(p, c);
    }

private:
    struct node {
        node* next;
    };
    struct lists {
        node* free[classes];
        std::size_t count[classes];
    };
    // fresh: nothing cached yet on this thread; live: the reaper is registered and frees the lists
    // at thread exit; gone: the thread is exiting, frames go straight back to the heap.
    enum class state : unsigned char { fresh, live, gone };
    // Frees the cached frames when the thread exits. Registered on the first frame cached, so the
    // lists themselves stay trivially constructed thread_locals that every call reaches without a
    // guard (a thread_local with a destructor is reached through an initialisation check).
    struct reaper {
        reaper() noexcept { state_ = state::live; }
        ~reaper() {
            state_ = state::gone;
            for (node*& head : lists_.free)
                while (head)
                    ::operator delete(std::exchange(head, head->next));
        }
        reaper(const reaper&) = delete;
        reaper& operator=(const reaper&) = delete;
    };
    static void push(void* p, std::size_t c) noexcept {
        auto* head = static_cast<node*>(p);
        head->next = lists_.free[c];
        lists_.free[c] = head;
        ++lists_.count[c];
    }
    // The first frame cached on a thread (which registers the reaper), a full class, an exiting
    // thread, a frame beyond the largest class.
    RESILIENCE_DETAIL_NOINLINE static void deallocate_rarely(void* p, std::size_t c) noexcept {
        if (c < classes && state_ != state::gone) {
            if (state_ == state::fresh)
                enrol();
            if (lists_.count[c] < max_cached) {
                push(p, c);
                return;
            }
        }
        ::operator delete(p);
    }
    static void enrol() noexcept {
        thread_local reaper r;
        (void)r;
    }
    static std::size_t class_of(std::size_t n) noexcept { return n == 0 ? 0 : (n - 1) / granule; }

    static constinit inline thread_local state state_ = state::fresh;
    static constinit inline thread_local lists lists_ = {};
};

/// Mixed into every promise type of the library.
struct recycled_frame {
    static void* operator new(std::size_t n) { return frame_cache::allocate(n); }
    static void operator delete(void* p, std::size_t n) noexcept { frame_cache::deallocate(p, n); }
};

} // namespace resilience::detail
