// SPDX-License-Identifier: MIT
/// \file examples/policy_kit/priority_shedder.hpp
/// `priority_shedder`: a load shedder by priority, written as a user of the library would write it,
/// with the public policy kit (resilience/policy_kit.hpp) only. docs/writing_a_policy.md builds it
/// step by step, quoting this file; tests/test_writing_a_policy.cpp tests it on virtual time.
#pragma once

#include <resilience/clock.hpp>
#include <resilience/policy_kit.hpp>
#include <resilience/stop_token.hpp>

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace example {

namespace rs = resilience;

/// How much a call matters when the dependency is saturated.
enum class priority : unsigned char {
    sheddable, ///< admitted only while more than `reserved` slots are free; never waits
    critical,  ///< may take any slot; when none is free, waits up to `max_wait` for one
};

constexpr const char* to_string(priority p) noexcept {
    return p == priority::critical ? "critical" : "sheddable";
}

/// How a `priority_shedder` behaves.
struct priority_shedder_options {
    /// Names the shedder in its errors, events and messages. Empty: unnamed.
    std::string name{};
    /// Calls holding a slot at once, of both priorities. At least 1.
    std::size_t capacity = 16;
    /// Slots only critical calls may take. Less than `capacity`.
    std::size_t reserved = 4;
    /// How long a critical call that finds every slot taken waits for one, in arrival order. Zero:
    /// it is shed at once, as a sheddable call is. Not negative.
    std::chrono::nanoseconds max_wait{};
    /// Called when a call is shed, before the refusal is returned, with the payload every policy's
    /// `on_rejected` has (`reason()`: `no_capacity` on arrival, `queue_timeout` after `max_wait`). A
    /// callback that throws ends the call with its exception instead (and the listener hears nothing).
    std::function<void(const rs::rejection_event&)> on_rejected{};
    /// Hears a `rejection` for every call shed and a `queue_wait` for every critical call admitted
    /// after waiting. Empty: the listener of a `telemetry` stage around it, if any.
    rs::telemetry_listener telemetry{};
};

/// "priority_shedder" or "priority_shedder (payments)": how the shedder signs its messages.
inline std::string shedder_label(const std::string& name) {
    return name.empty() ? std::string("priority_shedder") : "priority_shedder (" + name + ")";
}

/// A call shed by a `priority_shedder`. Not one of the library's `rs::error`s (their codes are the
/// library's `errc`): a `std::runtime_error` of its own, so `failure::code()` is `errc{}` for it,
/// `rs::is_transient` calls it transient (a retry around the shedder retries it, after its
/// backoff), and a breaker around the shedder counts it as a failure.
class shed_error : public std::runtime_error {
public:
    shed_error(std::string policy_name, priority p, rs::rejection_reason reason)
        : std::runtime_error(shedder_label(policy_name) + ": " + to_string(p) + " call shed (" +
                             rs::to_string(reason) + ")"),
          name_(std::move(policy_name)), priority_(p), reason_(reason) {}
    [[nodiscard]] const std::string& policy_name() const noexcept { return name_; }
    [[nodiscard]] priority call_priority() const noexcept { return priority_; }
    [[nodiscard]] rs::rejection_reason reason() const noexcept { return reason_; }

private:
    std::string name_;
    priority priority_;
    rs::rejection_reason reason_;
};

namespace detail {

/// What the copies of a shedder share: the slots and the queue of critical calls waiting for one.
/// One mutex guards both.
template <class C>
struct shedder_state {
    shedder_state(priority_shedder_options o, C c) : options(std::move(o)), clock(std::move(c)) {}

    /// A critical call's place in the queue, in its frame.
    struct waiter {
        rs::stop_source wake; // stopped to end the wait: by a slot handed over, or by the caller
        bool granted = false; // under the lock: `release` handed this waiter its slot
    };

    /// Takes a slot if one is free for `p`. While anyone waits, every slot is taken, so a call
    /// that arrives then never passes a waiter.
    bool try_take(priority p) {
        std::lock_guard lock(mutex);
        const std::size_t limit =
            p == priority::critical ? options.capacity : options.capacity - options.reserved;
        if (in_flight >= limit)
            return false;
        ++in_flight;
        return true;
    }
    /// `try_take`, else a place in the queue for `w`: true when a slot was taken.
    bool take_or_queue(waiter& w) {
        std::lock_guard lock(mutex);
        if (in_flight < options.capacity) {
            ++in_flight;
            return true;
        }
        queue.push_back(&w);
        return false;
    }
    /// Leaves the queue, if still in it; true when a slot was handed to `w`, which now holds it.
    bool withdraw(waiter& w) {
        std::lock_guard lock(mutex);
        if (!w.granted)
            std::erase(queue, &w);
        return w.granted;
    }
    /// Gives a slot back: to the first waiter, or to the free ones.
    void release() {
        rs::stop_source wake{rs::nostopstate};
        {
            std::lock_guard lock(mutex);
            if (queue.empty()) {
                --in_flight;
                return;
            }
            waiter* first = queue.front();
            queue.pop_front();
            first->granted = true;
            wake = first->wake; // a copy: once unlocked, the waiter may be resumed and gone
        }
        wake.request_stop(); // its sleep ends: it resumes on its own loop, at this instant
    }

    const priority_shedder_options options;
    const C clock;
    mutable std::mutex mutex;
    std::size_t in_flight = 0;   // slots taken, including those handed to a waiter
    std::deque<waiter*> queue{}; // critical calls waiting, the first to come first
};

} // namespace detail

/// Sheds load by priority. A handle: copies share one set of `capacity` slots, and each copy has the
/// priority of the calls made through it (`with_priority`), so one shedder serves both kinds:
///
///     example::priority_shedder shedder{{.name = "db", .capacity = 8, .reserved = 2, .max_wait = 50ms}};
///     rs::pipeline reports{shedder, rs::timeout{2s}};                                      // sheddable
///     rs::pipeline checkout{shedder.with_priority(example::priority::critical), rs::timeout{2s}};
///
/// - A sheddable call is admitted while more than `reserved` slots are free, else shed at once with
///   `shed_error` (`no_capacity`).
/// - A critical call takes any free slot. When none is free it waits, in arrival order, for the
///   first slot given back, and runs from that instant; after `max_wait` without one it is shed
///   (`queue_timeout`). A shedder without `max_wait` sheds it at once.
/// - A caller that stops is refused with `cancelled_error` at once, also while waiting.
/// Thread-safe (one uncontended lock per call); a waiter is resumed on the loop it waits on. `C`
/// times the waits.
template <rs::clock C = rs::steady_clock>
class priority_shedder : public rs::policy_base<priority_shedder<C>> {
    using state = detail::shedder_state<C>;

public:
    explicit priority_shedder(priority_shedder_options options, C clock = C{})
        : state_(std::make_shared<state>(validate(std::move(options)), std::move(clock))) {}

    /// A copy that shares the slots and admits its calls at `p`.
    [[nodiscard]] priority_shedder with_priority(priority p) const {
        priority_shedder copy = *this;
        copy.priority_ = p;
        return copy;
    }
    [[nodiscard]] priority call_priority() const noexcept { return priority_; }
    [[nodiscard]] const priority_shedder_options& options() const noexcept { return state_->options; }
    [[nodiscard]] const std::string& name() const noexcept { return state_->options.name; }
    /// Slots taken now.
    [[nodiscard]] std::size_t in_flight() const {
        std::lock_guard lock(state_->mutex);
        return state_->in_flight;
    }
    /// Critical calls waiting for a slot now.
    [[nodiscard]] std::size_t queued() const {
        std::lock_guard lock(state_->mutex);
        return state_->queue.size();
    }

    // ---- the policy protocol (see policy.hpp and docs/writing_a_policy.md) ----

    static constexpr bool copied_into_calls = true; // a handle: `shedder.execute(f)` copies it

    /// A call's slot: taken by `enter`, given back by `leave`, or by the destructor when the
    /// call's frame is destroyed before `leave` (its event loop torn down).
    struct call_state {
        std::shared_ptr<state> held; // the call keeps the slots alive while it holds one
        void give_back() noexcept {
            if (held)
                std::exchange(held, nullptr)->release();
        }
        ~call_state() { give_back(); }
    };

    /// The fast path: a free slot is taken without suspending. A critical call that finds none
    /// answers `step::wait`, and the pipeline calls `run`.
    template <class R>
    rs::step enter(call_state& c, const rs::context& ctx, std::optional<rs::outcome<R>>& result) const {
        if (ctx.stop_requested()) [[unlikely]]
            return rs::kit::cancel(result, name());
        if (state_->try_take(priority_)) {
            c.held = state_;
            return rs::step::proceed;
        }
        if (may_wait())
            return rs::step::wait;
        return rs::kit::refuse(result, shed(ctx, rs::rejection_reason::no_capacity, {}));
    }

    /// Gives the slot back, whatever the outcome.
    template <class R>
    rs::step leave(call_state& c, const rs::context&, rs::outcome<R>&) const noexcept {
        c.give_back();
        return rs::step::proceed;
    }

    /// The waiting path, for a call whose `enter` answered `step::wait`: the whole call, from the
    /// admission on. Waits for a slot (or the caller's stop, or `max_wait`), then runs `next`
    /// holding it.
    template <class Next>
    rs::task<rs::next_outcome_t<Next>> run(Next next, const rs::context& ctx) const {
        using result_type = rs::next_outcome_t<Next>;
        const state& s = *state_;
        call_state slot;
        if (ctx.stop_requested()) // stopped before it was admitted
            co_return result_type{rs::failure::make(rs::cancelled_error{name()})};
        if (!may_wait()) {
            if (!state_->try_take(priority_))
                co_return result_type{shed(ctx, rs::rejection_reason::no_capacity, {})};
            slot.held = state_;
        } else {
            place p{state_};
            if (state_->take_or_queue(p.w)) {
                slot.held = state_; // a slot came free since `enter`
            } else {
                const auto queued_at = s.clock.now();
                {
                    // Woken by a slot handed over, the caller's stop (forwarded to the same source),
                    // or the deadline, whichever comes first.
                    rs::stop_callback forward_stop{ctx.stop_token(), [&p] { p.w.wake.request_stop(); }};
                    co_await s.clock.sleep_until(rs::kit::after(s.clock, s.options.max_wait),
                                                 p.w.wake.get_token());
                }
                const bool granted = p.settle();
                if (granted)
                    slot.held = state_;
                const auto waited =
                    std::chrono::duration_cast<std::chrono::nanoseconds>(s.clock.now() - queued_at);
                if (ctx.stop_requested()) // a slot handed over to a call that stopped goes on to the next
                    co_return result_type{rs::failure::make(rs::cancelled_error{name()})};
                if (!granted)
                    co_return result_type{shed(ctx, rs::rejection_reason::queue_timeout, waited)};
                if (const rs::kit::listener listener = rs::kit::listener_for(s.options.telemetry, ctx)) {
                    if (std::optional<rs::failure> thrown =
                            rs::kit::emit(listener, s.clock,
                                          rs::kit::event(rs::telemetry_kind::queue_wait, "priority_shedder",
                                                         name(), ctx.attempt(), waited)))
                        co_return result_type{std::move(*thrown)};
                }
            }
        }
        result_type r = co_await next(ctx);
        slot.give_back();
        co_return r;
    }

private:
    /// The queue place of a waiting call. Settled once the wait ends; a frame destroyed while it
    /// waits (its loop torn down) settles it in the destructor, giving back a slot handed over.
    struct place {
        std::shared_ptr<state> s;
        typename state::waiter w{};
        bool settled = false;
        bool settle() {
            settled = true;
            return s->withdraw(w);
        }
        ~place() {
            if (!settled && settle())
                s->release();
        }
    };

    bool may_wait() const noexcept {
        return priority_ == priority::critical && state_->options.max_wait > std::chrono::nanoseconds::zero();
    }

    /// The refusal: `on_rejected` is told, then the listener; what either throws is the result instead.
    rs::failure shed(const rs::context& ctx, rs::rejection_reason why,
                     std::chrono::nanoseconds waited) const {
        const state& s = *state_;
        if (std::optional<rs::failure> thrown =
                rs::kit::invoke_callback(s.options.on_rejected, rs::rejection_event{name(), why}))
            return std::move(*thrown);
        rs::failure refusal = rs::failure::make(shed_error{name(), priority_, why});
        const rs::kit::listener listener = rs::kit::listener_for(s.options.telemetry, ctx);
        if (!listener)
            return refusal;
        rs::telemetry_event e =
            rs::kit::event(rs::telemetry_kind::rejection, "priority_shedder", name(), ctx.attempt(), waited);
        e.reason = why;
        return rs::kit::refused(listener, s.clock, e, std::move(refusal));
    }

    static priority_shedder_options validate(priority_shedder_options o) {
        const auto bad = [&](const std::string& what) {
            throw std::invalid_argument(shedder_label(o.name) + ": " + what);
        };
        if (o.capacity < 1)
            bad("capacity must be at least 1, got 0");
        if (o.reserved >= o.capacity)
            bad("reserved must be less than capacity (" + std::to_string(o.capacity) + "), got " +
                std::to_string(o.reserved));
        if (o.max_wait < std::chrono::nanoseconds::zero())
            bad("max_wait must not be negative, got " + std::to_string(o.max_wait.count()) + "ns");
        return o;
    }

    std::shared_ptr<state> state_;
    priority priority_ = priority::sheddable;
};

priority_shedder(priority_shedder_options) -> priority_shedder<rs::steady_clock>;
template <rs::clock C>
priority_shedder(priority_shedder_options, C) -> priority_shedder<C>;

} // namespace example
