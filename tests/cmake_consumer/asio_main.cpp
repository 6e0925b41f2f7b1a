// SPDX-License-Identifier: MIT
// The installed Asio integrations: both flavours and Beast's response in one program, through the
// targets resilience::asio, resilience::boost_asio and resilience::beast.
#include <resilience/asio.hpp>
#include <resilience/beast.hpp>
#include <resilience/boost_asio.hpp>
#include <resilience/resilience.hpp>

#include <asio/io_context.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/beast/http/string_body.hpp>

#include <chrono>
#include <exception>
#include <utility>

namespace rs = resilience;

// One retried call whose attempt sleeps on `Clock`, run by `io` until it answers: 1, or 0 on failure.
template <class Clock, class IoContext, class AsyncRun>
int one_call(IoContext& io, AsyncRun async_run) {
    const Clock clock{io.get_executor()};
    rs::retry r{{.max_attempts = 2}, clock};
    auto attempt = [clock]() -> rs::task<int> {
        co_await clock.sleep_for(std::chrono::milliseconds(1), {});
        co_return 1;
    };
    int answer = 0;
    async_run(io.get_executor(), r.execute(attempt),
              [&](std::exception_ptr e, int v) { answer = e ? 0 : v; });
    io.run();
    return answer;
}

int main() {
    ::asio::io_context standalone;
    const int a = one_call<rs::asio::clock>(
        standalone, [](auto&&... args) { rs::asio::async_run(std::forward<decltype(args)>(args)...); });
    boost::asio::io_context boost;
    const int b = one_call<rs::boost_asio::clock>(
        boost, [](auto&&... args) { rs::boost_asio::async_run(std::forward<decltype(args)>(args)...); });

    using reply = boost::beast::http::response<boost::beast::http::string_body>;
    const reply unavailable{boost::beast::http::status::service_unavailable, 11};
    const bool retried = rs::http::response_classifier<reply>{}(rs::outcome<reply>{unavailable}).handle;
    return a + b == 2 && retried ? 0 : 1;
}
