// SPDX-License-Identifier: MIT
// The success path of each policy alone and of pipelines, a shared handle hit from two threads, and
// rejections through execute_outcome, all against a bare co_await of the same action in the same run.
// See bench/README.md for how to read and reproduce the figures.
#include "harness.hpp"

#include <resilience/fallback.hpp>
#include <resilience/resilience.hpp>

#include <atomic>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

// The dependency, the action that calls it and the row through a policy: bench/harness.hpp.
const auto action = bench::ready_action;
using bench::through;

// A limiter and a bulkhead that never refuse in these runs: the success path only.
rs::rate_limiter<> roomy_limiter() {
    return rs::rate_limiter{{.token_limit = 1'000'000'000, .tokens_per_second = 1e12}};
}
rs::bulkhead<> roomy_bulkhead() {
    return rs::bulkhead{{.max_concurrent_calls = 1'000}};
}

using bench::bare_call;
BENCHMARK(bare_call);

void retry_alone(benchmark::State& state) {
    through(state, rs::retry{});
}
BENCHMARK(retry_alone);

// The same policy over a clock behind `rs::any_clock` (holding `rs::steady_clock`): what the
// indirection costs.
void retry_alone_any_clock(benchmark::State& state) {
    through(state, rs::retry{{}, rs::any_clock{rs::steady_clock{}}});
}
BENCHMARK(retry_alone_any_clock);

void retry_with_budget(benchmark::State& state) {
    through(state, rs::retry{{.budget = rs::retry_budget{}}});
}
BENCHMARK(retry_with_budget);

void timeout_alone(benchmark::State& state) {
    through(state, rs::timeout{1s});
}
BENCHMARK(timeout_alone);

void timeout_alone_any_clock(benchmark::State& state) {
    through(state, rs::timeout{1s, rs::any_clock{rs::steady_clock{}}});
}
BENCHMARK(timeout_alone_any_clock);

// The first attempt answers at once, so no extra attempt starts and no timer is armed: what is left is
// the hedge's frame and the attempt's own.
void hedge_alone(benchmark::State& state) {
    through(state, rs::hedge{{.max_attempts = 2, .delay = 1s}});
}
BENCHMARK(hedge_alone);

void pipeline_retry_hedge_timeout(benchmark::State& state) {
    through(state, rs::pipeline{rs::retry{}, rs::hedge{{.max_attempts = 2, .delay = 1s}}, rs::timeout{1s}});
}
BENCHMARK(pipeline_retry_hedge_timeout);

void fallback_alone(benchmark::State& state) {
    through(state, rs::fallback{0});
}
BENCHMARK(fallback_alone);

void circuit_breaker_alone(benchmark::State& state) {
    through(state, rs::circuit_breaker{{.failure_threshold = 5}});
}
BENCHMARK(circuit_breaker_alone);

void windowed_breaker_alone(benchmark::State& state) {
    through(state,
            rs::circuit_breaker{{.sampling = rs::breaker_sampling{.window = 10s, .failure_ratio = 0.5}}});
}
BENCHMARK(windowed_breaker_alone);

void bulkhead_alone(benchmark::State& state) {
    through(state, roomy_bulkhead());
}
BENCHMARK(bulkhead_alone);

void rate_limiter_alone(benchmark::State& state) {
    through(state, roomy_limiter());
}
BENCHMARK(rate_limiter_alone);

// A dependency that accepts every call, so the rejection probability stays 0: admitting and counting
// the accept, no draw.
void adaptive_throttle_alone(benchmark::State& state) {
    through(state, rs::adaptive_throttle{});
}
BENCHMARK(adaptive_throttle_alone);

void pipeline_retry_timeout(benchmark::State& state) {
    through(state, rs::pipeline{rs::retry{}, rs::timeout{1s}});
}
BENCHMARK(pipeline_retry_timeout);

// The same pipeline behind `rs::any_policy<int>`: what storing it without its type costs.
void any_policy_pipeline(benchmark::State& state) {
    const rs::any_policy<int> policy = rs::pipeline{rs::retry{}, rs::timeout{1s}};
    through(state, policy);
}
BENCHMARK(any_policy_pipeline);

void pipeline_of_five(benchmark::State& state) {
    through(state, rs::pipeline{rs::retry{}, rs::circuit_breaker{{.failure_threshold = 5}}, rs::timeout{1s},
                                roomy_bulkhead(), roomy_limiter()});
}
BENCHMARK(pipeline_of_five);

// The same five inside a `telemetry` stage whose listener counts events (two per call: the retry's
// attempt and the stage's call): what listening costs. With no listener the row above pays only the
// emission points' tests of an empty listener.
void pipeline_of_five_telemetry(benchmark::State& state) {
    std::size_t events = 0;
    through(state, rs::pipeline{rs::telemetry{[&events](const rs::telemetry_event&) { ++events; }},
                                rs::retry{}, rs::circuit_breaker{{.failure_threshold = 5}}, rs::timeout{1s},
                                roomy_bulkhead(), roomy_limiter()});
    benchmark::DoNotOptimize(events);
}
BENCHMARK(pipeline_of_five_telemetry);

// The same, with a caller's stop token that can be stopped (it never is).
void pipeline_of_five_caller_token(benchmark::State& state) {
    const rs::pipeline p{rs::retry{}, rs::circuit_breaker{{.failure_threshold = 5}}, rs::timeout{1s},
                         roomy_bulkhead(), roomy_limiter()};
    resilience::stop_source caller;
    bench::run_on_loop(state, [&](benchmark::State*) -> rs::task<void> {
        benchmark::DoNotOptimize(co_await p.execute(action, caller.get_token()));
    });
}
BENCHMARK(pipeline_of_five_caller_token);

// The same five, called with a context carrying two properties (a request id and a tenant) that the
// action reads: what properties cost a call that has them. A call without them pays only a null pointer
// copied along with its context (`pipeline_of_five`).
inline constexpr rs::property_key<std::string> request_id{"request_id"};
inline constexpr rs::property_key<std::string> tenant{"tenant"};
void pipeline_of_five_properties(benchmark::State& state) {
    const rs::pipeline p{rs::retry{}, rs::circuit_breaker{{.failure_threshold = 5}}, rs::timeout{1s},
                         roomy_bulkhead(), roomy_limiter()};
    rs::context ctx;
    ctx.set_property(request_id, "r-0001");
    ctx.set_property(tenant, "acme");
    bench::run_on_loop(state, [&](benchmark::State*) -> rs::task<void> {
        benchmark::DoNotOptimize(co_await p.execute(
            [](const rs::context& c) {
                benchmark::DoNotOptimize(c.property(request_id));
                return bench::ready_dependency();
            },
            ctx));
    });
}
BENCHMARK(pipeline_of_five_properties);

// The same five over `rs::coarse_steady_clock`: the call's one clock reading is the kernel's coarse
// clock (a few nanoseconds) instead of the precise one.
void pipeline_of_five_coarse_clock(benchmark::State& state) {
    const rs::coarse_steady_clock coarse;
    through(state, rs::pipeline{
                       rs::retry{{}, coarse}, rs::circuit_breaker{{.failure_threshold = 5}, coarse},
                       rs::timeout{1s, coarse}, rs::bulkhead{{.max_concurrent_calls = 1'000}, coarse},
                       rs::rate_limiter{{.token_limit = 1'000'000'000, .tokens_per_second = 1e12}, coarse}});
}
BENCHMARK(pipeline_of_five_coarse_clock);

// An action that takes the attempt's stop token, so the timeout makes one on every call.
void pipeline_of_five_token_taken(benchmark::State& state) {
    const rs::pipeline p{rs::retry{}, rs::circuit_breaker{{.failure_threshold = 5}}, rs::timeout{1s},
                         roomy_bulkhead(), roomy_limiter()};
    bench::run_on_loop(state, [&](benchmark::State*) -> rs::task<void> {
        benchmark::DoNotOptimize(
            co_await p.execute([](resilience::stop_token) { return bench::ready_dependency(); }));
    });
}
BENCHMARK(pipeline_of_five_token_taken);

// By hand: the least a five-policy call can cost, whatever the library does. The benchmark's own frame
// does only what the five policies' success path cannot avoid: one reading of the clock (the timeout's
// deadline and the bucket's refill) and the stateful handles' shared words (the breaker's state read,
// the bulkhead's slot taken and given back, a token taken from the bucket with a compare-and-swap), each
// word on a cache line of its own. No library frame, no result, no timer, no retry. Against the same
// bare call, these rows are the floor under `pipeline_of_five` on this machine (bench/README.md, "The
// least a call can cost").
struct by_hand_words {
    alignas(64) std::atomic<int> breaker{0};
    alignas(64) std::atomic<long> slots{0};
    alignas(64) std::atomic<long> tokens{1'000'000'000'000};
};
by_hand_words& shared_words() {
    static by_hand_words w;
    return w;
}
// False when a policy would refuse (never, in these runs); `co_await` stays in the caller's frame.
bool by_hand_admit(by_hand_words& w) {
    if (w.breaker.load(std::memory_order_acquire) != 0)
        return false;
    if (w.slots.fetch_add(1, std::memory_order_acquire) >= 1'000) {
        w.slots.fetch_sub(1, std::memory_order_release);
        return false;
    }
    long t = w.tokens.load(std::memory_order_relaxed);
    do {
        if (t <= 0)
            return false;
    } while (!w.tokens.compare_exchange_weak(t, t - 1, std::memory_order_acq_rel, std::memory_order_relaxed));
    return true;
}
template <class Clock>
void by_hand(benchmark::State& state, by_hand_words& w) {
    bench::run_on_loop(state, [&](benchmark::State*) -> rs::task<void> {
        if constexpr (!std::is_void_v<Clock>)
            benchmark::DoNotOptimize(Clock{}.now());
        if (!by_hand_admit(w))
            co_return;
        benchmark::DoNotOptimize(co_await action());
        w.slots.fetch_sub(1, std::memory_order_release);
    });
}
void by_hand_clock_read(benchmark::State& state) {
    bench::run_on_loop(state, [](benchmark::State*) -> rs::task<void> {
        benchmark::DoNotOptimize(rs::steady_clock{}.now());
        benchmark::DoNotOptimize(co_await action());
    });
}
BENCHMARK(by_hand_clock_read);
void by_hand_shared_words(benchmark::State& state) {
    by_hand_words w;
    by_hand<void>(state, w);
}
BENCHMARK(by_hand_shared_words);
void by_hand_least_of_five(benchmark::State& state) {
    by_hand_words w;
    by_hand<rs::steady_clock>(state, w);
}
BENCHMARK(by_hand_least_of_five);
void by_hand_least_of_five_coarse_clock(benchmark::State& state) {
    by_hand_words w;
    by_hand<rs::coarse_steady_clock>(state, w);
}
BENCHMARK(by_hand_least_of_five_coarse_clock);

// One handle of each stateful policy shared by two threads, each running its own event loop.
const rs::pipeline<rs::circuit_breaker<>, rs::bulkhead<>, rs::rate_limiter<>>& shared_stateful() {
    static const rs::pipeline p{rs::circuit_breaker{{.failure_threshold = 5}}, roomy_bulkhead(),
                                roomy_limiter()};
    return p;
}
void shared_handles_two_threads(benchmark::State& state) {
    through(state, shared_stateful());
}
BENCHMARK(shared_handles_two_threads)->Threads(2)->UseRealTime();

void shared_handles_one_thread(benchmark::State& state) {
    through(state, shared_stateful());
}
BENCHMARK(shared_handles_one_thread)->UseRealTime();

// The control: each thread its own handles (nothing shared), two threads and one.
void separate_handles(benchmark::State& state) {
    const rs::pipeline p{rs::circuit_breaker{{.failure_threshold = 5}}, roomy_bulkhead(), roomy_limiter()};
    through(state, p);
}
void separate_handles_two_threads(benchmark::State& state) {
    separate_handles(state);
}
BENCHMARK(separate_handles_two_threads)->Threads(2)->UseRealTime();
void separate_handles_one_thread(benchmark::State& state) {
    separate_handles(state);
}
BENCHMARK(separate_handles_one_thread)->UseRealTime();

// The bulkhead and the limiter alone, one handle shared by two threads: their fast paths under
// contention, without the breaker's mutex beside them.
const rs::bulkhead<>& shared_bulkhead() {
    static const rs::bulkhead b = roomy_bulkhead();
    return b;
}
void bulkhead_shared_two_threads(benchmark::State& state) {
    through(state, shared_bulkhead());
}
BENCHMARK(bulkhead_shared_two_threads)->Threads(2)->UseRealTime();
void bulkhead_shared_one_thread(benchmark::State& state) {
    through(state, shared_bulkhead());
}
BENCHMARK(bulkhead_shared_one_thread)->UseRealTime();

const rs::rate_limiter<>& shared_limiter() {
    static const rs::rate_limiter l = roomy_limiter();
    return l;
}
void rate_limiter_shared_two_threads(benchmark::State& state) {
    through(state, shared_limiter());
}
BENCHMARK(rate_limiter_shared_two_threads)->Threads(2)->UseRealTime();
void rate_limiter_shared_one_thread(benchmark::State& state) {
    through(state, shared_limiter());
}
BENCHMARK(rate_limiter_shared_one_thread)->UseRealTime();

// A closed breaker alone, one handle shared by two threads: admitting and recording a success
// only read the shared state.
const rs::circuit_breaker<>& shared_breaker() {
    static const rs::circuit_breaker b{{.failure_threshold = 5}};
    return b;
}
void breaker_shared_two_threads(benchmark::State& state) {
    through(state, shared_breaker());
}
BENCHMARK(breaker_shared_two_threads)->Threads(2)->UseRealTime();
void breaker_shared_one_thread(benchmark::State& state) {
    through(state, shared_breaker());
}
BENCHMARK(breaker_shared_one_thread)->UseRealTime();

// By hand, as above: the shared words of the three handles of `shared_handles` and the limiter's clock
// reading, from two threads and from one. The most two threads on one set of exact limits can gain here.
void by_hand_shared_two_threads(benchmark::State& state) {
    by_hand<rs::steady_clock>(state, shared_words());
}
BENCHMARK(by_hand_shared_two_threads)->Threads(2)->UseRealTime();
void by_hand_shared_one_thread(benchmark::State& state) {
    by_hand<rs::steady_clock>(state, shared_words());
}
BENCHMARK(by_hand_shared_one_thread)->UseRealTime();

// Rejections reported as values: no exception is thrown on these paths.
template <class Policy>
void rejected(benchmark::State& state, const Policy& policy) {
    bench::run_on_loop(state, [&](benchmark::State* st) -> rs::task<void> {
        auto result = co_await policy.execute_outcome(action);
        if (st && result.has_value())
            st->SkipWithError("the call was not rejected");
        benchmark::DoNotOptimize(result);
    });
}

void rejected_by_open_breaker(benchmark::State& state) {
    rs::circuit_breaker breaker{{.failure_threshold = 5}};
    breaker.isolate();
    rejected(state, breaker);
}
BENCHMARK(rejected_by_open_breaker);

void rejected_by_empty_limiter(benchmark::State& state) {
    rs::rate_limiter limiter{{.token_limit = 1, .tokens_per_second = 1e-3}};
    rs::sync_wait(limiter.take()); // empty the bucket: the next token is 1000 s away
    rejected(state, limiter);
}
BENCHMARK(rejected_by_empty_limiter);

void rejected_by_full_bulkhead(benchmark::State& state) {
    rs::bulkhead full{{.max_concurrent_calls = 1}};
    resilience::stop_source release;
    auto hold_the_slot = [&]() -> rs::task<int> {
        co_await rs::steady_clock{}.sleep_for(std::chrono::hours(1), release.get_token());
        co_return 0;
    };
    bool occupied = false;
    bench::run_on_loop(
        state,
        [&](benchmark::State* st) -> rs::task<void> {
            if (!occupied) { // first (warm-up) call: one call takes the only slot and keeps it
                occupied = true;
                auto holder = full.execute(hold_the_slot);
                rs::event_loop::current()->spawn(std::move(holder));
                co_await rs::steady_clock{}.sleep_for(std::chrono::milliseconds(1), {});
            }
            auto result = co_await full.execute_outcome(action);
            if (st && result.has_value())
                st->SkipWithError("the call was not rejected");
            benchmark::DoNotOptimize(result);
        },
        [&] { release.request_stop(); });
}
BENCHMARK(rejected_by_full_bulkhead);

// Results without exceptions: the dependency answers with an error value (an expected-like result),
// never a throw. The retry makes its three attempts back to back (no wait) and returns the last
// error value as it was: no exception is thrown or caught anywhere on the way.
struct status_or_error {
    int value = 0;
    int code = 0; // 0: a value
    bool has_value() const noexcept { return code == 0; }
    int error() const noexcept { return code; }
};
rs::task<status_or_error> unavailable_dependency() {
    co_return status_or_error{.value = 0, .code = 503};
}
const auto unavailable = [] { return unavailable_dependency(); };

void retry_expected_error_path(benchmark::State& state) {
    const rs::retry r{{.max_attempts = 3, .backoff = rs::constant_backoff{0ns, rs::jitter::none}}};
    bench::run_on_loop(state, [&](benchmark::State* st) -> rs::task<void> {
        const status_or_error last = co_await r.execute(unavailable);
        if (st && last.has_value())
            st->SkipWithError("the error value was lost");
        benchmark::DoNotOptimize(last);
    });
}
BENCHMARK(retry_expected_error_path);

// The same three attempts with the failure thrown, for comparison: each attempt throws, and the
// default classifier rethrows to look at it.
rs::task<int> throwing_dependency() {
    throw std::runtime_error("503");
    co_return 0;
}
const auto throwing = [] { return throwing_dependency(); };

void retry_thrown_error_path(benchmark::State& state) {
    const rs::retry r{{.max_attempts = 3, .backoff = rs::constant_backoff{0ns, rs::jitter::none}}};
    bench::run_on_loop(state, [&](benchmark::State* st) -> rs::task<void> {
        auto last = co_await r.execute_outcome(throwing);
        if (st && last.has_value())
            st->SkipWithError("the failure was lost");
        benchmark::DoNotOptimize(last);
    });
}
BENCHMARK(retry_thrown_error_path);

// The reference for the column above: a failure that is a real exception, thrown and caught.
void thrown_and_caught(benchmark::State& state) {
    bench::run_on_loop(state, [](benchmark::State*) -> rs::task<void> {
        try {
            throw rs::bulkhead_rejected_error{};
        } catch (const rs::error& e) {
            benchmark::DoNotOptimize(&e);
        }
        co_return;
    });
}
BENCHMARK(thrown_and_caught);

} // namespace

RESILIENCE_BENCH_MAIN("bare_call")
