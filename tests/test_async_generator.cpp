// SPDX-License-Identifier: MIT
#include "alloc_counter.hpp"
#include "catch.hpp"
#include "stream_consumer.hpp"

#include <resilience/async_generator.hpp>
#include <resilience/event_loop.hpp>
#include <resilience/task.hpp>
#include <resilience/testing/simulation.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace test_async_generator {

namespace rs = resilience;
using namespace std::chrono_literals;
using resilience_tests::consume;
using std::chrono::nanoseconds;

static_assert(!std::is_copy_constructible_v<rs::async_generator<int>>);
static_assert(!std::is_copy_assignable_v<rs::async_generator<int>>);
static_assert(std::is_nothrow_move_constructible_v<rs::async_generator<int>>);
static_assert(std::is_nothrow_move_assignable_v<rs::async_generator<int>>);
static_assert(rs::awaitable<decltype(std::declval<rs::async_generator<int>&>().next())>);
static_assert(std::is_same_v<rs::await_result_t<decltype(std::declval<rs::async_generator<int>&>().next())>,
                             std::optional<int>>);

namespace {

std::string message_of(const std::exception_ptr& e) {
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& x) {
        return x.what();
    }
}

rs::async_generator<int> count_to(int n) {
    for (int i = 1; i <= n; ++i)
        co_yield i;
}

// Counts how many of these objects were made and how many destroyed.
struct lifetimes {
    int made = 0;
    int destroyed = 0;
};
class tracked {
public:
    explicit tracked(lifetimes& l) : l_(&l) { ++l_->made; }
    tracked(const tracked& o) : l_(o.l_) { ++l_->made; }
    tracked& operator=(const tracked&) = delete;
    ~tracked() { ++l_->destroyed; }

private:
    lifetimes* l_;
};

// Yields 1..n with a tracked local; `resumed` counts how far the body got.
rs::async_generator<int> tracked_numbers(lifetimes& l, int n, int& resumed) {
    tracked local{l};
    for (int i = 1; i <= n; ++i) {
        ++resumed;
        co_yield i;
    }
}

// Consumes an inner generator and passes its items on, doubled.
rs::async_generator<int> doubled(rs::async_generator<int> inner) {
    while (std::optional<int> v = co_await inner.next())
        co_yield 2 * *v;
}

// Counts copies and moves of the items.
struct counted {
    int* copies;
    int* moves;
    int value;
    counted(int* c, int* m, int v) : copies(c), moves(m), value(v) {}
    counted(const counted& o) : copies(o.copies), moves(o.moves), value(o.value) { ++*copies; }
    counted(counted&& o) noexcept : copies(o.copies), moves(o.moves), value(o.value) { ++*moves; }
    counted& operator=(const counted&) = delete;
    counted& operator=(counted&&) = delete;
};

} // namespace

TEST_CASE("async_generator: items arrive in order, then an empty optional, which stays empty",
          "[async_generator]") {
    rs::testing::simulation sim;
    auto gen = count_to(3);
    auto r = sim.run(consume(sim, gen));
    CHECK(r.items == std::vector<int>{1, 2, 3});
    CHECK_FALSE(r.error);
    CHECK_FALSE(sim.run(consume(sim, gen)).error);
    CHECK(sim.run(consume(sim, gen)).items.empty());
    CHECK(gen.valid());
}

TEST_CASE("async_generator: the body starts at the first next(), not when it is made", "[async_generator]") {
    rs::testing::simulation sim;
    lifetimes l;
    int resumed = 0;
    auto gen = tracked_numbers(l, 3, resumed);
    CHECK(l.made == 0);
    CHECK(resumed == 0);
    auto r = sim.run(consume(sim, gen, 1));
    CHECK(r.items == std::vector<int>{1});
    CHECK(l.made == 1);
    CHECK(resumed == 1); // stopped at its first co_yield, not beyond
}

TEST_CASE("async_generator: a body that yields nothing gives an empty optional at once",
          "[async_generator]") {
    rs::testing::simulation sim;
    auto gen = count_to(0);
    auto r = sim.run(consume(sim, gen));
    CHECK(r.items.empty());
    CHECK_FALSE(r.error);
    CHECK(sim.now() == 0ns);
}

TEST_CASE("async_generator: the body may co_await between items, each item arrives at its instant",
          "[async_generator]") {
    rs::testing::simulation sim;
    auto gen = [](rs::testing::simulation& s) -> rs::async_generator<int> {
        co_await s.sleep_for(10ms);
        co_yield 1;
        co_await s.sleep_for(20ms);
        co_yield 2;
        co_await s.sleep_for(5ms); // after the last item: the end comes at 35ms
    }(sim);
    auto r = sim.run(consume(sim, gen));
    CHECK(r.items == std::vector<int>{1, 2});
    CHECK(r.at == std::vector<nanoseconds>{10ms, 30ms});
    CHECK(sim.now() == 35ms);
}

TEST_CASE("async_generator: an exception in the body is rethrown by next(), after the items before it",
          "[async_generator]") {
    rs::testing::simulation sim;
    auto failing = [](int items) -> rs::async_generator<int> {
        for (int i = 1; i <= items; ++i)
            co_yield i;
        throw std::runtime_error("source broke after " + std::to_string(items));
    };

    SECTION("after two items") {
        auto gen = failing(2);
        auto r = sim.run(consume(sim, gen));
        CHECK(r.items == std::vector<int>{1, 2});
        REQUIRE(r.error);
        CHECK(message_of(r.error) == "source broke after 2");
        // Rethrown once: the generator has then ended.
        auto after = sim.run(consume(sim, gen));
        CHECK(after.items.empty());
        CHECK_FALSE(after.error);
    }
    SECTION("before the first item") {
        auto gen = failing(0);
        auto r = sim.run(consume(sim, gen));
        CHECK(r.items.empty());
        REQUIRE(r.error);
        CHECK(message_of(r.error) == "source broke after 0");
    }
}

TEST_CASE("async_generator: a consumer that stops half-way destroys the body and its locals",
          "[async_generator]") {
    rs::testing::simulation sim;
    lifetimes l;
    int resumed = 0;
    {
        auto gen = tracked_numbers(l, 5, resumed);
        auto r = sim.run(consume(sim, gen, 2));
        CHECK(r.items == std::vector<int>{1, 2});
        CHECK(l.destroyed == 0); // suspended at its second co_yield, the local alive
    }
    CHECK(l.made == 1);
    CHECK(l.destroyed == 1);
    CHECK(resumed == 2);
}

TEST_CASE("async_generator: a generator never started destroys its parameters", "[async_generator]") {
    lifetimes l;
    {
        auto gen = [](tracked) -> rs::async_generator<int> { co_yield 1; }(tracked{l});
        CHECK(l.made - l.destroyed == 1); // the copy in the frame
    }
    CHECK(l.made == l.destroyed);
}

TEST_CASE("async_generator: destroying a generator that consumes another destroys the inner one",
          "[async_generator]") {
    rs::testing::simulation sim;
    lifetimes l;
    int resumed = 0;
    {
        auto outer = doubled(tracked_numbers(l, 10, resumed));
        auto r = sim.run(consume(sim, outer, 3));
        CHECK(r.items == std::vector<int>{2, 4, 6});
        CHECK(l.destroyed == 0);
    }
    CHECK(l.made == 1);
    CHECK(l.destroyed == 1);
    CHECK(resumed == 3);
}

TEST_CASE("async_generator: moving hands over the frame, a moved-from generator is empty",
          "[async_generator]") {
    rs::testing::simulation sim;
    lifetimes l;
    int resumed = 0;
    auto a = tracked_numbers(l, 3, resumed);
    (void)sim.run(consume(sim, a, 1));
    auto b = std::move(a);
    CHECK_FALSE(a.valid());
    CHECK(b.valid());
    CHECK(sim.run(consume(sim, b)).items == std::vector<int>{2, 3});

    auto r = sim.run(consume(sim, a));
    REQUIRE(r.error);
    CHECK_THROWS_AS(std::rethrow_exception(r.error), std::logic_error);

    // Assigning over a generator destroys the frame it held.
    int resumed_c = 0;
    auto c = tracked_numbers(l, 3, resumed_c);
    (void)sim.run(consume(sim, c, 1));
    CHECK(l.made - l.destroyed == 1);
    c = count_to(2);
    CHECK(l.made == l.destroyed);
    CHECK(sim.run(consume(sim, c)).items == std::vector<int>{1, 2});
}

TEST_CASE("async_generator: rvalues are moved, lvalues copied once, other types converted",
          "[async_generator]") {
    rs::testing::simulation sim;
    SECTION("an rvalue reaches the consumer by moves only") {
        int copies = 0, moves = 0;
        auto gen = [](int* c, int* m) -> rs::async_generator<counted> {
            co_yield counted{c, m, 7};
        }(&copies, &moves);
        auto r = sim.run(consume(sim, gen));
        REQUIRE(r.items.size() == 1);
        CHECK(r.items[0].value == 7);
        CHECK(copies == 0);
    }
    SECTION("an lvalue is copied once, and stays the body's") {
        int copies = 0, moves = 0;
        auto gen = [](int* c, int* m) -> rs::async_generator<counted> {
            counted kept{c, m, 8};
            co_yield kept;
            CHECK(kept.value == 8);
        }(&copies, &moves);
        auto r = sim.run(consume(sim, gen));
        REQUIRE(r.items.size() == 1);
        CHECK(r.items[0].value == 8);
        CHECK(copies == 1);
    }
    SECTION("move-only items") {
        auto gen = []() -> rs::async_generator<std::unique_ptr<int>> {
            co_yield std::make_unique<int>(1);
            auto p = std::make_unique<int>(2);
            co_yield std::move(p);
        }();
        auto r = sim.run(consume(sim, gen));
        REQUIRE(r.items.size() == 2);
        CHECK(*r.items[0] == 1);
        CHECK(*r.items[1] == 2);
    }
    SECTION("a value of another type is converted in the frame") {
        auto words = []() -> rs::async_generator<std::string> {
            co_yield "a string long enough not to fit in the small buffer";
            co_yield std::string(40, 'x');
        }();
        auto r = sim.run(consume(sim, words));
        CHECK(r.items == std::vector<std::string>{"a string long enough not to fit in the small buffer",
                                                  std::string(40, 'x')});
        auto longs = []() -> rs::async_generator<long> { co_yield 5; }();
        CHECK(sim.run(consume(sim, longs)).items == std::vector<long>{5L});
    }
}

TEST_CASE("async_generator: a million items that complete at once do not grow the stack",
          "[async_generator]") {
    rs::event_loop loop;
    long long sum = 0;
    loop.run([](long long& total) -> rs::task<void> {
        auto gen = count_to(1'000'000);
        while (std::optional<int> v = co_await gen.next())
            total += *v;
    }(sum));
    CHECK(sum == 1'000'000LL * 1'000'001LL / 2);
}

#ifdef RESILIENCE_TESTS_COUNT_ALLOCATIONS
TEST_CASE("async_generator: items cost no allocation, and a stream of generators reuses frames",
          "[async_generator][alloc]") {
    rs::event_loop loop;
    std::size_t per_item = 0, per_generator = 0;
    loop.run([](std::size_t& items_alloc, std::size_t& gens_alloc) -> rs::task<void> {
        {
            auto gen = count_to(10'000);
            (void)co_await gen.next(); // the frame exists
            resilience_tests::counting_allocations counting;
            int n = 1;
            while (co_await gen.next())
                ++n;
            items_alloc = counting.count();
            CHECK(n == 10'000);
        }
        for (int i = 0; i < 10; ++i) { // warm the frame cache
            auto gen = count_to(1);
            (void)co_await gen.next();
        }
        resilience_tests::counting_allocations counting;
        for (int i = 0; i < 1'000; ++i) {
            auto gen = count_to(2);
            while (co_await gen.next()) {
            }
        }
        gens_alloc = counting.count();
    }(per_item, per_generator));
    CHECK(per_item == 0);
    CHECK(per_generator == 0);
}
#endif

} // namespace test_async_generator
