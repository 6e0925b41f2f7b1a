// SPDX-License-Identifier: MIT
// rs::reloadable<P> (docs/reconfiguration.md): reloads while calls run on the virtual-time loop, calls in
// flight finishing on the snapshot they started on, which is destroyed after the last of them (also when
// the calls are destroyed without being resumed, and when the last handle goes first), bad options
// refused with the old snapshot in force, reloadable as a stage of a pipeline, and threads calling while
// another thread reloads.

#include "catch.hpp"
#include "support.hpp"

#include <resilience/circuit_breaker.hpp>
#include <resilience/error.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/outcome.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/reloadable.hpp>
#include <resilience/retry.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace test_reloadable {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_tests::invalid_argument_message;
using rs::testing::simulation;
using vclock = rs::testing::virtual_clock;

namespace {

// The instances of `tagged` alive now (copies and moves included), across threads.
std::atomic<int> live{0};
// The version of the last `tagged` a call ran through on this thread.
thread_local int last_version = -1;

// A policy that lets the call through, writing down its version: which snapshot a call ran on.
struct tagged : rs::policy_base<tagged> {
    int version = 0;
    std::vector<int>* log = nullptr; // one thread only

    explicit tagged(int v, std::vector<int>* l = nullptr) : version(v), log(l) { ++live; }
    tagged(const tagged& o) : rs::policy_base<tagged>(), version(o.version), log(o.log) { ++live; }
    tagged(tagged&& o) noexcept : rs::policy_base<tagged>(), version(o.version), log(o.log) { ++live; }
    tagged& operator=(const tagged&) = default;
    ~tagged() { --live; }

    template <class Next>
    rs::task<rs::next_outcome_t<Next>> run(Next next, const rs::context& ctx) const {
        last_version = version;
        if (log)
            log->push_back(version);
        co_return co_await next(ctx);
    }
};

// Runs for `d` of virtual time, then returns 7 (or throws; cancelled when stopped before).
struct slow_action {
    simulation* sim;
    std::chrono::nanoseconds d = 0ns;
    bool fail = false;
    rs::task<int> operator()(resilience::stop_token st) const {
        if (d > 0ns)
            co_await sim->sleep_for(d, st);
        if (st.stop_requested())
            throw rs::cancelled_error{};
        if (fail)
            throw std::runtime_error("scripted failure");
        co_return 7;
    }
};

rs::task<void> keep(rs::task<rs::outcome<int>> call, std::optional<rs::outcome<int>>& out) {
    out.emplace(co_await std::move(call));
}

} // namespace

static_assert(rs::policy<rs::reloadable<tagged>>);
static_assert(rs::policy<rs::reloadable<rs::retry<>>>);
static_assert(rs::policy<rs::reloadable<rs::pipeline<rs::retry<>, rs::circuit_breaker<>, rs::timeout<>>>>);

TEST_CASE("reloadable: calls in flight finish on their snapshot, which is destroyed after the last of them",
          "[reloadable]") {
    REQUIRE(live == 0);
    simulation sim;
    std::vector<int> log;
    {
        rs::reloadable<tagged> policy{tagged{1, &log}};
        CHECK(live == 1);
        std::optional<rs::outcome<int>> a, b, c;
        sim.spawn(keep(policy.execute_outcome(slow_action{&sim, 10s}), a)); // on version 1 until 10s
        sim.spawn(keep(policy.execute_outcome(slow_action{&sim, 5s}), b));  // on version 1 until 5s
        sim.run_until(1s);
        policy.reload(tagged{2, &log});
        CHECK(policy.current()->version == 2);
        CHECK(live == 2);                                                  // version 1 is still in use
        sim.spawn(keep(policy.execute_outcome(slow_action{&sim, 1s}), c)); // on version 2
        sim.run_until(5s);
        CHECK(b->has_value());
        CHECK(live == 2);
        sim.run_until(10s - 1ns);
        CHECK(live == 2);
        sim.run_until(10s);
        CHECK(a->value() == 7);
        CHECK(live == 1); // destroyed as its last call ended
        CHECK(c->value() == 7);
        CHECK(log == std::vector<int>{1, 1, 2});
    }
    CHECK(live == 0);
}

TEST_CASE("reloadable: a reload with no call running destroys the old snapshot at once, and a pin taken "
          "with current() keeps one alive",
          "[reloadable]") {
    REQUIRE(live == 0);
    {
        rs::reloadable<tagged> policy{tagged{1}};
        policy.reload(tagged{2});
        CHECK(live == 1);
        auto pinned = policy.current();
        policy.reload(tagged{3});
        CHECK(live == 2);
        CHECK(pinned->version == 2);
        CHECK(policy.current()->version == 3);
        const rs::reloadable<tagged> copy = policy; // copies share the snapshot
        copy.reload(tagged{4});
        CHECK(policy.current()->version == 4);
        CHECK(live == 2);
        pinned.reset();
        CHECK(live == 1);
        pinned = policy.current();
    } // the handles go first; the pin keeps the snapshot (and what it needs) alive
    CHECK(live == 0);
}

TEST_CASE("reloadable: a reloaded timeout bounds the calls made after, not those in flight", "[reloadable]") {
    simulation sim;
    rs::reloadable<rs::timeout<vclock>> policy{rs::timeout<vclock>{5s, sim.clock()}};
    std::optional<rs::outcome<int>> before, after;
    sim.spawn(keep(policy.execute_outcome(slow_action{&sim, 8s}), before));
    sim.run_until(1s);
    policy.reconfigure(10s, sim.clock());
    sim.spawn(keep(policy.execute_outcome(slow_action{&sim, 8s}), after));
    sim.run_until(5s);
    REQUIRE(before);
    CHECK(before->error().is<rs::timeout_error>()); // at 5s: the old bound
    CHECK_FALSE(after);
    sim.run_until(9s);
    REQUIRE(after);
    CHECK(after->value() == 7);
}

TEST_CASE("reloadable: bad options are refused as at construction, and the snapshot in force stays",
          "[reloadable]") {
    simulation sim;
    rs::reloadable<rs::retry<vclock>> policy{rs::retry<vclock>{
        {.max_attempts = 2, .backoff = rs::constant_backoff{1s, rs::jitter::none}}, sim.clock()}};
    CHECK(invalid_argument_message([&] {
              policy.reconfigure(rs::retry_options{.max_attempts = 0}, sim.clock());
          }) == "resilience::retry: max_attempts must be at least 1, got 0");
    CHECK(policy.current()->options().max_attempts == 2);
    int ran = 0;
    auto failing = [&]() -> rs::task<int> {
        ++ran;
        throw std::runtime_error("scripted failure");
        co_return 0;
    };
    CHECK(sim.run(policy.execute_outcome(failing)).has_failure());
    CHECK(ran == 2);
    CHECK(sim.now() == 1s);
    policy.reconfigure(
        rs::retry_options{.max_attempts = 3, .backoff = rs::constant_backoff{2s, rs::jitter::none}},
        sim.clock());
    CHECK(sim.run(policy.execute_outcome(failing)).has_failure());
    CHECK(ran == 5);
    CHECK(sim.now() == 5s);
}

TEST_CASE("reloadable: a pipeline reloaded with the same breaker keeps the breaker's state", "[reloadable]") {
    simulation sim;
    rs::circuit_breaker<vclock> breaker{{.failure_threshold = 1, .break_duration = 10s}, sim.clock()};
    auto make = [&](std::chrono::nanoseconds limit) {
        return rs::pipeline{breaker, rs::timeout<vclock>{limit, sim.clock()}};
    };
    rs::reloadable policy{make(1s)};
    CHECK(sim.run(policy.execute_outcome(slow_action{&sim, 2s})).error().is<rs::timeout_error>());
    CHECK(breaker.state() == rs::circuit_state::open); // opened at 1s
    policy.reload(make(5s));
    auto refused = sim.run(policy.execute_outcome(slow_action{&sim, 2s}));
    REQUIRE(refused.has_failure());
    CHECK(refused.error().as<rs::circuit_open_error>()->retry_after() == 10s);
    sim.run_until(11s);
    CHECK(sim.run(policy.execute_outcome(slow_action{&sim, 2s})).value() == 7); // the new limit: 5s
    CHECK(breaker.state() == rs::circuit_state::closed);
}

TEST_CASE("reloadable: as a stage of a pipeline, each pass takes the snapshot current then", "[reloadable]") {
    simulation sim;
    std::vector<int> log;
    rs::reloadable<tagged> stage{tagged{1, &log}};
    const rs::pipeline policy{
        rs::retry<vclock>{{.max_attempts = 3, .backoff = rs::constant_backoff{1s, rs::jitter::none}},
                          sim.clock()},
        stage};
    std::optional<rs::outcome<int>> r;
    sim.spawn(keep(policy.execute_outcome(slow_action{&sim, 0s, true}), r));
    sim.run_until(500ms); // the first attempt failed at 0s
    stage.reload(tagged{2, &log});
    sim.run_until(1500ms); // the second at 1s
    stage.reload(tagged{3, &log});
    sim.run_all();
    CHECK(r->has_failure());
    CHECK(log == std::vector<int>{1, 2, 3});
    CHECK(sim.now() == 2s);
}

TEST_CASE("reloadable: calls destroyed without being resumed give their snapshots back, whichever goes "
          "first",
          "[reloadable]") {
    REQUIRE(live == 0);
    const int order = GENERATE(0, 1);
    {
        auto sim = std::make_unique<simulation>();
        auto policy = std::make_unique<rs::reloadable<tagged>>(tagged{1});
        auto outer = std::make_unique<rs::pipeline<rs::reloadable<tagged>>>(*policy);
        sim->spawn(policy->execute_outcome(slow_action{sim.get(), 1h})); // on version 1
        sim->spawn(outer->execute_outcome(slow_action{sim.get(), 1h}));  // on version 1, through a stage
        sim->run_for(1s);
        policy->reload(tagged{2});
        sim->spawn(policy->execute_outcome(slow_action{sim.get(), 1h})); // on version 2, the current one
        sim->run_for(1s);
        CHECK(live == 2);
        if (order == 0) { // the handles and the pipeline, then the loop with the calls
            outer.reset();
            policy.reset();
            CHECK(live == 2);
            sim.reset();
        } else { // the loop first: the calls go, then the handles
            sim.reset();
            CHECK(live == 1);
            outer.reset();
            policy.reset();
        }
    }
    CHECK(live == 0);
}

TEST_CASE("reloadable: four threads call while another reloads, each call on one whole snapshot",
          "[reloadable][concurrency]") {
    REQUIRE(live == 0);
    {
        rs::reloadable<rs::pipeline<tagged, rs::retry<>>> policy{rs::pipeline{tagged{0}, rs::retry<>{}}};
        constexpr int threads = 4, calls = 5'000;
        std::atomic<bool> calling{true};
        std::atomic<int> versions{0};
        std::thread reloader([&] {
            int v = 0;
            while (calling.load()) {
                ++v;
                policy.reconfigure(tagged{v}, rs::retry<>{{.max_attempts = 1 + v % 3}});
                if (v % 8 == 0) {
                    auto pin = policy.current(); // a pin taken and given back among the calls
                    (void)pin->get<0>().version;
                }
            }
            versions = v;
        });
        std::atomic<int> values{0}, out_of_order{0};
        std::vector<std::thread> callers;
        for (int t = 0; t < threads; ++t)
            callers.emplace_back([&] {
                int seen = -1;
                for (int i = 0; i < calls; ++i) {
                    auto r = rs::sync_wait(policy.execute_outcome([]() -> rs::task<int> { co_return 1; }));
                    values += r.has_value() ? 1 : 0;
                    // A thread never runs on a snapshot older than one it has run on.
                    out_of_order += last_version < seen ? 1 : 0;
                    seen = last_version;
                }
            });
        for (auto& c : callers)
            c.join();
        calling = false;
        reloader.join();
        CHECK(values.load() == threads * calls);
        CHECK(out_of_order.load() == 0);
        CHECK(versions.load() > 0);
        CHECK(live == 1); // every replaced snapshot is gone
    }
    CHECK(live == 0);
}

// The interleaving that test above met once in a thousand runs, step by step on the state: a call
// loads the current snapshot's block, a reload retires that snapshot (it dies: no call was on it),
// and the call's increment finds the block dead. Before it gives the increment back, a second reload
// builds its snapshot in that free block, counting the passing increment in, and a third retires it.
// The passing pin is then that snapshot's last, and must destroy it (it used to take the count to zero
// with a bare decrement, and the snapshot, its hold on the state and everything after leaked).
TEST_CASE("reloadable: a pin that finds its block dead, built again and retired before it backs off, "
          "destroys the snapshot it was last to hold",
          "[reloadable][regression]") {
    REQUIRE(live == 0);
    {
        rs::reloadable<tagged> policy{tagged{0}};
        using state_type = rs::detail::reload_state<tagged>;
        auto& state =
            *static_cast<state_type*>(const_cast<void*>(rs::detail::handle_access::address(policy)));
        auto* const block = state.pin(); // the block of the first snapshot; its pin given back at once
        state.unpin(block);
        policy.reload(tagged{1}); // retires the first snapshot, which dies: its block is free
        CHECK(live == 1);
        // A call that loaded `block` before that reload adds itself now, and finds it dead.
        const std::uint64_t before = block->pins.fetch_add(1, std::memory_order_acquire);
        REQUIRE((before & state_type::block::dead) != 0);
        policy.reload(tagged{2}); // built in `block`, with the passing increment counted in
        CHECK(policy.current()->version == 2);
        policy.reload(tagged{3}); // retires it: the passing pin now holds it alone
        CHECK(live == 2);
        CHECK_FALSE(state.pinned(block, before)); // backs off: the snapshot of version 2 dies here
        CHECK(live == 1);
        CHECK(policy.current()->version == 3);
    }
    CHECK(live == 0); // the state went with the last handle: nothing held it
}

namespace {

// The snapshots of each version alive now (copies included), for the scenarios below.
std::map<int, int> versions_alive;
struct versioned : rs::policy_base<versioned> {
    int version;
    explicit versioned(int v) : version(v) { ++versions_alive[version]; }
    versioned(const versioned& o) : rs::policy_base<versioned>(), version(o.version) {
        ++versions_alive[version];
    }
    versioned(versioned&& o) noexcept : rs::policy_base<versioned>(), version(o.version) {
        ++versions_alive[version];
    }
    versioned& operator=(const versioned&) = delete;
    ~versioned() { --versions_alive[version]; }
    template <class Next>
    rs::task<rs::next_outcome_t<Next>> run(Next next, const rs::context& ctx) const {
        co_return co_await next(ctx);
    }
};

// One scenario: three callers and a reloader take steps in an order drawn from `seed`, on the
// state's own pin in its three steps (the load of the current block, the increment, the rest:
// `pinned`), a call's end (`unpin`) and `reload`. After every step, a snapshot is alive only if it is
// the current one, a call runs on it, or a pin passing its block holds it; a call runs on the
// snapshot that was current at its pin, alive until it ends. At the end, with every call ended, only
// the current snapshot is left; with the handle gone, none. Returns what failed, or an empty string.
std::string play_pins(std::uint64_t seed) {
    using state_type = rs::detail::reload_state<versioned>;
    using block_type = state_type::block;
    std::mt19937_64 rng{seed};
    const auto draw = [&](int n) { return static_cast<int>(rng() % static_cast<std::uint64_t>(n)); };
    enum class phase { idle, loaded, added, running };
    struct caller {
        phase at = phase::idle;
        block_type* block = nullptr;
        std::uint64_t before = 0;
        int version = -1; // the snapshot it runs on
    };
    std::string failed;
    {
        rs::reloadable<versioned> policy{versioned{0}};
        auto& state =
            *static_cast<state_type*>(const_cast<void*>(rs::detail::handle_access::address(policy)));
        const auto current_block = [&] { // a load of the current block, as `pin` does first
            block_type* const b = state.pin();
            state.unpin(b);
            return b;
        };
        int current = 0;
        caller callers[3];
        const auto check = [&](const std::string& step) {
            for (const auto& [v, n] : versions_alive) {
                if (n < 0 || n > 1)
                    return failed = step + ": version " + std::to_string(v) + " alive " + std::to_string(n) +
                                    " times";
                if (n == 0 || v == current)
                    continue;
                bool held = false;
                for (const caller& c : callers)
                    held = held || (c.at == phase::running && c.version == v) ||
                           (c.at == phase::added && !(c.block->pins.load() & block_type::dead) &&
                            c.block->policy.version == v);
                if (!held)
                    return failed = step + ": version " + std::to_string(v) + " alive, and nothing holds it";
            }
            if (versions_alive[current] != 1)
                return failed = step + ": the current version " + std::to_string(current) + " is not alive";
            for (const caller& c : callers)
                if (c.at == phase::running && versions_alive[c.version] != 1)
                    return failed =
                               step + ": a call's version " + std::to_string(c.version) + " died under it";
            return failed;
        };
        const auto step = [&](caller& c) {
            switch (c.at) {
            case phase::idle:
                c.block = current_block();
                c.at = phase::loaded;
                break;
            case phase::loaded:
                c.before = c.block->pins.fetch_add(1, std::memory_order_acquire);
                c.at = phase::added;
                break;
            case phase::added:
                if (state.pinned(c.block, c.before)) {
                    c.version = c.block->policy.version;
                    if (c.version != current)
                        failed = "a call pinned version " + std::to_string(c.version) + " where " +
                                 std::to_string(current) + " is current";
                    c.at = phase::running;
                } else {
                    c.at = phase::idle;
                }
                break;
            case phase::running:
                state.unpin(c.block);
                c.at = phase::idle;
                break;
            }
        };
        for (int i = 0; i < 60 && failed.empty(); ++i) {
            const int who = draw(4);
            if (who == 3) {
                policy.reload(versioned{++current});
                check("reload to " + std::to_string(current));
            } else {
                step(callers[who]);
                check("caller " + std::to_string(who));
            }
        }
        for (caller& c : callers) // every call ends
            while (failed.empty() && c.at != phase::idle)
                step(c);
        for (const auto& [v, n] : versions_alive)
            if (failed.empty() && n != (v == current ? 1 : 0))
                failed = "with every call ended, version " + std::to_string(v) + " alive " +
                         std::to_string(n) + " times";
    }
    for (const auto& [v, n] : versions_alive)
        if (failed.empty() && n != 0)
            failed = "with the handle gone, version " + std::to_string(v) + " alive " + std::to_string(n) +
                     " times";
    versions_alive.clear();
    return failed;
}

} // namespace

TEST_CASE("reloadable: seeded scenarios of pins, backed-off pins, call ends and reloads leave alive exactly "
          "the snapshots something holds",
          "[reloadable][model]") {
    int n = 5'000; // RESILIENCE_MODEL_SCENARIOS overrides, as for the other model tests (scripts/dev model N)
    if (const char* v = std::getenv("RESILIENCE_MODEL_SCENARIOS"); v && std::atoi(v) > 0)
        n = std::atoi(v);
    for (int i = 0; i < n; ++i) {
        const std::uint64_t seed = 0x5eed'0000ULL + static_cast<std::uint64_t>(i);
        const std::string failed = play_pins(seed);
        INFO("seed " << seed << ": " << failed);
        REQUIRE(failed.empty());
    }
}

} // namespace test_reloadable
