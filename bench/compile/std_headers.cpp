// SPDX-License-Identifier: MIT
// Compile-cost baseline: the standard headers that <resilience/resilience.hpp> includes, and nothing of the
// library (see bench/README.md, "Build cost"). When a header of the library starts using another one, add it
// here.
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cassert>
#include <chrono>
#include <cmath>
#include <concepts>
#include <condition_variable>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <ratio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <time.h>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>
#include <version>
#if __has_include(<cxxabi.h>)
#include <cxxabi.h>
#endif
#if __has_include(<expected>)
#include <expected>
#endif
#if __has_include(<stop_token>)
#include <stop_token>
#endif

int main() {
    return 0;
}
