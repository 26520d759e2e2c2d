#pragma once

/// @file
/// Small-m matrix products for the example transformer: y = x · Wᵀ for m input rows (the nodes
/// of one pass, 1 to a few hundred) against weights packed once at load time, and the vector
/// helpers of attention and the MLP (softmax rows, SiLU gating) on the same instruction set.
///
/// Packed layout (`packed_weights`): panels of 16 output columns; panel p holds, for each input
/// index k, the 16 weights W[16p + c][k] (c < 16) contiguously, zero-padded past the last
/// column. A micro-kernel ("tile") keeps MR rows × 16·NP columns of y in registers; for each k it
/// loads the NP packed weight vectors once and broadcasts one input per row, so each weight is
/// read once per MR rows instead of once per row.
///
/// Every output element is the sum over k in increasing order, one multiply-add per term
/// (fused on the AVX2 and AVX-512 paths), whatever m, the row block or the panel group: a row's
/// result does not depend on the other rows of the pass, so a batch equals its requests alone
/// bit for bit on one instruction set.
///
/// Instruction sets (`cpu_isa`): AVX-512F, AVX2+FMA and portable C++ (SSE2 on x86-64). The
/// x86 paths are compiled with target attributes in every x86-64 GCC/Clang build, whatever the
/// build's -march, and picked at run time (`best_cpu_isa()`); any supported one can be forced.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "specula/core/types.hpp"

/// SPECULA_EXAMPLE_X86_KERNELS: 1 when the AVX2 and AVX-512 kernels are compiled (x86-64 with
/// GCC or Clang), else 0.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define SPECULA_EXAMPLE_X86_KERNELS 1
#include <immintrin.h>
#else
#define SPECULA_EXAMPLE_X86_KERNELS 0
#endif

/// SPECULA_EXAMPLE_UNROLL: full unrolling of the register-tile loops.
#if defined(__clang__)
#define SPECULA_EXAMPLE_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define SPECULA_EXAMPLE_UNROLL _Pragma("GCC unroll 64")
#else
#define SPECULA_EXAMPLE_UNROLL
#endif

namespace specula::example {

/// The instruction set of the linear-layer and attention kernels.
enum class cpu_isa {
  generic,  ///< portable C++ (SSE2 on x86-64)
  avx2,     ///< AVX2 + FMA (x86-64-v3)
  avx512,   ///< AVX-512F
};

[[nodiscard]] inline const char* to_string(cpu_isa isa) noexcept {
  switch (isa) {
    case cpu_isa::generic:
      return "generic";
    case cpu_isa::avx2:
      return "avx2";
    case cpu_isa::avx512:
      return "avx512";
  }
  return "?";
}

/// True when this build has the kernels of `isa` and this CPU (and OS) can run them.
[[nodiscard]] inline bool cpu_supports(cpu_isa isa) noexcept {
#if SPECULA_EXAMPLE_X86_KERNELS
  __builtin_cpu_init();
  switch (isa) {
    case cpu_isa::generic:
      return true;
    case cpu_isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case cpu_isa::avx512:
      return __builtin_cpu_supports("avx512f");
  }
  return false;
#else
  return isa == cpu_isa::generic;
#endif
}

/// The widest instruction set this CPU runs (checked once).
[[nodiscard]] inline cpu_isa best_cpu_isa() noexcept {
  static const cpu_isa best = cpu_supports(cpu_isa::avx512) ? cpu_isa::avx512
                              : cpu_supports(cpu_isa::avx2) ? cpu_isa::avx2
                                                            : cpu_isa::generic;
  return best;
}

namespace detail {

/// Output columns per packed panel.
inline constexpr index_t panel_width = 16;

[[nodiscard]] constexpr index_t panels_of(index_t columns) noexcept {
  return (columns + panel_width - 1) / panel_width;
}

/// std::allocator with 64-byte (cache line) alignment.
template <class T>
struct aligned_allocator {
  using value_type = T;
  aligned_allocator() noexcept = default;
  template <class U>
  explicit aligned_allocator(const aligned_allocator<U>&) noexcept {}
  [[nodiscard]] T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete (p, std::align_val_t{64}); }
  friend bool operator==(const aligned_allocator&, const aligned_allocator&) noexcept {
    return true;
  }
};

template <class T>
using aligned_vector = std::vector<T, aligned_allocator<T>>;

}  // namespace detail

/// Weights of a linear layer ([out, in] row-major, as nn.Linear stores them) packed into panels
/// of 16 output columns (see the file comment). Several matrices with the same `in` can be
/// stacked along `out` into one (the query/key/value projections, the two MLP inputs), so that
/// one product computes them all.
class packed_weights {
 public:
  packed_weights() = default;

  /// Packs the row-major [rows_i, in] matrices of `stacked` one below the other.
  packed_weights(index_t in, std::initializer_list<std::span<const float>> stacked) : in_(in) {
    if (in <= 0) throw std::invalid_argument("packed_weights: in must be positive");
    for (const auto& w : stacked) {
      if (w.size() % static_cast<std::size_t>(in) != 0)
        throw std::invalid_argument(
            "packed_weights: a matrix is not a multiple of in = " + std::to_string(in) + " wide");
      out_ += static_cast<index_t>(w.size()) / in;
    }
    data_.assign(static_cast<std::size_t>(detail::panels_of(out_) * in * detail::panel_width),
                 0.0f);
    index_t row = 0;
    for (const auto& w : stacked)
      for (index_t r = 0; r < static_cast<index_t>(w.size()) / in; ++r, ++row) {
        float* dst = data_.data() + (row / detail::panel_width) * in * detail::panel_width +
                     row % detail::panel_width;
        for (index_t k = 0; k < in; ++k)
          dst[k * detail::panel_width] = w[static_cast<std::size_t>(r * in + k)];
      }
  }

  [[nodiscard]] index_t out() const noexcept { return out_; }
  [[nodiscard]] index_t in() const noexcept { return in_; }
  [[nodiscard]] index_t panels() const noexcept { return detail::panels_of(out_); }
  [[nodiscard]] const float* data() const noexcept { return data_.data(); }
  [[nodiscard]] bool empty() const noexcept { return out_ == 0; }

 private:
  index_t in_ = 0, out_ = 0;
  detail::aligned_vector<float> data_;
};

namespace detail {

/// c[r][col] (+)= sum_i a[r * lda + i] * B(i, col) for r < m, col < n, i < k, where B is packed
/// as panels of 16 columns (B(i, 16p + j) = b[(p * k + i) * 16 + j]), zero-padded past column n.
struct gemm_args {
  index_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  index_t lda = 0;
  const float* b = nullptr;
  float* c = nullptr;
  index_t ldc = 0;
  bool accumulate = false;  ///< add to c instead of overwriting it
  bool c_padded = false;    ///< c rows have room for whole panels (columns past n may be written)
};

/// One register tile: MR rows of a, NP panels of b, MR × 16·NP values of c.
struct tile_args {
  const float* a;
  index_t lda;
  const float* b;
  index_t ldb;
  index_t panel_stride;
  index_t k;
  float* c;
  index_t ldc;
  bool accumulate;
};

// exp(x) for the softmax and SiLU: x clamped to [-87, 88] (below -87, and -inf, give 0);
// n = round(x log2 e), r = x - n ln 2 in two parts, e^r by its Taylor polynomial of degree 7
// (|r| <= 0.35: truncation below 1e-8 relative), times 2^n built in the exponent bits.
inline constexpr float exp_lo = -87.0f, exp_hi = 88.0f, exp_log2e = 1.44269504088896341f,
                       exp_ln2_hi = 0.693359375f, exp_ln2_lo = -2.12194440e-4f;
inline constexpr float exp_taylor[8] = {1.0f,         1.0f,          0.5f,          1.0f / 6.0f,
                                        1.0f / 24.0f, 1.0f / 120.0f, 1.0f / 720.0f, 1.0f / 5040.0f};

[[nodiscard]] inline float exp_approx(float x) noexcept {
  if (!(x >= exp_lo)) return 0.0f;
  x = std::min(x, exp_hi);
  const float n = std::nearbyint(x * exp_log2e);
  float r = x - n * exp_ln2_hi;
  r = r - n * exp_ln2_lo;
  float p = exp_taylor[7];
  for (int i = 6; i >= 0; --i) p = p * r + exp_taylor[i];
  return p * std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
}

/// Portable kernels (the baseline instruction set).
struct isa_generic {
  static constexpr int max_panels = 1;
  static constexpr int rows_for(int /*np*/) noexcept { return 4; }

  template <int MR, int NP>
  static void tile(const tile_args& t) noexcept {
    float acc[MR][panel_width * NP];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < panel_width * NP; ++j)
        acc[r][j] = t.accumulate ? t.c[r * t.ldc + j] : 0.0f;
    for (index_t k = 0; k < t.k; ++k) {
      for (int r = 0; r < MR; ++r) {
        const float x = t.a[r * t.lda + k];
        for (int p = 0; p < NP; ++p) {
          const float* b = t.b + p * t.panel_stride + k * t.ldb;
          for (int j = 0; j < panel_width; ++j) acc[r][p * panel_width + j] += x * b[j];
        }
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < panel_width * NP; ++j) t.c[r * t.ldc + j] = acc[r][j];
  }

  /// s[j] <- exp((s[j] - max) * scale) for j < n (-inf entries give 0); returns the sum.
  static float softmax_row(float* s, index_t n, float scale) noexcept {
    float mx = -INFINITY;
    for (index_t j = 0; j < n; ++j) mx = std::max(mx, s[j]);
    float sum = 0.0f;
    for (index_t j = 0; j < n; ++j) {
      s[j] = exp_approx((s[j] - mx) * scale);
      sum += s[j];
    }
    return sum;
  }

  /// gate[j] <- silu(gate[j]) * up[j].
  static void silu_mul(float* gate, const float* up, index_t n) noexcept {
    for (index_t j = 0; j < n; ++j) gate[j] = gate[j] / (1.0f + exp_approx(-gate[j])) * up[j];
  }
};

#if SPECULA_EXAMPLE_X86_KERNELS

/// AVX2 + FMA: 16 ymm registers, a tile holds at most 12 accumulators.
struct isa_avx2 {
  static constexpr int max_panels = 2;
  static constexpr int rows_for(int np) noexcept { return np == 1 ? 6 : 3; }

  template <int MR, int NP>
  [[gnu::target("avx2,fma")]] static void tile(const tile_args& t) noexcept {
    constexpr int nv = 2 * NP;
    const float* a = t.a;
    const float* b = t.b;
    const index_t lda = t.lda, ldb = t.ldb, ps = t.panel_stride, kk = t.k;
    __m256 acc[MR][nv];
    SPECULA_EXAMPLE_UNROLL
    for (int r = 0; r < MR; ++r) SPECULA_EXAMPLE_UNROLL
    for (int v = 0; v < nv; ++v)
      acc[r][v] = t.accumulate ? _mm256_loadu_ps(t.c + r * t.ldc + 8 * v) : _mm256_setzero_ps();
    for (index_t k = 0; k < kk; ++k, ++a, b += ldb) {
      __m256 w[nv];
      SPECULA_EXAMPLE_UNROLL
      for (int v = 0; v < nv; ++v) w[v] = _mm256_loadu_ps(b + (v / 2) * ps + 8 * (v % 2));
      SPECULA_EXAMPLE_UNROLL
      for (int r = 0; r < MR; ++r) {
        const __m256 x = _mm256_broadcast_ss(a + r * lda);
        SPECULA_EXAMPLE_UNROLL
        for (int v = 0; v < nv; ++v) acc[r][v] = _mm256_fmadd_ps(x, w[v], acc[r][v]);
      }
    }
    SPECULA_EXAMPLE_UNROLL
    for (int r = 0; r < MR; ++r) SPECULA_EXAMPLE_UNROLL
    for (int v = 0; v < nv; ++v) _mm256_storeu_ps(t.c + r * t.ldc + 8 * v, acc[r][v]);
  }

  [[gnu::target("avx2,fma")]] static __m256 exp(__m256 x) noexcept {
    const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(exp_lo), _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(exp_lo)), _mm256_set1_ps(exp_hi));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(exp_log2e)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(exp_ln2_hi), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(exp_ln2_lo), r);
    __m256 p = _mm256_set1_ps(exp_taylor[7]);
    for (int i = 6; i >= 0; --i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(exp_taylor[i]));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
  }

  /// Lanes [0, left) set, for the tail of a row.
  [[gnu::target("avx2,fma")]] static __m256i tail_mask(index_t left) noexcept {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), lane);
  }

  [[gnu::target("avx2,fma")]] static float softmax_row(float* s, index_t n, float scale) noexcept {
    __m256 mx = _mm256_set1_ps(-INFINITY);
    index_t j = 0;
    for (; j + 8 <= n; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
    float m = -INFINITY;
    for (; j < n; ++j) m = std::max(m, s[j]);
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, mx);
    for (const float x : lanes) m = std::max(m, x);
    const __m256 vm = _mm256_set1_ps(m), vs = _mm256_set1_ps(scale);
    __m256 sum = _mm256_setzero_ps();
    for (j = 0; j + 8 <= n; j += 8) {
      const __m256 e = exp(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm), vs));
      _mm256_storeu_ps(s + j, e);
      sum = _mm256_add_ps(sum, e);
    }
    if (j < n) {
      const __m256i mask = tail_mask(n - j);
      const __m256 e =
          _mm256_and_ps(exp(_mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(s + j, mask), vm), vs)),
                        _mm256_castsi256_ps(mask));
      _mm256_maskstore_ps(s + j, mask, e);
      sum = _mm256_add_ps(sum, e);
    }
    _mm256_store_ps(lanes, sum);
    float total = 0.0f;
    for (const float x : lanes) total += x;
    return total;
  }

  [[gnu::target("avx2,fma")]] static __m256 silu_mul(__m256 g, __m256 u) noexcept {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 e = exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
  }

  [[gnu::target("avx2,fma")]] static void silu_mul(float* gate, const float* up,
                                                   index_t n) noexcept {
    index_t j = 0;
    for (; j + 8 <= n; j += 8)
      _mm256_storeu_ps(gate + j, silu_mul(_mm256_loadu_ps(gate + j), _mm256_loadu_ps(up + j)));
    if (j < n) {
      const __m256i mask = tail_mask(n - j);
      _mm256_maskstore_ps(
          gate + j, mask,
          silu_mul(_mm256_maskload_ps(gate + j, mask), _mm256_maskload_ps(up + j, mask)));
    }
  }
};

// GCC 12 reports its own _mm512_undefined_ps() inside the AVX-512 intrinsics as uninitialised
// once they are inlined (a false positive, fixed in later GCC releases).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

/// AVX-512F: 32 zmm registers, a tile holds at most 24 accumulators.
struct isa_avx512 {
  static constexpr int max_panels = 2;
  static constexpr int rows_for(int /*np*/) noexcept { return 12; }

  template <int MR, int NP>
  [[gnu::target("avx512f")]] static void tile(const tile_args& t) noexcept {
    __m512 acc[MR][NP];
    SPECULA_EXAMPLE_UNROLL
    for (int r = 0; r < MR; ++r) SPECULA_EXAMPLE_UNROLL
    for (int p = 0; p < NP; ++p)
      acc[r][p] = t.accumulate ? _mm512_loadu_ps(t.c + r * t.ldc + 16 * p) : _mm512_setzero_ps();
    for (index_t k = 0; k < t.k; ++k) {
      __m512 b[NP];
      SPECULA_EXAMPLE_UNROLL
      for (int p = 0; p < NP; ++p) b[p] = _mm512_loadu_ps(t.b + p * t.panel_stride + k * t.ldb);
      SPECULA_EXAMPLE_UNROLL
      for (int r = 0; r < MR; ++r) {
        const __m512 x = _mm512_set1_ps(t.a[r * t.lda + k]);
        SPECULA_EXAMPLE_UNROLL
        for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_fmadd_ps(x, b[p], acc[r][p]);
      }
    }
    SPECULA_EXAMPLE_UNROLL
    for (int r = 0; r < MR; ++r) SPECULA_EXAMPLE_UNROLL
    for (int p = 0; p < NP; ++p) _mm512_storeu_ps(t.c + r * t.ldc + 16 * p, acc[r][p]);
  }

  [[gnu::target("avx512f")]] static __m512 exp(__m512 x) noexcept {
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(exp_lo), _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(exp_lo)), _mm512_set1_ps(exp_hi));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(exp_log2e)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(exp_ln2_hi), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(exp_ln2_lo), r);
    __m512 p = _mm512_set1_ps(exp_taylor[7]);
    for (int i = 6; i >= 0; --i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(exp_taylor[i]));
    const __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(e));
  }

  [[gnu::target("avx512f")]] static __mmask16 tail_mask(index_t left) noexcept {
    return static_cast<__mmask16>((1u << static_cast<unsigned>(std::min<index_t>(left, 16))) - 1u);
  }

  [[gnu::target("avx512f")]] static float softmax_row(float* s, index_t n, float scale) noexcept {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    index_t j = 0;
    for (; j < n; j += 16)
      mx = _mm512_max_ps(mx,
                         _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail_mask(n - j), s + j));
    const __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(mx)), vs = _mm512_set1_ps(scale);
    __m512 sum = _mm512_setzero_ps();
    for (j = 0; j < n; j += 16) {
      const __mmask16 mask = tail_mask(n - j);
      const __m512 e = _mm512_maskz_mov_ps(
          mask, exp(_mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, s + j), vm), vs)));
      _mm512_mask_storeu_ps(s + j, mask, e);
      sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
  }

  [[gnu::target("avx512f")]] static void silu_mul(float* gate, const float* up,
                                                  index_t n) noexcept {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (index_t j = 0; j < n; j += 16) {
      const __mmask16 mask = tail_mask(n - j);
      const __m512 g = _mm512_maskz_loadu_ps(mask, gate + j);
      const __m512 e = exp(_mm512_sub_ps(_mm512_setzero_ps(), g));
      _mm512_mask_storeu_ps(gate + j, mask,
                            _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)),
                                          _mm512_maskz_loadu_ps(mask, up + j)));
    }
  }
};

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // SPECULA_EXAMPLE_X86_KERNELS

/// Runs the tile of `rows` (1..Isa::rows_for(NP)) rows and NP panels.
template <class Isa, int NP, int MR = 1>
void run_tile(int rows, const tile_args& t) noexcept {
  if constexpr (MR < Isa::rows_for(NP)) {
    if (rows != MR) return run_tile<Isa, NP, MR + 1>(rows, t);
  }
  Isa::template tile<MR, NP>(t);
}

template <class Isa>
void run_tile(int rows, int np, const tile_args& t) noexcept {
  if constexpr (Isa::max_panels >= 2)
    if (np == 2) return run_tile<Isa, 2>(rows, t);
  run_tile<Isa, 1>(rows, t);
}

/// The panel group (2 panels, or 1) whose tile holds `rows` rows, at most `avail` panels.
template <class Isa>
[[nodiscard]] int panels_for(int rows, index_t avail) noexcept {
  return Isa::max_panels >= 2 && avail >= 2 && rows <= Isa::rows_for(2) ? 2 : 1;
}

/// Columns of panels [p0, p1) of `g` (all rows).
template <class Isa>
void gemm_panels(const gemm_args& g, index_t p0, index_t p1) noexcept {
  constexpr int max_rows = Isa::rows_for(1);
  // Rows are processed in chunks whose inputs stay in the L2 cache while the panels stream by.
  constexpr index_t chunk = 16 * max_rows;
  const index_t all = panels_of(g.n);
  // A last panel that is not whole goes through a scratch tile unless c has room for it.
  const bool partial = g.n % panel_width != 0 && !g.c_padded;
  const index_t whole_end = std::min(p1, partial ? all - 1 : all);
  const index_t panel_stride = g.k * panel_width;
  const auto tile_at = [&](index_t r, index_t p, float* c, index_t ldc) {
    return tile_args{
        g.a + r * g.lda, g.lda, g.b + p * panel_stride, panel_width, panel_stride, g.k, c, ldc,
        g.accumulate};
  };
  for (index_t r0 = 0; r0 < g.m; r0 += chunk) {
    const index_t rows = std::min(chunk, g.m - r0);
    const index_t blocks = (rows + max_rows - 1) / max_rows;
    for (index_t p = p0; p < whole_end; p += Isa::max_panels) {
      const index_t group = std::min<index_t>(Isa::max_panels, whole_end - p);
      for (index_t blk = 0; blk < blocks; ++blk) {
        const index_t r = r0 + blk * rows / blocks;
        const int rb = static_cast<int>(r0 + (blk + 1) * rows / blocks - r);
        for (index_t q = 0; q < group;) {
          const int np = panels_for<Isa>(rb, group - q);
          run_tile<Isa>(rb, np, tile_at(r, p + q, g.c + r * g.ldc + (p + q) * panel_width, g.ldc));
          q += np;
        }
      }
    }
    if (partial && p1 == all) {
      const index_t p = all - 1, cols = g.n - p * panel_width;
      for (index_t blk = 0; blk < blocks; ++blk) {
        const index_t r = r0 + blk * rows / blocks;
        const int rb = static_cast<int>(r0 + (blk + 1) * rows / blocks - r);
        float scratch[max_rows * panel_width] = {};
        float* c = g.c + r * g.ldc + p * panel_width;
        if (g.accumulate)
          for (int i = 0; i < rb; ++i) std::copy_n(c + i * g.ldc, cols, scratch + i * panel_width);
        run_tile<Isa>(rb, 1, tile_at(r, p, scratch, panel_width));
        for (int i = 0; i < rb; ++i) std::copy_n(scratch + i * panel_width, cols, c + i * g.ldc);
      }
    }
  }
}

/// Columns of panels [p0, p1) of `g` with the kernels of `isa` (which the CPU must support).
inline void gemm_panels(cpu_isa isa, const gemm_args& g, index_t p0, index_t p1) noexcept {
#if SPECULA_EXAMPLE_X86_KERNELS
  if (isa == cpu_isa::avx512) return gemm_panels<isa_avx512>(g, p0, p1);
  if (isa == cpu_isa::avx2) return gemm_panels<isa_avx2>(g, p0, p1);
#endif
  (void)isa;
  gemm_panels<isa_generic>(g, p0, p1);
}

/// softmax numerators in place, returning their sum (see isa_generic::softmax_row).
inline float softmax_row(cpu_isa isa, float* s, index_t n, float scale) noexcept {
#if SPECULA_EXAMPLE_X86_KERNELS
  if (isa == cpu_isa::avx512) return isa_avx512::softmax_row(s, n, scale);
  if (isa == cpu_isa::avx2) return isa_avx2::softmax_row(s, n, scale);
#endif
  (void)isa;
  return isa_generic::softmax_row(s, n, scale);
}

/// gate[j] <- silu(gate[j]) * up[j] for j < n.
inline void silu_mul(cpu_isa isa, float* gate, const float* up, index_t n) noexcept {
#if SPECULA_EXAMPLE_X86_KERNELS
  if (isa == cpu_isa::avx512) return isa_avx512::silu_mul(gate, up, n);
  if (isa == cpu_isa::avx2) return isa_avx2::silu_mul(gate, up, n);
#endif
  (void)isa;
  isa_generic::silu_mul(gate, up, n);
}

}  // namespace detail
}  // namespace specula::example
