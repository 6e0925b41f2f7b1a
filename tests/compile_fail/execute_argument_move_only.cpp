// SPDX-License-Identifier: MIT
// Must not compile: execute(f, args...) passes the argument it keeps to f again at every attempt, so f
// cannot take a move-only one by value; the message names the fixes, and is the only error.
// expect: so f cannot take a move-only argument (a std::unique_ptr?) by value or by &&. Wrap it in a std::shared_ptr
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>

#include <memory>

namespace rs = resilience;

rs::task<int> read_value(std::unique_ptr<int> p, resilience::stop_token) {
    co_return *p;
}

rs::task<int> call(const rs::retry<>& r) {
    co_return co_await r.execute(read_value, std::make_unique<int>(1));
}
