// SPDX-License-Identifier: MIT
// Why execute refuses, on g++ before 13, a temporary lambda that owns something with a destructor:
// compiled by g++ under AddressSanitizer with the check turned off (RESILIENCE_ALLOW_CLOSURE_CAPTURES),
// the natural one-liners below free the captured string twice. tests/CMakeLists.txt expects
// AddressSanitizer's double-free report from each form ("capture": a lambda returning the task;
// "coroutine": a coroutine lambda); should a g++ before 13 not have the bug, these tests fail and
// the check's version bound can move. gcc_safe_call.cpp runs the forms that compile with the check.
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>

#include <cstdio>
#include <cstring>
#include <string>

namespace rs = resilience;

namespace {

rs::task<std::size_t> use(std::string key, resilience::stop_token) {
    co_return key.size();
}

rs::task<std::size_t> capture(const rs::retry<>& r, std::string key) {
    co_return co_await r.execute([key](resilience::stop_token st) { return use(key, st); });
}

rs::task<std::size_t> coroutine(const rs::retry<>& r, std::string key) {
    co_return co_await r.execute(
        [key](resilience::stop_token st) -> rs::task<std::size_t> { co_return co_await use(key, st); });
}

} // namespace

int main(int argc, char** argv) {
    if (argc != 2 || (std::strcmp(argv[1], "capture") != 0 && std::strcmp(argv[1], "coroutine") != 0)) {
        std::fprintf(stderr, "usage: %s capture|coroutine\n", argv[0]);
        return 2;
    }
    const std::string key(64, 'k'); // long enough to live on the heap
    const rs::retry r{};
    const bool is_capture = std::strcmp(argv[1], "capture") == 0;
    const std::size_t n = rs::sync_wait(is_capture ? capture(r, key) : coroutine(r, key));
    std::printf("%s: returned %zu, no double free reported\n", argv[1], n);
    return 0;
}
