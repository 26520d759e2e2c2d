// Token trees: builders' shapes, derived structure, engine outputs, malformed input.

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "specula/tree/builders.hpp"
#include "specula/tree/token_tree.hpp"

using namespace specula;
using idx = std::vector<index_t>;

TEST_CASE("builders produce the documented shapes", "[tree]") {
  const auto c = trees::chain(3);
  CHECK(idx(c.parents().begin(), c.parents().end()) == idx{-1, 0, 1, 2});
  const auto f = trees::full(2, 2);
  CHECK(idx(f.parents().begin(), f.parents().end()) == idx{-1, 0, 0, 1, 1, 2, 2});
  CHECK(trees::full(3, 2).size() == 13);
  CHECK(trees::full(3, 3).size() == 40);
  const auto s = trees::sjd_pac();
  CHECK(s.size() == 64);
  CHECK(s.max_width() == 3);
  // 13-node full tree, then the first branch (0 -> 1 -> 4) continues as a chain of 51 nodes.
  CHECK(s.max_depth() == 2 + 51);
  CHECK(s.parent(13) == 4);
  CHECK(s.parent(14) == 13);
  const auto small = trees::sjd_pac(2, 1, 5);
  CHECK(idx(small.parents().begin(), small.parents().end()) == idx{-1, 0, 0, 1, 3});
  const auto fp = trees::first_path_siblings(3, 2);
  CHECK(idx(fp.parents().begin(), fp.parents().end()) == idx{-1, 0, 0, 0, 1, 1, 1});
  CHECK(trees::first_path_siblings(4, 3).size() == 13);
  const auto mix = trees::ssd_mix_order(4);
  CHECK(mix.size() == 8);  // the paper: 5 -> 8 nodes for draft length 4
  CHECK(idx(mix.parents().begin(), mix.parents().end()) == idx{-1, 0, 1, 2, 3, 0, 1, 2});
  CHECK(trees::ssd_mix_order(1).size() == 2);
  CHECK_THROWS_AS(trees::sjd_pac(3, 2, 10), invalid_input);
  CHECK_THROWS_AS(trees::full(0, 2), invalid_input);
}

namespace {

// The derived structure of the parent list {-1, 0, 0, 0, 1, 1, 3, 4}: 1, 2, 3 under 0; 4, 5
// under 1; 6 under 3; 7 under 4.
void check_example_tree(const token_tree& t) {
  CHECK(t.size() == 8);
  CHECK(t.depth(7) == 3);
  CHECK(t.max_depth() == 3);
  CHECK(t.max_width() == 3);
  CHECK(t.children(0) == idx{1, 2, 3});
  CHECK(t.children(1) == idx{4, 5});
  CHECK(t.children(2).empty());
  CHECK(t.children(3) == idx{6});
  CHECK(t.children(7).empty());
  CHECK(t.num_children(3) == 1);
  CHECK(t.path_to(7) == idx{0, 1, 4, 7});
  CHECK(t.path_to(0) == idx{0});
  CHECK(t.dfs_order() == idx{0, 1, 4, 7, 5, 2, 3, 6});
  CHECK(t.bfs_order() == idx{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(t.position_ids(10) == idx{10, 11, 11, 11, 12, 12, 12, 13});
}

}  // namespace

TEST_CASE("derived structure, paths, orders, positions", "[tree]") {
  check_example_tree(token_tree(idx{-1, 0, 0, 0, 1, 1, 3, 4}));
}

TEST_CASE("assign rebuilds a tree in place with the constructor's structure and errors",
          "[tree][bad_input]") {
  // Starts from a larger, deeper tree, so that every derived array is overwritten.
  token_tree t = trees::sjd_pac(3, 2, 150);
  t.assign(idx{-1, 0, 0, 0, 1, 1, 3, 4}, std::vector<token_t>{9, 8, 7, 6, 5, 4, 3, 2});
  check_example_tree(t);
  CHECK(t.token(4) == 5);
  const auto m = t.attention_mask();
  CHECK(m[7] == 0b10010011u);
  // Tokens omitted: every token unset.
  t.assign(idx{-1, 0, 1});
  CHECK(t.token(2) == no_token);
  CHECK(t.children(1) == idx{2});
  // Malformed input: the constructor's error, and the tree left as the one-node tree.
  try {
    t.assign(idx{-1, 0, 0, 0}, {}, tree_limits{100, 100, 2});
    FAIL("accepted a malformed tree");
  } catch (const invalid_input& e) {
    CHECK(e.argument() == "parents");
    CHECK(e.row() == 0);
    CHECK(std::string(e.what()).find("too wide") != std::string::npos);
  }
  CHECK(t.size() == 1);
  CHECK(t.parent(0) == -1);
  CHECK(t.children(0).empty());
  CHECK(t.max_depth() == 0);
  CHECK_THROWS_WITH(t.assign(idx{-1, 0}, std::vector<token_t>{1}),
                    Catch::Contains("tokens") && Catch::Contains("one token per node"));
  CHECK(t.size() == 1);
  t.assign(idx{-1, 0, 0});
  CHECK(t.children(0) == idx{1, 2});
  // The tree's own arrays as input: re-checked under other limits, or cut to a prefix.
  t.assign(idx{-1, 0, 0, 0, 1, 1, 3, 4}, std::vector<token_t>{9, 8, 7, 6, 5, 4, 3, 2});
  t.assign(t.parents(), t.tokens(), tree_limits{8, 3, 3});
  check_example_tree(t);
  CHECK(t.token(7) == 2);
  CHECK_THROWS_WITH(t.assign(t.parents(), t.tokens(), tree_limits{8, 2, 3}),
                    Catch::Contains("too deep"));
  t.assign(idx{-1, 0, 0, 0, 1, 1, 3, 4}, std::vector<token_t>{9, 8, 7, 6, 5, 4, 3, 2});
  t.assign(t.parents().first(4), t.tokens().first(4));
  CHECK(t.size() == 4);
  CHECK(t.children(0) == idx{1, 2, 3});
  CHECK(t.children(1).empty());
  CHECK(t.token(3) == 6);
}

TEST_CASE("attention mask rows hold exactly each node's ancestors and itself", "[tree]") {
  const token_tree t(idx{-1, 0, 0, 0, 1, 1, 3, 4});
  const auto m = t.attention_mask();
  REQUIRE(t.mask_words() == 1);
  const std::uint64_t expected[] = {0b1,     0b11,     0b101,     0b1001,
                                    0b10011, 0b100011, 0b1001001, 0b10010011};
  for (index_t i = 0; i < 8; ++i) CHECK(m[static_cast<std::size_t>(i)] == expected[i]);
  // More than 64 nodes: rows span several words; check against parent walks.
  const auto big = trees::sjd_pac(3, 2, 150);
  const auto mb = big.attention_mask();
  REQUIRE(big.mask_words() == 3);
  for (index_t i = 0; i < big.size(); ++i)
    for (index_t j = 0; j < big.size(); ++j) {
      bool anc = false;
      for (index_t k = i; k >= 0; k = big.parent(k))
        if (k == j) anc = true;
      const bool bit = (mb[static_cast<std::size_t>(i * 3 + j / 64)] >> (j % 64)) & 1u;
      REQUIRE(bit == anc);
    }
  std::vector<std::uint64_t> small(3);
  CHECK_THROWS_WITH(t.attention_mask(small), Catch::Contains("out"));
}

TEST_CASE("malformed trees are rejected with the node and the reason", "[tree][bad_input]") {
  auto fails = [](idx parents, index_t node, const std::string& reason, tree_limits limits = {}) {
    try {
      token_tree t(std::move(parents), {}, limits);
      FAIL("accepted a malformed tree");
    } catch (const invalid_input& e) {
      INFO(e.what());
      CHECK(e.argument() == "parents");
      CHECK(e.row() == node);
      CHECK(std::string(e.what()).find(reason) != std::string::npos);
    }
  };
  fails({}, -1, "at least the root");
  fails({0, 0}, 0, "node 0 must be the root");
  fails({-1, 0, -1}, 2, "second root");
  fails({-1, 0, 7}, 2, "orphan");
  fails({-1, 0, -5}, 2, "orphan");
  fails({-1, 1}, 1, "cycle");
  fails({-1, 2, 1}, 1, "cycle");  // 1 -> 2 -> 1
  fails({-1, 2, 0}, 1, "parent after child");
  // Found by fuzzing: the cycle walk must not follow parent entries not yet range-checked.
  fails({-1, 3, -1, 10, 1, 2}, 1, "parent after child");
  fails({-1, 0, 1, 2, 3}, 4, "too deep", tree_limits{100, 3, 100});
  fails({-1, 0, 0, 0}, 0, "too wide", tree_limits{100, 100, 2});
  fails({-1, 0, 0}, -1, "too many nodes", tree_limits{2, 100, 100});
  CHECK_THROWS_WITH(token_tree(idx{-1, 0}, std::vector<token_t>{1}),
                    Catch::Contains("tokens") && Catch::Contains("one token per node"));
  token_tree ok(idx{-1, 0});
  CHECK_THROWS_WITH(ok.depth(2), Catch::Contains("node"));
  CHECK_THROWS_AS(ok.set_tokens(std::vector<token_t>{1, 2, 3}), invalid_input);
}
