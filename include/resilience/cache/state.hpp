// SPDX-License-Identifier: MIT
/// \file cache/state.hpp
/// The state the copies of a `cache` (cache.hpp) share, and what does not depend on how a refresh is
/// made: the immutable block of options a call reads, what a refresh hands the callers that waited
/// for it, the default answer to "is this failure worth remembering", and the call paths that read
/// and write the entries (table.hpp) under the cache's lock.
///
/// Locking: `cache_state::mutex_` guards the entry table `table_`, the marks of the background
/// refreshes `background_`, the `epoch_` that `invalidate` and `clear` bump, and the replacement of
/// the options block in `cell_` (read with `cell_.locked()` under it; `pin()` takes no lock). A member
/// function whose name ends in `_locked` must be called holding `mutex_` and never takes it; every
/// other member function that touches what it guards takes it itself. Held, it runs nothing of the
/// user's but `Hash`, `KeyEqual` and the copy of a `Key` into the table, and asks the `single_flight`
/// of the refreshes whether a key is in flight (that takes its own lock: always after this one).
#pragma once

#include "options.hpp"
#include "table.hpp"

#include "../classifier.hpp"
#include "../detail/snapshot_cell.hpp"
#include "../detail/time.hpp"
#include "../error.hpp"
#include "../outcome.hpp"
#include "../policy_kit.hpp"
#include "../single_flight.hpp"
#include "../telemetry_event.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace resilience::inline v0_2::detail {

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

/// The state the copies of one `cache` (cache.hpp) share, and its call paths: a caller's arrival
/// (answered from the entry, or sent to refresh), the end of a refresh (what is stored, and whether a
/// stale value answers its failure), and what a caller that waited for a refresh gets.
///
/// The options live in immutable blocks (`config`), the one in force published through `cell_`
/// (replaced under `mutex_`): a call pins it once, where it starts, and passes it on to everything
/// it does, the refresh it makes included (a background refresh pins it too). What the
/// table itself does (how many entries it keeps) follows the options in force, under `mutex_`.
template <class Key, class T, class C, class Hash, class KeyEqual>
class cache_state {
public:
    using time_point = typename C::time_point;
    using refresh = cache_refresh<T>;
    using flights = single_flight<Key, refresh, Hash, KeyEqual>;
    using table_type = cache_table<Key, T, time_point, Hash, KeyEqual>;
    using config = cache_config<cache_options<T>>; // the options, as a call reads them

    // Copied by bytes, without calling anything of the user's.
    static constexpr bool bytewise = std::is_trivially_copyable_v<T>;

    enum class route : unsigned char { answered, refresh, background };
    struct arrival {
        route how = route::answered;
        std::optional<outcome<T>> answer{};
        // With `route::background`: the mark made for the refresh to start (`background_`).
        std::size_t mark_hash = 0;
        const Key* marked = nullptr;
    };

    cache_state(cache_options<T> o, C c, Hash hash, KeyEqual equal)
        : clock(std::move(c)), refreshes(single_flight_options{.name = o.name}, hash, equal),
          table_(o.max_entries, hash, equal), key_hash_(std::move(hash)), key_equal_(std::move(equal)),
          cell_(std::make_unique<config>(std::move(o))) {}
    cache_state(const cache_state&) = delete;
    cache_state& operator=(const cache_state&) = delete;

    const C clock;
    const flights refreshes; // synchronised by itself; asked under `mutex_` by `arrive`

    /// Pins the block in force now: for a call starting, or for the handle's accessors.
    detail::pinned<config> pin() noexcept { return cell_.pin(); }

    // See `cache::reconfigure`. `o` is validated.
    void reconfigure(cache_options<T> o) {
        {
            std::lock_guard lock(mutex_);
            if (detail::same_cache_options(cell_.locked()->options, o))
                return;
        }
        auto fresh = std::make_unique<config>(std::move(o));
        std::vector<typename table_type::node_type> evicted; // destroyed once the lock is released
        std::lock_guard lock(mutex_);
        table_.limit(fresh->options.max_entries, evicted); // throws before changing anything
        cell_.replace(std::move(fresh));
    }

    static detail::listener_ref own_listener(const config& cfg) noexcept {
        return cfg.options.telemetry ? detail::listener_ref(&cfg.options.telemetry) : detail::listener_ref();
    }
    std::uint64_t current_epoch() const {
        std::lock_guard lock(mutex_);
        return epoch_;
    }
    // Entries stored, whatever their state.
    std::size_t size() const {
        std::lock_guard lock(mutex_);
        return table_.size();
    }
    // Forgets `key`'s entry; a refresh in flight now stores nothing when it ends.
    void invalidate(const Key& key) {
        typename table_type::node_type gone; // destroyed once the lock is released
        std::lock_guard lock(mutex_);
        gone = table_.erase(key);
        ++epoch_;
    }
    // Forgets every entry; a refresh in flight now stores nothing when it ends.
    void clear() {
        typename table_type::map_type gone; // destroyed once the lock is released
        std::lock_guard lock(mutex_);
        table_.clear(gone);
        ++epoch_;
    }
    // Unmarks `key` (the one in `background_`, found by its address), whose hash is `h`.
    void end_background(std::size_t h, const Key* key) noexcept {
        typename std::unordered_multimap<std::size_t, Key>::node_type gone; // destroyed unlocked
        std::lock_guard lock(mutex_);
        auto [it, last] = background_.equal_range(h);
        while (it != last && &it->second != key)
            ++it;
        if (it != last)
            gone = background_.extract(it);
    }
    std::optional<failure> report(const config& cfg, detail::listener_ref l, telemetry_kind kind, int attempt,
                                  std::chrono::nanoseconds d, const failure* error,
                                  std::string_view note = {}) const noexcept {
        if (!l)
            return std::nullopt;
        telemetry_event e = kit::event(kind, "cache", cfg.options.name, attempt, d, error);
        e.note = note;
        return kit::emit(l, clock, e);
    }
    static std::chrono::nanoseconds past(time_point now, time_point expired) noexcept {
        return now < expired ? std::chrono::nanoseconds::zero()
                             : detail::saturating_nanoseconds(now - expired);
    }

    // A caller arrives at `now`, with the options `cfg`: answered from the entry, or told to
    // refresh (to make or join the call), or answered with a stale value and told to start a
    // background refresh (`may_background`). With `report_miss` false (a policy's `enter`), a
    // caller told to refresh reports nothing: its `run` arrives again and reports.
    arrival arrive(const config& cfg, const Key& key, time_point now, detail::listener_ref l, int attempt,
                   bool may_background, bool report_miss = true) {
        const cache_options<T>& options = cfg.options;
        enum class found : unsigned char { miss, fresh, negative, stale_error, stale_revalidate, lead };
        found what = found::miss;
        std::shared_ptr<const T> value;
        std::shared_ptr<const outcome<T>> negative;
        time_point expired{};
        arrival a;
        {
            std::lock_guard lock(mutex_);
            if (const auto* e = table_.use(key)) {
                if (e->value && now < e->expires) {
                    what = found::fresh;
                } else if (e->negative && now < detail::add_saturating(e->failed, options.negative_ttl)) {
                    what = e->value && now < detail::add_saturating(e->expires, options.stale_if_error)
                               ? found::stale_error
                               : found::negative;
                } else if (e->value &&
                           now < detail::add_saturating(e->expires, options.stale_while_revalidate)) {
                    what = found::stale_revalidate;
                    const std::size_t h = key_hash_(key);
                    if (!marked_locked(key, h) && !refreshes.contains(key)) {
                        if (may_background) {
                            a.marked = &background_.emplace(h, key)->second;
                            a.mark_hash = h;
                            a.how = route::background;
                        } else {
                            what = found::lead;
                        }
                    }
                }
                // A value that copies as bytes is copied here (no user code runs); any other
                // is held by its pointer and copied once the lock is released.
                if constexpr (bytewise)
                    if (what == found::fresh)
                        a.answer.emplace(*e->value);
                if (!a.answer)
                    value = e->value;
                if (what == found::negative || what == found::stale_error)
                    negative = e->negative;
                expired = e->expires;
            }
        }
        try {
            std::optional<failure> thrown;
            switch (what) {
            case found::fresh:
                if (!a.answer)
                    a.answer.emplace(*value);
                thrown = report(cfg, l, telemetry_kind::cache_hit, attempt, {}, nullptr);
                break;
            case found::negative:
                a.answer.emplace(*negative);
                thrown = report(cfg, l, telemetry_kind::cache_hit, attempt, {},
                                negative->has_failure() ? &negative->error() : nullptr);
                break;
            case found::stale_error:
                a.answer.emplace(*value);
                thrown = report(cfg, l, telemetry_kind::stale_served, attempt, past(now, expired),
                                negative->has_failure() ? &negative->error() : nullptr, "stale_if_error");
                break;
            case found::stale_revalidate:
                a.answer.emplace(*value);
                thrown = report(cfg, l, telemetry_kind::stale_served, attempt, past(now, expired), nullptr,
                                "stale_while_revalidate");
                break;
            case found::miss:
            case found::lead:
                a.how = route::refresh;
                if (report_miss &&
                    (thrown = report(cfg, l, telemetry_kind::cache_miss, attempt, {}, nullptr)))
                    a.how = route::answered;
                break;
            }
            if (thrown)
                a.answer.emplace(std::move(*thrown));
        } catch (...) { // a copy of T that threw
            a.answer.emplace(failure::current());
            if (a.how == route::refresh)
                a.how = route::answered;
        }
        return a;
    }

    // A refresh begun at `began` (the epoch) under the options `cfg` ended with `r`: store what
    // is to be stored, and decide, once for every caller that waited, whether a stale value
    // answers instead; both by `cfg`, whatever the options in force now.
    refresh finish(const config& cfg, const Key& key, std::uint64_t began, outcome<T> r) {
        const cache_options<T>& options = cfg.options;
        const time_point now = clock.now();
        std::shared_ptr<const T> keep;
        std::shared_ptr<const outcome<T>> remember;
        std::chrono::nanoseconds ttl = options.ttl;
        bool failed = true, cancelled = false;
        try {
            // A failure is judged only when it could be remembered; a value always (a value the
            // classifier handles is a failure), unless it is one nobody needs to ask about.
            cancelled = r.has_failure() && is_cancellation(r.error());
            const bool judged = r.has_value()
                                    ? !options.should_handle.plain_success(r)
                                    : !cancelled && options.negative_ttl > std::chrono::nanoseconds::zero();
            const bool handled =
                judged && options.should_handle.classify(r, detail::remembered_by_default).handle;
            if (r.has_value() && !handled) {
                failed = false;
                if (options.ttl_of) {
                    if (const std::optional<std::chrono::nanoseconds> own = options.ttl_of(*r))
                        ttl = std::max(*own, std::chrono::nanoseconds::zero());
                }
                keep = std::make_shared<const T>(*r);
            } else if (handled && options.negative_ttl > std::chrono::nanoseconds::zero()) {
                remember = std::make_shared<const outcome<T>>(r);
            }
        } catch (...) { // the classifier, ttl_of or a copy threw: that is the call's failure
            r = outcome<T>{failure::current()};
            failed = true;
            cancelled = is_cancellation(r.error());
            keep.reset();
            remember.reset();
        }
        const bool stale_allowed = failed && !cancelled;
        refresh out{std::move(r)};
        typename table_type::node_type evicted;
        std::shared_ptr<const T> old_value;
        std::shared_ptr<const outcome<T>> old_negative;
        std::lock_guard lock(mutex_);
        if (epoch_ != began)
            return out;
        if (keep) {
            auto& e = table_.upsert(key, evicted);
            old_value = std::exchange(e.value, std::move(keep));
            old_negative = std::exchange(e.negative, nullptr);
            e.expires = detail::add_saturating(now, ttl);
        } else if (remember) {
            auto& e = table_.upsert(key, evicted);
            old_negative = std::exchange(e.negative, std::move(remember));
            e.failed = now;
        }
        if (stale_allowed) {
            const auto* e = table_.peek(key);
            if (e && e->value && now < detail::add_saturating(e->expires, options.stale_if_error)) {
                out.stale = e->value;
                out.stale_for = past(now, e->expires);
            }
        }
        return out;
    } // the lock goes first, then what left the table

    // What a caller that waited for a refresh gets, reported and named under its options `cfg`.
    outcome<T> deliver(const config& cfg, outcome<refresh> shared, detail::listener_ref l,
                       int attempt) const {
        if (shared.has_failure()) {
            // The refreshes' own cancellations carry the name the cache was made with.
            if (shared.error().template is<cancelled_error>() && cfg.options.name != refreshes.name())
                return failure::make(cancelled_error{cfg.options.name});
            return outcome<T>{shared.error()};
        }
        refresh& done = *shared;
        if (!done.stale)
            return std::move(done.result);
        try {
            outcome<T> out{*done.stale};
            if (std::optional<failure> thrown =
                    report(cfg, l, telemetry_kind::stale_served, attempt, done.stale_for,
                           done.result.has_failure() ? &done.result.error() : nullptr, "stale_if_error"))
                return *thrown;
            return out;
        } catch (...) {
            return failure::current();
        }
    }

private:
    // Whether a background refresh of `key`, whose hash is `h`, has not ended.
    bool marked_locked(const Key& key, std::size_t h) const {
        const auto [first, last] = background_.equal_range(h);
        return std::any_of(first, last, [&](const auto& m) { return key_equal_(m.second, key); });
    }

    mutable std::mutex mutex_;
    table_type table_; // guarded by mutex_
    const Hash key_hash_;
    const KeyEqual key_equal_;
    // Guarded: the keys of the background refreshes not ended, by their hashes, so that a refresh
    // unmarks its key without running the key's hash or equality (which may throw, and the mark must
    // go whatever happened).
    std::unordered_multimap<std::size_t, Key> background_{};
    std::uint64_t epoch_ = 0;            // guarded: bumped by invalidate and clear
    detail::snapshot_cell<config> cell_; // replaced under mutex_
};

} // namespace resilience::detail
