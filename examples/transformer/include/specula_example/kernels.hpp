#pragma once

/// @file
/// The dense kernels of the example transformer: row-major linear layers (a built-in blocked
/// kernel, or OpenBLAS's sgemm when built with SPECULA_EXAMPLE_WITH_BLAS), RMSNorm and SwiGLU.
/// Reductions are written as `omp simd` loops (compiled with -fopenmp-simd), so the compiler may
/// vectorise them without -ffast-math.

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "specula/core/types.hpp"

#if defined(SPECULA_EXAMPLE_WITH_BLAS)
#include <cblas.h>
#endif

namespace specula::example {

/// Which matrix-multiply kernel the linear layers use.
enum class matmul_kernel {
  builtin,  ///< the blocked loops below
  blas,     ///< cblas_sgemm (only when built with SPECULA_EXAMPLE_WITH_BLAS)
};

/// True when this build links a BLAS.
[[nodiscard]] constexpr bool have_blas() noexcept {
#if defined(SPECULA_EXAMPLE_WITH_BLAS)
  return true;
#else
  return false;
#endif
}

namespace detail {

[[nodiscard]] inline float dot(const float* a, const float* b, index_t n) noexcept {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (index_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

/// y[r, o] = sum_i x[r, i] * w[o, i] for r < rows, o < out (w is [out, in], as nn.Linear).
/// Four weight rows are held while every input row streams past them, so each weight is read
/// once per call whatever the number of rows.
inline void linear_builtin(const float* x, index_t rows, index_t in, const float* w, index_t out,
                           float* y) noexcept {
  index_t o = 0;
  for (; o + 4 <= out; o += 4) {
    const float* w0 = w + (o + 0) * in;
    const float* w1 = w + (o + 1) * in;
    const float* w2 = w + (o + 2) * in;
    const float* w3 = w + (o + 3) * in;
    for (index_t r = 0; r < rows; ++r) {
      const float* xr = x + r * in;
      float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
      for (index_t i = 0; i < in; ++i) {
        const float xi = xr[i];
        s0 += xi * w0[i];
        s1 += xi * w1[i];
        s2 += xi * w2[i];
        s3 += xi * w3[i];
      }
      float* yr = y + r * out + o;
      yr[0] = s0;
      yr[1] = s1;
      yr[2] = s2;
      yr[3] = s3;
    }
  }
  for (; o < out; ++o)
    for (index_t r = 0; r < rows; ++r) y[r * out + o] = dot(x + r * in, w + o * in, in);
}

inline void linear(matmul_kernel kernel, const float* x, index_t rows, index_t in, const float* w,
                   index_t out, float* y) noexcept {
#if defined(SPECULA_EXAMPLE_WITH_BLAS)
  if (kernel == matmul_kernel::blas) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                static_cast<int>(out), static_cast<int>(in), 1.0f, x, static_cast<int>(in), w,
                static_cast<int>(in), 0.0f, y, static_cast<int>(out));
    return;
  }
#else
  (void)kernel;
#endif
  linear_builtin(x, rows, in, w, out, y);
}

/// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for `rows` rows of width d.
inline void rms_norm(const float* x, index_t rows, index_t d, const float* weight, float eps,
                     float* out) noexcept {
  for (index_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (index_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float scale = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    float* o = out + r * d;
#pragma omp simd
    for (index_t i = 0; i < d; ++i) o[i] = xr[i] * scale * weight[i];
  }
}

/// gate[i] = silu(gate[i]) * up[i].
inline void swiglu(float* gate, const float* up, index_t n) noexcept {
#pragma omp simd
  for (index_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace detail
}  // namespace specula::example
