// SPDX-License-Identifier: MIT
// The fuzz targets, one function each; fuzz/CMakeLists.txt makes one libFuzzer executable per
// function, whose LLVMFuzzerTestOneInput calls it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace resilience_fuzz {

// Options constructors: bytes become option values (NaN, infinities and extremes included); the
// constructor must either throw std::invalid_argument or give a policy that behaves.
int retry_options(const std::uint8_t* data, std::size_t size);
int backoff(const std::uint8_t* data, std::size_t size);
int circuit_breaker_options(const std::uint8_t* data, std::size_t size);
int timeout_options(const std::uint8_t* data, std::size_t size);
int bulkhead_options(const std::uint8_t* data, std::size_t size);
int rate_limiter_options(const std::uint8_t* data, std::size_t size);
int sliding_window_limiter_options(const std::uint8_t* data, std::size_t size);
int retry_budget_options(const std::uint8_t* data, std::size_t size);
int hedge_options(const std::uint8_t* data, std::size_t size);
int adaptive_throttle_options(const std::uint8_t* data, std::size_t size);

// Parsers: a Retry-After value (delay-seconds or any HTTP-date form), after one byte that moves `now`.
int retry_after(const std::uint8_t* data, std::size_t size);

// A policy driven by a random scenario on virtual time against its model (tests/models.hpp).
int model(const std::uint8_t* data, std::size_t size);

} // namespace resilience_fuzz
