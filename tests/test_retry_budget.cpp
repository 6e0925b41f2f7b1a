// SPDX-License-Identifier: MIT
#include "catch.hpp"
#include "support.hpp"

#include <resilience/backoff.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/retry.hpp>
#include <resilience/retry_budget.hpp>
#include <resilience/task.hpp>

#include <atomic>
#include <cmath>
#include <stdexcept>
#include <string>

namespace test_retry_budget {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_tests::invalid_argument_message;
using resilience_tests::yield_now;

TEST_CASE("retry_budget: starts full and grants exactly capacity retries before anything is earned",
          "[retry_budget]") {
    rs::retry_budget budget{{.ratio = 0.2, .capacity = 3}};
    CHECK(budget.tokens() == 3.0);
    CHECK(budget.try_withdraw());
    CHECK(budget.try_withdraw());
    CHECK(budget.try_withdraw());
    CHECK_FALSE(budget.try_withdraw());
    CHECK(budget.tokens() == 0.0);
    CHECK(budget.granted() == 3);
    CHECK(budget.denied() == 1);
}

TEST_CASE("retry_budget: each call earns ratio tokens, and a retry needs a whole one", "[retry_budget]") {
    rs::retry_budget budget{{.ratio = 0.25, .capacity = 1}};
    CHECK(budget.try_withdraw());
    for (int i = 0; i < 3; ++i) {
        budget.record_call();
        CHECK_FALSE(budget.try_withdraw()); // 0.25, 0.5, 0.75: not yet a whole token
    }
    budget.record_call();
    CHECK(budget.tokens() == 1.0);
    CHECK(budget.try_withdraw());
    CHECK(budget.calls() == 4);
}

TEST_CASE("retry_budget: savings never exceed capacity", "[retry_budget]") {
    rs::retry_budget budget{{.ratio = 1.0, .capacity = 2}};
    for (int i = 0; i < 100; ++i)
        budget.record_call();
    CHECK(budget.tokens() == 2.0);
    CHECK(budget.try_withdraw());
    CHECK(budget.try_withdraw());
    CHECK_FALSE(budget.try_withdraw());
}

TEST_CASE("retry_budget: a large capacity with a fraction is held at most as given", "[retry_budget]") {
    // 14559974.924812315 tokens is 14559974924812315.x units; the product in double rounds up to
    // ...316, one unit more than the capacity (found by fuzz_retry_budget_options).
    const double capacity = 14559974.924812315;
    rs::retry_budget budget{{.ratio = 1.0, .capacity = capacity}};
    CHECK(budget.tokens() <= capacity);
    CHECK(budget.try_withdraw());
    budget.record_call();
    CHECK(budget.tokens() <= capacity);
    CHECK(budget.tokens() > capacity - 1e-6);
}

TEST_CASE("retry_budget: fractional ratios accumulate exactly", "[retry_budget]") {
    rs::retry_budget budget{{.ratio = 0.1, .capacity = 1}};
    CHECK(budget.try_withdraw());
    for (int i = 0; i < 9; ++i)
        budget.record_call();
    CHECK_FALSE(budget.try_withdraw()); // 0.9 after nine calls (no drift to 0.9000001 or 1.0)
    budget.record_call();
    CHECK(budget.try_withdraw()); // the tenth completes the token
}

TEST_CASE("retry_budget: copies are handles to one budget", "[retry_budget]") {
    rs::retry_budget a{{.ratio = 0.5, .capacity = 2}};
    rs::retry_budget b = a;
    CHECK(a == b);
    CHECK(b.try_withdraw());
    CHECK(a.tokens() == 1.0);
    CHECK_FALSE(a == rs::retry_budget{});
}

TEST_CASE("retry_budget: bad options throw std::invalid_argument naming the field and the value",
          "[retry_budget]") {
    CHECK(invalid_argument_message([] { rs::retry_budget b{{.ratio = 0}}; }) ==
          "resilience::retry_budget: ratio must be in (0, 1], got 0");
    CHECK(invalid_argument_message([] { rs::retry_budget b{{.ratio = 1.5}}; }) ==
          "resilience::retry_budget: ratio must be in (0, 1], got 1.5");
    CHECK_THROWS_AS(rs::retry_budget({.ratio = std::nan("")}), std::invalid_argument);
    CHECK_THROWS_AS(rs::retry_budget({.ratio = 1e-12}), std::invalid_argument);
    CHECK(invalid_argument_message([] { rs::retry_budget b{{.capacity = 0}}; }) ==
          "resilience::retry_budget: capacity must be positive, got 0");
    CHECK(invalid_argument_message([] { rs::retry_budget b{{.capacity = -3}}; }) ==
          "resilience::retry_budget: capacity must be positive, got -3");
    CHECK_THROWS_AS(rs::retry_budget({.capacity = HUGE_VAL}), std::invalid_argument);
    CHECK_NOTHROW(rs::retry_budget({.ratio = 1.0, .capacity = 0.5}));
}

namespace {

struct shared_counts {
    std::atomic<long> attempts{0};
    std::atomic<long> finished{0};
    std::atomic<long> succeeded{0};
};

rs::task<void> caller(const rs::retry<>& r, shared_counts& counts, int calls) {
    for (int i = 0; i < calls; ++i) {
        auto result = co_await r.execute_outcome([&counts]() -> rs::task<int> {
            counts.attempts.fetch_add(1, std::memory_order_relaxed);
            co_await yield_now{};
            throw std::runtime_error("always down");
        });
        if (result.has_value())
            counts.succeeded.fetch_add(1, std::memory_order_relaxed);
        counts.finished.fetch_add(1, std::memory_order_relaxed);
    }
}

} // namespace

TEST_CASE("retry_budget: two event loops on two threads never get more than capacity + ratio x calls",
          "[retry_budget][concurrency]") {
    constexpr int callers_per_loop = 4, calls_per_caller = 500;
    constexpr double ratio = 0.25, capacity = 10;
    rs::retry_budget budget{{.ratio = ratio, .capacity = capacity}};
    // Unbounded attempts and no wait: the budget is the only thing that stops a call.
    const rs::retry<> r{{.max_attempts = 1'000'000,
                         .backoff = rs::constant_backoff{0ns, rs::jitter::none},
                         .budget = budget}};
    shared_counts counts;

    rs::event_loop a, b;
    for (rs::event_loop* loop : {&a, &b})
        for (int c = 0; c < callers_per_loop; ++c)
            loop->spawn(caller(r, counts, calls_per_caller));
    resilience_tests::run_on_threads(a, b);

    const long calls = 2L * callers_per_loop * calls_per_caller; // two loops
    const long granted = counts.attempts.load() - calls;
    CHECK(counts.finished.load() == calls); // every call completed exactly once
    CHECK(counts.succeeded.load() == 0);
    CHECK(budget.calls() == static_cast<std::uint64_t>(calls));
    CHECK(budget.granted() == static_cast<std::uint64_t>(granted));
    CHECK(budget.denied() == static_cast<std::uint64_t>(calls)); // each call ended on a refusal
    CHECK(static_cast<double>(granted) <= capacity + ratio * static_cast<double>(calls));
    CHECK(static_cast<double>(granted) + budget.tokens() <= capacity + ratio * static_cast<double>(calls));
    CHECK(budget.tokens() < 1.0);
    CHECK(granted >= static_cast<long>(ratio * static_cast<double>(calls))); // and earned retries were given
}

} // namespace test_retry_budget
