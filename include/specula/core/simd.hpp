#pragma once

/// @file
/// Explicit SIMD kernels for the host's fixed-order row passes, with runtime ISA dispatch.
///
/// specula is header-only, so the speed of its host loops would otherwise depend on the
/// consumer's compiler flags: g++ -O2 leaves the passes scalar and turns the clamp
/// `w > 0 ? w : 0` into a branch that mispredicts on every other element of a residual row,
/// which made chain verification about 10x slower than at -O3. The kernels here are written
/// with intrinsics inside functions compiled for their instruction set (`target` attributes),
/// so they run at the same speed whatever optimisation level or `-march` the consumer uses, and
/// the widest instruction set the CPU supports is picked at run time.
///
/// Every kernel produces the bits of the scalar definition it replaces (see
/// sample/categorical.hpp and core/validate.hpp): lane k of the eight interleaved lanes takes
/// elements k, k + 8, ... in order, lanes are combined pairwise, and only exact operations
/// (float to double conversion, subtraction, max, min, addition in the same order) are used.
/// The tests force every instruction set the CPU supports and compare bits.
///
/// Instruction sets: `scalar` (the portable loops, used on every other architecture and in CUDA
/// translation units), `sse2` (every x86-64 CPU) and `avx2`. The environment variable
/// `SPECULA_ISA` (`scalar`, `sse2` or `avx2`) caps the choice at start-up; `force_isa` changes
/// it at run time (for tests and benchmarks). Define `SPECULA_NO_SIMD` to compile the scalar
/// loops only.

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "specula/core/types.hpp"

#if !defined(SPECULA_NO_SIMD) && !defined(__CUDACC__) && defined(__x86_64__) && \
    (defined(__GNUC__) || defined(__clang__))
#define SPECULA_SIMD_X86 1
#include <immintrin.h>
#else
#define SPECULA_SIMD_X86 0
#endif

namespace specula {

/// A weight row the host passes can sum with the SIMD kernels: float rows p and q and the
/// exact rule's residual, possibly applied recursively (the K-candidate recursion). For each
/// element, v = p; then for each step s < steps: v = max(v - q', 0), multiplied by inv_z[s]
/// unless s is the last step, where q' = 0 when q is null, q when scale is null, and
/// q * scale[s] otherwise; the weight is max(v, 0). With steps = 1 and no scale this is
/// max(p - q, 0), the chain residual, or max(p, 0), a plain row. Elements listed in skip[0 ..
/// num_skip) follow other rules: tiles holding them are summed through the element calls.
/// Weight functions expose their form as `w.dense_f32()` (see sample/categorical.hpp).
struct dense_f32_weights {
  const float* p = nullptr;
  const float* q = nullptr;
  const double* scale = nullptr;
  const double* inv_z = nullptr;
  index_t steps = 1;
  const token_t* skip = nullptr;
  index_t num_skip = 0;
};

}  // namespace specula

namespace specula::simd {

/// An instruction set the host kernels can use, in increasing order of width.
enum class isa : int {
  scalar = 0,  ///< portable C++ loops
  sse2 = 1,    ///< x86-64 baseline: two doubles per vector
  avx2 = 2,    ///< four doubles per vector
};

/// The name of an instruction set ("scalar", "sse2", "avx2").
[[nodiscard]] constexpr const char* name(isa i) noexcept {
  switch (i) {
    case isa::sse2:
      return "sse2";
    case isa::avx2:
      return "avx2";
    case isa::scalar:
      break;
  }
  return "scalar";
}

/// The widest instruction set this build and this CPU support.
[[nodiscard]] inline isa supported_isa() noexcept {
#if SPECULA_SIMD_X86
  static const isa best = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? isa::avx2 : isa::sse2;
  }();
  return best;
#else
  return isa::scalar;
#endif
}

namespace detail {

/// The instruction set in force; -1 until first use.
inline std::atomic<int> active_isa_state{-1};

[[nodiscard]] inline isa min_isa(isa a, isa b) noexcept {
  return static_cast<int>(a) < static_cast<int>(b) ? a : b;
}

/// The default: supported_isa(), capped by the environment variable SPECULA_ISA.
[[nodiscard]] inline isa default_isa() noexcept {
  isa cap = isa::avx2;
  if (const char* env = std::getenv("SPECULA_ISA");
      env != nullptr) {  // NOLINT(concurrency-mt-unsafe)
    if (std::strcmp(env, "scalar") == 0) cap = isa::scalar;
    if (std::strcmp(env, "sse2") == 0) cap = isa::sse2;
  }
  return min_isa(cap, supported_isa());
}

}  // namespace detail

/// The instruction set the host kernels use now.
[[nodiscard]] inline isa active_isa() noexcept {
  int v = detail::active_isa_state.load(std::memory_order_relaxed);
  if (v < 0) {
    v = static_cast<int>(detail::default_isa());
    detail::active_isa_state.store(v, std::memory_order_relaxed);
  }
  return static_cast<isa>(v);
}

/// Makes the host kernels use `requested`, or the widest supported set below it; returns the
/// set now in force. Results do not depend on the choice (every path gives the same bits); this
/// is for tests and benchmarks. Not meant to be called while other threads run verifiers.
inline isa force_isa(isa requested) noexcept {
  const isa chosen = detail::min_isa(requested, supported_isa());
  detail::active_isa_state.store(static_cast<int>(chosen), std::memory_order_relaxed);
  return chosen;
}

}  // namespace specula::simd

namespace specula::detail {

/// Combines eight lane sums in the fixed pairwise order of the row passes.
[[nodiscard]] constexpr double combine_lanes(const double* lane) noexcept {
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/// One element of the recursive form (see dense_f32_weights) as the scalar verifiers compute
/// it: v = p; per step d = v - q' and v = max(d, 0), times inv_z[s] but for the last step;
/// returns max(v, 0) (the clamp of tile_positive_sum).
template <bool HasQ>
[[nodiscard]] inline double recursion_element(float pf, float qf, const double* scale,
                                              const double* inv_z, index_t steps) noexcept {
  double v = static_cast<double>(pf);
  const double qd = static_cast<double>(qf);
  for (index_t st = 0; st < steps; ++st) {
    double sub = 0.0;
    if constexpr (HasQ) sub = scale != nullptr ? qd * scale[st] : qd;
    const double d = v - sub;
    v = d > 0.0 ? d : 0.0;
    if (st + 1 < steps) v = v * inv_z[st];
  }
  return v > 0.0 ? v : 0.0;
}

/// Scalar tail of a tile: elements [i, len) (fewer than 8) go to lanes 0, 1, ... in order, then
/// the lanes are combined. Weights max(p - q, 0) (q == nullptr: max(p, 0)).
template <bool HasQ>
[[nodiscard]] inline double finish_tile(const float* p, const float* q, index_t i, index_t len,
                                        double* lane) noexcept {
  for (int k = 0; i < len; ++i, ++k) {
    double d = static_cast<double>(p[i]);
    if constexpr (HasQ) d -= static_cast<double>(q[i]);
    lane[k] += d > 0.0 ? d : 0.0;
  }
  return combine_lanes(lane);
}

/// Portable reference: the positive-part sum of one tile of len <= sum_tile elements.
template <bool HasQ>
[[nodiscard]] inline double tile_sum_scalar(const float* p, const float* q, index_t len) noexcept {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  index_t i = 0;
  for (; i + 8 <= len; i += 8)
    for (int k = 0; k < 8; ++k) {
      double d = static_cast<double>(p[i + k]);
      if constexpr (HasQ) d -= static_cast<double>(q[i + k]);
      lane[k] += d > 0.0 ? d : 0.0;
    }
  return finish_tile<HasQ>(p, q, i, len, lane);
}

#if SPECULA_SIMD_X86

template <bool HasQ>
[[nodiscard]] __attribute__((target("sse2"))) inline double tile_sum_sse2(const float* p,
                                                                          const float* q,
                                                                          index_t len) noexcept {
  const __m128d zero = _mm_setzero_pd();
  __m128d a0 = zero, a1 = zero, a2 = zero, a3 = zero;  // lanes 0-1, 2-3, 4-5, 6-7
  index_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m128 p0 = _mm_loadu_ps(p + i);
    const __m128 p1 = _mm_loadu_ps(p + i + 4);
    __m128d d0 = _mm_cvtps_pd(p0);
    __m128d d1 = _mm_cvtps_pd(_mm_movehl_ps(p0, p0));
    __m128d d2 = _mm_cvtps_pd(p1);
    __m128d d3 = _mm_cvtps_pd(_mm_movehl_ps(p1, p1));
    if constexpr (HasQ) {
      const __m128 q0 = _mm_loadu_ps(q + i);
      const __m128 q1 = _mm_loadu_ps(q + i + 4);
      d0 = _mm_sub_pd(d0, _mm_cvtps_pd(q0));
      d1 = _mm_sub_pd(d1, _mm_cvtps_pd(_mm_movehl_ps(q0, q0)));
      d2 = _mm_sub_pd(d2, _mm_cvtps_pd(q1));
      d3 = _mm_sub_pd(d3, _mm_cvtps_pd(_mm_movehl_ps(q1, q1)));
    }
    // max(d, 0) returns its second operand unless d > 0: NaN and -0 map to +0, as the scalar
    // clamp does.
    a0 = _mm_add_pd(a0, _mm_max_pd(d0, zero));
    a1 = _mm_add_pd(a1, _mm_max_pd(d1, zero));
    a2 = _mm_add_pd(a2, _mm_max_pd(d2, zero));
    a3 = _mm_add_pd(a3, _mm_max_pd(d3, zero));
  }
  alignas(16) double lane[8];
  _mm_store_pd(lane + 0, a0);
  _mm_store_pd(lane + 2, a1);
  _mm_store_pd(lane + 4, a2);
  _mm_store_pd(lane + 6, a3);
  return finish_tile<HasQ>(p, q, i, len, lane);
}

/// G full tiles at once (independent lane chains: G times the instruction-level and
/// memory-level parallelism of one tile); out[0 .. G) get their sums.
template <bool HasQ, int G>
__attribute__((target("avx2"))) inline void tile_group_avx2(const float* p, const float* q,
                                                            index_t tile, double* out) noexcept {
  const __m256d zero = _mm256_setzero_pd();
  __m256d lo[G], hi[G];  // lanes 0-3 and 4-7 of each tile
  for (int g = 0; g < G; ++g) lo[g] = hi[g] = zero;
  for (index_t i = 0; i < tile; i += 8)
    for (int g = 0; g < G; ++g) {
      const __m256 pv = _mm256_loadu_ps(p + g * tile + i);
      __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(pv));
      __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(pv, 1));
      if constexpr (HasQ) {
        const __m256 qv = _mm256_loadu_ps(q + g * tile + i);
        d0 = _mm256_sub_pd(d0, _mm256_cvtps_pd(_mm256_castps256_ps128(qv)));
        d1 = _mm256_sub_pd(d1, _mm256_cvtps_pd(_mm256_extractf128_ps(qv, 1)));
      }
      lo[g] = _mm256_add_pd(lo[g], _mm256_max_pd(d0, zero));
      hi[g] = _mm256_add_pd(hi[g], _mm256_max_pd(d1, zero));
    }
  alignas(32) double lane[8];
  for (int g = 0; g < G; ++g) {
    _mm256_store_pd(lane, lo[g]);
    _mm256_store_pd(lane + 4, hi[g]);
    out[g] = combine_lanes(lane);
  }
}

template <bool HasQ>
[[nodiscard]] __attribute__((target("avx2"))) inline double tile_sum_avx2(const float* p,
                                                                          const float* q,
                                                                          index_t len) noexcept {
  const __m256d zero = _mm256_setzero_pd();
  __m256d a0 = zero, a1 = zero;  // lanes 0-3, 4-7
  index_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m256 pv = _mm256_loadu_ps(p + i);
    __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(pv));
    __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(pv, 1));
    if constexpr (HasQ) {
      const __m256 qv = _mm256_loadu_ps(q + i);
      d0 = _mm256_sub_pd(d0, _mm256_cvtps_pd(_mm256_castps256_ps128(qv)));
      d1 = _mm256_sub_pd(d1, _mm256_cvtps_pd(_mm256_extractf128_ps(qv, 1)));
    }
    a0 = _mm256_add_pd(a0, _mm256_max_pd(d0, zero));
    a1 = _mm256_add_pd(a1, _mm256_max_pd(d1, zero));
  }
  alignas(32) double lane[8];
  _mm256_store_pd(lane, a0);
  _mm256_store_pd(lane + 4, a1);
  return finish_tile<HasQ>(p, q, i, len, lane);
}

#endif  // SPECULA_SIMD_X86

#if SPECULA_SIMD_X86

/// One tile of the recursive form (see dense_f32_weights): for each element, v = p; then for
/// step s < steps: v = max(v - q', 0), times inv_z[s] unless s is the last step, with q' = 0
/// (no q), q (no scale) or q * scale[s]. The sum takes max(v, 0) once more, as
/// tile_positive_sum does.
template <bool HasQ>
[[nodiscard]] __attribute__((target("avx2"))) inline double recursion_tile_avx2(
    const float* p, const float* q, const double* scale, const double* inv_z, index_t steps,
    index_t len) noexcept {
  const __m256d zero = _mm256_setzero_pd();
  __m256d a0 = zero, a1 = zero;
  index_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m256 pv = _mm256_loadu_ps(p + i);
    __m256d v0 = _mm256_cvtps_pd(_mm256_castps256_ps128(pv));
    __m256d v1 = _mm256_cvtps_pd(_mm256_extractf128_ps(pv, 1));
    __m256d q0 = zero, q1 = zero;
    if constexpr (HasQ) {
      const __m256 qv = _mm256_loadu_ps(q + i);
      q0 = _mm256_cvtps_pd(_mm256_castps256_ps128(qv));
      q1 = _mm256_cvtps_pd(_mm256_extractf128_ps(qv, 1));
    }
    for (index_t st = 0; st < steps; ++st) {
      __m256d s0 = q0, s1 = q1;
      if (HasQ && scale != nullptr) {
        const __m256d c = _mm256_set1_pd(scale[st]);
        s0 = _mm256_mul_pd(q0, c);
        s1 = _mm256_mul_pd(q1, c);
      }
      v0 = _mm256_max_pd(_mm256_sub_pd(v0, s0), zero);
      v1 = _mm256_max_pd(_mm256_sub_pd(v1, s1), zero);
      if (st + 1 < steps) {
        const __m256d z = _mm256_set1_pd(inv_z[st]);
        v0 = _mm256_mul_pd(v0, z);
        v1 = _mm256_mul_pd(v1, z);
      }
    }
    a0 = _mm256_add_pd(a0, _mm256_max_pd(v0, zero));
    a1 = _mm256_add_pd(a1, _mm256_max_pd(v1, zero));
  }
  alignas(32) double lane[8];
  _mm256_store_pd(lane, a0);
  _mm256_store_pd(lane + 4, a1);
  for (int k = 0; i < len; ++i, ++k)
    lane[k] += recursion_element<HasQ>(p[i], HasQ ? q[i] : 0.0f, scale, inv_z, steps);
  return combine_lanes(lane);
}

template <bool HasQ>
[[nodiscard]] __attribute__((target("sse2"))) inline double recursion_tile_sse2(
    const float* p, const float* q, const double* scale, const double* inv_z, index_t steps,
    index_t len) noexcept {
  const __m128d zero = _mm_setzero_pd();
  __m128d a[4] = {zero, zero, zero, zero};
  index_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m128 p0 = _mm_loadu_ps(p + i);
    const __m128 p1 = _mm_loadu_ps(p + i + 4);
    __m128d v[4] = {_mm_cvtps_pd(p0), _mm_cvtps_pd(_mm_movehl_ps(p0, p0)), _mm_cvtps_pd(p1),
                    _mm_cvtps_pd(_mm_movehl_ps(p1, p1))};
    __m128d qd[4] = {zero, zero, zero, zero};
    if constexpr (HasQ) {
      const __m128 q0 = _mm_loadu_ps(q + i);
      const __m128 q1 = _mm_loadu_ps(q + i + 4);
      qd[0] = _mm_cvtps_pd(q0);
      qd[1] = _mm_cvtps_pd(_mm_movehl_ps(q0, q0));
      qd[2] = _mm_cvtps_pd(q1);
      qd[3] = _mm_cvtps_pd(_mm_movehl_ps(q1, q1));
    }
    for (index_t st = 0; st < steps; ++st) {
      const __m128d c = _mm_set1_pd(HasQ && scale != nullptr ? scale[st] : 1.0);
      const __m128d z = _mm_set1_pd(st + 1 < steps ? inv_z[st] : 1.0);
      for (int h = 0; h < 4; ++h) {
        const __m128d sub = HasQ && scale != nullptr ? _mm_mul_pd(qd[h], c) : qd[h];
        v[h] = _mm_max_pd(_mm_sub_pd(v[h], sub), zero);
        if (st + 1 < steps) v[h] = _mm_mul_pd(v[h], z);
      }
    }
    for (int h = 0; h < 4; ++h) a[h] = _mm_add_pd(a[h], _mm_max_pd(v[h], zero));
  }
  alignas(16) double lane[8];
  for (int h = 0; h < 4; ++h) _mm_store_pd(lane + 2 * h, a[h]);
  for (int k = 0; i < len; ++i, ++k)
    lane[k] += recursion_element<HasQ>(p[i], HasQ ? q[i] : 0.0f, scale, inv_z, steps);
  return combine_lanes(lane);
}

#endif  // SPECULA_SIMD_X86

template <bool HasQ>
[[nodiscard]] inline double recursion_tile_scalar(const float* p, const float* q,
                                                  const double* scale, const double* inv_z,
                                                  index_t steps, index_t len) noexcept {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  index_t i = 0;
  for (; i + 8 <= len; i += 8)
    for (int k = 0; k < 8; ++k)
      lane[k] += recursion_element<HasQ>(p[i + k], HasQ ? q[i + k] : 0.0f, scale, inv_z, steps);
  for (int k = 0; i < len; ++i, ++k)
    lane[k] += recursion_element<HasQ>(p[i], HasQ ? q[i] : 0.0f, scale, inv_z, steps);
  return combine_lanes(lane);
}

/// The sum of one tile [begin, end) (at most sum_tile elements) of a dense form with no skip
/// index inside it, on the active instruction set.
template <bool HasQ>
[[nodiscard]] inline double dense_tile_sum_q(const dense_f32_weights& f, index_t begin,
                                             index_t end) noexcept {
  const float* p = f.p + begin;
  const float* q = HasQ ? f.q + begin : nullptr;
  const index_t len = end - begin;
  const bool simple = f.steps == 1 && f.scale == nullptr;
#if SPECULA_SIMD_X86
  const simd::isa path = simd::active_isa();
  if (path == simd::isa::avx2)
    return simple ? tile_sum_avx2<HasQ>(p, q, len)
                  : recursion_tile_avx2<HasQ>(p, q, f.scale, f.inv_z, f.steps, len);
  if (path == simd::isa::sse2)
    return simple ? tile_sum_sse2<HasQ>(p, q, len)
                  : recursion_tile_sse2<HasQ>(p, q, f.scale, f.inv_z, f.steps, len);
#endif
  return simple ? tile_sum_scalar<HasQ>(p, q, len)
                : recursion_tile_scalar<HasQ>(p, q, f.scale, f.inv_z, f.steps, len);
}

[[nodiscard]] inline double dense_tile_sum(const dense_f32_weights& f, index_t begin,
                                           index_t end) noexcept {
  return f.q != nullptr ? dense_tile_sum_q<true>(f, begin, end)
                        : dense_tile_sum_q<false>(f, begin, end);
}

/// Whether [begin, end) holds one of the form's skip indices.
[[nodiscard]] inline bool holds_skip(const dense_f32_weights& f, index_t begin,
                                     index_t end) noexcept {
  for (index_t j = 0; j < f.num_skip; ++j) {
    const auto x = static_cast<index_t>(f.skip[j]);
    if (x >= begin && x < end) return true;
  }
  return false;
}

/// Tile sums of a dense form over the tiles of `tile` elements that start in [begin, end)
/// (the last one ends at `n`): out[k] for the k-th tile, in the fixed order of
/// tile_positive_sum. Tiles holding a skip index are left untouched (the caller computes them
/// from the element calls). `tile` is a multiple of 8.
inline void dense_tile_sums(const dense_f32_weights& f, index_t begin, index_t end, index_t n,
                            index_t tile, double* out) noexcept {
#if SPECULA_SIMD_X86
  if (f.steps == 1 && f.scale == nullptr && simd::active_isa() == simd::isa::avx2) {
    index_t t = begin;
    index_t k = 0;
    // Groups of full tiles without skip indices run interleaved.
    constexpr int group = 4;
    for (; t + group * tile <= n && t < end; t += group * tile, k += group) {
      if (holds_skip(f, t, t + group * tile)) break;
      double sums[group];
      if (f.q != nullptr)
        tile_group_avx2<true, group>(f.p + t, f.q + t, tile, sums);
      else
        tile_group_avx2<false, group>(f.p + t, nullptr, tile, sums);
      for (int g = 0; g < group && t + g * tile < end; ++g) out[k + g] = sums[g];
    }
    begin = t;
    out += k;
  }
#endif
  for (index_t t = begin, k = 0; t < end; t += tile, ++k) {
    const index_t e = t + tile < n ? t + tile : n;
    if (!holds_skip(f, t, e)) out[k] = dense_tile_sum(f, t, e);
  }
}

/// The tail of the validation pass: elements [i, n) go to lane 0; then the lanes are combined.
[[nodiscard]] inline double finish_sum_and_min(const float* row, index_t i, index_t n, double* lane,
                                               double* low, double& lowest) noexcept {
  for (; i < n; ++i) {
    const double v = static_cast<double>(row[i]);
    lane[0] += v;
    low[0] = v < low[0] ? v : low[0];
  }
  lowest = low[0];
  for (int k = 1; k < 8; ++k) lowest = low[k] < lowest ? low[k] : lowest;
  return combine_lanes(lane);
}

/// Lane sums and lane minima of a float row, the fast pass of check_probability_row: eight
/// interleaved lanes (lane k takes elements k, k + 8, ...; the tail after the last full group
/// goes to lane 0), lane k's minimum starts at 0 and is min(v, low) with NaN ignored.
/// Returns the pairwise-combined sum and writes the smallest lane minimum to `lowest`.
[[nodiscard]] inline double row_sum_and_min_scalar(const float* row, index_t n,
                                                   double& lowest) noexcept {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  double low[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  index_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) {
      const double v = static_cast<double>(row[i + k]);
      lane[k] += v;
      low[k] = v < low[k] ? v : low[k];
    }
  return finish_sum_and_min(row, i, n, lane, low, lowest);
}

#if SPECULA_SIMD_X86

[[nodiscard]] __attribute__((target("sse2"))) inline double row_sum_and_min_sse2(
    const float* row, index_t n, double& lowest) noexcept {
  const __m128d zero = _mm_setzero_pd();
  __m128d s0 = zero, s1 = zero, s2 = zero, s3 = zero;
  __m128d m0 = zero, m1 = zero, m2 = zero, m3 = zero;
  index_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128 r0 = _mm_loadu_ps(row + i);
    const __m128 r1 = _mm_loadu_ps(row + i + 4);
    const __m128d d0 = _mm_cvtps_pd(r0);
    const __m128d d1 = _mm_cvtps_pd(_mm_movehl_ps(r0, r0));
    const __m128d d2 = _mm_cvtps_pd(r1);
    const __m128d d3 = _mm_cvtps_pd(_mm_movehl_ps(r1, r1));
    s0 = _mm_add_pd(s0, d0);
    s1 = _mm_add_pd(s1, d1);
    s2 = _mm_add_pd(s2, d2);
    s3 = _mm_add_pd(s3, d3);
    // min(v, low) returns low unless v < low: a NaN v leaves low unchanged, as the scalar pass.
    m0 = _mm_min_pd(d0, m0);
    m1 = _mm_min_pd(d1, m1);
    m2 = _mm_min_pd(d2, m2);
    m3 = _mm_min_pd(d3, m3);
  }
  alignas(16) double lane[8];
  alignas(16) double low[8];
  _mm_store_pd(lane + 0, s0);
  _mm_store_pd(lane + 2, s1);
  _mm_store_pd(lane + 4, s2);
  _mm_store_pd(lane + 6, s3);
  _mm_store_pd(low + 0, m0);
  _mm_store_pd(low + 2, m1);
  _mm_store_pd(low + 4, m2);
  _mm_store_pd(low + 6, m3);
  return finish_sum_and_min(row, i, n, lane, low, lowest);
}

[[nodiscard]] __attribute__((target("avx2"))) inline double row_sum_and_min_avx2(
    const float* row, index_t n, double& lowest) noexcept {
  const __m256d zero = _mm256_setzero_pd();
  __m256d s0 = zero, s1 = zero, m0 = zero, m1 = zero;
  index_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 r = _mm256_loadu_ps(row + i);
    const __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(r));
    const __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(r, 1));
    s0 = _mm256_add_pd(s0, d0);
    s1 = _mm256_add_pd(s1, d1);
    m0 = _mm256_min_pd(d0, m0);
    m1 = _mm256_min_pd(d1, m1);
  }
  alignas(32) double lane[8];
  alignas(32) double low[8];
  _mm256_store_pd(lane, s0);
  _mm256_store_pd(lane + 4, s1);
  _mm256_store_pd(low, m0);
  _mm256_store_pd(low + 4, m1);
  return finish_sum_and_min(row, i, n, lane, low, lowest);
}

#endif  // SPECULA_SIMD_X86

/// row_sum_and_min_scalar on the active instruction set.
[[nodiscard]] inline double row_sum_and_min(const float* row, index_t n, double& lowest) noexcept {
#if SPECULA_SIMD_X86
  const simd::isa path = simd::active_isa();
  if (path == simd::isa::avx2) return row_sum_and_min_avx2(row, n, lowest);
  if (path == simd::isa::sse2) return row_sum_and_min_sse2(row, n, lowest);
#endif
  return row_sum_and_min_scalar(row, n, lowest);
}

/// argmax_lowest over a float row (see sample/categorical.hpp): the lowest index holding the
/// largest non-NaN value, -1 when every entry is NaN or the row is empty. Two passes: the maximum
/// (NaN ignored), then the first entry equal to it (-0 and +0 compare equal, as in the scalar
/// loop, which keeps the first of equal values).
[[nodiscard]] inline index_t argmax_f32_scalar(const float* row, index_t n) noexcept {
  index_t best = -1;
  float best_value = 0.0f;
  for (index_t i = 0; i < n; ++i) {
    const float v = row[i];
    if (v != v) continue;
    if (best < 0 || v > best_value) {
      best = i;
      best_value = v;
    }
  }
  return best;
}

#if SPECULA_SIMD_X86

[[nodiscard]] __attribute__((target("avx2"))) inline index_t argmax_f32_avx2(const float* row,
                                                                             index_t n) noexcept {
  const float neg_inf = -__builtin_inff();
  __m256 m0 = _mm256_set1_ps(neg_inf), m1 = m0, m2 = m0, m3 = m0;
  index_t i = 0;
  // max(v, m) returns m when v is NaN, so NaN entries never become the maximum.
  for (; i + 32 <= n; i += 32) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(row + i), m0);
    m1 = _mm256_max_ps(_mm256_loadu_ps(row + i + 8), m1);
    m2 = _mm256_max_ps(_mm256_loadu_ps(row + i + 16), m2);
    m3 = _mm256_max_ps(_mm256_loadu_ps(row + i + 24), m3);
  }
  const __m256 m = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float best = neg_inf;
  for (float v : lanes) best = v > best ? v : best;
  for (; i < n; ++i) best = row[i] > best ? row[i] : best;
  const __m256 target = _mm256_set1_ps(best);
  index_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const int mask =
        _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + j), target, _CMP_EQ_OQ));
    if (mask != 0) return j + __builtin_ctz(static_cast<unsigned>(mask));
  }
  for (; j < n; ++j)
    if (row[j] == best) return j;
  return -1;  // every entry is NaN (or the row is empty)
}

#endif  // SPECULA_SIMD_X86

/// argmax_f32_scalar on the active instruction set.
[[nodiscard]] inline index_t argmax_f32(const float* row, index_t n) noexcept {
#if SPECULA_SIMD_X86
  if (simd::active_isa() == simd::isa::avx2) return argmax_f32_avx2(row, n);
#endif
  return argmax_f32_scalar(row, n);
}

}  // namespace specula::detail
