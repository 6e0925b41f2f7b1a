// SPDX-License-Identifier: MIT
#include "catch.hpp"
#include "support.hpp"

#include <resilience/error.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/resilience.hpp>
#include <resilience/retry.hpp>
#include <resilience/retry_by_request.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>
#include <resilience/when_all.hpp>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace test_retry_by_request {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_tests::stop_at;
using rs::testing::simulation;
using std::chrono::nanoseconds;

namespace {

// Requests, marked or not.
struct get_price {
    std::string sku;
    static constexpr bool retry_safe = true;
};
struct get_stock : get_price {}; // inherits the mark
struct charge_card {
    int cents = 0;
};
struct send_mail {
    static constexpr bool retry_safe = false;
};
struct vendor_lookup { // a type the test pretends it cannot change: marked by specialization
    int id = 0;
};
struct audited_price : get_price {}; // unmarked by specialization
struct runtime_flag {
    static inline bool retry_safe = true; // not a constant: not a mark
};

// A deterministic error of the application's own: derived from std::logic_error, so never retried.
struct validation_error : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

// What the handlers did, shared by their copies.
struct journal {
    int failures_left = 0;          // calls that fail with a transient error before they succeed
    bool invalid = false;           // fail with validation_error instead
    std::vector<std::string> calls; // the request kind of each call
    std::vector<int> attempts;      // context::attempt() as each call saw it
    std::vector<nanoseconds> starts;
};

// One handler object for every request type, as a mediator would hold: each call takes 10ms.
struct handlers {
    simulation* sim;
    std::shared_ptr<journal> log = std::make_shared<journal>();

    rs::task<std::size_t> operator()(const get_price& r, const rs::context& ctx) const {
        auto j = log;
        j->calls.push_back("price " + r.sku);
        j->attempts.push_back(ctx.attempt());
        j->starts.push_back(sim->now());
        co_await sim->sleep_for(10ms, ctx.stop_token());
        if (ctx.stop_requested())
            throw rs::cancelled_error{};
        if (j->invalid)
            throw validation_error("no such sku");
        if (j->failures_left > 0) {
            --j->failures_left;
            throw std::runtime_error("upstream busy");
        }
        co_return r.sku.size();
    }
    rs::task<void> operator()(const charge_card&, resilience::stop_token) const {
        auto j = log;
        j->calls.push_back("charge");
        j->starts.push_back(sim->now());
        co_await sim->sleep_for(10ms);
        if (j->failures_left > 0) {
            --j->failures_left;
            throw std::runtime_error("gateway timeout");
        }
    }
    rs::task<int> operator()(const vendor_lookup& v) const {
        auto j = log;
        j->calls.push_back("lookup");
        j->starts.push_back(sim->now());
        co_await sim->sleep_for(10ms);
        if (j->failures_left > 0) {
            --j->failures_left;
            throw std::runtime_error("vendor down");
        }
        co_return v.id;
    }
};

const rs::constant_backoff exact_100ms{100ms, rs::jitter::none};

} // namespace

} // namespace test_retry_by_request

template <>
inline constexpr bool resilience::retry_safe<test_retry_by_request::vendor_lookup> = true;
template <>
inline constexpr bool resilience::retry_safe<test_retry_by_request::audited_price> = false;

namespace test_retry_by_request {

static_assert(rs::retry_safe<get_price>);
static_assert(rs::retry_safe<get_stock>);
static_assert(!rs::retry_safe<charge_card>);
static_assert(!rs::retry_safe<send_mail>);
static_assert(rs::retry_safe<vendor_lookup>);
static_assert(!rs::retry_safe<audited_price>);
static_assert(!rs::retry_safe<runtime_flag>);
static_assert(!rs::retry_safe<int>);

TEST_CASE("retry by request: a marked request is retried at the backoff's instants", "[retry_by_request]") {
    simulation sim;
    handlers h{&sim};
    h.log->failures_left = 2;
    const rs::retrying_handler handle{h, rs::retry{{.max_attempts = 3, .backoff = exact_100ms}, sim.clock()}};
    CHECK(sim.run(handle(get_price{"sku-42"})) == 6);
    CHECK(h.log->starts == std::vector<nanoseconds>{0ms, 110ms, 220ms});
    CHECK(h.log->attempts == std::vector<int>{1, 2, 3});
}

TEST_CASE("retry by request: a request that is not marked runs once", "[retry_by_request]") {
    simulation sim;
    handlers h{&sim};
    h.log->failures_left = 1;
    const rs::retrying_handler handle{h, rs::retry{{.max_attempts = 3, .backoff = exact_100ms}, sim.clock()}};
    CHECK_THROWS_WITH(sim.run(handle(charge_card{500})), "gateway timeout");
    CHECK(h.log->calls == std::vector<std::string>{"charge"});
    CHECK(sim.now() == 10ms);

    h.log->failures_left = 1;
    CHECK_THROWS_AS(sim.run(handle(audited_price{{"x"}})), std::runtime_error); // unmarked by specialization
    CHECK(h.log->calls.size() == 2);
}

TEST_CASE("retry by request: marks are inherited and may be given by specialization", "[retry_by_request]") {
    simulation sim;
    handlers h{&sim};
    const rs::retrying_handler handle{h, rs::retry{{.max_attempts = 2, .backoff = exact_100ms}, sim.clock()}};
    h.log->failures_left = 1;
    CHECK(sim.run(handle(get_stock{{"abc"}})) == 3); // get_stock is handled as a get_price
    h.log->failures_left = 1;
    CHECK(sim.run(handle(vendor_lookup{7})) == 7);
    CHECK(h.log->calls == std::vector<std::string>{"price abc", "price abc", "lookup", "lookup"});
}

TEST_CASE("retry by request: a deterministic error is not retried, even for a marked request",
          "[retry_by_request]") {
    simulation sim;
    handlers h{&sim};
    h.log->invalid = true;
    const rs::retrying_handler handle{h, rs::retry{{.max_attempts = 5, .backoff = exact_100ms}, sim.clock()}};
    CHECK_THROWS_AS(sim.run(handle(get_price{"?"})), validation_error);
    CHECK(h.log->calls.size() == 1);
    CHECK(sim.now() == 10ms);
}

TEST_CASE("retry by request: a caller's stop ends a marked request without another attempt",
          "[retry_by_request]") {
    simulation sim;
    handlers h{&sim};
    h.log->failures_left = 100;
    const rs::retrying_handler handle{h, rs::retry{{.max_attempts = 5, .backoff = exact_100ms}, sim.clock()}};
    resilience::stop_source caller;
    // First attempt 0-10ms fails; the second starts at 110ms and is stopped at 115ms.
    auto [r, ignored] = sim.run(rs::when_all(
        [&]() -> rs::task<rs::outcome<std::size_t>> {
            // Named, not braced inside the co_await: g++ 12 destroys such a temporary twice.
            const get_price request{"sku"};
            try {
                co_return co_await handle(request, caller.get_token());
            } catch (...) {
                co_return rs::failure::current();
            }
        }(),
        stop_at(sim, caller, 115ms)));
    (void)ignored;
    REQUIRE(r.has_failure());
    CHECK(r.error().is<rs::cancelled_error>());
    CHECK(h.log->starts == std::vector<nanoseconds>{0ms, 110ms});
    CHECK(sim.now() == 115ms);
}

TEST_CASE("retry by request: the call keeps its own copy of the request for every attempt",
          "[retry_by_request]") {
    simulation sim;
    handlers h{&sim};
    h.log->failures_left = 2;
    const rs::retrying_handler handle{h, rs::retry{{.max_attempts = 3, .backoff = exact_100ms}, sim.clock()}};
    auto call = [&] {
        get_price request{"a-long-sku-that-owns-heap-memory"};
        return handle(std::move(request)); // the caller's object is gone before the call starts
    }();
    CHECK(sim.run(std::move(call)) == 32);
    CHECK(h.log->calls == std::vector<std::string>(3, "price a-long-sku-that-owns-heap-memory"));
}

TEST_CASE("retry by request: any policy may carry the marked requests, a pipeline with a timeout say",
          "[retry_by_request]") {
    simulation sim;
    handlers h{&sim};
    const rs::retrying_handler handle{
        h, rs::pipeline{rs::retry{{.max_attempts = 3, .backoff = exact_100ms}, sim.clock()},
                        rs::timeout{5ms, sim.clock()}}};
    // Every attempt takes 10ms, past the 5ms timeout: three timeouts, at 5, 110 and 215ms.
    CHECK_THROWS_AS(sim.run(handle(get_price{"x"})), rs::timeout_error);
    CHECK(h.log->starts == std::vector<nanoseconds>{0ms, 105ms, 210ms});
    CHECK(sim.now() == 215ms);
    // A request that is not marked does not meet the policy at all: no timeout either.
    h.log->failures_left = 0;
    const nanoseconds start = sim.now();
    CHECK_NOTHROW(sim.run(handle(charge_card{100})));
    CHECK(sim.now() - start == 10ms);
}

} // namespace test_retry_by_request
