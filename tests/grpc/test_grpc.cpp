// SPDX-License-Identifier: MIT
// resilience/grpc.hpp against a real gRPC server, in process, on loopback (a port the server picks).
// The server (a callback service of echo.proto) does what each request's text says; it records what
// it saw (calls, deadlines, cancellations) for the tests to assert on. Real time: every wait is bounded.

#include "../catch.hpp"

#include <resilience/grpc.hpp>
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>

#include <grpcpp/grpcpp.h>

#include "echo.grpc.pb.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace test_grpc {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_test::Echo;
using resilience_test::EchoReply;
using resilience_test::EchoRequest;

// ---------------------------------------------------------------------------------------------------------
// docs/grpc.md's program: a server that fails twice, and a client that retries through it.

class flaky_greeter final : public Echo::CallbackService {
    std::atomic<int> calls_{0};
    grpc::ServerUnaryReactor* Say(grpc::CallbackServerContext* ctx, const EchoRequest* q,
                                  EchoReply* a) override {
        grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
        const int n = ++calls_;
        if (n <= 2) {
            reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "warming up"));
        } else {
            a->set_text("hello, " + q->text());
            a->set_attempt(n);
            reactor->Finish(grpc::Status::OK);
        }
        return reactor;
    }
};

rs::task<std::string> greet(Echo::Stub& stub, std::string name) {
    rs::pipeline policy{
        rs::timeout{5s}, // the whole call; each attempt's RPC gets the time left as its deadline
        rs::retry{{.max_attempts = 4,
                   .backoff = rs::exponential_backoff{10ms, 2.0, 1s},
                   .should_handle = rs::grpc::status_classifier<EchoReply>{}}},
    };
    EchoRequest request;
    request.set_text(name);
    rs::grpc::reply<EchoReply> r = co_await policy.execute([&](const rs::context& ctx) {
        return rs::grpc::unary(ctx, stub.async(), &Echo::Stub::async::Say, request);
    });
    if (!r.ok())
        co_return "failed: " + r.status.error_message();
    co_return r.response.text() + " (attempt " + std::to_string(r.response.attempt()) + ")";
}

int run_program() {
    flaky_greeter service;
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    if (!server || port == 0)
        return 1;
    auto channel =
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
    std::unique_ptr<Echo::Stub> stub = Echo::NewStub(channel);
    const std::string answer = rs::sync_wait(greet(*stub, "world"));
    std::printf("%s\n", answer.c_str()); // hello, world (attempt 3)
    server->Shutdown();
    return answer == "hello, world (attempt 3)" ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------------------
// The tests' server. A request's text is a list of words:
//   fail N         the first N calls end UNAVAILABLE
//   pushback V     the first call ends UNAVAILABLE with grpc-retry-pushback-ms: V
//   started        every failing call sends initial metadata first (the server began the call)
//   metadata       every failing call adds initial metadata, sent along with the status
//   code N         the failing calls end with status code N instead of UNAVAILABLE
//   hang           the call never ends by itself: it waits until it is cancelled

struct server_log {
    std::mutex m;
    std::condition_variable cv;
    int calls = 0;
    int hanging = 0;
    int cancelled = 0;
    std::vector<std::chrono::steady_clock::time_point> arrivals;
    std::vector<std::optional<std::chrono::nanoseconds>> deadlines; // deadline less arrival; none: infinite

    template <class Pred>
    bool wait_for(Pred pred, std::chrono::milliseconds bound = 5000ms) {
        std::unique_lock lock{m};
        return cv.wait_for(lock, bound, pred);
    }
};

struct command {
    int fail = 0;
    std::optional<std::string> pushback;
    bool started = false;
    bool metadata = false;
    int code = static_cast<int>(grpc::StatusCode::UNAVAILABLE);
    bool hang = false;
};

command parse(const std::string& text) {
    command c;
    std::istringstream in{text};
    std::string word;
    while (in >> word) {
        if (word == "fail")
            in >> c.fail;
        else if (word == "pushback")
            c.pushback.emplace(), in >> *c.pushback;
        else if (word == "started")
            c.started = true;
        else if (word == "metadata")
            c.metadata = true;
        else if (word == "code")
            in >> c.code;
        else if (word == "hang")
            c.hang = true;
    }
    return c;
}

// Ends when the client cancels (or the server shuts down).
class hanging_call final : public grpc::ServerUnaryReactor {
public:
    explicit hanging_call(server_log& log) : log_(log) {}
    void OnCancel() override {
        {
            std::lock_guard lock{log_.m};
            ++log_.cancelled;
        }
        log_.cv.notify_all();
        Finish(grpc::Status::CANCELLED);
    }
    void OnDone() override { delete this; }

private:
    server_log& log_;
};

class scripted_service final : public Echo::CallbackService {
public:
    server_log log;

private:
    grpc::ServerUnaryReactor* Say(grpc::CallbackServerContext* ctx, const EchoRequest* q,
                                  EchoReply* a) override {
        const command c = parse(q->text());
        const auto now = std::chrono::steady_clock::now();
        const auto deadline = ctx->deadline();
        int n = 0;
        {
            std::lock_guard lock{log.m};
            n = ++log.calls;
            log.arrivals.push_back(now);
            if (deadline - std::chrono::system_clock::now() > std::chrono::hours{24 * 365})
                log.deadlines.emplace_back();
            else
                log.deadlines.emplace_back(deadline - std::chrono::system_clock::now());
            if (c.hang)
                ++log.hanging;
        }
        log.cv.notify_all();
        if (c.hang)
            return new hanging_call(log);
        grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
        const bool fails = n <= c.fail || (c.pushback && n == 1);
        if (!fails) {
            a->set_text(q->text());
            a->set_attempt(n);
            reactor->Finish(grpc::Status::OK);
            return reactor;
        }
        if (c.pushback)
            ctx->AddTrailingMetadata(std::string{rs::grpc::pushback_key}, *c.pushback);
        if (c.metadata)
            ctx->AddInitialMetadata("x-note", "1"); // sent along with the status
        if (c.started) {
            ctx->AddInitialMetadata("x-started", "1");
            reactor->StartSendInitialMetadata();
        }
        reactor->Finish(grpc::Status(static_cast<grpc::StatusCode>(c.code), "scripted failure"));
        return reactor;
    }
};

struct fixture {
    scripted_service service;
    std::unique_ptr<grpc::Server> server;
    int port = 0;
    std::unique_ptr<Echo::Stub> stub;

    fixture() {
        grpc::ServerBuilder builder;
        builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
        builder.RegisterService(&service);
        server = builder.BuildAndStart();
        REQUIRE(server);
        REQUIRE(port > 0);
        stub = Echo::NewStub(
            grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
    }
    ~fixture() { server->Shutdown(std::chrono::system_clock::now() + 2s); }
    fixture(const fixture&) = delete;
    fixture& operator=(const fixture&) = delete;

    server_log& log() { return service.log; }
    int calls() {
        std::lock_guard lock{log().m};
        return log().calls;
    }
    // One attempt's action: an RPC of `text`, counting the attempts. A class with a constructor, not a
    // closure owning a string (which g++ 12 would destroy twice inside co_await: docs/core.md).
    class say_action {
    public:
        say_action(Echo::Stub* stub, std::string text, int& attempts)
            : stub_(stub), text_(std::move(text)), attempts_(&attempts) {}
        rs::task<rs::grpc::reply<EchoReply>> operator()(const rs::context& ctx) const {
            ++*attempts_;
            EchoRequest q;
            q.set_text(text_);
            return rs::grpc::unary(ctx, stub_->async(), &Echo::Stub::async::Say, std::move(q));
        }

    private:
        Echo::Stub* stub_;
        std::string text_;
        int* attempts_;
    };
    say_action say(std::string text, int& attempts) {
        return say_action{stub.get(), std::move(text), attempts};
    }
};

// The server's view of a deadline passes the attempt's by the margin the client adds
// (rs::grpc::deadline_margin) and a few milliseconds more: the grpc-timeout header rounds the time left
// up to its unit.
constexpr auto rounding = rs::grpc::deadline_margin + 50ms;

rs::retry<> retry_of(int attempts, rs::grpc::classifier_options options = {},
                     std::function<void(const rs::retry_event&)> on_retry = {}) {
    return rs::retry{{.max_attempts = attempts,
                      .backoff = rs::constant_backoff{5ms, rs::jitter::none},
                      .max_delay = 10s,
                      .should_handle = rs::grpc::status_classifier<EchoReply>{std::move(options)},
                      .on_retry = std::move(on_retry)}};
}

// ---------------------------------------------------------------------------------------------------------
// Pushback and the classifier, without a server

TEST_CASE("grpc: parse_pushback reads milliseconds and stops on anything else", "[grpc]") {
    using rs::grpc::parse_pushback;
    using rs::grpc::pushback_kind;
    CHECK(parse_pushback("250") == rs::grpc::pushback{pushback_kind::delay, 250ms});
    CHECK(parse_pushback("0") == rs::grpc::pushback{pushback_kind::delay, 0ms});
    CHECK(parse_pushback("007").delay == 7ms);
    for (const char* bad : {"-1", "-250", "", " 5", "5 ", "1.5", "5ms", "+5", "abc", "99999999999999999999"})
        CHECK(parse_pushback(bad).kind == pushback_kind::stop);
    CHECK(parse_pushback(std::to_string(rs::grpc::max_pushback.count())).kind == pushback_kind::delay);
    static_assert(parse_pushback("12").delay == 12ms);
}

TEST_CASE("grpc: status_classifier follows the retry design", "[grpc]") {
    using rs::grpc::pushback;
    using rs::grpc::pushback_kind;
    const rs::grpc::status_classifier<EchoReply> c;
    const pushback none{};
    CHECK(c.judge(grpc::StatusCode::UNAVAILABLE, none, false).handle);
    CHECK_FALSE(c.judge(grpc::StatusCode::UNAVAILABLE, none, false).delay);
    CHECK_FALSE(c.judge(grpc::StatusCode::OK, none, false).handle);
    CHECK_FALSE(c.judge(grpc::StatusCode::INTERNAL, none, false).handle);
    CHECK_FALSE(c.judge(grpc::StatusCode::DEADLINE_EXCEEDED, none, false).handle);
    CHECK_FALSE(c.judge(grpc::StatusCode::UNAVAILABLE, none, true).handle); // the server had started it
    CHECK_FALSE(c.judge(grpc::StatusCode::UNAVAILABLE, pushback{pushback_kind::stop, {}}, false).handle);
    CHECK(c.judge(grpc::StatusCode::UNAVAILABLE, pushback{pushback_kind::delay, 300ms}, false).delay ==
          300ms);

    const rs::grpc::status_classifier<EchoReply> wide{
        {.retryable_codes = {grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::RESOURCE_EXHAUSTED},
         .safe_to_retry = true,
         .use_pushback = false}};
    CHECK(wide.judge(grpc::StatusCode::RESOURCE_EXHAUSTED, none, true).handle);
    CHECK(wide.judge(grpc::StatusCode::UNAVAILABLE, pushback{pushback_kind::stop, {}}, false).handle);
    CHECK_FALSE(wide.judge(grpc::StatusCode::UNAVAILABLE, pushback{pushback_kind::delay, 1s}, false).delay);

    // A failure (an exception) is judged by rs::is_transient.
    CHECK(c(rs::outcome<rs::grpc::reply<EchoReply>>{rs::failure::make(std::runtime_error("io"))}).handle);
    CHECK_FALSE(c(rs::outcome<rs::grpc::reply<EchoReply>>{rs::failure::make(rs::cancelled_error{})}).handle);
}

TEST_CASE("grpc: status_classifier refuses OK and unknown codes, naming the field", "[grpc]") {
    const auto message = [](grpc::StatusCode code) {
        try {
            rs::grpc::status_classifier<EchoReply>{
                {.retryable_codes = {grpc::StatusCode::UNAVAILABLE, code}}};
        } catch (const std::invalid_argument& e) {
            return std::string{e.what()};
        }
        return std::string{"no exception"};
    };
    CHECK(message(grpc::StatusCode::OK) ==
          "resilience::grpc::status_classifier: retryable_codes holds 0 (OK, which is never retried)");
    CHECK(message(static_cast<grpc::StatusCode>(42)) ==
          "resilience::grpc::status_classifier: retryable_codes holds 42 (not a status code)");
}

// ---------------------------------------------------------------------------------------------------------
// Against the server

TEST_CASE("grpc: the page's program retries twice and gets its answer", "[grpc]") {
    CHECK(run_program() == 0);
}

TEST_CASE("grpc: a call that ends UNAVAILABLE twice is retried and succeeds", "[grpc]") {
    fixture f;
    int attempts = 0;
    const rs::grpc::reply<EchoReply> r = rs::sync_wait(retry_of(4).execute(f.say("fail 2", attempts)));
    CHECK(r.ok());
    CHECK(attempts == 3);
    CHECK(f.calls() == 3);
    CHECK(r.response.attempt() == 3);
    CHECK(r.response.text() == "fail 2");
}

TEST_CASE("grpc: when the attempts run out the last reply is returned with its status", "[grpc]") {
    fixture f;
    int attempts = 0;
    const auto r = rs::sync_wait(retry_of(2).execute(f.say("fail 5", attempts)));
    CHECK(attempts == 2);
    CHECK(r.status.error_code() == grpc::StatusCode::UNAVAILABLE);
    CHECK(r.status.error_message() == "scripted failure");
    CHECK_FALSE(r.server_started);
}

TEST_CASE("grpc: a status that is not retryable is returned at once", "[grpc]") {
    fixture f;
    int attempts = 0;
    const auto r = rs::sync_wait(retry_of(4).execute(f.say("fail 5 code 13", attempts))); // INTERNAL
    CHECK(attempts == 1);
    CHECK(r.status.error_code() == grpc::StatusCode::INTERNAL);

    fixture g;
    int wide_attempts = 0;
    const auto w = rs::sync_wait(retry_of(4, {.retryable_codes = {grpc::StatusCode::INTERNAL}})
                                     .execute(g.say("fail 1 code 13", wide_attempts)));
    CHECK(wide_attempts == 2);
    CHECK(w.ok());
}

TEST_CASE("grpc: a pushback sets the retry's wait", "[grpc]") {
    fixture f;
    int attempts = 0;
    std::vector<std::chrono::nanoseconds> delays;
    const auto r = rs::sync_wait(retry_of(3, {}, [&](const rs::retry_event& e) {
                                     delays.push_back(e.delay());
                                 }).execute(f.say("pushback 300", attempts)));
    CHECK(r.ok());
    CHECK(attempts == 2);
    REQUIRE(delays.size() == 1);
    CHECK(delays[0] == 300ms); // not the 5 ms backoff
    std::lock_guard lock{f.log().m};
    REQUIRE(f.log().arrivals.size() == 2);
    CHECK(f.log().arrivals[1] - f.log().arrivals[0] >= 300ms); // and the retry waited for it
}

TEST_CASE("grpc: a negative or malformed pushback stops the retries", "[grpc]") {
    for (const char* value : {"-1", "soon"}) {
        fixture f;
        int attempts = 0;
        const auto r = rs::sync_wait(retry_of(4).execute(f.say(std::string{"pushback "} + value, attempts)));
        CHECK(attempts == 1);
        CHECK(r.status.error_code() == grpc::StatusCode::UNAVAILABLE);
        CHECK(r.pushback.kind == rs::grpc::pushback_kind::stop);
    }
}

TEST_CASE("grpc: use_pushback false leaves the backoff in charge", "[grpc]") {
    fixture f;
    int attempts = 0;
    std::vector<std::chrono::nanoseconds> delays;
    const auto r = rs::sync_wait(retry_of(3, {.use_pushback = false}, [&](const rs::retry_event& e) {
                                     delays.push_back(e.delay());
                                 }).execute(f.say("pushback -1", attempts)));
    CHECK(r.ok());
    CHECK(attempts == 2);
    REQUIRE(delays.size() == 1);
    CHECK(delays[0] == 5ms);
}

TEST_CASE("grpc: a call the server had started is not retried unless safe_to_retry", "[grpc]") {
    fixture f;
    int attempts = 0;
    const auto r = rs::sync_wait(retry_of(4).execute(f.say("fail 2 started", attempts)));
    CHECK(attempts == 1);
    CHECK(r.status.error_code() == grpc::StatusCode::UNAVAILABLE);
    CHECK(r.server_started);

    fixture g;
    int safe_attempts = 0;
    const auto s =
        rs::sync_wait(retry_of(4, {.safe_to_retry = true}).execute(g.say("fail 2 started", safe_attempts)));
    CHECK(safe_attempts == 3);
    CHECK(s.ok());
}

TEST_CASE("grpc: initial metadata sent along with the failing status marks the call started too", "[grpc]") {
    fixture f;
    int attempts = 0;
    const auto r = rs::sync_wait(retry_of(4).execute(f.say("fail 2 metadata", attempts)));
    CHECK(attempts == 1);
    CHECK(r.server_started);
    CHECK(r.status.error_code() == grpc::StatusCode::UNAVAILABLE);
}

TEST_CASE("grpc: a connection refused is UNAVAILABLE before the server, and retried", "[grpc]") {
    int port = 0;
    {
        fixture gone;
        port = gone.port;
    }
    auto stub = Echo::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
    int attempts = 0;
    const auto r =
        rs::sync_wait(rs::pipeline{rs::timeout{10s}, retry_of(3)}.execute([&](const rs::context& ctx) {
            ++attempts;
            return rs::grpc::unary(ctx, stub->async(), &Echo::Stub::async::Say, EchoRequest{});
        }));
    CHECK(attempts == 3);
    CHECK(r.status.error_code() == grpc::StatusCode::UNAVAILABLE);
    CHECK_FALSE(r.server_started);
}

TEST_CASE("grpc: a timeout's stop cancels the RPC on the server", "[grpc]") {
    fixture f;
    int attempts = 0;
    CHECK_THROWS_AS(rs::sync_wait(rs::timeout{300ms}.execute(f.say("hang", attempts))), rs::timeout_error);
    CHECK(f.log().wait_for([&] { return f.log().cancelled == 1; }));
}

TEST_CASE("grpc: the caller's stop cancels the RPC on the server", "[grpc]") {
    fixture f;
    int attempts = 0;
    resilience::stop_source stop;
    std::thread stopper{[&] {
        f.log().wait_for([&] { return f.log().hanging == 1; });
        stop.request_stop();
    }};
    CHECK_THROWS_AS(rs::sync_wait(retry_of(3).execute(f.say("hang", attempts), stop.get_token())),
                    rs::cancelled_error);
    stopper.join();
    CHECK(attempts == 1);
    CHECK(f.log().wait_for([&] { return f.log().cancelled == 1; }));
}

TEST_CASE("grpc: a timeout's deadline becomes the RPC's deadline", "[grpc]") {
    fixture f;
    int attempts = 0;
    const auto r = rs::sync_wait(rs::timeout{2s}.execute(f.say("", attempts)));
    CHECK(r.ok());
    std::lock_guard lock{f.log().m};
    REQUIRE(f.log().deadlines.size() == 1);
    REQUIRE(f.log().deadlines[0]);
    CHECK(*f.log().deadlines[0] > 0ms);
    CHECK(*f.log().deadlines[0] <= 2s + rounding);
}

TEST_CASE("grpc: without a timeout the RPC has no deadline", "[grpc]") {
    fixture f;
    int attempts = 0;
    const auto r = rs::sync_wait(retry_of(1).execute(f.say("", attempts)));
    CHECK(r.ok());
    std::lock_guard lock{f.log().m};
    REQUIRE(f.log().deadlines.size() == 1);
    CHECK_FALSE(f.log().deadlines[0]);
}

TEST_CASE("grpc: a retry's attempts under an outer timeout get the time left", "[grpc]") {
    fixture f;
    int attempts = 0;
    const auto r = rs::sync_wait(
        rs::pipeline{rs::timeout{3s}, retry_of(3, {}, {})}.execute(f.say("pushback 400", attempts)));
    CHECK(r.ok());
    CHECK(attempts == 2);
    std::lock_guard lock{f.log().m};
    REQUIRE(f.log().deadlines.size() == 2);
    REQUIRE(f.log().deadlines[0]);
    REQUIRE(f.log().deadlines[1]);
    CHECK(*f.log().deadlines[0] <= 3s + rounding);
    CHECK(*f.log().deadlines[1] <= 3s - 400ms + rounding); // the pushback's wait came out of the same budget
    CHECK(*f.log().deadlines[1] > 0ms);
}

TEST_CASE("grpc: a deadline set by setup is kept when it is the earlier", "[grpc]") {
    fixture f;
    EchoRequest q;
    const auto r = rs::sync_wait(rs::timeout{10s}.execute([&](const rs::context& ctx) {
        return rs::grpc::unary(ctx, f.stub->async(), &Echo::Stub::async::Say, q, [](grpc::ClientContext& c) {
            c.set_deadline(std::chrono::system_clock::now() + 1s);
        });
    }));
    CHECK(r.ok());
    std::lock_guard lock{f.log().m};
    REQUIRE(f.log().deadlines.size() == 1);
    REQUIRE(f.log().deadlines[0]);
    CHECK(*f.log().deadlines[0] <= 1s + rounding);
}

} // namespace test_grpc
