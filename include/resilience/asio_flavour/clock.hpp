// SPDX-License-Identifier: MIT
/// \file asio_flavour/clock.hpp
/// `resilience::asio::clock`: a clock whose sleeps are Asio steady timers, for the policies that run
/// on an io_context's threads.
///
/// A body of the Asio integration, written once for both Asio flavours: <resilience/asio.hpp> and
/// <resilience/boost_asio.hpp> include it with RESILIENCE_ASIO_FLAVOUR (the namespace it goes in,
/// under resilience::) and RESILIENCE_ASIO_NET (the Asio it is built on, unqualified) defined, and Asio's headers
/// already included. No include guard: it is included once per flavour.

#if !defined(RESILIENCE_ASIO_FLAVOUR) || !defined(RESILIENCE_ASIO_NET) ||                                    \
    !defined(RESILIENCE_ASIO_FLAVOUR_NAME)
#error "include <resilience/asio.hpp> (standalone Asio) or <resilience/boost_asio.hpp> (Boost.Asio)"
#endif

#include "../clock.hpp"
#include "../concepts.hpp"
#include "../stop_token.hpp"

#include <chrono>
#include <coroutine>
#include <optional>
#include <utility>

namespace resilience::inline v0_2::RESILIENCE_ASIO_FLAVOUR {

/// A clock that sleeps on Asio steady timers bound to an executor; the sleeping coroutine resumes
/// in that executor's context (the io_context's threads). `std::chrono::steady_clock` time.
/// Copyable; the execution context must outlive every sleep. A stop request from any thread
/// cancels the timer through the executor. A pending sleep is an Asio operation like any
/// `use_task` one: an io_context destroyed during a backoff destroys the waiting call.
class clock {
public:
    using duration = std::chrono::steady_clock::duration;
    using time_point = std::chrono::steady_clock::time_point;

    explicit clock(net::any_io_executor executor) : executor_(std::move(executor)) {}

    time_point now() const noexcept { return std::chrono::steady_clock::now(); }
    const net::any_io_executor& executor() const noexcept { return executor_; }

    auto sleep_until(time_point tp, stop_token token) const {
        return sleep_awaiter{executor_, tp, std::move(token)};
    }
    auto sleep_for(duration d, stop_token token) const { return sleep_until(now() + d, std::move(token)); }

private:
    // The timer lives in the sleeping frame; its wait is a `use_task(token)` operation, so the
    // stop request, the resumption in the executor's context and the ownership are all that one's.
    class sleep_awaiter {
    public:
        sleep_awaiter(net::any_io_executor ex, time_point tp, stop_token token)
            : executor_(std::move(ex)), when_(tp), token_(std::move(token)) {}

        bool await_ready() const noexcept {
            return token_.stop_requested() || when_ <= std::chrono::steady_clock::now();
        }
        bool await_suspend(std::coroutine_handle<> h) {
            timer_.emplace(executor_, when_);
            wait_.emplace(resilience::detail::emplace_from{
                [&] { return timer_->async_wait(use_task_with_stop_t{std::move(token_)}); }});
            return wait_->await_suspend(h);
        }
        void await_resume() {
            if (wait_)
                (void)wait_->await_resume(); // aborted or expired: the caller checks its token
        }

    private:
        using wait_operation =
            decltype(std::declval<net::steady_timer&>().async_wait(std::declval<use_task_with_stop_t>()));

        net::any_io_executor executor_;
        time_point when_;
        stop_token token_;
        std::optional<net::steady_timer> timer_;
        std::optional<wait_operation> wait_;
    };

    net::any_io_executor executor_;
};

static_assert(resilience::clock<clock>);

} // namespace resilience::RESILIENCE_ASIO_FLAVOUR
