#pragma once

/// @file
/// Greedy verification of chains and trees: a draft is accepted iff it equals the argmax of its
/// parent's target row (ties broken towards the lowest token id); the longest such path is
/// accepted and the argmax at its last node is emitted (the correction after a mismatch, or the
/// bonus at a leaf). The output is identical to greedy decoding of the target one token at a
/// time. Rows may be logits or probabilities (only their argmax matters); checked entry points
/// reject NaN entries.

#include <cstdint>

#include "specula/backend/host.hpp"
#include "specula/core/row.hpp"
#include "specula/core/validate.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/tree/token_tree.hpp"
#include "specula/verify/chain.hpp"
#include "specula/verify/tree.hpp"

namespace specula {

/// Greedy verification of one request's tree. `score_row(u)` is the target row at node u.
/// Outputs as verify_tree_request. If several children carry the argmax token, the first in
/// verification order is followed.
template <class ScoreRowFn, class Passes = sequential_passes>
SPECULA_HOST_DEVICE tree_request_result greedy_tree_request(const tree_view& tree,
                                                            ScoreRowFn&& score_row,
                                                            token_t* out_tokens, index_t* out_nodes,
                                                            const Passes& passes = {}) {
  tree_request_result result;
  for (index_t i = 0; i < tree.size; ++i) {
    out_tokens[i] = no_token;
    if (out_nodes != nullptr) out_nodes[i] = -1;
  }
  if (out_nodes != nullptr) out_nodes[0] = 0;
  index_t u = 0;
  for (index_t step = 0; step < tree.size; ++step) {
    const index_t a = passes.argmax(score_row(u));
    index_t next = -1;
    for (index_t c = tree.first_child[u]; c >= 0; c = tree.next_sibling[c])
      if (static_cast<index_t>(tree.token[c]) == a) {
        next = c;
        break;
      }
    if (next < 0) {
      result.emitted = static_cast<token_t>(a);
      if (a >= 0) result.flags |= chain_valid;
      if (tree.first_child[u] < 0) result.flags |= chain_bonus;
      break;
    }
    out_tokens[result.num_accepted] = tree.token[next];
    ++result.num_accepted;
    if (out_nodes != nullptr) out_nodes[result.num_accepted] = next;
    u = next;
  }
  out_tokens[result.num_accepted] = result.emitted;
  return result;
}

namespace detail {

template <host::policy Policy, class T>
void validate_score_rows(const Policy& policy, batch_view<const T> rows, index_t expected_rows,
                         index_t vocab, const char* argument) {
  require_size(rows.rows, expected_rows, argument, "number of rows");
  require_size(rows.cols, vocab, argument, "row length must equal vocab_size");
  if (rows.rows > 1 && rows.row_stride < rows.cols)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(rows.row_stride)},
                    argument, "row_stride must be at least the row length");
  host::for_each_index(policy, rows.rows, [&](index_t r) {
    const auto row = rows.row(r);
    for (index_t i = 0; i < row.size; ++i)
      if (detail::is_nan(static_cast<double>(row[i])))
        throw_if_failed({status::nan_value, r, i, 0.0}, argument);
  });
}

}  // namespace detail

/// Greedy chain verification, flattened layout (chain_batch_input; draft_probs is ignored and
/// target_probs may hold logits). Checked: validates shapes, tokens and NaN-free rows. With
/// draft_placeholders::reject a -1 draft is rejected at its position (it never equals the
/// argmax, which is emitted there), as vLLM's greedy rule does.
template <host::policy Policy, class T>
void verify_chain_greedy(const Policy& policy, const chain_batch_input<T>& in,
                         const chain_batch_output& out,
                         draft_placeholders placeholders = draft_placeholders::refuse) {
  const index_t batch = detail::validate_flattened_shape(in);
  if (batch == 0) return;  // B = 0 is a no-op
  const index_t num_draft = in.draft_offsets[batch];
  for (index_t i = 0; i < num_draft; ++i) {
    const token_t x = in.draft_tokens[i];
    if (x == no_token) {
      if (placeholders == draft_placeholders::reject) continue;
      throw_if_failed({status::bad_padding, i, -1, -1.0}, "draft_tokens",
                      detail::placeholder_refused);
    }
    if (x < 0 || static_cast<index_t>(x) >= in.vocab_size)
      throw_if_failed({status::token_out_of_range, i, -1, static_cast<double>(x)}, "draft_tokens",
                      ("vocab_size is " + std::to_string(in.vocab_size)).c_str());
  }
  detail::validate_score_rows(policy, in.target_probs,
                              detail::validate_bonus_tokens(in, num_draft, batch), in.vocab_size,
                              "target_probs");
  detail::validate_flattened_outputs(out, num_draft, batch);

  host::for_each_index(policy, batch, [&](index_t b) {
    const auto s = detail::flattened_segment(in, b);
    auto rows = [&](index_t i) { return in.target_probs.row(s.target_row_of(i)); };
    const auto r = greedy_chain_request(
        s.length, in.draft_tokens.data + s.draft_row, rows, out.output_tokens.data + s.target_row,
        out.accepted.empty() ? nullptr : out.accepted.data + s.draft_row, sequential_passes{},
        s.given_bonus);
    detail::write_result(r, b, out.num_accepted, out.flags);
  });
}

/// Greedy tree verification (tree_batch_input; draft_probs and rng are ignored and target_probs
/// may hold logits). Checked: validates shapes, node tokens and NaN-free rows.
template <host::policy Policy, class T>
void verify_tree_greedy(const Policy& policy, const tree_batch_input<T>& in,
                        const tree_batch_output& out) {
  require_parameter(in.vocab_size > 0, "vocab_size", static_cast<double>(in.vocab_size),
                    "must be positive");
  if (in.trees.size == 0) return;  // B = 0 is a no-op
  const index_t batch = in.trees.size;
  const index_t nodes = detail::total_nodes(in.trees);
  detail::validate_score_rows(policy, in.target_probs, nodes, in.vocab_size, "target_probs");
  std::vector<index_t> offsets(static_cast<std::size_t>(batch + 1), 0);
  for (index_t b = 0; b < batch; ++b) {
    const token_tree& t = in.trees[b];
    for (index_t i = 1; i < t.size(); ++i)
      if (t.token(i) < 0 || static_cast<index_t>(t.token(i)) >= in.vocab_size)
        throw_if_failed({status::token_out_of_range, b, i, static_cast<double>(t.token(i))},
                        "trees", "node token (request = row, node = column) out of range");
    offsets[static_cast<std::size_t>(b + 1)] = offsets[static_cast<std::size_t>(b)] + t.size();
  }
  detail::require_size(out.output_tokens.size, nodes, "output_tokens",
                       "length must be the total number of nodes");
  detail::require_size(out.num_accepted.size, batch, "num_accepted", "length must be B");
  if (!out.accepted_nodes.empty())
    detail::require_size(out.accepted_nodes.size, nodes, "accepted_nodes",
                         "length must be the total number of nodes");
  if (!out.flags.empty()) detail::require_size(out.flags.size, batch, "flags", "length must be B");

  host::for_each_index(policy, batch, [&](index_t b) {
    const index_t base = offsets[static_cast<std::size_t>(b)];
    auto rows = [&](index_t u) { return in.target_probs.row(base + u); };
    const auto r =
        greedy_tree_request(in.trees[b].view(), rows, out.output_tokens.data + base,
                            out.accepted_nodes.empty() ? nullptr : out.accepted_nodes.data + base);
    out.num_accepted[b] = r.num_accepted;
    if (!out.flags.empty()) out.flags[b] = r.flags;
  });
}

}  // namespace specula
