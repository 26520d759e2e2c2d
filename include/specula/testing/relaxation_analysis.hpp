#pragma once

/// @file
/// Exact accounting of relaxed speculative decoding on toy models (small V and L): the expected
/// number of tokens per round E[τ + 1] (Cool-SD Eq. 7), the total-variation upper bound of
/// Theorem 2 (Eq. 8), and the exact total variation between the relaxed output law P̂ and the
/// target law P over the first L + 1 tokens.
///
/// One round of Algorithm 1 from the empty prefix: L drafts from the draft model, verified left
/// to right with `rule` (rule_at(rule, i) at draft position i + 1, bound to the target row as
/// the chain verifier binds it), the residual sample at the first rejection, the bonus token if
/// all are accepted, and — as in the paper — the sequence virtually extended to L + 1 tokens by
/// sampling the rest from the target. Everything is computed from the same rule objects and the
/// same residual-floor fallback as the chain verifier, by enumerating all V^(L+1) sequences.
///
/// For rules whose resampling distribution depends on the rejected draft x̃ (LANTERN++'s own
/// G^{k,λ}), the rejection term of Eq. 8 is the mixture Σ_x̃ Q(x̃)(1 − f(x̃))·G_x̃, which reduces
/// to the paper's r·G when G does not depend on x̃.
///
/// Trees: `candidates_law` is the exact law of one node's K-candidate verification and
/// `speculative_tree_loop_law` the exact law of the whole loop with tree drafts (chains are
/// trees of one child per node), for scalar and row-aware rules alike; the exact TV of a
/// configuration is total_variation(law, target.sequence_law()).

#include <algorithm>
#include <cmath>
#include <functional>
#include <span>
#include <stdexcept>
#include <vector>

#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/rules/rule.hpp"
#include "specula/testing/toy_models.hpp"
#include "specula/tree/builders.hpp"
#include "specula/tree/token_tree.hpp"
#include "specula/verify/chain_core.hpp"
#include "specula/verify/tree.hpp"

namespace specula::testing {

/// Results of relaxation_accounting.
struct relaxation_report {
  double expected_tokens = 0.0;     ///< E[τ + 1] (Eq. 7)
  double tv_bound = 0.0;            ///< right-hand side of Eq. 8
  double tv_exact = 0.0;            ///< TV(P̂, P) over the first L + 1 tokens
  std::vector<double> relaxed_law;  ///< P̂ over X^{L+1}, indexed base-V (first token first)
  std::vector<double> target_law;   ///< P over X^{L+1}
};

/// How the candidates of K-candidate verification come about (detail::candidate_terms,
/// candidates_law).
enum class candidate_draw { without_replacement, with_replacement, fixed };

namespace detail {

/// Per-position quantities for one prefix.
struct position_terms {
  std::vector<double> accept;  ///< f(y): acceptance probability if y is drafted
  std::vector<double> reject;  ///< Σ_x̃ Q(x̃)(1 − f(x̃)) G_x̃(y)
};

template <class Rule>
position_terms terms_at(const Rule& rule, index_t depth, std::span<const double> p,
                        std::span<const double> q, double residual_floor) {
  const auto v = static_cast<index_t>(p.size());
  const row_view<const double> pr(p.data(), v);
  position_terms t{std::vector<double>(p.size()), std::vector<double>(p.size(), 0.0)};
  const auto rule_d = rule_at(rule, depth);
  for (index_t x = 0; x < v; ++x) {
    const auto sx = static_cast<std::size_t>(x);
    const auto bound = bind_rule(rule_d, pr, static_cast<token_t>(x));
    const double f = bound.accept_probability(p[sx], q[sx]);
    t.accept[sx] = f;
    const double rej = q[sx] * (1.0 - f);
    if (!(rej > 0.0)) continue;
    // G_x: the residual the verifier samples after rejecting x (with its fallback to p).
    std::vector<double> g(p.size());
    double mass = 0.0;
    for (index_t y = 0; y < v; ++y) {
      const auto sy = static_cast<std::size_t>(y);
      g[sy] = bound.residual_weight_at(y, p[sy], q[sy]);
      mass += g[sy];
    }
    if (!(mass > residual_floor && mass > 0.0)) {
      g.assign(p.begin(), p.end());
      mass = 0.0;
      for (double w : g) mass += w;
    }
    for (std::size_t y = 0; y < g.size(); ++y) t.reject[y] += rej * g[y] / mass;
  }
  return t;
}

/// K-candidate verification at one node, in double (a transcription of the recursion of
/// verify/candidates.hpp with explicit rows, sharing no code with it): `accept[j][y]` is the
/// probability that candidate j is y and is the one accepted (its draw included); `reject[y]`
/// that all candidates are rejected and y is sampled. The candidates are drawn from q — without
/// replacement (q renormalised over the tokens not yet drawn, stopping when none with positive
/// mass is left, as the drafters do) or i.i.d. — or given (`fixed`, one-hot proposals).
struct node_terms {
  std::vector<std::vector<double>> accept;
  std::vector<double> reject;
};

template <class Rule>
node_terms candidate_terms(const Rule& rule, index_t depth, std::span<const double> p,
                           std::span<const double> q, index_t k, candidate_draw draw,
                           std::span<const token_t> fixed = {},
                           double residual_floor = default_residual_floor) {
  const auto v = static_cast<index_t>(p.size());
  const auto sv = p.size();
  node_terms t{
      std::vector<std::vector<double>>(static_cast<std::size_t>(k), std::vector<double>(sv, 0.0)),
      std::vector<double>(sv, 0.0)};
  const auto rule_d = rule_at(rule, depth);
  const auto normalised = [](std::vector<double> w) {
    double z = 0.0;
    for (double x : w) z += std::max(x, 0.0);
    for (double& x : w) x = z > 0.0 ? std::max(x, 0.0) / z : 0.0;
    return w;
  };
  // The recursion for one ordered candidate list, weighted by its probability.
  const auto verify = [&](const std::vector<token_t>& cand, double weight) {
    std::vector<double> cur(p.begin(), p.end());
    double reach = weight;
    for (std::size_t j = 0; j < cand.size(); ++j) {
      // q^(j): one-hot at c_j, q, or q without c_1..c_{j-1} renormalised.
      std::vector<double> qj(sv, 0.0);
      if (draw == candidate_draw::fixed) {
        qj[static_cast<std::size_t>(cand[j])] = 1.0;
      } else {
        qj.assign(q.begin(), q.end());
        if (draw == candidate_draw::without_replacement) {
          for (std::size_t i = 0; i < j; ++i) qj[static_cast<std::size_t>(cand[i])] = 0.0;
          double rest = 0.0;
          for (double x : qj) rest += x;
          for (double& x : qj) x = rest > 0.0 ? x / rest : 0.0;
        }
      }
      const auto c = static_cast<std::size_t>(cand[j]);
      const auto bound = bind_rule(rule_d, row_view<const double>(cur.data(), v), cand[j]);
      const double f = std::clamp(bound.accept_probability(cur[c], qj[c]), 0.0, 1.0);
      t.accept[j][c] += reach * f;
      reach *= 1.0 - f;
      if (!(reach > 0.0)) return;
      std::vector<double> r(sv);
      double mass = 0.0;
      for (index_t y = 0; y < v; ++y) {
        const auto sy = static_cast<std::size_t>(y);
        r[sy] = bound.residual_weight_at(y, cur[sy], qj[sy]);
        mass += r[sy];
      }
      if (!(mass > residual_floor && mass > 0.0)) {  // fallback: sample the current target
        const auto g = normalised(cur);
        for (std::size_t y = 0; y < sv; ++y) t.reject[y] += reach * g[y];
        return;
      }
      cur = normalised(r);
    }
    const auto g = normalised(cur);  // every candidate rejected (or none): sample p^(K+1)
    for (std::size_t y = 0; y < sv; ++y) t.reject[y] += reach * g[y];
  };
  std::vector<token_t> cand;
  if (draw == candidate_draw::fixed) {
    cand.assign(fixed.begin(), fixed.end());
    verify(cand, 1.0);
    return t;
  }
  // Every ordered list of draws with its probability.
  const std::function<void(double)> draw_next = [&](double weight) {
    if (static_cast<index_t>(cand.size()) == k) {
      verify(cand, weight);
      return;
    }
    double rest = 0.0;
    for (index_t y = 0; y < v; ++y)
      if (draw == candidate_draw::with_replacement ||
          std::find(cand.begin(), cand.end(), static_cast<token_t>(y)) == cand.end())
        rest += q[static_cast<std::size_t>(y)];
    if (!(rest > 0.0)) {  // nothing left to draw: fewer candidates
      verify(cand, weight);
      return;
    }
    for (index_t y = 0; y < v; ++y) {
      const double qy = q[static_cast<std::size_t>(y)];
      if (!(qy > 0.0) ||
          (draw == candidate_draw::without_replacement &&
           std::find(cand.begin(), cand.end(), static_cast<token_t>(y)) != cand.end()))
        continue;
      cand.push_back(static_cast<token_t>(y));
      draw_next(weight * qy / rest);
      cand.pop_back();
    }
  };
  draw_next(1.0);
  return t;
}

}  // namespace detail

/// Exact law of the token K-candidate verification emits at one node (candidate_terms summed:
/// accepted candidates and residual samples together). With an exact rule it is p.
template <class Rule>
std::vector<double> candidates_law(const Rule& rule, index_t depth, std::span<const double> p,
                                   std::span<const double> q, index_t k, candidate_draw draw,
                                   std::span<const token_t> fixed = {},
                                   double residual_floor = default_residual_floor) {
  const auto t = detail::candidate_terms(rule, depth, p, q, k, draw, fixed, residual_floor);
  std::vector<double> law = t.reject;
  for (const auto& row : t.accept)
    for (std::size_t y = 0; y < law.size(); ++y) law[y] += row[y];
  return law;
}

/// Exact E[τ + 1], TV bound and TV for one round with draft length `length` (see file comment).
/// Both models need horizon >= length + 1 and equal vocabularies.
template <class Rule>
relaxation_report relaxation_accounting(const toy_ar_model& target, const toy_ar_model& draft,
                                        index_t length, const Rule& rule,
                                        double residual_floor = default_residual_floor) {
  if (target.vocab_size() != draft.vocab_size() || target.horizon() < length + 1 ||
      draft.horizon() < length + 1 || length < 1)
    throw std::invalid_argument(
        "specula::testing::relaxation_accounting: models need equal vocabularies and horizon "
        ">= length + 1, and length >= 1");
  const index_t v = target.vocab_size();
  index_t leaves = 1;
  for (index_t i = 0; i <= length; ++i) leaves *= v;
  relaxation_report r;
  r.relaxed_law.assign(static_cast<std::size_t>(leaves), 0.0);
  r.target_law.assign(static_cast<std::size_t>(leaves), 0.0);
  r.expected_tokens = 1.0;
  std::vector<token_t> prefix;
  // a: P(all drafted tokens so far accepted and equal to the prefix) = Π Q f;
  // b: P(prefix produced with a rejection already behind it); c: P(prefix) under the target.
  std::function<void(double, double, double, index_t)> dfs = [&](double a, double b, double c,
                                                                 index_t code) {
    const auto i = static_cast<index_t>(prefix.size());
    const auto p = target.row(prefix);
    if (i == length) {
      for (index_t y = 0; y < v; ++y) {
        const auto sy = static_cast<std::size_t>(y);
        const auto leaf = static_cast<std::size_t>(code * v + y);
        r.relaxed_law[leaf] = (a + b) * p[sy];  // bonus and virtual extension both sample P
        r.target_law[leaf] = c * p[sy];
      }
      return;
    }
    const auto q = draft.row(prefix);
    const auto t = detail::terms_at(rule, i, p, q, residual_floor);
    double bound_term = 0.0;
    for (index_t y = 0; y < v; ++y) {
      const auto sy = static_cast<std::size_t>(y);
      bound_term += std::abs(q[sy] * t.accept[sy] - p[sy] + t.reject[sy]);
    }
    r.tv_bound += 0.5 * a * bound_term;
    for (index_t y = 0; y < v; ++y) {
      const auto sy = static_cast<std::size_t>(y);
      const double a2 = a * q[sy] * t.accept[sy];
      r.expected_tokens += a2;
      prefix.push_back(static_cast<token_t>(y));
      dfs(a2, b * p[sy] + a * t.reject[sy], c * p[sy], code * v + y);
      prefix.pop_back();
    }
  };
  dfs(1.0, 0.0, 1.0, 0);
  double tv = 0.0;
  for (std::size_t k = 0; k < r.relaxed_law.size(); ++k)
    tv += std::abs(r.relaxed_law[k] - r.target_law[k]);
  r.tv_exact = 0.5 * tv;
  return r;
}

/// Exact law of the draft-model loop with tree drafts (`speculative_decode` with
/// `speculative_options::draft_tree = shape`, sampled drafts, `draft_sampling = sampling`, and a
/// `tree_verifier` using `rule` with the same sampling) over the target's `horizon` tokens after
/// the BOS prompt. Each round drafts node u's children in `shape` from the draft's row at u (as
/// many as the row can supply; levels deeper than the tokens still to generate minus one are not
/// drafted), verifies the children of the current node as K candidates with the rule at its
/// depth (detail::candidate_terms), descends into the accepted child's subtree, and ends with
/// the residual sample or, at a leaf, the target's bonus token. A chain-shaped `shape` gives
/// the chain loop's law (speculative_loop_law below is this with a chain). With the exact rule this
/// is the target's law.
template <class Rule>
std::vector<double> speculative_tree_loop_law(const toy_ar_model& target, const toy_ar_model& draft,
                                              const token_tree& shape, sibling_sampling sampling,
                                              const Rule& rule,
                                              double residual_floor = default_residual_floor) {
  if (target.vocab_size() != draft.vocab_size() || draft.horizon() < target.horizon() ||
      shape.size() < 1)
    throw std::invalid_argument(
        "specula::testing::speculative_tree_loop_law: models need equal vocabularies, the draft "
        "a horizon >= the target's, and the shape a root");
  const index_t v = target.vocab_size();
  const index_t horizon = target.horizon();
  const auto draw = sampling == sibling_sampling::without_replacement
                        ? candidate_draw::without_replacement
                        : candidate_draw::with_replacement;
  std::vector<double> law(static_cast<std::size_t>(target.num_sequences()), 0.0);
  std::vector<token_t> prefix;
  std::function<void(double, index_t)> round;
  // walk: at shape node u (depth d) of a round drafting up to depth `cap`, reached with mass a.
  std::function<void(index_t, index_t, double, index_t)> walk = [&](index_t u, index_t cap,
                                                                    double a, index_t code) {
    const auto p = target.row(prefix);
    std::vector<index_t> children;
    if (shape.depth(u) < cap)
      for (index_t c = shape.first_child(u); c >= 0; c = shape.next_sibling(c))
        children.push_back(c);
    if (children.empty()) {  // leaf: the bonus token from the target row
      for (index_t y = 0; y < v; ++y) {
        prefix.push_back(static_cast<token_t>(y));
        round(a * p[static_cast<std::size_t>(y)], code * v + y);
        prefix.pop_back();
      }
      return;
    }
    const auto q = draft.row(prefix);
    const auto t =
        detail::candidate_terms(rule, shape.depth(u), p, q, static_cast<index_t>(children.size()),
                                draw, {}, residual_floor);
    for (index_t y = 0; y < v; ++y) {
      const auto sy = static_cast<std::size_t>(y);
      prefix.push_back(static_cast<token_t>(y));
      for (std::size_t j = 0; j < children.size(); ++j)
        if (const double acc = a * t.accept[j][sy]; acc > 0.0)
          walk(children[j], cap, acc, code * v + y);  // child j drafted as y and accepted
      if (const double rej = a * t.reject[sy]; rej > 0.0)
        round(rej, code * v + y);  // every child rejected, then y from the residual
      prefix.pop_back();
    }
  };
  round = [&](double mass, index_t code) {
    if (!(mass > 0.0)) return;
    const auto remaining = horizon - static_cast<index_t>(prefix.size());
    if (remaining == 0) {
      law[static_cast<std::size_t>(code)] += mass;
      return;
    }
    walk(0, std::min(shape.max_depth(), remaining - 1), mass, code);
  };
  round(1.0, 0);
  return law;
}

/// Exact law of the whole draft-model speculative decoding loop (`speculative_decode` with
/// sampled drafts and a `tree_verifier` using `rule`) over the target's `horizon` tokens after
/// the BOS prompt: rounds of min(draft_length, remaining - 1) drafts, each verified left to
/// right with the rule at its draft position (the schedule restarts every round), ending with
/// the residual sample at the first rejection or the target's bonus token. Indexed like
/// toy_ar_model::sequence_index. With the exact rule this is the target's law.
template <class Rule>
std::vector<double> speculative_loop_law(const toy_ar_model& target, const toy_ar_model& draft,
                                         index_t draft_length, const Rule& rule,
                                         double residual_floor = default_residual_floor) {
  if (target.vocab_size() != draft.vocab_size() || draft.horizon() < target.horizon() ||
      draft_length < 0)
    throw std::invalid_argument(
        "specula::testing::speculative_loop_law: models need equal vocabularies, the draft a "
        "horizon >= the target's, and draft_length >= 0");
  // A chain of drafts is a tree of one child per node.
  return speculative_tree_loop_law(target, draft, trees::chain(draft_length),
                                   sibling_sampling::without_replacement, rule, residual_floor);
}

}  // namespace specula::testing
