#pragma once

/// @file
/// Row transforms that turn target logits into the probability rows verifiers consume:
/// classifier-free guidance mixing, temperature, top-k, softmax, top-p and min-p.
///
/// The order of `logits_to_probs` is the one engines and the text-to-image papers use:
///   CFG mix -> temperature -> top-k (on logits) -> softmax -> top-p -> min-p (on probabilities),
/// renormalising after each filter. Filters keep ties at their threshold (so top-k may keep more
/// than k tokens when several share the k-th largest logit); this keeps the result independent
/// of the order in which equal entries appear.
///
/// The scalar maths are host+device function objects; the row loops here are the host backend.
/// Functions that need scratch space take a caller-provided span, so no call allocates.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <span>
#include <string>

#include "specula/core/config.hpp"
#include "specula/core/error.hpp"
#include "specula/core/numeric.hpp"
#include "specula/core/types.hpp"

namespace specula {

/// Classifier-free guidance: uncond + scale * (cond - uncond).
struct cfg_mix_op {
  float scale = 1.0f;
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr float operator()(float cond,
                                                               float uncond) const noexcept {
    return uncond + scale * (cond - uncond);
  }
};

/// Temperature scaling of a logit: logit / temperature (temperature > 0).
struct temperature_op {
  float inv_temperature = 1.0f;
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr float operator()(float logit) const noexcept {
    return logit * inv_temperature;
  }
};

/// Parameters of logits_to_probs. Defaults disable every filter.
struct sampling_params {
  float temperature = 1.0f;  ///< > 0
  index_t top_k = 0;         ///< 0 disables; otherwise >= 1
  float top_p = 1.0f;        ///< in (0, 1]; 1 disables
  float min_p = 0.0f;        ///< in [0, 1]; 0 disables
  float cfg_scale = 1.0f;    ///< used only when an unconditional row is given
};

/// Throws invalid_input unless the parameters are in their domains.
inline void validate_sampling_params(const sampling_params& s) {
  require_parameter(detail::is_finite(s.temperature) && s.temperature > 0.0f, "temperature",
                    s.temperature, "must be finite and > 0 (use greedy decoding for 0)");
  require_parameter(s.top_k >= 0, "top_k", static_cast<double>(s.top_k), "must be >= 0");
  require_parameter(s.top_p > 0.0f && s.top_p <= 1.0f, "top_p", s.top_p, "must be in (0, 1]");
  require_parameter(s.min_p >= 0.0f && s.min_p <= 1.0f, "min_p", s.min_p, "must be in [0, 1]");
  require_parameter(detail::is_finite(s.cfg_scale), "cfg_scale", s.cfg_scale, "must be finite");
}

namespace detail {

inline void require_same_size(std::size_t a, std::size_t b, const char* argument) {
  if (a != b)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(a)}, argument,
                    ("expected length " + std::to_string(b)).c_str());
}

[[noreturn]] inline void throw_scratch_too_small(std::size_t have, std::size_t need) {
  throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(have)}, "scratch",
                  ("needs at least " + std::to_string(need) + " elements").c_str());
  std::abort();  // unreachable: throw_if_failed throws for a failed diagnostic
}

inline void require_scratch(std::span<float> scratch, std::size_t n) {
  if (scratch.size() < n) throw_scratch_too_small(scratch.size(), n);
}

/// Renormalises a probability row in place (sum in double). Returns false if it has no mass.
inline bool renormalise(std::span<float> probs) {
  double sum = 0.0;
  for (float v : probs) sum += v;
  if (!(sum > 0.0)) return false;
  const double inv = 1.0 / sum;
  for (float& v : probs) v = static_cast<float>(v * inv);
  return true;
}

}  // namespace detail

/// out[i] = uncond[i] + scale * (cond[i] - uncond[i]). `out` may alias `cond` or `uncond`.
inline void cfg_mix(std::span<const float> cond, std::span<const float> uncond, float scale,
                    std::span<float> out) {
  detail::require_same_size(uncond.size(), cond.size(), "uncond");
  detail::require_same_size(out.size(), cond.size(), "out");
  require_parameter(detail::is_finite(scale), "cfg_scale", scale, "must be finite");
  const cfg_mix_op op{scale};
  for (std::size_t i = 0; i < cond.size(); ++i) out[i] = op(cond[i], uncond[i]);
}

/// logits[i] /= temperature, temperature > 0.
inline void apply_temperature(std::span<float> logits, float temperature) {
  require_parameter(detail::is_finite(temperature) && temperature > 0.0f, "temperature",
                    temperature, "must be finite and > 0 (use greedy decoding for 0)");
  const temperature_op op{1.0f / temperature};
  for (float& v : logits) v = op(v);
}

/// Numerically stable softmax (max subtracted, sum in double). -Inf logits get probability 0.
/// Throws invalid_input if a logit is NaN or +Inf, or if every logit is -Inf.
inline void softmax(std::span<const float> logits, std::span<float> probs) {
  detail::require_same_size(probs.size(), logits.size(), "probs");
  float m = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (detail::is_nan(v))
      throw_if_failed({status::nan_value, -1, static_cast<index_t>(i), v}, "logits");
    if (v == std::numeric_limits<float>::infinity())
      throw_if_failed({status::inf_value, -1, static_cast<index_t>(i), v}, "logits");
    m = std::max(m, v);
  }
  if (m == -std::numeric_limits<float>::infinity())
    throw_if_failed({status::no_mass, -1, -1, 0.0}, "logits", "every logit is -inf");
  double sum = 0.0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float e = std::exp(logits[i] - m);
    probs[i] = e;
    sum += e;
  }
  const double inv = 1.0 / sum;
  for (float& v : probs) v = static_cast<float>(v * inv);
}

/// Keeps the logits >= the k-th largest and sets the others to -Inf (k >= size: no change).
/// `scratch` needs logits.size() elements.
inline void top_k_filter(std::span<float> logits, index_t k, std::span<float> scratch) {
  require_parameter(k >= 1, "top_k", static_cast<double>(k), "must be >= 1");
  if (static_cast<std::size_t>(k) >= logits.size()) return;
  const std::size_t n = logits.size();
  detail::require_scratch(scratch, n);
  float* s = scratch.data();
  for (std::size_t i = 0; i < n; ++i) s[i] = logits[i];
  std::nth_element(s, s + (k - 1), s + n, std::greater<float>());
  const float threshold = s[k - 1];
  for (float& v : logits)
    if (v < threshold) v = -std::numeric_limits<float>::infinity();
}

/// Nucleus filter on a probability row: keeps the tokens whose probability is >= the smallest
/// probability among the highest-probability tokens that first reach mass >= top_p, zeroes the
/// rest and renormalises. `scratch` needs probs.size() elements.
inline void top_p_filter(std::span<float> probs, float top_p, std::span<float> scratch) {
  require_parameter(top_p > 0.0f && top_p <= 1.0f, "top_p", top_p, "must be in (0, 1]");
  if (top_p >= 1.0f) return;
  detail::require_scratch(scratch, probs.size());
  auto s = scratch.first(probs.size());
  std::copy(probs.begin(), probs.end(), s.begin());
  std::sort(s.begin(), s.end(), std::greater<float>());
  double total = 0.0;
  for (float v : s) total += v;
  const double target = static_cast<double>(top_p) * total;
  double acc = 0.0;
  float threshold = s.empty() ? 0.0f : s.back();
  for (float v : s) {
    acc += v;
    if (acc >= target) {
      threshold = v;
      break;
    }
  }
  for (float& v : probs)
    if (v < threshold) v = 0.0f;
  detail::renormalise(probs);
}

/// min-p filter: zeroes tokens with probability < min_p * max(probs), then renormalises.
inline void min_p_filter(std::span<float> probs, float min_p) {
  require_parameter(min_p >= 0.0f && min_p <= 1.0f, "min_p", min_p, "must be in [0, 1]");
  if (min_p <= 0.0f || probs.empty()) return;
  const float m = *std::max_element(probs.begin(), probs.end());
  const float threshold = min_p * m;
  for (float& v : probs)
    if (v < threshold) v = 0.0f;
  detail::renormalise(probs);
}

/// The full pipeline on one row: optional CFG mix (when `uncond` is non-empty), temperature,
/// top-k, softmax, top-p, min-p. Writes the probability row to `probs`; `logits` is used as
/// working storage and is modified. `scratch` needs logits.size() elements when top-k or top-p
/// is enabled.
inline void logits_to_probs(const sampling_params& params, std::span<float> logits,
                            std::span<const float> uncond, std::span<float> probs,
                            std::span<float> scratch) {
  validate_sampling_params(params);
  if (!uncond.empty()) cfg_mix(logits, uncond, params.cfg_scale, logits);
  if (params.temperature != 1.0f) apply_temperature(logits, params.temperature);
  if (params.top_k > 0) top_k_filter(logits, params.top_k, scratch);
  softmax(logits, probs);
  if (params.top_p < 1.0f) top_p_filter(probs, params.top_p, scratch);
  if (params.min_p > 0.0f) min_p_filter(probs, params.min_p);
}

}  // namespace specula
