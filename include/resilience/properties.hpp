// SPDX-License-Identifier: MIT
/// \file properties.hpp
/// Typed properties a caller sets on a call's `context` (a request id, a tenant, a priority), readable
/// by the call's actions, by the policies' callbacks and classifiers, and in telemetry events.
///
///     inline constexpr rs::property_key<std::string> request_id{"request_id"};
///
///     rs::context ctx;
///     ctx.set_property(request_id, std::string("r-42"));
///     co_await pipeline.execute([](const rs::context& c) -> rs::task<int> {
///         const std::string* id = c.property(request_id);   // "r-42" in every attempt
///         ...
///     }, ctx);
///
/// A key is an object with static storage duration, compared by address: two keys with one name are two
/// keys, and a key cannot be copied (a copy would be another key). Its type says what its value is, so a
/// lookup needs no cast and cannot read a value of another type.
///
/// Costs. A context without properties carries one null pointer more, copied along with the rest: a
/// call through a pipeline pays nothing else (bench/policies.cpp, `pipeline_of_five` against
/// `pipeline_of_five_properties`). Setting a property allocates one node, which the contexts of the call
/// share: the context the caller made owns the list (copies of a context share it, with a reference count
/// changed only when a context is copied), the contexts the policies derive for the attempts refer to it.
/// A lookup walks the list, newest first: properties are meant to be a few. A key set again on a context
/// that alone holds its earlier setting replaces it, so setting one key over and over keeps one node.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace resilience::inline v0_2 {

template <class T>
class property_key;
class properties_view;

namespace detail {

/// One property: a node of an immutable list, newest first, shared by reference count.
struct property_node {
    const void* key;
    std::string_view name;     // the key's name
    const property_node* next; // older properties (held by this node)
    mutable std::atomic<std::size_t> refs{1};
    void (*destroy)(const property_node*) noexcept;
    std::string_view (*text)(const property_node*) noexcept; // the value as text, or empty
    const void* value;                                       // the typed node's value
    // Null for a node of the heap. For a node kept in a call's frame (`borrowed_property_node`, a
    // balancer's endpoint), which only the contexts the library derives inside the call refer to:
    // makes an owned copy, for a context copied out of the call (`share`).
    const property_node* (*clone)(const property_node*) = nullptr;

    static void add_ref(const property_node* n) noexcept {
        if (n)
            n->refs.fetch_add(1, std::memory_order_relaxed);
    }
    /// The list a copied context holds, from `n`: `n` with one more reference, or, when `n` is
    /// borrowed from a call's frame, owned copies of the borrowed nodes (always the first ones) before
    /// the rest of the list. Throws only `std::bad_alloc`, for a borrowed node.
    static const property_node* share(const property_node* n) {
        if (n && n->clone) [[unlikely]]
            return n->clone(n);
        add_ref(n);
        return n;
    }
    /// Drops a reference; the last one destroys the node and drops its reference on the next (in a
    /// loop: a list may be long).
    static void release(const property_node* n) noexcept {
        while (n && n->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            const property_node* next = n->next;
            n->destroy(n);
            n = next;
        }
    }
    /// Unlinks and destroys the earlier settings of `head`'s key that only `head` reaches: those before
    /// the first node that something else holds too (a copy of the context, a call running with one).
    /// Nothing can read them any more. `head` is new, held by one context only.
    static void drop_shadowed(property_node* head) noexcept {
        property_node* above = head;
        const property_node* n = head->next;
        // A count of 1 is `above`'s reference; acquire: the thread that dropped another one is done with it.
        while (n && n->refs.load(std::memory_order_acquire) == 1) {
            if (n->key == head->key) {
                above->next =
                    std::exchange(const_cast<property_node*>(n)->next, nullptr); // its reference too
                n->destroy(n);
                n = above->next;
            } else {
                above = const_cast<property_node*>(n); // sound: every node is made non-const, by `new`
                n = n->next;
            }
        }
    }
};

template <class T>
struct typed_property_node final : property_node {
    T held;

    template <class V>
    typed_property_node(const property_key<T>& k, const property_node* older, V&& v)
        : property_node{&k, k.name(), older, {1}, &destroy_node, &text_of, nullptr},
          held(std::forward<V>(v)) {
        value = &held;
    }
    static void destroy_node(const property_node* n) noexcept {
        delete static_cast<const typed_property_node*>(n);
    }
    static std::string_view text_of(const property_node* n) noexcept {
        const T& v = *static_cast<const T*>(n->value);
        if constexpr (std::is_convertible_v<const T&, std::string_view>)
            return std::string_view(v);
        else
            return {};
    }
};

/// A property whose value lives elsewhere for as long as the node does, the node itself in a call's
/// frame: what a stage sets for the stages and the action inside it, at no allocation (a balancer's
/// endpoint). Only contexts the library derives inside the call point at it; a context copied from
/// one of them gets an owned copy (`property_node::share`), so a copy may outlive the call.
template <class T>
struct borrowed_property_node final : property_node {
    borrowed_property_node(const property_key<T>& k, const property_node* older, const T& v) noexcept
        : property_node{&k, k.name(), older, {1}, &keep, &typed_property_node<T>::text_of, &v, &clone_node} {}
    borrowed_property_node(const borrowed_property_node&) = delete;
    borrowed_property_node& operator=(const borrowed_property_node&) = delete;

private:
    static void keep(const property_node*) noexcept {} // never released: nothing owns a reference to it
    static const property_node* clone_node(const property_node* n) {
        const property_node* rest = share(n->next);
        try {
            return new typed_property_node<T>(*static_cast<const property_key<T>*>(n->key), rest,
                                              *static_cast<const T*>(n->value));
        } catch (...) {
            release(rest);
            throw;
        }
    }
};

struct properties_access;

} // namespace detail

/// The key of a property whose value is a `T`. Declare it once, with static storage duration
/// (`inline constexpr rs::property_key<int> tenant{"tenant"};`): the key is its address. `name` is for
/// logs and telemetry (`properties_view::for_each`); keys are not looked up by name.
template <class T>
class property_key {
    static_assert(std::is_object_v<T> && !std::is_const_v<T> && !std::is_array_v<T>,
                  "rs::property_key<T>: T must be a non-const object type (store a value, not a reference)");

public:
    using value_type = T;
    constexpr explicit property_key(std::string_view name) noexcept : name_(name) {}
    property_key(const property_key&) = delete;
    property_key& operator=(const property_key&) = delete;

    [[nodiscard]] constexpr std::string_view name() const noexcept { return name_; }

private:
    std::string_view name_;
};

/// A read-only view of a call's properties, as the context holds them: what a telemetry event carries
/// (`telemetry_event::properties`) and what `context::properties()` returns. Valid while the call runs
/// (for an event: during the listener's call); copy the values you keep.
class properties_view {
public:
    properties_view() noexcept = default;

    /// The value set for `key` (the latest, if set more than once), or null.
    template <class T>
    [[nodiscard]] const T* get(const property_key<T>& key) const noexcept {
        for (const detail::property_node* n = head_; n; n = n->next)
            if (n->key == &key)
                return static_cast<const T*>(n->value);
        return nullptr;
    }
    /// The value set for `key`, or `otherwise`.
    template <class T, class U>
    [[nodiscard]] T get_or(const property_key<T>& key, U&& otherwise) const {
        if (const T* v = get(key))
            return *v;
        return static_cast<T>(std::forward<U>(otherwise));
    }
    [[nodiscard]] bool empty() const noexcept { return head_ == nullptr; }
    /// Calls `f(name, text)` for each property, in the order they were set, a key set twice once (with
    /// its latest value, in the place of its latest setting): `text` is the value when its type converts
    /// to `std::string_view` (a `std::string`, a string literal), empty otherwise. For logs and labels.
    template <class F>
    void for_each(F&& f) const {
        // The list is newest first: each key's first node is its latest setting. They are gathered
        // (a few, on the stack), then reported backwards; no recursion, since a list may be long.
        constexpr std::size_t few = 16;
        const detail::property_node* latest[few];
        std::size_t n = 0;
        const detail::property_node* m = head_;
        for (; m; m = m->next) {
            if (std::any_of(latest, latest + n,
                            [m](const detail::property_node* l) { return l->key == m->key; }))
                continue; // set again later
            if (n == few)
                break;
            latest[n++] = m;
        }
        if (m) {
            for_each_of_many(f, latest, m);
            return;
        }
        while (n > 0) {
            --n;
            f(latest[n]->name, latest[n]->text(latest[n]));
        }
    }

private:
    friend struct detail::properties_access;
    explicit properties_view(const detail::property_node* head) noexcept : head_(head) {}
    // `for_each` past its first `few` keys: `latest` (full) and the rest of the list from `m`.
    template <class F, std::size_t few>
    static void for_each_of_many(F& f, const detail::property_node* (&latest)[few],
                                 const detail::property_node* m) {
        std::vector<const detail::property_node*> all(latest, latest + few);
        std::vector<const void*> keys; // sorted, of the nodes in `all`
        keys.reserve(few);
        for (const detail::property_node* l : latest)
            keys.insert(std::lower_bound(keys.begin(), keys.end(), l->key, std::less<>{}), l->key);
        for (; m; m = m->next) {
            const auto at = std::lower_bound(keys.begin(), keys.end(), m->key, std::less<>{});
            if (at != keys.end() && *at == m->key)
                continue;
            keys.insert(at, m->key);
            all.push_back(m);
        }
        for (auto it = all.rbegin(); it != all.rend(); ++it)
            f((*it)->name, (*it)->text(*it));
    }
    const detail::property_node* head_ = nullptr;
};

namespace detail {
struct properties_access {
    static properties_view view(const property_node* head) noexcept { return properties_view(head); }
    static const property_node* head(properties_view v) noexcept { return v.head_; }
};
} // namespace detail

} // namespace resilience
