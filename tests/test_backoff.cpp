// SPDX-License-Identifier: MIT
#include "catch.hpp"
#include "support.hpp"

#include <resilience/backoff.hpp>
#include <resilience/error.hpp>
#include <resilience/limiter/errors.hpp>
#include <resilience/outcome.hpp>
#include <resilience/random.hpp>

#include <chrono>
#include <climits>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace test_backoff {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_tests::invalid_argument_message;
using std::chrono::nanoseconds;

namespace {

struct sample_range {
    nanoseconds low = nanoseconds::max();
    nanoseconds high = nanoseconds::min();
    int quarters[4] = {0, 0, 0, 0};
};

// Draws `n` delays of `schedule` at `attempt` and reports their range and how they fall over the
// quarters of [0, max].
template <class S>
sample_range sample(const S& schedule, int attempt, nanoseconds max, int n, std::uint64_t seed = 7) {
    rs::seeded_random rng{seed};
    sample_range r;
    for (int i = 0; i < n; ++i) {
        const nanoseconds d = schedule.delay(attempt, rng);
        r.low = std::min(r.low, d);
        r.high = std::max(r.high, d);
        const double share = static_cast<double>(d.count()) / static_cast<double>(max.count());
        ++r.quarters[std::min(3, static_cast<int>(share * 4.0))];
    }
    return r;
}

} // namespace

TEST_CASE("backoff: exponential without jitter doubles from initial and stops at max", "[backoff]") {
    const rs::exponential_backoff b{.initial = 200ms, .max = 5s, .jitter = rs::jitter::none};
    rs::seeded_random rng{1};
    CHECK(b.delay(1, rng) == 200ms);
    CHECK(b.delay(2, rng) == 400ms);
    CHECK(b.delay(3, rng) == 800ms);
    CHECK(b.delay(4, rng) == 1600ms);
    CHECK(b.delay(5, rng) == 3200ms);
    CHECK(b.delay(6, rng) == 5s);
    CHECK(b.delay(60, rng) == 5s);
}

TEST_CASE("backoff: exponential reads positionally as initial, factor, max", "[backoff]") {
    const rs::exponential_backoff b{200ms, 3.0, 5s};
    CHECK(b.initial == 200ms);
    CHECK(b.factor == 3.0);
    CHECK(b.max == 5s);
    CHECK(b.jitter == rs::jitter::full);
    const rs::exponential_backoff exact{100ms, 3.0, 1s, rs::jitter::none};
    rs::seeded_random rng;
    CHECK(exact.delay(3, rng) == 900ms);
    CHECK(exact.delay(4, rng) == 1s);
}

TEST_CASE("backoff: defaults are 200ms doubling to 30s with full jitter", "[backoff]") {
    const rs::exponential_backoff b{};
    CHECK(b.initial == 200ms);
    CHECK(b.factor == 2.0);
    CHECK(b.max == 30s);
    CHECK(b.jitter == rs::jitter::full);
    const rs::backoff held{};
    rs::seeded_random a{3}, c{3};
    for (int attempt = 1; attempt < 20; ++attempt)
        CHECK(held.delay(attempt, a) == b.delay(attempt, c));
}

TEST_CASE("backoff: exponential never overflows, wraps negative or collapses to zero up to INT_MAX",
          "[backoff]") {
    const rs::exponential_backoff b{1s, 2.0, 30s, rs::jitter::none};
    rs::seeded_random rng;
    nanoseconds previous = 0ns;
    for (int attempt = 1; attempt <= 200; ++attempt) {
        const nanoseconds d = b.delay(attempt, rng);
        CHECK(d > 0ns);
        CHECK(d <= 30s);
        CHECK(d >= previous); // never shrinks: no wrap-around
        previous = d;
    }
    for (int attempt : {44, 58, 63, 64, 1000, 1'000'000, 1'000'000'000, INT_MAX - 1, INT_MAX})
        CHECK(b.delay(attempt, rng) == 30s);

    // The same at the edges of the representable: a huge factor and the largest cap.
    const rs::exponential_backoff extreme{1ns, 1e300, nanoseconds::max(), rs::jitter::none};
    CHECK(extreme.delay(1, rng) == 1ns);
    for (int attempt : {2, 3, 1000, INT_MAX})
        CHECK(extreme.delay(attempt, rng) == nanoseconds::max());
}

TEST_CASE("backoff: full jitter at attempt INT_MAX still spreads over all of [0, max]", "[backoff]") {
    const rs::exponential_backoff b{200ms, 2.0, 10s}; // full jitter by default
    for (int attempt : {1'000'000'000, INT_MAX}) {
        const sample_range r = sample(b, attempt, 10s, 1000);
        CHECK(r.low >= 0ns);
        CHECK(r.high <= 10s);
        CHECK(r.low < 500ms);   // reaches the bottom...
        CHECK(r.high > 9500ms); // ...and the top of the range
        for (int q : r.quarters)
            CHECK(q > 150); // and covers every quarter, about evenly (250 expected)
    }
}

TEST_CASE("backoff: equal and proportional jitter keep their spread at the cap", "[backoff]") {
    const rs::exponential_backoff equal{200ms, 2.0, 8s, rs::jitter::equal};
    const sample_range e = sample(equal, INT_MAX, 8s, 1000);
    CHECK(e.low >= 4s);
    CHECK(e.high <= 8s);
    CHECK(e.low < 4s + 200ms);
    CHECK(e.high > 8s - 200ms);

    const rs::exponential_backoff prop{200ms, 2.0, 10s, rs::jitter::proportional(0.2)};
    const sample_range p = sample(prop, INT_MAX, 10s, 1000);
    CHECK(p.low >= 8s);
    CHECK(p.high <= 10s);
    CHECK(p.low < 8s + 100ms);
    CHECK(p.high > 10s - 100ms);
}

TEST_CASE("backoff: jitter below the cap spreads the uncapped delay", "[backoff]") {
    const rs::exponential_backoff b{100ms, 2.0, 10s, rs::jitter::full};
    const sample_range r = sample(b, 3, 400ms, 1000); // d = 400ms
    CHECK(r.low >= 0ns);
    CHECK(r.high <= 400ms);
    for (int q : r.quarters)
        CHECK(q > 150);
}

TEST_CASE("backoff: the same seed gives the same jittered delays", "[backoff]") {
    const rs::exponential_backoff b{};
    rs::seeded_random x{42}, y{42}, z{43};
    std::vector<nanoseconds> a, c, d;
    for (int attempt = 1; attempt <= 10; ++attempt) {
        a.push_back(b.delay(attempt, x));
        c.push_back(b.delay(attempt, y));
        d.push_back(b.delay(attempt, z));
    }
    CHECK(a == c);
    CHECK(a != d);
}

TEST_CASE("backoff: proportional jitter validates its fraction", "[backoff]") {
    CHECK(rs::jitter::proportional(1.0).fraction() == 1.0);
    CHECK(rs::jitter::proportional(0.25).kind() == rs::jitter::mode::proportional);
    CHECK(invalid_argument_message([] { (void)rs::jitter::proportional(0.0); }) ==
          "resilience::jitter: proportional fraction must be in (0, 1], got 0");
    CHECK_THROWS_AS(rs::jitter::proportional(-0.1), std::invalid_argument);
    CHECK(invalid_argument_message([] { (void)rs::jitter::proportional(1.5); }).find("got 1.5") !=
          std::string::npos);
    CHECK_THROWS_AS(rs::jitter::proportional(std::nan("")), std::invalid_argument);
}

TEST_CASE("backoff: decorrelated jitter stays within [initial, max] and grows from the previous wait",
          "[backoff]") {
    const rs::exponential_backoff b{100ms, 2.0, 2s, rs::jitter::decorrelated};
    rs::seeded_random rng{11};
    nanoseconds previous = 0ns;
    bool reached_cap_region = false;
    for (int attempt = 1; attempt <= 2000; ++attempt) {
        const nanoseconds d = b.delay(attempt, rng, previous);
        CHECK(d >= 100ms);
        CHECK(d <= 2s);
        CHECK(d <= std::max(previous, nanoseconds{100ms}) * 3);
        if (d > 1500ms)
            reached_cap_region = true;
        previous = d;
    }
    CHECK(reached_cap_region);
    // Without a previous wait it starts from initial: [initial, 3 x initial].
    for (int i = 0; i < 200; ++i) {
        const nanoseconds d = b.delay(INT_MAX, rng);
        CHECK(d >= 100ms);
        CHECK(d <= 300ms);
    }
}

TEST_CASE("backoff: decorrelated jitter is refused by schedules without initial and max", "[backoff]") {
    CHECK(invalid_argument_message([] {
              rs::backoff b{rs::constant_backoff{1s, rs::jitter::decorrelated}};
          }).find("resilience::constant_backoff: jitter decorrelated") == 0);
    CHECK_THROWS_AS(rs::backoff(rs::linear_backoff{.jitter = rs::jitter::decorrelated}),
                    std::invalid_argument);
    CHECK_THROWS_AS(rs::backoff(rs::list_backoff{{1s}, rs::jitter::decorrelated}), std::invalid_argument);
}

TEST_CASE("backoff: list repeats its last entry once it runs out", "[backoff]") {
    const rs::list_backoff b{{100ms, 500ms, 2s}, rs::jitter::none};
    rs::seeded_random rng;
    CHECK(b.delay(1, rng) == 100ms);
    CHECK(b.delay(2, rng) == 500ms);
    CHECK(b.delay(3, rng) == 2s);
    CHECK(b.delay(4, rng) == 2s);
    CHECK(b.delay(INT_MAX, rng) == 2s);
}

TEST_CASE("backoff: an empty list or a negative entry is an invalid argument", "[backoff]") {
    rs::seeded_random rng;
    CHECK(invalid_argument_message([] { rs::backoff b{rs::list_backoff{}}; }) ==
          "resilience::list_backoff: delays must not be empty");
    CHECK_THROWS_AS(rs::list_backoff{}.delay(1, rng), std::invalid_argument);
    CHECK(invalid_argument_message([] {
              rs::backoff b{rs::list_backoff{{1s, -1ms}}};
          }) == "resilience::list_backoff: delays[1] must not be negative, got -1000000ns");
}

TEST_CASE("backoff: constant and linear schedules", "[backoff]") {
    rs::seeded_random rng;
    const rs::constant_backoff c{500ms, rs::jitter::none};
    CHECK(c.delay(1, rng) == 500ms);
    CHECK(c.delay(INT_MAX, rng) == 500ms);
    const rs::constant_backoff jittered{500ms};
    for (int i = 0; i < 100; ++i) {
        const nanoseconds d = jittered.delay(1, rng);
        CHECK(d >= 0ns);
        CHECK(d <= 500ms);
    }
    const rs::linear_backoff l{.initial = 100ms, .step = 50ms, .max = 300ms, .jitter = rs::jitter::none};
    CHECK(l.delay(1, rng) == 100ms);
    CHECK(l.delay(2, rng) == 150ms);
    CHECK(l.delay(5, rng) == 300ms);
    CHECK(l.delay(INT_MAX, rng) == 300ms);
    CHECK(rs::constant_backoff{0ms, rs::jitter::none}.delay(3, rng) == 0ns);
}

TEST_CASE("backoff: bad options throw std::invalid_argument naming the field and the value", "[backoff]") {
    CHECK(invalid_argument_message([] { rs::backoff b{rs::exponential_backoff{.initial = -5ns}}; }) ==
          "resilience::exponential_backoff: initial must be positive, got -5ns");
    CHECK(invalid_argument_message([] { rs::backoff b{rs::exponential_backoff{.initial = 0ns}}; }) ==
          "resilience::exponential_backoff: initial must be positive, got 0ns");
    CHECK(invalid_argument_message([] { rs::backoff b{rs::exponential_backoff{.factor = 0.5}}; }) ==
          "resilience::exponential_backoff: factor must be finite and at least 1, got 0.5");
    CHECK_THROWS_AS(rs::backoff(rs::exponential_backoff{.factor = std::nan("")}), std::invalid_argument);
    CHECK_THROWS_AS(rs::backoff(rs::exponential_backoff{.factor = HUGE_VAL}), std::invalid_argument);
    CHECK(invalid_argument_message([] {
              rs::backoff b{rs::exponential_backoff{1s, 2.0, 10ms}};
          }) ==
          "resilience::exponential_backoff: max must be at least initial (1000000000ns), got 10000000ns");
    CHECK(invalid_argument_message([] { rs::backoff b{rs::constant_backoff{-1ns}}; }) ==
          "resilience::constant_backoff: interval must not be negative, got -1ns");
    CHECK(invalid_argument_message([] { rs::backoff b{rs::linear_backoff{.step = -2ns}}; }) ==
          "resilience::linear_backoff: step must not be negative, got -2ns");
    CHECK(invalid_argument_message([] {
              rs::backoff b{rs::linear_backoff{.initial = 2s, .max = 1s}};
          }).find("resilience::linear_backoff: max must be at least initial") == 0);
    // Asking an invalid schedule directly throws too.
    rs::seeded_random rng;
    CHECK_THROWS_AS(rs::exponential_backoff{.factor = 0.9}.delay(1, rng), std::invalid_argument);
}

TEST_CASE("backoff: holds user callables of the attempt, or of the attempt and the failure", "[backoff]") {
    rs::seeded_random rng;
    const rs::backoff by_attempt{[](int attempt) { return std::chrono::milliseconds{attempt * 10}; }};
    CHECK(by_attempt.delay(3, rng) == 30ms);

    // A schedule that reads what the failure carries: wait as long as the limiter asked.
    const rs::backoff by_failure{[](int, const rs::failure& f) -> nanoseconds {
        if (auto* limited = f.as<rs::rate_limited_error>())
            return limited->retry_after();
        return 1s;
    }};
    CHECK(by_failure.delay(1, rng, rs::failure::make(rs::rate_limited_error{"", 250ms})) == 250ms);
    CHECK(by_failure.delay(1, rng, rs::failure::make(std::runtime_error("x"))) == 1s);
    CHECK(by_failure.delay(1, rng) == 1s); // no failure (a rejected value): an empty one

    // Negative results read as no wait; enormous ones saturate instead of overflowing.
    const rs::backoff negative{[](int) { return -5s; }};
    CHECK(negative.delay(1, rng) == 0ns);
    const rs::backoff huge{[](int) { return std::chrono::hours::max(); }};
    CHECK(huge.delay(1, rng) == nanoseconds::max());
    const rs::backoff fractional{[](int) { return std::chrono::duration<double>(1e300); }};
    CHECK(fractional.delay(1, rng) == nanoseconds::max());
    const rs::backoff half{[](int) { return std::chrono::duration<double>(0.5); }};
    CHECK(half.delay(1, rng) == 500ms);
}

namespace {
// A user-defined schedule object: jitter of its own, drawn from whichever generator it is handed.
struct coin_flip_backoff {
    template <class Rng>
    nanoseconds delay(int attempt, Rng& rng) const {
        return rng() % 2 == 0 ? nanoseconds{attempt} : nanoseconds{attempt * 1000};
    }
};
} // namespace

TEST_CASE("backoff: holds user schedule objects and hands them the retry's generator", "[backoff]") {
    const rs::backoff b{coin_flip_backoff{}};
    rs::seeded_random rng{5};
    int small = 0, large = 0;
    for (int i = 0; i < 200; ++i)
        (b.delay(7, rng) == 7ns ? small : large)++;
    CHECK(small > 50);
    CHECK(large > 50);
    CHECK(small + large == 200);
}

TEST_CASE("backoff: a generator with a narrow range still spreads full jitter over [0, max]", "[backoff]") {
    const rs::backoff b{rs::constant_backoff{1s}};
    std::minstd_rand narrow{123}; // 31 bits, minimum 1
    rs::random_ref ref{narrow};
    int quarters[4] = {0, 0, 0, 0};
    for (int i = 0; i < 1000; ++i) {
        const nanoseconds d = b.delay(1, ref);
        REQUIRE(d >= 0ns);
        REQUIRE(d <= 1s);
        ++quarters[std::min(3, static_cast<int>(static_cast<double>(d.count()) / 1e9 * 4))];
    }
    for (int q : quarters)
        CHECK(q > 150);
}

TEST_CASE("backoff: copies share one schedule", "[backoff]") {
    const rs::backoff a{rs::list_backoff{{1ms, 2ms}, rs::jitter::none}};
    const rs::backoff b = a; // NOLINT(performance-unnecessary-copy-initialization): the copy is the point
    rs::seeded_random rng;
    CHECK(b.delay(1, rng) == 1ms);
    CHECK(b.delay(9, rng) == 2ms);
}

} // namespace test_backoff
