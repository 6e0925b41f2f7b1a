// SPDX-License-Identifier: MIT
// <resilience/beast.hpp>: the HTTP classifier and Retry-After on Beast's own response type, on virtual
// time. Built only when Boost's headers are found.
#include "catch.hpp"

#include <resilience/beast.hpp>
#include <resilience/resilience.hpp>
#include <resilience/testing/simulation.hpp>

#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/string_body.hpp>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace test_beast {

namespace rs = resilience;
namespace http = boost::beast::http;
using namespace std::chrono_literals;
using rs::testing::simulation;
using std::chrono::nanoseconds;

using response = http::response<http::string_body>;

static_assert(rs::http::response<response>);
static_assert(rs::http::response<http::response<http::empty_body>>);

response make(http::status status, std::optional<std::string> retry_after = std::nullopt) {
    response r{status, 11};
    if (retry_after)
        r.set(http::field::retry_after, *retry_after);
    r.body() = "body";
    r.prepare_payload();
    return r;
}

TEST_CASE("beast: the classifier reads a Beast response's status and Retry-After", "[beast][http]") {
    const rs::http::response_classifier<response> c;
    CHECK_FALSE(c(rs::outcome<response>{make(http::status::ok)}).handle);
    CHECK_FALSE(c(rs::outcome<response>{make(http::status::not_found, "5")}).handle);
    CHECK_FALSE(c(rs::outcome<response>{make(http::status::conflict)}).handle);
    const rs::verdict plain = c(rs::outcome<response>{make(http::status::service_unavailable)});
    CHECK(plain.handle);
    CHECK_FALSE(plain.delay);
    const rs::verdict hinted = c(rs::outcome<response>{make(http::status::too_many_requests, "7")});
    CHECK(hinted.handle);
    CHECK(hinted.delay == nanoseconds{7s});
    // A status Beast has no name for is still a number.
    response odd = make(http::status::ok);
    odd.result(599);
    CHECK(c(rs::outcome<response>{odd}).handle);
    // The field name is matched case-insensitively, as HTTP says.
    response lower = make(http::status::bad_gateway);
    lower.set("retry-after", "3");
    CHECK(c(rs::outcome<response>{lower}).delay == nanoseconds{3s});
}

TEST_CASE("beast: a retry waits what a Beast response's Retry-After asks, else its backoff",
          "[beast][http][retry]") {
    simulation sim;
    std::vector<response> replies{make(http::status::service_unavailable, "2"),
                                  make(http::status::bad_gateway), make(http::status::ok)};
    std::vector<nanoseconds> starts;
    auto call = [&]() -> rs::task<response> {
        const std::size_t n = starts.size();
        starts.push_back(sim.now());
        co_await sim.sleep_for(10ms);
        co_return replies[n];
    };
    rs::retry r{{.max_attempts = 4,
                 .backoff = rs::constant_backoff{100ms, rs::jitter::none},
                 .should_handle = rs::http::response_classifier<response>{}},
                sim.clock()};
    const response answer = sim.run(r.execute(call));
    CHECK(answer.result() == http::status::ok);
    CHECK(answer.body() == "body");
    // 503 at 10 ms asks 2 s; 502 at 2.020 s asks nothing: the backoff's 100 ms.
    CHECK(starts == std::vector<nanoseconds>{0ms, 2010ms, 2120ms});
    CHECK(sim.now() == 2130ms);
}

TEST_CASE("beast: attempts run out on a Beast response and the last one is returned as it is",
          "[beast][http][retry]") {
    simulation sim;
    int calls = 0;
    auto call = [&]() -> rs::task<response> {
        ++calls;
        co_await sim.sleep_for(1ms);
        co_return make(http::status::service_unavailable, "1");
    };
    rs::retry r{{.max_attempts = 3, .should_handle = rs::http::response_classifier<response>{}}, sim.clock()};
    const response answer = sim.run(r.execute(call));
    CHECK(calls == 3);
    CHECK(answer.result() == http::status::service_unavailable);
    CHECK(answer[http::field::retry_after] == "1");
    CHECK(sim.now() == 2003ms);
}

} // namespace test_beast
