// SPDX-License-Identifier: MIT
// The library's own stop token (stop_token.hpp): what a user of std::stop_token relies on holds for
// rs::stop_source / stop_token / stop_callback (one request, callbacks once, on the requesting thread,
// at once when registered late, never when unregistered; a callback destroyed inside its own run; a
// destructor that waits for a run on another thread), checked against a reference model on seeded
// random scenarios, under threads (TSan leg), and without allocating once the frame cache is warm.
#include "alloc_counter.hpp"
#include "catch.hpp"

#include <resilience/stop_token.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

namespace test_stop_token {

namespace rs = resilience;

namespace {

struct counter {
    int* runs;
    void operator()() const noexcept { ++*runs; }
};

} // namespace

TEST_CASE("stop_token: one request stops every token and runs each callback once", "[stop_token]") {
    rs::stop_source source;
    rs::stop_token a = source.get_token();
    rs::stop_token b = a; // copies share the state
    int first = 0;
    int second = 0;
    rs::stop_callback c1(a, counter{&first});
    rs::stop_callback c2(b, counter{&second});
    CHECK(a.stop_possible());
    CHECK_FALSE(a.stop_requested());

    CHECK(source.request_stop());
    CHECK(a.stop_requested());
    CHECK(b.stop_requested());
    CHECK(source.stop_requested());
    CHECK(first == 1);
    CHECK(second == 1);

    CHECK_FALSE(source.request_stop()); // only the first request makes it
    CHECK(first == 1);
    CHECK(second == 1);
}

TEST_CASE("stop_token: a callback registered after the request runs at once, in its constructor",
          "[stop_token]") {
    rs::stop_source source;
    source.request_stop();
    int runs = 0;
    rs::stop_callback late(source.get_token(), counter{&runs});
    CHECK(runs == 1);
}

TEST_CASE("stop_token: an unregistered callback never runs", "[stop_token]") {
    rs::stop_source source;
    int runs = 0;
    { rs::stop_callback gone(source.get_token(), counter{&runs}); }
    source.request_stop();
    CHECK(runs == 0);
}

TEST_CASE("stop_token: what can stop, and what never will", "[stop_token]") {
    CHECK_FALSE(rs::stop_token{}.stop_possible());
    CHECK_FALSE(rs::stop_source{rs::nostopstate}.stop_possible());
    CHECK_FALSE(rs::stop_source{rs::nostopstate}.request_stop());
    CHECK_FALSE(rs::stop_source{rs::nostopstate}.get_token().stop_possible());

    rs::stop_token orphan;
    {
        rs::stop_source source;
        orphan = source.get_token();
        CHECK(orphan.stop_possible());
    }
    // Its last source is gone without a request: the token can never stop, and a callback on it is
    // not kept.
    CHECK_FALSE(orphan.stop_possible());
    CHECK_FALSE(orphan.stop_requested());
    int runs = 0;
    rs::stop_callback never(orphan, counter{&runs});
    CHECK(runs == 0);

    rs::stop_token stopped;
    {
        rs::stop_source source;
        stopped = source.get_token();
        source.request_stop();
    }
    // A stopped token stays stopped after its sources are gone.
    CHECK(stopped.stop_possible());
    CHECK(stopped.stop_requested());
}

TEST_CASE("stop_token: copies and moves of sources and tokens compare by their state", "[stop_token]") {
    rs::stop_source a;
    rs::stop_source b = a;
    rs::stop_source c;
    CHECK(a == b);
    CHECK_FALSE(a == c);
    CHECK(a.get_token() == b.get_token());
    CHECK_FALSE(a.get_token() == c.get_token());

    rs::stop_source moved = std::move(b);
    CHECK(moved == a);
    CHECK_FALSE(b.stop_possible()); // NOLINT(bugprone-use-after-move): a moved-from source has no state
    b.request_stop();               // and asking it is harmless
    CHECK_FALSE(a.stop_requested());

    swap(a, c);
    CHECK(moved == c);
    c.request_stop();
    CHECK(moved.stop_requested());
    CHECK_FALSE(a.stop_requested());
}

TEST_CASE("stop_token: a callback may destroy itself, and drop the last token, inside its own run",
          "[stop_token]") {
    // As a call that ends inside a stop callback does: the frame that holds the callback and the
    // call's own source goes away while the request is still running. The requester holds a copy.
    struct call_frame;
    struct end_call {
        std::unique_ptr<call_frame>* owner;
        void operator()() const noexcept { owner->reset(); }
    };
    struct call_frame {
        rs::stop_source source;
        std::optional<rs::stop_callback<end_call>> first;
        std::optional<rs::stop_callback<counter>> second;
    };
    int later = 0;
    rs::stop_source outer;
    std::unique_ptr<call_frame> frame = std::make_unique<call_frame>();
    rs::stop_callback after(outer.get_token(), counter{&later});
    frame->first.emplace(outer.get_token(), end_call{&frame});
    frame->second.emplace(outer.get_token(), counter{&later}); // listed first: runs first

    rs::stop_source held = outer; // the requester's copy
    CHECK(held.request_stop());
    CHECK(frame == nullptr);
    CHECK(later == 2); // the one in the frame, which ran before the frame went, and the one after
}

TEST_CASE("stop_token: destroying a callback that runs on another thread waits until its run is over",
          "[stop_token][threads]") {
    rs::stop_source source;
    std::atomic<bool> entered{false};
    std::atomic<bool> go{false};
    bool finished_work = false; // written by the callback, read after the destructor: no race if it waits
    struct slow {
        std::atomic<bool>* entered;
        std::atomic<bool>* go;
        bool* finished;
        void operator()() const noexcept {
            entered->store(true);
            while (!go->load())
                std::this_thread::yield();
            *finished = true;
        }
    };
    auto cb =
        std::make_unique<rs::stop_callback<slow>>(source.get_token(), slow{&entered, &go, &finished_work});
    std::thread requester([source]() mutable { source.request_stop(); });
    while (!entered.load())
        std::this_thread::yield();
    go.store(true);
    cb.reset(); // must not return before the run is over
    CHECK(finished_work);
    requester.join();
}

TEST_CASE("stop_token: callbacks added and removed on several threads while another requests",
          "[stop_token][threads]") {
    // Every callback runs at most once; one still registered when the request comes runs exactly once,
    // and a request never touches a callback already gone (TSan and ASan watch this one).
    for (int round = 0; round < 20; ++round) {
        rs::stop_source source;
        constexpr int threads = 3;
        constexpr int per_thread = 200;
        std::vector<std::atomic<int>> runs(threads * per_thread);
        std::atomic<bool> start{false};
        std::atomic<bool> requested{false}; // `request_stop` has returned: every callback it owes has run
        struct bump {
            std::atomic<int>* n;
            void operator()() const noexcept { n->fetch_add(1); }
        };
        std::vector<std::thread> workers;
        std::vector<int> kept(threads, -1);
        for (int t = 0; t < threads; ++t)
            workers.emplace_back([&, t] {
                while (!start.load())
                    std::this_thread::yield();
                std::optional<rs::stop_callback<bump>> keep;
                for (int i = 0; i < per_thread; ++i) {
                    const int id = t * per_thread + i;
                    if (i == per_thread / 2) { // this one stays registered until the request is done
                        keep.emplace(source.get_token(), bump{&runs[static_cast<std::size_t>(id)]});
                        kept[static_cast<std::size_t>(t)] = id;
                        continue;
                    }
                    rs::stop_callback<bump> cb(source.get_token(), bump{&runs[static_cast<std::size_t>(id)]});
                }
                // Not `stop_requested()`: that is true as soon as the request begins, and a callback
                // destroyed before the request reaches it is rightly never run.
                while (!requested.load())
                    std::this_thread::yield();
            });
        start.store(true);
        source.request_stop();
        requested.store(true);
        for (auto& w : workers)
            w.join();
        for (auto& r : runs)
            CHECK(r.load() <= 1);
        for (int id : kept)
            CHECK(runs[static_cast<std::size_t>(id)].load() == 1);
    }
}

TEST_CASE("stop_token: seeded random scenarios agree with a reference model", "[stop_token][model]") {
    // The model: a set of registered callbacks, a stop flag, and the number of live sources. Register:
    // runs at once if stopped, is dropped if no source is left, else listed. Unregister: unlisted.
    // Request: stops once (when a source is left) and runs every listed callback once.
    for (unsigned seed = 1; seed <= 200; ++seed) {
        std::mt19937 rng(seed);
        constexpr int slots = 8;
        std::vector<rs::stop_source> sources(1);
        rs::stop_token token = sources[0].get_token();
        std::vector<std::optional<rs::stop_callback<counter>>> callbacks(slots);
        std::vector<int> runs(slots, 0);
        // model
        std::vector<bool> listed(slots, false);
        std::vector<int> expected(slots, 0);
        bool stopped = false;
        for (int step = 0; step < 60; ++step) {
            const int op = std::uniform_int_distribution<int>(0, 5)(rng);
            const auto slot = static_cast<std::size_t>(std::uniform_int_distribution<int>(0, slots - 1)(rng));
            switch (op) {
            case 0:
            case 1: // register (replacing what the slot held)
                callbacks[slot].reset();
                listed[slot] = false;
                callbacks[slot].emplace(token, counter{&runs[slot]});
                if (stopped)
                    ++expected[slot];
                else if (!sources.empty())
                    listed[slot] = true;
                break;
            case 2: // unregister
                callbacks[slot].reset();
                listed[slot] = false;
                break;
            case 3: { // request, through a copy of some source
                if (sources.empty())
                    break;
                rs::stop_source held = sources[slot % sources.size()];
                const bool made = held.request_stop();
                CHECK(made == !stopped);
                if (!stopped)
                    for (std::size_t i = 0; i < slots; ++i)
                        if (listed[i]) {
                            ++expected[i];
                            listed[i] = false;
                        }
                stopped = true;
                break;
            }
            case 4: // another source
                if (!sources.empty())
                    sources.push_back(sources.front());
                break;
            case 5: // drop a source
                if (!sources.empty())
                    sources.pop_back();
                break;
            }
            INFO("seed " << seed << " step " << step);
            CHECK(runs == expected);
            CHECK(token.stop_requested() == stopped);
            CHECK(token.stop_possible() == (stopped || !sources.empty()));
        }
    }
}

#ifdef RESILIENCE_TESTS_COUNT_ALLOCATIONS
TEST_CASE("stop_token: a steady stream of sources reuses stop states instead of allocating",
          "[stop_token][alloc]") {
    for (int i = 0; i < 100; ++i) { // warm the frame cache
        rs::stop_source s;
        (void)s.get_token();
    }
    std::size_t allocations = 0;
    int runs = 0;
    {
        resilience_tests::counting_allocations counting;
        for (int i = 0; i < 10'000; ++i) {
            rs::stop_source s;
            rs::stop_callback cb(s.get_token(), counter{&runs});
            if (i % 2 == 0)
                s.request_stop();
        }
        allocations = counting.count();
    }
    CHECK(runs == 5'000);
    CHECK(allocations == 0);
}
#endif

} // namespace test_stop_token
