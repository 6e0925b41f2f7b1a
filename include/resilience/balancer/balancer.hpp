// SPDX-License-Identifier: MIT
/// \file balancer/balancer.hpp
/// `balancer<E>`: picks, for each attempt, one endpoint of a set (a replica, a host), and makes it
/// known to the action; steers away from slow and busy endpoints, sends a retry to an endpoint the
/// call has not tried, and ejects outliers for a while. docs/balancer.md says it with examples.
///
/// Locking: see balancer/state.hpp. A pick takes no lock.
#pragma once

#include "../classifier.hpp"
#include "../clock.hpp"
#include "../context.hpp"
#include "../detail/label.hpp"
#include "../detail/shared_handle.hpp"
#include "../policy.hpp"
#include "../policy_kit.hpp"
#include "../random.hpp"
#include "errors.hpp"
#include "options.hpp"
#include "pick.hpp"
#include "state.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace resilience::inline v0_2 {

/// The endpoint the balancer around this attempt picked for it: valid during the attempt. Throws
/// `std::logic_error` when no balancer of endpoints of type `E` is around the action.
template <class E>
const E& endpoint(const context& ctx) {
    if (const E* e = ctx.property(endpoint_key<E>))
        return *e;
    throw std::logic_error("resilience::endpoint: no balancer of this endpoint type around the action");
}

namespace detail {
/// What bench/balancer.cpp times on its own: the pick a call makes once it holds the set in force
/// (every call pins it, as it holds its options, for its whole length).
struct balancer_access {
    template <class B>
    static auto pin(const B& lb) noexcept {
        return lb.held().cell.pin();
    }
    /// A pick at the clock's time, counted in flight and given back: null when the set is empty. Inline
    /// in the caller, as a pick is in a call's admission.
    template <class B, class Block>
    RESILIENCE_DETAIL_ALWAYS_INLINE static const void* pick_once(const B& lb, const Block& b) {
        auto* const e = lb.take(b, B::ticks(lb.held().clock.now()), 0, nullptr);
        if (e)
            e->in_flight.fetch_sub(1, std::memory_order_relaxed);
        return e;
    }
};
} // namespace detail

/// Picks one endpoint of a set for each attempt of a call, and puts it on the attempt's context
/// (`rs::endpoint<E>(ctx)`, or `lb.bind(f)` for an action that takes it as its first argument).
///
///     rs::balancer<std::string> replicas{{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"}};
///     rs::pipeline policy{rs::retry<>{{.max_attempts = 3}}, replicas, rs::timeout<>{100ms}};
///     int v = co_await policy.execute(replicas.bind(
///         [&](const std::string& host, const rs::context& c) -> rs::task<int> { co_return co_await get(host, c); }));
///
/// - **The pick** (`balance_pick`): by default the less loaded of two endpoints drawn at random, the
///   load being a peak-EWMA latency times the calls in flight plus one; or round-robin, or random.
/// - **Inside a retry or a hedge** (listed before it in the pipeline), each attempt is picked anew, and
///   goes to an endpoint the call has not tried while one that may be picked is left (`avoid_tried`;
///   the call remembers up to 64 endpoints, by `id % 64`).
/// - **Membership** changes while calls run (`set_endpoints`, `add`, `remove`): a call keeps the
///   endpoint it picked to its end; a removed endpoint's state is freed after its last call.
/// - **Outlier ejection** (`outlier_ejection_options`, Envoy's names and defaults): consecutive
///   failures and success rate against the other endpoints'; an ejected endpoint comes back after its
///   ejection time, through slow start; in panic (too few left) every endpoint may be picked.
/// - A timeout listed after the balancer bounds each attempt, and its `timeout_error` counts as the
///   endpoint's failure; a cancellation counts as neither success nor failure.
///
/// A cheap copyable handle: copies share the endpoints and what is known of them; thread-safe. The
/// random source is used from every thread that picks: the default `thread_random` is safe, a
/// `seeded_random` (for tests on one loop) is not. `C` serves every use of time.
template <class E, clock C = steady_clock, random_source Random = thread_random>
class balancer : public policy_base<balancer<E, C, Random>>,
                 public detail::shared_handle<balancer<E, C, Random>, detail::balancer_state<E, C, Random>> {
    using state = detail::balancer_state<E, C, Random>;
    using handle = detail::shared_handle<balancer, state>;
    using ep = detail::endpoint_entry<E>;
    using block = detail::balancer_block<E>;
    enum class ended : unsigned char { succeeded, failed, cancelled };

public:
    using endpoint_type = E;

    /// Validates `options`: a bad value throws `std::invalid_argument` naming the field and value. The
    /// set may be empty (calls are refused with `no_endpoint_error` until endpoints are added).
    explicit balancer(std::vector<E> endpoints, balancer_options options = {}, C clock = C{},
                      Random rng = Random{})
        : handle(handle::make_state(validate(std::move(options)), std::move(endpoints), std::move(clock),
                                    std::move(rng))) {}

    // ---- membership ----

    /// The endpoints in force, in order.
    [[nodiscard]] std::vector<E> endpoints() const {
        std::lock_guard lock(held().changing);
        return endpoints_locked();
    }
    /// Replaces the set: an endpoint equal to one in force keeps its state (its latency, its
    /// ejection); a new one starts afresh, through slow start; one left out gets no new call.
    void set_endpoints(std::vector<E> next) const {
        std::lock_guard lock(held().changing);
        replace_locked(std::move(next));
    }
    /// Adds `e` at the end of the set (through slow start).
    void add(E e) const {
        std::lock_guard lock(held().changing);
        std::vector<E> next = endpoints_locked();
        next.push_back(std::move(e));
        replace_locked(std::move(next));
    }
    /// Removes the endpoints equal to `e`; false when there was none.
    bool remove(const E& e) const {
        std::lock_guard lock(held().changing);
        std::vector<E> next = endpoints_locked();
        const auto n = std::erase(next, e);
        if (n > 0)
            replace_locked(std::move(next));
        return n > 0;
    }

    // ---- what it knows ----

    /// Its `name` option.
    [[nodiscard]] std::string name() const {
        std::lock_guard lock(held().changing);
        return held().cell.locked()->options.name;
    }
    /// The endpoints in the set.
    [[nodiscard]] std::size_t size() const {
        std::lock_guard lock(held().changing);
        return held().cell.locked()->endpoints.size();
    }

    /// The endpoints ejected now (out of the set in force).
    [[nodiscard]] std::size_t ejected() const {
        std::lock_guard lock(held().changing);
        std::size_t n = 0;
        const std::int64_t now = ticks(held().clock.now());
        for (const ep* e : held().cell.locked()->endpoints)
            n += e->ejected && e->ejected_until.load(std::memory_order_relaxed) > now ? 1 : 0;
        return n;
    }
    /// Whether `e` is in the set and ejected now.
    [[nodiscard]] bool is_ejected(const E& e) const {
        std::lock_guard lock(held().changing);
        const std::int64_t now = ticks(held().clock.now());
        for (const ep* x : held().cell.locked()->endpoints)
            if (x->value == e)
                return x->ejected && x->ejected_until.load(std::memory_order_relaxed) > now;
        return false;
    }
    /// The calls in flight to `e` (zero when it is not in the set).
    [[nodiscard]] std::size_t in_flight(const E& e) const {
        std::lock_guard lock(held().changing);
        for (const ep* x : held().cell.locked()->endpoints)
            if (x->value == e)
                return static_cast<std::size_t>(x->in_flight.load(std::memory_order_relaxed));
        return 0;
    }

    /// A copy of the options in force.
    [[nodiscard]] balancer_options options() const {
        std::lock_guard lock(held().changing);
        return held().cell.locked()->options;
    }
    /// Puts `options` in force for the calls admitted from now on, checked as the constructor checks
    /// them (a bad one throws `std::invalid_argument` and nothing changes). Carried over: the endpoints
    /// and all that is known of them (latencies, ejections and their count, the current interval's
    /// calls). A new `interval` starts counting from the next interval's end under the old one.
    void reconfigure(balancer_options options) const {
        validate(options);
        state& s = held();
        std::lock_guard lock(s.changing);
        const block& b = *s.cell.locked();
        const bool had = b.options.outlier_ejection.has_value();
        if (!options.outlier_ejection)
            s.next_evaluation.store(detail::no_time, std::memory_order_relaxed);
        else if (!had)
            s.next_evaluation.store(
                detail::plus(ticks(s.clock.now()), options.outlier_ejection->interval.count()),
                std::memory_order_relaxed);
        s.refresh_due();
        s.publish_locked(std::move(options), b.endpoints);
    }

    /// `f(const E&, const context&)` or `f(const E&)` as an action: called with the attempt's endpoint.
    template <class F>
    auto bind(F f) const {
        return [f = std::move(f)](const context& ctx) {
            if constexpr (std::is_invocable_v<const F&, const E&, const context&>)
                return f(endpoint<E>(ctx), ctx);
            else
                return f(endpoint<E>(ctx));
        };
    }

    // ---- the policy protocol (see policy.hpp and docs/writing_a_policy.md) ----
    static constexpr bool enter_never_waits = true;
    static constexpr bool copied_into_calls = true;
    static constexpr bool uses_call_scratch = true; // the endpoints a call tried

    /// An attempt's endpoint: the block it was picked from (pinned, so the endpoint outlives the
    /// attempt), its place in the attempt's context, and when the attempt began.
    struct call_state {
        detail::pinned<block> held;
        ep* at = nullptr;
        std::int64_t begun = 0;
        std::optional<detail::borrowed_property_node<E>> node;
        context inner;
        void give_back() noexcept {
            if (at)
                std::exchange(at, nullptr)->in_flight.fetch_sub(1, std::memory_order_relaxed);
        }
        ~call_state() { give_back(); }
    };

    template <class R>
    resilience::entry enter(call_state& c, const context& ctx, std::optional<outcome<R>>& result) const {
        state& s = held();
        c.held = s.cell.pin();
        const balancer_options* const o = &c.held->options;
        if (ctx.stop_requested()) [[unlikely]]
            return kit::cancel(result, o->name);
        if (std::optional<failure> bad = kit::mismatch<R>(o->should_handle, "balancer", o->name)) [[unlikely]]
            return kit::refuse(result, std::move(*bad));
        const std::int64_t now = ticks(kit::call_now(s.clock, ctx));
        detail::call_scratch* tried = o->avoid_tried ? detail::context_access::scratch(ctx) : nullptr;
        if (tried)
            tried = tried->claim(&s);
        ep* const e = take(*c.held, now, tried ? tried->bits.load(std::memory_order_relaxed) : 0, &ctx);
        if (!e) [[unlikely]]
            return kit::refuse(result, failure::make(no_endpoint_error{o->name}));
        c.at = e;
        c.begun = now;
        if (tried)
            tried->bits.fetch_or(std::uint64_t{1} << (e->id % 64), std::memory_order_relaxed);
        c.node.emplace(endpoint_key<E>, detail::context_access::properties(ctx), e->value);
        c.inner = detail::context_access::derive_with_properties(ctx, &*c.node);
        return resilience::entry::proceed_in(c.inner);
    }

    template <class R>
    step leave(call_state& c, const context& ctx, outcome<R>& result) const {
        if (!c.at)
            return step::proceed;
        const std::int64_t now = ticks(kit::call_now(held().clock, ctx));
        ended how = ended::cancelled;
        if (!(result.has_failure() && is_cancellation(result.error()))) {
            try {
                how = failed_outcome(c.held->options, result, c.inner) ? ended::failed : ended::succeeded;
            } catch (...) { // the classifier threw: the call ends with that, counted neither way
                result = outcome<R>{failure::current()};
            }
        }
        ep& e = *c.at;
        c.give_back();
        finish(*c.held, e, c.begun, now, how, ctx);
        return step::proceed;
    }

    /// One endpoint for a call made outside a pipeline (a request sent by hand, a connection taken
    /// from a pool), picked as an attempt's is and counted in flight until the lease ends. Say how the
    /// call went with `succeeded()` or `failed()`: its latency and its outcome count as an attempt's. A
    /// lease dropped without either only ends the call in flight: nothing is learnt from it.
    /// Holds the balancer (a copy of the handle) and the endpoint.
    class lease {
    public:
        lease() noexcept = default;
        lease(lease&& o) noexcept
            : lb_(std::move(o.lb_)), held_(std::move(o.held_)), at_(std::exchange(o.at_, nullptr)),
              begun_(o.begun_) {}
        lease& operator=(lease&& o) noexcept {
            if (this != &o) {
                end(ended::cancelled);
                lb_ = std::move(o.lb_);
                held_ = std::move(o.held_);
                at_ = std::exchange(o.at_, nullptr);
                begun_ = o.begun_;
            }
            return *this;
        }
        ~lease() { end(ended::cancelled); }
        /// False when the set was empty: no endpoint.
        explicit operator bool() const noexcept { return at_ != nullptr; }
        /// The endpoint. Precondition: not empty.
        const E& endpoint() const noexcept { return at_->value; }
        void succeeded() { end(ended::succeeded); }
        void failed() { end(ended::failed); }

    private:
        friend class balancer;
        void end(ended how) {
            if (ep* const e = std::exchange(at_, nullptr)) {
                e->in_flight.fetch_sub(1, std::memory_order_relaxed);
                if (how != ended::cancelled)
                    lb_->finish(*held_, *e, begun_, ticks(lb_->held().clock.now()), how, context{});
            }
        }
        std::optional<balancer> lb_;
        detail::pinned<block> held_;
        ep* at_ = nullptr;
        std::int64_t begun_ = 0;
    };

    /// Picks an endpoint for a call the caller makes itself (see `lease`).
    [[nodiscard]] lease pick() const {
        lease l;
        l.held_ = held().cell.pin();
        l.begun_ = ticks(held().clock.now());
        if ((l.at_ = take(*l.held_, l.begun_, 0, nullptr)))
            l.lb_.emplace(*this);
        return l;
    }

private:
    friend struct detail::balancer_access;
    state& held() const noexcept { return handle::held(); }

    std::vector<E> endpoints_locked() const {
        std::vector<E> out;
        for (const ep* e : held().cell.locked()->endpoints)
            out.push_back(e->value);
        return out;
    }
    // `set_endpoints` under `changing`: the endpoints kept first (each once), then numbers for the new.
    void replace_locked(std::vector<E> next) const {
        state& s = held();
        const block& b = *s.cell.locked();
        const std::int64_t now = ticks(s.clock.now());
        std::vector<ep*> list(next.size(), nullptr);
        std::uint64_t used = 0;
        for (std::size_t i = 0; i < next.size(); ++i)
            for (ep* e : b.endpoints)
                if (e->value == next[i] && std::find(list.begin(), list.end(), e) == list.end()) {
                    list[i] = e;
                    used |= e->id < 64 ? std::uint64_t{1} << e->id : 0;
                    break;
                }
        std::vector<ep*> made;
        made.reserve(next.size());
        try {
            for (std::size_t i = 0; i < next.size(); ++i)
                if (!list[i]) {
                    list[i] = s.make_entry(std::move(next[i]), s.number_locked(used), b.options, now);
                    made.push_back(list[i]);
                }
            s.publish_locked(b.options, list);
        } catch (...) {
            for (ep* e : made)
                ep::drop(e);
            throw;
        }
        for (ep* e : made) // the block holds them now
            ep::drop(e);
    }

    // Picks for a call at `now`, avoiding the endpoints whose bits are in `avoid`, and counts it in
    // flight; null when the set is empty. `ctx`: the call's, for what is told meanwhile (null: none).
    RESILIENCE_DETAIL_ALWAYS_INLINE ep* take(const block& b, std::int64_t now, std::uint64_t avoid,
                                             const context* ctx) const {
        state& s = held();
        ep* e;
        if (now < s.due.load(std::memory_order_relaxed) && detail::plain_pick(b, avoid, s.ejected_count))
            [[likely]]
            e = detail::pick_plain(b, now, s.rng, s.turn);
        else
            e = take_otherwise(b, now, avoid, ctx);
        if (e)
            e->in_flight.fetch_add(1, std::memory_order_relaxed);
        return e;
    }
    // `take`'s other cases, out of line (so that its common case keeps a small frame): housekeeping
    // due, an endpoint ejected or ramping up or tried, fewer than two endpoints.
    RESILIENCE_DETAIL_NOINLINE ep* take_otherwise(const block& b, std::int64_t now, std::uint64_t avoid,
                                                  const context* ctx) const {
        state& s = held();
        if (now >= s.due.load(std::memory_order_relaxed))
            housekeep(b, now, ctx ? *ctx : context{});
        return detail::pick_endpoint(b, now, avoid, s.rng, s.turn, s.ejected_count);
    }

    // Counts a call's end on `e` (no longer in flight): its latency (a failure's at least the penalty;
    // a cancellation's only when it raises the estimate, as a lower bound), and, for ejection, whether
    // it failed.
    void finish(const block& b, ep& e, std::int64_t begun, std::int64_t now, ended how,
                const context& ctx) const {
        const balancer_options& o = b.options;
        const std::int64_t took = now > begun ? now - begun : 0;
        const double tau = static_cast<double>(o.decay_time.count());
        if (how == ended::cancelled) {
            if (detail::to_estimate(took) > detail::decayed_estimate(e, now, o.decay_time.count()))
                detail::record_latency(e, now, took, tau);
            return;
        }
        const std::int64_t penalty = o.failure_penalty.count();
        const bool failed = how == ended::failed;
        detail::record_latency(e, now, failed && penalty > took ? penalty : took, tau);
        if (o.outlier_ejection)
            judge(b, e, failed, now, ctx);
    }

    template <class TimePoint>
    static std::int64_t ticks(TimePoint t) noexcept {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
    }

    template <class R>
    static bool failed_outcome(const balancer_options& o, const outcome<R>& r, const context& ctx) {
        return o.should_handle
            .classify(
                r, [](const failure& f) { return !is_cancellation(f); }, &ctx)
            .handle;
    }

    // An ejection or a return, told once the lock is released (a callback may call back in): what it
    // says of the endpoint is copied, since the set may change as soon as the lock is released.
    struct notice {
        std::string endpoint;
        ejection_event::cause why;
        int times;
        std::chrono::nanoseconds duration;
    };
    static notice noticed(const ep& e, ejection_event::cause why, std::chrono::nanoseconds d) {
        return {e.text, why, e.times_ejected, d};
    }

    // Counts the call's end for the endpoint's ejection: a run of failures ejects it at once.
    void judge(const block& b, ep& e, bool failed, std::int64_t now, const context& ctx) const {
        const outlier_ejection_options& x = *b.options.outlier_ejection;
        e.calls.fetch_add(1, std::memory_order_relaxed);
        if (!failed) {
            e.successes.fetch_add(1, std::memory_order_relaxed);
            e.consecutive.store(0, std::memory_order_relaxed);
        } else if (const int run = e.consecutive.fetch_add(1, std::memory_order_relaxed) + 1;
                   x.consecutive_failures > 0 && run >= x.consecutive_failures) {
            std::optional<notice> heard;
            {
                state& s = held();
                std::lock_guard lock(s.changing);
                if (contains(*s.cell.locked(), e)) {
                    const std::chrono::nanoseconds d = s.eject_locked(e, *s.cell.locked(), now, x);
                    if (d.count() > 0)
                        heard.emplace(noticed(e, ejection_event::cause::consecutive_failures, d));
                    else // out already, or too many out: a new run starts, as in Envoy
                        e.consecutive.store(0, std::memory_order_relaxed);
                }
            }
            if (heard)
                tell(b.options, *heard, ctx);
        }
        if (now >= held().due.load(std::memory_order_relaxed)) [[unlikely]]
            housekeep(b, now, ctx);
    }

    static bool contains(const block& b, const ep& e) noexcept {
        return std::find(b.endpoints.begin(), b.endpoints.end(), &e) != b.endpoints.end();
    }

    // Returns the endpoints whose ejection is over, and compares success rates at an interval's end;
    // told under the options of `mine`, the block the call holds.
    RESILIENCE_DETAIL_NOINLINE void housekeep(const block& mine, std::int64_t now, const context& ctx) const {
        std::vector<notice> heard;
        {
            state& s = held();
            std::lock_guard lock(s.changing);
            const block& b = *s.cell.locked();
            s.settle_returns_locked(
                b, now, [&](ep& e) { heard.push_back(noticed(e, ejection_event::cause::returned, {})); });
            if (b.options.outlier_ejection)
                s.evaluate_locked(b, now, [&](ep& e, std::chrono::nanoseconds d) {
                    heard.push_back(noticed(e, ejection_event::cause::success_rate, d));
                });
        }
        for (const notice& n : heard)
            tell(mine.options, n, ctx);
    }

    // The callback and the listener hear an ejection or a return; what they throw is dropped.
    void tell(const balancer_options& o, const notice& n, const context& ctx) const {
        if (o.on_ejection)
            (void)kit::invoke_callback(o.on_ejection,
                                       ejection_event{o.name, n.endpoint, n.why, n.times, n.duration});
        if (const kit::listener l = kit::listener_for(o.telemetry, ctx)) {
            const bool back = n.why == ejection_event::cause::returned;
            telemetry_event ev =
                kit::event(back ? telemetry_kind::endpoint_returned : telemetry_kind::endpoint_ejected,
                           "balancer", o.name, ctx.attempt(), n.duration);
            ev.note = back ? std::string_view{} : std::string_view{to_string(n.why)};
            ev.endpoint = n.endpoint;
            (void)kit::emit(l, held().clock, ev);
        }
    }

    static balancer_options validate(balancer_options o) {
        const auto fail = [&](const char* field, const std::string& rule, const std::string& got) {
            throw std::invalid_argument(detail::policy_label("balancer", o.name) + ": " + field + ' ' + rule +
                                        ", got " + got);
        };
        const auto ns = [](std::chrono::nanoseconds d) { return std::to_string(d.count()) + "ns"; };
        if (o.decay_time.count() <= 0)
            fail("decay_time", "must be positive", ns(o.decay_time));
        if (o.initial_latency.count() <= 0)
            fail("initial_latency", "must be positive", ns(o.initial_latency));
        if (o.failure_penalty.count() < 0)
            fail("failure_penalty", "must not be negative", ns(o.failure_penalty));
        if (o.slow_start_window.count() < 0)
            fail("slow_start_window", "must not be negative", ns(o.slow_start_window));
        if (!(o.slow_start_min_weight > 0.0 && o.slow_start_min_weight <= 1.0))
            fail("slow_start_min_weight", "must be in (0, 1]", std::to_string(o.slow_start_min_weight));
        if (o.pick != balance_pick::least_loaded && o.pick != balance_pick::round_robin &&
            o.pick != balance_pick::random)
            fail("pick", "must be a balance_pick", std::to_string(static_cast<int>(o.pick)));
        if (const auto& x = o.outlier_ejection) {
            if (x->consecutive_failures < 0)
                fail("outlier_ejection.consecutive_failures", "must not be negative",
                     std::to_string(x->consecutive_failures));
            if (x->interval.count() <= 0)
                fail("outlier_ejection.interval", "must be positive", ns(x->interval));
            if (x->base_ejection_time.count() <= 0)
                fail("outlier_ejection.base_ejection_time", "must be positive", ns(x->base_ejection_time));
            if (x->max_ejection_time.count() <= 0)
                fail("outlier_ejection.max_ejection_time", "must be positive", ns(x->max_ejection_time));
            if (!(x->max_ejection_percent >= 0.0 && x->max_ejection_percent <= 100.0))
                fail("outlier_ejection.max_ejection_percent", "must be in [0, 100]",
                     std::to_string(x->max_ejection_percent));
            if (!(x->panic_threshold_percent >= 0.0 && x->panic_threshold_percent <= 100.0))
                fail("outlier_ejection.panic_threshold_percent", "must be in [0, 100]",
                     std::to_string(x->panic_threshold_percent));
            if (std::isnan(x->success_rate_stdev_factor))
                fail("outlier_ejection.success_rate_stdev_factor", "must be a number", "nan");
            if (x->success_rate_request_volume <= 0)
                fail("outlier_ejection.success_rate_request_volume", "must be positive",
                     std::to_string(x->success_rate_request_volume));
            if (x->success_rate_minimum_hosts <= 0)
                fail("outlier_ejection.success_rate_minimum_hosts", "must be positive",
                     std::to_string(x->success_rate_minimum_hosts));
        }
        return o;
    }
};

} // namespace resilience
