#pragma once

/// @file
/// Sampling one category from an unnormalised, non-negative weight row.
///
/// Weights are given as a callable `w(i) -> double` over [0, n), so a residual such as
/// [p - q]+ is sampled without ever being materialised or normalised.

#include <cmath>
#include <concepts>
#include <type_traits>

#include "specula/core/config.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/simd.hpp"
#include "specula/core/types.hpp"

namespace specula {

namespace detail {

/// max(x, 0) written so that gcc vectorises loops over it (NaN maps to 0).
SPECULA_HOST_DEVICE constexpr double positive_part(double x) noexcept { return x > 0.0 ? x : 0.0; }

/// Weight functions whose weights have the dense float form of core/simd.hpp expose it as
/// `w.dense_f32()`; the host passes then sum whole tiles with the explicit SIMD kernels (same bits
/// as the element calls) and use the element calls only for tiles holding a skip index.
template <class W>
concept dense_f32_weight_function = requires(const W& w) {
  { w.dense_f32() } -> std::same_as<dense_f32_weights>;
};

/// Weight function of a row: w(i) = max(row[i], 0). Clamping inside the weight function (rather
/// than only in the summation) is what lets gcc vectorise the tile sums over a plain row.
template <class T, class Row = row_view<const T>>
struct row_weights {
  Row row;
  SPECULA_HOST_DEVICE constexpr double operator()(index_t i) const noexcept {
    // "+ 0.0" is numerically neutral here (it maps -0 to +0, which the clamp does anyway) and
    // lets gcc 12 vectorise the select after a float-to-double conversion.
    return positive_part(static_cast<double>(row[i]) + 0.0);
  }
  [[nodiscard]] dense_f32_weights dense_f32() const noexcept
      requires(std::is_same_v<Row, row_view<const float>>) {
    return {row.data};
  }
};

/// Sum of the positive weights over [begin, end) (at most one tile) in a fixed order: eight
/// interleaved lanes (lane k takes elements begin + k, begin + k + 8, ...) combined pairwise.
/// Branch-free, so the compiler vectorises it for inlined weight functions.
/// Weight functions that can also fill a whole tile at once: `w.tile(begin, end, out)` writes
/// w(begin) .. w(end - 1) (bit-identical to the element calls) to out[0 ..]. Weights that are
/// costly per element (the candidate recursion) use it to run their inner loops tile-wide.
template <class W>
concept tile_weight_function = requires(const W& w, index_t b, index_t e, double* out) {
  w.tile(b, e, out);
};

/// Whether tile_positive_sum and scan_tile use a weight function's tile form. Device code calls
/// the element form (bit-identical by contract), since a per-thread tile buffer would live in
/// local memory.
template <class WeightFn>
inline constexpr bool use_tile_form =
    tile_weight_function<std::remove_cvref_t<WeightFn>> && !SPECULA_IS_DEVICE_CODE;

/// The lane order of one tile [begin, end): lane k sums w(begin + k), w(begin + k + 8), ... (each
/// clamped at 0 when Positive), the lanes combined ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)).
template <bool Positive, class WeightFn>
SPECULA_HOST_DEVICE constexpr double tile_lane_sum(index_t begin, index_t end,
                                                   WeightFn& w) noexcept {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  auto add = [](double& l, double wi) {
    if constexpr (Positive)
      l += wi > 0.0 ? wi : 0.0;
    else
      l += wi;
  };
  index_t i = begin;
  for (; i + 8 <= end; i += 8)
    for (int k = 0; k < 8; ++k) add(lane[k], w(i + k));
  // The tail with constant lane indices (a dynamically indexed lane array would live in local
  // memory on the device).
  for (int k = 0; k < 8; ++k)
    if (i + k < end) add(lane[k], w(i + k));
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

template <class WeightFn>
SPECULA_HOST_DEVICE constexpr double tile_positive_sum(index_t begin, index_t end,
                                                       WeightFn& w) noexcept {
#if !SPECULA_IS_DEVICE_CODE
  if constexpr (dense_f32_weight_function<std::remove_cvref_t<WeightFn>>) {
    if (!std::is_constant_evaluated()) {
      const dense_f32_weights f = w.dense_f32();
      if (!holds_skip(f, begin, end)) return dense_tile_sum(f, begin, end);
    }
  }
#endif
  if constexpr (use_tile_form<WeightFn>) {
    double buf[sum_tile];
    w.tile(begin, end, buf);
    auto from_buf = [&](index_t i) { return buf[i - begin]; };
    return tile_positive_sum(begin, end, from_buf);
  }
  return tile_lane_sum<true>(begin, end, w);
}

/// Element-wise scan of one tile [begin, end) starting from the running sum `acc`: the first
/// index with positive weight whose running sum exceeds `target`, or -1 if rounding differences
/// between the tile sum and the element-wise sum leave the target beyond the tile.
template <class WeightFn>
SPECULA_HOST_DEVICE constexpr index_t scan_tile(index_t begin, index_t end, WeightFn& w, double acc,
                                                double target) noexcept {
  double buf[use_tile_form<WeightFn> ? sum_tile : 1];
  if constexpr (use_tile_form<WeightFn>) w.tile(begin, end, buf);
  for (index_t i = begin; i < end; ++i) {
    double wi = 0.0;
    if constexpr (use_tile_form<WeightFn>)
      wi = buf[i - begin];
    else
      wi = w(i);
    if (wi > 0.0) {
      acc += wi;
      if (target < acc) return i;
    }
  }
  return -1;
}

/// Values a walk reads ahead of its additions (walk_eight).
inline constexpr index_t walk_batch = 8;

/// Eight steps of a running sum from `acc` over `v` (read by the caller before the call, so that
/// the loads are not held behind the additions): returns the first u whose sum acc + v[0] + ...
/// + v[u] exceeds `target`, with `acc` set to the sum before it, or walk_batch with `acc`
/// advanced over all eight. The same additions in the same order as a step-by-step walk, and no
/// branch per step (the sums, then one test whether any crosses, then the first that does, with
/// constant indices so that the sums stay in registers).
SPECULA_HOST_DEVICE constexpr index_t walk_eight(const double (&v)[walk_batch], double& acc,
                                                 double target) noexcept {
  double run[walk_batch] = {};
  bool crossed = false;
  double a = acc;
  SPECULA_UNROLL
  for (index_t u = 0; u < walk_batch; ++u) {
    a += v[u];
    run[u] = a;
    crossed = crossed | (target < a);
  }
  if (!crossed) {
    acc = a;
    return walk_batch;
  }
  index_t first = 0;
  double before = acc;
  SPECULA_UNROLL
  for (index_t u = walk_batch - 1; u >= 0; --u)
    if (target < run[u]) {
      first = u;
      before = u > 0 ? run[u - 1] : acc;
    }
  acc = before;
  return first;
}

/// The inverse-CDF walk shared by both sample_inverse_cdf forms: tile sums (from `tile_sum(k,
/// begin, end)` for tile k) are accumulated in order until one crosses `target`, then that tile
/// is scanned element by element. Falls back to the last positive index when rounding leaves
/// the target beyond the accumulated mass; -1 when no weight is positive.
/// The tile is scanned by `scan(begin, end, acc, target)` (scan_tile's contract; the 4-argument
/// form uses scan_tile itself).
///
/// `recorded` and `recorded_sum(k)` (a weight summary's): the first `recorded` tile sums, which
/// the walk reads eight at a time before it adds them (walk_eight), so that a CTA's walk over
/// shared memory (the CUDA backend, where every thread walks) does not wait on one load per
/// tile. It stops at the batch's first tile that crosses the target and hands that tile to the
/// tile-by-tile loop, which tests it again and adds the same sums in the same order.
template <class WeightFn, class TileSum, class Scan, class RecordedSum>
SPECULA_HOST_DEVICE constexpr index_t walk_tiles(index_t n, WeightFn& w, double target,
                                                 TileSum&& tile_sum, Scan&& scan, index_t recorded,
                                                 RecordedSum&& recorded_sum) noexcept {
  double acc = 0.0;
  index_t k = 0;
  const index_t tiles = (n + sum_tile - 1) / sum_tile;
  const index_t ahead = recorded < tiles ? recorded : tiles;
  for (; k + walk_batch <= ahead; k += walk_batch) {
    double v[walk_batch];
    SPECULA_UNROLL
    for (index_t u = 0; u < walk_batch; ++u) v[u] = recorded_sum(k + u);
    const index_t first = walk_eight(v, acc, target);
    if (first < walk_batch) {
      k += first;  // tile k crosses: the loop below scans it from the sum before it
      break;
    }
  }
  for (index_t t = k * sum_tile; t < n; t += sum_tile, ++k) {
    const index_t end = t + sum_tile < n ? t + sum_tile : n;
    const double tile = tile_sum(k, t, end);
    if (target < acc + tile) {
      const index_t i = scan(t, end, acc, target);
      if (i >= 0) return i;
    }
    acc += tile;
  }
  for (index_t i = n - 1; i >= 0; --i)
    if (w(i) > 0.0) return i;
  return -1;
}

template <class WeightFn, class TileSum, class Scan>
SPECULA_HOST_DEVICE constexpr index_t walk_tiles(index_t n, WeightFn& w, double target,
                                                 TileSum&& tile_sum, Scan&& scan) noexcept {
  return walk_tiles(n, w, target, tile_sum, scan, 0, [](index_t) { return 0.0; });
}

template <class WeightFn, class TileSum>
SPECULA_HOST_DEVICE constexpr index_t walk_tiles(index_t n, WeightFn& w, double target,
                                                 TileSum&& tile_sum) noexcept {
  return walk_tiles(n, w, target, tile_sum, [&](index_t begin, index_t end, double acc, double t) {
    return scan_tile(begin, end, w, acc, t);
  });
}

}  // namespace detail

namespace detail {

/// Visits the tile sums of `w` over [0, n) in order: visit(k, sum of tile k). Weights of the
/// dense float form are summed by the SIMD kernels a chunk of tiles at a time. With `scan`
/// (host, simple dense forms only: see dense_tile_sums), the same pass validates the form's
/// rows into it (check_level::reads).
template <class WeightFn, class Visit>
SPECULA_HOST_DEVICE constexpr void for_each_tile_sum(index_t n, WeightFn& w, Visit&& visit,
                                                     dense_scan* scan = nullptr) noexcept {
#if !SPECULA_IS_DEVICE_CODE
  if constexpr (dense_f32_weight_function<std::remove_cvref_t<WeightFn>>) {
    if (!std::is_constant_evaluated()) {
      const dense_f32_weights f = w.dense_f32();
      constexpr index_t chunk = tiles_per_chunk;
      double sums[chunk] = {};
      index_t k = 0;
      for (index_t t = 0; t < n; t += chunk * sum_tile) {
        const index_t end = n - t < chunk * sum_tile ? n : t + chunk * sum_tile;
        if (scan != nullptr)
          dense_tile_sums<true>(f, t, end, n, sum_tile, sums, scan);
        else
          dense_tile_sums(f, t, end, n, sum_tile, sums);
        for (index_t b = t; b < end; b += sum_tile, ++k) {
          const index_t e = b + sum_tile < n ? b + sum_tile : n;
          visit(k, holds_skip(f, b, e) ? tile_positive_sum(b, e, w) : sums[(b - t) / sum_tile]);
        }
      }
      return;
    }
  }
#endif
  index_t k = 0;
  for (index_t t = 0; t < n; t += sum_tile, ++k)
    visit(k, tile_positive_sum(t, t + sum_tile < n ? t + sum_tile : n, w));
}

/// positive_mass; with `scan`, validating the rows read (see for_each_tile_sum).
template <class WeightFn>
SPECULA_HOST_DEVICE constexpr double positive_mass_scanning(index_t n, WeightFn& w,
                                                            dense_scan* scan) noexcept {
  double total = 0.0;
  for_each_tile_sum(
      n, w, [&](index_t, double tile) { total += tile; }, scan);
  return total;
}

}  // namespace detail

/// Sum of the positive weights of `w` over [0, n), in double, in a fixed order: tiles of
/// detail::sum_tile elements summed in order, each tile summed by detail::tile_positive_sum.
/// NaN weights count as 0. The order is part of the contract: the same weights give the same
/// total bit for bit on every call.
template <class WeightFn>
SPECULA_HOST_DEVICE constexpr double positive_mass(index_t n, WeightFn&& w) noexcept {
  return detail::positive_mass_scanning(n, w, nullptr);
}

/// Sum of w(i) over [0, n) in positive_mass's fixed order — tiles of detail::sum_tile elements,
/// each summed by 8 interleaved lanes combined pairwise, tiles added left to right — without
/// clamping: negative weights count and NaN propagates. For row statistics that are not a mass
/// (typical acceptance's entropy): the order is the one a CTA-wide pass reproduces (the CUDA
/// backend's block_passes::sum), so both backends get the same bits.
template <class WeightFn>
SPECULA_HOST_DEVICE constexpr double ordered_sum(index_t n, WeightFn&& w) noexcept {
  double total = 0.0;
  for (index_t t = 0; t < n; t += detail::sum_tile)
    total +=
        detail::tile_lane_sum<false>(t, t + detail::sum_tile < n ? t + detail::sum_tile : n, w);
  return total;
}

namespace detail {

/// ordered_sum(n, w) through a row-passes object: `passes.sum(n, w)` when it has one (the CUDA
/// backend's CTA-wide pass, the same bits), ordered_sum otherwise (the host's passes).
template <class Passes, class WeightFn>
SPECULA_HOST_DEVICE constexpr double pass_sum(const Passes& passes, index_t n,
                                              WeightFn&& w) noexcept {
  if constexpr (requires { passes.sum(n, w); })
    return passes.sum(n, w);
  else
    return ordered_sum(n, w);
}

}  // namespace detail

/// Inverse-CDF sampling with one uniform u in (0, 1): returns the first index i with positive
/// weight at which the running sum of positive weights exceeds u * total. Indices with
/// w(i) <= 0 (or NaN) are never returned. If rounding leaves u * total at or beyond the
/// accumulated sum, the last index with positive weight is returned. Returns -1 when no weight
/// is positive.
///
/// `total` should be positive_mass(n, w) (computed by the caller, usually in the pass that
/// decides whether the row has any mass). The running sum is taken tile by tile in the order of
/// positive_mass, then element by element inside the tile that crosses u * total, so the scan
/// reads on average half of the row and only one tile element by element.
template <class WeightFn>
SPECULA_HOST_DEVICE constexpr index_t sample_inverse_cdf(index_t n, WeightFn&& w, double total,
                                                         double u) noexcept {
  return detail::walk_tiles(n, w, u * total, [&](index_t, index_t begin, index_t end) {
    return detail::tile_positive_sum(begin, end, w);
  });
}

/// The positive mass of a weight row together with its tile sums, recorded by one pass
/// (summarize_weights), so that a following inverse-CDF sample walks the recorded sums and reads
/// only the tile it lands in: one pass over the row plus one tile, instead of about 1.5 passes.
/// Rows longer than max_tiles tiles (131 072 elements) have their remaining tile sums
/// recomputed during the sample. Results are bit-identical to positive_mass and the uncached
/// sample_inverse_cdf.
struct weight_summary {
  static constexpr index_t max_tiles = 512;
  double total = 0.0;
  index_t recorded = 0;  ///< tile sums recorded in tile_sum
  double tile_sum[max_tiles];
};

namespace detail {

/// summarize_weights; with `scan`, validating the rows read (see for_each_tile_sum).
template <class WeightFn>
SPECULA_HOST_DEVICE void summarize_weights_scanning(index_t n, WeightFn& w, weight_summary& s,
                                                    dense_scan* scan) noexcept {
  s.total = 0.0;
  s.recorded = 0;
  for_each_tile_sum(
      n, w,
      [&](index_t, double tile) {
        if (s.recorded < weight_summary::max_tiles) s.tile_sum[s.recorded++] = tile;
        s.total += tile;
      },
      scan);
}

}  // namespace detail

/// Fills `s` with the positive mass of `w` over [0, n) (the value positive_mass returns) and
/// the sums of its first tiles.
template <class WeightFn>
SPECULA_HOST_DEVICE void summarize_weights(index_t n, WeightFn&& w, weight_summary& s) noexcept {
  detail::summarize_weights_scanning(n, w, s, nullptr);
}

/// A record of a weight row's mass and tile sums, as weight_summary: `total`, `recorded` (how
/// many leading tile sums are recorded) and `tile_sum[k]` for k < recorded. The device backend's
/// block-wide passes record into shared memory and hand out a summary of this shape.
template <class S>
concept tile_summary = requires(const S& s, index_t k) {
  { s.total } -> std::convertible_to<double>;
  { s.recorded } -> std::convertible_to<index_t>;
  { s.tile_sum[k] } -> std::convertible_to<double>;
};

static_assert(tile_summary<weight_summary>);

/// A tile_summary that scans the tile a sample lands in itself, with detail::scan_tile's
/// contract and result (the device's CTA-wide passes: every thread of the CTA loads part of the
/// tile).
template <class S, class WeightFn>
concept tile_scanning_summary = tile_summary<S> &&
    requires(const S& s, index_t i, WeightFn& w, double x) {
  { s.scan_tile(i, i, w, x, x) } -> std::convertible_to<index_t>;
};

/// sample_inverse_cdf(n, w, s.total, u), walking the tile sums recorded in `s`.
template <class WeightFn, tile_summary Summary>
SPECULA_HOST_DEVICE index_t sample_inverse_cdf(index_t n, WeightFn&& w, const Summary& s,
                                               double u) noexcept {
  auto tile_sum = [&](index_t k, index_t begin, index_t end) {
    return k < s.recorded ? s.tile_sum[k] : detail::tile_positive_sum(begin, end, w);
  };
  const auto recorded_sum = [&](index_t k) -> double { return s.tile_sum[k]; };
  if constexpr (tile_scanning_summary<Summary, std::remove_reference_t<WeightFn>>) {
    return detail::walk_tiles(
        n, w, u * s.total, tile_sum,
        [&](index_t begin, index_t end, double acc, double t) {
          return s.scan_tile(begin, end, w, acc, t);
        },
        s.recorded, recorded_sum);
  } else {
    return detail::walk_tiles(
        n, w, u * s.total, tile_sum,
        [&](index_t begin, index_t end, double acc, double t) {
          return detail::scan_tile(begin, end, w, acc, t);
        },
        s.recorded, recorded_sum);
  }
}

/// Inverse-CDF sampling from a row of non-negative weights (two passes: sum, then scan).
template <class T>
SPECULA_HOST_DEVICE constexpr index_t sample_inverse_cdf(row_view<const T> weights,
                                                         double u) noexcept {
  const detail::row_weights<T> w{weights};
  return sample_inverse_cdf(weights.size, w, positive_mass(weights.size, w), u);
}

/// Exponential race: returns argmax_i w(i) / E_i with E_i ~ Exp(1) independent, which selects i
/// with probability w(i) / sum(w). One pass, no normalisation and no prefix sum; one Philox call
/// per four categories, drawn from the per-category slots of `rng` at `position` (see
/// core/rng.hpp). Ties resolve to the smaller index. Returns -1 when no weight is positive.
template <class WeightFn>
SPECULA_HOST_DEVICE index_t sample_exponential_race(index_t n, WeightFn&& w, const request_rng& rng,
                                                    std::uint32_t position) noexcept {
  index_t best = -1;
  double best_score = 0.0;
  for (index_t block = 0; block * 4 < n; ++block) {
    const u32x4 bits =
        random_bits(rng, draw_id{position, category_slot_base + static_cast<std::uint32_t>(block)});
    for (int j = 0; j < 4; ++j) {
      const index_t i = block * 4 + j;
      if (i >= n) break;
      const double wi = w(i);
      if (!(wi > 0.0)) continue;
      // 32-bit uniform in (0, 1); E = -log(u) > 0.
      const double u = (static_cast<double>(bits.v[j]) + 0.5) * 0x1p-32;
      const double score = wi / -std::log(u);
      if (score > best_score) {
        best_score = score;
        best = i;
      }
    }
  }
  return best;
}

}  // namespace specula

namespace specula {

/// Index of the largest entry of a score row (logits or probabilities), ties broken towards the
/// lowest index; NaN entries are never chosen. Returns -1 for an empty row or an all-NaN row.
template <class T>
SPECULA_HOST_DEVICE constexpr index_t argmax_lowest(row_view<const T> row) noexcept {
#if !SPECULA_IS_DEVICE_CODE
  if constexpr (std::is_same_v<std::remove_cv_t<T>, float>) {
    if (!std::is_constant_evaluated()) return detail::argmax_f32(row.data, row.size);
  }
#endif
  index_t best = -1;
  double best_value = 0.0;
  for (index_t i = 0; i < row.size; ++i) {
    const double v = static_cast<double>(row[i]);
    if (v != v) continue;
    if (best < 0 || v > best_value) {
      best = i;
      best_value = v;
    }
  }
  return best;
}

}  // namespace specula
