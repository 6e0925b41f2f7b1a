// SPDX-License-Identifier: MIT
// Compile-cost baseline for a file that uses one policy: its header alone, nothing instantiated, against
// include_only.cpp's umbrella header (see bench/README.md, "Build cost").
#include <resilience/retry.hpp>

int main() {
    return 0;
}
