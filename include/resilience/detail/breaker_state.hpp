// SPDX-License-Identifier: MIT
/// \file detail/breaker_state.hpp
/// `breaker_core`: the state the copies of a `circuit_breaker` share, and its state machine
/// (admission in each state, half-open probes, recording results, telling of changes). One
/// algorithm, kept whole: its locking rules hold across every member.
#pragma once

#include "../circuit_breaker.hpp" // the options and the state; includes this file back at its end
#include "breaker_window.hpp"
#include "inlining.hpp"
#include "ring.hpp"
#include "shared_handle.hpp"
#include "time.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <utility>

namespace resilience::detail {

/// The shared state of one breaker. Every change is made under `mutex_`, which is held only to
/// admit a call and to record its result, never across user code: the clock, `should_handle` and
/// `on_state_change` are called with it released (`on_rejected` is the policy's, not the state's).
///
/// Each change of state bumps the generation; a call remembers the generation that admitted it,
/// and its result is dropped when the generation has moved on, so a call that started before
/// the circuit opened (or was reset) cannot change what came after.
///
/// Two fields are also read without the lock, so that a healthy breaker shared by many threads
/// costs them no lock: `word_` (the state and the generation in one atomic word) and
/// `consecutive_failures_`. Both are written only under the lock, so a locked section sees a
/// state no lock-free reader can change under it, and a lock-free read takes effect at its load:
/// a closed admission at the instant the word said closed, a skipped success at the instant the
/// run of failures was already zero (see `record`).
template <class C>
class breaker_core : public shared_state {
public:
    using time_point = typename C::time_point;
    using duration = typename C::duration;

    /// What recording a call's result needs to know of its admission.
    struct admission {
        bool admitted = false;
        bool probe = false;
        std::uint64_t generation = 0;
        time_point start{};
    };
    /// What `admit` decided.
    struct ticket : admission {
        bool isolated = false; // refused because isolated by hand: no wait helps
        std::chrono::nanoseconds retry_after{};
        std::exception_ptr cause;
    };

    breaker_core(circuit_breaker_options o, C clock) : options_(std::move(o)), clock_(std::move(clock)) {
        if (options_.sampling) {
            const breaker_sampling& w = *options_.sampling;
            if (w.calls) {
                count_window_.emplace(static_cast<std::size_t>(*w.calls));
                minimum_throughput_ = static_cast<std::uint64_t>(w.minimum_throughput.value_or(*w.calls));
            } else {
                time_window_.emplace(*w.window / static_cast<std::int64_t>(w.segments), w.segments);
                minimum_throughput_ = static_cast<std::uint64_t>(w.minimum_throughput.value_or(20));
            }
            slow_duration_ = w.slow_call_duration;
            slow_trips_ = w.slow_call_ratio.has_value();
        }
    }

    const circuit_breaker_options& options() const noexcept { return options_; }
    const C& clock() const noexcept { return clock_; }

    /// Does admitting a call need the time (to time it against a slow-call rule)?
    bool times_calls() const noexcept { return slow_duration_.has_value(); }

    /// Admits or refuses a call. A closed breaker decides with one atomic load and no lock, and
    /// reads the clock only when a slow-call rule needs the call's start. `sink` hears the state
    /// changes this call makes or sees, unless the options have a listener.
    ticket admit(const telemetry_listener* sink = nullptr) {
        if (slow_duration_)
            return admit(clock_.now(), sink);
        const std::uint64_t w = word_.load(std::memory_order_acquire);
        if (state_of(w) == circuit_state::closed)
            return closed_ticket(w, time_point{});
        return admit_locked(std::nullopt, sink);
    }

    /// The closed state's part of `admit()` with no slow-call rule (`!times_calls()`): admits the
    /// call into `a` and returns true when the breaker is closed at this one load; false changes
    /// nothing (the caller goes on to `admit()`).
    bool admit_closed(admission& a) const noexcept {
        const std::uint64_t w = word_.load(std::memory_order_acquire);
        if (state_of(w) != circuit_state::closed)
            return false;
        a.admitted = true;
        a.generation = generation_of(w);
        return true;
    }

    /// As `admit()`, with `now` a reading of `clock()` the caller has just made: it is the call's
    /// start for slow-call rules and the time the break is judged at; the clock is not read again.
    ticket admit(time_point now, const telemetry_listener* sink = nullptr) {
        const std::uint64_t w = word_.load(std::memory_order_acquire);
        if (state_of(w) == circuit_state::closed)
            return closed_ticket(w, now);
        return admit_locked(now, sink);
    }

    /// How the outcome `o` of an admitted call is recorded: a value is a success unless
    /// `should_handle` handles it (then a failure); a failure is a failure when it handles it,
    /// else ignored. Calls the user's classifier, with no lock held; what it throws propagates.
    /// Precondition: `options().should_handle.accepts<R>()`.
    template <class R>
    breaker_verdict judge(const outcome<R>& o) const {
        const bool handled =
            options_.should_handle.classify(o, [](const failure& f) noexcept { return !is_cancellation(f); })
                .handle;
        if (o.has_value())
            return handled ? breaker_verdict::failure : breaker_verdict::success;
        return handled ? breaker_verdict::failure : breaker_verdict::ignored;
    }

    /// Records the result of the call `t` admitted. A closed-state result that would change nothing
    /// returns without the lock.
    void record(const admission& t, breaker_verdict v, const std::exception_ptr& error,
                const telemetry_listener* sink = nullptr) {
        if (!t.admitted)
            return; // a refused call ran nothing: its result says nothing about the dependency
        if (!t.probe) {
            // Stale or not, an ignored closed-state result leaves everything as it was.
            if (v == breaker_verdict::ignored)
                return;
            // With no sampling, a closed-state success only ends the run of failures (or is dropped
            // as stale, which changes nothing either), so with no run there is nothing to store.
            // Skipping is recording it at the instant of this load: the run was zero then, and a
            // success on a zero run is a no-op. A failure recorded concurrently is ordered after
            // it; a failure recorded before this call (happens-before) wrote the counter before this
            // load, so coherence makes the load see a run and the success takes the lock to end it.
            // Relaxed is enough: nothing else is read on the strength of the value.
            if (v == breaker_verdict::success && !options_.sampling &&
                consecutive_failures_.load(std::memory_order_relaxed) == 0)
                return;
        }
        record_locked(t, v, error, sink);
    }

    circuit_state state() {
        const time_point read = clock_.now();
        std::lock_guard lock(mutex_);
        return visible_state(std::max(read, last_now_));
    }

    circuit_metrics metrics() {
        const time_point read = clock_.now();
        std::lock_guard lock(mutex_);
        const time_point now = std::max(read, last_now_);
        circuit_metrics m;
        m.name = options_.name;
        m.state = visible_state(now);
        detail::window_counts c;
        if (count_window_)
            c = count_window_->counts();
        if (time_window_)
            c = time_window_->counts(since_epoch(now));
        m.calls = c.calls;
        m.failures = c.failures;
        m.slow_calls = c.slow;
        m.consecutive_failures = consecutive_failures_.load(std::memory_order_relaxed);
        m.consecutive_opens = consecutive_opens_;
        return m;
    }

    void isolate() {
        {
            std::lock_guard lock(mutex_);
            if (current_state() == circuit_state::isolated)
                return;
            cause_ = nullptr;
            transition(circuit_state::isolated);
        }
        notify();
    }

    void reset() {
        bool changed = false;
        {
            std::lock_guard lock(mutex_);
            changed = current_state() != circuit_state::closed;
            clear();
            if (changed)
                transition(circuit_state::closed);
            else // calls in flight belong to the sample just cleared
                publish(circuit_state::closed, current_generation() + 1);
        }
        if (changed)
            notify();
    }

private:
    struct change {
        circuit_state from{}, to{};
    };

    // The word holds the state in its low bits and the generation above them. The generation
    // wraps after 2^62 changes, and tickets compare it as stored, wrapped too.
    static constexpr unsigned state_bits = 2;
    static_assert(static_cast<unsigned>(circuit_state::isolated) < (1u << state_bits));
    static constexpr std::uint64_t pack(circuit_state s, std::uint64_t generation) noexcept {
        return generation << state_bits | static_cast<std::uint64_t>(s);
    }
    static constexpr circuit_state state_of(std::uint64_t w) noexcept {
        return static_cast<circuit_state>(w & ((std::uint64_t{1} << state_bits) - 1));
    }
    static constexpr std::uint64_t generation_of(std::uint64_t w) noexcept { return w >> state_bits; }

    // Under the lock only. Only the lock holder writes the word, so relaxed loads see its latest value.
    circuit_state current_state() const noexcept { return state_of(word_.load(std::memory_order_relaxed)); }
    std::uint64_t current_generation() const noexcept {
        return generation_of(word_.load(std::memory_order_relaxed));
    }
    // Under the lock only. The lock-free paths read nothing but the word, so they need no more than
    // its atomicity; release (free on x86, paired with the admission's acquire) keeps the word a
    // publication point, so a lock-free path that one day reads more sees what came before it.
    void publish(circuit_state s, std::uint64_t generation) noexcept {
        word_.store(pack(s, generation), std::memory_order_release);
    }

    static ticket closed_ticket(std::uint64_t w, time_point start) noexcept {
        ticket t;
        t.admitted = true;
        t.generation = generation_of(w);
        t.start = start;
        return t;
    }

    // Any state but a closed one seen by the lock-free load. `read` is the caller's clock reading,
    // if it made one.
    ticket admit_locked(std::optional<time_point> read, const telemetry_listener* sink) {
        ticket t;
        bool changed = false;
        for (;;) {
            std::unique_lock lock(mutex_);
            const circuit_state s = current_state();
            // Only open needs the time; the clock is read with the lock dropped.
            if (s != circuit_state::closed && s != circuit_state::isolated && !read) {
                lock.unlock();
                read = clock_.now();
                continue;
            }
            const time_point now = read ? monotonic(*read) : time_point{};
            switch (s) {
            case circuit_state::closed: // closed since the lock-free load
                t.admitted = true;
                break;
            case circuit_state::open:
                if (now < open_until_) {
                    t.retry_after = to_nanoseconds(open_until_ - now);
                    t.cause = cause_;
                    return t;
                }
                transition(circuit_state::half_open);
                probes_taken_ = 0;
                probes_passed_ = 0;
                changed = true;
                [[fallthrough]];
            case circuit_state::half_open:
                if (probes_taken_ < options_.probes) {
                    ++probes_taken_;
                    t.admitted = true;
                    t.probe = true;
                } else {
                    // A slot frees when a probe ends, which nobody can foresee; a zero wait would
                    // make callers that honour it spin. A failed probe keeps the circuit shut for
                    // at least the break just served, so that is the wait worth suggesting.
                    t.retry_after = break_for(consecutive_opens_);
                    t.cause = cause_;
                }
                break;
            case circuit_state::isolated:
                t.isolated = true;
                t.retry_after = std::chrono::nanoseconds::max();
                break;
            }
            t.generation = current_generation();
            t.start = now;
            break;
        }
        if (changed) {
            try {
                notify(sink);
            } catch (...) {
                // The call fails with the observer's exception and never runs: its slot goes back.
                record(t, breaker_verdict::ignored, nullptr);
                throw;
            }
        }
        return t;
    }

    // Out of line: `record`'s lock-free checks stay small enough to be inlined into a call's frame.
    RESILIENCE_DETAIL_NOINLINE void record_locked(const admission& t, breaker_verdict v,
                                                  const std::exception_ptr& error,
                                                  const telemetry_listener* sink) {
        // The clock is read only when the result may need it: a success of a breaker with no
        // sampling and no slow-call rule needs no time at all.
        const bool needs_time =
            v == breaker_verdict::failure || (v == breaker_verdict::success && options_.sampling.has_value());
        const time_point read = needs_time ? clock_.now() : time_point{};
        bool changed = false;
        {
            std::lock_guard lock(mutex_);
            if (t.generation != current_generation())
                return;
            const time_point now = needs_time ? monotonic(read) : time_point{};
            const bool slow =
                needs_time && slow_duration_ && to_nanoseconds(now - t.start) >= *slow_duration_;
            if (t.probe)
                changed = record_probe(v, slow, error, now);
            else
                changed = record_closed(v, slow, error, now);
        }
        if (changed)
            notify(sink);
    }

    static std::chrono::nanoseconds since_epoch(time_point t) noexcept {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch());
    }
    // Saturates instead of overflowing, for the breaks that grew past what nanoseconds hold.
    static std::chrono::nanoseconds to_nanoseconds(duration d) noexcept {
        return detail::saturating_nanoseconds(d);
    }
    static time_point add_saturating(time_point now, std::chrono::nanoseconds d) noexcept {
        return detail::add_saturating(now, d);
    }
    // Threads read the clock before taking the lock, so a late reader may bring an earlier time:
    // time inside the breaker never goes back.
    time_point monotonic(time_point read) noexcept {
        if (read > last_now_)
            last_now_ = read;
        return last_now_;
    }

    circuit_state visible_state(time_point now) const noexcept {
        const circuit_state s = current_state();
        if (s == circuit_state::open && now >= open_until_)
            return circuit_state::half_open;
        return s;
    }

    std::chrono::nanoseconds break_for(std::uint64_t opens) const noexcept {
        const std::chrono::nanoseconds cap =
            options_.max_break_duration.value_or(std::chrono::nanoseconds::max());
        const double growth = options_.break_duration_growth;
        if (opens <= 1 || growth == 1.0)
            return std::min(options_.break_duration, cap);
        const long double d = static_cast<long double>(options_.break_duration.count()) *
                              std::pow(static_cast<long double>(growth), static_cast<long double>(opens - 1));
        if (!(d < static_cast<long double>(cap.count())))
            return cap; // also catches infinity
        return std::chrono::nanoseconds{static_cast<std::chrono::nanoseconds::rep>(d)};
    }

    bool record_closed(breaker_verdict v, bool slow, const std::exception_ptr& error, time_point now) {
        if (v == breaker_verdict::ignored)
            return false;
        const bool failed = v == breaker_verdict::failure;
        // Plain load and store rather than a read-modify-write: only the lock holder writes the run.
        const std::uint64_t run = consecutive_failures_.load(std::memory_order_relaxed);
        if (failed) {
            consecutive_failures_.store(run + 1, std::memory_order_relaxed);
            last_failure_ = error;
        } else if (run != 0) {
            // A success that finds no run stores nothing, so a sampling breaker's successes leave
            // the line other threads read on their lock-free paths untouched.
            consecutive_failures_.store(0, std::memory_order_relaxed);
        }
        if (options_.failure_threshold && failed &&
            run + 1 >= static_cast<std::uint64_t>(*options_.failure_threshold)) {
            open(now, error);
            return true;
        }
        if (!options_.sampling)
            return false;
        detail::window_counts c;
        if (count_window_) {
            count_window_->add(failed, slow);
            c = count_window_->counts();
        } else {
            time_window_->add(since_epoch(now), failed, slow);
            c = time_window_->counts(since_epoch(now));
        }
        if (c.calls < minimum_throughput_)
            return false;
        const breaker_sampling& w = *options_.sampling;
        const auto calls = static_cast<double>(c.calls);
        // A share computed by one division compares exactly with the decimal the user wrote
        // (3/10 rounds to the same double as 0.3), where `failures >= rate * calls` would not.
        if (w.failure_ratio && c.failures > 0 &&
            static_cast<double>(c.failures) / calls >= *w.failure_ratio) {
            open(now, last_failure_);
            return true;
        }
        if (w.slow_call_ratio && c.slow > 0 && static_cast<double>(c.slow) / calls >= *w.slow_call_ratio) {
            open(now, nullptr); // slowness alone: no failure to report
            return true;
        }
        return false;
    }

    bool record_probe(breaker_verdict v, bool slow, const std::exception_ptr& error, time_point now) {
        switch (v) {
        case breaker_verdict::ignored:
            --probes_taken_; // the slot goes to the next caller
            return false;
        case breaker_verdict::failure:
            open(now, error);
            return true;
        case breaker_verdict::success:
            if (slow && slow_trips_) {
                open(now, nullptr);
                return true;
            }
            if (++probes_passed_ < options_.probes)
                return false;
            clear();
            transition(circuit_state::closed);
            return true;
        }
        return false;
    }

    void open(time_point now, std::exception_ptr cause) {
        if (consecutive_opens_ != std::numeric_limits<std::uint64_t>::max())
            ++consecutive_opens_;
        open_until_ = add_saturating(now, break_for(consecutive_opens_));
        cause_ = std::move(cause);
        transition(circuit_state::open);
    }

    void clear() noexcept {
        if (count_window_)
            count_window_->clear();
        if (time_window_)
            time_window_->clear();
        consecutive_failures_.store(0, std::memory_order_relaxed);
        consecutive_opens_ = 0;
        cause_ = nullptr;
        last_failure_ = nullptr;
    }

    // Every change is queued: a listener may be in the context of whichever call drains it.
    void transition(circuit_state to) {
        changes_.push(change{current_state(), to});
        publish(to, current_generation() + 1);
    }

    // Runs the callback for queued changes, outside the lock. One thread drains at a time, so the
    // callback sees changes one by one in the order they were made; a change queued while another
    // thread drains is left to that thread, which looks at the queue again before it stops.
    // An exception from the callback does not stop the draining (every change is still told); the
    // first one is rethrown once the queue is empty, to the call or the caller that drained it.
    // The telemetry listener hears each change after the callback: the options' own, else `sink`.
    void notify(const telemetry_listener* sink = nullptr) {
        const telemetry_listener* const listener = options_.telemetry ? &options_.telemetry : sink;
        std::exception_ptr thrown;
        {
            std::unique_lock lock(mutex_);
            if (draining_)
                return;
            draining_ = true;
            while (!changes_.empty()) {
                const change c = changes_.pop();
                lock.unlock();
                try {
                    if (options_.on_state_change)
                        options_.on_state_change(state_change_event{options_.name, c.from, c.to});
                } catch (...) {
                    if (!thrown)
                        thrown = std::current_exception();
                }
                auto f =
                    detail::emit_caught(listener, clock_, detail::state_change(options_.name, c.from, c.to));
                if (f && !thrown)
                    thrown = f->exception();
                lock.lock();
            }
            draining_ = false;
        }
        if (thrown)
            std::rethrow_exception(thrown);
    }

    // Off the cache line of the count of holds (see `shared_state`): calls only read what follows.
    alignas(64) const circuit_breaker_options options_;
    C clock_;
    std::uint64_t minimum_throughput_ = 0;
    std::optional<std::chrono::nanoseconds> slow_duration_;
    bool slow_trips_ = false;

    // Read without the lock, written under it.
    std::atomic<std::uint64_t> word_{pack(circuit_state::closed, 0)};
    std::atomic<std::uint64_t> consecutive_failures_{0}; // the current run of recorded failures

    std::mutex mutex_;
    std::optional<detail::count_window> count_window_;
    std::optional<detail::time_window> time_window_;
    time_point last_now_ = time_point::min();
    time_point open_until_{};
    std::exception_ptr cause_;        // what opened the circuit
    std::exception_ptr last_failure_; // the latest failure recorded while closed
    std::uint64_t consecutive_opens_ = 0;
    int probes_taken_ = 0;
    int probes_passed_ = 0;
    detail::ring<change> changes_;
    bool draining_ = false;
};

} // namespace resilience::detail
