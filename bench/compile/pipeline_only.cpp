// SPDX-License-Identifier: MIT
// Compile cost of building five_policies.cpp's pipeline and calling nothing: what the policies'
// constructors and destructors cost a file (see bench/README.md, "Build cost").
#include "pipeline_of_five.hpp"

int main() {
    auto p = bench_compile::pipeline_of_five();
    return sizeof(p) > 1 ? 0 : 1;
}
