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
/// translation units), `sse2` (every x86-64 CPU), `avx2` and `avx512` (AVX-512 F, BW, VL and DQ:
/// Intel since Skylake-SP, AMD since Zen 4). The environment variable `SPECULA_ISA` (`scalar`,
/// `sse2`, `avx2` or `avx512`) caps the choice at start-up; `force_isa` changes it at run time
/// (for tests and benchmarks). Define `SPECULA_NO_SIMD` to compile the scalar loops only.

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "specula/core/exp.hpp"
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
  avx2 = 2,    ///< four doubles per vector (AVX2 and FMA)
  avx512 = 3,  ///< eight doubles per vector (AVX-512 F, BW, VL, DQ)
};

/// The name of an instruction set ("scalar", "sse2", "avx2", "avx512").
[[nodiscard]] constexpr const char* name(isa i) noexcept {
  switch (i) {
    case isa::avx512:
      return "avx512";
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
    // AVX2 comes with FMA on every CPU that has it; the AVX2 kernels use both.
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return isa::sse2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      return isa::avx512;
    return isa::avx2;
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
  isa cap = isa::avx512;
  if (const char* env = std::getenv("SPECULA_ISA");
      env != nullptr) {  // NOLINT(concurrency-mt-unsafe)
    if (std::strcmp(env, "scalar") == 0) cap = isa::scalar;
    if (std::strcmp(env, "sse2") == 0) cap = isa::sse2;
    if (std::strcmp(env, "avx2") == 0) cap = isa::avx2;
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

/// Elements per tile of the fixed-order summations: the row passes' weight sums (positive_mass
/// in sample/categorical.hpp) and the entry sum of check_probability_row (core/validate.hpp).
inline constexpr index_t sum_tile = 256;

/// Combines eight lane sums in the fixed pairwise order of the row passes.
SPECULA_HOST_DEVICE constexpr double combine_lanes(const double* lane) noexcept {
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/// What a probability row's entry v adds to the row's sum in check_probability_row: v, or 0
/// when v < 0. A row with a negative entry fails on its minimum whatever its sum, so the sum of
/// every row that can pass is the plain sum; NaN is kept, so that it reaches the sum. Without a
/// proposal row the weight max(p, 0) of a valid row is this very value, so a checked pass sums
/// the weights and the row's entries in one (see tile_lanes).
SPECULA_HOST_DEVICE constexpr double checked_entry(double v) noexcept { return 0.0 > v ? 0.0 : v; }

/// What a checked tile kernel reports besides its weight sums (check_level::reads): the entry
/// sums of p and of q over the tile (or, with q on AVX2 and AVX-512, the run of tiles) it
/// summed, and the running minimum of the entries of both rows (NaN ignored; starts at 0).
/// Without q, p's entry sum is the weight sum, of checked_entry. With q, the scalar and SSE2
/// kernels add the plain entries in the weights' lanes (the bits of check_probability_row's sum
/// for every row without a negative entry); the AVX2 and AVX-512 run kernels add them in float
/// lanes instead, at most `float_lane_adds` entries per lane, whose values are then added in
/// double: a sum within a proven bound of check_probability_row's (see entry_sum_within), one
/// FMA per row and 16 entries (AVX-512) instead of two.
struct tile_checks {
  double p_sum = 0.0;  ///< of the tile, or with q of the run, just summed
  double q_sum = 0.0;
  float low = 0.0f;
  int float_lane_adds = 0;  ///< 0: p_sum and q_sum are exact (see above)
  /// The AVX2 and AVX-512 kernels keep no minimum: they OR the bits of every entry of both rows
  /// into vector lanes (one integer operation per vector) and OR the lanes' sign bits into this
  /// mask once per call. Only when a sign bit was seen (a negative entry, or -0 or
  /// NaN with the sign set, which valid rows do not hold in practice) does dense_tile_sums
  /// compute the minimum, by a second scan of those tiles.
  unsigned sign_bits = 0;
  unsigned call_sign_bits = 0;  ///< the sign bits of the last kernel call alone
  [[nodiscard]] bool saw_sign_bit() const noexcept { return sign_bits != 0; }
};

/// What a checked pass learned about the rows of a dense form: the entry sums of p and q, each
/// the tiles' entry sums added left to right, and the smallest entry of either row. With
/// `float_lane_adds` 0, a row without negative entries has bit for bit the row sum of
/// check_probability_row, so both rows pass check_probability_row exactly when `low >= 0` and
/// both sums are finite and within the tolerance (a negative entry fails on `low`; a NaN in q,
/// which can hide a negative entry of p from `low`, makes q's sum NaN). Otherwise (with q, on
/// AVX2 and AVX-512: tile_checks) the sums are within a bound of check_probability_row's, and
/// entry_sum_within tells the rows that pass for certain from those that need the exact scan.
struct dense_scan {
  double p_sum = 0.0;
  double q_sum = 0.0;
  float low = 0.0f;
  int float_lane_adds = 0;  ///< see tile_checks
};

/// Whether the entry sum `sum` of a row of n entries, none negative, as a checked pass computed
/// it (`float_lane_adds` as in dense_scan), proves that check_probability_row's sum S (double,
/// in its fixed order) satisfies |S - 1| <= tolerance. With float_lane_adds = 0, `sum` is S
/// and the answer is exact. Otherwise `sum` came from float lanes of at most k =
/// float_lane_adds entries each, their values (and some entries) then added in double in some
/// order: at most N = n + 16 terms. For nonnegative terms a sum of m terms in any order is
/// within gamma_{m-1} of the exact sum times itself (gamma_m = m u / (1 - m u); u = 2^-24 in
/// float, 2^-53 in double), so with S* the exact sum,
///   |sum - S*| <= e1 S*,  e1 = gamma_k^f + gamma_N^d (1 + gamma_k^f),   |S - S*| <= gamma_N^d S*,
/// hence |sum - S| <= e S* <= e sum / (1 - e) with e = e1 + gamma_N^d, plus N 2^-125 for
/// entries and float partial sums below 2^-126 that flush-to-zero modes would drop. The row
/// passes when |sum - 1| + that bound <= tolerance (each bound rounded up; the few roundings
/// of this test are covered by the 2^-40 and 2^-48 margins). False means "not proven": NaN and
/// infinite sums, and sums within about 2e-6 of the tolerance; the caller then scans the row.
[[nodiscard]] inline bool entry_sum_within(double sum, int float_lane_adds, index_t n,
                                           double tolerance) noexcept {
  const double off = sum > 1.0 ? sum - 1.0 : 1.0 - sum;  // NaN: off is NaN, compares false
  if (!(sum - sum == 0.0)) return false;                 // NaN or infinite
  if (float_lane_adds == 0) return off <= tolerance;
  const auto gamma = [](double m, double u) { return m * u / (1.0 - m * u); };
  const double terms = static_cast<double>(n) + 16.0;
  const double gf = gamma(static_cast<double>(float_lane_adds), 0x1p-24);
  const double gd = gamma(terms, 0x1p-53);
  const double e = (gf + gd * (1.0 + gf) + gd) * (1.0 + 0x1p-40);
  if (!(e < 0.25)) return false;
  const double bound = e * sum / (1.0 - e) * (1.0 + 0x1p-40) + terms * 0x1p-125;
  return (off + bound) * (1.0 + 0x1p-48) <= tolerance;
}

/// The eight lanes of one tile (lane k takes elements k, k + 8, ... of the tile): the weights
/// max(p - q, 0) (max(p, 0) without q) and, when Check, the entry sums of p and q and the
/// minimum. Every path adds the tile's tail (after its last full group of 8) here and combines
/// the lanes here; the SIMD kernels store their vector lanes into w, p and q first.
///
/// The members are left uninitialised by default, so that the SIMD kernels, which overwrite
/// them, pay no zeroing per tile; `tile_lanes<...> acc{}` starts from zero lanes.
template <bool HasQ, bool Check>
struct tile_lanes {
  double w[8];
  double p[Check && HasQ ? 8 : 1];
  double q[Check && HasQ ? 8 : 1];

  void add(int k, float pf, float qf, tile_checks* c) noexcept {
    double d = static_cast<double>(pf);
    if constexpr (HasQ) d -= static_cast<double>(qf);
    if constexpr (Check && !HasQ)
      w[k] += checked_entry(d);  // equals max(d, 0) but keeps NaN: the weight sum is p's sum
    else
      w[k] += d > 0.0 ? d : 0.0;
    if constexpr (Check) {
      // One minimum for both rows, of min(p, q) as the vector min instruction takes it (q when
      // either is NaN): a NaN in q can hide a negative p here, never from q's sum (dense_scan).
      const float m = HasQ ? (pf < qf ? pf : qf) : pf;
      c->low = m < c->low ? m : c->low;
      if constexpr (HasQ) {  // plain sums: equal to checked_entry's unless the row fails on low
        p[k] += static_cast<double>(pf);
        q[k] += static_cast<double>(qf);
      }
    }
  }
  /// The tile's weight sum; when Check, its entry sums go to `c`.
  double finish(tile_checks* c) const noexcept {
    const double sum = combine_lanes(w);
    if constexpr (Check) {
      c->p_sum = HasQ ? combine_lanes(p) : sum;
      if constexpr (HasQ) c->q_sum = combine_lanes(q);
    }
    return sum;
  }
};

/// Whether a dense form is a simple one, max(p - q, 0) or max(p, 0), which the tile kernels
/// (and, checked, the fused ones) take: one step, and no scale or a scale of exactly 1 (q * 1
/// is q: the first step of the candidate recursion without replacement, before any candidate
/// is removed).
[[nodiscard]] inline bool simple_form(const dense_f32_weights& f) noexcept {
  return f.steps == 1 && (f.scale == nullptr || f.scale[0] == 1.0);
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

/// Portable reference: the positive-part sum of one tile of len <= sum_tile elements, max(p - q,
/// 0) (max(p, 0) without q); with Check, also its entry sums and minimum into `c` (tile_lanes).
template <bool HasQ, bool Check = false>
[[nodiscard]] inline double tile_sum_scalar(const float* p, const float* q, index_t len,
                                            tile_checks* c = nullptr) noexcept {
  tile_lanes<HasQ, Check> acc{};
  index_t i = 0;
  for (; i + 8 <= len; i += 8)
    for (int k = 0; k < 8; ++k) acc.add(k, p[i + k], HasQ ? q[i + k] : 0.0f, c);
  for (int k = 0; i < len; ++i, ++k) acc.add(k, p[i], HasQ ? q[i] : 0.0f, c);
  return acc.finish(c);
}

#if SPECULA_SIMD_X86

template <bool HasQ, bool Check = false>
[[nodiscard]] __attribute__((target("sse2"))) inline double tile_sum_sse2(
    const float* p, const float* q, index_t len, tile_checks* c = nullptr) noexcept {
  const __m128d zero = _mm_setzero_pd();
  __m128d a[4] = {zero, zero, zero, zero};   // weight lanes 0-1, 2-3, 4-5, 6-7
  __m128d ap[4] = {zero, zero, zero, zero};  // entry sums of p and q (Check with q)
  __m128d aq[4] = {zero, zero, zero, zero};
  __m128 low = _mm_setzero_ps();
  index_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m128 p0 = _mm_loadu_ps(p + i);
    const __m128 p1 = _mm_loadu_ps(p + i + 4);
    const __m128d pd[4] = {_mm_cvtps_pd(p0), _mm_cvtps_pd(_mm_movehl_ps(p0, p0)), _mm_cvtps_pd(p1),
                           _mm_cvtps_pd(_mm_movehl_ps(p1, p1))};
    __m128d d[4] = {pd[0], pd[1], pd[2], pd[3]};
    if constexpr (HasQ) {
      const __m128 q0 = _mm_loadu_ps(q + i);
      const __m128 q1 = _mm_loadu_ps(q + i + 4);
      const __m128d qd[4] = {_mm_cvtps_pd(q0), _mm_cvtps_pd(_mm_movehl_ps(q0, q0)),
                             _mm_cvtps_pd(q1), _mm_cvtps_pd(_mm_movehl_ps(q1, q1))};
      for (int h = 0; h < 4; ++h) d[h] = _mm_sub_pd(pd[h], qd[h]);
      if constexpr (Check) {
        for (int h = 0; h < 4; ++h) {
          ap[h] = _mm_add_pd(ap[h], pd[h]);
          aq[h] = _mm_add_pd(aq[h], qd[h]);
        }
        low = _mm_min_ps(_mm_min_ps(p0, q0), _mm_min_ps(_mm_min_ps(p1, q1), low));
      }
    } else if constexpr (Check) {
      // min(v, low) returns low unless v < low: NaN entries are ignored, as in tile_lanes.
      low = _mm_min_ps(p0, _mm_min_ps(p1, low));
    }
    // max(d, 0) returns its second operand unless d > 0: NaN and -0 map to +0, as the scalar
    // clamp does; a checked pass without q keeps NaN instead (tile_lanes::add).
    for (int h = 0; h < 4; ++h)
      a[h] = _mm_add_pd(a[h], Check && !HasQ ? _mm_max_pd(zero, d[h]) : _mm_max_pd(d[h], zero));
  }
  tile_lanes<HasQ, Check> acc;
  for (int h = 0; h < 4; ++h) {
    _mm_storeu_pd(acc.w + 2 * h, a[h]);
    if constexpr (Check && HasQ) {
      _mm_storeu_pd(acc.p + 2 * h, ap[h]);
      _mm_storeu_pd(acc.q + 2 * h, aq[h]);
    }
  }
  if constexpr (Check) {
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, low);
    for (float v : lanes) c->low = v < c->low ? v : c->low;
  }
  for (int k = 0; i < len; ++i, ++k) acc.add(k, p[i], HasQ ? q[i] : 0.0f, c);
  return acc.finish(c);
}

/// combine_lanes of lanes 0-3 (`lo`) and 4-7 (`hi`) in registers: the same additions as
/// combine_lanes (each commutes exactly), so the same bits.
__attribute__((target("avx2,fma"), always_inline)) inline double combine_lanes_avx2(
    __m256d lo, __m256d hi) noexcept {
  const __m256d lo_pairs = _mm256_add_pd(lo, _mm256_permute_pd(lo, 0x5));  // l0+l1, ., l2+l3, .
  const __m256d hi_pairs = _mm256_add_pd(hi, _mm256_permute_pd(hi, 0x5));
  const __m256d lo_quad = _mm256_add_pd(lo_pairs, _mm256_permute2f128_pd(lo_pairs, lo_pairs, 1));
  const __m256d hi_quad = _mm256_add_pd(hi_pairs, _mm256_permute2f128_pd(hi_pairs, hi_pairs, 1));
  return _mm_cvtsd_f64(
      _mm_add_sd(_mm256_castpd256_pd128(lo_quad), _mm256_castpd256_pd128(hi_quad)));
}

/// Entries a checked run kernel adds into a float lane before it folds the lanes into double
/// lanes: the lanes' rounding error stays within gamma_64 in float (about 3.8e-6 of the sum; see
/// entry_sum_within) while the folds cost a few instructions per four tiles. (Folding every
/// tile, 16 entries per lane, cost a checked residual pass 5 % of its time on Zen 4.)
inline constexpr index_t lane_entries_per_fold = 64;

/// Tiles between folds for a run kernel whose lanes take `per_tile` entries each per tile.
[[nodiscard]] constexpr index_t fold_every(index_t per_tile, index_t tiles) noexcept {
  if (per_tile == 0) return tiles > 0 ? tiles : 1;
  return lane_entries_per_fold / per_tile > 0 ? lane_entries_per_fold / per_tile : 1;
}

/// Adds the weights of the eight entries at p (and q) to lanes 0-3 (`lo`) and 4-7 (`hi`) of a
/// tile: max(p - q, 0) (max(p, 0) without q); checked without q, max(0, p), which keeps NaN
/// (checked_entry), or the plain entries with !Clamp (see tile_run_avx2). Four entries per
/// vector, each converted from a 16-byte load: on Zen 4 the conversion of a 32-byte load into
/// eight doubles, or of an upper half extracted from a register, takes more issue slots of the
/// two floating-point add pipes, which bound these kernels. The sums are fmadd(x, 1, acc), acc +
/// x rounded once: the same bits, on the FMA pipes. Opaque ones: each kernel hides its 1.0 from
/// the optimiser behind an empty asm, since Clang (14) otherwise rewrites fmadd(x, 1, acc) as
/// an add, which issues on the add pipes (its residual kernels ran 1.2-1.4x slower). Checked
/// without q, the bits of the converted entries (a double keeps its float's sign, NaN included) are
/// ORed into `bits`.
template <bool HasQ, bool Check, bool Clamp>
__attribute__((target("avx2,fma"), always_inline)) inline void add_eight_avx2(
    const float* p, const float* q, __m256d& lo, __m256d& hi, __m256i& bits) noexcept {
  const __m256d zero = _mm256_setzero_pd();
  __m256d one = _mm256_set1_pd(1.0);
  asm("" : "+v"(one));  // an FMA, not an add (see opaque ones above)
  __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(p));
  __m256d b = _mm256_cvtps_pd(_mm_loadu_ps(p + 4));
  if constexpr (Check && !HasQ)
    bits = _mm256_or_si256(_mm256_or_si256(_mm256_castpd_si256(a), _mm256_castpd_si256(b)), bits);
  if constexpr (HasQ) {
    a = _mm256_sub_pd(a, _mm256_cvtps_pd(_mm_loadu_ps(q)));
    b = _mm256_sub_pd(b, _mm256_cvtps_pd(_mm_loadu_ps(q + 4)));
  }
  if constexpr (Check && !HasQ && !Clamp) {
    lo = _mm256_fmadd_pd(a, one, lo);
    hi = _mm256_fmadd_pd(b, one, hi);
  } else if constexpr (Check && !HasQ) {
    // max(0, x) returns x unless 0 > x: NaN is kept (checked_entry).
    lo = _mm256_fmadd_pd(_mm256_max_pd(zero, a), one, lo);
    hi = _mm256_fmadd_pd(_mm256_max_pd(zero, b), one, hi);
  } else {
    // max(x, 0) returns 0 unless x > 0: NaN and -0 map to +0, as the scalar clamp does.
    lo = _mm256_fmadd_pd(_mm256_max_pd(a, zero), one, lo);
    hi = _mm256_fmadd_pd(_mm256_max_pd(b, zero), one, hi);
  }
}

/// A row's check stream in a checked run with q: the entries [s, s + n) as a head (up to the
/// first `align`-byte boundary), `blocks` blocks of 16 floats from there, read with aligned
/// loads (a load across a cache line costs about two on Zen 4, and std::vector rows sit 16
/// bytes off a line), and a tail. In which float lane an entry is added does not matter to a
/// sum known within a bound (entry_sum_within), so the blocks need not line up with the
/// weights' groups. The head and tail are added in double by `rest`.
struct check_stream {
  const float* s = nullptr;  ///< the first entry
  const float* a = nullptr;  ///< the first block
  index_t n = 0;
  index_t blocks = 0;

  check_stream() = default;
  check_stream(const float* row, index_t count, std::uintptr_t align) noexcept : s(row), n(count) {
    const auto at = reinterpret_cast<std::uintptr_t>(row);
    const auto head = static_cast<index_t>((align - at % align) % align / sizeof(float));
    a = row + (head < n ? head : n);
    blocks = head < n ? (n - head) / 16 : 0;
  }
  /// Adds the entries outside the blocks to `sum` in double and ORs their bits into `bits`.
  void rest(double& sum, std::uint32_t& bits) const noexcept {
    const auto add = [&](const float* from, const float* to) {
      for (; from < to; ++from) {
        std::uint32_t u = 0;
        std::memcpy(&u, from, sizeof u);
        bits |= u;
        sum += static_cast<double>(*from);
      }
    };
    add(s, a);
    add(a + 16 * blocks, s + n);
  }
};

/// One block of a check stream (AVX2): two 32-byte loads into two float-lane sums, their bits
/// ORed into `bits`. The sums are fmadd(v, 1, s) (s + v rounded once) on the FMA pipes.
__attribute__((target("avx2,fma"), always_inline)) inline void check_block_avx2(
    const float* at, __m256& s0, __m256& s1, __m256i& bits) noexcept {
  __m256 one = _mm256_set1_ps(1.0f);
  asm("" : "+v"(one));  // an FMA, not an add
  __m256 v0 = _mm256_load_ps(at);
  __m256 v1 = _mm256_load_ps(at + 8);
  asm("" : "+v"(v0), "+v"(v1));  // one load each (see check_blocks_avx512)
  bits = _mm256_or_si256(_mm256_or_si256(_mm256_castps_si256(v0), _mm256_castps_si256(v1)), bits);
  s0 = _mm256_fmadd_ps(v0, one, s0);
  s1 = _mm256_fmadd_ps(v1, one, s1);
}

/// Adds eight float lanes, as doubles, to the double lanes `lo` (0-3) and `hi` (4-7).
__attribute__((target("avx2,fma"), always_inline)) inline void fold_float_lanes_avx2(
    __m256 v, __m256d& lo, __m256d& hi) noexcept {
  lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

/// The end of a run kernel call, from its lanes stored in `lanes` (weights, and with q the
/// double lanes of p's and q's entry sums): a tile with a tail (one tile) gets its last len % 8
/// entries through tile_lanes; otherwise, checked, the entry sums of the run (with q) or of the
/// one tile (without q: its weight sum). combine_lanes gives the bits of the kernels'
/// in-register combines.
template <bool HasQ, bool Check>
inline void finish_run(const double (&lanes)[3][8], double p_rest, double q_rest, const float* p,
                       const float* q, index_t len8, index_t len, double* out,
                       tile_checks* c) noexcept {
  constexpr bool streams = Check && HasQ;
  if (len8 < len) {
    tile_lanes<HasQ, Check> acc;
    std::memcpy(acc.w, lanes[0], sizeof acc.w);
    if constexpr (streams) {
      std::memcpy(acc.p, lanes[1], sizeof acc.p);
      std::memcpy(acc.q, lanes[2], sizeof acc.q);
      acc.p[0] += p_rest;
      acc.q[0] += q_rest;
    }
    for (index_t j = len8, k = 0; j < len; ++j, ++k)
      acc.add(static_cast<int>(k), p[j], HasQ ? q[j] : 0.0f, c);
    out[0] = acc.finish(c);
  } else if constexpr (streams) {
    c->p_sum = combine_lanes(lanes[1]) + p_rest;
    c->q_sum = combine_lanes(lanes[2]) + q_rest;
  } else if constexpr (Check) {
    c->p_sum = out[0];  // one tile: its entry sum is its weight sum
  }
}

/// Sums `tiles` consecutive tiles of `len` entries each, the first at p (and q): out[t] gets
/// tile t's weight sum, with the bits of tile_sum_scalar (lane k adds entries k, k + 8, ... of
/// the tile in order; combine_lanes). `len` is at most sum_tile, and a multiple of 8 when
/// tiles > 1. One call covers a run of tiles, so that the checks' lanes are reduced once per
/// run (reducing them per tile cost a checked residual pass about a fifth of its time on Zen 4).
///
/// With Check, into `c`: the sign bits of the entries of the vector part (c->call_sign_bits),
/// and for one tile its entry sums (tile_lanes). Without q and !Clamp the weights are the plain
/// entries p, one maximum less per vector: the same sums for every tile without a sign bit
/// (dense_tile_sums sums a run again with Clamp when it had one). With q, both rows' entry sums
/// over the run into c->p_sum and c->q_sum, added in float lanes from their aligned check
/// streams (at most c->float_lane_adds entries per lane, then folded into double lanes every
/// lane_entries_per_fold entries).
template <bool HasQ, bool Check = false, bool Clamp = true>
__attribute__((target("avx2,fma"))) inline void tile_run_avx2(const float* p, const float* q,
                                                              index_t tiles, index_t len,
                                                              double* out,
                                                              tile_checks* c = nullptr) noexcept {
  const index_t len8 = len - len % 8;
  const index_t span = tiles * len8;  // the vector part (len8 = len when tiles > 1)
  const __m256d zero = _mm256_setzero_pd();
  __m256d lo = zero, hi = zero;
  __m256i bits = _mm256_setzero_si256();
  constexpr bool streams = Check && HasQ;
  // Checked with q: two float-lane sums per row (two chains), folded into double lanes.
  __m256 ps0 = _mm256_setzero_ps(), ps1 = ps0, qs0 = ps0, qs1 = ps0;
  __m256d pw_lo = zero, pw_hi = zero, qw_lo = zero, qw_hi = zero;
  check_stream sp, sq;
  if constexpr (streams) {
    sp = check_stream(p, span, 32);
    sq = check_stream(q, span, 32);
  }
  const index_t both = sp.blocks < sq.blocks ? sp.blocks : sq.blocks;
  index_t b = 0;  // blocks of both streams added in the weights' loop
  // Each lane of a chain takes one entry per block; the two chains are added at the fold.
  const index_t per_tile = 2 * (len8 / 16);
  const index_t every = fold_every(per_tile, tiles);
  index_t until_fold = every;
  for (index_t t = 0; t < tiles; ++t) {
    const float* pt = p + t * len;
    const float* qt = HasQ ? q + t * len : nullptr;
    lo = hi = zero;
    index_t i = 0;
    if constexpr (streams) {  // the groups that also take a block of each check stream
      const index_t checked = 16 * (both - b < len8 / 16 ? both - b : len8 / 16);
      for (; i < checked; i += 16, ++b) {
        add_eight_avx2<HasQ, Check, Clamp>(pt + i, qt + i, lo, hi, bits);
        add_eight_avx2<HasQ, Check, Clamp>(pt + i + 8, qt + i + 8, lo, hi, bits);
        check_block_avx2(sp.a + 16 * b, ps0, ps1, bits);
        check_block_avx2(sq.a + 16 * b, qs0, qs1, bits);
      }
    }
    for (; i + 16 <= len8; i += 16) {
      add_eight_avx2<HasQ, Check, Clamp>(pt + i, HasQ ? qt + i : nullptr, lo, hi, bits);
      add_eight_avx2<HasQ, Check, Clamp>(pt + i + 8, HasQ ? qt + i + 8 : nullptr, lo, hi, bits);
    }
    if (i < len8) add_eight_avx2<HasQ, Check, Clamp>(pt + i, HasQ ? qt + i : nullptr, lo, hi, bits);
    if constexpr (streams)
      if (--until_fold == 0) {
        until_fold = every;
        // s0 + s1: one more float addition per lane, within the lanes' bound.
        fold_float_lanes_avx2(_mm256_add_ps(ps0, ps1), pw_lo, pw_hi);
        fold_float_lanes_avx2(_mm256_add_ps(qs0, qs1), qw_lo, qw_hi);
        ps0 = ps1 = qs0 = qs1 = _mm256_setzero_ps();
      }
    if (len8 == len) out[t] = combine_lanes_avx2(lo, hi);
  }
  [[maybe_unused]] double p_rest = 0.0, q_rest = 0.0;
  if constexpr (streams) {
    const index_t left = (sp.blocks > sq.blocks ? sp.blocks : sq.blocks) - b;
    for (index_t k = b; k < sp.blocks; ++k) check_block_avx2(sp.a + 16 * k, ps0, ps1, bits);
    for (index_t k = b; k < sq.blocks; ++k) check_block_avx2(sq.a + 16 * k, qs0, qs1, bits);
    fold_float_lanes_avx2(_mm256_add_ps(ps0, ps1), pw_lo, pw_hi);
    fold_float_lanes_avx2(_mm256_add_ps(qs0, qs1), qw_lo, qw_hi);
    std::uint32_t rest_bits = 0;
    sp.rest(p_rest, rest_bits);
    sq.rest(q_rest, rest_bits);
    bits = _mm256_or_si256(bits, _mm256_set1_epi32(static_cast<int>(rest_bits)));
    const index_t per_lane = per_tile * every + 2 * left;
    const auto adds = static_cast<int>(per_lane > 1 ? per_lane : 1);
    if (adds > c->float_lane_adds) c->float_lane_adds = adds;  // the largest of the calls'
  }
  if constexpr (Check) {
    // Sign bits of 32-bit lanes (floats, with q) or 64-bit lanes (converted doubles).
    c->call_sign_bits = HasQ ? static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(bits)))
                             : static_cast<unsigned>(_mm256_movemask_pd(_mm256_castsi256_pd(bits)));
    c->sign_bits |= c->call_sign_bits;
  }
  if (Check || len8 < len) {
    alignas(32) double lanes[3][8];
    _mm256_store_pd(lanes[0], lo);
    _mm256_store_pd(lanes[0] + 4, hi);
    if constexpr (streams) {
      _mm256_store_pd(lanes[1], pw_lo);
      _mm256_store_pd(lanes[1] + 4, pw_hi);
      _mm256_store_pd(lanes[2], qw_lo);
      _mm256_store_pd(lanes[2] + 4, qw_hi);
    }
    finish_run<HasQ, Check>(lanes, p_rest, q_rest, p, q, len8, len, out, c);
  }
}

/// combine_lanes of eight lanes held in one vector, in registers: ((l0 + l1) + (l2 + l3)) +
/// ((l4 + l5) + (l6 + l7)), the same additions (each commutes exactly), so the same bits.
__attribute__((target(SPECULA_AVX512_TARGET), always_inline)) inline double combine_lanes_avx512(
    __m512d v) noexcept {
  const __m512d pairs = _mm512_add_pd(v, _mm512_permute_pd(v, 0x55));           // l0+l1, l2+l3, ...
  const __m512d quads = _mm512_add_pd(pairs, _mm512_permutex_pd(pairs, 0x4E));  // + other pair
  const __m256d sum =
      _mm256_add_pd(_mm512_castpd512_pd256(quads), _mm512_extractf64x4_pd(quads, 1));
  return _mm_cvtsd_f64(_mm256_castpd256_pd128(sum));
}

/// Sixteen float lanes as eight double lanes: lane k plus lane k + 8, in double.
__attribute__((target(SPECULA_AVX512_TARGET), always_inline)) inline __m512d fold_lanes_avx512(
    __m512 v) noexcept {
  return _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)),
                       _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
}

/// One block of p's and of q's check streams (AVX-512): a 64-byte load of each into sixteen
/// float-lane sums (fmadd(v, 1, s), on the FMA pipes), the bits of both ORed into `bits` with
/// one ternary-logic instruction.
__attribute__((target(SPECULA_AVX512_TARGET), always_inline)) inline void check_blocks_avx512(
    const float* pa, const float* qa, __m512& ps, __m512& qs, __m512i& bits) noexcept {
  __m512 one = _mm512_set1_ps(1.0f);
  asm("" : "+v"(one));  // an FMA, not an add
  __m512 pv = _mm512_load_ps(pa);
  __m512 qv = _mm512_load_ps(qa);
  // One load each: without this GCC folds the loads into the three uses (four or six 64-byte
  // loads per block; 8 % slower on Zen 4).
  asm("" : "+v"(pv), "+v"(qv));
  bits = _mm512_ternarylogic_epi32(bits, _mm512_castps_si512(pv), _mm512_castps_si512(qv), 0xFE);
  ps = _mm512_fmadd_ps(pv, one, ps);
  qs = _mm512_fmadd_ps(qv, one, qs);
}

/// One block of a single check stream (AVX-512; the blocks one row has more than the other).
__attribute__((target(SPECULA_AVX512_TARGET), always_inline)) inline void check_block_avx512(
    const float* at, __m512& s, __m512i& bits) noexcept {
  const __m512 v = _mm512_load_ps(at);
  __m512 one = _mm512_set1_ps(1.0f);
  asm("" : "+v"(one));  // an FMA, not an add
  bits = _mm512_or_si512(_mm512_castps_si512(v), bits);
  s = _mm512_fmadd_ps(v, one, s);
}

/// Without q, the weights of the eight (`Sixteen`: sixteen) entries at p added to a tile's
/// eight lanes in one vector (AVX-512): entries k (and then k + 8) to lane k. Without q the add
/// pipes have room for the 512-bit conversions, which issue fewer instructions than
/// add_eight_avx2's. Checked, the bits of the converted entries are ORed into `bits`; the
/// weights as in add_eight_avx2.
template <bool Sixteen, bool Check, bool Clamp>
__attribute__((target(SPECULA_AVX512_TARGET), always_inline)) inline void add_row_avx512(
    const float* p, __m512d& w, __m512i& bits) noexcept {
  const __m512d zero = _mm512_setzero_pd();
  __m512d one = _mm512_set1_pd(1.0);
  asm("" : "+v"(one));  // an FMA, not an add
  const __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(p));
  const __m512d b = Sixteen ? _mm512_cvtps_pd(_mm256_loadu_ps(p + 8)) : zero;
  if constexpr (Check)
    bits = _mm512_ternarylogic_epi64(bits, _mm512_castpd_si512(a), _mm512_castpd_si512(b), 0xFE);
  if constexpr (Check && !Clamp) {
    w = _mm512_fmadd_pd(a, one, w);
    if constexpr (Sixteen) w = _mm512_fmadd_pd(b, one, w);
  } else if constexpr (Check) {  // max(0, x) keeps NaN (checked_entry)
    w = _mm512_fmadd_pd(_mm512_max_pd(zero, a), one, w);
    if constexpr (Sixteen) w = _mm512_fmadd_pd(_mm512_max_pd(zero, b), one, w);
  } else {  // max(x, 0) maps NaN and -0 to +0
    w = _mm512_fmadd_pd(_mm512_max_pd(a, zero), one, w);
    if constexpr (Sixteen) w = _mm512_fmadd_pd(_mm512_max_pd(b, zero), one, w);
  }
}

/// tile_run_avx2 on AVX-512: with q the same weights (their 256-bit conversions are the cheaper
/// ones where the add pipes bound the kernel) and the check streams read 64 bytes at a time
/// into sixteen float lanes; without q the weights of add_row_avx512.
template <bool HasQ, bool Check = false, bool Clamp = true>
__attribute__((target(SPECULA_AVX512_TARGET ",fma"))) inline void tile_run_avx512(
    const float* p, const float* q, index_t tiles, index_t len, double* out,
    tile_checks* c = nullptr) noexcept {
  const index_t len8 = len - len % 8;
  const index_t span = tiles * len8;
  const __m256d zero = _mm256_setzero_pd();
  __m256d lo = zero, hi = zero;                  // with q: the lanes (add_eight_avx2)
  __m512d w = _mm512_setzero_pd();               // without q: the lanes (add_row_avx512)
  __m256i unused_bits = _mm256_setzero_si256();  // add_eight_avx2 sets none with q
  __m512i row_bits = _mm512_setzero_si512();     // checked without q
  constexpr bool streams = Check && HasQ;
  __m512 ps = _mm512_setzero_ps(), qs = ps;
  __m512d pw = _mm512_setzero_pd(), qw = pw;
  __m512i both_bits = _mm512_setzero_si512();  // checked with q
  check_stream sp, sq;
  if constexpr (streams) {
    sp = check_stream(p, span, 64);
    sq = check_stream(q, span, 64);
  }
  const index_t both = sp.blocks < sq.blocks ? sp.blocks : sq.blocks;
  index_t b = 0;
  const index_t per_tile = len8 / 16;  // entries per lane and tile: one per block
  const index_t every = fold_every(per_tile, tiles);
  index_t until_fold = every;
  for (index_t t = 0; t < tiles; ++t) {
    const float* pt = p + t * len;
    const float* qt = HasQ ? q + t * len : nullptr;
    lo = hi = zero;
    w = _mm512_setzero_pd();
    index_t i = 0;
    if constexpr (streams) {  // the groups that also take a block of each check stream
      const index_t checked = 16 * (both - b < len8 / 16 ? both - b : len8 / 16);
      for (; i < checked; i += 16, ++b) {
        add_eight_avx2<HasQ, Check, Clamp>(pt + i, qt + i, lo, hi, unused_bits);
        add_eight_avx2<HasQ, Check, Clamp>(pt + i + 8, qt + i + 8, lo, hi, unused_bits);
        check_blocks_avx512(sp.a + 16 * b, sq.a + 16 * b, ps, qs, both_bits);
      }
    }
    for (; i + 16 <= len8; i += 16) {
      if constexpr (HasQ) {
        add_eight_avx2<HasQ, Check, Clamp>(pt + i, qt + i, lo, hi, unused_bits);
        add_eight_avx2<HasQ, Check, Clamp>(pt + i + 8, qt + i + 8, lo, hi, unused_bits);
      } else {
        add_row_avx512<true, Check, Clamp>(pt + i, w, row_bits);
      }
    }
    if (i < len8) {
      if constexpr (HasQ)
        add_eight_avx2<HasQ, Check, Clamp>(pt + i, qt + i, lo, hi, unused_bits);
      else
        add_row_avx512<false, Check, Clamp>(pt + i, w, row_bits);
    }
    if constexpr (streams)
      if (--until_fold == 0) {
        until_fold = every;
        pw = _mm512_add_pd(pw, fold_lanes_avx512(ps));
        qw = _mm512_add_pd(qw, fold_lanes_avx512(qs));
        ps = qs = _mm512_setzero_ps();
      }
    if (len8 == len) out[t] = HasQ ? combine_lanes_avx2(lo, hi) : combine_lanes_avx512(w);
  }
  [[maybe_unused]] double p_rest = 0.0, q_rest = 0.0;
  if constexpr (streams) {
    const index_t left = (sp.blocks > sq.blocks ? sp.blocks : sq.blocks) - b;
    for (index_t k = b; k < sp.blocks; ++k) check_block_avx512(sp.a + 16 * k, ps, both_bits);
    for (index_t k = b; k < sq.blocks; ++k) check_block_avx512(sq.a + 16 * k, qs, both_bits);
    pw = _mm512_add_pd(pw, fold_lanes_avx512(ps));
    qw = _mm512_add_pd(qw, fold_lanes_avx512(qs));
    std::uint32_t rest_bits = 0;
    sp.rest(p_rest, rest_bits);
    sq.rest(q_rest, rest_bits);
    both_bits = _mm512_or_si512(both_bits, _mm512_set1_epi32(static_cast<int>(rest_bits)));
    const index_t per_lane = per_tile * every + left;
    const auto adds = static_cast<int>(per_lane > 1 ? per_lane : 1);
    if (adds > c->float_lane_adds) c->float_lane_adds = adds;  // the largest of the calls'
  }
  if constexpr (Check) {
    // Sign bits of 32-bit lanes (floats, with q) or 64-bit lanes (converted doubles).
    c->call_sign_bits = HasQ ? static_cast<unsigned>(_mm512_movepi32_mask(both_bits))
                             : static_cast<unsigned>(_mm512_movepi64_mask(row_bits));
    c->sign_bits |= c->call_sign_bits;
  }
  if (Check || len8 < len) {
    alignas(64) double lanes[3][8];
    if constexpr (HasQ) {
      _mm256_store_pd(lanes[0], lo);
      _mm256_store_pd(lanes[0] + 4, hi);
    } else {
      _mm512_store_pd(lanes[0], w);
    }
    if constexpr (streams) {
      _mm512_store_pd(lanes[1], pw);
      _mm512_store_pd(lanes[2], qw);
    }
    finish_run<HasQ, Check>(lanes, p_rest, q_rest, p, q, len8, len, out, c);
  }
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

/// Whether a dense form with q is the two-step threshold form of the candidate recursion
/// (verify/candidates.hpp: candidate_residual): max(max(p - q * scale[0], 0) - q * scale[1], 0),
/// normaliser 1 between the steps. threshold_tile_avx2 / _avx512 sum it unrolled.
[[nodiscard]] inline bool two_step_form(const dense_f32_weights& f) noexcept {
  return f.steps == 2 && f.q != nullptr && f.scale != nullptr && f.inv_z[0] == 1.0;
}

/// The two-step weights of four elements (threshold_tile_avx2). The products are kept apart from
/// the subtractions (GCC contracts them into FMAs in functions compiled for FMA); the first
/// subtraction is x - product·1 rounded once (vfnmadd), the value vsubpd gives, issued on the FMA
/// pipes: on Zen 3 the conversions, subtractions and maxima share the two add pipes, which bound
/// this loop (docs/PERFORMANCE.md, "The threshold step on AVX2").
[[nodiscard]] __attribute__((target("avx2,fma"), always_inline)) inline __m256d
threshold_weights_avx2(__m256d pv, __m256d qv, __m256d s0, __m256d s1, __m256d one) noexcept {
  const __m256d zero = _mm256_setzero_pd();
  const __m256d v =
      _mm256_max_pd(_mm256_fnmadd_pd(SPECULA_EXP_ROUNDED(_mm256_mul_pd(qv, s0)), one, pv), zero);
  return _mm256_max_pd(_mm256_sub_pd(v, SPECULA_EXP_ROUNDED(_mm256_mul_pd(qv, s1))), zero);
}

/// Adds the two-step weights of eight elements (p and q in two halves of four floats each) to
/// lanes 0-3 (`a0`) and 4-7 (`a1`) as fmadd(w, 1, acc): acc + w rounded once, on the FMA pipes.
__attribute__((target("avx2,fma"), always_inline)) inline void threshold_add_avx2(
    __m128 p_lo, __m128 p_hi, __m128 q_lo, __m128 q_hi, __m256d s0, __m256d s1, __m256d one,
    __m256d& a0, __m256d& a1) noexcept {
  a0 = _mm256_fmadd_pd(
      threshold_weights_avx2(_mm256_cvtps_pd(p_lo), _mm256_cvtps_pd(q_lo), s0, s1, one), one, a0);
  a1 = _mm256_fmadd_pd(
      threshold_weights_avx2(_mm256_cvtps_pd(p_hi), _mm256_cvtps_pd(q_hi), s0, s1, one), one, a1);
}

/// One tile of the two-step form (see two_step_form), lanes as recursion_tile_avx2 (element i
/// in lane i % 8): the same bits. Each row's eight entries are converted from two 16-byte loads
/// (a conversion from memory is cheaper than one from a register half), the sums are fmadd(w, 1,
/// acc) (acc + w rounded once, on the FMA pipes), and the tail is vector code too, masked (lanes
/// past len % 8 load 0, whose weight +0 leaves a lane's sum as it is): scalar code inlined here
/// would be contracted.
[[nodiscard]] __attribute__((target("avx2,fma"))) inline double threshold_tile_avx2(
    const float* p, const float* q, const double* scale, index_t len) noexcept {
  const __m256d zero = _mm256_setzero_pd();
  const __m256d s0 = _mm256_set1_pd(scale[0]), s1 = _mm256_set1_pd(scale[1]);
  __m256d one = _mm256_set1_pd(1.0);
  asm("" : "+v"(one));  // an FMA, not an add (see add_eight_avx2)
  __m256d a0 = zero, a1 = zero;
  index_t i = 0;
  for (; i + 8 <= len; i += 8)
    threshold_add_avx2(_mm_loadu_ps(p + i), _mm_loadu_ps(p + i + 4), _mm_loadu_ps(q + i),
                       _mm_loadu_ps(q + i + 4), s0, s1, one, a0, a1);
  if (i < len) {
    const auto r = static_cast<int>(len - i);
    const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(r), index);  // lanes k < r
    const __m128i ml = _mm256_castsi256_si128(m), mh = _mm256_extracti128_si256(m, 1);
    threshold_add_avx2(_mm_maskload_ps(p + i, ml), _mm_maskload_ps(p + i + 4, mh),
                       _mm_maskload_ps(q + i, ml), _mm_maskload_ps(q + i + 4, mh), s0, s1, one, a0,
                       a1);
  }
  alignas(32) double lane[8];
  _mm256_store_pd(lane, a0);
  _mm256_store_pd(lane + 4, a1);
  return combine_lanes(lane);
}

/// The two-step weights of eight elements (threshold_tile_avx512), the products kept apart from
/// the subtractions: GCC contracts them into FMAs in functions compiled for AVX-512.
[[nodiscard]] __attribute__((target(SPECULA_AVX512_TARGET))) inline __m512d
threshold_weights_avx512(__m512d pv, __m512d qv, __m512d s0, __m512d s1) noexcept {
  const __m512d zero = _mm512_setzero_pd();
  const __m512d v =
      _mm512_max_pd(_mm512_sub_pd(pv, SPECULA_EXP_ROUNDED(_mm512_mul_pd(qv, s0))), zero);
  return _mm512_max_pd(_mm512_sub_pd(v, SPECULA_EXP_ROUNDED(_mm512_mul_pd(qv, s1))), zero);
}

/// threshold_tile_avx2 with eight doubles per vector (the same lanes and bits). The tail is
/// vector code too, masked (lane k < len % 8 takes element k of the tail, as the scalar loop
/// would): scalar code inlined here would be contracted as well.
[[nodiscard]] __attribute__((target(SPECULA_AVX512_TARGET))) inline double threshold_tile_avx512(
    const float* p, const float* q, const double* scale, index_t len) noexcept {
  const __m512d s0 = _mm512_set1_pd(scale[0]), s1 = _mm512_set1_pd(scale[1]);
  __m512d a = _mm512_setzero_pd();
  index_t i = 0;
  for (; i + 8 <= len; i += 8)
    a = _mm512_add_pd(a, threshold_weights_avx512(_mm512_cvtps_pd(_mm256_loadu_ps(p + i)),
                                                  _mm512_cvtps_pd(_mm256_loadu_ps(q + i)), s0, s1));
  if (i < len) {
    const auto m = static_cast<__mmask8>((1u << (len - i)) - 1u);
    a = _mm512_mask_add_pd(
        a, m, a,
        threshold_weights_avx512(_mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, p + i)),
                                 _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, q + i)), s0, s1));
  }
  alignas(64) double lane[8];
  _mm512_store_pd(lane, a);
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
/// index inside it, on the active instruction set. With Check (simple forms only: see
/// simple_form), also the tile's entry sums and minimum into `c` (see tile_lanes).
template <bool HasQ, bool Check = false>
[[nodiscard]] inline double dense_tile_sum_q(const dense_f32_weights& f, index_t begin, index_t end,
                                             tile_checks* c = nullptr) noexcept {
  const float* p = f.p + begin;
  const float* q = HasQ ? f.q + begin : nullptr;
  const index_t len = end - begin;
  const bool simple = Check || simple_form(f);
#if SPECULA_SIMD_X86
  const simd::isa path = simd::active_isa();
  if (path >= simd::isa::avx2) {
    if constexpr (HasQ) {
      if (!simple && two_step_form(f))
        return path == simd::isa::avx512 ? threshold_tile_avx512(p, q, f.scale, len)
                                         : threshold_tile_avx2(p, q, f.scale, len);
    }
    // The nested recursion has no AVX-512 kernel: AVX2's serves AVX-512 CPUs (same bits).
    if (!simple) return recursion_tile_avx2<HasQ>(p, q, f.scale, f.inv_z, f.steps, len);
    double sum = 0.0;
    if (path == simd::isa::avx512)
      tile_run_avx512<HasQ, Check>(p, q, 1, len, &sum, c);
    else
      tile_run_avx2<HasQ, Check>(p, q, 1, len, &sum, c);
    return sum;
  }
  if (path == simd::isa::sse2)
    return simple ? tile_sum_sse2<HasQ, Check>(p, q, len, c)
                  : recursion_tile_sse2<HasQ>(p, q, f.scale, f.inv_z, f.steps, len);
#endif
  return simple ? tile_sum_scalar<HasQ, Check>(p, q, len, c)
                : recursion_tile_scalar<HasQ>(p, q, f.scale, f.inv_z, f.steps, len);
}

template <bool Check = false>
[[nodiscard]] inline double dense_tile_sum(const dense_f32_weights& f, index_t begin, index_t end,
                                           tile_checks* c = nullptr) noexcept {
  return f.q != nullptr ? dense_tile_sum_q<true, Check>(f, begin, end, c)
                        : dense_tile_sum_q<false, Check>(f, begin, end, c);
}

/// Whether [begin, end) holds one of list[0 .. count).
[[nodiscard]] SPECULA_HOST_DEVICE constexpr bool holds_index(const token_t* list, index_t count,
                                                             index_t begin, index_t end) noexcept {
  for (index_t j = 0; j < count; ++j) {
    const auto x = static_cast<index_t>(list[j]);
    if (x >= begin && x < end) return true;
  }
  return false;
}

/// Whether [begin, end) holds one of the form's skip indices.
[[nodiscard]] inline bool holds_skip(const dense_f32_weights& f, index_t begin,
                                     index_t end) noexcept {
  return holds_index(f.skip, f.num_skip, begin, end);
}

#if SPECULA_SIMD_X86

/// The AVX2 and AVX-512 part of dense_tile_sums: `tiles` full tiles without skip indices from
/// `t`, in one run kernel call (one tile at a time: interleaving tiles, which gives the lane
/// chains more instruction-level parallelism, ran from L3 or memory at a fraction of the speed
/// of one, as their streams defeat the prefetchers: on Zen 3, four tiles of p and q ran a
/// residual pass at half the speed of one; on Zen 4, a bonus row of 32000 in L3 took 14.4 us
/// against 3.8; docs/PERFORMANCE.md). With Check: the entry sums into `scan`, and without q
/// and with a sign bit in the run, the run summed again with the clamp.
template <bool HasQ, bool Check, bool Avx512>
inline void wide_tile_run(const dense_f32_weights& f, index_t t, index_t tiles, index_t tile,
                          double* out, tile_checks* c, dense_scan* scan) noexcept {
  // Checked without q: the plain entries first (no maximum), and only a run with a sign bit
  // (a negative entry, -0, or NaN with the sign set) summed again with the clamp.
  constexpr bool plain = Check && !HasQ;
  const float* q = HasQ ? f.q + t : nullptr;
  if constexpr (Avx512)
    tile_run_avx512<HasQ, Check, !plain>(f.p + t, q, tiles, tile, out, c);
  else
    tile_run_avx2<HasQ, Check, !plain>(f.p + t, q, tiles, tile, out, c);
  if constexpr (plain) {
    if (c->call_sign_bits != 0) {
      if constexpr (Avx512)
        tile_run_avx512<HasQ, Check>(f.p + t, q, tiles, tile, out, c);
      else
        tile_run_avx2<HasQ, Check>(f.p + t, q, tiles, tile, out, c);
    }
  }
  if constexpr (Check) {
    if constexpr (HasQ) {
      scan->p_sum += c->p_sum;
      scan->q_sum += c->q_sum;
    } else {
      for (index_t k = 0; k < tiles; ++k) scan->p_sum += out[k];  // exact: the weight sums
    }
  }
}

#endif  // SPECULA_SIMD_X86

/// Tile sums of a dense form over the tiles of `tile` elements that start in [begin, end)
/// (the last one ends at `n`): out[k] for the k-th tile, in the fixed order of
/// tile_positive_sum. Tiles holding a skip index are left untouched (the caller computes them
/// from the element calls). `tile` is a multiple of 8, at most sum_tile. On AVX2 and AVX-512
/// each run of full tiles without skip indices is summed by one run kernel call.
///
/// With Check (check_level::reads; simple forms only: see simple_form), the same pass adds
/// the entry sums of the form's rows over these tiles to `scan` (exact, or from float lanes:
/// see tile_checks) and lowers its minimum (skip tiles included), so a row is validated while
/// it is read for its weights. The weight sums are the unchecked ones for every row without
/// NaN.
template <bool Check = false>
inline void dense_tile_sums(const dense_f32_weights& f, index_t begin, index_t end, index_t n,
                            index_t tile, double* out, dense_scan* scan = nullptr) noexcept {
  const index_t first = begin;
  tile_checks c;
  if constexpr (Check) c.low = scan->low;
#if SPECULA_SIMD_X86
  const simd::isa path = simd::active_isa();
  const bool wide = simple_form(f) && path >= simd::isa::avx2;
#endif
  for (index_t t = begin, k = 0; t < end;) {
    const index_t e = t + tile < n ? t + tile : n;
#if SPECULA_SIMD_X86
    if (wide && e - t == tile && !holds_skip(f, t, e)) {
      index_t m = 1;  // the run: full tiles without skip indices, starting before `end`
      while (t + m * tile < end && t + (m + 1) * tile <= n &&
             !holds_skip(f, t + m * tile, t + (m + 1) * tile))
        ++m;
      const auto run = [&](auto avx512) {
        constexpr bool w = decltype(avx512)::value;
        if (f.q != nullptr)
          wide_tile_run<true, Check, w>(f, t, m, tile, out + k, &c, scan);
        else
          wide_tile_run<false, Check, w>(f, t, m, tile, out + k, &c, scan);
      };
      if (path == simd::isa::avx512)
        run(std::true_type{});
      else
        run(std::false_type{});
      t += m * tile;
      k += m;
      continue;
    }
#endif
    if (!holds_skip(f, t, e))
      out[k] = dense_tile_sum<Check>(f, t, e, &c);
    else if constexpr (Check)
      (void)dense_tile_sum<true>(f, t, e, &c);  // the rows' entries; weights from element calls
    if constexpr (Check) {
      scan->p_sum += c.p_sum;
      scan->q_sum += c.q_sum;
    }
    t += tile;
    ++k;
  }
  if constexpr (Check) {
    if (c.saw_sign_bit()) {
      // The minimum tile_lanes::add keeps, over the tiles summed here (rarely needed).
      const index_t last = first + (end - 1 - first) / tile * tile;
      const index_t stop = last + tile < n ? last + tile : n;
      for (index_t i = first; i < stop; ++i) {
        const float pf = f.p[i];
        const float qf = f.q != nullptr ? f.q[i] : pf;
        const float m = pf < qf ? pf : qf;  // q when either is NaN, as tile_lanes::add
        c.low = m < c.low ? m : c.low;
      }
    }
    scan->low = c.low;
    if (c.float_lane_adds > scan->float_lane_adds) scan->float_lane_adds = c.float_lane_adds;
  }
}

/// Tiles per dense_tile_sums call of the passes (a stack buffer of their sums).
inline constexpr index_t tiles_per_chunk = 64;

/// The fast pass of check_probability_row over a float row: its entry sum (the tiles' sums of
/// checked_entry, 8 lanes each combined pairwise, added left to right) and its smallest entry
/// (NaN ignored, at most 0) into `lowest`. The checked passes compute the same two values while
/// they sum a row's weights (dense_tile_sums), so a row read by a pass is validated by it.
[[nodiscard]] inline double row_sum_and_min(const float* row, index_t n, double& lowest) noexcept {
  dense_scan scan;
  const dense_f32_weights f{row};
  double sums[tiles_per_chunk];
  for (index_t t = 0; t < n; t += tiles_per_chunk * sum_tile) {
    const index_t end = n - t < tiles_per_chunk * sum_tile ? n : t + tiles_per_chunk * sum_tile;
    dense_tile_sums<true>(f, t, end, n, sum_tile, sums, &scan);
  }
  lowest = static_cast<double>(scan.low);
  return scan.p_sum;
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

[[nodiscard]] __attribute__((target(SPECULA_AVX512_TARGET))) inline index_t argmax_f32_avx512(
    const float* row, index_t n) noexcept {
  const float neg_inf = -__builtin_inff();
  __m512 m0 = _mm512_set1_ps(neg_inf), m1 = m0, m2 = m0, m3 = m0;
  index_t i = 0;
  // max(v, m) returns m when v is NaN, so NaN entries never become the maximum.
  for (; i + 64 <= n; i += 64) {
    m0 = _mm512_max_ps(_mm512_loadu_ps(row + i), m0);
    m1 = _mm512_max_ps(_mm512_loadu_ps(row + i + 16), m1);
    m2 = _mm512_max_ps(_mm512_loadu_ps(row + i + 32), m2);
    m3 = _mm512_max_ps(_mm512_loadu_ps(row + i + 48), m3);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
  float best = neg_inf;
  for (float v : lanes) best = v > best ? v : best;
  for (; i < n; ++i) best = row[i] > best ? row[i] : best;
  const __m512 target = _mm512_set1_ps(best);
  index_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __mmask16 mask = _mm512_cmp_ps_mask(_mm512_loadu_ps(row + j), target, _CMP_EQ_OQ);
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
  if (simd::active_isa() == simd::isa::avx512) return argmax_f32_avx512(row, n);
  if (simd::active_isa() == simd::isa::avx2) return argmax_f32_avx2(row, n);
#endif
  return argmax_f32_scalar(row, n);
}

}  // namespace specula::detail
