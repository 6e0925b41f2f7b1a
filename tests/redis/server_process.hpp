// SPDX-License-Identifier: MIT
// A private redis-server: started on a free loopback port in a temporary directory, with no
// persistence, and killed when it goes out of scope. Used by the Redis tests and the benchmark.
#pragma once

#include <resilience/redis.hpp>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <spawn.h>
#include <stdexcept>
#include <string>
#include <string_view>
#include <sys/types.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

extern char** environ;

namespace resilience_tests {

/// The redis-server binary on PATH, or empty.
inline std::string redis_server_binary() {
    const char* path = std::getenv("PATH");
    std::string dirs = path ? path : "/usr/bin:/bin";
    std::size_t start = 0;
    while (start <= dirs.size()) {
        const std::size_t end = std::min(dirs.find(':', start), dirs.size());
        const std::filesystem::path candidate =
            std::filesystem::path(dirs.substr(start, end - start)) / "redis-server";
        if (::access(candidate.c_str(), X_OK) == 0)
            return candidate.string();
        start = end + 1;
    }
    return {};
}

/// A free loopback port, as the kernel hands one out.
inline std::uint16_t free_port() {
    ::asio::io_context io;
    ::asio::ip::tcp::acceptor a{io, {::asio::ip::make_address("127.0.0.1"), 0}};
    return a.local_endpoint().port();
}

class redis_server {
public:
    redis_server() : port_(free_port()) {
        char tmpl[] = "/tmp/resilience-redis-XXXXXX";
        if (!::mkdtemp(tmpl))
            throw std::runtime_error("mkdtemp failed");
        dir_ = tmpl;
        start();
    }
    redis_server(const redis_server&) = delete;
    redis_server& operator=(const redis_server&) = delete;
    ~redis_server() {
        kill();
        std::error_code ignored;
        std::filesystem::remove_all(dir_, ignored);
    }

    std::uint16_t port() const noexcept { return port_; }
    resilience::redis::connection_options options() const {
        return {.port = port_,
                .command_timeout = std::chrono::milliseconds{200},
                // Fixed and without jitter: a test that expects `unavailable` right after a failure
                // must not find the backoff already over (a full-jitter draw may be close to zero).
                .reconnect =
                    resilience::constant_backoff{std::chrono::milliseconds{250}, resilience::jitter::none}};
    }

    /// Starts the server (again, on the same port) and returns once it answers PING.
    void start() {
        const std::string binary = redis_server_binary();
        if (binary.empty())
            throw std::runtime_error("redis-server not found on PATH");
        std::vector<std::string> args{
            binary,   "--port",    std::to_string(port_), "--bind",      "127.0.0.1",
            "--save", "",          "--appendonly",        "no",          "--dir",
            dir_,     "--logfile", dir_ + "/log",         "--daemonize", "no"};
        std::vector<char*> argv;
        for (auto& a : args)
            argv.push_back(a.data());
        argv.push_back(nullptr);
        pid_t pid = 0;
        if (::posix_spawn(&pid, binary.c_str(), nullptr, nullptr, argv.data(), environ) != 0)
            throw std::runtime_error("cannot start redis-server");
        pid_ = pid;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds{10};
        while (!answers()) {
            if (std::chrono::steady_clock::now() > deadline)
                throw std::runtime_error("redis-server did not answer within 10 s on port " +
                                         std::to_string(port_));
            std::this_thread::sleep_for(std::chrono::milliseconds{5}); // a poll, under the deadline above
        }
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    void kill() {
        if (!pid_)
            return;
        ::kill(*pid_, SIGKILL);
        int status = 0;
        ::waitpid(*pid_, &status, 0);
        pid_.reset();
    }
    /// Freezes and thaws it (SIGSTOP, SIGCONT): a server that takes connections but never answers.
    void freeze() { ::kill(*pid_, SIGSTOP); }
    void thaw() { ::kill(*pid_, SIGCONT); }

private:
    bool answers() const {
        try {
            ::asio::io_context io;
            ::asio::ip::tcp::socket s{io};
            s.connect({::asio::ip::make_address("127.0.0.1"), port_});
            ::asio::write(s, ::asio::buffer(std::string_view{"PING\r\n"}));
            char buf[7];
            ::asio::read(s, ::asio::buffer(buf));
            return std::string_view(buf, 7) == "+PONG\r\n";
        } catch (const std::exception&) {
            return false;
        }
    }

    std::uint16_t port_;
    std::string dir_;
    std::optional<pid_t> pid_;
};

} // namespace resilience_tests
