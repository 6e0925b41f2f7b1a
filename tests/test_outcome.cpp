// SPDX-License-Identifier: MIT
#include "catch.hpp"

#include <resilience/adaptive_throttle/errors.hpp>
#include <resilience/circuit_breaker/errors.hpp>
#include <resilience/error.hpp>
#include <resilience/limiter/errors.hpp>
#include <resilience/outcome.hpp>

#include <stdexcept>
#include <string>
#include <system_error>

namespace test_outcome {

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
    rs::circuit_open_error open{"", 23s};
    CHECK(open.retry_after() == 23s);
    CHECK(open.cause() == nullptr);
    rs::rate_limited_error limited{"", 150ms};
    CHECK(limited.retry_after() == 150ms);
    CHECK(limited.code() == rs::errc::rate_limited);
}

TEST_CASE("error: every refusal says why, and every error takes the policy's name first", "[error]") {
    const rs::circuit_open_error open{"payments", 2s};
    CHECK(open.reason() == rs::rejection_reason::circuit_open);
    CHECK(open.policy_name() == "payments");
    const rs::circuit_isolated_error isolated{"payments"};
    CHECK(isolated.reason() == rs::rejection_reason::circuit_isolated);
    const rs::circuit_open_error& as_open = isolated;
    CHECK(as_open.reason() == rs::rejection_reason::circuit_isolated);
    const rs::throttled_error throttled{"search", 0.25};
    CHECK(throttled.reason() == rs::rejection_reason::throttled);
    CHECK(throttled.probability() == 0.25);
    CHECK(throttled.policy_name() == "search");
    const rs::rate_limited_error limited{"api", 3s, rs::rejection_reason::queue_full};
    CHECK(limited.reason() == rs::rejection_reason::queue_full);
    CHECK(limited.policy_name() == "api");
    const rs::timeout_error timed_out{"db"};
    CHECK(timed_out.policy_name() == "db");
    CHECK(std::string_view{rs::to_string(rs::rejection_reason::circuit_isolated)} == "circuit_isolated");
    const rs::rejection_event e{"api", rs::rejection_reason::queue_timeout, 40ms};
    CHECK(e.policy_name() == "api");
    CHECK(e.reason() == rs::rejection_reason::queue_timeout);
    CHECK(e.retry_after() == 40ms);
}

TEST_CASE("failure: made without throwing, asked about its type, rethrown unchanged", "[outcome]") {
    auto f = rs::failure::make(rs::circuit_open_error{"", 1s});
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

TEST_CASE("outcome: value_or gives the value or the fallback, never throws the failure", "[outcome]") {
    rs::outcome<std::string> ok{"fine"};
    rs::outcome<std::string> bad{rs::failure::make(std::runtime_error("down"))};
    CHECK(ok.value_or("other") == "fine");
    CHECK(bad.value_or("other") == "other");
    CHECK(std::move(ok).value_or("other") == "fine");
    CHECK(std::move(bad).value_or(std::string("moved in")) == "moved in");

    rs::outcome<int> n{rs::failure::make(rs::timeout_error{})};
    CHECK(n.value_or(7) == 7);
}

TEST_CASE("outcome: * and -> read the value in place", "[outcome]") {
    rs::outcome<std::string> ok{"fine"};
    CHECK(*ok == "fine");
    CHECK(ok->size() == 4);
    ok->append("!");
    *ok += "?";
    CHECK(ok.value() == "fine!?");
    const auto& same = ok;
    CHECK(same->size() == 6);
    std::string taken = *std::move(ok);
    CHECK(taken == "fine!?");
    static_assert(std::is_same_v<decltype(*std::declval<rs::outcome<int>&>()), int&>);
    static_assert(std::is_same_v<decltype(*std::declval<const rs::outcome<int>&>()), const int&>);
    static_assert(std::is_same_v<decltype(*std::declval<rs::outcome<int>>()), int&&>);
    static_assert(std::is_same_v<decltype(std::declval<rs::outcome<int>&>().operator->()), int*>);
    rs::outcome<void> done;
    *done; // asserts has_value(), as std::expected<void, E> does
}

TEST_CASE("outcome: failure() and error() name the same failure, checked", "[outcome]") {
    rs::outcome<int> bad{rs::failure::make(rs::circuit_open_error{"", 2s})};
    CHECK(&bad.failure() == &bad.error());
    CHECK(bad.failure().code() == rs::errc::circuit_open);
    rs::outcome<int> ok{1};
    CHECK_THROWS_AS(ok.failure(), std::logic_error);
    CHECK_THROWS_AS(rs::outcome<void>{}.failure(), std::logic_error);
    static_assert(std::is_same_v<rs::outcome<int>::failure_type, rs::failure>);
    static_assert(std::is_same_v<rs::outcome<int>::error_type, rs::failure>);
}

TEST_CASE("outcome: transform maps a value and passes a failure through", "[outcome]") {
    rs::outcome<int> ok{20};
    auto doubled = ok.transform([](int v) { return v * 2; });
    static_assert(std::is_same_v<decltype(doubled), rs::outcome<int>>);
    CHECK(doubled.value() == 40);

    auto text = ok.transform([](const int& v) -> const std::string& {
        static const std::string twenty = std::to_string(v);
        return twenty;
    });
    static_assert(std::is_same_v<decltype(text), rs::outcome<std::string>>); // stored by value
    CHECK(*text == "20");

    int seen = 0;
    auto nothing = ok.transform([&](int v) { seen = v; });
    static_assert(std::is_same_v<decltype(nothing), rs::outcome<void>>);
    CHECK(nothing.has_value());
    CHECK(seen == 20);

    rs::outcome<int> bad{rs::failure::make(rs::timeout_error{})};
    bool called = false;
    auto still_bad = bad.transform([&](int v) {
        called = true;
        return std::to_string(v);
    });
    static_assert(std::is_same_v<decltype(still_bad), rs::outcome<std::string>>);
    CHECK_FALSE(called);
    REQUIRE(still_bad.has_failure());
    CHECK(still_bad.failure().code() == rs::errc::timeout);
    CHECK(still_bad.failure().exception() == bad.failure().exception()); // the same exception object

    // Moves the value out of an rvalue.
    rs::outcome<std::string> s{"abc"};
    auto len = std::move(s).transform([](std::string&& v) {
        std::string mine = std::move(v);
        return mine.size();
    });
    CHECK(*len == 3);

    rs::outcome<void> done;
    CHECK(done.transform([] { return 5; }).value() == 5);
}

TEST_CASE("outcome: and_then chains steps that may fail", "[outcome]") {
    const auto parse = [](const std::string& s) -> rs::outcome<int> {
        if (s.empty())
            return rs::failure::make(std::invalid_argument("empty"));
        return static_cast<int>(s.size());
    };
    rs::outcome<std::string> word{"four"};
    CHECK(word.and_then(parse).value() == 4);
    rs::outcome<std::string> empty{""};
    CHECK_THROWS_WITH(empty.and_then(parse).value(), "empty");

    rs::outcome<std::string> bad{rs::failure::make(rs::cancelled_error{})};
    auto r = bad.and_then(parse);
    static_assert(std::is_same_v<decltype(r), rs::outcome<int>>);
    CHECK(rs::is_cancellation(r.failure()));

    rs::outcome<void> done;
    auto v = done.and_then([]() -> rs::outcome<void> { return rs::failure::make(rs::timeout_error{}); });
    CHECK(v.has_failure());
}

TEST_CASE("outcome: or_else recovers, transform_error replaces the failure", "[outcome]") {
    rs::outcome<int> bad{rs::failure::make(rs::circuit_open_error{"", 1s})};
    auto recovered = bad.or_else([](const rs::failure& f) -> rs::outcome<int> {
        if (f.code() == rs::errc::circuit_open)
            return -1;
        return f;
    });
    CHECK(recovered.value() == -1);
    rs::outcome<int> ok{3};
    CHECK(ok.or_else([](const rs::failure&) -> rs::outcome<int> { return -1; }).value() == 3);

    struct wrapped : std::runtime_error {
        using std::runtime_error::runtime_error;
    };
    auto renamed = bad.transform_error(
        [](const rs::failure& f) { return rs::failure::make(wrapped("backend: " + f.what())); });
    CHECK(renamed.failure().is<wrapped>());
    CHECK(renamed.failure().what() == std::string("backend: circuit open"));
    CHECK(ok.transform_error([](const rs::failure& f) { return f; }).value() == 3);

    rs::outcome<void> failed_void{rs::failure::make(rs::timeout_error{})};
    CHECK(std::move(failed_void).or_else([](rs::failure&&) { return rs::outcome<void>{}; }).has_value());
}

#if RESILIENCE_HAS_STD_EXPECTED
TEST_CASE("outcome: to_expected keeps the value or the exception", "[outcome]") {
    rs::outcome<int> ok{5};
    CHECK(ok.to_expected().value() == 5);
    rs::outcome<int> bad{rs::failure::make(rs::timeout_error{})};
    auto e = bad.to_expected();
    REQUIRE_FALSE(e.has_value());
    CHECK(e.error() == bad.failure().exception());
    CHECK(rs::outcome<void>{}.to_expected().has_value());
}
#endif

} // namespace test_outcome
