// SPDX-License-Identifier: MIT
// redis::rate_limiter against a real redis-server: one limit shared by several event loops on several
// threads, keys per tenant, waiting on reserved tokens, a script flush, and each failure mode with the
// server killed mid-run and restarted. Real time: bounds with tolerance, never instants.
#include "catch.hpp"
#include "redis/server.hpp"

#include <resilience/redis.hpp>
#include <resilience/resilience.hpp>

#include <asio/io_context.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

namespace rs = resilience;
namespace redis = resilience::redis;
using namespace std::chrono_literals;
using resilience_tests::redis_server;
using resilience_tests::run;

namespace {

rs::task<int> one() {
    co_return 1;
}

struct tally {
    int admitted = 0;
    int refused = 0;
    int other = 0;
    std::chrono::nanoseconds retry_after{};
};

// `n` calls through `p`, one after another.
template <class P>
rs::task<tally> calls(P p, int n) {
    tally t;
    for (int i = 0; i < n; ++i) {
        auto call = p.execute_outcome(one);
        rs::outcome<int> r = co_await std::move(call);
        if (r.has_value()) {
            ++t.admitted;
        } else if (r.failure().code() == rs::errc::rate_limited) {
            ++t.refused;
            t.retry_after = r.failure().template as<rs::rate_limited_error>()->retry_after();
        } else {
            ++t.other;
        }
    }
    co_return t;
}

// `n` calls through `p` at once.
template <class P>
rs::task<tally> burst(P p, int n) {
    std::vector<rs::task<tally>> all;
    for (int i = 0; i < n; ++i)
        all.push_back(calls(p, 1));
    auto together = rs::when_all(std::move(all));
    std::vector<tally> each = co_await std::move(together);
    tally t;
    for (const tally& e : each) {
        t.admitted += e.admitted;
        t.refused += e.refused;
        t.other += e.other;
    }
    co_return t;
}

// Calls through `p` for `length`, `per_round` at once, rounds back to back; what each got.
template <class P>
rs::task<tally> hammer(P p, std::chrono::nanoseconds length, int per_round) {
    tally t;
    const auto end = std::chrono::steady_clock::now() + length;
    while (std::chrono::steady_clock::now() < end) {
        auto round = burst(p, per_round);
        const tally r = co_await std::move(round);
        t.admitted += r.admitted;
        t.refused += r.refused;
        t.other += r.other;
    }
    co_return t;
}

redis::rate_limiter_options quota(std::string key, std::size_t limit, double rate) {
    return {.key = std::move(key), .token_limit = limit, .tokens_per_second = rate};
}

} // namespace

TEST_CASE("redis rate_limiter: a burst of token_limit, then refusals with the wait Redis computed", "[redis]") {
    if (!resilience_tests::redis_tests_enabled())
        return;
    redis_server server;
    ::asio::io_context io;
    redis::connection c{io.get_executor(), server.options()};
    const redis::rate_limiter limiter{quota("burst", 5, 10), c}; // a token every 100 ms
    const tally t = run(io, calls(limiter, 8));
    CHECK(t.admitted == 5);
    CHECK(t.refused == 3);
    CHECK(t.other == 0);
    // The next token is at most one interval away, and more than the time the calls took before it.
    CHECK(t.retry_after > 0ns);
    CHECK(t.retry_after <= 100ms);
}

TEST_CASE("redis rate_limiter: a token that is refused is not spent", "[redis]") {
    if (!resilience_tests::redis_tests_enabled())
        return;
    redis_server server;
    ::asio::io_context io;
    redis::connection c{io.get_executor(), server.options()};
    const redis::rate_limiter limiter{quota("refused", 1, 20), c}; // a token every 50 ms
    CHECK(run(io, calls(limiter, 1)).admitted == 1);
    const auto first = std::chrono::steady_clock::now();
    CHECK(run(io, calls(limiter, 20)).admitted == 0); // 20 refusals in a row spend nothing...
    const auto deadline = first + 5s;
    int admitted = 0;
    while (admitted == 0 && std::chrono::steady_clock::now() < deadline)
        admitted = run(io, calls(limiter, 1)).admitted; // ...so the next token comes 50 ms on,
    CHECK(admitted == 1);
    CHECK(std::chrono::steady_clock::now() - first < 600ms); // not 21 x 50 ms on
}
