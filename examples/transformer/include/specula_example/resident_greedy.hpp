#pragma once

/// @file
/// The greedy loops — Jacobi decoding (decode/jacobi.hpp) and multi-block decoding's greedy
/// variant (decode/multiblock.hpp) — with the logits kept where the model computes them:
/// `resident_jacobi_decode(ops, ...)` / `resident_multiblock_decode(ops, ...)` run the library's
/// own loops with `resident_greedy_ops` as their model and resident rows policy. A greedy loop
/// reads a row only through its argmax (greedy verification of the chain or tree, the window
/// update), so the ops keep each row's summary (`detail::row_top`): over a `device_session` they
/// are computed on the GPU (`device_transformer::evaluate_tree_tops`, 16 bytes per node cross
/// instead of 4 V), over a `transformer_session` (the host stand-in that CI runs) every row is
/// summarised on the host. The output is greedy decoding, as the loops'.

#include <span>
#include <vector>

#include "specula/decode/jacobi.hpp"
#include "specula/decode/multiblock.hpp"
#include "specula/decode/row_top.hpp"
#include "specula_example/resident_sd.hpp"
#include "specula_example/sessions.hpp"

namespace specula::example {

/// A session (`transformer_session` or `device_session`) as jacobi_task's model and resident
/// rows policy (see file comment).
template <class Session>
class resident_greedy_ops : public resident_session<Session> {
  using resident_session<Session>::session_;

 public:
  static constexpr bool resident = true;
  using resident_session<Session>::resident_session;
  using resident_session<Session>::vocab_size;

  // The rows policy (detail::greedy_host_rows describes it).
  void target(const token_tree& tree) {
    tops_.resize(static_cast<std::size_t>(tree.size()));
    if constexpr (requires {
                    session_.model().evaluate_tree_tops(session_.cache(), tree, std::span(tops_));
                  }) {
      session_.model().evaluate_tree_tops(session_.cache(), tree, tops_);
    } else {
      const index_t V = vocab_size();
      logits_.resize(tops_.size() * static_cast<std::size_t>(V));
      session_.evaluate(tree, batch_view<float>(logits_.data(), tree.size(), V));
      for (std::size_t r = 0; r < tops_.size(); ++r)
        tops_[r] = specula::detail::top_of(logits_.data() + r * static_cast<std::size_t>(V), V);
    }
  }
  /// Greedy verification of the tree from its rows' argmaxes: from the root, descend into the
  /// child whose token is the current node's argmax while there is one; the argmax of the node
  /// reached follows the accepted tokens.
  index_t verify(const token_tree& tree, index_t, std::vector<token_t>& out_tokens,
                 std::vector<index_t>& out_nodes) const {
    const auto n = static_cast<std::size_t>(tree.size());
    out_tokens.assign(n, no_token);
    out_nodes.assign(n, -1);
    out_nodes[0] = 0;
    index_t u = 0, k = 0;
    for (;;) {
      const token_t a = argmax(u, 0);
      out_tokens[static_cast<std::size_t>(k)] = a;
      index_t c = tree.first_child(u);
      while (c >= 0 && tree.token(c) != a) c = tree.next_sibling(c);
      if (c < 0) return k;
      u = c;
      out_nodes[static_cast<std::size_t>(++k)] = c;
    }
  }
  [[nodiscard]] token_t argmax(index_t row, index_t) const {
    return static_cast<token_t>(tops_[static_cast<std::size_t>(row)].token);
  }

 private:
  std::vector<specula::detail::row_top> tops_;
  std::vector<float> logits_;  // the host stand-in's
};

/// jacobi_decode with `ops` as the loop's model and resident rows policy.
template <class Session>
std::vector<token_t> resident_jacobi_decode(resident_greedy_ops<Session>& ops,
                                            std::span<const token_t> prompt,
                                            const jacobi_options& options, request_rng rng = {},
                                            decode_stats* stats = nullptr) {
  return detail::run_task(ops, stats, [&](decode_stats& st, std::vector<token_t>& out) {
    return specula::detail::jacobi_task(specula::detail::solo<resident_greedy_ops<Session>>{&ops},
                                        prompt, options, rng, st, out, &ops);
  });
}

/// multiblock_decode (greedy variant) with `ops` as the loop's model and resident rows policy.
template <class Session>
std::vector<token_t> resident_multiblock_decode(resident_greedy_ops<Session>& ops,
                                                std::span<const token_t> prompt,
                                                const multiblock_options& options,
                                                request_rng rng = {},
                                                decode_stats* stats = nullptr) {
  return detail::run_task(ops, stats, [&](decode_stats& st, std::vector<token_t>& out) {
    return specula::detail::multiblock_task(
        specula::detail::solo<resident_greedy_ops<Session>>{&ops}, prompt, options, rng,
        tree_verifier<>{}, st, out, &ops);
  });
}

static_assert(session_model<resident_greedy_ops<transformer_session>>);

}  // namespace specula::example
