// SPDX-License-Identifier: MIT
#include "catch.hpp"

#include <resilience/pipeline.hpp>
#include <resilience/testing/scripted.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>

#include <string>
#include <vector>

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {
// A policy that records when calls pass through it, to observe the nesting order.
class recorder : public rs::policy_base<recorder> {
public:
    recorder(std::string name, std::vector<std::string>& log) : name_(std::move(name)), log_(&log) {}
    template <class Next>
    rs::task<rs::next_outcome_t<Next>> run(Next next, const rs::context& ctx) const {
        log_->push_back(name_ + " enter");
        auto result = co_await next(ctx);
        log_->push_back(name_ + " leave");
        co_return result;
    }

private:
    std::string name_;
    std::vector<std::string>* log_;
};
} // namespace

static_assert(rs::policy<recorder>);
static_assert(rs::policy<rs::pipeline<recorder, rs::timeout<>>>);

TEST_CASE("pipeline: the first policy listed is the outermost", "[pipeline]") {
    std::vector<std::string> log;
    rs::pipeline p{recorder{"a", log}, recorder{"b", log}, recorder{"c", log}};
    int v = rs::sync_wait(p.execute([&]() -> rs::task<int> {
        log.push_back("action");
        co_return 5;
    }));
    CHECK(v == 5);
    CHECK(log == std::vector<std::string>{"a enter", "b enter", "c enter", "action", "c leave", "b leave",
                                          "a leave"});
}

TEST_CASE("pipeline: a pipeline is a policy, so pipelines nest", "[pipeline]") {
    std::vector<std::string> log;
    rs::pipeline inner{recorder{"b", log}, recorder{"c", log}};
    rs::pipeline outer{recorder{"a", log}, inner};
    rs::sync_wait(outer.execute([&]() -> rs::task<void> {
        log.push_back("action");
        co_return;
    }));
    CHECK(log == std::vector<std::string>{"a enter", "b enter", "c enter", "action", "c leave", "b leave",
                                          "a leave"});
}

TEST_CASE("pipeline: failures pass outward unchanged and execute_outcome does not throw", "[pipeline]") {
    std::vector<std::string> log;
    rs::pipeline p{recorder{"a", log}, recorder{"b", log}};
    // Thrown from inside the coroutine, after it started...
    auto result = rs::sync_wait(p.execute_outcome([]() -> rs::task<int> {
        throw std::runtime_error("dependency down");
        co_return 0;
    }));
    REQUIRE(result.has_failure());
    CHECK(result.error().what() == std::string("dependency down"));
    CHECK(log.back() == "a leave");

    // ...or by an action that throws when called, before it returns any awaitable.
    auto refused =
        rs::sync_wait(p.execute_outcome([]() -> rs::task<int> { throw std::runtime_error("no socket"); }));
    REQUIRE(refused.has_failure());
    CHECK(refused.error().what() == std::string("no socket"));
}

TEST_CASE("pipeline: the action may take a context, a stop token or nothing", "[pipeline]") {
    rs::testing::simulation sim;
    rs::pipeline p{rs::timeout{1s, sim.clock()}};
    CHECK(sim.run(p.execute([](const rs::context& c) -> rs::task<int> { co_return c.attempt(); })) == 1);
    CHECK(sim.run(p.execute([](std::stop_token t) -> rs::task<bool> { co_return t.stop_possible(); })));
    CHECK(sim.run(p.execute([]() -> rs::task<int> { co_return 3; })) == 3);
}

TEST_CASE("pipeline: a temporary coroutine lambda is kept alive for the whole call", "[pipeline]") {
    rs::testing::simulation sim;
    rs::pipeline p{rs::timeout{1s, sim.clock()}};
    // The lambda object dies at the end of the full expression in the caller, but execute holds
    // its own copy until the call ends, so the capture is still there after the suspension.
    auto call = p.execute([text = std::string(100, 'x'), &sim]() -> rs::task<std::size_t> {
        co_await sim.sleep_for(10ms);
        co_return text.size();
    });
    CHECK(sim.run(std::move(call)) == 100);
}

namespace {
// The shapes [expr.await] allows beyond the usual task: await_suspend returning a typed handle, and
// an operator co_await that hands back an awaiter living inside the awaitable.
struct typed_handle_awaiter {
    bool await_ready() const noexcept { return false; }
    std::noop_coroutine_handle await_suspend(std::coroutine_handle<> h) {
        rs::event_loop::current()->post(h); // resumed by the loop; a typed handle goes back
        return std::noop_coroutine();
    }
    int await_resume() const noexcept { return 7; }
};
struct awaiter_by_reference {
    struct inner {
        bool await_ready() const noexcept { return true; }
        void await_suspend(std::coroutine_handle<>) const noexcept {}
        int await_resume() const noexcept { return 8; }
    } awaiter;
    inner& operator co_await() && noexcept { return awaiter; }
};
} // namespace

TEST_CASE("pipeline: actions may return any awaitable shape the language allows", "[pipeline]") {
    rs::testing::simulation sim;
    rs::pipeline p{rs::timeout{1s, sim.clock()}};
    CHECK(sim.run(p.execute([] { return typed_handle_awaiter{}; })) == 7);
    CHECK(sim.run(p.execute([] { return awaiter_by_reference{}; })) == 8);
}
