// SPDX-License-Identifier: MIT
// Compiles and runs against the installed headers only; exits 0 when the umbrella header works.
#include <resilience/resilience.hpp>

int main() {
    return resilience::sync_wait([]() -> resilience::task<int> { co_return 0; }());
}
