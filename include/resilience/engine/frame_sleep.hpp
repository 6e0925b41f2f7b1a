// SPDX-License-Identifier: MIT
/// \file engine/frame_sleep.hpp
/// A clock's sleep kept in an object rather than in a coroutine's frame: what a policy's `frame_wait`
/// holds to wait on its clock in the pipeline's frame (a retry's backoff).
#pragma once

#include "../concepts.hpp"
#include "../stop_token.hpp"

#include <coroutine>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace resilience::inline v0_2::detail {

/// `clock.sleep_until(tp, token)`, awaited through this object: `await_ready`, `await_suspend` and
/// `await_resume` are the sleep's. It keeps as little as the clock's awaitable allows: the awaiter
/// alone when `sleep_until` returns one, or when its awaitable says that the awaiter of its
/// `operator co_await` refers to nothing of it (`using standalone_awaiter = void;`, as the library's
/// clocks do); otherwise the awaitable, and its awaiter once awaited, as a `co_await` would.
template <class C>
class frame_sleep {
    using awaitable_type = decltype(std::declval<const C&>().sleep_until(
        std::declval<typename C::time_point>(), std::declval<stop_token>()));
    // As `co_await` does: an `operator co_await` first, else the awaitable is its own awaiter.
    static constexpr bool is_awaiter =
        !has_member_co_await<awaitable_type> && !has_free_co_await<awaitable_type>;
    static constexpr bool standalone =
        has_member_co_await<awaitable_type> && requires { typename awaitable_type::standalone_awaiter; };
    using got = decltype(get_awaiter(std::declval<awaitable_type>()));
    using awaiter_type = std::remove_cvref_t<got>;
    // What the kept awaitable's `operator co_await` gives: a value, or a reference into the awaitable.
    using made_type = std::conditional_t<std::is_reference_v<got>, std::remove_reference_t<got>*,
                                         std::optional<awaiter_type>>;

    static awaiter_type start(const C& clock, typename C::time_point tp, stop_token token) {
        if constexpr (is_awaiter)
            return clock.sleep_until(tp, std::move(token));
        else
            return clock.sleep_until(tp, std::move(token)).operator co_await();
    }

public:
    frame_sleep(const C& clock, typename C::time_point tp, stop_token token)
    requires(is_awaiter || standalone)
        : awaiter_(start(clock, tp, std::move(token))) {}
    frame_sleep(const C& clock, typename C::time_point tp, stop_token token)
    requires(!is_awaiter && !standalone)
        : awaiter_{clock.sleep_until(tp, std::move(token)), made_type{}} {}
    frame_sleep(const frame_sleep&) = delete;
    frame_sleep& operator=(const frame_sleep&) = delete;

    bool await_ready() { return awaiter().await_ready(); }
    template <class Promise>
    auto await_suspend(std::coroutine_handle<Promise> h) {
        return awaiter().await_suspend(h);
    }
    decltype(auto) await_resume() { return awaiter().await_resume(); }

private:
    struct kept {
        awaitable_type awaitable;
        made_type made;
    };
    auto& awaiter() {
        if constexpr (is_awaiter || standalone) {
            return awaiter_;
        } else if constexpr (std::is_reference_v<got>) {
            if (!awaiter_.made)
                awaiter_.made = std::addressof( // an lvalue to take the address of, whichever reference
                    static_cast<std::remove_reference_t<got>&>(get_awaiter(std::move(awaiter_.awaitable))));
            return *awaiter_.made;
        } else {
            if (!awaiter_.made)
                awaiter_.made.emplace(
                    emplace_from{[&] { return get_awaiter(std::move(awaiter_.awaitable)); }});
            return *awaiter_.made;
        }
    }

    std::conditional_t<is_awaiter || standalone, awaiter_type, kept> awaiter_;
};

} // namespace resilience::detail
