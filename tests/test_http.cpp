// SPDX-License-Identifier: MIT
#include "catch.hpp"
#include "support.hpp"

#include <resilience/circuit_breaker.hpp>
#include <resilience/classifier.hpp>
#include <resilience/hedge.hpp>
#include <resilience/http.hpp>
#include <resilience/resilience.hpp>
#include <resilience/retry.hpp>
#include <resilience/testing/simulation.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace test_http {

namespace rs = resilience;
namespace http = resilience::http;
using namespace std::chrono_literals;
using namespace std::string_view_literals;
using rs::testing::simulation;
using std::chrono::nanoseconds;
using std::chrono::seconds;
using std::chrono::sys_days;
using std::chrono::sys_seconds;
using std::chrono::system_clock;

namespace {

// The standard library's calendar is the oracle for the parser's own day arithmetic.
constexpr sys_seconds utc(int y, unsigned m, unsigned d, int hh = 0, int mm = 0, int ss = 0) {
    return sys_seconds{sys_days{std::chrono::year{y} / std::chrono::month{m} / std::chrono::day{d}}} +
           std::chrono::hours{hh} + std::chrono::minutes{mm} + seconds{ss};
}

// 2025-06-15 12:00:00 UTC, a Sunday: "now" for the parser tables.
constexpr system_clock::time_point now_2025 = utc(2025, 6, 15, 12);

} // namespace

// ---------------------------------------------------------------------------------------------------------
// Statuses

TEST_CASE("http: transient statuses are 408, 429 and 5xx, not 409 or 422", "[http]") {
    for (int s : {408, 429, 500, 501, 502, 503, 504, 599})
        CHECK(http::is_transient_status(s));
    for (int s : {0, -1, 100, 200, 204, 301, 400, 401, 403, 404, 409, 410, 422, 425, 499, 600, 999})
        CHECK_FALSE(http::is_transient_status(s));
    STATIC_REQUIRE(http::is_transient_status(503));
}

// ---------------------------------------------------------------------------------------------------------
// HTTP-dates

TEST_CASE("http: parse_http_date reads the three forms to the same instant", "[http][parse]") {
    const sys_seconds expected = utc(1994, 11, 6, 8, 49, 37);
    const char* forms[] = {
        "Sun, 06 Nov 1994 08:49:37 GMT",  // IMF-fixdate
        "Sunday, 06-Nov-94 08:49:37 GMT", // RFC 850
        "Sun Nov  6 08:49:37 1994",       // asctime, day padded with a space
        "Sun Nov 06 08:49:37 1994",       // asctime, day padded with a zero
        " \tSun, 06 Nov 1994 08:49:37 GMT\t ",
    };
    for (const char* text : forms) {
        INFO(text);
        const auto t = http::parse_http_date(text, now_2025);
        REQUIRE(t);
        CHECK(*t == expected);
    }
    STATIC_REQUIRE(*http::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT", now_2025) ==
                   utc(1994, 11, 6, 8, 49, 37));
}

TEST_CASE("http: parse_http_date knows leap years and the days of each month", "[http][parse]") {
    struct row {
        const char* text;
        std::optional<sys_seconds> expected;
    };
    const row rows[] = {
        {"Thu, 29 Feb 2024 23:59:59 GMT", utc(2024, 2, 29, 23, 59, 59)},
        {"Tue, 29 Feb 2000 00:00:00 GMT", utc(2000, 2, 29)}, // divisible by 400: leap
        {"Thu Feb 29 10:00:00 2024", utc(2024, 2, 29, 10)},
        {"Thursday, 29-Feb-24 10:00:00 GMT", utc(2024, 2, 29, 10)},
        {"Thu, 01 Jan 1970 00:00:00 GMT", utc(1970, 1, 1)},
        {"Wed, 31 Dec 1969 23:59:59 GMT", utc(1969, 12, 31, 23, 59, 59)},
        {"Sat, 01 Jan 0000 00:00:00 GMT", utc(0, 1, 1)},
        {"Fri, 31 Dec 9999 23:59:59 GMT", utc(9999, 12, 31, 23, 59, 59)},
        {"Sun, 31 Aug 2025 00:00:00 GMT", utc(2025, 8, 31)},
        {"Wed, 31 Dec 2025 23:59:60 GMT", utc(2026, 1, 1)}, // a leap second: the next second
        {"Wed, 29 Feb 2023 00:00:00 GMT", std::nullopt},    // 2023 is a common year
        {"Thu, 29 Feb 1900 00:00:00 GMT", std::nullopt},    // divisible by 100, not 400: common
        {"Wed, 29-Feb-23 00:00:00 GMT", std::nullopt},
        {"Wed Feb 29 00:00:00 2023", std::nullopt},
        {"Wed, 30 Apr 2025 00:00:00 GMT", utc(2025, 4, 30)},
        {"Thu, 31 Apr 2025 00:00:00 GMT", std::nullopt},
        {"Sun, 00 Nov 1994 08:49:37 GMT", std::nullopt},
        {"Sun, 32 Dec 1994 08:49:37 GMT", std::nullopt},
    };
    for (const row& r : rows) {
        INFO(r.text);
        CHECK(http::parse_http_date(r.text, now_2025) == r.expected);
    }
}

TEST_CASE("http: parse_http_date refuses anything off the grammar", "[http][parse]") {
    const std::string_view bad[] = {
        "",
        "   ",
        "Sun, 06 Nov 1994 24:00:00 GMT", // hour past 23
        "Sun, 06 Nov 1994 08:60:37 GMT", // minute past 59
        "Sun, 06 Nov 1994 08:49:61 GMT", // second past 60
        "Sun, 06 Nov 1994 8:49:37 GMT",
        "Sun, 06 nov 1994 08:49:37 GMT", // names are case-sensitive
        "sun, 06 Nov 1994 08:49:37 GMT",
        "SUN, 06 NOV 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:37 gmt",
        "Sun, 06 Nov 1994 08:49:37 UTC",
        "Sun, 06 Nov 1994 08:49:37 +0000",
        "Sun, 06 Nov 1994 08:49:37",
        "Sun, 6 Nov 1994 08:49:37 GMT", // IMF-fixdate: two-digit day
        "Sun, 06 Nov 94 08:49:37 GMT",  // IMF-fixdate: four-digit year
        "Sun, 06 Nov 01994 08:49:37 GMT",
        "Sun,  06 Nov 1994 08:49:37 GMT",
        "Sun 06 Nov 1994 08:49:37 GMT",
        "Sunday, 06 Nov 1994 08:49:37 GMT", // a long name belongs to RFC 850
        "Sun, 06-Nov-94 08:49:37 GMT",      // and a short one does not
        "Sunday, 06-Nov-1994 08:49:37 GMT",
        "Sunday, 6-Nov-94 08:49:37 GMT",
        "Sun Nov 6 08:49:37 1994", // asctime: the day is two wide
        "Sun Nov  6 08:49:37 94",
        "Sun Nov  6 08:49:37 1994 GMT",
        "Sunday Nov  6 08:49:37 1994",
        "Fun, 06 Nov 1994 08:49:37 GMT", // no such day
        "Funday, 06-Nov-94 08:49:37 GMT",
        "Sun, 06 Nox 1994 08:49:37 GMT", // no such month
        "Sun, 06 Nov 1994 08:49:37 GMT extra",
        "Sun, 06 Nov 1994 08:49:37 GMT,",
        "Sun, 06 Nov 1994 08:49:37 GMT\r\n",
        "Sun, 06 Nov 1994 08:49:37 GM",
        "Sun, 06 Nov 1994 08:49",
        "Sun, 06 Nov 1994 08:49:37 G\0T"sv, // a NUL inside the view
        "120",
    };
    for (const std::string_view text : bad) {
        INFO('"' << std::string(text) << '"');
        CHECK_FALSE(http::parse_http_date(text, now_2025));
    }
}

TEST_CASE("http: a weekday that does not match the date is ignored", "[http][parse]") {
    // 1994-11-06 was a Sunday. The name must be a day's name, but not the right one.
    CHECK(http::parse_http_date("Mon, 06 Nov 1994 08:49:37 GMT", now_2025) == utc(1994, 11, 6, 8, 49, 37));
    CHECK(http::parse_http_date("Friday, 06-Nov-94 08:49:37 GMT", now_2025) == utc(1994, 11, 6, 8, 49, 37));
    CHECK(http::parse_http_date("Wed Nov  6 08:49:37 1994", now_2025) == utc(1994, 11, 6, 8, 49, 37));
}

TEST_CASE("http: an RFC 850 year is at most 50 years ahead, else the latest past year with its digits",
          "[http][parse]") {
    struct row {
        int now_year;
        const char* two_digits;
        int year;
    };
    const row rows[] = {
        {2025, "25", 2025}, {2025, "00", 2000}, {2025, "75", 2075}, // exactly 50 years ahead: kept
        {2025, "76", 1976},                                         // 51 ahead: the past year instead
        {2025, "99", 1999}, {2025, "94", 1994}, {2099, "49", 2149}, {2099, "50", 2050},
        {2090, "10", 2110}, {1999, "49", 2049}, {1999, "50", 1950}, {2000, "50", 2050},
    };
    for (const row& r : rows) {
        const std::string text = std::string("Monday, 01-Jan-") + r.two_digits + " 00:00:00 GMT";
        INFO(text << " seen in " << r.now_year);
        const system_clock::time_point now = utc(r.now_year, 7, 1);
        CHECK(http::parse_http_date(text, now) == utc(r.year, 1, 1));
    }
}

// ---------------------------------------------------------------------------------------------------------
// Retry-After

TEST_CASE("http: parse_retry_after reads delay-seconds and nothing near it", "[http][parse]") {
    struct row {
        std::string_view text;
        std::optional<seconds> expected;
    };
    const row rows[] = {
        {"120", 120s},
        {"0", 0s},
        {"007", 7s},
        {" 120 ", 120s},
        {"\t5\t", 5s},
        {"9223372036", http::max_retry_after}, // the longest wait a nanosecond delay holds
        {"00000000000000000000009223372036", http::max_retry_after},
        {"9223372037", std::nullopt},           // out of range
        {"18446744073709551617", std::nullopt}, // would wrap to 1 in 64 bits
        {"99999999999999999999999999999999999999", std::nullopt},
        {"+120", std::nullopt},
        {"-1", std::nullopt},
        {"-0", std::nullopt},
        {"1.5", std::nullopt},
        {"120s", std::nullopt},
        {"1 20", std::nullopt},
        {"1,2", std::nullopt},
        {"0x10", std::nullopt},
        {"", std::nullopt},
        {" ", std::nullopt},
        {"soon", std::nullopt},
        {"\xd9\xa1\xd9\xa2", std::nullopt}, // Arabic-Indic digits are not ASCII digits
    };
    for (const row& r : rows) {
        INFO('"' << std::string(r.text) << '"');
        CHECK(http::parse_retry_after(r.text, now_2025) == r.expected);
    }
    STATIC_REQUIRE(http::parse_retry_after("120", now_2025) == 120s);
    STATIC_REQUIRE(http::max_retry_after == seconds{9'223'372'036});
}

TEST_CASE("http: a Retry-After date is the wait from now, rounded up, and zero once past", "[http][parse]") {
    // now_2025 is Sun, 15 Jun 2025 12:00:00 GMT.
    CHECK(http::parse_retry_after("Sun, 15 Jun 2025 12:01:30 GMT", now_2025) == 90s);
    CHECK(http::parse_retry_after("Sunday, 15-Jun-25 12:01:30 GMT", now_2025) == 90s);
    CHECK(http::parse_retry_after("Sun Jun 15 12:01:30 2025", now_2025) == 90s);
    CHECK(http::parse_retry_after("Mon, 16 Jun 2025 12:00:00 GMT", now_2025) == 86'400s);
    CHECK(http::parse_retry_after("Sun, 15 Jun 2025 12:00:00 GMT", now_2025) == 0s);
    CHECK(http::parse_retry_after("Sun, 15 Jun 2025 11:59:59 GMT", now_2025) == 0s);
    CHECK(http::parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now_2025) == 0s);
    // Between whole seconds: 9.75 s and 9.000000001 s both wait 10 s; a date one second ahead of a
    // now just short of it waits one second.
    CHECK(http::parse_retry_after("Sun, 15 Jun 2025 12:00:10 GMT", now_2025 + 250ms) == 10s);
    // (system_clock counts microseconds in libc++: the cast keeps what it can of the nanoseconds)
    CHECK(http::parse_retry_after("Sun, 15 Jun 2025 12:00:10 GMT",
                                  std::chrono::time_point_cast<std::chrono::system_clock::duration>(
                                      now_2025 + 999'999'999ns)) == 10s);
    CHECK(http::parse_retry_after("Sun, 15 Jun 2025 12:00:10 GMT", now_2025 + 1s) == 9s);
    // A date too far ahead is out of range: no hint rather than a wrapped one.
    CHECK_FALSE(http::parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now_2025));
    CHECK_FALSE(http::parse_retry_after("Sun, 29 Feb 2025 12:00:00 GMT", now_2025));
    // A now before 1970 works too.
    CHECK(http::parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", system_clock::time_point{-90s}) == 90s);
}

TEST_CASE(
    "http: a Retry-After date at most max_retry_after ahead is that wait, one a second further gives no "
    "hint",
    "[http][parse][regression]") {
    // now_2025 plus 9223372036 s (max_retry_after, about 292 years) is Tue, 25 Sep 2317 11:47:16 GMT.
    CHECK(http::parse_retry_after("Tue, 25 Sep 2317 11:47:16 GMT", now_2025) == http::max_retry_after);
    CHECK(http::parse_retry_after("Tue Sep 25 11:47:16 2317", now_2025) == http::max_retry_after);
    CHECK(http::parse_retry_after("Tue, 25 Sep 2317 11:47:16 GMT", now_2025 + 999ms) ==
          http::max_retry_after);
    CHECK_FALSE(http::parse_retry_after("Tue, 25 Sep 2317 11:47:17 GMT", now_2025));
    CHECK_FALSE(http::parse_retry_after("Tue Sep 25 11:47:17 2317", now_2025));
    CHECK_FALSE(http::parse_retry_after("Sat, 15 Jun 2318 12:00:00 GMT", now_2025)); // 293 years
    CHECK_FALSE(http::parse_retry_after("Fri, 15 Jun 2525 12:00:00 GMT", now_2025)); // 500 years
    // Seen a second later, the first is within reach again.
    CHECK(http::parse_retry_after("Tue, 25 Sep 2317 11:47:17 GMT", now_2025 + 1s) == http::max_retry_after);
}

// ---------------------------------------------------------------------------------------------------------
// The classifier

namespace {

// A response the primary response_traits reads: `status` and `retry_after` fields.
struct reply {
    int status = 200;
    std::optional<std::string> retry_after{};
};

// A response read through a specialization.
class legacy_reply {
public:
    legacy_reply(int code, const char* retry_after) : code_(code), retry_after_(retry_after) {}
    int code() const { return code_; }
    const char* header(std::string_view name) const { return name == "Retry-After" ? retry_after_ : nullptr; }

private:
    int code_;
    const char* retry_after_;
};

// An expected-like result of a reply: a transport error or a reply.
struct transport_error {
    int code = 0;
};
class fetched {
public:
    fetched(reply r) : reply_(std::move(r)) {}
    fetched(transport_error e) : error_(e) {}
    bool has_value() const noexcept { return reply_.has_value(); }
    const reply& value() const { return *reply_; }
    const transport_error& error() const { return error_; }

private:
    std::optional<reply> reply_;
    transport_error error_{};
};

// The wall clock of a simulation: `base` at virtual time zero, moving with virtual time. Counts its
// readings.
struct sim_wall_clock {
    simulation* sim;
    system_clock::time_point base = now_2025;
    std::shared_ptr<int> reads = std::make_shared<int>(0);
    system_clock::time_point now() const {
        ++*reads;
        return base + std::chrono::duration_cast<system_clock::duration>(sim->now());
    }
};

// A dependency answering with `replies` in turn (the last one from then on), each after `latency`.
template <class R>
class upstream {
public:
    upstream(simulation& sim, std::vector<R> replies, nanoseconds latency = 10ms)
        : state_(std::make_shared<state>(state{&sim, std::move(replies), latency, {}})) {}

    rs::task<R> operator()() const {
        auto s = state_;
        const std::size_t call = s->starts.size();
        s->starts.push_back(s->sim->now());
        co_await s->sim->sleep_for(s->latency);
        co_return s->replies[std::min(call, s->replies.size() - 1)];
    }
    const std::vector<nanoseconds>& starts() const { return state_->starts; }
    int calls() const { return static_cast<int>(state_->starts.size()); }

private:
    struct state {
        simulation* sim;
        std::vector<R> replies;
        nanoseconds latency;
        std::vector<nanoseconds> starts;
    };
    std::shared_ptr<state> state_;
};

const rs::constant_backoff exact_100ms{100ms, rs::jitter::none};

} // namespace

} // namespace test_http

template <>
struct resilience::http::response_traits<test_http::legacy_reply> {
    static int status(const test_http::legacy_reply& r) { return r.code(); }
    static const char* retry_after(const test_http::legacy_reply& r) { return r.header("Retry-After"); }
};

namespace test_http {

static_assert(http::response<reply>);
static_assert(http::response<legacy_reply>);
static_assert(!http::response<int>);
static_assert(!http::response<fetched>); // a result of a response, not a response
static_assert(std::is_same_v<http::response_classifier<fetched>::response_type, reply>);

TEST_CASE("http: the classifier's verdicts on statuses and Retry-After", "[http][classifier]") {
    const http::response_classifier<reply> c;
    CHECK_FALSE(c(rs::outcome<reply>{reply{200}}).handle);
    CHECK_FALSE(c(rs::outcome<reply>{reply{409, "5"}}).handle);
    CHECK_FALSE(c(rs::outcome<reply>{reply{422}}).handle);
    const rs::verdict plain = c(rs::outcome<reply>{reply{503}});
    CHECK(plain.handle);
    CHECK_FALSE(plain.delay);
    const rs::verdict hinted = c(rs::outcome<reply>{reply{429, "7"}});
    CHECK(hinted.handle);
    CHECK(hinted.delay == nanoseconds{7s});
    const rs::verdict malformed = c(rs::outcome<reply>{reply{503, "-7"}});
    CHECK(malformed.handle);
    CHECK_FALSE(malformed.delay);
    // Failures are judged by rs::is_transient.
    CHECK(c(rs::outcome<reply>{rs::failure::make(std::runtime_error("reset"))}).handle);
    CHECK_FALSE(c(rs::outcome<reply>{rs::failure::make(std::invalid_argument("bad url"))}).handle);
    CHECK_FALSE(c(rs::outcome<reply>{rs::failure::make(rs::cancelled_error{})}).handle);

    const http::response_classifier<legacy_reply> legacy;
    CHECK(legacy(rs::outcome<legacy_reply>{legacy_reply{502, "3"}}).delay == nanoseconds{3s});
    CHECK_FALSE(legacy(rs::outcome<legacy_reply>{legacy_reply{502, nullptr}}).delay);
    CHECK_FALSE(legacy(rs::outcome<legacy_reply>{legacy_reply{404, "3"}}).handle);
}

TEST_CASE("http: the wall clock is read only for a Retry-After that is a date", "[http][classifier]") {
    simulation sim;
    sim_wall_clock wall{&sim};
    const http::response_classifier<reply, sim_wall_clock> c{{}, wall};
    (void)c(rs::outcome<reply>{reply{200}});
    (void)c(rs::outcome<reply>{reply{503}});
    (void)c(rs::outcome<reply>{reply{503, "120"}});
    (void)c(rs::outcome<reply>{reply{404, "Sun, 15 Jun 2025 12:01:30 GMT"}});
    CHECK(*wall.reads == 0);
    CHECK(c(rs::outcome<reply>{reply{503, "Sun, 15 Jun 2025 12:01:30 GMT"}}).delay == nanoseconds{90s});
    CHECK(*wall.reads == 1);
}

TEST_CASE("http: a retry waits what Retry-After asks, in seconds or until a date, else its backoff",
          "[http][classifier][retry]") {
    simulation sim;
    // Sun, 15 Jun 2025 12:00:00 GMT is virtual time zero on the wall clock.
    upstream<reply> up{
        sim, {reply{503, "2"}, reply{429, "Sun, 15 Jun 2025 12:00:10 GMT"}, reply{503}, reply{200}}};
    rs::retry r{{.max_attempts = 5,
                 .backoff = exact_100ms,
                 .should_handle = http::response_classifier<reply, sim_wall_clock>{{}, sim_wall_clock{&sim}}},
                sim.clock()};
    const reply answer = sim.run(r.execute(up));
    CHECK(answer.status == 200);
    // 503 at 10ms asks 2 s; 429 at 2.020 s asks until 10 s on the wall clock: 7.98 s, rounded up to
    // 8 s; 503 at 10.030 s asks nothing: the backoff's 100ms.
    CHECK(up.starts() == std::vector<nanoseconds>{0ms, 2010ms, 10020ms, 10130ms});
    CHECK(sim.now() == 10140ms);
}

TEST_CASE("http: Retry-After is capped by the retry's max_delay", "[http][classifier][retry]") {
    simulation sim;
    upstream<reply> up{sim, {reply{503, "3600"}, reply{200}}};
    rs::retry r{{.max_attempts = 3,
                 .backoff = exact_100ms,
                 .max_delay = 5s,
                 .should_handle = http::response_classifier<reply>{}},
                sim.clock()};
    CHECK(sim.run(r.execute(up)).status == 200);
    CHECK(up.starts() == std::vector<nanoseconds>{0ms, 5010ms});
}

TEST_CASE("http: told to ignore Retry-After, the classifier leaves the wait to the backoff",
          "[http][classifier][retry]") {
    simulation sim;
    upstream<reply> up{sim, {reply{503, "60"}, reply{200}}};
    rs::retry r{{.max_attempts = 3,
                 .backoff = exact_100ms,
                 .should_handle = http::response_classifier<reply>{{.use_retry_after = false}}},
                sim.clock()};
    CHECK(sim.run(r.execute(up)).status == 200);
    CHECK(up.starts() == std::vector<nanoseconds>{0ms, 110ms});
}

TEST_CASE("http: an answer that is not transient is returned at once, and the last transient one when "
          "attempts run out",
          "[http][classifier][retry]") {
    simulation sim;
    upstream<reply> conflict{sim, {reply{409}, reply{200}}};
    rs::retry r{
        {.max_attempts = 3, .backoff = exact_100ms, .should_handle = http::response_classifier<reply>{}},
        sim.clock()};
    CHECK(sim.run(r.execute(conflict)).status == 409);
    CHECK(conflict.calls() == 1);

    upstream<reply> down{sim, {reply{502}, reply{503}, reply{504}, reply{200}}};
    CHECK(sim.run(r.execute(down)).status == 504);
    CHECK(down.calls() == 3);
}

TEST_CASE("http: the statuses can be widened or narrowed", "[http][classifier][retry]") {
    simulation sim;
    const http::response_classifier<reply> wider{
        {.transient_status = [](int s) { return http::is_transient_status(s) || s == 409; }}};
    const http::response_classifier<reply> narrower{
        {.transient_status = [](int s) { return http::is_transient_status(s) && s != 501; }}};

    upstream<reply> conflict{sim, {reply{409}, reply{200}}};
    rs::retry widened{{.max_attempts = 3, .backoff = exact_100ms, .should_handle = wider}, sim.clock()};
    CHECK(sim.run(widened.execute(conflict)).status == 200);
    CHECK(conflict.calls() == 2);

    upstream<reply> unimplemented{sim, {reply{501}, reply{200}}};
    rs::retry narrowed{{.max_attempts = 3, .backoff = exact_100ms, .should_handle = narrower}, sim.clock()};
    CHECK(sim.run(narrowed.execute(unimplemented)).status == 501);
    CHECK(unimplemented.calls() == 1);
}

TEST_CASE("http: a result holding a transport error or a reply is classified without exceptions",
          "[http][classifier][retry]") {
    simulation sim;
    upstream<fetched> up{sim, {fetched{transport_error{104}}, fetched{reply{503, "1"}}, fetched{reply{200}}}};
    rs::retry r{
        {.max_attempts = 4, .backoff = exact_100ms, .should_handle = http::response_classifier<fetched>{}},
        sim.clock()};
    const fetched answer = sim.run(r.execute(up));
    REQUIRE(answer.has_value());
    CHECK(answer.value().status == 200);
    // The transport error waits the backoff, the 503 its Retry-After.
    CHECK(up.starts() == std::vector<nanoseconds>{0ms, 110ms, 1120ms});

    upstream<fetched> gone{sim, {fetched{transport_error{111}}}};
    const fetched last = sim.run(r.execute(gone));
    REQUIRE_FALSE(last.has_value());
    CHECK(last.error().code == 111);
    CHECK(gone.calls() == 4);
}

TEST_CASE("http: one classifier serves a breaker and a hedge too", "[http][classifier]") {
    simulation sim;
    const rs::classifier c = http::response_classifier<reply>{};

    rs::circuit_breaker breaker{{.failure_threshold = 2, .should_handle = c}, sim.clock()};
    upstream<reply> failing{sim, {reply{503}, reply{200}, reply{500}, reply{502}}};
    (void)sim.run(breaker.execute(failing));
    CHECK(breaker.metrics().consecutive_failures == 1);
    (void)sim.run(breaker.execute(failing)); // a 200 ends the run
    CHECK(breaker.metrics().consecutive_failures == 0);
    (void)sim.run(breaker.execute(failing));
    const rs::outcome<reply> opened = sim.run(breaker.execute_outcome(failing));
    REQUIRE(opened.has_value()); // the 502 itself is still returned
    CHECK(opened->status == 502);
    CHECK(breaker.state() == rs::circuit_state::open);

    upstream<reply> replicas{sim, {reply{503, "100"}, reply{200}}};
    rs::hedge h{{.max_attempts = 2, .delay = 1s, .should_handle = c}, sim.clock()};
    const nanoseconds start = sim.now();
    CHECK(sim.run(h.execute(replicas)).status == 200);
    CHECK(sim.now() - start ==
          20ms); // the 503 brought the second attempt forward; its Retry-After is for a retry
}

#if RESILIENCE_HAS_STD_EXPECTED
TEST_CASE("http: a std::expected of a reply is classified like the result type of the test's own",
          "[http][classifier]") {
    using fetch_result = std::expected<reply, std::error_code>;
    const http::response_classifier<fetch_result> c;
    CHECK(c(rs::outcome<fetch_result>{
                fetch_result{std::unexpect, std::make_error_code(std::errc::connection_reset)}})
              .handle);
    CHECK(c(rs::outcome<fetch_result>{fetch_result{reply{503, "4"}}}).delay == nanoseconds{4s});
    CHECK_FALSE(c(rs::outcome<fetch_result>{fetch_result{reply{200}}}).handle);
}
#endif

// ---------------------------------------------------------------------------------------------------------
// Cache-Control max-age

static_assert(http::parse_max_age("max-age=3") == std::optional<seconds>{3s}); // usable at compile time

TEST_CASE("http: parse_max_age reads the max-age directive among the others, and nothing near it",
          "[http][parse][cache]") {
    const auto none = std::optional<seconds>{};
    const auto is = [](std::int64_t n) { return std::optional<seconds>{seconds{n}}; };
    CHECK(http::parse_max_age("max-age=60") == is(60));
    CHECK(http::parse_max_age("public, max-age=60") == is(60));
    CHECK(http::parse_max_age("MAX-Age=5") == is(5));                           // names ignore case
    CHECK(http::parse_max_age("max-age=\"7\"") == is(7));                       // a quoted argument
    CHECK(http::parse_max_age(" \t max-age = 12 ,no-store") == is(12));         // whitespace around
    CHECK(http::parse_max_age("s-maxage=10, max-age=20") == is(20));            // s-maxage is not max-age
    CHECK(http::parse_max_age("max-age=5, max-age=9") == is(5));                // the first counts
    CHECK(http::parse_max_age("private=\"a, max-age=3\", max-age=4") == is(4)); // a comma inside quotes
    CHECK(http::parse_max_age("max-age=5,,no-cache") == is(5));
    CHECK(http::parse_max_age("max-age=0") == is(0));
    // Invalid freshness information: stale, so zero.
    CHECK(http::parse_max_age("max-age=abc") == is(0));
    CHECK(http::parse_max_age("max-age=-1") == is(0));
    CHECK(http::parse_max_age("max-age=1.5") == is(0));
    CHECK(http::parse_max_age("max-age") == is(0));
    CHECK(http::parse_max_age("max-age=") == is(0));
    CHECK(http::parse_max_age("max-age=\"1\\2\"") == is(0));
    // Too large to hold: 2^31 seconds.
    CHECK(http::parse_max_age("max-age=2147483647") == is(2147483647));
    CHECK(http::parse_max_age("max-age=99999999999999999999999") == is(2147483648));
    // No max-age at all.
    CHECK(http::parse_max_age("") == none);
    CHECK(http::parse_max_age("no-cache, no-store") == none);
    CHECK(http::parse_max_age("s-maxage=10") == none);
    CHECK(http::parse_max_age("max-agex=5, xmax-age=5") == none);
    CHECK(http::parse_max_age("private=\"max-age=3\"") == none);
}

namespace {

// Cache-Control read through the primary traits: a field, empty for none.
struct cached_reply {
    int status = 200;
    std::string cache_control;
};
// ... or a member function returning a pointer, null for none.
struct pointer_reply {
    const char* field = nullptr;
    int status() const { return 200; }
    const char* cache_control() const { return field; }
};
// ... or a specialization.
struct header_reply {
    std::optional<std::string> control;
};

} // namespace

} // namespace test_http

template <>
struct resilience::http::response_traits<test_http::header_reply> {
    static int status(const test_http::header_reply&) { return 200; }
    static std::optional<std::string_view> cache_control(const test_http::header_reply& r) {
        if (!r.control)
            return std::nullopt;
        return std::string_view{*r.control};
    }
};

namespace test_http {

TEST_CASE("http: max_age reads Cache-Control through response_traits", "[http][cache]") {
    CHECK(http::max_age(cached_reply{200, "public, max-age=30"}) == std::optional<seconds>{30s});
    CHECK(http::max_age(cached_reply{200, ""}) == std::nullopt);
    CHECK(http::max_age(cached_reply{200, "no-store"}) == std::nullopt);
    CHECK(http::max_age(pointer_reply{"max-age=4"}) == std::optional<seconds>{4s});
    CHECK(http::max_age(pointer_reply{}) == std::nullopt);
    CHECK(http::max_age(header_reply{"max-age=\"9\""}) == std::optional<seconds>{9s});
    CHECK(http::max_age(header_reply{}) == std::nullopt);
    CHECK(http::max_age(reply{503, "5"}) == std::nullopt); // no Cache-Control to read
    CHECK(http::max_age(legacy_reply{200, "5"}) == std::nullopt);
}

} // namespace test_http
