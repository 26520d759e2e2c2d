// Host execution policies: every index exactly once, exceptions propagate deterministically,
// the persistent pool and caller-provided executors.

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "specula/backend/host.hpp"

using namespace specula;

namespace {

/// An engine-style executor: runs the tasks of a bulk call on threads it starts for the call,
/// one task per thread, the calling thread taking task 0; counts bulk calls and tasks.
struct counting_executor {
  std::atomic<int> bulk_calls{0};
  std::atomic<int> tasks{0};
  std::mutex mutex;
  std::set<std::thread::id> threads_seen;

  void bulk(index_t n, host::bulk_task task) {
    ++bulk_calls;
    auto run = [&](index_t i) {
      ++tasks;
      {
        const std::lock_guard<std::mutex> lock(mutex);
        threads_seen.insert(std::this_thread::get_id());
      }
      task(i);
    };
    std::vector<std::thread> started;
    for (index_t i = 1; i < n; ++i) started.emplace_back(run, i);
    run(0);
    for (auto& t : started) t.join();
  }
};

/// Runs every task on the calling thread, in order, and says how many threads it has.
struct inline_executor {
  int tasks = 0;
  void bulk(index_t n, host::bulk_task task) {
    for (index_t i = 0; i < n; ++i, ++tasks) task(i);
  }
  [[nodiscard]] index_t concurrency() const { return 3; }
};

struct not_an_executor {
  void run(index_t, host::bulk_task) {}
};

static_assert(host::executor<counting_executor>);
static_assert(host::executor<host::thread_pool>);
static_assert(!host::executor<not_an_executor>);
static_assert(!host::executor<int>);
static_assert(host::policy<host::executor_policy<counting_executor>>);
static_assert(host::policy<decltype(host::on(std::declval<host::thread_pool&>()))>);
static_assert(!host::policy<int>);
static_assert(host::is_concurrent_policy<host::parallel_policy>);
static_assert(host::is_concurrent_policy<host::executor_policy<inline_executor>>);
static_assert(!host::is_concurrent_policy<host::sequential_policy>);

template <class Policy>
void check_every_index_once(const Policy& pol, index_t n) {
  std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
  host::for_each_index(pol, n, [&](index_t i) { hits[static_cast<std::size_t>(i)]++; });
  for (const auto& h : hits) REQUIRE(h.load() == 1);
}

template <class Policy>
std::string first_error(const Policy& pol, index_t n, std::vector<index_t> failing) {
  try {
    host::for_each_index(pol, n, [&](index_t i) {
      for (const index_t f : failing)
        if (i == f) throw std::runtime_error("index " + std::to_string(i));
    });
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "no exception";
}

}  // namespace

TEST_CASE("for_each_index visits every index exactly once", "[core][backend]") {
  host::thread_pool pool(3);
  counting_executor counting;
  inline_executor serial;
  for (index_t n : {0, 1, 2, 7, 100, 1001}) {
    for (unsigned threads : {0u, 1u, 2u, 3u, 8u}) {
      check_every_index_once(host::par.with_threads(threads), n);
      check_every_index_once(host::par.with_threads(threads).with_serial_below_ns(0), n);
    }
    check_every_index_once(host::seq, n);
    check_every_index_once(host::on(pool), n);
    check_every_index_once(host::on(serial), n);
    if (n <= 100) check_every_index_once(host::on(counting), n);
  }
}

TEST_CASE("the lowest failing index's exception is rethrown", "[core][backend]") {
  host::thread_pool pool(4);
  counting_executor counting;
  inline_executor serial;
  for (const index_t n : {64, 2000}) {
    const std::vector<index_t> failing{10, 60, n - 1};
    CHECK(first_error(host::seq, n, failing) == "index 10");
    for (unsigned threads : {1u, 2u, 4u}) {
      CHECK(first_error(host::par.with_threads(threads), n, failing) == "index 10");
      CHECK(first_error(host::par.with_threads(threads).with_serial_below_ns(0), n, failing) ==
            "index 10");
    }
    // An exception in the first block, which the caller runs alone before deciding to split.
    CHECK(first_error(host::par, n, {0, 5}) == "index 0");
    CHECK(first_error(host::on(pool), n, failing) == "index 10");
    CHECK(first_error(host::on(serial), n, failing) == "index 10");
    CHECK(first_error(host::on(counting), n, {n - 1, 33}) == "index 33");
    CHECK(first_error(host::on(pool), n, {}) == "no exception");
  }
}

TEST_CASE("min_requests_per_thread limits the split", "[core][backend]") {
  host::parallel_policy p;
  p.threads = 8;
  p.min_requests_per_thread = 100;
  std::atomic<int> count{0};
  host::for_each_index(p, 150, [&](index_t) { count++; });
  CHECK(count.load() == 150);
}

TEST_CASE("a caller's executor runs the loop", "[core][backend]") {
  counting_executor ex;
  std::atomic<int> count{0};
  host::for_each_index(host::on(ex), 6, [&](index_t) { count++; });
  CHECK(count.load() == 6);
  CHECK(ex.bulk_calls.load() == 1);
  CHECK(ex.tasks.load() == 6);  // one task per request without a concurrency() hint
  CHECK(ex.threads_seen.size() == 6);

  // min_requests_per_task groups requests; one task's worth runs on the caller, unsubmitted.
  host::for_each_index(host::on(ex).with_min_requests_per_task(4), 10, [&](index_t) { count++; });
  CHECK(ex.bulk_calls.load() == 2);
  CHECK(ex.tasks.load() == 6 + 3);
  host::for_each_index(host::on(ex), 1, [&](index_t) { count++; });
  host::for_each_index(host::on(ex).with_min_requests_per_task(4), 4, [&](index_t) { count++; });
  CHECK(ex.bulk_calls.load() == 2);
  CHECK(count.load() == 6 + 10 + 1 + 4);

  // concurrency() caps the tasks of a call.
  inline_executor serial;
  host::for_each_index(host::on(serial), 100, [](index_t) {});
  CHECK(serial.tasks == 3);
}

TEST_CASE("an executor policy without an executor is rejected", "[core][backend][bad_input]") {
  const host::executor_policy<counting_executor> none{};
  CHECK_THROWS_WITH(host::for_each_index(none, 4, [](index_t) {}),
                    Catch::Contains("policy.ex") && Catch::Contains("host::on"));
}

TEST_CASE("the thread pool runs every task once, on the caller when limited to one thread",
          "[core][backend]") {
  host::thread_pool pool(4);
  CHECK(pool.concurrency() == 4);
  std::vector<std::atomic<int>> hits(50);
  auto count = [&](index_t i) noexcept { hits[static_cast<std::size_t>(i)]++; };
  pool.bulk(50, host::bulk_task(count));
  for (const auto& h : hits) CHECK(h.load() == 1);

  const auto caller = std::this_thread::get_id();
  std::atomic<int> elsewhere{0};
  auto where = [&](index_t) noexcept {
    if (std::this_thread::get_id() != caller) elsewhere++;
  };
  pool.bulk(50, host::bulk_task(where), 1);
  CHECK(elsewhere.load() == 0);
  // par limited to one thread, given one request, or told that no call is worth splitting,
  // stays on the caller too.
  host::for_each_index(host::par.with_threads(1), 50, [&](index_t i) { where(i); });
  host::for_each_index(host::par, 1, [&](index_t i) { where(i); });
  const auto never_split = host::par.with_serial_below_ns(std::numeric_limits<std::int64_t>::max());
  host::for_each_index(never_split, 500, [&](index_t i) { where(i); });
  CHECK(elsewhere.load() == 0);

  host::thread_pool single(1);
  CHECK(single.concurrency() == 1);
  single.bulk(50, host::bulk_task(where));
  CHECK(elsewhere.load() == 0);
}

TEST_CASE("nested and concurrent calls from several threads complete", "[core][backend]") {
  host::thread_pool pool(3);
  for (int round = 0; round < 20; ++round) {
    std::atomic<long> total{0};
    const auto split = host::par.with_serial_below_ns(0);  // always use the pool
    auto outer = [&](auto policy) {
      host::for_each_index(policy, 24, [&](index_t) {
        host::for_each_index(split, 8, [&](index_t) { total++; });
        host::for_each_index(host::on(pool), 5, [&](index_t) { total++; });
      });
    };
    std::vector<std::thread> callers;
    for (int t = 0; t < 4; ++t)
      callers.emplace_back([&, t] {
        if (t % 2 == 0)
          outer(split);
        else
          outer(host::on(pool));
      });
    for (auto& c : callers) c.join();
    CHECK(total.load() == 4L * 24 * (8 + 5));
  }
}
