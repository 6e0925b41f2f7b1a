// SPDX-License-Identifier: MIT
#include "catch.hpp"

#include <resilience/error.hpp>
#include <resilience/outcome.hpp>

#include <stdexcept>
#include <string>
#include <system_error>

namespace rs = resilience;
using namespace std::chrono_literals;

TEST_CASE("error: errc values live in the library's category and read well", "[error]") {
    std::error_code ec = rs::errc::circuit_open;
    CHECK(ec.category() == rs::error_category());
    CHECK(std::string(ec.category().name()) == "resilience");
    CHECK(ec.message() == "circuit open");
    rs::timeout_error t;
    CHECK(t.code() == rs::errc::timeout);
    const std::system_error& as_system = t; // catchable as std::system_error
    CHECK(as_system.code().value() == static_cast<int>(rs::errc::timeout));
}

TEST_CASE("error: errors that refuse a call carry retry_after", "[error]") {
    rs::circuit_open_error open{23s};
    CHECK(open.retry_after() == 23s);
    CHECK(open.cause() == nullptr);
    rs::rate_limited_error limited{150ms};
    CHECK(limited.retry_after() == 150ms);
    CHECK(limited.code() == rs::errc::rate_limited);
}

TEST_CASE("failure: made without throwing, asked about its type, rethrown unchanged", "[outcome]") {
    auto f = rs::failure::make(rs::circuit_open_error{1s});
    CHECK(f.code() == rs::errc::circuit_open);
    CHECK(f.is<rs::circuit_open_error>());
    CHECK(f.is<rs::error>());
    CHECK(f.is<std::system_error>());
    CHECK_FALSE(f.is<std::logic_error>());
    REQUIRE(f.as<rs::circuit_open_error>() != nullptr);
    CHECK(f.as<rs::circuit_open_error>()->retry_after() == 1s);

    auto g = rs::failure::make(std::invalid_argument("bad"));
    CHECK(g.code() == rs::errc{});
    CHECK(g.what() == std::string("bad"));
    const std::exception* first = nullptr;
    try {
        g.rethrow();
    } catch (const std::invalid_argument& e) {
        first = &e;
    }
    try {
        g.rethrow();
    } catch (const std::invalid_argument& e) {
        CHECK(&e == first); // the same exception object each time
    }
}

TEST_CASE("failure: cancellation is recognised by code and by type", "[outcome]") {
    CHECK(rs::is_cancellation(rs::failure::make(rs::cancelled_error{})));
    CHECK_FALSE(rs::is_cancellation(rs::failure::make(rs::timeout_error{})));
    CHECK_THROWS_AS(rs::failure{}.rethrow(), std::logic_error);
}

TEST_CASE("outcome: holds a value or a failure, value() rethrows the failure", "[outcome]") {
    rs::outcome<std::string> ok{"fine"};
    CHECK(ok.has_value());
    CHECK(ok.value() == "fine");
    CHECK_THROWS_AS(ok.error(), std::logic_error);

    rs::outcome<std::string> bad{rs::failure::make(std::runtime_error("down"))};
    CHECK(bad.has_failure());
    CHECK_FALSE(static_cast<bool>(bad));
    CHECK_THROWS_WITH(bad.value(), "down");
    CHECK(bad.error().what() == std::string("down"));

    rs::outcome<void> done;
    CHECK(done.has_value());
    CHECK_NOTHROW(done.value());
}

TEST_CASE("error: timeout and cancelled compare equal to their std::errc conditions", "[error]") {
    const std::error_code timeout = rs::errc::timeout;
    CHECK(timeout == std::errc::timed_out);
    CHECK(std::errc::timed_out == timeout);
    CHECK(timeout == std::error_condition(std::errc::timed_out));
    CHECK(std::error_condition(std::errc::timed_out) == timeout);
    CHECK(std::error_code(rs::errc::cancelled) == std::errc::operation_canceled);
    CHECK(std::errc::operation_canceled == std::error_code(rs::errc::cancelled));

    // Each matches only its own condition.
    CHECK(timeout != std::errc::operation_canceled);
    CHECK(std::error_code(rs::errc::cancelled) != std::errc::timed_out);
    CHECK(std::error_code(rs::errc::circuit_open) != std::errc::timed_out);
    CHECK(std::error_code(rs::errc::rate_limited) != std::errc::operation_canceled);

    // Through the exceptions, as code catching std::system_error sees them.
    CHECK(rs::timeout_error{}.code() == std::errc::timed_out);
    CHECK(rs::cancelled_error{}.code() == std::errc::operation_canceled);
    try {
        throw rs::timeout_error{};
    } catch (const std::system_error& e) {
        CHECK(e.code() == std::errc::timed_out);
    }
    // And through a failure's code, without rethrowing it.
    CHECK(std::error_code(rs::failure::make(rs::timeout_error{}).code()) == std::errc::timed_out);

    // Still a code of our own category: equality with our enum is unchanged.
    CHECK(timeout == rs::errc::timeout);
    CHECK(timeout != rs::errc::cancelled);
    CHECK(timeout.default_error_condition() == std::error_condition(1, rs::error_category()));
}
