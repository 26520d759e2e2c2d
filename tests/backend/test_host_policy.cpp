// Host execution policies: every index exactly once, exceptions propagate deterministically.

#include <atomic>
#include <catch2/catch.hpp>
#include <stdexcept>
#include <vector>

#include "specula/backend/host.hpp"

using namespace specula;

TEST_CASE("for_each_index visits every index exactly once", "[core][backend]") {
  for (index_t n : {0, 1, 2, 7, 100, 1001}) {
    for (unsigned threads : {0u, 1u, 2u, 3u, 8u}) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      host::for_each_index(host::par.with_threads(threads), n,
                           [&](index_t i) { hits[static_cast<std::size_t>(i)]++; });
      for (const auto& h : hits) REQUIRE(h.load() == 1);
    }
    std::vector<int> seq_hits(static_cast<std::size_t>(n), 0);
    host::for_each_index(host::seq, n, [&](index_t i) { seq_hits[static_cast<std::size_t>(i)]++; });
    for (int h : seq_hits) REQUIRE(h == 1);
  }
}

TEST_CASE("the lowest failing chunk's exception is rethrown", "[core][backend]") {
  for (unsigned threads : {1u, 2u, 4u}) {
    try {
      host::for_each_index(host::par.with_threads(threads), 64, [](index_t i) {
        if (i == 10) throw std::runtime_error("first");
        if (i == 60) throw std::runtime_error("second");
      });
      FAIL("expected an exception");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "first");
    }
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
