// SPDX-License-Identifier: MIT
/// \file asio_flavour/home.hpp
/// `call_home`: where a call started from Asio code runs, resumes and sleeps: a strand of the call's
/// executor, made the thread's current home (detail/home_loop.hpp) whenever the call's own code runs.
///
/// A body of the Asio integration, written once for both Asio flavours: <resilience/asio.hpp> and
/// <resilience/boost_asio.hpp> include it with RESILIENCE_ASIO_FLAVOUR (the namespace it goes in,
/// under resilience::) and RESILIENCE_ASIO_NET (the Asio it is built on, unqualified) defined, and Asio's headers
/// already included. No include guard: it is included once per flavour.

#if !defined(RESILIENCE_ASIO_FLAVOUR) || !defined(RESILIENCE_ASIO_NET) ||                                    \
    !defined(RESILIENCE_ASIO_FLAVOUR_NAME)
#error "include <resilience/asio.hpp> (standalone Asio) or <resilience/boost_asio.hpp> (Boost.Asio)"
#endif

#include "../detail/home_loop.hpp"

#include <chrono>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2::RESILIENCE_ASIO_FLAVOUR::detail {

/// Whether `ex` runs one handler at a time (`serial`): a strand, or an io_context made with concurrency
/// hint 1 (the user's promise that one thread runs it; Asio drops some of its own locking for it),
/// whose executor then serialises a call as a strand would, without a strand's allocation and
/// handoffs; and whether it is running on this thread now (`here`).
///
/// The concurrency hint is read through `net::detail::io_context_impl`, the one internal of Asio the
/// library uses (the scheduler on POSIX, the IOCP context on Windows: both keep the hint, in
/// standalone Asio 1.22 and later and Boost 1.81 and later). It is read here and nowhere else: an Asio
/// without it needs only this function changed, and an io_context then gets a strand, as any executor
/// that is not known to be serial does.
struct executor_traits {
    bool serial = false;
    bool here = false;
};
inline executor_traits traits_of(const net::any_io_executor& ex) noexcept {
    using io_executor = net::io_context::executor_type;
    using tracked_io_executor = std::decay_t<decltype(net::prefer(std::declval<io_executor>(),
                                                                  net::execution::outstanding_work.tracked))>;
    const auto io_context_traits = [](const auto& e) {
        auto& impl = net::use_service<net::detail::io_context_impl>(e.context());
        return executor_traits{impl.concurrency_hint() == 1, e.running_in_this_thread()};
    };
    if (const auto* e = ex.target<io_executor>())
        return io_context_traits(*e);
    if (const auto* e = ex.target<tracked_io_executor>())
        return io_context_traits(*e);
    if (const auto* s = ex.target<net::strand<io_executor>>())
        return {true, s->running_in_this_thread()};
    if (const auto* s = ex.target<net::strand<net::any_io_executor>>())
        return {true, s->running_in_this_thread()};
    return {};
}

/// Where a call's own code runs: an executor that runs one thing at a time, so that the call's
/// bookkeeping is serialised even on an io_context run by several threads. That is the executor the
/// call was started with when it already does (`traits_of`), else a strand of it, kept as its
/// own type: wrapped in an `any_io_executor` a strand does not fit the small buffer, and every
/// `post`, binding and work guard of it would allocate. Attempts run on `io()` (as Asio runs any
/// coroutine there); their completions and everything of the call's own come back through `visit`.
class call_executor {
public:
    explicit call_executor(const net::any_io_executor& ex);

    /// The executor the call was started with.
    const net::any_io_executor& io() const noexcept { return io_; }

    /// The strand the call made, or null when `io()` serialises the call itself.
    const net::strand<net::any_io_executor>* strand() const noexcept { return strand_ ? &*strand_ : nullptr; }

    /// Made on this thread while the serialising executor ran on it: the call may start at once.
    bool made_here() const noexcept { return here_; }

    /// `f(e)`, with `e` the serialising executor (the strand, or `io()` itself).
    template <class F>
    decltype(auto) visit(F&& f) const {
        if (strand_)
            return std::forward<F>(f)(*strand_);
        return std::forward<F>(f)(io_);
    }

private:
    net::any_io_executor io_;
    std::optional<net::strand<net::any_io_executor>> strand_;
    bool here_ = false;
};

class call_registry;

/// The home of one call started from Asio code (`execute`, `async_run`, `spawn`). It lives in the
/// call's outermost frame. Everything it runs (posted work, the default clock's sleeps, the call's
/// resumption after a wait that ended elsewhere) runs on its serialising executor (`call_executor`),
/// with this home current, so a policy on the default clock sleeps on a timer of the call's executor
/// and a queued waiter granted by another thread resumes here.
class call_home final : public resilience::detail::home_loop {
public:
    explicit call_home(call_executor where) noexcept : home_loop(&operations_), where_(std::move(where)) {}

    const call_executor& where() const noexcept { return where_; }

    /// The registry of the call's context, which keeps its timers: set when the call starts.
    void attach(call_registry* r) noexcept { registry_ = r; }

    /// The home of the call whose code runs on this thread, or null.
    static call_home* current() noexcept {
        home_loop* const h = home_loop::current();
        return h && !h->is_event_loop() ? static_cast<call_home*>(h) : nullptr;
    }

private:
    using timer_node = resilience::detail::timer_node;

    static void post_job(home_loop* h, resilience::detail::job j) {
        auto* self = static_cast<call_home*>(h);
        // The home is alive when the job runs: what is posted resumes the call, which waits for it.
        self->where_.visit([&](const auto& serial) {
            net::post(serial, [self, j] {
                home_loop::scope here(self);
                j();
            });
        });
    }

    // The timers of every call on an execution context are in one wheel with one Asio timer, kept by
    // the context's `call_registry` (async_run.hpp, where these two are defined).
    static void add_timer(home_loop* h, timer_node* t);
    static void remove_timer(home_loop* h, timer_node* t) noexcept;

    static constexpr operations operations_{&post_job, &add_timer, &remove_timer, nullptr};

    call_executor where_;
    call_registry* registry_ = nullptr;
};

} // namespace resilience::RESILIENCE_ASIO_FLAVOUR::detail
