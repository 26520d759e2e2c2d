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
/// Two entry points run the pipeline: `logits_to_probs(params, logits, uncond, probs, scratch)`
/// on one float row, and the batched `logits_to_probs(policy, logits, uncond, params, probs)`
/// over fp32, bf16 or fp16 rows with one parameter set per row (or one for all), rows split
/// over threads by the host policy. Neither writes to its inputs. Both run the same row code,
/// so a row gets the same output bits from either (and from its own single-row call whatever
/// the rest of the batch is).
///
/// Top-k and top-p use selection, not sorting (sample/select.hpp): the logits are re-read and
/// re-transformed by each pass instead of being copied, and `probs` holds exp(x - max) between
/// the passes. The results are bit for bit those of the sort-based definitions
/// (specula::testing::reference_logits_to_probs; tests compare them): top-k keeps the logits >=
/// the k-th largest; top-p keeps the probabilities >= the one at which the descending running
/// sum (double) first reaches top_p times the descending total; the softmax is
/// e_i * float(1 / S) with S the sum of the e_i = exp(x_i - max) in float lanes and double
/// (sample/softmax_passes.hpp states the order and the error bound, about 1e-6 relative);
/// the other sums are in double, in index order unless said otherwise. A top-p row whose threshold
/// depends on the rounding of the descending sums (top_p within about V * 2^-29 of 1, or a partial
/// sum within about V * 2^-52 of the target) takes the sort instead; it is rare and gives the same
/// bits.
///
/// Cost per row (passes over V elements): softmax alone 3 (max, exp, write); top-k adds 2 to 4
/// cheap counting passes and skips exp for the dropped logits; top-p adds 2 to 4; min-p adds 1.
///
/// The scalar maths are host+device function objects; the row loops here are the host backend
/// (the device version is specula/cuda/transforms.cuh).

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <type_traits>

#include "specula/backend/host.hpp"
#include "specula/core/config.hpp"
#include "specula/core/error.hpp"
#include "specula/core/float16.hpp"
#include "specula/core/numeric.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/sample/select.hpp"
#include "specula/sample/softmax_passes.hpp"

namespace specula {

/// Classifier-free guidance: uncond + scale * (cond - uncond).
struct cfg_mix_op {
  float scale = 1.0f;
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr float operator()(float cond,
                                                               float uncond) const noexcept {
    // Each operation rounded on its own on both backends (the device would otherwise fuse the
    // product and the sum into one FMA), so the device's mixed logits are the host's bits.
    return detail::fadd_rn(uncond, detail::fmul_rn(scale, detail::fsub_rn(cond, uncond)));
  }
};

/// Temperature scaling of a logit: logit / temperature (temperature > 0).
struct temperature_op {
  float inv_temperature = 1.0f;
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr float operator()(float logit) const noexcept {
    // Rounded on its own: never fused with the max subtraction that follows on the device.
    return detail::fmul_rn(logit, inv_temperature);
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

/// Logit element types of the batched host transforms: float, bfloat16 and half (storage types
/// of core/float16.hpp, layout-compatible with an engine's bf16/fp16 tensors).
template <class T>
concept logit_element =
    std::same_as<T, float> || std::same_as<T, bfloat16> || std::same_as<T, half>;

namespace detail {

/// The first parameter out of its domain, as a diagnostic for `row` (-1: no row), with the
/// parameter's name and requirement; ok when every parameter is valid.
struct parameter_problem {
  diagnostic d;
  const char* name = "";
  const char* requirement = "";
};

inline parameter_problem check_sampling_params(const sampling_params& s, index_t row) {
  const auto bad = [row](double v, const char* name, const char* requirement) {
    return parameter_problem{{status::invalid_parameter, row, -1, v}, name, requirement};
  };
  if (!(detail::is_finite(s.temperature) && s.temperature > 0.0f))
    return bad(s.temperature, "temperature", "must be finite and > 0 (use greedy decoding for 0)");
  if (s.top_k < 0) return bad(static_cast<double>(s.top_k), "top_k", "must be >= 0");
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) return bad(s.top_p, "top_p", "must be in (0, 1]");
  if (!(s.min_p >= 0.0f && s.min_p <= 1.0f)) return bad(s.min_p, "min_p", "must be in [0, 1]");
  if (!detail::is_finite(s.cfg_scale)) return bad(s.cfg_scale, "cfg_scale", "must be finite");
  return {};
}

}  // namespace detail

/// Throws invalid_input unless the parameters are in their domains.
inline void validate_sampling_params(const sampling_params& s) {
  const auto problem = detail::check_sampling_params(s, -1);
  throw_if_failed(problem.d, problem.name, problem.requirement);
}

/// Throws invalid_input naming `argument`.<parameter> and the row (entry) of `params` unless
/// every entry is in its domain, e.g. `specula: params.top_p[row 3]: invalid parameter ...`.
inline void validate_sampling_params(row_view<const sampling_params> params,
                                     const char* argument = "params") {
  for (index_t r = 0; r < params.size; ++r) {
    const auto problem = detail::check_sampling_params(params[r], r);
    if (problem.d.ok()) continue;
    throw_if_failed(problem.d, (std::string(argument) + "." + problem.name).c_str(),
                    problem.requirement);
  }
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

/// One row's logits after CFG (when Cfg) and temperature (when Scale), recomputed per read.
template <class T, bool Cfg, bool Scale>
struct logit_source {
  const T* cond;
  const T* uncond;
  cfg_mix_op mix;
  temperature_op temperature;

  [[nodiscard]] float operator()(index_t i) const noexcept {
    float x = to_float(cond[i]);
    if constexpr (Cfg) x = mix(x, to_float(uncond[i]));
    if constexpr (Scale) x = temperature(x);
    return x;
  }
};

/// Calls f(source) with the logit_source of row `cond` (and `uncond` unless null) for `sp`.
template <class T, class F>
void with_logit_source(const T* cond, const T* uncond, const sampling_params& sp, F&& f) {
  const cfg_mix_op mix{sp.cfg_scale};
  const temperature_op scale{1.0f / sp.temperature};
  if (uncond != nullptr) {
    if (sp.temperature != 1.0f)
      f(logit_source<T, true, true>{cond, uncond, mix, scale});
    else
      f(logit_source<T, true, false>{cond, uncond, mix, scale});
  } else {
    if (sp.temperature != 1.0f)
      f(logit_source<T, false, true>{cond, nullptr, mix, scale});
    else
      f(logit_source<T, false, false>{cond, nullptr, mix, scale});
  }
}

/// 1 / mass, or 1 when there is no mass (renormalise leaves such a row, all zeros, as it is).
[[nodiscard]] inline double inverse_mass(double mass) noexcept {
  return mass > 0.0 ? 1.0 / mass : 1.0;
}

/// Throws for the first NaN or +Inf logit of the row (index order), as softmax reports it.
template <class Source>
[[noreturn]] void throw_first_bad_logit(const Source& src, index_t n, index_t row,
                                        const char* argument) {
  for (index_t i = 0; i < n; ++i) {
    const float v = src(i);
    if (detail::is_nan(v)) throw_if_failed({status::nan_value, row, i, v}, argument);
    if (v == std::numeric_limits<float>::infinity())
      throw_if_failed({status::inf_value, row, i, v}, argument);
  }
  std::abort();  // unreachable: the scan found a bad logit
}

/// Whether a logit source reads fp32 logits without CFG (the passes then read the row itself and
/// apply the temperature as a factor).
template <class Source>
inline constexpr bool direct_source = false;
template <bool Scale>
inline constexpr bool direct_source<logit_source<float, false, Scale>> = true;

/// The inverse temperature a direct source applies (1 without temperature).
template <class Source>
[[nodiscard]] float direct_scale(const Source& src) noexcept {
  if constexpr (std::is_same_v<Source, logit_source<float, false, true>>)
    return src.temperature.inv_temperature;
  return 1.0f;
}

/// The first pass over a float row read as x_i * s (s > 0), by the SIMD pass logit_max: returns
/// the largest x_i * s (the largest x_i times s: rounding keeps the order); throws as
/// scan_logits.
inline float scaled_logit_max(const float* x, float s, index_t n, index_t row,
                              const char* argument) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  const logit_extent ext = logit_max(x, n);
  const float m = ext.max * s;
  if (ext.bad || m == inf)
    throw_first_bad_logit([x, s](index_t i) { return x[i] * s; }, n, row, argument);
  if (m == -inf) throw_if_failed({status::no_mass, row, -1, 0.0}, argument, "every logit is -inf");
  return m;
}

/// The first pass over a row of logits: returns the max; throws invalid_input naming
/// `argument` and `row` for the first NaN or +Inf logit and for a row of -Inf only (or empty).
template <class Source>
float scan_logits(const Source& src, index_t n, index_t row, const char* argument) {
  if constexpr (direct_source<Source>)
    return scaled_logit_max(src.cond, direct_scale(src), n, row, argument);
  constexpr float inf = std::numeric_limits<float>::infinity();
  float m = -inf;
  bool bad = false;
  for (index_t i = 0; i < n; ++i) {
    const float x = src(i);
    bad |= !(x < inf);
    m = std::max(m, x);
  }
  if (bad) throw_first_bad_logit(src, n, row, argument);
  if (m == -inf) throw_if_failed({status::no_mass, row, -1, 0.0}, argument, "every logit is -inf");
  return m;
}

/// The pipeline on one row of n logits given by `src`, writing the probabilities to
/// out[0 .. n). `scratch`: n floats for the rare sort fallback of top-p, or null (then `out` is
/// sorted and the logits read again, so `src` must not alias `out`). Errors name `argument` and
/// `row` (-1: none). The parameters must be valid.
///
/// The passes (sample/softmax_passes.hpp, each on the widest instruction set): fp32 logits
/// without CFG are read in place, x_i * s with s the inverse temperature (1 without: exact);
/// other rows are first written to `out` as floats after conversion, CFG and temperature (s = 1).
/// Then the max m, the top-k threshold, e_i = exp_f32(x_i * s - m) for the kept logits with
/// their sum, and the probabilities.
template <class Source>
void transform_row(const sampling_params& sp, const Source& src, index_t n, float* out,
                   float* scratch, index_t row, const char* argument) {
  constexpr bool direct = direct_source<Source>;
  const float* x = out;
  float s = 1.0f;
  const auto materialise = [&] {
    if constexpr (!direct)
      for (index_t i = 0; i < n; ++i) out[i] = src(i);
  };
  if constexpr (direct) {
    x = src.cond;
    s = direct_scale(src);
  } else {
    materialise();
  }
  const auto value = [x, s](index_t i) { return x[i] * s; };

  // Pass 1: the max, and the checks.
  const float m = scaled_logit_max(x, s, n, row, argument);

  // Top-k threshold (top-k keeps the max, so m is also the max of what it keeps).
  float thr_k = -std::numeric_limits<float>::infinity();
  if (sp.top_k > 0 && sp.top_k < n) {  // no NaN here
    const auto block_max = [](const float* b, index_t len) { return logit_max(b, len).max; };
    if (!kth_largest_by_blocks(x, s, n, sp.top_k, block_max, thr_k))
      (void)kth_largest(n, sp.top_k, value, thr_k);
  }

  // Pass 2: e = exp(x - m) for the kept logits, 0 for the dropped ones, and their sum. The
  // largest e is exp_f32(0) = 1, that of the max logit.
  constexpr float e_max = 1.0f;
  const auto run_exp_pass = [&] { return exp_pass(x, n, s, m, thr_k, out); };
  probability_cuts c;
  c.set_sum(run_exp_pass());

  if (sp.top_p < 1.0f) {
    const auto softmax_at = [out, &c](index_t i) { return c.softmax(out[i]); };
    nucleus_cut cut;
    if (!nucleus_threshold_selected(n, sp.top_p, softmax_at, cut)) {
      // The sort-based definition itself, on a copy (or in `out`, whose e values are then
      // computed again).
      float* sorted = scratch != nullptr ? scratch : out;
      for (index_t i = 0; i < n; ++i) sorted[i] = c.softmax(out[i]);
      cut.threshold = nucleus_threshold_sorted(sorted, n, sp.top_p);
      if (sorted == out) {
        materialise();
        (void)run_exp_pass();
      }
      cut.kept_mass = 0.0;
      for (index_t i = 0; i < n; ++i) {
        const float p = softmax_at(i);
        if (!(p < cut.threshold)) cut.kept_mass += p;
      }
    }
    c.top_p = true;
    c.thr_p = cut.threshold;
    c.inv_p = inverse_mass(cut.kept_mass);
  }

  if (sp.min_p > 0.0f) {
    // Every step is non-decreasing in e, so the largest probability is that of the largest e.
    c.thr_m = sp.min_p * c.after_top_p(e_max);
    double kept = 0.0;
    for (index_t i = 0; i < n; ++i) {
      const float p = c.after_top_p(out[i]);
      if (!(p < c.thr_m)) kept += p;
    }
    c.min_p = true;
    c.inv_m = inverse_mass(kept);
  }

  // Last pass: the probabilities, with the cuts.
  probability_pass(out, n, c);
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

/// Numerically stable softmax (max subtracted; sample/softmax_passes.hpp gives the order of the
/// sum and the error bound). -Inf logits get probability 0.
/// Throws invalid_input if a logit is NaN or +Inf, or if every logit is -Inf. `probs` may
/// alias `logits`.
inline void softmax(std::span<const float> logits, std::span<float> probs) {
  detail::require_same_size(probs.size(), logits.size(), "probs");
  detail::transform_row(sampling_params{},
                        detail::logit_source<float, false, false>{logits.data(), nullptr, {}, {}},
                        static_cast<index_t>(logits.size()), probs.data(), nullptr, -1, "logits");
}

/// Keeps the logits >= the k-th largest and sets the others to -Inf (k >= size: no change).
/// `scratch` needs logits.size() elements (used only when a logit is NaN).
inline void top_k_filter(std::span<float> logits, index_t k, std::span<float> scratch) {
  require_parameter(k >= 1, "top_k", static_cast<double>(k), "must be >= 1");
  if (static_cast<std::size_t>(k) >= logits.size()) return;
  const std::size_t n = logits.size();
  detail::require_scratch(scratch, n);
  float threshold = 0.0f;
  if (!detail::kth_largest(
          static_cast<index_t>(n), k,
          [&](index_t i) { return logits[static_cast<std::size_t>(i)]; }, threshold)) {
    float* s = scratch.data();  // NaN present: the order is undefined; do what nth_element does
    for (std::size_t i = 0; i < n; ++i) s[i] = logits[i];
    std::nth_element(s, s + (k - 1), s + n, std::greater<float>());
    threshold = s[k - 1];
  }
  for (float& v : logits)
    if (v < threshold) v = -std::numeric_limits<float>::infinity();
}

/// Nucleus filter on a probability row: keeps the tokens whose probability is >= the smallest
/// probability among the highest-probability tokens that first reach mass >= top_p, zeroes the
/// rest and renormalises. `scratch` needs probs.size() elements (for the rare rows the
/// selection leaves to the sort, and rows with entries outside [0, 2)).
inline void top_p_filter(std::span<float> probs, float top_p, std::span<float> scratch) {
  require_parameter(top_p > 0.0f && top_p <= 1.0f, "top_p", top_p, "must be in (0, 1]");
  if (top_p >= 1.0f) return;
  detail::require_scratch(scratch, probs.size());
  const auto n = static_cast<index_t>(probs.size());
  detail::nucleus_cut cut;
  float threshold = 0.0f;
  if (detail::nucleus_threshold_selected(
          n, top_p, [&](index_t i) { return probs[static_cast<std::size_t>(i)]; }, cut)) {
    threshold = cut.threshold;
  } else {
    std::copy(probs.begin(), probs.end(), scratch.begin());
    threshold = detail::nucleus_threshold_sorted(scratch.data(), n, top_p);
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
/// top-k, softmax, top-p, min-p. Writes the probability row to `probs` and leaves `logits` and
/// `uncond` unchanged (`probs` may alias either). `scratch` needs logits.size() elements when
/// top-k or top-p is enabled. Throws invalid_input for invalid parameters, mismatched sizes, a
/// NaN or +Inf logit (after CFG and temperature: `logits[column i]`), or a row of -Inf only.
inline void logits_to_probs(const sampling_params& params, std::span<const float> logits,
                            std::span<const float> uncond, std::span<float> probs,
                            std::span<float> scratch) {
  validate_sampling_params(params);
  const std::size_t n = logits.size();
  if (n == 0)
    throw_if_failed({status::empty_input, -1, -1, 0.0}, "logits",
                    "the row has no entries (a vocabulary of 0)");
  if (!uncond.empty()) detail::require_same_size(uncond.size(), n, "uncond");
  detail::require_same_size(probs.size(), n, "probs");
  const bool top_k = params.top_k > 0 && static_cast<std::size_t>(params.top_k) < n;
  if (top_k || params.top_p < 1.0f) detail::require_scratch(scratch, n);
  detail::with_logit_source(logits.data(), uncond.empty() ? nullptr : uncond.data(), params,
                            [&](const auto& src) {
                              detail::transform_row(params, src, static_cast<index_t>(n),
                                                    probs.data(), scratch.data(), -1, "logits");
                            });
}

namespace detail {

template <class T>
[[nodiscard]] bool rows_overlap(batch_view<const T> a, batch_view<float> b) noexcept {
  if (a.data == nullptr || b.data == nullptr || a.rows == 0 || b.rows == 0 || a.cols == 0)
    return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data);
  const auto a1 =
      a0 + static_cast<std::uintptr_t>((a.rows - 1) * a.row_stride + a.cols) * sizeof(T);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.data);
  const auto b1 =
      b0 + static_cast<std::uintptr_t>((b.rows - 1) * b.row_stride + b.cols) * sizeof(float);
  return a0 < b1 && b0 < a1;
}

/// Shape checks shared by the batched transforms: `rows` x `cols` logits (and the same for
/// `uncond` unless it has no rows), `params` of 1 entry or `params_rows`, each valid.
template <class T>
void validate_logit_rows_shape(batch_view<const T> logits, batch_view<const T> uncond,
                               row_view<const sampling_params> params, index_t params_rows,
                               const char* logits_name, const char* uncond_name,
                               const char* params_name) {
  const auto fail = [](status code, double v, const char* argument, const char* what) {
    throw_if_failed({code, -1, -1, v}, argument, what);
  };
  if (logits.rows < 0 || logits.cols < 0)
    fail(status::length_mismatch, static_cast<double>(std::min(logits.rows, logits.cols)),
         logits_name, "rows and cols must be >= 0");
  if (logits.rows > 0 && logits.cols == 0)
    fail(status::empty_input, 0.0, logits_name, "rows have no entries (a vocabulary of 0)");
  if (logits.rows > 1 && logits.row_stride < logits.cols)
    fail(status::length_mismatch, static_cast<double>(logits.row_stride), logits_name,
         "row_stride must be at least the row length");
  if (!logits.empty() && logits.data == nullptr)
    fail(status::empty_input, 0.0, logits_name, "null data pointer");
  if (uncond.rows != 0) {
    if (uncond.rows != logits.rows || uncond.cols != logits.cols)
      fail(status::length_mismatch, static_cast<double>(uncond.rows), uncond_name,
           "must have no rows (no CFG) or the shape of the logits");
    if (uncond.rows > 1 && uncond.row_stride < uncond.cols)
      fail(status::length_mismatch, static_cast<double>(uncond.row_stride), uncond_name,
           "row_stride must be at least the row length");
    if (!uncond.empty() && uncond.data == nullptr)
      fail(status::empty_input, 0.0, uncond_name, "null data pointer");
  }
  if (params_rows > 0 && params.size != 1 && params.size != params_rows)
    fail(status::length_mismatch, static_cast<double>(params.size), params_name,
         ("needs 1 entry or " + std::to_string(params_rows)).c_str());
  if (params.size > 0 && params.data == nullptr)
    fail(status::empty_input, 0.0, params_name, "null data pointer");
  validate_sampling_params(params, params_name);
}

}  // namespace detail

/// Batched logits -> probabilities (see the file comment) under a host policy: row r of
/// `probs` receives the pipeline of row r of `logits` (and of `uncond`, for CFG, unless it has
/// no rows) with `params[r]`, or `params[0]` for every row when it has one entry.
///
/// - `logits`: rows x V of float, bfloat16 or half; never written.
/// - `uncond`: the same shape, or no rows (no CFG).
/// - `params`: 1 or `rows` entries.
/// - `probs`: rows x V floats; must not overlap the inputs (it holds intermediate values).
///
/// Throws invalid_input before writing anything for mismatched shapes or strides, null
/// pointers, overlapping output, and parameters out of their domain (`params.top_p[row r]`);
/// then, while transforming, for a NaN or +Inf logit (after CFG and temperature:
/// `logits[row r][column i]`) or a row of -Inf only. The error of the lowest failing row is the
/// one thrown under every policy; rows other than it may have been written. No allocation.
template <logit_element T, host::policy Policy>
void logits_to_probs(const Policy& policy, batch_view<const T> logits,
                     std::type_identity_t<batch_view<const T>> uncond,
                     row_view<const sampling_params> params, batch_view<float> probs) {
  detail::validate_logit_rows_shape(logits, uncond, params, logits.rows, "logits", "uncond",
                                    "params");
  if (probs.rows != logits.rows || probs.cols != logits.cols)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(probs.rows)}, "probs",
                    "must have the shape of the logits");
  if (probs.rows > 1 && probs.row_stride < probs.cols)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(probs.row_stride)},
                    "probs", "row_stride must be at least the row length");
  if (!probs.empty() && probs.data == nullptr)
    throw_if_failed({status::empty_input, -1, -1, 0.0}, "probs", "null data pointer");
  if (detail::rows_overlap(logits, probs) || detail::rows_overlap(uncond, probs))
    throw_if_failed({status::overlapping_buffers, -1, -1, 0.0}, "probs",
                    "must not overlap logits or uncond");
  host::for_each_index(policy, logits.rows, [&](index_t r) {
    const sampling_params& sp = params[params.size == 1 ? 0 : r];
    detail::with_logit_source(logits.row(r).data, uncond.rows > 0 ? uncond.row(r).data : nullptr,
                              sp, [&](const auto& src) {
                                detail::transform_row(sp, src, logits.cols, probs.row(r).data,
                                                      nullptr, r, "logits");
                              });
  });
}

/// logits_to_probs(host::seq, ...): the rows one after the other on the calling thread.
template <logit_element T>
void logits_to_probs(batch_view<const T> logits, std::type_identity_t<batch_view<const T>> uncond,
                     row_view<const sampling_params> params, batch_view<float> probs) {
  logits_to_probs<T>(host::seq, logits, uncond, params, probs);
}

}  // namespace specula
