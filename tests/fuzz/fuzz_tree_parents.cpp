// libFuzzer target: token-tree construction from parent lists, and every walk over the result.
//
// The input bytes are a parent list (int8 entries, so malformed lists with orphans, cycles,
// second roots and forward references are common) plus limits and tokens. Construction must
// either throw specula::invalid_input or produce a tree on which paths, traversal orders,
// attention masks, and greedy and stochastic verification all stay in range and terminate.

#include <cstdint>
#include <cstring>
#include <vector>

#include "specula/tree/token_tree.hpp"
#include "specula/verify/greedy.hpp"
#include "specula/verify/tree.hpp"

namespace {
void require(bool ok) {
  if (!ok) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace specula;
  if (size < 3) return 0;
  tree_limits limits;
  limits.max_depth = 1 + data[0] % 40;
  limits.max_children = 1 + data[1] % 8;
  const index_t vocab = 2 + data[2] % 6;
  std::vector<index_t> parents;
  std::vector<token_t> tokens;
  for (std::size_t i = 3; i + 1 < size && parents.size() < 200; i += 2) {
    parents.push_back(static_cast<std::int8_t>(data[i]));
    tokens.push_back(static_cast<token_t>(data[i + 1] % vocab));
  }
  token_tree tree;
  try {
    tree = token_tree(parents, tokens, limits);
  } catch (const invalid_input&) {
    return 0;
  }
  const index_t n = tree.size();
  require(n == static_cast<index_t>(parents.size()));
  require(tree.max_depth() <= limits.max_depth);
  require(tree.max_width() <= limits.max_children);
  for (index_t i = 1; i < n; ++i) require(tree.depth(i) == tree.depth(tree.parent(i)) + 1);
  const auto dfs = tree.dfs_order();
  const auto bfs = tree.bfs_order();
  require(static_cast<index_t>(dfs.size()) == n && static_cast<index_t>(bfs.size()) == n);
  std::vector<int> seen(static_cast<std::size_t>(n), 0);
  for (index_t u : dfs) ++seen[static_cast<std::size_t>(u)];
  for (int s : seen) require(s == 1);
  const auto mask = tree.attention_mask();
  const index_t words = tree.mask_words();
  for (index_t i = 0; i < n; ++i) {
    const auto path = tree.path_to(i);
    require(path.front() == 0 && path.back() == i);
    index_t bits = 0;
    for (index_t w = 0; w < words; ++w)
      bits += __builtin_popcountll(mask[static_cast<std::size_t>(i * words + w)]);
    require(bits == static_cast<index_t>(path.size()));
  }
  // Verification over the fuzzed tree (root token unset is allowed; children have tokens).
  std::vector<float> rows(static_cast<std::size_t>(n * vocab), 1.0f / static_cast<float>(vocab));
  const std::vector<request_rng> rng = {{size, 0, 0}};
  std::vector<token_t> out(static_cast<std::size_t>(n));
  std::vector<std::int32_t> acc(1);
  std::vector<index_t> path(static_cast<std::size_t>(n));
  const tree_batch_input<float> in{vocab, {&tree, 1}, {rows.data(), n, vocab}, {}, rng};
  verify_tree_greedy(host::seq, in, tree_batch_output{out, acc, path, {}});
  require(acc[0] >= 0 && acc[0] <= tree.max_depth());
  tree_options opt;
  opt.sampling = sibling_sampling::with_replacement;
  verify_tree(host::seq, in, tree_batch_output{out, acc, path, {}}, opt);
  require(acc[0] >= 0 && acc[0] <= tree.max_depth());
  require(out[static_cast<std::size_t>(acc[0])] >= 0 &&
          out[static_cast<std::size_t>(acc[0])] < vocab);
  for (index_t i = 1; i <= acc[0]; ++i)
    require(tree.parent(path[static_cast<std::size_t>(i)]) ==
            path[static_cast<std::size_t>(i - 1)]);
  return 0;
}
