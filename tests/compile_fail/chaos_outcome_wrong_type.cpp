// SPDX-License-Identifier: MIT
// Must not compile: a chaos outcome whose substitute is not what the action returns.
// expect: resilience::chaos::outcome: the substitute must give what the action returns
#include <resilience/resilience.hpp>

#include <string>

namespace rs = resilience;

rs::task<int> call() {
    rs::chaos::outcome wrong{std::string("not a number"), {.injection_rate = 1}};
    co_return co_await wrong.execute([]() -> rs::task<int> { co_return 1; });
}
