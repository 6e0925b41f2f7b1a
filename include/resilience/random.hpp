// SPDX-License-Identifier: MIT
/// \file random.hpp
/// Random sources for jitter: a fast per-thread default and a seeded, copyable one for replay.
#pragma once

#include "detail/inlining.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <thread>
#include <type_traits>

namespace resilience::inline v0_2 {

/// A small, fast generator (SplitMix64): 64 random bits a call, copyable, seeded explicitly, so a
/// test or a replay gets the same sequence every run. Not for cryptography.
class seeded_random {
public:
    using result_type = std::uint64_t;
    explicit constexpr seeded_random(std::uint64_t seed = 0) noexcept : state_(seed) {}
    static constexpr result_type min() noexcept { return 0; }
    static constexpr result_type max() noexcept { return std::numeric_limits<result_type>::max(); }
    RESILIENCE_DETAIL_ALWAYS_INLINE constexpr result_type operator()() noexcept {
        std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }

private:
    std::uint64_t state_;
};

/// The default random source of every policy: a handle to a per-thread `seeded_random`, seeded once
/// per thread from `std::random_device` and the clock. Stateless itself, so a policy holding one
/// may be used from many threads at once.
struct thread_random {
    using result_type = std::uint64_t;
    static constexpr result_type min() noexcept { return 0; }
    static constexpr result_type max() noexcept { return std::numeric_limits<result_type>::max(); }
    RESILIENCE_DETAIL_ALWAYS_INLINE result_type operator()() const noexcept {
        ahead& a = generator();
        const result_type r = a.next;
        a.next = a.source();
        return r;
    }

private:
    // The word to return next, drawn one call ahead: a caller's work on the word it gets does not
    // wait on the generator's arithmetic, which then runs beside it.
    struct ahead {
        explicit ahead(std::uint64_t s) noexcept : source(s), next(source()) {}
        seeded_random source;
        std::uint64_t next;
    };
    RESILIENCE_DETAIL_ALWAYS_INLINE static ahead& generator() noexcept {
        thread_local ahead g{seed()};
        return g;
    }
    static std::uint64_t seed() noexcept {
        std::uint64_t s =
            static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
        s ^= std::hash<std::thread::id>{}(std::this_thread::get_id()) * 0x9e3779b97f4a7c15ULL;
        try {
            std::random_device rd;
            s ^= (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
        } catch (...) {
            // no entropy device: the clock and thread id still differ between threads and runs
        }
        return s;
    }
};

static_assert(std::uniform_random_bit_generator<seeded_random>);
static_assert(std::uniform_random_bit_generator<thread_random>);

namespace detail {
/// A double uniformly in [0, 1) from any bit generator, using its top 53 bits.
template <class R>
double unit_random(R& rng) {
    using U = typename std::remove_cvref_t<R>::result_type;
    constexpr long double range = static_cast<long double>(std::remove_cvref_t<R>::max()) -
                                  static_cast<long double>(std::remove_cvref_t<R>::min()) + 1.0L;
    const long double x = static_cast<long double>(static_cast<U>(rng() - std::remove_cvref_t<R>::min()));
    double r = static_cast<double>(x / range);
    return r < 1.0 ? r : std::nextafter(1.0, 0.0);
}
} // namespace detail

} // namespace resilience
