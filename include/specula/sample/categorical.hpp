#pragma once

/// @file
/// Sampling one category from an unnormalised, non-negative weight row.
///
/// Weights are given as a callable `w(i) -> double` over [0, n), so a residual such as
/// [p - q]+ is sampled without ever being materialised or normalised.

#include <cmath>

#include "specula/core/config.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"

namespace specula {

/// Inverse-CDF sampling with one uniform u in (0, 1): returns the first index i with
/// w(0) + ... + w(i) > u * total (partial sums in double). Indices with w(i) <= 0 are never
/// returned. If rounding leaves u * total at or beyond the accumulated sum, the last index with
/// positive weight is returned. Returns -1 when no weight is positive.
///
/// `total` must be the sum of the positive weights (computed by the caller, usually in the pass
/// that decides whether the row has any mass). The scan stops at the sampled index.
template <class WeightFn>
SPECULA_HOST_DEVICE constexpr index_t sample_inverse_cdf(index_t n, WeightFn&& w, double total,
                                                         double u) noexcept {
  const double target = u * total;
  double acc = 0.0;
  index_t last_positive = -1;
  for (index_t i = 0; i < n; ++i) {
    const double wi = w(i);
    if (wi > 0.0) {
      acc += wi;
      last_positive = i;
      if (target < acc) return i;
    }
  }
  return last_positive;
}

/// Sum of the positive weights of `w` over [0, n), in double.
template <class WeightFn>
SPECULA_HOST_DEVICE constexpr double positive_mass(index_t n, WeightFn&& w) noexcept {
  double total = 0.0;
  for (index_t i = 0; i < n; ++i) {
    const double wi = w(i);
    if (wi > 0.0) total += wi;
  }
  return total;
}

/// Inverse-CDF sampling from a row of non-negative weights (two passes: sum, then scan).
template <class T>
SPECULA_HOST_DEVICE constexpr index_t sample_inverse_cdf(row_view<const T> weights,
                                                         double u) noexcept {
  auto w = [weights](index_t i) { return static_cast<double>(weights[i]); };
  return sample_inverse_cdf(weights.size, w, positive_mass(weights.size, w), u);
}

/// Exponential race: returns argmax_i w(i) / E_i with E_i ~ Exp(1) independent, which selects i
/// with probability w(i) / sum(w). One pass, no normalisation and no prefix sum; one Philox call
/// per four categories, drawn from the per-category slots of `rng` at `position` (see
/// core/rng.hpp). Ties resolve to the smaller index. Returns -1 when no weight is positive.
template <class WeightFn>
SPECULA_HOST_DEVICE index_t sample_exponential_race(index_t n, WeightFn&& w,
                                                    const request_rng& rng,
                                                    std::uint32_t position) noexcept {
  index_t best = -1;
  double best_score = 0.0;
  for (index_t block = 0; block * 4 < n; ++block) {
    const u32x4 bits = random_bits(
        rng, draw_id{position, category_slot_base + static_cast<std::uint32_t>(block)});
    for (int j = 0; j < 4; ++j) {
      const index_t i = block * 4 + j;
      if (i >= n) break;
      const double wi = w(i);
      if (!(wi > 0.0)) continue;
      // 32-bit uniform in (0, 1); E = -log(u) > 0.
      const double u = (static_cast<double>(bits.v[j]) + 0.5) * 0x1p-32;
      const double score = wi / -std::log(u);
      if (score > best_score) {
        best_score = score;
        best = i;
      }
    }
  }
  return best;
}

}  // namespace specula
