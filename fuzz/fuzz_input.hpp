// SPDX-License-Identifier: MIT
// Turns a fuzzer's bytes into option values, leaning on the ones that break arithmetic: NaN,
// infinities, zero, negative, the type's minimum and maximum, and raw values.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

namespace resilience_fuzz {

class input {
public:
    input(const std::uint8_t* data, std::size_t size) noexcept : data_(data), size_(size) {}

    std::uint8_t byte() noexcept { return at_ < size_ ? data_[at_++] : 0; }
    std::uint64_t raw() noexcept {
        std::uint64_t v = 0;
        for (int i = 0; i < 8; ++i)
            v = (v << 8) | byte();
        return v;
    }
    bool flag() noexcept { return (byte() & 1) != 0; }

    std::int64_t int64() noexcept {
        switch (byte() % 10) {
        case 0:
            return 0;
        case 1:
            return -1;
        case 2:
            return 1;
        case 3:
            return std::numeric_limits<std::int64_t>::min();
        case 4:
            return std::numeric_limits<std::int64_t>::max();
        case 5:
            return static_cast<std::int64_t>(raw() % 1'000);
        case 6:
            return static_cast<std::int64_t>(raw() % 10'000'000'000);
        case 7:
            return -static_cast<std::int64_t>(raw() % 1'000'000);
        default:
            return static_cast<std::int64_t>(raw());
        }
    }
    std::chrono::nanoseconds duration() noexcept { return std::chrono::nanoseconds{int64()}; }
    int count() noexcept {
        switch (byte() % 8) {
        case 0:
            return 0;
        case 1:
            return -1;
        case 2:
            return std::numeric_limits<int>::min();
        case 3:
            return std::numeric_limits<int>::max();
        case 4:
            return static_cast<int>(raw() % 8);
        case 5:
            return static_cast<int>(raw() % 100);
        default:
            return static_cast<int>(static_cast<std::uint32_t>(raw()));
        }
    }
    std::size_t size() noexcept {
        switch (byte() % 6) {
        case 0:
            return 0;
        case 1:
            return std::numeric_limits<std::size_t>::max();
        case 2:
            return static_cast<std::size_t>(raw() % 8);
        case 3:
            return static_cast<std::size_t>(raw() % 2'000'000);
        default:
            return static_cast<std::size_t>(raw());
        }
    }
    double number() noexcept {
        switch (byte() % 16) {
        case 0:
            return std::numeric_limits<double>::quiet_NaN();
        case 1:
            return std::numeric_limits<double>::infinity();
        case 2:
            return -std::numeric_limits<double>::infinity();
        case 3:
            return 0.0;
        case 4:
            return -0.0;
        case 5:
            return std::numeric_limits<double>::max();
        case 6:
            return std::numeric_limits<double>::lowest();
        case 7:
            return std::numeric_limits<double>::denorm_min();
        case 8:
            return 1e-300;
        case 9:
            return 1e-9;
        case 10:
            return 0.5;
        case 11:
            return 1.0;
        case 12:
            return 2.0;
        case 13:
            return static_cast<double>(raw() % 1000) / 100.0;
        default: {
            const std::uint64_t bits = raw();
            double d;
            std::memcpy(&d, &bits, sizeof d);
            return d;
        }
        }
    }

private:
    const std::uint8_t* data_;
    std::size_t size_;
    std::size_t at_ = 0;
};

} // namespace resilience_fuzz
