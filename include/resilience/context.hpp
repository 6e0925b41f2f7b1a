// SPDX-License-Identifier: MIT
/// \file context.hpp
/// `context`: what one attempt knows about itself (stop token, attempt number, deadline) and what the
/// caller told the call (its properties, properties.hpp).
#pragma once

#include "detail/config.hpp"
#include "detail/frame_allocator.hpp"
#include "detail/inlining.hpp"
#include "properties.hpp"
#include "stop_token.hpp"

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

namespace resilience::inline v0_2 {

class context;
class telemetry_listener;

namespace detail {

template <class C>
inline constexpr char clock_key = 0;

/// Which readings `c` may share: those of clocks of its type, or, for a clock that wraps others
/// (`any_clock`), of its `reading_key()`. Clocks with one key read the same time (as every clock
/// of this library of one type does), so a deadline is compared only with deadlines of its key.
template <class C>
const void* reading_key(const C& c) noexcept {
    if constexpr (requires {
                      { c.reading_key() } -> std::convertible_to<const void*>;
                  })
        return c.reading_key();
    else
        return &clock_key<C>;
}

/// One clock reading shared by every policy of a call while it is admitted, so a pipeline of a
/// timeout, a limiter and a slow-call breaker reads the clock once. Valid only until the call
/// first suspends: the pipeline clears it then, so a later reading is a fresh one. Keyed by clock
/// type (two clocks of one type are taken to agree, as every clock of this library does).
struct time_cache;

/// A word a stage keeps for the whole call, across a retry's rounds and a hedge's attempts (a
/// balancer's endpoints tried so far): in the frame of the call's outermost drive, for a pipeline
/// that has a stage asking for one (`uses_call_scratch`), and reached from every context of the call
/// through its `time_cache`. The first stage to claim it (`claim`) owns it; another finds it taken.
struct call_scratch {
    std::atomic<const void*> owner{nullptr};
    std::atomic<std::uint64_t> bits{0};
    /// The scratch for `stage`, or null when another stage has it.
    call_scratch* claim(const void* stage) noexcept {
        const void* none = nullptr;
        if (owner.compare_exchange_strong(none, stage, std::memory_order_relaxed) || none == stage)
            return this;
        return nullptr;
    }
};

struct time_cache {
    const void* clock = nullptr; // which clock type read `at`; null: nothing cached
    std::chrono::nanoseconds at{};
    call_scratch* scratch = nullptr; // the call's, if its pipeline has one (not cleared with the reading)
    void clear() noexcept { clock = nullptr; }
};

/// The stop token of a timeout's attempt, made only when somebody asks for it. Most calls end
/// before their deadline with an action that never looks at its token; for them no stop source
/// is taken and no callback is linked to the caller's token. Asking (`token()`) makes a source
/// linked to the parent context's token; the deadline (`expire()`) stops it, or, if nobody has
/// asked yet, makes every later one start stopped. Both may happen on different threads.
///
/// Polling (`stop_requested()`) walks up the chain of lazy stops without a call per level: each
/// one knows, from its construction, the nearest lazy stop above it and otherwise the token it
/// ends at, or that nothing above it can ever stop (a token that cannot stop never will).
///
/// What a token needs (the source, its link to the parent, the token) is a block of its own from
/// the frame cache, made on first use: a call that never asks carries four words here, not the
/// block. The block and the deadline's flag share one atomic word: the deadline sets the flag and
/// finds any block published before it, which its caller stops; a block published after it is
/// stopped before it is published. So a token first asked for after the deadline is born stopped,
/// whichever thread asks and whichever makes it.
class lazy_stop {
public:
    explicit lazy_stop(const context* parent) noexcept;
    lazy_stop(const lazy_stop&) = delete;
    lazy_stop& operator=(const lazy_stop&) = delete;
    ~lazy_stop() {
        if (made* m = block_of(word_.load(std::memory_order_acquire)))
            discard(m);
    }

    /// Stopped by the deadline or by the parent: no token made for that.
    RESILIENCE_DETAIL_ALWAYS_INLINE bool stop_requested() const noexcept {
        const lazy_stop* l = this;
        while (!(l->word_.load(std::memory_order_acquire) & expired_flag)) {
            const std::uintptr_t up = l->parent_;
            if (up & token_tag)
                return token_of(up)->stop_requested();
            if (!up)
                return false;
            l = reinterpret_cast<const lazy_stop*>(up);
        }
        return true;
    }
    /// The attempt's token, made (and linked to the parent's) on first use.
    const stop_token& token() const {
        made* m = block_of(word_.load(std::memory_order_acquire));
        if (!m)
            m = materialize();
        return m->token;
    }
    /// The deadline passed: returns a copy of the source to stop (after which the owner may be
    /// gone), or a source without state when no token was made yet: one made later starts stopped.
    stop_source expire() {
        if (made* m = block_of(word_.fetch_or(expired_flag, std::memory_order_acq_rel)))
            return m->source.source();
        return stop_source{nostopstate};
    }

private:
    // Runs on the thread that stops the parent; the request may end the call, block included
    // (`pooled_stop_source::request_stop` holds the stop state until it is done).
    struct forward {
        pooled_stop_source* target;
        void operator()() const noexcept { target->request_stop(); }
    };
    // Declared in this order so that the link goes before the source it stops.
    struct made {
        pooled_stop_source source; // pooled: no allocation per call
        std::optional<stop_callback<forward>> link;
        stop_token token;
    };
    static_assert(alignof(made) > 1, "the low bit of a block's address holds the deadline's flag");
    RESILIENCE_DECL made* materialize() const;
    static constexpr std::uintptr_t expired_flag = 1; // the low bit: a block is aligned to more
    static made* block_of(std::uintptr_t word) noexcept {
        return reinterpret_cast<made*>(word & ~expired_flag);
    }
    static void discard(made* m) noexcept {
        std::destroy_at(m);
        frame_cache::deallocate(m, sizeof(made));
    }

    // What is above: the parent's own lazy stop, if it has one; else the token the parent ends at,
    // tagged with `token_tag`; null if nothing above can stop. One word: every timeout's call has one.
    static constexpr std::uintptr_t token_tag = 1; // a lazy stop and a token are aligned to more
    static const stop_token* token_of(std::uintptr_t up) noexcept {
        return reinterpret_cast<const stop_token*>(up & ~token_tag);
    }
    std::uintptr_t parent_;
    // The published block (null until a token is asked for), with `expired_flag` set once the
    // deadline has passed.
    mutable std::atomic<std::uintptr_t> word_{0};
};

struct context_access;

} // namespace detail

/// Per-attempt information handed to an action that asks for it (`[](rs::context const& c)`).
/// Copying gives a self-contained context that owns its stop token. Policies derive child
/// contexts: a retry sets `attempt()`, a timeout gives the attempt its own stop token and
/// tightens the deadline, a hedge numbers its attempts and gives each its own stop token. Inside
/// the library a child refers to its parent instead of copying its token (no atomic reference
/// counting per layer); the parent outlives it, as every call's frames are nested.
class context {
public:
    context() = default;
    explicit context(resilience::stop_token token) noexcept : token_(std::move(token)) {}
#if RESILIENCE_HAS_STD_STOP_TOKEN
    /// Stopped by a standard library token (through a bridge: see stop_token.hpp).
    explicit context(const std::stop_token& token) : token_(from_std(token)) {}
#endif
    context(const context& other)
        : token_(other.stop_token()), telemetry_(other.telemetry_), props_(other.props_),
          attempt_(other.attempt_), deadline_(other.deadline_), deadline_clock_(other.deadline_clock_) {
        props_ = detail::property_node::share(props_);
    }
    // Moves keep a derived context's references: only the library holds derived contexts by
    // value (users see them as `const context&`), and it moves them only into place.
    context(context&& o) noexcept
        : token_(std::move(o.token_)), up_(o.up_), time_(o.time_), telemetry_(o.telemetry_),
          props_(std::exchange(o.props_, nullptr)), attempt_(o.attempt_), deadline_(o.deadline_),
          deadline_clock_(o.deadline_clock_) {}
    context& operator=(const context& other) {
        if (this != &other)
            *this = context(other);
        return *this;
    }
    context& operator=(context&& o) noexcept {
        if (this != &o) {
            drop_properties();
            token_ = std::move(o.token_);
            up_ = o.up_;
            time_ = o.time_;
            telemetry_ = o.telemetry_;
            props_ = std::exchange(o.props_, nullptr);
            attempt_ = o.attempt_;
            deadline_ = o.deadline_;
            deadline_clock_ = o.deadline_clock_;
        }
        return *this;
    }
    // Inlined: contexts are destroyed on every call's fast path, where they hold no properties.
    RESILIENCE_DETAIL_ALWAYS_INLINE ~context() { drop_properties(); }

    /// Stopped when the caller, or a policy around this attempt (timeout, hedge), wants it to end.
    /// Under a timeout, the token is made on first use: prefer `stop_requested()` to poll.
    const resilience::stop_token& stop_token() const {
        const std::uintptr_t up = up_;
        if (up & lazy_tag)
            return lazy_in(up)->token();
        return up ? reinterpret_cast<const context*>(up)->token_ : token_;
    }
    /// Same as `stop_token().stop_requested()`, without making a token.
    RESILIENCE_DETAIL_ALWAYS_INLINE bool stop_requested() const noexcept {
        const std::uintptr_t up = up_;
        if (up & lazy_tag)
            return lazy_in(up)->stop_requested();
        return (up ? reinterpret_cast<const context*>(up)->token_ : token_).stop_requested();
    }
    /// 1 for the first attempt of the innermost retry or hedge, 2 for the next one, and so on.
    int attempt() const noexcept { return attempt_; }
    /// The deadline set by the enclosing timeouts, as time since the epoch of the clock of the
    /// timeout that set it; empty when nothing bounds the attempt. Timeouts on one clock keep the
    /// earliest of their deadlines. Deadlines of different clocks cannot be compared (each clock
    /// has its own epoch), so a timeout on another clock than the one that set the current deadline
    /// replaces it with its own: the deadline seen is the innermost timeout's, and the outer one
    /// still bounds the attempt through its own timer and stop token. Prefer `deadline_for(clock)`,
    /// which says whether the deadline is on the clock you compare it with.
    std::optional<std::chrono::nanoseconds> deadline() const noexcept {
        if (deadline_ == no_deadline)
            return std::nullopt;
        return deadline_;
    }
    /// `deadline()` when it was set on `clock` (or on a clock of its type, which reads the same
    /// time), as time since `clock`'s epoch: compare it with `clock.now().time_since_epoch()`.
    /// Empty when there is no deadline, or when it is another clock's.
    template <class C>
    std::optional<std::chrono::nanoseconds> deadline_for(const C& clock) const noexcept {
        if (deadline_ == no_deadline || deadline_clock_ != detail::reading_key(clock))
            return std::nullopt;
        return deadline_;
    }

    /// The value the caller set for `key` (the latest, if set twice), or null. Every attempt of the
    /// call, and every callback, classifier and telemetry event of its policies, sees the properties
    /// of the context the call was started with (`execute(action, ctx)`).
    template <class T>
    [[nodiscard]] const T* property(const property_key<T>& key) const noexcept {
        return properties().get(key);
    }
    /// The value set for `key`, or `otherwise`.
    template <class T, class U>
    [[nodiscard]] T property_or(const property_key<T>& key, U&& otherwise) const {
        return properties().get_or(key, std::forward<U>(otherwise));
    }
    /// All of them, for a listener or a log line (properties.hpp).
    [[nodiscard]] properties_view properties() const noexcept {
        return detail::properties_access::view(props_);
    }
    /// Sets `key` to `value` on this context, for the calls started with it (and with its copies made
    /// afterwards): a property set again hides its earlier value. Allocates one node. Copies made
    /// before keep what they had. An earlier value that only this context holds (no copy, no call
    /// running with one) is destroyed: a pointer or view taken to it before is no longer valid.
    template <class T, class V>
    requires std::constructible_from<T, V&&>
    void set_property(const property_key<T>& key, V&& value) {
        if (!self_contained())
            *this = context(*this);
        auto* const node =
            new detail::typed_property_node<T>(key, props_,
                                               std::forward<V>(value)); // takes over the reference
        props_ = node;
        detail::property_node::drop_shadowed(node);
    }
    /// A copy of this context with `key` set to `value`.
    template <class T, class V>
    requires std::constructible_from<T, V&&>
    [[nodiscard]] context with_property(const property_key<T>& key, V&& value) const {
        context c = *this;
        c.set_property(key, std::forward<V>(value));
        return c;
    }

    [[nodiscard]] context with_stop_token(resilience::stop_token t) const {
        context c = *this;
        c.token_ = std::move(t);
        return c;
    }
    [[nodiscard]] context with_attempt(int a) const {
        context c = *this;
        c.attempt_ = a;
        return c;
    }
    /// Keeps the earlier of the current deadline and `d`, a time on `clock`; replaces a deadline of
    /// another clock (see `deadline()`).
    template <class C>
    [[nodiscard]] context with_deadline(std::chrono::nanoseconds d, const C& clock) const {
        context c = *this;
        c.tighten(d, detail::reading_key(clock));
        return c;
    }
    /// Keeps the earlier of the current deadline and `d`, taken to be on the current deadline's
    /// clock; with no deadline yet, `d` is on no known clock (`deadline()` shows it,
    /// `deadline_for()` does not). Prefer the form that names the clock.
    [[nodiscard]] context with_deadline(std::chrono::nanoseconds d) const {
        context c = *this;
        c.tighten(d, deadline_clock_);
        return c;
    }

private:
    friend struct detail::context_access;
    friend class detail::lazy_stop;
    struct derived_tag {};

    // A child that refers to `parent` for its stop token (see the class comment): to what the parent
    // refers to, or to the parent itself when it owns its token.
    context(derived_tag, const context& parent) noexcept
        : up_(parent.up_ ? parent.up_ : reinterpret_cast<std::uintptr_t>(&parent)), time_(parent.time_),
          telemetry_(parent.telemetry_), props_(parent.props_), attempt_(parent.attempt_),
          deadline_(parent.deadline_), deadline_clock_(parent.deadline_clock_) {}

    bool self_contained() const noexcept { return !up_; }
    // Where the stop token comes from, in `up_`: a lazy stop's address tagged with `lazy_tag`, or the
    // address of the context whose `token_` this one shares.
    static constexpr std::uintptr_t lazy_tag = 1;
    static detail::lazy_stop* lazy_in(std::uintptr_t up) noexcept {
        return reinterpret_cast<detail::lazy_stop*>(up & ~lazy_tag);
    }
    static std::uintptr_t tagged(detail::lazy_stop* stop) noexcept {
        return reinterpret_cast<std::uintptr_t>(stop) | lazy_tag;
    }
    detail::lazy_stop* lazy() const noexcept { return up_ & lazy_tag ? lazy_in(up_) : nullptr; }
    // The token this one refers to (its own, its parent's or an ancestor's), when not a lazy stop's.
    const resilience::stop_token& shared_token() const noexcept {
        return up_ ? reinterpret_cast<const context*>(up_)->token_ : token_;
    }
    // A self-contained context owns a reference to its properties; a derived one refers to its parent's.
    RESILIENCE_DETAIL_ALWAYS_INLINE void drop_properties() noexcept {
        if (props_ && self_contained()) [[unlikely]]
            release_properties(props_);
    }
    RESILIENCE_DETAIL_NOINLINE static void release_properties(const detail::property_node* p) noexcept {
        detail::property_node::release(p);
    }
    // The earlier deadline of one clock; another clock's replaces it (see `deadline()`).
    void tighten(std::chrono::nanoseconds d, const void* clock) noexcept {
        if (clock != deadline_clock_ || d < deadline_) {
            deadline_ = d;
            deadline_clock_ = clock;
        }
    }

    resilience::stop_token token_; // when `up_` is zero
    // Zero: the token is `token_`. Else, in one word: a timeout's or a hedge's attempt token, made on
    // first use (a `lazy_stop`, tagged), or the context whose `token_` this one shares.
    std::uintptr_t up_ = 0;
    detail::time_cache* time_ = nullptr; // the call's shared clock reading, while admitting
    // The listener of the `telemetry` stage around the call, for the stages inside it.
    const telemetry_listener* telemetry_ = nullptr;
    // The caller's properties, newest first: owned (one reference) by a self-contained context.
    const detail::property_node* props_ = nullptr;
    int attempt_ = 1;
    // No deadline: the largest time (a plain integer rather than an optional: contexts are moved
    // on every call's fast path, and a field of mixed widths costs a store-forwarding stall).
    static constexpr std::chrono::nanoseconds no_deadline = std::chrono::nanoseconds::max();
    std::chrono::nanoseconds deadline_ = no_deadline;
    const void* deadline_clock_ = nullptr; // the reading key (detail::reading_key) of the deadline's clock
};

namespace detail {

/// The library's way to derive contexts without copying stop tokens.
struct context_access {
    /// The lazy stop `c` takes its token from, if any (`set_deadline`'s `stop`).
    static const lazy_stop* lazy_of(const context& c) noexcept { return c.lazy(); }
    static context derive(const context& parent) noexcept { return context(context::derived_tag{}, parent); }
    static context derive(const context& parent, time_cache* cache) noexcept {
        context c(context::derived_tag{}, parent);
        c.time_ = cache;
        return c;
    }
    /// Points `c` (a call's own context, in its frame) at the call's shared clock reading.
    static void attach(context& c, time_cache* cache) noexcept { c.time_ = cache; }
    /// A child whose properties are `props` (a list that ends with the parent's: a stage's own
    /// property, in its state, before them), for the stages and the action inside the stage.
    static context derive_with_properties(const context& parent, const property_node* props) noexcept {
        context c(context::derived_tag{}, parent);
        c.props_ = props;
        return c;
    }
    static context derive_attempt(const context& parent, int attempt) noexcept {
        context c(context::derived_tag{}, parent);
        c.attempt_ = attempt;
        return c;
    }
    /// A child numbered `attempt` with a stop token of its own, made on first use (a hedge's attempt).
    static context derive_attempt(const context& parent, lazy_stop* stop, int attempt) noexcept {
        context c(context::derived_tag{}, parent);
        c.up_ = context::tagged(stop);
        c.attempt_ = attempt;
        return c;
    }
    /// A child with its own stop token, made on first use, and the deadline `d` on the clock whose
    /// reading key is `clock` (see `context::deadline()`).
    static context derive_deadline(const context& parent, lazy_stop* stop, std::chrono::nanoseconds d,
                                   const void* clock) noexcept {
        context c(context::derived_tag{}, parent);
        c.up_ = context::tagged(stop);
        c.tighten(d, clock);
        return c;
    }
    /// Makes `c` (default-constructed, in a call's state) what `derive_deadline` returns, in place:
    /// assigning a returned context would cost a store-forwarding stall on the fast path.
    static void set_deadline(context& c, const context& parent, lazy_stop* stop, std::chrono::nanoseconds d,
                             const void* clock) noexcept {
        c.up_ = context::tagged(stop);
        c.time_ = parent.time_;
        c.telemetry_ = parent.telemetry_;
        c.props_ = parent.props_;
        c.attempt_ = parent.attempt_;
        const bool keep_parent = parent.deadline_clock_ == clock && parent.deadline_ < d;
        c.deadline_ = keep_parent ? parent.deadline_ : d;
        c.deadline_clock_ = clock;
    }
    static time_cache* cache(const context& c) noexcept { return c.time_; }
    /// The call's scratch word (`call_scratch`), or null when its pipeline keeps none.
    static call_scratch* scratch(const context& c) noexcept { return c.time_ ? c.time_->scratch : nullptr; }
    /// The listener of the `telemetry` stage around the call, or null (see telemetry.hpp).
    static const telemetry_listener* telemetry(const context& c) noexcept { return c.telemetry_; }
    static void set_telemetry(context& c, const telemetry_listener* l) noexcept { c.telemetry_ = l; }
    static const property_node* properties(const context& c) noexcept { return c.props_; }
};

inline lazy_stop::lazy_stop(const context* parent) noexcept
    : parent_(reinterpret_cast<std::uintptr_t>(parent->lazy())) {
    static_assert(alignof(lazy_stop) > token_tag && alignof(stop_token) > token_tag);
    static_assert(alignof(lazy_stop) > context::lazy_tag && alignof(context) > context::lazy_tag);
    if (!parent_) {
        const stop_token* t = &parent->shared_token();
        if (t->stop_possible())
            parent_ = reinterpret_cast<std::uintptr_t>(t) | token_tag;
    }
}

} // namespace detail

} // namespace resilience

#if RESILIENCE_INCLUDE_DEFINITIONS
#include "impl/context.ipp"
#endif
