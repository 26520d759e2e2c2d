#pragma once

/// @file
/// Builders of the tree shapes used by the papers and engines (tokens unset, -1; the proposal
/// fills them). Pictures of every shape: docs/trees.md.
///
/// Conventions: the root (node 0) is the last committed token; "depth" counts candidate levels
/// below the root; node counts include the root.

#include <algorithm>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/types.hpp"
#include "specula/tree/token_tree.hpp"

namespace specula::trees {

/// A chain of `length` drafts: length + 1 nodes. SSD's greedy verification chain for draft
/// length N is chain(N) (N + 1 nodes).
inline token_tree chain(index_t length) {
  require_parameter(length >= 0, "length", static_cast<double>(length), "must be >= 0");
  std::vector<index_t> parents(static_cast<std::size_t>(length + 1));
  for (index_t i = 0; i <= length; ++i) parents[static_cast<std::size_t>(i)] = i - 1;
  return token_tree(std::move(parents));
}

/// A chain over `tokens` (node i's parent is i - 1; node 0 is the root), with limits sized to
/// it so that chains longer than the default depth limit are accepted. Throws invalid_input
/// (argument "tokens") for an empty span.
inline token_tree chain(std::span<const token_t> tokens) {
  if (tokens.empty()) throw_if_failed({status::empty_input, -1, -1, 0.0}, "tokens");
  const auto n = static_cast<index_t>(tokens.size());
  std::vector<index_t> parents(tokens.size());
  for (index_t i = 0; i < n; ++i) parents[static_cast<std::size_t>(i)] = i - 1;
  tree_limits limits;
  limits.max_nodes = n;
  limits.max_depth = n;
  return token_tree(std::move(parents), std::vector<token_t>(tokens.begin(), tokens.end()), limits);
}

/// Full `width`-ary tree with `depth` candidate levels: 1 + width + ... + width^depth nodes, in
/// breadth-first order.
inline token_tree full(index_t width, index_t depth) {
  require_parameter(width >= 1, "width", static_cast<double>(width), "must be >= 1");
  require_parameter(depth >= 0, "depth", static_cast<double>(depth), "must be >= 0");
  std::vector<index_t> parents{-1};
  index_t level_begin = 0, level_end = 1;
  for (index_t d = 0; d < depth; ++d) {
    for (index_t u = level_begin; u < level_end; ++u)
      for (index_t k = 0; k < width; ++k) {
        parents.push_back(u);
        if (static_cast<index_t>(parents.size()) > tree_limits{}.max_nodes)
          throw_if_failed({status::invalid_parameter, -1, -1, static_cast<double>(width)}, "width",
                          "full tree exceeds the node limit");
      }
    level_begin = level_end;
    level_end = static_cast<index_t>(parents.size());
  }
  return token_tree(std::move(parents));
}

/// The SJD-PAC Proactive Drafting shape as its authors' code builds it: a full `width`-ary tree
/// with `depth` candidate levels whose first branch (first child of the root, its first child,
/// ...) continues as a chain until the tree has `budget` nodes. Defaults: width 3, depth 2
/// (13 nodes, which the authors' code calls D = 3, counting the root level), budget 64.
inline token_tree sjd_pac(index_t width = 3, index_t depth = 2, index_t budget = 64) {
  token_tree base = full(width, depth);
  require_parameter(
      budget >= base.size(), "budget", static_cast<double>(budget),
      ("must be at least the full tree's " + std::to_string(base.size()) + " nodes").c_str());
  std::vector<index_t> parents(base.parents().begin(), base.parents().end());
  index_t tip = 0;  // deepest node of the first branch
  while (base.first_child(tip) >= 0) tip = base.first_child(tip);
  while (static_cast<index_t>(parents.size()) < budget) {
    parents.push_back(tip);
    tip = static_cast<index_t>(parents.size()) - 1;
  }
  return token_tree(std::move(parents));
}

/// K siblings per level along the first path (SJD-PAC's paper text, the lighter variant):
/// the root has `siblings` children, the first of them has `siblings` children, and so on for
/// `depth` levels: 1 + siblings * depth nodes.
inline token_tree first_path_siblings(index_t siblings, index_t depth) {
  require_parameter(siblings >= 1, "siblings", static_cast<double>(siblings), "must be >= 1");
  require_parameter(depth >= 0, "depth", static_cast<double>(depth), "must be >= 0");
  std::vector<index_t> parents{-1};
  index_t parent = 0;
  for (index_t d = 0; d < depth; ++d) {
    const auto first = static_cast<index_t>(parents.size());
    for (index_t k = 0; k < siblings; ++k) parents.push_back(parent);
    parent = first;
  }
  return token_tree(std::move(parents));
}

/// SSD's mix-order verification tree for draft length N >= 1: the greedy chain (nodes 0..N)
/// plus, for every chain node with a grandchild (nodes 0..N-2), one extra leaf child that places
/// the grandchild's candidate directly (out-of-order acceptance). 2N nodes with the root — the
/// paper's 2N - 1 verification nodes besides the root (5 -> 8 nodes for N = 4 with the root).
/// Extra node N + 1 + k hangs under chain node k; it is verified after chain node k + 1.
inline token_tree ssd_mix_order(index_t n) {
  require_parameter(n >= 1, "n", static_cast<double>(n), "must be >= 1");
  std::vector<index_t> parents(static_cast<std::size_t>(n + 1));
  for (index_t i = 0; i <= n; ++i) parents[static_cast<std::size_t>(i)] = i - 1;
  for (index_t k = 0; k + 2 <= n; ++k) parents.push_back(k);
  return token_tree(std::move(parents));
}

/// From EAGLE / Medusa "tree choices", the form in which EAGLE's and LANTERN's code take a static
/// tree: each choice is a path of candidate ranks from the root, {r1, ..., rd} being the rd-th
/// candidate below the node {r1, ..., r(d-1)}. Every proper prefix of a choice must be a choice,
/// and the ranks below each node must be 0, 1, ..., c - 1 (tree drafts fill a node's children
/// with its first candidates, in order). Nodes are numbered as that code sorts the choices: by
/// depth, then lexicographically; node 0 is the root. Throws invalid_input naming
/// "choices[i]" for an empty, negative, repeated, orphaned or out-of-order path.
inline token_tree from_choices(std::span<const std::vector<index_t>> choices) {
  std::vector<std::size_t> order(choices.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (choices[a].size() != choices[b].size()) return choices[a].size() < choices[b].size();
    return choices[a] < choices[b];
  });
  std::map<std::vector<index_t>, index_t> node_of{{{}, 0}};
  std::vector<index_t> parents{-1}, children{0};
  for (const std::size_t i : order) {
    const auto& path = choices[i];
    const auto fail = [&](const char* why) {
      throw_if_failed({status::invalid_parameter, static_cast<index_t>(i), -1,
                       static_cast<double>(path.size())},
                      ("choices[" + std::to_string(i) + "]").c_str(), why);
    };
    if (path.empty()) fail("empty path (the root is implicit)");
    if (std::any_of(path.begin(), path.end(), [](index_t r) { return r < 0; }))
      fail("negative candidate rank");
    if (node_of.count(path) != 0) fail("repeated path");
    const auto parent = node_of.find(std::vector<index_t>(path.begin(), path.end() - 1));
    if (parent == node_of.end()) fail("its prefix is not a choice");
    if (path.back() != children[static_cast<std::size_t>(parent->second)])
      fail("ranks below a node must be 0, 1, ..., c - 1 (a gap)");
    ++children[static_cast<std::size_t>(parent->second)];
    node_of.emplace(path, static_cast<index_t>(parents.size()));
    parents.push_back(parent->second);
    children.push_back(0);
  }
  return token_tree(std::move(parents));
}

/// LANTERN's default static draft tree (`naive_extend_57` of jadohu/LANTERN's
/// models/drafters/choices.py, the `tree_choices` default of its generate()): 57 candidate nodes
/// over 5 levels (5, 13, 16, 14, 9 per level), 58 with the root.
inline token_tree lantern_static() {
  // clang-format off
  static const std::vector<std::vector<index_t>> choices = {
      {0}, {1}, {2}, {3}, {4},
      {0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 1}, {1, 2}, {2, 0}, {2, 1}, {2, 2}, {3, 0},
      {3, 1}, {4, 0},
      {0, 0, 0}, {0, 0, 1}, {0, 0, 2}, {0, 0, 3}, {0, 1, 0}, {0, 1, 1}, {0, 1, 2}, {0, 2, 0},
      {0, 2, 1}, {0, 2, 2}, {0, 3, 0}, {0, 3, 1}, {1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {2, 0, 0},
      {0, 0, 0, 0}, {0, 0, 0, 1}, {0, 0, 0, 2}, {0, 0, 0, 3}, {0, 0, 1, 0}, {0, 0, 1, 1},
      {0, 0, 1, 2}, {0, 0, 2, 0}, {0, 0, 2, 1}, {0, 0, 3, 0}, {0, 1, 0, 0}, {0, 1, 0, 1},
      {0, 1, 1, 0}, {0, 2, 0, 0},
      {0, 0, 0, 0, 0}, {0, 0, 0, 0, 1}, {0, 0, 0, 0, 2}, {0, 0, 0, 1, 0}, {0, 0, 0, 1, 1},
      {0, 0, 1, 0, 0}, {0, 0, 1, 0, 1}, {0, 0, 1, 1, 0}, {0, 0, 2, 0, 0}};
  // clang-format on
  return from_choices(choices);
}

/// From a parent list (validated; see token_tree).
inline token_tree from_parents(std::vector<index_t> parents, std::vector<token_t> tokens = {},
                               const tree_limits& limits = {}) {
  return token_tree(std::move(parents), std::move(tokens), limits);
}

}  // namespace specula::trees
