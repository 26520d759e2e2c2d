#pragma once

/// @file
/// The exponential of the host's softmax: exp_f32, a float exp whose bits are the same on every
/// instruction-set path (scalar, SSE2, AVX2, AVX-512) and every compiler setting, unlike
/// std::exp, whose result depends on the C library.
///
/// Definition (each step rounded to float on its own; no fused multiply-add anywhere):
///   x  = max(x, -104), then min(x, 89)   (NaN passes through both; -inf gives 0, +inf gives inf)
///   t  = x * log2(e) + 1.5 * 2^23         (t - 1.5 * 2^23 = n, x * log2(e) rounded to an integer)
///   nf = t - 1.5 * 2^23
///   r  = (x - nf * ln2_hi) - nf * ln2_lo  (Cody-Waite: nf * ln2_hi and the first difference exact)
///   y  = ((((c0 r + c1) r + c2) r + c3) r + c4) r + c5    (Horner, Cephes' expf coefficients)
///   y  = ((y * (r * r)) + r) + 1          (exp(r), r in about [-ln2/2, ln2/2])
///   exp_f32(x) = (y * 2^n1) * 2^n2        (n1 = floor(n / 2), n2 = n - n1: both factors normal, so
///                                          the first product is exact and the second rounds once,
///                                          also into the subnormal range)
/// n is read from the bits of t (its low mantissa bits), not converted, so no path needs a
/// float-to-integer conversion and NaN stays defined.
///
/// Accuracy against a correctly rounded exp (tools/exp_ulp.cpp, every float checked): at most
/// 1 ulp over [-104, 89], the whole range where the result is neither 0 nor infinite, and over
/// [-87.33, 0], the arguments x - max of a softmax with normal results (see docs/PERFORMANCE.md
/// for the measured distribution). exp_f32(0) = 1 exactly, so the largest logit of a row gets
/// e = 1.
///
/// The SIMD versions (exp_sse2, exp_avx2, exp_avx512) apply the same operations lane by lane,
/// except for three instructions that give the same values in fewer operations:
/// - AVX2 and AVX-512 round x * log2(e) to the nearest integer, ties to even, with vroundps /
///   vrndscaleps: the shifter's addition and subtraction give that integer too (the sum lies in
///   [2^23, 2^24), where the float spacing is 1, and 1.5 * 2^23 is even), except that the
///   rounding instruction keeps the sign of a zero, which changes no later value (the sign of
///   nf * ln2_hi and nf * ln2_lo never reaches a nonzero r, and 2^(+-0) = 1);
/// - AVX2 and AVX-512 compute x - nf * ln2_hi with one fused negative multiply-add: the product
///   is exact (at most 9 + 8 significant bits), so the fused and the separate forms round the
///   same exact difference once;
/// - AVX-512 scales by 2^n in one instruction (vscalefps: y * 2^n rounded once, the value the
///   two products give).
/// Products go through an empty asm statement before the addition they feed, so that no
/// compiler contracts them into an FMA (GCC does so in functions compiled for AVX-512, and in
/// any function of a translation unit built with -mfma or -march=native), which keeps the bits
/// of every path equal to the scalar definition whatever the consumer's flags.

#include <bit>
#include <cstdint>

#include "specula/core/config.hpp"
#include "specula/core/numeric.hpp"

#if !defined(SPECULA_NO_SIMD) && !defined(__CUDACC__) && defined(__x86_64__) && \
    (defined(__GNUC__) || defined(__clang__))
// GCC 12 warns, wrongly, that the AVX-512 intrinsics' _mm512_undefined_* operands are used
// uninitialised (GCC bug 105593, fixed in 12.3 and 13); the warnings point into the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC warning: Clang would warn that it does not know it
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
#define SPECULA_EXP_X86 1
#else
#define SPECULA_EXP_X86 0
#endif

namespace specula::detail {

/// The constants of exp_f32 (see the file comment).
struct exp_f32_constants {
  static constexpr float lo = -104.0f;  ///< below: the result rounds to 0
  static constexpr float hi = 89.0f;    ///< above: the result is infinite
  static constexpr float log2e = 1.44269504088896341f;
  static constexpr float shifter = 12582912.0f;  ///< 1.5 * 2^23
  static constexpr std::uint32_t shifter_bits = 0x4B400000u;
  static constexpr float ln2_hi = 0.693359375f;  ///< 9 significant bits: nf * ln2_hi is exact
  static constexpr float ln2_lo = -2.12194440e-4f;
  static constexpr float c0 = 1.9875691500e-4f;
  static constexpr float c1 = 1.3981999507e-3f;
  static constexpr float c2 = 8.3334519073e-3f;
  static constexpr float c3 = 4.1665795894e-2f;
  static constexpr float c4 = 1.6666665459e-1f;
  static constexpr float c5 = 5.0000001201e-1f;
};

/// Keeps the compiler from fusing the product `v` into the addition that follows (host); the
/// device's products are rounded on their own by fmul_rn.
SPECULA_HOST_DEVICE inline float exp_rounded(float v) noexcept {
#if !SPECULA_IS_DEVICE_CODE && (defined(__GNUC__) || defined(__clang__))
#if defined(__x86_64__) || defined(__i386__)
  __asm__("" : "+x"(v));
#elif defined(__aarch64__)
  __asm__("" : "+w"(v));
#endif
#endif
  return v;
}

/// exp(x) in float by the definition of the file comment; the scalar path of every kernel.
SPECULA_HOST_DEVICE inline float exp_f32(float x) noexcept {
  using k = exp_f32_constants;
  x = k::lo > x ? k::lo : x;  // the operand order of maxps/minps: NaN gives x
  x = k::hi < x ? k::hi : x;
  const float t = fadd_rn(exp_rounded(fmul_rn(x, k::log2e)), k::shifter);
  const float nf = fsub_rn(t, k::shifter);
  const float rh = fsub_rn(x, exp_rounded(fmul_rn(nf, k::ln2_hi)));
  const float r = fsub_rn(rh, exp_rounded(fmul_rn(nf, k::ln2_lo)));
  const float z = fmul_rn(r, r);
  float y = k::c0;
  y = fadd_rn(exp_rounded(fmul_rn(y, r)), k::c1);
  y = fadd_rn(exp_rounded(fmul_rn(y, r)), k::c2);
  y = fadd_rn(exp_rounded(fmul_rn(y, r)), k::c3);
  y = fadd_rn(exp_rounded(fmul_rn(y, r)), k::c4);
  y = fadd_rn(exp_rounded(fmul_rn(y, r)), k::c5);
  y = fadd_rn(fadd_rn(exp_rounded(fmul_rn(y, z)), r), 1.0f);
  const auto n = static_cast<std::int32_t>(std::bit_cast<std::uint32_t>(t) - k::shifter_bits);
  const std::int32_t n1 = n >> 1;
  const std::int32_t n2 = n - n1;
  const float s1 = std::bit_cast<float>(static_cast<std::uint32_t>(n1 + 127) << 23);
  const float s2 = std::bit_cast<float>(static_cast<std::uint32_t>(n2 + 127) << 23);
  return fmul_rn(exp_rounded(fmul_rn(y, s1)), s2);
}

#if SPECULA_EXP_X86

/// The vector form of exp_rounded (a GNU statement expression: the kernels are GCC/Clang only).
#define SPECULA_EXP_ROUNDED(expr)   \
  __extension__({                   \
    auto specula_v_ = (expr);       \
    __asm__("" : "+v"(specula_v_)); \
    specula_v_;                     \
  })

/// exp_f32 on four lanes. With NonPositive, for arguments <= 0 (or -inf) only, the upper clamp,
/// which cannot change them, is left out.
template <bool NonPositive = false>
[[nodiscard]] __attribute__((target("sse2"))) inline __m128 exp_sse2(__m128 x) noexcept {
  using k = exp_f32_constants;
  x = _mm_max_ps(_mm_set1_ps(k::lo), x);
  if constexpr (!NonPositive) x = _mm_min_ps(_mm_set1_ps(k::hi), x);
  const __m128 shifter = _mm_set1_ps(k::shifter);
  const __m128 t = _mm_add_ps(SPECULA_EXP_ROUNDED(_mm_mul_ps(x, _mm_set1_ps(k::log2e))), shifter);
  const __m128 nf = _mm_sub_ps(t, shifter);
  const __m128 rh = _mm_sub_ps(x, SPECULA_EXP_ROUNDED(_mm_mul_ps(nf, _mm_set1_ps(k::ln2_hi))));
  const __m128 r = _mm_sub_ps(rh, SPECULA_EXP_ROUNDED(_mm_mul_ps(nf, _mm_set1_ps(k::ln2_lo))));
  const __m128 z = _mm_mul_ps(r, r);
  __m128 y = _mm_set1_ps(k::c0);
  y = _mm_add_ps(SPECULA_EXP_ROUNDED(_mm_mul_ps(y, r)), _mm_set1_ps(k::c1));
  y = _mm_add_ps(SPECULA_EXP_ROUNDED(_mm_mul_ps(y, r)), _mm_set1_ps(k::c2));
  y = _mm_add_ps(SPECULA_EXP_ROUNDED(_mm_mul_ps(y, r)), _mm_set1_ps(k::c3));
  y = _mm_add_ps(SPECULA_EXP_ROUNDED(_mm_mul_ps(y, r)), _mm_set1_ps(k::c4));
  y = _mm_add_ps(SPECULA_EXP_ROUNDED(_mm_mul_ps(y, r)), _mm_set1_ps(k::c5));
  y = _mm_add_ps(_mm_add_ps(SPECULA_EXP_ROUNDED(_mm_mul_ps(y, z)), r), _mm_set1_ps(1.0f));
  const __m128i n =
      _mm_sub_epi32(_mm_castps_si128(t), _mm_set1_epi32(static_cast<int>(k::shifter_bits)));
  const __m128i n1 = _mm_srai_epi32(n, 1);
  const __m128i n2 = _mm_sub_epi32(n, n1);
  const __m128i bias = _mm_set1_epi32(127);
  const __m128 s1 = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(n1, bias), 23));
  const __m128 s2 = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(n2, bias), 23));
  return _mm_mul_ps(SPECULA_EXP_ROUNDED(_mm_mul_ps(y, s1)), s2);
}

/// exp_f32 on eight lanes. With NonPositive, for arguments <= 0 (or -inf) only, the upper clamp,
/// which cannot change them, is left out.
template <bool NonPositive = false>
[[nodiscard]] __attribute__((target("avx2,fma"))) inline __m256 exp_avx2(__m256 x) noexcept {
  using k = exp_f32_constants;
  x = _mm256_max_ps(_mm256_set1_ps(k::lo), x);
  if constexpr (!NonPositive) x = _mm256_min_ps(_mm256_set1_ps(k::hi), x);
  // nf = n as a float (the file comment); x - nf * ln2_hi fused (its product is exact).
  const __m256 nf = _mm256_round_ps(SPECULA_EXP_ROUNDED(_mm256_mul_ps(x, _mm256_set1_ps(k::log2e))),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 rh = _mm256_fnmadd_ps(nf, _mm256_set1_ps(k::ln2_hi), x);
  const __m256 r =
      _mm256_sub_ps(rh, SPECULA_EXP_ROUNDED(_mm256_mul_ps(nf, _mm256_set1_ps(k::ln2_lo))));
  const __m256 z = _mm256_mul_ps(r, r);
  __m256 y = _mm256_set1_ps(k::c0);
  y = _mm256_add_ps(SPECULA_EXP_ROUNDED(_mm256_mul_ps(y, r)), _mm256_set1_ps(k::c1));
  y = _mm256_add_ps(SPECULA_EXP_ROUNDED(_mm256_mul_ps(y, r)), _mm256_set1_ps(k::c2));
  y = _mm256_add_ps(SPECULA_EXP_ROUNDED(_mm256_mul_ps(y, r)), _mm256_set1_ps(k::c3));
  y = _mm256_add_ps(SPECULA_EXP_ROUNDED(_mm256_mul_ps(y, r)), _mm256_set1_ps(k::c4));
  y = _mm256_add_ps(SPECULA_EXP_ROUNDED(_mm256_mul_ps(y, r)), _mm256_set1_ps(k::c5));
  y = _mm256_add_ps(_mm256_add_ps(SPECULA_EXP_ROUNDED(_mm256_mul_ps(y, z)), r),
                    _mm256_set1_ps(1.0f));
  const __m256i n = _mm256_cvtps_epi32(nf);  // exact: nf is an integer, |nf| <= 150
  const __m256i n1 = _mm256_srai_epi32(n, 1);
  const __m256i n2 = _mm256_sub_epi32(n, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(SPECULA_EXP_ROUNDED(_mm256_mul_ps(y, s1)), s2);
}

#define SPECULA_AVX512_TARGET "avx512f,avx512dq,avx512bw,avx512vl"

/// exp_f32 on sixteen lanes. With NonPositive, for arguments <= 0 (or -inf) only, the upper clamp,
/// which cannot change them, is left out.
template <bool NonPositive = false>
[[nodiscard]] __attribute__((target(SPECULA_AVX512_TARGET))) inline __m512 exp_avx512(
    __m512 x) noexcept {
  using k = exp_f32_constants;
  x = _mm512_max_ps(_mm512_set1_ps(k::lo), x);
  if constexpr (!NonPositive) x = _mm512_min_ps(_mm512_set1_ps(k::hi), x);
    // nf = n as a float (the file comment); x - nf * ln2_hi fused (its product is exact).
    // (GCC's _mm512_roundscale_ps macro converts the all-ones mask to a signed type.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-conversion"
#pragma GCC diagnostic ignored "-Wconversion"
  const __m512 nf =
      _mm512_roundscale_ps(SPECULA_EXP_ROUNDED(_mm512_mul_ps(x, _mm512_set1_ps(k::log2e))),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#pragma GCC diagnostic pop
  const __m512 rh = _mm512_fnmadd_ps(nf, _mm512_set1_ps(k::ln2_hi), x);
  const __m512 r =
      _mm512_sub_ps(rh, SPECULA_EXP_ROUNDED(_mm512_mul_ps(nf, _mm512_set1_ps(k::ln2_lo))));
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 y = _mm512_set1_ps(k::c0);
  y = _mm512_add_ps(SPECULA_EXP_ROUNDED(_mm512_mul_ps(y, r)), _mm512_set1_ps(k::c1));
  y = _mm512_add_ps(SPECULA_EXP_ROUNDED(_mm512_mul_ps(y, r)), _mm512_set1_ps(k::c2));
  y = _mm512_add_ps(SPECULA_EXP_ROUNDED(_mm512_mul_ps(y, r)), _mm512_set1_ps(k::c3));
  y = _mm512_add_ps(SPECULA_EXP_ROUNDED(_mm512_mul_ps(y, r)), _mm512_set1_ps(k::c4));
  y = _mm512_add_ps(SPECULA_EXP_ROUNDED(_mm512_mul_ps(y, r)), _mm512_set1_ps(k::c5));
  y = _mm512_add_ps(_mm512_add_ps(SPECULA_EXP_ROUNDED(_mm512_mul_ps(y, z)), r),
                    _mm512_set1_ps(1.0f));
  // y * 2^nf rounded once (vscalefps), which is (y * 2^n1) * 2^n2 of the other paths: the first
  // product is exact, the second rounds once, into the subnormal range too.
  return _mm512_scalef_ps(y, nf);
}

#endif  // SPECULA_EXP_X86

}  // namespace specula::detail
