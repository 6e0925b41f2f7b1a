// SPDX-License-Identifier: MIT
// Must not compile: execute(f, args...) keeps a copy of each argument, and this one cannot be copied;
// the message names std::ref, the fix.
// expect: Pass it by reference with std::ref(x)
#include <resilience/resilience.hpp>

#include <mutex>

namespace rs = resilience;

rs::task<int> guarded(std::mutex& m) {
    std::lock_guard lock(m);
    co_return 1;
}

rs::task<int> call(const rs::retry<>& r, std::mutex& m) {
    co_return co_await r.execute(guarded, m);
}
