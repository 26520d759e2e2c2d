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
#include "specula/verify/chain_core.hpp"

namespace specula::testing {

/// Results of relaxation_accounting.
struct relaxation_report {
  double expected_tokens = 0.0;     ///< E[τ + 1] (Eq. 7)
  double tv_bound = 0.0;            ///< right-hand side of Eq. 8
  double tv_exact = 0.0;            ///< TV(P̂, P) over the first L + 1 tokens
  std::vector<double> relaxed_law;  ///< P̂ over X^{L+1}, indexed base-V (first token first)
  std::vector<double> target_law;   ///< P over X^{L+1}
};

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

}  // namespace detail

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
  const index_t v = target.vocab_size();
  const index_t horizon = target.horizon();
  std::vector<double> law(static_cast<std::size_t>(target.num_sequences()), 0.0);
  std::vector<token_t> prefix;
  std::function<void(double, index_t)> round;
  // walk: inside a round whose first `i` drafts were all accepted (mass a).
  std::function<void(index_t, index_t, double, index_t)> walk = [&](index_t i, index_t gamma,
                                                                    double a, index_t code) {
    const auto p = target.row(prefix);
    if (i == gamma) {  // every draft accepted: the bonus token from the target row
      for (index_t y = 0; y < v; ++y) {
        prefix.push_back(static_cast<token_t>(y));
        round(a * p[static_cast<std::size_t>(y)], code * v + y);
        prefix.pop_back();
      }
      return;
    }
    const auto q = draft.row(prefix);
    const auto t = detail::terms_at(rule, i, p, q, residual_floor);
    for (index_t y = 0; y < v; ++y) {
      const auto sy = static_cast<std::size_t>(y);
      prefix.push_back(static_cast<token_t>(y));
      if (const double acc = a * q[sy] * t.accept[sy]; acc > 0.0)
        walk(i + 1, gamma, acc, code * v + y);  // y drafted and accepted
      if (const double rej = a * t.reject[sy]; rej > 0.0)
        round(rej, code * v + y);  // a rejection, then y from the residual
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
    walk(0, std::min(draft_length, remaining - 1), mass, code);
  };
  round(1.0, 0);
  return law;
}

}  // namespace specula::testing
