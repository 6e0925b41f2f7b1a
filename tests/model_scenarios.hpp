// SPDX-License-Identifier: MIT
// Runs seeded scenarios of a reference model against its policy, for Catch2 (see tests/models.hpp).
#pragma once

#include "catch.hpp"
#include "models.hpp"

#include <cstdint>

namespace resilience_models {

/// Plays `scenario_count(fallback)` scenarios through `check` (a `comparison(chooser&)`); the
/// first disagreement fails the test with its seed, its setup and both traces.
template <class Check>
void run_scenarios(int fallback, Check check) {
    const int n = scenario_count(fallback);
    for (int i = 0; i < n; ++i) {
        const std::uint64_t seed = scenario_seed(i);
        chooser pick{seed};
        const comparison c = check(pick);
        if (!c.agree()) {
            INFO("seed " << seed << " (replay: RESILIENCE_MODEL_SEED=" << seed
                         << " RESILIENCE_MODEL_SCENARIOS=1): " << c.setup);
            INFO("model:\n" << to_string(c.expected) << "policy:\n" << to_string(c.actual));
            FAIL("the policy and its model disagree");
        }
    }
    SUCCEED(n << " scenarios agree");
}

} // namespace resilience_models
