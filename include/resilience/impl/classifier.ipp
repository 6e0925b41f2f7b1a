// SPDX-License-Identifier: MIT
// The definitions of <resilience/classifier.hpp> that do not depend on a user's type: included by the
// header (header-only), or compiled once into resilience::compiled (detail/config.hpp).
#pragma once

#include "../classifier.hpp"

namespace resilience::inline v0_2::detail {

RESILIENCE_DECL failure classifier_mismatch(const std::type_info& classified, const std::type_info& returned,
                                            const char* policy, const std::string& name) {
    return failure::make(
        std::invalid_argument(policy_label(policy, name) + ": should_handle classifies rs::outcome<" +
                              type_name(classified) + "> but the action returns " + type_name(returned)));
}

RESILIENCE_DECL failure refused_before_admission(const classifier* c, const std::type_info& returned,
                                                 const char* policy, const std::string& name) {
    if (c && !c->accepts(returned))
        return c->mismatch(returned, policy, name);
    return cancelled_failure(name);
}

} // namespace resilience::detail

namespace resilience::inline v0_2 {

RESILIENCE_DECL bool is_transient(const failure& f) noexcept {
    if (!f.has_exception())
        return false;
    if (f.code() == errc::cancelled || f.code() == errc::circuit_open || f.code() == errc::circuit_isolated ||
        f.code() == errc::throttled || f.code() == errc::no_endpoint)
        return false;
    if (f.code() != errc{})
        return true; // the library's other failures (timeout, rejections) are transient: no rethrow needed
    // By code, not by type: the policies' own errors are declared in their folders, above this layer.
    const auto refused_on_purpose = [](std::error_code c) {
        return c == errc::cancelled || c == errc::circuit_open || c == errc::circuit_isolated ||
               c == errc::throttled || c == errc::no_endpoint;
    };
    try {
        f.rethrow();
    } catch (const error& e) {
        return !refused_on_purpose(e.code());
    } catch (const std::logic_error&) {
        return false;
    } catch (...) {
        return true;
    }
}

} // namespace resilience
