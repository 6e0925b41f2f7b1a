// SPDX-License-Identifier: MIT
// Must not compile: the action wants an argument that execute cannot give it.
// expect: an action must be callable with
#include <resilience/resilience.hpp>

namespace rs = resilience;

rs::task<int> call(const rs::retry<>& r) {
    co_return co_await r.execute([](int x) -> rs::task<int> { co_return x; });
}
