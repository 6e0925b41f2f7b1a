// SPDX-License-Identifier: MIT
/// \file asio_flavour/bodies.hpp
/// The Asio integration's bodies for the flavour that <resilience/asio.hpp> or
/// <resilience/boost_asio.hpp> has just named (`RESILIENCE_ASIO_FLAVOUR`, `RESILIENCE_ASIO_NET` and the
/// macros beside them), in the order in which each uses the ones before it; the flavour's macros are
/// undefined after them. No include guard: it is included once per flavour.

#if !defined(RESILIENCE_ASIO_FLAVOUR) || !defined(RESILIENCE_ASIO_NET) ||                                    \
    !defined(RESILIENCE_ASIO_FLAVOUR_NAME)
#error "include <resilience/asio.hpp> (standalone Asio) or <resilience/boost_asio.hpp> (Boost.Asio)"
#endif

// clang-format off
#include "use_task.hpp"
#include "home.hpp"
#include "clock.hpp"
#include "async_run.hpp"
#include "execute.hpp"
// clang-format on

#undef RESILIENCE_ASIO_FLAVOUR
#undef RESILIENCE_ASIO_NET
#undef RESILIENCE_ASIO_FLAVOUR_NAME
#undef RESILIENCE_ASIO_NET_NAME
#undef RESILIENCE_ASIO_HAS_CO_AWAIT
#undef RESILIENCE_ASIO_HAS_DEFERRED
#undef RESILIENCE_ASIO_HAS_USE_FUTURE
