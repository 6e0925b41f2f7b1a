// SPDX-License-Identifier: MIT
// Fuzz target: a scenario made from the bytes, played through a policy on virtual time and through
// its reference model (tests/models.hpp); the first byte picks the policy. A disagreement aborts
// with both traces.

#include "targets.hpp"

#include "models.hpp"

#include <cstdio>
#include <cstdlib>

namespace resilience_fuzz {

int model(const std::uint8_t* data, std::size_t size) {
    if (size == 0)
        return 0;
    namespace rm = resilience_models;
    rm::chooser pick{data + 1, size - 1};
    rm::comparison c;
    switch (data[0] % 7) {
    case 0:
        c = rm::check_token_bucket(pick);
        break;
    case 1:
        c = rm::check_sliding_window(pick);
        break;
    case 2:
        c = rm::check_bulkhead(pick);
        break;
    case 3:
        c = rm::check_breaker(pick);
        break;
    case 5:
        c = rm::check_breaker_window(pick);
        break;
    case 6:
        c = rm::check_throttle(pick);
        break;
    default:
        c = rm::check_retry_timeout(pick);
        break;
    }
    if (!c.agree()) {
        std::fprintf(
            stderr, "resilience fuzz finding: the policy and its model disagree\n%s\nmodel:\n%s\npolicy:\n%s",
            c.setup.c_str(), rm::to_string(c.expected).c_str(), rm::to_string(c.actual).c_str());
        std::abort();
    }
    return 0;
}

} // namespace resilience_fuzz
