// SPDX-License-Identifier: MIT
// The definitions of detail/stages.hpp that do not depend on a user's type: included by the header
// (header-only), or compiled once into resilience::compiled (detail/config.hpp).
#pragma once

#include "../detail/stages.hpp"

namespace resilience::inline v0_2::detail {

RESILIENCE_DECL std::string nowhere_to_sleep_message(const sleeper& found, const std::string& name) {
    std::string m = "resilience::";
    m += found.kind;
    if (!name.empty())
        m += " (" + name + ")";
    m += " may sleep on the default clock (";
    m += found.why;
    m += "), and this call has nowhere to sleep: no event loop runs on this thread and the call was not "
         "started by rs::boost_asio::execute or rs::asio::execute. Run it under rs::sync_wait or an "
         "rs::event_loop, start it with rs::boost_asio::execute (rs::asio::execute), or give the policy "
         "a clock (rs::boost_asio::clock{executor})";
    return m;
}

} // namespace resilience::detail
