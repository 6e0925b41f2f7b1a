// SPDX-License-Identifier: MIT
// Fuzz targets for the options of every policy: construct from fuzzed values, then use the policy
// on virtual time. Anything but std::invalid_argument escaping a constructor, a call that ends
// wrongly, or undefined behaviour (the sanitizers) is a finding.

#include "fuzz_input.hpp"
#include "targets.hpp"

#include <resilience/adaptive_throttle.hpp>
#include <resilience/backoff.hpp>
#include <resilience/bulkhead.hpp>
#include <resilience/circuit_breaker.hpp>
#include <resilience/hedge.hpp>
#include <resilience/queue_discipline.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/retry.hpp>
#include <resilience/retry_budget.hpp>
#include <resilience/sliding_window_limiter.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>

namespace rs = resilience;
using namespace std::chrono_literals;

namespace resilience_fuzz {
namespace {

[[noreturn]] void finding(const char* what) {
    std::fprintf(stderr, "resilience fuzz finding: %s\n", what);
    std::abort();
}
void require(bool ok, const char* what) {
    if (!ok)
        finding(what);
}

// A refusal must name a field: "<policy>: <field> must ..., got <value>".
void check_message(const std::invalid_argument& e) {
    const std::string m = e.what();
    require(m.find("resilience::") == 0, "an options message does not start with the policy");
    require(m.find(" must ") != std::string::npos || m.find(" needs ") != std::string::npos,
            "an options message does not say what the field must be");
}

rs::task<int> quick(rs::testing::simulation& sim) {
    co_await sim.sleep_for(1ms);
    co_return 7;
}

// Runs a call that takes 1 ms through `p` and requires `expected` of it.
template <class Policy>
void one_call(rs::testing::simulation& sim, const Policy& p, bool must_succeed) {
    const auto r = sim.run(p.execute_outcome([&sim] { return quick(sim); }));
    if (must_succeed)
        require(r.has_value() && r.value() == 7, "a lone quick call did not get through");
}

template <class Make>
int construct(Make make) {
    try {
        make();
    } catch (const std::invalid_argument& e) {
        check_message(e);
    }
    return 0;
}

std::optional<std::chrono::nanoseconds> maybe(input& in) {
    if (in.flag())
        return std::nullopt;
    return in.duration();
}

rs::jitter jitter_of(input& in) {
    switch (in.byte() % 5) {
    case 0:
        return rs::jitter::none;
    case 1:
        return rs::jitter::full;
    case 2:
        return rs::jitter::equal;
    case 3:
        return rs::jitter::decorrelated;
    default:
        return rs::jitter::proportional(in.number()); // may throw invalid_argument
    }
}

rs::backoff backoff_of(input& in) {
    switch (in.byte() % 4) {
    case 0:
        return rs::constant_backoff{in.duration(), jitter_of(in)};
    case 1:
        return rs::linear_backoff{in.duration(), in.duration(), in.duration(), jitter_of(in)};
    case 2:
        return rs::exponential_backoff{in.duration(), in.number(), in.duration(), jitter_of(in)};
    default: {
        rs::list_backoff l{{}, jitter_of(in)};
        for (int n = in.byte() % 4; n > 0; --n)
            l.delays.push_back(in.duration());
        return l;
    }
    }
}

} // namespace

int retry_options(const std::uint8_t* data, std::size_t size) {
    input in{data, size};
    return construct([&] {
        rs::testing::simulation sim;
        rs::retry_options o;
        o.max_attempts = in.count();
        o.backoff = backoff_of(in);
        o.max_elapsed = in.duration();
        o.max_delay = in.duration();
        o.min_attempt_time = in.duration(); // no deadline here: it must change nothing
        const rs::retry r{std::move(o), sim.clock(), rs::seeded_random{in.raw()}};
        one_call(sim, r, true);
        // A failing call ends, after at most max_attempts attempts (bounded here to keep runs short).
        if (r.options().max_attempts <= 16) {
            int calls = 0;
            const auto failed = sim.run(r.execute_outcome([&]() -> rs::task<int> {
                ++calls;
                co_await sim.sleep_for(1ms);
                throw std::runtime_error("down");
            }));
            require(failed.has_failure(), "a call that always fails succeeded");
            require(calls >= 1 && calls <= r.options().max_attempts, "attempts outside [1, max_attempts]");
        }
    });
}

int backoff(const std::uint8_t* data, std::size_t size) {
    input in{data, size};
    return construct([&] {
        const rs::backoff b = backoff_of(in);
        rs::seeded_random rng{in.raw()};
        for (int i = 0; i < 4; ++i) {
            const auto d =
                b.delay(in.count(), rng, rs::failure{}, std::chrono::nanoseconds{in.int64() & INT64_MAX});
            require(d >= 0ns, "a negative backoff delay");
        }
    });
}

int circuit_breaker_options(const std::uint8_t* data, std::size_t size) {
    input in{data, size};
    return construct([&] {
        rs::testing::simulation sim;
        rs::circuit_breaker_options o;
        if (in.flag())
            o.failure_threshold = in.count();
        if (in.flag()) {
            rs::breaker_sampling w;
            if (in.flag())
                w.calls = in.count();
            if (in.flag())
                w.window = in.duration();
            w.segments = static_cast<std::size_t>(in.count());
            if (in.flag())
                w.minimum_throughput = in.count();
            if (in.flag())
                w.failure_ratio = in.number();
            w.slow_call_duration = maybe(in);
            if (in.flag())
                w.slow_call_ratio = in.number();
            o.sampling = w;
        }
        o.break_duration = in.duration();
        o.break_duration_growth = in.number();
        o.max_break_duration = maybe(in);
        o.probes = in.count();
        const rs::circuit_breaker b{std::move(o), sim.clock()};
        one_call(sim, b, true);
        for (int i = 0; i < 6; ++i) {
            const auto r = sim.run(b.execute_outcome([&]() -> rs::task<int> {
                co_await sim.sleep_for(1ms);
                throw std::runtime_error("down");
            }));
            require(r.has_failure(), "a failing call succeeded through the breaker");
            if (auto* open = r.error().as<rs::circuit_open_error>())
                require(open->retry_after() > 0ns, "an open circuit with a retry_after not positive");
        }
    });
}

int timeout_options(const std::uint8_t* data, std::size_t size) {
    input in{data, size};
    return construct([&] {
        rs::testing::simulation sim;
        const bool as_double = in.flag();
        const rs::timeout t = as_double ? rs::timeout{std::chrono::duration<double>{in.number()}, sim.clock()}
                                        : rs::timeout{{.timeout = in.duration()}, sim.clock()};
        require(t.options().timeout > 0ns, "a timeout accepted a duration that is not positive");
        one_call(sim, t, true); // a quick value is returned, even after the deadline
    });
}

int bulkhead_options(const std::uint8_t* data, std::size_t size) {
    input in{data, size};
    return construct([&] {
        rs::testing::simulation sim;
        const std::size_t slots = in.size();
        const std::size_t queue = in.size();
        const std::optional<std::chrono::nanoseconds> timeout = maybe(in);
        rs::queue_discipline discipline = rs::fifo{};
        if (in.flag()) {
            const auto target = in.duration();
            const auto interval = in.duration();
            if (in.flag())
                discipline = rs::codel{.target = target, .interval = interval};
            else
                discipline = rs::adaptive_lifo{.target = target, .interval = interval};
        }
        const rs::bulkhead b{{.max_concurrent_calls = slots,
                              .queue_limit = queue,
                              .queue_timeout = timeout,
                              .queue_discipline = discipline},
                             sim.clock()};
        std::visit(
            [](const auto& d) {
                if constexpr (!std::is_same_v<std::decay_t<decltype(d)>, rs::fifo>)
                    require(
                        d.target > 0ns && d.interval > 0ns,
                        "a bulkhead accepted a queue discipline whose target or interval is not positive");
            },
            b.options().queue_discipline);
        one_call(sim, b, true);
        for (int i = 0; i < 3; ++i)
            // Parameters, not captures: the closure is gone once spawn returns.
            sim.spawn([](const rs::bulkhead<rs::testing::virtual_clock>& bh,
                         rs::testing::simulation& s) -> rs::task<void> {
                (void)co_await bh.execute_outcome([&s] { return quick(s); });
            }(b, sim));
        sim.run_all();
    });
}

int rate_limiter_options(const std::uint8_t* data, std::size_t size) {
    input in{data, size};
    return construct([&] {
        rs::testing::simulation sim;
        const std::size_t tokens = in.size();
        const double rate = in.number();
        const std::size_t queue = in.size();
        const rs::rate_limiter l{{.token_limit = tokens,
                                  .tokens_per_second = rate,
                                  .queue_limit = queue,
                                  .queue_timeout = maybe(in)},
                                 sim.clock()};
        one_call(sim, l, true);
        for (int i = 0; i < 4; ++i) {
            const auto r = sim.run(l.take_outcome());
            if (!r.has_value())
                if (auto* e = r.error().as<rs::rate_limited_error>())
                    require(e->retry_after() >= 0ns, "a negative retry_after");
        }
        const double t = l.tokens();
        require(t >= 0.0 && t <= static_cast<double>(tokens), "tokens() outside [0, token_limit]");
    });
}

int sliding_window_limiter_options(const std::uint8_t* data, std::size_t size) {
    input in{data, size};
    return construct([&] {
        // The loop goes first (reset below), so that waiters still queued leave the limiter's
        // queue while the limiter lives.
        auto owned_sim = std::make_unique<rs::testing::simulation>();
        rs::testing::simulation& sim = *owned_sim;
        const std::size_t permits = in.size();
        const auto window = in.duration();
        const std::size_t segments = in.size();
        const std::size_t queue = in.size();
        const rs::sliding_window_limiter l{{.permit_limit = permits,
                                            .window = window,
                                            .segments = segments,
                                            .queue_limit = queue,
                                            .queue_timeout = maybe(in)},
                                           sim.clock()};
        one_call(sim, l, true);
        for (int i = 0; i < 4; ++i)
            sim.spawn(
                [](const rs::sliding_window_limiter<rs::testing::virtual_clock>& lim) -> rs::task<void> {
                    const auto r = co_await lim.take_outcome();
                    if (!r.has_value())
                        if (auto* e = r.error().as<rs::rate_limited_error>())
                            require(e->retry_after() >= 0ns, "a negative retry_after");
                }(l));
        sim.run_for(std::chrono::nanoseconds{in.int64() & 0xffff'ffff});
        const double t = l.tokens();
        require(t >= 0.0 && t <= static_cast<double>(permits), "tokens() outside [0, permit_limit]");
        owned_sim.reset();
    });
}

int retry_budget_options(const std::uint8_t* data, std::size_t size) {
    input in{data, size};
    return construct([&] {
        const double ratio = in.number();
        const double capacity = in.number();
        rs::retry_budget b{{.ratio = ratio, .capacity = capacity}};
        for (int i = 0; i < 8; ++i) {
            if (in.flag())
                b.record_call();
            else
                (void)b.try_withdraw();
            require(b.tokens() >= 0.0 && b.tokens() <= capacity, "budget tokens outside [0, capacity]");
        }
    });
}

int hedge_options(const std::uint8_t* data, std::size_t size) {
    input in{data, size};
    return construct([&] {
        rs::testing::simulation sim;
        rs::hedge_options o;
        o.max_attempts = in.count();
        if (in.flag())
            o.delay = std::chrono::duration<double>{in.number()};
        else
            o.delay = in.duration();
        const rs::hedge h{std::move(o), sim.clock()};
        // Every attempt may start together (a zero delay): keep the number small enough to run.
        if (h.options().max_attempts <= 8)
            one_call(sim, h, true);
    });
}

int adaptive_throttle_options(const std::uint8_t* data, std::size_t size) {
    input in{data, size};
    return construct([&] {
        rs::testing::simulation sim;
        rs::adaptive_throttle_options o;
        o.k = in.number();
        o.window = in.duration();
        o.segments = in.size();
        const rs::adaptive_throttle t{std::move(o), sim.clock(), rs::seeded_random{in.raw()}};
        one_call(sim, t, true); // nothing refused yet: the first call goes through
        // Calls that fail or succeed, some time apart: the probability stays in [0, 1).
        for (int i = 0; i < 12; ++i) {
            const bool fails = in.flag();
            (void)sim.run(t.execute_outcome([&sim, fails]() -> rs::task<int> {
                co_await sim.sleep_for(1ms);
                if (fails)
                    throw std::runtime_error("refused by the dependency");
                co_return 7;
            }));
            sim.run_for(std::chrono::nanoseconds{static_cast<std::int64_t>(in.raw() % 10'000'000'000)});
            const double p = t.probability();
            require(p >= 0.0 && p < 1.0, "throttle probability outside [0, 1)");
        }
    });
}

} // namespace resilience_fuzz
