// SPDX-License-Identifier: MIT
// Reference models of the stateful policies, written from their documentation (docs/*.md), and
// runners that play one scenario through the real policy on virtual time. The model tests
// (tests/test_model_*.cpp) and the model fuzzer (fuzz/) compare the two traces event by event.
//
// A scenario is a list of calls, each arriving at an instant. The models decide everything in
// whole nanoseconds. Where the documentation leaves the order of two things at one instant open,
// the scenarios avoid the tie, except for this one rule of the simulation, which the models follow:
// every arrival and every caller's stop is a timer armed when the scenario starts, before any timer
// a policy arms, so at one instant arrivals come first (in call order), then stops (in call order),
// then whatever the policy had scheduled for that instant. Arrivals are never at 0, so that all of
// them are armed before the policies start. Reconfigurations of a policy (the `*_reconfigured`
// checks) are timers armed the same way, after the stops: at one instant they come after the stops
// and before anything the policy scheduled.
#pragma once

#include "loopless_clock.hpp"

#include <resilience/adaptive_throttle.hpp>
#include <resilience/any_policy.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/circuit_breaker.hpp>
#include <resilience/outcome.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/random.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/retry.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/task.hpp>
#include <resilience/telemetry.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace resilience_models {

namespace rs = resilience;
using ns = std::int64_t; // nanoseconds: every instant and duration of the models

/// One thing that happened to one call, at one instant.
struct event {
    event() = default;
    event(int c, ns t, std::string w, ns r = -1, std::string d = {})
        : call(c), at(t), what(std::move(w)), retry_after(r), detail(std::move(d)) {}

    int call = 0;
    ns at = 0;
    std::string what;    // "admitted", "rate_limited", "bulkhead_rejected", "cancelled", "value", ...
    ns retry_after = -1; // for refusals that carry one; -1 otherwise
    std::string detail;  // a reason, a state name: whatever else the policy reports

    bool operator==(const event&) const = default;
};

inline std::string to_string(const std::vector<event>& trace) {
    std::ostringstream out;
    for (const event& e : trace) {
        out << "  call " << e.call << " at " << e.at << "ns: " << e.what;
        if (e.retry_after >= 0)
            out << " retry_after=" << e.retry_after << "ns";
        if (!e.detail.empty())
            out << " (" << e.detail << ")";
        out << '\n';
    }
    return out.str();
}

/// What a listener heard, in a trace's shape: no call (events do not name one), the duration in
/// `retry_after`, the reason of a rejection in `detail`.
inline event heard_event(ns at, std::string what, ns duration, std::string reason = {}) {
    return {-1, at, std::move(what), duration, std::move(reason)};
}

/// Events sorted by instant, then call: the order two implementations agree on.
inline std::vector<event> sorted(std::vector<event> trace) {
    std::stable_sort(trace.begin(), trace.end(), [](const event& a, const event& b) {
        return std::tie(a.at, a.call) < std::tie(b.at, b.call);
    });
    return trace;
}

/// How many scenarios a model test runs: `RESILIENCE_MODEL_SCENARIOS` when set (scripts/dev model N),
/// else `fallback`.
inline int scenario_count(int fallback) {
    if (const char* v = std::getenv("RESILIENCE_MODEL_SCENARIOS")) {
        const long n = std::strtol(v, nullptr, 10);
        if (n > 0)
            return static_cast<int>(std::min(n, 100'000'000L));
    }
    return fallback;
}

/// The seed of scenario `i`: `RESILIENCE_MODEL_SEED` (to replay one) or a fixed base plus `i`.
inline std::uint64_t scenario_seed(int i) {
    if (const char* v = std::getenv("RESILIENCE_MODEL_SEED"))
        return std::strtoull(v, nullptr, 10) + static_cast<std::uint64_t>(i);
    return 0x5eed'0000ULL + static_cast<std::uint64_t>(i);
}

/// A small deterministic source of choices, from a seed (tests) or from bytes (the fuzzer).
class chooser {
public:
    explicit chooser(std::uint64_t seed) : rng_(seed) {}
    chooser(const std::uint8_t* data, std::size_t size) : bytes_(data), size_(size), from_bytes_(true) {}

    /// A number in [lo, hi].
    std::int64_t between(std::int64_t lo, std::int64_t hi) {
        if (hi <= lo)
            return lo;
        const auto span = static_cast<std::uint64_t>(hi - lo) + 1;
        return lo + static_cast<std::int64_t>(next() % span);
    }
    bool coin(int percent) { return between(0, 99) < percent; }
    template <class T, std::size_t N>
    const T& pick(const T (&items)[N]) {
        return items[static_cast<std::size_t>(between(0, static_cast<std::int64_t>(N) - 1))];
    }

private:
    std::uint64_t next() {
        if (!from_bytes_)
            return rng_();
        std::uint64_t v = 0;
        for (int i = 0; i < 4; ++i) {
            v <<= 8;
            if (at_ < size_)
                v |= bytes_[at_++];
        }
        return v;
    }

    std::mt19937_64 rng_{0};
    const std::uint8_t* bytes_ = nullptr;
    std::size_t size_ = 0, at_ = 0;
    bool from_bytes_ = false;
};

inline ns ceil_div(ns a, ns b) {
    ns q = a / b;
    if (a % b != 0 && ((a < 0) == (b < 0)))
        ++q;
    return q;
}

/// Something done to a policy at an instant of a scenario (a reconfiguration).
struct timed_action {
    ns at = 0;
    std::function<void()> act;
};

/// Plays `calls` through a real policy on `sim`'s virtual time and returns what `step` wrote down.
/// `step(out, id, call, stop)` makes call `id` through the policy, with `stop` as its caller's token,
/// and writes down what happened; it returns an `rs::task<void>`. Calls with an `arrive` instant run
/// at once, each from its own instant, and a call with a `stop_at` instant has its caller stop then
/// (every arrival and stop is a timer armed before the policy runs: see the top of this file), then
/// each of `actions` at its instant (armed after the stops). Calls with a `gap` run one after
/// another, each `gap` after the previous one ended, never stopped.
template <class Call, class Step>
std::vector<event> run_calls(rs::testing::simulation& sim, const std::vector<Call>& calls, Step step,
                             const std::vector<timed_action>& actions = {}) {
    std::vector<event> out;
    if constexpr (requires(const Call& c) { c.arrive; }) {
        std::vector<resilience::stop_source> stops(calls.size());
        const auto client = [&](std::size_t i) -> rs::task<void> {
            co_await sim.sleep_for(std::chrono::nanoseconds{calls[i].arrive});
            const resilience::stop_token stop = stops[i].get_token();
            co_await step(out, static_cast<int>(i), calls[i], stop);
        };
        const auto stopper = [&](std::size_t i) -> rs::task<void> {
            co_await sim.sleep_for(std::chrono::nanoseconds{*calls[i].stop_at});
            stops[i].request_stop();
        };
        for (std::size_t i = 0; i < calls.size(); ++i)
            sim.spawn(client(i));
        for (std::size_t i = 0; i < calls.size(); ++i)
            if (calls[i].stop_at)
                sim.spawn(stopper(i));
        const auto actor = [&](const timed_action& a) -> rs::task<void> {
            co_await sim.sleep_for(std::chrono::nanoseconds{a.at});
            a.act();
        };
        for (const timed_action& a : actions)
            sim.spawn(actor(a));
        sim.run_all();
    } else {
        sim.run([&]() -> rs::task<void> {
            const resilience::stop_token never;
            for (std::size_t i = 0; i < calls.size(); ++i) {
                if (calls[i].gap > 0)
                    co_await sim.sleep_for(std::chrono::nanoseconds{calls[i].gap});
                co_await step(out, static_cast<int>(i), calls[i], never);
            }
        }());
    }
    return out;
}

/// The instants at which concurrent calls arrive and their callers stop, each as (instant, call), in the
/// order the simulation fires them: by instant, then by call.
struct call_instants {
    std::vector<std::pair<ns, int>> arrivals, stops;
};
template <class Call>
call_instants instants_of(const std::vector<Call>& calls) {
    call_instants out;
    for (std::size_t i = 0; i < calls.size(); ++i) {
        out.arrivals.emplace_back(calls[i].arrive, static_cast<int>(i));
        if (calls[i].stop_at)
            out.stops.emplace_back(*calls[i].stop_at, static_cast<int>(i));
    }
    std::stable_sort(out.arrivals.begin(), out.arrivals.end());
    std::stable_sort(out.stops.begin(), out.stops.end());
    return out;
}

// ---------------------------------------------------------------------------------------------------------
// Limiters (docs/rate_limiter.md): arrivals, a FIFO queue whose front waiter is served as soon as a
// permit is due, queue_limit, queue_timeout, a caller's stop, and retry_after counting the waiters ahead.

struct limiter_call {
    ns arrive = 1;
    std::optional<ns> stop_at{}; // the caller stops waiting at this instant (if still waiting)
};

/// The counting half of a limiter model: when permits are there.
///
/// The bucket's instants are doubles, as the documentation of the bucket keeps them: whole
/// nanoseconds stay exact (below 2^53), and the arithmetic of a reconfiguration, which may leave a
/// fraction of a token, is the one the documentation states. A due time is rounded up to a whole
/// nanosecond; a full bucket keeps less than a nanosecond of overflow (limiter/token_bucket.hpp).
struct token_bucket_meter {
    double capacity, interval, empty_at;
    token_bucket_meter(ns tokens, ns interval_ns)
        : capacity(static_cast<double>(tokens)), interval(static_cast<double>(interval_ns)),
          empty_at(-static_cast<double>(tokens) * static_cast<double>(interval_ns)) {}

    // The bucket holds (now - empty_at) / interval tokens, at most `capacity`.
    void refill(ns now) {
        const double full_since = static_cast<double>(now) - capacity * interval;
        if (full_since - empty_at >= 1.0)
            empty_at = full_since;
    }
    bool try_take(ns now) {
        refill(now);
        if (static_cast<double>(now) < empty_at + interval)
            return false;
        empty_at += interval;
        return true;
    }
    ns available_at(ns now, std::size_t ahead) {
        refill(now);
        const double at =
            std::max(static_cast<double>(now), empty_at + static_cast<double>(ahead + 1) * interval);
        return static_cast<ns>(std::ceil(at));
    }
    // rate_limiter::reconfigure: the tokens earned up to `now`, counted at the old rate (a full
    // bucket holds the old capacity), are kept, capped at the new capacity; from `now` on they
    // accrue at the new rate. Kept as a span of time at the old rate, scaled to the new one.
    void reconfigure(ns tokens, ns interval_ns, ns now) {
        refill(now);
        const double t = static_cast<double>(now), new_capacity = static_cast<double>(tokens),
                     new_interval = static_cast<double>(interval_ns);
        const double earned = std::max(t - empty_at, 0.0);
        if (earned / interval > new_capacity)
            empty_at = t - new_capacity * new_interval;
        else if (new_interval != interval)
            empty_at = t - earned * (new_interval / interval);
        capacity = new_capacity;
        interval = new_interval;
    }
};

struct sliding_window_meter {
    ns limit, window, segment;
    std::vector<ns> returns; // when each permit in use comes back
    sliding_window_meter(ns permits, ns window_ns, ns segments)
        : limit(permits), window(window_ns), segment(window_ns / segments) {}

    // A permit taken at t is counted at the segment boundary at or after t and comes back a window later.
    ns return_of(ns taken) const { return ceil_div(taken, segment) * segment + window; }
    void expire(ns now) {
        std::erase_if(returns, [now](ns r) { return r <= now; });
    }
    bool try_take(ns now) {
        expire(now);
        if (static_cast<ns>(returns.size()) >= limit)
            return false;
        returns.push_back(return_of(now));
        return true;
    }
    // The callers ahead, then this one, each take the permit that is there first. With more permits
    // in use than the limit (it was lowered), the first ones to come back free nothing.
    ns available_at(ns now, std::size_t ahead) {
        expire(now);
        std::vector<ns> when(returns);
        std::sort(when.begin(), when.end());
        if (static_cast<ns>(when.size()) > limit)
            when.erase(when.begin(), when.end() - limit);
        for (ns i = static_cast<ns>(when.size()); i < limit; ++i)
            when.push_back(now);
        ns at = now;
        for (std::size_t k = 0; k <= ahead; ++k) {
            auto first = std::min_element(when.begin(), when.end());
            at = std::max(now, *first);
            *first = return_of(at);
        }
        return at;
    }
    // sliding_window_limiter::reconfigure: the permits in use stay. Each is counted again on the new
    // grid, at the boundary at or after the one it was counted at but no later than the boundary at
    // or after `now`, and comes back a new window after that (with the same grid: when it would
    // have); one that is then back already is gone.
    void reconfigure(ns permits, ns window_ns, ns segments, ns now) {
        expire(now);
        const ns new_segment = window_ns / segments;
        const ns latest = ceil_div(now, new_segment) * new_segment;
        std::vector<ns> moved;
        for (const ns r : returns) {
            const ns counted = std::min(ceil_div(r - window, new_segment) * new_segment, latest);
            if (counted + window_ns > now)
                moved.push_back(counted + window_ns);
        }
        returns = std::move(moved);
        limit = permits;
        window = window_ns;
        segment = new_segment;
    }
};

/// A reconfiguration of a limiter at an instant: `meter(m, now)` gives the meter its new parameters;
/// the queue's are set, `queue_timeout` for the callers queued from then on.
template <class Meter>
struct limiter_change {
    ns at = 0;
    std::function<void(Meter&, ns)> meter;
    std::size_t queue_limit = 0;
    std::optional<ns> queue_timeout{};
};

/// The waiting half, the same for both limiters. With `heard`, also what a listener of the limiter
/// hears (see `heard_event`): a `queue_wait` for each call admitted after it found no permit, and a
/// `rejection` for each refusal, each with the time waited since the call found none. `changes`
/// (in order of their instants) reconfigure it: the waiters stay queued, with their deadlines, and
/// the front one is served by the new meter from that instant.
template <class Meter>
std::vector<event> model_limiter(Meter meter, std::size_t queue_limit, std::optional<ns> queue_timeout,
                                 const std::vector<limiter_call>& calls, std::vector<event>* heard = nullptr,
                                 const std::vector<limiter_change<Meter>>& changes = {}) {
    std::vector<event> out;
    struct waiter {
        int call;
        ns deadline;
    };
    std::deque<waiter> queue;
    const ns forever = INT64_MAX;
    const auto hear = [&](ns now, int call, const char* what, const char* reason = "") {
        if (heard)
            heard->push_back(
                heard_event(now, what, now - calls[static_cast<std::size_t>(call)].arrive, reason));
    };
    const auto refused = [&](int call, ns now, std::size_t ahead, const char* reason) {
        out.push_back({call, now, "rate_limited", meter.available_at(now, ahead) - now, reason});
        hear(now, call, "rejection", reason);
    };
    // Serves the front waiter at `now` until one must wait; returns when it wants to be woken.
    const auto serve = [&](ns now) -> ns {
        while (!queue.empty()) {
            waiter& head = queue.front();
            if (meter.try_take(now)) {
                out.push_back({head.call, now, "admitted"});
                hear(now, head.call, "queue_wait");
                queue.pop_front();
                continue;
            }
            const ns due = meter.available_at(now, 0);
            if (now >= head.deadline) {
                out.push_back({head.call, now, "rate_limited", due - now, "queue_timeout"});
                hear(now, head.call, "rejection", "queue_timeout");
                queue.pop_front();
                continue;
            }
            return std::min(due, head.deadline);
        }
        return forever;
    };

    const call_instants instants = instants_of(calls);
    const auto& arrivals = instants.arrivals;
    const auto& stops = instants.stops;
    std::size_t a = 0, s = 0, c = 0;
    ns wake = forever;
    for (;;) {
        ns now = wake;
        if (a < arrivals.size())
            now = std::min(now, arrivals[a].first);
        if (s < stops.size())
            now = std::min(now, stops[s].first);
        if (c < changes.size())
            now = std::min(now, changes[c].at);
        if (now == forever)
            break;
        for (; a < arrivals.size() && arrivals[a].first == now; ++a) {
            const int id = arrivals[a].second;
            if (queue.empty() && meter.try_take(now)) {
                out.push_back({id, now, "admitted"});
            } else if (queue.size() >= queue_limit) {
                refused(id, now, queue.size(), queue_limit == 0 ? "no_capacity" : "queue_full");
            } else {
                const ns deadline = queue_timeout ? now + *queue_timeout : forever;
                queue.push_back({id, deadline});
            }
        }
        for (; s < stops.size() && stops[s].first == now; ++s) {
            const int id = stops[s].second;
            auto it =
                std::find_if(queue.begin(), queue.end(), [id](const waiter& w) { return w.call == id; });
            if (it != queue.end()) {
                out.push_back({id, now, "cancelled"});
                queue.erase(it);
            }
        }
        for (; c < changes.size() && changes[c].at == now; ++c) {
            changes[c].meter(meter, now);
            queue_limit = changes[c].queue_limit;
            queue_timeout = changes[c].queue_timeout;
        }
        wake = serve(now);
    }
    return out;
}

inline std::string reason_name(rs::rejection_reason r) {
    switch (r) {
    case rs::rejection_reason::no_capacity:
        return "no_capacity";
    case rs::rejection_reason::queue_full:
        return "queue_full";
    case rs::rejection_reason::queue_timeout:
        return "queue_timeout";
    case rs::rejection_reason::shed:
        return "shed";
    case rs::rejection_reason::circuit_open:
    case rs::rejection_reason::circuit_isolated:
    case rs::rejection_reason::throttled:
        break; // not a limiter's or a bulkhead's
    }
    return "?";
}

// ---------------------------------------------------------------------------------------------------------
// How a scenario reaches a bulkhead or a limiter. Its trace must not depend on the route: called
// directly; with a listener of the policy's own (the wait is then timed); with the listener of a
// `telemetry` stage in front (found in the call's context); through `any_policy` (the policy's
// waiting `run`), with or without a listener of its own; or behind a timeout that never fires.
// Where a listener hears the calls, what it hears is compared with the model's too.

enum class route { direct, own_listener, telemetry_stage, any_policy, any_policy_listener, behind_timeout };

inline route route_of(chooser& pick) {
    return static_cast<route>(pick.between(0, 5));
}
inline bool own_listener(route r) {
    return r == route::own_listener || r == route::any_policy_listener;
}
inline bool listens(route r) {
    return own_listener(r) || r == route::telemetry_stage;
}
inline const char* route_name(route r) {
    switch (r) {
    case route::direct:
        return "direct";
    case route::own_listener:
        return "own_listener";
    case route::telemetry_stage:
        return "telemetry_stage";
    case route::any_policy:
        return "any_policy";
    case route::any_policy_listener:
        return "any_policy_listener";
    case route::behind_timeout:
        return "behind_timeout";
    }
    return "?";
}

/// Writes down the queue waits and rejections a bulkhead or a limiter reports, as `heard_event`s
/// (stamped with the event's own `at`).
inline rs::telemetry_listener recorder(std::vector<event>& heard) {
    return [&heard](const rs::telemetry_event& e) {
        if (e.kind == rs::telemetry_kind::queue_wait)
            heard.push_back(heard_event(e.at.count(), "queue_wait", e.duration.count()));
        else if (e.kind == rs::telemetry_kind::rejection)
            heard.push_back(
                heard_event(e.at.count(), "rejection", e.duration.count(), rs::to_string(e.reason)));
    };
}

/// Heard events in one order whatever the order of reports at one instant.
inline std::vector<event> sorted_heard(std::vector<event> heard) {
    std::sort(heard.begin(), heard.end(), [](const event& a, const event& b) {
        return std::tie(a.at, a.what, a.retry_after, a.detail) <
               std::tie(b.at, b.what, b.retry_after, b.detail);
    });
    return heard;
}

/// `run(p)` with `p` the policy reached by route `r` (actions producing `T`); a `telemetry` stage
/// writes into `heard`.
template <class T, class Policy, class Run>
std::vector<event> run_routed(rs::testing::simulation& sim, route r, const Policy& policy,
                              std::vector<event>& heard, Run run) {
    switch (r) {
    case route::telemetry_stage:
        return run(rs::pipeline{rs::telemetry{recorder(heard), sim.clock()}, policy});
    case route::any_policy:
    case route::any_policy_listener:
        return run(rs::any_policy<T>{policy});
    case route::behind_timeout:
        return run(rs::pipeline{rs::timeout{std::chrono::hours{1}, sim.clock()}, policy});
    default:
        return run(policy);
    }
}

/// Plays `calls` through `limiter` (built on `sim`'s clock) and writes down how each call was admitted.
template <class Limiter>
std::vector<event> run_limiter(rs::testing::simulation& sim, const Limiter& limiter,
                               const std::vector<limiter_call>& calls,
                               const std::vector<timed_action>& changes = {}) {
    return run_calls(
        sim, calls,
        [&](std::vector<event>& out, int id, const limiter_call&,
            resilience::stop_token stop) -> rs::task<void> {
            auto action = [&out, &sim, id]() -> rs::task<void> {
                out.push_back({id, sim.now().count(), "admitted"});
                co_return;
            };
            const auto r = co_await limiter.execute_outcome(std::move(action), stop);
            if (r.has_value())
                co_return;
            if (auto* e = r.error().template as<rs::rate_limited_error>())
                out.push_back({id, sim.now().count(), "rate_limited", e->retry_after().count(),
                               reason_name(e->reason())});
            else if (rs::is_cancellation(r.error()))
                out.push_back({id, sim.now().count(), "cancelled"});
            else
                out.push_back({id, sim.now().count(), "unexpected failure"});
        },
        changes);
}

// ---------------------------------------------------------------------------------------------------------
// Bulkhead (docs/bulkhead.md): at most N calls run at once; others wait in arrival order, up to
// queue_limit, for at most queue_timeout, or until their caller stops.

struct bulkhead_call {
    ns arrive = 1;
    ns hold = 0; // how long the action runs once admitted
    std::optional<ns> stop_at{};
};

/// A reconfiguration of a bulkhead at an instant (bulkhead::reconfigure): nobody admitted or queued
/// leaves; a larger limit admits the front waiters at once, a smaller one nobody new until the
/// calls running are under it; `queue_timeout` for the callers queued from then on.
struct bulkhead_change {
    ns at = 0;
    std::size_t slots = 1;
    std::size_t queue_limit = 0;
    std::optional<ns> queue_timeout{};
};

/// With `heard`, also what a listener of the bulkhead hears, as `model_limiter`'s. `changes` in
/// order of their instants.
inline std::vector<event> model_bulkhead(std::size_t slots, std::size_t queue_limit,
                                         std::optional<ns> queue_timeout,
                                         const std::vector<bulkhead_call>& calls,
                                         std::vector<event>* heard = nullptr,
                                         const std::vector<bulkhead_change>& changes = {}) {
    std::vector<event> out;
    const auto hear = [&](ns now, int call, const char* what, const char* reason = "") {
        if (heard)
            heard->push_back(
                heard_event(now, what, now - calls[static_cast<std::size_t>(call)].arrive, reason));
    };
    struct waiter {
        int call;
        ns deadline;
    };
    std::deque<waiter> queue;
    std::vector<std::pair<ns, int>> running; // (ends at, call), in admission order
    std::size_t busy = 0;
    const ns forever = INT64_MAX;
    const auto admit = [&](int id, ns now) {
        ++busy;
        out.push_back({id, now, "admitted"});
        running.emplace_back(now + calls[static_cast<std::size_t>(id)].hold, id);
    };

    const call_instants instants = instants_of(calls);
    const auto& arrivals = instants.arrivals;
    const auto& stops = instants.stops;
    std::size_t a = 0, s = 0, c = 0;
    for (;;) {
        ns now = forever;
        if (a < arrivals.size())
            now = std::min(now, arrivals[a].first);
        if (s < stops.size())
            now = std::min(now, stops[s].first);
        if (c < changes.size())
            now = std::min(now, changes[c].at);
        for (auto& r : running)
            now = std::min(now, r.first);
        for (auto& w : queue)
            now = std::min(now, w.deadline);
        if (now == forever)
            break;
        for (; a < arrivals.size() && arrivals[a].first == now; ++a) {
            const int id = arrivals[a].second;
            if (queue.empty() && busy < slots)
                admit(id, now);
            else if (queue.size() >= queue_limit) {
                const char* reason = queue_limit == 0 ? "no_capacity" : "queue_full";
                out.push_back({id, now, "bulkhead_rejected", -1, reason});
                hear(now, id, "rejection", reason);
            } else
                queue.push_back({id, queue_timeout ? now + *queue_timeout : forever});
        }
        for (; s < stops.size() && stops[s].first == now; ++s) {
            const int id = stops[s].second;
            auto it =
                std::find_if(queue.begin(), queue.end(), [id](const waiter& w) { return w.call == id; });
            if (it != queue.end()) {
                out.push_back({id, now, "cancelled"});
                queue.erase(it);
            }
        }
        for (; c < changes.size() && changes[c].at == now; ++c) {
            slots = changes[c].slots;
            queue_limit = changes[c].queue_limit;
            queue_timeout = changes[c].queue_timeout;
            while (!queue.empty() && busy < slots) {
                const int next = queue.front().call;
                queue.pop_front();
                admit(next, now);
                hear(now, next, "queue_wait");
            }
        }
        // Calls ending now free their slots, each handed to the front waiter at once (unless the
        // limit shrank below the calls still running).
        for (std::size_t i = 0; i < running.size();) {
            if (running[i].first != now) {
                ++i;
                continue;
            }
            out.push_back({running[i].second, now, "value"});
            running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
            --busy;
            if (!queue.empty() && busy < slots) {
                const int next = queue.front().call;
                queue.pop_front();
                admit(next, now);
                hear(now, next, "queue_wait");
            }
        }
        // Waiters whose time ran out leave.
        for (auto it = queue.begin(); it != queue.end();) {
            if (it->deadline == now) {
                out.push_back({it->call, now, "bulkhead_rejected", -1, "queue_timeout"});
                hear(now, it->call, "rejection", "queue_timeout");
                it = queue.erase(it);
            } else {
                ++it;
            }
        }
    }
    return out;
}

template <class Bulkhead>
std::vector<event> run_bulkhead(rs::testing::simulation& sim, const Bulkhead& bulkhead,
                                const std::vector<bulkhead_call>& calls,
                                const std::vector<timed_action>& changes = {}) {
    return run_calls(
        sim, calls,
        [&](std::vector<event>& out, int id, const bulkhead_call& c,
            resilience::stop_token stop) -> rs::task<void> {
            auto action = [&out, &sim, id, hold = c.hold]() -> rs::task<int> {
                out.push_back({id, sim.now().count(), "admitted"});
                co_await sim.sleep_for(std::chrono::nanoseconds{hold}); // ignores stop: it holds its slot
                co_return id;
            };
            const auto r = co_await bulkhead.execute_outcome(std::move(action), stop);
            if (r.has_value())
                out.push_back({id, sim.now().count(), "value"});
            else if (auto* e = r.error().template as<rs::bulkhead_rejected_error>())
                out.push_back({id, sim.now().count(), "bulkhead_rejected", -1, reason_name(e->reason())});
            else if (rs::is_cancellation(r.error()))
                out.push_back({id, sim.now().count(), "cancelled"});
            else
                out.push_back({id, sim.now().count(), "unexpected failure"});
        },
        changes);
}

// ---------------------------------------------------------------------------------------------------------
// Circuit breaker (docs/circuit_breaker.md), calls one after another: closed until `threshold`
// failures in a row, or until a window's failure or slow-call share reaches its ratio (with at least
// `minimum_throughput` calls in it); open for break_duration * growth^(n-1) (capped) after the n-th
// opening in a row, refusing with retry_after = the time left; then half-open, admitting `probes`
// calls, all of which must succeed (and, with a slow-call ratio, not slowly) to close it; any
// failure opens it again. The window holds only calls recorded while closed and is emptied when
// the circuit closes.
//
// The window is kept here as the list of recorded calls, not in segments: a count window is the
// last `calls` of them; a time window counts a call recorded at t while
// floor(now / width) - floor(t / width) < segments, width = window / segments (rounded
// down), segments aligned to the clock's epoch.

struct breaker_call {
    ns gap = 0;     // idle time before the call starts, after the previous one ended
    ns latency = 0; // how long it runs
    bool fails = false;
};

struct breaker_window_setup {
    std::optional<int> size{};    // a count window
    std::optional<ns> sampling{}; // or a time window
    int segments = 10;
    int minimum_throughput = 1;
    std::optional<double> failure_ratio{};
    std::optional<ns> slow_call_duration{};
    std::optional<double> slow_call_ratio{};
};

struct breaker_setup {
    int threshold = 1; // 0: no consecutive-failure rule
    ns break_duration = 1;
    double growth = 1.0;
    std::optional<ns> max_break{};
    int probes = 1;
    std::optional<breaker_window_setup> window{};
};

struct model_recorded_call {
    ns at;
    bool failed, slow;
};

// The calls the window holds at `now`.
inline std::vector<model_recorded_call>
model_window_calls(const breaker_window_setup& w, const std::vector<model_recorded_call>& recorded, ns now) {
    std::vector<model_recorded_call> held;
    if (w.size) {
        const std::size_t n = static_cast<std::size_t>(*w.size);
        const std::size_t from = recorded.size() > n ? recorded.size() - n : 0;
        held.assign(recorded.begin() + static_cast<std::ptrdiff_t>(from), recorded.end());
        return held;
    }
    const ns width = *w.sampling / w.segments;
    for (const auto& r : recorded)
        if (now / width - r.at / width < w.segments)
            held.push_back(r);
    return held;
}

inline ns model_break_for(const breaker_setup& b, int opens) {
    long double d = static_cast<long double>(b.break_duration);
    for (int i = 1; i < opens; ++i)
        d *= static_cast<long double>(b.growth);
    const ns cap = b.max_break.value_or(INT64_MAX);
    return d >= static_cast<long double>(cap) ? cap : static_cast<ns>(d);
}

inline std::vector<event> model_breaker(const breaker_setup& b, const std::vector<breaker_call>& calls) {
    std::vector<event> out;
    enum { closed, open, half_open } state = closed;
    int run = 0, opens = 0, probes_passed = 0;
    ns open_until = 0, now = 0;
    const auto state_name = [&](ns t) -> std::string {
        if (state == open && t >= open_until)
            return "half_open";
        return state == closed ? "closed" : state == open ? "open" : "half_open";
    };
    const auto open_at = [&](ns t) {
        ++opens;
        state = open;
        open_until = t + model_break_for(b, opens);
        probes_passed = 0;
    };
    std::vector<model_recorded_call> recorded;
    // After a call recorded while closed: does the window's share open the circuit?
    const auto window_opens = [&](ns t) {
        if (!b.window)
            return false;
        const breaker_window_setup& w = *b.window;
        const auto held = model_window_calls(w, recorded, t);
        if (static_cast<int>(held.size()) < w.minimum_throughput)
            return false;
        const auto failures = std::count_if(held.begin(), held.end(), [](const auto& r) { return r.failed; });
        const auto slow = std::count_if(held.begin(), held.end(), [](const auto& r) { return r.slow; });
        const double total = static_cast<double>(held.size());
        // The share as one division, as the documentation says.
        if (w.failure_ratio && failures > 0 && static_cast<double>(failures) / total >= *w.failure_ratio)
            return true;
        return w.slow_call_ratio && slow > 0 && static_cast<double>(slow) / total >= *w.slow_call_ratio;
    };
    for (std::size_t i = 0; i < calls.size(); ++i) {
        const breaker_call& c = calls[i];
        const int id = static_cast<int>(i);
        now += c.gap;
        if (state == open && now >= open_until)
            state = half_open;
        if (state == open) {
            out.push_back({id, now, "circuit_open", open_until - now, "open"});
            continue;
        }
        out.push_back({id, now, "admitted", -1, state_name(now)});
        now += c.latency;
        const bool slow =
            b.window && b.window->slow_call_duration && c.latency >= *b.window->slow_call_duration;
        if (state == closed) {
            run = c.fails ? run + 1 : 0;
            if (b.threshold > 0 && c.fails && run >= b.threshold) {
                run = 0;
                open_at(now);
            } else {
                recorded.push_back({now, c.fails, slow});
                if (window_opens(now)) {
                    run = 0;
                    open_at(now);
                }
            }
        } else if (c.fails || (slow && b.window->slow_call_ratio)) {
            open_at(now);
        } else if (++probes_passed >= b.probes) {
            state = closed;
            opens = 0;
            run = 0;
            recorded.clear();
        }
        out.push_back({id, now, c.fails ? "failure" : "value", -1, state_name(now)});
    }
    return out;
}

inline std::string state_name(rs::circuit_state s) {
    return rs::to_string(s);
}

template <class Breaker>
std::vector<event> run_breaker(rs::testing::simulation& sim, const Breaker& breaker,
                               const std::vector<breaker_call>& calls) {
    return run_calls(
        sim, calls,
        [&](std::vector<event>& out, int id, const breaker_call& c,
            resilience::stop_token) -> rs::task<void> {
            auto action = [&out, &sim, &breaker, id, c]() -> rs::task<int> {
                out.push_back({id, sim.now().count(), "admitted", -1, state_name(breaker.state())});
                if (c.latency > 0)
                    co_await sim.sleep_for(std::chrono::nanoseconds{c.latency});
                if (c.fails)
                    throw std::runtime_error("scripted failure");
                co_return id;
            };
            const auto r = co_await breaker.execute_outcome(std::move(action));
            if (r.has_value())
                out.push_back({id, sim.now().count(), "value", -1, state_name(breaker.state())});
            else if (auto* e = r.error().template as<rs::circuit_open_error>())
                out.push_back({id, sim.now().count(), "circuit_open", e->retry_after().count(), "open"});
            else
                out.push_back({id, sim.now().count(), "failure", -1, state_name(breaker.state())});
        });
}

// ---------------------------------------------------------------------------------------------------------
// pipeline{retry, timeout} (docs/retry.md, docs/timeout.md): each attempt bounded by the timeout;
// a failure before the deadline is reported at once, a failure after it (or a stop) becomes
// timeout_error, a late value is returned; retried (transient failures and timeouts) after a
// constant backoff, up to max_attempts; the last failure comes out unchanged.

struct attempt_plan {
    ns latency = 0;
    bool fails = false;
    bool ignores_stop = false;
};

struct retry_timeout_setup {
    int max_attempts = 1;
    ns backoff = 0;
    ns timeout = 1;
};

inline std::vector<event> model_retry_timeout(const retry_timeout_setup& s,
                                              const std::vector<attempt_plan>& plan) {
    std::vector<event> out;
    ns now = 0;
    for (int attempt = 1;; ++attempt) {
        const attempt_plan& p = plan[static_cast<std::size_t>(attempt - 1) % plan.size()];
        out.push_back({attempt, now, "attempt"});
        std::string result;
        if (p.latency < s.timeout) {
            now += p.latency;
            result = p.fails ? "scripted_failure" : "value";
        } else if (p.ignores_stop) {
            now += p.latency;
            result = p.fails ? "timeout_error" : "value";
        } else {
            now += s.timeout;
            result = "timeout_error";
        }
        if (result == "value" || attempt >= s.max_attempts) {
            out.push_back({attempt, now, result});
            return out;
        }
        now += s.backoff;
    }
}

/// Plays one call of `policy` (a retry around a timeout, on `sim`'s clock), its attempts following `plan`
/// in turn; the call is the runner's only one, and each event's `call` is the attempt's number.
template <class Policy>
std::vector<event> run_retry_timeout(rs::testing::simulation& sim, const Policy& policy,
                                     const std::vector<attempt_plan>& plan) {
    struct only_call {
        ns gap = 0;
    };
    const std::vector<only_call> one(1);
    return run_calls(
        sim, one,
        [&](std::vector<event>& out, int, const only_call&, resilience::stop_token) -> rs::task<void> {
            int attempt = 0;
            auto action = [&](resilience::stop_token st) -> rs::task<int> {
                const attempt_plan& p = plan[static_cast<std::size_t>(attempt) % plan.size()];
                ++attempt;
                out.push_back({attempt, sim.now().count(), "attempt"});
                // Named, not a temporary of the co_await expression (g++ 12 destroys those
                // twice).
                const resilience::stop_token listened = p.ignores_stop ? resilience::stop_token{} : st;
                co_await sim.sleep_for(std::chrono::nanoseconds{p.latency}, listened);
                if (!p.ignores_stop && st.stop_requested())
                    throw rs::cancelled_error{};
                if (p.fails)
                    throw std::runtime_error("scripted failure");
                co_return attempt;
            };
            const auto r = co_await policy.execute_outcome(action);
            std::string what = "value";
            if (!r.has_value()) {
                if (r.error().template is<rs::timeout_error>())
                    what = "timeout_error";
                else if (r.error().template is<std::runtime_error>())
                    what = "scripted_failure";
                else
                    what = "unexpected failure";
            }
            out.push_back({attempt, sim.now().count(), what});
        });
}

// ---------------------------------------------------------------------------------------------------------
// Adaptive throttle (docs/adaptive_throttle.md), calls one after another: each call arriving at `now` is
// refused with p = max(0, (requests - k * accepts) / (requests + 1)) over the window as it stands, drawn
// from the seeded source only while p > 0, then counted as a request; an admitted call that succeeds is
// an accept at the instant it ends. A count made at t stops counting at (floor(t / width) + segments) *
// width, width = window / segments rounded down.

struct throttle_call {
    ns gap = 0;     // idle time before the call arrives, after the previous one ended
    ns latency = 0; // how long it runs when admitted
    bool fails = false;
};

struct throttle_setup {
    double k = 2.0;
    ns window = 1;
    ns segments = 1;
    std::uint64_t seed = 0;
};

inline std::string probability_text(double p) {
    std::ostringstream out;
    out.precision(17);
    out << "p=" << p;
    return out.str();
}

inline std::vector<event> model_throttle(const throttle_setup& s, const std::vector<throttle_call>& calls) {
    std::vector<event> out;
    std::vector<ns> requests, accepts; // the instants they were counted at
    const ns width = s.window / s.segments;
    const auto live = [&](const std::vector<ns>& counted, ns now) {
        return static_cast<double>(std::count_if(
            counted.begin(), counted.end(), [&](ns t) { return now < (t / width + s.segments) * width; }));
    };
    rs::seeded_random rng{s.seed};
    ns now = 0;
    for (std::size_t i = 0; i < calls.size(); ++i) {
        const throttle_call& c = calls[i];
        const int id = static_cast<int>(i);
        now += c.gap;
        const double r = live(requests, now), a = live(accepts, now);
        const double p = std::max(0.0, (r - s.k * a) / (r + 1.0));
        const bool refuse = p > 0.0 && rs::detail::unit_random(rng) < p;
        requests.push_back(now);
        if (refuse) {
            out.push_back({id, now, "throttled", -1, probability_text(p)});
            continue;
        }
        out.push_back({id, now, "admitted", -1, probability_text(p)});
        now += c.latency;
        if (!c.fails)
            accepts.push_back(now);
        out.push_back({id, now, c.fails ? "failure" : "value"});
    }
    return out;
}

template <class Throttle>
std::vector<event> run_throttle(rs::testing::simulation& sim, const Throttle& throttle,
                                const std::vector<throttle_call>& calls) {
    return run_calls(
        sim, calls,
        [&](std::vector<event>& out, int id, const throttle_call& c,
            resilience::stop_token) -> rs::task<void> {
            const double before = throttle.probability();
            auto action = [&out, &sim, id, c, before]() -> rs::task<int> {
                out.push_back({id, sim.now().count(), "admitted", -1, probability_text(before)});
                if (c.latency > 0)
                    co_await sim.sleep_for(std::chrono::nanoseconds{c.latency});
                if (c.fails)
                    throw std::runtime_error("scripted failure");
                co_return id;
            };
            const auto r = co_await throttle.execute_outcome(std::move(action));
            if (r.has_value())
                out.push_back({id, sim.now().count(), "value"});
            else if (auto* e = r.error().template as<rs::throttled_error>())
                out.push_back({id, sim.now().count(), "throttled", -1, probability_text(e->probability())});
            else
                out.push_back({id, sim.now().count(), "failure"});
        });
}

// ---------------------------------------------------------------------------------------------------------
// Scenarios: made from a `chooser`, so the tests draw them from seeds and the fuzzer from bytes. Each
// `check_*` plays one through the model and the policy and returns both traces, sorted.
//
// Grids keep apart the instants the documentation does not order: arrivals are at 1 mod 1000 ns,
// stops at 250, queue deadlines at 501, attempt timeouts at 500 mod 1000 ns (latencies and holds
// are whole microseconds).

struct comparison {
    std::string setup;
    std::vector<event> expected, actual;
    bool agree() const { return expected == actual; }
};

/// Adds what a listener heard to both traces of `c`, after the calls' events.
inline void compare_heard(comparison& c, std::vector<event> expected, std::vector<event> actual) {
    for (event& e : sorted_heard(std::move(expected)))
        c.expected.push_back(std::move(e));
    for (event& e : sorted_heard(std::move(actual)))
        c.actual.push_back(std::move(e));
}

/// The skeleton of a check of a bulkhead or a limiter: the model's trace (`model(&heard)` also writes
/// down what its listener would hear) against the policy's on route `r`, both sorted; with a listener
/// on the route, what it heard is compared too. `make(sim, listener)` builds the policy on `sim`'s
/// clock with `listener` as its own (empty unless the route gives it one); `play(sim, p)` plays the
/// calls through `p`, the policy as the route reaches it (actions producing `T`). The route is told
/// after `setup`.
template <class T, class Model, class Make, class Play>
comparison compare_routed(std::string setup, route r, Model model, Make make, Play play) {
    comparison c;
    c.setup = std::move(setup) + " route=" + route_name(r);
    std::vector<event> expected_heard, heard;
    c.expected = sorted(model(&expected_heard));
    rs::testing::simulation sim;
    const auto policy = make(sim, own_listener(r) ? recorder(heard) : rs::telemetry_listener{});
    c.actual = sorted(run_routed<T>(sim, r, policy, heard, [&](const auto& p) { return play(sim, p); }));
    if (listens(r))
        compare_heard(c, std::move(expected_heard), std::move(heard));
    return c;
}

inline std::optional<std::chrono::nanoseconds> as_duration(std::optional<ns> v) {
    return v ? std::optional<std::chrono::nanoseconds>{*v} : std::nullopt;
}

inline std::vector<limiter_call> limiter_calls(chooser& pick) {
    std::vector<limiter_call> calls(static_cast<std::size_t>(pick.between(1, 12)));
    const ns unit = pick.coin(50) ? 1'000 : 1'000'000; // microseconds or milliseconds apart
    ns t = 0;
    for (auto& c : calls) {
        if (pick.coin(70))
            t += pick.between(0, 400) * unit;
        c.arrive = t + 1;
        if (pick.coin(15))
            c.stop_at = c.arrive + pick.between(0, 300) * unit + 249;
    }
    return calls;
}

inline std::optional<ns> queue_timeout_of(chooser& pick) {
    if (!pick.coin(40))
        return std::nullopt;
    return pick.between(0, 500) * (pick.coin(50) ? 1'000 : 1'000'000) + 500;
}

inline comparison check_token_bucket(chooser& pick) {
    static constexpr ns rates[] = {1, 2, 4, 5, 8, 10, 20, 25, 40, 50, 100, 1000, 1'000'000};
    const ns tokens = pick.between(1, 4);
    const ns rate = pick.pick(rates);
    const auto queue_limit = static_cast<std::size_t>(pick.between(0, 4));
    const std::optional<ns> queue_timeout = queue_timeout_of(pick);
    const std::vector<limiter_call> calls = limiter_calls(pick);
    const route r = route_of(pick);

    std::ostringstream setup;
    setup << "token_limit=" << tokens << " tokens_per_second=" << rate << " queue_limit=" << queue_limit
          << " queue_timeout=" << (queue_timeout ? std::to_string(*queue_timeout) + "ns" : "none");
    return compare_routed<void>(
        setup.str(), r,
        [&](std::vector<event>* heard) {
            return model_limiter(token_bucket_meter{tokens, 1'000'000'000 / rate}, queue_limit, queue_timeout,
                                 calls, heard);
        },
        [&](rs::testing::simulation& sim, rs::telemetry_listener listener) {
            return rs::rate_limiter{{.token_limit = static_cast<std::size_t>(tokens),
                                     .tokens_per_second = static_cast<double>(rate),
                                     .queue_limit = queue_limit,
                                     .queue_timeout = as_duration(queue_timeout),
                                     .telemetry = std::move(listener)},
                                    sim.clock()};
        },
        [&](rs::testing::simulation& sim, const auto& p) { return run_limiter(sim, p, calls); });
}

inline comparison check_sliding_window(chooser& pick) {
    static constexpr ns windows[] = {1'000'000'000, 100'000'000, 999'999'999,
                                     1'000'000'007, 3'000'000,   7'000};
    const ns permits = pick.between(1, 4);
    const ns window = pick.pick(windows);
    const ns segments = pick.between(1, 7);
    const auto queue_limit = static_cast<std::size_t>(pick.between(0, 4));
    const std::optional<ns> queue_timeout = queue_timeout_of(pick);
    const std::vector<limiter_call> calls = limiter_calls(pick);
    const route r = route_of(pick);

    std::ostringstream setup;
    setup << "permit_limit=" << permits << " window=" << window << "ns segments=" << segments
          << " queue_limit=" << queue_limit
          << " queue_timeout=" << (queue_timeout ? std::to_string(*queue_timeout) + "ns" : "none");
    return compare_routed<void>(
        setup.str(), r,
        [&](std::vector<event>* heard) {
            return model_limiter(sliding_window_meter{permits, window, segments}, queue_limit, queue_timeout,
                                 calls, heard);
        },
        [&](rs::testing::simulation& sim, rs::telemetry_listener listener) {
            return rs::sliding_window_limiter{{.permit_limit = static_cast<std::size_t>(permits),
                                               .window = std::chrono::nanoseconds{window},
                                               .segments = static_cast<std::size_t>(segments),
                                               .queue_limit = queue_limit,
                                               .queue_timeout = as_duration(queue_timeout),
                                               .telemetry = std::move(listener)},
                                              sim.clock()};
        },
        [&](rs::testing::simulation& sim, const auto& p) { return run_limiter(sim, p, calls); });
}

// A bulkhead's scenario is also played through the ways its calls wait (bulkhead/state.hpp): on the
// simulation's clock, whose timers run on the loop; the same with `adapt` pinned at the limit (min =
// max), which must change nothing the model sees; and on a clock with no timers on the loop, whose
// queue timeout a watchdog coroutine bounds (`wait_bounded`).
enum class bulkhead_way { loop_clock, fixed_adapt, loopless_clock };

inline bulkhead_way bulkhead_way_of(chooser& pick) {
    return static_cast<bulkhead_way>(pick.between(0, 2));
}
inline const char* bulkhead_way_name(bulkhead_way w) {
    switch (w) {
    case bulkhead_way::loop_clock:
        return "loop_clock";
    case bulkhead_way::fixed_adapt:
        return "fixed_adapt";
    case bulkhead_way::loopless_clock:
        return "loopless_clock";
    }
    return "?";
}

using resilience_tests::loopless_clock;

inline comparison check_bulkhead(chooser& pick) {
    const auto slots = static_cast<std::size_t>(pick.between(1, 4));
    const auto queue_limit = static_cast<std::size_t>(pick.between(0, 4));
    const std::optional<ns> queue_timeout =
        pick.coin(40) ? std::optional<ns>{pick.between(0, 300) * 1'000 + 500} : std::nullopt;
    std::vector<bulkhead_call> calls(static_cast<std::size_t>(pick.between(1, 12)));
    ns t = 0;
    for (auto& call : calls) {
        if (pick.coin(70))
            t += pick.between(0, 200) * 1'000;
        call.arrive = t + 1;
        call.hold = pick.between(1, 400) * 1'000;
        if (pick.coin(15))
            call.stop_at = call.arrive + pick.between(0, 300) * 1'000 + 249;
    }

    const route r = route_of(pick);
    const bulkhead_way way = bulkhead_way_of(pick);

    std::ostringstream setup;
    setup << "max_concurrent_calls=" << slots << " queue_limit=" << queue_limit
          << " queue_timeout=" << (queue_timeout ? std::to_string(*queue_timeout) + "ns" : "none")
          << " way=" << bulkhead_way_name(way);
    const auto options = [&](rs::telemetry_listener listener) {
        rs::bulkhead_options o{.max_concurrent_calls = slots,
                               .queue_limit = queue_limit,
                               .queue_timeout = as_duration(queue_timeout),
                               .telemetry = std::move(listener)};
        if (way == bulkhead_way::fixed_adapt)
            o.adapt = rs::aimd{.min = slots, .max = slots};
        return o;
    };
    const auto model = [&](std::vector<event>* heard) {
        return model_bulkhead(slots, queue_limit, queue_timeout, calls, heard);
    };
    const auto play = [&](rs::testing::simulation& sim, const auto& p) {
        return run_bulkhead(sim, p, calls);
    };
    if (way == bulkhead_way::loopless_clock)
        return compare_routed<int>(
            setup.str(), r, model,
            [&](rs::testing::simulation& sim, rs::telemetry_listener listener) {
                return rs::bulkhead{options(std::move(listener)), loopless_clock{sim.clock()}};
            },
            play);
    return compare_routed<int>(
        setup.str(), r, model,
        [&](rs::testing::simulation& sim, rs::telemetry_listener listener) {
            return rs::bulkhead{options(std::move(listener)), sim.clock()};
        },
        play);
}

// Reconfigurations of the limiters and the bulkhead: between one and three, at instants of their own
// grid (750 mod 1000 ns) spread over the calls, each with options drawn as the first ones are. Two
// at one instant are applied in the order drawn.

inline std::vector<ns> change_instants(chooser& pick, ns horizon) {
    std::vector<ns> at(static_cast<std::size_t>(pick.between(1, 3)));
    for (ns& t : at)
        t = pick.between(0, horizon / 1'000) * 1'000 + 750;
    std::sort(at.begin(), at.end());
    return at;
}

inline std::string timeout_text(std::optional<ns> t) {
    return t ? std::to_string(*t) + "ns" : "none";
}

inline comparison check_token_bucket_reconfigured(chooser& pick) {
    static constexpr ns rates[] = {1, 2, 4, 5, 8, 10, 20, 25, 40, 50, 100, 1000, 1'000'000};
    struct setting {
        ns tokens, rate;
        std::size_t queue_limit;
        std::optional<ns> queue_timeout;
    };
    const auto draw = [&pick] {
        setting s{};
        s.tokens = pick.between(1, 4);
        s.rate = pick.pick(rates);
        s.queue_limit = static_cast<std::size_t>(pick.between(0, 4));
        s.queue_timeout = queue_timeout_of(pick);
        return s;
    };
    const setting first = draw();
    const std::vector<limiter_call> calls = limiter_calls(pick);
    const route r = route_of(pick);
    const ns last = calls.back().arrive;
    std::vector<std::pair<ns, setting>> changes;
    for (const ns at : change_instants(pick, last + std::max<ns>(last, 1'000'000) / 2))
        changes.emplace_back(at, draw());

    std::ostringstream setup;
    const auto describe = [&setup](const setting& s) {
        setup << "token_limit=" << s.tokens << " tokens_per_second=" << s.rate
              << " queue_limit=" << s.queue_limit << " queue_timeout=" << timeout_text(s.queue_timeout);
    };
    describe(first);
    for (const auto& [at, s] : changes) {
        setup << "; at " << at << "ns ";
        describe(s);
    }
    rs::telemetry_listener listener_kept;
    const auto options_of = [&listener_kept](const setting& s) {
        return rs::rate_limiter_options{.token_limit = static_cast<std::size_t>(s.tokens),
                                        .tokens_per_second = static_cast<double>(s.rate),
                                        .queue_limit = s.queue_limit,
                                        .queue_timeout = as_duration(s.queue_timeout),
                                        .telemetry = listener_kept};
    };
    std::optional<rs::rate_limiter<rs::testing::virtual_clock>> handle;
    return compare_routed<void>(
        setup.str(), r,
        [&](std::vector<event>* heard) {
            std::vector<limiter_change<token_bucket_meter>> model_changes;
            for (const auto& [at, s] : changes)
                model_changes.push_back(
                    {at,
                     [tokens = s.tokens, interval = 1'000'000'000 / s.rate](token_bucket_meter& m, ns now) {
                         m.reconfigure(tokens, interval, now);
                     },
                     s.queue_limit, s.queue_timeout});
            return model_limiter(token_bucket_meter{first.tokens, 1'000'000'000 / first.rate},
                                 first.queue_limit, first.queue_timeout, calls, heard, model_changes);
        },
        [&](rs::testing::simulation& sim, rs::telemetry_listener listener) {
            listener_kept = std::move(listener);
            handle.emplace(options_of(first), sim.clock());
            return *handle;
        },
        [&](rs::testing::simulation& sim, const auto& p) {
            std::vector<timed_action> acts;
            for (const auto& [at, s] : changes)
                acts.push_back({at, [&, o = options_of(s)] { handle->reconfigure(o); }});
            return run_limiter(sim, p, calls, acts);
        });
}

inline comparison check_sliding_window_reconfigured(chooser& pick) {
    static constexpr ns windows[] = {1'000'000'000, 100'000'000, 999'999'999,
                                     1'000'000'007, 3'000'000,   7'000};
    struct setting {
        ns permits, window, segments;
        std::size_t queue_limit;
        std::optional<ns> queue_timeout;
    };
    const auto draw = [&pick](ns previous_window) {
        setting s{};
        s.permits = pick.between(1, 4);
        s.window = previous_window == 0 || pick.coin(50) ? pick.pick(windows) : previous_window;
        s.segments = pick.between(1, 7);
        s.queue_limit = static_cast<std::size_t>(pick.between(0, 4));
        s.queue_timeout = queue_timeout_of(pick);
        return s;
    };
    const setting first = draw(0);
    const std::vector<limiter_call> calls = limiter_calls(pick);
    const route r = route_of(pick);
    const ns last = calls.back().arrive;
    std::vector<std::pair<ns, setting>> changes;
    ns window = first.window;
    for (const ns at : change_instants(pick, last + std::max<ns>(last, 1'000'000) / 2)) {
        changes.emplace_back(at, draw(window));
        window = changes.back().second.window;
    }

    std::ostringstream setup;
    const auto describe = [&setup](const setting& s) {
        setup << "permit_limit=" << s.permits << " window=" << s.window << "ns segments=" << s.segments
              << " queue_limit=" << s.queue_limit << " queue_timeout=" << timeout_text(s.queue_timeout);
    };
    describe(first);
    for (const auto& [at, s] : changes) {
        setup << "; at " << at << "ns ";
        describe(s);
    }
    rs::telemetry_listener listener_kept;
    const auto options_of = [&listener_kept](const setting& s) {
        return rs::sliding_window_limiter_options{.permit_limit = static_cast<std::size_t>(s.permits),
                                                  .window = std::chrono::nanoseconds{s.window},
                                                  .segments = static_cast<std::size_t>(s.segments),
                                                  .queue_limit = s.queue_limit,
                                                  .queue_timeout = as_duration(s.queue_timeout),
                                                  .telemetry = listener_kept};
    };
    std::optional<rs::sliding_window_limiter<rs::testing::virtual_clock>> handle;
    return compare_routed<void>(
        setup.str(), r,
        [&](std::vector<event>* heard) {
            std::vector<limiter_change<sliding_window_meter>> model_changes;
            for (const auto& [at, s] : changes)
                model_changes.push_back({at,
                                         [c = s](sliding_window_meter& m, ns now) {
                                             m.reconfigure(c.permits, c.window, c.segments, now);
                                         },
                                         s.queue_limit, s.queue_timeout});
            return model_limiter(sliding_window_meter{first.permits, first.window, first.segments},
                                 first.queue_limit, first.queue_timeout, calls, heard, model_changes);
        },
        [&](rs::testing::simulation& sim, rs::telemetry_listener listener) {
            listener_kept = std::move(listener);
            handle.emplace(options_of(first), sim.clock());
            return *handle;
        },
        [&](rs::testing::simulation& sim, const auto& p) {
            std::vector<timed_action> acts;
            for (const auto& [at, s] : changes)
                acts.push_back({at, [&, o = options_of(s)] { handle->reconfigure(o); }});
            return run_limiter(sim, p, calls, acts);
        });
}

inline comparison check_bulkhead_reconfigured(chooser& pick) {
    struct setting {
        std::size_t slots, queue_limit;
        std::optional<ns> queue_timeout;
    };
    const auto draw = [&pick] {
        setting s{};
        s.slots = static_cast<std::size_t>(pick.between(1, 4));
        s.queue_limit = static_cast<std::size_t>(pick.between(0, 4));
        s.queue_timeout =
            pick.coin(40) ? std::optional<ns>{pick.between(0, 300) * 1'000 + 500} : std::nullopt;
        return s;
    };
    const setting first = draw();
    std::vector<bulkhead_call> calls(static_cast<std::size_t>(pick.between(1, 12)));
    ns t = 0;
    for (auto& call : calls) {
        if (pick.coin(70))
            t += pick.between(0, 200) * 1'000;
        call.arrive = t + 1;
        call.hold = pick.between(1, 400) * 1'000;
        if (pick.coin(15))
            call.stop_at = call.arrive + pick.between(0, 300) * 1'000 + 249;
    }
    const route r = route_of(pick);
    std::vector<std::pair<ns, setting>> changes;
    for (const ns at : change_instants(pick, t + 400'000))
        changes.emplace_back(at, draw());
    const bool loopless = pick.coin(33); // on a clock without loop timers (`bulkhead_way`)

    std::ostringstream setup;
    const auto describe = [&setup](const setting& s) {
        setup << "max_concurrent_calls=" << s.slots << " queue_limit=" << s.queue_limit
              << " queue_timeout=" << timeout_text(s.queue_timeout);
    };
    describe(first);
    for (const auto& [at, s] : changes) {
        setup << "; at " << at << "ns ";
        describe(s);
    }
    if (loopless)
        setup << "; loopless clock";
    rs::telemetry_listener listener_kept;
    const auto options_of = [&listener_kept](const setting& s) {
        return rs::bulkhead_options{.max_concurrent_calls = s.slots,
                                    .queue_limit = s.queue_limit,
                                    .queue_timeout = as_duration(s.queue_timeout),
                                    .telemetry = listener_kept};
    };
    const auto model = [&](std::vector<event>* heard) {
        std::vector<bulkhead_change> model_changes;
        for (const auto& [at, s] : changes)
            model_changes.push_back({at, s.slots, s.queue_limit, s.queue_timeout});
        return model_bulkhead(first.slots, first.queue_limit, first.queue_timeout, calls, heard,
                              model_changes);
    };
    // `handle`: the bulkhead, kept to be reconfigured; `clock_of(sim)`: its clock.
    const auto compare_on = [&](auto& handle, auto clock_of) {
        return compare_routed<int>(
            setup.str(), r, model,
            [&](rs::testing::simulation& sim, rs::telemetry_listener listener) {
                listener_kept = std::move(listener);
                handle.emplace(options_of(first), clock_of(sim));
                return *handle;
            },
            [&](rs::testing::simulation& sim, const auto& p) {
                std::vector<timed_action> acts;
                for (const auto& [at, s] : changes)
                    acts.push_back({at, [&, o = options_of(s)] { handle->reconfigure(o); }});
                return run_bulkhead(sim, p, calls, acts);
            });
    };
    if (loopless) {
        std::optional<rs::bulkhead<loopless_clock>> handle;
        return compare_on(handle, [](rs::testing::simulation& sim) { return loopless_clock{sim.clock()}; });
    }
    std::optional<rs::bulkhead<rs::testing::virtual_clock>> handle;
    return compare_on(handle, [](rs::testing::simulation& sim) { return sim.clock(); });
}

inline comparison check_breaker(chooser& pick) {
    breaker_setup b;
    b.threshold = static_cast<int>(pick.between(1, 4));
    b.break_duration = pick.between(1, 50) * 1'000'000;
    b.growth = pick.coin(50) ? 1.0 : pick.coin(50) ? 2.0 : 1.5;
    if (pick.coin(40))
        b.max_break = b.break_duration * pick.between(1, 5);
    b.probes = static_cast<int>(pick.between(1, 3));
    std::vector<breaker_call> calls(static_cast<std::size_t>(pick.between(1, 30)));
    for (auto& call : calls) {
        call.gap = pick.coin(50) ? 0 : pick.between(0, 60) * 1'000'000;
        call.latency = pick.coin(30) ? 0 : pick.between(0, 20) * 1'000'000;
        call.fails = pick.coin(45);
    }

    comparison c;
    std::ostringstream setup;
    setup << "failure_threshold=" << b.threshold << " break_duration=" << b.break_duration
          << "ns break_duration_growth=" << b.growth
          << " max_break_duration=" << (b.max_break ? std::to_string(*b.max_break) + "ns" : "none")
          << " probes=" << b.probes;
    c.setup = setup.str();
    c.expected = model_breaker(b, calls);
    rs::testing::simulation sim;
    rs::circuit_breaker breaker{
        {.failure_threshold = b.threshold,
         .break_duration = std::chrono::nanoseconds{b.break_duration},
         .break_duration_growth = b.growth,
         .max_break_duration =
             b.max_break ? std::optional<std::chrono::nanoseconds>{*b.max_break} : std::nullopt,
         .probes = b.probes},
        sim.clock()};
    c.actual = run_breaker(sim, breaker, calls);
    return c;
}

// A breaker with a count or time window, and sometimes a consecutive-failure rule besides.
inline comparison check_breaker_window(chooser& pick) {
    breaker_setup b;
    b.threshold = pick.coin(30) ? static_cast<int>(pick.between(2, 5)) : 0;
    b.break_duration = pick.between(1, 50) * 1'000'000;
    b.growth = pick.coin(60) ? 1.0 : 2.0;
    b.probes = static_cast<int>(pick.between(1, 3));
    breaker_window_setup w;
    if (pick.coin(50))
        w.size = static_cast<int>(pick.between(1, 8));
    else {
        w.sampling = pick.between(1, 100) * 1'000'000 + (pick.coin(50) ? 0 : pick.between(1, 999));
        w.segments = static_cast<int>(pick.between(1, 12));
    }
    w.minimum_throughput = static_cast<int>(pick.between(1, w.size.value_or(6)));
    static constexpr double ratios[] = {0.1, 0.25, 0.3, 0.5, 0.6, 0.75, 1.0};
    const bool slow_rule = pick.coin(40);
    if (!slow_rule || pick.coin(50))
        w.failure_ratio = pick.pick(ratios);
    if (slow_rule || pick.coin(20))
        w.slow_call_duration = pick.between(1, 20) * 1'000'000;
    if (slow_rule)
        w.slow_call_ratio = pick.pick(ratios);
    b.window = w;
    std::vector<breaker_call> calls(static_cast<std::size_t>(pick.between(1, 40)));
    for (auto& call : calls) {
        call.gap =
            pick.coin(50) ? 0 : pick.between(0, 60) * 1'000'000 + (pick.coin(70) ? 0 : pick.between(1, 999));
        call.latency = pick.coin(30) ? 0 : pick.between(0, 25) * 1'000'000;
        call.fails = pick.coin(40);
    }

    comparison c;
    std::ostringstream setup;
    setup << "failure_threshold=" << (b.threshold ? std::to_string(b.threshold) : "none")
          << " break_duration=" << b.break_duration << "ns break_duration_growth=" << b.growth
          << " probes=" << b.probes << " sampling{";
    if (w.size)
        setup << "calls=" << *w.size;
    else
        setup << "window=" << *w.sampling << "ns segments=" << w.segments;
    setup << " minimum_throughput=" << w.minimum_throughput
          << " failure_ratio=" << (w.failure_ratio ? std::to_string(*w.failure_ratio) : "none")
          << " slow_call_duration="
          << (w.slow_call_duration ? std::to_string(*w.slow_call_duration) + "ns" : "none")
          << " slow_call_ratio=" << (w.slow_call_ratio ? std::to_string(*w.slow_call_ratio) : "none") << "}";
    c.setup = setup.str();
    c.expected = model_breaker(b, calls);
    const auto opt_ns = [](std::optional<ns> v) {
        return v ? std::optional<std::chrono::nanoseconds>{*v} : std::nullopt;
    };
    rs::testing::simulation sim;
    rs::circuit_breaker breaker{
        {.failure_threshold = b.threshold ? std::optional<int>{b.threshold} : std::nullopt,
         .sampling = rs::breaker_sampling{.calls = w.size,
                                          .window = opt_ns(w.sampling),
                                          .segments = static_cast<std::size_t>(w.segments),
                                          .minimum_throughput = w.minimum_throughput,
                                          .failure_ratio = w.failure_ratio,
                                          .slow_call_duration = opt_ns(w.slow_call_duration),
                                          .slow_call_ratio = w.slow_call_ratio},
         .break_duration = std::chrono::nanoseconds{b.break_duration},
         .break_duration_growth = b.growth,
         .probes = b.probes},
        sim.clock()};
    c.actual = run_breaker(sim, breaker, calls);
    return c;
}

inline comparison check_retry_timeout(chooser& pick) {
    retry_timeout_setup s;
    s.max_attempts = static_cast<int>(pick.between(1, 5));
    s.backoff = pick.between(0, 50) * 1'000'000;
    s.timeout = pick.between(1, 100) * 1'000'000 + 500;
    std::vector<attempt_plan> plan(static_cast<std::size_t>(pick.between(1, 5)));
    for (auto& p : plan) {
        p.latency = pick.between(0, 150) * 1'000'000;
        p.fails = pick.coin(50);
        p.ignores_stop = pick.coin(25);
    }

    comparison c;
    std::ostringstream setup;
    setup << "max_attempts=" << s.max_attempts << " backoff=" << s.backoff << "ns timeout=" << s.timeout
          << "ns";
    for (const auto& p : plan)
        setup << " [latency=" << p.latency << "ns" << (p.fails ? " fails" : "")
              << (p.ignores_stop ? " ignores_stop" : "") << "]";
    c.setup = setup.str();
    c.expected = model_retry_timeout(s, plan);
    rs::testing::simulation sim;
    rs::pipeline policy{
        rs::retry{{.max_attempts = s.max_attempts,
                   .backoff = rs::constant_backoff{std::chrono::nanoseconds{s.backoff}, rs::jitter::none}},
                  sim.clock()},
        rs::timeout{std::chrono::nanoseconds{s.timeout}, sim.clock()}};
    c.actual = run_retry_timeout(sim, policy, plan);
    return c;
}

inline comparison check_throttle(chooser& pick) {
    static constexpr double ks[] = {0.5, 1.0, 1.1, 1.5, 2.0, 3.0};
    static constexpr ns windows[] = {1'000'000'000, 100'000'000, 999'999'999,
                                     1'000'000'007, 3'000'000,   7'000};
    throttle_setup s;
    s.k = pick.pick(ks);
    s.window = pick.pick(windows);
    s.segments = pick.between(1, 12);
    s.seed = static_cast<std::uint64_t>(pick.between(0, 1'000'000));
    // Half the scenarios keep to the segment grid, so that counts often leave at the very instant a
    // call arrives; the others move in fortieths of the window, off the grid by a few nanoseconds.
    const bool on_grid = pick.coin(50);
    const ns unit = on_grid ? s.window / s.segments : s.window / 40;
    const int fail_percent = static_cast<int>(pick.between(0, 100));
    std::vector<throttle_call> calls(static_cast<std::size_t>(pick.between(1, 60)));
    for (auto& call : calls) {
        call.gap = pick.coin(50) ? 0 : pick.between(0, 12) * unit + (on_grid ? 0 : pick.between(0, 3));
        call.latency = pick.coin(50) ? 0 : pick.between(0, 6) * unit;
        call.fails = pick.coin(fail_percent);
    }

    comparison c;
    std::ostringstream setup;
    setup << "k=" << s.k << " window=" << s.window << "ns segments=" << s.segments << " seed=" << s.seed
          << " calls=" << calls.size() << " failing=" << fail_percent << "%"
          << (on_grid ? " on the grid" : "");
    c.setup = setup.str();
    c.expected = model_throttle(s, calls);
    rs::testing::simulation sim;
    rs::adaptive_throttle throttle{{.k = s.k,
                                    .window = std::chrono::nanoseconds{s.window},
                                    .segments = static_cast<std::size_t>(s.segments)},
                                   sim.clock(),
                                   rs::seeded_random{s.seed}};
    c.actual = run_throttle(sim, throttle, calls);
    return c;
}

} // namespace resilience_models
