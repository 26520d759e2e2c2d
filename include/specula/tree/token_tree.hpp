#pragma once

/// @file
/// Token trees: a flat, validated representation of a draft tree, and the per-node outputs an
/// engine needs to evaluate it (attention masks, position ids, paths, traversal orders).
///
/// A tree of n nodes is given by parent indices: node 0 is the root (parent -1; it stands for
/// the last committed token, its token is not verified) and every other node's parent precedes
/// it (parents[i] < i). Children of a node are ordered by index; that order is the order in
/// which siblings are verified. Construction validates the parent list — exactly one root, no
/// orphans, parents before children (which rules out cycles), bounded depth and width — and
/// derives depth, first child and next sibling, so every walk over a token_tree is bounded and
/// stays in range. Malformed input throws specula::invalid_input naming the node.

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "specula/core/config.hpp"
#include "specula/core/error.hpp"
#include "specula/core/types.hpp"

namespace specula {

/// Bounds enforced when a tree is constructed.
struct tree_limits {
  index_t max_nodes = 1 << 16;  ///< nodes including the root
  index_t max_depth = 4096;     ///< depth of the deepest node (root has depth 0)
  index_t max_children = 4096;  ///< children of any one node
};

/// Read-only view of a validated tree's arrays; trivially copyable (usable in kernels).
struct tree_view {
  const index_t* parent = nullptr;
  const index_t* depth = nullptr;
  const index_t* first_child = nullptr;
  const index_t* next_sibling = nullptr;
  const token_t* token = nullptr;
  index_t size = 0;
  index_t max_depth = 0;
  index_t max_children = 0;
};

/// A validated token tree (see file comment).
class token_tree {
 public:
  token_tree() : token_tree(std::vector<index_t>{-1}) {}

  /// Builds a tree from parent indices (and optional tokens, -1 = not yet set). Throws
  /// invalid_input (argument "parents" or "tokens") for a malformed tree.
  explicit token_tree(std::vector<index_t> parents, std::vector<token_t> tokens = {},
                      const tree_limits& limits = {})
      : parent_(std::move(parents)), token_(std::move(tokens)) {
    validate_and_derive(limits);
  }

  /// Rebuilds the tree in place from `parents` and `tokens` (empty: every token unset), with
  /// the constructor's checks and errors, reusing this tree's buffers: a loop that builds one
  /// tree per step allocates only when a tree outgrows every earlier one. When it throws, the
  /// tree is left as the one-node tree token_tree() builds.
  /// The spans may be this tree's own arrays (`t.assign(t.parents(), t.tokens(), limits)`).
  void assign(std::span<const index_t> parents, std::span<const token_t> tokens = {},
              const tree_limits& limits = {}) {
    take(parent_, parents);
    take(token_, tokens);
    try {
      validate_and_derive(limits);
    } catch (...) {
      parent_.assign(1, -1);
      token_.assign(1, no_token);
      validate_and_derive(tree_limits{});
      throw;
    }
  }

  [[nodiscard]] index_t size() const noexcept { return static_cast<index_t>(parent_.size()); }
  [[nodiscard]] index_t parent(index_t i) const { return parent_[at(i)]; }
  [[nodiscard]] index_t depth(index_t i) const { return depth_[at(i)]; }
  [[nodiscard]] index_t first_child(index_t i) const { return first_child_[at(i)]; }
  [[nodiscard]] index_t next_sibling(index_t i) const { return next_sibling_[at(i)]; }
  [[nodiscard]] index_t num_children(index_t i) const { return num_children_[at(i)]; }
  [[nodiscard]] token_t token(index_t i) const { return token_[at(i)]; }
  /// Depth of the deepest node (the longest draft path).
  [[nodiscard]] index_t max_depth() const noexcept { return max_depth_; }
  /// Largest number of children of any node.
  [[nodiscard]] index_t max_width() const noexcept { return max_width_; }

  [[nodiscard]] std::span<const index_t> parents() const noexcept { return parent_; }
  [[nodiscard]] std::span<const index_t> depths() const noexcept { return depth_; }
  [[nodiscard]] std::span<const token_t> tokens() const noexcept { return token_; }

  /// Sets the token of node i (>= 0, or -1 for "unset"); token ranges are checked by the
  /// verifiers against their vocabulary.
  void set_token(index_t i, token_t t) { token_[at(i)] = t; }
  void set_tokens(std::span<const token_t> tokens) {
    if (static_cast<index_t>(tokens.size()) != size())
      throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(tokens.size())},
                      "tokens", ("expected " + std::to_string(size())).c_str());
    token_.assign(tokens.begin(), tokens.end());
  }

  [[nodiscard]] tree_view view() const noexcept {
    return {parent_.data(), depth_.data(), first_child_.data(), next_sibling_.data(),
            token_.data(),  size(),        max_depth_,          max_width_};
  }

  /// Children of node i in verification order.
  [[nodiscard]] std::vector<index_t> children(index_t i) const {
    std::vector<index_t> c;
    for (index_t k = first_child(i); k >= 0; k = next_sibling_[static_cast<std::size_t>(k)])
      c.push_back(k);
    return c;
  }

  /// Node indices from the root to node i (inclusive), root first.
  [[nodiscard]] std::vector<index_t> path_to(index_t i) const {
    std::vector<index_t> p(static_cast<std::size_t>(depth(i) + 1));
    for (index_t k = i, d = depth(i); k >= 0; k = parent_[static_cast<std::size_t>(k)], --d)
      p[static_cast<std::size_t>(d)] = k;
    return p;
  }

  /// Position ids: offset + depth of each node (the root at `offset`, usually the number of
  /// committed tokens minus one).
  [[nodiscard]] std::vector<index_t> position_ids(index_t offset = 0) const {
    std::vector<index_t> pos(depth_);
    for (auto& p : pos) p += offset;
    return pos;
  }

  /// Depth-first pre-order, children in verification order.
  [[nodiscard]] std::vector<index_t> dfs_order() const {
    std::vector<index_t> order, stack{0};
    order.reserve(parent_.size());
    while (!stack.empty()) {
      const index_t u = stack.back();
      stack.pop_back();
      order.push_back(u);
      // Push children in reverse so the first child is visited first.
      const auto c = children(u);
      for (auto it = c.rbegin(); it != c.rend(); ++it) stack.push_back(*it);
    }
    return order;
  }

  /// Breadth-first order (by depth, then by verification order within a parent).
  [[nodiscard]] std::vector<index_t> bfs_order() const {
    std::vector<index_t> order{0};
    order.reserve(parent_.size());
    for (std::size_t h = 0; h < order.size(); ++h)
      for (index_t k = first_child(order[h]); k >= 0;
           k = next_sibling_[static_cast<std::size_t>(k)])
        order.push_back(k);
    return order;
  }

  /// 64-bit words per bit-packed attention-mask row: ceil(size / 64).
  [[nodiscard]] index_t mask_words() const noexcept { return (size() + 63) / 64; }

  /// Bit-packed tree attention mask: row i (mask_words() words, little-endian bit order) has bit
  /// j set iff node j is node i or one of its ancestors. `out` needs size() * mask_words()
  /// words; it is overwritten.
  void attention_mask(std::span<std::uint64_t> out) const {
    const index_t words = mask_words();
    if (static_cast<index_t>(out.size()) < size() * words)
      throw_if_failed(
          {status::length_mismatch, -1, -1, static_cast<double>(out.size())}, "out",
          ("needs size() * mask_words() = " + std::to_string(size() * words) + " words").c_str());
    for (index_t i = 0; i < size(); ++i) {
      std::uint64_t* row = out.data() + i * words;
      const index_t p = parent_[static_cast<std::size_t>(i)];
      if (p >= 0) {
        const std::uint64_t* prow = out.data() + p * words;  // parents precede children
        for (index_t w = 0; w < words; ++w) row[w] = prow[w];
      } else {
        for (index_t w = 0; w < words; ++w) row[w] = 0;
      }
      row[i / 64] |= std::uint64_t{1} << (i % 64);
    }
  }

  /// The attention mask as a vector (size() * mask_words() words).
  [[nodiscard]] std::vector<std::uint64_t> attention_mask() const {
    std::vector<std::uint64_t> m(static_cast<std::size_t>(size() * mask_words()));
    attention_mask(m);
    return m;
  }

 private:
  [[nodiscard]] std::size_t at(index_t i) const {
    if (i < 0 || i >= size())
      throw_if_failed({status::invalid_parameter, i, -1, static_cast<double>(i)}, "node",
                      ("tree has " + std::to_string(size()) + " nodes").c_str());
    return static_cast<std::size_t>(i);
  }

  // v = s, also when s lies in v's own storage (then through a copy).
  template <class T>
  static void take(std::vector<T>& v, std::span<const T> s) {
    const std::less<const T*> before;
    if (!s.empty() && !before(s.data(), v.data()) && before(s.data(), v.data() + v.size())) {
      std::vector<T> copy(s.begin(), s.end());
      v.swap(copy);
    } else {
      v.assign(s.begin(), s.end());
    }
  }

  [[noreturn]] static void fail(status code, index_t node, double value, const std::string& why) {
    throw_if_failed({code, node, -1, value}, "parents", why.c_str());
    std::abort();  // unreachable: throw_if_failed throws for a failed diagnostic
  }

  void validate_and_derive(const tree_limits& limits) {
    const index_t n = size();
    if (n == 0) fail(status::empty_input, -1, 0.0, "a tree needs at least the root node");
    if (n > limits.max_nodes)
      fail(status::invalid_parameter, -1, static_cast<double>(n),
           "too many nodes (limit " + std::to_string(limits.max_nodes) + ")");
    if (token_.empty()) token_.assign(static_cast<std::size_t>(n), no_token);
    if (static_cast<index_t>(token_.size()) != n)
      throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(token_.size())},
                      "tokens", ("expected one token per node: " + std::to_string(n)).c_str());
    if (parent_[0] != -1)
      fail(status::invalid_parameter, 0, static_cast<double>(parent_[0]),
           "node 0 must be the root (parent -1)");
    for (index_t i = 1; i < n; ++i) {
      const index_t p = parent_[static_cast<std::size_t>(i)];
      if (p == -1)
        fail(status::invalid_parameter, i, -1.0,
             "a second root (parent -1): a tree has exactly one root, node 0");
      if (p < -1 || p >= n)
        fail(status::invalid_parameter, i, static_cast<double>(p),
             "orphan: parent index outside [0, " + std::to_string(n) + ")");
      if (p == i)
        fail(status::invalid_parameter, i, static_cast<double>(p), "cycle: node is its own parent");
      if (p > i) {
        // Distinguish a cycle from a mere ordering problem, with a walk bounded by n steps that
        // stops at parent entries not validated yet (out of range).
        index_t k = p;
        for (index_t steps = 0; steps < n && k > 0 && k < n && k != i; ++steps)
          k = parent_[static_cast<std::size_t>(k)] < 0 ? 0 : parent_[static_cast<std::size_t>(k)];
        if (k == i)
          fail(status::invalid_parameter, i, static_cast<double>(p),
               "cycle: following parents from this node returns to it");
        fail(status::invalid_parameter, i, static_cast<double>(p),
             "parent after child: parents must precede their children (parents[i] < i)");
      }
    }
    depth_.assign(static_cast<std::size_t>(n), 0);
    first_child_.assign(static_cast<std::size_t>(n), -1);
    next_sibling_.assign(static_cast<std::size_t>(n), -1);
    num_children_.assign(static_cast<std::size_t>(n), 0);
    max_depth_ = 0;
    max_width_ = 0;
    for (index_t i = 1; i < n; ++i) {
      const auto p = static_cast<std::size_t>(parent_[static_cast<std::size_t>(i)]);
      const auto si = static_cast<std::size_t>(i);
      depth_[si] = depth_[p] + 1;
      if (depth_[si] > limits.max_depth)
        fail(status::invalid_parameter, i, static_cast<double>(depth_[si]),
             "too deep: depth exceeds " + std::to_string(limits.max_depth));
      if (++num_children_[p] > limits.max_children)
        fail(status::invalid_parameter, static_cast<index_t>(p),
             static_cast<double>(num_children_[p]),
             "too wide: node has more than " + std::to_string(limits.max_children) + " children");
      max_depth_ = depth_[si] > max_depth_ ? depth_[si] : max_depth_;
      max_width_ = num_children_[p] > max_width_ ? num_children_[p] : max_width_;
    }
    // Children lists in index order, linked from the last node back (no scratch array).
    for (index_t i = n - 1; i >= 1; --i) {
      const auto p = static_cast<std::size_t>(parent_[static_cast<std::size_t>(i)]);
      next_sibling_[static_cast<std::size_t>(i)] = first_child_[p];
      first_child_[p] = i;
    }
  }

  std::vector<index_t> parent_;
  std::vector<token_t> token_;
  std::vector<index_t> depth_;
  std::vector<index_t> first_child_;
  std::vector<index_t> next_sibling_;
  std::vector<index_t> num_children_;
  index_t max_depth_ = 0;
  index_t max_width_ = 0;
};

}  // namespace specula
