// SPDX-License-Identifier: MIT
/// \file cache/table.hpp
/// The entries of a `cache` (cache.hpp): a hash table of keys with their values and remembered
/// failures, in least-recently-used order, evicting the oldest beyond `max_entries`. Not
/// synchronised: the cache's state (state.hpp) holds its lock around every use.
#pragma once

#include "../outcome.hpp"

#include <cstddef>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace resilience::inline v0_2::detail {

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

} // namespace resilience::detail
