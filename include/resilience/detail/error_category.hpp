// SPDX-License-Identifier: MIT
/// \file detail/error_category.hpp
/// `errc_category<E>`: the `std::error_category` of one of the library's error enums, made from the
/// enum's description (`errc_text<E>`), so that each enum says only its name, its messages and the
/// standard conditions it matches, and the category's machinery is written once.
#pragma once

#include <cstddef>
#include <iterator>
#include <string>
#include <system_error>

namespace resilience::inline v0_2::detail {

/// Specialised for each error enum `E` whose values run 1, 2, ...:
///
///     static constexpr const char* name;          // the category's name
///     static constexpr const char* messages[];    // the message of value v at [v - 1]
///     static constexpr const char* unknown;       // the message of any other value
///     static std::errc standard(E) noexcept;      // the standard condition it matches, or std::errc{}
template <class E>
struct errc_text;

template <class E>
class errc_category final : public std::error_category {
public:
    const char* name() const noexcept override { return errc_text<E>::name; }
    std::string message(int value) const override {
        const auto& messages = errc_text<E>::messages;
        if (value >= 1 && static_cast<std::size_t>(value) <= std::size(messages))
            return messages[value - 1];
        return errc_text<E>::unknown;
    }
    // Code written against the standard conditions (`ec == std::errc::timed_out`) should recognise
    // ours without knowing this library; the comparison asks the code's category first.
    bool equivalent(int value, const std::error_condition& condition) const noexcept override {
        const std::errc standard = errc_text<E>::standard(static_cast<E>(value));
        if (standard != std::errc{} && condition == standard)
            return true;
        return default_error_condition(value) == condition;
    }
};

/// The one category object of `E` for the whole program.
template <class E>
const std::error_category& category_of() noexcept {
    static const errc_category<E> category;
    return category;
}

} // namespace resilience::detail
