#pragma once

/// @file
/// The dense kernels of the example transformer: row-major linear layers (a built-in blocked
/// kernel, or OpenBLAS's sgemm when built with SPECULA_EXAMPLE_WITH_BLAS), RMSNorm and SwiGLU.
/// Reductions are written as `omp simd` loops (compiled with -fopenmp-simd), so the compiler may
/// vectorise them without -ffast-math.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "specula/core/types.hpp"

#if defined(SPECULA_EXAMPLE_WITH_BLAS)
#include <cblas.h>
#endif

/// SPECULA_EXAMPLE_MULTIVERSION: compile a hot loop for AVX2+FMA as well as the baseline ISA
/// and pick one at load time (GCC/Clang function multiversioning on x86-64), so the default
/// portable build still uses the wide units where the CPU has them.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define SPECULA_EXAMPLE_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SPECULA_EXAMPLE_MULTIVERSION
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
SPECULA_EXAMPLE_MULTIVERSION inline void linear_builtin(const float* x, index_t rows, index_t in,
                                                        const float* w, index_t out,
                                                        float* y) noexcept {
  index_t o = 0;
  for (; o + 4 <= out; o += 4) {
    const float* w0 = w + (o + 0) * in;
    const float* w1 = w + (o + 1) * in;
    const float* w2 = w + (o + 2) * in;
    const float* w3 = w + (o + 3) * in;
    index_t r = 0;
    for (; r + 2 <= rows; r += 2) {  // 4 weight rows x 2 input rows: 8 accumulators
      const float* xa = x + r * in;
      const float* xb = xa + in;
      float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
      float b0 = 0.0f, b1 = 0.0f, b2 = 0.0f, b3 = 0.0f;
#pragma omp simd reduction(+ : a0, a1, a2, a3, b0, b1, b2, b3)
      for (index_t i = 0; i < in; ++i) {
        const float u = xa[i];
        const float v = xb[i];
        a0 += u * w0[i];
        a1 += u * w1[i];
        a2 += u * w2[i];
        a3 += u * w3[i];
        b0 += v * w0[i];
        b1 += v * w1[i];
        b2 += v * w2[i];
        b3 += v * w3[i];
      }
      float* ya = y + r * out + o;
      float* yb = ya + out;
      ya[0] = a0;
      ya[1] = a1;
      ya[2] = a2;
      ya[3] = a3;
      yb[0] = b0;
      yb[1] = b1;
      yb[2] = b2;
      yb[3] = b3;
    }
    for (; r < rows; ++r) {
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

/// One query head's attention: softmax(q·k / sqrt(hd)) · v over `ctx` committed keys (all
/// visible) and the `n` block keys whose bits are set in `mask_row`. Keys and values are rows
/// of stride `stride`; `scores` needs ctx + n entries; writes hd outputs.
SPECULA_EXAMPLE_MULTIVERSION inline void attend(const float* q, const float* ck, const float* cv,
                                                index_t ctx, const float* pk, const float* pv,
                                                const std::uint64_t* mask_row, index_t n,
                                                index_t stride, index_t hd, float scale,
                                                float* scores, float* out) noexcept {
  const auto visible = [&](index_t j) { return ((mask_row[j / 64] >> (j % 64)) & 1u) != 0; };
  float mx = -INFINITY;
  for (index_t j = 0; j < ctx; ++j) {
    scores[j] = dot(q, ck + j * stride, hd) * scale;
    mx = std::max(mx, scores[j]);
  }
  for (index_t j = 0; j < n; ++j) {
    if (!visible(j)) continue;
    scores[ctx + j] = dot(q, pk + j * stride, hd) * scale;
    mx = std::max(mx, scores[ctx + j]);
  }
  for (index_t t = 0; t < hd; ++t) out[t] = 0.0f;
  float denom = 0.0f;
  const auto accumulate = [&](float e, const float* v) {
    denom += e;
#pragma omp simd
    for (index_t t = 0; t < hd; ++t) out[t] += e * v[t];
  };
  for (index_t j = 0; j < ctx; ++j) accumulate(std::exp(scores[j] - mx), cv + j * stride);
  for (index_t j = 0; j < n; ++j)
    if (visible(j)) accumulate(std::exp(scores[ctx + j] - mx), pv + j * stride);
  const float inv = 1.0f / denom;
#pragma omp simd
  for (index_t t = 0; t < hd; ++t) out[t] *= inv;
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
