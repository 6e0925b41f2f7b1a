// SPDX-License-Identifier: MIT
// The pipeline and dependency of five_policies.cpp and second_call_site.cpp (see bench/README.md).
#pragma once

#include <resilience/resilience.hpp>

namespace bench_compile {

namespace rs = resilience;
using namespace std::chrono_literals;

inline rs::task<int> dependency() {
    co_return 42;
}

inline auto pipeline_of_five() {
    return rs::pipeline{rs::retry{}, rs::circuit_breaker{{.failure_threshold = 5}}, rs::timeout{1s},
                        rs::bulkhead{{.max_concurrent_calls = 8}},
                        rs::rate_limiter{{.token_limit = 10, .tokens_per_second = 10}}};
}

} // namespace bench_compile
