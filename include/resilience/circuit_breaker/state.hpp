// SPDX-License-Identifier: MIT
/// \file circuit_breaker/state.hpp
/// `breaker_core`: the state the copies of a `circuit_breaker` share, and its state machine
/// (admission in each state, half-open probes, recording results, telling of changes). The options
/// block it publishes, and what follows from a block alone (the verdict on an outcome, the length of a
/// break, the sample it asks for), are in config_block.hpp; the samples in window.hpp; one call's hold
/// on the state in call.hpp.
///
/// Locking: `breaker_core::mutex_` guards the options in force (`cell_`: replaced under it, while a
/// call pins a block without it, by the cell's own count), the samples (`count_window_`,
/// `time_window_`), `last_now_`, `open_until_`, `cause_`, `last_failure_`, `consecutive_opens_`,
/// `probes_taken_`, `probes_passed_`, the queue of changes (`changes_`) and `draining_`, and every write
/// of the atomics `word_`, `admit_word_` and `consecutive_failures_`, which the lock-free paths read
/// without it. It is held only to admit a call, to record a result or to change the state, never across
/// user code (the clock, `should_handle`, `on_state_change`, listeners). A member whose name ends in
/// `_locked` is called with `mutex_` held and never takes it; every other member that touches what it
/// guards takes it itself (the constructor, before the state is shared, needs none).
#pragma once

#include "../classifier.hpp"
#include "../context.hpp"
#include "../detail/inlining.hpp"
#include "../detail/ring.hpp"
#include "../detail/shared_handle.hpp"
#include "../detail/snapshot_cell.hpp"
#include "../detail/time.hpp"
#include "../outcome.hpp"
#include "../telemetry_event.hpp"
#include "config_block.hpp"
#include "options.hpp"
#include "window.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

namespace resilience::inline v0_2::detail {

/// The shared state of one breaker, under `mutex_` (see "Locking" at the top of the file;
/// `on_rejected` is the policy's, not the state's).
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
///
/// The options live in an immutable `breaker_config`, published through `cell_` and replaced whole
/// by `reconfigure`. A call takes it once, when it is admitted, and judges itself under it to the
/// end (classification, slowness, its callbacks and names); what the
/// breaker itself does next (the rules a result is recorded under, the length of a break, the
/// probes half-open admits, who hears a change) follows the block in force when it does it, read
/// under the lock.
template <class C>
class breaker_core : public shared_state {
public:
    using time_point = typename C::time_point;
    using duration = typename C::duration;
    using config_block = breaker_config;

    /// What recording a call's result needs to know of its admission.
    struct admission {
        bool admitted = false;
        bool probe = false;
        std::uint64_t generation = 0;
        time_point start{};
        const breaker_config* config = nullptr; // the options the call was admitted under
        bool sampled = false;                   // whether they sample, and under which epoch
        std::uint64_t epoch = 0;
    };
    /// What `admit` decided.
    struct ticket : admission {
        bool isolated = false; // refused because isolated by hand: no wait helps
        std::chrono::nanoseconds retry_after{};
        std::exception_ptr cause;
    };

    breaker_core(circuit_breaker_options o, C clock)
        : clock_(std::move(clock)), cell_(std::make_unique<breaker_config>(std::move(o), 0)) {
        make_sample(*cell_.locked(), count_window_, time_window_);
        admit_word_.store(admit_word_of(*cell_.locked()), std::memory_order_relaxed);
    }
    breaker_core(const breaker_core&) = delete;
    breaker_core& operator=(const breaker_core&) = delete;

    /// Pins the options in force, for a call admitted under them (or a reader of them).
    pinned<breaker_config> pin() noexcept { return cell_.pin(); }
    /// A copy of the options in force.
    circuit_breaker_options options() const {
        std::lock_guard lock(mutex_);
        return cell_.locked()->options;
    }
    const C& clock() const noexcept { return clock_; }

    /// Admits a call into `a` when the options in force are plain (`breaker_config::plain`, read
    /// with whether they sample and the sample's epoch in one load of `admit_word_`) and the breaker
    /// is closed (one load of the word): the call is judged under `breaker_plain<>::block` and pins
    /// nothing. False changes nothing (the caller pins the options in force and goes on to
    /// `admit_under`).
    bool admit_plain(admission& a) const noexcept {
        const std::uint64_t o = admit_word_.load(std::memory_order_acquire);
        if (!(o & admit_plain_bit))
            return false;
        const std::uint64_t w = word_.load(std::memory_order_acquire);
        if (state_of(w) != circuit_state::closed)
            return false;
        a.admitted = true;
        a.generation = generation_of(w);
        a.config = &breaker_plain<>::block;
        a.sampled = (o & admit_sampled_bit) != 0;
        a.epoch = o >> 2;
        return true;
    }

    /// Admits or refuses a call. A closed breaker decides with one atomic load and no lock, and
    /// reads the clock only when a slow-call rule needs the call's start. `sink` hears the state
    /// changes this call makes or sees, unless the options have a listener.
    /// (For tests: the call is judged under the block in force, which must stay in force until
    /// its result is recorded.)
    ticket admit(detail::listener_ref sink = {}) { return admit_under(unpinned(), sink); }
    /// As `admit()`, the call judged under `cfg` (a block of this breaker's the caller pinned).
    ticket admit_under(const breaker_config* cfg, detail::listener_ref sink = {}) {
        if (cfg->slow_duration)
            return admit_under(cfg, clock_.now(), sink);
        const std::uint64_t w = word_.load(std::memory_order_acquire);
        if (state_of(w) == circuit_state::closed)
            return closed_ticket(cfg, w, time_point{});
        return admit_not_closed(cfg, std::nullopt, sink);
    }

    /// The closed state's part of `admit()` for a call under `cfg` with no slow-call rule
    /// (`!cfg->times_calls()`): admits the call into `a` and returns true when the breaker is closed
    /// at this one load; false changes nothing (the caller goes on to `admit_under`).
    bool admit_closed(admission& a, const breaker_config* cfg) const noexcept {
        const std::uint64_t w = word_.load(std::memory_order_acquire);
        if (state_of(w) != circuit_state::closed)
            return false;
        a.admitted = true;
        a.generation = generation_of(w);
        judged_under(a, cfg);
        return true;
    }

    /// As `admit()`, with `now` a reading of `clock()` the caller has just made: it is the call's
    /// start for slow-call rules and the time the break is judged at; the clock is not read again.
    ticket admit(time_point now, detail::listener_ref sink = {}) {
        return admit_under(unpinned(), now, sink);
    }
    /// As `admit(now)`, the call judged under `cfg`.
    ticket admit_under(const breaker_config* cfg, time_point now, detail::listener_ref sink = {}) {
        const std::uint64_t w = word_.load(std::memory_order_acquire);
        if (state_of(w) == circuit_state::closed)
            return closed_ticket(cfg, w, now);
        return admit_not_closed(cfg, now, sink);
    }

    /// How the outcome `o` of an admitted call is recorded (`verdict_of`), judged under the options
    /// in force. Precondition: `options().should_handle.accepts<R>()`.
    template <class R>
    breaker_verdict judge(const outcome<R>& o) const {
        return verdict_of(*pin(), o);
    }

    /// Records the result of the call `t` admitted. A closed-state result that would change nothing
    /// returns without the lock.
    void record(const admission& t, breaker_verdict v, const std::exception_ptr& error,
                detail::listener_ref sink = {}) {
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
            // A call admitted with no sample is entered in none (see `record_closed_locked`).
            if (v == breaker_verdict::success && !t.sampled &&
                consecutive_failures_.load(std::memory_order_relaxed) == 0)
                return;
        }
        record_in_full(t, v, error, sink);
    }

    circuit_state state() {
        const time_point read = clock_.now();
        std::lock_guard lock(mutex_);
        return visible_state_locked(std::max(read, last_now_));
    }

    circuit_metrics metrics() {
        const time_point read = clock_.now();
        std::lock_guard lock(mutex_);
        const time_point now = std::max(read, last_now_);
        circuit_metrics m;
        m.name = current_config_locked().options.name;
        m.state = visible_state_locked(now);
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
            if (current_state_locked() == circuit_state::isolated)
                return;
            cause_ = nullptr;
            transition_locked(circuit_state::isolated);
        }
        notify();
    }

    void reset() {
        bool changed = false;
        {
            std::lock_guard lock(mutex_);
            changed = current_state_locked() != circuit_state::closed;
            clear_locked();
            if (changed)
                transition_locked(circuit_state::closed);
            else // calls in flight belong to the sample just cleared
                publish_locked(circuit_state::closed, current_generation_locked() + 1);
        }
        if (changed)
            notify();
    }

    /// Puts `o` in force for the calls admitted from now on (`o` checked and its default trip filled
    /// in: see `circuit_breaker::reconfigure`, which says what carries over). The state is kept; the
    /// sample is kept when `o` samples as the options in force do (`same_sample`), and is otherwise
    /// replaced by a fresh one, which only calls admitted from now on enter. A half-open breaker that
    /// has already seen as many probes pass as `o.probes` asks closes now, and `on_state_change`
    /// hears it (what that throws reaches the caller, after the change). The block replaced is freed
    /// once no call pins it; options the same as those in force (`same_breaker_options`) change
    /// nothing and make no block. Throws `std::bad_alloc` before anything changed.
    void reconfigure(circuit_breaker_options o) {
        bool closed = false;
        {
            std::lock_guard lock(mutex_);
            const breaker_config* const old = cell_.locked();
            if (same_breaker_options(old->options, o))
                return;
            const bool keep = same_sample(old->options, o);
            auto fresh = std::make_unique<breaker_config>(std::move(o),
                                                          keep ? old->sample_epoch : old->sample_epoch + 1);
            std::optional<count_window> counts;
            std::optional<time_window> times;
            if (!keep)
                make_sample(*fresh, counts, times);
            const std::uint64_t admits = admit_word_of(*fresh);
            cell_.replace(std::move(fresh)); // frees `old` if no call pins it: not read after this
            // A plain admission reads this word and not the block: it changes with the block.
            admit_word_.store(admits, std::memory_order_release);
            if (!keep) {
                count_window_ = std::move(counts);
                time_window_ = std::move(times);
            }
            // Fewer probes than have passed already: half-open would admit no more, and none in
            // flight would close it. It has passed the test the new options set.
            if (current_state_locked() == circuit_state::half_open &&
                probes_passed_ >= current_config_locked().options.probes) {
                clear_locked();
                transition_locked(circuit_state::closed);
                closed = true;
            }
        }
        if (closed)
            notify();
    }

private:
    // A change of state, told to the callbacks of the options in force when it was made.
    struct change {
        circuit_state from{}, to{};
        pinned<breaker_config> config; // told to its callbacks, which may run after a reconfiguration
    };

    // `cell_` is replaced under the lock.
    const breaker_config& current_config_locked() const noexcept { return *cell_.locked(); }
    // For `admit()` without a block: see there.
    const breaker_config* unpinned() const {
        std::lock_guard lock(mutex_);
        return cell_.locked();
    }

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

    // `admit_word_`: what a plain admission needs of the block in force, in one word: `plain`,
    // whether it samples, and its sample epoch above them.
    static constexpr std::uint64_t admit_plain_bit = 1;
    static constexpr std::uint64_t admit_sampled_bit = 2;
    static std::uint64_t admit_word_of(const breaker_config& c) noexcept {
        return c.sample_epoch << 2 | (c.options.sampling ? admit_sampled_bit : 0) |
               (c.plain ? admit_plain_bit : 0);
    }
    // The call admitted into `a` is judged under `cfg`.
    static void judged_under(admission& a, const breaker_config* cfg) noexcept {
        a.config = cfg;
        a.sampled = cfg->options.sampling.has_value();
        a.epoch = cfg->sample_epoch;
    }

    // Under the lock only. Only the lock holder writes the word, so relaxed loads see its latest value.
    circuit_state current_state_locked() const noexcept {
        return state_of(word_.load(std::memory_order_relaxed));
    }
    std::uint64_t current_generation_locked() const noexcept {
        return generation_of(word_.load(std::memory_order_relaxed));
    }
    // Under the lock only. The lock-free paths read nothing but the word, so they need no more than
    // its atomicity; release (free on x86, paired with the admission's acquire) keeps the word a
    // publication point, so a lock-free path that one day reads more sees what came before it.
    void publish_locked(circuit_state s, std::uint64_t generation) noexcept {
        word_.store(pack(s, generation), std::memory_order_release);
    }

    static ticket closed_ticket(const breaker_config* cfg, std::uint64_t w, time_point start) noexcept {
        ticket t;
        judged_under(t, cfg);
        t.admitted = true;
        t.generation = generation_of(w);
        t.start = start;
        return t;
    }

    // Any state but a closed one seen by the lock-free load: takes the lock. `read` is the caller's
    // clock reading, if it made one. `cfg`: the options the call is judged under; the breaker's own
    // decisions (how many probes) follow those in force.
    ticket admit_not_closed(const breaker_config* cfg, std::optional<time_point> read,
                            detail::listener_ref sink) {
        ticket t;
        judged_under(t, cfg);
        bool changed = false;
        for (;;) {
            std::unique_lock lock(mutex_);
            const circuit_state s = current_state_locked();
            // Only open needs the time; the clock is read with the lock dropped.
            if (s != circuit_state::closed && s != circuit_state::isolated && !read) {
                lock.unlock();
                read = clock_.now();
                continue;
            }
            const time_point now = read ? monotonic_locked(*read) : time_point{};
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
                transition_locked(circuit_state::half_open);
                probes_taken_ = 0;
                probes_passed_ = 0;
                changed = true;
                [[fallthrough]];
            case circuit_state::half_open:
                if (probes_taken_ < current_config_locked().options.probes) {
                    ++probes_taken_;
                    t.admitted = true;
                    t.probe = true;
                } else {
                    // A slot frees when a probe ends, which nobody can foresee; a zero wait would
                    // make callers that honour it spin. A failed probe keeps the circuit shut for
                    // at least the break just served, so that is the wait worth suggesting.
                    t.retry_after = break_for(current_config_locked(), consecutive_opens_);
                    t.cause = cause_;
                }
                break;
            case circuit_state::isolated:
                t.isolated = true;
                t.retry_after = std::chrono::nanoseconds::max();
                break;
            }
            t.generation = current_generation_locked();
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

    // Takes the lock. Out of line: `record`'s lock-free checks stay small enough to be inlined into a
    // call's frame.
    RESILIENCE_DETAIL_NOINLINE void record_in_full(const admission& t, breaker_verdict v,
                                                   const std::exception_ptr& error,
                                                   detail::listener_ref sink) {
        // The clock is read only when the result may need it: a success of a call admitted with no
        // sampling (and so no slow-call rule) needs no time at all.
        const breaker_config& own = *t.config;
        const bool needs_time = v == breaker_verdict::failure || (v == breaker_verdict::success && t.sampled);
        const time_point read = needs_time ? clock_.now() : time_point{};
        bool changed = false;
        {
            std::lock_guard lock(mutex_);
            if (t.generation != current_generation_locked())
                return;
            const time_point now = needs_time ? monotonic_locked(read) : time_point{};
            // Slow by the call's own options; what that does, by those in force.
            const bool slow =
                needs_time && own.slow_duration && to_nanoseconds(now - t.start) >= *own.slow_duration;
            if (t.probe)
                changed = record_probe_locked(v, slow, error, now);
            else
                changed = record_closed_locked(t, v, slow, error, now);
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
    time_point monotonic_locked(time_point read) noexcept {
        if (read > last_now_)
            last_now_ = read;
        return last_now_;
    }

    circuit_state visible_state_locked(time_point now) const noexcept {
        const circuit_state s = current_state_locked();
        if (s == circuit_state::open && now >= open_until_)
            return circuit_state::half_open;
        return s;
    }

    // `own`: the call's admission (whether its options sampled, and which sample). The rules are
    // those in force.
    bool record_closed_locked(const admission& own, breaker_verdict v, bool slow,
                              const std::exception_ptr& error, time_point now) {
        if (v == breaker_verdict::ignored)
            return false;
        const breaker_config& cfg = current_config_locked();
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
        if (cfg.options.failure_threshold && failed &&
            run + 1 >= static_cast<std::uint64_t>(*cfg.options.failure_threshold)) {
            open_locked(now, error);
            return true;
        }
        // A sample holds only the calls admitted under it: one admitted before the sample was
        // replaced (or with none) was judged for another, and is left out.
        if (!cfg.options.sampling || !own.sampled || own.epoch != cfg.sample_epoch)
            return false;
        detail::window_counts c;
        if (count_window_) {
            count_window_->add(failed, slow);
            c = count_window_->counts();
        } else {
            time_window_->add(since_epoch(now), failed, slow);
            c = time_window_->counts(since_epoch(now));
        }
        if (c.calls < cfg.minimum_throughput)
            return false;
        const breaker_sampling& w = *cfg.options.sampling;
        const auto calls = static_cast<double>(c.calls);
        // A share computed by one division compares exactly with the decimal the user wrote
        // (3/10 rounds to the same double as 0.3), where `failures >= rate * calls` would not.
        if (w.failure_ratio && c.failures > 0 &&
            static_cast<double>(c.failures) / calls >= *w.failure_ratio) {
            open_locked(now, last_failure_);
            return true;
        }
        if (w.slow_call_ratio && c.slow > 0 && static_cast<double>(c.slow) / calls >= *w.slow_call_ratio) {
            open_locked(now, nullptr); // slowness alone: no failure to report
            return true;
        }
        return false;
    }

    bool record_probe_locked(breaker_verdict v, bool slow, const std::exception_ptr& error, time_point now) {
        switch (v) {
        case breaker_verdict::ignored:
            --probes_taken_; // the slot goes to the next caller
            return false;
        case breaker_verdict::failure:
            open_locked(now, error);
            return true;
        case breaker_verdict::success:
            if (slow && current_config_locked().slow_trips) {
                open_locked(now, nullptr);
                return true;
            }
            if (++probes_passed_ < current_config_locked().options.probes)
                return false;
            clear_locked();
            transition_locked(circuit_state::closed);
            return true;
        }
        return false;
    }

    void open_locked(time_point now, std::exception_ptr cause) {
        if (consecutive_opens_ != std::numeric_limits<std::uint64_t>::max())
            ++consecutive_opens_;
        open_until_ = add_saturating(now, break_for(current_config_locked(), consecutive_opens_));
        cause_ = std::move(cause);
        transition_locked(circuit_state::open);
    }

    void clear_locked() noexcept {
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
    void transition_locked(circuit_state to) {
        changes_.push(change{current_state_locked(), to, cell_.pin_locked()});
        publish_locked(to, current_generation_locked() + 1);
    }

    // Runs the callback for queued changes, outside the lock. One thread drains at a time, so the
    // callback sees changes one by one in the order they were made; a change queued while another
    // thread drains is left to that thread, which looks at the queue again before it stops.
    // An exception from the callback does not stop the draining (every change is still told); the
    // first one is rethrown once the queue is empty, to the call or the caller that drained it.
    // The telemetry listener hears each change after the callback: the options' own, else `sink`.
    // Both, and the name, are those of the options in force when the change was made.
    void notify(detail::listener_ref sink = {}) {
        std::exception_ptr thrown;
        {
            std::unique_lock lock(mutex_);
            if (draining_)
                return;
            draining_ = true;
            while (!changes_.empty()) {
                {
                    const change c = changes_.pop();
                    lock.unlock();
                    const circuit_breaker_options& o = c.config->options;
                    try {
                        if (o.on_state_change)
                            o.on_state_change(state_change_event{o.name, c.from, c.to});
                    } catch (...) {
                        if (!thrown)
                            thrown = std::current_exception();
                    }
                    const detail::listener_ref listener = o.telemetry ? sink.to(&o.telemetry) : sink;
                    auto f =
                        detail::emit_caught(listener, clock_, detail::state_change(o.name, c.from, c.to));
                    if (f && !thrown)
                        thrown = f->exception();
                } // the pin goes with the lock released: the block's callbacks may be freed with it
                lock.lock();
            }
            draining_ = false;
        }
        if (thrown)
            std::rethrow_exception(thrown);
    }

    // Off the cache line of the count of holds (see `shared_state`): calls only read what follows.
    // The three atomics are written under `mutex_` and read without it, each where its comment says.
    // The state and the generation: read without the lock by `admit_plain`, `admit_closed`, `admit_under`.
    alignas(64) std::atomic<std::uint64_t> word_{pack(circuit_state::closed, 0)};
    std::atomic<std::uint64_t> admit_word_{0}; // see `admit_word_of`; read without the lock by `admit_plain`
    // The current run of recorded failures; read without the lock by `record`.
    std::atomic<std::uint64_t> consecutive_failures_{0};

    C clock_;
    mutable std::mutex mutex_; // guards the members below and the writes above (see "Locking")
    // The options in force; replaced under the lock, pinned by calls without it.
    snapshot_cell<breaker_config> cell_;
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
