// SPDX-License-Identifier: MIT
// The standard library's std::stop_token at the library's edges (stop_token.hpp, engine/std_token.hpp),
// where the standard library has it: a caller's std token stops a call, an action (or a function of
// execute(f, args...)) written to take a std token gets one the call's token stops, a maker of
// async_scope::spawn may take one, and the bridges outlive either side safely. On virtual time.
#include "catch.hpp"
#include "support.hpp"

#include <resilience/async_scope.hpp>
#include <resilience/retry.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>
#include <resilience/timeout.hpp>
#include <resilience/when_all.hpp>

#include <chrono>
#include <stdexcept>

#if RESILIENCE_HAS_STD_STOP_TOKEN
#include <stop_token>

namespace test_std_stop_token {

namespace rs = resilience;
using namespace std::chrono_literals;
using rs::testing::simulation;

namespace {

rs::task<void> std_stop_at(simulation& sim, std::stop_source& source, std::chrono::nanoseconds at) {
    co_await sim.sleep_for(at - sim.now());
    source.request_stop();
}

/// Sleeps 10 s on virtual time unless `st` stops it; notes whether it saw the stop.
struct std_token_action {
    simulation* sim;
    bool* saw_stop;
    rs::task<int> operator()(std::stop_token st) const {
        co_await sim->clock().sleep_for(10s, rs::from_std(st)); // a stopped sleep ends early
        *saw_stop = st.stop_requested();
        co_return 1;
    }
};

} // namespace

TEST_CASE("std stop_token: a caller's std::stop_token stops the call", "[stop_token][std]") {
    simulation sim;
    rs::retry r{{.max_attempts = 3}, sim.clock()};
    std::stop_source caller;
    auto slow = [&](const rs::context& ctx) -> rs::task<int> {
        co_await sim.clock().sleep_for(10s, ctx.stop_token());
        if (ctx.stop_requested())
            throw std::runtime_error("stopped"); // what the stopped attempt throws is not the call's end
        co_return 1;
    };
    auto [out, ignored] =
        sim.run(rs::when_all(r.execute_outcome(slow, caller.get_token()), std_stop_at(sim, caller, 1s)));
    CHECK(sim.now() == 1s);
    REQUIRE(out.has_failure());
    CHECK(out.error().is<rs::cancelled_error>());
}

TEST_CASE("std stop_token: an action that takes a std::stop_token is stopped by the call's token",
          "[stop_token][std]") {
    simulation sim;
    rs::timeout limit{2s, sim.clock()};
    bool saw_stop = false;
    const std_token_action act{&sim, &saw_stop};
    CHECK(sim.run(limit.execute(act)) == 1); // its value, returned after the deadline
    CHECK(sim.now() == 2s);
    CHECK(saw_stop);
}

TEST_CASE("std stop_token: execute(f, args...) with f taking a trailing std::stop_token",
          "[stop_token][std]") {
    simulation sim;
    rs::timeout limit{2s, sim.clock()};
    bool saw_stop = false;
    auto f = [&sim, &saw_stop](int base, std::stop_token st) -> rs::task<int> {
        co_await sim.clock().sleep_for(10s, rs::from_std(st));
        saw_stop = st.stop_requested();
        co_return base + 1;
    };
    CHECK(sim.run(limit.execute(f, 41)) == 42);
    CHECK(sim.now() == 2s);
    CHECK(saw_stop);
}

TEST_CASE("std stop_token: an action that takes a std::stop_token and is never stopped gets a token that "
          "cannot stop",
          "[stop_token][std]") {
    simulation sim;
    rs::retry r{{.max_attempts = 1}, sim.clock()};
    bool possible = true;
    auto f = [&possible](std::stop_token st) -> rs::task<int> {
        possible = st.stop_possible();
        co_return 3;
    };
    CHECK(sim.run(r.execute(f)) == 3);
    CHECK_FALSE(possible); // no std::stop_source was made for it
}

TEST_CASE("std stop_token: async_scope::spawn takes a maker of a std::stop_token", "[stop_token][std]") {
    simulation sim;
    rs::async_scope scope;
    bool saw_stop = false;
    // The maker lives in the scope's frame for the length of the call, as `execute` keeps its action.
    scope.spawn(sim.loop(), [&sim, &saw_stop](std::stop_token st) -> rs::task<void> {
        co_await sim.clock().sleep_for(10s, rs::from_std(st));
        saw_stop = st.stop_requested();
    });
    auto stopper = [&]() -> rs::task<void> {
        co_await sim.sleep_for(3s);
        scope.request_stop();
        co_await scope.join();
    };
    sim.run(stopper());
    CHECK(sim.now() == 3s);
    CHECK(saw_stop);
}

TEST_CASE("std stop_token: from_std gives a token the std one stops, on the requesting thread",
          "[stop_token][std]") {
    CHECK_FALSE(rs::from_std(std::stop_token{}).stop_possible());

    std::stop_source source;
    rs::stop_token t = rs::from_std(source.get_token());
    CHECK(t.stop_possible());
    int runs = 0;
    rs::stop_callback cb(t, [&runs]() noexcept { ++runs; });
    source.request_stop();
    CHECK(t.stop_requested());
    CHECK(runs == 1);

    // A std token already stopped gives a stopped one.
    CHECK(rs::from_std(source.get_token()).stop_requested());
}

TEST_CASE("std stop_token: either side of a bridge may go first", "[stop_token][std]") {
    {
        std::stop_source source;
        { rs::stop_token t = rs::from_std(source.get_token()); }
        source.request_stop(); // the bridge is gone: nothing left to tell
    }
    {
        rs::stop_token t;
        {
            std::stop_source source;
            t = rs::from_std(source.get_token());
        }
        CHECK_FALSE(t.stop_requested());
    }
    {
        rs::stop_source source;
        std::stop_token st;
        {
            rs::std_stop_link link(source.get_token());
            st = link.get_token();
        }
        source.request_stop(); // the link is gone: its std token stays as it was
        CHECK_FALSE(st.stop_requested());
    }
    {
        rs::stop_source source;
        rs::std_stop_link link(source.get_token());
        std::stop_token st = link.get_token();
        source.request_stop();
        CHECK(st.stop_requested());
    }
}

} // namespace test_std_stop_token

#endif
