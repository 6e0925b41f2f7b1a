// SPDX-License-Identifier: MIT
// Every duration, count and double field of every options struct, given the values that break
// arithmetic: negative, zero, NaN, infinities, the type's minimum and maximum. Each is refused with
// std::invalid_argument naming the field and the value as written, or is accepted as documented
// (the extremes that saturate) and then gives a policy that behaves: a call through it ends as it
// should. Nothing here may be undefined behaviour: the UBSan leg runs this file too.

#include "catch.hpp"
#include "support.hpp"

#include <resilience/adaptive_throttle.hpp>
#include <resilience/backoff.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/chaos.hpp>
#include <resilience/circuit_breaker.hpp>
#include <resilience/hedge.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/retry.hpp>
#include <resilience/retry_budget.hpp>
#include <resilience/retry_stream.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/standard.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#if defined(RESILIENCE_HAS_REDIS)
// Named through a macro: a test source that includes the Redis header by name is left out of builds
// without hiredis, and this file's other rows must be built everywhere.
#define RESILIENCE_REDIS_HEADER <resilience/redis.hpp>
#include RESILIENCE_REDIS_HEADER
#include <asio/io_context.hpp>
#endif

#include <chrono>
#include <climits>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <variant>

namespace test_bad_input {

namespace rs = resilience;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using std::chrono::nanoseconds;

namespace {

constexpr double qnan = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double dmax = std::numeric_limits<double>::max();
constexpr double dlowest = std::numeric_limits<double>::lowest();
constexpr double dtiny = std::numeric_limits<double>::denorm_min();
constexpr nanoseconds nmin = nanoseconds::min();
constexpr nanoseconds nmax = nanoseconds::max();
constexpr std::size_t smax = std::numeric_limits<std::size_t>::max();

// `make()` must throw std::invalid_argument whose message names `field` and shows `value`. (A
// std::function, not a template: each of the hundred-odd cases then compiles only its lambda, not
// these checks again.)
void refused(const std::string& field, const std::string& value, const std::function<void()>& make) {
    INFO(field << " = " << value);
    CHECK_THAT(resilience_tests::invalid_argument_message(make), Contains(field) && Contains(value));
}

// The same, and the message starts with the policy's label (`detail::policy_label`).
void refused_by(const std::string& label, const std::string& field, const std::string& value,
                const std::function<void()>& make) {
    INFO(label << ": " << field << " = " << value);
    CHECK_THAT(resilience_tests::invalid_argument_message(make),
               StartsWith(label + ": ") && Contains(field) && Contains(value));
}

// A call that takes 1 ms and returns 7.
rs::task<int> quick(rs::testing::simulation& sim) {
    co_await sim.sleep_for(1ms);
    co_return 7;
}

// `policy` (on `sim`'s clock) lets a quick call through with its value.
template <class Policy>
void behaves(rs::testing::simulation& sim, const Policy& policy) {
    const auto r = sim.run(policy.execute_outcome([&sim] { return quick(sim); }));
    REQUIRE(r.has_value());
    CHECK(r.value() == 7);
}

} // namespace

TEST_CASE("bad input: retry options", "[bad_input][retry]") {
    rs::testing::simulation sim;
    const auto make = [&](rs::retry_options o) { return rs::retry{std::move(o), sim.clock()}; };
    for (int v : {0, -1, INT_MIN})
        refused_by("resilience::retry", "max_attempts", std::to_string(v),
                   [&] { make({.max_attempts = v}); });
    for (nanoseconds v : {-1ns, nmin}) {
        refused_by("resilience::retry", "max_elapsed", std::to_string(v.count()),
                   [&] { make({.max_elapsed = v}); });
        refused_by("resilience::retry", "max_delay", std::to_string(v.count()),
                   [&] { make({.max_delay = v}); });
        refused_by("resilience::retry", "min_attempt_time", std::to_string(v.count()),
                   [&] { make({.min_attempt_time = v}); });
    }
    // Accepted: every attempt count up to INT_MAX, no limit (0) or any limit up to the largest.
    behaves(sim, make({.max_attempts = INT_MAX}));
    behaves(sim, make({.max_elapsed = nmax}));
    behaves(sim, make({.max_delay = 0ns}));
    behaves(sim, make({.max_delay = nmax}));
    behaves(sim, make({.min_attempt_time = nmax}));
    behaves(sim, rs::pipeline{rs::timeout{nmax, sim.clock()}, make({.min_attempt_time = nmax})});

    // A call that always fails, retried with the extremes: ends, with the last failure.
    int calls = 0;
    const auto failing = [&]() -> rs::task<int> {
        ++calls;
        co_await sim.sleep_for(1ms);
        throw std::runtime_error("down");
    };
    // The longest backoff, capped by max_delay: two waits of an hour.
    const rs::retry capped{{.max_attempts = 3,
                            .backoff = rs::constant_backoff{nmax, rs::jitter::none},
                            .max_elapsed = nmax,
                            .max_delay = 1h},
                           sim.clock()};
    auto before = sim.now();
    CHECK(sim.run(capped.execute_outcome(failing)).has_failure());
    CHECK(calls == 3);
    CHECK(sim.now() - before == 2h + 3ms);
    // Uncapped, the first wait (about 292 years) would pass max_elapsed: the loop ends at once.
    const rs::retry longest{{.max_attempts = 3,
                             .backoff = rs::constant_backoff{nmax, rs::jitter::none},
                             .max_elapsed = nmax,
                             .max_delay = nmax},
                            sim.clock()};
    calls = 0;
    before = sim.now();
    CHECK(sim.run(longest.execute_outcome(failing)).has_failure());
    CHECK(calls == 1);
    CHECK(sim.now() - before == 1ms);
    // The longest min_attempt_time inside a deadline: it would end past it, so the loop ends after the
    // first attempt, without overflowing on the way. (A timeout of nmax sets no deadline: its end
    // saturates at the end of time, which is what "no deadline" is.)
    const rs::pipeline deadline{rs::timeout{1h, sim.clock()},
                                make({.max_attempts = 3, .min_attempt_time = nmax})};
    calls = 0;
    before = sim.now();
    CHECK(sim.run(deadline.execute_outcome(failing)).has_failure());
    CHECK(calls == 1);
    CHECK(sim.now() - before == 1ms);
}

TEST_CASE("bad input: backoff schedules", "[bad_input][backoff]") {
    const auto with = [](auto schedule) { return rs::backoff{schedule}; };
    for (nanoseconds v : {-1ns, nmin}) {
        const std::string s = std::to_string(v.count());
        refused("interval", s, [&] { with(rs::constant_backoff{v}); });
        refused("initial", s, [&] { with(rs::linear_backoff{.initial = v}); });
        refused("step", s, [&] { with(rs::linear_backoff{.step = v}); });
        refused("max", s, [&] { with(rs::linear_backoff{.initial = 0ns, .max = v}); });
        refused("initial", s, [&] { with(rs::exponential_backoff{.initial = v}); });
        refused("max", s, [&] { with(rs::exponential_backoff{.max = v}); });
        refused("delays[1]", s, [&] { with(rs::list_backoff{.delays = {1ms, v}}); });
    }
    refused("initial", "0", [&] { with(rs::exponential_backoff{.initial = 0ns}); });
    for (double f : {qnan, inf, -inf, 0.0, -1.0, 0.5, dlowest, dtiny})
        refused("factor", rs::detail::format_number(f), [&] { with(rs::exponential_backoff{.factor = f}); });
    for (double f : {qnan, inf, -inf, 0.0, -0.5, 1.5, dmax, dlowest})
        refused("fraction", rs::detail::format_number(f), [&] { rs::jitter::proportional(f); });

    // Accepted extremes give delays in [0, max] for every attempt number, without overflow.
    rs::seeded_random rng{42};
    const rs::backoff schedules[] = {
        with(rs::constant_backoff{nmax}),
        with(rs::constant_backoff{0ns}),
        with(rs::linear_backoff{.initial = nmax, .step = nmax, .max = nmax}),
        with(rs::exponential_backoff{.initial = 1ns, .factor = dmax, .max = nmax}),
        with(rs::exponential_backoff{
            .initial = nmax, .factor = 1.0, .max = nmax, .jitter = rs::jitter::decorrelated}),
        with(rs::exponential_backoff{.initial = 1ns, .max = nmax, .jitter = rs::jitter::proportional(dtiny)}),
        with(rs::list_backoff{.delays = {nmax, 0ns}}),
    };
    for (const auto& b : schedules)
        for (int attempt : {INT_MIN, -1, 0, 1, 2, 63, 64, 1'000'000'000, INT_MAX}) {
            const nanoseconds d = b.delay(attempt, rng, rs::failure{}, nmax);
            CHECK(d >= 0ns);
        }
}

TEST_CASE("bad input: circuit breaker options", "[bad_input][circuit_breaker]") {
    rs::testing::simulation sim;
    const auto make = [&](rs::circuit_breaker_options o) {
        return rs::circuit_breaker{std::move(o), sim.clock()};
    };
    const auto sampling = [&](rs::breaker_sampling w) { return make({.sampling = w}); };
    for (int v : {0, -1, INT_MIN}) {
        const std::string s = std::to_string(v);
        refused("failure_threshold", s, [&] { make({.failure_threshold = v}); });
        refused("probes", s, [&] { make({.probes = v}); });
        refused("sampling.calls", s, [&] { sampling({.calls = v, .failure_ratio = 0.5}); });
        refused("sampling.minimum_throughput", s,
                [&] { sampling({.calls = 10, .minimum_throughput = v, .failure_ratio = 0.5}); });
    }
    for (nanoseconds v : {0ns, -1ns, nmin}) {
        const std::string s = std::to_string(v.count());
        refused("break_duration", s, [&] { make({.failure_threshold = 1, .break_duration = v}); });
        refused("max_break_duration", s, [&] { make({.failure_threshold = 1, .max_break_duration = v}); });
        refused("sampling.window", s, [&] { sampling({.window = v, .failure_ratio = 0.5}); });
        refused("sampling.slow_call_duration", s,
                [&] { sampling({.calls = 10, .slow_call_duration = v, .slow_call_ratio = 0.5}); });
    }
    for (double v : {qnan, inf, -inf, 0.0, -1.0, 0.999, dlowest}) {
        const std::string s = rs::detail::format_number(v);
        refused("break_duration_growth", s,
                [&] { make({.failure_threshold = 1, .break_duration_growth = v}); });
    }
    for (double v : {qnan, inf, -inf, 0.0, -0.5, 1.5, dmax, dlowest}) {
        const std::string s = rs::detail::format_number(v);
        refused("sampling.failure_ratio", s, [&] { sampling({.calls = 10, .failure_ratio = v}); });
        refused("sampling.slow_call_ratio", s,
                [&] { sampling({.calls = 10, .slow_call_duration = 1s, .slow_call_ratio = v}); });
    }
    // Sizes that would allocate gigabytes are refused (they used to be accepted and allocated).
    refused("sampling.calls", std::to_string(INT_MAX),
            [&] { sampling({.calls = INT_MAX, .failure_ratio = 0.5}); });
    refused("sampling.segments", "0", [&] { sampling({.window = 1s, .segments = 0, .failure_ratio = 0.5}); });
    refused("sampling.segments", std::to_string(smax),
            [&] { sampling({.window = nmax, .segments = smax, .failure_ratio = 0.5}); });
    refused("sampling.segments", std::to_string(INT_MAX),
            [&] { sampling({.window = nmax, .segments = INT_MAX, .failure_ratio = 0.5}); });
    refused("sampling.segments", std::to_string(INT_MAX),
            [&] { sampling({.window = 1ms, .segments = INT_MAX, .failure_ratio = 0.5}); });
    refused("sampling.minimum_throughput", std::to_string(INT_MAX),
            [&] { sampling({.calls = 10, .minimum_throughput = INT_MAX, .failure_ratio = 0.5}); });

    // Accepted extremes: the largest counts, durations and growth. A breaker that opens for the
    // longest break refuses with the longest retry_after, and growth saturates instead of overflowing.
    behaves(sim, make({.failure_threshold = INT_MAX, .probes = INT_MAX}));
    behaves(sim, sampling({.calls = rs::breaker_sampling::max_calls, .failure_ratio = dtiny}));
    behaves(sim, sampling({.window = nmax,
                           .segments = rs::breaker_sampling::max_segments,
                           .minimum_throughput = INT_MAX,
                           .failure_ratio = 1.0,
                           .slow_call_duration = nmax,
                           .slow_call_ratio = 1.0}));
    behaves(sim, sampling({.window = 1ns,
                           .segments = 1,
                           .minimum_throughput = 1,
                           .failure_ratio = dtiny,
                           .slow_call_duration = 1ns,
                           .slow_call_ratio = dtiny}));
    const auto fail = [&]() -> rs::task<int> {
        co_await sim.sleep_for(1ms);
        throw std::runtime_error("down");
    };
    for (double growth : {1.0, dmax}) {
        const auto breaker =
            make({.failure_threshold = 1, .break_duration = nmax, .break_duration_growth = growth});
        for (int i = 0; i < 3; ++i) {
            CHECK(sim.run(breaker.execute_outcome(fail)).has_failure());
            const auto refused_call = sim.run(breaker.execute_outcome([&sim] { return quick(sim); }));
            REQUIRE(refused_call.has_failure());
            const auto* e = refused_call.error().as<rs::circuit_open_error>();
            REQUIRE(e != nullptr);
            CHECK(e->retry_after() > std::chrono::hours{24 * 365 * 100});
            breaker.reset();
        }
    }
    const auto growing = make({.failure_threshold = 1, .break_duration = 1ms, .break_duration_growth = dmax});
    for (int i = 0; i < 4; ++i) {
        CHECK(sim.run(growing.execute_outcome(fail)).has_failure());
        sim.run([&]() -> rs::task<void> { co_await sim.sleep_for(1ms); }());
    }
}

TEST_CASE("bad input: timeout options and durations", "[bad_input][timeout][regression]") {
    rs::testing::simulation sim;
    for (nanoseconds v : {0ns, -1ns, nmin})
        refused_by("resilience::timeout", "timeout", std::to_string(v.count()), [&] {
            rs::timeout{{.timeout = v}, sim.clock()};
        });
    // A NaN was converted to an integer count before it was checked (undefined behaviour); the
    // message then showed whatever that gave. Refused by name now, before converting.
    using seconds_d = std::chrono::duration<double>;
    refused_by("resilience::timeout", "timeout", "nan s", [&] { rs::timeout{seconds_d{qnan}, sim.clock()}; });
    refused_by("resilience::timeout", "timeout", "inf s", [&] { rs::timeout{seconds_d{inf}, sim.clock()}; });
    refused_by("resilience::timeout", "timeout", "-inf s", [&] {
        rs::timeout{seconds_d{-inf}, sim.clock()};
    });
    refused_by("resilience::timeout", "timeout", "nan ms", [&] {
        rs::timeout{std::chrono::duration<float, std::milli>{std::numeric_limits<float>::quiet_NaN()}};
    });
    refused_by("resilience::timeout", "timeout", "must be positive", [&] {
        rs::timeout{seconds_d{dlowest}, sim.clock()};
    });
    refused_by("resilience::timeout", "timeout", "must be positive", [&] {
        rs::timeout{seconds_d{-dtiny}, sim.clock()};
    });
    refused_by("resilience::timeout", "timeout", "must be positive", [&] {
        rs::timeout{seconds_d{dtiny}, sim.clock()};
    }); // rounds to 0 ns

    // Accepted: the largest, and anything longer (saturated to it, documented as forever).
    CHECK(rs::timeout{seconds_d{dmax}, sim.clock()}.options().timeout == nmax);
    CHECK(rs::timeout{std::chrono::hours::max(), sim.clock()}.options().timeout == nmax);
    behaves(sim, rs::timeout{{.timeout = nmax}, sim.clock()});
    behaves(sim, rs::timeout{seconds_d{dmax}, sim.clock()});
    behaves(sim, rs::timeout{{.timeout = 1ns}, sim.clock()} /* a value after the deadline is returned */);
}

TEST_CASE("bad input: bulkhead options", "[bad_input][bulkhead]") {
    rs::testing::simulation sim;
    const auto make = [&](rs::bulkhead_options o) { return rs::bulkhead{std::move(o), sim.clock()}; };
    refused("max_concurrent_calls", "0", [&] { make({.max_concurrent_calls = 0}); });
    for (nanoseconds v : {0ns, -1ns, nmin})
        refused("queue_timeout", std::to_string(v.count()), [&] { make({.queue_timeout = v}); });
    behaves(sim, make({.max_concurrent_calls = 1, .queue_limit = smax, .queue_timeout = nmax}));

    // A full bulkhead with the longest queue timeout: the waiter gets the slot when it frees.
    const auto one = make({.max_concurrent_calls = 1, .queue_limit = smax, .queue_timeout = nmax});
    sim.spawn(one.execute([&sim] { return quick(sim); }));
    const auto r = sim.run(one.execute_outcome([&sim] { return quick(sim); }));
    CHECK(r.has_value());
}

TEST_CASE("bad input: queue disciplines", "[bad_input][bulkhead][rate_limiter]") {
    rs::testing::simulation sim;
    const auto bulkhead = [&](rs::queue_discipline d) {
        return rs::bulkhead{{.max_concurrent_calls = 1, .queue_limit = smax, .queue_discipline = d},
                            sim.clock()};
    };
    const auto limiter = [&](rs::queue_discipline d) {
        return rs::rate_limiter{
            {.token_limit = 1, .tokens_per_second = 1000, .queue_limit = smax, .queue_discipline = d},
            sim.clock()};
    };
    for (nanoseconds v : {0ns, -1ns, nmin}) {
        for (const rs::queue_discipline d : {rs::queue_discipline{rs::codel{.target = v}},
                                             rs::queue_discipline{rs::adaptive_lifo{.target = v}}}) {
            refused("queue_discipline.target", std::to_string(v.count()), [&] { bulkhead(d); });
            refused("queue_discipline.target", std::to_string(v.count()), [&] { limiter(d); });
        }
        refused("queue_discipline.interval", std::to_string(v.count()),
                [&] { bulkhead(rs::codel{.interval = v}); });
        refused("queue_discipline.interval", std::to_string(v.count()),
                [&] { limiter(rs::adaptive_lifo{.interval = v}); });
    }
    // The extremes: an interval that overflows the clock when added (the queue is then never
    // overloaded), a target nothing waits past, and the shortest of both (a queue sheds as soon as
    // it has stood for a nanosecond). Each waits in a standing queue behind a call holding the slot.
    for (const rs::queue_discipline d :
         {rs::queue_discipline{rs::codel{.target = 1ns, .interval = nmax}},
          rs::queue_discipline{rs::adaptive_lifo{.target = nmax, .interval = 1ns}},
          rs::queue_discipline{rs::codel{.target = 1ns, .interval = 1ns}}}) {
        const auto b = bulkhead(d);
        behaves(sim, b);
        const auto l = limiter(d);
        behaves(sim, l);
        for (int i = 0; i < 4; ++i) {
            sim.spawn([](const rs::bulkhead<rs::testing::virtual_clock>& p,
                         rs::testing::simulation& s) -> rs::task<void> {
                (void)co_await p.execute_outcome([&s] { return quick(s); });
            }(b, sim));
            sim.spawn([](const rs::rate_limiter<rs::testing::virtual_clock>& p,
                         rs::testing::simulation& s) -> rs::task<void> {
                (void)co_await p.execute_outcome([&s] { return quick(s); });
            }(l, sim));
        }
        sim.run_all();
        CHECK(b.queued() == 0);
        CHECK(l.queued() == 0);
    }
}

// The largest limit a bulkhead's slot word holds: its two top bits are the `waiting` and `retired`
// flags (bulkhead/state.hpp).
constexpr std::size_t largest_bulkhead_limit = (std::size_t{1} << 62) - 1;

// `make()` must throw std::invalid_argument naming `field`, the largest value it accepts and `value`.
void beyond_largest(const std::string& field, std::size_t value, const std::function<void()>& make) {
    INFO(field << " = " << value);
    CHECK_THAT(resilience_tests::invalid_argument_message(make),
               StartsWith("resilience::bulkhead: " + field + " must be at most " +
                          std::to_string(largest_bulkhead_limit)) &&
                   Contains("got " + std::to_string(value)));
}

TEST_CASE("bad input: a bulkhead limit beyond what its slot word holds is refused, at construction and at "
          "reconfigure",
          "[bad_input][bulkhead][regression]") {
    rs::testing::simulation sim;
    const auto make = [&](rs::bulkhead_options o) { return rs::bulkhead{std::move(o), sim.clock()}; };
    const rs::bulkhead running = make({.max_concurrent_calls = 4});
    for (const std::size_t v : {largest_bulkhead_limit + 1, smax}) {
        beyond_largest("max_concurrent_calls", v, [&] { make({.max_concurrent_calls = v}); });
        beyond_largest("max_concurrent_calls", v, [&] { running.reconfigure({.max_concurrent_calls = v}); });
        // Each bound of each algorithm, named even where another check would refuse the options too.
        for (const bool reconfigured : {false, true}) {
            const auto put = [&](std::size_t start, rs::adaptive_limit a) {
                rs::bulkhead_options o{.max_concurrent_calls = start, .adapt = std::move(a)};
                if (reconfigured)
                    running.reconfigure(std::move(o));
                else
                    make(std::move(o));
            };
            beyond_largest("adapt.min", v, [&] { put(v, rs::aimd{.min = v, .max = v}); });
            beyond_largest("adapt.min", v, [&] { put(25, rs::aimd{.min = v, .max = smax}); });
            beyond_largest("adapt.max", v, [&] { put(25, rs::aimd{.min = 1, .max = v}); });
            beyond_largest("adapt.min", v, [&] { put(25, rs::gradient{.min = v, .max = v}); });
            beyond_largest("adapt.max", v, [&] { put(25, rs::gradient{.min = 1, .max = v}); });
        }
    }
    // What was refused changed nothing.
    CHECK(running.options().max_concurrent_calls == 4);
    CHECK(running.limit() == 4);
    CHECK(std::holds_alternative<std::monostate>(running.options().adapt));
    behaves(sim, running);
}

TEST_CASE("bad input: the largest bulkhead limit is accepted and admits calls, fixed or adaptive",
          "[bad_input][bulkhead]") {
    rs::testing::simulation sim;
    const auto make = [&](rs::bulkhead_options o) { return rs::bulkhead{std::move(o), sim.clock()}; };
    constexpr std::size_t top = largest_bulkhead_limit;
    CHECK(rs::bulkhead_options::max_limit == top);

    const rs::bulkhead fixed = make({.max_concurrent_calls = top});
    CHECK(fixed.limit() == top);
    behaves(sim, fixed);

    const rs::bulkhead aimd = make({.max_concurrent_calls = top, .adapt = rs::aimd{.min = top, .max = top}});
    CHECK(aimd.limit() == top);
    behaves(sim, aimd);
    const rs::bulkhead gradient =
        make({.max_concurrent_calls = top, .adapt = rs::gradient{.min = 1, .max = top, .short_samples = 1}});
    CHECK(gradient.limit() == top);
    behaves(sim, gradient);
    CHECK(gradient.limit() == top); // a measurement with nothing held back lowers nothing

    const rs::bulkhead later = make({.max_concurrent_calls = 1});
    later.reconfigure({.max_concurrent_calls = top});
    CHECK(later.limit() == top);
    later.reconfigure({.max_concurrent_calls = top, .adapt = rs::aimd{.min = top, .max = top}});
    CHECK(later.limit() == top);
    behaves(sim, later);
}

TEST_CASE("bad input: rate limiter options", "[bad_input][rate_limiter]") {
    rs::testing::simulation sim;
    const auto make = [&](rs::rate_limiter_options o) { return rs::rate_limiter{std::move(o), sim.clock()}; };
    refused("token_limit", "0", [&] { make({.token_limit = 0, .tokens_per_second = 1}); });
    for (double v : {qnan, inf, -inf, 0.0, -1.0, dlowest, dtiny, 1e-300, 1e-10})
        refused("tokens_per_second", rs::detail::format_number(v),
                [&] { make({.token_limit = 1, .tokens_per_second = v}); });
    for (nanoseconds v : {0ns, -1ns, nmin})
        refused("queue_timeout", std::to_string(v.count()),
                [&] { make({.token_limit = 1, .tokens_per_second = 1, .queue_timeout = v}); });

    // Accepted extremes behave: the slowest rate, the fastest, the largest bucket and queue.
    behaves(sim, make({.token_limit = 1, .tokens_per_second = 1e-9}));
    behaves(sim, make({.token_limit = 1, .tokens_per_second = dmax}));
    behaves(sim,
            make({.token_limit = smax, .tokens_per_second = 1, .queue_limit = smax, .queue_timeout = nmax}));
    const auto fastest = make({.token_limit = 1, .tokens_per_second = dmax, .queue_limit = 1});
    for (int i = 0; i < 5; ++i)
        CHECK(sim.run(fastest.take_outcome()).has_value()); // a token due within a nanosecond, waited for
    CHECK(fastest.tokens() >= 0.0);
    CHECK(fastest.tokens() <= 1.0);

    // The slowest rate with a queue: a refused caller is told the far future, never a negative wait.
    const auto slowest = make({.token_limit = 1, .tokens_per_second = 1e-9, .queue_limit = 3});
    CHECK(sim.run(slowest.take_outcome()).has_value());
    for (int i = 0; i < 3; ++i)
        // A parameter, not a capture: the closure is gone once spawn returns.
        sim.spawn(
            [](const auto& limiter) -> rs::task<void> { (void)co_await limiter.take_outcome(); }(slowest));
    sim.run_for(1s);
    const auto told = sim.run(slowest.take_outcome());
    REQUIRE(told.has_failure());
    CHECK(told.error().as<rs::rate_limited_error>()->retry_after() > std::chrono::hours{24 * 365 * 100});
}

TEST_CASE("bad input: the largest share of the largest limiter limit is kept for the classes above, without "
          "overflow",
          "[bad_input][rate_limiter][sliding_window][regression]") {
    rs::testing::simulation sim;
    // All but one ten-billionth kept for class 1: a class 0 call's reserve, rounded with its tolerance,
    // would be past 2^64 with a limit of 2^64 - 1 (UBSan: a conversion out of range).
    const rs::priority_classes top_heavy{.classes = 2, .reserved = {0.0, 0.9999999999}};
    behaves(sim, rs::rate_limiter{{.token_limit = smax, .tokens_per_second = 1, .priorities = top_heavy},
                                  sim.clock()});
    behaves(sim, rs::sliding_window_limiter{{.permit_limit = smax, .window = 1s, .priorities = top_heavy},
                                            sim.clock()});
}

TEST_CASE("bad input: sliding window limiter options", "[bad_input][sliding_window][regression]") {
    rs::testing::simulation sim;
    const auto make = [&](rs::sliding_window_limiter_options o) {
        return rs::sliding_window_limiter{std::move(o), sim.clock()};
    };
    refused("permit_limit", "0", [&] { make({.permit_limit = 0, .window = 1s}); });
    for (nanoseconds v : {0ns, -1ns, nmin}) {
        refused("window", std::to_string(v.count()), [&] { make({.permit_limit = 1, .window = v}); });
        refused("queue_timeout", std::to_string(v.count()),
                [&] { make({.permit_limit = 1, .window = 1s, .queue_timeout = v}); });
    }
    refused("segments", "0", [&] { make({.permit_limit = 1, .window = 1s, .segments = 0}); });
    refused("segments", std::to_string(smax),
            [&] { make({.permit_limit = 1, .window = 1s, .segments = smax}); });
    refused("segments", "1000001", [&] { make({.permit_limit = 1, .window = 1s, .segments = 1'000'001}); });
    refused("segments", "11", [&] { make({.permit_limit = 1, .window = 10ns, .segments = 11}); });

    // Accepted extremes behave. The longest window saturates: a permit taken never comes back in
    // practice (it used to overflow where its return time was computed).
    behaves(sim, make({.permit_limit = smax, .window = nmax}));
    behaves(sim, make({.permit_limit = 1, .window = nmax, .segments = 1'000'000}));
    behaves(
        sim,
        make({.permit_limit = 1, .window = 1ns, .segments = 1, .queue_limit = smax, .queue_timeout = nmax}));
    for (std::size_t segments : {std::size_t{1}, std::size_t{3}, std::size_t{7}}) {
        // The waiters give up after 10 s: their permits never come back.
        const auto longest = make({.permit_limit = 2,
                                   .window = nmax,
                                   .segments = segments,
                                   .queue_limit = 4,
                                   .queue_timeout = 10s});
        CHECK(sim.run(longest.take_outcome()).has_value());
        CHECK(sim.run(longest.take_outcome()).has_value());
        for (int i = 0; i < 4; ++i)
            // A parameter, not a capture: the closure is gone once spawn returns.
            sim.spawn([](const auto& limiter) -> rs::task<void> {
                (void)co_await limiter.take_outcome();
            }(longest));
        sim.run_for(1s);
        const auto told = sim.run(longest.take_outcome());
        REQUIRE(told.has_failure());
        CHECK(told.error().as<rs::rate_limited_error>()->retry_after() > std::chrono::hours{24 * 365 * 100});
        CHECK(longest.tokens() == 0.0);
    }
}

TEST_CASE("bad input: retry budget options", "[bad_input][retry_budget]") {
    for (double v : {qnan, inf, -inf, 0.0, -1.0, 1.5, dlowest, dmax, dtiny, 1e-10})
        refused_by("resilience::retry_budget", "ratio", rs::detail::format_number(v),
                   [&] { rs::retry_budget{{.ratio = v}}; });
    for (double v : {qnan, inf, -inf, 0.0, -1.0, dlowest, dmax, 1e10})
        refused_by("resilience::retry_budget", "capacity", rs::detail::format_number(v),
                   [&] { rs::retry_budget{{.capacity = v}}; });
    // Accepted extremes: tokens stay in [0, capacity].
    for (const rs::retry_budget_options o : {rs::retry_budget_options{.ratio = 1e-9, .capacity = 1e9},
                                             rs::retry_budget_options{.ratio = 1.0, .capacity = dtiny}}) {
        rs::retry_budget budget{o};
        for (int i = 0; i < 10; ++i) {
            budget.record_call();
            (void)budget.try_withdraw();
        }
        CHECK(budget.tokens() >= 0.0);
        CHECK(budget.tokens() <= o.capacity);
    }
}

TEST_CASE("bad input: adaptive throttle options", "[bad_input][adaptive_throttle]") {
    rs::testing::simulation sim;
    const auto make = [&](rs::adaptive_throttle_options o) {
        return rs::adaptive_throttle{std::move(o), sim.clock(), rs::seeded_random{1}};
    };
    for (double v : {qnan, inf, -inf, 0.0, -0.0, -1.0, dlowest})
        refused("k", rs::detail::format_number(v), [&] { make({.k = v}); });
    for (nanoseconds v : {0ns, -1ns, nmin})
        refused("window", std::to_string(v.count()), [&] { make({.window = v}); });
    refused("segments", "0", [&] { make({.segments = 0}); });
    refused("segments", std::to_string(smax), [&] { make({.segments = smax}); });
    refused("segments", "1000001", [&] { make({.window = 1h, .segments = 1'000'001}); });
    refused("segments", "11", [&] { make({.window = 10ns, .segments = 11}); });

    // Accepted extremes behave: the tiniest and the largest k, the longest window, the finest one.
    behaves(sim, make({.k = dtiny}));
    behaves(sim, make({.k = dmax}));
    behaves(sim, make({.window = nmax}));
    behaves(sim, make({.window = nmax, .segments = 1'000'000}));
    behaves(sim, make({.window = 1ns, .segments = 1}));
    // With the largest k, a failing dependency is never throttled; with the tiniest, it is at once.
    for (const double k : {dtiny, dmax}) {
        const auto t = make({.k = k});
        (void)sim.run(t.execute_outcome([&sim] { return quick(sim); }));
        for (int i = 0; i < 3; ++i)
            (void)sim.run(t.execute_outcome([]() -> rs::task<int> {
                throw std::runtime_error("down");
                co_return 0;
            }));
        const double p = t.probability();
        CHECK(p >= 0.0);
        CHECK(p < 1.0);
        CHECK((p == 0.0) == (k == dmax));
    }
}

TEST_CASE("bad input: hedge options", "[bad_input][hedge]") {
    rs::testing::simulation sim;
    const auto make = [&](rs::hedge_options o) { return rs::hedge{std::move(o), sim.clock()}; };
    for (int v : {0, -1, INT_MIN})
        refused_by("resilience::hedge", "max_attempts", std::to_string(v),
                   [&] { make({.max_attempts = v}); });
    for (nanoseconds v : {-1ns, nmin})
        refused_by("resilience::hedge", "delay", std::to_string(v.count()), [&] { make({.delay = v}); });
    using seconds_d = std::chrono::duration<double>;
    refused_by("resilience::hedge", "delay", "nan s", [&] { make({.delay = seconds_d{qnan}}); });
    refused_by("resilience::hedge", "delay", "inf s", [&] { make({.delay = seconds_d{inf}}); });
    refused_by("resilience::hedge", "delay", "-inf s", [&] { make({.delay = seconds_d{-inf}}); });

    behaves(sim, make({.max_attempts = INT_MAX, .delay = nmax}));
    behaves(sim, make({.max_attempts = INT_MAX, .delay = seconds_d{dmax}}));
    behaves(sim, make({.max_attempts = 3, .delay = 0ns}));
    // A schedule answering NaN ends the call that asked it, with the same message.
    const auto odd = make({.max_attempts = 3, .delay = [](int) { return seconds_d{qnan}; }});
    const auto r = sim.run(odd.execute_outcome([&sim] { return quick(sim); }));
    REQUIRE(r.has_failure());
    CHECK_THROWS_WITH(r.error().rethrow(), Contains("delay") && Contains("nan s"));
}

TEST_CASE("bad input: chaos options and latency delays", "[bad_input][chaos][regression]") {
    rs::testing::simulation sim;
    namespace chaos = rs::chaos;
    using seconds_d = std::chrono::duration<double>;
    const auto latency = [&](auto delay, chaos::injection_options o = {.injection_rate = 1}) {
        return chaos::latency{delay, std::move(o), sim.clock()};
    };
    // A NaN delay became 0 ns and was accepted; infinities and a negative delay of less than a
    // nanosecond (which rounds to 0 ns) were taken too. Refused by name now, before converting.
    refused_by("resilience::chaos::latency", "delay", "nan s", [&] { latency(seconds_d{qnan}); });
    refused_by("resilience::chaos::latency", "delay", "inf s", [&] { latency(seconds_d{inf}); });
    refused_by("resilience::chaos::latency", "delay", "-inf s", [&] { latency(seconds_d{-inf}); });
    refused_by("resilience::chaos::latency", "delay", "nan ms", [&] {
        latency(std::chrono::duration<float, std::milli>{std::numeric_limits<float>::quiet_NaN()});
    });
    refused_by("resilience::chaos::latency (slow)", "delay", "nan s",
               [&] { latency(seconds_d{qnan}, {.name = "slow"}); });
    refused_by("resilience::chaos::latency", "delay must not be negative", "-1e-300 s",
               [&] { latency(seconds_d{-1e-300}); });
    refused_by("resilience::chaos::latency", "delay must not be negative", "-1.79769e+308 s",
               [&] { latency(seconds_d{dlowest}); });
    for (nanoseconds v : {-1ns, nmin})
        refused_by("resilience::chaos::latency", "delay must not be negative",
                   std::to_string(v.count()) + "ns", [&] { latency(v); });
    refused_by("resilience::chaos::latency", "delay must not be negative",
               std::to_string(nmin.count()) + "ns", [&] { latency(std::chrono::hours::min()); });

    // The injection rate, in every stage: NaN, infinities and anything outside [0, 1].
    for (double v : {qnan, inf, -inf, -0.001, 1.001, dmax, dlowest}) {
        const std::string got = rs::detail::format_number(v);
        refused_by("resilience::chaos::fault", "injection_rate", got,
                   [&] { chaos::fault{{.injection_rate = v}}; });
        refused_by("resilience::chaos::outcome", "injection_rate", got, [&] {
            chaos::outcome{7, {.injection_rate = v}};
        });
        refused_by("resilience::chaos::latency", "injection_rate", got,
                   [&] { latency(1ms, {.injection_rate = v}); });
    }

    // Accepted: zero, a tiny delay that rounds to 0 ns, and the longest (saturated to it).
    CHECK(latency(0ns).delay() == 0ns);
    CHECK(latency(seconds_d{dtiny}).delay() == 0ns);
    CHECK(latency(seconds_d{dmax}).delay() == nmax);
    CHECK(latency(std::chrono::hours::max()).delay() == nmax);
    behaves(sim, latency(0ns));
    behaves(sim, latency(seconds_d{0.5}));
    behaves(sim, latency(nmax, {.injection_rate = 0}));
    behaves(sim, chaos::fault{{.injection_rate = 0}});
    behaves(sim, chaos::outcome{8, {.injection_rate = 0}});
}

#if defined(RESILIENCE_HAS_REDIS)
// The Redis options: refused at construction like every other's (nothing connects until a call, so no
// server is needed here; tests/redis/ runs the accepted ones against a real one).
TEST_CASE("bad input: redis connection, rate limiter and bulkhead options", "[bad_input][redis]") {
    namespace redis = rs::redis;
    ::asio::io_context io;
    const auto connect = [&](redis::connection_options o) {
        return redis::connection{io.get_executor(), std::move(o)};
    };
    refused("host", "empty", [&] { connect({.host = ""}); });
    refused("port", "0", [&] { connect({.port = 0}); });
    for (nanoseconds v : {0ns, -1ns, nmin, nmax})
        refused("command_timeout", std::to_string(v.count()), [&] { connect({.command_timeout = v}); });
    refused("port", "99999", [&] { (void)redis::connection_options::from_url("redis://h:99999"); });
    refused("db", "2", [&] { (void)redis::connection_options::from_url("redis://h:6379/2"); });
    refused("user info", "@", [&] { (void)redis::connection_options::from_url("redis://:pw@h:6379"); });
    refused("bracketed host", "[::1", [&] { (void)redis::connection_options::from_url("redis://[::1"); });
    const redis::connection c = connect({});

    const auto limiter = [&](redis::rate_limiter_options o) { return redis::rate_limiter{std::move(o), c}; };
    refused("key", "empty", [&] { limiter({.token_limit = 1, .tokens_per_second = 1}); });
    refused("token_limit", "0", [&] { limiter({.key = "k", .token_limit = 0, .tokens_per_second = 1}); });
    refused("token_limit", std::to_string(smax),
            [&] { limiter({.key = "k", .token_limit = smax, .tokens_per_second = 1}); });
    for (double v : {qnan, inf, -inf, 0.0, -1.0, dlowest, dtiny, 1e-300, 1e-10})
        refused("tokens_per_second", rs::detail::format_number(v),
                [&] { limiter({.key = "k", .token_limit = 1, .tokens_per_second = v}); });
    for (nanoseconds v : {0ns, -1ns, nmin})
        refused("queue_timeout", std::to_string(v.count()),
                [&] { limiter({.key = "k", .token_limit = 1, .tokens_per_second = 1, .queue_timeout = v}); });
    for (double v : {qnan, inf, -inf, -1.0, 1.5, dmax, dlowest})
        refused("local_share", rs::detail::format_number(v),
                [&] { limiter({.key = "k", .token_limit = 1, .tokens_per_second = 1, .local_share = v}); });
    refused("local_share", "0", [&] {
        limiter({.key = "k",
                 .token_limit = 1,
                 .tokens_per_second = 1,
                 .when_unavailable = redis::unavailable_policy::local_share});
    });
    // Accepted extremes: the slowest and fastest rates, the longest wait, the smallest share.
    (void)limiter({.key = "k", .token_limit = 1, .tokens_per_second = 1e-9});
    (void)limiter({.key = "k", .token_limit = 1, .tokens_per_second = dmax});
    (void)limiter(
        {.key = "k", .token_limit = 1, .tokens_per_second = 1, .queue_limit = smax, .queue_timeout = nmax});
    (void)limiter({.key = "k",
                   .token_limit = 1,
                   .tokens_per_second = 1,
                   .when_unavailable = redis::unavailable_policy::local_share,
                   .local_share = dtiny});

    const auto bulkhead = [&](redis::bulkhead_options o) { return redis::bulkhead{std::move(o), c}; };
    refused("key", "empty", [&] { bulkhead({}); });
    refused("max_concurrent_calls", "0", [&] { bulkhead({.key = "k", .max_concurrent_calls = 0}); });
    for (nanoseconds v : {0ns, -1ns, nmin, nanoseconds{9ms}, nmax})
        refused("lease_duration", std::to_string(v.count()),
                [&] { bulkhead({.key = "k", .lease_duration = v}); });
    for (double v : {qnan, inf, -1.0, 1.5})
        refused("local_share", rs::detail::format_number(v),
                [&] { bulkhead({.key = "k", .local_share = v}); });
    // At least 3 x the connection's command_timeout (250 ms here), named with both values.
    refused("lease_duration", "749999999", [&] { bulkhead({.key = "k", .lease_duration = 749999999ns}); });
    refused("250000000", "749999999", [&] { bulkhead({.key = "k", .lease_duration = 749999999ns}); });
    (void)bulkhead({.key = "k", .lease_duration = 750ms});
    const redis::connection quick = connect({.command_timeout = 3ms});
    (void)redis::bulkhead{{.key = "k", .max_concurrent_calls = smax, .lease_duration = 10ms}, quick};
    (void)bulkhead(
        {.key = "k", .when_unavailable = redis::unavailable_policy::local_share, .local_share = 1.0});
    // The local share stands in as a bulkhead of its own, whose limit has a largest value.
    const auto local = [&](std::size_t calls, double share) {
        return bulkhead({.key = "k",
                         .max_concurrent_calls = calls,
                         .when_unavailable = redis::unavailable_policy::local_share,
                         .local_share = share});
    };
    constexpr std::size_t top = rs::bulkhead_options::max_limit;
    const std::string at_most = std::to_string(top) + ", got ";
    refused("max_concurrent_calls x local_share", at_most + std::to_string(smax), [&] { local(smax, 1.0); });
    refused("max_concurrent_calls x local_share", at_most + "9223372036854775808", [&] { local(smax, 0.5); });
    refused("max_concurrent_calls x local_share", at_most + std::to_string(top + 1),
            [&] { local(top + 1, 1.0); });
    (void)local(top, 1.0);
    (void)local(smax, 0.2);
}
#endif

TEST_CASE("bad input: a named policy signs its message with its label and name, then the field and value",
          "[bad_input][regression]") {
    rs::testing::simulation sim;
    const auto message = [](auto make) { return resilience_tests::invalid_argument_message(make); };
    CHECK(message([&] {
              rs::retry{{.name = "pay", .max_attempts = 0}, sim.clock()};
          }) == "resilience::retry (pay): max_attempts must be at least 1, got 0");
    CHECK(message([&] {
              rs::hedge{{.name = "pay", .max_attempts = 0}, sim.clock()};
          }) == "resilience::hedge (pay): max_attempts must be at least 1, got 0");
    CHECK(message([&] {
              rs::timeout{{.name = "pay", .timeout = 0s}, sim.clock()};
          }) == "resilience::timeout (pay): timeout must be positive, got 0ns");
    CHECK(message([&] { rs::chaos::fault{{.name = "pay", .injection_rate = 2}}; }) ==
          "resilience::chaos::fault (pay): injection_rate must be in [0, 1], got 2");
    CHECK(message([&] {
              rs::chaos::fault{rs::failure{}, {.name = "pay"}};
          }) == "resilience::chaos::fault (pay): the failure to inject is empty");
    CHECK(message([&] {
              (void)rs::retry_stream([] { return rs::async_generator<int>{}; },
                                     {.name = "pay", .max_attempts = 0}, sim.clock());
          }) == "resilience::retry_stream (pay): max_attempts must be at least 1, got 0");
    CHECK(message([&] { (void)rs::standard_pipeline({.name = "pay", .max_attempts = 0}, sim.clock()); }) ==
          "resilience::standard_pipeline (pay): max_attempts must be at least 1, got 0");
}

} // namespace test_bad_input
