// SPDX-License-Identifier: MIT
// A consumer of an `async_generator` on virtual time, for the stream tests: it pulls items and writes
// down each one, the instant it arrived, and how and when the stream ended.
#pragma once

#include <resilience/async_generator.hpp>
#include <resilience/task.hpp>
#include <resilience/testing/simulation.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

namespace resilience_tests {

/// What a consumer saw: the items, the instant each arrived, the failure that ended the stream (if
/// one did) and the instant the consumer stopped pulling.
template <class T>
struct received {
    std::vector<T> items;
    std::vector<std::chrono::nanoseconds> at;
    std::exception_ptr error;
    std::chrono::nanoseconds ended{-1};
};

/// Pulls up to `limit` items from `gen`, noting the virtual instant of each; a failure of the stream
/// is kept in `error`, not thrown.
template <class T>
resilience::task<received<T>> consume(resilience::testing::simulation& sim,
                                      resilience::async_generator<T>& gen,
                                      std::size_t limit = static_cast<std::size_t>(-1)) {
    received<T> r;
    try {
        while (r.items.size() < limit) {
            std::optional<T> v = co_await gen.next();
            if (!v)
                break;
            r.items.push_back(std::move(*v));
            r.at.push_back(sim.now());
        }
    } catch (...) {
        r.error = std::current_exception();
    }
    r.ended = sim.now();
    co_return r;
}

} // namespace resilience_tests
