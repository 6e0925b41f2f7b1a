// SPDX-License-Identifier: MIT
// Must not compile on g++ before 13: a lambda that captures a std::string by value, written inside
// co_await, which g++ 12 destroys twice (a double free; see tests/gcc_closure_double_free.cpp).
// expect: passed to execute, is destroyed twice when written inside co_await
#include <resilience/resilience.hpp>

#include <string>

namespace rs = resilience;

rs::task<int> use(std::string key, resilience::stop_token st);

rs::task<int> call(const rs::retry<>& r, std::string key) {
    co_return co_await r.execute([key](resilience::stop_token st) { return use(key, st); });
}
