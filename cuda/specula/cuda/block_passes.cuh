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
///
/// Vector loads. Lane k of a tile needs the elements k, k + 8, ... — every eighth one — so a
/// 16-byte load (four floats) always holds elements of four different lanes. Weight functions
/// over float rows that say which rows they read and how a weight follows from the values
/// (vector_weights below: a row, the chain residual over a dense or one-hot proposal) are read
/// with one 16-byte load per row and per four elements when their rows are 16-byte aligned:
/// the 8 lanes of a tile together load 32 consecutive elements, then four rounds of warp
/// shuffles within the 8 lanes (vector_source_lane / vector_given_component) hand every lane
/// the four elements it sums, which it adds in the scalar order. The weights and the order of
/// the additions are those of the element-wise path, so the bits are the same; unaligned rows
/// and a row's last, partial tile take the element-wise path.

#include <cstdint>
#include <type_traits>

#include "specula/core/config.hpp"
#include "specula/core/types.hpp"
#include "specula/cuda/config.cuh"
#include "specula/sample/categorical.hpp"

SPECULA_CUDA_NAMESPACE_BEGIN

namespace detail {

/// How block_passes reads a weight function with 16-byte loads (see file comment). The primary
/// template opts out; a specialisation for a weight function W provides
///   - `static const float* p(const W&)`, `static const float* q(const W&)`: the float rows the
///     weight at y reads at index y (q: nullptr when there is one row);
///   - `static double weight(const W&, index_t y, float p_y, float q_y)`: w(y) from those values,
///     bit for bit (it calls W's own arithmetic on rows that hold the values, never a copy of
///     it).
template <class W>
struct vector_weights {
  static constexpr bool enabled = false;
};

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
  [[nodiscard]] __device__ static const float* p(const weights& w) noexcept { return w.row.data; }
  [[nodiscard]] __device__ static const float* q(const weights&) noexcept { return nullptr; }
  [[nodiscard]] __device__ static double weight(const weights&, index_t y, float p_y,
                                                float) noexcept {
    return specula::detail::row_weights<float, value_row>{value_row{p_y}}(y);
  }
};

/// The 16-byte-load schedule of one tile (see file comment). Lane L of a tile's 8 lanes loads the
/// four elements 32m + 4L + c (c = 0..3) of every 32; they belong to lane 4(L & 1) + c, as its
/// element j = 4m + (L >> 1). In shuffle round r = 0..3, lane k reads from this lane ...
[[nodiscard]] __host__ __device__ constexpr int vector_source_lane(int k, int r) noexcept {
  return 2 * (((k & 3) + r) & 3) + (k >> 2);
}
/// ... which hands over its component (the one lane k needs) ...
[[nodiscard]] __host__ __device__ constexpr int vector_given_component(int lane, int r) noexcept {
  return ((lane >> 1) - r) & 3;
}
/// ... so that lane k receives its element 4m + s (s = 0..3) in round vector_round_of(k, s).
[[nodiscard]] __host__ __device__ constexpr int vector_round_of(int k, int s) noexcept {
  return (s - (k & 3)) & 3;
}

/// v.x, v.y, v.z or v.w (c in 0..3) without indexing memory.
[[nodiscard]] __device__ inline float vector_component(const float4& v, int c) noexcept {
  return c == 0 ? v.x : (c == 1 ? v.y : (c == 2 ? v.z : v.w));
}
[[nodiscard]] __device__ inline float vector_pick(float a0, float a1, float a2, float a3,
                                                  int r) noexcept {
  return r == 0 ? a0 : (r == 1 ? a1 : (r == 2 ? a2 : a3));
}

/// Whether a row can be read with 16-byte loads (a null row: nothing to read).
[[nodiscard]] __device__ inline bool vector_aligned(const float* row) noexcept {
  return (reinterpret_cast<std::uintptr_t>(row) & 15u) == 0;
}

/// The sum of lane `lane` of the full tile starting at `begin` (weights at begin + lane + 8j in
/// increasing j, clamped at 0 when Positive), read with 16-byte loads and redistributed by
/// shuffles among the tile's 8 lanes (threads 8s .. 8s + 7 of a warp, all of which call this
/// for the same tile). `p` and `q` (or null) are 16-byte aligned.
template <bool Positive, class WeightFn>
__device__ double vector_tile_sum(const WeightFn& w, const float* p, const float* q, index_t begin,
                                  int lane) noexcept {
  using vw = vector_weights<WeightFn>;
  const unsigned group = 0xffu << (threadIdx.x & 24u);  // this tile's 8 lanes of the warp
  const auto* p4 = reinterpret_cast<const float4*>(p + begin);
  const auto* q4 = q == nullptr ? nullptr : reinterpret_cast<const float4*>(q + begin);
  double acc = 0.0;
  // Every load of the tile is issued before the first use: 8 (or 16) 16-byte loads in flight per
  // thread. Loading inside the summing loop left one in flight at a time (the compiler does not
  // move global loads across the shuffles), which made a CTA's pass over a row latency-bound:
  // about 50 µs for a 32000-entry row on an H200 against about 1 µs of streaming.
  float4 pl[8];
  float4 ql[8];
#pragma unroll
  for (int m = 0; m < 8; ++m) {
    pl[m] = p4[lane + 8 * m];
    ql[m] = q4 == nullptr ? float4{0.f, 0.f, 0.f, 0.f} : q4[lane + 8 * m];
  }
#pragma unroll
  for (int m = 0; m < 8; ++m) {
    const float4 pv = pl[m];
    const float4 qv = ql[m];
    float pr[4];
    float qr[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int give = vector_given_component(lane, r);
      const int from = vector_source_lane(lane, r);
      pr[r] = __shfl_sync(group, vector_component(pv, give), from, 8);
      if (q4 != nullptr) qr[r] = __shfl_sync(group, vector_component(qv, give), from, 8);
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int r = vector_round_of(lane, s);
      const index_t y = begin + lane + 8 * (4 * m + s);
      const double wi = vw::weight(w, y, vector_pick(pr[0], pr[1], pr[2], pr[3], r),
                                   vector_pick(qr[0], qr[1], qr[2], qr[3], r));
      if constexpr (Positive)
        acc += wi > 0.0 ? wi : 0.0;
      else
        acc += wi;
    }
  }
  return acc;
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
    // 16-byte loads when the weight function has a vector form and its rows are aligned (the
    // same for every thread: it depends on the row pointers only).
    [[maybe_unused]] const float* vp = nullptr;
    [[maybe_unused]] const float* vq = nullptr;
    [[maybe_unused]] bool vector = false;
    if constexpr (vw::enabled) {
      vp = vw::p(w);
      vq = vw::q(w);
      vector = detail::vector_aligned(vp) && (vq == nullptr || detail::vector_aligned(vq));
    }
    for (index_t base = first_tile; base < tiles; base += per_round) {
      const index_t t = base + slot;
      double acc = 0.0;
      if (t < tiles) {
        const index_t begin = t * tile;
        const index_t end = begin + tile < n ? begin + tile : n;
        bool done = false;
        if constexpr (vw::enabled) {
          // A full tile: all 8 lanes of the tile take this branch together (same t).
          if (vector && end - begin == tile) {
            acc = detail::vector_tile_sum<Positive>(w, vp, vq, begin, lane);
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
