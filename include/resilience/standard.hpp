// SPDX-License-Identifier: MIT
/// \file standard.hpp
/// `standard_pipeline`: the usual stack for a remote call (total timeout, retry, breaker, attempt
/// timeout) from one set of options with Polly's standard defaults.
#pragma once

#include "backoff.hpp"
#include "circuit_breaker.hpp"
#include "classifier.hpp"
#include "clock.hpp"
#include "concepts.hpp"
#include "pipeline.hpp"
#include "random.hpp"
#include "retry.hpp"
#include "timeout.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace resilience::inline v0_2 {

/// The options of `standard_pipeline`, with the defaults of Polly's standard resilience pipeline.
/// Validated by `standard_pipeline` (`std::invalid_argument` naming the field and the value).
struct standard_options {
    /// Names the pipeline: its stages are named `<name>.total_timeout`, `<name>.retry`,
    /// `<name>.circuit_breaker` and `<name>.attempt_timeout` (without the `<name>.` when empty),
    /// so an error's `policy_name()` says which stage made it.
    std::string name{};
    /// Attempts in all, the first included: the retry's `max_attempts` (Polly's `MaxRetryAttempts`
    /// counts the retries only: ours is that plus one). 1 never retries. At least 1.
    int max_attempts = 4;
    /// The wait before the first retry; it doubles with each retry, and each wait is drawn uniformly
    /// from its upper half (`jitter::equal`). Positive.
    std::chrono::nanoseconds base_delay = std::chrono::seconds{2};
    /// How long one attempt may run. Positive, and less than `total_timeout`.
    std::chrono::nanoseconds attempt_timeout = std::chrono::seconds{10};
    /// How long the whole call may run, every attempt and wait included. Positive.
    std::chrono::nanoseconds total_timeout = std::chrono::seconds{30};
    /// The breaker opens when at least this share of the calls in its window failed; in (0, 1].
    double failure_ratio = 0.1;
    /// The breaker's window: the calls of the last `window` (Polly's `SamplingDuration`). At least
    /// twice `attempt_timeout`, so that a window can hold the outcome of more than one attempt.
    std::chrono::nanoseconds window = std::chrono::seconds{30};
    /// Calls the window must hold before a ratio counts. Positive. A dependency called less often
    /// than this per `window` never opens the breaker: lower it for a quiet one.
    int minimum_throughput = 100;
    /// How long the breaker stays open. Positive.
    std::chrono::nanoseconds break_duration = std::chrono::seconds{5};
};

/// The type `standard_pipeline` returns: `get<0>()` is the total timeout, `get<1>()` the retry,
/// `get<2>()` the circuit breaker and `get<3>()` the attempt timeout.
template <clock C = steady_clock, random_source Random = thread_random>
using standard_pipeline_t = pipeline<timeout<C>, retry<C, Random>, circuit_breaker<C>, timeout<C>>;

namespace detail {

inline std::string standard_stage_name(const std::string& name, const char* stage) {
    return name.empty() ? std::string(stage) : name + "." + stage;
}

inline std::string standard_ns(std::chrono::nanoseconds d) {
    return std::to_string(d.count()) + "ns";
}

/// Throws `std::invalid_argument` for the first thing wrong with `o`.
inline void validate_standard_options(const standard_options& o) {
    const auto bad = [&o](const std::string& what) {
        throw std::invalid_argument(policy_label("standard_pipeline", o.name) + ": " + what);
    };
    const auto positive = [&bad](std::chrono::nanoseconds d, const char* field) {
        if (d <= std::chrono::nanoseconds::zero())
            bad(std::string(field) + " must be positive, got " + standard_ns(d));
    };
    if (o.max_attempts < 1)
        bad("max_attempts must be at least 1, got " + std::to_string(o.max_attempts));
    positive(o.base_delay, "base_delay");
    positive(o.attempt_timeout, "attempt_timeout");
    positive(o.total_timeout, "total_timeout");
    if (o.attempt_timeout >= o.total_timeout)
        bad("attempt_timeout must be less than total_timeout (" + standard_ns(o.total_timeout) + "), got " +
            standard_ns(o.attempt_timeout));
    if (!(o.failure_ratio > 0.0 && o.failure_ratio <= 1.0))
        bad("failure_ratio must be in (0, 1], got " + format_number(o.failure_ratio));
    positive(o.window, "window");
    // window >= 2 * attempt, written as a halving (rounded down) so that nothing overflows.
    if (o.window / 2 < o.attempt_timeout)
        bad("window must be at least twice attempt_timeout (" + standard_ns(o.attempt_timeout) + "), got " +
            standard_ns(o.window));
    if (o.minimum_throughput < 1)
        bad("minimum_throughput must be positive, got " + std::to_string(o.minimum_throughput));
    positive(o.break_duration, "break_duration");
}

} // namespace detail

/// The breaker `standard_pipeline` makes from `o`: a time window of `window`,
/// `failure_ratio` and `minimum_throughput`, open for `break_duration`, named
/// `<name>.circuit_breaker`. For sharing one breaker between pipelines (see the overload of
/// `standard_pipeline` taking a breaker, and `registry`). Validates `o` as `standard_pipeline` does.
inline circuit_breaker_options standard_breaker_options(const standard_options& o) {
    detail::validate_standard_options(o);
    // A window keeps at most 10 segments, and never more segments than nanoseconds.
    const auto segments = static_cast<std::size_t>(std::min<std::int64_t>(10, o.window.count()));
    return circuit_breaker_options{
        .name = detail::standard_stage_name(o.name, "circuit_breaker"),
        .sampling = breaker_sampling{.window = o.window,
                                     .segments = segments,
                                     .minimum_throughput = o.minimum_throughput,
                                     .failure_ratio = o.failure_ratio},
        .break_duration = o.break_duration,
    };
}

/// Builds the standard pipeline around `breaker`, a breaker made elsewhere (shared with other
/// pipelines, or handed out by a `registry`): the options' breaker fields (`failure_ratio`,
/// `window`, `minimum_throughput`, `break_duration`) are still validated but the
/// breaker keeps its own. Time is read from `breaker.clock()`.
template <clock C, random_source Random = thread_random>
standard_pipeline_t<C, Random> standard_pipeline(const standard_options& o, circuit_breaker<C> breaker,
                                                 Random rng = Random{}) {
    detail::validate_standard_options(o);
    const C clock = breaker.clock();
    // Waits beyond the total timeout are cut by it anyway: the cap only keeps the doubling finite.
    const std::chrono::nanoseconds cap = std::max(o.base_delay, o.total_timeout);
    retry_options retry_opts{
        .name = detail::standard_stage_name(o.name, "retry"),
        .max_attempts = o.max_attempts,
        .backoff =
            exponential_backoff{.initial = o.base_delay, .factor = 2.0, .max = cap, .jitter = jitter::equal},
        .max_delay = cap,
    };
    return standard_pipeline_t<C, Random>{
        timeout<C>{timeout_options{.name = detail::standard_stage_name(o.name, "total_timeout"),
                                   .timeout = o.total_timeout},
                   clock},
        retry<C, Random>{std::move(retry_opts), clock, std::move(rng)},
        std::move(breaker),
        timeout<C>{timeout_options{.name = detail::standard_stage_name(o.name, "attempt_timeout"),
                                   .timeout = o.attempt_timeout},
                   clock},
    };
}

/// The usual stack for a call to a remote dependency, outermost first, as Polly's standard
/// resilience pipeline:
/// 1. a **total timeout** (`total_timeout`) over the whole call, waits included;
/// 2. a **retry** of transient failures (`is_transient`: timeouts yes, an open circuit no),
///    up to `max_attempts` attempts in all, waiting `base_delay * 2^(n-1)` before retry n,
///    drawn uniformly from `[d/2, d]` (equal jitter, from `rng`);
/// 3. a **circuit breaker** over a time window (`window`, `failure_ratio`,
///    `minimum_throughput`), open for `break_duration`; every attempt passes it and is recorded;
/// 4. an **attempt timeout** (`attempt_timeout`) on each attempt.
///
/// Checks `o` first: `std::invalid_argument` naming the field when a value is out of range, when
/// `attempt_timeout` is not below `total_timeout` (the first attempt could never time out on its
/// own), or when `window` is under twice `attempt_timeout` (a window too short to see
/// the timeouts it is meant to judge). Each call makes a new breaker: a pipeline per dependency,
/// copied freely (copies share the breaker). `C` serves every use of time; `rng` draws the jitter
/// (the default `thread_random` is safe to share across threads; a `seeded_random` is not).
///
///     auto api = rs::standard_pipeline({.name = "billing", .attempt_timeout = 2s, .total_timeout = 10s,
///                                       .window = 10s});
///     auto invoice = co_await api.execute(fetch_invoice, id);
///     rs::circuit_state s = api.get<2>().state();     // the breaker
template <clock C = steady_clock, random_source Random = thread_random>
standard_pipeline_t<C, Random> standard_pipeline(const standard_options& o, C clock = C{},
                                                 Random rng = Random{}) {
    return standard_pipeline(o, circuit_breaker<C>{standard_breaker_options(o), std::move(clock)},
                             std::move(rng));
}

} // namespace resilience
