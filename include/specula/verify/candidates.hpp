#pragma once

/// @file
/// Verification of K candidates at one position (recursive rejection sampling).
///
/// Candidates c_1..c_K are verified in order. Step k uses the proposal q^(k) and the residual
/// target p^(k) (p^(1) = p): accept c_k with the rule's acceptance probability
/// f(p^(k)(c_k), q^(k)(c_k)); on rejection p^(k+1) = Norm(r(p^(k), q^(k))) with r the rule's
/// residual weight. If all K are rejected, the emitted token is sampled from p^(K+1). With the
/// exact rule the emitted token is distributed exactly as p (SJD-PAC Theorem 2 for candidates
/// drawn without replacement; SpecInfer for i.i.d. candidates; see docs/trees.md).
///
/// Proposals (how q^(k) is formed):
///   - `without_replacement<T>`: candidates drawn from q without replacement; q^(k) is q with
///     c_1..c_{k-1} removed and renormalised (SJD-PAC Eq. 7);
///   - `with_replacement<T>`: candidates drawn i.i.d. from q; q^(k) = q;
///   - `one_hot_candidates`: deterministic candidates (no q row); q^(k) is one-hot at c_k.
///
/// p^(k) is never materialised: p^(k)(x) is recomputed pointwise from p(x), q(x), whether x is
/// among the earlier candidates, and the normalisers Z_1..Z_{k-1} kept in a caller-provided
/// workspace. For the exact rule the recursion unrolls into a threshold on p/q
/// (threshold_candidate_form), so every pass costs the same few operations per element; other
/// rules recompute the k - 1 earlier steps per element. Each rejected candidate costs one pass
/// over the row (its normaliser Z_k); the final residual sample reuses Z_K and the tile sums of
/// that pass (weight_summary) and reads one tile. Without replacement, the first rejection costs
/// one more pass: the proposal row's own total, from which the mass q^(k) renormalises by is
/// derived (see without_replacement). Nothing is allocated.
///
/// Row-aware rules (rules/rule.hpp: LANTERN / LANTERN++, typical acceptance) take part too: step
/// k binds the rule to p^(k) and c_k as the chain verifier binds it to p and its draft, and the
/// residual of a rejected step is written to a workspace row, since a bound rule may read the
/// target anywhere (LANTERN's neighbour walk). With one candidate this is chain verification;
/// with more it is the same recursion with the rule's own residuals. The exact law of the
/// recursion is computed independently by specula/testing/relaxation_analysis.hpp.

#include <cstdint>
#include <type_traits>

#include "specula/core/config.hpp"
#include "specula/core/error.hpp"
#include "specula/core/numeric.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/core/validate.hpp"
#include "specula/rules/rule.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/sample/random_source.hpp"
#include "specula/sample/row_passes.hpp"
#include "specula/verify/chain_core.hpp"

namespace specula {

/// Candidates drawn from q without replacement: q^(k)(x) = q(x) / rest_k for x not among
/// c_1..c_{k-1}, 0 otherwise, where rest_k is the sum of q over the tokens not among
/// c_1..c_{k-1} (1 for k = 1). The core passes `renorm` = 1 / rest_k (0 once nothing is left),
/// computed once per step as the row's summed total minus the removed entries in double (or,
/// when that leaves less than 1e-9 of the total, by summing the remaining entries as the
/// drafter does), never as 1 - q(c_1) - ... - q(c_{k-1}): float rows do not sum to exactly 1,
/// and when the earlier candidates hold nearly all of q's mass that difference cancels
/// catastrophically (q = (1 - 1.39e-7, 1.39e-7) rounds to 0.99999988f, so 1 - q(c_1) = 1.19e-7
/// and q^(2)(c_2) = 1.16 instead of 1), and the verification is no longer exact.
template <class T>
struct without_replacement {
  row_view<const T> q;
  /// q^(k)(x). `earlier`: x is one of c_1..c_{k-1}; `current`: c_k; `renorm`: 1 / rest_k.
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr double prob(index_t x, bool earlier,
                                                          token_t /*current*/,
                                                          double renorm) const noexcept {
    return earlier ? 0.0 : detail::mul_rn(static_cast<double>(q[x]), renorm);
  }
  /// Mass a drawn candidate removes from the proposal.
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr double mass(index_t x) const noexcept {
    return static_cast<double>(q[x]);
  }
};

/// Candidates drawn i.i.d. from q: q^(k) = q.
template <class T>
struct with_replacement {
  row_view<const T> q;
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr double prob(index_t x, bool /*earlier*/,
                                                          token_t /*current*/,
                                                          double /*renorm*/) const noexcept {
    return static_cast<double>(q[x]);
  }
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr double mass(index_t /*x*/) const noexcept {
    return 0.0;
  }
};

/// Deterministic candidates (no proposal row): q^(k) is one-hot at c_k.
struct one_hot_candidates {
  /// q^(k)(x) = 0 for every x that is not a candidate (lets row passes skip the comparison).
  static constexpr bool zero_off_candidates = true;
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr double prob(index_t x, bool /*earlier*/,
                                                          token_t current,
                                                          double /*renorm*/) const noexcept {
    return x == static_cast<index_t>(current) ? 1.0 : 0.0;
  }
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr double mass(index_t /*x*/) const noexcept {
    return 0.0;
  }
};

/// Result of verifying the candidates at one position.
struct candidates_result {
  index_t accepted = -1;     ///< index (0-based) of the accepted candidate, or -1
  token_t token = no_token;  ///< the accepted candidate, or the residual sample
  std::uint32_t flags = 0;   ///< chain_valid, chain_residual_fallback
};

/// Doubles of workspace verify_candidates needs for `k` candidates with a scalar rule.
SPECULA_HOST_DEVICE constexpr index_t candidates_workspace_size(index_t k) noexcept {
  return 2 * k;
}

/// Doubles of workspace verify_candidates needs for `k` candidates over rows of `vocab` entries
/// with a rule of type `Rule` (the rule in force at the node: rule_at(rule, depth)): 2k for
/// scalar rules; a row-aware rule binds to each step's residual target p^(j), which is then held
/// as a row, so it needs two rows more when k >= 2.
template <class Rule>
constexpr index_t candidates_workspace_size(index_t k, index_t vocab) noexcept {
  if constexpr (acceptance_rule<Rule>) {
    (void)vocab;
    return 2 * k;
  } else {
    return 2 * k + (k >= 2 ? 2 * vocab : 0);
  }
}

namespace detail {

/// Whether the candidate recursion of `Rule` over rows of `T` with `Proposal` has the dense float
/// form of core/simd.hpp (the exact rule over float rows), so the host passes use SIMD kernels.
template <class Rule, class T, class Proposal>
inline constexpr bool dense_candidate_form =
    residual_is_positive_difference<Rule>&& std::is_same_v<T, float> &&
    (std::is_same_v<Proposal, without_replacement<float>> ||
     std::is_same_v<Proposal, with_replacement<float>> ||
     std::is_same_v<Proposal, one_hot_candidates>);

/// The proposal row of a dense candidate form (nullptr for one-hot candidates).
template <class Proposal>
[[nodiscard]] constexpr const float* dense_proposal_row(const Proposal& proposal) noexcept {
  if constexpr (std::is_same_v<Proposal, one_hot_candidates>) {
    (void)proposal;
    return nullptr;
  } else {
    return proposal.q.data;
  }
}

/// Lets checking passes validate p(c) and q(c) of the candidate c a step tests (see
/// check_pointwise) before the step reads them.
template <class Passes, class T, class Proposal>
SPECULA_HOST_DEVICE constexpr void check_candidate_entries(const Passes& passes,
                                                           row_view<const T> p,
                                                           const Proposal& proposal,
                                                           index_t c) noexcept {
  check_pointwise(passes, p, c, false);
  if constexpr (requires { proposal.q; }) check_pointwise(passes, proposal.q, c, true);
}

/// The proposal row's mass weights, proposal.mass(x).
template <class Proposal>
struct proposal_mass_weights {
  const Proposal& proposal;
  SPECULA_HOST_DEVICE constexpr double operator()(index_t x) const noexcept {
    return proposal.mass(x);
  }
  [[nodiscard]] dense_f32_weights dense_f32() const noexcept
      requires(std::is_same_v<Proposal, without_replacement<float>>) {
    return {.p = proposal.q.data};
  }
};

/// 1-based index of the first of cand[0 .. limit) equal to x, or limit + 1 if none. Branch-free
/// (a select per candidate), since it runs for every element of a pass.
SPECULA_HOST_DEVICE constexpr index_t first_candidate_index(const token_t* cand, index_t x,
                                                            index_t limit) noexcept {
  index_t first = limit + 1;
  for (index_t j = limit - 1; j >= 0; --j)
    first = static_cast<index_t>(cand[j]) == x ? j + 1 : first;
  return first;
}

/// The proposal mass left for q^(j) after the distinct earlier candidates are removed, as
/// `renorm` = 1 / rest_j (see without_replacement): the row's own total minus the removed
/// entries, in double (not 1 - removed mass: float rows do not sum to 1, and when the earlier
/// candidates hold nearly all of q that difference cancels catastrophically). Where even this
/// leaves little (1e-9 of the total), the remaining entries are summed directly.
template <class Proposal, class Passes>
struct proposal_mass_left {
  const Proposal& proposal;
  const Passes& passes;
  index_t n;
  double total = -1.0;        // the proposal row's summed mass (one pass, at the first removal)
  double removed_mass = 0.0;  // q(c_1) + ... over the distinct earlier candidates (each > 0)

  /// 1 / rest_j for candidate j (1-based) of cand.
  SPECULA_HOST_DEVICE double renorm(const token_t* cand, index_t j) {
    if (!(removed_mass > 0.0)) return 1.0;  // nothing removed yet
    if (total < 0.0) total = passes.mass(n, proposal_mass_weights<Proposal>{proposal});
    double rest = total - removed_mass;
    if (!(rest > 1e-9 * total))
      rest = passes.mass(n, [&](index_t x) {
        return first_candidate_index(cand, x, j - 1) <= j - 1 ? 0.0 : proposal.mass(x);
      });
    return rest > 0.0 ? 1.0 / rest : 0.0;
  }

  /// Candidate c (first occurrence: `repeated` false) was rejected: its mass leaves q.
  SPECULA_HOST_DEVICE void remove(index_t c, bool repeated) {
    if (repeated || !(proposal.mass(c) > 0.0)) return;  // a repeated candidate removes nothing
    removed_mass += proposal.mass(c);
  }
};

/// Pointwise residual targets p^(k)(x) for the candidate recursion.
template <class Rule, class T, class Proposal>
struct candidate_recursion {
  const Rule& rule;
  row_view<const T> p;
  const Proposal& proposal;
  const token_t* cand;
  const double* inv_z;   // inv_z[j]: 1 / Z_{j+1}, the normaliser of step j+1 (j < steps done)
  const double* renorm;  // renorm[j]: 1 / (q's mass left before step j+1)

  /// 1-based index of the first candidate equal to x, or limit + 1 if none among c_1..c_limit.
  SPECULA_HOST_DEVICE constexpr index_t first_index(index_t x, index_t limit) const noexcept {
    return first_candidate_index(cand, x, limit);
  }

  /// q^(k)(x) given first = first_index(x, ...).
  SPECULA_HOST_DEVICE constexpr double q_at(index_t k, index_t x, index_t first) const noexcept {
    return proposal.prob(x, first < k, cand[k - 1], renorm[k - 1]);
  }

  /// p^(k)(x) (k >= 1), with first = first_index(x, k - 1).
  SPECULA_HOST_DEVICE constexpr double p_at(index_t k, index_t x, index_t first) const noexcept {
    double v = static_cast<double>(p[x]);
    for (index_t j = 1; j < k; ++j)
      v = mul_rn(static_cast<double>(rule.residual_weight(v, q_at(j, x, first))), inv_z[j - 1]);
    return v;
  }

  /// Unnormalised residual r_k(x) = residual_weight(p^(k)(x), q^(k)(x)).
  SPECULA_HOST_DEVICE constexpr double residual(index_t k, index_t x) const noexcept {
    const index_t first = first_index(x, k);
    return static_cast<double>(rule.residual_weight(p_at(k, x, first), q_at(k, x, first)));
  }
};

/// Whether the candidate recursion of `Rule` with `Proposal` has the threshold form: the rule's
/// residual is the positive difference max(p - q, 0) and q^(j)(x) off the candidates is
/// q(x) * s_j (without replacement: s_j = 1 / rest_j; i.i.d.: s_j = 1) or 0 (one-hot). Then,
/// for every x that is not among c_1..c_k, unrolling the recursion gives
///   p^(j)(x) = P_j * max(p(x) - T_j * q(x), 0),  r_k(x) = P_k * max(p(x) - T_{k+1} * q(x), 0),
/// with P_1 = 1, T_1 = 0, T_{j+1} = T_j + s_j / P_j and P_{j+1} = P_j / Z_j (by induction: the
/// clamp commutes with the positive factor P_j, and max(max(u, 0) - v, 0) = max(u - v, 0) for
/// v >= 0). A pass of step k then costs the same few operations per element whatever k,
/// instead of k nested steps (docs/trees.md, "Cost of the recursion").
template <class Proposal>
inline constexpr int proposal_kind = 0;  // 1: without replacement, 2: i.i.d., 3: one-hot
template <class T>
inline constexpr int proposal_kind<without_replacement<T>> = 1;
template <class T>
inline constexpr int proposal_kind<with_replacement<T>> = 2;
template <>
inline constexpr int proposal_kind<one_hot_candidates> = 3;

template <class Rule, class Proposal>
inline constexpr bool threshold_candidate_form =
    residual_is_positive_difference<Rule>&& proposal_kind<Proposal> != 0;

/// The factor s_j of q(x) in q^(j)(x) off the candidates (see threshold_candidate_form); 0 when
/// q^(j) is zero there (one-hot candidates).
template <class Proposal>
[[nodiscard]] SPECULA_HOST_DEVICE constexpr double off_candidate_q_scale(double renorm) noexcept {
  if constexpr (proposal_kind<Proposal> == 1) return renorm;
  if constexpr (proposal_kind<Proposal> == 3) return 0.0;
  return 1.0;
}

/// Largest P_k the threshold form goes to. The recursion reaches step k with probability
/// E[1 / P_k] = 1 / P_k in the mean (each step's rejection probability is Z_j, so P_k over the
/// steps reached is a martingale of mean 1), so past 2^512 a step is treated as an exhausted
/// residual (chain_residual_fallback: the token is sampled from p^(k)), which moves the output
/// law by at most 2^-512, far below what the residual floor moves it. It keeps P_k, 1 / P_k and
/// the weights r_k / P_k finite and normal.
inline constexpr double threshold_form_max_scale = 0x1p512;

/// r_k as a weight function with a tile form.
///
/// With the threshold form (see threshold_candidate_form) the weights are r_k / P_k: for x not
/// among the candidates
///   max(max(p(x) - q(x) * s_1, 0) - q(x) * t_k, 0),  t_k = T_{k+1} - s_1 = sum_{j=2..k} s_j / P_j,
/// and r_k(x) / P_k through the nested recursion for the candidates; the step's normaliser is
/// Z_k = P_k * (their sum) (mass_scale()). The first subtraction is the one the nested recursion
/// makes at step 1 (exact for float rows whose exponents differ by at most 29) and the second
/// subtracts the remaining steps' mass at once, so the rounding is of the order of the nested
/// recursion's, whose step j rounds s_j * q(x) and the difference at scale P_j (docs/trees.md).
///
/// Other rules (the nested form) weigh r_k itself: the recursion runs step by step over a whole
/// tile (vectorisable inner loops) treating every element as a non-candidate, then the few
/// candidate elements in the tile are recomputed exactly. Non-candidates go through the same
/// operations as residual(k, x), so both forms agree bit for bit.
template <class Rule, class T, class Proposal>
struct candidate_residual {
  static constexpr bool threshold = threshold_candidate_form<Rule, Proposal>;
  const candidate_recursion<Rule, T, Proposal>& rec;
  index_t k;
  double scales[2] = {1.0, 0.0};  ///< s_1 and t_k (the threshold form)
  double unit = 1.0;              ///< the dense form's normaliser between its two steps
  double scale = 1.0;             ///< P_k with the threshold form, else 1
  double inv_scale = 1.0;         ///< 1 / scale

  /// Step k >= 1; needs rec.inv_z[0 .. k-1) and rec.renorm[0 .. k).
  SPECULA_HOST_DEVICE constexpr candidate_residual(const candidate_recursion<Rule, T, Proposal>& r,
                                                   index_t step) noexcept
      : rec(r), k(step) {
    if constexpr (threshold) {
      double p_scale = 1.0, t = 0.0;
      for (index_t j = 2; j <= k; ++j) {
        p_scale = mul_rn(p_scale, rec.inv_z[j - 2]);
        t += off_candidate_q_scale<Proposal>(rec.renorm[j - 1]) / p_scale;
      }
      scales[0] = off_candidate_q_scale<Proposal>(rec.renorm[0]);
      scales[1] = t;
      scale = p_scale;
      inv_scale = 1.0 / p_scale;
    }
  }

  /// False past threshold_form_max_scale: the caller treats the step as an exhausted residual.
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr bool usable() const noexcept {
    return !threshold || scale <= threshold_form_max_scale;
  }

  /// The factor from the sum of these weights to Z_k.
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr double mass_scale() const noexcept { return scale; }

  /// q^(j)(x) for an x that is not among the candidates.
  SPECULA_HOST_DEVICE constexpr double off_candidate_q(index_t x, token_t cj,
                                                       double renorm) const noexcept {
    if constexpr (requires { Proposal::zero_off_candidates; }) {
      (void)x;
      (void)cj;
      (void)renorm;
      return 0.0;
    } else {
      return rec.proposal.prob(x, false, cj, renorm);
    }
  }

  /// The threshold form's weight of an x that is not among the candidates, from p(x) and q(x)
  /// (q(x) unused for one-hot candidates).
  SPECULA_HOST_DEVICE constexpr double off_candidate_value(double px, double qx) const noexcept {
    if constexpr (requires { Proposal::zero_off_candidates; }) {
      (void)qx;
      return static_cast<double>(rec.rule.residual_weight(px, 0.0));
    } else {
      const auto first = static_cast<double>(rec.rule.residual_weight(px, mul_rn(qx, scales[0])));
      return static_cast<double>(rec.rule.residual_weight(first, mul_rn(qx, scales[1])));
    }
  }

  /// The threshold form's weight of an x that is not among the candidates.
  SPECULA_HOST_DEVICE constexpr double off_candidate_weight(index_t x) const noexcept {
    if constexpr (requires { Proposal::zero_off_candidates; })
      return off_candidate_value(static_cast<double>(rec.p[x]), 0.0);
    else
      return off_candidate_value(static_cast<double>(rec.p[x]),
                                 static_cast<double>(rec.proposal.q[x]));
  }

  /// Whether none of the candidates lies in [begin, end) (the threshold form's weights there are
  /// all off_candidate_weight).
  SPECULA_HOST_DEVICE constexpr bool no_candidate_in(index_t begin, index_t end) const noexcept {
    return !holds_index(rec.cand, k, begin, end);
  }

  SPECULA_HOST_DEVICE constexpr double operator()(index_t x) const noexcept {
    if constexpr (threshold) {
      if (rec.first_index(x, k) > k) return off_candidate_weight(x);
      return mul_rn(rec.residual(k, x), inv_scale);
    } else {
      return rec.residual(k, x);
    }
  }

  SPECULA_HOST_DEVICE constexpr void tile(index_t begin, index_t end, double* out) const noexcept {
    const index_t n = end - begin;
    if constexpr (threshold) {
      for (index_t i = 0; i < n; ++i) out[i] = off_candidate_weight(begin + i);
    } else {
      for (index_t i = 0; i < n; ++i) out[i] = static_cast<double>(rec.p[begin + i]);
      for (index_t j = 1; j < k; ++j) {
        const token_t cj = rec.cand[j - 1];
        const double renorm = rec.renorm[j - 1];
        const double inv_z = rec.inv_z[j - 1];
        for (index_t i = 0; i < n; ++i)
          out[i] = mul_rn(static_cast<double>(rec.rule.residual_weight(
                              out[i], off_candidate_q(begin + i, cj, renorm))),
                          inv_z);
      }
      const token_t ck = rec.cand[k - 1];
      const double renorm = rec.renorm[k - 1];
      for (index_t i = 0; i < n; ++i)
        out[i] = static_cast<double>(
            rec.rule.residual_weight(out[i], off_candidate_q(begin + i, ck, renorm)));
    }
    for (index_t j = 0; j < k; ++j) {
      const index_t c = rec.cand[j];
      if (c >= begin && c < end) out[c - begin] = (*this)(c);
    }
  }

  /// The dense form (core/simd.hpp), the candidates as skip indices: the threshold form as two
  /// steps (scales s_1 and t_k, normaliser 1 between them; max(p, 0) for one-hot candidates).
  [[nodiscard]] dense_f32_weights dense_f32() const noexcept
      requires(dense_candidate_form<Rule, T, Proposal>) {
    static_assert(threshold, "a dense form is the exact rule's, which has the threshold form");
    const float* q = dense_proposal_row(rec.proposal);
    return {.p = rec.p.data,
            .q = q,
            .scale = q != nullptr ? scales : nullptr,
            .inv_z = &unit,
            .steps = q != nullptr ? 2 : 1,
            .skip = rec.cand,
            .num_skip = k};
  }
};

/// The first step's residual when the proposal has a row: residual_weight(p(x), q^(1)(x)),
/// the same for every x (no candidate removed yet).
template <class Rule, class T, class Proposal>
struct first_candidate_residual {
  const Rule& rule;
  row_view<const T> p;
  const Proposal& proposal;
  token_t c1;
  const double* renorm;  // renorm[0]: 1 / q's mass (1 at the first step)
  /// The factor from the sum of these weights to Z_1 (they are r_1 itself).
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr double mass_scale() const noexcept { return 1.0; }
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr bool usable() const noexcept { return true; }
  SPECULA_HOST_DEVICE constexpr double operator()(index_t x) const noexcept {
    return static_cast<double>(
        rule.residual_weight(static_cast<double>(p[x]), proposal.prob(x, false, c1, renorm[0])));
  }
  [[nodiscard]] dense_f32_weights dense_f32() const noexcept
      requires(dense_candidate_form<Rule, T, Proposal>) {
    constexpr bool one_hot = std::is_same_v<Proposal, one_hot_candidates>;
    return {.p = p.data,
            .q = dense_proposal_row(proposal),
            .scale = std::is_same_v<Proposal, without_replacement<float>> ? renorm : nullptr,
            .skip = one_hot ? &c1 : nullptr,  // q^(1) is one at c1 only
            .num_skip = one_hot ? 1 : 0};
  }
};

/// No candidates (or none left): the token is sampled from p at slot 1.
template <random_source Source, class Row, class Passes>
SPECULA_HOST_DEVICE void sample_target_row(Source& src, const Row& p, std::uint32_t position,
                                           candidates_result& result, const Passes& passes) {
  const detail::row_weights<typename Row::value_type, Row> target{p};
  typename Passes::summary_type summary;
  passes.summarize(p.size, target, summary);
  if (summary.total > 0.0) {
    result.token =
        static_cast<token_t>(src.categorical(p.size, target, summary, draw_id{position, 1}));
    result.flags |= chain_valid;
  }
}

/// verify_candidates for a row-aware rule (rules/rule.hpp: LANTERN++, typical acceptance). Step
/// j binds the rule to the residual target p^(j) and c_j, exactly as the chain verifier binds it
/// to p and its draft: accept with bound.accept_probability(p^(j)(c_j), q^(j)(c_j)); after a
/// rejection p^(j+1) = Norm(bound.residual_weight_at(y, p^(j)(y), q^(j)(y))). A bound rule may
/// read p^(j) anywhere (LANTERN's neighbour walk), so p^(j+1) is written to a row of the
/// workspace (two rows after the 2k doubles, used in turn) instead of being recomputed
/// pointwise. The last step samples the residual as verify_chain does (sample_residual), so one
/// candidate verifies exactly like a chain position. Host passes only (the row writes are a
/// plain loop).
template <class Rule, random_source Source, class T, class Proposal, class Passes>
SPECULA_HOST_DEVICE candidates_result verify_candidates_bound(
    const Rule& rule, Source& src, row_view<const T> p, const Proposal& proposal,
    const token_t* cand, index_t k, double residual_floor, std::uint32_t position,
    double* workspace, const Passes& passes) {
  static_assert(chain_rule<Rule>, "a candidate rule is scalar or row-aware (rules/rule.hpp)");
  candidates_result result;
  const index_t n = p.size;
  double* renorm = workspace + k;
  double* rows[2] = {workspace + 2 * k, workspace + 2 * k + n};
  proposal_mass_left<Proposal, Passes> left{proposal, passes, n};
  for (index_t j = 1; j <= k; ++j) {
    renorm[j - 1] = left.renorm(cand, j);
    const index_t c = cand[j - 1];
    check_candidate_entries(passes, p, proposal, c);
    const index_t first = first_candidate_index(cand, c, j - 1);
    // q^(j)(x): x among c_1..c_{j-1} is `earlier`.
    const auto q_at = [&, j](index_t x) {
      return proposal.prob(x, first_candidate_index(cand, x, j - 1) < j, cand[j - 1],
                           renorm[j - 1]);
    };
    // One step against the current target `cur` (p, then a workspace row); true when done.
    const auto step = [&](const auto& cur) -> bool {
      const auto bound = bind_rule(rule, cur, static_cast<token_t>(c));
      const double a = bound.accept_probability(static_cast<double>(cur[c]), q_at(c));
      if (src.bernoulli(a, draw_id{position, static_cast<std::uint32_t>(2 * (j - 1))})) {
        result.accepted = j - 1;
        result.token = static_cast<token_t>(c);
        result.flags |= chain_valid;
        return true;
      }
      if (j == k) {  // the last rejection: sample the residual (or p^(k) on fallback)
        const index_t y = sample_residual(bound, src, cur, q_at, residual_floor,
                                          draw_id{position, 1}, result.flags, passes);
        if (y >= 0) {
          result.token = static_cast<token_t>(y);
          result.flags |= chain_valid;
        }
        return true;
      }
      double* next = rows[(j - 1) % 2];
      for (index_t y = 0; y < n; ++y)
        next[y] =
            static_cast<double>(bound.residual_weight_at(y, static_cast<double>(cur[y]), q_at(y)));
      const row_view<const double> next_row(next, n);
      // The normaliser as the scalar recursion computes it (the same summation).
      typename Passes::summary_type summary;
      passes.summarize(n, row_weights<double>{next_row}, summary);
      const double mass = summary.total;
      if (!(mass > residual_floor && mass > 0.0)) {  // empty residual: sample from p^(j)
        result.flags |= chain_residual_fallback;
        sample_target_row(src, cur, position, result, passes);
        return true;
      }
      const double inv_z = 1.0 / mass;
      for (index_t y = 0; y < n; ++y) next[y] = mul_rn(next[y], inv_z);
      return false;
    };
    const bool done = j == 1 ? step(p) : step(row_view<const double>(rows[(j - 2) % 2], n));
    if (done) return result;
    left.remove(c, first <= j - 1);
  }
  sample_target_row(src, p, position, result, passes);  // k == 0
  return result;
}

}  // namespace detail

/// Verifies candidates cand[0..k) at one position against target row p (see file comment).
/// Draws: candidate j's acceptance test at draw_id{position, 2j}; the residual sample at
/// draw_id{position, 1} (so k = 1 draws exactly like chain verification). `workspace` needs
/// candidates_workspace_size<Rule>(k, p.size) doubles (2k for a scalar rule). A residual with mass
/// <= residual_floor after a rejection stops the recursion: the token is then sampled from the
/// current target p^(j) and chain_residual_fallback is set.
template <class Rule, random_source Source, class T, class Proposal,
          class Passes = sequential_passes>
SPECULA_HOST_DEVICE candidates_result
verify_candidates(const Rule& rule, Source& src, row_view<const T> p, const Proposal& proposal,
                  const token_t* cand, index_t k, double residual_floor, std::uint32_t position,
                  double* workspace, const Passes& passes = {}) {
  if constexpr (!acceptance_rule<Rule>) {
    return detail::verify_candidates_bound(rule, src, p, proposal, cand, k, residual_floor,
                                           position, workspace, passes);
  } else {
    candidates_result result;
    double* inv_z = workspace;
    double* renorm = workspace + k;
    const detail::candidate_recursion<Rule, T, Proposal> rec{rule, p,     proposal,
                                                             cand, inv_z, renorm};
    const index_t n = p.size;
    detail::proposal_mass_left<Proposal, Passes> left{proposal, passes, n};
    typename Passes::summary_type summary;  // reused by every step: the normaliser pass records
                                            // tile sums
    const bool writer = detail::workspace_leader(passes);  // see row_passes.hpp
    for (index_t j = 1; j <= k; ++j) {
      const double renorm_j = left.renorm(cand, j);
      if (writer) renorm[j - 1] = renorm_j;
      detail::workspace_barrier(passes);
      const index_t c = cand[j - 1];
      detail::check_candidate_entries(passes, p, proposal, c);
      const index_t first = rec.first_index(c, j - 1);
      const double pk = rec.p_at(j, c, first);
      const double qk = rec.q_at(j, c, first);
      const auto draw_slot = static_cast<std::uint32_t>(2 * (j - 1));
      if (src.bernoulli(static_cast<double>(rule.accept_probability(pk, qk)),
                        draw_id{position, draw_slot})) {
        result.accepted = j - 1;
        result.token = static_cast<token_t>(c);
        result.flags |= chain_valid;
        return result;
      }
      // One pass for the normaliser of this step's residual; returns true when the call is done
      // (fallback, or the last candidate was rejected and the residual sample was drawn).
      auto finish_step = [&](auto&& r) -> bool {
        double mass = 0.0;  // Z_j (the weights are r_j / P_j in the threshold form)
        if (r.usable()) {
          passes.summarize(n, r, summary);
          mass = detail::mul_rn(r.mass_scale(), summary.total);
        }
        // A mass below the smallest normal double counts as empty too: 1 / Z_j, which the later
        // steps multiply by, would overflow (reachable with a residual floor of 0 only).
        if (!(mass > residual_floor && mass >= 0x1p-1022)) {
          // Empty residual (or past threshold_form_max_scale): sample from the current target.
          result.flags |= chain_residual_fallback;
          auto target = [&](index_t x) {
            return detail::positive_part(rec.p_at(j, x, rec.first_index(x, j - 1)));
          };
          passes.summarize(n, target, summary);
          if (summary.total > 0.0) {
            result.token =
                static_cast<token_t>(src.categorical(n, target, summary, draw_id{position, 1}));
            result.flags |= chain_valid;
          }
          return true;
        }
        if (writer) inv_z[j - 1] = 1.0 / mass;
        detail::workspace_barrier(passes);
        if (j < k) return false;
        // All rejected: sample from p^(k+1) = r_k / Z_k, reusing the normaliser just computed.
        result.token = static_cast<token_t>(src.categorical(n, r, summary, draw_id{position, 1}));
        if (result.token >= 0) result.flags |= chain_valid;
        return true;
      };
      bool done = false;
      // First step on the host: p^(1) = p and no earlier candidates, a simple loop the compiler
      // vectorises. The device takes candidate_residual at every step (the same weights: with
      // j = 1 it is residual_weight(p(x), q^(1)(x))), so a kernel inlines one copy of the
      // step's passes and samples instead of two.
      if constexpr (!SPECULA_IS_DEVICE_CODE && !requires { Proposal::zero_off_candidates; }) {
        if (j == 1)
          done = finish_step(detail::first_candidate_residual<Rule, T, Proposal>{rule, p, proposal,
                                                                                 cand[0], renorm});
        else
          done = finish_step(detail::candidate_residual<Rule, T, Proposal>{rec, j});
      } else {
        done = finish_step(detail::candidate_residual<Rule, T, Proposal>{rec, j});
      }
      if (done) return result;
      left.remove(c, first <= j - 1);
    }
    detail::sample_target_row(src, p, position, result, passes);  // k == 0: sample from p
    return result;
  }
}

/// Options of verify_candidates_checked.
struct candidates_options {
  double sum_tolerance = default_sum_tolerance;    ///< |sum - 1| allowed in p and q
  double residual_floor = default_residual_floor;  ///< as in verify_candidates
  /// check_level::reads (default): p and q are checked as the verification reads them: in full
  /// after a rejection, p(c) and q(c) of each candidate it tests; full: p(c), q(c) of every
  /// candidate and both rows first.
  check_level check = check_level::reads;
};

/// Checked verify_candidates (host): validates the candidates (each in [0, vocab), distinct when
/// drawn without replacement) and the workspace size (candidates_workspace_size<Rule>(k, V)),
/// then, at the chosen check level, p(c) and q(c) of the candidates (finite, non-negative, q(c) >
/// 0 when the proposal has a row) and the rows, and verifies. Throws invalid_input naming the
/// argument ("p", "q", "candidates", "workspace") and index; the result is unspecified when it
/// throws.
template <class Rule, class T, class Proposal>
candidates_result verify_candidates_checked(const Rule& rule, const request_rng& rng,
                                            row_view<const T> p, const Proposal& proposal,
                                            row_view<const token_t> candidates,
                                            row_view<double> workspace, std::uint32_t position,
                                            const candidates_options& options = {}) {
  validate_sum_tolerance(options.sum_tolerance, "options.sum_tolerance");
  require_parameter(options.residual_floor >= 0.0, "options.residual_floor", options.residual_floor,
                    "must be >= 0");
  const index_t vocab = p.size;
  if (vocab <= 0 || p.data == nullptr)
    throw_if_failed({status::empty_input, -1, -1, static_cast<double>(vocab)}, "p",
                    "needs a non-empty row");
  detail::validate_rule(rule, vocab, 1);
  constexpr bool has_row = !std::is_same_v<Proposal, one_hot_candidates>;
  row_view<const T> q{};
  if constexpr (has_row) {
    q = proposal.q;
    detail::require_size(q.size, vocab, "q", "length must equal the length of p");
    if (q.data == nullptr) throw_if_failed({status::empty_input, -1, -1, 0.0}, "q", "null data");
  }
  const index_t k = candidates.size;
  if (workspace.size < candidates_workspace_size<Rule>(k, vocab) ||
      (k > 0 && workspace.data == nullptr))
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(workspace.size)},
                    "workspace",
                    acceptance_rule<Rule>
                        ? "needs candidates_workspace_size(k) = 2k doubles"
                        : "needs candidates_workspace_size<Rule>(k, vocab) = 2k + 2 vocab doubles "
                          "(a row-aware rule with k >= 2)");
  for (index_t j = 0; j < k; ++j) {
    const token_t c = candidates[j];
    if (c < 0 || static_cast<index_t>(c) >= vocab)
      throw_if_failed({status::token_out_of_range, j, -1, static_cast<double>(c)}, "candidates",
                      ("must be in [0, " + std::to_string(vocab) + ")").c_str());
    if constexpr (std::is_same_v<Proposal, without_replacement<T>>)
      for (index_t i = 0; i < j; ++i)
        if (candidates[i] == c)
          throw_if_failed({status::invalid_parameter, j, -1, static_cast<double>(c)}, "candidates",
                          "candidates drawn without replacement must be distinct");
  }
  constexpr bool reads = detail::residual_is_positive_difference<Rule> && std::is_same_v<T, float>;
  const bool scan = options.check == check_level::full || !reads;
  if (scan) {
    // At check_level::reads the recursion checks p(c) and q(c) of each candidate it tests.
    for (index_t j = 0; j < k; ++j) {
      const token_t c = candidates[j];
      detail::check_entry(static_cast<double>(p[c]), "p", -1, c);
      if constexpr (has_row) {
        const auto qc = static_cast<double>(q[c]);
        detail::check_entry(qc, "q", -1, c);
        if (!(qc > 0.0))
          throw_if_failed({status::zero_draft_probability, -1, c, qc}, "q",
                          "a candidate must have positive proposal probability");
      }
    }
    throw_if_failed(check_probability_row(p, options.sum_tolerance), "p");
    if constexpr (has_row) throw_if_failed(check_probability_row(q, options.sum_tolerance), "q");
  }
  philox_source src{rng};
  if constexpr (reads) {
    if (!scan) {
      row_read_log log;
      log.sum_tolerance = options.sum_tolerance;
      const auto r =
          verify_candidates(rule, src, p, proposal, candidates.data, k, options.residual_floor,
                            position, workspace.data, checking_passes{&log});
      if (log.failed_row != nullptr)
        throw_if_failed(log.failure,
                        log.failed_row == p.data && !log.failed_in_proposal ? "p" : "q",
                        log.failure.code == status::zero_draft_probability
                            ? "a candidate must have positive proposal probability"
                            : "");
      return r;
    }
  }
  return verify_candidates(rule, src, p, proposal, candidates.data, k, options.residual_floor,
                           position, workspace.data);
}

}  // namespace specula
