#pragma once

/// @file
/// The SJD-PAC tree rule written out operation by operation, and the authors' code's choice of
/// the longest accepted sibling path: a verifier (specula::verifier) for measurements and for
/// negative controls, independent of the library's tree_verifier.
///
/// `sibling_rule_verifier{false}` is the rule SJD-PAC's Theorem 2 proves lossless (siblings
/// drawn without replacement; at node u the children x_1, x_2, ... are tried in order, x_i
/// against the residual p_i (p_1 = p_u, p_{i+1} = norm(max(p_i - q_i, 0))) with q_i = q_u
/// without x_1..x_{i-1}, renormalised; after the last rejection the emitted token is drawn
/// from the last residual, after an accepted leaf from its row; the first accepted child is
/// kept). `sibling_rule_verifier{true}` is what the authors' code (KangJialiang/SJD-PAC,
/// scheduler/sjd_pac_iteration_lumina_mgpt.py) does instead: every child's test is evaluated
/// and the accepted child with the longest accepted path below it is kept. That choice is
/// biased (docs/decoding.md, "Where the authors' code is not exact"); use it to measure the
/// bias, never to sample. Batch size 1; double-precision reference code, not a fast path.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "specula/core/rng.hpp"
#include "specula/core/types.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/tree/token_tree.hpp"
#include "specula/verify/tree.hpp"

namespace specula::testing {

/// The tree rule written out (siblings without replacement, SJD-PAC Theorem 2):
/// at node u the children x_1, x_2, ... are tried in order, x_i against the residual p_i
/// (p_1 = p_u, p_{i+1} = norm(max(p_i - q_i, 0))) with q_i = q_u without x_1..x_{i-1},
/// renormalised; after the last rejection the emitted token is drawn from the last residual,
/// after an accepted leaf from its row. `longest` is the authors' code's choice (biased): every
/// child's test is evaluated and the accepted child with the longest accepted path below it is
/// kept, instead of the first accepted child.
struct sibling_rule_verifier {
  bool longest = false;

  struct walk {
    std::vector<index_t> nodes;
    token_t emitted = no_token;
  };

  void operator()(const tree_batch_input<float>& in, const tree_batch_output& out) const {
    const token_tree& t = in.trees[0];
    const walk w = from(t, in, 0);
    out.accepted_nodes[0] = 0;
    for (std::size_t j = 0; j < w.nodes.size(); ++j) {
      out.output_tokens[static_cast<index_t>(j)] = t.token(w.nodes[j]);
      out.accepted_nodes[static_cast<index_t>(j) + 1] = w.nodes[j];
    }
    out.output_tokens[static_cast<index_t>(w.nodes.size())] = w.emitted;
    out.num_accepted[0] = static_cast<std::int32_t>(w.nodes.size());
  }

  walk from(const token_tree& t, const tree_batch_input<float>& in, index_t u) const {
    const index_t V = in.vocab_size;
    const auto at = [](index_t y) { return static_cast<std::size_t>(y); };
    std::vector<double> p(at(V)), q(at(V));
    for (index_t y = 0; y < V; ++y) {
      p[at(y)] = in.target_probs.row(u)[y];
      q[at(y)] = in.draft_probs.row(u)[y];
    }
    std::vector<index_t> accepted;
    std::uint32_t i = 0;
    for (const index_t c : t.children(u)) {
      const token_t x = t.token(c);
      double qs = 0.0;
      for (const double v : q) qs += v;
      for (double& v : q) v /= qs;
      const double a = q[at(x)] > 0.0 ? std::min(1.0, p[at(x)] / q[at(x)]) : 0.0;
      const bool ok = uniform_at(in.rng[0], draw_id{static_cast<std::uint32_t>(u), i++}) < a;
      if (ok) {
        accepted.push_back(c);
        if (!longest) break;
      }
      double ps = 0.0;
      for (index_t y = 0; y < V; ++y) ps += (p[at(y)] = std::max(p[at(y)] - q[at(y)], 0.0));
      if (ps > 0.0)
        for (double& v : p) v /= ps;
      q[at(x)] = 0.0;
    }
    walk best;
    if (accepted.empty()) {
      if (t.num_children(u) == 0)
        for (index_t y = 0; y < V; ++y) p[at(y)] = in.target_probs.row(u)[y];
      const auto w = [&](index_t y) { return p[at(y)]; };
      best.emitted = static_cast<token_t>(sample_inverse_cdf(
          V, w, positive_mass(V, w),
          uniform_at(in.rng[0], draw_id{static_cast<std::uint32_t>(u), 0xFFFFu})));
      return best;
    }
    bool first = true;
    for (const index_t c : accepted) {
      walk w = from(t, in, c);
      w.nodes.insert(w.nodes.begin(), c);
      if (first || w.nodes.size() > best.nodes.size()) best = std::move(w);
      first = false;
    }
    return best;
  }
};

}  // namespace specula::testing
