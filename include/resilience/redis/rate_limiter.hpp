// SPDX-License-Identifier: MIT
/// \file redis/rate_limiter.hpp
/// `redis::rate_limiter`: a rate limit shared by every process that uses the same Redis and key, one
/// round trip per admission, on Redis's clock.
#pragma once

#include "../asio.hpp"
#include "../context.hpp"
#include "../detail/label.hpp"
#include "../detail/time.hpp"
#include "../error.hpp"
#include "../limiter/errors.hpp"
#include "../limiter/options.hpp"
#include "../outcome.hpp"
#include "../policy.hpp"
#include "../policy_kit.hpp"
#include "../rate_limiter.hpp"
#include "../stop_token.hpp"
#include "../task.hpp"
#include "../telemetry_event.hpp"
#include "connection.hpp"
#include "script.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace resilience::inline v0_2::redis {

struct rate_limiter_options {
    /// Carried by the errors it makes (`policy_name()`) and by `name()`.
    std::string name{};
    /// The Redis key of the bucket: every limiter with the same key on the same Redis shares one
    /// limit (a key per tenant gives each tenant its own). Must not be empty. The key holds one
    /// string and expires by itself once the bucket is full again.
    std::string key{};
    /// The burst after idle, as `rs::rate_limiter_options::token_limit`. Must be positive.
    std::size_t token_limit = 0;
    /// The sustained rate, for all the replicas together, as `rs::rate_limiter_options::tokens_per_second`.
    /// Finite, at least `rs::rate_limiter_options::min_tokens_per_second`.
    double tokens_per_second = 0;
    /// How many calls of this limiter may wait for their token at once; beyond that a call that
    /// would have to wait is refused (`queue_full`). The default 0 refuses as soon as no token is
    /// there (`no_capacity`). A call that waits has reserved its token in Redis already: it sleeps
    /// locally until the token is due, with no further round trip. A place is held from the moment
    /// a call asks Redis (whether it will have to wait is known only from the answer), so calls
    /// asking at once cannot reserve more waits than this between them.
    std::size_t queue_limit = 0;
    /// The longest wait a call accepts; a call whose token is due later is refused at once
    /// (`queue_timeout`) and reserves nothing. Empty: any wait. Must be positive when set.
    std::optional<std::chrono::nanoseconds> queue_timeout{};
    /// What a call gets while Redis cannot be reached (see `unavailable_policy`).
    unavailable_policy when_unavailable = unavailable_policy::fail_closed;
    /// With `local_share`: the share of `token_limit` and `tokens_per_second` this limiter allows
    /// on its own meanwhile (1/N for N replicas), in (0, 1]; the local bucket holds at least one
    /// token. Otherwise ignored (0 or in (0, 1]).
    double local_share = 0;
    /// Hears this limiter's `rejection`s, `queue_wait`s, `backend_lost` and `backend_restored`.
    /// Empty: the listener of a `telemetry` stage around the call, if any.
    telemetry_listener telemetry{};
};

namespace detail {

// GCRA, which is a token bucket kept as one number: the theoretical arrival time `tat` of the next
// token, in microseconds of Redis's own clock (TIME), so every replica reads one clock. A call is
// admitted when `tat` is at most `(burst - 1) * interval` ahead of now; admitting it moves `tat` on by
// one interval. A call that may wait reserves the next token the same way, if it is due within its
// wait, and is told how long to sleep. Read, decide and write happen inside one script, which Redis
// runs atomically: no two callers ever see the same `tat`. The key expires when the bucket would be
// full again, when forgetting it changes nothing. The wait it returns is held at 2^62 ns (in
// microseconds, rounded up), the longest a limiter tells: a longer one (a token every ten years with
// thirty calls waiting) is beyond what nanoseconds hold, and in the end Redis's integer reply.
//   after script_preamble (`now`); ARGV: burst, interval (us), longest wait accepted (us; -1: any)
//   returns {1, wait (us)} admitted (sleep `wait` first), or {0, retry after (us)}
inline constexpr std::string_view rate_limiter_script = R"lua(
local burst = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]))
if not tat or tat < now then tat = now end
local wait = tat - now - (burst - 1) * interval
if wait < 0 then wait = 0 end
local told = math.min(math.ceil(wait), 4611686018427388)
if wait > 0 and max_wait >= 0 and wait > max_wait then
  return {0, told}
end
tat = tat + interval
redis.call('SET', KEYS[1], tat, 'PX', math.ceil((tat - now) / 1000) + 1)
return {1, told}
)lua";

template <class Options>
struct redis_limiter_state {
    redis_limiter_state(Options o, connection c, resilience::asio::clock k)
        : options(std::move(o)), conn(std::move(c)), clock(std::move(k)),
          interval_us(1e6 / options.tokens_per_second), lua(rate_limiter_script),
          health("redis_rate_limiter", options.when_unavailable) {
        if (options.when_unavailable == unavailable_policy::local_share) {
            const double share = options.local_share;
            local.emplace(
                rs_rate_limiter_options{.name = options.name,
                                        .token_limit = std::max<std::size_t>(
                                            1, static_cast<std::size_t>(std::floor(
                                                   static_cast<double>(options.token_limit) * share))),
                                        .tokens_per_second = std::max(options.tokens_per_second * share,
                                                                      rate_limiter_options_min()),
                                        .queue_limit = options.queue_limit,
                                        .queue_timeout = options.queue_timeout,
                                        .telemetry = options.telemetry},
                clock);
        }
    }
    using rs_rate_limiter_options = ::resilience::rate_limiter_options;
    static constexpr double rate_limiter_options_min() {
        return rs_rate_limiter_options::min_tokens_per_second;
    }

    const Options options;
    connection conn;
    resilience::asio::clock clock;
    const double interval_us;
    script lua;
    store_health health;
    std::optional<::resilience::rate_limiter<resilience::asio::clock>> local;
    std::size_t waiting = 0; // calls of this limiter that may wait, asking or asleep (executor only)
};

} // namespace detail

/// A token bucket shared by every limiter, in any process, that uses the same Redis and `key`:
/// twenty replicas of a service keep to one upstream quota together.
///
/// - **One round trip per admission**: one `EVALSHA` of a Lua script (see `detail::rate_limiter_script`)
///   that reads Redis's clock, decides and writes, atomically. Replicas with skewed clocks agree:
///   the only clock is Redis's.
/// - **Wait or reject** like `rs::rate_limiter`, with the same options. A call that may wait
///   reserves its token in the same round trip and sleeps locally until it is due; one refused
///   fails with `rs::rate_limited_error`, whose `retry_after()` is Redis's answer. Waits and
///   `retry_after` are held at about 146 years (2^62 ns), as `rs::rate_limiter` holds them.
/// - **Redis unreachable or slow**: each command has the connection's `command_timeout`, so no call
///   waits longer than that for Redis; then `when_unavailable` decides (refuse, let through, or a
///   local bucket of `local_share` of the limit), and the listener hears `backend_lost` once and
///   `backend_restored` when Redis answers again.
/// - **Never counted twice**: a command that timed out or whose connection broke is not sent again
///   (it may have taken its token); the call is decided by `when_unavailable` instead. Only a
///   `NOSCRIPT` answer, which proves nothing ran, is followed by the same script sent whole.
///
/// A copyable handle; copies share the connection, the script's state and the local share. Calls
/// must be made on the connection's executor (its thread), and sleep on `rs::asio::clock`. A token
/// taken is not given back, however the call ends, and a caller that stops while asleep on its
/// reserved token leaves it unused: the limit errs on the side of fewer calls.
///
///     asio::io_context io;
///     rs::redis::connection redis{io.get_executor(), rs::redis::connection_options::from_url(url)};
///     rs::redis::rate_limiter quota{{.key = "quota:upstream", .token_limit = 50, .tokens_per_second = 500,
///                                    .when_unavailable = rs::redis::unavailable_policy::local_share,
///                                    .local_share = 1.0 / 20},
///                                   redis};
///     rs::pipeline p{rs::retry{{}, clock}, quota, breaker, rs::timeout{2s, clock}};
class rate_limiter
    : public detail::shared_limit<rate_limiter, detail::redis_limiter_state<rate_limiter_options>> {
public:
    /// The `policy` of its telemetry events.
    static constexpr std::string_view telemetry_policy = "redis_rate_limiter";

    /// Sleeps (reserved waits) on `clock`; by default an `rs::asio::clock` on the connection's executor.
    rate_limiter(rate_limiter_options options, connection conn)
        : rate_limiter(std::move(options), conn, resilience::asio::clock{conn.executor()}) {}
    rate_limiter(rate_limiter_options options, connection conn, resilience::asio::clock clock)
        : shared_limit(
              std::make_shared<state>(validated(std::move(options)), std::move(conn), std::move(clock))) {}

    /// Admits the call after its one round trip (and its reserved wait, if any), or fails it as a
    /// value: `rate_limited_error` when refused (or Redis is unreachable and `fail_closed`),
    /// `cancelled_error` when the caller stops first.
    template <class Next>
    task<resilience::detail::next_outcome_t<Next>> run(Next next, const context& ctx) const {
        std::shared_ptr<state> s = state_;
        if (ctx.stop_requested())
            co_return failure::make(cancelled_error{s->options.name});
        const resilience::detail::listener_ref listener =
            resilience::kit::listener_for(s->options.telemetry, ctx);
        auto deciding = admit(s, ctx.stop_token(), listener, ctx.attempt());
        decision d = co_await std::move(deciding);
        if (d.refusal)
            co_return std::move(*d.refusal);
        if (d.local) {
            auto limited = s->local->run(std::move(next), ctx);
            co_return co_await std::move(limited);
        }
        co_return co_await next(ctx);
    }

    /// Spends one token without running anything, by the same rules as a call. Throws
    /// `rate_limited_error` when refused, `cancelled_error` when `token` stops first.
    template <class = void> // a template only for g++ -O0 (see redis/connection.hpp's file comment)
    task<void> take(stop_token token = {}) const {
        std::shared_ptr<state> s = state_;
        const telemetry_listener* listener = s->options.telemetry ? &s->options.telemetry : nullptr;
        auto deciding = admit(s, token, listener, 1);
        decision d = co_await std::move(deciding);
        if (d.refusal)
            d.refusal->rethrow();
        if (d.local) {
            auto local = s->local->take(token);
            co_await std::move(local);
        }
    }

private:
    using state = detail::redis_limiter_state<rate_limiter_options>;

    // One of the `queue_limit` places, however the call's wait ends.
    struct queue_place {
        std::size_t& waiting;
        explicit queue_place(std::size_t& w) noexcept : waiting(w) { ++waiting; }
        queue_place(const queue_place&) = delete;
        queue_place& operator=(const queue_place&) = delete;
        ~queue_place() { --waiting; }
    };

    struct decision {
        std::optional<failure> refusal{}; // refused (or cancelled): the call's outcome
        bool local = false;               // Redis unreachable: the local share decides
    };

    template <class State> // State: `state`; a template for g++ -O0 (redis/connection.hpp)
    static task<decision> admit(std::shared_ptr<State> s, stop_token token,
                                resilience::detail::listener_ref listener, int attempt) {
        const rate_limiter_options& o = s->options;
        // A call that may wait holds a queue place from before it asks until its wait ends, so calls
        // asking at once cannot together reserve more waits than `queue_limit`.
        const bool may_wait = o.queue_limit > 0 && s->waiting < o.queue_limit;
        std::optional<queue_place> place;
        if (may_wait)
            place.emplace(s->waiting);
        long long max_wait_us = 0;
        if (may_wait)
            max_wait_us =
                o.queue_timeout
                    ? std::chrono::duration_cast<std::chrono::microseconds>(*o.queue_timeout).count()
                    : -1;
        std::vector<std::string> args{std::to_string(o.token_limit), detail::number_arg(s->interval_us),
                                      std::to_string(max_wait_us)};
        auto asking = s->lua.ask(s->conn, o.key, std::move(args), token);
        detail::script::answer a = co_await std::move(asking);
        if (a.cancelled)
            co_return decision{failure::make(cancelled_error{o.name})};
        std::optional<failure>& unreachable = a.unreachable;
        const std::optional<reply>& r = a.value;
        const auto event = [&](telemetry_kind k, std::chrono::nanoseconds waited, rejection_reason why) {
            return telemetry_event{.kind = k,
                                   .policy = telemetry_policy,
                                   .name = o.name,
                                   .attempt = attempt,
                                   .duration = waited,
                                   .reason = why};
        };
        if (!unreachable &&
            (r->type != reply::kind::array || r->elements.size() != 2 ||
             r->elements[0].type != reply::kind::integer || r->elements[1].type != reply::kind::integer))
            unreachable.emplace(
                failure::make(error{errc::protocol, "unexpected reply from the limiter script"}));
        if (unreachable) {
            if (std::optional<failure> thrown = s->health.lost(listener, s->clock, o.name, *unreachable))
                co_return decision{std::move(thrown)};
            switch (o.when_unavailable) {
            case unavailable_policy::fail_open:
                co_return decision{};
            case unavailable_policy::local_share:
                co_return decision{std::nullopt, true};
            case unavailable_policy::fail_closed:
                break;
            }
            const auto retry_after =
                std::max<std::chrono::nanoseconds>(s->conn.reconnect_in(), std::chrono::milliseconds{1});
            co_return decision{resilience::detail::refused(
                listener, s->clock, event(telemetry_kind::rejection, {}, rejection_reason::no_capacity),
                failure::make(rate_limited_error{o.name, retry_after, rejection_reason::no_capacity}))};
        }
        if (std::optional<failure> thrown = s->health.answered(listener, s->clock, o.name))
            co_return decision{std::move(thrown)};
        const std::chrono::nanoseconds wait = told_wait(r->elements[1].integer);
        if (r->elements[0].integer != 1) {
            const rejection_reason why = o.queue_limit == 0 ? rejection_reason::no_capacity
                                         : !may_wait        ? rejection_reason::queue_full
                                                            : rejection_reason::queue_timeout;
            co_return decision{
                resilience::detail::refused(listener, s->clock, event(telemetry_kind::rejection, {}, why),
                                            failure::make(rate_limited_error{o.name, wait, why}))};
        }
        if (wait > std::chrono::nanoseconds::zero()) {
            const auto until = resilience::detail::add_saturating(s->clock.now(), wait);
            auto sleeping = s->clock.sleep_until(until, token);
            co_await std::move(sleeping);
            place.reset();
            if (token.stop_requested())
                co_return decision{failure::make(cancelled_error{o.name})};
            if (std::optional<failure> thrown = resilience::detail::emit_caught(
                    listener, s->clock,
                    event(telemetry_kind::queue_wait, wait, rejection_reason::no_capacity)))
                co_return decision{std::move(thrown)};
        }
        co_return decision{};
    }

    // Redis's answer (microseconds) in nanoseconds, held at the longest wait `rs::rate_limiter`
    // tells (about 146 years) as its due times and `retry_after` are: beyond about 292 years the
    // nanoseconds would overflow, and a sleep or `retry_after` come out negative.
    static std::chrono::nanoseconds told_wait(long long us) noexcept {
        constexpr long long longest_us = resilience::detail::longest_wait.count() / 1000;
        if (us <= 0)
            return std::chrono::nanoseconds::zero();
        if (us > longest_us)
            return resilience::detail::longest_wait;
        return std::chrono::microseconds{us};
    }

    static rate_limiter_options validated(rate_limiter_options o) {
        const std::string who = ::resilience::detail::policy_label("redis::rate_limiter", o.name) + ": ";
        detail::validate_shared(o, who);
        if (o.token_limit == 0)
            throw std::invalid_argument(who + "token_limit must be positive, got 0");
        if (!std::isfinite(o.tokens_per_second) || !(o.tokens_per_second > 0))
            throw std::invalid_argument(who + "tokens_per_second must be finite and positive, got " +
                                        resilience::detail::format_number(o.tokens_per_second));
        if (o.tokens_per_second < ::resilience::rate_limiter_options::min_tokens_per_second)
            throw std::invalid_argument(who + "tokens_per_second must be at least 1e-9, got " +
                                        resilience::detail::format_number(o.tokens_per_second));
        if (static_cast<double>(o.token_limit) > 1e15)
            throw std::invalid_argument(who + "token_limit must be at most 1e15, got " +
                                        std::to_string(o.token_limit));
        resilience::detail::validate_queue_options(o, who);
        return o;
    }
};

} // namespace resilience::redis
