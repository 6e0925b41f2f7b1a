// SPDX-License-Identifier: MIT
// Must not compile on g++ before 13: execute(f, args...) with f a lambda that owns a std::string,
// written inside co_await: f is as much a temporary of the expression as a lone action would be.
// expect: passed to execute(f, args...), is destroyed twice when written inside co_await
#include <resilience/resilience.hpp>

#include <string>

namespace rs = resilience;

rs::task<int> use(std::string prefix, int id, resilience::stop_token st);

rs::task<int> call(const rs::retry<>& r, std::string prefix) {
    co_return co_await r.execute([prefix](int id, resilience::stop_token st) { return use(prefix, id, st); },
                                 7);
}
