// SPDX-License-Identifier: MIT
/// \file resilience.hpp
/// The whole library: every core piece and every policy. Testing helpers live in
/// `resilience/testing/`, optional integrations in `resilience/fmt.hpp` and `resilience/asio.hpp`.
#pragma once

#include "any_clock.hpp"
#include "any_policy.hpp"
#include "backoff.hpp"
#include "bulkhead.hpp"
#include "circuit_breaker.hpp"
#include "clock.hpp"
#include "concepts.hpp"
#include "context.hpp"
#include "error.hpp"
#include "event_loop.hpp"
#include "fallback.hpp"
#include "hedge.hpp"
#include "outcome.hpp"
#include "pipeline.hpp"
#include "policy.hpp"
#include "random.hpp"
#include "rate_limiter.hpp"
#include "retry.hpp"
#include "retry_budget.hpp"
#include "single_flight.hpp"
#include "sliding_window_limiter.hpp"
#include "task.hpp"
#include "telemetry.hpp"
#include "timeout.hpp"
#include "when_all.hpp"
