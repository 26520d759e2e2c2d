#pragma once

/// @file
/// Fused logits -> probabilities on the GPU: the device counterpart of specula::logits_to_probs
/// (include/specula/sample/transforms.hpp), for fp32, bf16 and fp16 logits.
///
/// Order, as on the host: CFG mix -> temperature -> top-k (on logits, ties kept) -> softmax
/// (max subtracted) -> top-p (ties kept, renormalised) -> min-p (renormalised). The scalar maths
/// of the first two steps are the host's function objects (cfg_mix_op, temperature_op).
///
/// Layout of the work: one CTA of `transforms_block_size` threads per row. The input row is read
/// directly in its own type (bf16/fp16 are converted per element in registers); no fp32 copy of
/// the logits is made, and the only write is the fp32 output row. Threads own chunks of 16 bytes
/// (4 fp32 or 8 bf16/fp16 logits), read with one vector load when the row is 16-byte aligned.
/// Each pass re-reads the input row and recomputes the per-element values:
///
///   1  scan: max logit, first NaN / first +Inf
///   8  top-k threshold (only when 0 < top_k < cols): radix select on the order-preserving
///      32-bit key of the logit, 4 bits per pass; each pass counts, for 16 candidate thresholds
///      at once, the elements >= the candidate (per-thread counters, then one cub::BlockReduce)
///   1  softmax denominator (sum in double)
///   8  top-p threshold (only when top_p < 1): the same radix select in probability space,
///      accumulating mass (double) instead of counts; the first pass also yields the total and
///      the last one the kept mass (the renormalisation constant)
///   1  min-p renormalisation sum (only when min_p > 0); the max probability is known in
///      closed form (the arg-max logit has exp(0) = 1)
///   1  write
///
/// i.e. 3 passes over the row with no top-k/top-p/min-p, at most 20 with all of them. A radix
/// select stops reading the row once the elements above its lower bound fit a shared buffer of
/// transforms_candidates values: one more pass gathers them, and its remaining passes read
/// shared memory (top-k: after the pass whose count says so; top-p: once total / lower bound
/// does). No sort, no global workspace.
///
/// Guarantees: the reductions have a fixed order (per-thread strided accumulation in index order,
/// then cub::BlockReduce on a fixed block size), so the same inputs give the same output bits on
/// every call, whatever the other rows of the batch are and wherever the row sits in it. The
/// result is NOT bit-identical to the host's logits_to_probs: the device sums in another order,
/// and uses the device expf (max 2 ulp). The CFG mix and the temperature are the host's bits:
/// cfg_mix_op and temperature_op round every operation on its own (__fmul_rn / __fadd_rn /
/// __fsub_rn), so nothing is contracted into an FMA (checked on the PTX by
/// cuda.no_fma_contraction). Filter decisions
/// (top-k) on identical logits are exact; top-p/min-p decisions can differ from the host only
/// when a cumulative mass lies within rounding of its target.
///
/// Bad rows never stop the batch: the row's status (specula::status cast to std::uint32_t) is
/// written to `row_status[row]` (0 = ok) and its output row is filled with quiet NaN.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <limits>
#include <type_traits>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/numeric.hpp"
#include "specula/core/row.hpp"
#include "specula/core/status.hpp"
#include "specula/core/types.hpp"
#include "specula/cuda/config.cuh"
#include "specula/cuda/error.cuh"
#include "specula/cuda/policy.cuh"
#include "specula/sample/transforms.hpp"

SPECULA_CUDA_NAMESPACE_BEGIN

/// Logit element types accepted by logits_to_probs_async.
template <class T>
concept logit_element =
    std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

/// Threads per CTA (one CTA per row). A compile-time constant: the reduction order, and so the
/// output bits, depend only on the row's inputs.
inline constexpr int transforms_block_size = 512;

/// Workspace logits_to_probs_async needs: none (every pass re-reads the input row).
[[nodiscard]] constexpr std::size_t logits_to_probs_workspace_bytes(index_t /*rows*/,
                                                                    index_t /*cols*/) noexcept {
  return 0;
}

namespace transforms_detail {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ float neg_inf() { return __int_as_float(static_cast<int>(0xff800000u)); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

/// Order-preserving key of a float: a < b (non-NaN, -0 below +0) iff key(a) < key(b).
__device__ __forceinline__ std::uint32_t order_key(float f) {
  const std::uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u);
}

/// key(-Inf). Keys below it are negative NaN patterns.
inline constexpr std::uint32_t neg_inf_key = 0x007FFFFFu;

/// The float threshold of a key, clamped to -Inf below key(-Inf). Keys above key(+Inf) give
/// NaN, which no element reaches (x >= NaN is false), so the counting functions below are
/// non-increasing over the whole key range.
__device__ __forceinline__ float key_threshold(std::uint32_t k) {
  if (k <= neg_inf_key) return neg_inf();
  const std::uint32_t b = (k & 0x80000000u) != 0u ? (k & 0x7FFFFFFFu) : ~k;
  return __uint_as_float(b);
}

/// 16 accumulators (one per candidate threshold of a radix-select pass).
template <class A>
struct acc16 {
  A v[16];
};

struct acc16_sum {
  template <class A>
  __device__ acc16<A> operator()(const acc16<A>& a, const acc16<A>& b) const {
    acc16<A> r;
#pragma unroll
    for (int j = 0; j < 16; ++j) r.v[j] = a.v[j] + b.v[j];
    return r;
  }
};

struct double_sum {
  __device__ double operator()(double a, double b) const { return a + b; }
};

/// Pass 1: max over the non-NaN logits, first NaN index, first +Inf index (n when none).
struct scan_acc {
  float max;
  long long first_nan;
  long long first_inf;
};

struct scan_combine {
  __device__ scan_acc operator()(const scan_acc& a, const scan_acc& b) const {
    return {a.max > b.max ? a.max : b.max, a.first_nan < b.first_nan ? a.first_nan : b.first_nan,
            a.first_inf < b.first_inf ? a.first_inf : b.first_inf};
  }
};

template <int Block>
union reduce_storage {
  typename cub::BlockReduce<acc16<double>, Block>::TempStorage mass;
  typename cub::BlockReduce<acc16<unsigned>, Block>::TempStorage count;
  typename cub::BlockReduce<scan_acc, Block>::TempStorage scan;
  typename cub::BlockReduce<double, Block>::TempStorage sum;
  typename cub::BlockScan<int, Block>::TempStorage offsets;  // gather_candidates

  /// The storage of the radix select's reduction over acc16<A>.
  template <class A>
  __device__ typename cub::BlockReduce<acc16<A>, Block>::TempStorage& get() {
    if constexpr (std::is_same_v<A, double>)
      return mass;
    else
      return count;
  }
};

struct reduce_slots {
  acc16<double> mass;
  acc16<unsigned> count;
  scan_acc scan;
  double sum;
};

/// Block-wide reduction whose result every thread receives. Deterministic for a fixed Block.
template <int Block, class V, class Op>
__device__ V block_all_reduce(const V& v, Op op,
                              typename cub::BlockReduce<V, Block>::TempStorage& tmp, V& slot) {
  const V r = cub::BlockReduce<V, Block>(tmp).Reduce(v, op);
  if (threadIdx.x == 0) slot = r;
  __syncthreads();
  const V out = slot;
  __syncthreads();  // tmp and slot may be reused by the next reduction
  return out;
}

/// Host-side check of the parameters, repeated per row on the device.
__host__ __device__ inline bool valid_params(const sampling_params& s) {
  return specula::detail::is_finite(s.temperature) && s.temperature > 0.0f && s.top_k >= 0 &&
         s.top_p > 0.0f && s.top_p <= 1.0f && s.min_p >= 0.0f && s.min_p <= 1.0f &&
         specula::detail::is_finite(s.cfg_scale);
}

/// Word w of a vector (w a compile-time constant after unrolling).
__device__ __forceinline__ std::uint32_t vector_word(const uint4& v, int w) {
  return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

/// The bits of a 16-bit logit.
__device__ __forceinline__ unsigned short bits16(__half x) { return __half_as_ushort(x); }
__device__ __forceinline__ unsigned short bits16(__nv_bfloat16 x) {
  return __bfloat16_as_ushort(x);
}

/// Element j of a 16-byte chunk of T (4 fp32 or 8 bf16 / fp16 logits), as float (exact, as
/// to_float of the element).
template <class T>
__device__ __forceinline__ float vector_element(const uint4& v, int j) {
  if constexpr (std::is_same_v<T, float>) {
    return __uint_as_float(vector_word(v, j));
  } else {
    const std::uint32_t w = vector_word(v, j / 2);
    const auto bits = static_cast<unsigned short>((j % 2) != 0 ? (w >> 16) : (w & 0xFFFFu));
    if constexpr (std::is_same_v<T, __half>)
      return __half2float(__ushort_as_half(bits));
    else
      return __bfloat162float(__ushort_as_bfloat16(bits));
  }
}

/// One row's logits after CFG and temperature, as the host computes them.
template <class T>
struct logit_source {
  /// Elements per chunk: 16 bytes of T.
  static constexpr int width = static_cast<int>(16 / sizeof(T));

  const T* cond;
  const T* uncond;  // null: no CFG
  cfg_mix_op mix;
  temperature_op temperature;
  bool apply_temperature;

  /// The logit after CFG and temperature, from the row entries as float.
  __device__ __forceinline__ float transformed(float c, float u) const {
    float x = c;
    if (uncond != nullptr) x = mix(x, u);
    if (apply_temperature) x = temperature(x);
    return x;
  }
  __device__ __forceinline__ float operator()(index_t i) const {
    return transformed(to_float(cond[i]), uncond != nullptr ? to_float(uncond[i]) : 0.0f);
  }
  /// Whether chunks can be read with 16-byte loads (every row pointer 16-byte aligned).
  __device__ __forceinline__ bool vector_loads() const {
    const auto aligned = [](const T* ptr) {
      return reinterpret_cast<std::uintptr_t>(ptr) % sizeof(uint4) == 0;
    };
    return aligned(cond) && (uncond == nullptr || aligned(uncond));
  }
  /// The raw entries of chunk [first, first + width) of both rows.
  struct chunk {
    uint4 cond;
    uint4 uncond;
  };
  __device__ __forceinline__ chunk load_chunk(index_t first, bool vector) const {
    chunk k{};
    k.cond = load_vector(cond + first, vector);
    if (uncond != nullptr) k.uncond = load_vector(uncond + first, vector);
    return k;
  }
  /// The chunk at `p`: one 16-byte load, or one load per element (same bits).
  static __device__ __forceinline__ uint4 load_vector(const T* p, bool vector) {
    if (vector) return *reinterpret_cast<const uint4*>(p);
    const auto word = [p](int w) -> std::uint32_t {
      if constexpr (sizeof(T) == 4)
        return __float_as_uint(p[w]);
      else
        return static_cast<std::uint32_t>(bits16(p[2 * w])) |
               (static_cast<std::uint32_t>(bits16(p[2 * w + 1])) << 16);
    };
    return {word(0), word(1), word(2), word(3)};
  }
  /// use(first + j, logit j) for the chunk's elements in order.
  template <class Use>
  __device__ __forceinline__ void each(const chunk& k, index_t first, Use& use) const {
#pragma unroll
    for (int j = 0; j < width; ++j)
      use(first + j, transformed(vector_element<T>(k.cond, j),
                                 uncond != nullptr ? vector_element<T>(k.uncond, j) : 0.0f));
  }
};

/// Calls use(i, src(i)) for every element i < n this thread owns, in increasing i. The row is
/// cut into chunks of W = logit_source<T>::width consecutive elements (16 bytes: 4 fp32 or
/// 8 bf16 / fp16 logits); thread t owns chunks t, t + Block, t + 2 Block, ... and, of the n % W
/// elements after the last full chunk, the t-th. Two chunks are loaded before either is used,
/// each with one 16-byte load per input row when the row pointers are 16-byte aligned and with
/// one load per element otherwise, into the same registers: the owner and the order do not
/// depend on the alignment, so neither do the per-thread sums nor the output bits (one code
/// path for both cases; a separate element-wise loop made ptxas spill in the fused path).
template <int Block, class T, class Use>
__device__ __forceinline__ void strided_pass(const logit_source<T>& src, index_t n, Use&& use) {
  constexpr int W = logit_source<T>::width;
  const index_t chunks = n / W;
  const auto t = static_cast<index_t>(threadIdx.x);
  const bool vector = src.vector_loads();
  index_t c = t;
  for (; c + Block < chunks; c += 2 * Block) {
    const auto a = src.load_chunk(c * W, vector);
    const auto b = src.load_chunk((c + Block) * W, vector);
    src.each(a, c * W, use);
    src.each(b, (c + Block) * W, use);
  }
  if (c < chunks) src.each(src.load_chunk(c * W, vector), c * W, use);
  const index_t tail = chunks * W + t;
  if (tail < n) use(tail, src(tail));
}

/// Capacity (elements) of the shared candidate buffer of the radix selects.
inline constexpr int transforms_candidates = 4096;

/// Copies the values x = value(logit) >= lower of the row into `cand`, block-wide, in a fixed
/// order (rounds of Block * W elements; within a round by thread, then by position), and
/// returns their number; -1 when there are more than transforms_candidates (the radix select
/// then stays on the row). One read of the row and one block scan per round.
template <int Block, class T, class Value>
__device__ index_t gather_candidates(const logit_source<T>& src, index_t n, const Value& value,
                                     float lower, float* cand,
                                     typename cub::BlockScan<int, Block>::TempStorage& tmp) {
  constexpr int W = logit_source<T>::width;
  constexpr index_t per_round = static_cast<index_t>(Block) * W;
  index_t base = 0;
  for (index_t first = 0; first < n; first += per_round) {
    const index_t mine = first + static_cast<index_t>(threadIdx.x) * W;
    float x[W];
    int count = 0;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      x[j] = mine + j < n ? value(src(mine + j)) : quiet_nan();  // NaN is never >= lower
      count += x[j] >= lower ? 1 : 0;
    }
    int offset = 0;
    int total = 0;
    cub::BlockScan<int, Block>(tmp).ExclusiveSum(count, offset, total);
    if (base + total > transforms_candidates) {  // uniform: total is the block's
      base = -1;
      break;
    }
    index_t at = base + offset;
#pragma unroll
    for (int j = 0; j < W; ++j)
      if (x[j] >= lower) cand[at++] = x[j];
    base += total;
    __syncthreads();  // tmp is reused by the next round's scan
  }
  __syncthreads();  // cand is complete (and tmp free) for every thread
  return base;
}

/// Radix select (4 bits per pass, 8 passes): the largest key K such that
/// F(K) = sum of w_i over the elements with x_i >= key_threshold(K) is >= target, where
/// `target = make_target(F(0))` (F(0) is the total weight). Returns key_threshold(K); `kept`
/// receives F(K). Element i's value is x_i = value(logit_i), its weight weight(x_i). Elements
/// below the current lower bound are skipped after the test, so later passes add only near the
/// threshold; once fits(F of the new lower bound, F(0), lower bound) says the surviving elements
/// fit the shared buffer `cand` (transforms_candidates), their values are gathered there once
/// and the remaining passes read them instead of the row. Which passes run where depends only on
/// the row, so the result is deterministic.
template <int Block, class A, class T, class Value, class Weight, class MakeTarget, class Fits>
__device__ float radix_select(const logit_source<T>& src, index_t n, const Value& value,
                              const Weight& weight, const MakeTarget& make_target, const Fits& fits,
                              reduce_storage<Block>& tmp, acc16<A>& slot, float* cand, A& kept) {
  std::uint32_t prefix = 0;
  A target{};
  A total{};
  index_t gathered = -1;  // number of values in cand; -1: the passes read the row
  for (int shift = 28; shift >= 0; shift -= 4) {
    float thr[16];
#pragma unroll
    for (int j = 0; j < 16; ++j)
      thr[j] = key_threshold(prefix | (static_cast<std::uint32_t>(j) << shift));
    acc16<A> acc;
#pragma unroll
    for (int j = 0; j < 16; ++j) acc.v[j] = A(0);
    const auto add = [&](float x) {
      if (!(x >= thr[0])) return;
      const A w = weight(x);
#pragma unroll
      for (int j = 0; j < 16; ++j) acc.v[j] += x >= thr[j] ? w : A(0);
    };
    if (gathered < 0)
      strided_pass<Block>(src, n, [&](index_t, float logit) { add(value(logit)); });
    else
      for (index_t i = threadIdx.x; i < gathered; i += Block) add(cand[i]);
    const acc16<A> f = block_all_reduce<Block>(acc, acc16_sum{}, tmp.template get<A>(), slot);
    if (shift == 28) {
      total = f.v[0];
      target = make_target(total);
    }
    // f is non-increasing in j and f.v[0] >= target (invariant). Compile-time indices only (a
    // dynamic f.v[best] put f in a 128-byte local-memory frame).
    int best = 0;
    A best_f = f.v[0];
#pragma unroll
    for (int j = 1; j < 16; ++j)
      if (f.v[j] >= target) {
        best = j;
        best_f = f.v[j];
      }
    prefix |= static_cast<std::uint32_t>(best) << shift;
    kept = best_f;
    if (gathered < 0 && shift > 0 && fits(best_f, total, key_threshold(prefix)))
      gathered = gather_candidates<Block>(src, n, value, key_threshold(prefix), cand, tmp.offsets);
  }
  return key_threshold(prefix);
}

/// The per-row constants of the transform, found by the passes (identical in every thread):
/// everything needed to compute any entry of the output row from the logits alone.
struct row_transform {
  std::uint32_t status = 0;  ///< specula::status of the row (0 = ok)
  float max = 0.0f;          ///< max logit (after CFG and temperature)
  float thr_k = 0.0f;        ///< top-k threshold on logits (-Inf: no top-k)
  double inv_sum = 1.0;      ///< 1 / softmax denominator
  float thr_p = 0.0f;        ///< top-p threshold on probabilities
  double inv_p = 1.0;        ///< 1 / mass kept by top-p
  float thr_m = 0.0f;        ///< min-p threshold
  double inv_m = 1.0;        ///< 1 / mass kept by min-p
  bool do_top_p = false;
  bool do_min_p = false;

  /// Softmax over the top-k survivors, of logit x (after CFG and temperature).
  __device__ __forceinline__ float p1_of(float x) const {
    if (!(x >= thr_k)) return 0.0f;
    return static_cast<float>(static_cast<double>(expf(x - max)) * inv_sum);
  }
  /// After top-p.
  __device__ __forceinline__ float p2_of(float x) const {
    float p = p1_of(x);
    if (do_top_p) {
      if (p < thr_p) p = 0.0f;
      p = static_cast<float>(static_cast<double>(p) * inv_p);
    }
    return p;
  }
  /// Output entry of logit x of a row whose transform succeeded.
  __device__ __forceinline__ float filtered(float x) const {
    float p = p2_of(x);
    if (do_min_p) {
      if (p < thr_m) p = 0.0f;
      p = static_cast<float>(static_cast<double>(p) * inv_m);
    }
    return p;
  }
  /// Output entry of logit x (quiet NaN for a failed row).
  __device__ __forceinline__ float prob_of(float x) const {
    return status != 0u ? quiet_nan() : filtered(x);
  }
  /// Output entry i of the row `src` reads (a failed row reads nothing).
  template <class Source>
  __device__ __forceinline__ float prob(const Source& src, index_t i) const {
    if (status != 0u) return quiet_nan();
    return filtered(src(i));
  }
};

/// The shared memory of one row's passes.
template <int Block>
struct transform_shared {
  reduce_storage<Block> tmp;
  reduce_slots slots;
  float cand[transforms_candidates];  ///< the radix selects' gathered candidates
};

/// The first pass of a row (every thread gets the result): the max over the non-NaN logits, the
/// first NaN and the first +Inf index (n when none).
template <int Block, class T>
__device__ scan_acc scan_row(const logit_source<T>& src, index_t n, transform_shared<Block>& sh) {
  scan_acc s{neg_inf(), n, n};
  strided_pass<Block>(src, n, [&](index_t i, float x) {
    if (x != x) {
      if (s.first_nan == n) s.first_nan = i;
    } else if (x == pos_inf()) {
      if (s.first_inf == n) s.first_inf = i;
    } else if (x > s.max) {
      s.max = x;
    }
  });
  return block_all_reduce<Block>(s, scan_combine{}, sh.tmp.scan, sh.slots.scan);
}

/// The row's status after its first pass (as the host's scan_logits: the first NaN or +Inf,
/// whichever comes first; no_mass for a row of -Inf only), as std::uint32_t (0 = ok).
__device__ inline std::uint32_t scan_status(const scan_acc& s, index_t n) {
  if (s.first_nan < n || s.first_inf < n)
    return static_cast<std::uint32_t>(s.first_nan < s.first_inf ? status::nan_value
                                                                : status::inf_value);
  if (s.max == neg_inf()) return static_cast<std::uint32_t>(status::no_mass);
  return 0u;
}

/// Runs the passes of one row with the whole block (see file comment); every thread returns the
/// same constants. n > 0.
template <class T, int Block>
__device__ row_transform compute_row_transform(const logit_source<T>& src,
                                               const sampling_params& sp, index_t n,
                                               transform_shared<Block>& sh) {
  reduce_storage<Block>& tmp = sh.tmp;
  reduce_slots& slots = sh.slots;
  row_transform t;
  if (!valid_params(sp)) {
    t.status = static_cast<std::uint32_t>(status::invalid_parameter);
    return t;
  }
  // Pass 1: max, first NaN, first +Inf (the host's softmax reports the first offender).
  const scan_acc s = scan_row<Block>(src, n, sh);
  t.status = scan_status(s, n);
  if (t.status != 0u) return t;
  t.max = s.max;  // top-k always keeps the max, so this is also the filtered max

  // Top-k threshold on the logits (keep x >= thr_k; -Inf keeps everything).
  t.thr_k = neg_inf();
  if (sp.top_k > 0 && sp.top_k < n) {
    const auto k = static_cast<unsigned>(sp.top_k);
    unsigned kept_count = 0;
    t.thr_k = radix_select<Block, unsigned>(
        src, n, [](float logit) { return logit; }, [](float) { return 1u; },
        [k](unsigned) { return k; },
        [](unsigned survivors, unsigned, float) {
          return survivors <= static_cast<unsigned>(transforms_candidates);
        },
        tmp, slots.count, sh.cand, kept_count);
  }

  // Softmax denominator: exp(x - m) in float, summed in double (as the host).
  double sum = 0.0;
  strided_pass<Block>(src, n, [&](index_t, float x) {
    if (x >= t.thr_k) sum += static_cast<double>(expf(x - t.max));
  });
  sum = block_all_reduce<Block>(sum, double_sum{}, tmp.sum, slots.sum);
  t.inv_sum = 1.0 / sum;

  // Top-p threshold in probability space; the kept mass is the renormalisation constant.
  t.do_top_p = sp.top_p < 1.0f;
  if (t.do_top_p) {
    const double top_p = sp.top_p;
    double kept_mass = 0.0;
    // The survivors of a lower bound `lower` > 0 each carry at least `lower` of the total mass,
    // so at most total / lower of them remain (the gather checks the count anyway).
    t.thr_p = radix_select<Block, double>(
        src, n, [&](float logit) { return t.p1_of(logit); },
        [](float x) { return static_cast<double>(x); },
        [top_p](double total) { return top_p * total; },
        [](double, double total, float lower) {
          return lower > 0.0f &&
                 total <= static_cast<double>(transforms_candidates) * lower * (1.0 - 1e-6);
        },
        tmp, slots.mass, sh.cand, kept_mass);
    t.inv_p = 1.0 / kept_mass;
  }

  // Min-p: the max probability is the arg-max logit's, exp(0) = 1 times the constants.
  t.do_min_p = sp.min_p > 0.0f;
  if (t.do_min_p) {
    float pmax = static_cast<float>(t.inv_sum);
    if (t.do_top_p) pmax = static_cast<float>(static_cast<double>(pmax) * t.inv_p);
    t.thr_m = sp.min_p * pmax;
    double kept = 0.0;
    strided_pass<Block>(src, n, [&](index_t, float x) {
      const float p = t.p2_of(x);
      if (!(p < t.thr_m)) kept += static_cast<double>(p);
    });
    kept = block_all_reduce<Block>(kept, double_sum{}, tmp.sum, slots.sum);
    t.inv_m = 1.0 / kept;
  }
  return t;
}

/// Row r's logit source (CFG and temperature from its parameters).
template <class T>
__device__ logit_source<T> row_source(batch_view<const T> logits, batch_view<const T> uncond,
                                      const sampling_params& sp, index_t r) {
  return {logits.data + r * logits.row_stride,
          uncond.rows > 0 ? uncond.data + r * uncond.row_stride : nullptr, cfg_mix_op{sp.cfg_scale},
          temperature_op{1.0f / sp.temperature}, sp.temperature != 1.0f};
}

template <class T, int Block>
SPECULA_KERNEL void __launch_bounds__(Block)
    logits_to_probs_kernel(batch_view<const T> logits, batch_view<const T> uncond,
                           row_view<const sampling_params> params, batch_view<float> probs,
                           std::uint32_t* row_status) {
  __shared__ transform_shared<Block> sh;
  const index_t r = blockIdx.x;
  const index_t n = logits.cols;
  float* out = probs.data + r * probs.row_stride;
  const sampling_params sp = params.data[params.size == 1 ? 0 : r];
  if (n == 0) {
    if (threadIdx.x == 0 && row_status != nullptr)
      row_status[r] = static_cast<std::uint32_t>(status::empty_input);
    return;
  }
  const auto src = row_source(logits, uncond, sp, r);
  const row_transform t = compute_row_transform<T, Block>(src, sp, n, sh);
  strided_pass<Block>(src, n, [&](index_t i, float x) { out[i] = t.prob_of(x); });
  if (threadIdx.x == 0 && row_status != nullptr) row_status[r] = t.status;
}

/// The passes only: row r's constants into transforms[r] (the fused verification path).
template <class T, int Block>
SPECULA_KERNEL void __launch_bounds__(Block)
    row_transform_kernel(batch_view<const T> logits, batch_view<const T> uncond,
                         row_view<const sampling_params> params, row_transform* transforms,
                         std::uint32_t* row_status) {
  __shared__ transform_shared<Block> sh;
  const index_t r = blockIdx.x;
  const sampling_params sp = params.data[params.size == 1 ? 0 : r];
  const auto src = row_source(logits, uncond, sp, r);
  row_transform t;
  if (logits.cols == 0)
    t.status = static_cast<std::uint32_t>(status::empty_input);
  else
    t = compute_row_transform<T, Block>(src, sp, logits.cols, sh);
  if (threadIdx.x == 0) {
    transforms[r] = t;
    if (row_status != nullptr) row_status[r] = t.status;
  }
}

/// A probability row computed on the fly from logits and the row's constants: what
/// logits_to_probs writes, entry by entry, without writing it.
template <class T>
struct transformed_row {
  using value_type = float;
  logit_source<T> src;
  row_transform t;
  index_t size;
  __device__ float operator[](index_t i) const { return t.prob(src, i); }
};

/// The target rows of the fused verification path: row(r) is transformed_row of logit row r.
template <class T>
struct transformed_rows {
  batch_view<const T> logits;
  batch_view<const T> uncond;
  row_view<const sampling_params> params;
  const row_transform* transforms;
  __device__ transformed_row<T> row(index_t r) const {
    const sampling_params sp = params.data[params.size == 1 ? 0 : r];
    return {row_source(logits, uncond, sp, r), transforms[r], logits.cols};
  }
};

/// A row of logits after the CFG mix only (no temperature, no filters: they do not move the
/// arg-max), read by greedy verification and greedy sampling.
template <class T>
struct mixed_logit_row {
  using value_type = float;
  logit_source<T> src;
  index_t size;
  __device__ float operator[](index_t i) const { return src(i); }
};

/// Row r of `logits` (mixed with `uncond` by the row's cfg_scale when it has rows) as a
/// mixed_logit_row.
template <class T>
struct mixed_logit_rows {
  batch_view<const T> logits;
  batch_view<const T> uncond;
  row_view<const sampling_params> params;
  __device__ mixed_logit_row<T> row(index_t r) const {
    logit_source<T> src = row_source(logits, uncond, params.data[params.size == 1 ? 0 : r], r);
    src.apply_temperature = false;
    return {src, logits.cols};
  }
};

/// A failed shape check: the diagnostic, and the argument it names.
struct shape_problem {
  diagnostic d;
  const char* argument = "";
  const char* what = "";
};

template <class U>
inline bool overlaps(const U* a, index_t a_rows, index_t a_stride, const float* b, index_t b_rows,
                     index_t b_stride, index_t cols) {
  if (a == nullptr || b == nullptr || a_rows == 0 || b_rows == 0 || cols == 0) return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a);
  const auto a1 = a0 + static_cast<std::uintptr_t>((a_rows - 1) * a_stride + cols) * sizeof(U);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b);
  const auto b1 = b0 + static_cast<std::uintptr_t>((b_rows - 1) * b_stride + cols) * sizeof(float);
  return a0 < b1 && b0 < a1;
}

/// Host checks of extents, strides and pointers (no device memory is read).
template <class T>
shape_problem check_shapes(batch_view<const T> logits, batch_view<const T> uncond,
                           row_view<const sampling_params> params, batch_view<float> probs) {
  const index_t rows = logits.rows, cols = logits.cols;
  const auto bad = [](status c, double v, const char* arg, const char* what) {
    return shape_problem{diagnostic{c, -1, -1, v}, arg, what};
  };
  if (rows < 0 || rows > std::numeric_limits<int>::max())
    return bad(status::length_mismatch, static_cast<double>(rows), "logits",
               "rows must be in [0, 2^31)");
  if (cols < 0 || cols > std::numeric_limits<int>::max())
    return bad(status::length_mismatch, static_cast<double>(cols), "logits",
               "cols must be in [0, 2^31)");
  if (probs.rows != rows)
    return bad(status::length_mismatch, static_cast<double>(probs.rows), "probs_out",
               "rows must equal logits.rows");
  if (probs.cols != cols)
    return bad(status::length_mismatch, static_cast<double>(probs.cols), "probs_out",
               "cols must equal logits.cols");
  if (uncond.rows != 0 && (uncond.rows != rows || uncond.cols != cols))
    return bad(status::length_mismatch, static_cast<double>(uncond.rows), "uncond",
               "must have 0 rows (no CFG) or the shape of logits");
  if (rows == 0) return {};
  if (params.size != 1 && params.size != rows)
    return bad(status::length_mismatch, static_cast<double>(params.size), "params",
               "needs 1 entry or one per row");
  if (params.data == nullptr) return bad(status::empty_input, 0.0, "params", "null data pointer");
  if (cols == 0) return {};
  if (logits.data == nullptr) return bad(status::empty_input, 0.0, "logits", "null data pointer");
  if (probs.data == nullptr) return bad(status::empty_input, 0.0, "probs_out", "null data pointer");
  if (uncond.rows > 0 && uncond.data == nullptr)
    return bad(status::empty_input, 0.0, "uncond", "null data pointer");
  if (rows > 1) {
    if (logits.row_stride < cols)
      return bad(status::length_mismatch, static_cast<double>(logits.row_stride), "logits",
                 "row_stride must be at least the row length");
    if (probs.row_stride < cols)
      return bad(status::length_mismatch, static_cast<double>(probs.row_stride), "probs_out",
                 "row_stride must be at least the row length");
    if (uncond.rows > 0 && uncond.row_stride < cols)
      return bad(status::length_mismatch, static_cast<double>(uncond.row_stride), "uncond",
                 "row_stride must be at least the row length");
  }
  if (overlaps(logits.data, rows, logits.row_stride, probs.data, rows, probs.row_stride, cols))
    return bad(status::overlapping_buffers, 0.0, "probs_out",
               "must not overlap logits (every pass re-reads the input)");
  if (overlaps(uncond.data, uncond.rows, uncond.row_stride, probs.data, rows, probs.row_stride,
               cols))
    return bad(status::overlapping_buffers, 0.0, "probs_out", "must not overlap uncond");
  return {};
}

}  // namespace transforms_detail

/// Enqueues the fused logits -> probabilities transform of every row on `policy.stream`.
///
/// - `logits`: [rows, cols] device rows of T (float, __half or __nv_bfloat16).
/// - `uncond`: unconditional rows for classifier-free guidance, same shape, or 0 rows (no CFG).
/// - `params`: device array of 1 entry (for all rows) or one per row.
/// - `probs_out`: [rows, cols] device fp32 rows; must not overlap the inputs.
/// - `row_status`: device array of `rows` entries receiving specula::status values (0 = ok) as
///   std::uint32_t; may be null. A failed row's output is filled with quiet NaN (empty rows
///   have nothing to fill).
///
/// Does not synchronise. Returns cudaErrorInvalidValue (without launching) when the extents,
/// strides or pointers are inconsistent, otherwise cudaGetLastError() after the launch.
/// Bad data (NaN or +Inf logits, rows without mass, invalid parameters) is reported per row.
template <logit_element T>
cudaError_t logits_to_probs_async(const par_policy& policy, batch_view<const T> logits,
                                  batch_view<const T> uncond,
                                  row_view<const sampling_params> params,
                                  batch_view<float> probs_out,
                                  std::uint32_t* row_status = nullptr) {
  if (!transforms_detail::check_shapes<T>(logits, uncond, params, probs_out).d.ok())
    return cudaErrorInvalidValue;
  if (logits.rows == 0) return cudaSuccess;
  transforms_detail::logits_to_probs_kernel<T, transforms_block_size>
      <<<static_cast<unsigned>(logits.rows), transforms_block_size, 0, policy.stream>>>(
          logits, uncond, params, probs_out, row_status);
  return cudaGetLastError();
}

/// Checked, synchronising variant: throws specula::invalid_input naming the argument for bad
/// extents, cuda_error for CUDA failures, and, after synchronising `policy.stream`,
/// specula::invalid_input for the first row whose status is not ok (row index in the
/// exception; argument "params" for invalid parameters, "logits" otherwise). When `row_status`
/// is null a temporary status array is allocated on the stream (cudaMallocAsync).
template <logit_element T>
void logits_to_probs_checked(const par_policy& policy, batch_view<const T> logits,
                             batch_view<const T> uncond, row_view<const sampling_params> params,
                             batch_view<float> probs_out, std::uint32_t* row_status = nullptr) {
  const auto problem = transforms_detail::check_shapes<T>(logits, uncond, params, probs_out);
  throw_if_failed(problem.d, problem.argument, problem.what);
  if (logits.rows == 0) return;

  struct temp_status {
    std::uint32_t* ptr = nullptr;
    cudaStream_t stream = nullptr;
    ~temp_status() {
      if (ptr != nullptr) (void)cudaFreeAsync(ptr, stream);
    }
  } temp{nullptr, policy.stream};
  std::uint32_t* statuses = row_status;
  const auto rows = static_cast<std::size_t>(logits.rows);
  if (statuses == nullptr) {
    throw_on_error(cudaMallocAsync(reinterpret_cast<void**>(&temp.ptr),
                                   rows * sizeof(std::uint32_t), policy.stream),
                   "cudaMallocAsync (row statuses)");
    statuses = temp.ptr;
  }
  throw_on_error(logits_to_probs_async<T>(policy, logits, uncond, params, probs_out, statuses),
                 "logits_to_probs kernel launch");
  std::vector<std::uint32_t> host(rows);
  throw_on_error(cudaMemcpyAsync(host.data(), statuses, rows * sizeof(std::uint32_t),
                                 cudaMemcpyDeviceToHost, policy.stream),
                 "cudaMemcpyAsync (row statuses)");
  throw_on_error(cudaStreamSynchronize(policy.stream), "logits_to_probs");
  for (std::size_t r = 0; r < rows; ++r) {
    if (host[r] == 0u) continue;
    const auto code = static_cast<status>(host[r]);
    const double value = code == status::inf_value ? std::numeric_limits<double>::infinity() : 0.0;
    throw_if_failed(diagnostic{code, static_cast<index_t>(r), -1, value},
                    code == status::invalid_parameter ? "params" : "logits",
                    "device logits_to_probs");
  }
}

SPECULA_CUDA_NAMESPACE_END
