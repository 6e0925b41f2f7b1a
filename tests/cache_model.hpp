// SPDX-License-Identifier: MIT
// A reference model of `rs::cache` (docs/cache.md), written from its documentation, and a runner that
// plays one scenario through the real cache on virtual time; tests/test_cache.cpp compares the two
// traces on seeded random scenarios (see tests/models.hpp for the vocabulary: events, choosers,
// scenario counts and seeds).
//
// A scenario is a list of calls, each of one key, arriving at distinct instants, some stopping later.
// The k-th call of the action for a key (whichever caller's action it is) follows the k-th step of
// that key's plan: a latency, then a value (key * 1000 + k), a failure the cache remembers by default,
// or a refusal it does not. Instants keep to grids, so that the documentation never has to order two
// things at one instant: arrivals at 1 mod 1000 ns, stops at 301, the ends of calls at 501 (latencies
// are 500 mod 1000), expiries and the ends of the stale windows at 751 (ttls are 250 mod 1000, windows
// whole microseconds), the ends of remembered failures at 626 (negative ttls are 125 mod 1000), and
// reconfigurations at 901.
#pragma once

#include "models.hpp"

#include <resilience/cache.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/telemetry.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace resilience_models {

/// The options a scenario changes (docs/cache.md, "Reconfiguring").
struct cache_limits {
    ns ttl = 1'000'250;
    ns swr = 0;          // stale_while_revalidate
    ns sie = 0;          // stale_if_error
    ns negative_ttl = 0; // 0: nothing remembered
    std::size_t max_entries = 1;
};

/// The cache is reconfigured to `to` at `at`.
struct cache_change {
    ns at = 901;
    cache_limits to{};
};

struct cache_setup : cache_limits {
    bool ttl_of = false;                 // each value's ttl from `cache_ttl_of`
    bool background = true;              // the `run` form: stale-while-revalidate refreshes in the background
    std::vector<cache_change> changes{}; // in order of their instants
};

struct cache_call {
    ns arrive = 1;
    int key = 0;
    std::optional<ns> stop_at{};
};

enum cache_result_kind { cache_value = 0, cache_boom = 1, cache_refused = 2 };

/// One call of the action: how long it takes and how it ends.
struct cache_step {
    ns latency = 500;
    int ends = cache_value;
};

/// The scenarios' `ttl_of`: a value's own time to live for two values in three, the cache's `ttl` for
/// the others.
inline std::optional<ns> cache_ttl_of(int value) {
    if (value % 3 == 0)
        return std::nullopt;
    return (value % 3) * 700'000 + 250;
}

inline std::string cache_failure_name(int ends) {
    return ends == cache_boom ? "remembered" : "refused";
}

/// What the cache documents, played on `calls` and `plans` (plans[key][k]: the k-th call of the
/// action for `key`). With `heard`, what its listener hears too, as `heard_event`s: the kind (and
/// the note of a `stale_served`), the duration, and "error" when the event carries one. Ends with
/// one "invocations" event per key and the number of entries left.
inline std::vector<event> model_cache(const cache_setup& s, const std::vector<cache_call>& calls,
                                      const std::vector<std::vector<cache_step>>& plans,
                                      std::vector<event>* heard) {
    std::vector<event> out;
    const auto hear = [&](ns at, const char* what, ns duration, bool error) {
        if (heard)
            heard->push_back(heard_event(at, what, duration, error ? "error" : ""));
    };

    // The options in force: lookups and the table follow them; a refresh, those it started with.
    cache_limits now_in_force = s;
    struct entry {
        bool has_value = false;
        int value = 0;
        ns expires = 0;
        bool has_negative = false;
        int negative = 0;
        ns failed = 0; // when the failure was remembered
    };
    std::map<int, entry> entries;
    std::list<int> order; // most recently used first
    const auto touch = [&](int key) {
        order.remove(key);
        order.push_front(key);
    };
    const auto use = [&](int key) -> entry* {
        auto it = entries.find(key);
        if (it == entries.end())
            return nullptr;
        touch(key);
        return &it->second;
    };
    const auto evict_down_to = [&](std::size_t n) {
        while (entries.size() > n) {
            entries.erase(order.back());
            order.pop_back();
        }
    };
    const auto upsert = [&](int key) -> entry& {
        if (entries.count(key) == 0) {
            entries[key] = entry{};
            order.push_front(key);
            evict_down_to(now_in_force.max_entries);
        } else {
            touch(key);
        }
        return entries[key];
    };

    struct flight {
        int key = 0;
        int index = 0; // the k of the key's plan
        ns start = 0, end = 0;
        int owner = -1; // a call, or -1: a background refresh
        bool owner_attached = true;
        std::vector<int> joiners;
        bool current = true; // callers of the key join it
        bool done = false;
        cache_limits options{}; // those in force when it started
    };
    std::vector<flight> flights;
    std::set<int> marks; // keys with a background refresh
    std::map<int, int> invocations;
    std::vector<int> waits_on(calls.size(), -1); // the flight a call waits for

    const auto current_of = [&](int key) -> int {
        for (std::size_t i = 0; i < flights.size(); ++i)
            if (flights[i].current && flights[i].key == key)
                return static_cast<int>(i);
        return -1;
    };
    const auto start = [&](int key, ns now, int owner) {
        flight f;
        f.key = key;
        f.index = invocations[key]++;
        f.start = now;
        f.end = now + plans[static_cast<std::size_t>(key)][static_cast<std::size_t>(f.index)].latency;
        f.owner = owner;
        f.options = now_in_force;
        flights.push_back(f);
        if (owner >= 0)
            waits_on[static_cast<std::size_t>(owner)] = static_cast<int>(flights.size()) - 1;
    };
    const auto ended = [&](int call, ns now, const entry* stale, const cache_step& step, int value) {
        if (step.ends == cache_value)
            out.push_back({call, now, "value", value});
        else if (stale)
            out.push_back({call, now, "value", stale->value});
        else
            out.push_back({call, now, "failure", -1, cache_failure_name(step.ends)});
        waits_on[static_cast<std::size_t>(call)] = -1;
    };

    const auto arrive = [&](int id, ns now) {
        const cache_call& c = calls[static_cast<std::size_t>(id)];
        const cache_limits& o = now_in_force;
        entry* e = use(c.key);
        if (e && e->has_value && now < e->expires) {
            out.push_back({id, now, "value", e->value});
            hear(now, "cache_hit", 0, false);
        } else if (e && e->has_negative && now < e->failed + o.negative_ttl) {
            if (e->has_value && now < e->expires + o.sie) {
                out.push_back({id, now, "value", e->value});
                hear(now, "stale_served:stale_if_error", now - e->expires, true);
            } else {
                out.push_back({id, now, "failure", -1, cache_failure_name(e->negative)});
                hear(now, "cache_hit", 0, true);
            }
        } else if (e && e->has_value && now < e->expires + o.swr &&
                   (marks.count(c.key) != 0 || current_of(c.key) >= 0 || s.background)) {
            out.push_back({id, now, "value", e->value});
            hear(now, "stale_served:stale_while_revalidate", now - e->expires, false);
            if (marks.count(c.key) == 0 && current_of(c.key) < 0) {
                marks.insert(c.key);
                start(c.key, now, -1);
            }
        } else {
            hear(now, "cache_miss", 0, false);
            const int f = current_of(c.key);
            if (f >= 0) {
                flights[static_cast<std::size_t>(f)].joiners.push_back(id);
                waits_on[static_cast<std::size_t>(id)] = f;
            } else {
                start(c.key, now, id);
            }
        }
    };

    const auto stop = [&](int id, ns now) {
        const int fi = waits_on[static_cast<std::size_t>(id)];
        if (fi < 0)
            return;
        flight& f = flights[static_cast<std::size_t>(fi)];
        if (f.owner == id) {
            if (!f.owner_attached)
                return;
            f.owner_attached = false; // it stays until the call ends
        } else {
            std::erase(f.joiners, id);
            out.push_back({id, now, "cancelled"});
            waits_on[static_cast<std::size_t>(id)] = -1;
        }
        const bool attached = f.owner < 0 || f.owner_attached || !f.joiners.empty();
        if (attached)
            return;
        // Every caller stopped: the call is stopped, ends now, and nothing is stored.
        f.current = false;
        f.done = true;
        if (f.owner >= 0) {
            out.push_back({f.owner, now, "cancelled"});
            waits_on[static_cast<std::size_t>(f.owner)] = -1;
        }
    };

    const auto finish = [&](flight& f, ns now) {
        f.done = true;
        f.current = false;
        const cache_step& step = plans[static_cast<std::size_t>(f.key)][static_cast<std::size_t>(f.index)];
        const int value = f.key * 1000 + f.index;
        const cache_limits& o = f.options;
        const entry* stale = nullptr;
        if (step.ends == cache_value) {
            entry& e = upsert(f.key);
            e.has_value = true;
            e.value = value;
            const std::optional<ns> own = s.ttl_of ? cache_ttl_of(value) : std::nullopt;
            e.expires = now + own.value_or(o.ttl);
            e.has_negative = false;
        } else {
            if (o.negative_ttl > 0 && step.ends == cache_boom) {
                entry& e = upsert(f.key);
                e.has_negative = true;
                e.negative = step.ends;
                e.failed = now;
            }
            auto it = entries.find(f.key);
            if (it != entries.end() && it->second.has_value && now < it->second.expires + o.sie)
                stale = &it->second;
        }
        std::vector<int> receivers = f.joiners;
        if (f.owner >= 0 && f.owner_attached)
            receivers.push_back(f.owner);
        for (int call : receivers) {
            ended(call, now, stale, step, value);
            if (stale)
                hear(now, "stale_served:stale_if_error", now - stale->expires, step.ends != cache_value);
        }
        if (f.owner >= 0 && !f.owner_attached) {
            out.push_back({f.owner, now, "cancelled"});
            waits_on[static_cast<std::size_t>(f.owner)] = -1;
        }
        if (f.owner < 0)
            marks.erase(f.key);
    };

    const call_instants instants = instants_of(calls);
    std::size_t a = 0, st = 0, ch = 0;
    for (;;) {
        ns now = INT64_MAX;
        if (ch < s.changes.size())
            now = std::min(now, s.changes[ch].at);
        if (a < instants.arrivals.size())
            now = std::min(now, instants.arrivals[a].first);
        if (st < instants.stops.size())
            now = std::min(now, instants.stops[st].first);
        for (const flight& f : flights)
            if (!f.done)
                now = std::min(now, f.end);
        if (now == INT64_MAX)
            break;
        for (; ch < s.changes.size() && s.changes[ch].at == now; ++ch) {
            now_in_force = s.changes[ch].to;
            evict_down_to(now_in_force.max_entries); // the least recently used first
        }
        for (; a < instants.arrivals.size() && instants.arrivals[a].first == now; ++a)
            arrive(instants.arrivals[a].second, now);
        for (; st < instants.stops.size() && instants.stops[st].first == now; ++st)
            stop(instants.stops[st].second, now);
        // Calls that end at one instant end in the order they started (their timers' order).
        for (std::size_t i = 0; i < flights.size(); ++i)
            if (!flights[i].done && flights[i].end == now)
                finish(flights[i], now);
    }
    for (const auto& [key, n] : invocations)
        out.push_back({-1, 0, "invocations", n, "key " + std::to_string(key)});
    out.push_back({-1, 0, "entries", static_cast<ns>(entries.size())});
    return out;
}

// ---------------------------------------------------------------------------------------------------------
// The real cache

/// The action of the scenarios: call k of `key` follows plans[key][k], counted in `invocations`.
struct planned_action {
    rs::testing::simulation* sim;
    const std::vector<std::vector<cache_step>>* plans;
    std::vector<int>* invocations;
    int key;

    rs::task<int> operator()(resilience::stop_token stop) const { return call(*this, std::move(stop)); }

    static rs::task<int> call(planned_action self, resilience::stop_token stop) {
        const int k = (*self.invocations)[static_cast<std::size_t>(self.key)]++;
        const cache_step step =
            (*self.plans)[static_cast<std::size_t>(self.key)][static_cast<std::size_t>(k)];
        co_await self.sim->sleep_for(std::chrono::nanoseconds{step.latency}, stop);
        if (stop.stop_requested())
            throw rs::cancelled_error{};
        if (step.ends == cache_boom)
            throw std::runtime_error("boom");
        if (step.ends == cache_refused)
            throw rs::bulkhead_rejected_error{};
        co_return self.key * 1000 + k;
    }
};

/// How a scenario reaches the cache: `run_outcome` (background refreshes), its policy alone, its
/// policy behind a `telemetry` stage (whose listener then hears), or behind a timeout that never fires.
enum class cache_route { run, policy, telemetry_stage, behind_timeout };

inline const char* cache_route_name(cache_route r) {
    switch (r) {
    case cache_route::run:
        return "run";
    case cache_route::policy:
        return "policy";
    case cache_route::telemetry_stage:
        return "telemetry_stage";
    case cache_route::behind_timeout:
        return "behind_timeout";
    }
    return "?";
}

/// Writes down the cache's events as the model's `heard_event`s.
inline rs::telemetry_listener cache_recorder(std::vector<event>& heard) {
    return [&heard](const rs::telemetry_event& e) {
        if (e.kind != rs::telemetry_kind::cache_hit && e.kind != rs::telemetry_kind::cache_miss &&
            e.kind != rs::telemetry_kind::stale_served)
            return;
        std::string what = rs::to_string(e.kind);
        if (!e.note.empty())
            what += ":" + std::string(e.note);
        heard.push_back(heard_event(e.at.count(), what, e.duration.count(), e.error ? "error" : ""));
    };
}

template <class Cache>
std::vector<event> run_cache(rs::testing::simulation& sim, const Cache& cache, cache_route r,
                             const std::vector<cache_call>& calls,
                             const std::vector<std::vector<cache_step>>& plans, std::vector<event>& heard,
                             const std::vector<timed_action>& changes = {}) {
    std::vector<int> invocations(plans.size(), 0);
    std::vector<event> out = run_calls(
        sim, calls,
        [&](std::vector<event>& trace, int id, const cache_call& c,
            resilience::stop_token stop) -> rs::task<void> {
            const planned_action action{&sim, &plans, &invocations, c.key};
            rs::outcome<int> result = rs::failure::make(std::logic_error("not called"));
            switch (r) {
            case cache_route::run:
                result = co_await cache.run_outcome(c.key, action, stop);
                break;
            case cache_route::policy: {
                // Policies are built in statements of their own (a g++ 12 bug: docs/core.md, "Compiler
                // notes").
                const auto p = cache.policy(c.key);
                result = co_await p.execute_outcome(action, stop);
                break;
            }
            case cache_route::telemetry_stage: {
                const rs::pipeline p{rs::telemetry{cache_recorder(heard), sim.clock()}, cache.policy(c.key)};
                result = co_await p.execute_outcome(action, stop);
                break;
            }
            case cache_route::behind_timeout: {
                const rs::pipeline p{rs::timeout{std::chrono::hours{1}, sim.clock()}, cache.policy(c.key)};
                result = co_await p.execute_outcome(action, stop);
                break;
            }
            }
            const ns now = sim.now().count();
            if (result.has_value())
                trace.push_back({id, now, "value", *result});
            else if (rs::is_cancellation(result.error()))
                trace.push_back({id, now, "cancelled"});
            else if (result.error().template is<rs::bulkhead_rejected_error>())
                trace.push_back({id, now, "failure", -1, "refused"});
            else
                trace.push_back({id, now, "failure", -1, "remembered"});
        },
        changes);
    for (std::size_t key = 0; key < invocations.size(); ++key)
        if (invocations[key] > 0)
            out.push_back({-1, 0, "invocations", invocations[key], "key " + std::to_string(key)});
    out.push_back({-1, 0, "entries", static_cast<ns>(cache.size())});
    return out;
}

/// The options of `rs::cache<int, int>` for `o`, with `ttl_of` when `ttl_of`, heard by `listener`.
inline rs::cache_options<int> cache_options_of(const cache_limits& o, bool ttl_of,
                                               rs::telemetry_listener listener) {
    return {.ttl = std::chrono::nanoseconds{o.ttl},
            .stale_while_revalidate = std::chrono::nanoseconds{o.swr},
            .stale_if_error = std::chrono::nanoseconds{o.sie},
            .max_entries = o.max_entries,
            .negative_ttl = std::chrono::nanoseconds{o.negative_ttl},
            .ttl_of =
                ttl_of ? std::function<std::optional<std::chrono::nanoseconds>(const int&)>{[](const int& v) {
                    const std::optional<ns> own = cache_ttl_of(v);
                    return own ? std::optional<std::chrono::nanoseconds>{std::chrono::nanoseconds{*own}}
                               : std::nullopt;
                }}
                       : nullptr,
            .telemetry = std::move(listener)};
}

inline comparison check_cache(chooser& pick) {
    cache_setup s;
    const auto micros = [&](std::int64_t lo, std::int64_t hi) { return pick.between(lo, hi) * 1'000; };
    const auto limits = [&](cache_limits& o) {
        o.ttl = micros(1, 40) + 250;
        o.swr = pick.coin(50) ? 0 : micros(1, 60);
        o.sie = pick.coin(50) ? 0 : micros(1, 60);
        o.negative_ttl = pick.coin(50) ? 0 : micros(0, 30) + 125;
        o.max_entries = static_cast<std::size_t>(pick.between(1, 4));
    };
    limits(s);
    s.ttl_of = pick.coin(30);
    const auto r = static_cast<cache_route>(pick.between(0, 3));
    s.background = r == cache_route::run;
    const int keys = static_cast<int>(pick.between(1, 4));

    std::vector<cache_call> calls(static_cast<std::size_t>(pick.between(1, 24)));
    ns t = 0;
    for (auto& c : calls) {
        t += micros(1, 25);
        c.arrive = t + 1;
        c.key = static_cast<int>(pick.between(0, keys - 1));
        if (pick.coin(15))
            c.stop_at = c.arrive + micros(0, 30) + 300;
    }
    const int fail_percent = static_cast<int>(pick.between(0, 70));
    std::vector<std::vector<cache_step>> plans(static_cast<std::size_t>(keys));
    for (auto& plan : plans) {
        plan.resize(calls.size());
        for (auto& step : plan) {
            step.latency = micros(0, 30) + 500;
            step.ends = !pick.coin(fail_percent) ? cache_value : pick.coin(60) ? cache_boom : cache_refused;
        }
    }
    // Half the scenarios reconfigure the cache, up to three times while the calls come.
    s.changes.resize(pick.coin(50) ? 0 : static_cast<std::size_t>(pick.between(1, 3)));
    for (auto& change : s.changes) {
        change.at = micros(0, t / 1'000 + 30) + 901;
        limits(change.to);
    }
    std::sort(s.changes.begin(), s.changes.end(),
              [](const cache_change& x, const cache_change& y) { return x.at < y.at; });

    comparison c;
    std::ostringstream setup;
    setup << "ttl=" << s.ttl << "ns swr=" << s.swr << "ns sie=" << s.sie
          << "ns negative_ttl=" << s.negative_ttl << "ns max_entries=" << s.max_entries
          << (s.ttl_of ? " ttl_of" : "") << " keys=" << keys << " calls=" << calls.size()
          << " failing=" << fail_percent << "% route=" << cache_route_name(r);
    for (const cache_change& change : s.changes)
        setup << " | at " << change.at << "ns: ttl=" << change.to.ttl << "ns swr=" << change.to.swr
              << "ns sie=" << change.to.sie << "ns negative_ttl=" << change.to.negative_ttl
              << "ns max_entries=" << change.to.max_entries;
    c.setup = setup.str();
    std::vector<event> expected_heard, heard;
    c.expected = sorted(model_cache(s, calls, plans, &expected_heard));
    rs::testing::simulation sim;
    const auto listener = [&] {
        return r == cache_route::telemetry_stage ? rs::telemetry_listener{} : cache_recorder(heard);
    };
    rs::cache<int, int, rs::testing::virtual_clock> cache{cache_options_of(s, s.ttl_of, listener()),
                                                          sim.clock()};
    std::vector<timed_action> changes;
    for (const cache_change& change : s.changes)
        changes.push_back({change.at, [&cache, &listener, o = change.to, ttl_of = s.ttl_of] {
                               cache.reconfigure(cache_options_of(o, ttl_of, listener()));
                           }});
    c.actual = sorted(run_cache(sim, cache, r, calls, plans, heard, changes));
    compare_heard(c, std::move(expected_heard), std::move(heard));
    return c;
}

} // namespace resilience_models
