#pragma once

/// @file
/// Token-tree verification (stochastic, lossless with the exact rule).
///
/// Every node u has a target row p_u = p(. | path to u) and, optionally, a proposal row q_u:
/// the distribution u's children were drawn from. Starting at the root, the children of the
/// current node are verified as candidates in their stored order (verify_candidates; without
/// replacement by default): the accepted child is emitted and becomes the current node; if no
/// child is accepted the residual sample is emitted and verification stops; at a leaf a bonus
/// token is sampled from the leaf's target row. At most one child per node is accepted, so the
/// walk follows a single path (picking the best of independently verified paths would bias the
/// output). Without proposal rows the children are treated as deterministic candidates (one-hot
/// proposals), which is lossless for any way of choosing them.
///
/// Rules: any rule the chain verifier takes — scalar (exact, ω-relaxed), row-aware (LANTERN /
/// LANTERN++, typical acceptance), scheduled by depth (`rule_at(rule, depth)`: Cool-SD's
/// schedules, scheduled_lantern_rule), or per_request of one. A row-aware rule is bound at
/// every candidate step to that step's residual target (verify/candidates.hpp); the tree then
/// needs two rows of workspace per thread, which tree_workspace sizes from the rule type. The
/// CUDA tree kernels take scalar rules only (batch_tree_rule).
///
/// Draws: verification at a node of depth d uses position d (candidate j at slot 2j, the
/// residual or bonus sample at slot 1), so a chain-shaped tree draws exactly like
/// verify_chain and gives the same output.
///
/// Example (compiled and run by the test suite):
/// @snippet tree/test_tree_example.cpp tree_example

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "specula/backend/host.hpp"
#include "specula/core/error.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/validate.hpp"
#include "specula/rules/exact.hpp"
#include "specula/sample/random_source.hpp"
#include "specula/sample/row_passes.hpp"
#include "specula/tree/token_tree.hpp"
#include "specula/verify/candidates.hpp"
#include "specula/verify/chain.hpp"

namespace specula {

/// How siblings with proposal rows were drawn from their parent's q row.
enum class sibling_sampling {
  without_replacement,  ///< distinct siblings drawn sequentially from q (SJD-PAC, EAGLE-style)
  with_replacement,     ///< i.i.d. siblings (SpecInfer)
};

/// Options of tree verification.
struct tree_options {
  double sum_tolerance = default_sum_tolerance;
  double residual_floor = default_residual_floor;
  sibling_sampling sampling = sibling_sampling::without_replacement;
  /// What checked entry points validate (see check_level): by default the rows and the entries
  /// p(x), q(x) the verifier reads, checked as they are read; check_level::full checks every row
  /// and every drafted token's p(x), q(x) first.
  check_level check = check_level::reads;
};

/// Result of verifying one request's tree.
struct tree_request_result {
  std::int32_t num_accepted = 0;  ///< accepted draft nodes (accepted path length, root excluded)
  token_t emitted = no_token;     ///< residual sample or bonus token
  std::uint32_t flags = 0;        ///< chain_flags
};

/// Workspace for verifying one tree whose nodes have at most `max_children` children.
struct tree_request_workspace {
  double* z = nullptr;  ///< candidates_workspace_size<R>(max_children, V) doubles (R: the rule)
  token_t* candidates = nullptr;  ///< max_children tokens
  index_t* children = nullptr;    ///< max_children node indices
};

/// Verifies one request's tree (see file comment).
/// - `target_row(u)`: row_view of p_u for every node u;
/// - `proposal_for(u)`: the candidate proposal of u's children (without_replacement<T>{q_u},
///   with_replacement<T>{q_u}, or one_hot_candidates{} for deterministic children);
/// - `out_tokens`: tree.size slots: the accepted path's tokens (root excluded), then the
///   emitted token, then -1;
/// - `out_nodes`: tree.size slots: the accepted path's node indices starting with the root,
///   then -1 (or nullptr).
template <class Rule, random_source Source, class TargetRowFn, class ProposalFn,
          class Passes = sequential_passes>
SPECULA_HOST_DEVICE tree_request_result verify_tree_request(
    const Rule& rule, Source& src, const tree_view& tree, TargetRowFn&& target_row,
    ProposalFn&& proposal_for, double residual_floor, token_t* out_tokens, index_t* out_nodes,
    const tree_request_workspace& ws, const Passes& passes = {}) {
  tree_request_result result;
  for (index_t i = 0; i < tree.size; ++i) {
    out_tokens[i] = no_token;
    if (out_nodes != nullptr) out_nodes[i] = -1;
  }
  if (out_nodes != nullptr) out_nodes[0] = 0;
  index_t u = 0;
  // Each step moves to a child, whose index is larger: at most tree.size iterations.
  for (index_t step = 0; step < tree.size; ++step) {
    detail::workspace_barrier(passes);  // ws is rewritten below (see row_passes.hpp)
    const auto p = target_row(u);
    const auto d = static_cast<std::uint32_t>(tree.depth[u]);
    const bool writer = detail::workspace_leader(passes);
    index_t k = 0;
    for (index_t c = tree.first_child[u]; c >= 0 && k < tree.max_children;
         c = tree.next_sibling[c]) {
      if (writer) {
        ws.children[k] = c;
        ws.candidates[k] = tree.token[c];
      }
      ++k;
    }
    detail::workspace_barrier(passes);  // the lists written above are read by every thread
    const auto rule_d = rule_at(rule, tree.depth[u]);
    if (k == 0) {
      // Leaf: bonus token from p_u.
      const detail::row_weights<typename decltype(p)::value_type> w{p};
      typename Passes::summary_type summary;
      passes.summarize(p.size, w, summary);
      result.flags |= chain_bonus;
      if (summary.total > 0.0) {
        result.emitted = static_cast<token_t>(src.categorical(p.size, w, summary, draw_id{d, 1}));
        result.flags |= chain_valid;
      }
      break;
    }
    const candidates_result r = verify_candidates(rule_d, src, p, proposal_for(u), ws.candidates, k,
                                                  residual_floor, d, ws.z, passes);
    result.flags |= r.flags & chain_residual_fallback;
    if (r.accepted < 0) {
      result.emitted = r.token;
      if ((r.flags & chain_valid) != 0) result.flags |= chain_valid;
      break;
    }
    const index_t child = ws.children[r.accepted];
    out_tokens[result.num_accepted] = tree.token[child];
    ++result.num_accepted;
    if (out_nodes != nullptr) out_nodes[result.num_accepted] = child;
    u = child;
  }
  out_tokens[result.num_accepted] = result.emitted;
  return result;
}

/// Inputs of batched tree verification. Request b's tree has trees[b].size() nodes; its rows
/// are the next trees[b].size() rows of target_probs (and of draft_probs when given), requests
/// in order.
template <class T>
struct tree_batch_input {
  index_t vocab_size = 0;
  row_view<const token_tree> trees;  ///< B validated trees with their tokens set
  batch_view<const T> target_probs;  ///< total_nodes x V: one target row per node
  batch_view<const T> draft_probs;   ///< total_nodes x V (q_u: u's children were drawn from
                                     ///< it), or no rows for deterministic children
  row_view<const request_rng> rng;   ///< B random streams
};

/// Outputs of batched tree verification (caller-allocated), laid out like the node rows.
struct tree_batch_output {
  row_view<token_t> output_tokens;      ///< total_nodes: per request, path tokens then emitted
  row_view<std::int32_t> num_accepted;  ///< B
  row_view<index_t> accepted_nodes;     ///< total_nodes (local node ids, root first), or empty
  row_view<std::uint32_t> flags;        ///< B, or empty
};

/// Reusable scratch for batched tree verification; grows as needed, so a reused workspace makes
/// steady-state calls allocation-free.
class tree_workspace {
 public:
  /// `z_doubles`: the candidate workspace of one thread (candidates_workspace_size).
  void prepare(index_t batch, index_t threads, index_t max_children, index_t z_doubles) {
    offsets_.resize(static_cast<std::size_t>(batch + 1));
    const auto slots = static_cast<std::size_t>(threads * max_children);
    z_.resize(static_cast<std::size_t>(threads * z_doubles));
    cand_.resize(slots);
    children_.resize(slots);
    width_ = max_children;
    z_doubles_ = z_doubles;
  }
  [[nodiscard]] index_t* offsets() noexcept { return offsets_.data(); }
  [[nodiscard]] tree_request_workspace slot(index_t t) noexcept {
    return {z_.data() + t * z_doubles_, cand_.data() + t * width_, children_.data() + t * width_};
  }

 private:
  std::vector<index_t> offsets_;
  std::vector<double> z_;
  std::vector<token_t> cand_;
  std::vector<index_t> children_;
  index_t width_ = 0;
  index_t z_doubles_ = 0;
};

namespace detail {

inline index_t max_width(row_view<const token_tree> trees) {
  index_t w = 1;
  for (index_t b = 0; b < trees.size; ++b) w = std::max(w, trees[b].max_width());
  return w;
}

inline index_t total_nodes(row_view<const token_tree> trees) {
  index_t n = 0;
  for (index_t b = 0; b < trees.size; ++b) n += trees[b].size();
  return n;
}

}  // namespace detail

namespace detail {

/// Validates batched tree-verification inputs and outputs; scans every row, and checks the entries
/// the verifier reads pointwise (p_u(c) and q_u(c) of every child c of every node u), only when
/// `scan_rows`. At check_level::reads the walk checks those entries of the children it tests as
/// it reads them (check_pointwise); tokens, shapes and distinct siblings are always checked here.
template <host::policy Policy, class T>
void validate_tree_input(const Policy& policy, const tree_batch_input<T>& in,
                         const tree_batch_output& out, const tree_options& options,
                         bool scan_rows) {
  detail::validate_options(chain_options{options.sum_tolerance, options.residual_floor});
  require_parameter(in.vocab_size > 0, "vocab_size", static_cast<double>(in.vocab_size),
                    "must be positive");
  if (in.trees.size == 0) return;  // B = 0 is a no-op
  const index_t batch = in.trees.size;
  const index_t nodes = detail::total_nodes(in.trees);
  detail::require_streams(in.rng, batch);
  detail::validate_rows(policy, in.target_probs, nodes, in.vocab_size, "target_probs",
                        options.sum_tolerance, !scan_rows);
  const bool dense = in.draft_probs.rows > 0;
  if (dense)
    detail::validate_rows(policy, in.draft_probs, nodes, in.vocab_size, "draft_probs",
                          options.sum_tolerance, !scan_rows);
  index_t base = 0;
  for (index_t b = 0; b < batch; ++b) {
    // The tree's arrays without the bounds checks of its accessors (i < size here).
    const tree_view t = in.trees[b].view();
    for (index_t i = 1; i < t.size; ++i) {
      const token_t x = t.token[i];
      if (x < 0 || static_cast<index_t>(x) >= in.vocab_size)
        throw_if_failed({status::token_out_of_range, b, i, static_cast<double>(x)}, "trees",
                        ("node token (request = row, node = column) must be in [0, " +
                         std::to_string(in.vocab_size) + ")")
                            .c_str());
      const index_t parent = t.parent[i];
      if (dense && options.sampling == sibling_sampling::without_replacement)
        for (index_t s = t.first_child[parent]; s >= 0 && s < i; s = t.next_sibling[s])
          if (t.token[s] == x)
            throw_if_failed({status::invalid_parameter, b, i, static_cast<double>(x)}, "trees",
                            "siblings drawn without replacement must have distinct tokens "
                            "(request = row, node = column)");
      if (!scan_rows) continue;
      check_entry(static_cast<double>(in.target_probs.row(base + parent)[x]), "target_probs",
                  base + parent, x);
      if (dense) {
        const double qx = static_cast<double>(in.draft_probs.row(base + parent)[x]);
        check_entry(qx, "draft_probs", base + parent, x);
        if (!(qx > 0.0))
          throw_if_failed({status::zero_draft_probability, base + parent, x, qx}, "draft_probs",
                          zero_draft_text);
      }
    }
    base += t.size;
  }
  detail::require_size(out.output_tokens.size, nodes, "output_tokens",
                       "length must be the total number of nodes");
  detail::require_size(out.num_accepted.size, batch, "num_accepted", "length must be B");
  if (!out.accepted_nodes.empty())
    detail::require_size(out.accepted_nodes.size, nodes, "accepted_nodes",
                         "length must be the total number of nodes");
  if (!out.flags.empty()) detail::require_size(out.flags.size, batch, "flags", "length must be B");
}

}  // namespace detail

/// Validates batched tree-verification inputs and outputs, every row included; throws
/// invalid_input.
template <host::policy Policy, class T>
void validate_tree_batch(const Policy& policy, const tree_batch_input<T>& in,
                         const tree_batch_output& out, const tree_options& options = {}) {
  detail::validate_tree_input(policy, in, out, options, true);
}

namespace detail {

template <bool CheckReads, host::policy Policy, class T, class Rule>
void run_tree_batch(const Policy& policy, const tree_batch_input<T>& in,
                    const tree_batch_output& out, tree_workspace& ws, const tree_options& options,
                    const Rule& rule) {
  const index_t batch = in.trees.size;
  index_t threads = 1;
  if constexpr (host::is_concurrent_policy<Policy>) threads = batch;
  const index_t width = detail::max_width(in.trees);
  // The rule in force at a node (the same type at every depth and for every request).
  using node_rule = std::remove_cvref_t<decltype(rule_at(request_rule(rule, 0), 0))>;
  ws.prepare(batch, threads, width, candidates_workspace_size<node_rule>(width, in.vocab_size));
  index_t* offsets = ws.offsets();
  offsets[0] = 0;
  for (index_t b = 0; b < batch; ++b) offsets[b + 1] = offsets[b] + in.trees[b].size();
  host::for_each_index(policy, batch, [&](index_t b) {
    const index_t base = offsets[b];
    philox_source src{in.rng[b]};
    auto target_row = [&](index_t u) { return in.target_probs.row(base + u); };
    index_t* nodes = out.accepted_nodes.empty() ? nullptr : out.accepted_nodes.data + base;
    [[maybe_unused]] row_read_log log;
    log.sum_tolerance = options.sum_tolerance;
    auto run = [&](auto proposal_for) {
      auto request = [&](const auto& passes) {
        return verify_tree_request(detail::request_rule(rule, b), src, in.trees[b].view(),
                                   target_row, proposal_for, options.residual_floor,
                                   out.output_tokens.data + base, nodes,
                                   ws.slot(threads == 1 ? 0 : b), passes);
      };
      if constexpr (CheckReads)
        return request(checking_passes{&log});
      else
        return request(sequential_passes{});
    };
    tree_request_result r;
    if (in.draft_probs.rows == 0)
      r = run([](index_t) { return one_hot_candidates{}; });
    else if (options.sampling == sibling_sampling::with_replacement)
      r = run([&](index_t u) { return with_replacement<T>{in.draft_probs.row(base + u)}; });
    else
      r = run([&](index_t u) { return without_replacement<T>{in.draft_probs.row(base + u)}; });
    if constexpr (CheckReads) throw_read_failure(log, in.target_probs, in.draft_probs);
    out.num_accepted[b] = r.num_accepted;
    if (!out.flags.empty()) out.flags[b] = r.flags;
  });
}

}  // namespace detail

/// Tree verification without input validation. `ws` is reused across calls.
template <host::policy Policy, class T, batch_chain_rule Rule = exact_rule>
void verify_tree_unchecked(const Policy& policy, const tree_batch_input<T>& in,
                           const tree_batch_output& out, tree_workspace& ws,
                           const tree_options& options = {}, const Rule& rule = {}) {
  detail::run_tree_batch<false>(policy, in, out, ws, options, rule);
}

/// Checked tree verification: validates, then verifies every request under `policy`. At
/// check_level::reads (the default) the rows and the entries p(x), q(x) are checked as the
/// verifier reads them, so outputs are unspecified whenever the call throws.
template <host::policy Policy, class T, batch_chain_rule Rule = exact_rule>
void verify_tree(const Policy& policy, const tree_batch_input<T>& in, const tree_batch_output& out,
                 tree_workspace& ws, const tree_options& options = {}, const Rule& rule = {}) {
  const bool scan = detail::scans_all_rows<Rule, T>(options.check);
  detail::validate_tree_input(policy, in, out, options, scan);
  detail::validate_rule(rule, in.vocab_size, in.trees.size);
  if constexpr (detail::checks_reads<Rule, T>) {
    if (!scan) {
      detail::run_tree_batch<true>(policy, in, out, ws, options, rule);
      return;
    }
  }
  detail::run_tree_batch<false>(policy, in, out, ws, options, rule);
}

/// Checked tree verification with a workspace allocated for this call.
template <host::policy Policy, class T, batch_chain_rule Rule = exact_rule>
void verify_tree(const Policy& policy, const tree_batch_input<T>& in, const tree_batch_output& out,
                 const tree_options& options = {}, const Rule& rule = {}) {
  tree_workspace ws;
  verify_tree(policy, in, out, ws, options, rule);
}

}  // namespace specula
