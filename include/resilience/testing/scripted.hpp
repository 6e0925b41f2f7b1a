// SPDX-License-Identifier: MIT
/// \file testing/scripted.hpp
/// `testing::scripted_action`: a fake dependency that fails N times, takes D, then succeeds.
#pragma once

#include "../clock.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../stop_token.hpp"
#include "../task.hpp"

#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace resilience::inline v0_2::testing {

/// What a scripted action throws for a scripted failure.
class scripted_failure : public std::runtime_error {
public:
    explicit scripted_failure(int call)
        : std::runtime_error("scripted failure on call " + std::to_string(call)), call_(call) {}
    int call() const noexcept { return call_; }

private:
    int call_;
};

/// One call of a script: how long it takes, and whether it fails.
struct step {
    std::chrono::nanoseconds latency{};
    bool fail = false;
};

template <class T>
struct script {
    int failures = 0;                   ///< the first `failures` calls fail...
    std::chrono::nanoseconds latency{}; ///< ...each call taking this long (unless `steps` says otherwise)
    T value{};                          ///< what the calls after the failures return
    std::vector<step> steps{};          ///< explicit per-call steps; when set, used before the rule above
    bool ignore_stop = false;           ///< keep running when asked to stop (an action that does not listen)
};

/// A fake dependency for tests, driven by a clock (normally a simulation's). Call `i` (1-based)
/// waits its latency on the clock, then throws `scripted_failure` or returns `value`. A stop
/// request during the wait ends it at once with `cancelled_error` unless `ignore_stop` is set.
/// Copies share the call count, so a test can hand a copy to `execute` and read `calls()` after.
template <class T, clock C>
class scripted_action {
public:
    scripted_action(C clock, script<T> s) : state_(std::make_shared<state>(std::move(clock), std::move(s))) {}

    task<T> operator()(stop_token token) const {
        auto s = state_; // keeps the state alive for the whole call, whatever happens to *this
        const int call = ++s->calls;
        ++s->in_flight;
        struct leave {
            state* st;
            ~leave() { --st->in_flight; }
        } guard{s.get()};
        step st =
            call <= static_cast<int>(s->plan.steps.size())
                ? s->plan.steps[static_cast<std::size_t>(call - 1)]
                : step{s->plan.latency, call - static_cast<int>(s->plan.steps.size()) <= s->plan.failures};
        if (st.latency > std::chrono::nanoseconds::zero()) {
            stop_token listen = s->plan.ignore_stop ? stop_token{} : token;
            co_await s->clock.sleep_until(
                s->clock.now() + std::chrono::duration_cast<typename C::duration>(st.latency), listen);
            if (listen.stop_requested()) {
                ++s->stopped;
                throw cancelled_error{};
            }
        }
        if (st.fail)
            throw scripted_failure{call};
        co_return s->plan.value;
    }

    int calls() const noexcept { return state_->calls; }         ///< calls started so far
    int in_flight() const noexcept { return state_->in_flight; } ///< calls started and not finished
    int stopped() const noexcept { return state_->stopped; } ///< calls that ended because they were stopped

private:
    struct state {
        state(C c, script<T> s) : clock(std::move(c)), plan(std::move(s)) {}
        C clock;
        script<T> plan;
        int calls = 0, in_flight = 0, stopped = 0;
    };
    std::shared_ptr<state> state_;
};

template <class T, class C>
scripted_action(C, script<T>) -> scripted_action<T, C>;

} // namespace resilience::testing
