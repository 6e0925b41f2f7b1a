// SPDX-License-Identifier: MIT
// Results without exceptions: actions returning an expected-like value, classified by retry, circuit
// breaker, fallback and hedge from the value alone, with no exception thrown anywhere.
#include "alloc_counter.hpp"
#include "catch.hpp"
#include "support.hpp"
#include "throw_counter.hpp"

#include <resilience/circuit_breaker.hpp>
#include <resilience/classifier.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/fallback.hpp>
#include <resilience/hedge.hpp>
#include <resilience/outcome.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/retry.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <utility>
#include <vector>

#ifdef RESILIENCE_TESTS_COUNT_CATCHES
#include <dlfcn.h>

// Counting wrapper of the C++ runtime's __cxa_begin_catch (see throw_counter.hpp): forwards to the
// runtime's own, found with dlsym; every catch block in this binary binds to this definition.
extern "C" void* __cxa_begin_catch(void* exception) noexcept {
    using begin_fn = void* (*)(void*) noexcept;
    static const auto real = reinterpret_cast<begin_fn>(dlsym(RTLD_NEXT, "__cxa_begin_catch"));
    if (resilience_tests::catch_counter::enabled)
        ++resilience_tests::catch_counter::count;
    return real(exception);
}
#endif

namespace test_expected {

namespace rs = resilience;
using namespace std::chrono_literals;
using rs::testing::simulation;
using std::chrono::nanoseconds;

namespace {

enum class fault { busy, invalid, stopped };

struct error_info {
    fault kind = fault::busy;
    int call = 0;
    bool operator==(const error_info&) const = default;
};

/// An expected-like result of the test's own: neither `std::expected` nor `tl::expected`, only the
/// two members the library asks for, plus `value()`.
template <class T>
class result {
public:
    result(T v) : value_(std::move(v)) {}
    static result failed(error_info e) {
        result r;
        r.error_ = e;
        return r;
    }
    bool has_value() const noexcept { return value_.has_value(); }
    const T& value() const { return *value_; }
    const error_info& error() const { return error_; }

private:
    result() = default;
    std::optional<T> value_;
    error_info error_{};
};

// A type with has_value() and error() that is not a result: opted out.
struct not_a_result {
    bool has_value() const noexcept { return false; }
    int error() const { return 0; }
};

} // namespace

} // namespace test_expected

template <>
inline constexpr bool resilience::disable_expected_like<test_expected::not_a_result> = true;

namespace test_expected {

static_assert(rs::expected_like<result<int>>);
static_assert(rs::expected_like<const result<int>>);
static_assert(rs::expected_like<rs::outcome<int>>);
static_assert(!rs::expected_like<std::optional<int>>);
static_assert(!rs::expected_like<int>);
static_assert(!rs::expected_like<not_a_result>);

namespace {

/// A dependency that answers after `latency`: with an error value for its first `errors` calls (or
/// with `fault::stopped` when asked to stop), with its call number after that. It never throws.
/// Copies share the log, so a test hands a copy to `execute` and reads it after.
class service {
public:
    service(simulation& sim, int errors, nanoseconds latency = 10ms, fault kind = fault::busy)
        : state_(std::make_shared<state>(state{&sim, errors, latency, kind, {}})) {}

    rs::task<result<int>> operator()(resilience::stop_token token) const {
        auto s = state_;
        const int call = static_cast<int>(s->starts.size()) + 1;
        s->starts.push_back(s->sim->now());
        co_await s->sim->sleep_for(s->latency, token);
        if (token.stop_requested())
            co_return result<int>::failed({fault::stopped, call});
        if (call <= s->errors)
            co_return result<int>::failed({s->kind, call});
        co_return result<int>{call};
    }

    const std::vector<nanoseconds>& starts() const { return state_->starts; }
    int calls() const { return static_cast<int>(state_->starts.size()); }

private:
    struct state {
        simulation* sim;
        int errors;
        nanoseconds latency;
        fault kind;
        std::vector<nanoseconds> starts;
    };
    std::shared_ptr<state> state_;
};

const rs::constant_backoff exact_100ms{100ms, rs::jitter::none};

} // namespace

TEST_CASE("expected: a retry retries a value holding an error, at the backoff's exact instants",
          "[expected][retry]") {
    simulation sim;
    service svc{sim, 2};
    rs::retry r{{.max_attempts = 4, .backoff = exact_100ms}, sim.clock()};
    const result<int> v = sim.run(r.execute(svc));
    REQUIRE(v.has_value());
    CHECK(v.value() == 3);
    CHECK(svc.starts() == std::vector<nanoseconds>{0ms, 110ms, 220ms});
    CHECK(sim.now() == 230ms);
}

TEST_CASE("expected: a retry that gives up returns the last error value unchanged", "[expected][retry]") {
    simulation sim;
    service svc{sim, 100};
    std::vector<int> told; // on_retry sees the value, and no failure
    rs::retry r{{.max_attempts = 3,
                 .backoff = exact_100ms,
                 .on_retry =
                     [&told](const rs::retry_event& e) {
                         CHECK(e.error() == nullptr);
                         REQUIRE(e.value<result<int>>());
                         told.push_back(e.value<result<int>>()->error().call);
                     }},
                sim.clock()};
    const rs::outcome<result<int>> o = sim.run(r.execute_outcome(svc));
    REQUIRE(o.has_value()); // the call returned a value: the error travels inside it
    REQUIRE_FALSE(o->has_value());
    CHECK(o->error() == error_info{fault::busy, 3});
    CHECK(told == std::vector<int>{1, 2});
    CHECK(svc.calls() == 3);
    CHECK(sim.now() == 230ms);
}

TEST_CASE("expected: an outcome classifier decides on the error's content", "[expected][retry]") {
    simulation sim;
    service svc{sim, 100, 10ms, fault::invalid};
    rs::retry r{{.max_attempts = 5,
                 .backoff = exact_100ms,
                 .should_handle =
                     [](const rs::outcome<result<int>>& o) {
                         return !o || (!o->has_value() && o->error().kind == fault::busy);
                     }},
                sim.clock()};
    const result<int> v = sim.run(r.execute(svc));
    CHECK(v.error() == error_info{fault::invalid, 1}); // invalid is not worth a second attempt
    CHECK(svc.calls() == 1);
}

TEST_CASE("expected: a failure classifier judges thrown failures, and error values stay handled",
          "[expected][retry]") {
    simulation sim;
    service svc{sim, 1};
    int asked = 0;
    rs::retry r{{.max_attempts = 3,
                 .backoff = exact_100ms,
                 .should_handle =
                     [&asked](const rs::failure&) {
                         ++asked;
                         return false;
                     }},
                sim.clock()};
    CHECK(sim.run(r.execute(svc)).value() == 2);
    CHECK(asked == 0); // no failure was thrown, so it was never asked
}

TEST_CASE("expected: an rs::outcome returned as a value has its failure judged as a failure",
          "[expected][retry]") {
    simulation sim;
    int calls = 0;
    auto fails_with = [&calls](bool deterministic) {
        return [&calls, deterministic]() -> rs::task<rs::outcome<int>> {
            ++calls;
            if (deterministic)
                co_return rs::failure::make(std::invalid_argument("bad input"));
            co_return rs::failure::make(std::runtime_error("down"));
        };
    };
    rs::retry r{{.max_attempts = 3, .backoff = exact_100ms}, sim.clock()};
    // std::invalid_argument is a logic_error: is_transient says no, as it would for a thrown one.
    const rs::outcome<int> once = sim.run(r.execute(fails_with(true)));
    CHECK(once.error().is<std::invalid_argument>());
    CHECK(calls == 1);
    calls = 0;
    const rs::outcome<int> thrice = sim.run(r.execute(fails_with(false)));
    CHECK(thrice.error().is<std::runtime_error>());
    CHECK(calls == 3);
}

TEST_CASE("expected: a type opted out with disable_expected_like is a plain value", "[expected][retry]") {
    simulation sim;
    int calls = 0;
    auto act = [&calls]() -> rs::task<not_a_result> {
        ++calls;
        co_return not_a_result{};
    };
    rs::retry r{{.max_attempts = 3, .backoff = exact_100ms}, sim.clock()};
    (void)sim.run(r.execute(act));
    CHECK(calls == 1);
}

TEST_CASE("expected: a circuit breaker counts error values as failures and returns them",
          "[expected][circuit_breaker]") {
    simulation sim;
    service svc{sim, 2};
    rs::circuit_breaker breaker{{.failure_threshold = 2, .break_duration = 5s}, sim.clock()};
    const auto first = sim.run(breaker.execute_outcome(svc));
    REQUIRE(first.has_value());
    CHECK(first->error() == error_info{fault::busy, 1});
    CHECK(breaker.metrics().consecutive_failures == 1);
    CHECK(breaker.state() == rs::circuit_state::closed);
    (void)sim.run(breaker.execute_outcome(svc));
    CHECK(breaker.state() == rs::circuit_state::open);
    const auto refused = sim.run(breaker.execute_outcome(svc));
    REQUIRE(refused.has_failure());
    CHECK(refused.error().code() == rs::errc::circuit_open);
    CHECK(svc.calls() == 2);

    // After the break a probe that returns a value without an error closes it.
    sim.run_for(5s);
    const auto probe = sim.run(breaker.execute_outcome(svc));
    REQUIRE(probe.has_value());
    CHECK(probe->value() == 3);
    CHECK(breaker.state() == rs::circuit_state::closed);
    CHECK(breaker.metrics().consecutive_failures == 0);
}

TEST_CASE("expected: a fallback substitutes an error value, and passes a good one through",
          "[expected][fallback]") {
    simulation sim;
    service svc{sim, 1};
    rs::fallback fb{-1}; // an int, converted to result<int>
    CHECK(sim.run(fb.execute(svc)).value() == -1);
    CHECK(sim.run(fb.execute(svc)).value() == 2);

    // A substitute taking the outcome sees the error it replaces.
    service again{sim, 1};
    rs::fallback seen{[](const rs::outcome<result<int>>& o) { return result<int>{100 * o->error().call}; }};
    CHECK(sim.run(seen.execute(again)).value() == 100);
}

TEST_CASE("expected: a fallback with a failure predicate still substitutes error values",
          "[expected][fallback]") {
    simulation sim;
    service svc{sim, 1};
    int asked = 0;
    rs::fallback fb{-1, {.should_handle = [&asked](const rs::failure&) {
                        ++asked;
                        return true;
                    }}};
    CHECK(sim.run(fb.execute(svc)).value() == -1);
    CHECK(asked == 0);
}

TEST_CASE("expected: an error value brings the hedge's next attempt forward", "[expected][hedge]") {
    simulation sim;
    service svc{sim, 2};
    rs::hedge h{{.max_attempts = 3, .delay = 1s}, sim.clock()};
    const result<int> v = sim.run(h.execute(svc));
    REQUIRE(v.has_value());
    CHECK(v.value() == 3);
    CHECK(svc.starts() == std::vector<nanoseconds>{0ms, 10ms, 20ms});
    CHECK(sim.now() == 30ms);
}

TEST_CASE("expected: a hedge whose attempts all return errors returns the last error value",
          "[expected][hedge]") {
    simulation sim;
    service svc{sim, 100};
    rs::hedge h{{.max_attempts = 3, .delay = 1s}, sim.clock()};
    const result<int> v = sim.run(h.execute(svc));
    CHECK(v.error() == error_info{fault::busy, 3});
    CHECK(sim.now() == 30ms);
}

#if RESILIENCE_HAS_STD_EXPECTED
TEST_CASE("expected: std::expected is classified by retry, breaker, fallback and hedge", "[expected]") {
    simulation sim;
    int calls = 0;
    auto busy = [&calls]() -> rs::task<std::expected<int, std::errc>> {
        ++calls;
        co_return std::unexpected(std::errc::resource_unavailable_try_again);
    };
    static_assert(rs::expected_like<std::expected<int, std::errc>>);
    static_assert(rs::expected_like<std::expected<void, std::errc>>);
    rs::circuit_breaker breaker{{.failure_threshold = 10}, sim.clock()};
    const rs::pipeline p{rs::retry{{.max_attempts = 3, .backoff = exact_100ms}, sim.clock()}, breaker,
                         rs::hedge{{.max_attempts = 2, .delay = 1s}, sim.clock()}};
    const std::expected<int, std::errc> given_up = sim.run(p.execute(busy));
    CHECK(given_up.error() == std::errc::resource_unavailable_try_again);
    CHECK(calls == 6);
    CHECK(breaker.metrics().consecutive_failures == 3);
    CHECK(sim.run(rs::fallback{7}.execute(busy)).value() == 7);
}
#endif

#ifdef RESILIENCE_TESTS_COUNT_CATCHES
TEST_CASE("expected: an error path through fallback, retry, breaker and hedge throws no exception",
          "[expected][pipeline]") {
    simulation sim;
    service svc{sim, 100};
    rs::circuit_breaker breaker{{.failure_threshold = 100}, sim.clock()};
    const rs::retry retry{{.max_attempts = 3, .backoff = exact_100ms}, sim.clock()};
    const rs::hedge hedge{{.max_attempts = 2, .delay = 1s}, sim.clock()};
    const rs::pipeline bare{retry, breaker, hedge};
    const rs::pipeline answered{rs::fallback{-1}, retry, breaker, hedge};

    resilience_tests::counting_catches counting;
    // Each retry attempt is two hedged attempts, both errors: calls at 0 and 10ms, 120 and 130ms,
    // 240 and 250ms.
    const result<int> given_up = sim.run(bare.execute(svc));
    CHECK(counting.count() == 0);
    CHECK(given_up.error() == error_info{fault::busy, 6});
    CHECK(svc.starts() == std::vector<nanoseconds>{0ms, 10ms, 120ms, 130ms, 240ms, 250ms});
    CHECK(breaker.metrics().consecutive_failures == 3);

    const result<int> substituted = sim.run(answered.execute(svc));
    CHECK(counting.count() == 0);
    CHECK(substituted.value() == -1);
    CHECK(svc.calls() == 12);
}

TEST_CASE("expected: the catch counter sees a thrown and caught exception", "[expected]") {
    resilience_tests::counting_catches counting;
    try {
        throw std::runtime_error("counted");
    } catch (const std::exception&) {
    }
    CHECK(counting.count() == 1);
}
#endif

#ifdef RESILIENCE_TESTS_COUNT_ALLOCATIONS
TEST_CASE("expected: the success path of an expected-like result allocates nothing after warm-up",
          "[expected][alloc]") {
    rs::event_loop loop;
    const rs::pipeline p{rs::retry{{.max_attempts = 3}}, rs::circuit_breaker{{.failure_threshold = 5}},
                         rs::fallback{-1}};
    std::size_t allocations = 0;
    auto ok = []() -> rs::task<result<int>> { co_return result<int>{1}; };
    loop.run([&]() -> rs::task<void> {
        for (int i = 0; i < 50; ++i)
            (void)co_await p.execute(ok); // warm the frame cache
        resilience_tests::counting_allocations counting;
        int sum = 0;
        for (int i = 0; i < 1000; ++i)
            sum += (co_await p.execute(ok)).value();
        allocations = counting.count();
        CHECK(sum == 1000);
    }());
    CHECK(allocations == 0);
}
#endif

} // namespace test_expected
