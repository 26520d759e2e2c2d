#pragma once

/// @file
/// The dense kernels of the example transformer: linear layers (the packed small-m products of
/// gemm.hpp, or OpenBLAS's sgemm when built with SPECULA_EXAMPLE_WITH_BLAS), attention of a
/// block of nodes for one KV head, RMSNorm and SwiGLU. Reductions outside the products are
/// written as `omp simd` loops (compiled with -fopenmp-simd), so the compiler may vectorise them
/// without -ffast-math.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "specula/backend/thread_pool.hpp"
#include "specula/core/types.hpp"
#include "specula_example/gemm.hpp"

#if defined(SPECULA_EXAMPLE_WITH_BLAS)
#include <cblas.h>
#endif

namespace specula::example {

/// Which matrix-multiply kernel the linear layers use.
enum class matmul_kernel {
  builtin,  ///< the packed micro-kernels of gemm.hpp
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

/// Threads a pass uses with `backend_options::threads = 0`: one per hardware thread, at most
/// four (the shipped models' products are too small to feed more).
[[nodiscard]] inline int hardware_threads() noexcept {
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
}

/// How the example transformer runs its kernels.
struct backend_options {
  matmul_kernel kernel = have_blas() ? matmul_kernel::blas : matmul_kernel::builtin;
  /// Instruction set of the built-in kernels (see gemm.hpp); must be one `cpu_supports` accepts.
  cpu_isa isa = best_cpu_isa();
  /// Threads one pass may use (the caller and workers of the library's process-wide pool): 1
  /// (the default) for the calling thread only, 0 for `hardware_threads()`. One by default
  /// because a second thread did not measurably help on the two-core machine, shared with
  /// other jobs, where it was measured (docs/PERFORMANCE.md). A product is split only when it
  /// is large enough (`detail::parallel_min_flops`).
  int threads = 1;
};

namespace detail {

/// The resolved options a pass runs with.
struct kernel_context {
  matmul_kernel kernel = matmul_kernel::builtin;
  cpu_isa isa = cpu_isa::generic;
  int threads = 1;
};

/// Products smaller than this many flops run on one thread: about 10 us of kernel time, above
/// the few microseconds it takes to wake a pooled worker.
inline constexpr double parallel_min_flops = 1e6;

/// A linear layer's weights as its kernel reads them: packed panels (built-in kernel) or the
/// row-major [out, in] matrix (BLAS). Several matrices with the same `in` can be stacked.
class linear_weights {
 public:
  linear_weights() = default;
  linear_weights(matmul_kernel kernel, index_t in,
                 std::initializer_list<std::span<const float>> stacked) {
    if (kernel == matmul_kernel::blas) {
      for (const auto& w : stacked) dense_.insert(dense_.end(), w.begin(), w.end());
      in_ = in;
      out_ = static_cast<index_t>(dense_.size()) / in;
    } else {
      packed_ = packed_weights(in, stacked);
      in_ = in;
      out_ = packed_.out();
    }
  }
  [[nodiscard]] index_t in() const noexcept { return in_; }
  [[nodiscard]] index_t out() const noexcept { return out_; }
  [[nodiscard]] const packed_weights& packed() const noexcept { return packed_; }
  [[nodiscard]] const float* dense() const noexcept { return dense_.data(); }

 private:
  index_t in_ = 0, out_ = 0;
  packed_weights packed_;
  std::vector<float> dense_;
};

/// Calls fn(part) for part < parts on up to kc.threads threads of the library's process-wide
/// pool (specula::host::default_pool(): parts are claimed one at a time, the caller takes part,
/// so a worker that starts late costs nothing). An exception from fn is rethrown here.
template <class F>
void parallel_parts(const kernel_context& kc, index_t parts, F&& fn) {
  if (parts <= 1 || kc.threads <= 1) {
    for (index_t p = 0; p < parts; ++p) fn(p);
    return;
  }
  std::exception_ptr error;
  std::once_flag first_error;
  auto task = [&](index_t p) noexcept {
    try {
      fn(p);
    } catch (...) {
      std::call_once(first_error, [&] { error = std::current_exception(); });
    }
  };
  host::default_pool().bulk(parts, host::bulk_task(task), kc.threads);
  if (error) std::rethrow_exception(error);
}

/// y[r, o] = sum_i x[r * ldx + i] * w[o, i] for r < rows, o < w.out() (y rows of w.out()).
inline void linear(const kernel_context& kc, const float* x, index_t rows, index_t ldx,
                   const linear_weights& w, float* y) {
  if (rows == 0) return;
#if defined(SPECULA_EXAMPLE_WITH_BLAS)
  if (kc.kernel == matmul_kernel::blas) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                static_cast<int>(w.out()), static_cast<int>(w.in()), 1.0f, x, static_cast<int>(ldx),
                w.dense(), static_cast<int>(w.in()), 0.0f, y, static_cast<int>(w.out()));
    return;
  }
#endif
  const gemm_args g{.m = rows,
                    .n = w.out(),
                    .k = w.in(),
                    .a = x,
                    .lda = ldx,
                    .b = w.packed().data(),
                    .c = y,
                    .ldc = w.out()};
  // Parts of whole panel pairs (the tiles' widest group), a few per thread so that a thread
  // that starts late takes fewer.
  const index_t panels = w.packed().panels(), pairs = (panels + 1) / 2;
  const double flops = 2.0 * static_cast<double>(rows * w.out() * w.in());
  const index_t parts =
      kc.threads > 1 && flops >= parallel_min_flops ? std::min<index_t>(4 * kc.threads, pairs) : 1;
  parallel_parts(kc, parts, [&](index_t p) {
    gemm_panels(kc.isa, g, std::min(panels, 2 * (p * pairs / parts)),
                std::min(panels, 2 * ((p + 1) * pairs / parts)));
  });
}

/// Reused buffers of `attend_block`.
struct attention_scratch {
  aligned_vector<float> q, keys, values, scores, out;
  std::vector<float> inv_sum;
};

/// Attention of a block of n nodes for one KV head and the `group` query heads that share it,
/// all query rows against one pass over the keys. Keys and values: `ctx` committed rows (row j at
/// ck / cv + j * stride, all visible) followed by the block's n rows (pk / pv + j * stride), the
/// head's offset already applied. Node i sees block row j when bit j of mask row i is set (rows
/// of ceil(n / 64) words). Query and output of node i, head h < group: q / out + i * q_stride +
/// h * hd. Scores S = Q Kᵀ and outputs P V are products of gemm.hpp (keys transposed and values
/// copied into panels first), the softmax runs row by row in between.
inline void attend_block(cpu_isa isa, const float* q, float* out, index_t q_stride, index_t group,
                         index_t hd, const float* ck, const float* cv, index_t ctx, const float* pk,
                         const float* pv, index_t n, index_t stride, const std::uint64_t* mask,
                         float scale, attention_scratch& s) {
  const auto sz = [](index_t v) { return static_cast<std::size_t>(v); };
  const index_t keys = ctx + n, rows = n * group, words = (n + 63) / 64;
  const index_t key_cols = panels_of(keys) * panel_width, hd_cols = panels_of(hd) * panel_width;
  const auto key = [&](index_t j) { return j < ctx ? ck + j * stride : pk + (j - ctx) * stride; };
  const auto value = [&](index_t j) { return j < ctx ? cv + j * stride : pv + (j - ctx) * stride; };

  s.q.resize(sz(rows * hd));
  for (index_t i = 0; i < n; ++i)
    std::copy_n(q + i * q_stride, group * hd, s.q.begin() + i * group * hd);
  // Keys transposed into panels of 16 keys: keys[p][t][j] = element t of key 16p + j.
  s.keys.resize(sz(key_cols * hd));
  std::fill(s.keys.end() - panel_width * hd, s.keys.end(), 0.0f);
  for (index_t j = 0; j < keys; ++j) {
    const float* kj = key(j);
    float* dst = s.keys.data() + (j / panel_width) * hd * panel_width + j % panel_width;
    for (index_t t = 0; t < hd; ++t) dst[t * panel_width] = kj[t];
  }
  // Values in panels of 16 columns: values[p][j][c] = column 16p + c of value j.
  s.values.resize(sz(hd_cols * keys));
  for (index_t p = 0; p < hd_cols / panel_width; ++p) {
    const index_t cols = std::min(panel_width, hd - p * panel_width);
    float* dst = s.values.data() + p * keys * panel_width;
    for (index_t j = 0; j < keys; ++j, dst += panel_width) {
      std::copy_n(value(j) + p * panel_width, cols, dst);
      std::fill(dst + cols, dst + panel_width, 0.0f);
    }
  }

  s.scores.resize(sz(rows * key_cols));
  gemm_panels(isa,
              {.m = rows,
               .n = keys,
               .k = hd,
               .a = s.q.data(),
               .lda = hd,
               .b = s.keys.data(),
               .c = s.scores.data(),
               .ldc = key_cols,
               .c_padded = true},
              0, panels_of(keys));

  s.inv_sum.resize(sz(rows));
  for (index_t i = 0; i < n; ++i) {
    const std::uint64_t* m = mask + i * words;
    for (index_t h = 0; h < group; ++h) {
      float* row = s.scores.data() + (i * group + h) * key_cols;
      for (index_t j = 0; j < n; ++j)
        if (((m[j / 64] >> (j % 64)) & 1u) == 0) row[ctx + j] = -INFINITY;
      s.inv_sum[sz(i * group + h)] = 1.0f / softmax_row(isa, row, keys, scale);
    }
  }

  s.out.resize(sz(rows * hd_cols));
  gemm_panels(isa,
              {.m = rows,
               .n = hd,
               .k = keys,
               .a = s.scores.data(),
               .lda = key_cols,
               .b = s.values.data(),
               .c = s.out.data(),
               .ldc = hd_cols,
               .c_padded = true},
              0, panels_of(hd));
  for (index_t i = 0; i < n; ++i)
    for (index_t h = 0; h < group; ++h) {
      const index_t r = i * group + h;
      const float inv = s.inv_sum[sz(r)];
      const float* o = s.out.data() + r * hd_cols;
      float* dst = out + i * q_stride + h * hd;
#pragma omp simd
      for (index_t t = 0; t < hd; ++t) dst[t] = o[t] * inv;
    }
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

/// SwiGLU on rows holding [gate | up] (2 * d_ff values each): gate <- silu(gate) * up.
inline void swiglu_rows(cpu_isa isa, float* rows_data, index_t rows, index_t d_ff) noexcept {
  for (index_t r = 0; r < rows; ++r) {
    float* g = rows_data + r * 2 * d_ff;
    silu_mul(isa, g, g + d_ff, d_ff);
  }
}

}  // namespace detail
}  // namespace specula::example
