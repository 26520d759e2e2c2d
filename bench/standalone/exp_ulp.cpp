// Accuracy of specula's exp_f32 (core/exp.hpp) against a correctly rounded exp, over every float
// in a range, and a check that every instruction-set kernel gives the scalar bits on each of
// them. A plain program (not a ctest: it takes about a minute):
//
//   g++ -O2 -std=c++20 -Iinclude bench/standalone/exp_ulp.cpp -o exp_ulp && ./exp_ulp [lo hi]
//
// The reference: exp in double (glibc, error below 1 ulp of double) rounded to float, and where
// that double lies within 2^-40 (relative) of a point halfway between two floats, exp in long
// double (64-bit significand) rounded to float instead. Prints the largest error in ulps of the
// correctly rounded result (for subnormal results, in units of the smallest subnormal), the
// number of floats at each error, and the first argument where a SIMD kernel differs from the
// scalar definition (none expected).

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "specula/core/exp.hpp"

using specula::detail::exp_f32;

namespace {

float correctly_rounded_exp(float x) {
  const double d = std::exp(static_cast<double>(x));
  const float f = static_cast<float>(d);
  if (!std::isfinite(f) || f == 0.0f) return f;
  // The float neighbour on d's side, and the midpoint between them.
  const float g = std::nextafter(f, d > static_cast<double>(f) ? INFINITY : 0.0f);
  const double mid = (static_cast<double>(f) + static_cast<double>(g)) / 2;
  if (std::fabs(d - mid) > std::ldexp(std::fabs(d), -40)) return f;
  return static_cast<float>(std::exp(static_cast<long double>(x)));
}

/// |a - b| in units of the last place of b (the correctly rounded value).
double ulp_error(float a, float b) {
  if (a == b) return 0.0;
  if (std::isinf(b) || std::isinf(a)) return 1e9;
  const auto ka = static_cast<std::int64_t>(std::bit_cast<std::uint32_t>(a));
  const auto kb = static_cast<std::int64_t>(std::bit_cast<std::uint32_t>(b));
  return static_cast<double>(ka > kb ? ka - kb : kb - ka);  // both >= 0: keys are ordered
}

#if SPECULA_EXP_X86
__attribute__((target("sse2"))) void exp_sse2_16(const float* x, float* y) {
  for (int j = 0; j < 16; j += 4)
    _mm_storeu_ps(y + j, specula::detail::exp_sse2(_mm_loadu_ps(x + j)));
}
__attribute__((target("avx2,fma"))) void exp_avx2_16(const float* x, float* y) {
  for (int j = 0; j < 16; j += 8)
    _mm256_storeu_ps(y + j, specula::detail::exp_avx2(_mm256_loadu_ps(x + j)));
}
__attribute__((target(SPECULA_AVX512_TARGET))) void exp_avx512_16(const float* x, float* y) {
  _mm512_storeu_ps(y, specula::detail::exp_avx512(_mm512_loadu_ps(x)));
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const float lo = argc > 2 ? std::strtof(argv[1], nullptr) : -104.0f;
  const float hi = argc > 2 ? std::strtof(argv[2], nullptr) : 89.0f;
  double worst = 0.0;
  float worst_x = 0.0f;
  std::map<double, std::uint64_t> histogram;
  std::uint64_t count = 0, simd_mismatch = 0;
  float first_mismatch = 0.0f;
  constexpr int block = 16;
  float xs[block];
  int filled = 0;
  auto flush = [&] {
#if SPECULA_EXP_X86
    __builtin_cpu_init();
    const bool has512 = __builtin_cpu_supports("avx512f") != 0;
    float s4[16], s8[16], s16[16];
    exp_sse2_16(xs, s4);
    exp_avx2_16(xs, s8);
    if (has512) exp_avx512_16(xs, s16);
#endif
    for (int j = 0; j < filled; ++j) {
      const float x = xs[j];
      const float got = exp_f32(x);
#if SPECULA_EXP_X86
      const auto b = std::bit_cast<std::uint32_t>(got);
      if (std::bit_cast<std::uint32_t>(s4[j]) != b || std::bit_cast<std::uint32_t>(s8[j]) != b ||
          (has512 && std::bit_cast<std::uint32_t>(s16[j]) != b)) {
        if (simd_mismatch++ == 0) first_mismatch = x;
      }
#endif
      const double e = ulp_error(got, correctly_rounded_exp(x));
      ++histogram[e];
      if (e > worst) {
        worst = e;
        worst_x = x;
      }
      ++count;
    }
    filled = 0;
  };
  // Every float from lo to hi, walked in the order of the values.
  for (float x = lo;; x = std::nextafter(x, INFINITY)) {
    xs[filled++] = x;
    if (filled == block) flush();
    if (x >= hi) break;
  }
  if (filled > 0) {
    for (int j = filled; j < block; ++j) xs[j] = 0.0f;  // padding, not counted
    flush();
  }
  std::printf("exp_f32 over [%g, %g]: %llu floats, max error %.0f ulp (at x = %.9g)\n",
              static_cast<double>(lo), static_cast<double>(hi),
              static_cast<unsigned long long>(count), worst, static_cast<double>(worst_x));
  for (const auto& [e, n] : histogram)
    std::printf("  %.0f ulp: %llu\n", e, static_cast<unsigned long long>(n));
  std::printf("SIMD kernels differing from the scalar definition: %llu",
              static_cast<unsigned long long>(simd_mismatch));
  if (simd_mismatch > 0) std::printf(" (first at x = %.9g)", static_cast<double>(first_mismatch));
  std::printf("\n");
  return simd_mismatch == 0 ? 0 : 1;
}
