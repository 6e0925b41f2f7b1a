// SPDX-License-Identifier: MIT
/// \file asio.hpp
/// Optional Asio integration (standalone Asio 1.22 or later): a clock whose sleeps are Asio timers,
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

#include "asio/async_run.hpp"
#include "asio/clock.hpp"
#include "asio/use_task.hpp"
