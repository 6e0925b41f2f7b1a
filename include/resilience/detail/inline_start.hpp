// SPDX-License-Identifier: MIT
/// \file detail/inline_start.hpp
/// Starting a coroutine from its awaiter and resuming the awaiter when it is done, without growing the
/// stack when the coroutine finishes during its start, whatever the compiler does with symmetric
/// transfer.
///
/// Symmetric transfer (an `await_suspend` that returns the handle to run next) only keeps the stack
/// flat when the compiler makes the transfer a tail call. Clang always does. g++ does it only with
/// sibling-call optimisation (on at `-O2`, off at `-O0`, `-Og` and `-O1`, and defeated by
/// AddressSanitizer), and no macro tells the two apart. A loop that awaits a million tasks that each
/// finish at once then nests a million resumes, and overflows the stack of a Debug build.
///
/// So where the transfer is not known to be a tail call, an awaiter starts its coroutine with a plain
/// `resume()` from inside `await_suspend`, after marking, in a per-thread slot, which coroutine it is
/// starting. If that coroutine reaches the point where it would resume its awaiter while still being
/// started (it finished, or yielded, at once), it sees the mark, records that it is done and hands
/// control back instead of resuming the awaiter; `await_suspend` then returns false and the awaiter
/// goes on in its own frame. A coroutine that suspends first is resumed later from elsewhere, where
/// the mark is not its own, and resumes its awaiter by symmetric transfer as usual (one nested resume
/// that unwinds at the awaiter's next real suspension). Only the thread that started a coroutine can
/// see its own mark, so a coroutine finished on another thread never mistakes itself for one finished
/// during its start; and nothing is read from the awaiter after `resume()` returns, since by then it
/// may be running, or gone, on that other thread.
///
/// `RESILIENCE_TAIL_CALL_TRANSFER` is 1 where symmetric transfer is always a tail call (clang), and
/// the start is then a plain transfer at no cost; 0 elsewhere. It changes the return type and body of
/// inline functions whose symbols do not name it, so it must have one value in every translation unit
/// of a program (define it for both compilers where g++ and clang objects are linked together).
/// Defining it to 1 on g++ is correct only if every translation unit is built with
/// `-foptimize-sibling-calls` (on at `-O2`) and without a sanitizer.
#pragma once

#include <coroutine>
#include <type_traits>

#if !defined(RESILIENCE_TAIL_CALL_TRANSFER)
#if defined(__clang__)
#define RESILIENCE_TAIL_CALL_TRANSFER 1
#else
#define RESILIENCE_TAIL_CALL_TRANSFER 0
#endif
#endif

namespace resilience::inline v0_2::detail {

/// What an `await_suspend` that starts a coroutine returns: the handle to transfer to where transfers
/// are tail calls, else whether the awaiter stays suspended.
using start_result = std::conditional_t<RESILIENCE_TAIL_CALL_TRANSFER != 0, std::coroutine_handle<>, bool>;

#if RESILIENCE_TAIL_CALL_TRANSFER

/// Starts `started`, the coroutine `await_suspend` hands control to.
inline std::coroutine_handle<> start_inline(std::coroutine_handle<> started) noexcept {
    return started;
}

/// From the `await_suspend` of a coroutine `self` at the point where it hands control back to the
/// coroutine that awaits it: what to resume.
inline std::coroutine_handle<> resume_awaiter(std::coroutine_handle<> /*self*/,
                                              std::coroutine_handle<> awaiter) noexcept {
    return awaiter;
}

#else

/// The coroutine this thread is starting from an awaiter's `await_suspend`, and whether it has
/// already reached the point where it resumes that awaiter.
struct inline_start_mark {
    void* starting = nullptr;
    bool done = false;
};
inline constinit thread_local inline_start_mark inline_start_now{};

inline std::coroutine_handle<> resume_awaiter(std::coroutine_handle<> self,
                                              std::coroutine_handle<> awaiter) noexcept {
    inline_start_mark& mark = inline_start_now;
    if (mark.starting == self.address()) {
        mark.done = true; // the starting awaiter goes on, in its own frame
        return std::noop_coroutine();
    }
    return awaiter;
}

/// Runs `started` until it first suspends or hands control back; true if it has not handed control
/// back (the awaiter stays suspended), false if it has (the awaiter goes on at once).
inline bool start_inline(std::coroutine_handle<> started) noexcept {
    inline_start_mark& mark = inline_start_now;
    const inline_start_mark outer = mark; // the coroutine this thread was starting, if any
    mark = {started.address(), false};
    started.resume();
    // `mark` is this thread's slot, whatever `started` did; nothing of the awaiter is read.
    const bool done = mark.done;
    mark = outer;
    return !done;
}

#endif

/// From an `await_suspend`: go on at once (`suspended` false) or stay suspended, in the return type
/// of one that may also start a coroutine (`start_result`). A returned handle to the awaiting
/// coroutine itself would be a nested resume where transfers are not tail calls.
inline start_result suspend_unless_done(bool suspended, [[maybe_unused]] std::coroutine_handle<> h) noexcept {
#if RESILIENCE_TAIL_CALL_TRANSFER
    return suspended ? std::coroutine_handle<>(std::noop_coroutine()) : h;
#else
    return suspended;
#endif
}

/// From an `await_suspend` that forwards to another awaiter's handle-returning `await_suspend`: hand
/// control to `next`. Where transfers are not tail calls, `next` being the awaiting coroutine itself
/// means going on at once, and any other coroutine is resumed from here (it may in turn resume the
/// awaiting one before this returns, after which nothing here touches it).
inline start_result transfer_to(std::coroutine_handle<> next,
                                [[maybe_unused]] std::coroutine_handle<> h) noexcept {
#if RESILIENCE_TAIL_CALL_TRANSFER
    return next;
#else
    if (next == h)
        return false;
    next.resume(); // a no-op for std::noop_coroutine()
    return true;
#endif
}

} // namespace resilience::detail
