// SPDX-License-Identifier: MIT
// How the loop's timers and the policies' wait queues scale with what is pending: 10^3 to 10^6 timers,
// calls under a timeout, waiters queued on a full bulkhead or an empty rate limiter, or calls sleeping in a
// retry's backoff. Time per operation and heap bytes per pending timer or waiter, in one table per scenario.
//
// Everything runs on virtual time (`testing::simulation`), so no figure waits on a real clock; times are
// the CPU time of the measuring thread. Each repetition runs on a fresh thread, twice: the first round
// starts with an empty per-thread frame cache, so every coroutine frame a waiter needs comes from
// `operator new` and is counted (at its frame-cache size class); the second is timed, on memory the
// first one paged in (the page faults of a process's first use of that much memory are not counted).
// See bench/README.md.
#include <resilience/bulkhead.hpp>
#include <resilience/rate_limiter.hpp>
#include <resilience/retry.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <fmt/format.h>

#include "replace_new.hpp"

#include <malloc.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <coroutine>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <new>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

// ---- counting operator new (replaced below), on the measuring thread only ----

struct size_count {
    std::size_t size = 0;
    std::size_t count = 0;
};
// Thread-local, so neither the main thread nor anything else running meanwhile is counted.
thread_local bool counting = false;
thread_local std::size_t counted_bytes = 0;
thread_local std::array<size_count, 32> counted_sizes{};

void note_allocation(std::size_t n) noexcept {
    counted_bytes += n;
    for (auto& s : counted_sizes) {
        if (s.count == 0 || s.size == n) {
            s.size = n;
            ++s.count;
            return;
        }
    }
}

struct allocations {
    std::size_t bytes = 0;
    std::vector<size_count> sizes; // by size, largest first
};

class counting_scope {
public:
    counting_scope() noexcept {
        counted_bytes = 0;
        counted_sizes = {};
        counting = true;
    }
    ~counting_scope() { counting = false; }
    allocations stop() {
        counting = false;
        allocations a{counted_bytes, {}};
        for (const auto& s : counted_sizes)
            if (s.count)
                a.sizes.push_back(s);
        std::sort(a.sizes.begin(), a.sizes.end(), [](auto& x, auto& y) { return x.size > y.size; });
        return a;
    }
};

// ---- helpers ----

// The measuring thread's CPU time: on a shared machine, time spent waiting for a core is not the
// code's. (Page faults, the kernel's work for the thread, are counted.)
struct thread_cpu_clock {
    using duration = std::chrono::nanoseconds;
    using rep = duration::rep;
    using period = duration::period;
    using time_point = std::chrono::time_point<thread_cpu_clock>;
    [[maybe_unused]] static constexpr bool is_steady = true; // a clock's member, which nothing here reads
    static time_point now() noexcept {
        timespec ts{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
    }
};
using clock_type = thread_cpu_clock;
double ns_between(clock_type::time_point a, clock_type::time_point b) {
    return std::chrono::duration<double, std::nano>(b - a).count();
}

// Goes to the back of the loop's queue: everything posted before runs first.
struct yield_to_loop {
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) const { rs::event_loop::current()->post(h); }
    void await_resume() const noexcept {}
};

// Grows the loop's run queue to hold `n` posted jobs before the measurement, so that the one-off growth
// of that queue is not counted as memory held by the waiters (it is not: it is reused).
rs::task<void> grow_run_queue(std::size_t n) {
    for (std::size_t i = 0; i < n + 2; ++i)
        rs::event_loop::current()->post([](void*) {}, nullptr);
    co_await yield_to_loop{};
}

// An action that parks its call until the benchmark resumes it.
struct parking {
    std::coroutine_handle<> waiting;
};
struct park {
    parking* spot;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) const noexcept { spot->waiting = h; }
    int await_resume() const noexcept { return 1; }
};
rs::task<int> bare_call(parking* spot) {
    co_return co_await park{spot};
}
// An action that completes at once, without a coroutine frame of its own.
struct ready {
    bool await_ready() const noexcept { return true; }
    void await_suspend(std::coroutine_handle<>) const noexcept {}
    int await_resume() const noexcept { return 1; }
};

void expect(bool ok, const char* what) {
    if (!ok)
        throw std::logic_error(std::string("bench_scaling: ") + what);
}

struct row {
    double first_ns = 0;  // per operation, first phase
    double second_ns = 0; // per operation, second phase
    double floor_ns = 0;  // per operation, a reference (see the scenario)
    double bytes = 0;     // per pending timer or waiter
    allocations allocated;
};

// Runs `f` twice on a fresh thread. The first round starts with the thread's frame cache empty, so it
// counts every frame's bytes; it also pages in whatever memory the process had not used yet. The
// second, timed, reuses what the first gave back (main keeps the heap from shrinking): the steady
// state of a process that has served such a load before.
template <class F>
std::pair<row, row> two_rounds_on_fresh_thread(F f) {
    std::pair<row, row> rounds;
    std::exception_ptr error;
    std::thread([&] {
        try {
            rounds.first = f();
            rounds.second = f();
        } catch (...) {
            error = std::current_exception();
        }
    }).join();
    if (error)
        std::rethrow_exception(error);
    return rounds;
}

// ---- scenarios ----

// N raw timers pending on the loop, deadlines spread uniformly over [1 s, 2 s). First: a timer
// cancelled at random and armed again with a new deadline, 10^6 times (N stays pending). Second: every
// timer expires, time jumping from one deadline to the next. Reference: reading the deadline of a timer
// picked at random, what any timer structure pays to reach the node (a cache miss once N nodes no
// longer fit in the caches).
row raw_timers(std::size_t n) {
    rs::testing::simulation sim;
    rs::event_loop& loop = sim.loop();
    struct counted : rs::detail::timer_node {
        std::size_t* fired = nullptr;
    };
    std::vector<counted> nodes(n);
    std::size_t fired = 0;
    std::mt19937_64 rng{42};
    const auto deadline = [&] { return loop.now() + 1s + std::chrono::nanoseconds(rng() % 1'000'000'000); };
    row r;
    {
        counting_scope scope;
        for (auto& t : nodes) {
            t.when = deadline();
            t.fired = &fired;
            t.fire = [](rs::detail::timer_node* node) { ++*static_cast<counted*>(node)->fired; };
            rs::detail::loop_access::add_timer(loop, &t);
        }
        r.allocated = scope.stop();
    }
    r.bytes = static_cast<double>(r.allocated.bytes) / static_cast<double>(n);
    constexpr std::size_t churn = 1'000'000;
    const auto t0 = clock_type::now();
    for (std::size_t i = 0; i < churn; ++i) {
        counted& t = nodes[rng() % n];
        rs::detail::loop_access::remove_timer(loop, &t);
        t.when = deadline();
        rs::detail::loop_access::add_timer(loop, &t);
    }
    const auto t1 = clock_type::now();
    expect(loop.timers() == n, "raw timers: some timer is not pending");
    std::int64_t sum = 0;
    const auto r0 = clock_type::now();
    for (std::size_t i = 0; i < churn; ++i)
        sum += nodes[rng() % n].when.count();
    const auto r1 = clock_type::now();
    expect(sum != 0, "raw timers: no deadline read");
    const auto t2 = clock_type::now();
    sim.run_all();
    const auto t3 = clock_type::now();
    expect(fired == n && loop.timers() == 0, "raw timers: not every timer fired");
    r.first_ns = ns_between(t0, t1) / churn;
    r.floor_ns = ns_between(r0, r1) / churn;
    r.second_ns = ns_between(t2, t3) / static_cast<double>(n);
    return r;
}

// N calls through `timeout` (each its own duration in [1 s, 2 s)) suspended on an action that waits to
// be resumed. First: starting the calls (frames, the timer armed). Second: resuming their actions in
// random order, so each call returns and cancels its timer. With `with_timeout` false, the same
// actions are called from a bare coroutine instead: the reference, what is not the timeout's.
row parked_calls(std::size_t n, bool with_timeout) {
    rs::testing::simulation sim;
    std::mt19937_64 rng{7};
    std::vector<rs::timeout<rs::testing::virtual_clock>> policies;
    policies.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
        policies.emplace_back(1s + std::chrono::nanoseconds(rng() % 1'000'000'000), sim.clock());
    std::vector<parking> spots(n);
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::shuffle(order.begin(), order.end(), rng);
    row r;
    sim.run([&]() -> rs::task<void> {
        co_await grow_run_queue(n);
        rs::event_loop& loop = *rs::event_loop::current();
        counting_scope scope;
        const auto t0 = clock_type::now();
        for (std::size_t i = 0; i < n; ++i) {
            if (with_timeout)
                loop.spawn(policies[i].execute_outcome([s = &spots[i]] { return park{s}; }));
            else
                loop.spawn(bare_call(&spots[i]));
        }
        co_await yield_to_loop{}; // every call has started, armed its timer and parked
        const auto t1 = clock_type::now();
        r.allocated = scope.stop();
        expect(loop.timers() == (with_timeout ? n : 0), "timeout: some call has no timer");
        for (std::size_t i : order)
            std::exchange(spots[i].waiting, {}).resume();
        const auto t2 = clock_type::now();
        expect(loop.timers() == 0, "timeout: some timer is left");
        r.first_ns = ns_between(t0, t1) / static_cast<double>(n);
        r.second_ns = ns_between(t1, t2) / static_cast<double>(n);
    }());
    expect(sim.now() == 0s, "timeout: time moved");
    r.bytes = static_cast<double>(r.allocated.bytes) / static_cast<double>(n);
    return r;
}
row timeout_calls(std::size_t n) {
    return parked_calls(n, true);
}
row bare_calls(std::size_t n) {
    return parked_calls(n, false);
}

// N calls queued on a bulkhead whose one slot is held. First: the calls arrive and queue. Second: the
// holder returns, and the slot is handed down the queue, call by call. `bounded`: with a queue timeout
// (an hour: it never runs out here), so each waiter also arms and disarms a timer.
row bulkhead_queue_of(std::size_t n, bool bounded) {
    rs::testing::simulation sim;
    rs::bulkhead bulkhead{
        {.max_concurrent_calls = 1,
         .queue_limit = rs::unbounded_queue,
         .queue_timeout =
             bounded ? std::optional<std::chrono::nanoseconds>{std::chrono::hours{1}} : std::nullopt},
        sim.clock()};
    parking holder;
    row r;
    clock_type::time_point t1;
    sim.run([&]() -> rs::task<void> {
        rs::event_loop& loop = *rs::event_loop::current();
        loop.spawn(bulkhead.execute_outcome([&] { return park{&holder}; }));
        co_await grow_run_queue(n);
        expect(bulkhead.in_flight() == 1 && holder.waiting, "bulkhead: the holder does not hold the slot");
        counting_scope scope;
        const auto t0 = clock_type::now();
        for (std::size_t i = 0; i < n; ++i)
            loop.spawn(bulkhead.execute_outcome([] { return ready{}; }));
        co_await yield_to_loop{};
        t1 = clock_type::now();
        r.allocated = scope.stop();
        expect(bulkhead.queued() == n, "bulkhead: some call is not queued");
        r.first_ns = ns_between(t0, t1) / static_cast<double>(n);
        t1 = clock_type::now();
        std::exchange(holder.waiting, {}).resume();
    }());
    const auto t2 = clock_type::now();
    expect(bulkhead.queued() == 0 && bulkhead.in_flight() == 0, "bulkhead: not every call ran");
    r.second_ns = ns_between(t1, t2) / static_cast<double>(n);
    r.bytes = static_cast<double>(r.allocated.bytes) / static_cast<double>(n);
    return r;
}
row bulkhead_queue(std::size_t n) {
    return bulkhead_queue_of(n, false);
}
row bulkhead_queue_bounded(std::size_t n) {
    return bulkhead_queue_of(n, true);
}

// N calls queued on an empty token bucket refilled at one token per nanosecond. First: the calls arrive
// and queue. Second: each in turn waits for its token (the front waiter's timer) and runs.
row limiter_queue(std::size_t n) {
    rs::testing::simulation sim;
    rs::rate_limiter limiter{{.token_limit = 1, .tokens_per_second = 1e9, .queue_limit = rs::unbounded_queue},
                             sim.clock()};
    row r;
    clock_type::time_point t1;
    sim.run([&]() -> rs::task<void> {
        rs::event_loop& loop = *rs::event_loop::current();
        co_await limiter.take(); // the only token: the bucket is empty until 1 ns
        co_await grow_run_queue(n);
        counting_scope scope;
        const auto t0 = clock_type::now();
        for (std::size_t i = 0; i < n; ++i)
            loop.spawn(limiter.execute_outcome([] { return ready{}; }));
        co_await yield_to_loop{};
        t1 = clock_type::now();
        r.allocated = scope.stop();
        expect(limiter.queued() == n, "limiter: some call is not queued");
        r.first_ns = ns_between(t0, t1) / static_cast<double>(n);
    }());
    const auto t2 = clock_type::now();
    expect(limiter.queued() == 0, "limiter: not every call ran");
    expect(sim.now() == std::chrono::nanoseconds(n), "limiter: a token came at the wrong instant");
    r.second_ns = ns_between(t1, t2) / static_cast<double>(n);
    r.bytes = static_cast<double>(r.allocated.bytes) / static_cast<double>(n);
    return r;
}

// N calls through one `retry` (a constant backoff of 1 s, no jitter) whose first attempt answers an
// error value at once, so that each call sleeps in its backoff. First: starting the calls, each to its
// sleep. Second: the sleeps end together and every second attempt succeeds. No exception is thrown.
struct answer {
    int value = 0;
    int code = 0; // 0: a value; else an error value the retry handles
    bool has_value() const noexcept { return code == 0; }
    int error() const noexcept { return code; }
};
struct answer_now {
    answer a;
    bool await_ready() const noexcept { return true; }
    void await_suspend(std::coroutine_handle<>) const noexcept {}
    answer await_resume() const noexcept { return a; }
};
row retry_backoff(std::size_t n) {
    rs::testing::simulation sim;
    const rs::retry retry{{.max_attempts = 2, .backoff = rs::constant_backoff{1s, rs::jitter::none}},
                          sim.clock()};
    std::size_t succeeded = 0;
    row r;
    clock_type::time_point t1;
    sim.run([&]() -> rs::task<void> {
        rs::event_loop& loop = *rs::event_loop::current();
        co_await grow_run_queue(n);
        counting_scope scope;
        const auto t0 = clock_type::now();
        // The first attempt fails with an error value, the second succeeds.
        for (std::size_t i = 0; i < n; ++i)
            loop.spawn(retry.execute([&succeeded](const rs::context& c) {
                succeeded += c.attempt() == 1 ? 0 : 1;
                return answer_now{c.attempt() == 1 ? answer{0, 503} : answer{1, 0}};
            }));
        co_await yield_to_loop{};
        t1 = clock_type::now();
        r.allocated = scope.stop();
        expect(loop.timers() == n, "retry: some call is not sleeping in its backoff");
        r.first_ns = ns_between(t0, t1) / static_cast<double>(n);
    }());
    const auto t2 = clock_type::now();
    expect(succeeded == n, "retry: some call did not succeed on its second attempt");
    expect(sim.now() == 1s, "retry: the backoff did not end at 1 s");
    r.second_ns = ns_between(t1, t2) / static_cast<double>(n);
    r.bytes = static_cast<double>(r.allocated.bytes) / static_cast<double>(n);
    return r;
}

// ---- the table ----

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// "1 x 448 B + 1 x 192 B + ...": the blocks a pending item costs, then the rest spread over all of
// them (a vector's growth, say) as one figure.
std::string where_bytes_go(const allocations& a, std::size_t n) {
    std::string s;
    double rest = static_cast<double>(a.bytes);
    for (const auto& sc : a.sizes) {
        const double per = static_cast<double>(sc.count) / static_cast<double>(n);
        if (per < 0.5)
            continue;
        s += fmt::format("{}{:.3g} x {} B", s.empty() ? "" : " + ", per, sc.size);
        rest -= static_cast<double>(sc.count * sc.size);
    }
    if (rest / static_cast<double>(n) >= 0.05)
        s += fmt::format("{}{:.1f} B in fewer, larger blocks", s.empty() ? "" : " + ",
                         rest / static_cast<double>(n));
    return s.empty() ? "nothing" : s;
}

struct scenario {
    const char* title;
    const char* first;
    const char* second;
    const char* per;
    row (*run)(std::size_t);
    const char* floor = nullptr; // the reference's column, if any
};

void report(const scenario& sc, const std::vector<std::size_t>& sizes) {
    fmt::print("\n{}\n", sc.title);
    fmt::print("{:>10} {:>22} {:>22} {:>12} {:>16}\n", "pending", sc.first, sc.second, sc.per,
               sc.floor ? sc.floor : "");
    row counted;
    for (std::size_t n : sizes) {
        const int reps = n <= 10'000 ? 7 : n <= 100'000 ? 5 : 3;
        std::vector<double> first, second, extra;
        for (int i = 0; i < reps; ++i) {
            const auto [fresh, reused] = two_rounds_on_fresh_thread([&] { return sc.run(n); });
            first.push_back(reused.first_ns);
            second.push_back(reused.second_ns);
            extra.push_back(reused.floor_ns);
            counted = fresh;
        }
        fmt::print("{:>10} {:>22.1f} {:>22.1f} {:>12.1f} {:>16}\n", n, median(first), median(second),
                   counted.bytes, sc.floor ? fmt::format("{:.1f}", median(extra)) : "");
    }
    fmt::print("{:>10} allocations per pending item at N = {}: {}\n", "", sizes.back(),
               where_bytes_go(counted.allocated, sizes.back()));
}

} // namespace

// Counts the bytes the measuring thread asks for; everything else is the ordinary heap.
RESILIENCE_BENCH_REPLACE_NEW([](std::size_t n) noexcept {
    if (counting)
        note_allocation(n);
})

/// `bench_scaling [largest N]`: sizes 10^3, 10^4, ... up to the largest (default 10^6).
int main(int argc, char** argv) {
    std::size_t largest = 1'000'000;
    if (argc > 1)
        largest = std::strtoull(argv[1], nullptr, 10);
    std::vector<std::size_t> sizes;
    for (std::size_t n = 1'000; n <= largest; n *= 10)
        sizes.push_back(n);
    if (sizes.empty())
        return 1;
    // Freed memory stays with the process, so a second round runs on memory already paged in: one
    // arena for every thread (a thread's own arena gives whole heaps back when it empties them) and no
    // trimming.
    mallopt(M_ARENA_MAX, 1);
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
    fmt::print(
        "thread CPU time, median of 7 (N <= 10^4), 5 (10^5) or 3 (10^6) runs, each the second round on a "
        "fresh thread; virtual time\n");
    const scenario scenarios[] = {
        {"raw timers on the loop (deadlines uniform in [1 s, 2 s))", "arm+cancel ns", "expire ns", "B/timer",
         raw_timers, "random read ns"},
        {"calls through timeout (parked action, durations in [1 s, 2 s))", "start+arm ns/call",
         "finish+cancel ns/call", "B/call", timeout_calls},
        {"the same parked actions called from a bare coroutine (reference for the row above)",
         "start ns/call", "finish ns/call", "B/call", bare_calls},
        {"waiters on a full bulkhead (max_concurrent_calls 1)", "enqueue ns", "dequeue+run ns", "B/waiter",
         bulkhead_queue},
        {"waiters on a full bulkhead with a queue_timeout (1 h: timers armed, never fired)", "enqueue ns",
         "dequeue+run ns", "B/waiter", bulkhead_queue_bounded},
        {"waiters on an empty rate_limiter (wait mode, 1 token/ns)", "enqueue ns", "dequeue+run ns",
         "B/waiter", limiter_queue},
        {"calls sleeping in a retry's backoff (constant 1 s, the first attempt an error value)", "start ns",
         "wake+retry ns", "B/call", retry_backoff},
    };
    for (const auto& sc : scenarios)
        report(sc, sizes);
    return 0;
}
