// SPDX-License-Identifier: MIT
// Must not compile: the second element of the pipeline is not a policy.
// expect: pipeline_element<1, not_a_policy>
#include <resilience/resilience.hpp>

namespace rs = resilience;

struct not_a_policy {};

void build() {
    const rs::pipeline p{rs::retry{}, not_a_policy{}, rs::timeout{std::chrono::seconds{1}}};
    (void)p;
}
