// SPDX-License-Identifier: MIT
/// \file fmt.hpp
/// Optional fmt formatters for the library's vocabulary types (needs fmt 9 or later).
///
///     fmt::print("{}\n", rs::errc::circuit_open);            // circuit open
///     fmt::print("call failed: {}\n", outcome.error());       // the exception's what()
///     fmt::print("{}\n", rs::outcome<int>{42});               // value(42)
#pragma once

#include "error.hpp"
#include "outcome.hpp"

#include <fmt/format.h>

#include <string_view>

template <>
struct fmt::formatter<resilience::errc> : fmt::formatter<std::string_view> {
    template <class FormatContext>
    auto format(resilience::errc e, FormatContext& ctx) const -> decltype(ctx.out()) {
        const std::string message = resilience::error_category().message(static_cast<int>(e));
        return fmt::formatter<std::string_view>::format(message, ctx);
    }
};

/// A failure prints as its exception's `what()`.
template <>
struct fmt::formatter<resilience::failure> : fmt::formatter<std::string_view> {
    template <class FormatContext>
    auto format(const resilience::failure& f, FormatContext& ctx) const -> decltype(ctx.out()) {
        const std::string text = f.what();
        return fmt::formatter<std::string_view>::format(text, ctx);
    }
};

/// An outcome prints as `value(<value>)`, `value()` for `outcome<void>`, or `failure(<what>)`.
template <class T>
struct fmt::formatter<resilience::outcome<T>> {
    constexpr auto parse(fmt::format_parse_context& ctx) -> decltype(ctx.begin()) { return ctx.begin(); }
    template <class FormatContext>
    auto format(const resilience::outcome<T>& o, FormatContext& ctx) const -> decltype(ctx.out()) {
        if (o.has_failure())
            return fmt::format_to(ctx.out(), "failure({})", o.error().what());
        if constexpr (std::is_void_v<T>)
            return fmt::format_to(ctx.out(), "value()");
        else
            return fmt::format_to(ctx.out(), "value({})", o.value());
    }
};
