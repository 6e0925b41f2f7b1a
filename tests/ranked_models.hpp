// SPDX-License-Identifier: MIT
// What the tests of priority classes share (test_priorities.cpp, test_queue_discipline.cpp): calls made
// with a class on virtual time and a journal of how they went; and the reference model of a bulkhead
// with priorities and a queue discipline, with the seeded scenarios that compare it with the policy.
#pragma once

#include "catch.hpp"
#include "models.hpp"
#include "support.hpp"

#include <resilience/any_policy.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/priority.hpp>
#include <resilience/queue_discipline.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/telemetry.hpp>
#include <resilience/testing/simulation.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace resilience_ranked {

namespace rs = resilience;
namespace rm = resilience_models;
using std::chrono::nanoseconds;

// ---------------------------------------------------------------------------------------------------------
// Calls with a class, and their journal

// The context of a call of class `cls` (none: the property unset), stopped by `stop`.
inline rs::context with_class(std::optional<int> cls, resilience::stop_token stop = {}) {
    rs::context ctx{std::move(stop)};
    if (cls)
        ctx.set_property(rs::priority, *cls);
    return ctx;
}

// How a call ended, in one line: "value", "rejected queue_full", "limited no_capacity 100000000ns",
// "cancelled".
inline std::string how(const rs::outcome<int>& r) {
    if (r.has_value())
        return "value";
    if (auto* e = r.error().as<rs::bulkhead_rejected_error>())
        return "rejected " + rm::reason_name(e->reason());
    if (auto* e = r.error().as<rs::rate_limited_error>())
        return "limited " + rm::reason_name(e->reason()) + " " + std::to_string(e->retry_after().count()) +
               "ns";
    if (rs::is_cancellation(r.error()))
        return "cancelled";
    return "failure";
}

struct call {
    int id = 0;
    nanoseconds arrive{};
    std::optional<int> cls{};
    nanoseconds hold{};
    bool fail = false;
    resilience::stop_token stop{};
};

// When each call's action started (in order) and when and how each call ended.
struct journal {
    std::vector<std::pair<int, nanoseconds>> started;
    std::map<int, std::pair<nanoseconds, std::string>> ended;

    std::vector<int> start_order() const { return resilience_tests::ids_of(started); }
    nanoseconds started_at(int id) const { return resilience_tests::instant_of(started, id); }
};

// Arrives at `c.arrive`, runs an action holding what it was admitted to for `c.hold`, and writes
// down when the action started and how the call ended.
template <class Policy>
rs::task<void> client(rs::testing::simulation& sim, const Policy& p, journal& j, call c) {
    if (c.arrive > sim.now())
        co_await sim.sleep_for(c.arrive - sim.now());
    // Named, then passed as an lvalue (docs/core.md#compiler-notes).
    auto action = [&sim, &j, c](resilience::stop_token st) -> rs::task<int> {
        j.started.emplace_back(c.id, sim.now());
        if (c.hold > nanoseconds::zero())
            co_await sim.sleep_for(c.hold, st);
        if (c.fail)
            throw std::runtime_error("boom");
        co_return c.id;
    };
    auto r = co_await p.execute_outcome(action, with_class(c.cls, c.stop));
    j.ended[c.id] = {sim.now(), how(r)};
}

template <class Policy>
void spawn_all(rs::testing::simulation& sim, const Policy& p, journal& j, const std::vector<call>& calls) {
    for (const call& c : calls)
        sim.spawn(client(sim, p, j, c));
}

using ended = std::pair<nanoseconds, std::string>;

// ---------------------------------------------------------------------------------------------------------
// The reference model of a bulkhead with priorities (written from priority.hpp; see test_priorities.cpp)
// and a queue discipline (written from docs/bulkhead.md; see test_queue_discipline.cpp), and the runner
// that plays the same calls through the policy

struct ranked_call {
    rm::ns arrive = 1;
    rm::ns hold = 0; // bulkhead: how long the action runs once admitted
    std::optional<rm::ns> stop_at{};
    std::optional<int> cls{}; // the `rs::priority` property; none: unset
};

struct class_setup {
    int classes = 1;
    std::vector<int> quarters; // the share reserved for each class, in quarters (empty: none)
    int default_class = 0;

    rs::priority_classes options() const {
        rs::priority_classes p{.classes = static_cast<std::size_t>(classes), .default_class = default_class};
        for (int q : quarters)
            p.reserved.push_back(q / 4.0);
        return p;
    }
    int class_of(const ranked_call& c) const {
        if (!c.cls)
            return default_class;
        return std::clamp(*c.cls, 0, classes - 1);
    }
    // What a call of class k leaves for the classes above.
    rm::ns keep(int k, rm::ns limit) const {
        rm::ns q = 0;
        for (std::size_t j = static_cast<std::size_t>(k) + 1; j < quarters.size(); ++j)
            q += quarters[j];
        return limit * q / 4;
    }
    std::string text() const {
        std::ostringstream out;
        out << "classes=" << classes << " reserved(quarters)={";
        for (int q : quarters)
            out << q << ",";
        out << "} default_class=" << default_class;
        return out.str();
    }
};

inline class_setup classes_of(rm::chooser& pick) {
    class_setup s;
    s.classes = static_cast<int>(pick.between(1, 3));
    s.default_class = static_cast<int>(pick.between(0, s.classes - 1));
    if (pick.coin(70)) {
        int left = 3; // the shares add up to less than 1
        s.quarters.push_back(0);
        for (int k = 1; k < s.classes; ++k) {
            const int q = static_cast<int>(pick.between(0, left));
            s.quarters.push_back(q);
            left -= q;
        }
    }
    return s;
}

// How densely `ranked_calls` draws calls: at most `calls` of them, up to `gap` units apart (0: 200 µs
// for a bulkhead's, 400 µs or ms for a limiter's), each holding its slot (with `holds`) up to `hold` µs.
struct density {
    std::int64_t calls = 14;
    rm::ns gap = 0, hold = 400;
};

inline std::vector<ranked_call> ranked_calls(rm::chooser& pick, const class_setup& s, bool holds,
                                             density d = {}) {
    std::vector<ranked_call> calls(static_cast<std::size_t>(pick.between(1, d.calls)));
    const rm::ns unit = holds || pick.coin(50) ? 1'000 : 1'000'000;
    rm::ns t = 0;
    for (auto& c : calls) {
        if (pick.coin(70))
            t += pick.between(0, d.gap != 0 ? d.gap : holds ? 200 : 400) * unit;
        c.arrive = t + 1;
        if (holds)
            c.hold = pick.between(1, d.hold) * 1'000;
        if (pick.coin(15))
            c.stop_at = c.arrive + pick.between(0, 300) * unit + 249;
        if (!pick.coin(20))
            c.cls = static_cast<int>(pick.between(-1, s.classes));
    }
    return calls;
}

struct model_waiter {
    int call;
    int rank;
    rm::ns deadline;
    rm::ns arrived = 0; // for a queue discipline
};

// Queues `w` behind every waiter of its class or above.
inline void insert_ranked(std::vector<model_waiter>& queue, model_waiter w) {
    auto at =
        std::find_if(queue.begin(), queue.end(), [&](const model_waiter& q) { return q.rank < w.rank; });
    queue.insert(at, w);
}

/// The callers that stop at `now` (from `instants.stops[s]` on): each one still queued is told
/// "cancelled" and taken out with `gone(it)`.
template <class Gone>
void stops_at(rm::ns now, const rm::call_instants& instants, std::size_t& s, std::vector<model_waiter>& queue,
              std::vector<rm::event>& out, const Gone& gone) {
    for (; s < instants.stops.size() && instants.stops[s].first == now; ++s) {
        const int id = instants.stops[s].second;
        auto it =
            std::find_if(queue.begin(), queue.end(), [id](const model_waiter& w) { return w.call == id; });
        if (it != queue.end()) {
            out.push_back({id, now, "cancelled"});
            gone(it);
        }
    }
}

inline bool any_from(const std::vector<model_waiter>& queue, int rank) {
    return std::any_of(queue.begin(), queue.end(), [&](const model_waiter& q) { return q.rank >= rank; });
}

// A bulkhead's queue discipline, as the model applies it (docs/bulkhead.md, "Queue disciplines").
struct model_discipline {
    int kind = 0; // 0 fifo, 1 codel, 2 adaptive lifo
    rm::ns target = 0, interval = 0;

    rs::queue_discipline options() const {
        if (kind == 1)
            return rs::codel{.target = nanoseconds{target}, .interval = nanoseconds{interval}};
        if (kind == 2)
            return rs::adaptive_lifo{.target = nanoseconds{target}, .interval = nanoseconds{interval}};
        return rs::fifo{};
    }
    std::string text() const {
        if (kind == 0)
            return "discipline=fifo";
        return std::string(kind == 1 ? "discipline=codel" : "discipline=adaptive_lifo") +
               " target=" + std::to_string(target) + "ns interval=" + std::to_string(interval) + "ns";
    }
};

// A hand-over under `d` at `now` to the class of the front waiter (a slot freed, a permit due): it
// samples the wait of the oldest waiter of that class: at most the target ends a standing queue; above
// it, the class's queue stands from the first such sample and is overloaded from that instant plus the
// interval. While overloaded and no lower class waits, the class's waiters that waited more than the
// target are taken out onto `shed`. Returns the waiter to serve, taken out (adaptive LIFO's newest
// while overloaded, else the oldest), or nothing when the class was shed whole. A class that empties
// stands no more (`standing`, one per class: when it is overloaded from; none while it does not stand).
inline std::optional<model_waiter> model_hand_over(std::vector<model_waiter>& queue,
                                                   std::vector<std::optional<rm::ns>>& standing,
                                                   const model_discipline& d, rm::ns now,
                                                   std::vector<model_waiter>& shed) {
    const int k = queue.front().rank;
    const auto count = [&] {
        return static_cast<std::size_t>(
            std::count_if(queue.begin(), queue.end(), [k](const model_waiter& w) { return w.rank == k; }));
    };
    std::optional<rm::ns>& from = standing[static_cast<std::size_t>(k)];
    bool overloaded = false;
    if (d.kind != 0) {
        if (now - queue.front().arrived <= d.target) {
            from.reset();
        } else {
            if (!from)
                from = now + d.interval;
            overloaded = now >= *from;
        }
    }
    if (overloaded && count() == queue.size())
        while (!queue.empty() && now - queue.front().arrived > d.target) {
            shed.push_back(queue.front());
            queue.erase(queue.begin());
        }
    std::optional<model_waiter> served;
    if (const std::size_t n = count(); n != 0) {
        // The class is the front of the queue.
        const auto at = queue.begin() + static_cast<std::ptrdiff_t>(overloaded && d.kind == 2 ? n - 1 : 0);
        served = *at;
        queue.erase(at);
    }
    if (count() == 0)
        from.reset();
    return served;
}

// A freed slot goes to the front waiter when its class may take it, by `model_hand_over` under a
// discipline; a class shed whole passes the slot on.
inline std::vector<rm::event> model_ranked_bulkhead(rm::ns slots, std::size_t queue_limit,
                                                    std::optional<rm::ns> queue_timeout,
                                                    const class_setup& cs,
                                                    const std::vector<ranked_call>& calls,
                                                    const model_discipline& d = {}) {
    std::vector<rm::event> out;
    std::vector<model_waiter> queue;
    std::vector<std::optional<rm::ns>> overloaded_from(
        static_cast<std::size_t>(cs.classes));   // none: not standing
    std::vector<std::pair<rm::ns, int>> running; // (ends at, call), in admission order
    rm::ns busy = 0;
    const rm::ns forever = INT64_MAX;
    const auto cap = [&](int rank) { return slots - cs.keep(rank, slots); };
    const auto count = [&](int rank) {
        return static_cast<std::size_t>(std::count_if(
            queue.begin(), queue.end(), [rank](const model_waiter& w) { return w.rank == rank; }));
    };
    const auto leave = [&](std::vector<model_waiter>::iterator it) {
        const int k = it->rank;
        auto next = queue.erase(it);
        if (count(k) == 0)
            overloaded_from[static_cast<std::size_t>(k)].reset();
        return next;
    };
    const auto admit = [&](int id, rm::ns now) {
        ++busy;
        out.push_back({id, now, "admitted"});
        running.emplace_back(now + calls[static_cast<std::size_t>(id)].hold, id);
    };
    const auto hand_over = [&](rm::ns now) {
        while (!queue.empty() && busy < cap(queue.front().rank)) {
            std::vector<model_waiter> shed;
            const std::optional<model_waiter> served = model_hand_over(queue, overloaded_from, d, now, shed);
            for (const model_waiter& w : shed)
                out.push_back({w.call, now, "bulkhead_rejected", -1, "shed"});
            if (served) {
                admit(served->call, now);
                return;
            }
        }
    };
    const rm::call_instants instants = rm::instants_of(calls);
    std::size_t a = 0, s = 0;
    for (;;) {
        rm::ns now = forever;
        if (a < instants.arrivals.size())
            now = std::min(now, instants.arrivals[a].first);
        if (s < instants.stops.size())
            now = std::min(now, instants.stops[s].first);
        for (auto& r : running)
            now = std::min(now, r.first);
        for (auto& w : queue)
            now = std::min(now, w.deadline);
        if (now == forever)
            break;
        for (; a < instants.arrivals.size() && instants.arrivals[a].first == now; ++a) {
            const int id = instants.arrivals[a].second;
            const int k = cs.class_of(calls[static_cast<std::size_t>(id)]);
            const model_waiter w{id, k, queue_timeout ? now + *queue_timeout : forever, now};
            if (!any_from(queue, k) && busy < cap(k)) {
                admit(id, now);
            } else if (queue.size() >= queue_limit) {
                if (!queue.empty() && queue.back().rank < k) {
                    out.push_back({queue.back().call, now, "bulkhead_rejected", -1, "queue_full"});
                    leave(queue.end() - 1);
                    insert_ranked(queue, w);
                } else {
                    out.push_back(
                        {id, now, "bulkhead_rejected", -1, queue_limit == 0 ? "no_capacity" : "queue_full"});
                }
            } else {
                insert_ranked(queue, w);
            }
        }
        stops_at(now, instants, s, queue, out, leave);
        for (std::size_t i = 0; i < running.size();) {
            if (running[i].first != now) {
                ++i;
                continue;
            }
            out.push_back({running[i].second, now, "value"});
            running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
            --busy;
            hand_over(now);
        }
        for (auto it = queue.begin(); it != queue.end();) {
            if (it->deadline == now) {
                out.push_back({it->call, now, "bulkhead_rejected", -1, "queue_timeout"});
                it = leave(it);
            } else {
                ++it;
            }
        }
    }
    return out;
}

// The limiters' model; `Meter` is tests/models.hpp's, `limit` what the shares are of. The limiter's
// front waiter takes its permit as soon as its class may (at `available_at(now, keep)`); the deadlines
// of the waiters behind it are watched too. Under a discipline, the permit due is handed over by
// `model_hand_over`; a waiter shed is told when a permit would be there for it behind the waiters of
// its class and above still queued.
template <class Meter>
std::vector<rm::event> model_ranked_limiter(Meter meter, rm::ns limit, std::size_t queue_limit,
                                            std::optional<rm::ns> queue_timeout, const class_setup& cs,
                                            const std::vector<ranked_call>& calls,
                                            const model_discipline& d = {}) {
    std::vector<rm::event> out;
    std::vector<model_waiter> queue;
    std::vector<std::optional<rm::ns>> standing(static_cast<std::size_t>(cs.classes));
    // Takes out the waiter at `it`; a class that empties stands no more.
    const auto erase = [&](std::vector<model_waiter>::iterator it) {
        const int k = it->rank;
        queue.erase(it);
        if (!std::any_of(queue.begin(), queue.end(), [k](const model_waiter& w) { return w.rank == k; }))
            standing[static_cast<std::size_t>(k)].reset();
    };
    const rm::ns forever = INT64_MAX;
    const auto keep = [&](int rank) { return static_cast<std::size_t>(cs.keep(rank, limit)); };
    const auto take = [&](rm::ns now, int rank) {
        return meter.available_at(now, keep(rank)) <= now && meter.try_take(now);
    };
    const auto admitted = [&](int id, rm::ns now) {
        out.push_back({id, now, "admitted"});
        out.push_back({id, now, "value"});
    };
    const auto refused = [&](int id, rm::ns now, std::size_t ahead, int rank, const char* why) {
        out.push_back({id, now, "rate_limited", meter.available_at(now, ahead + keep(rank)) - now, why});
    };
    // Serves the front waiter at `now` until it must wait; returns when it wants to look again.
    const auto serve = [&](rm::ns now) -> rm::ns {
        while (!queue.empty()) {
            const model_waiter head = queue.front();
            if (d.kind != 0 && meter.available_at(now, keep(head.rank)) <= now) {
                std::vector<model_waiter> shed;
                if (const std::optional<model_waiter> served =
                        model_hand_over(queue, standing, d, now, shed)) {
                    meter.try_take(now);
                    admitted(served->call, now);
                }
                const auto ahead = static_cast<std::size_t>(std::count_if(
                    queue.begin(), queue.end(), [&](const model_waiter& q) { return q.rank >= head.rank; }));
                for (const model_waiter& w : shed)
                    refused(w.call, now, ahead, w.rank, "shed");
                continue;
            }
            if (take(now, head.rank)) {
                admitted(head.call, now);
                erase(queue.begin());
                continue;
            }
            if (now >= head.deadline) {
                refused(head.call, now, 0, head.rank, "queue_timeout");
                erase(queue.begin());
                continue;
            }
            rm::ns wake = std::min(head.deadline, meter.available_at(now, keep(head.rank)));
            if (any_from(queue, 1)) {
                for (std::size_t i = 1; i < queue.size();) {
                    if (queue[i].deadline <= now) {
                        refused(queue[i].call, now, i, queue[i].rank, "queue_timeout");
                        erase(queue.begin() + static_cast<std::ptrdiff_t>(i));
                    } else {
                        wake = std::min(wake, queue[i].deadline);
                        ++i;
                    }
                }
            }
            return wake;
        }
        return forever;
    };
    const rm::call_instants instants = rm::instants_of(calls);
    std::size_t a = 0, s = 0;
    rm::ns wake = forever;
    for (;;) {
        rm::ns now = wake;
        if (a < instants.arrivals.size())
            now = std::min(now, instants.arrivals[a].first);
        if (s < instants.stops.size())
            now = std::min(now, instants.stops[s].first);
        if (now == forever)
            break;
        for (; a < instants.arrivals.size() && instants.arrivals[a].first == now; ++a) {
            const int id = instants.arrivals[a].second;
            const int k = cs.class_of(calls[static_cast<std::size_t>(id)]);
            const model_waiter w{id, k, queue_timeout ? now + *queue_timeout : forever, now};
            if (!any_from(queue, k) && take(now, k)) {
                admitted(id, now);
            } else if (queue.size() >= queue_limit) {
                if (!queue.empty() && queue.back().rank < k) {
                    refused(queue.back().call, now, queue.size() - 1, queue.back().rank, "queue_full");
                    erase(queue.end() - 1);
                    insert_ranked(queue, w);
                } else {
                    const auto ahead = static_cast<std::size_t>(std::count_if(
                        queue.begin(), queue.end(), [&](const model_waiter& q) { return q.rank >= k; }));
                    refused(id, now, ahead, k, queue_limit == 0 ? "no_capacity" : "queue_full");
                }
            } else {
                insert_ranked(queue, w);
            }
        }
        stops_at(now, instants, s, queue, out, erase);
        wake = serve(now);
    }
    return out;
}

// Plays `calls` through `policy` (on `sim`'s clock), writing down when each action started and how
// each call ended.
template <class Policy>
std::vector<rm::event> run_ranked(rs::testing::simulation& sim, const Policy& policy,
                                  const std::vector<ranked_call>& calls) {
    return rm::run_calls(
        sim, calls,
        [&](std::vector<rm::event>& out, int id, const ranked_call& c,
            resilience::stop_token stop) -> rs::task<void> {
            auto action = [&out, &sim, id, hold = c.hold]() -> rs::task<int> {
                out.push_back({id, sim.now().count(), "admitted"});
                if (hold > 0)
                    co_await sim.sleep_for(nanoseconds{hold}); // ignores stop: it holds its slot
                co_return id;
            };
            const auto r = co_await policy.execute_outcome(std::move(action), with_class(c.cls, stop));
            const rm::ns now = sim.now().count();
            if (r.has_value())
                out.push_back({id, now, "value"});
            else if (auto* full = r.error().template as<rs::bulkhead_rejected_error>())
                out.push_back({id, now, "bulkhead_rejected", -1, rm::reason_name(full->reason())});
            else if (auto* limited = r.error().template as<rs::rate_limited_error>())
                out.push_back({id, now, "rate_limited", limited->retry_after().count(),
                               rm::reason_name(limited->reason())});
            else if (rs::is_cancellation(r.error()))
                out.push_back({id, now, "cancelled"});
            else
                out.push_back({id, now, "unexpected failure"});
        });
}

// The model's trace against the policy's, called directly or through `any_policy` (its `run`).
template <class Model, class Make>
rm::comparison compare(std::string setup, rm::chooser& pick, Model model, Make make,
                       const std::vector<ranked_call>& calls) {
    const bool through_any = pick.coin(30);
    rm::comparison c;
    c.setup = std::move(setup) + (through_any ? " route=any_policy" : " route=direct");
    c.expected = rm::sorted(model());
    rs::testing::simulation sim;
    const auto policy = make(sim);
    c.actual = rm::sorted(through_any ? run_ranked(sim, rs::any_policy<int>{policy}, calls)
                                      : run_ranked(sim, policy, calls));
    return c;
}

inline std::string timeout_text(std::optional<rm::ns> t) {
    return t ? std::to_string(*t) + "ns" : "none";
}

// ---------------------------------------------------------------------------------------------------------
// Seeded scenarios of the bulkhead and the limiters with priorities (test_priorities.cpp) and, when
// `disciplined`, with a queue discipline too (test_queue_discipline.cpp): then denser, so that queues
// stand (for a bulkhead up to 24 calls up to 40 µs apart, each holding its slot up to 100 µs; targets and
// intervals whole microseconds, or milliseconds for a limiter whose calls are), with longer queues and
// larger limits (which make the reserves' `keep` common). Without a discipline the draws are those the
// priorities' scenarios always made.

// A discipline for a scenario whose calls are `unit` apart (and hold their slot a few `unit`s).
inline model_discipline discipline_of(rm::chooser& pick, rm::ns unit) {
    return {.kind = static_cast<int>(pick.between(0, 2)),
            .target = pick.between(1, 40) * unit,
            .interval = pick.between(1, 150) * unit};
}

inline rm::comparison check_ranked_bulkhead(rm::chooser& pick, bool disciplined = false) {
    const class_setup cs = classes_of(pick);
    const rm::ns slots = pick.between(1, disciplined ? 4 : 6);
    const std::size_t queue_limit = disciplined && pick.coin(20)
                                        ? rs::unbounded_queue
                                        : static_cast<std::size_t>(pick.between(0, disciplined ? 8 : 4));
    std::optional<rm::ns>
        queue_timeout; // assigned, not made by ?: (g++ 12 -O2 sees it as maybe uninitialized)
    if (pick.coin(disciplined ? 30 : 40))
        queue_timeout = pick.between(0, 300) * 1'000 + 500;
    const model_discipline d = disciplined ? discipline_of(pick, 1'000) : model_discipline{};
    // A listener times every wait, so that under fifo too every waiter keeps the instant it queued.
    const bool listener = disciplined && pick.coin(30);
    const std::vector<ranked_call> calls =
        ranked_calls(pick, cs, true, disciplined ? density{.calls = 24, .gap = 40, .hold = 100} : density{});
    std::ostringstream setup;
    setup << "max_concurrent_calls=" << slots << " queue_limit=" << queue_limit
          << " queue_timeout=" << timeout_text(queue_timeout) << " " << cs.text();
    if (disciplined)
        setup << " " << d.text() << " listener=" << listener;
    std::vector<rm::event> heard;
    return compare(
        setup.str(), pick,
        [&] { return model_ranked_bulkhead(slots, queue_limit, queue_timeout, cs, calls, d); },
        [&](rs::testing::simulation& sim) {
            return rs::bulkhead{{.max_concurrent_calls = static_cast<std::size_t>(slots),
                                 .queue_limit = queue_limit,
                                 .queue_timeout = rm::as_duration(queue_timeout),
                                 .priorities = cs.options(),
                                 .queue_discipline = d.options(),
                                 .telemetry = listener ? rm::recorder(heard) : rs::telemetry_listener{}},
                                sim.clock()};
        },
        calls);
}

// The queue options of a limiter's scenario, and its calls.
struct limiter_queue {
    std::size_t queue_limit = 0;
    std::optional<rm::ns> queue_timeout{};
    model_discipline discipline{};
    std::vector<ranked_call> calls{};

    limiter_queue(rm::chooser& pick, const class_setup& cs, bool disciplined)
        : queue_limit(disciplined && pick.coin(30)
                          ? rs::unbounded_queue
                          : static_cast<std::size_t>(pick.between(0, disciplined ? 10 : 4))),
          queue_timeout(rm::queue_timeout_of(pick)) {
        if (disciplined)
            discipline = discipline_of(pick, pick.coin(50) ? 1'000 : 1'000'000);
        calls = ranked_calls(pick, cs, false, disciplined ? density{.calls = 24, .gap = 20} : density{});
    }
    std::string text(const class_setup& cs) const {
        return "queue_limit=" + std::to_string(queue_limit) +
               " queue_timeout=" + timeout_text(queue_timeout) + " " + cs.text() +
               (discipline.kind != 0 ? " " + discipline.text() : "");
    }
};

inline rm::comparison check_ranked_token_bucket(rm::chooser& pick, bool disciplined = false) {
    static constexpr rm::ns rates[] = {1, 2, 4, 5, 8, 10, 20, 25, 40, 50, 100, 1000, 1'000'000};
    const class_setup cs = classes_of(pick);
    const rm::ns tokens = pick.between(1, disciplined ? 8 : 6);
    const rm::ns rate = pick.pick(rates);
    const limiter_queue q{pick, cs, disciplined};
    return compare(
        "token_limit=" + std::to_string(tokens) + " tokens_per_second=" + std::to_string(rate) + " " +
            q.text(cs),
        pick,
        [&] {
            return model_ranked_limiter(rm::token_bucket_meter{tokens, 1'000'000'000 / rate}, tokens,
                                        q.queue_limit, q.queue_timeout, cs, q.calls, q.discipline);
        },
        [&](rs::testing::simulation& sim) {
            return rs::rate_limiter{{.token_limit = static_cast<std::size_t>(tokens),
                                     .tokens_per_second = static_cast<double>(rate),
                                     .queue_limit = q.queue_limit,
                                     .queue_timeout = rm::as_duration(q.queue_timeout),
                                     .priorities = cs.options(),
                                     .queue_discipline = q.discipline.options()},
                                    sim.clock()};
        },
        q.calls);
}

inline rm::comparison check_ranked_sliding_window(rm::chooser& pick, bool disciplined = false) {
    static constexpr rm::ns windows[] = {1'000'000'000, 100'000'000, 999'999'999,
                                         1'000'000'007, 3'000'000,   7'000};
    const class_setup cs = classes_of(pick);
    const rm::ns permits = pick.between(1, disciplined ? 8 : 6);
    const rm::ns window = pick.pick(windows);
    const rm::ns segments = pick.between(1, 7);
    const limiter_queue q{pick, cs, disciplined};
    return compare(
        "permit_limit=" + std::to_string(permits) + " window=" + std::to_string(window) +
            "ns segments=" + std::to_string(segments) + " " + q.text(cs),
        pick,
        [&] {
            return model_ranked_limiter(rm::sliding_window_meter{permits, window, segments}, permits,
                                        q.queue_limit, q.queue_timeout, cs, q.calls, q.discipline);
        },
        [&](rs::testing::simulation& sim) {
            return rs::sliding_window_limiter{{.permit_limit = static_cast<std::size_t>(permits),
                                               .window = nanoseconds{window},
                                               .segments = static_cast<std::size_t>(segments),
                                               .queue_limit = q.queue_limit,
                                               .queue_timeout = rm::as_duration(q.queue_timeout),
                                               .priorities = cs.options(),
                                               .queue_discipline = q.discipline.options()},
                                              sim.clock()};
        },
        q.calls);
}

} // namespace resilience_ranked
