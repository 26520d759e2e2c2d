// The host side of the device forward pass, exercised without a GPU: the slot-layout cache
// bookkeeping (slot_cache.hpp) over its host stand-in storage — commit of accepted paths,
// rollback and a dual cache's refresh move exactly the rows an independent list of committed
// rows says — and the device tests' sampled-SD G-test run on the host model, which shows that
// the law it tests against is right and that its negative control has power.

#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include <specula_example/sessions.hpp>
#include <specula_example/slot_cache.hpp>

#include "toy_sd_gtest.hpp"

using namespace specula;
using namespace specula::example;

namespace {

/// A cache whose slot rows hold one float: a tag naming the row's node.
slot_cache<host_slot_storage> tagged_cache() {
  slot_cache<host_slot_storage> c;
  c.storage().row_size = 1;
  return c;
}

}  // namespace

TEST_CASE("slot_cache commits accepted paths and rolls back like a list of committed rows",
          "[backend]") {
  std::mt19937_64 g(3);
  auto c = tagged_cache();
  std::vector<float> expected;  // the committed rows' tags, independent of the slot layout
  float next_tag = 0.0f;
  for (int step = 0; step < 300; ++step) {
    // A random tree of n pending nodes (parents precede children); node i's row gets a fresh tag.
    const auto n = static_cast<index_t>(1 + g() % 20);
    std::vector<index_t> parents{-1}, depth{0};
    for (index_t i = 1; i < n; ++i) {
      parents.push_back(static_cast<index_t>(g() % static_cast<std::uint64_t>(i)));
      depth.push_back(depth[static_cast<std::size_t>(parents.back())] + 1);
    }
    const index_t words = (n + 63) / 64;
    std::vector<std::uint64_t> mask(static_cast<std::size_t>(n * words), 0);
    std::vector<index_t> positions;
    for (index_t i = 0; i < n; ++i) {
      positions.push_back(c.size() + depth[static_cast<std::size_t>(i)]);
      for (index_t a = i; a >= 0; a = parents[static_cast<std::size_t>(a)])
        mask[static_cast<std::size_t>(i * words + a / 64)] |= std::uint64_t{1} << (a % 64);
    }
    const index_t first = c.begin_pending(positions, mask);
    REQUIRE(first == c.size());
    std::vector<float> tags;
    for (index_t i = 0; i < n; ++i) {
      tags.push_back(next_tag++);
      c.storage().slot(first + i)[0] = tags.back();
    }
    // Commit the path to a random node (sometimes only the root, sometimes nothing).
    std::vector<index_t> path;
    if (g() % 10 != 0)
      for (auto u = static_cast<index_t>(g() % static_cast<std::uint64_t>(n)); u >= 0;
           u = parents[static_cast<std::size_t>(u)])
        path.insert(path.begin(), u);
    c.commit(path);
    for (const index_t u : path) expected.push_back(tags[static_cast<std::size_t>(u)]);
    if (g() % 9 == 0) {
      const auto keep = static_cast<index_t>(g() % static_cast<std::uint64_t>(c.size() + 1));
      c.rollback(keep);
      expected.resize(static_cast<std::size_t>(keep));
    }
    REQUIRE(c.size() == static_cast<index_t>(expected.size()));
    REQUIRE(c.pending() == 0);
    for (index_t s = 0; s < c.size(); ++s)
      REQUIRE(c.storage().slot(s)[0] == expected[static_cast<std::size_t>(s)]);
  }
}

TEST_CASE("slot_cache keeps a refresh's rows outside the window", "[backend]") {
  for (const auto& [b, e] : {std::pair<index_t, index_t>{0, 4}, {3, 7}, {6, 10}, {2, 2}}) {
    auto c = tagged_cache();
    const index_t n = 10;
    std::vector<index_t> positions(n);
    std::vector<std::uint64_t> mask(n, (std::uint64_t{1} << n) - 1);
    for (index_t i = 0; i < n; ++i) positions[static_cast<std::size_t>(i)] = i;
    c.begin_pending(positions, mask);
    for (index_t i = 0; i < n; ++i) c.storage().slot(i)[0] = static_cast<float>(100 + i);
    c.keep_pending_outside(b, e);
    REQUIRE(c.size() == n - (e - b));
    index_t s = 0;
    for (index_t i = 0; i < n; ++i)
      if (i < b || i >= e) CHECK(c.storage().slot(s++)[0] == static_cast<float>(100 + i));
  }
}

TEST_CASE("slot_cache rejects bad paths, rollbacks and windows", "[backend][bad_input]") {
  auto c = tagged_cache();
  const std::vector<index_t> positions{0, 1, 1};
  const std::vector<std::uint64_t> mask{0b001, 0b011, 0b101};  // node 0 with two children
  c.begin_pending(positions, mask);
  CHECK_THROWS_WITH(c.commit(std::vector<index_t>{0, 3}), Catch::Contains("path"));
  CHECK_THROWS_WITH(c.commit(std::vector<index_t>{1}), Catch::Contains("next context position"));
  CHECK_THROWS_WITH(c.commit(std::vector<index_t>{0, 1, 2}), Catch::Contains("path"));
  c.commit(std::vector<index_t>{0, 2});
  CHECK(c.size() == 2);
  CHECK_THROWS_WITH(c.rollback(3), Catch::Contains("n"));
  CHECK_THROWS_WITH(c.keep_pending_outside(0, 1), Catch::Contains("window"));
  host_slot_storage s;
  s.reserve(4, 0);
  CHECK_THROWS_WITH(s.gather(2, std::vector<index_t>{1}), Catch::Contains("from"));
}

TEST_CASE("the device tests' sampled-SD G-test passes on the host model and has power",
          "[backend][stats]") {
  const auto c = example::testing::toy_gtest_config();
  const auto tw = example::testing::random_weights(c, 71),
             dw = example::testing::random_weights(c, 72);
  const transformer target_model(tw), draft_model(dw);
  transformer_session t(target_model), d(draft_model);
  example::testing::check_toy_sd_gtest(t, d, example::testing::toy_sequence_law(tw));
}
