// SPDX-License-Identifier: MIT
#include "catch.hpp"

#include <resilience/fmt.hpp>

#include <fmt/format.h>

#include <chrono>
#include <stdexcept>
#include <string>

namespace test_fmt {

namespace rs = resilience;
using namespace std::chrono_literals;

TEST_CASE("fmt: codes, states, reasons and kinds print as their names", "[fmt]") {
    CHECK(fmt::format("{}", rs::errc::circuit_open) == "circuit open");
    CHECK(fmt::format("{}", rs::circuit_state::half_open) == "half_open");
    CHECK(fmt::format("{}", rs::rejection_reason::queue_timeout) == "queue_timeout");
    CHECK(fmt::format("{}", rs::rejection_reason::shed) == "shed");
    CHECK(fmt::format("{}", rs::hedge_reason::failure) == "failure");
    CHECK(fmt::format("{}", rs::telemetry_kind::state_change) == "state_change");
    CHECK(fmt::format("[{:>8}]", rs::circuit_state::open) == "[    open]");
}

TEST_CASE("fmt: errors print what a caller acts on: how long to wait and why", "[fmt]") {
    CHECK(fmt::format("{}", rs::circuit_open_error{"payments", 4500ms}) ==
          "payments: circuit open (retry after 4.5s)");
    CHECK(fmt::format("{}", rs::circuit_isolated_error{"payments"}) == "payments: circuit isolated");
    CHECK(fmt::format("{}", rs::throttled_error{"payments", 0.5}) == "payments: throttled");
    CHECK(fmt::format("{}", rs::bulkhead_rejected_error{"db", rs::rejection_reason::queue_full}) ==
          "db: bulkhead rejected the call (queue_full)");
    CHECK(fmt::format("{}", rs::rate_limited_error{"api", 0ms, rs::rejection_reason::shed}) ==
          "api: rate limited (retry after 0ns) (shed)");
    CHECK(fmt::format("{}", rs::rate_limited_error{"", 250ms, rs::rejection_reason::no_capacity}) ==
          "rate limited (retry after 250ms) (no_capacity)");
    CHECK(fmt::format("{}", rs::timeout_error{}) == "timed out");
    const rs::failure f = rs::failure::make(rs::circuit_open_error{"", 1s});
    CHECK(fmt::format("{}", f) == "circuit open");
    CHECK(fmt::format("{}", rs::outcome<int>{42}) == "value(42)");
    CHECK(fmt::format("{}", rs::outcome<int>{rs::failure::make(std::runtime_error("boom"))}) ==
          "failure(boom)");
}

TEST_CASE("fmt: a telemetry event prints as one line with its instant, policy, name and what happened",
          "[fmt]") {
    const rs::failure boom = rs::failure::make(std::runtime_error("boom"));
    const rs::failure full =
        rs::failure::make(rs::bulkhead_rejected_error{"db", rs::rejection_reason::queue_full});
    rs::telemetry_event retry{.kind = rs::telemetry_kind::retry,
                              .policy = "retry",
                              .name = "payments",
                              .attempt = 1,
                              .duration = 200ms,
                              .error = &boom,
                              .at = 1200ms};
    CHECK(fmt::format("{}", retry) == "[1.2s] retry(payments) retry: attempt 1 failed, next in 200ms: boom");
    rs::telemetry_event attempt{
        .kind = rs::telemetry_kind::attempt, .policy = "retry", .attempt = 2, .duration = 12345us, .at = 2s};
    CHECK(fmt::format("{}", attempt) == "[2s] retry attempt: attempt 2 succeeded after 12.345ms");
    rs::telemetry_event opened{.kind = rs::telemetry_kind::state_change,
                               .policy = "circuit_breaker",
                               .from = rs::circuit_state::closed,
                               .to = rs::circuit_state::open,
                               .at = 5s};
    CHECK(fmt::format("{}", opened) == "[5s] circuit_breaker state_change: closed -> open");
    rs::telemetry_event refused{.kind = rs::telemetry_kind::rejection,
                                .policy = "bulkhead",
                                .name = "db",
                                .attempt = 1,
                                .duration = 300ms,
                                .error = &full,
                                .reason = rs::rejection_reason::queue_full,
                                .at = 300ms};
    CHECK(fmt::format("{}", refused) == "[300ms] bulkhead(db) rejection: attempt 1 refused after waiting "
                                        "300ms: db: bulkhead rejected the call "
                                        "(queue_full)");
    rs::telemetry_event call{.kind = rs::telemetry_kind::call, .policy = "telemetry", .duration = 0ns};
    CHECK(fmt::format("{}", call) == "[0ns] telemetry call: call succeeded after 0ns");
    rs::telemetry_event unavailable{.kind = rs::telemetry_kind::attempt,
                                    .policy = "retry",
                                    .attempt = 1,
                                    .duration = 30ms,
                                    .handled = true,
                                    .at = 30ms};
    CHECK(fmt::format("{}", unavailable) ==
          "[30ms] retry attempt: attempt 1 returned a handled value after 30ms");
    rs::telemetry_event ejected{.kind = rs::telemetry_kind::endpoint_ejected,
                                .policy = "balancer",
                                .name = "replicas",
                                .attempt = 1,
                                .duration = 30s,
                                .note = "consecutive_failures",
                                .endpoint = "10.0.0.7:80",
                                .at = 9s};
    CHECK(fmt::format("{}", ejected) ==
          "[9s] balancer(replicas) endpoint_ejected: 10.0.0.7:80 ejected for 30s (consecutive_failures)");
    rs::telemetry_event back{.kind = rs::telemetry_kind::endpoint_returned,
                             .policy = "balancer",
                             .name = "replicas",
                             .endpoint = "10.0.0.7:80",
                             .at = 39s};
    CHECK(fmt::format("{}", back) == "[39s] balancer(replicas) endpoint_returned: 10.0.0.7:80 back");
    CHECK(fmt::format("{}", rs::errc::no_endpoint) == "no endpoint");
}

} // namespace test_fmt
