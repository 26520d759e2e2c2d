#pragma once

/// @file
/// The row passes of the host softmax (sample/transforms.hpp) on each instruction set, with the
/// runtime dispatch of core/simd.hpp: the maximum of a row of logits, the exponentials with
/// their sum, and the final scaling with the top-p and min-p cuts. Each gives the bits of its
/// scalar definition on every path (tests/sample/test_softmax_passes.cpp forces each one):
///
/// - `logit_max`: the largest logit, NaN ignored, and whether any entry is NaN or +inf (the
///   maximum does not depend on the order; the sign of a zero maximum does, and does not change
///   any result: exp(+0) = exp(-0) = 1);
/// - `exp_pass`: e_i = exp_f32(x_i * s - m) for x_i * s >= thr, else 0, written to out[i], and
///   their sum S in a fixed order: tiles of detail::sum_tile elements; in a tile, element j is
///   added to float lane j mod 16 (sixteen float sums in index order, each of at most 16
///   entries); lanes k and k + 8 are added in double and the eight results combined pairwise
///   (combine_lanes); tile sums are added left to right in double. Every path adds the same
///   numbers in the same order;
/// - `probability_pass`: out[i] = e_i * inv_sum, one float product, with inv_sum = float(1 / S)
///   (1 / S in double, rounded to float), then the top-p and min-p cuts
///   p < thr ? 0 : float(double(p) * inv) (element by element: the order does not matter).
///
/// Error of the softmax (the exp's own error aside: e_i is within 1 ulp of exp(x_i * s - m)):
/// every e_i >= 0, so each float lane is within 15 u of its exact sum (u = 2^-24; at most 15
/// additions of non-negative terms), the double steps add at most about 2^-50 relatively, and
/// S = S* (1 + d) with |d| <= 15.01 u, S* the exact sum of the e_i. The probability
/// e_i * inv_sum then carries two more roundings (inv_sum and the product), so
/// p_i = (e_i / S*) (1 + t_i) with |t_i| <= 17.1 u (about 1.02e-6), and the row sums to 1 within
/// the same bound. The factor (1 + d) is common to the row: the ratios p_i / p_j are those of
/// the e_i within 2 u.

#include <limits>
#include <type_traits>

#include "specula/core/exp.hpp"
#include "specula/core/simd.hpp"
#include "specula/core/types.hpp"

namespace specula::detail {

/// What logit_max found: the largest entry (NaN ignored; -inf for an empty row or one of NaN
/// and -inf only) and whether an entry is NaN or +inf.
struct logit_extent {
  float max = -std::numeric_limits<float>::infinity();
  bool bad = false;
};

/// The row constants of the softmax pipeline after its passes, which give each probability from
/// e_i = exp(x_i - max) (0 for logits dropped by top-k), what the exp pass stored: softmax, then
/// top-p's cut and renormalisation, then min-p's (see probability_pass).
struct probability_cuts {
  float inv_sum = 1.0f;  ///< float(1 / sum of e), the sum as exp_pass returns it
  bool top_p = false;
  float thr_p = 0.0f;  ///< top-p keeps softmax probabilities >= thr_p
  double inv_p = 1.0;  ///< 1 / their mass (1 when it is 0: the row stays as it is)
  bool min_p = false;
  float thr_m = 0.0f;  ///< min-p keeps probabilities >= thr_m
  double inv_m = 1.0;

  [[nodiscard]] float softmax(float e) const noexcept { return fmul_rn(e, inv_sum); }

  /// inv_sum from the sum exp_pass returned.
  void set_sum(double sum) noexcept { inv_sum = static_cast<float>(1.0 / sum); }
  [[nodiscard]] float after_top_p(float e) const noexcept {
    float p = softmax(e);
    if (top_p) p = p < thr_p ? 0.0f : static_cast<float>(static_cast<double>(p) * inv_p);
    return p;
  }
};

/// One element of exp_pass (rounded on its own: never fused into the lane sum it feeds).
[[nodiscard]] inline float softmax_exp(float x, float s, float m, float thr) noexcept {
  const float xs = exp_rounded(x * s);  // never fused with the subtraction
  return exp_rounded(xs >= thr ? exp_f32(xs - m) : 0.0f);
}

/// The float lanes of a tile of exp_pass's sum.
inline constexpr int softmax_lanes = 16;

/// A tile's sum from its sixteen float lanes: lanes k and k + 8 added in double, then the eight
/// combined pairwise.
[[nodiscard]] inline double combine_softmax_lanes(const float* lane) noexcept {
  double d[8];
  for (int k = 0; k < 8; ++k)
    d[k] = static_cast<double>(lane[k]) + static_cast<double>(lane[k + 8]);
  return combine_lanes(d);
}

/// The scalar end of a tile of exp_pass: elements i .. end (i - t a multiple of 16 or not)
/// into `lane`, which holds the tile's lanes so far.
inline void exp_tail(const float* x, index_t t, index_t i, index_t end, float s, float m, float thr,
                     float* out, float* lane) noexcept {
  for (; i < end; ++i) {
    out[i] = softmax_exp(x[i], s, m, thr);
    lane[(i - t) % softmax_lanes] += out[i];
  }
}

/// One element of probability_pass.
[[nodiscard]] inline float softmax_probability(float e, const probability_cuts& c) noexcept {
  float p = c.after_top_p(e);
  if (c.min_p) p = p < c.thr_m ? 0.0f : static_cast<float>(static_cast<double>(p) * c.inv_m);
  return p;
}

[[nodiscard]] inline logit_extent logit_max_scalar(const float* x, index_t n) noexcept {
  constexpr float inf = std::numeric_limits<float>::infinity();
  logit_extent r;
  for (index_t i = 0; i < n; ++i) {
    const float v = x[i];
    r.bad |= !(v < inf);
    r.max = v > r.max ? v : r.max;
  }
  return r;
}

[[nodiscard]] inline double exp_pass_scalar(const float* x, index_t n, float s, float m, float thr,
                                            float* out) noexcept {
  double total = 0.0;
  for (index_t t = 0; t < n; t += sum_tile) {
    const index_t end = t + sum_tile < n ? t + sum_tile : n;
    float lane[softmax_lanes] = {};
    exp_tail(x, t, t, end, s, m, thr, out, lane);
    total += combine_softmax_lanes(lane);
  }
  return total;
}

inline void probability_pass_scalar(float* out, index_t n, const probability_cuts& c) noexcept {
  for (index_t i = 0; i < n; ++i) out[i] = softmax_probability(out[i], c);
}

#if SPECULA_SIMD_X86

[[nodiscard]] __attribute__((target("sse2"))) inline logit_extent logit_max_sse2(
    const float* x, index_t n) noexcept {
  const __m128 inf = _mm_set1_ps(std::numeric_limits<float>::infinity());
  __m128 m0 = _mm_set1_ps(-std::numeric_limits<float>::infinity()), m1 = m0;
  __m128 bad = _mm_setzero_ps();
  index_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128 a = _mm_loadu_ps(x + i), b = _mm_loadu_ps(x + i + 4);
    m0 = _mm_max_ps(a, m0);  // a NaN entry leaves the maximum as it is
    m1 = _mm_max_ps(b, m1);
    bad = _mm_or_ps(bad, _mm_or_ps(_mm_cmpnlt_ps(a, inf), _mm_cmpnlt_ps(b, inf)));
  }
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, _mm_max_ps(m0, m1));
  logit_extent r = logit_max_scalar(x + i, n - i);
  for (float v : lanes) r.max = v > r.max ? v : r.max;
  r.bad |= _mm_movemask_ps(bad) != 0;
  return r;
}

[[nodiscard]] __attribute__((target("sse2"))) inline double exp_pass_sse2(const float* x, index_t n,
                                                                          float s, float m,
                                                                          float thr,
                                                                          float* out) noexcept {
  const __m128 vs = _mm_set1_ps(s), vm = _mm_set1_ps(m), vt = _mm_set1_ps(thr);
  double total = 0.0;
  for (index_t t = 0; t < n; t += sum_tile) {
    const index_t end = t + sum_tile < n ? t + sum_tile : n;
    __m128 a[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
    index_t i = t;
    for (; i + 16 <= end; i += 16)
      for (int h = 0; h < 4; ++h) {  // lanes 4h .. 4h + 3
        const __m128 xs = SPECULA_EXP_ROUNDED(_mm_mul_ps(_mm_loadu_ps(x + i + 4 * h), vs));
        const __m128 keep = _mm_cmpge_ps(xs, vt);
        const __m128 e = _mm_movemask_ps(keep) == 0
                             ? _mm_setzero_ps()
                             : _mm_and_ps(exp_sse2<true>(_mm_sub_ps(xs, vm)), keep);
        _mm_storeu_ps(out + i + 4 * h, e);
        a[h] = _mm_add_ps(a[h], e);
      }
    alignas(16) float lane[softmax_lanes];
    for (int h = 0; h < 4; ++h) _mm_store_ps(lane + 4 * h, a[h]);
    exp_tail(x, t, i, end, s, m, thr, out, lane);
    total += combine_softmax_lanes(lane);
  }
  return total;
}

[[nodiscard]] __attribute__((target("avx2"))) inline logit_extent logit_max_avx2(
    const float* x, index_t n) noexcept {
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 m0 = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), m1 = m0;
  __m256 bad = _mm256_setzero_ps();
  index_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    m0 = _mm256_max_ps(a, m0);
    m1 = _mm256_max_ps(b, m1);
    bad = _mm256_or_ps(
        bad, _mm256_or_ps(_mm256_cmp_ps(a, inf, _CMP_NLT_UQ), _mm256_cmp_ps(b, inf, _CMP_NLT_UQ)));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(m0, m1));
  logit_extent r = logit_max_scalar(x + i, n - i);
  for (float v : lanes) r.max = v > r.max ? v : r.max;
  r.bad |= _mm256_movemask_ps(bad) != 0;
  return r;
}

/// exp_pass's eight elements at x + i on AVX2 (stored to out + i), as a vector.
[[nodiscard]] __attribute__((target("avx2,fma"))) inline __m256 exp_group_avx2(const float* x,
                                                                               __m256 vs, __m256 vm,
                                                                               __m256 vt) noexcept {
  const __m256 xs = SPECULA_EXP_ROUNDED(_mm256_mul_ps(_mm256_loadu_ps(x), vs));
  const __m256 keep = _mm256_cmp_ps(xs, vt, _CMP_GE_OQ);
  if (_mm256_movemask_ps(keep) == 0) return _mm256_setzero_ps();
  return _mm256_and_ps(exp_avx2<true>(_mm256_sub_ps(xs, vm)), keep);
}

/// A tile's sum from its sixteen float lanes held as two vectors (lanes 0-7, 8-15): the double
/// steps of combine_softmax_lanes.
[[nodiscard]] __attribute__((target("avx2,fma"))) inline double combine_softmax_lanes_avx2(
    __m256 lo, __m256 hi) noexcept {
  alignas(32) double d[8];
  _mm256_store_pd(d, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(lo)),
                                   _mm256_cvtps_pd(_mm256_castps256_ps128(hi))));
  _mm256_store_pd(d + 4, _mm256_add_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1)),
                                       _mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1))));
  return combine_lanes(d);
}

[[nodiscard]] __attribute__((target("avx2,fma"))) inline double exp_pass_avx2(const float* x,
                                                                              index_t n, float s,
                                                                              float m, float thr,
                                                                              float* out) noexcept {
  const __m256 vs = _mm256_set1_ps(s), vm = _mm256_set1_ps(m), vt = _mm256_set1_ps(thr);
  double total = 0.0;
  for (index_t t = 0; t < n; t += sum_tile) {
    const index_t end = t + sum_tile < n ? t + sum_tile : n;
    __m256 lo = _mm256_setzero_ps(), hi = lo;  // lanes 0-7 and 8-15
    index_t i = t;
    for (; i + 16 <= end; i += 16) {
      const __m256 e0 = exp_group_avx2(x + i, vs, vm, vt);
      _mm256_storeu_ps(out + i, e0);
      const __m256 e1 = exp_group_avx2(x + i + 8, vs, vm, vt);
      _mm256_storeu_ps(out + i + 8, e1);
      lo = _mm256_add_ps(lo, e0);
      hi = _mm256_add_ps(hi, e1);
    }
    if (i < end) {
      if (i + 8 <= end) {
        const __m256 e = exp_group_avx2(x + i, vs, vm, vt);
        _mm256_storeu_ps(out + i, e);
        lo = _mm256_add_ps(lo, e);
        i += 8;
      }
      alignas(32) float lane[softmax_lanes];
      _mm256_store_ps(lane, lo);
      _mm256_store_ps(lane + 8, hi);
      exp_tail(x, t, i, end, s, m, thr, out, lane);
      lo = _mm256_load_ps(lane);
      hi = _mm256_load_ps(lane + 8);
    }
    total += combine_softmax_lanes_avx2(lo, hi);
  }
  return total;
}

/// float(double(v) * f) on eight floats.
[[nodiscard]] __attribute__((target("avx2"))) inline __m256 scale_avx2(__m256 v,
                                                                       double f) noexcept {
  const __m256d fd = _mm256_set1_pd(f);
  const __m128 lo = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), fd));
  const __m128 hi =
      _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), fd));
  return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
}

/// probability_pass on eight floats (AVX2).
template <bool TopP, bool MinP>
[[nodiscard]] __attribute__((target("avx2"))) inline __m256 probabilities_avx2(
    __m256 e, const probability_cuts& c) noexcept {
  __m256 p = _mm256_mul_ps(e, _mm256_set1_ps(c.inv_sum));
  if constexpr (TopP)
    p = _mm256_and_ps(scale_avx2(p, c.inv_p),
                      _mm256_cmp_ps(p, _mm256_set1_ps(c.thr_p), _CMP_GE_OQ));
  if constexpr (MinP)
    p = _mm256_and_ps(scale_avx2(p, c.inv_m),
                      _mm256_cmp_ps(p, _mm256_set1_ps(c.thr_m), _CMP_GE_OQ));
  return p;
}

template <bool TopP, bool MinP>
__attribute__((target("avx2"))) inline void probability_pass_avx2(
    float* out, index_t n, const probability_cuts& c) noexcept {
  index_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, probabilities_avx2<TopP, MinP>(_mm256_loadu_ps(out + i), c));
  probability_pass_scalar(out + i, n - i, c);
}

[[nodiscard]] __attribute__((target(SPECULA_AVX512_TARGET))) inline logit_extent logit_max_avx512(
    const float* x, index_t n) noexcept {
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  __m512 m0 = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), m1 = m0;
  __mmask16 bad = 0;
  index_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    m0 = _mm512_max_ps(a, m0);
    m1 = _mm512_max_ps(b, m1);
    bad |= static_cast<__mmask16>(_mm512_cmp_ps_mask(a, inf, _CMP_NLT_UQ) |
                                  _mm512_cmp_ps_mask(b, inf, _CMP_NLT_UQ));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_max_ps(m0, m1));
  logit_extent r = logit_max_scalar(x + i, n - i);
  for (float v : lanes) r.max = v > r.max ? v : r.max;
  r.bad |= bad != 0;
  return r;
}

/// exp_pass on AVX-512; without Scale, s is 1 and x * s = x is not computed; without Cut, thr
/// is -inf and every entry is kept (x * s >= -inf for every non-NaN x; exp_f32(-inf) = 0), so
/// the comparison is not made.
template <bool Scale, bool Cut>
[[nodiscard]] __attribute__((target(SPECULA_AVX512_TARGET))) inline double exp_pass_avx512(
    const float* x, index_t n, float s, float m, float thr, float* out) noexcept {
  const __m512 vs = _mm512_set1_ps(s), vm = _mm512_set1_ps(m), vt = _mm512_set1_ps(thr);
  double total = 0.0;
  for (index_t t = 0; t < n; t += sum_tile) {
    const index_t end = t + sum_tile < n ? t + sum_tile : n;
    __m512 acc = _mm512_setzero_ps();  // lane k: elements k, k + 16, ... of the tile
    index_t i = t;
    for (; i + 16 <= end; i += 16) {
      __m512 xs = _mm512_loadu_ps(x + i);
      if constexpr (Scale) xs = SPECULA_EXP_ROUNDED(_mm512_mul_ps(xs, vs));
      __m512 e;
      if constexpr (Cut) {
        const __mmask16 keep = _mm512_cmp_ps_mask(xs, vt, _CMP_GE_OQ);
        e = keep == 0 ? _mm512_setzero_ps()
                      : _mm512_maskz_mov_ps(keep, exp_avx512<true>(_mm512_sub_ps(xs, vm)));
      } else {
        e = exp_avx512<true>(_mm512_sub_ps(xs, vm));
      }
      _mm512_storeu_ps(out + i, e);
      acc = _mm512_add_ps(acc, e);
    }
    if (i < end) {
      if (i + 8 <= end) {  // lanes 0-7
        const __m256 e =
            exp_group_avx2(x + i, _mm256_set1_ps(s), _mm256_set1_ps(m), _mm256_set1_ps(thr));
        _mm256_storeu_ps(out + i, e);
        acc = _mm512_mask_add_ps(acc, 0x00FF, acc, _mm512_castps256_ps512(e));
        i += 8;
      }
      alignas(64) float lane[softmax_lanes];
      _mm512_store_ps(lane, acc);
      exp_tail(x, t, i, end, s, m, thr, out, lane);
      acc = _mm512_load_ps(lane);
    }
    // combine_softmax_lanes: lanes k and k + 8 in double, then pairwise.
    alignas(64) double d[8];
    _mm512_store_pd(d, _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(acc)),
                                     _mm512_cvtps_pd(_mm512_extractf32x8_ps(acc, 1))));
    total += combine_lanes(d);
  }
  return total;
}

/// float(double(v) * f) on sixteen floats.
[[nodiscard]] __attribute__((target(SPECULA_AVX512_TARGET))) inline __m512 scale_avx512(
    __m512 v, __m512d f) noexcept {
  const __m256 lo = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)), f));
  const __m256 hi =
      _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)), f));
  return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

template <bool TopP, bool MinP>
__attribute__((target(SPECULA_AVX512_TARGET))) inline void probability_pass_avx512(
    float* out, index_t n, const probability_cuts& c) noexcept {
  const __m512 inv_sum = _mm512_set1_ps(c.inv_sum);
  const __m512d inv_p = _mm512_set1_pd(c.inv_p), inv_m = _mm512_set1_pd(c.inv_m);
  const __m512 thr_p = _mm512_set1_ps(c.thr_p), thr_m = _mm512_set1_ps(c.thr_m);
  index_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 p = _mm512_mul_ps(_mm512_loadu_ps(out + i), inv_sum);
    if constexpr (TopP)
      p = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, thr_p, _CMP_GE_OQ), scale_avx512(p, inv_p));
    if constexpr (MinP)
      p = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, thr_m, _CMP_GE_OQ), scale_avx512(p, inv_m));
    _mm512_storeu_ps(out + i, p);
  }
  probability_pass_scalar(out + i, n - i, c);
}

#endif  // SPECULA_SIMD_X86

/// logit_max on the active instruction set.
[[nodiscard]] inline logit_extent logit_max(const float* x, index_t n) noexcept {
#if SPECULA_SIMD_X86
  switch (simd::active_isa()) {
    case simd::isa::avx512:
      return logit_max_avx512(x, n);
    case simd::isa::avx2:
      return logit_max_avx2(x, n);
    case simd::isa::sse2:
      return logit_max_sse2(x, n);
    case simd::isa::scalar:
      break;
  }
#endif
  return logit_max_scalar(x, n);
}

/// exp_pass on the active instruction set: out[i] = e_i, returns their sum (file comment).
[[nodiscard]] inline double exp_pass(const float* x, index_t n, float s, float m, float thr,
                                     float* out) noexcept {
#if SPECULA_SIMD_X86
  switch (simd::active_isa()) {
    case simd::isa::avx512:
      if (thr == -std::numeric_limits<float>::infinity())
        return s == 1.0f ? exp_pass_avx512<false, false>(x, n, s, m, thr, out)
                         : exp_pass_avx512<true, false>(x, n, s, m, thr, out);
      return s == 1.0f ? exp_pass_avx512<false, true>(x, n, s, m, thr, out)
                       : exp_pass_avx512<true, true>(x, n, s, m, thr, out);
    case simd::isa::avx2:
      return exp_pass_avx2(x, n, s, m, thr, out);
    case simd::isa::sse2:
      return exp_pass_sse2(x, n, s, m, thr, out);
    case simd::isa::scalar:
      break;
  }
#endif
  return exp_pass_scalar(x, n, s, m, thr, out);
}

/// probability_pass on the active instruction set (file comment), in place.
inline void probability_pass(float* out, index_t n, const probability_cuts& c) noexcept {
#if SPECULA_SIMD_X86
  const simd::isa path = simd::active_isa();
  const auto run = [&](auto top_p, auto min_p) {
    constexpr bool tp = decltype(top_p)::value, mp = decltype(min_p)::value;
    if (path == simd::isa::avx512) return probability_pass_avx512<tp, mp>(out, n, c);
    return probability_pass_avx2<tp, mp>(out, n, c);
  };
  if (path >= simd::isa::avx2) {
    using yes = std::true_type;
    using no = std::false_type;
    if (c.top_p)
      c.min_p ? run(yes{}, yes{}) : run(yes{}, no{});
    else
      c.min_p ? run(no{}, yes{}) : run(no{}, no{});
    return;
  }
#endif
  probability_pass_scalar(out, n, c);
}

}  // namespace specula::detail
