#pragma once

/// @file
/// Chain verification of one request: the per-request algorithm every backend runs.
///
/// Given L drafted tokens x_1..x_L, their proposal rows q_1..q_L and L+1 target rows
/// p_1..p_{L+1}, verify left to right: accept x_i with the rule's acceptance probability; at the
/// first rejection emit a sample from the rule's residual at that position and stop; if all L
/// drafts are accepted emit a bonus token sampled from p_{L+1}. With the exact rule the emitted
/// sequence is distributed exactly as sampling from the target one token at a time.
///
/// This header has no loops over requests and no validation; the batch entry points in
/// specula/verify/chain.hpp validate inputs and call `verify_chain_request` per request.

#include <cstdint>
#include <type_traits>

#include "specula/core/config.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/rules/rule.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/sample/random_source.hpp"
#include "specula/sample/row_passes.hpp"

namespace specula {

/// Per-request result flags (bit mask).
enum chain_flags : std::uint32_t {
  /// The request produced an emitted token (always set unless a row had no mass at all, which
  /// checked entry points rule out).
  chain_valid = 1u << 0,
  /// All drafts were accepted and the emitted token is a bonus sampled from p_{L+1}.
  chain_bonus = 1u << 1,
  /// The residual at the rejected position had no mass up to rounding (<= residual_floor), so
  /// the emitted token was sampled from p at that position instead.
  chain_residual_fallback = 1u << 2,
  /// The request's inputs were invalid (reported by device entry points, which cannot throw):
  /// a drafted token outside [0, vocab) or -1 inside the draft, or a row too long for the
  /// kernel. Nothing was read out of bounds and no token was emitted.
  chain_invalid_input = 1u << 3,
};

/// Default mass below which a residual is treated as empty (rounding noise of float32 rows).
inline constexpr double default_residual_floor = 1e-6;

/// Proposal row given densely: q(y) = row[y].
template <class T>
struct dense_proposal {
  row_view<const T> row;
  SPECULA_HOST_DEVICE constexpr double operator()(index_t y) const noexcept {
    return static_cast<double>(row[y]);
  }
};

/// Deterministic (one-hot) proposal: q(y) = 1 if y is the drafted token, else 0. Under the exact
/// rule this accepts x with probability p(x) and on rejection samples p with x removed.
struct one_hot_proposal {
  token_t token = no_token;
  SPECULA_HOST_DEVICE constexpr double operator()(index_t y) const noexcept {
    return y == static_cast<index_t>(token) ? 1.0 : 0.0;
  }
};

/// Result of verifying one request's chain.
struct chain_request_result {
  std::int32_t num_accepted = 0;  ///< accepted drafts (0..L)
  token_t emitted = no_token;     ///< correction (on rejection) or bonus (all accepted) token
  std::uint32_t flags = 0;        ///< chain_flags
};

namespace detail {

/// The residual weights of a bound rule at one position: y -> rule.residual_weight_at(y, p(y),
/// q(y)). Named so that backends splitting the pass across several workers compute exactly
/// the weights the verifier samples from.
template <class BoundRule, class Row, class Proposal>
struct chain_residual {
  const BoundRule& rule;
  const Row& p;
  const Proposal& q;
  SPECULA_HOST_DEVICE double operator()(index_t y) const noexcept {
    return static_cast<double>(rule.residual_weight_at(y, static_cast<double>(p[y]), q(y)));
  }
  /// The exact rule's residual over float rows, max(p - q, 0), for the host's SIMD passes.
  [[nodiscard]] dense_f32_weights dense_f32() const noexcept requires(
      residual_is_positive_difference<BoundRule>&& std::is_same_v<Row, row_view<const float>> &&
      (std::is_same_v<Proposal, dense_proposal<float>> ||
       std::is_same_v<Proposal, one_hot_proposal>)) {
    if constexpr (std::is_same_v<Proposal, one_hot_proposal>)
      return {.p = p.data, .skip = &q.token, .num_skip = 1};
    else
      return {.p = p.data, .q = q.row.data};
  }
};

}  // namespace detail

/// Samples from a bound rule's residual at one position (see bind_rule), falling back to p when
/// the residual mass is <= residual_floor. Sets chain_residual_fallback in `flags` on fallback.
/// Returns -1 when p has no mass either. `passes` makes the row reductions (row_passes.hpp).
template <class BoundRule, random_source Source, class Row, class Proposal,
          class Passes = sequential_passes>
SPECULA_HOST_DEVICE index_t sample_residual(const BoundRule& rule, Source& src, const Row& p,
                                            const Proposal& q, double residual_floor, draw_id at,
                                            std::uint32_t& flags, const Passes& passes = {}) {
  const detail::chain_residual<BoundRule, Row, Proposal> residual{rule, p, q};
  typename Passes::summary_type summary;  // one pass: the mass and the tile sums the sample walks
  passes.summarize(p.size, residual, summary);
  const double mass = summary.total;
  if (mass > residual_floor && mass > 0.0) return src.categorical(p.size, residual, summary, at);
  flags |= chain_residual_fallback;
  const detail::row_weights<typename Row::value_type, Row> target{p};
  passes.summarize(p.size, target, summary);
  if (!(summary.total > 0.0)) return -1;
  return src.categorical(p.size, target, summary, at);
}

/// The draft positions of verify_chain_request (same arguments; `target_row(i)` is read for
/// i < length only). A draft of -1 (a placeholder: draft_placeholders::reject) is rejected at
/// its position without an acceptance draw, and the emitted token is sampled there from the
/// rule's residual (a one-hot proposal of -1 proposes nothing: the exact rule samples p). When
/// every draft is accepted it returns with chain_bonus set and no emitted token
/// (`out_tokens[length]` is -1): the caller then emits the bonus token — sampled from p_{L+1} by
/// verify_chain_request, or given (a bonus the engine sampled itself, as vLLM's bonus_token_ids).
template <class Rule, random_source Source, class TargetRowFn, class ProposalFn,
          class Passes = sequential_passes>
SPECULA_HOST_DEVICE chain_request_result
verify_chain_drafts(const Rule& rule, Source& src, index_t length, const token_t* drafts,
                    TargetRowFn&& target_row, ProposalFn&& proposal, double residual_floor,
                    token_t* out_tokens, std::uint8_t* accepted, const Passes& passes = {}) {
  chain_request_result result;
  for (index_t i = 0; i <= length; ++i) out_tokens[i] = no_token;
  if (accepted != nullptr)
    for (index_t i = 0; i < length; ++i) accepted[i] = 0;

  for (index_t i = 0; i < length; ++i) {
    const auto p = target_row(i);
    const auto q = proposal(i);
    const token_t x = drafts[i];
    const auto rule_i = bind_rule(rule_at(rule, i), p, x, passes);
    const auto pos = static_cast<std::uint32_t>(i);
    if (x >= 0) {  // q(x) and p(x) are read below (checking passes validate them first)
      if constexpr (requires { q.row; }) detail::check_pointwise(passes, q.row, x, true);
      detail::check_pointwise(passes, p, x, false);
    }
    // A placeholder (x < 0: no draft at this position, vLLM's -1) is rejected without a draw;
    // the token is then sampled from the residual with nothing proposed by a one-hot draft.
    if (x >= 0 && src.bernoulli(rule_i.accept_probability(static_cast<double>(p[x]), q(x)),
                                draw_id{pos, 0})) {
      out_tokens[i] = x;
      if (accepted != nullptr) accepted[i] = 1;
      result.num_accepted = static_cast<std::int32_t>(i + 1);
      continue;
    }
    const index_t y =
        sample_residual(rule_i, src, p, q, residual_floor, draw_id{pos, 1}, result.flags, passes);
    if (y >= 0) {
      result.emitted = static_cast<token_t>(y);
      result.flags |= chain_valid;
    }
    out_tokens[i] = result.emitted;
    return result;
  }
  result.flags |= chain_bonus;
  return result;
}

/// Verifies one request's chain (see file comment).
///
/// - `drafts[i]`, i < length: drafted tokens, each in [0, vocab) or -1 (a placeholder, rejected
///   at its position; scalar rules only), not checked here.
/// - `target_row(i)`, i <= length: row_view of p_{i+1}.
/// - `proposal(i)`, i < length: a callable y -> q_{i+1}(y) (dense_proposal or one_hot_proposal).
/// - `out_tokens`: length + 1 slots: the accepted drafts, then the emitted token, then -1.
/// - `accepted`: length flags (1 = accepted), or nullptr.
///
/// Random draws: position i uses slot 0 for its acceptance test and slot 1 for its residual or
/// bonus sample (draw_id{i, 0}, draw_id{i, 1}).
template <class Rule, random_source Source, class TargetRowFn, class ProposalFn,
          class Passes = sequential_passes>
SPECULA_HOST_DEVICE chain_request_result
verify_chain_request(const Rule& rule, Source& src, index_t length, const token_t* drafts,
                     TargetRowFn&& target_row, ProposalFn&& proposal, double residual_floor,
                     token_t* out_tokens, std::uint8_t* accepted, const Passes& passes = {}) {
  chain_request_result result = verify_chain_drafts(rule, src, length, drafts, target_row, proposal,
                                                    residual_floor, out_tokens, accepted, passes);
  if ((result.flags & chain_bonus) == 0) return result;

  const auto p = target_row(length);
  using row_type = std::remove_cvref_t<decltype(p)>;
  const detail::row_weights<typename row_type::value_type, row_type> target{p};
  typename Passes::summary_type summary;
  passes.summarize(p.size, target, summary);
  if (summary.total > 0.0) {
    const index_t y =
        src.categorical(p.size, target, summary, draw_id{static_cast<std::uint32_t>(length), 1});
    result.emitted = static_cast<token_t>(y);
    result.flags |= chain_valid;
  }
  out_tokens[length] = result.emitted;
  return result;
}

/// Greedy verification of one request's chain: drafts[i] is accepted iff it is the argmax of
/// score_row(i); emits the argmax of score_row(num_accepted) — or, when every draft is accepted
/// and `given_bonus` is a token (the caller's bonus, chain_batch_input::bonus_tokens), that
/// token without reading score_row(length).
template <class ScoreRowFn, class Passes = sequential_passes>
SPECULA_HOST_DEVICE chain_request_result greedy_chain_request(
    index_t length, const token_t* drafts, ScoreRowFn&& score_row, token_t* out_tokens,
    std::uint8_t* accepted, const Passes& passes = {}, token_t given_bonus = no_token) {
  chain_request_result result;
  for (index_t i = 0; i <= length; ++i) out_tokens[i] = no_token;
  if (accepted != nullptr)
    for (index_t i = 0; i < length; ++i) accepted[i] = 0;
  index_t i = 0;
  for (; i < length; ++i) {
    const index_t a = passes.argmax(score_row(i));
    if (a != static_cast<index_t>(drafts[i])) break;
    out_tokens[i] = drafts[i];
    if (accepted != nullptr) accepted[i] = 1;
  }
  result.num_accepted = static_cast<std::int32_t>(i);
  const index_t a =
      i == length && given_bonus != no_token ? given_bonus : passes.argmax(score_row(i));
  result.emitted = static_cast<token_t>(a);
  if (a >= 0) result.flags |= chain_valid;
  if (i == length) result.flags |= chain_bonus;
  out_tokens[i] = result.emitted;
  return result;
}

}  // namespace specula
