// SPDX-License-Identifier: MIT
/// \file redis/error.hpp
/// `redis::error` and `redis::errc`: why a Redis command failed without a reply.
#pragma once

#include "../detail/error_category.hpp"

#include <cstddef>
#include <iterator>
#include <string>
#include <system_error>
#include <type_traits>

namespace resilience::inline v0_2::redis {

/// Why a Redis command failed without a reply from the server's script or command.
enum class errc {
    unavailable = 1, ///< no connection: the connect failed, or the connection waits out its reconnect backoff
    connection_lost, ///< the connection broke with the command in flight: it may or may not have run
    timeout,         ///< no reply within `command_timeout`: it may or may not have run
    protocol,        ///< the server sent something that is not RESP, or a reply nobody asked for
    server,          ///< the server answered with an error reply (its text is `what()`)
};

} // namespace resilience::redis

template <>
struct resilience::detail::errc_text<resilience::redis::errc> {
    static constexpr const char* name = "resilience.redis";
    static constexpr const char* messages[] = {
        "redis unavailable",    "redis connection lost", "redis command timed out",
        "redis protocol error", "redis error reply",
    };
    static_assert(std::size(messages) == static_cast<std::size_t>(resilience::redis::errc::server));
    static constexpr const char* unknown = "unknown redis error";
    static std::errc standard(resilience::redis::errc) noexcept { return std::errc{}; }
};

namespace resilience::inline v0_2::redis {

/// The category of `redis::errc`; one object for the whole program.
inline const std::error_category& error_category() noexcept {
    return resilience::detail::category_of<errc>();
}
inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), error_category()};
}

/// A Redis command failed: `code()` is a `redis::errc`. A `std::system_error`, not an `rs::error`:
/// it says what happened to the connection, not what a policy decided (the policies turn it into
/// their own refusal, or let the call through, as their options say).
class error : public std::system_error {
public:
    explicit error(errc e, const std::string& what = {}) : std::system_error(make_error_code(e), what) {}
};

} // namespace resilience::redis

template <>
struct std::is_error_code_enum<resilience::redis::errc> : std::true_type {};
