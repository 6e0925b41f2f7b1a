// SPDX-License-Identifier: MIT
// resilience::prometheus: the series' exact values after calls on virtual time, read back from the
// registry; the Exposer scraped over HTTP on loopback; and a real Prometheus server (/usr/bin/prometheus,
// Debian's `prometheus` package) scraping the Exposer and answering a query through its HTTP API.
#include "alloc_counter.hpp"
#include "catch.hpp"
#include "counting_new.hpp" // this executable's counting operator new

#include <resilience/prometheus.hpp>
#include <resilience/resilience.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>

#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <arpa/inet.h>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <netinet/in.h>
#include <optional>
#include <spawn.h>
#include <stdexcept>
#include <string>
#include <string_view>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

extern char** environ;

namespace test_prometheus {

namespace rs = resilience;
namespace prom = ::prometheus;
using namespace std::chrono_literals;
using rs::testing::script;
using rs::testing::scripted_action;
using labels = std::map<std::string, std::string>;

// The sample of `family` with exactly `want` as labels, or null. It points into `families`, so a
// temporary is refused: it would leave the sample dangling.
const prom::ClientMetric* sample(std::vector<prom::MetricFamily>&& families, std::string_view family,
                                 const labels& want) = delete;
const prom::ClientMetric* sample(const std::vector<prom::MetricFamily>& families, std::string_view family,
                                 const labels& want) {
    for (const prom::MetricFamily& f : families) {
        if (f.name != family)
            continue;
        for (const prom::ClientMetric& m : f.metric) {
            labels have;
            for (const auto& l : m.label)
                have[l.name] = l.value;
            if (have == want)
                return &m;
        }
    }
    return nullptr;
}

double counter(const rs::prometheus::metrics& m, std::string_view family, const labels& want) {
    const auto all = m.collect();
    const prom::ClientMetric* s = sample(all, family, want);
    return s ? s->counter.value : -1.0;
}
double gauge(const rs::prometheus::metrics& m, std::string_view family, const labels& want) {
    const auto all = m.collect();
    const prom::ClientMetric* s = sample(all, family, want);
    return s ? s->gauge.value : -1.0;
}
std::optional<prom::ClientMetric::Histogram> histogram(const rs::prometheus::metrics& m,
                                                       std::string_view family, const labels& want) {
    const auto all = m.collect();
    if (const prom::ClientMetric* s = sample(all, family, want))
        return s->histogram;
    return std::nullopt;
}
// Observations at most `le` seconds.
std::uint64_t at_most(const prom::ClientMetric::Histogram& h, double le) {
    for (const auto& b : h.bucket)
        if (b.upper_bound == le)
            return b.cumulative_count;
    throw std::logic_error("no bucket " + std::to_string(le));
}

const rs::exponential_backoff exact_200ms{200ms, 2.0, 30s, rs::jitter::none};

template <class P, class A>
rs::task<void> call_into(const P& policy, A action, std::optional<rs::outcome<int>>& out) {
    out = co_await policy.execute_outcome(std::move(action));
}

TEST_CASE("prometheus: attempts, retries and the call around them, with exact counts and durations",
          "[prometheus]") {
    rs::testing::simulation sim;
    rs::prometheus::metrics m;
    const rs::pipeline p{
        rs::telemetry{rs::telemetry_options{.name = "orders", .listener = m.listener()}, sim.clock()},
        rs::retry{{.name = "orders", .max_attempts = 3, .backoff = exact_200ms}, sim.clock()}};
    scripted_action flaky{sim.clock(), script<int>{.failures = 2, .latency = 100ms, .value = 42}};
    // 0-100 ms fails, wait 200; 300-400 fails, wait 400; 800-900 succeeds.
    CHECK(sim.run(p.execute(flaky)) == 42);

    const auto failed =
        histogram(m, "resilience_attempt_duration_seconds",
                  {{"policy", "retry"}, {"name", "orders"}, {"outcome", "failure"}, {"handled", "true"}});
    REQUIRE(failed);
    CHECK(failed->sample_count == 2);
    CHECK(failed->sample_sum == Approx(0.2).epsilon(1e-12));
    CHECK(at_most(*failed, 0.05) == 0);
    CHECK(at_most(*failed, 0.25) == 2);
    const auto succeeded =
        histogram(m, "resilience_attempt_duration_seconds",
                  {{"policy", "retry"}, {"name", "orders"}, {"outcome", "success"}, {"handled", "false"}});
    REQUIRE(succeeded);
    CHECK(succeeded->sample_count == 1);
    CHECK(succeeded->sample_sum == Approx(0.1).epsilon(1e-12));

    CHECK(counter(m, "resilience_events_total",
                  {{"policy", "retry"}, {"name", "orders"}, {"event", "retry"}}) == 2);
    const auto call = histogram(
        m, "resilience_call_duration_seconds",
        {{"policy", "telemetry"}, {"name", "orders"}, {"outcome", "success"}, {"handled", "false"}});
    REQUIRE(call);
    CHECK(call->sample_count == 1);
    CHECK(call->sample_sum == Approx(0.9).epsilon(1e-12));
    CHECK(at_most(*call, 0.5) == 0);
    CHECK(at_most(*call, 1.0) == 1);
    // No failed call: its series is made the first time one fails.
    CHECK_FALSE(histogram(
        m, "resilience_call_duration_seconds",
        {{"policy", "telemetry"}, {"name", "orders"}, {"outcome", "failure"}, {"handled", "true"}}));

    // A second, failing call through the same pipeline: three more failed attempts, two more retries.
    scripted_action down{sim.clock(), script<int>{.failures = 5, .latency = 10ms}};
    CHECK_THROWS_AS(sim.run(p.execute(down)), rs::testing::scripted_failure);
    CHECK(histogram(m, "resilience_attempt_duration_seconds",
                    {{"policy", "retry"}, {"name", "orders"}, {"outcome", "failure"}, {"handled", "true"}})
              ->sample_count == 5);
    CHECK(counter(m, "resilience_events_total",
                  {{"policy", "retry"}, {"name", "orders"}, {"event", "retry"}}) == 4);
    const auto failed_call =
        histogram(m, "resilience_call_duration_seconds",
                  {{"policy", "telemetry"}, {"name", "orders"}, {"outcome", "failure"}, {"handled", "true"}});
    REQUIRE(failed_call);
    CHECK(failed_call->sample_count == 1);
    CHECK(failed_call->sample_sum == Approx(0.63).epsilon(1e-12)); // 10 + 200 + 10 + 400 + 10 ms
}

TEST_CASE("prometheus: a value the classifier handled is a handled success, a thrown failure a handled one",
          "[prometheus]") {
    rs::testing::simulation sim;
    rs::prometheus::metrics m;
    // An HTTP-like status: 503 is retried though it is returned, not thrown; failures as by default.
    const auto unavailable = [](const rs::outcome<int>& o) {
        return o.has_failure() ? rs::is_transient(o.error()) : *o == 503;
    };
    const rs::pipeline p{
        rs::telemetry{{.name = "api", .listener = m.listener(), .should_handle = unavailable}, sim.clock()},
        rs::retry{{.name = "api", .max_attempts = 3, .backoff = exact_200ms, .should_handle = unavailable},
                  sim.clock()}};
    const auto attempts = [&](const char* outcome, const char* handled) {
        const auto h =
            histogram(m, "resilience_attempt_duration_seconds",
                      {{"policy", "retry"}, {"name", "api"}, {"outcome", outcome}, {"handled", handled}});
        return h ? h->sample_count : 0;
    };
    const auto calls = [&](const char* outcome, const char* handled) {
        const auto h =
            histogram(m, "resilience_call_duration_seconds",
                      {{"policy", "telemetry"}, {"name", "api"}, {"outcome", outcome}, {"handled", handled}});
        return h ? h->sample_count : 0;
    };

    // 503, then 200: the first attempt returned, and the retry handled what it returned.
    int n = 0;
    const auto unavailable_once = [&]() -> rs::task<int> {
        co_await sim.sleep_for(10ms);
        co_return ++n == 1 ? 503 : 200;
    };
    CHECK(sim.run(p.execute(unavailable_once)) == 200);
    CHECK(attempts("success", "true") == 1);
    CHECK(attempts("success", "false") == 1);
    CHECK(attempts("failure", "true") == 0);
    CHECK(counter(m, "resilience_events_total", {{"policy", "retry"}, {"name", "api"}, {"event", "retry"}}) ==
          1);
    CHECK(calls("success", "false") == 1);

    // Thrown and handled (a transient failure), each of the three attempts, then the call.
    scripted_action down{sim.clock(), script<int>{.failures = 3, .latency = 10ms}};
    CHECK_THROWS_AS(sim.run(p.execute(down)), rs::testing::scripted_failure);
    CHECK(attempts("failure", "true") == 3);
    CHECK(calls("failure", "true") == 1);

    // Thrown and not handled (a bug: not transient): no retry, and the series says so.
    const auto bug = []() -> rs::task<int> { throw std::logic_error("bug"); };
    CHECK_THROWS_AS(sim.run(p.execute(bug)), std::logic_error);
    CHECK(attempts("failure", "false") == 1);
    CHECK(calls("failure", "false") == 1);

    // Always 503: every attempt handled, the last one too, and the call that returns it.
    const auto always = []() -> rs::task<int> { co_return 503; };
    CHECK(sim.run(p.execute(always)) == 503);
    CHECK(attempts("success", "true") == 4);
    CHECK(calls("success", "true") == 1);
}

TEST_CASE("prometheus: a watched bulkhead's gauges, its rejections by reason and its queue waits",
          "[prometheus]") {
    rs::testing::simulation sim;
    rs::prometheus::metrics m;
    const rs::bulkhead slots{
        {.name = "slots", .max_concurrent_calls = 1, .queue_limit = 1, .telemetry = m.listener()},
        sim.clock()};
    m.watch(slots);
    scripted_action busy{sim.clock(), script<int>{.latency = 1s, .value = 1}};
    std::optional<rs::outcome<int>> a, b, c;
    sim.spawn(call_into(slots, busy, a)); // holds the slot 0-1 s
    sim.spawn(call_into(slots, busy, b)); // queued, admitted at 1 s
    sim.spawn(call_into(slots, busy, c)); // no queue place
    sim.run_until(500ms);
    const labels who{{"policy", "bulkhead"}, {"name", "slots"}};
    CHECK(gauge(m, "resilience_bulkhead_in_flight", who) == 1);
    CHECK(gauge(m, "resilience_bulkhead_queued", who) == 1);
    CHECK(gauge(m, "resilience_bulkhead_limit", who) == 1);
    CHECK(counter(m, "resilience_rejections_total",
                  {{"policy", "bulkhead"}, {"name", "slots"}, {"reason", "queue_full"}}) == 1);
    CHECK(counter(m, "resilience_events_total",
                  {{"policy", "bulkhead"}, {"name", "slots"}, {"event", "rejection"}}) == 1);
    sim.run_all();
    CHECK(b->value() == 1);
    CHECK(gauge(m, "resilience_bulkhead_in_flight", who) == 0);
    CHECK(gauge(m, "resilience_bulkhead_queued", who) == 0);
    const auto waited =
        histogram(m, "resilience_queue_wait_seconds", {{"policy", "bulkhead"}, {"name", "slots"}});
    REQUIRE(waited);
    CHECK(waited->sample_count == 1);
    CHECK(waited->sample_sum == Approx(1.0).epsilon(1e-12));
    CHECK(counter(m, "resilience_events_total",
                  {{"policy", "bulkhead"}, {"name", "slots"}, {"event", "queue_wait"}}) == 1);
    // Watching the same bulkhead name twice would report its series twice.
    CHECK_THROWS_AS(m.watch(slots), std::invalid_argument);
    CHECK_NOTHROW(m.watch(slots, "slots-again"));
}

TEST_CASE("prometheus: a watched balancer's endpoint gauges follow its ejections, which are counted",
          "[prometheus]") {
    rs::testing::simulation sim;
    rs::prometheus::metrics m;
    rs::balancer_options o{
        .name = "replicas", .pick = rs::balance_pick::round_robin, .telemetry = m.listener()};
    o.outlier_ejection->consecutive_failures = 1;
    o.outlier_ejection->max_ejection_percent = 50;
    const rs::balancer<std::string, rs::testing::virtual_clock> lb{{"a", "b"}, o, sim.clock()};
    m.watch(lb);
    const labels who{{"policy", "balancer"}, {"name", "replicas"}};
    CHECK(gauge(m, "resilience_balancer_endpoints", who) == 2);
    CHECK(gauge(m, "resilience_balancer_ejected", who) == 0);
    CHECK(gauge(m, "resilience_balancer_healthy", who) == 2);
    const auto r = sim.run(lb.execute_outcome([]() -> rs::task<int> { throw std::runtime_error("down"); }));
    CHECK(r.has_failure());
    CHECK(gauge(m, "resilience_balancer_ejected", who) == 1);
    CHECK(gauge(m, "resilience_balancer_healthy", who) == 1);
    CHECK(counter(m, "resilience_events_total",
                  {{"policy", "balancer"}, {"name", "replicas"}, {"event", "endpoint_ejected"}}) == 1);
    sim.run_until(30s);
    CHECK(sim.run(lb.execute([]() -> rs::task<int> { co_return 1; })) == 1); // sees the return
    CHECK(gauge(m, "resilience_balancer_ejected", who) == 0);
    CHECK(counter(m, "resilience_events_total",
                  {{"policy", "balancer"}, {"name", "replicas"}, {"event", "endpoint_returned"}}) == 1);
}

TEST_CASE("prometheus: a watched breaker's state gauge follows the clock, and its refusals are counted",
          "[prometheus]") {
    rs::testing::simulation sim;
    rs::prometheus::metrics m;
    const rs::circuit_breaker breaker{
        {.name = "db", .failure_threshold = 2, .break_duration = 10s, .telemetry = m.listener()},
        sim.clock()};
    m.watch(breaker);
    const auto state_is = [&](const char* s) {
        return gauge(m, "resilience_circuit_state",
                     {{"policy", "circuit_breaker"}, {"name", "db"}, {"state", s}});
    };
    CHECK(state_is("closed") == 1);
    CHECK(state_is("open") == 0);
    scripted_action down{sim.clock(), script<int>{.failures = 10, .latency = 10ms}};
    CHECK(sim.run(breaker.execute_outcome(down)).has_failure());
    CHECK(gauge(m, "resilience_circuit_consecutive_failures",
                {{"policy", "circuit_breaker"}, {"name", "db"}}) == 1);
    CHECK(sim.run(breaker.execute_outcome(down)).has_failure()); // opens
    CHECK(sim.run(breaker.execute_outcome(down)).error().is<rs::circuit_open_error>());
    CHECK(state_is("closed") == 0);
    CHECK(state_is("open") == 1);
    CHECK(state_is("half_open") == 0);
    CHECK(counter(m, "resilience_events_total",
                  {{"policy", "circuit_breaker"}, {"name", "db"}, {"event", "state_change"}}) == 1);
    CHECK(counter(m, "resilience_rejections_total",
                  {{"policy", "circuit_breaker"}, {"name", "db"}, {"reason", "circuit_open"}}) == 1);
    const auto transitions = [&](const char* from, const char* to) {
        return counter(m, "resilience_circuit_transitions_total",
                       {{"policy", "circuit_breaker"}, {"name", "db"}, {"from", from}, {"to", to}});
    };
    CHECK(transitions("closed", "open") == 1);
    sim.run_for(10s); // the break is over: read as half-open, with no call made
    CHECK(state_is("open") == 0);
    CHECK(state_is("half_open") == 1);
    breaker.isolate();
    CHECK(state_is("isolated") == 1);
    // The breaker reports the change from the state it kept (open: a half-open after the break is only
    // read, until a call comes), as its state_change events do.
    CHECK(transitions("open", "isolated") == 1);
    CHECK(counter(m, "resilience_events_total",
                  {{"policy", "circuit_breaker"}, {"name", "db"}, {"event", "state_change"}}) == 2);
}

TEST_CASE(
    "prometheus: watched limiters' tokens, and a retry budget's, hedge's, timeout's and fallback's events",
    "[prometheus]") {
    rs::testing::simulation sim;
    rs::prometheus::metrics m;
    const rs::rate_limiter bucket{{.name = "api", .token_limit = 10, .tokens_per_second = 5}, sim.clock()};
    const rs::sliding_window_limiter window{{.name = "api", .permit_limit = 4, .window = 1s}, sim.clock()};
    m.watch(bucket);
    m.watch(window); // the same name under another policy label is allowed
    scripted_action ok{sim.clock(), script<int>{.value = 7}};
    for (int i = 0; i < 4; ++i) {
        CHECK(sim.run(bucket.execute(ok)) == 7);
        CHECK(sim.run(window.execute(ok)) == 7);
    }
    CHECK(gauge(m, "resilience_limiter_tokens", {{"policy", "rate_limiter"}, {"name", "api"}}) == 6);
    CHECK(gauge(m, "resilience_limiter_tokens", {{"policy", "sliding_window_limiter"}, {"name", "api"}}) ==
          0);
    CHECK(gauge(m, "resilience_limiter_queued", {{"policy", "rate_limiter"}, {"name", "api"}}) == 0);
    sim.run_for(200ms); // one token back
    CHECK(gauge(m, "resilience_limiter_tokens", {{"policy", "rate_limiter"}, {"name", "api"}}) ==
          Approx(7.0).epsilon(1e-9));

    // A pipeline-wide listener: a fallback around a retry with an empty budget, around a hedge and a timeout.
    rs::retry_budget budget{{.ratio = 0.1, .capacity = 1}};
    REQUIRE(budget.try_withdraw()); // empty
    const rs::pipeline p{rs::telemetry{m.listener(), sim.clock()},
                         rs::fallback{-1, rs::fallback_options{.name = "answer"}},
                         rs::retry{{.name = "api", .max_attempts = 3, .budget = budget}, sim.clock()},
                         rs::hedge{{.name = "api", .max_attempts = 2, .delay = 50ms}, sim.clock()},
                         rs::timeout{{.name = "api", .timeout = 80ms}, sim.clock()}};
    scripted_action stall{sim.clock(), script<int>{.latency = 1s}};
    CHECK(sim.run(p.execute(stall)) == -1);
    // The first attempt starts at 0, the hedge at 50 ms; each is stopped by its own 80 ms deadline.
    CHECK(counter(m, "resilience_events_total", {{"policy", "hedge"}, {"name", "api"}, {"event", "hedge"}}) ==
          1);
    CHECK(counter(m, "resilience_events_total",
                  {{"policy", "timeout"}, {"name", "api"}, {"event", "timeout"}}) == 2);
    CHECK(counter(m, "resilience_rejections_total",
                  {{"policy", "retry_budget"}, {"name", "api"}, {"reason", "budget_exhausted"}}) == 1);
    CHECK(counter(m, "resilience_events_total",
                  {{"policy", "fallback"}, {"name", "answer"}, {"event", "fallback"}}) == 1);
    const auto attempt =
        histogram(m, "resilience_attempt_duration_seconds",
                  {{"policy", "retry"}, {"name", "api"}, {"outcome", "failure"}, {"handled", "true"}});
    REQUIRE(attempt);
    CHECK(attempt->sample_count == 1);
    CHECK(attempt->sample_sum == Approx(0.13).epsilon(1e-12)); // the hedge's attempt ends at 130 ms
}

TEST_CASE("prometheus: options are checked, naming the field", "[prometheus]") {
    using opts = rs::prometheus::metrics_options;
    const auto message = [](opts o) -> std::string {
        try {
            rs::prometheus::metrics m{std::move(o)};
        } catch (const std::invalid_argument& e) {
            return e.what();
        }
        return "";
    };
    CHECK_THAT(message(opts{.prefix = "9lives"}), Catch::Matchers::Contains("prefix"));
    CHECK_THAT(message(opts{.prefix = ""}), Catch::Matchers::Contains("prefix"));
    CHECK_THAT(message(opts{.duration_buckets = {}}), Catch::Matchers::Contains("duration_buckets"));
    CHECK_THAT(message(opts{.duration_buckets = {0.1, 0.1}}),
               Catch::Matchers::Contains("strictly increasing"));
    CHECK_THAT(message(opts{.duration_buckets = {0.1, 1.0 / 0.0}}), Catch::Matchers::Contains("finite"));
    CHECK_THROWS_AS(rs::prometheus::metrics(std::shared_ptr<prom::Registry>{}), std::invalid_argument);
    // Another prefix, and the series in a registry of the caller's.
    auto registry = std::make_shared<prom::Registry>();
    rs::prometheus::metrics m{registry, opts{.prefix = "shop"}};
    m(rs::telemetry_event{.kind = rs::telemetry_kind::retry, .policy = "retry", .name = "x"});
    const std::vector<prom::MetricFamily> families = registry->Collect(); // the sample points into it
    const prom::ClientMetric* s =
        sample(families, "shop_events_total", {{"policy", "retry"}, {"name", "x"}, {"event", "retry"}});
    REQUIRE(s);
    CHECK(s->counter.value == 1);
}

TEST_CASE("prometheus: a policy made again at the same address under another name gets its own series",
          "[prometheus]") {
    rs::prometheus::metrics m;
    std::string name = "first";
    m(rs::telemetry_event{.kind = rs::telemetry_kind::retry, .policy = "retry", .name = name});
    name.replace(0, name.size(), "other"); // same buffer, same length, other content
    m(rs::telemetry_event{.kind = rs::telemetry_kind::retry, .policy = "retry", .name = name});
    m(rs::telemetry_event{.kind = rs::telemetry_kind::retry, .policy = "retry", .name = name});
    CHECK(counter(m, "resilience_events_total",
                  {{"policy", "retry"}, {"name", "first"}, {"event", "retry"}}) == 1);
    CHECK(counter(m, "resilience_events_total",
                  {{"policy", "retry"}, {"name", "other"}, {"event", "retry"}}) == 2);
}

TEST_CASE("prometheus: policies made per call under one name share one series, without allocating",
          "[prometheus]") {
    rs::prometheus::metrics m;
    // Each policy made per call holds its name in a string of its own: a new address every time.
    std::vector<std::string> names(5'000, std::string(40, 'q')); // longer than a short-string buffer
    m(rs::telemetry_event{.kind = rs::telemetry_kind::timeout, .policy = "timeout", .name = names[0]});
    std::size_t allocations = 0;
    {
#ifdef RESILIENCE_TESTS_COUNT_ALLOCATIONS
        resilience_tests::counting_allocations counting;
#endif
        for (std::size_t i = 1; i < names.size(); ++i)
            m(rs::telemetry_event{
                .kind = rs::telemetry_kind::timeout, .policy = "timeout", .name = names[i]});
#ifdef RESILIENCE_TESTS_COUNT_ALLOCATIONS
        allocations = counting.count();
#endif
    }
    CHECK(allocations == 0);
    CHECK(counter(m, "resilience_events_total",
                  {{"policy", "timeout"}, {"name", names[0]}, {"event", "timeout"}}) == 5'000);
}

#ifdef RESILIENCE_TESTS_COUNT_ALLOCATIONS
TEST_CASE("prometheus: the success path allocates nothing once its series are made", "[prometheus]") {
    rs::testing::simulation sim;
    rs::prometheus::metrics m;
    const rs::pipeline p{rs::telemetry{{.name = "five", .listener = m.listener()}, sim.clock()},
                         rs::retry{{.name = "five"}, sim.clock()},
                         rs::circuit_breaker{{.failure_threshold = 5}, sim.clock()},
                         rs::timeout{1s, sim.clock()},
                         rs::bulkhead{{.max_concurrent_calls = 4}, sim.clock()},
                         rs::rate_limiter{{.token_limit = 1'000'000, .tokens_per_second = 1e9}, sim.clock()}};
    auto action = []() -> rs::task<int> { co_return 1; };
    std::size_t allocations = 0;
    int sum = 0;
    sim.run([&]() -> rs::task<void> {
        for (int i = 0; i < 10; ++i) // warm-up: frames, pools, the series
            sum += co_await p.execute(action);
        resilience_tests::counting_allocations counting;
        for (int i = 0; i < 1'000; ++i)
            sum += co_await p.execute(action);
        allocations = counting.count();
    }());
    CHECK(sum == 1'010);
    CHECK(allocations == 0);
    CHECK(histogram(m, "resilience_call_duration_seconds",
                    {{"policy", "telemetry"}, {"name", "five"}, {"outcome", "success"}, {"handled", "false"}})
              ->sample_count == 1'010);
}
#endif

// ---- over HTTP: the Exposer scraped by hand, and a real Prometheus server ----

// A blocking GET on 127.0.0.1:port (HTTP/1.0, so the server closes the connection after the body),
// with a 5 s bound on every read. Returns the whole response, headers included; empty when the
// connection failed.
std::string http_get(int port, const std::string& target) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return {};
    timeval tv{.tv_sec = 5, .tv_usec = 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string response;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
        const std::string request = "GET " + target + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(request.size())) {
            char buf[4096];
            for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
                response.append(buf, static_cast<std::size_t>(n));
        }
    }
    ::close(fd);
    return response;
}

// A loopback port free now (bound, read, released: another process could take it, which is unlikely).
int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
        throw std::runtime_error("free_port: no loopback port");
    ::close(fd);
    return ntohs(addr.sin_port);
}

// Some traffic: three calls through a retry (one retried after a failure, one after a 503 it
// returned), a watched breaker, a watched bulkhead.
struct traffic {
    rs::prometheus::metrics m;
    rs::circuit_breaker<> breaker{{.name = "db", .failure_threshold = 5}};
    rs::bulkhead<> slots{{.name = "db", .max_concurrent_calls = 3}};

    traffic() {
        m.watch(breaker);
        m.watch(slots);
        const auto unavailable = [](const rs::outcome<int>& o) {
            return o.has_failure() ? rs::is_transient(o.error()) : *o == 503;
        };
        const rs::pipeline p{
            rs::telemetry{{.name = "orders", .listener = m.listener()}},
            rs::retry{{.name = "orders", .backoff = rs::constant_backoff{1ms}, .should_handle = unavailable}},
            breaker, slots};
        int calls = 0;
        const auto action = [&calls]() -> rs::task<int> {
            if (++calls == 2)
                throw std::runtime_error("once");
            co_return calls == 4 ? 503 : 1;
        };
        rs::sync_wait(p.execute(action)); // 1
        rs::sync_wait(p.execute(action)); // throws, then 1
        rs::sync_wait(p.execute(action)); // 503, then 1
    }
};

TEST_CASE("prometheus: the Exposer on a loopback port serves every series, scraped over HTTP",
          "[prometheus]") {
    traffic t;
    prom::Exposer exposer{"127.0.0.1:0"};
    t.m.expose(exposer);
    const std::vector<int> ports = exposer.GetListeningPorts();
    REQUIRE(ports.size() == 1);
    const std::string text = http_get(ports[0], "/metrics");
    INFO(text);
    REQUIRE(text.rfind("HTTP/1.1 200", 0) == 0);
    CHECK(text.find("# TYPE resilience_events_total counter") != std::string::npos);
    CHECK(text.find("resilience_events_total{event=\"retry\",name=\"orders\",policy=\"retry\"} 2") !=
          std::string::npos);
    CHECK(text.find("resilience_attempt_duration_seconds_count{handled=\"false\",name=\"orders\","
                    "outcome=\"success\",policy=\"retry\"} 3") != std::string::npos);
    // The 503 the retry retried: returned, and handled.
    CHECK(text.find("resilience_attempt_duration_seconds_count{handled=\"true\",name=\"orders\","
                    "outcome=\"success\",policy=\"retry\"} 1") != std::string::npos);
    CHECK(text.find("resilience_attempt_duration_seconds_count{handled=\"true\",name=\"orders\","
                    "outcome=\"failure\",policy=\"retry\"} 1") != std::string::npos);
    CHECK(text.find("resilience_call_duration_seconds_count{handled=\"false\",name=\"orders\","
                    "outcome=\"success\",policy=\"telemetry\"} 3") != std::string::npos);
    CHECK(text.find("resilience_call_duration_seconds_bucket{handled=\"false\",name=\"orders\","
                    "outcome=\"success\",policy=\"telemetry\",le=\"+Inf\"} 3") != std::string::npos);
    CHECK(text.find("# TYPE resilience_circuit_state gauge") != std::string::npos);
    CHECK(text.find("resilience_circuit_state{name=\"db\",policy=\"circuit_breaker\",state=\"closed\"} 1") !=
          std::string::npos);
    CHECK(text.find("resilience_circuit_state{name=\"db\",policy=\"circuit_breaker\",state=\"open\"} 0") !=
          std::string::npos);
    CHECK(text.find("resilience_circuit_window_calls{name=\"db\",policy=\"circuit_breaker\"} ") !=
          std::string::npos);
    CHECK(text.find("resilience_bulkhead_limit{name=\"db\",policy=\"bulkhead\"} 3") != std::string::npos);
    CHECK(text.find("resilience_bulkhead_in_flight{name=\"db\",policy=\"bulkhead\"} 0") != std::string::npos);
    // Every sample of every series carries both policy and name.
    std::size_t samples = 0;
    for (std::size_t at = text.find("\r\n\r\n"), end; at != std::string::npos && at < text.size(); at = end) {
        end = text.find('\n', at + 1);
        const std::string line = text.substr(at + 1, end == std::string::npos ? end : end - at - 1);
        if (line.empty() || line[0] == '#' || line.rfind("resilience_", 0) != 0)
            continue;
        ++samples;
        INFO(line);
        CHECK(line.find("policy=\"") != std::string::npos);
        CHECK(line.find("name=\"") != std::string::npos);
    }
    CHECK(samples > 20);
}

// What `promtool check metrics` says of `text` (Debian's `prometheus` package ships promtool): its exit
// status and output; nullopt when promtool is missing.
std::optional<std::pair<int, std::string>> promtool_check(const std::string& text) {
    const char* const promtool = "/usr/bin/promtool";
    if (::access(promtool, X_OK) != 0)
        return std::nullopt;
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("resilience-promtool-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string in = (dir / "metrics.txt").string(), out = (dir / "promtool.log").string();
    std::ofstream(in) << text;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, in.c_str(), O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::string check = "check", metrics = "metrics";
    char* argv[] = {const_cast<char*>(promtool), check.data(), metrics.data(), nullptr};
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, promtool, &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    int status = -1;
    if (rc == 0)
        ::waitpid(pid, &status, 0);
    std::ifstream log(out);
    std::string said{std::istreambuf_iterator<char>(log), {}};
    std::filesystem::remove_all(dir);
    return std::pair{rc == 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1, said};
}

TEST_CASE("prometheus: promtool finds nothing to say about the scraped exposition", "[prometheus]") {
    traffic t;
    prom::Exposer exposer{"127.0.0.1:0"};
    t.m.expose(exposer);
    const std::string response = http_get(exposer.GetListeningPorts().at(0), "/metrics");
    const auto body_at = response.find("\r\n\r\n");
    REQUIRE(body_at != std::string::npos);
    const std::string body = response.substr(body_at + 4);
    const auto checked = promtool_check(body);
    if (!checked) {
        WARN("skipped: /usr/bin/promtool is missing (Debian: apt-get install prometheus)");
        return;
    }
    INFO(body);
    INFO("promtool: " << checked->second);
    CHECK(checked->first == 0);
    CHECK(checked->second.empty());
}

// A child process, killed (SIGTERM, then SIGKILL) and reaped when it goes out of scope.
class child_process {
public:
    child_process(const std::vector<std::string>& argv, const std::string& log) {
        std::vector<char*> args;
        for (const std::string& a : argv)
            args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        posix_spawn_file_actions_adddup2(&actions, 1, 2);
        const int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
        posix_spawn_file_actions_destroy(&actions);
        if (rc != 0)
            throw std::runtime_error("cannot start " + argv[0]);
    }
    ~child_process() {
        ::kill(pid_, SIGTERM);
        for (int i = 0; i < 100; ++i) { // up to 5 s for a clean exit
            int status = 0;
            if (::waitpid(pid_, &status, WNOHANG) == pid_)
                return;
            std::this_thread::sleep_for(50ms);
        }
        ::kill(pid_, SIGKILL);
        int status = 0;
        ::waitpid(pid_, &status, 0);
    }
    child_process(const child_process&) = delete;
    child_process& operator=(const child_process&) = delete;

private:
    pid_t pid_ = -1;
};

// "1" from a query answer's first sample, `"value":[1712345678.9,"1"]`; empty when there is none.
std::string first_value(const std::string& body) {
    const auto at = body.find("\"value\":[");
    if (at == std::string::npos)
        return {};
    const auto open = body.find(",\"", at);
    const auto close = open == std::string::npos ? open : body.find('"', open + 2);
    if (close == std::string::npos)
        return {};
    return body.substr(open + 2, close - open - 2);
}

TEST_CASE("prometheus: a Prometheus server scrapes the Exposer and answers a query for the series",
          "[prometheus][server]") {
    const char* const server = "/usr/bin/prometheus";
    if (::access(server, X_OK) != 0) {
        WARN("skipped: /usr/bin/prometheus is missing (Debian: apt-get install prometheus)");
        return;
    }
    traffic t;
    prom::Exposer exposer{"127.0.0.1:0"};
    t.m.expose(exposer);
    const int target = exposer.GetListeningPorts().at(0);

    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("resilience-prometheus-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    {
        std::ofstream config(dir / "prometheus.yml");
        config << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
               << "scrape_configs:\n  - job_name: resilience\n    static_configs:\n"
               << "      - targets: ['127.0.0.1:" << target << "']\n";
    }
    const int web = free_port();
    std::string answer, value, handled_value, breaker_value, bulkhead_value;
    {
        child_process prometheus{{server, "--config.file=" + (dir / "prometheus.yml").string(),
                                  "--storage.tsdb.path=" + (dir / "data").string(),
                                  "--web.listen-address=127.0.0.1:" + std::to_string(web)},
                                 (dir / "prometheus.log").string()};
        // resilience_events_total{event="retry",name="orders"}, URL-encoded.
        const std::string query = "/api/v1/query?query=resilience_events_total%7Bevent%3D%22retry%22%2C"
                                  "name%3D%22orders%22%7D";
        const auto bound = std::chrono::steady_clock::now() + 30s;
        while (std::chrono::steady_clock::now() < bound) {
            answer = http_get(web, query);
            value = first_value(answer);
            if (!value.empty())
                break;
            std::this_thread::sleep_for(250ms);
        }
        // From the same scrape: the 503 the retry handled, and the watched gauges under their policy.
        // resilience_attempt_duration_seconds_count{outcome="success",handled="true"}
        handled_value =
            first_value(http_get(web, "/api/v1/query?query=resilience_attempt_duration_seconds_count"
                                      "%7Boutcome%3D%22success%22%2Chandled%3D%22true%22%7D"));
        // resilience_circuit_state{policy="circuit_breaker",name="db",state="closed"}
        breaker_value =
            first_value(http_get(web, "/api/v1/query?query=resilience_circuit_state%7Bpolicy%3D%22"
                                      "circuit_breaker%22%2Cname%3D%22db%22%2Cstate%3D%22closed%22%7D"));
        // resilience_bulkhead_limit{policy="bulkhead",name="db"}
        bulkhead_value = first_value(http_get(
            web,
            "/api/v1/query?query=resilience_bulkhead_limit%7Bpolicy%3D%22bulkhead%22%2Cname%3D%22db%22%7D"));
    }
    std::string log;
    {
        std::ifstream in(dir / "prometheus.log");
        log.assign(std::istreambuf_iterator<char>(in), {});
    }
    std::filesystem::remove_all(dir);
    INFO("last answer: " << answer);
    INFO("server log: " << log.substr(log.size() > 4000 ? log.size() - 4000 : 0));
    CHECK(answer.find("\"status\":\"success\"") != std::string::npos);
    CHECK(answer.find("\"job\":\"resilience\"") != std::string::npos);
    CHECK(value == "2");
    CHECK(handled_value == "1");
    CHECK(breaker_value == "1");
    CHECK(bulkhead_value == "3");
}

} // namespace test_prometheus
