#pragma once

/// @file
/// CTA-wide row passes: the CUDA backend's model of specula::row_passes
/// (include/specula/sample/row_passes.hpp).
///
/// The device kernels run the host's own per-request verifiers (verify_chain_request,
/// verify_candidates, verify_tree_request, the greedy verifiers) with every thread of a CTA
/// executing the scalar code redundantly — the same loads, the same arithmetic, the same
/// branches, so every thread holds the same values — and only the full-row reductions split
/// across the threads. This is what makes the device results the host's: the maths is one piece
/// of code, and the reductions below reproduce the host's fixed summation order bit for bit:
///
///   - a tile of detail::sum_tile (256) elements is summed by 8 lanes (threads 8s .. 8s+7), lane
///     k taking elements begin + k + 8j in increasing j, combined ((l0+l1)+(l2+l3))+((l4+l5)+
///     (l6+l7)) — exactly detail::tile_positive_sum;
///   - Threads / 8 tiles are summed per round; every thread then adds the round's tile sums to its
///     running total left to right — exactly positive_mass / summarize_weights.
///
/// Rules for code run this way: every thread must reach every pass, and every sample drawn
/// through a passes summary (`categorical(n, w, summary, at)`: its tile scan is CTA-wide, with
/// barriers), which holds because the verifiers' control flow depends only on values all threads
/// share; and writes to memory other threads read must be made by one thread and followed by a
/// barrier (the passes do this for their own buffers).
/// Outputs written redundantly (every thread storing the same value to global memory) are
/// harmless. Scratch the verifiers write and read back (the tree kernels' recursion state) may
/// live in shared memory — one copy per CTA, read by broadcast: every thread computes the value
/// alike, the leader (detail::workspace_leader, leader() below) alone stores it, and a barrier
/// (detail::workspace_barrier, sync() below) publishes it; every rewrite also follows a barrier
/// after the last read of the old contents (the passes end with one). No two threads write the
/// same shared word, so compute-sanitizer's racecheck has nothing to report.
///
/// Loads. Lane k of a tile sums the elements k, k + 8, ... — every eighth one. Weight functions
/// over float rows that say which rows they read and how a weight follows from the values
/// (vector_weights below: a row; in chain.cuh, the chain residual of rules that read p(y) and
/// q(y) alone) have a
/// full tile read with all of a lane's 32 loads (64 with two rows) issued before the first
/// weight is computed: one 4-byte load per element and row, the 8 lanes of a tile reading 32
/// consecutive bytes (one sector) per load, so a warp's load touches one sector of each of its
/// four tiles and every sector read is used whole. The weights and the order of the additions
/// are those of the element-wise path, so the bits are the same; a row's last, partial tile and
/// other weight functions take the element-wise path. (An earlier schedule read 16-byte vectors
/// and handed their elements to the summing lanes by warp shuffles: four shuffles and about a
/// dozen selects per four elements, with a sub-warp mask that made the compiler wrap every
/// shuffle in a convergence check.)
///
/// The 8 lanes of a tile combine their sums by three butterfly shuffles (xor 1, 2, 4):
/// IEEE addition is commutative, so every lane ends with ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)),
/// the host's bits, without a round trip through shared memory.
///
/// Sampling. The inverse-CDF sample after summarize() walks the recorded tile sums in every
/// thread; the one tile it lands in is then scanned with the CTA (summary_type::scan_tile): each
/// thread computes one weight into shared memory, then every thread scans them in index order
/// from there (the scan is a running sum in double, so it stays sequential; what leaves it is a
/// dependent global load per element).

#include <cstdint>
#include <type_traits>

#include "specula/core/config.hpp"
#include "specula/core/types.hpp"
#include "specula/cuda/config.cuh"
#include "specula/sample/categorical.hpp"

SPECULA_CUDA_NAMESPACE_BEGIN

namespace detail {

/// How block_passes reads a weight function's full tiles with all loads in flight (see file
/// comment). The primary template opts out; a specialisation for a weight function W provides
///   - `static constexpr int rows`: 1 or 2, the float rows w(y) reads (at index y);
///   - `static const float* p(const W&)`, `static const float* q(const W&)`: those rows (q:
///     nullptr when there is one);
///   - `static double weight(const W&, index_t y, float p_y, float q_y)`: w(y) from those values,
///     bit for bit (it calls W's own arithmetic on rows that hold the values, never a copy of
///     it);
///   - optionally `static bool plain(const W&, index_t begin, index_t end)`: whether the full
///     tile [begin, end) may be read so (loads_ahead; false: element by element);
///   - optionally `static constexpr int batch`: the loads per row kept in flight (a divisor of
///     the lane's 32; default all 32).
template <class W>
struct vector_weights {
  static constexpr bool enabled = false;
};

/// Whether vector_weights `VW` may read the full tile [begin, end) of `w` ahead: always, unless
/// the specialisation says otherwise for some tiles (`static bool plain(const W&, begin, end)`;
/// the others take the element-wise path).
template <class VW, class W>
[[nodiscard]] __device__ bool loads_ahead(const W& w, index_t begin, index_t end) noexcept {
  if constexpr (requires { VW::plain(w, begin, end); })
    return VW::plain(w, begin, end);
  else
    return true;
}

/// A row read as a single value (vector_weights: a weight function evaluated on loaded values).
struct value_row {
  using value_type = float;
  float v;
  [[nodiscard]] __host__ __device__ constexpr float operator[](index_t) const noexcept { return v; }
};

/// A float row's weights, max(row[y], 0): one row.
template <>
struct vector_weights<specula::detail::row_weights<float, row_view<const float>>> {
  using weights = specula::detail::row_weights<float, row_view<const float>>;
  static constexpr bool enabled = true;
  static constexpr int rows = 1;
  [[nodiscard]] __device__ static const float* p(const weights& w) noexcept { return w.row.data; }
  [[nodiscard]] __device__ static const float* q(const weights&) noexcept { return nullptr; }
  [[nodiscard]] __device__ static double weight(const weights&, index_t y, float p_y,
                                                float) noexcept {
    return specula::detail::row_weights<float, value_row>{value_row{p_y}}(y);
  }
};

/// The sum of lane `lane` of the full tile starting at `begin` (weights at begin + lane + 8j in
/// increasing j, clamped at 0 when Positive), every load of the lane issued before the first use
/// (see file comment). `q` is null for weight functions of one row.
template <bool Positive, class WeightFn>
__device__ double strided_tile_sum(const WeightFn& w, const float* p, const float* q, index_t begin,
                                   int lane) noexcept {
  using vw = vector_weights<WeightFn>;
  constexpr int per_lane = static_cast<int>(specula::detail::sum_tile / 8);
  // Loads in flight at once per row: all of the lane's, or vw::batch of them at a time where the
  // kernel around the pass has fewer registers to spare (the same additions in the same order).
  constexpr int batch = [] {
    if constexpr (requires { vw::batch; })
      return vw::batch;
    else
      return per_lane;
  }();
  static_assert(per_lane % batch == 0, "a batch divides the lane's elements");
  const float* pl = p + begin + lane;
  const float* ql = vw::rows == 2 ? q + begin + lane : nullptr;
  double acc = 0.0;
#pragma unroll 1  // a batch's loads are not hoisted above the previous batch's weights
  for (int j0 = 0; j0 < per_lane; j0 += batch) {
    float pv[batch];
    float qv[batch];
#pragma unroll
    for (int j = 0; j < batch; ++j) pv[j] = pl[8 * (j0 + j)];
    if constexpr (vw::rows == 2) {
#pragma unroll
      for (int j = 0; j < batch; ++j) qv[j] = ql[8 * (j0 + j)];
    } else {
#pragma unroll
      for (int j = 0; j < batch; ++j) qv[j] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < batch; ++j) {
      const double wi = vw::weight(w, begin + lane + 8 * (j0 + j), pv[j], qv[j]);
      if constexpr (Positive)
        acc += wi > 0.0 ? wi : 0.0;
      else
        acc += wi;
    }
  }
  return acc;
}

/// ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) over the 8 lanes of each tile, in every lane of it (see
/// file comment). Every lane of the warp calls it.
[[nodiscard]] __device__ inline double combine_tile_lanes(double v) noexcept {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  return v;
}

}  // namespace detail

/// Shared memory of a block_passes<Threads> recording up to MaxTiles tile sums (rows of up to
/// MaxTiles * 256 elements have every tile sum recorded; longer rows have the rest recomputed
/// during a sample, as on the host).
template <int Threads, index_t MaxTiles = specula::weight_summary::max_tiles>
struct block_passes_storage {
  static_assert(Threads % 8 == 0 && Threads >= 8, "eight lanes per tile");
  double tile_sum[MaxTiles];
  double round[Threads / 8];
  double lanes[Threads];
  index_t index[Threads];
};

/// Shared memory of a block_passes<Threads> without its tile sums, for kernels that keep those
/// in dynamic shared memory sized at launch (the tree kernels).
template <int Threads>
struct block_passes_scratch {
  static_assert(Threads % 8 == 0 && Threads >= 8, "eight lanes per tile");
  double round[Threads / 8];
  double lanes[Threads];
  index_t index[Threads];
};

/// CTA-wide row passes (see file comment). A summary handed out by summarize() refers to the
/// storage's tile sums and is valid until the next summarize() on the same storage.
template <int Threads>
struct block_passes {
  static_assert((Threads & (Threads - 1)) == 0, "the argmax reduction needs a power of two");
  static_assert(Threads >= 32, "the tile lanes combine by warp shuffles: whole warps");
  /// A summarize() record (a tile_summary, specula/sample/categorical.hpp) whose sample scans
  /// its tile with the CTA.
  struct summary_type {
    double total = 0.0;
    index_t recorded = 0;
    const double* tile_sum = nullptr;
    double* scratch = nullptr;  ///< Threads doubles of shared memory for scan_tile

    /// detail::scan_tile(begin, end, w, acc, target) with the whole CTA (see file comment):
    /// every thread calls it with the same arguments and gets the same index. The weights of
    /// a chunk of up to Threads elements go to shared memory, then each thread runs the host's
    /// scan over them.
    template <class WeightFn>
    [[nodiscard]] __device__ index_t scan_tile(index_t begin, index_t end, WeightFn& w, double acc,
                                               double target) const {
      const auto tid = static_cast<index_t>(threadIdx.x);
      for (index_t chunk = begin; chunk < end; chunk += Threads) {
        const index_t m = end - chunk < Threads ? end - chunk : Threads;
        // Each weight clamped here, in parallel: a weight <= 0 or NaN becomes +0.0, which the
        // scans below skip, as the host's (adding +0.0 would leave the non-negative sum as it is).
        if (tid < m) {
          const double wi = static_cast<double>(w(chunk + tid));
          scratch[tid] = wi > 0.0 ? wi : 0.0;
        }
        __syncthreads();
        index_t found = -1;
        index_t j = 0;
        // Eight weights at a time, read before the first is added (walk_eight). The first
        // element whose running sum crosses the target is the one the element-by-element loop
        // below would stop at: the sum before it is at most the target, so its weight is
        // positive.
        constexpr index_t batch = specula::detail::walk_batch;
        for (; found < 0 && j + batch <= m; j += batch) {
          double v[batch];
#pragma unroll
          for (index_t u = 0; u < batch; ++u) v[u] = scratch[j + u];
          const index_t first = specula::detail::walk_eight(v, acc, target);
          if (first < batch) found = chunk + j + first;
        }
#pragma unroll 8
        for (; found < 0 && j < m; ++j) {
          const double wi = scratch[j];
          if (wi > 0.0) {
            acc += wi;
            if (target < acc) {
              found = chunk + j;
              break;
            }
          }
        }
        __syncthreads();  // scratch is rewritten by the next chunk or pass
        if (found >= 0) return found;
      }
      return -1;
    }
  };

  double* tile_sum;
  index_t max_tiles;
  double* round;
  double* lanes;
  index_t* index;

  template <index_t MaxTiles>
  __device__ explicit block_passes(block_passes_storage<Threads, MaxTiles>& s)
      : tile_sum(s.tile_sum), max_tiles(MaxTiles), round(s.round), lanes(s.lanes), index(s.index) {}

  /// Passes recording up to `tiles` tile sums at `tile_sums` (shared memory).
  __device__ block_passes(block_passes_scratch<Threads>& s, double* tile_sums, index_t tiles)
      : tile_sum(tile_sums), max_tiles(tiles), round(s.round), lanes(s.lanes), index(s.index) {}

  /// A CTA barrier (detail::workspace_barrier): verifiers call it before rewriting scratch that
  /// every thread writes alike and reads back, such as the tree kernels' shared recursion state.
  __device__ void sync() const { __syncthreads(); }
  /// The one thread that writes such scratch (detail::workspace_leader); sync() publishes it.
  __device__ bool leader() const { return threadIdx.x == 0; }

  /// Calls visit(t, sum of tile t) for every tile t of [first_tile, last_tile) (default: all
  /// tiles of a row of n) in order, in every thread. Positive: weights clamped at 0 (the
  /// positive mass); otherwise summed as they are (sum()).
  template <bool Positive = true, class WeightFn, class Visit>
  __device__ void tile_rounds(index_t n, const WeightFn& w, Visit&& visit, index_t first_tile = 0,
                              index_t last_tile = -1) const {
    constexpr index_t tile = specula::detail::sum_tile;
    constexpr index_t per_round = Threads / 8;
    using vw = detail::vector_weights<std::remove_cvref_t<WeightFn>>;
    const int tid = static_cast<int>(threadIdx.x);
    const int lane = tid & 7;
    const index_t slot = tid >> 3;
    const index_t tiles = last_tile < 0 ? (n + tile - 1) / tile : last_tile;
    for (index_t base = first_tile; base < tiles; base += per_round) {
      const index_t t = base + slot;
      double acc = 0.0;
      if (t < tiles) {
        const index_t begin = t * tile;
        const index_t end = begin + tile < n ? begin + tile : n;
        bool done = false;
        if constexpr (vw::enabled) {
          if (end - begin == tile && detail::loads_ahead<vw>(w, begin, end)) {
            acc = detail::strided_tile_sum<Positive>(w, vw::p(w), vw::q(w), begin, lane);
            done = true;
          }
        }
        if (!done) {
          for (index_t i = begin + lane; i < end; i += 8) {
            const double wi = w(i);
            if constexpr (Positive)
              acc += wi > 0.0 ? wi : 0.0;
            else
              acc += wi;
          }
        }
      }
      // Every lane of every warp is here (the round loop is the same in all threads).
      acc = detail::combine_tile_lanes(acc);
      if (lane == 0 && t < tiles) round[slot] = acc;
      __syncthreads();
      const index_t m = tiles - base < per_round ? tiles - base : per_round;
      // Eight of the round's sums read before the first is visited (visit may store to shared
      // memory, which would otherwise keep each read behind the previous visit).
      constexpr index_t batch = per_round < 8 ? per_round : 8;
      for (index_t j0 = 0; j0 < m; j0 += batch) {
        double v[batch];
#pragma unroll
        for (index_t u = 0; u < batch; ++u)
          v[u] = round[j0 + u];  // in bounds: batch divides per_round
#pragma unroll
        for (index_t u = 0; u < batch; ++u)
          if (j0 + u < m) visit(base + j0 + u, v[u]);
      }
      __syncthreads();  // round is reused by the next round or pass
    }
  }

  /// ordered_sum(n, w) (the weights as they are, in the passes' order), in every thread.
  template <class WeightFn>
  [[nodiscard]] __device__ double sum(index_t n, const WeightFn& w) const {
    double total = 0.0;
    tile_rounds<false>(n, w, [&](index_t, double s) { total += s; });
    return total;
  }

  /// positive_mass(n, w), in every thread.
  template <class WeightFn>
  [[nodiscard]] __device__ double mass(index_t n, const WeightFn& w) const {
    double total = 0.0;
    tile_rounds(n, w, [&](index_t, double s) { total += s; });
    return total;
  }

  /// summarize_weights(n, w, s), in every thread; s.tile_sum points to the shared tile sums.
  template <class WeightFn>
  __device__ void summarize(index_t n, const WeightFn& w, summary_type& s) const {
    s.total = 0.0;
    s.recorded = 0;
    s.tile_sum = tile_sum;
    s.scratch = lanes;
    const bool writer = threadIdx.x == 0;
    tile_rounds(n, w, [&](index_t t, double v) {
      if (t < max_tiles) {
        if (writer) tile_sum[t] = v;
        s.recorded = t + 1;
      }
      s.total += v;
    });  // tile_rounds ends with a barrier: the tile sums are visible to every thread
  }

  /// argmax_lowest(row) (NaN never chosen, lowest index on ties; -1 for an all-NaN row), in
  /// every thread.
  template <class Row>
  [[nodiscard]] __device__ index_t argmax(const Row& row) const {
    const int tid = static_cast<int>(threadIdx.x);
    index_t best = -1;
    double best_v = 0.0;
    for (index_t i = tid; i < row.size; i += Threads) {
      const double v = static_cast<double>(row[i]);
      if (v != v) continue;
      if (best < 0 || v > best_v) {
        best = i;
        best_v = v;
      }
    }
    lanes[tid] = best_v;
    index[tid] = best;
    __syncthreads();
    for (int stride = Threads / 2; stride > 0; stride /= 2) {
      if (tid < stride) {
        const index_t oi = index[tid + stride];
        const double ov = lanes[tid + stride];
        const index_t mi = index[tid];
        if (oi >= 0 && (mi < 0 || ov > lanes[tid] || (ov == lanes[tid] && oi < mi))) {
          index[tid] = oi;
          lanes[tid] = ov;
        }
      }
      __syncthreads();
    }
    const index_t r = index[0];
    __syncthreads();
    return r;
  }
};

SPECULA_CUDA_NAMESPACE_END
