// SPDX-License-Identifier: MIT
// What a reconfiguration keeps in memory (docs/reconfiguration.md): 10^5 reconfigurations of each kind
// (10^4 under a sanitizer, where each costs ten times as much), with no call in flight, grow the heap by
// less than 10 bytes each; calls in flight keep the options they started with, and the heap comes back to
// that level when they end; options equal to those in force make nothing at all. The heap is measured as
// the bytes malloc has handed out and not taken back (glibc's `mallinfo2`, or the sanitizer's own count
// under ASan and TSan).

#include "catch.hpp"
#include "support.hpp"

#include <resilience/adaptive_throttle.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/cache.hpp>
#include <resilience/circuit_breaker.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/registry.hpp>
#include <resilience/reloadable.hpp>
#include <resilience/retry.hpp>
#include <resilience/retry_budget.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/testing/simulation.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TEST_RECONFIGURE_MEMORY_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TEST_RECONFIGURE_MEMORY_SANITIZER 1
#endif
#endif
#ifdef TEST_RECONFIGURE_MEMORY_SANITIZER
// Declared here: g++ ships no <sanitizer/allocator_interface.h>, but both runtimes define it.
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#elif defined(__GLIBC__)
#include <malloc.h>
#endif

namespace test_reconfigure_memory {

namespace rs = resilience;
using namespace std::chrono_literals;
using rs::testing::simulation;
using vclock = rs::testing::virtual_clock;

namespace {

constexpr std::size_t reconfigurations = resilience_tests::stress_rounds(100'000);
constexpr std::ptrdiff_t allowed = 10 * static_cast<std::ptrdiff_t>(reconfigurations);

// The bytes of the heap in use now, or -1 where this platform does not say.
std::ptrdiff_t heap_in_use() {
#ifdef TEST_RECONFIGURE_MEMORY_SANITIZER
    return static_cast<std::ptrdiff_t>(__sanitizer_get_current_allocated_bytes());
#elif defined(__GLIBC__)
    const struct mallinfo2 m = mallinfo2();
    return static_cast<std::ptrdiff_t>(m.uordblks + m.hblkhd);
#else
    return -1;
#endif
}

// What `reconfigure(i)` for i in [0, reconfigurations) leaves on the heap, after two to warm up.
template <class F>
std::ptrdiff_t growth(F&& reconfigure) {
    reconfigure(std::size_t{0});
    reconfigure(std::size_t{1});
    const std::ptrdiff_t before = heap_in_use();
    for (std::size_t i = 0; i < reconfigurations; ++i)
        reconfigure(i);
    return heap_in_use() - before;
}

// An action that takes `d` of virtual time.
struct sleeper {
    simulation* sim;
    std::chrono::nanoseconds d;
    rs::task<int> operator()() const {
        co_await sim->sleep_for(d);
        co_return 7;
    }
};

rs::task<void> call_on(simulation& sim, auto policy, std::chrono::nanoseconds d) {
    (void)co_await policy.execute_outcome(sleeper{&sim, d});
}

// Reconfigures `n` times while calls run (one started every tenth of the way, each lasting to the
// end), and returns what is left on the heap once they all have ended, against before the first.
template <class Start, class F>
std::ptrdiff_t growth_with_calls(simulation& sim, Start&& start, F&& reconfigure) {
    reconfigure(std::size_t{0});
    reconfigure(std::size_t{1});
    sim.run_all();
    const std::ptrdiff_t before = heap_in_use();
    {
        for (std::size_t i = 0; i < reconfigurations; ++i) {
            if (i % (reconfigurations / 10) == 0)
                start(1h - std::chrono::seconds{i / (reconfigurations / 10)});
            reconfigure(i);
            if (i % 1000 == 0)
                sim.run_for(0ns); // the calls started reach their action and wait there
        }
        sim.run_all();
    }
    return heap_in_use() - before;
}

} // namespace

TEST_CASE("reconfigure memory: reconfigurations with no call in flight keep less than 10 bytes each",
          "[reconfigure][memory]") {
    if (heap_in_use() < 0) {
        WARN("no count of the heap on this platform");
        return;
    }
    simulation sim;

    SECTION("circuit_breaker") {
        rs::circuit_breaker<vclock> b{{.failure_threshold = 5}, sim.clock()};
        CHECK(growth([&](std::size_t i) {
                  b.reconfigure({.failure_threshold = 5 + static_cast<int>(i % 2)});
              }) < allowed);
    }
    SECTION("circuit_breaker with a sample") {
        rs::circuit_breaker<vclock> b{{}, sim.clock()};
        CHECK(growth([&](std::size_t i) {
                  b.reconfigure({.name = "b", .break_duration = 5s + std::chrono::seconds{i % 2}});
              }) < allowed);
    }
    SECTION("bulkhead") {
        rs::bulkhead<vclock> h{{.max_concurrent_calls = 10}, sim.clock()};
        CHECK(growth([&](std::size_t i) { h.reconfigure({.max_concurrent_calls = 10 + i % 2}); }) < allowed);
    }
    SECTION("adaptive bulkhead") {
        rs::bulkhead<vclock> h{{.max_concurrent_calls = 10, .adapt = rs::aimd{}}, sim.clock()};
        CHECK(growth([&](std::size_t i) {
                  h.reconfigure({.max_concurrent_calls = 10, .adapt = rs::aimd{.max = 200 + i % 2}});
              }) < allowed);
    }
    SECTION("rate_limiter") {
        rs::rate_limiter<vclock> l{{.token_limit = 10, .tokens_per_second = 100}, sim.clock()};
        CHECK(growth([&](std::size_t i) {
                  l.reconfigure({.token_limit = 10, .tokens_per_second = 100.0 + static_cast<double>(i % 2)});
              }) < allowed);
    }
    SECTION("sliding_window_limiter") {
        rs::sliding_window_limiter<vclock> l{{.permit_limit = 10, .window = 1s}, sim.clock()};
        CHECK(growth([&](std::size_t i) { l.reconfigure({.permit_limit = 10 + i % 2, .window = 1s}); }) <
              allowed);
    }
    SECTION("rate_limiter with priorities, between two settings") {
        rs::rate_limiter<vclock> l{
            {.token_limit = 10, .tokens_per_second = 100, .priorities = {.classes = 2}}, sim.clock()};
        CHECK(growth([&](std::size_t i) {
                  l.reconfigure(
                      {.token_limit = 10 + i % 2, .tokens_per_second = 100, .priorities = {.classes = 2}});
              }) < allowed);
    }
    SECTION("adaptive_throttle") {
        rs::adaptive_throttle<vclock> t{{}, sim.clock()};
        CHECK(growth([&](std::size_t i) { t.reconfigure({.k = 2.0 + static_cast<double>(i % 2)}); }) <
              allowed);
    }
    SECTION("retry_budget") {
        rs::retry_budget r{{}};
        CHECK(growth([&](std::size_t i) {
                  r.reconfigure({.ratio = 0.2 + 0.1 * static_cast<double>(i % 2)});
              }) < allowed);
    }
    SECTION("cache") {
        rs::cache<std::string, int, vclock> c{{.ttl = 1s}, sim.clock()};
        CHECK(growth([&](std::size_t i) { c.reconfigure({.ttl = 1s + std::chrono::nanoseconds{i % 2}}); }) <
              allowed);
    }
    SECTION("reloadable<retry>") {
        rs::reloadable r{rs::retry<vclock>{{.max_attempts = 3}, sim.clock()}};
        CHECK(growth([&](std::size_t i) {
                  r.reconfigure(rs::retry_options{.max_attempts = 3 + static_cast<int>(i % 2)}, sim.clock());
              }) < allowed);
    }
    SECTION("registry.reconfigure") {
        rs::registry<> policies;
        (void)policies.breaker("payments", {.failure_threshold = 5});
        CHECK(growth([&](std::size_t i) {
                  policies.reconfigure("payments", rs::circuit_breaker_options{
                                                       .failure_threshold = 5 + static_cast<int>(i % 2)});
              }) < allowed);
    }
}

TEST_CASE("reconfigure memory: a breaker reconfigured with the options in force makes nothing",
          "[reconfigure][memory][circuit_breaker]") {
    if (heap_in_use() < 0) {
        WARN("no count of the heap on this platform");
        return;
    }
    simulation sim;
    rs::circuit_breaker<vclock> b{{.name = "b", .failure_threshold = 5}, sim.clock()};
    CHECK(growth([&](std::size_t) { b.reconfigure({.name = "b", .failure_threshold = 5}); }) == 0);
    rs::circuit_breaker<vclock> sampled{{}, sim.clock()};
    const rs::classifier handle_all{[](const rs::failure&) { return true; }};
    sampled.reconfigure({.should_handle = handle_all});
    CHECK(growth([&](std::size_t) { sampled.reconfigure({.should_handle = handle_all}); }) == 0);
    CHECK(sampled.options().should_handle.same_as(handle_all));
}

TEST_CASE("reconfigure memory: every kind reconfigured with the options in force makes nothing",
          "[reconfigure][memory]") {
    if (heap_in_use() < 0) {
        WARN("no count of the heap on this platform");
        return;
    }
    simulation sim;
    const rs::telemetry_listener heard = [](const rs::telemetry_event&) {};
    rs::bulkhead<vclock> h{{.name = "h", .max_concurrent_calls = 10, .adapt = rs::aimd{}, .telemetry = heard},
                           sim.clock()};
    CHECK(growth([&](std::size_t) {
              h.reconfigure(
                  {.name = "h", .max_concurrent_calls = 10, .adapt = rs::aimd{}, .telemetry = heard});
          }) == 0);
    rs::rate_limiter<vclock> l{{.token_limit = 10, .tokens_per_second = 100, .priorities = {.classes = 2}},
                               sim.clock()};
    CHECK(growth([&](std::size_t) {
              l.reconfigure({.token_limit = 10, .tokens_per_second = 100, .priorities = {.classes = 2}});
          }) == 0);
    rs::sliding_window_limiter<vclock> w{{.permit_limit = 10, .window = 1s}, sim.clock()};
    CHECK(growth([&](std::size_t) { w.reconfigure({.permit_limit = 10, .window = 1s}); }) == 0);
    rs::adaptive_throttle<vclock> t{{.name = "t"}, sim.clock()};
    CHECK(growth([&](std::size_t) { t.reconfigure({.name = "t"}); }) == 0);
    rs::cache<std::string, int, vclock> c{{.name = "c", .ttl = 1s}, sim.clock()};
    CHECK(growth([&](std::size_t) { c.reconfigure({.name = "c", .ttl = 1s}); }) == 0);
    rs::registry<> policies;
    (void)policies.bulkhead("db", {.max_concurrent_calls = 4});
    CHECK(growth([&](std::size_t) {
              policies.reconfigure("db", rs::bulkhead_options{.max_concurrent_calls = 4});
          }) == 0);
}

TEST_CASE("reconfigure memory: calls in flight keep their options, which go when the calls end",
          "[reconfigure][memory]") {
    if (heap_in_use() < 0) {
        WARN("no count of the heap on this platform");
        return;
    }
    simulation sim;

    SECTION("circuit_breaker, plain options") {
        rs::circuit_breaker<vclock> b{{.failure_threshold = 5}, sim.clock()};
        CHECK(growth_with_calls(
                  sim, [&](std::chrono::nanoseconds d) { sim.spawn(call_on(sim, b, d)); },
                  [&](std::size_t i) { b.reconfigure({.failure_threshold = 5 + static_cast<int>(i % 2)}); }) <
              allowed);
    }
    SECTION("circuit_breaker with a sample") {
        rs::circuit_breaker<vclock> b{{}, sim.clock()};
        CHECK(growth_with_calls(
                  sim, [&](std::chrono::nanoseconds d) { sim.spawn(call_on(sim, b, d)); },
                  [&](std::size_t i) {
                      b.reconfigure({.break_duration = 5s + std::chrono::seconds{i % 2}});
                  }) < allowed);
    }
    SECTION("bulkhead") {
        rs::bulkhead<vclock> h{{.max_concurrent_calls = 100}, sim.clock()};
        CHECK(growth_with_calls(
                  sim, [&](std::chrono::nanoseconds d) { sim.spawn(call_on(sim, h, d)); },
                  [&](std::size_t i) { h.reconfigure({.max_concurrent_calls = 100 + i % 2}); }) < allowed);
    }
    SECTION("adaptive bulkhead") {
        rs::bulkhead<vclock> h{{.max_concurrent_calls = 100, .adapt = rs::aimd{}}, sim.clock()};
        CHECK(growth_with_calls(
                  sim, [&](std::chrono::nanoseconds d) { sim.spawn(call_on(sim, h, d)); },
                  [&](std::size_t i) {
                      h.reconfigure({.max_concurrent_calls = 100, .adapt = rs::aimd{.max = 200 + i % 2}});
                  }) < allowed);
    }
    SECTION("rate_limiter") {
        rs::rate_limiter<vclock> l{{.token_limit = 100, .tokens_per_second = 100}, sim.clock()};
        CHECK(growth_with_calls(
                  sim, [&](std::chrono::nanoseconds d) { sim.spawn(call_on(sim, l, d)); },
                  [&](std::size_t i) {
                      l.reconfigure(
                          {.token_limit = 100, .tokens_per_second = 100.0 + static_cast<double>(i % 2)});
                  }) < allowed);
    }
    SECTION("sliding_window_limiter") {
        rs::sliding_window_limiter<vclock> l{{.permit_limit = 100, .window = 1s}, sim.clock()};
        CHECK(growth_with_calls(
                  sim, [&](std::chrono::nanoseconds d) { sim.spawn(call_on(sim, l, d)); },
                  [&](std::size_t i) { l.reconfigure({.permit_limit = 100 + i % 2, .window = 1s}); }) <
              allowed);
    }
    SECTION("adaptive_throttle") {
        rs::adaptive_throttle<vclock> t{{}, sim.clock()};
        CHECK(growth_with_calls(
                  sim, [&](std::chrono::nanoseconds d) { sim.spawn(call_on(sim, t, d)); },
                  [&](std::size_t i) { t.reconfigure({.k = 2.0 + static_cast<double>(i % 2)}); }) < allowed);
    }
    SECTION("reloadable<retry>") {
        rs::reloadable r{rs::retry<vclock>{{.max_attempts = 3}, sim.clock()}};
        CHECK(growth_with_calls(
                  sim, [&](std::chrono::nanoseconds d) { sim.spawn(call_on(sim, r, d)); },
                  [&](std::size_t i) {
                      r.reconfigure(rs::retry_options{.max_attempts = 3 + static_cast<int>(i % 2)},
                                    sim.clock());
                  }) < allowed);
    }
}

TEST_CASE("reconfigure memory: four threads call while another reconfigures every kind, plain options and "
          "options that pin alternating",
          "[reconfigure][memory][concurrency]") {
    // Run under ThreadSanitizer and AddressSanitizer: a call that reads a block freed under it, or a
    // block freed twice, shows there. Every other call fails, so failure paths pin too.
    const rs::classifier all = [](const rs::failure&) { return true; };
    rs::circuit_breaker<> breaker{{.failure_threshold = 1'000'000}};
    rs::bulkhead<> pool{{.max_concurrent_calls = 100}};
    rs::rate_limiter<> bucket{{.token_limit = 1'000'000, .tokens_per_second = 1e9}};
    rs::sliding_window_limiter<> window{{.permit_limit = 1'000'000, .window = 1s}};
    rs::adaptive_throttle<> throttle{{.k = 1e9}};
    rs::cache<int, int> cache{{.ttl = 1ns}};
    rs::reloadable reloading{rs::retry<>{{.max_attempts = 1}}};
    constexpr int threads = 4, calls = 2'000;
    // A throttle whose window holds requests and no accept refuses with a probability above zero,
    // whatever k is (docs/overload.md: it starts cold). Give it an accept first, or the first calls of
    // two threads racing each other may refuse a call this test counts on succeeding.
    REQUIRE(rs::sync_wait(throttle.execute_outcome([]() -> rs::task<int> { co_return 1; })).has_value());
    std::atomic<int> values{0};
    std::atomic<bool> calling{true};
    std::thread changer([&] {
        for (int i = 0; calling.load(); ++i) {
            const bool odd = i % 2 == 1;
            if (odd)
                breaker.reconfigure({.failure_threshold = 1'000'000, .should_handle = all});
            else
                breaker.reconfigure({.failure_threshold = 1'000'001});
            if (odd)
                pool.reconfigure({.max_concurrent_calls = 100, .adapt = rs::aimd{.min = 50, .max = 200}});
            else
                pool.reconfigure({.max_concurrent_calls = 101, .priorities = {.classes = 2}});
            bucket.reconfigure({.token_limit = 1'000'000, .tokens_per_second = odd ? 1e9 : 2e9});
            window.reconfigure({.permit_limit = odd ? 1'000'000u : 1'000'001u, .window = 1s});
            throttle.reconfigure({.k = odd ? 1e9 : 2e9});
            cache.reconfigure({.ttl = odd ? 1ns : 2ns});
            // No backoff: the failed half of the calls would each wait out a real delay (40 s in all).
            reloading.reconfigure(
                rs::retry_options{.max_attempts = odd ? 1 : 2, .backoff = rs::constant_backoff{}});
            std::this_thread::yield();
        }
    });
    std::vector<std::thread> callers;
    for (int t = 0; t < threads; ++t)
        callers.emplace_back([&, t] {
            for (int i = 0; i < calls; ++i) {
                const bool fail = i % 2 == 1;
                const auto action = [fail]() -> rs::task<int> {
                    if (fail)
                        throw std::runtime_error("scripted failure");
                    co_return 1;
                };
                values += rs::sync_wait(breaker.execute_outcome(action)).has_value();
                values += rs::sync_wait(pool.execute_outcome(action)).has_value();
                values += rs::sync_wait(bucket.execute_outcome(action)).has_value();
                values += rs::sync_wait(window.execute_outcome(action)).has_value();
                values += rs::sync_wait(throttle.execute_outcome(action)).has_value();
                values += rs::sync_wait(cache.run_outcome(t, action)).has_value();
                values += rs::sync_wait(reloading.execute_outcome(action)).has_value();
                (void)breaker.options().name.size();
                (void)cache.name().size();
            }
        });
    for (auto& c : callers)
        c.join();
    calling = false;
    changer.join();
    CHECK(values.load() == threads * calls / 2 * 7);
}

} // namespace test_reconfigure_memory
