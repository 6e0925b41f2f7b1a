// SPDX-License-Identifier: MIT
// Compile-cost baseline: the umbrella header and nothing instantiated (see bench/README.md).
#include <resilience/resilience.hpp>

int main() {
    return 0;
}
