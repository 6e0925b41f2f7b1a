// SPDX-License-Identifier: MIT
// resilience::compiled: the library's compiled mode (docs/install.md, "Compiled mode").
#define RESILIENCE_COMPILING_LIBRARY
#include <resilience/src.hpp>
