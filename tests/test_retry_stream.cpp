// SPDX-License-Identifier: MIT
#include "catch.hpp"
#include "stream_consumer.hpp"
#include "support.hpp"

#include <resilience/async_generator.hpp>
#include <resilience/backoff.hpp>
#include <resilience/classifier.hpp>
#include <resilience/error.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/retry_stream.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/task.hpp>
#include <resilience/testing/simulation.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace test_retry_stream {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_tests::consume;
using resilience_tests::invalid_argument_message;
using resilience_tests::stop_at;
using std::chrono::nanoseconds;

static_assert(std::is_aggregate_v<rs::stream_retry_options>);
static_assert(rs::stream_source<rs::async_generator<int>>);
static_assert(std::is_same_v<rs::stream_value_t<rs::async_generator<std::string>>, std::string>);
static_assert(!rs::stream_source<int>);

namespace {

const rs::exponential_backoff exact_200ms{200ms, 2.0, 30s, rs::jitter::none};
constexpr int no_break = -1;

// A source that broke: says which attempt it was.
struct stream_broken : std::runtime_error {
    explicit stream_broken(int a)
        : std::runtime_error("attempt " + std::to_string(a) + " broke"), attempt(a) {}
    int attempt;
};

// What the factory was asked and what became of the sources it made.
struct source_log {
    std::vector<nanoseconds> starts;
    std::vector<int> attempts;
    std::vector<std::size_t> offsets;
    std::vector<std::exception_ptr> thrown; // every failure a source threw, in order
    int alive = 0;
    int destroyed = 0;
    int most_alive = 0;
};

struct alive_guard {
    source_log* log;
    explicit alive_guard(source_log* l) : log(l) {
        if (++log->alive > log->most_alive)
            log->most_alive = log->alive;
    }
    alive_guard(const alive_guard&) = delete;
    alive_guard& operator=(const alive_guard&) = delete;
    ~alive_guard() {
        --log->alive;
        ++log->destroyed;
    }
};

// Yields from, from+1, ... up to (not including) `to`, one every `every`; throws `stream_broken` instead
// of the item numbered `break_after` (counted from 0 within this source), unless it is `no_break`.
rs::async_generator<int> numbers(rs::testing::simulation& sim, source_log& log, int attempt, int from, int to,
                                 int break_after, nanoseconds every) {
    alive_guard guard{&log};
    for (int i = from, n = 0; i < to; ++i, ++n) {
        if (every > 0ns)
            co_await sim.sleep_for(every);
        if (n == break_after) {
            log.thrown.push_back(std::make_exception_ptr(stream_broken{attempt}));
            std::rethrow_exception(log.thrown.back());
        }
        co_yield i;
    }
}

// A factory following a plan: attempt n breaks after `breaks[n-1]` items (the last entry repeats);
// `resume` makes it start at the offset it is given, otherwise it starts over at 0.
struct planned_factory {
    planned_factory(rs::testing::simulation* s, source_log* l, std::vector<int> b, bool r = false, int t = 5)
        : sim(s), log(l), breaks(std::move(b)), resume(r), total(t) {}

    rs::testing::simulation* sim;
    source_log* log;
    std::vector<int> breaks;
    bool resume;
    int total;
    nanoseconds every = 10ms;

    rs::async_generator<int> operator()(const rs::stream_context& c) const {
        log->starts.push_back(sim->now());
        log->attempts.push_back(c.attempt());
        log->offsets.push_back(c.items_yielded());
        const std::size_t i = std::min(static_cast<std::size_t>(c.attempt() - 1), breaks.size() - 1);
        const int from = resume ? static_cast<int>(c.items_yielded()) : 0;
        return numbers(*sim, *log, c.attempt(), from, total, breaks[i], every);
    }
};

template <class E>
const E* as(const std::exception_ptr& p) {
    try {
        std::rethrow_exception(p);
    } catch (const E& e) {
        return &e;
    } catch (...) {
        return nullptr;
    }
}

} // namespace

TEST_CASE("retry_stream: a break before the first item is retried at the backoff's exact instants",
          "[retry_stream]") {
    rs::testing::simulation sim;
    source_log log;
    auto stream = rs::retry_stream(planned_factory{&sim, &log, {0, 0, no_break}},
                                   {.max_attempts = 4, .backoff = exact_200ms}, sim.clock());
    CHECK(log.starts.empty()); // lazy: nothing is called before the first next()
    auto r = sim.run(consume(sim, stream));
    CHECK_FALSE(r.error);
    CHECK(r.items == std::vector<int>{0, 1, 2, 3, 4});
    // Attempt 1 breaks at 10ms, waits 200ms; attempt 2 breaks at 220ms, waits 400ms; attempt 3 at 620ms.
    CHECK(log.starts == std::vector<nanoseconds>{0ms, 210ms, 620ms});
    CHECK(log.attempts == std::vector<int>{1, 2, 3});
    CHECK(log.offsets == std::vector<std::size_t>{0, 0, 0});
    CHECK(r.at == std::vector<nanoseconds>{630ms, 640ms, 650ms, 660ms, 670ms});
    CHECK(log.alive == 0);
    CHECK(log.destroyed == 3);
    CHECK(log.most_alive == 1); // each source is gone before the next is made
}

TEST_CASE(
    "retry_stream: when every retry breaks before the first item, the last failure is rethrown as it was",
    "[retry_stream]") {
    rs::testing::simulation sim;
    source_log log;
    auto stream = rs::retry_stream(planned_factory{&sim, &log, {0}},
                                   {.max_attempts = 3, .backoff = exact_200ms}, sim.clock());
    auto r = sim.run(consume(sim, stream));
    CHECK(r.items.empty());
    REQUIRE(log.thrown.size() == 3);
    CHECK(r.error == log.thrown.back()); // the very exception object
    CHECK(log.starts == std::vector<nanoseconds>{0ms, 210ms, 620ms});
    CHECK(r.ended == 630ms);
}

TEST_CASE("retry_stream: rethrow_mid_stream passes a break after the first item to the consumer at once",
          "[retry_stream]") {
    rs::testing::simulation sim;
    source_log log;
    auto stream = rs::retry_stream(planned_factory{&sim, &log, {2, no_break}},
                                   {.max_attempts = 4, .backoff = exact_200ms}, sim.clock());
    auto r = sim.run(consume(sim, stream));
    CHECK(r.items == std::vector<int>{0, 1});
    REQUIRE(log.thrown.size() == 1);
    CHECK(r.error == log.thrown.front());
    CHECK(r.ended == 30ms); // no wait: the break is the consumer's at its own instant
    CHECK(log.attempts == std::vector<int>{1});
    CHECK(log.alive == 0);
}

TEST_CASE(
    "retry_stream: restart_from_start re-delivers the items before the break when the factory starts over",
    "[retry_stream]") {
    rs::testing::simulation sim;
    source_log log;
    auto stream = rs::retry_stream(
        planned_factory{&sim, &log, {2, no_break}},
        {.max_attempts = 4, .backoff = exact_200ms, .partial = rs::partial_stream::restart_from_start},
        sim.clock());
    auto r = sim.run(consume(sim, stream));
    CHECK_FALSE(r.error);
    CHECK(r.items == std::vector<int>{0, 1, 0, 1, 2, 3, 4});
    CHECK(log.starts == std::vector<nanoseconds>{0ms, 230ms});
    CHECK(log.offsets == std::vector<std::size_t>{0, 2}); // items the consumer had, duplicates to come or not
}

TEST_CASE(
    "retry_stream: restart_from_start with a factory that resumes at items_yielded delivers each item once",
    "[retry_stream]") {
    rs::testing::simulation sim;
    source_log log;
    auto stream = rs::retry_stream(
        planned_factory{&sim, &log, {2, 1, no_break}, /*resume=*/true},
        {.max_attempts = 4, .backoff = exact_200ms, .partial = rs::partial_stream::restart_from_start},
        sim.clock());
    auto r = sim.run(consume(sim, stream));
    CHECK_FALSE(r.error);
    CHECK(r.items == std::vector<int>{0, 1, 2, 3, 4});
    CHECK(log.attempts == std::vector<int>{1, 2, 3});
    CHECK(log.offsets == std::vector<std::size_t>{0, 2, 3});
    // 0-30ms: two items, break; wait 200; 230-250: one item, break; wait 400; 650 on: the rest.
    CHECK(log.starts == std::vector<nanoseconds>{0ms, 230ms, 650ms});
    CHECK(r.at == std::vector<nanoseconds>{10ms, 20ms, 240ms, 660ms, 670ms});
}

TEST_CASE("retry_stream: max_attempts counts every attempt of the stream, progress does not replenish it",
          "[retry_stream]") {
    rs::testing::simulation sim;
    source_log log;
    auto stream = rs::retry_stream(
        planned_factory{&sim, &log, {1}, /*resume=*/true, /*total=*/10},
        {.max_attempts = 3, .backoff = exact_200ms, .partial = rs::partial_stream::restart_from_start},
        sim.clock());
    auto r = sim.run(consume(sim, stream));
    CHECK(r.items == std::vector<int>{0, 1, 2});
    CHECK(log.attempts == std::vector<int>{1, 2, 3});
    REQUIRE(log.thrown.size() == 3);
    CHECK(r.error == log.thrown.back());
    CHECK(as<stream_broken>(r.error)->attempt == 3);
    // Each attempt: one item at +10ms, a break at +20ms; waits of 200ms then 400ms (retry 1, then 2).
    CHECK(log.starts == std::vector<nanoseconds>{0ms, 220ms, 640ms});
    CHECK(r.ended == 660ms);
}

TEST_CASE("retry_stream: max_attempts = 1 never retries", "[retry_stream]") {
    rs::testing::simulation sim;
    source_log log;
    auto stream = rs::retry_stream(planned_factory{&sim, &log, {0, no_break}},
                                   {.max_attempts = 1, .backoff = exact_200ms}, sim.clock());
    auto r = sim.run(consume(sim, stream));
    CHECK(r.error == log.thrown.front());
    CHECK(log.attempts == std::vector<int>{1});
    CHECK(r.ended == 10ms);
}

TEST_CASE("retry_stream: a stop during a backoff wait ends the stream at that instant, without a retry",
          "[retry_stream]") {
    rs::testing::simulation sim;
    source_log log;
    resilience::stop_source stop;
    auto stream =
        rs::retry_stream(planned_factory{&sim, &log, {0, no_break}},
                         {.max_attempts = 4, .backoff = exact_200ms}, sim.clock(), stop.get_token());
    sim.spawn(stop_at(sim, stop, 110ms)); // the wait runs from 10ms to 210ms
    auto r = sim.run(consume(sim, stream));
    CHECK(r.ended == 110ms);
    CHECK(r.items.empty());
    REQUIRE(log.thrown.size() == 1);
    CHECK(as<rs::cancelled_error>(r.error) != nullptr); // not the failure that led to the wait
    CHECK(log.attempts == std::vector<int>{1});
    sim.run_all();
    CHECK(sim.now() == 110ms); // no timer left behind
}

TEST_CASE("retry_stream: a stop found after a failure ends the stream even when no wait was needed",
          "[retry_stream]") {
    rs::testing::simulation sim;
    resilience::stop_source stop;
    int calls = 0;
    auto factory = [&calls, &stop]() -> rs::async_generator<int> {
        ++calls;
        stop.request_stop(); // the consumer gives up while the source is failing
        throw std::runtime_error("down");
        co_return;
    };
    auto stream = rs::retry_stream(factory, {.max_attempts = 4, .backoff = rs::constant_backoff{}},
                                   sim.clock(), stop.get_token());
    auto r = sim.run(consume(sim, stream));
    REQUIRE(r.error);
    CHECK(as<rs::cancelled_error>(r.error) != nullptr); // not the source's failure: the consumer stopped
    CHECK(calls == 1);
}

TEST_CASE("retry_stream: a stop before the first next() ends with cancelled_error, the factory never called",
          "[retry_stream]") {
    rs::testing::simulation sim;
    source_log log;
    resilience::stop_source stop;
    auto stream = rs::retry_stream(planned_factory{&sim, &log, {no_break}}, {.name = "rows"}, sim.clock(),
                                   stop.get_token());
    stop.request_stop();
    auto r = sim.run(consume(sim, stream));
    REQUIRE(r.error);
    const auto* e = as<rs::cancelled_error>(r.error);
    REQUIRE(e);
    CHECK(e->policy_name() == "rows");
    CHECK(log.starts.empty());
}

TEST_CASE("retry_stream: a cancellation from the source is never retried, whatever should_handle says",
          "[retry_stream]") {
    rs::testing::simulation sim;
    int calls = 0, asked = 0;
    auto factory = [&calls](resilience::stop_token) -> rs::async_generator<int> {
        ++calls;
        co_yield 1;
        throw rs::cancelled_error{};
    };
    auto stream = rs::retry_stream(factory,
                                   {.max_attempts = 4,
                                    .backoff = exact_200ms,
                                    .partial = rs::partial_stream::restart_from_start,
                                    .should_handle =
                                        [&asked](const rs::failure&) {
                                            ++asked;
                                            return true;
                                        }},
                                   sim.clock());
    auto r = sim.run(consume(sim, stream));
    CHECK(r.items == std::vector<int>{1});
    CHECK(as<rs::cancelled_error>(r.error) != nullptr);
    CHECK(calls == 1);
    CHECK(asked == 0);
}

TEST_CASE("retry_stream: should_handle picks the failures to retry, by default every one but cancellation",
          "[retry_stream]") {
    rs::testing::simulation sim;
    int calls = 0;
    // A logic_error: rs::retry's is_transient would not retry it; the stream's default does.
    auto factory = [&calls]() -> rs::async_generator<int> {
        if (++calls < 3)
            throw std::logic_error("not yet");
        co_yield 42;
    };

    SECTION("the default") {
        auto stream = rs::retry_stream(factory, {.backoff = exact_200ms}, sim.clock());
        auto r = sim.run(consume(sim, stream));
        CHECK_FALSE(r.error);
        CHECK(r.items == std::vector<int>{42});
        CHECK(calls == 3);
        CHECK(r.ended == 600ms);
    }
    SECTION("a classifier that declines: rethrown at once") {
        std::vector<std::string> seen;
        auto stream = rs::retry_stream(factory,
                                       {.backoff = exact_200ms,
                                        .should_handle =
                                            [&seen](const rs::failure& f) {
                                                seen.push_back(f.what());
                                                return !f.is<std::logic_error>();
                                            }},
                                       sim.clock());
        auto r = sim.run(consume(sim, stream));
        CHECK(as<std::logic_error>(r.error) != nullptr);
        CHECK(calls == 1);
        CHECK(seen == std::vector<std::string>{"not yet"});
        CHECK(r.ended == 0ms);
    }
    SECTION("an outcome classifier of the item type") {
        auto stream =
            rs::retry_stream(factory,
                             {.backoff = exact_200ms,
                              .should_handle = [](const rs::outcome<int>& o) { return o.has_failure(); }},
                             sim.clock());
        CHECK(sim.run(consume(sim, stream)).items == std::vector<int>{42});
        CHECK(calls == 3);
    }
    SECTION("a classifier that throws ends the stream with its exception") {
        auto stream = rs::retry_stream(factory, {.should_handle = [](const rs::failure&) -> bool {
                                           throw std::runtime_error("classifier broke");
                                       }},
                                       sim.clock());
        auto r = sim.run(consume(sim, stream));
        REQUIRE(as<std::runtime_error>(r.error));
        CHECK(std::string(as<std::runtime_error>(r.error)->what()) == "classifier broke");
        CHECK(calls == 1);
    }
}

TEST_CASE("retry_stream: a verdict's delay replaces the backoff for that wait", "[retry_stream]") {
    rs::testing::simulation sim;
    source_log log;
    auto stream =
        rs::retry_stream(planned_factory{&sim, &log, {0, 0, no_break}},
                         {.backoff = exact_200ms,
                          .should_handle =
                              [](const rs::failure& f) {
                                  return rs::verdict{.handle = true,
                                                     .delay = f.as<stream_broken>()->attempt == 1
                                                                  ? std::optional<nanoseconds>{1s}
                                                                  : std::optional<nanoseconds>{-5s}};
                              }},
                         sim.clock());
    auto r = sim.run(consume(sim, stream));
    CHECK_FALSE(r.error);
    CHECK(log.starts == std::vector<nanoseconds>{0ms, 1010ms, 1020ms}); // 1s, then a negative delay: none
}

TEST_CASE(
    "retry_stream: invalid options throw at the call, naming the field and the value, before anything runs",
    "[retry_stream]") {
    rs::testing::simulation sim;
    source_log log;
    const planned_factory factory{&sim, &log, {no_break}};
    CHECK(invalid_argument_message([&] {
              (void)rs::retry_stream(factory, {.name = "rows", .max_attempts = 0}, sim.clock());
          }) == "resilience::retry_stream (rows): max_attempts must be at least 1, got 0");
    CHECK(invalid_argument_message([&] {
              (void)rs::retry_stream(factory, {.partial = static_cast<rs::partial_stream>(7)}, sim.clock());
          }) == "resilience::retry_stream: partial must be rethrow_mid_stream or restart_from_start, got 7");
    CHECK(invalid_argument_message([&] {
              (void)rs::retry_stream(
                  factory, {.should_handle = [](const rs::outcome<long>&) { return true; }}, sim.clock());
          }) ==
          "resilience::retry_stream: should_handle classifies rs::outcome<long> but the stream yields int");
    CHECK(invalid_argument_message([&] {
              (void)rs::retry_stream(factory, {.backoff = rs::exponential_backoff{.initial = 0ns}},
                                     sim.clock());
          }).find("initial must be positive") != std::string::npos);
    CHECK(log.starts.empty());
}

TEST_CASE("retry_stream: the factory may take a stream_context, a stop_token or nothing", "[retry_stream]") {
    rs::testing::simulation sim;
    resilience::stop_source stop;

    SECTION("a stream_context, kept by reference in a coroutine factory") {
        std::vector<std::size_t> seen;
        // The context lives until the source is destroyed: reading it after a suspension is fine.
        auto factory = [&sim, &seen, &stop](const rs::stream_context& c) -> rs::async_generator<int> {
            co_await sim.sleep_for(10ms);
            seen.push_back(c.items_yielded());
            co_yield c.attempt();
            co_await sim.sleep_for(10ms);
            CHECK(c.stop_token() == stop.get_token());
            if (c.attempt() < 3)
                throw std::runtime_error("break");
        };
        auto stream = rs::retry_stream(factory,
                                       {.backoff = rs::constant_backoff{100ms, rs::jitter::none},
                                        .partial = rs::partial_stream::restart_from_start},
                                       sim.clock(), stop.get_token());
        auto r = sim.run(consume(sim, stream));
        CHECK_FALSE(r.error);
        CHECK(r.items == std::vector<int>{1, 2, 3});
        CHECK(seen == std::vector<std::size_t>{0, 1, 2});
        CHECK(r.at == std::vector<nanoseconds>{10ms, 130ms, 250ms});
    }
    SECTION("the consumer's stop token") {
        std::vector<resilience::stop_token> tokens;
        auto factory = [&tokens](resilience::stop_token st) -> rs::async_generator<int> {
            tokens.push_back(st);
            if (tokens.size() == 1)
                throw std::runtime_error("once");
            co_yield 1;
        };
        auto stream =
            rs::retry_stream(factory, {.backoff = rs::constant_backoff{}}, sim.clock(), stop.get_token());
        CHECK(sim.run(consume(sim, stream)).items == std::vector<int>{1});
        REQUIRE(tokens.size() == 2);
        CHECK(tokens[0] == stop.get_token());
        CHECK(tokens[1] == stop.get_token());
    }
    SECTION("nothing") {
        auto stream = rs::retry_stream(
            [] { return [](int n) -> rs::async_generator<int> { co_yield n; }(9); }, {}, sim.clock());
        CHECK(sim.run(consume(sim, stream)).items == std::vector<int>{9});
    }
}

TEST_CASE("retry_stream: a factory that throws is an attempt that failed", "[retry_stream]") {
    rs::testing::simulation sim;
    int calls = 0;
    auto factory = [&calls]() {
        if (++calls == 1)
            throw std::runtime_error("no connection");
        return [](int n) -> rs::async_generator<int> { co_yield n; }(calls);
    };
    auto stream = rs::retry_stream(factory, {.backoff = exact_200ms}, sim.clock());
    auto r = sim.run(consume(sim, stream));
    CHECK(r.items == std::vector<int>{2});
    CHECK(r.at == std::vector<nanoseconds>{200ms});
}

TEST_CASE("retry_stream: a consumer that stops half-way destroys the source", "[retry_stream]") {
    rs::testing::simulation sim;
    source_log log;
    {
        auto stream = rs::retry_stream(
            planned_factory{&sim, &log, {1, no_break}, /*resume=*/true},
            {.backoff = exact_200ms, .partial = rs::partial_stream::restart_from_start}, sim.clock());
        auto r = sim.run(consume(sim, stream, 3));
        CHECK(r.items == std::vector<int>{0, 1, 2});
        CHECK(log.alive == 1); // the second source, suspended at a co_yield
    }
    CHECK(log.alive == 0);
    CHECK(log.destroyed == 2);
    CHECK(log.attempts == std::vector<int>{1, 2});
}

TEST_CASE("retry_stream: any source whose next() gives an optional will do", "[retry_stream]") {
    // A cursor over a vector that fails once at a given position.
    struct cursor {
        std::vector<int>* rows;
        std::size_t at;
        std::size_t fail_at;
        rs::task<std::optional<int>> next() {
            if (at == fail_at)
                throw std::runtime_error("cursor lost");
            if (at == rows->size())
                co_return std::nullopt;
            co_return (*rows)[at++];
        }
    };
    rs::testing::simulation sim;
    std::vector<int> rows{10, 20, 30, 40};
    auto stream = rs::retry_stream(
        [&rows](const rs::stream_context& c) {
            return cursor{&rows, c.items_yielded(), c.attempt() == 1 ? std::size_t{2} : std::size_t{99}};
        },
        {.backoff = exact_200ms, .partial = rs::partial_stream::restart_from_start}, sim.clock());
    auto r = sim.run(consume(sim, stream));
    CHECK(r.items == rows);
    CHECK(r.at == std::vector<nanoseconds>{0ms, 0ms, 200ms, 200ms});
}

TEST_CASE("retry_stream: on steady_clock with a stop token, without waiting when the backoff is zero",
          "[retry_stream]") {
    int calls = 0;
    auto factory = [&calls](resilience::stop_token) -> rs::async_generator<std::string> {
        if (++calls < 3)
            throw std::runtime_error("flaky");
        co_yield "ok";
    };
    resilience::stop_source stop;
    auto stream = rs::retry_stream(factory, {.backoff = rs::constant_backoff{}}, stop.get_token());
    STATIC_REQUIRE(std::is_same_v<decltype(stream), rs::async_generator<std::string>>);
    std::vector<std::string> items;
    rs::sync_wait([](rs::async_generator<std::string>& s, std::vector<std::string>& out) -> rs::task<void> {
        while (auto v = co_await s.next())
            out.push_back(std::move(*v));
    }(stream, items));
    CHECK(items == std::vector<std::string>{"ok"});
    CHECK(calls == 3);
}

} // namespace test_retry_stream
