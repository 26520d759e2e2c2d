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
/// Rules for code run this way: every thread must reach every pass (the verifiers' control flow
/// depends only on values all threads share), and writes to memory other threads read must be
/// made by one thread and followed by a barrier (the passes do this for their own buffers).
/// Outputs written redundantly (every thread storing the same value to global memory) are
/// harmless. Scratch the verifiers write and read back (the tree kernels' recursion state) may
/// live in shared memory — one copy per CTA, read by broadcast: every thread computes the value
/// alike, the leader (detail::workspace_leader, leader() below) alone stores it, and a barrier
/// (detail::workspace_barrier, sync() below) publishes it; every rewrite also follows a barrier
/// after the last read of the old contents (the passes end with one). No two threads write the
/// same shared word, so compute-sanitizer's racecheck has nothing to report.

#include <cstdint>

#include "specula/core/config.hpp"
#include "specula/core/types.hpp"
#include "specula/cuda/config.cuh"
#include "specula/sample/categorical.hpp"

SPECULA_CUDA_NAMESPACE_BEGIN

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
  struct summary_type {
    double total = 0.0;
    index_t recorded = 0;
    const double* tile_sum = nullptr;
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
  /// tiles of a row of n) in order, in every thread.
  template <class WeightFn, class Visit>
  __device__ void tile_rounds(index_t n, const WeightFn& w, Visit&& visit, index_t first_tile = 0,
                              index_t last_tile = -1) const {
    constexpr index_t tile = specula::detail::sum_tile;
    constexpr index_t per_round = Threads / 8;
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
        for (index_t i = begin + lane; i < end; i += 8) {
          const double wi = w(i);
          acc += wi > 0.0 ? wi : 0.0;
        }
      }
      lanes[tid] = acc;
      __syncthreads();
      if (lane == 0 && t < tiles) {
        const double* l = lanes + slot * 8;
        round[slot] = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
      }
      __syncthreads();
      const index_t m = tiles - base < per_round ? tiles - base : per_round;
      for (index_t j = 0; j < m; ++j) visit(base + j, round[j]);
      __syncthreads();  // round and lanes are reused by the next round or pass
    }
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
