// SPDX-License-Identifier: MIT
/// \file rate_limiter.hpp
/// `rate_limiter`: a token bucket refilled lazily from the clock, with a first-come-first-served queue.
#pragma once

#include "clock.hpp"
#include "concepts.hpp"
#include "context.hpp"
#include "detail/shared_handle.hpp"
#include "detail/time.hpp"
#include "detail/waiter_queue.hpp"
#include "error.hpp"
#include "outcome.hpp"
#include "policy.hpp"
#include "task.hpp"
#include "telemetry.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <utility>

namespace resilience {

namespace detail {

/// The outcome of asking a limiter for one token: `granted`, `rejected` or `expired` (with
/// `retry_after`), or `stopped`.
struct admission {
    waiter_state state = waiter_state::idle;
    std::chrono::nanoseconds retry_after{};
};

/// The longest wait a limiter tells or sleeps: 2^62 ns, about 146 years (a rate of a token per
/// century). Due times and `retry_after` beyond it are held there, so adding one to a clock's time
/// cannot overflow; `redis::rate_limiter` holds Redis's answers at the same bound.
inline constexpr std::chrono::nanoseconds longest_wait{std::int64_t{1} << 62};

// Rounds a time in nanoseconds (a double, from the meters) up to a whole nanosecond, so nobody is
// woken or told to come back before the permit is really there. Times beyond `longest_wait` are
// held there.
inline std::chrono::nanoseconds ceil_ns(double ns) noexcept {
    constexpr std::int64_t far = longest_wait.count();
    const double up = std::ceil(ns);
    if (!(up < static_cast<double>(far))) // also NaN, which no meter makes: never sooner than can be told
        return std::chrono::nanoseconds(far);
    if (up < -static_cast<double>(far))
        return std::chrono::nanoseconds(-far);
    return std::chrono::nanoseconds(static_cast<std::int64_t>(up));
}

/// A meter that can also hand out permits without the limiter's mutex (see `limiter_state`).
template <class M>
concept lock_free_meter = requires(M& m, std::chrono::nanoseconds now) {
    { m.try_take_shared(now) } -> std::same_as<bool>;
    m.hold();
    m.unhold();
};

/// The waiting machinery shared by `rate_limiter` and `sliding_window_limiter`; `Meter` does the
/// counting. A meter is called with the mutex held, with times as nanoseconds since the limiter
/// was made (never decreasing), and provides:
///
///     bool try_take(nanoseconds now);                      // spends one permit if there is one
///     double available_at(nanoseconds now, size_t ahead);  // when a caller with `ahead` callers
///                                                          // before it would get its permit (>= now)
///     double remaining(nanoseconds now);                   // permits available now
///
/// The queue's front waiter (the head) is the only one that watches the clock: it sleeps until
/// its permit is due, takes it, leaves, and hands the timing to the next waiter, which it wakes.
/// A head whose caller stops leaves the same way. Other waiters just sit in the queue until they
/// become the head or their caller stops. So a new call never takes a permit while anyone waits,
/// and no timer runs for a limiter nobody waits on.
///
/// A queue timeout needs no timer of its own either. Every waiter's deadline is its queueing time
/// (read under the mutex, so never decreasing along the queue) plus the same timeout, so the head
/// always has the earliest deadline: it sleeps until its permit is due or its deadline, whichever
/// comes first, and at its deadline leaves (`expired`) and hands the turn on. The next waiter
/// takes over at that instant, so its own deadline, no earlier, is never missed.
///
/// A `lock_free_meter` keeps its state where calls can take a permit without the mutex, at any
/// reading of the clock (a stale one sees fewer permits, never more):
///
///     bool try_take_shared(nanoseconds now) noexcept; // spends one permit if there is one and
///                                                     // the mutex side does not hold the state
///     void hold() noexcept;   // mutex held: takes the state over; the calls above now say no
///     void unhold() noexcept; // mutex held: hands it back (nothing if not held)
///
/// and its other functions are called only while held. The mutex side holds it while it decides
/// and for exactly as long as anyone waits, so a permit taken without the mutex is never taken
/// ahead of a waiter, and the mutex side always sees a state nobody else changes.
template <clock C, class Meter>
struct limiter_state : shared_state {
    limiter_state(Meter m, C c, std::size_t queue_limit_,
                  std::optional<std::chrono::nanoseconds> queue_timeout_ = std::nullopt)
        : meter(std::move(m)), clock(std::move(c)), origin(clock.now()), queue_limit(queue_limit_),
          queue_timeout(queue_timeout_) {}
#ifndef NDEBUG
    ~limiter_state() {
        assert(queue.empty());
    } // a waiting call holds the limiter
#endif

    Meter meter;
    C clock;
    const typename C::time_point origin;
    const std::size_t queue_limit;
    const std::optional<std::chrono::nanoseconds> queue_timeout;
    std::mutex mutex;
    waiter_queue queue;

    std::chrono::nanoseconds latest{}; // the latest time a decision under the mutex used

    std::chrono::nanoseconds since_origin(typename C::time_point t) const {
        const auto e = std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin);
        return std::max(e, std::chrono::nanoseconds::zero());
    }
    std::chrono::nanoseconds elapsed_locked() {
        // Read under the mutex, so the meter sees times in the order its decisions are made.
        latest = std::max(latest, since_origin(clock.now()));
        return latest;
    }
    typename C::time_point time_point_of(double ns) const {
        return detail::add_saturating(origin, ceil_ns(ns)); // ns >= 0: a due time, never before now
    }

    // Made with `mutex` held, ended before it is released: a lock-free meter's state is held by the
    // mutex side meanwhile, and stays held afterwards exactly while anyone waits.
    struct meter_lease {
        limiter_state& s;
        explicit meter_lease(limiter_state& owner) noexcept : s(owner) {
            if constexpr (lock_free_meter<Meter>)
                s.meter.hold();
        }
        meter_lease(const meter_lease&) = delete;
        meter_lease& operator=(const meter_lease&) = delete;
        ~meter_lease() { s.waiter_left_locked(); }
    };
    // Also called by `stop_waiter` and `queue_awaiter` when a waiter leaves on its own: the meter's
    // state goes back to the fast path as soon as nobody waits.
    void waiter_left_locked() noexcept {
        if constexpr (lock_free_meter<Meter>)
            if (queue.empty())
                meter.unhold();
    }

    // ---- the waiter_queue protocol; `mutex` held ----
    waiter_state decide_locked(waiter& w) {
        meter_lease lease{*this};
        const auto now = elapsed_locked();
        if (queue.empty() && meter.try_take(now))
            return waiter_state::granted;
        if (queue.size() >= queue_limit) {
            w.retry_after = ceil_ns(meter.available_at(now, queue.size())) - now;
            return waiter_state::rejected;
        }
        return waiter_state::idle;
    }
    // The meter is held before the waiter is queued: a permit taken without the mutex is taken
    // before this waiter queued, never after, however the two race.
    waiter_state enqueue_locked(waiter& w) noexcept {
        meter_lease lease{*this};
        if (queue_timeout) {
            const auto now = elapsed_locked();
            w.deadline = *queue_timeout < std::chrono::nanoseconds::max() - now
                             ? now + *queue_timeout
                             : std::chrono::nanoseconds::max();
        }
        queue.push_back(w);
        return queue.front() == &w ? waiter_state::turn : waiter_state::queued;
    }

    /// The fast path: a permit at `now`, a reading of `clock` the caller made, with nobody waiting.
    /// False: no permit now or someone waits; the caller goes on to `wait`, which decides again.
    /// Without the mutex for a `lock_free_meter`.
    [[nodiscard]] bool try_take_now(typename C::time_point now) {
        if constexpr (lock_free_meter<Meter>) {
            return meter.try_take_shared(since_origin(now));
        } else {
            std::lock_guard lock(mutex);
            // A reading made before the lock may be older than one a decision already used.
            return queue.empty() && meter.try_take(std::max(since_origin(now), latest));
        }
    }
    [[nodiscard]] bool try_take_now() { return try_take_now(clock.now()); }

    /// The slow path: refuse, or wait for a permit in arrival order.
    task<admission> wait(std::stop_token token) {
        waiter node;
        waiter_state st = co_await queue_awaiter<limiter_state>{*this, node, token};
        if (st == waiter_state::turn) {
            // Passes the turn on if `serve_turn` cannot even start (its frame not allocated);
            // once it runs, its own guard does it first and this one finds nothing to do.
            turn_guard guard{this, &node};
            st = co_await serve_turn(node, token);
        }
        co_return admission{st, node.retry_after};
    }

    /// The head's part of a wait: `node` has its turn; ends with its final state.
    task<waiter_state> serve_turn(waiter& node, std::stop_token token) {
        // However this coroutine ends (a value, an exception from the clock, or destroyed while
        // asleep), the turn passes on: the waiters behind are never stranded.
        turn_guard guard{this, &node};
        // While it is the head, a stop takes it out of the queue at once and hands the turn
        // on, as for any waiter; its sleep, stopped by the same token, then ends the loop.
        std::optional<std::stop_callback<leave_on_stop>> on_stop;
        if (token.stop_possible())
            on_stop.emplace(token, leave_on_stop{this, &node});
        co_return co_await serve_head(node, token);
    }

    struct turn_guard {
        limiter_state* self;
        waiter* node;
        ~turn_guard() {
            waiter* next = nullptr;
            {
                std::lock_guard lock(self->mutex);
                if (node->state == waiter_state::turn) {
                    next = self->queue.leave_turn(*node, waiter_state::stopped);
                    self->waiter_left_locked();
                }
            }
            if (next)
                next->wake_later();
        }
    };

    struct leave_on_stop {
        limiter_state* self;
        waiter* node;
        void operator()() const { stop_waiter(*self, *node); } // may post a wake-up
    };

    // The head's loop: take the permit when it is there, else sleep until it is due or the wait
    // runs out. Ends when the permit is taken, when the deadline passed first (a permit due at the
    // very instant of the deadline is still taken), or when the node left its turn (stopped).
    task<waiter_state> serve_head(waiter& node, const std::stop_token& token) {
        for (;;) {
            typename C::time_point due{};
            waiter* next = nullptr;
            waiter_state st = waiter_state::turn;
            {
                std::lock_guard lock(mutex);
                meter_lease lease{*this};
                if (node.state != waiter_state::turn) {
                    st = node.state;
                } else if (token.stop_requested()) {
                    next = queue.leave_turn(node, waiter_state::stopped);
                    st = waiter_state::stopped;
                } else {
                    const auto now = elapsed_locked();
                    if (meter.try_take(now)) {
                        next = queue.leave_turn(node, waiter_state::granted);
                        st = waiter_state::granted;
                    } else {
                        const double at = meter.available_at(now, 0);
                        if (now >= node.deadline) {
                            node.retry_after = ceil_ns(at) - now;
                            next = queue.leave_turn(node, waiter_state::expired);
                            st = waiter_state::expired;
                        } else if (ceil_ns(at) <= node.deadline && ceil_ns(at) > now) {
                            due = time_point_of(at);
                        } else {
                            // The deadline comes first, or the permit is further than the limiter
                            // can tell (held at ceil_ns's limit, which `now` may have passed on
                            // virtual time): sleep until the deadline, or for good, not in a loop.
                            due = detail::add_saturating(origin, node.deadline);
                        }
                    }
                }
            }
            if (next)
                next->wake();
            if (st != waiter_state::turn)
                co_return st;
            co_await clock.sleep_until(due, token); // if it throws, serve_turn's turn_guard hands the turn on
        }
    }

    double remaining() {
        std::lock_guard lock(mutex);
        meter_lease lease{*this};
        return meter.remaining(elapsed_locked());
    }
    [[nodiscard]] std::size_t queued() {
        std::lock_guard lock(mutex);
        return queue.size();
    }
};

/// A limiter's shared state with the options it was made with, which the handles read.
template <clock C, class Meter, class Options>
struct limiter_shared : limiter_state<C, Meter> {
    limiter_shared(Meter m, C c, Options o)
        : limiter_state<C, Meter>(std::move(m), std::move(c), o.queue_limit, o.queue_timeout),
          options(std::move(o)) {}
    const Options options;
};

/// The public face shared by the limiters: the policy protocol, `take`, `queued`, `name`, `==`.
/// A copyable handle to one shared, thread-safe limiter. A call holds the limiter only while it
/// waits: on the fast path it takes its permit and touches the limiter no more.
template <class Derived, clock C, class Meter, class Options>
class limiter_handle : public policy_base<Derived>,
                       public shared_handle<Derived, limiter_shared<C, Meter, Options>> {
    using handle = shared_handle<Derived, limiter_shared<C, Meter, Options>>;

public:
    // ---- the policy protocol (see policy.hpp) ----
    struct call_state {};

    /// A permit now with nobody queued is taken at once; anything else waits (or is refused) in
    /// `frame_wait`.
    template <class R>
    step enter(call_state&, const context& ctx, const context*&, std::optional<outcome<R>>& result) const {
        if (ctx.stop_requested()) [[unlikely]] {
            set_cancelled(result, name());
            return step::done;
        }
        return this->held().try_take_now(call_now(this->held().clock, ctx)) ? step::proceed : step::wait;
    }
    template <class R>
    step leave(call_state&, const context&, outcome<R>&) const noexcept {
        return step::proceed;
    }

    /// Whether a call that found no permit waits for one in the pipeline's frame (`frame_wait`):
    /// always (`run` is for a limiter used inside a waiting-form policy).
    bool waits_in_frame(const context&) const noexcept { return true; }
    /// Waits for a permit without a frame of its own, by the rules of `run`: yields `step::proceed`
    /// with the permit spent, or `step::done` with the refusal (`rate_limited_error`) or the stop
    /// (`cancelled_error`) in `result`. The queue's node is in it; only the head, which watches
    /// the clock, runs a coroutine (`serve_turn`), so it answers `step::wait` (await it again)
    /// when its turn comes. With a telemetry listener, the time the wait began is kept in a block
    /// of its own from the frame cache, taken only then. Holds the limiter while it lives (taken
    /// at construction, given back at the end of its destructor: no member of its own).
    template <class R>
    class frame_wait {
        using shared = limiter_shared<C, Meter, Options>;

    public:
        frame_wait(const limiter_handle& l, call_state&, const context& ctx,
                   std::optional<outcome<R>>& result)
            : ctx_(ctx), result_(result), queue_(l.held(), node_, ctx.stop_token()) {
            add_hold(l.held(), true);
        }
        frame_wait(const frame_wait&) = delete;
        frame_wait& operator=(const frame_wait&) = delete;
        ~frame_wait() {
            shared& l = limiter();
            // Ended (or destroyed) at its turn, before or while the head's coroutine ran: the turn
            // passes on all the same. The coroutine goes first; its own guard may do it.
            turn_ = {};
            if (phase_ == phase::turn) {
                typename limiter_state<C, Meter>::turn_guard pass_on{&l, &node_};
                (void)pass_on; // its destructor hands the turn on, if the node still has it
            }
            if (queued_at_) {
                std::destroy_at(queued_at_);
                frame_cache::deallocate(queued_at_, sizeof(typename C::time_point));
            }
            queue_.leave(); // what its destructor would do, while the limiter is still held
            drop_hold(l, true);
        }

        bool await_ready() {
            switch (phase_) {
            case phase::start:
                if (ctx_.stop_requested()) {
                    set_cancelled(result_, limiter().options.name);
                    phase_ = phase::decided;
                    answer_ = step::done;
                    return true;
                }
                if (limiter().try_take_now()) {
                    phase_ = phase::decided;
                    answer_ = step::proceed;
                    return true;
                }
                if (listener_for(limiter().options.telemetry, ctx_)) { // as `run`: from when it found none
                    const typename C::time_point now = limiter().clock.now();
                    queued_at_ = ::new (frame_cache::allocate(sizeof(typename C::time_point)))
                        typename C::time_point(now);
                }
                phase_ = phase::queue;
                return queue_.await_ready();
            case phase::turn:
                return false; // the head's coroutine runs next
            default:
                return true;
            }
        }
        detail::start_result await_suspend(std::coroutine_handle<> h) {
            if (phase_ == phase::turn)
                return std::move(turn_).operator co_await().await_suspend(h);
            return detail::suspend_unless_done(queue_.await_suspend(h), h);
        }
        step await_resume() {
            waiter_state st;
            switch (phase_) {
            case phase::decided:
                return answer_;
            case phase::queue:
                st = queue_.await_resume();
                if (st == waiter_state::turn) {
                    phase_ = phase::turn;
                    turn_ = limiter().serve_turn(node_, ctx_.stop_token());
                    return step::wait;
                }
                break;
            default: // phase::turn
                st = std::move(turn_).operator co_await().await_resume();
                break;
            }
            phase_ = phase::decided;
            shared& l = limiter();
            const telemetry_listener* const listener = queued_at_ ? listener_for(l.options.telemetry, ctx_) : nullptr;
            if (st == waiter_state::granted) {
                if (listener)
                    if (std::optional<failure> thrown =
                            emit_caught(listener, l.clock, waited_on(l, ctx_, queued_at_, telemetry_kind::queue_wait))) {
                        result_.emplace(std::move(*thrown)); // the permit stays spent
                        return answer_ = step::done;
                    }
                // Stopped since its turn came (by the listener, or from another thread): runs
                // nothing, and the permit stays spent.
                if (ctx_.stop_requested()) {
                    set_cancelled(result_, l.options.name);
                    return answer_ = step::done;
                }
                return answer_ = step::proceed;
            }
            if (st == waiter_state::stopped) {
                set_cancelled(result_, l.options.name);
            } else {
                rate_limited_error e = refusal_of(l, admission{st, node_.retry_after});
                const rejection_reason why = e.reason();
                failure refused_call = failure::make(std::move(e));
                result_.emplace(listener ? refused(listener, l.clock,
                                                   waited_on(l, ctx_, queued_at_, telemetry_kind::rejection, why),
                                                   std::move(refused_call))
                                         : std::move(refused_call));
            }
            return answer_ = step::done;
        }

    private:
        enum class phase : unsigned char { start, queue, turn, decided };

        shared& limiter() const noexcept { return static_cast<shared&>(queue_.owner()); }

        const context& ctx_;
        std::optional<outcome<R>>& result_;
        typename C::time_point* queued_at_ = nullptr; // with a listener: when the call found no permit
        waiter node_;
        // After the node it queues. Its tail padding holds the two fields after it, which keeps
        // the whole at 184 bytes, a 192-byte block with the pipeline's stage index.
        [[no_unique_address]] queue_awaiter<limiter_state<C, Meter>> queue_;
        phase phase_ = phase::start;
        step answer_ = step::done;
        task<waiter_state> turn_; // the head's: watches the clock
    };

    /// Admits the call once it has a permit, spending exactly one; otherwise fails it (as a value)
    /// with `rate_limited_error` when it may not wait or waited `queue_timeout`, or
    /// `cancelled_error` when its caller stops first. A permit, once spent, is not given back,
    /// however the call ends.
    template <class Next>
    task<next_outcome_t<Next>> run(Next next, const context& ctx) const {
        // The same wait as in a pipeline's frame, in this coroutine's.
        std::optional<next_outcome_t<Next>> refused_call;
        call_state none;
        step s;
        {
            frame_wait<next_value_t<Next>> waiting{*this, none, ctx, refused_call};
            do // `step::wait`: the head's turn came, await it again
                s = co_await waiting;
            while (s == step::wait);
        }
        if (s != step::proceed)
            co_return std::move(*refused_call);
        co_return co_await next(ctx);
    }

    /// Spends one permit without running anything, by the same rules as a call (waits in the
    /// same queue). Throws `rate_limited_error` when refused, `cancelled_error` when `token` stops
    /// the wait first. Like a call, it holds the limiter from the moment it is made.
    task<void> take(std::stop_token token = {}) const {
        return take_with(static_cast<const Derived&>(*this), std::move(token));
    }
    /// `take`, reporting a refusal or a stop as a failure value instead of throwing it.
    [[nodiscard]] task<outcome<void>> take_outcome(std::stop_token token = {}) const {
        return take_outcome_with(static_cast<const Derived&>(*this), std::move(token));
    }

    /// Calls (and `take`s) waiting now, the one watching the clock included.
    [[nodiscard]] std::size_t queued() const { return this->held().queued(); }
    [[nodiscard]] const Options& options() const noexcept { return this->held().options; }
    [[nodiscard]] const std::string& name() const noexcept { return this->held().options.name; }
    [[nodiscard]] const C& clock() const noexcept { return this->held().clock; }

protected:
    using shared = limiter_shared<C, Meter, Options>;

    limiter_handle(Meter meter, C clock, Options options)
        : handle(handle::make_state(std::move(meter), std::move(clock), std::move(options))) {}

private:
    // The limiter is a copy in the frame: the take needs no handle of the caller's.
    static task<void> take_with(Derived self, std::stop_token token) {
        auto r = co_await self.take_outcome(std::move(token));
        r.value();
    }
    static task<outcome<void>> take_outcome_with(Derived self, std::stop_token token) {
        shared& s = self.held();
        if (token.stop_requested())
            co_return failure::make(cancelled_error{s.options.name});
        if (s.try_take_now())
            co_return outcome<void>{};
        const admission a = co_await s.wait(token);
        if (a.state == waiter_state::granted)
            co_return outcome<void>{};
        if (a.state == waiter_state::stopped)
            co_return failure::make(cancelled_error{s.options.name});
        co_return failure::make(refusal_of(s, a));
    }

    static rate_limited_error refusal_of(const shared& s, const admission& a) {
        rejection_reason why = rejection_reason::queue_timeout;
        if (a.state == waiter_state::rejected)
            why = s.queue_limit == 0 ? rejection_reason::no_capacity : rejection_reason::queue_full;
        return rate_limited_error{s.options.name, a.retry_after, why};
    }
    // An event about a call that waited since `since` (read only for a listener).
    static telemetry_event waited_on(const shared& s, const context& ctx, const typename C::time_point* since,
                                     telemetry_kind k, rejection_reason why = rejection_reason::no_capacity) {
        return {.kind = k,
                .policy = Derived::telemetry_policy,
                .name = s.options.name,
                .attempt = ctx.attempt(),
                .duration = since ? saturating_nanoseconds(s.clock.now() - *since) : std::chrono::nanoseconds{},
                .reason = why};
    }
};

/// Checks the queue options both limiters share; `who` starts the message.
template <class Options>
void validate_queue_options(const Options& o, const std::string& who) {
    if (o.queue_timeout && *o.queue_timeout <= std::chrono::nanoseconds::zero())
        throw std::invalid_argument(who + "queue_timeout must be positive, got " +
                                    std::to_string(o.queue_timeout->count()) + "ns");
}

/// A token bucket in time form: the bucket holds `(now - empty_at) / interval` tokens, capped at
/// `capacity` (the `token_limit`). Keeping the instant the bucket was empty instead of a token count makes
/// every due time one addition, exact on virtual time whenever `interval` is a whole number of nanoseconds
/// (10 per second: 100 ms), and within a nanosecond otherwise.
///
/// That instant is the bucket's whole state, so it lives in one atomic word, as the bits of the
/// double, and a token is taken with one compare-and-swap (a `lock_free_meter`). While the mutex
/// side holds the bucket, the word holds `held_bits` instead and the instant is in `empty_at_`.
class token_bucket {
public:
    token_bucket(std::size_t capacity, double tokens_per_second) noexcept
        : capacity_(static_cast<double>(capacity)), interval_(1e9 / tokens_per_second),
          empty_at_(-capacity_ * interval_), word_(std::bit_cast<std::uint64_t>(empty_at_)) {}
    // Moved only before it is shared.
    token_bucket(token_bucket&& other) noexcept
        : capacity_(other.capacity_), interval_(other.interval_), empty_at_(other.empty_at_),
          held_(other.held_), word_(other.word_.load(std::memory_order_relaxed)) {}

    bool try_take_shared(std::chrono::nanoseconds now) noexcept {
        std::uint64_t seen = word_.load(std::memory_order_acquire);
        while (seen != held_bits) {
            double empty_at = std::bit_cast<double>(seen);
            if (!take(empty_at, now))
                return false;
            if (word_.compare_exchange_weak(seen, std::bit_cast<std::uint64_t>(empty_at),
                                            std::memory_order_acq_rel, std::memory_order_acquire))
                return true;
        }
        return false;
    }
    void hold() noexcept {
        if (!held_) {
            empty_at_ = std::bit_cast<double>(word_.exchange(held_bits, std::memory_order_acq_rel));
            held_ = true;
        }
    }
    void unhold() noexcept {
        if (held_) {
            word_.store(std::bit_cast<std::uint64_t>(empty_at_), std::memory_order_release);
            held_ = false;
        }
    }

    bool try_take(std::chrono::nanoseconds now) noexcept { return take(empty_at_, now); }
    double available_at(std::chrono::nanoseconds now, std::size_t ahead) noexcept {
        refill(empty_at_, now);
        return std::max(static_cast<double>(now.count()),
                        empty_at_ + static_cast<double>(ahead + 1) * interval_);
    }
    double remaining(std::chrono::nanoseconds now) noexcept {
        refill(empty_at_, now);
        return std::clamp((static_cast<double>(now.count()) - empty_at_) / interval_, 0.0, capacity_);
    }

private:
    // A signalling NaN: arithmetic never produces one, so no instant the bucket computes has these bits.
    static constexpr std::uint64_t held_bits = 0x7ff0'0000'0000'0001;

    bool take(double& empty_at, std::chrono::nanoseconds now) const noexcept {
        refill(empty_at, now);
        if (static_cast<double>(now.count()) < empty_at + interval_)
            return false;
        empty_at += interval_;
        return true;
    }

    // A full bucket stays full: time spent idle beyond that adds nothing. Less than a nanosecond
    // of overflow is kept, though: it is what rounding a due time up to a whole nanosecond adds,
    // and dropping it would push every later token back by that much again, a drift.
    void refill(double& empty_at, std::chrono::nanoseconds now) const noexcept {
        const double full_since = static_cast<double>(now.count()) - capacity_ * interval_;
        if (full_since - empty_at >= 1.0)
            empty_at = full_since;
    }

    double capacity_;
    double interval_;                 // nanoseconds per token
    double empty_at_;                 // nanoseconds since the limiter was made; the state while `held_`
    bool held_ = false;               // guarded by the limiter's mutex
    std::atomic<std::uint64_t> word_; // `empty_at` as bits, or `held_bits`
};

} // namespace detail

struct rate_limiter_options {
    /// The burst after idle: how many tokens the bucket holds. It starts full. Must be positive.
    /// No default, as for the rate: only the user knows what the dependency allows.
    std::size_t token_limit = 0;
    /// The sustained rate: tokens added per second, lazily, as time passes. Finite and at least
    /// `min_tokens_per_second`. No default: a guessed rate would either throttle a dependency that
    /// could take more or let through more than it can take, silently; so a limiter made without
    /// one throws.
    double tokens_per_second = 0;
    /// The slowest rate accepted: a token every 31.7 years. The bucket counts in nanoseconds per
    /// token; a slower rate is refused (`std::invalid_argument`) rather than rounded, since its
    /// interval would not fit the times the limiter computes (a rate of 1e-300 would make it
    /// infinite, and the bucket would admit everything).
    static constexpr double min_tokens_per_second = 1e-9;
    /// How many calls may wait for a token; beyond that a call is refused at once
    /// (`rejection_reason::queue_full`). The default 0 refuses as soon as the bucket is empty
    /// (`no_capacity`); `rs::unbounded_queue` never refuses for want of a queue place.
    std::size_t queue_limit = 0;
    /// How long a call may wait in the queue before it is refused (`queue_timeout`), at exactly
    /// that instant; a token due at that very instant is still taken. Empty (the default): as
    /// long as it takes. Must be positive when set.
    std::optional<std::chrono::nanoseconds> queue_timeout{};
    /// Carried by the errors it makes (`policy_name()`) and by `name()`.
    std::string name{};
    /// Hears this limiter's `rejection`s and `queue_wait`s. Empty: the listener of a `telemetry`
    /// stage around the call, if any (see telemetry.hpp).
    telemetry_listener telemetry{};
};

/// Limits how often calls start: a token bucket of `token_limit` tokens (full at first) refilled
/// at `tokens_per_second`. Each admitted call spends exactly one token before it starts.
/// - Refilled lazily from the clock, never by a timer: an idle limiter costs nothing, and the
///   bucket never holds more than `token_limit` however long it idles.
/// - A call that finds no token waits, when `queue_limit` allows, in a queue served in arrival
///   order: while anyone waits, a new call queues behind them even if a token is there, so a
///   stream of new calls cannot starve the oldest. Only the front waiter watches the clock: it
///   sleeps until its token is due (exact on virtual time); when it is served or leaves, the next
///   one takes over. A waiter whose caller stops leaves the queue at once and fails with
///   `cancelled_error`.
/// - A call that may not wait (`queue_limit` 0 or reached) or that waited `queue_timeout` fails
///   with `rate_limited_error`, returned as a value through the pipeline, whose `reason()` says
///   which and whose `retry_after()` is how long until a token would be there for it, counting
///   the waiters before it.
///
/// A copyable handle: copies share one bucket, which is thread-safe; event loops on several
/// threads may share it, and each waiter is resumed on the loop it waited on. While nobody waits,
/// a call takes its token with one atomic compare-and-swap, without a lock. A call made through a
/// handle needs only the shared state to live (some copy of the handle), not that handle object.
/// `C` serves every use of time (see `clock`); copies share one clock object, which must be
/// usable from every thread that calls through the limiter.
///
///     rs::rate_limiter api{{.token_limit = 10, .tokens_per_second = 5, .queue_limit = 100}};
///     auto r = co_await api.execute(call);              // waits for a token when needed
///     co_await api.take(stop);                          // or spend one directly
template <clock C = steady_clock>
class rate_limiter
    : public detail::limiter_handle<rate_limiter<C>, C, detail::token_bucket, rate_limiter_options> {
    using base = detail::limiter_handle<rate_limiter<C>, C, detail::token_bucket, rate_limiter_options>;

public:
    /// The `policy` of its telemetry events.
    static constexpr std::string_view telemetry_policy = "rate_limiter";

    explicit rate_limiter(rate_limiter_options options, C clock = C{})
        : base(meter_of(options), std::move(clock), options) {}

    /// Tokens in the bucket now (fractional while refilling), at most `token_limit`.
    [[nodiscard]] double tokens() const { return this->held().remaining(); }

private:
    static detail::token_bucket meter_of(const rate_limiter_options& o) {
        const std::string who = "resilience::rate_limiter: ";
        if (o.token_limit == 0)
            throw std::invalid_argument(who + "token_limit must be positive, got 0");
        if (!std::isfinite(o.tokens_per_second) || !(o.tokens_per_second > 0))
            throw std::invalid_argument(who + "tokens_per_second must be finite and positive, got " +
                                        detail::format_number(o.tokens_per_second));
        if (o.tokens_per_second < rate_limiter_options::min_tokens_per_second)
            throw std::invalid_argument(who + "tokens_per_second must be at least 1e-9 (a token every " +
                                        "31.7 years), got " + detail::format_number(o.tokens_per_second));
        detail::validate_queue_options(o, who);
        return detail::token_bucket{o.token_limit, o.tokens_per_second};
    }
};

rate_limiter(rate_limiter_options)->rate_limiter<steady_clock>;
template <clock C>
rate_limiter(rate_limiter_options, C) -> rate_limiter<C>;

} // namespace resilience
