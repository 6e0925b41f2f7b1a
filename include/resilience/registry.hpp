// SPDX-License-Identifier: MIT
/// \file registry.hpp
/// `registry`: the shared handles of named breakers, bulkheads, limiters and retry budgets, made on
/// first use, with a snapshot of their state; `keyed_registry`: one handle per key (host, tenant),
/// keeping a bounded number of idle ones.
///
/// Locking: `keyed_registry::mutex_` guards its entries (`entries_`, `index_`, `evictions_`);
/// `registry::mutex_` guards the entries of every kind (the maps in `slots_`; `slot_of` only finds a kind's
/// slot, and what it returns is read and changed with the mutex held). A member function whose name ends in
/// `_locked` is called with its class's mutex held and never takes it; every other one takes it itself.
/// A policy's reconfiguration runs without the lock (it may run user code that looks something up here).
#pragma once

#include "bulkhead.hpp"
#include "circuit_breaker.hpp"
#include "clock.hpp"
#include "concepts.hpp"
#include "rate_limiter.hpp"
#include "retry_budget.hpp"
#include "sliding_window_limiter.hpp"

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace resilience::inline v0_2 {

/// Which kind of policy a registry entry is.
enum class policy_kind : unsigned char {
    circuit_breaker,
    bulkhead,
    rate_limiter,
    sliding_window_limiter,
    retry_budget
};

/// "circuit_breaker", "bulkhead", "rate_limiter", "sliding_window_limiter" or "retry_budget": a
/// static string, for logs and health endpoints.
constexpr const char* to_string(policy_kind k) noexcept {
    switch (k) {
    case policy_kind::circuit_breaker:
        return "circuit_breaker";
    case policy_kind::bulkhead:
        return "bulkhead";
    case policy_kind::rate_limiter:
        return "rate_limiter";
    case policy_kind::sliding_window_limiter:
        return "sliding_window_limiter";
    case policy_kind::retry_budget:
        return "retry_budget";
    }
    return "unknown";
}

/// One entry of `registry::snapshot()`: what a health endpoint shows. Each field is read from the
/// policy at the moment the snapshot reaches it (entries are not taken at one common instant);
/// fields that do not apply to the entry's kind stay zero.
struct policy_status {
    std::string name{}; ///< the name the entry is registered under
    std::string key{};  ///< for a keyed entry, its key; empty otherwise
    policy_kind kind = policy_kind::circuit_breaker;
    std::optional<circuit_metrics> circuit{}; ///< circuit_breaker: its state and window (`metrics()`)
    std::size_t in_flight = 0;                ///< bulkhead: calls holding a slot
    std::size_t limit = 0;                    ///< bulkhead: calls that may hold a slot now
    std::size_t queued = 0;                   ///< bulkhead, limiters: calls waiting
    double tokens = 0;                        ///< limiters: permits free now; retry_budget: tokens left
    std::uint64_t calls = 0;                  ///< retry_budget: calls recorded
    std::uint64_t granted = 0;                ///< retry_budget: retries allowed
    std::uint64_t denied = 0;                 ///< retry_budget: retries refused
};

/// Says whether a handle is idle, so a `keyed_registry` may forget it. As far as the handle lets
/// anyone tell:
/// - a bulkhead is idle with no call holding a slot and none waiting;
/// - a limiter is idle with no call waiting (an admitted call holds nothing of it);
/// - a breaker is idle while closed: an open, half-open or isolated one remembers that its
///   dependency is failing, which a fresh breaker would not, so it is kept;
/// - anything else (a retry budget, a handle type of your own) is always idle: only how recently
///   it was handed out decides.
/// A handle type of your own can have its own rule: pass a different `Idle` to `keyed_registry`.
struct idle_handle {
    template <class C>
    bool operator()(const circuit_breaker<C>& b) const {
        return b.state() == circuit_state::closed;
    }
    template <class C>
    bool operator()(const bulkhead<C>& b) const {
        return b.in_flight() == 0 && b.queued() == 0;
    }
    template <class C>
    bool operator()(const rate_limiter<C>& l) const {
        return l.queued() == 0;
    }
    template <class C>
    bool operator()(const sliding_window_limiter<C>& l) const {
        return l.queued() == 0;
    }
    template <class H>
    bool operator()(const H&) const noexcept {
        return true;
    }
};

/// One handle per key, made on first use, for a policy per host or per tenant. Keeps at most
/// `capacity` entries, except busy ones: when an entry would take it past `capacity`, the least
/// recently handed out idle entry (see `idle_handle`) is forgotten, then the next least recent,
/// until it is back within `capacity` or only busy entries are left over. So it never holds more
/// than `capacity` idle entries, busy ones are never forgotten (they may take it past `capacity`
/// for as long as they stay busy), and the entry just handed out is never the one forgotten.
///
/// Forgetting an entry does not stop anyone using it: handles already handed out keep working
/// (they share the state, which lives while any copy does). The next `get` for that key makes a
/// new one, with fresh state: a new bulkhead's slots, a full bucket, a closed breaker.
///
/// Thread-safe: one mutex guards the entries. `make` runs with it held, so it must not call back
/// into this registry; `Idle` runs with it held too. A `get` that must forget something walks the
/// entries from the least recent, so a registry full of busy entries costs a walk per new key.
///
///     rs::keyed_registry<rs::circuit_breaker<>> per_host{
///         500, [](const std::string&) { return rs::circuit_breaker<>{{.failure_threshold = 5}}; }};
///     auto breaker = per_host.get(host);   // the same breaker for every call to this host
template <class Handle, class Key = std::string, class Hash = std::hash<Key>,
          class KeyEqual = std::equal_to<Key>, class Idle = idle_handle>
class keyed_registry {
public:
    /// Makes the handle for a key seen for the first time.
    using make_function = std::function<Handle(const Key&)>;

    /// `capacity` must be positive (`std::invalid_argument`). `make` serves `get(key)`; it may be
    /// empty when every call passes its own maker to `get(key, make)`.
    explicit keyed_registry(std::size_t capacity, make_function make = {}, Idle idle = Idle{})
        : capacity_(capacity), make_(std::move(make)), idle_(std::move(idle)) {
        if (capacity_ == 0)
            throw std::invalid_argument("resilience::keyed_registry: capacity must be positive, got 0");
    }
    keyed_registry(const keyed_registry&) = delete;
    keyed_registry& operator=(const keyed_registry&) = delete;

    /// The handle for `key`: the one handed out before, or a new one from the constructor's `make`
    /// (`std::bad_function_call` when it has none). Marks it the most recently handed out.
    Handle get(const Key& key) {
        return get(key, [this](const Key& k) { return make_(k); });
    }
    /// As `get(key)`, a new handle coming from `make(key)`. If `make` throws, nothing changes.
    template <class Make>
    Handle get(const Key& key, Make&& make) {
        std::lock_guard lock(mutex_);
        if (auto found = index_.find(key); found != index_.end()) {
            entries_.splice(entries_.begin(), entries_, found->second);
            Handle h = found->second->second;
            forget_locked();
            return h;
        }
        entries_.emplace_front(key, std::invoke(std::forward<Make>(make), key));
        try {
            index_.emplace(key, entries_.begin());
        } catch (...) {
            entries_.pop_front();
            throw;
        }
        Handle h = entries_.front().second;
        forget_locked();
        return h;
    }

    /// The handle for `key` if there is one; makes nothing and changes no order.
    [[nodiscard]] std::optional<Handle> find(const Key& key) const {
        std::lock_guard lock(mutex_);
        if (auto found = index_.find(key); found != index_.end())
            return found->second->second;
        return std::nullopt;
    }

    /// Forgets `key`'s entry, busy or not; false if there was none.
    bool erase(const Key& key) {
        std::lock_guard lock(mutex_);
        auto found = index_.find(key);
        if (found == index_.end())
            return false;
        entries_.erase(found->second);
        index_.erase(found);
        return true;
    }

    /// Entries held now, busy ones included.
    [[nodiscard]] std::size_t size() const {
        std::lock_guard lock(mutex_);
        return entries_.size();
    }
    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
    /// Entries forgotten so far to stay within `capacity` (not counting `erase`).
    [[nodiscard]] std::uint64_t evictions() const {
        std::lock_guard lock(mutex_);
        return evictions_;
    }

    /// Every entry, the most recently handed out first.
    [[nodiscard]] std::vector<std::pair<Key, Handle>> entries() const {
        std::lock_guard lock(mutex_);
        return {entries_.begin(), entries_.end()};
    }

private:
    using list = std::list<std::pair<Key, Handle>>;

    // Back within `capacity` by forgetting idle entries, least recently handed out first; the
    // front (just handed out) stays.
    void forget_locked() {
        auto it = entries_.end();
        while (entries_.size() > capacity_) {
            --it;
            if (it == entries_.begin())
                return; // only busy entries behind the front
            if (std::invoke(idle_, std::as_const(it->second))) {
                index_.erase(it->first);
                it = entries_.erase(it);
                ++evictions_;
            }
        }
    }

    const std::size_t capacity_;
    make_function make_;
    Idle idle_;
    mutable std::mutex mutex_;
    list entries_; // most recently handed out first
    std::unordered_map<Key, typename list::iterator, Hash, KeyEqual> index_;
    std::uint64_t evictions_ = 0;
};

struct registry_options {
    /// The `capacity` of each keyed family (`breaker(name, key, options)` and the like): how many
    /// keys under one name it keeps, idle ones forgotten beyond it (see `keyed_registry`). Positive.
    std::size_t keyed_capacity = 1024;
};

/// Hands out the shared handles of named policies, so that every pipeline calling one dependency
/// shares its breaker, bulkhead, limiter or retry budget, and a health endpoint can show them all.
///
/// - `breaker(name, options)` (likewise `bulkhead`, `rate_limiter`, `sliding_window_limiter`,
///   `retry_budget`) returns the handle registered under `name` for that kind, making it from
///   `options` on first use. **Later calls with the same name return that same handle and ignore
///   their options** (they are not even validated): the first call's options rule, as in
///   resilience4j's registries. So any call site may look a policy up with the options it would
///   want, and the one that runs first decides; to see what is in force, read the handle's
///   `options()`. Options that cannot be made into a policy throw `std::invalid_argument` from the
///   first call, which registers nothing. To change the options of an entry while it is in use,
///   `reconfigure(name, options)` (docs/reconfiguration.md).
/// - Names are per kind: a breaker "db" and a bulkhead "db" are two entries.
/// - A policy made with an empty `name` option is given the registry name (keyed:
///   `name + "/" + key`), so its errors and metrics carry it; a non-empty `name` option is kept.
/// - `breaker(name, key, options)` and the like keep one policy per key under `name` (one breaker
///   per host, one limiter per tenant): a `keyed_registry` per name, of
///   `registry_options::keyed_capacity`, forgetting the least recently handed out idle entry
///   beyond it. Options are required there (write `{}` for the defaults) so that `breaker(name,
///   {})` stays unambiguous.
/// - `snapshot()` lists every entry, keyed ones included, with its state.
///
/// Thread-safe: lookups and snapshots may come from any thread. Policies are made with a lock held
/// (the registry's, or a keyed family's: constructors only validate and allocate). Handles handed out live on
/// their own: the registry may go before them. Not copyable: one registry is one set of names.
/// `C` is the clock every policy it makes uses (`sim.clock()` in a test).
///
///     rs::registry<> policies;
///     auto db = policies.bulkhead("db", {.max_concurrent_calls = 8});
///     auto breaker = policies.breaker("payments", host, {});       // one breaker per host
///     for (const rs::policy_status& s : policies.snapshot()) { /* name, kind, state, ... */ }
template <clock C = steady_clock>
class registry {
public:
    /// A clock that cannot be made from nothing (`testing::virtual_clock`) must be passed: these
    /// two constructors exist only for one that can, so that `std::optional<registry<C>>` and other
    /// traits that ask whether a registry can be made from nothing get a plain no for such a `C`.
    registry()
    requires std::default_initializable<C>
        : registry(registry_options{}, C{}) {}
    explicit registry(registry_options options)
    requires std::default_initializable<C>
        : registry(options, C{}) {}
    explicit registry(registry_options options, C clock) : options_(options), clock_(std::move(clock)) {
        if (options_.keyed_capacity == 0)
            throw std::invalid_argument("resilience::registry: keyed_capacity must be positive, got 0");
    }
    registry(const registry&) = delete;
    registry& operator=(const registry&) = delete;

    /// The breaker registered as `name`, made from `options` if there is none yet (a later call's
    /// options are ignored); with `key`, the one for `key` in the family `name`. The same for the
    /// other kinds below.
    ::resilience::circuit_breaker<C> breaker(std::string_view name, circuit_breaker_options options = {}) {
        return plain<::resilience::circuit_breaker<C>>(name, std::move(options));
    }
    ::resilience::circuit_breaker<C> breaker(std::string_view name, std::string_view key,
                                             circuit_breaker_options options) {
        return keyed<::resilience::circuit_breaker<C>>(name, key, std::move(options));
    }

    ::resilience::bulkhead<C> bulkhead(std::string_view name, bulkhead_options options = {}) {
        return plain<::resilience::bulkhead<C>>(name, std::move(options));
    }
    ::resilience::bulkhead<C> bulkhead(std::string_view name, std::string_view key,
                                       bulkhead_options options) {
        return keyed<::resilience::bulkhead<C>>(name, key, std::move(options));
    }

    /// No default options: a token bucket has no default rate. Once registered, `{}` looks it up.
    ::resilience::rate_limiter<C> rate_limiter(std::string_view name, rate_limiter_options options) {
        return plain<::resilience::rate_limiter<C>>(name, std::move(options));
    }
    ::resilience::rate_limiter<C> rate_limiter(std::string_view name, std::string_view key,
                                               rate_limiter_options options) {
        return keyed<::resilience::rate_limiter<C>>(name, key, std::move(options));
    }

    /// No default options: a window has no default limit. Once registered, `{}` looks it up.
    ::resilience::sliding_window_limiter<C> sliding_window_limiter(std::string_view name,
                                                                   sliding_window_limiter_options options) {
        return plain<::resilience::sliding_window_limiter<C>>(name, std::move(options));
    }
    ::resilience::sliding_window_limiter<C> sliding_window_limiter(std::string_view name,
                                                                   std::string_view key,
                                                                   sliding_window_limiter_options options) {
        return keyed<::resilience::sliding_window_limiter<C>>(name, key, std::move(options));
    }

    ::resilience::retry_budget retry_budget(std::string_view name, retry_budget_options options = {}) {
        return plain<::resilience::retry_budget>(name, options);
    }
    ::resilience::retry_budget retry_budget(std::string_view name, std::string_view key,
                                            retry_budget_options options) {
        return keyed<::resilience::retry_budget>(name, key, options);
    }

    /// Puts new options in force for the entry `name` of the options' kind, in place: its handle's
    /// `reconfigure` (what carries over is said there and in docs/reconfiguration.md), so every copy
    /// handed out, and every pipeline holding one, sees them at once, and later lookups return the
    /// same handle with them. With no such entry yet, makes it from `options`, as `breaker(name,
    /// options)` and the like would (so options loaded before first use rule). Returns true when an
    /// entry was reconfigured, false when one was made. Bad options throw `std::invalid_argument`
    /// (naming the field and the value) and change nothing. An empty `name` option gets the registry
    /// name, as when the entry is made. Name the options' type when it is not plain from the
    /// designators (`rs::bulkhead_options{}`). Memory, as the handle's own `reconfigure`: the
    /// options replaced are freed once no call needs them, and options the same as those in force
    /// change nothing and allocate nothing, so a service may reconfigure from its settings on every
    /// poll.
    ///
    ///     policies.reconfigure("payments", rs::circuit_breaker_options{.failure_threshold = 3});
    bool reconfigure(std::string_view name, circuit_breaker_options options) {
        return reconfigure_plain<::resilience::circuit_breaker<C>>(name, std::move(options));
    }
    bool reconfigure(std::string_view name, bulkhead_options options) {
        return reconfigure_plain<::resilience::bulkhead<C>>(name, std::move(options));
    }
    bool reconfigure(std::string_view name, rate_limiter_options options) {
        return reconfigure_plain<::resilience::rate_limiter<C>>(name, std::move(options));
    }
    bool reconfigure(std::string_view name, sliding_window_limiter_options options) {
        return reconfigure_plain<::resilience::sliding_window_limiter<C>>(name, std::move(options));
    }
    bool reconfigure(std::string_view name, retry_budget_options options) {
        return reconfigure_plain<::resilience::retry_budget>(name, options);
    }
    /// The same for the entry `key` of the keyed family `name` (made, with its family, if there is
    /// none). Only that key's policy changes: the family keeps no options of its own, so keys made
    /// later come from the options of the lookup that makes them.
    bool reconfigure(std::string_view name, std::string_view key, circuit_breaker_options options) {
        return reconfigure_keyed<::resilience::circuit_breaker<C>>(name, key, std::move(options));
    }
    bool reconfigure(std::string_view name, std::string_view key, bulkhead_options options) {
        return reconfigure_keyed<::resilience::bulkhead<C>>(name, key, std::move(options));
    }
    bool reconfigure(std::string_view name, std::string_view key, rate_limiter_options options) {
        return reconfigure_keyed<::resilience::rate_limiter<C>>(name, key, std::move(options));
    }
    bool reconfigure(std::string_view name, std::string_view key, sliding_window_limiter_options options) {
        return reconfigure_keyed<::resilience::sliding_window_limiter<C>>(name, key, std::move(options));
    }
    bool reconfigure(std::string_view name, std::string_view key, retry_budget_options options) {
        return reconfigure_keyed<::resilience::retry_budget>(name, key, options);
    }

    /// Every entry with its state, ordered by kind (as `policy_kind` lists them), then name, then
    /// key (a name's plain entry before its keyed ones). The entries are listed under the lock;
    /// each one's state is then read without it, one entry after another.
    [[nodiscard]] std::vector<policy_status> snapshot() const {
        listing entries;
        {
            std::lock_guard lock(mutex_);
            list_locked(entries, std::make_index_sequence<std::tuple_size_v<slots>>{});
        }
        std::vector<policy_status> out;
        std::apply(
            [&out](const auto&... kinds) {
                (
                    [&out](const auto& of_kind) {
                        for (const auto& [name, key, h] : of_kind) {
                            policy_status& st = out.emplace_back();
                            st.name = name;
                            st.key = key;
                            st.kind = kind_of<std::remove_cvref_t<decltype(h)>>();
                            read(h, st);
                        }
                    }(kinds),
                    ...);
            },
            entries);
        return out;
    }

    [[nodiscard]] const registry_options& options() const noexcept { return options_; }
    [[nodiscard]] const C& clock() const noexcept { return clock_; }

private:
    template <class Handle>
    using family = keyed_registry<Handle, std::string>;

    // The entries of one kind: by name, and the keyed families by name. std::map: nodes never move
    // (a family is used after the lock is released) and the snapshot comes out ordered.
    template <class Handle>
    struct slot {
        std::map<std::string, Handle, std::less<>> plain;
        std::map<std::string, family<Handle>, std::less<>> keyed;
    };
    using slots = std::tuple<slot<::resilience::circuit_breaker<C>>, slot<::resilience::bulkhead<C>>,
                             slot<::resilience::rate_limiter<C>>,
                             slot<::resilience::sliding_window_limiter<C>>, slot<::resilience::retry_budget>>;

    template <class Handle>
    slot<Handle>& slot_of() noexcept {
        return std::get<slot<Handle>>(slots_);
    }

    template <class Handle, class Options>
    Handle make(Options options, std::string label) const {
        if constexpr (std::is_same_v<Handle, ::resilience::retry_budget>) {
            (void)label;
            return Handle{options};
        } else {
            if (options.name.empty())
                options.name = std::move(label);
            return Handle{std::move(options), clock_};
        }
    }

    template <class Handle, class Options>
    Handle plain(std::string_view name, Options&& options) {
        std::lock_guard lock(mutex_);
        auto& entries = slot_of<Handle>().plain;
        if (auto found = entries.find(name); found != entries.end())
            return found->second;
        Handle h = make<Handle>(std::forward<Options>(options), std::string(name));
        entries.emplace(std::string(name), h);
        return h;
    }

    template <class Handle, class Options>
    Handle keyed(std::string_view name, std::string_view key, Options&& options) {
        // Families are never removed: `f` stays valid without the registry's lock.
        return family_of<Handle>(name).get(std::string(key), [&](const std::string& k) {
            return make<Handle>(std::forward<Options>(options), std::string(name) + "/" + k);
        });
    }

    template <class Handle>
    family<Handle>& family_of(std::string_view name) {
        std::lock_guard lock(mutex_);
        auto& families = slot_of<Handle>().keyed;
        auto found = families.find(name);
        if (found == families.end())
            found = families.try_emplace(std::string(name), options_.keyed_capacity).first;
        return found->second;
    }

    // `options` as the entry labelled `label` is made with: an empty `name` option gets the label.
    template <class Handle, class Options>
    static Options labelled(Options options, std::string label) {
        if constexpr (!std::is_same_v<Handle, ::resilience::retry_budget>) {
            if (options.name.empty())
                options.name = std::move(label);
        } else {
            (void)label;
        }
        return options;
    }

    // The entry is reconfigured, or made, exactly once; the reconfiguration itself runs without the
    // registry's lock, since it may run user code (a breaker's `on_state_change`, a waiter it admits)
    // that looks something up here. A lookup that makes the entry meanwhile is reconfigured after.
    template <class Handle, class Options>
    bool reconfigure_plain(std::string_view name, Options options) {
        std::optional<Handle> existing;
        {
            std::lock_guard lock(mutex_);
            auto& entries = slot_of<Handle>().plain;
            if (auto found = entries.find(name); found != entries.end())
                existing = found->second;
        }
        if (!existing) {
            Handle made = make<Handle>(options, std::string(name)); // checks the options; may throw
            std::lock_guard lock(mutex_);
            auto [at, inserted] = slot_of<Handle>().plain.emplace(std::string(name), made);
            if (inserted)
                return false;
            existing = at->second;
        }
        existing->reconfigure(labelled<Handle>(std::move(options), std::string(name)));
        return true;
    }

    template <class Handle, class Options>
    bool reconfigure_keyed(std::string_view name, std::string_view key, Options options) {
        family<Handle>& f = family_of<Handle>(name);
        const std::string k(key);
        std::string label = std::string(name) + "/" + k;
        if (std::optional<Handle> found = f.find(k)) {
            found->reconfigure(labelled<Handle>(std::move(options), std::move(label)));
            return true;
        }
        bool made = false;
        Handle h = f.get(k, [&](const std::string&) {
            made = true;
            return make<Handle>(options, label);
        });
        if (!made) // another lookup made it in between
            h.reconfigure(labelled<Handle>(std::move(options), std::move(label)));
        return !made;
    }

    // (name, key, handle) of every entry, per kind: copied under the lock, read after it.
    template <class Handle>
    using listed = std::vector<std::tuple<std::string, std::string, Handle>>;
    using listing =
        std::tuple<listed<::resilience::circuit_breaker<C>>, listed<::resilience::bulkhead<C>>,
                   listed<::resilience::rate_limiter<C>>, listed<::resilience::sliding_window_limiter<C>>,
                   listed<::resilience::retry_budget>>;

    template <std::size_t... I>
    void list_locked(listing& entries, std::index_sequence<I...>) const {
        (list_kind_locked(std::get<I>(slots_), std::get<I>(entries)), ...);
    }

    template <class Handle>
    static void list_kind_locked(const slot<Handle>& s, listed<Handle>& out) {
        for (const auto& [name, h] : s.plain)
            out.emplace_back(name, std::string{}, h);
        for (const auto& [name, f] : s.keyed)
            for (auto& [key, h] : f.entries())
                out.emplace_back(name, std::move(key), std::move(h));
        std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
            return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
        });
    }

    template <class Handle>
    static constexpr policy_kind kind_of() noexcept {
        if constexpr (std::is_same_v<Handle, ::resilience::circuit_breaker<C>>)
            return policy_kind::circuit_breaker;
        else if constexpr (std::is_same_v<Handle, ::resilience::bulkhead<C>>)
            return policy_kind::bulkhead;
        else if constexpr (std::is_same_v<Handle, ::resilience::rate_limiter<C>>)
            return policy_kind::rate_limiter;
        else if constexpr (std::is_same_v<Handle, ::resilience::sliding_window_limiter<C>>)
            return policy_kind::sliding_window_limiter;
        else
            return policy_kind::retry_budget;
    }

    static void read(const ::resilience::circuit_breaker<C>& b, policy_status& s) { s.circuit = b.metrics(); }
    static void read(const ::resilience::bulkhead<C>& b, policy_status& s) {
        s.in_flight = b.in_flight();
        s.limit = b.limit();
        s.queued = b.queued();
    }
    static void read(const ::resilience::rate_limiter<C>& l, policy_status& s) {
        s.tokens = l.tokens();
        s.queued = l.queued();
    }
    static void read(const ::resilience::sliding_window_limiter<C>& l, policy_status& s) {
        s.tokens = l.tokens();
        s.queued = l.queued();
    }
    static void read(const ::resilience::retry_budget& b, policy_status& s) {
        s.tokens = b.tokens();
        s.calls = b.calls();
        s.granted = b.granted();
        s.denied = b.denied();
    }

    const registry_options options_;
    const C clock_;
    mutable std::mutex mutex_;
    slots slots_;
};

template <clock C>
registry(registry_options, C) -> registry<C>;

} // namespace resilience
