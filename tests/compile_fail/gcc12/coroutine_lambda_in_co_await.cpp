// SPDX-License-Identifier: MIT
// Must not compile on g++ before 13: a coroutine lambda that captures a std::string by value,
// written inside co_await (here through execute_outcome), which g++ 12 destroys twice.
// expect: passed to execute, is destroyed twice when written inside co_await
#include <resilience/resilience.hpp>

#include <string>

namespace rs = resilience;

rs::task<int> use(std::string key, resilience::stop_token st);

rs::task<rs::outcome<int>> call(const rs::retry<>& r, std::string key) {
    co_return co_await r.execute_outcome(
        [key](resilience::stop_token st) -> rs::task<int> { co_return co_await use(key, st); });
}
