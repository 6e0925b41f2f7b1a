// SPDX-License-Identifier: MIT
/// \file redis/script.hpp
/// What the limits shared through Redis have in common: a Lua script run with `EVALSHA` (loaded once,
/// sent whole again after a script flush), what a policy does while Redis cannot be reached
/// (`unavailable_policy`), and the reports of Redis lost and back.
#pragma once

#include "../asio.hpp"
#include "../context.hpp"
#include "../error.hpp"
#include "../outcome.hpp"
#include "../policy.hpp"
#include "../rate_limiter.hpp"
#include "../stop_token.hpp"
#include "../task.hpp"
#include "../telemetry_event.hpp"
#include "connection.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace resilience::inline v0_2::redis {

/// What a shared limit does with a call while Redis cannot be reached (no connection, a timeout,
/// an error reply). Reported to the telemetry listener when Redis is lost and when it is back
/// (`telemetry_kind::backend_lost`, `backend_restored`).
enum class unavailable_policy : unsigned char {
    /// Refuse the call, as if the limit were reached (the default: a quota is kept, at the price of
    /// the calls refused during an outage).
    fail_closed,
    /// Let the call through unlimited (availability first: the dependency's own limit is the guard).
    fail_open,
    /// Limit the call locally with this replica's share of the limit (`local_share`): with N replicas
    /// and a share of 1/N, the replicas together keep close to the limit without talking to each other.
    local_share,
};

/// "fail_closed", "fail_open" or "local_share": a static string, for logs and telemetry (`note`).
constexpr const char* to_string(unavailable_policy p) noexcept {
    switch (p) {
    case unavailable_policy::fail_closed:
        return "fail_closed";
    case unavailable_policy::fail_open:
        return "fail_open";
    case unavailable_policy::local_share:
        return "local_share";
    }
    return "unknown";
}

namespace detail {

// A double as Redis reads it back exactly (17 significant digits).
inline std::string number_arg(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}

// Checks what every shared limit's options have: a key, the failure mode and its share.
template <class Options>
void validate_shared(const Options& o, const std::string& who) {
    if (o.key.empty())
        throw std::invalid_argument(who + "key must not be empty");
    if (!std::isfinite(o.local_share) || o.local_share < 0.0 || o.local_share > 1.0)
        throw std::invalid_argument(who + "local_share must be in [0, 1], got " +
                                    resilience::detail::format_number(o.local_share));
    if (o.when_unavailable == unavailable_policy::local_share && !(o.local_share > 0.0))
        throw std::invalid_argument(who +
                                    "local_share must be positive with when_unavailable = local_share, got " +
                                    resilience::detail::format_number(o.local_share));
}

// Refuses a duration outside [min, max], naming the field and the value.
inline void check_duration(const std::string& who, const char* field, std::chrono::nanoseconds value,
                           std::chrono::nanoseconds min, const char* min_text, std::chrono::nanoseconds max,
                           const char* max_text) {
    if (value < min || value > max)
        throw std::invalid_argument(who + field + " must be from " + min_text + " to " + max_text + ", got " +
                                    std::to_string(value.count()) + "ns");
}

/// What every script starts with: its effects replicated rather than the script (Redis before 5
/// replicates a script whole, and `TIME` makes it differ from replica to replica), and `now`, Redis's
/// clock in microseconds, the one clock every process sharing the key agrees on.
inline constexpr std::string_view script_preamble = R"lua(
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
)lua";

/// A Lua script run by its SHA-1. The SHA is learnt with `SCRIPT LOAD` on first use (one round trip
/// once); afterwards each run is one `EVALSHA`. A `NOSCRIPT` reply (the server restarted, or its
/// scripts were flushed) proves the script did not run, so it is sent whole with `EVAL`, which also
/// caches it again: that resend cannot count anything twice. Nothing else is ever resent. Touched
/// only on its connection's executor.
class script {
public:
    /// `body` runs after `script_preamble`, which sets `now`.
    explicit script(std::string_view body) : text_(std::string(script_preamble).append(body)) {}

    /// Runs the script with one key and `args`. Throws `redis::error` when Redis cannot answer or
    /// answers with an error, `cancelled_error` when `token` stops the wait.
    // Connection: `connection`; a template only for g++ -O0 (see redis/connection.hpp's file comment).
    template <class Connection>
    task<reply> run(Connection conn, std::string key, std::vector<std::string> args, stop_token token) {
        if (sha_.empty()) {
            std::vector<std::string> load{"SCRIPT", "LOAD", text_};
            auto loading = conn.command(std::move(load), token);
            reply loaded = co_await std::move(loading);
            if (loaded.type != reply::kind::string)
                throw error{errc::server, "SCRIPT LOAD: " + loaded.str};
            sha_ = std::move(loaded.str);
        }
        std::vector<std::string> call;
        call.reserve(args.size() + 4);
        call.insert(call.end(), {"EVALSHA", sha_, "1", key});
        call.insert(call.end(), args.begin(), args.end());
        auto running = conn.command(call, token);
        reply r = co_await std::move(running);
        if (r.is_error() && r.str.starts_with("NOSCRIPT")) {
            call[0] = "EVAL";
            call[1] = text_;
            auto again = conn.command(std::move(call), token);
            r = co_await std::move(again);
        }
        if (r.is_error())
            throw error{errc::server, r.str};
        co_return r;
    }

    /// What `run` came to, without an exception: the reply, or that Redis could not answer (the
    /// failure), or that the caller stopped first.
    struct answer {
        std::optional<reply> value{};
        std::optional<failure> unreachable{};
        bool cancelled = false;
    };
    template <class Connection> // `connection`, as for `run`
    task<answer> ask(Connection conn, std::string key, std::vector<std::string> args, stop_token token) {
        answer a;
        try {
            auto running = run(std::move(conn), std::move(key), std::move(args), std::move(token));
            a.value.emplace(co_await std::move(running));
        } catch (const cancelled_error&) {
            a.cancelled = true;
        } catch (...) {
            a.unreachable.emplace(failure::current());
        }
        co_return a;
    }

private:
    std::string text_;
    std::string sha_;
};

/// Whether Redis answered last time, with the reports of each change to the listener.
class store_health {
public:
    store_health(std::string_view policy, unavailable_policy mode) noexcept : policy_(policy), mode_(mode) {}

    /// Redis answered. Reports `backend_restored` if it had been lost; what the listener throws is
    /// returned.
    template <class C>
    std::optional<failure> answered(const telemetry_listener* l, const C& clock,
                                    std::string_view name) noexcept {
        if (up_.load(std::memory_order_relaxed) || up_.exchange(true, std::memory_order_acq_rel))
            return std::nullopt;
        return resilience::detail::emit_caught(l, clock,
                                               event(telemetry_kind::backend_restored, name, nullptr));
    }
    /// Redis did not answer (`why`). Reports `backend_lost` if it had been up.
    template <class C>
    std::optional<failure> lost(const telemetry_listener* l, const C& clock, std::string_view name,
                                const failure& why) noexcept {
        if (!up_.exchange(false, std::memory_order_acq_rel))
            return std::nullopt;
        return resilience::detail::emit_caught(l, clock, event(telemetry_kind::backend_lost, name, &why));
    }
    [[nodiscard]] bool up() const noexcept { return up_.load(std::memory_order_relaxed); }

private:
    telemetry_event event(telemetry_kind k, std::string_view name, const failure* why) const noexcept {
        return {.kind = k, .policy = policy_, .name = name, .error = why, .note = to_string(mode_)};
    }

    std::string_view policy_;
    unavailable_policy mode_;
    std::atomic<bool> up_{true};
};

/// The public face both shared limits have: the policy protocol's base, and what a handle tells.
/// `State` has `options`, `conn`, `clock` and `health`. Copies share one state.
template <class Derived, class State>
class shared_limit : public policy_base<Derived> {
public:
    [[nodiscard]] const auto& options() const noexcept { return state_->options; }
    [[nodiscard]] const std::string& name() const noexcept { return state_->options.name; }
    [[nodiscard]] const resilience::asio::clock& clock() const noexcept { return state_->clock; }
    [[nodiscard]] const connection& redis() const noexcept { return state_->conn; }
    /// False from the call that found Redis unreachable until the one that found it back.
    [[nodiscard]] bool redis_up() const noexcept { return state_->health.up(); }

    /// Copies of one policy are equal.
    friend bool operator==(const shared_limit& a, const shared_limit& b) noexcept {
        return a.state_ == b.state_;
    }

protected:
    explicit shared_limit(std::shared_ptr<State> s) noexcept : state_(std::move(s)) {}
    std::shared_ptr<State> state_;
};

} // namespace detail
} // namespace resilience::redis
