// SPDX-License-Identifier: MIT
// Three replicas of a service, each on its own thread with its own event loop and Redis connection,
// keep to one upstream quota together through rs::redis::rate_limiter. Prints the admissions of every
// second, per replica and in total, and exits non-zero if the total ever passes the quota.
//
// Uses the Redis at REDIS_URL (redis://host:port) when set; otherwise starts a private redis-server on
// a free loopback port, in a temporary directory, and stops it at the end.
#include <resilience/asio.hpp>
#include <resilience/redis.hpp>
#include <resilience/resilience.hpp>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <fmt/core.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <spawn.h>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <vector>

extern char** environ;

namespace rs = resilience;
namespace redis = resilience::redis;
using namespace std::chrono_literals;

namespace {

constexpr int replicas = 3;
constexpr int seconds = 3;
constexpr std::size_t burst = 10;
constexpr double quota = 60; // calls a second, for the three together

// A redis-server of our own, for when no REDIS_URL is given.
class private_server {
public:
    private_server() {
        ::asio::io_context io;
        port_ =
            ::asio::ip::tcp::acceptor{io, {::asio::ip::make_address("127.0.0.1"), 0}}.local_endpoint().port();
        char tmpl[] = "/tmp/shared-quota-XXXXXX";
        dir_ = ::mkdtemp(tmpl) ? tmpl : "/tmp";
        std::vector<std::string> args{
            "redis-server", "--port",    std::to_string(port_), "--bind", "127.0.0.1",
            "--save",       "",          "--appendonly",        "no",     "--dir",
            dir_,           "--logfile", dir_ + "/log"};
        std::vector<char*> argv;
        for (auto& a : args)
            argv.push_back(a.data());
        argv.push_back(nullptr);
        if (::posix_spawnp(&pid_, "redis-server", nullptr, nullptr, argv.data(), environ) != 0)
            throw std::runtime_error(
                "cannot start redis-server (apt-get install redis-server), or set REDIS_URL");
        for (int i = 0; i < 1000 && !answers(); ++i)
            std::this_thread::sleep_for(10ms);
    }
    ~private_server() {
        ::kill(pid_, SIGTERM);
        int status = 0;
        ::waitpid(pid_, &status, 0);
        std::error_code ignored;
        std::filesystem::remove_all(dir_, ignored);
    }
    std::uint16_t port() const { return port_; }

private:
    // Asks with the library's own connection: a PING answered means the server is up.
    bool answers() const {
        ::asio::io_context io;
        const redis::connection probe{io.get_executor(), {.port = port_}};
        bool up = false;
        rs::asio::async_run(
            io.get_executor(),
            [](redis::connection c) -> rs::task<bool> {
                auto ping = c.command({"PING"});
                co_return (co_await std::move(ping)).str == "PONG";
            }(probe),
            [&up](std::exception_ptr e, bool pong) { up = !e && pong; });
        io.run();
        return up;
    }
    std::uint16_t port_ = 0;
    std::string dir_;
    pid_t pid_ = 0;
};

// The upstream call the quota protects.
rs::task<int> upstream() {
    co_return 200;
}

// One caller of a replica: calls through the policy until `end`, counting admissions per second.
rs::task<int> caller(redis::rate_limiter limiter, std::chrono::steady_clock::time_point start,
                     std::chrono::steady_clock::time_point end, std::array<int, seconds>& per_second) {
    const rs::asio::clock clock = limiter.clock();
    while (clock.now() < end) {
        auto call = limiter.execute_outcome(upstream);
        const rs::outcome<int> r = co_await std::move(call);
        if (r.has_value()) {
            const auto second = static_cast<std::size_t>((clock.now() - start) / 1s);
            if (second < per_second.size())
                ++per_second[second];
        } else if (auto refused = r.failure().as<rs::rate_limited_error>()) {
            // Refused: come back when Redis says the next token is due.
            auto later = clock.sleep_for(refused->retry_after(), {});
            co_await std::move(later);
        }
    }
    co_return 0;
}

// A replica: its own loop and connection, four callers, on the calling thread.
void replica(redis::connection_options where, std::chrono::steady_clock::time_point start,
             std::array<int, seconds>& per_second) {
    ::asio::io_context io;
    const redis::connection connection{io.get_executor(), std::move(where)};
    const redis::rate_limiter limiter{{.key = "quota:upstream",
                                       .token_limit = burst,
                                       .tokens_per_second = quota,
                                       .when_unavailable = redis::unavailable_policy::local_share,
                                       .local_share = 1.0 / replicas},
                                      connection};
    for (int i = 0; i < 4; ++i)
        rs::asio::async_run(io.get_executor(),
                            caller(limiter, start, start + std::chrono::seconds{seconds}, per_second),
                            [](std::exception_ptr e, int) {
                                if (e)
                                    std::rethrow_exception(e);
                            });
    io.run();
}

} // namespace

int main() {
    std::optional<private_server> server;
    redis::connection_options where;
    if (const char* url = std::getenv("REDIS_URL")) {
        where = redis::connection_options::from_url(url);
    } else {
        server.emplace();
        where.port = server->port();
    }
    fmt::print("{} replicas share a quota of {} calls/s (burst {}) through Redis at {}:{}\n\n", replicas,
               quota, burst, where.host, where.port);

    std::array<std::array<int, seconds>, replicas> counts{};
    const auto start = std::chrono::steady_clock::now();
    {
        std::vector<std::jthread> threads;
        for (auto& per_second : counts)
            threads.emplace_back([&per_second, where, start] { replica(where, start, per_second); });
    }

    fmt::print("second  replica-1  replica-2  replica-3   total  (quota {})\n", quota);
    bool kept = true;
    int all = 0;
    for (int s = 0; s < seconds; ++s) {
        int total = 0;
        fmt::print("{:>6}", s + 1);
        for (const auto& r : counts) {
            fmt::print("  {:>9}", r[static_cast<std::size_t>(s)]);
            total += r[static_cast<std::size_t>(s)];
        }
        all += total;
        // The first second may also spend the burst. Each admission is counted in the second its
        // reply reached its replica, a little after Redis counted it, so a replica held up by a busy
        // machine moves a few into the next second: a quarter of the quota of slack per second. The
        // total below has none of that.
        const double allowed = quota + (s == 0 ? static_cast<double>(burst) : 0.0) + quota / 4;
        fmt::print("  {:>6}{}\n", total, total > allowed ? "  over the quota!" : "");
        kept = kept && total <= allowed;
    }
    const double ceiling = static_cast<double>(burst) + quota * seconds + 5;
    fmt::print("\n{} calls in {} s: at most {} allowed (the burst, then the rate)\n", all, seconds, ceiling);
    return kept && all <= ceiling && all > 0 ? 0 : 1;
}
