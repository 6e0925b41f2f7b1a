// SPDX-License-Identifier: MIT
/// \file asio/clock.hpp
/// the Asio clock, on standalone Asio: kept for the programs that include it by this name; the whole
/// integration is <resilience/asio.hpp> (and <resilience/boost_asio.hpp> on Boost.Asio).
#pragma once

#include "../asio.hpp"
