// SPDX-License-Identifier: MIT
// Must not compile: execute(policy, action, use_future) takes the executor from use_future's handler,
// which has none but the system context's.
// expect: this token's handler has no executor of its own to run the call on
#include <resilience/boost_asio.hpp>
#include <resilience/resilience.hpp>

#include <boost/asio/use_future.hpp>

namespace rs = resilience;

rs::task<int> fetch();

auto call(const rs::retry<>& policy) {
    return rs::boost_asio::execute(
        policy, [] { return fetch(); }, boost::asio::use_future);
}
