// SPDX-License-Identifier: MIT
// Must not compile: execute(policy, action, callback) with a plain callback, which has no executor
// of its own to run the call on.
// expect: this token's handler has no executor of its own to run the call on
#include <resilience/boost_asio.hpp>
#include <resilience/resilience.hpp>

namespace rs = resilience;

rs::task<int> fetch();

void call(const rs::retry<>& policy) {
    rs::boost_asio::execute(
        policy, [] { return fetch(); }, [](std::exception_ptr, int) {});
}
