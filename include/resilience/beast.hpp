// SPDX-License-Identifier: MIT
/// \file beast.hpp
/// Optional Beast integration: `rs::http::response_traits` for Beast's `http::response<Body, Fields>`,
/// so `rs::http::response_classifier` reads a Beast response's status and Retry-After field with no
/// code of the user's. With <resilience/boost_asio.hpp>, a Beast client's own awaitable is the action
/// of `rs::boost_asio::execute` (examples/beast_client.cpp does all of it).
///
///     rs::retry r{{.max_attempts = 4,
///                  .should_handle = rs::http::response_classifier<beast::http::response<beast::http::string_body>>{}}};
///
/// Needs Boost's headers (CMake target resilience::beast).
#pragma once

#include "http.hpp"

#include <boost/beast/http/field.hpp>
#include <boost/beast/http/message.hpp>

#include <optional>
#include <string_view>

/// Beast's response: the status is `result_int()`, Retry-After the first field of that name. The
/// view refers to the response's fields and is valid while the response lives unchanged.
template <class Body, class Fields>
struct resilience::http::response_traits<boost::beast::http::message<false, Body, Fields>> {
    using response = boost::beast::http::message<false, Body, Fields>;

    static int status(const response& r) noexcept { return static_cast<int>(r.result_int()); }

    static std::optional<std::string_view> retry_after(const response& r) {
        const auto it = r.find(boost::beast::http::field::retry_after);
        if (it == r.end())
            return std::nullopt;
        const auto value = it->value();
        return std::string_view{value.data(), value.size()};
    }
};
