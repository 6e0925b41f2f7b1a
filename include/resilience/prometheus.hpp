// SPDX-License-Identifier: MIT
/// \file prometheus.hpp
/// Optional: Prometheus series from the library's telemetry (needs prometheus-cpp; CMake target
/// `resilience::prometheus`, which links prometheus-cpp's core and pull libraries). The umbrella header
/// `resilience.hpp` does not include it.
///
/// `prometheus::metrics` is a telemetry listener that keeps the series a dashboard needs, and reads
/// the live numbers of the stateful policies it is asked to watch when it is scraped:
///
///     rs::prometheus::metrics metrics;                         // its own prometheus::Registry
///     rs::circuit_breaker breaker{{.name = "orders-db"}};
///     metrics.watch(breaker);                                  // state gauges, read at scrape time
///     rs::pipeline p{rs::telemetry{{.name = "orders", .listener = metrics.listener()}},
///                    rs::retry{{.name = "orders"}}, breaker, rs::timeout{2s}};
///     prometheus::Exposer exposer{"127.0.0.1:9464"};
///     metrics.expose(exposer);                                 // GET /metrics
///
/// The series (prefix `resilience` by default; docs/telemetry.md, "Prometheus", maps each to Polly's
/// and resilience4j's):
///
/// | series | type | labels | from |
/// |---|---|---|---|
/// | `resilience_call_duration_seconds` | histogram | policy, name, outcome, handled | `call` events (a `telemetry` stage) |
/// | `resilience_attempt_duration_seconds` | histogram | policy, name, outcome, handled | `attempt` events (a retry) |
/// | `resilience_events_total` | counter | policy, name, event | every other event: retry, hedge, timeout, fallback, rejection, state_change, queue_wait, backend_lost, backend_restored, cache_hit, cache_miss, stale_served |
/// | `resilience_rejections_total` | counter | policy, name, reason | `rejection` events |
/// | `resilience_circuit_transitions_total` | counter | policy, name, from, to | `state_change` events |
/// | `resilience_queue_wait_seconds` | histogram | policy, name | `queue_wait` events |
/// | `resilience_circuit_state` | gauge | policy, name, state | a watched breaker: 1 for its state, 0 for the others |
/// | `resilience_circuit_window_calls`, `_failures`, `_slow_calls` | gauge | policy, name | a watched breaker's sample |
/// | `resilience_circuit_consecutive_failures` | gauge | policy, name | a watched breaker |
/// | `resilience_bulkhead_in_flight`, `_queued`, `_limit` | gauge | policy, name | a watched bulkhead |
/// | `resilience_limiter_tokens`, `resilience_limiter_queued` | gauge | policy, name | a watched rate_limiter or sliding_window_limiter |
/// | `resilience_balancer_endpoints`, `_ejected`, `_healthy` | gauge | policy, name | a watched balancer |
///
/// Every series carries `policy` (the policy kind: `retry`, `circuit_breaker`, `bulkhead`, ...) and
/// `name` (its `name` option, or the name it is watched under). `outcome` is `success` (the attempt or
/// call returned a value) or `failure` (it threw); `handled` is `true` when the policy's classifier
/// handled that outcome (`telemetry_event::handled`; Polly's `attempt-handled`), so a 503 value that
/// a retry retries is `outcome="success",handled="true"`, and a failure it gives up on at once is
/// `outcome="failure",handled="false"`. For calls, the `telemetry` stage's own `should_handle` judges
/// (by default, a failure other than a cancellation). `reason` is the event's `rejection_reason`
/// (`budget_exhausted` for a retry budget's refusals). A histogram's `_count` is the number of calls,
/// attempts or admitted waiters.
///
/// Cost: a label set's counters and histograms are made the first time an event needs them (one lock,
/// a few allocations), and cached in a lock-free table keyed by the event's kind and the contents of
/// its `policy` and `name` (so policies made per call under one name share their series, and one made
/// again at the same address under another name is told apart). After that an event costs a hash of
/// those two short strings, a table probe, a few atomic
/// increments and, for a duration, one histogram observation (prometheus-cpp takes a mutex for it):
/// no allocation, no string built (bench/bench_prometheus.cpp).
///
/// Lifetime: copies of `metrics` and of `listener()` share the event series' state and keep it alive
/// (the Exposer holds what it is given weakly); watching a policy keeps a copy of its handle, so its
/// shared state lives as long as the metrics do. The watched handles are kept apart from what the
/// listener holds, so a watched breaker whose own `telemetry` is this listener makes no cycle.
///
///     rs::prometheus::metrics m;
///     rs::retry r{{.telemetry = m.listener()}};   // OK: the listener shares m's state
///     exposer.RegisterCollectable(m.registry());  // misses the watched gauges: use m.expose(exposer)
///
/// Locking: `recorder::make_mutex_` guards the series made so far (`made_`) and the making of one;
/// `table_` holds atomics, read without it (a series once published there never changes).
/// `watcher::watch_mutex_` guards `watched_`. Every function takes the mutex it needs itself, so none is
/// named `_locked`.
#pragma once

#include "balancer.hpp"
#include "bulkhead.hpp"
#include "circuit_breaker.hpp"
#include "clock.hpp"
#include "rate_limiter.hpp"
#include "sliding_window_limiter.hpp"
#include "telemetry_event.hpp"

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/labels.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace resilience::inline v0_2::prometheus {

/// What `metrics` names its series and how it buckets durations. Validated by `metrics`'
/// constructor (`std::invalid_argument` naming the field).
struct metrics_options {
    /// The first word of every series name (`<prefix>_events_total`, ...): a Prometheus metric name,
    /// `[a-zA-Z_:][a-zA-Z0-9_:]*`.
    std::string prefix = "resilience";
    /// The upper bounds, in seconds, of the duration histograms' buckets (`+Inf` is added):
    /// finite, strictly increasing, at least one. Prometheus clients' default buckets, from 1 ms.
    std::vector<double> duration_buckets{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                         0.25,  0.5,    1.0,   2.5,  5.0,   10.0};
};

namespace detail {

inline bool valid_metric_name(std::string_view s) noexcept {
    if (s.empty())
        return false;
    for (std::size_t i = 0; i < s.size(); ++i) {
        const char c = s[i];
        const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
        if (!letter && !(i > 0 && c >= '0' && c <= '9'))
            return false;
    }
    return true;
}

inline metrics_options validate(metrics_options o) {
    if (!valid_metric_name(o.prefix))
        throw std::invalid_argument("prometheus::metrics: prefix must be a Prometheus metric name "
                                    "([a-zA-Z_:][a-zA-Z0-9_:]*), got '" +
                                    o.prefix + "'");
    if (o.duration_buckets.empty())
        throw std::invalid_argument("prometheus::metrics: duration_buckets must not be empty");
    for (std::size_t i = 0; i < o.duration_buckets.size(); ++i) {
        const double b = o.duration_buckets[i];
        if (!std::isfinite(b))
            throw std::invalid_argument("prometheus::metrics: duration_buckets must be finite, got " +
                                        std::to_string(b) + " at index " + std::to_string(i));
        if (i > 0 && !(b > o.duration_buckets[i - 1]))
            throw std::invalid_argument(
                "prometheus::metrics: duration_buckets must be strictly increasing, got " +
                std::to_string(b) + " after " + std::to_string(o.duration_buckets[i - 1]));
    }
    return o;
}

/// The children of one label set: what an event of one kind, policy, name and outcome or reason
/// updates. Made once, never changed, freed with the metrics.
struct series {
    telemetry_kind kind{};
    unsigned char sub = 0; // the outcome (bit 0: failure, bit 1: handled) or the rejection reason
    std::string policy;
    std::string name;
    ::prometheus::Counter* events = nullptr;      // <prefix>_events_total
    ::prometheus::Counter* rejections = nullptr;  // <prefix>_rejections_total
    ::prometheus::Counter* transitions = nullptr; // <prefix>_circuit_transitions_total
    ::prometheus::Histogram* durations = nullptr; // a duration histogram

    bool is(telemetry_kind k, unsigned char s, std::string_view p, std::string_view n) const noexcept {
        return kind == k && sub == s && policy == p && name == n;
    }
};

/// The event series: what the listener updates (and keeps alive).
class recorder {
public:
    recorder(std::shared_ptr<::prometheus::Registry> registry, metrics_options options)
        : options_(validate(std::move(options))), registry_(std::move(registry)) {
        if (!registry_)
            throw std::invalid_argument("prometheus::metrics: registry must not be null");
        const std::string& p = options_.prefix;
        calls_ = &::prometheus::BuildHistogram()
                      .Name(p + "_call_duration_seconds")
                      .Help("Calls through a telemetry stage, by outcome: their length in seconds")
                      .Register(*registry_);
        attempts_ = &::prometheus::BuildHistogram()
                         .Name(p + "_attempt_duration_seconds")
                         .Help("Attempts of a retry, by outcome: their length in seconds")
                         .Register(*registry_);
        queue_waits_ =
            &::prometheus::BuildHistogram()
                 .Name(p + "_queue_wait_seconds")
                 .Help(
                     "Calls admitted after waiting in a bulkhead's or a limiter's queue: the wait in seconds")
                 .Register(*registry_);
        events_ =
            &::prometheus::BuildCounter()
                 .Name(p + "_events_total")
                 .Help("Resilience events (retry, hedge, timeout, fallback, rejection, state_change, "
                       "queue_wait, backend_lost, backend_restored, cache_hit, cache_miss, stale_served)")
                 .Register(*registry_);
        rejections_ = &::prometheus::BuildCounter()
                           .Name(p + "_rejections_total")
                           .Help("Calls, retries and hedges refused, by reason")
                           .Register(*registry_);
        transitions_ =
            &::prometheus::BuildCounter()
                 .Name(p + "_circuit_transitions_total")
                 .Help("Circuit breakers' changes of state, by the state left and the state entered")
                 .Register(*registry_);
    }

    const metrics_options& options() const noexcept { return options_; }
    const std::shared_ptr<::prometheus::Registry>& registry() const noexcept { return registry_; }

    /// The listener's work: find the event's label set (made on first use) and update it.
    void record(const telemetry_event& e) {
        const unsigned char sub = sub_key(e);
        const series& s = find(e.kind, sub, e.policy, e.name);
        if (s.events)
            s.events->Increment();
        if (s.rejections)
            s.rejections->Increment();
        if (s.transitions)
            s.transitions->Increment();
        if (s.durations)
            s.durations->Observe(static_cast<double>(e.duration.count()) * 1e-9);
    }

private:
    static constexpr std::size_t slots = 1024; // a power of two
    static constexpr std::size_t probes = 16;

    static unsigned char sub_key(const telemetry_event& e) noexcept {
        switch (e.kind) {
        case telemetry_kind::attempt:
        case telemetry_kind::call:
            return static_cast<unsigned char>((e.error ? 1 : 0) | (e.handled ? 2 : 0));
        case telemetry_kind::rejection:
            return static_cast<unsigned char>(e.reason);
        case telemetry_kind::state_change: // four states: from in the high bits, to in the low
            return static_cast<unsigned char>(static_cast<unsigned>(e.from) * 4 +
                                              static_cast<unsigned>(e.to));
        default:
            return 0;
        }
    }

    static std::size_t hash(telemetry_kind k, unsigned char sub, std::string_view p,
                            std::string_view n) noexcept {
        auto mix = [](std::uint64_t h, std::uint64_t v) noexcept {
            h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
            return h;
        };
        // By content, not address: a policy made per call (a name in a new string each time) finds
        // its series again instead of filling the table with copies of one label set.
        auto bytes = [](std::uint64_t h, std::string_view v) noexcept {
            for (const char c : v)
                h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL; // FNV-1a
            return h;
        };
        std::uint64_t h = static_cast<std::uint64_t>(k) * 0x100 + sub;
        h = mix(h, bytes(0xcbf29ce484222325ULL, p));
        h = mix(h, p.size());
        h = mix(h, bytes(0xcbf29ce484222325ULL, n));
        h = mix(h, n.size());
        h ^= h >> 29;
        h *= 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 32;
        return static_cast<std::size_t>(h);
    }

    const series& find(telemetry_kind k, unsigned char sub, std::string_view p, std::string_view n) {
        const std::size_t h = hash(k, sub, p, n);
        for (std::size_t i = 0; i < probes; ++i) {
            const series* s = table_[(h + i) & (slots - 1)].load(std::memory_order_acquire);
            if (!s)
                break;
            if (s->is(k, sub, p, n))
                return *s;
        }
        return make(h, k, sub, p, n);
    }

    // The first event of a label set (or one whose table slots are all taken): made under the lock,
    // then published in the table for the lock-free lookups.
    const series& make(std::size_t h, telemetry_kind k, unsigned char sub, std::string_view p,
                       std::string_view n) {
        std::lock_guard lock(make_mutex_);
        const auto key =
            std::make_tuple(static_cast<int>(k), static_cast<int>(sub), std::string(p), std::string(n));
        auto it = made_.find(key);
        if (it == made_.end()) {
            auto s = std::make_unique<series>();
            s->kind = k;
            s->sub = sub;
            s->policy = std::string(p);
            s->name = std::string(n);
            fill(*s);
            it = made_.emplace(key, std::move(s)).first;
        }
        const series* made = it->second.get();
        for (std::size_t i = 0; i < probes; ++i) {
            std::atomic<const series*>& slot = table_[(h + i) & (slots - 1)];
            const series* expected = nullptr;
            if (slot.compare_exchange_strong(expected, made, std::memory_order_acq_rel) || expected == made)
                break;
        }
        return *made;
    }

    void fill(series& s) {
        const ::prometheus::Labels who{{"policy", s.policy}, {"name", s.name}};
        auto with = [&who](const char* label, std::string value) {
            ::prometheus::Labels l = who;
            l.emplace(label, std::move(value));
            return l;
        };
        const auto& buckets = options_.duration_buckets;
        // `outcome` says what the attempt or call did (returned or threw), `handled` what the
        // classifier made of it: a 503 that a retry retries is a success that was handled.
        auto ended = [&] {
            ::prometheus::Labels l = with("outcome", (s.sub & 1) ? "failure" : "success");
            l.emplace("handled", (s.sub & 2) ? "true" : "false");
            return l;
        };
        switch (s.kind) {
        case telemetry_kind::call:
            s.durations = &calls_->Add(ended(), buckets);
            return;
        case telemetry_kind::attempt:
            s.durations = &attempts_->Add(ended(), buckets);
            return;
        case telemetry_kind::queue_wait:
            s.durations = &queue_waits_->Add(who, buckets);
            break;
        case telemetry_kind::rejection: {
            const std::string reason = s.policy == "retry_budget"
                                           ? std::string("budget_exhausted")
                                           : std::string(to_string(static_cast<rejection_reason>(s.sub)));
            s.rejections = &rejections_->Add(with("reason", reason));
            break;
        }
        case telemetry_kind::state_change: {
            ::prometheus::Labels l = who;
            l.emplace("from", to_string(static_cast<circuit_state>(s.sub / 4)));
            l.emplace("to", to_string(static_cast<circuit_state>(s.sub % 4)));
            s.transitions = &transitions_->Add(l);
            break;
        }
        default:
            break;
        }
        s.events = &events_->Add(with("event", to_string(s.kind)));
    }

    metrics_options options_;
    std::shared_ptr<::prometheus::Registry> registry_;
    ::prometheus::Family<::prometheus::Histogram>* calls_ = nullptr;
    ::prometheus::Family<::prometheus::Histogram>* attempts_ = nullptr;
    ::prometheus::Family<::prometheus::Histogram>* queue_waits_ = nullptr;
    ::prometheus::Family<::prometheus::Counter>* events_ = nullptr;
    ::prometheus::Family<::prometheus::Counter>* rejections_ = nullptr;
    ::prometheus::Family<::prometheus::Counter>* transitions_ = nullptr;

    std::array<std::atomic<const series*>, slots> table_{};
    std::mutex make_mutex_;
    std::map<std::tuple<int, int, std::string, std::string>, std::unique_ptr<series>> made_;
};

/// The watched policies' gauges, read at each scrape. Holds copies of the policies' handles; kept
/// apart from the recorder, which a watched policy's own listener may keep alive (no cycle).
class watcher : public ::prometheus::Collectable {
public:
    explicit watcher(std::string prefix) : prefix_(std::move(prefix)) {}

    /// Adds a watched policy's reader; `what` and `name` must be new together.
    void watch(std::string what, std::string name,
               std::function<void(std::vector<::prometheus::MetricFamily>&)> read) {
        std::lock_guard lock(watch_mutex_);
        for (const watched_entry& w : watched_)
            if (w.what == what && w.name == name)
                throw std::invalid_argument("prometheus::metrics::watch: a " + what + " named '" + name +
                                            "' is watched already (its series would be reported twice)");
        watched_.push_back({std::move(what), std::move(name), std::move(read)});
    }

    /// The watched policies' gauges, read now.
    std::vector<::prometheus::MetricFamily> Collect() const override {
        std::vector<::prometheus::MetricFamily> out;
        std::lock_guard lock(watch_mutex_);
        for (const watched_entry& w : watched_)
            w.read(out);
        return out;
    }

    /// The family named `<prefix>_<suffix>` in `out`, added as a gauge when missing.
    ::prometheus::MetricFamily& gauge_family(std::vector<::prometheus::MetricFamily>& out,
                                             std::string_view suffix, std::string_view help) const {
        std::string full = prefix_;
        full += '_';
        full += suffix;
        for (::prometheus::MetricFamily& f : out)
            if (f.name == full)
                return f;
        ::prometheus::MetricFamily f;
        f.name = std::move(full);
        f.help = std::string(help);
        f.type = ::prometheus::MetricType::Gauge;
        out.push_back(std::move(f));
        return out.back();
    }

    /// A sample of `f` labelled `policy`, `name` and `more`, which are sorted by name as the
    /// registry's series' labels are, so that every series reads alike in the exposition.
    static void add_gauge(::prometheus::MetricFamily& f, std::string_view policy, const std::string& name,
                          std::vector<::prometheus::ClientMetric::Label> more, double value) {
        ::prometheus::ClientMetric m;
        m.label = std::move(more);
        m.label.push_back({"policy", std::string(policy)});
        m.label.push_back({"name", name});
        std::sort(m.label.begin(), m.label.end(),
                  [](const auto& a, const auto& b) { return a.name < b.name; });
        m.gauge.value = value;
        f.metric.push_back(std::move(m));
    }

private:
    struct watched_entry {
        std::string what;
        std::string name;
        std::function<void(std::vector<::prometheus::MetricFamily>&)> read;
    };

    std::string prefix_;
    mutable std::mutex watch_mutex_;
    std::vector<watched_entry> watched_;
};

} // namespace detail

/// A telemetry listener that keeps Prometheus series (see the file comment), plus gauges read from
/// the stateful policies it watches. A handle: copies share one state. Thread-safe: its listener may
/// be called from every thread at once, `watch` and scrapes may run beside it.
///
///     rs::prometheus::metrics m{registry};                         // series in your registry
///     rs::bulkhead db{{.name = "db", .max_concurrent_calls = 8, .telemetry = m.listener()}};
///     m.watch(db);
class metrics {
public:
    /// A registry of its own.
    metrics() : metrics(std::make_shared<::prometheus::Registry>()) {}
    explicit metrics(metrics_options options)
        : metrics(std::make_shared<::prometheus::Registry>(), std::move(options)) {}
    /// Series in `registry` (shared: other metrics of yours may live there too). Validates `options`
    /// and throws `std::invalid_argument` naming the field; the same for a null registry.
    explicit metrics(std::shared_ptr<::prometheus::Registry> registry, metrics_options options = {})
        : recorder_(std::make_shared<detail::recorder>(std::move(registry), std::move(options))),
          watcher_(std::make_shared<detail::watcher>(recorder_->options().prefix)) {}

    /// The listener to set: a policy's options `telemetry`, or a `telemetry` stage's. Copies share
    /// this state and keep it alive.
    [[nodiscard]] telemetry_listener listener() const {
        return telemetry_listener{[r = recorder_](const telemetry_event& e) { r->record(e); }};
    }
    /// Records one event, as the listener does.
    void operator()(const telemetry_event& e) const { recorder_->record(e); }

    /// The registry holding the event series.
    [[nodiscard]] const std::shared_ptr<::prometheus::Registry>& registry() const noexcept {
        return recorder_->registry();
    }
    /// The watched policies' gauges, read at each `Collect()` (a scrape). Register it beside the
    /// registry when you expose the registry yourself.
    [[nodiscard]] std::shared_ptr<::prometheus::Collectable> watched() const noexcept { return watcher_; }
    /// Everything, read now: the registry's families, then the watched gauges.
    [[nodiscard]] std::vector<::prometheus::MetricFamily> collect() const {
        std::vector<::prometheus::MetricFamily> all = recorder_->registry()->Collect();
        for (auto& f : watcher_->Collect())
            all.push_back(std::move(f));
        return all;
    }
    /// Registers the registry and the watched gauges with `exposer` at `uri`. The exposer holds
    /// them weakly: scrapes after the last copy of these metrics is gone return nothing of them.
    void expose(::prometheus::Exposer& exposer, const std::string& uri = "/metrics") const {
        exposer.RegisterCollectable(recorder_->registry(), uri);
        exposer.RegisterCollectable(watched(), uri);
    }

    [[nodiscard]] const metrics_options& options() const noexcept { return recorder_->options(); }

    /// Watches a breaker under `name` (empty: its `name` option):
    /// `<prefix>_circuit_state{policy="circuit_breaker",name,state}`, 1 for the state it is in (`state()`) and 0 for the others, and its sample (`metrics()`).
    /// Keeps a copy of the handle. Throws `std::invalid_argument` when a breaker of that name is
    /// watched already.
    template <clock C>
    void watch(const circuit_breaker<C>& breaker, std::string name = {}) {
        if (name.empty())
            name = breaker.name();
        const detail::watcher* st = watcher_.get();
        watcher_->watch(
            "circuit_breaker", name, [st, breaker, name](std::vector<::prometheus::MetricFamily>& out) {
                const circuit_metrics m = breaker.metrics();
                auto& state = st->gauge_family(out, "circuit_state",
                                               "A watched circuit breaker's state: 1 for the one it is in");
                for (circuit_state s : {circuit_state::closed, circuit_state::open, circuit_state::half_open,
                                        circuit_state::isolated})
                    detail::watcher::add_gauge(state, "circuit_breaker", name, {{"state", to_string(s)}},
                                               s == m.state ? 1.0 : 0.0);
                auto one = [&](std::string_view suffix, std::string_view help, std::uint64_t v) {
                    detail::watcher::add_gauge(st->gauge_family(out, suffix, help), "circuit_breaker", name,
                                               {}, static_cast<double>(v));
                };
                one("circuit_window_calls", "Calls in a watched breaker's sample now", m.calls);
                one("circuit_window_failures", "Failures in a watched breaker's sample now", m.failures);
                one("circuit_window_slow_calls", "Slow calls in a watched breaker's sample now",
                    m.slow_calls);
                one("circuit_consecutive_failures", "A watched breaker's current run of failures",
                    m.consecutive_failures);
            });
    }

    /// Watches a bulkhead: `<prefix>_bulkhead_in_flight`, `_queued` and `_limit` (`in_flight()`,
    /// `queued()`, `limit()`), labelled `policy="bulkhead"` and `name` (empty: its `name` option).
    template <clock C>
    void watch(const bulkhead<C>& slots, std::string name = {}) {
        if (name.empty())
            name = slots.name();
        const detail::watcher* st = watcher_.get();
        watcher_->watch("bulkhead", name, [st, slots, name](std::vector<::prometheus::MetricFamily>& out) {
            auto one = [&](std::string_view suffix, std::string_view help, std::size_t v) {
                detail::watcher::add_gauge(st->gauge_family(out, suffix, help), "bulkhead", name, {},
                                           static_cast<double>(v));
            };
            one("bulkhead_in_flight", "Calls holding a slot of a watched bulkhead now", slots.in_flight());
            one("bulkhead_queued", "Calls waiting for a slot of a watched bulkhead now", slots.queued());
            one("bulkhead_limit", "How many calls a watched bulkhead lets in at once now", slots.limit());
        });
    }

    /// Watches a token bucket: `<prefix>_limiter_tokens` (`tokens()`, fractional while refilling) and
    /// `<prefix>_limiter_queued` (`queued()`), labelled `policy="rate_limiter"` and `name`.
    template <clock C>
    void watch(const rate_limiter<C>& limiter, std::string name = {}) {
        watch_limiter("rate_limiter", limiter, std::move(name));
    }
    /// The same for a sliding window (`tokens()`: permits free now), `policy="sliding_window_limiter"`.
    template <clock C>
    void watch(const sliding_window_limiter<C>& limiter, std::string name = {}) {
        watch_limiter("sliding_window_limiter", limiter, std::move(name));
    }

    /// Watches a balancer: `<prefix>_balancer_endpoints`, `_ejected` and `_healthy` (the endpoints in
    /// the set, those ejected now, the others), labelled `policy="balancer"` and `name`.
    template <class E, clock C, random_source R>
    void watch(const balancer<E, C, R>& lb, std::string name = {}) {
        if (name.empty())
            name = lb.name();
        const detail::watcher* st = watcher_.get();
        watcher_->watch("balancer", name, [st, lb, name](std::vector<::prometheus::MetricFamily>& out) {
            const std::size_t all = lb.size(), out_now = lb.ejected();
            auto one = [&](std::string_view suffix, std::string_view help, std::size_t v) {
                detail::watcher::add_gauge(st->gauge_family(out, suffix, help), "balancer", name, {},
                                           static_cast<double>(v));
            };
            one("balancer_endpoints", "Endpoints in a watched balancer's set now", all);
            one("balancer_ejected", "Endpoints of a watched balancer ejected now", out_now);
            one("balancer_healthy", "Endpoints of a watched balancer not ejected now",
                all > out_now ? all - out_now : 0);
        });
    }

private:
    template <class L>
    void watch_limiter(const char* policy, const L& limiter, std::string name) {
        if (name.empty())
            name = limiter.name();
        const detail::watcher* st = watcher_.get();
        watcher_->watch(
            policy, name, [st, policy, limiter, name](std::vector<::prometheus::MetricFamily>& out) {
                detail::watcher::add_gauge(
                    st->gauge_family(out, "limiter_tokens", "Tokens or permits free now"), policy, name, {},
                    limiter.tokens());
                detail::watcher::add_gauge(
                    st->gauge_family(out, "limiter_queued", "Calls waiting for a token or permit now"),
                    policy, name, {}, static_cast<double>(limiter.queued()));
            });
    }

    std::shared_ptr<detail::recorder> recorder_;
    std::shared_ptr<detail::watcher> watcher_;
};

} // namespace resilience::prometheus
