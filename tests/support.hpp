// SPDX-License-Identifier: MIT
// Helpers several test files share: invalid-argument messages, stops at virtual instants, (id, instant)
// logs, and running event loops on threads of their own while counting how the calls ended.
#pragma once

#include "alloc_counter.hpp" // RESILIENCE_TESTS_SANITIZED
#include "catch.hpp"

#include <resilience/bulkhead/errors.hpp>
#include <resilience/error.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/outcome.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/task.hpp>
#include <resilience/telemetry.hpp>
#include <resilience/testing/simulation.hpp>

#include <atomic>
#include <chrono>
#include <concepts>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <latch>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace resilience_tests {

// ---------------------------------------------------------------------------------------------------------
// Invalid arguments

/// Runs `f` and returns the message of the std::invalid_argument it throws (fails the test otherwise).
template <class F>
std::string invalid_argument_message(F&& f) {
    try {
        f();
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    FAIL("expected std::invalid_argument");
    return {};
}

// ---------------------------------------------------------------------------------------------------------
// Threads

/// A thread that resumes one coroutine, for tests of code whose call finishes off its loop's thread.
/// The thread waits until `await_suspend` is done with the awaiting frame (a coroutine resumed
/// elsewhere may finish and free its frame at once), pauses for `pause`, then resumes it. Joined on
/// destruction; the object must outlive the awaiting coroutine.
class foreign_thread {
public:
    explicit foreign_thread(std::chrono::milliseconds pause = {}) : pause_(pause) {}
    foreign_thread(const foreign_thread&) = delete;
    foreign_thread& operator=(const foreign_thread&) = delete;
    ~foreign_thread() {
        if (thread_.joinable())
            thread_.join();
    }

    /// Awaitable: suspends the caller and resumes it on this thread.
    auto resume_here() {
        struct awaiter {
            foreign_thread* self;
            bool await_ready() const noexcept { return false; }
            void await_suspend(std::coroutine_handle<> h) {
                foreign_thread* t = self;
                t->thread_ = std::thread([t, h] {
                    t->handed_over_.wait();
                    if (t->pause_.count() > 0)
                        std::this_thread::sleep_for(t->pause_);
                    h.resume();
                });
                t->handed_over_.count_down();
            }
            void await_resume() const noexcept {}
        };
        return awaiter{this};
    }

private:
    std::thread thread_;
    std::latch handed_over_{1};
    std::chrono::milliseconds pause_;
};

// ---------------------------------------------------------------------------------------------------------
// Stops

/// An awaiter that resumes its coroutine from inside the stop callback, as some I/O wrappers do: the
/// stop request then finishes the whole call, timeout included, before request_stop() returns.
class resumed_by_stop {
public:
    explicit resumed_by_stop(resilience::stop_token token) : token_(std::move(token)) {}
    bool await_ready() const noexcept { return token_.stop_requested(); }
    void await_suspend(std::coroutine_handle<> h) { callback_.emplace(token_, resume{h}); }
    void await_resume() const { throw resilience::cancelled_error{}; }

private:
    struct resume {
        std::coroutine_handle<> h;
        void operator()() const noexcept { h.resume(); }
    };
    resilience::stop_token token_;
    std::optional<resilience::stop_callback<resume>> callback_;
};

/// An action that ends inside the stop request of its token: it waits with `resumed_by_stop`, having
/// registered another callback on the token first. The state's callbacks run newest first, so the
/// call ends, frames and all, while the stop state still has that callback to go through.
inline resilience::task<int> ends_inside_its_stop(resilience::stop_token token) {
    resilience::stop_callback beside{token, [] {}};
    co_await resumed_by_stop{token};
    co_return 1;
}

// ---------------------------------------------------------------------------------------------------------
// Simulations

/// Requests a stop on `src` at the virtual instant `at`.
inline resilience::task<void> stop_at(resilience::testing::simulation& sim, resilience::stop_source& src,
                                      std::chrono::nanoseconds at) {
    co_await sim.sleep_for(at - sim.now());
    src.request_stop();
}

/// Requests a stop on `src` at the virtual instant `at`, and writes down `policy.queued()` right after.
template <class Policy>
resilience::task<void> stop_at(resilience::testing::simulation& sim, resilience::stop_source& src,
                               std::chrono::nanoseconds at, const Policy& policy, std::size_t& queued_after) {
    co_await sim.sleep_for(at - sim.now());
    src.request_stop();
    queued_after = policy.queued();
}

/// The simulation's time shifted by an hour: another epoch, so its readings are an hour behind the
/// simulation's. A valid clock without loop timers, so a timeout on it watches beside the call.
struct shifted_clock {
    using duration = std::chrono::nanoseconds;
    using time_point = std::chrono::time_point<shifted_clock, duration>;
    static constexpr duration shift = std::chrono::hours{1};
    resilience::testing::virtual_clock inner;
    time_point now() const { return time_point{inner.now().time_since_epoch() - shift}; }
    auto sleep_until(time_point tp, resilience::stop_token st) const {
        // A sleep "forever" (the latest time point) stays the latest one instead of overflowing.
        const duration at =
            tp.time_since_epoch() > duration::max() - shift ? duration::max() : tp.time_since_epoch() + shift;
        return inner.sleep_until(resilience::testing::virtual_clock::time_point{at}, std::move(st));
    }
};

/// Which call did something and at what instant, in the order it happened.
using instant_log = std::vector<std::pair<int, std::chrono::nanoseconds>>;

/// The call ids of `log`, in its order.
inline std::vector<int> ids_of(const instant_log& log) {
    std::vector<int> ids;
    for (auto& [id, at] : log)
        ids.push_back(id);
    return ids;
}

/// The first instant call `id` has in `log`, or -1 ns if it has none.
inline std::chrono::nanoseconds instant_of(const instant_log& log, int id) {
    for (auto& [i, at] : log)
        if (i == id)
            return at;
    return std::chrono::nanoseconds{-1};
}

// ---------------------------------------------------------------------------------------------------------
// Real event loops on threads

/// Whether `e` holds an exception of type `E` (or derived from it); false for a null `e`.
template <class E>
bool holds(const std::exception_ptr& e) {
    if (!e)
        return false;
    try {
        std::rethrow_exception(e);
    } catch (const E&) {
        return true;
    } catch (...) {
        return false;
    }
}

/// The type of a coroutine that starts at once and is never awaited: it drives a call by hand on the
/// thread that starts it, with no event loop or other home there, as a call resumed on a thread the
/// library does not know would be. It ends itself (final_suspend does not suspend).
struct started_here {
    struct promise_type {
        started_here get_return_object() noexcept { return {}; }
        std::suspend_never initial_suspend() noexcept { return {}; }
        std::suspend_never final_suspend() noexcept { return {}; }
        void return_void() noexcept {}
        void unhandled_exception() noexcept { std::terminate(); }
    };
};

/// Suspends and resumes later on the same event loop: lets everything else queued there run first.
struct yield_now {
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) const { resilience::event_loop::current()->post(h); }
    void await_resume() const noexcept {}
};

/// Requests a stop on `src` after letting the current loop run `yields` rounds.
inline resilience::task<void> stop_after_yields(resilience::stop_source& src, int yields) {
    for (int i = 0; i < yields; ++i)
        co_await yield_now{};
    src.request_stop();
}

/// Runs each loop on its own thread, all starting together; once all end, rethrows what a run() threw.
template <std::same_as<resilience::event_loop>... Loops>
void run_on_threads(Loops&... loops) {
    constexpr std::size_t n = sizeof...(Loops);
    resilience::event_loop* const all[] = {&loops...};
    std::exception_ptr errors[n];
    std::latch go{static_cast<std::ptrdiff_t>(n)};
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < n; ++i)
        threads.emplace_back([&, i] {
            go.arrive_and_wait();
            try {
                all[i]->run();
            } catch (...) {
                errors[i] = std::current_exception();
            }
        });
    for (auto& t : threads)
        t.join();
    for (auto& e : errors)
        if (e)
            std::rethrow_exception(e);
}

/// The rounds a stress test runs: `rounds` in a plain build, a tenth under a sanitizer. There each
/// round (a lockstep's spinning, a reconfiguration's allocations) costs 10 to 50 times as much, on a
/// machine that the other tests share, and what the sanitizer looks for is found otherwise:
/// ThreadSanitizer reports accesses that nothing orders, whether or not they happened to overlap,
/// AddressSanitizer a use after free on the round that makes it, and a leak of 10 bytes a round still
/// adds up past a bound of 10 bytes a round.
constexpr std::size_t stress_rounds(std::size_t rounds) noexcept {
#if defined(RESILIENCE_TESTS_SANITIZED)
    return rounds / 10;
#else
    return rounds;
#endif
}

/// Runs `step(thread, round)` on `threads` threads for `rounds` rounds, all threads starting each
/// round together: they spin a little before yielding rather than block until the last one
/// arrives, so threads that have a core start within nanoseconds of each other, as needed to
/// meet races that narrow (how often they meet depends on how many cores are idle).
template <class Step>
void in_lockstep(std::size_t threads, std::size_t rounds, Step step) {
    std::atomic<std::size_t> arrived{0};
    std::vector<std::thread> workers;
    for (std::size_t t = 0; t < threads; ++t)
        workers.emplace_back([&, t] {
            for (std::size_t r = 0; r < rounds; ++r) {
                arrived.fetch_add(1);
                for (int spins = 0; arrived.load() < threads * (r + 1); ++spins)
                    if (spins >= 64)
                        std::this_thread::yield();
                step(t, r);
            }
        });
    for (auto& w : workers)
        w.join();
}

/// Counts, per call id, how many times each call completed; any thread may record.
class completion_counts {
public:
    explicit completion_counts(std::size_t calls) : counts_(calls) {}

    /// Notes one completion of call `id`.
    void record(std::size_t id) { counts_[id].fetch_add(1); }

    /// How many calls completed exactly once: all of them when none was lost or completed twice.
    std::size_t exactly_once() const {
        std::size_t once = 0;
        for (auto& n : counts_)
            once += n.load() == 1 ? 1 : 0;
        return once;
    }

private:
    std::vector<std::atomic<int>> counts_;
};

/// How calls from several threads ended (`Refusal`: the policy's refusal error), and who completed.
template <class Refusal>
struct call_tally {
    std::atomic<int> values{0}, refused{0}, cancelled{0}, failed{0};
    completion_counts completions;

    explicit call_tally(std::size_t calls) : completions(calls) {}

    /// Counts how call `id` ended.
    template <class T>
    void record(std::size_t id, const resilience::outcome<T>& r) {
        if (r.has_value())
            ++values;
        else if (r.error().template is<Refusal>())
            ++refused;
        else if (resilience::is_cancellation(r.error()))
            ++cancelled;
        else
            ++failed;
        completions.record(id);
    }
};

/// Counts the queue waits and the rejections a policy's listener hears, from any thread.
struct heard_counts {
    std::atomic<int> waits{0}, rejections{0};

    /// A listener for the policy's `telemetry` option; `*this` must outlive the policy.
    auto listener() {
        return [this](const resilience::telemetry_event& e) {
            if (e.kind == resilience::telemetry_kind::queue_wait)
                ++waits;
            else if (e.kind == resilience::telemetry_kind::rejection)
                ++rejections;
        };
    }
};

/// Lives in a waiting coroutine's frame and counts the live ones; its payload, longer than any
/// small-string buffer, is a heap block, so a leaked frame is a leak LeakSanitizer sees. One count for
/// the test program: a test that uses it starts and ends with `tracked::live == 0`.
struct tracked {
    static inline std::atomic<int> live{0};
    std::string payload = std::string(64, 'x');
    tracked() { live.fetch_add(1); }
    tracked(const tracked&) = delete;
    tracked& operator=(const tracked&) = delete;
    ~tracked() { live.fetch_sub(1); }
};

// ---------------------------------------------------------------------------------------------------------
// How a call through a bulkhead ended

/// "value", "rejected" (a `bulkhead_rejected_error`), "cancelled" or "failure": one word per way a
/// call through a bulkhead can end, for the journals of the bulkhead tests.
template <class T>
std::string describe(const resilience::outcome<T>& r) {
    if (r.has_value())
        return "value";
    if (r.error().template is<resilience::bulkhead_rejected_error>())
        return "rejected";
    if (resilience::is_cancellation(r.error()))
        return "cancelled";
    return "failure";
}

} // namespace resilience_tests
