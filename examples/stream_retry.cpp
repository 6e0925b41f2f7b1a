// SPDX-License-Identifier: MIT
// Retrying a stream that breaks half-way. A client exports twelve rows from a remote table, one row every
// 50 ms; the connection fails once before the first row and drops twice in the middle. The stream is
// wrapped in rs::retry_stream with partial_stream::restart_from_start, and the factory opens the table
// at stream_context::items_yielded(), so each new connection resumes where the last one broke.
// For comparison the same outage is replayed with a factory that ignores the offset: the stream then
// starts over and the consumer sees the first rows again. Everything runs on virtual time, so the
// timeline below is exact and the whole run takes a few milliseconds. Exits non-zero unless the
// resuming consumer received every row exactly once, in order.
#include <resilience/resilience.hpp>
#include <resilience/testing/simulation.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace rs = resilience;
using namespace std::chrono_literals;
using std::chrono::nanoseconds;

namespace {

constexpr int rows_in_table = 12;
constexpr nanoseconds per_row = 50ms;

double ms(nanoseconds d) {
    return std::chrono::duration<double, std::milli>(d).count();
}

struct connection_lost : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The remote table. Connection n (1-based) fails before sending anything when n is in `refused`, and
// drops after sending `drop_after[n]` rows when it has an entry there.
struct remote_table {
    rs::testing::simulation* sim;
    int connections = 0;

    rs::async_generator<int> read_from(int first_row, resilience::stop_token stop) {
        const int n = ++connections;
        fmt::print("{:>9.1f} ms  connection {} opens at row {}\n", ms(sim->now()), n, first_row);
        if (n == 1) {
            fmt::print("{:>9.1f} ms  connection {} refused\n", ms(sim->now()), n);
            throw connection_lost("connection refused");
        }
        const int drop_after = n == 2 ? 4 : n == 3 ? 5 : -1;
        int sent = 0;
        for (int row = first_row; row < rows_in_table; ++row) {
            co_await sim->sleep_for(per_row, stop);
            if (sent == drop_after) {
                fmt::print("{:>9.1f} ms  connection {} resets\n", ms(sim->now()), n);
                throw connection_lost("connection reset after " + std::to_string(sent) + " rows");
            }
            ++sent;
            co_yield row;
        }
    }
};

// Pulls every row of `rows`, printing each, and returns them (or what came before a failure).
rs::task<std::vector<int>> export_all(rs::testing::simulation& sim, rs::async_generator<int>& rows) {
    std::vector<int> got;
    try {
        while (std::optional<int> row = co_await rows.next()) {
            fmt::print("{:>9.1f} ms    row {}\n", ms(sim.now()), *row);
            got.push_back(*row);
        }
    } catch (const std::exception& e) {
        fmt::print("{:>9.1f} ms  the stream failed: {}\n", ms(sim.now()), e.what());
    }
    co_return got;
}

// One export through retry_stream; `resume` picks the factory that opens at the offset it is given.
std::vector<int> run(bool resume) {
    rs::testing::simulation sim;
    remote_table table{&sim};
    const rs::stream_retry_options options{
        .name = "export",
        .max_attempts = 6,
        .backoff = rs::exponential_backoff{.initial = 100ms, .max = 2s, .jitter = rs::jitter::none},
        .partial = rs::partial_stream::restart_from_start,
    };
    auto rows = rs::retry_stream(
        [&table, resume](const rs::stream_context& c) {
            return table.read_from(resume ? static_cast<int>(c.items_yielded()) : 0, c.stop_token());
        },
        options, sim.clock());
    std::vector<int> got = sim.run(export_all(sim, rows));
    fmt::print("{:>9.1f} ms  done: {} rows received over {} connections\n\n", ms(sim.now()), got.size(),
               table.connections);
    return got;
}

} // namespace

int main() {
    fmt::print("A factory that resumes at stream_context::items_yielded():\n");
    const std::vector<int> resumed = run(true);
    fmt::print("A factory that ignores it (the stream starts over):\n");
    const std::vector<int> restarted = run(false);

    std::vector<int> expected;
    for (int row = 0; row < rows_in_table; ++row)
        expected.push_back(row);
    fmt::print("resuming:      {} rows, each exactly once: {}\n", resumed.size(),
               resumed == expected ? "yes" : "no");
    fmt::print("starting over: {} rows, {} of them delivered again\n", restarted.size(),
               static_cast<long>(restarted.size()) - static_cast<long>(expected.size()));
    if (resumed != expected) {
        fmt::print(stderr, "stream_retry: the resuming consumer did not receive every row exactly once\n");
        return 1;
    }
    return 0;
}
