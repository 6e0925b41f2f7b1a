// SPDX-License-Identifier: MIT
// The call forms that compile on g++ 12, run with the project's compiler under AddressSanitizer
// (see tests/CMakeLists.txt), each written as the one-liner inside `co_return co_await` and with
// data that owns heap memory: `execute(f, args...)` (f a function or a coroutine lambda without
// captures), a lambda that captures by reference, and a named lambda that captures by value,
// passed as an lvalue. A lambda that captures by value written inside the co_await is destroyed
// twice by g++ 12 (gcc_closure_double_free.cpp shows it), and execute refuses it there
// (compile_fail/gcc12/).
#include <resilience/resilience.hpp>
#include <resilience/stop_token.hpp>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

int failures_left = 0;

rs::task<std::size_t> fetch(std::string host, resilience::stop_token) {
    if (failures_left > 0) {
        --failures_left;
        throw std::runtime_error("flaky " + host);
    }
    co_return host.size();
}

rs::task<std::size_t> through_retry(const rs::retry<>& r, std::string host) {
    co_return co_await r.execute(fetch, host);
}

rs::task<std::size_t> through_pipeline(const auto& p, std::string host, resilience::stop_token caller) {
    co_return co_await p.execute(fetch, host, caller);
}

rs::task<rs::outcome<std::size_t>> outcome_form(const auto& p, std::string host) {
    co_return co_await p.execute_outcome(fetch, host);
}

// The coroutine-lambda spelling of the safe form: the data is a parameter, not a capture.
rs::task<std::size_t> coroutine_lambda_with_arguments(const rs::retry<>& r, std::string host) {
    co_return co_await r.execute(
        [](std::string h, resilience::stop_token st) -> rs::task<std::size_t> {
            co_return co_await fetch(h, st);
        },
        host);
}

// Captures by reference: trivially destructible, so the second destruction does nothing.
rs::task<std::size_t> reference_capture(const rs::retry<>& r, std::string host) {
    co_return co_await r.execute([&](resilience::stop_token st) { return fetch(host, st); });
}
rs::task<std::size_t> reference_capture_coroutine(const rs::retry<>& r, std::string host) {
    co_return co_await r.execute(
        [&](resilience::stop_token st) -> rs::task<std::size_t> { co_return co_await fetch(host, st); });
}

// A named lambda that owns a copy, passed as an lvalue: execute copies it with its constructor.
rs::task<std::size_t> named_capture(const rs::retry<>& r, std::string host) {
    const auto action = [host](resilience::stop_token st) { return fetch(host, st); };
    co_return co_await r.execute(action);
}
rs::task<std::size_t> named_capture_coroutine(const rs::retry<>& r, std::string host) {
    const auto action = [host](resilience::stop_token st) -> rs::task<std::size_t> {
        co_return co_await fetch(host, st);
    };
    co_return (co_await r.execute_outcome(action)).value();
}

int check(bool ok, const char* what) {
    std::printf("%s: %s\n", ok ? "ok" : "FAILED", what);
    return ok ? 0 : 1;
}

} // namespace

int main() {
    const std::string host(64, 'h'); // long enough to live on the heap
    rs::retry r{{.max_attempts = 3, .backoff = rs::constant_backoff{0ms}}};
    rs::pipeline p{rs::retry{{.max_attempts = 3, .backoff = rs::constant_backoff{0ms}}}, rs::timeout{1s}};
    int failed = 0;
    failed += check(rs::sync_wait(through_retry(r, host)) == 64, "retry: one call");
    failures_left = 2;
    failed += check(rs::sync_wait(through_retry(r, host)) == 64, "retry: the argument survives two retries");
    failures_left = 1;
    failed += check(rs::sync_wait(through_pipeline(p, host, {})) == 64, "pipeline with a caller's token");
    failed += check(rs::sync_wait(outcome_form(p, host)).value() == 64, "execute_outcome");
    failures_left = 1;
    failed += check(rs::sync_wait(coroutine_lambda_with_arguments(r, host)) == 64,
                    "execute(f, args...) with a coroutine lambda");
    failures_left = 1;
    failed += check(rs::sync_wait(reference_capture(r, host)) == 64, "a lambda capturing by reference");
    failures_left = 1;
    failed += check(rs::sync_wait(reference_capture_coroutine(r, host)) == 64,
                    "a coroutine lambda capturing by reference");
    failures_left = 1;
    failed += check(rs::sync_wait(named_capture(r, host)) == 64, "a named lambda capturing by value");
    failures_left = 1;
    failed += check(rs::sync_wait(named_capture_coroutine(r, host)) == 64,
                    "a named coroutine lambda capturing by value");
    std::printf("%d passed, %d failed\n", 9 - failed, failed);
    return failed == 0 ? 0 : 1;
}
