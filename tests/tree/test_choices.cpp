// trees::from_choices (EAGLE / Medusa tree choices) and trees::lantern_static: every node's rank
// path, read back from the built tree, is the choice it came from; LANTERN's naive_extend_57 per
// level; bad choices refused naming the index.

#include <catch2/catch.hpp>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/tree/builders.hpp"

using namespace specula;

namespace {

/// The rank path of node u: at each level, the number of earlier siblings (children listed in
/// node order), walking up the parents.
std::vector<index_t> rank_path(const token_tree& t, index_t u) {
  std::vector<index_t> path;
  for (; u > 0; u = t.parent(u)) {
    index_t rank = 0;
    for (index_t v = 1; v < u; ++v) rank += t.parent(v) == t.parent(u) ? 1 : 0;
    path.insert(path.begin(), rank);
  }
  return path;
}

}  // namespace

TEST_CASE("from_choices: every node's rank path is its choice, in depth-then-path order",
          "[tree]") {
  // Given out of order: the builder sorts by depth, then lexicographically.
  const std::vector<std::vector<index_t>> choices = {{0, 1}, {1}, {0}, {0, 0, 0}, {0, 0}, {1, 0}};
  const auto t = trees::from_choices(choices);
  REQUIRE(t.size() == 7);
  const std::vector<std::vector<index_t>> want = {{}, {0}, {1}, {0, 0}, {0, 1}, {1, 0}, {0, 0, 0}};
  for (index_t u = 0; u < t.size(); ++u) CHECK(rank_path(t, u) == want[static_cast<size_t>(u)]);
}

TEST_CASE("lantern_static is LANTERN's naive_extend_57", "[tree]") {
  const auto t = trees::lantern_static();
  REQUIRE(t.size() == 58);
  std::vector<int> per_level(6, 0);
  for (index_t u = 1; u < t.size(); ++u) ++per_level[static_cast<std::size_t>(t.depth(u))];
  CHECK(per_level == std::vector<int>{0, 5, 13, 16, 14, 9});
  // Spot checks against the published list: the root has 5 children; [0, 0] has 4; the
  // deepest level hangs below [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0], [0, 0, 1, 1], [0, 0, 2, 0].
  CHECK(t.num_children(0) == 5);
  bool found_last = false;
  for (index_t u = 1; u < t.size(); ++u) {
    const auto p = rank_path(t, u);
    if (p == std::vector<index_t>{0, 0}) CHECK(t.num_children(u) == 4);
    if (p == std::vector<index_t>{0, 0, 2, 0, 0}) found_last = u == t.size() - 1;
  }
  CHECK(found_last);
}

TEST_CASE("from_choices refuses malformed choices, naming the index", "[tree][bad_input]") {
  using C = std::vector<std::vector<index_t>>;
  const auto refused = [](const C& c, const char* arg) {
    CHECK_THROWS_WITH(trees::from_choices(c), Catch::Contains(arg));
  };
  refused(C{{0}, {}}, "choices[1]");            // empty path
  refused(C{{0}, {-1}}, "choices[1]");          // negative rank
  refused(C{{0}, {0}}, "choices[1]");           // repeated
  refused(C{{0}, {1, 0}}, "choices[1]");        // prefix {1} missing
  refused(C{{0}, {2}}, "choices[1]");           // gap: rank 1 missing
  refused(C{{0}, {0, 1}}, "choices[1]");        // gap below {0}
  CHECK(trees::from_choices(C{}).size() == 1);  // only the root
}
