#pragma once

/// @file
/// The sort-based definitions of the sampling transforms, kept as the specification the
/// selection-based library code (sample/transforms.hpp) is tested against bit for bit, and as
/// the "before" of its benchmarks. This is the host pipeline as it was before selection: each
/// step in place on one float row, top-k by nth_element on a copy, top-p by sorting a copy.
/// Slow (top-p sorts the whole row); not for production. Needs no Boost.

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <vector>

#include "specula/core/exp.hpp"
#include "specula/sample/transforms.hpp"

namespace specula::testing {

/// Sets the logits below the k-th largest (nth_element on a copy) to -Inf.
inline void reference_top_k(std::span<float> logits, index_t k, std::span<float> scratch) {
  if (static_cast<std::size_t>(k) >= logits.size()) return;
  const std::size_t n = logits.size();
  float* s = scratch.data();
  for (std::size_t i = 0; i < n; ++i) s[i] = logits[i];
  std::nth_element(s, s + (k - 1), s + n, std::greater<float>());
  const float threshold = s[k - 1];
  for (float& v : logits)
    if (v < threshold) v = -std::numeric_limits<float>::infinity();
}

/// Softmax: max subtracted, e = exp_f32(x - max) in float (core/exp.hpp: specula's exp, the same
/// bits on every instruction set); the sum S in the fixed order of the row passes: tiles of 256
/// entries, entry j of a tile added in float to lane j mod 16, lanes k and k + 8 added in double,
/// those eight combined pairwise, tile sums added left to right in double; then each
/// probability is the float product e * float(1 / S). Throws std::domain_error for NaN or +Inf
/// logits or a row of -Inf only.
inline void reference_softmax(std::span<const float> logits, std::span<float> probs) {
  float m = -std::numeric_limits<float>::infinity();
  for (const float v : logits) {
    if (v != v || v == std::numeric_limits<float>::infinity())
      throw std::domain_error("reference_softmax: NaN or +inf logit");
    m = std::max(m, v);
  }
  if (m == -std::numeric_limits<float>::infinity())
    throw std::domain_error("reference_softmax: every logit is -inf");
  double sum = 0.0;
  for (std::size_t t = 0; t < logits.size(); t += 256) {
    float lane[16] = {};
    for (std::size_t i = t; i < logits.size() && i < t + 256; ++i) {
      // exp_rounded: no compiler may fuse the exp's last product into the addition.
      const float e = specula::detail::exp_rounded(specula::detail::exp_f32(logits[i] - m));
      probs[i] = e;
      lane[(i - t) % 16] += e;
    }
    double d[8];
    for (int k = 0; k < 8; ++k)
      d[k] = static_cast<double>(lane[k]) + static_cast<double>(lane[k + 8]);
    sum += ((d[0] + d[1]) + (d[2] + d[3])) + ((d[4] + d[5]) + (d[6] + d[7]));
  }
  const auto inv = static_cast<float>(1.0 / sum);
  for (float& v : probs) v = v * inv;
}

/// The top-p threshold by the definition: sort descending, total = the descending double sum,
/// the first value at which the running descending sum reaches top_p * total.
inline float reference_top_p_threshold(std::span<const float> probs, float top_p,
                                       std::span<float> scratch) {
  auto s = scratch.first(probs.size());
  std::copy(probs.begin(), probs.end(), s.begin());
  std::sort(s.begin(), s.end(), std::greater<float>());
  double total = 0.0;
  for (const float v : s) total += v;
  const double target = static_cast<double>(top_p) * total;
  double acc = 0.0;
  float threshold = s.empty() ? 0.0f : s.back();
  for (const float v : s) {
    acc += v;
    if (acc >= target) {
      threshold = v;
      break;
    }
  }
  return threshold;
}

/// Zeroes the probabilities below `threshold` and renormalises (sum in double, index order).
inline void reference_keep_at_least(std::span<float> probs, float threshold) {
  for (float& v : probs)
    if (v < threshold) v = 0.0f;
  double sum = 0.0;
  for (const float v : probs) sum += v;
  if (!(sum > 0.0)) return;
  const double inv = 1.0 / sum;
  for (float& v : probs) v = static_cast<float>(v * inv);
}

/// The pipeline: CFG (when `uncond` is non-empty) -> temperature -> top-k -> softmax -> top-p
/// -> min-p, with `logits` as working storage (modified) and `scratch` of logits.size().
/// Parameters are assumed valid.
inline void reference_logits_to_probs(const sampling_params& params, std::span<float> logits,
                                      std::span<const float> uncond, std::span<float> probs,
                                      std::span<float> scratch) {
  if (!uncond.empty()) {
    const cfg_mix_op mix{params.cfg_scale};
    for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = mix(logits[i], uncond[i]);
  }
  if (params.temperature != 1.0f) {
    const temperature_op op{1.0f / params.temperature};
    for (float& v : logits) v = op(v);
  }
  if (params.top_k > 0) reference_top_k(logits, params.top_k, scratch);
  reference_softmax(logits, probs);
  if (params.top_p < 1.0f)
    reference_keep_at_least(probs, reference_top_p_threshold(probs, params.top_p, scratch));
  if (params.min_p > 0.0f && !probs.empty())
    reference_keep_at_least(probs, params.min_p * *std::max_element(probs.begin(), probs.end()));
}

/// w / sum(w) in double: the law of non-negative weights, normalised by hand.
inline std::vector<double> normalised_law(const std::vector<float>& w) {
  double s = 0;
  for (const float v : w) s += v;
  std::vector<double> p;
  p.reserve(w.size());
  for (const float v : w) p.push_back(v / s);
  return p;
}

/// The reference pipeline's law of one row of logits (the probabilities above, in double).
inline std::vector<double> reference_law(const sampling_params& sp, std::vector<float> logits) {
  std::vector<float> probs(logits.size()), scratch(logits.size());
  reference_logits_to_probs(sp, logits, {}, probs, scratch);
  return normalised_law(probs);
}

/// The filtered-rows G-test case of the row samplers (host and device): one row of 7 logits
/// repeated over 4 x `per` rows, row r drawn with params[r % 4] (plain; temperature 0.7 with
/// top-k 3; top-p 0.8; temperature 1.3 with min-p 0.2), whose laws are reference_law(params[k],
/// logits).
struct filtered_rows_case {
  std::vector<float> logits = {1.0f, 2.5f, -0.5f, 0.0f, 2.0f, -3.0f, 1.5f};
  std::vector<sampling_params> params = std::vector<sampling_params>(4);
  index_t rows = 0;
  std::vector<float> data;               ///< rows x logits.size()
  std::vector<sampling_params> per_row;  ///< params[r % 4]

  explicit filtered_rows_case(index_t per) : rows(4 * per) {
    params[1].temperature = 0.7f;
    params[1].top_k = 3;
    params[2].top_p = 0.8f;
    params[3].temperature = 1.3f;
    params[3].min_p = 0.2f;
    for (index_t r = 0; r < rows; ++r) {
      data.insert(data.end(), logits.begin(), logits.end());
      per_row.push_back(params[static_cast<std::size_t>(r % 4)]);
    }
  }
  [[nodiscard]] index_t vocab() const { return static_cast<index_t>(logits.size()); }
};

}  // namespace specula::testing
