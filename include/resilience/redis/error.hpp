// SPDX-License-Identifier: MIT
/// \file redis/error.hpp
/// `redis::error` and `redis::errc`: why a Redis command failed without a reply.
#pragma once

#include <string>
#include <system_error>
#include <type_traits>

namespace resilience::redis {

/// Why a Redis command failed without a reply from the server's script or command.
enum class errc {
    unavailable = 1, ///< no connection: the connect failed, or the connection waits out its reconnect backoff
    connection_lost, ///< the connection broke with the command in flight: it may or may not have run
    timeout,         ///< no reply within `command_timeout`: it may or may not have run
    protocol,        ///< the server sent something that is not RESP, or a reply nobody asked for
    server,          ///< the server answered with an error reply (its text is `what()`)
};

namespace detail {
class error_category_impl final : public std::error_category {
public:
    const char* name() const noexcept override { return "resilience.redis"; }
    std::string message(int value) const override {
        switch (static_cast<errc>(value)) {
        case errc::unavailable:
            return "redis unavailable";
        case errc::connection_lost:
            return "redis connection lost";
        case errc::timeout:
            return "redis command timed out";
        case errc::protocol:
            return "redis protocol error";
        case errc::server:
            return "redis error reply";
        }
        return "unknown redis error";
    }
};
} // namespace detail

/// The category of `redis::errc`; one object for the whole program.
inline const std::error_category& error_category() noexcept {
    static const detail::error_category_impl category;
    return category;
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
