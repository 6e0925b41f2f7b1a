// SPDX-License-Identifier: MIT
/// \file redis.hpp
/// Optional: limits shared by every replica of a service, kept in Redis (needs standalone Asio and
/// hiredis; CMake target `resilience::redis`). The umbrella header `resilience.hpp` does not include it.
///
/// - `redis::connection` (redis/connection.hpp): an asynchronous, pipelined connection on an Asio
///   executor, reconnecting with a backoff, a timeout and a stop token on every command; its
///   errors (`redis::error`, redis/error.hpp) and its replies (`redis::reply`, redis/resp.hpp);
/// - `redis::rate_limiter` (redis/rate_limiter.hpp): a token bucket shared by every process using
///   the same key, one round trip per admission, on Redis's clock;
/// - `redis::bulkhead` (redis/bulkhead.hpp): a concurrency limit across replicas, with leases that
///   expire when a replica dies and that a running call renews;
/// - `redis::unavailable_policy` (redis/script.hpp): what they do while Redis cannot be reached.
///
/// Both policies are pipeline stages like any other, on `rs::asio::clock`:
///
///     rs::pipeline p{rs::retry{{}, clock}, shared_quota, breaker, rs::timeout{2s, clock}};
///
/// docs/redis.md says when a shared limit is worth its round trip, and how each failure is handled.
#pragma once

#include "redis/bulkhead.hpp"
#include "redis/connection.hpp"
#include "redis/error.hpp"
#include "redis/rate_limiter.hpp"
#include "redis/resp.hpp"
#include "redis/script.hpp"
