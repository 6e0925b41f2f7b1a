// SPDX-License-Identifier: MIT
// Every public header this build can include, and no call: compiled by g++ at -O0 (tests/CMakeLists.txt),
// its object must hold no coroutine (tests/gcc_no_uncalled_coroutines.cmake). g++ 12 at -O0 compiles
// every inline coroutine that is not a template into each file that includes it, called or not, with all
// it instantiates; a header that defined one would cost every user's Debug build of a file that includes
// it (include/resilience/redis/connection.hpp says how the library avoids it).
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>
#include <resilience/testing/simulation.hpp>

#if RESILIENCE_CHECK_ASIO
#include <resilience/asio.hpp>
#endif
#if RESILIENCE_CHECK_BOOST_ASIO
#include <resilience/beast.hpp>
#include <resilience/boost_asio.hpp>
#endif
#if RESILIENCE_CHECK_REDIS
#include <resilience/redis.hpp>
#endif
#if RESILIENCE_CHECK_FMT
#include <resilience/fmt.hpp>
#endif
#if RESILIENCE_CHECK_PROMETHEUS
#include <resilience/prometheus.hpp>
#endif
#if RESILIENCE_CHECK_GRPC
#include <resilience/grpc.hpp>
#endif
