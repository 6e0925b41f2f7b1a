// SPDX-License-Identifier: MIT
// The g++ 12 safe call form, compiled with the project's compiler under AddressSanitizer (see
// tests/CMakeLists.txt): `execute(f, args...)` with an argument that owns heap memory, written as
// the one-liner inside `co_return co_await`. With a capturing lambda in the same place, g++ 12
// destroys the lambda twice (ASan: attempting double-free); this form has no such temporary.
#include <resilience/resilience.hpp>

#include <cstdio>
#include <stdexcept>
#include <stop_token>
#include <string>

namespace rs = resilience;
using namespace std::chrono_literals;

namespace {

int failures_left = 0;

rs::task<std::size_t> fetch(std::string host, std::stop_token) {
    if (failures_left > 0) {
        --failures_left;
        throw std::runtime_error("flaky " + host);
    }
    co_return host.size();
}

rs::task<std::size_t> through_retry(const rs::retry<>& r, std::string host) {
    co_return co_await r.execute(fetch, host);
}

rs::task<std::size_t> through_pipeline(const auto& p, std::string host, std::stop_token caller) {
    co_return co_await p.execute(fetch, host, caller);
}

rs::task<rs::outcome<std::size_t>> outcome_form(const auto& p, std::string host) {
    co_return co_await p.execute_outcome(fetch, host);
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
    std::printf("%d passed, %d failed\n", 4 - failed, failed);
    return failed == 0 ? 0 : 1;
}
