#pragma once

/// @file
/// Steps that several decoding loops share: target logits to probability rows, verifying one
/// request's draft tree, appending a step's output, and the row draws of SJD-style drafting
/// (a sample from a row; Adaptive Continuation's keep-or-resample draw). Used by
/// speculative.hpp, sjd.hpp, jacobi.hpp and multiblock.hpp.

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/decode/row_draws.hpp"
#include "specula/decode/stats.hpp"
#include "specula/rules/exact.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/sample/random_source.hpp"
#include "specula/sample/transforms.hpp"
#include "specula/tree/token_tree.hpp"
#include "specula/verify/tree.hpp"

namespace specula::detail {

/// The stream of a decoding loop's step `step` for the request stream `rng`, its seed first
/// folded with `stream` (0: as given; the loops draw their drafts from fold 1 and multi-block's
/// first window from fold 2): the loop's steps count on from rng.step, so that a call that
/// continues a request (its prompt extended by what an earlier call committed) with rng.step
/// advanced past that call's steps (by its decode_stats::steps, or by the number of tokens it
/// committed, never fewer) draws afresh; step numbers wrap modulo 2^32.
[[nodiscard]] constexpr request_rng step_stream(const request_rng& rng, std::uint32_t step,
                                                std::uint64_t stream = 0) noexcept {
  return {stream == 0 ? rng.seed : fold_in(rng.seed, stream), rng.request_id, rng.step + step};
}

/// logits (rows x V) -> probability rows, with `params`.
inline void rows_to_probs(const sampling_params& params, std::span<float> logits,
                          std::span<float> probs, std::span<float> scratch, index_t vocab) {
  const auto V = static_cast<std::size_t>(vocab);
  for (std::size_t r = 0; r * V < logits.size(); ++r)
    logits_to_probs(params, logits.subspan(r * V, V), {}, probs.subspan(r * V, V), scratch);
}

/// The tokens that end a request's generation once emitted: `token` (`no_token`: none) and
/// every entry of `more` (a loop's `stop_tokens` option).
struct stop_set {
  token_t token = no_token;
  std::span<const token_t> more{};
  [[nodiscard]] bool contains(token_t t) const noexcept {
    return (token != no_token && t == token) ||
           std::find(more.begin(), more.end(), t) != more.end();
  }
};

/// Appends a step's output (the accepted path's tokens, then the emitted one: out_tokens[0..k])
/// to `seq`, counting them in `st` (and in `st.step_tokens`); returns true when a token of
/// `stops` was emitted (tokens after it are dropped).
inline bool emit_step(std::span<const token_t> out_tokens, index_t k, const stop_set& stops,
                      std::vector<token_t>& seq, decode_stats& st) {
  st.record_step(k);
  index_t emitted = 0;
  bool stopped = false;
  for (index_t j = 0; j <= k && !stopped; ++j) {
    const token_t t = out_tokens[static_cast<std::size_t>(j)];
    seq.push_back(t);
    ++st.tokens;
    ++emitted;
    stopped = stops.contains(t);
  }
  st.step_tokens.push_back(emitted);
  return stopped;
}

/// emit_step with one stop token (`no_token`: none).
inline bool emit_step(std::span<const token_t> out_tokens, index_t k, token_t stop_token,
                      std::vector<token_t>& seq, decode_stats& st) {
  return emit_step(out_tokens, k, stop_set{stop_token, {}}, seq, st);
}

/// Verifies one request's tree with `verify`: rows are nodes x V (q may be empty for one-hot
/// drafts); fills out_tokens / out_nodes (tree.size() each) and returns the accepted count.
/// A verifier that also takes a tree_workspace (tree_verifier does) gets `*ws` when given: the
/// loops keep one per request, so that a step allocates nothing once it has grown.
template <class Verifier>
index_t verify_one(const Verifier& verify, const token_tree& tree, index_t vocab,
                   std::span<const float> p_rows, std::span<const float> q_rows,
                   const request_rng& rng, std::vector<token_t>& out_tokens,
                   std::vector<index_t>& out_nodes, tree_workspace* ws = nullptr) {
  const index_t nodes = tree.size();
  out_tokens.assign(static_cast<std::size_t>(nodes), no_token);
  out_nodes.assign(static_cast<std::size_t>(nodes), -1);
  std::int32_t accepted = 0;
  std::uint32_t flags = 0;
  tree_batch_input<float> in;
  in.vocab_size = vocab;
  in.trees = row_view<const token_tree>(&tree, 1);
  in.target_probs = batch_view<const float>(p_rows.data(), nodes, vocab);
  if (!q_rows.empty()) in.draft_probs = batch_view<const float>(q_rows.data(), nodes, vocab);
  in.rng = row_view<const request_rng>(&rng, 1);
  tree_batch_output out;
  out.output_tokens = row_view<token_t>(out_tokens.data(), nodes);
  out.num_accepted = row_view<std::int32_t>(&accepted, 1);
  out.accepted_nodes = row_view<index_t>(out_nodes.data(), nodes);
  out.flags = row_view<std::uint32_t>(&flags, 1);
  if constexpr (requires { verify(in, out, *ws); }) {
    if (ws != nullptr) {
      verify(in, out, *ws);
      return accepted;
    }
  }
  verify(in, out);
  return accepted;
}

/// verify_one after giving the tree's leaves (nodes without children, whose q rows no draw
/// used) their p rows as q rows, so that every row the verifier is handed is valid.
template <class Verifier>
index_t verify_with_leaves(const Verifier& verify, const token_tree& tree, index_t vocab,
                           std::span<const float> p_rows, std::span<float> q_rows,
                           const request_rng& rng, std::vector<token_t>& out_tokens,
                           std::vector<index_t>& out_nodes, tree_workspace* ws = nullptr) {
  for (index_t u = 0; u < tree.size(); ++u)
    if (tree.num_children(u) == 0)
      std::copy_n(p_rows.begin() + u * vocab, vocab, q_rows.begin() + u * vocab);
  return verify_one(verify, tree, vocab, p_rows, q_rows, rng, out_tokens, out_nodes, ws);
}

/// A sample from the probability row R with the uniform u (row_draws.hpp).
inline token_t sample_row(std::span<const float> R, double u) {
  return sample_row(R.data(), static_cast<index_t>(R.size()), u);
}

/// Adaptive Continuation's draw (row_draws.hpp) over spans.
inline token_t adaptive_continuation_draw(std::span<const float> R, std::span<const float> q_old,
                                          token_t old, const request_rng& rng, draw_id keep_at,
                                          draw_id resample_at) {
  return adaptive_continuation_draw(R.data(), q_old.data(), static_cast<index_t>(R.size()), old,
                                    rng, keep_at, resample_at);
}

}  // namespace specula::detail
