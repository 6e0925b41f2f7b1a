// SPDX-License-Identifier: MIT
// The definitions of engine/call_edges.hpp that do not depend on a user's type: included by the header
// (header-only), or compiled once into resilience::compiled (detail/config.hpp).
#pragma once

#include "../engine/call_edges.hpp"

namespace resilience::inline v0_2::detail {

RESILIENCE_DECL bool stands_for_a_stop(const failure& f) noexcept {
    if (f.code() != errc{})
        return f.code() != errc::cancelled; // the library's own: no rethrow needed
    if (!f.has_exception())
        return true;
    try {
        f.rethrow();
    } catch (const cancelled_error&) {
        return false;
    } catch (const std::logic_error&) {
        return false;
    } catch (...) {
    }
    return true;
}

} // namespace resilience::detail
