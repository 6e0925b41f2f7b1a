// SPDX-License-Identifier: MIT
/// \file circuit_breaker.hpp
/// `circuit_breaker`: stops calling a dependency that keeps failing or dragging, then probes it back.
#pragma once

#include "classifier.hpp"
#include "clock.hpp"
#include "concepts.hpp"
#include "context.hpp"
#include "detail/breaker_window.hpp"
#include "detail/ring.hpp"
#include "detail/shared_handle.hpp"
#include "detail/time.hpp"
#include "error.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "task.hpp"
#include "telemetry.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace resilience {

/// Where a breaker stands. `closed`: calls run and are recorded. `open`: calls are refused until the
/// break is over. `half_open`: the break is over and up to `probes` calls test the dependency.
/// `isolated`: held open by hand (`isolate()`) until `reset()`.
enum class circuit_state { closed, open, half_open, isolated };

/// "closed", "open", "half_open" or "isolated": a static string, for logs.
constexpr const char* to_string(circuit_state s) noexcept {
    switch (s) {
    case circuit_state::closed:
        return "closed";
    case circuit_state::open:
        return "open";
    case circuit_state::half_open:
        return "half_open";
    case circuit_state::isolated:
        return "isolated";
    }
    return "unknown";
}

/// The recent calls over which a breaker judges ratios. Set exactly one of `size` (the last N
/// calls, however long ago) and `sampling_duration` (the calls of the last D of time, however
/// many), and at least one of `failure_ratio` and `slow_call_ratio`.
struct breaker_window {
    /// Count-based: the last `size` calls. Positive and at most `max_size`.
    std::optional<int> size{};
    /// The largest `size` accepted: one byte is kept per call, so the bound caps the memory (10 MB).
    static constexpr int max_size = 10'000'000;
    /// The most `segments` accepted: a few counters are kept per segment (about 24 MB at most).
    static constexpr int max_segments = 1'000'000;
    /// Time-based: the calls of the last `sampling_duration`. Positive.
    std::optional<std::chrono::nanoseconds> sampling_duration{};
    /// Time-based only: `sampling_duration` is kept in this many segments of
    /// `sampling_duration / segments` (rounded down) each, so memory is fixed; a call stops
    /// counting at most `sampling_duration` after it was made, and not before
    /// `sampling_duration - sampling_duration / segments`. Positive, at most `max_segments`, and
    /// at most `sampling_duration` in nanoseconds.
    int segments = 10;
    /// Calls the window must hold before a ratio can open the circuit, so two failures in a quiet
    /// hour do not read as 100%. Default: `size` for a count window (it must be full), 20 for a
    /// time window. Positive, and at most `size`.
    std::optional<int> minimum_throughput{};
    /// Opens when at least this share of the window failed; in (0, 1].
    std::optional<double> failure_ratio{};
    /// A call taking at least this long is slow, whether it succeeded or failed; positive.
    std::optional<std::chrono::nanoseconds> slow_call_duration{};
    /// Opens when at least this share of the window was slow; in (0, 1]; needs `slow_call_duration`.
    std::optional<double> slow_call_ratio{};
};

/// How a `circuit_breaker` decides. `circuit_breaker_options{}` is valid: with no trip condition
/// set (neither `failure_threshold` nor `window`), the breaker uses Polly's defaults, a time
/// window of `sampling_duration` 30s, `failure_ratio` 0.1 and `minimum_throughput` 100, and
/// `options()` shows that window. Checked by the constructor (`std::invalid_argument` naming
/// field and value).
///
/// A user callback (`should_handle`, `on_state_change`) that throws while a call runs makes its
/// exception that call's failure, after the breaker's own bookkeeping (the result recorded, a
/// probe slot freed); `execute_outcome` returns it, `execute` throws it. One thrown from
/// `isolate()` or `reset()` reaches their caller, after the change was made.
struct circuit_breaker_options {
    /// Names this breaker in the errors it makes (`error::policy_name()`), in `circuit_metrics`
    /// and in its messages. Empty: unnamed.
    std::string name{};
    /// Opens after this many consecutive recorded failures (a recorded success resets the run).
    /// Unset: no consecutive rule. Positive.
    std::optional<int> failure_threshold{};
    /// Opens on a failure or slow-call ratio over recent calls. Unset: no window, unless
    /// `failure_threshold` is unset too (then Polly's default window, above).
    std::optional<breaker_window> window{};
    /// How long the circuit stays open after its first opening. Default 5s (Polly's). Positive.
    std::chrono::nanoseconds break_duration = std::chrono::seconds{5};
    /// Each re-opening without a close in between multiplies the break by this factor: the n-th
    /// consecutive opening breaks for `break_duration * growth^(n-1)`, capped at
    /// `max_break_duration`. 1 (the default) keeps it constant. Finite and at least 1.
    double break_duration_growth = 1.0;
    /// The longest break. Unset: no cap, but the break saturates at the longest time the clock can
    /// represent instead of overflowing. At least `break_duration`.
    std::optional<std::chrono::nanoseconds> max_break_duration{};
    /// How many calls half-open admits, all of which must succeed to close it. At least 1.
    int probes = 1;
    /// Which outcomes count against the dependency (see `classifier`). A failure it declines is
    /// not recorded at all (neither opens nor closes the circuit, frees a probe slot) and is
    /// passed on unchanged. A returned value it handles is recorded as a failure with a null
    /// cause, and still returned to the caller. Empty: every failure but cancellation; values
    /// are successes, except an `expected_like` value holding an error. Called without any lock
    /// held.
    classifier should_handle{};
    /// Told of every change of state, one at a time and in the order they happened, without any
    /// lock held (so it may call back into the breaker), on the thread of a call that made or saw
    /// a change. Empty: nothing is told.
    std::function<void(circuit_state from, circuit_state to)> on_state_change{};
    /// Hears this breaker's `state_change` events (after `on_state_change`, in the same order) and its
    /// `rejection`s. Empty: the listener of a `telemetry` stage around the call that made or saw the
    /// change, if any (see telemetry.hpp).
    telemetry_listener telemetry{};
};

/// A consistent snapshot of a breaker, taken under its lock at one instant.
struct circuit_metrics {
    std::string name{};                          ///< the breaker's `name` option
    circuit_state state = circuit_state::closed; ///< as `state()` reports it
    std::uint64_t calls = 0;                     ///< calls in the window now (0 without a window)
    std::uint64_t failures = 0;                  ///< recorded failures in the window now
    std::uint64_t slow_calls = 0;                ///< slow calls in the window now
    std::uint64_t consecutive_failures = 0;      ///< the current run of recorded failures
    std::uint64_t consecutive_opens = 0;         ///< openings since the circuit last closed
};

namespace detail {

/// Throws `std::invalid_argument` for the first thing wrong with `o`.
inline void validate_breaker_options(const circuit_breaker_options& o) {
    const auto bad = [&o](const std::string& what) {
        throw std::invalid_argument(policy_label("circuit_breaker", o.name) + ": " + what);
    };
    const auto check_ratio = [&bad](const std::optional<double>& ratio, const char* name) {
        if (ratio && !(*ratio > 0.0 && *ratio <= 1.0))
            bad(std::string(name) + " must be in (0, 1], got " + format_number(*ratio));
    };
    const auto check_duration = [&bad](const std::optional<std::chrono::nanoseconds>& d, const char* name) {
        if (d && *d <= std::chrono::nanoseconds::zero())
            bad(std::string(name) + " must be positive, got " + std::to_string(d->count()) + "ns");
    };
    if (o.failure_threshold && *o.failure_threshold < 1)
        bad("failure_threshold must be positive, got " + std::to_string(*o.failure_threshold));
    check_duration(o.break_duration, "break_duration");
    if (!(o.break_duration_growth >= 1.0 && std::isfinite(o.break_duration_growth)))
        bad("break_duration_growth must be finite and at least 1, got " +
            format_number(o.break_duration_growth));
    check_duration(o.max_break_duration, "max_break_duration");
    if (o.max_break_duration && *o.max_break_duration < o.break_duration)
        bad("max_break_duration must be at least break_duration (" +
            std::to_string(o.break_duration.count()) + "ns), got " +
            std::to_string(o.max_break_duration->count()) + "ns");
    if (o.probes < 1)
        bad("probes must be at least 1, got " + std::to_string(o.probes));
    if (o.window) {
        const breaker_window& w = *o.window;
        if (w.size.has_value() == w.sampling_duration.has_value())
            bad(std::string("window needs exactly one of window.size and window.sampling_duration, got ") +
                (w.size ? "both" : "neither"));
        if (w.size && *w.size < 1)
            bad("window.size must be positive, got " + std::to_string(*w.size));
        if (w.size && *w.size > breaker_window::max_size)
            bad("window.size must be at most " + std::to_string(breaker_window::max_size) + ", got " +
                std::to_string(*w.size));
        check_duration(w.sampling_duration, "window.sampling_duration");
        if (w.sampling_duration) {
            if (w.segments < 1)
                bad("window.segments must be positive, got " + std::to_string(w.segments));
            if (w.segments > breaker_window::max_segments)
                bad("window.segments must be at most " + std::to_string(breaker_window::max_segments) +
                    ", got " + std::to_string(w.segments));
            if (w.sampling_duration->count() < w.segments)
                bad("window.segments must not exceed window.sampling_duration in nanoseconds (" +
                    std::to_string(w.sampling_duration->count()) + "), got " + std::to_string(w.segments));
        }
        if (w.minimum_throughput && *w.minimum_throughput < 1)
            bad("window.minimum_throughput must be positive, got " + std::to_string(*w.minimum_throughput));
        if (w.minimum_throughput && w.size && *w.minimum_throughput > *w.size)
            bad("window.minimum_throughput must not exceed window.size (" + std::to_string(*w.size) +
                "), got " + std::to_string(*w.minimum_throughput));
        check_ratio(w.failure_ratio, "window.failure_ratio");
        check_ratio(w.slow_call_ratio, "window.slow_call_ratio");
        check_duration(w.slow_call_duration, "window.slow_call_duration");
        if (w.slow_call_ratio && !w.slow_call_duration)
            bad("window.slow_call_ratio needs window.slow_call_duration, got none");
        if (!w.failure_ratio && !w.slow_call_ratio)
            bad("window needs window.failure_ratio or window.slow_call_ratio, got neither");
    }
}

/// `o` with Polly's default trip condition when it has none, so `circuit_breaker_options{}` is a
/// usable breaker rather than an error.
inline circuit_breaker_options with_default_trip(circuit_breaker_options o) {
    if (!o.failure_threshold && !o.window)
        o.window = breaker_window{
            .sampling_duration = std::chrono::seconds{30}, .minimum_throughput = 100, .failure_ratio = 0.1};
    return o;
}

/// How a finished call is recorded.
enum class breaker_verdict : std::uint8_t { success, failure, ignored };

/// The shared state of one breaker. Every change is made under `mutex_`, which is held only to
/// admit a call and to record its result, never across user code: the clock, `should_handle` and
/// `on_state_change` are called with it released.
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
        if (options_.window) {
            const breaker_window& w = *options_.window;
            if (w.size) {
                count_window_.emplace(static_cast<std::size_t>(*w.size));
                minimum_throughput_ = static_cast<std::uint64_t>(w.minimum_throughput.value_or(*w.size));
            } else {
                time_window_.emplace(*w.sampling_duration / w.segments, static_cast<std::size_t>(w.segments));
                minimum_throughput_ = static_cast<std::uint64_t>(w.minimum_throughput.value_or(20));
            }
            slow_duration_ = w.slow_call_duration;
            slow_trips_ = w.slow_call_ratio.has_value();
        }
    }

    const circuit_breaker_options& options() const noexcept { return options_; }
    const C& clock() const noexcept { return clock_; }

    /// Admits or refuses a call. A closed breaker decides with one atomic load and no lock, and
    /// reads the clock only when a slow-call rule needs the call's start.
    /// Does admitting a call need the time (to time it against a slow-call rule)?
    bool times_calls() const noexcept { return slow_duration_.has_value(); }

    /// `sink` hears the state changes this call makes or sees, unless the options have a listener.
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
            // With no window, a closed-state success only ends the run of failures (or is dropped
            // as stale, which changes nothing either), so with no run there is nothing to store.
            // Skipping is recording it at the instant of this load: the run was zero then, and a
            // success on a zero run is a no-op. A failure recorded concurrently is ordered after
            // it; a failure recorded before this call (happens-before) wrote the counter before this
            // load, so coherence makes the load see a run and the success takes the lock to end it.
            // Relaxed is enough: nothing else is read on the strength of the value.
            if (v == breaker_verdict::success && !options_.window &&
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
            else // calls in flight belong to the window just cleared
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
                                                  const std::exception_ptr& error, const telemetry_listener* sink) {
        // The clock is read only when the result may need it: a success of a breaker with no
        // window and no slow-call rule needs no time at all.
        const bool needs_time =
            v == breaker_verdict::failure || (v == breaker_verdict::success && options_.window.has_value());
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
            // A success that finds no run stores nothing, so a windowed breaker's successes leave
            // the line other threads read on their lock-free paths untouched.
            consecutive_failures_.store(0, std::memory_order_relaxed);
        }
        if (options_.failure_threshold && failed &&
            run + 1 >= static_cast<std::uint64_t>(*options_.failure_threshold)) {
            open(now, error);
            return true;
        }
        if (!options_.window)
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
        const breaker_window& w = *options_.window;
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
                        options_.on_state_change(c.from, c.to);
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

/// Records a call's result once, through the breaker that admitted it (`finish`). A call that ends
/// without one (the classifier threw, the coroutine was destroyed) is recorded as ignored, so a probe
/// slot is never lost: only a probe needs that (an ignored closed-state result changes nothing), so
/// only a probe holds the breaker's state, and the destruction of any other call touches nothing.
/// Holds nothing until `start`.
template <class C>
class breaker_call {
public:
    using admission = typename breaker_core<C>::admission;

    breaker_call() noexcept {}
    breaker_call(const breaker_call&) = delete;
    breaker_call& operator=(const breaker_call&) = delete;
    ~breaker_call() {
        if (breaker_core<C>* core = probe_.get())
            core->record(admission_, breaker_verdict::ignored, nullptr, sink_); // then the hold goes
    }
    /// The call admitted by `a` is under way; its result is recorded by `finish` or, for a probe,
    /// the destructor.
    void start(breaker_core<C>& core, const admission& a, const telemetry_listener* sink) noexcept {
        admission_ = a;
        sink_ = sink;
        if (a.probe) [[unlikely]]
            probe_.take(core);
    }
    /// `core`: the breaker passed to `start`.
    void finish(breaker_core<C>& core, breaker_verdict v, const std::exception_ptr& error) {
        const state_hold<breaker_core<C>> held = std::move(probe_); // given back once recorded, or thrown
        core.record(admission_, v, error, sink_);
    }

private:
    state_hold<breaker_core<C>> probe_; // a probe's hold on the breaker
    admission admission_;
    const telemetry_listener* sink_ = nullptr; // the call's listener, for the state changes it makes
};

} // namespace detail

/// Stops calling a dependency that keeps failing (or answering too slowly), refusing calls at
/// once for a while, then lets a few probe calls decide whether it has recovered.
///
/// - **closed**: calls run. It opens when `failure_threshold` consecutive failures are recorded,
///   or when, with at least `minimum_throughput` in the window, the share of failures reaches
///   `failure_ratio` or the share of slow calls reaches `slow_call_ratio`: whichever comes first.
///   Rules are checked after each recorded call.
/// - **open**: every call is refused without running, with a `circuit_open_error` carrying
///   `retry_after()` (the exact time left) and `cause()` (the failure that opened it; null when
///   slowness or a handled value did). The break lasts `break_duration`, growing on consecutive
///   re-openings.
/// - **half_open**: once the break is over, exactly `probes` calls are admitted (even under many
///   concurrent callers; others are refused with `retry_after()` the current break duration);
///   when all of them succeed it closes, and any failure (or, with a `slow_call_ratio`, a slow
///   success) re-opens it. A probe whose result is not recorded (cancelled, or declined by
///   `should_handle`) frees its slot.
/// - **isolated**: refused with `circuit_isolated_error` (`retry_after()` is
///   `nanoseconds::max()`: no wait helps) until `reset()`, by hand.
///
/// The refusal is a failure value (`failure::make`), so `execute_outcome` reports it without an
/// exception. An outcome is recorded as a failure when `should_handle` handles it (default: every
/// failure but cancellation, and an `expected_like` value holding an error), and a failure never
/// when the caller's own stop token was stopped; a declined failure passes through unchanged, a
/// handled value is still returned. A result from a call admitted before the last change of state
/// is dropped. Time rules are read lazily from the clock: nothing runs while idle, and the move
/// from open to half-open happens (and is reported to `on_state_change`) when the first call after
/// the break arrives; `state()` already shows it without changing anything. Errors it makes carry
/// its `name`.
///
/// A cheap copyable handle: copies are the same breaker, thread-safe, usable from many event
/// loops at once. The state lives as long as any copy or any call that uses it (docs/core.md,
/// "Lifetimes"): reassigning the handle to reload the options is safe while calls run. A closed breaker
/// admits with one atomic load, and a success that ends no run of failures and has no window to enter is
/// recorded without a lock. Failures, windows and every other state lock a mutex briefly, never across the
/// action or user callbacks. The closed-state path allocates nothing.
///
///     rs::circuit_breaker breaker{{.failure_threshold = 5, .break_duration = 30s}};
///     rs::outcome<page> r = co_await breaker.execute_outcome(fetch);
///     if (!r && r.error().code() == rs::errc::circuit_open) { /* refused without an exception */ }
template <clock C = steady_clock>
class circuit_breaker : public policy_base<circuit_breaker<C>>,
                        public detail::shared_handle<circuit_breaker<C>, detail::breaker_core<C>> {
    using handle = detail::shared_handle<circuit_breaker<C>, detail::breaker_core<C>>;

public:
    /// Polly's defaults: see `circuit_breaker_options`.
    circuit_breaker() : circuit_breaker(circuit_breaker_options{}) {}
    /// Validates `options` (`std::invalid_argument` naming the field and value). Starts no timer.
    explicit circuit_breaker(circuit_breaker_options options, C clock = C{})
        : handle(make_core(detail::with_default_trip(std::move(options)), std::move(clock))) {}

    // ---- the policy protocol (see policy.hpp): admitting and recording never wait ----
    static constexpr bool enter_never_waits = true;
    struct call_state {
        detail::breaker_call<C> call; // records "ignored" if the call never finishes
    };

    template <class R>
    step enter(call_state& s, const context& ctx, const context*&, std::optional<outcome<R>>& result) const {
        detail::breaker_core<C>& core = this->held();
        if (ctx.stop_requested() || !core.options().should_handle.template accepts<R>()) {
            result.emplace(refused_before_admission<R>());
            return step::done;
        }
        const telemetry_listener* const sink = detail::context_access::telemetry(ctx);
        // Closed, with no call to time: admitted at one load, nothing else to decide.
        if (typename detail::breaker_core<C>::admission a; !core.times_calls() && core.admit_closed(a)) {
            s.call.start(core, a, sink);
            return step::proceed;
        }
        return enter_other(s, ctx, result, sink);
    }

    /// Records the result. A classifier or `on_state_change` that throws replaces the result with
    /// its exception, once the result is recorded (as neither success nor failure when the
    /// classifier threw, so a probe slot is freed).
    template <class R>
    step leave(call_state& s, const context& ctx, outcome<R>& result) const {
        detail::breaker_core<C>& core = this->held();
        if (core.options().should_handle.plain_success(result)) {
            try {
                s.call.finish(core, detail::breaker_verdict::success, nullptr);
            } catch (...) {
                result = outcome<R>{failure::current()};
            }
            return step::proceed;
        }
        leave_judged(s, ctx, result);
        return step::proceed;
    }

    /// The state now, with open turned half-open once the break is over. Changes nothing.
    [[nodiscard]] circuit_state state() const { return this->held().state(); }
    /// A snapshot taken at one instant. Changes nothing.
    [[nodiscard]] circuit_metrics metrics() const { return this->held().metrics(); }
    /// Holds the circuit open, refusing every call with `circuit_isolated_error`, until `reset()`.
    /// An exception from `on_state_change` reaches the caller, after the change.
    void isolate() const { this->held().isolate(); }
    /// Closes the circuit and forgets everything: window, runs of failures and openings.
    /// Results of calls still in flight are dropped. An exception from `on_state_change`
    /// reaches the caller, after the change.
    void reset() const { this->held().reset(); }

    /// The options in force: as given, with Polly's default window filled in when they set no
    /// trip condition. Valid while any copy of the handle lives.
    [[nodiscard]] const circuit_breaker_options& options() const noexcept { return this->held().options(); }
    [[nodiscard]] const C& clock() const noexcept { return this->held().clock(); }
    /// The `name` option (empty when unnamed).
    [[nodiscard]] const std::string& name() const noexcept { return this->held().options().name; }

private:
    // Every admission but a closed breaker's with no call to time: judged under the lock, or
    // refused.
    template <class R>
    RESILIENCE_DETAIL_NOINLINE step enter_other(call_state& s, const context& ctx,
                                                std::optional<outcome<R>>& result,
                                                const telemetry_listener* sink) const {
        detail::breaker_core<C>& core = this->held();
        try {
            // The call's shared clock reading serves a slow-call rule's start time.
            auto ticket =
                core.times_calls() ? core.admit(detail::call_now(core.clock(), ctx), sink) : core.admit(sink);
            if (ticket.admitted) {
                s.call.start(core, ticket, sink);
                // Stopped while being admitted (by `on_state_change` or a listener as the breaker
                // turned half-open, or from another thread): runs nothing, and its probe slot goes back.
                if (ctx.stop_requested()) [[unlikely]] {
                    s.call.finish(core, detail::breaker_verdict::ignored, nullptr);
                    detail::set_cancelled(result, name());
                    return step::done;
                }
                return step::proceed;
            }
            result.emplace(detail::refused(
                detail::listener_for(core.options().telemetry, ctx), core.clock(),
                detail::event(telemetry_kind::rejection, "circuit_breaker", name(), ctx.attempt()),
                refusal(ticket)));
        } catch (...) {
            // on_state_change threw (the probe slot is already given back), or the clock did
            result.emplace(failure::current());
        }
        return step::done;
    }

    // The refusals, out of the admission path.
    template <class R>
    // Called when the caller stopped or the classifier is for another type. The type is asked
    // first: it does not change, while a stop may arrive between two checks.
    failure refused_before_admission() const {
        const circuit_breaker_options& o = this->held().options();
        if (!o.should_handle.template accepts<R>())
            return o.should_handle.template mismatch<R>("circuit_breaker", o.name);
        return failure::make(cancelled_error{o.name});
    }
    failure refusal(const typename detail::breaker_core<C>::ticket& t) const {
        const std::string& name = this->held().options().name;
        if (t.isolated)
            return failure::make(circuit_isolated_error{name});
        return failure::make(circuit_open_error{name, t.retry_after, t.cause});
    }

    // A failure, or a value the classifier looks at: judged, then recorded.
    template <class R>
    void leave_judged(call_state& s, const context& ctx, outcome<R>& result) const {
        detail::breaker_verdict v = detail::breaker_verdict::ignored;
        std::exception_ptr cause;
        std::optional<failure> thrown;
        if (!(result.has_failure() && ctx.stop_requested())) {
            try {
                v = this->held().judge(result);
                if (v == detail::breaker_verdict::failure && result.has_failure())
                    cause = result.error().exception();
            } catch (...) {
                v = detail::breaker_verdict::ignored;
                thrown.emplace(failure::current());
            }
        }
        try {
            s.call.finish(this->held(), v, cause);
        } catch (...) {
            if (!thrown)
                thrown.emplace(failure::current());
        }
        if (thrown)
            result = outcome<R>{std::move(*thrown)};
    }

    static detail::breaker_core<C>* make_core(circuit_breaker_options options, C clock) {
        detail::validate_breaker_options(options);
        return handle::make_state(std::move(options), std::move(clock));
    }
};

// clang-format off
circuit_breaker() -> circuit_breaker<steady_clock>;
circuit_breaker(circuit_breaker_options) -> circuit_breaker<steady_clock>;
template <clock C>
circuit_breaker(circuit_breaker_options, C) -> circuit_breaker<C>;
// clang-format on

} // namespace resilience
