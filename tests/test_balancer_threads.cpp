// SPDX-License-Identifier: MIT
// One balancer shared by four event loops on four threads while its set, its options and its
// endpoints' ejections change: for ThreadSanitizer (the threads set) and AddressSanitizer (a removed
// endpoint freed while a call still runs on it).
#include "support.hpp"

#include <resilience/balancer.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/pipeline.hpp>
#include <resilience/retry.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace test_balancer_threads {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_tests::run_on_threads;
using resilience_tests::stress_rounds;

rs::task<void> client(const rs::pipeline<rs::retry<>, rs::balancer<std::string>>& p,
                      const rs::balancer<std::string>& lb, int calls, std::atomic<int>& done,
                      std::atomic<int>& strangers) {
    for (int i = 0; i < calls; ++i) {
        auto r = co_await p.execute_outcome(lb.bind([i, &strangers](const std::string& h) -> rs::task<int> {
            if (h.size() != 2 || h[0] != 'h') // every endpoint ever in the set is h0..h9
                strangers.fetch_add(1);
            if (h == "h1" || (h == "h2" && i % 2 == 0)) // h1 always fails, h2 every other call
                throw std::runtime_error("down");
            co_return 1;
        }));
        (void)r;
        done.fetch_add(1);
    }
}

TEST_CASE("a balancer shared by four loops while its set and options change", "[threads]") {
    rs::balancer_options o;
    o.outlier_ejection->consecutive_failures = 2;
    o.outlier_ejection->interval = 1ms;
    o.outlier_ejection->base_ejection_time = 1ms;
    o.outlier_ejection->max_ejection_percent = 50;
    o.outlier_ejection->success_rate_request_volume = 5;
    o.outlier_ejection->success_rate_minimum_hosts = 2;
    o.slow_start_window = 2ms;
    rs::balancer<std::string> lb{{"h0", "h1", "h2", "h3"}, o};
    rs::pipeline p{rs::retry<>{{.max_attempts = 3, .backoff = rs::constant_backoff{0ms}}}, lb};
    const int calls = static_cast<int>(stress_rounds(4000));
    std::atomic<int> done{0}, strangers{0};
    rs::event_loop loops[4];
    for (rs::event_loop& l : loops)
        l.spawn(client(p, lb, calls, done, strangers));
    std::thread changer([&] {
        int round = 0;
        while (done.load() < 4 * calls) {
            switch (round++ % 4) {
            case 0:
                lb.set_endpoints({"h0", "h1", "h2", "h3", "h4", "h5"});
                break;
            case 1:
                lb.remove("h0");
                break;
            case 2: {
                rs::balancer_options next = o;
                next.pick = round % 8 < 4 ? rs::balance_pick::round_robin : rs::balance_pick::least_loaded;
                lb.reconfigure(next);
                break;
            }
            case 3:
                lb.add("h9");
                (void)lb.ejected();
                break;
            }
            std::this_thread::yield();
        }
    });
    run_on_threads(loops[0], loops[1], loops[2], loops[3]);
    changer.join();
    CHECK(done.load() == 4 * calls);
    CHECK(strangers.load() == 0);
    for (const std::string& h : lb.endpoints())
        CHECK(lb.in_flight(h) == 0);
}

TEST_CASE("endpoints added and removed from two threads at once are all kept or all gone", "[threads]") {
    rs::balancer<std::string> lb{{"base"}};
    std::atomic<int> removed{0}; // counted here, checked on the test's thread (Catch2 is not thread-safe)
    const auto adder = [&](char tag) {
        for (int i = 0; i < 50; ++i)
            lb.add(std::string(1, tag) + std::to_string(i));
        for (int i = 0; i < 50; i += 2)
            removed += lb.remove(std::string(1, tag) + std::to_string(i)) ? 1 : 0;
    };
    std::thread a(adder, 'a'), b(adder, 'b');
    a.join();
    b.join();
    CHECK(removed.load() == 50);
    const std::vector<std::string> all = lb.endpoints();
    CHECK(all.size() == 51);
    for (char tag : {'a', 'b'})
        for (int i = 1; i < 50; i += 2)
            CHECK(std::count(all.begin(), all.end(), std::string(1, tag) + std::to_string(i)) == 1);
}

} // namespace test_balancer_threads
