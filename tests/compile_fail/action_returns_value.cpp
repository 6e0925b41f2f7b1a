// SPDX-License-Identifier: MIT
// Must not compile: the action returns a plain int, not an awaitable.
// expect: an action must return an awaitable such as rs::task<T>
#include <resilience/resilience.hpp>

namespace rs = resilience;

rs::task<int> call(const rs::retry<>& r) {
    co_return co_await r.execute([] { return 42; });
}
