#pragma once

/// @file
/// The row draws of SJD-style drafting, host and device (SPECULA_HOST_DEVICE): a sample from a
/// probability row, Adaptive Continuation's keep-or-resample draw, the children of one node
/// of SJD / SJD-PAC's next draft (and of a position of multi-block's stochastic window), and the
/// window's rows set without a draw. The host loops (decode/sjd.hpp, decode/multiblock.hpp) draw
/// with them, and so does the example transformer's resident SJD on the GPU
/// (examples/transformer/cuda), so the two make the same draws from the same rows.

#include <cstdint>

#include "specula/core/config.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/types.hpp"
#include "specula/rules/exact.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/sample/random_source.hpp"

namespace specula::detail {

/// A sample from the probability row R[0 .. V) with the uniform u.
SPECULA_HOST_DEVICE inline token_t sample_row(const float* R, index_t V, double u) {
  const auto w = [R](index_t y) { return static_cast<double>(R[y]); };
  return static_cast<token_t>(sample_inverse_cdf(V, w, positive_mass(V, w), u));
}

/// Adaptive Continuation's draw (SJD-PAC §4.2): keeps `old`, drawn from q_old, with probability
/// min(1, R/q_old), else samples max(R − q_old, 0) (R itself when that has no mass); by the
/// rejection lemma the result has law R. Draws: `keep_at` (Bernoulli), `resample_at`.
SPECULA_HOST_DEVICE inline token_t adaptive_continuation_draw(const float* R, const float* q_old,
                                                              index_t V, token_t old,
                                                              const request_rng& rng,
                                                              draw_id keep_at,
                                                              draw_id resample_at) {
  const exact_rule rule{};
  if (philox_source{rng}.bernoulli(rule.accept_probability(R[old], q_old[old]), keep_at))
    return old;
  const auto w = [&](index_t y) { return rule.residual_weight(R[y], q_old[y]); };
  const double mass = positive_mass(V, w);
  const double u = uniform_at(rng, resample_at);
  return mass > 0.0 ? static_cast<token_t>(sample_inverse_cdf(V, w, mass, u)) : sample_row(R, V, u);
}

/// What one node of SJD / SJD-PAC's next draft draws (sjd_draw_children): `kids` children from
/// the stale target row R of the old draft's node `row`; the node's q row becomes R.
struct sjd_children_job {
  index_t row = 0;     ///< the old draft's node whose target row is R
  index_t parent = 0;  ///< the next draft's node that receives the children
  index_t kids = 0;    ///< children wanted (>= 1)
  /// Adaptive Continuation for the first child: the old draft's node whose q row the old token
  /// `ac_old` was drawn from (-1: no AC, the first child is a plain draw from R).
  index_t ac_from = -1;
  token_t ac_old = no_token;
  /// sjd_fault::residual_siblings only: the old draft's node whose q row's residual the
  /// siblings are drawn from (-1: none, the lossless draw).
  index_t residual_from = -1;
  /// Draw ids: {depth, slot} and {depth, slot + 1} for AC, {depth, slot + 2 + c} for child c.
  std::uint32_t depth = 0;
  std::uint32_t slot = 0;
};

/// The children of one job: child 0 by AC (when q_ac is given) or drawn from R, then draws from
/// R without the tokens already chosen (without replacement) — or, with `q_residual` (a fault
/// kept for measuring the SJD-PAC authors' code), from max(R - q_residual, 0) while it has mass.
/// Writes them to out[0 ..) and returns how many: fewer than job.kids when R has fewer positive
/// tokens. R, q_ac, q_residual: rows of V floats.
SPECULA_HOST_DEVICE inline index_t sjd_draw_children(const sjd_children_job& job, const float* R,
                                                     const float* q_ac, const float* q_residual,
                                                     index_t V, const request_rng& rng,
                                                     token_t* out) {
  index_t got = 0;
  for (index_t c = 0; c < job.kids; ++c) {
    token_t x = no_token;
    if (c == 0 && q_ac != nullptr) {
      x = adaptive_continuation_draw(R, q_ac, V, job.ac_old, rng, draw_id{job.depth, job.slot},
                                     draw_id{job.depth, job.slot + 1});
    } else {
      const float* q_old = q_residual;
      const auto w = [&](index_t y) {
        for (index_t j = 0; j < got; ++j)
          if (out[j] == y) return 0.0;
        const double r = R[y];
        if (q_old == nullptr) return r;
        const double d = r - static_cast<double>(q_old[y]);
        return d < 0.0 ? 0.0 : d;
      };
      double mass = positive_mass(V, w);
      if (q_old != nullptr && !(mass > 0.0)) {
        q_old = nullptr;
        mass = positive_mass(V, w);
      }
      if (!(mass > 0.0)) break;  // the row has fewer than `kids` tokens
      x = static_cast<token_t>(sample_inverse_cdf(
          V, w, mass,
          uniform_at(rng, draw_id{job.depth, job.slot + 2 + static_cast<std::uint32_t>(c)})));
    }
    out[got++] = x;
  }
  return got;
}

/// One q row of multi-block decoding's stochastic window set without a draw
/// (decode/multiblock.hpp): a copy of the current window's row `from` (from >= 0), the context law
/// (`from == context_law`: the token frequencies of the first `end` tokens of the sequence), else
/// `value` on [begin, end) and 0 elsewhere (a one-hot or a uniform row).
struct window_row {
  static constexpr std::int32_t context_law = -2;
  std::int32_t at = 0;  ///< the row written
  std::int32_t from = -1;
  std::int32_t begin = 0;
  std::int32_t end = 0;
  float value = 0.0f;
};

/// Entry y of the row `r` sets: `current` holds the current window's rows, `context_counts` the
/// token counts of the sequence's first r.end tokens (read by a context-law row only).
SPECULA_HOST_DEVICE inline float window_row_entry(const window_row& r, const float* current,
                                                  const std::int32_t* context_counts, index_t V,
                                                  index_t y) {
  if (r.from >= 0) return current[static_cast<index_t>(r.from) * V + y];
  if (r.from == window_row::context_law)
    return static_cast<float>(static_cast<double>(context_counts[y]) / static_cast<double>(r.end));
  return y >= r.begin && y < r.end ? r.value : 0.0f;
}

}  // namespace specula::detail
