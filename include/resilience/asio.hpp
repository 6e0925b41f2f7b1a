// SPDX-License-Identifier: MIT
/// \file asio.hpp
/// Optional Asio integration, on standalone Asio 1.22 or later (<resilience/boost_asio.hpp> is the same
/// on Boost.Asio). A call through a policy is an Asio asynchronous operation, `execute`, whose action
/// is an `asio::awaitable` (or an `rs::task`) called once per attempt; policies built without a clock
/// sleep on timers of the call's executor, so no clock is named:
///
///     rs::pipeline policy{rs::retry{{.max_attempts = 3}}, rs::timeout{2s}};
///
///     auto fetch = [&]() -> asio::awaitable<std::size_t> {
///         // a timeout or a losing hedge cancels the read (terminal): use_awaitable throws operation_aborted
///         co_return co_await socket.async_read_some(asio::buffer(buf), asio::use_awaitable);
///     };
///     // in an asio::awaitable: the call runs on the coroutine's executor, a failure is rethrown here
///     std::size_t n = co_await rs::asio::execute(policy, fetch, asio::use_awaitable);
///     // any completion token, given the executor: a callback, use_future, ...
///     rs::asio::execute(io.get_executor(), policy, fetch, [](std::exception_ptr e, std::size_t n) { ... });
///
/// Asio cancellation of the operation (`||`, bind_cancellation_slot) stops the call. Also here:
/// `use_task`, the completion token with which an `rs::task` awaits an Asio operation; `async_run`,
/// which runs a resilience awaitable as an Asio operation; `spawn`, which starts one in an
/// `rs::async_scope` for a graceful drain; and `clock`, whose sleeps are timers of a given executor.
/// With clang and libstdc++, Asio 1.22 declares no `asio::awaitable` (Boost.Asio does).
///
/// The io_context owns the calls started on it and destroys them, wherever they wait, when it shuts
/// down (docs/asio.md).
#pragma once

// Standalone Asio: its headers need ASIO_STANDALONE (the target resilience::asio defines it).
#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/execution/context.hpp>
#include <asio/execution_context.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/query.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/system_context.hpp>
#include <asio/system_executor.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

namespace resilience::inline v0_2::asio {
/// The Asio this integration is built on: standalone Asio's namespace.
namespace net = ::asio;
} // namespace resilience::asio

#if defined(RESILIENCE_ASIO_FLAVOUR) || defined(RESILIENCE_ASIO_NET) || defined(RESILIENCE_ASIO_FLAVOUR_NAME)
#error "RESILIENCE_ASIO_FLAVOUR, RESILIENCE_ASIO_NET and RESILIENCE_ASIO_FLAVOUR_NAME are the library's own"
#endif
#define RESILIENCE_ASIO_FLAVOUR asio
#define RESILIENCE_ASIO_FLAVOUR_NAME "asio"
#define RESILIENCE_ASIO_NET asio
#define RESILIENCE_ASIO_NET_NAME "asio"
#if defined(ASIO_HAS_CO_AWAIT)
#define RESILIENCE_ASIO_HAS_CO_AWAIT 1
#else
#define RESILIENCE_ASIO_HAS_CO_AWAIT 0
#endif
#define RESILIENCE_ASIO_HAS_DEFERRED 0
#if defined(ASIO_HAS_STD_FUTURE_CLASS)
#define RESILIENCE_ASIO_HAS_USE_FUTURE 1
#else
#define RESILIENCE_ASIO_HAS_USE_FUTURE 0
#endif
#include "asio_flavour/bodies.hpp" // the bodies, in order; undefines the macros above
