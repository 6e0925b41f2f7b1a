// SPDX-License-Identifier: MIT
/// \file asio.hpp
/// Optional Asio integration, on standalone Asio 1.22 or later (<resilience/boost_asio.hpp> is the same
/// on Boost.Asio): a clock whose sleeps are Asio timers,
/// `async_run`, which runs a resilience awaitable as an Asio asynchronous operation, and `use_task`,
/// the completion token that lets a resilience coroutine await an Asio operation.
///
///     asio::io_context io;
///     rs::asio::clock clock{io.get_executor()};
///     rs::pipeline policy{rs::retry{{.max_attempts = 3}, clock}, rs::timeout{2s, clock}};
///
///     // an action: its stop token reaches the read as Asio per-operation cancellation
///     auto fetch = [&](std::stop_token st) -> rs::task<std::size_t> {
///         auto [ec, n] = co_await socket.async_read_some(asio::buffer(buf), rs::asio::use_task(st));
///         if (ec) throw std::system_error(ec);
///         co_return n;
///     };
///     // from Asio code, with any completion token; Asio cancellation of the operation stops the call
///     rs::asio::async_run(io.get_executor(), [&](std::stop_token st) { return policy.execute(fetch, st); },
///                         [](std::exception_ptr e, std::size_t n) { ... });
///
/// Policies that run on Asio threads must be given this clock: the default `steady_clock` sleeps on
/// the library's own `event_loop`, which Asio threads do not run.
///
/// The io_context owns the calls started on it with `async_run` and destroys them, wherever they wait,
/// when it shuts down; `rs::asio::spawn` starts a call in an `rs::async_scope`, for a graceful drain
/// before that (docs/asio.md).
#pragma once

// Standalone Asio: its headers need ASIO_STANDALONE (the target resilience::asio defines it).
#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/execution/context.hpp>
#include <asio/execution_context.hpp>
#include <asio/io_context.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/dispatch.hpp>
#include <asio/post.hpp>
#include <asio/query.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/bind_executor.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/awaitable.hpp>
#include <asio/system_context.hpp>
#include <asio/system_executor.hpp>
#include <asio/use_awaitable.hpp>

namespace resilience::asio {
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
// In this order: each body uses the ones before it.
// clang-format off
#include "asio/flavour/use_task.hpp"
#include "asio/flavour/home.hpp"
#include "asio/flavour/clock.hpp"
#include "asio/flavour/async_run.hpp"
#include "asio/flavour/execute.hpp"
// clang-format on
#undef RESILIENCE_ASIO_FLAVOUR
#undef RESILIENCE_ASIO_NET
#undef RESILIENCE_ASIO_FLAVOUR_NAME
#undef RESILIENCE_ASIO_NET_NAME
#undef RESILIENCE_ASIO_HAS_CO_AWAIT
#undef RESILIENCE_ASIO_HAS_DEFERRED
