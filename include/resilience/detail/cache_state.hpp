// SPDX-License-Identifier: MIT
/// \file detail/cache_state.hpp
/// The parts of `cache` (cache.hpp) that do not depend on how a refresh is made: the table of
/// entries with its least-recently-used order, the immutable block of options a call reads, what a
/// refresh hands the callers that waited for it, the default answer to "is this failure worth
/// remembering", and the options' validation.
#pragma once

#include "snapshot_cell.hpp"

#include "../classifier.hpp"
#include "../error.hpp"
#include "../outcome.hpp"
#include "label.hpp"

#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

namespace resilience::detail {

/// The default of `cache_options::should_handle` for a failure: remembered for `negative_ttl`,
/// unless it is a cancellation (the caller gave up: nothing was learnt about the dependency) or one
/// of the library's own refusals (a breaker, bulkhead, limiter or throttle that refused the call
/// said something about this process, not about the key). A timeout is remembered: the dependency
/// was too slow. Costs one rethrow for a failure the library did not make.
inline bool remembered_by_default(const failure& f) noexcept {
    const auto by_code = [](errc c) { return c == errc::timeout; };
    if (!f.has_exception())
        return false;
    if (f.code() != errc{})
        return by_code(f.code());
    try {
        f.rethrow();
    } catch (const error& e) {
        // The library's own errors, caught from an action that threw them: read their code.
        return e.code().category() == error_category() ? by_code(static_cast<errc>(e.code().value())) : true;
    } catch (...) {
        return true;
    }
}

/// One configuration of a cache (`Options` is `cache_options<T>`), immutable once published: a call
/// pins the block in force once, where it starts, and uses it to its end (and so does the refresh
/// it makes); a block replaced by a reconfiguration is freed once no call pins it.
template <class Options>
struct cache_config : pinnable {
    explicit cache_config(Options o) : options(std::move(o)) {}

    const Options options;
};

/// Whether `a` and `b` (`cache_options<T>`) are the same options: a reconfiguration from one to
/// the other changes nothing. The classifier and the listener compare by identity (copies of one
/// are the same); options with a `ttl_of` are never the same as any (it cannot be compared).
template <class Options>
bool same_cache_options(const Options& a, const Options& b) noexcept {
    return !a.ttl_of && !b.ttl_of && a.name == b.name && a.ttl == b.ttl &&
           a.stale_while_revalidate == b.stale_while_revalidate && a.stale_if_error == b.stale_if_error &&
           a.max_entries == b.max_entries && a.negative_ttl == b.negative_ttl &&
           a.should_handle.same_as(b.should_handle) && a.telemetry.same_as(b.telemetry);
}

/// What a refresh hands every caller that waited for it (through its `single_flight`): the outcome
/// of the call, and, when it failed while a stale value was still within its `stale_if_error`
/// allowance, that value to answer with instead. Decided once, by the refresh, under the cache's
/// lock, so every caller of one refresh gets the same answer.
template <class T>
struct cache_refresh {
    outcome<T> result;
    std::shared_ptr<const T> stale{};     // set: answer with this value (stale_if_error)
    std::chrono::nanoseconds stale_for{}; // how long past its freshness the stale value was
};

/// The entries of a cache: a hash table of keys, each with its value and its remembered failure,
/// and a list through them from the most recently used to the least, which is evicted first once
/// there are more than `max_entries`. Not synchronised: the cache holds its lock around every use.
/// Nothing here calls user code but `Hash` and `KeyEqual`; what leaves the table (an evicted or
/// erased entry, whose destruction runs `T`'s and `Key`'s destructors) is handed back as a node for
/// the caller to destroy once the lock is released.
template <class Key, class T, class TimePoint, class Hash, class KeyEqual>
class cache_table {
public:
    struct entry {
        std::shared_ptr<const T> value{};             // null: no value
        TimePoint expires{};                          // the value is fresh before this instant
        std::shared_ptr<const outcome<T>> negative{}; // null: no failure remembered
        TimePoint failed{}; // when the failure was remembered: each lookup adds its own `negative_ttl`
        entry* newer = nullptr;
        entry* older = nullptr;
        const Key* key = nullptr; // the key in the table's node, which never moves
    };
    using map_type = std::unordered_map<Key, entry, Hash, KeyEqual>;
    using node_type = typename map_type::node_type;

    cache_table(std::size_t max_entries, Hash hash, KeyEqual equal)
        : max_(max_entries), map_(0, std::move(hash), std::move(equal)) {}
    cache_table(const cache_table&) = delete;
    cache_table& operator=(const cache_table&) = delete;

    /// The entry of `key`, made the most recently used, or null.
    entry* use(const Key& key) {
        const auto it = map_.find(key);
        if (it == map_.end())
            return nullptr;
        touch(it->second);
        return &it->second;
    }
    /// The entry of `key` without changing the order, or null.
    entry* peek(const Key& key) {
        const auto it = map_.find(key);
        return it == map_.end() ? nullptr : &it->second;
    }
    /// The entry of `key`, made if there is none, and made the most recently used. A new entry
    /// beyond `max_entries` evicts the least recently used one, which is put in `evicted`.
    entry& upsert(const Key& key, node_type& evicted) {
        auto [it, made] = map_.try_emplace(key);
        entry& e = it->second;
        if (!made) {
            touch(e);
            return e;
        }
        e.key = &it->first;
        link_newest(e);
        if (map_.size() > max_) {
            entry* last = oldest_;
            unlink(*last);
            evicted = map_.extract(*last->key);
        }
        return e;
    }
    /// Takes `key`'s entry out (empty node: there was none).
    node_type erase(const Key& key) {
        const auto it = map_.find(key);
        if (it == map_.end())
            return {};
        unlink(it->second);
        return map_.extract(it);
    }
    /// Takes every entry out, into `out` (empty), for the caller to destroy.
    void clear(map_type& out) noexcept {
        out.swap(map_);
        newest_ = oldest_ = nullptr;
    }
    [[nodiscard]] std::size_t size() const noexcept { return map_.size(); }

    /// Makes `n` (positive) the most entries kept, evicting the least recently used down to it at
    /// once, into `evicted` (appended, for the caller to destroy). Throws `std::bad_alloc` (making
    /// room in `evicted`) before anything changed.
    void limit(std::size_t n, std::vector<node_type>& evicted) {
        if (map_.size() > n)
            evicted.reserve(evicted.size() + (map_.size() - n));
        max_ = n;
        while (map_.size() > max_) {
            entry* last = oldest_;
            unlink(*last);
            evicted.push_back(map_.extract(*last->key)); // room reserved: does not throw
        }
    }

private:
    void link_newest(entry& e) noexcept {
        e.older = newest_;
        e.newer = nullptr;
        if (newest_)
            newest_->newer = &e;
        newest_ = &e;
        if (!oldest_)
            oldest_ = &e;
    }
    void unlink(entry& e) noexcept {
        (e.newer ? e.newer->older : newest_) = e.older;
        (e.older ? e.older->newer : oldest_) = e.newer;
        e.newer = e.older = nullptr;
    }
    void touch(entry& e) noexcept {
        if (newest_ == &e)
            return;
        unlink(e);
        link_newest(e);
    }

    std::size_t max_;
    map_type map_;
    entry* newest_ = nullptr;
    entry* oldest_ = nullptr;
};

/// The outcome of an action that may produce anything convertible to `T`, as the `T` a cache keeps.
template <class T, class R>
outcome<T> cache_converted(outcome<R>&& r) {
    if constexpr (std::is_same_v<R, T>) {
        return std::move(r);
    } else {
        if (r.has_failure())
            return r.error();
        try {
            return outcome<T>(static_cast<T>(std::move(*r)));
        } catch (...) {
            return failure::current();
        }
    }
}

/// `o` (a `cache_options<T>`), or `std::invalid_argument` naming the first bad field and its value.
template <class T, class Options>
Options validated_cache_options(Options o) {
    const std::string label = policy_label("cache", o.name);
    const auto bad = [&](const char* field, const char* rule, std::chrono::nanoseconds v) {
        throw std::invalid_argument(label + ": " + field + " must be " + rule + ", got " +
                                    std::to_string(v.count()) + "ns");
    };
    if (o.ttl <= std::chrono::nanoseconds::zero())
        bad("ttl", "positive", o.ttl);
    if (o.stale_while_revalidate < std::chrono::nanoseconds::zero())
        bad("stale_while_revalidate", "zero or positive", o.stale_while_revalidate);
    if (o.stale_if_error < std::chrono::nanoseconds::zero())
        bad("stale_if_error", "zero or positive", o.stale_if_error);
    if (o.max_entries == 0)
        throw std::invalid_argument(label + ": max_entries must be positive, got 0");
    if (o.negative_ttl < std::chrono::nanoseconds::zero())
        bad("negative_ttl", "zero or positive", o.negative_ttl);
    if (!o.should_handle.template accepts<T>())
        throw std::invalid_argument(label + ": should_handle classifies rs::outcome<" +
                                    type_name(*o.should_handle.value_type()) + "> but the cache holds " +
                                    type_name(typeid(T)));
    return o;
}

} // namespace resilience::detail
