// SPDX-License-Identifier: MIT
/// \file redis/bulkhead.hpp
/// `redis::bulkhead`: a limit on calls running at once across every process that uses the same
/// Redis and key, with leases that expire when a replica dies and that a running call renews.
#pragma once

#include "../asio.hpp"
#include "../bulkhead.hpp"
#include "../bulkhead/errors.hpp"
#include "../context.hpp"
#include "../detail/label.hpp"
#include "../error.hpp"
#include "../outcome.hpp"
#include "../policy.hpp"
#include "../policy_kit.hpp"
#include "../random.hpp"
#include "../stop_token.hpp"
#include "../task.hpp"
#include "../telemetry_event.hpp"
#include "../when_all.hpp"
#include "connection.hpp"
#include "script.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace resilience::inline v0_2::redis {

struct bulkhead_options {
    /// Carried by the errors it makes (`policy_name()`) and by `name()`.
    std::string name{};
    /// The Redis key of the slots: every bulkhead with the same key on the same Redis shares one
    /// limit. Must not be empty. The key holds a sorted set of leases and expires with the last one.
    std::string key{};
    /// How many calls may run at once, across every replica. Must be positive.
    std::size_t max_concurrent_calls = 25;
    /// How long a slot stays taken without news from its holder: a replica that dies holding slots
    /// gives them back this long after its last renewal. A running call renews its lease every third
    /// of this. At least 10 ms, and at least 3 x the connection's `command_timeout`: a renewal that
    /// timed out leaves the lease alive for the next one.
    std::chrono::nanoseconds lease_duration = std::chrono::seconds{10};
    /// What a call gets while Redis cannot be reached (see `unavailable_policy`).
    unavailable_policy when_unavailable = unavailable_policy::fail_closed;
    /// With `local_share`: the share of `max_concurrent_calls` this bulkhead allows on its own
    /// meanwhile, in (0, 1]; at least one call, and at most `rs::bulkhead_options::max_limit` (the
    /// local bulkhead's largest limit). Otherwise ignored (0 or in (0, 1]).
    double local_share = 0;
    /// Hears this bulkhead's `rejection`s, `backend_lost` and `backend_restored`. Empty: the
    /// listener of a `telemetry` stage around the call, if any.
    telemetry_listener telemetry{};
};

namespace detail {

// The leases: a sorted set of lease ids scored by their expiry, in microseconds of Redis's clock.
// `acquire` drops the expired ones, then adds one if fewer than the limit remain; `renew` pushes a
// live lease's expiry on (and says 0 if it already expired: its slot may be someone else's now);
// `release` removes it. Each runs atomically, as every Lua script does. The key's own expiry
// follows the latest lease, so a key whose holders all died goes away by itself.
//   after script_preamble (`now`); ARGV: op, lease id, lease (us), limit
inline constexpr std::string_view bulkhead_script = R"lua(
local op = ARGV[1]
local id = ARGV[2]
local lease = tonumber(ARGV[3])
if op == 'release' then
  return redis.call('ZREM', KEYS[1], id)
end
if op == 'acquire' then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
else
  local held = tonumber(redis.call('ZSCORE', KEYS[1], id))
  if not held or held <= now then
    redis.call('ZREM', KEYS[1], id)
    return 0
  end
end
redis.call('ZADD', KEYS[1], now + lease, id)
redis.call('PEXPIRE', KEYS[1], math.ceil(lease / 1000) + 1)
return 1
)lua";

// The limit of the local bulkhead that stands in while Redis is unreachable: `share` (in (0, 1]) of
// `calls`, rounded down, at least one. A share of 1 is `calls` exactly, which a double may not hold.
inline std::size_t local_limit(std::size_t calls, double share) noexcept {
    if (share >= 1.0)
        return calls;
    const double part = std::floor(static_cast<double>(calls) * share);
    // Below `calls` as a double (at most 2^64), so it converts; rounding may still leave it above.
    const std::size_t whole = part < static_cast<double>(calls) ? static_cast<std::size_t>(part) : calls;
    return std::clamp<std::size_t>(whole, 1, calls);
}

struct redis_bulkhead_state {
    redis_bulkhead_state(bulkhead_options o, connection c, resilience::asio::clock k)
        : options(std::move(o)), conn(std::move(c)), clock(std::move(k)), lua(bulkhead_script),
          health("redis_bulkhead", options.when_unavailable) {
        if (options.when_unavailable == unavailable_policy::local_share)
            local.emplace(
                ::resilience::bulkhead_options{
                    .name = options.name,
                    .max_concurrent_calls = local_limit(options.max_concurrent_calls, options.local_share),
                    .telemetry = options.telemetry},
                clock);
        thread_random rng;
        char buf[24];
        std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
        lease_prefix = buf;
    }

    std::string next_lease_id() { return lease_prefix + ":" + std::to_string(++leases); }
    std::vector<std::string> args(const char* op, const std::string& id) const {
        return {op, id,
                std::to_string(
                    std::chrono::duration_cast<std::chrono::microseconds>(options.lease_duration).count()),
                std::to_string(options.max_concurrent_calls)};
    }

    const bulkhead_options options;
    connection conn;
    resilience::asio::clock clock;
    script lua;
    store_health health;
    std::optional<::resilience::bulkhead<resilience::asio::clock>> local;
    std::string lease_prefix; // random per bulkhead object: lease ids never collide across replicas
    std::uint64_t leases = 0; // executor only
};

} // namespace detail

/// A concurrency limit shared by every bulkhead, in any process, that uses the same Redis and `key`.
///
/// - **One round trip to enter**, one `EVALSHA` that takes a slot as a lease if fewer than
///   `max_concurrent_calls` leases are live; the release is sent when the call ends without
///   waiting for its reply.
/// - **Leases expire**: a replica that dies holding slots (a crash, a lost network) gives them back
///   `lease_duration` after its last renewal. A running call renews its lease every third of
///   `lease_duration`, so a long call keeps its slot. A renewal that finds its lease gone (Redis
///   was out or frozen for longer than a lease, or restarted) does not stop the call, though the
///   slot may have been taken meanwhile; the call renews no more. Redis answered that renewal, so
///   it counts as Redis up: the listener heard `backend_lost` when the outage was seen, and hears
///   `backend_restored` once when Redis answers again, however many renewals find their lease gone.
/// - **Refuses at once** when the slots are taken, with `rs::bulkhead_rejected_error`
///   (`no_capacity`); it does not queue (a queue across replicas would need polling Redis).
/// - **Redis unreachable or slow**: as `redis::rate_limiter`: the connection's `command_timeout`
///   bounds the wait, then `when_unavailable` decides (refuse, let through, or a local bulkhead of
///   `local_share` of the limit), reported to the listener once lost and once back. A command that
///   timed out is never resent. A lease it may have taken is released with a `ZREM` (it runs after
///   the acquisition, which it follows on the connection), as is that of an acquisition whose
///   caller stopped first; when the connection is waiting out its backoff the `ZREM` cannot be
///   sent, and the lease expires by itself.
///
/// A copyable handle; copies share the connection and the local share. Calls must be made on the
/// connection's executor (its thread).
///
///     rs::redis::bulkhead slots{{.key = "slots:reports", .max_concurrent_calls = 8, .lease_duration = 5s}, redis};
///     rs::pipeline p{slots, rs::timeout{30s, clock}};
class bulkhead : public detail::shared_limit<bulkhead, detail::redis_bulkhead_state> {
public:
    /// The `policy` of its telemetry events.
    static constexpr std::string_view telemetry_policy = "redis_bulkhead";

    bulkhead(bulkhead_options options, connection conn)
        : bulkhead(std::move(options), conn, resilience::asio::clock{conn.executor()}) {}
    bulkhead(bulkhead_options options, connection conn, resilience::asio::clock clock)
        : shared_limit(std::make_shared<state>(validated(std::move(options), conn.options().command_timeout),
                                               std::move(conn), std::move(clock))) {}

    /// Runs the call holding a lease (renewed while it runs, released when it ends), or fails it as
    /// a value: `bulkhead_rejected_error` when every slot is taken (or Redis is unreachable and
    /// `fail_closed`), `cancelled_error` when the caller stops first.
    template <class Next>
    task<resilience::detail::next_outcome_t<Next>> run(Next next, const context& ctx) const {
        std::shared_ptr<state> s = state_;
        const bulkhead_options& o = s->options;
        if (ctx.stop_requested())
            co_return failure::make(cancelled_error{o.name});
        const resilience::detail::listener_ref listener = resilience::kit::listener_for(o.telemetry, ctx);
        const std::string id = s->next_lease_id();
        auto acquiring = s->lua.ask(s->conn, o.key, s->args("acquire", id), ctx.stop_token());
        detail::script::answer a = co_await std::move(acquiring);
        // Past this point a call that does not run may still hold a slot (the acquisition ran, its
        // answer was not awaited or not used): it is released at once, not after the lease.
        if (a.cancelled) {
            s->conn.send(release_command(*s, id));
            co_return failure::make(cancelled_error{o.name});
        }
        std::optional<failure>& unreachable = a.unreachable;
        if (!unreachable && a.value->type != reply::kind::integer)
            unreachable.emplace(
                failure::make(error{errc::protocol, "unexpected reply from the bulkhead script"}));
        const telemetry_event refusing{.kind = telemetry_kind::rejection,
                                       .policy = telemetry_policy,
                                       .name = o.name,
                                       .attempt = ctx.attempt()};
        if (unreachable) {
            s->conn.send(release_command(*s, id));
            if (std::optional<failure> thrown = s->health.lost(listener, s->clock, o.name, *unreachable))
                co_return std::move(*thrown);
            if (o.when_unavailable == unavailable_policy::fail_open)
                co_return co_await next(ctx);
            if (o.when_unavailable == unavailable_policy::local_share) {
                auto limited = s->local->run(std::move(next), ctx);
                co_return co_await std::move(limited);
            }
            co_return resilience::detail::refused(listener, s->clock, refusing,
                                                  failure::make(bulkhead_rejected_error{o.name}));
        }
        if (std::optional<failure> thrown = s->health.answered(listener, s->clock, o.name)) {
            if (a.value->integer == 1)
                s->conn.send(release_command(*s, id));
            co_return std::move(*thrown);
        }
        if (a.value->integer != 1)
            co_return resilience::detail::refused(listener, s->clock, refusing,
                                                  failure::make(bulkhead_rejected_error{o.name}));

        stop_source ended;
        auto call = run_then_stop(std::move(next), ctx, ended);
        auto renewing = renew(s, id, ended.get_token(), listener);
        auto both = when_all(std::move(call), std::move(renewing));
        auto [result, renewed] = co_await std::move(both);
        (void)renewed;
        s->conn.send(release_command(*s, id));
        co_return std::move(result);
    }

private:
    using state = detail::redis_bulkhead_state;

    template <class Next>
    static task<resilience::detail::next_outcome_t<Next>> run_then_stop(Next next, const context& ctx,
                                                                        stop_source& ended) {
        auto result = co_await next(ctx);
        resilience::detail::request_stop_held(ended);
        co_return result;
    }

    // Renews the lease every third of it until the call ends. A renewal that fails (Redis
    // unreachable) is tried again at the next period. One that finds the lease gone (it expired
    // while Redis was out or frozen, or Redis restarted) is an answer: Redis is up, and says so to
    // `health` like any other; the outage that cost the lease, if one was seen, was reported as
    // it began. Renewing stops there: there is nothing left to renew, and each further renewal
    // would find the same.
    template <class State> // State: `state`; a template for g++ -O0 (redis/connection.hpp)
    static task<void> renew(std::shared_ptr<State> s, std::string id, stop_token ended,
                            const telemetry_listener* listener) {
        const auto period = s->options.lease_duration / 3;
        for (;;) {
            const auto until = s->clock.now() + period;
            auto sleeping = s->clock.sleep_until(until, ended);
            co_await std::move(sleeping);
            if (ended.stop_requested())
                co_return;
            auto renewing = s->lua.ask(s->conn, s->options.key, s->args("renew", id), ended);
            const detail::script::answer a = co_await std::move(renewing);
            if (a.cancelled)
                co_return;
            std::optional<failure> failed = a.unreachable;
            if (!failed && a.value->type != reply::kind::integer)
                failed.emplace(
                    failure::make(error{errc::protocol, "unexpected reply from the bulkhead script"}));
            if (failed) {
                (void)s->health.lost(listener, s->clock, s->options.name, *failed);
                continue;
            }
            (void)s->health.answered(listener, s->clock, s->options.name);
            if (a.value->integer != 1)
                co_return; // the lease is gone
        }
    }

    static std::vector<std::string> release_command(const state& s, const std::string& id) {
        return {"ZREM", s.options.key, id};
    }

    // `command_timeout` is the connection's: a lease must outlive one renewal that timed out (the
    // renewals come every third of it).
    static bulkhead_options validated(bulkhead_options o, std::chrono::nanoseconds command_timeout) {
        const std::string who = ::resilience::detail::policy_label("redis::bulkhead", o.name) + ": ";
        detail::validate_shared(o, who);
        if (o.max_concurrent_calls == 0)
            throw std::invalid_argument(who + "max_concurrent_calls must be positive, got 0");
        if (o.when_unavailable == unavailable_policy::local_share &&
            detail::local_limit(o.max_concurrent_calls, o.local_share) >
                ::resilience::bulkhead_options::max_limit)
            throw std::invalid_argument(
                who +
                "max_concurrent_calls x local_share (the limit while Redis is unreachable) must be at most " +
                std::to_string(::resilience::bulkhead_options::max_limit) + ", got " +
                std::to_string(detail::local_limit(o.max_concurrent_calls, o.local_share)));
        detail::check_duration(who, "lease_duration", o.lease_duration, std::chrono::milliseconds{10}, "10ms",
                               std::chrono::hours{24 * 365}, "a year");
        if (o.lease_duration / 3 < command_timeout) // command_timeout is at most a year: 3 x fits
            throw std::invalid_argument(
                who + "lease_duration must be at least 3 x the connection's command_timeout (" +
                std::to_string(command_timeout.count()) + "ns), got " +
                std::to_string(o.lease_duration.count()) + "ns");
        return o;
    }
};

} // namespace resilience::redis
