// SPDX-License-Identifier: MIT
#include "alloc_counter.hpp"
#include "catch.hpp"
#include "counting_new.hpp" // this executable's counting operator new

#include <resilience/detail/frame_allocator.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/task.hpp>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

namespace test_task {

namespace rs = resilience;

// A loop of awaits that complete at once runs in constant stack in every build. A recursive chain of
// tasks (each awaiting the next before it finishes) does too where symmetric transfer is a tail call
// (clang); elsewhere (g++, whose transfer is a tail call only when optimised and unsanitized) each task
// started during its awaiter's start holds a native frame until it finishes, as a recursive function
// would (detail/inline_start.hpp), so the chain is only as deep as any stack holds.
constexpr int loop_length = 1'000'000;
#if RESILIENCE_TAIL_CALL_TRANSFER
constexpr int chain_depth = 200'000;
#else
constexpr int chain_depth = 1'000;
#endif

namespace {
rs::task<int> value(int v) {
    co_return v;
}
rs::task<int> add(int a, int b) {
    co_return co_await value(a) + co_await value(b);
}
rs::task<void> throws() {
    throw std::runtime_error("from the task");
    co_return;
}
rs::task<std::unique_ptr<int>> move_only(int v) {
    co_return std::make_unique<int>(v);
}
rs::task<int> countdown(int n) {
    if (n == 0)
        co_return 0;
    co_return 1 + co_await countdown(n - 1);
}

// Counts its live instances.
struct tracked {
    static inline int live = 0;
    tracked() { ++live; }
    tracked(const tracked&) { ++live; }
    tracked& operator=(const tracked&) = default;
    ~tracked() { --live; }
};
struct throws_when_destroyed {
    ~throws_when_destroyed() noexcept(false) {
        throw std::runtime_error("from a destructor after co_return");
    }
};
rs::task<tracked> returns_then_throws() {
    throws_when_destroyed local;
    co_return tracked{};
}
rs::task<const std::string> const_result() {
    co_return std::string("kept const");
}
} // namespace

TEST_CASE("task: nothing runs until the task is awaited", "[task]") {
    bool ran = false;
    auto body = [&]() -> rs::task<int> {
        ran = true;
        co_return 1;
    };
    auto t = body();
    CHECK_FALSE(ran);
    CHECK(rs::sync_wait(std::move(t)) == 1);
    CHECK(ran);
}

TEST_CASE("task: destroying an unawaited task destroys its frame without running it", "[task]") {
    auto guard = std::make_shared<int>(0);
    bool ran = false;
    {
        auto body = [](std::shared_ptr<int>, bool& flag) -> rs::task<void> {
            flag = true;
            co_return;
        };
        auto t = body(guard, ran);
        CHECK(guard.use_count() == 2);
    }
    CHECK(guard.use_count() == 1);
    CHECK_FALSE(ran);
}

TEST_CASE("task: values, move-only results and exceptions reach the awaiter", "[task]") {
    CHECK(rs::sync_wait(add(2, 3)) == 5);
    CHECK(*rs::sync_wait(move_only(7)) == 7);
    CHECK_THROWS_WITH(rs::sync_wait(throws()), "from the task");
}

TEST_CASE("task: a const result, and an exception thrown after co_return (by a local's destructor) replaces "
          "the value, which is destroyed",
          "[task]") {
    CHECK(rs::sync_wait(const_result()) == "kept const");
    REQUIRE(tracked::live == 0);
    CHECK_THROWS_WITH(rs::sync_wait(returns_then_throws()), "from a destructor after co_return");
    CHECK(tracked::live == 0);
}

TEST_CASE(
    "task: a recursive chain of tasks that finish at once (200,000 deep where transfers are tail calls)",
    "[task]") {
    CHECK(rs::sync_wait(countdown(chain_depth)) == chain_depth);
}

TEST_CASE("task: a loop of awaits that complete at once runs in constant stack", "[task]") {
    auto two = []() -> rs::task<int> { co_return co_await value(1) + co_await value(1); };
    auto sum = rs::sync_wait([](auto make) -> rs::task<long> {
        long s = 0;
        for (int i = 0; i < loop_length / 2; ++i)
            s += co_await make();
        co_return s;
    }(two));
    CHECK(sum == loop_length);
}

TEST_CASE("task: a moved-from task is empty and awaiting it is a clear error", "[task]") {
    auto t = value(1);
    auto u = std::move(t);
    CHECK_FALSE(t.valid()); // NOLINT(bugprone-use-after-move): the moved-from state is specified
    CHECK(u.valid());
    CHECK_THROWS_AS(rs::sync_wait(std::move(t)), std::logic_error);
}

#ifdef RESILIENCE_TESTS_COUNT_ALLOCATIONS
TEST_CASE("task: a steady stream of calls reuses coroutine frames instead of allocating", "[task][alloc]") {
    rs::event_loop loop;
    std::size_t allocations = 0;
    loop.run([&]() -> rs::task<void> {
        for (int i = 0; i < 100; ++i)
            (void)co_await add(i, i); // warm the frame cache
        resilience_tests::counting_allocations counting;
        int sum = 0;
        for (int i = 0; i < 10'000; ++i)
            sum += co_await add(i, 1);
        allocations = counting.count();
        CHECK(sum == 10'000 * 10'001 / 2);
    }());
    CHECK(allocations == 0);
}
#endif

namespace {
// Makes a frame-sized block in its destructor, which runs on an exiting thread after the frame
// cache's own clean-up (it was constructed before the cache kept its first frame).
void* made_while_exiting = nullptr;
struct allocates_at_exit {
    ~allocates_at_exit() { made_while_exiting = resilience::detail::frame_cache::allocate(100); }
};
} // namespace

TEST_CASE(
    "frame cache: a frame made while its thread exits can serve any frame of its class on another thread",
    "[task]") {
    using resilience::detail::frame_cache;
    std::thread exiting([] {
        thread_local allocates_at_exit late;
        (void)&late;
        frame_cache::deallocate(frame_cache::allocate(64), 64); // the cache registers its clean-up now
    });
    exiting.join();
    REQUIRE(made_while_exiting != nullptr);
    // Freed here, the 100-byte frame joins this thread's list of frames of its class (up to `whole`
    // bytes)...
    frame_cache::deallocate(made_while_exiting, 100);
    constexpr std::size_t whole =
        (100 + frame_cache::granule - 1) / frame_cache::granule * frame_cache::granule;
    static_assert(whole > 100, "the class must hold frames larger than the one freed");
    // ...and the next frame of the class's largest size may be that block: it must hold `whole` bytes
    // (ASan checks the write).
    void* next = frame_cache::allocate(whole);
    std::memset(next, 0xab, whole);
    CHECK(static_cast<unsigned char*>(next)[whole - 1] == 0xab);
    frame_cache::deallocate(next, whole);
}

} // namespace test_task
