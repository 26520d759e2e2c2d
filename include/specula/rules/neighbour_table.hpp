#pragma once

/// @file
/// Neighbour tables for LANTERN / LANTERN++ (rules/lantern.hpp): for every token of a codebook,
/// its k nearest other tokens (nearest first), built once from an embedding matrix with L2 or
/// cosine distance and held in O(V·k) memory.
///
/// Besides the nearest-first ids, each row is kept sorted by id with every entry's rank
/// (position in nearest-first order), so a rule answers "is y among x's first m neighbours?" by
/// a binary search of x's row (O(log k)) instead of a scan of m entries — the resampling passes
/// ask it for every token of the vocabulary. Memory: V·k·(4 + 4 + 2) bytes.
///
/// Construction ranks by a distance computed in double (squared L2 between the rows, or
/// 1 − cos), ties broken by the lower token id. It screens candidates with float dot products
/// (blocked, AVX2 where the CPU has it; O(V²·d) time, no V² memory) and a proven bound on their
/// rounding error, then ranks every candidate whose order the float scores cannot settle with
/// the double distance, so the table is the one the double distance defines.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "specula/core/config.hpp"
#include "specula/core/error.hpp"
#include "specula/core/numeric.hpp"
#include "specula/core/row.hpp"
#include "specula/core/simd.hpp"
#include "specula/core/types.hpp"

namespace specula {

/// Largest neighbour count a table supports per token (ranks are stored as 16-bit integers).
inline constexpr index_t lantern_max_neighbours = 65535;

/// Read-only view of a neighbour table: row t lists token t's k nearest other tokens, nearest
/// first (`ids`); optionally the same row sorted by id (`sorted`) with each entry's position in
/// `ids` (`rank`). Trivially copyable; usable in device code.
struct neighbour_table_view {
  const token_t* ids = nullptr;
  index_t vocab = 0;
  index_t k = 0;
  const token_t* sorted = nullptr;      ///< V rows of k ids, ascending (may be null)
  const std::uint16_t* rank = nullptr;  ///< rank[t·k + i]: position of sorted[t·k + i] in ids

  [[nodiscard]] SPECULA_HOST_DEVICE constexpr const token_t* of(index_t token) const noexcept {
    return ids + token * k;
  }

  /// y's position among token t's neighbours (0 = nearest), or k when y is not one of them:
  /// a binary search of the sorted row, or a scan of `ids` when the view has no sorted rows.
  [[nodiscard]] SPECULA_HOST_DEVICE index_t rank_of(index_t t, index_t y) const noexcept {
    if (k <= 0) return k;
    if (sorted == nullptr) {
      const token_t* row = of(t);
      for (index_t j = 0; j < k; ++j)
        if (row[j] == y) return j;
      return k;
    }
    const token_t* row = sorted + t * k;
    index_t lo = 0, n = k;  // first index with row[i] >= y, branch-free halving
    while (n > 1) {
      const index_t half = n / 2;
      lo = row[lo + half - 1] < y ? lo + half : lo;
      n -= half;
    }
    if (row[lo] < y) ++lo;
    return lo < k && row[lo] == y ? static_cast<index_t>(rank[t * k + lo]) : k;
  }
};

/// Distance used to rank neighbours.
enum class neighbour_metric : std::uint8_t {
  l2,      ///< Euclidean distance between raw embedding rows (LANTERN's torch.cdist(p = 2))
  cosine,  ///< 1 − cosine similarity (a zero row counts as norm 1)
};

namespace detail {

/// The distance that defines the ranking, in double: squared L2 (same order as L2), or
/// 1 − a·b/(‖a‖‖b‖) with the norms passed in. Four partial sums, fixed order.
inline double neighbour_distance(const float* a, const float* b, index_t d, neighbour_metric m,
                                 double norm_a, double norm_b) noexcept {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  // The four-wide part ends at d4, the tail runs from there (bounds GCC can follow: with
  // `j + 4 <= d` it warned at -O3 that the tail loop's iteration 2^62 - 1 would overflow).
  const index_t d4 = d - d % 4;
  index_t j = 0;
  if (m == neighbour_metric::l2) {
    for (; j < d4; j += 4)
      for (index_t l = 0; l < 4; ++l) {
        const double diff = static_cast<double>(a[j + l]) - static_cast<double>(b[j + l]);
        s[l] += diff * diff;
      }
    for (; j < d; ++j) {
      const double diff = static_cast<double>(a[j]) - static_cast<double>(b[j]);
      s[0] += diff * diff;
    }
    return (s[0] + s[1]) + (s[2] + s[3]);
  }
  for (; j < d4; j += 4)
    for (index_t l = 0; l < 4; ++l) s[l] += static_cast<double>(a[j + l]) * b[j + l];
  for (; j < d; ++j) s[0] += static_cast<double>(a[j]) * b[j];
  return 1.0 - ((s[0] + s[1]) + (s[2] + s[3])) / (norm_a * norm_b);
}

/// Float dot products of rows a[0..rows) (row-major, stride d) with the columns [u0, u0 + 16)
/// of the transposed matrix bt (d rows of stride ld): out[r·16 + c]. Each product is summed
/// in j order, so its rounding error is at most γ_d·Σ|a_j b_j| whatever the instruction set.
template <index_t Rows>
inline void neighbour_dot_tile(const float* a, index_t d, const float* bt, index_t ld, index_t u0,
                               float* out) noexcept {
  float acc[static_cast<std::size_t>(Rows)][16] = {};
  for (index_t j = 0; j < d; ++j) {
    const float* col = bt + j * ld + u0;
    for (index_t r = 0; r < Rows; ++r) {
      const float ar = a[r * d + j];
      for (index_t c = 0; c < 16; ++c) acc[r][c] += ar * col[c];
    }
  }
  for (index_t r = 0; r < Rows; ++r)
    for (index_t c = 0; c < 16; ++c) out[r * 16 + c] = acc[r][c];
}

/// Dot products of `rows` rows of a with every column of bt: out[r·ld + u]. Column tiles outer,
/// rows in groups of 4 inner, so a d×16 tile of bt is read from memory once per block.
inline void neighbour_dot_block_generic(const float* a, index_t rows, index_t d, const float* bt,
                                        index_t ld, float* out) noexcept {
  float tile[4 * 16];
  for (index_t u0 = 0; u0 < ld; u0 += 16)
    for (index_t r0 = 0; r0 < rows; r0 += 4) {
      const index_t n = rows - r0 < 4 ? rows - r0 : 4;
      if (n == 4)
        neighbour_dot_tile<4>(a + r0 * d, d, bt, ld, u0, tile);
      else
        for (index_t r = 0; r < n; ++r)
          neighbour_dot_tile<1>(a + (r0 + r) * d, d, bt, ld, u0, tile + r * 16);
      for (index_t r = 0; r < n; ++r)
        for (index_t c = 0; c < 16; ++c) out[(r0 + r) * ld + u0 + c] = tile[r * 16 + c];
    }
}

#if SPECULA_SIMD_X86
/// The AVX2 form: 4 rows × 16 columns in eight registers, one FMA per (row, j, 8 columns).
__attribute__((target("avx2,fma"))) inline void neighbour_dot_block_avx2(
    const float* a, index_t rows, index_t d, const float* bt, index_t ld, float* out) noexcept {
  for (index_t u0 = 0; u0 < ld; u0 += 16)
    for (index_t r0 = 0; r0 < rows; r0 += 4) {
      const index_t n = rows - r0 < 4 ? rows - r0 : 4;
      const float* ar[4];
      for (index_t r = 0; r < 4; ++r) ar[r] = a + (r0 + (r < n ? r : 0)) * d;
      __m256 acc[4][2];
      for (auto& row : acc) row[0] = row[1] = _mm256_setzero_ps();
      const float* col = bt + u0;
      for (index_t j = 0; j < d; ++j, col += ld) {
        const __m256 b0 = _mm256_loadu_ps(col), b1 = _mm256_loadu_ps(col + 8);
        for (index_t r = 0; r < 4; ++r) {
          const __m256 x = _mm256_broadcast_ss(ar[r] + j);
          acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
        }
      }
      for (index_t r = 0; r < n; ++r) {
        _mm256_storeu_ps(out + (r0 + r) * ld + u0, acc[r][0]);
        _mm256_storeu_ps(out + (r0 + r) * ld + u0 + 8, acc[r][1]);
      }
    }
}
#endif

inline void neighbour_dot_block(const float* a, index_t rows, index_t d, const float* bt,
                                index_t ld, float* out) noexcept {
#if SPECULA_SIMD_X86
  if (simd::active_isa() >= simd::isa::avx2)  // AVX-512 CPUs have AVX2 and FMA
    return neighbour_dot_block_avx2(a, rows, d, bt, ld, out);
#endif
  neighbour_dot_block_generic(a, rows, d, bt, ld, out);
}

}  // namespace detail

/// Owning neighbour table built from a codebook embedding matrix (see file comment).
class neighbour_table {
 public:
  /// For every token t of `embeddings` (V rows of dimension d), its k nearest other tokens by
  /// `metric`, nearest first, ties broken by the lower token id. O(V²·d) time, O(V·k) memory.
  /// Throws invalid_input for k outside [1, min(V − 1, lantern_max_neighbours)], an empty
  /// matrix, or non-finite entries (naming the row and column).
  neighbour_table(batch_view<const float> embeddings, index_t k,
                  neighbour_metric metric = neighbour_metric::l2)
      : vocab_(embeddings.rows), k_(k) {
    if (embeddings.rows < 2 || embeddings.cols < 1)
      throw_if_failed({status::empty_input, -1, -1, static_cast<double>(embeddings.rows)},
                      "embeddings", "needs at least 2 rows of dimension >= 1");
    check_k(k, vocab_);
    const index_t d = embeddings.cols, V = vocab_;
    std::vector<double> norm(static_cast<std::size_t>(V));
    for (index_t t = 0; t < V; ++t) {
      double s = 0;
      for (index_t j = 0; j < d; ++j) {
        const double v = embeddings.row(t)[j];
        if (!detail::is_finite(v))
          throw_if_failed({status::inf_value, t, j, v}, "embeddings", "entries must be finite");
        s += v * v;
      }
      norm[static_cast<std::size_t>(t)] = std::sqrt(s);
    }
    // Float copies, scaled so that every row has norm <= 1 (L2 ranking is scale-free; cosine
    // uses the normalised rows): row-major A and its transpose, padded to a multiple of 16
    // columns (the padding's scores are never read).
    const index_t ld = (V + 15) / 16 * 16;
    std::vector<float> a(static_cast<std::size_t>(V * d));
    std::vector<float> bt(static_cast<std::size_t>(d * ld), 0.f);
    std::vector<float> sq(static_cast<std::size_t>(V));
    std::vector<double> scaled_norm(static_cast<std::size_t>(V));
    const double max_norm = *std::max_element(norm.begin(), norm.end());
    for (index_t t = 0; t < V; ++t) {
      const double n = norm[static_cast<std::size_t>(t)];
      const double scale = metric == neighbour_metric::cosine
                               ? (n > 0 ? 1.0 / n : 1.0)
                               : (max_norm > 0 ? 1.0 / max_norm : 1.0);
      for (index_t j = 0; j < d; ++j) {
        const auto v = static_cast<float>(embeddings.row(t)[j] * scale);
        a[static_cast<std::size_t>(t * d + j)] = v;
        bt[static_cast<std::size_t>(j * ld + t)] = v;
      }
      scaled_norm[static_cast<std::size_t>(t)] = std::min(1.0, n * scale);
      sq[static_cast<std::size_t>(t)] = static_cast<float>(n * scale * n * scale);
      if (metric == neighbour_metric::cosine && !(n > 0)) norm[static_cast<std::size_t>(t)] = 1.0;
    }
    // |float score − exact distance (scaled)| <= e_t = 2γ_{d+8}·(‖t‖ + 1)²: γ_{d+8} covers the
    // dot product's γ_d·‖t‖‖u‖, the rounding of the stored rows and squared norms, the score's
    // two additions, and the double distance's own rounding. Two tokens whose scores differ by
    // more than 2e_t are in score order.
    const double unit = std::ldexp(1.0, -24);
    const double gamma =
        static_cast<double>(d + 8) * unit / (1.0 - static_cast<double>(d + 8) * unit);

    ids_.resize(static_cast<std::size_t>(V * k_));
    constexpr index_t block = 64;
    std::vector<float> dots(static_cast<std::size_t>(block * ld));
    std::vector<std::pair<float, token_t>> cand;
    std::vector<float> sample;
    std::vector<token_t> hits(static_cast<std::size_t>(V) + 1);
    std::vector<std::pair<double, token_t>> exact;
    const index_t m = std::min(V, std::max<index_t>(4 * k_, 4096));  // screening sample
    for (index_t t0 = 0; t0 < V; t0 += block) {
      const index_t rows = std::min(block, V - t0);
      detail::neighbour_dot_block(a.data() + t0 * d, rows, d, bt.data(), ld, dots.data());
      for (index_t r = 0; r < rows; ++r) {
        const index_t t = t0 + r;
        float* s = dots.data() + r * ld;  // scores, in place
        const float sq_t = sq[static_cast<std::size_t>(t)];
        for (index_t u = 0; u < V; ++u)
          s[u] = metric == neighbour_metric::l2
                     ? (sq_t + sq[static_cast<std::size_t>(u)]) - 2.f * s[u]
                     : 1.f - s[u];
        s[t] = std::numeric_limits<float>::infinity();
        const double nt = scaled_norm[static_cast<std::size_t>(t)];
        const double gap = 4.0 * gamma * (nt + 1.0) * (nt + 1.0);  // 2e_t
        // An upper bound on the k-th smallest score: the k-th smallest of the first m.
        sample.assign(s, s + m);
        std::nth_element(sample.begin(), sample.begin() + (k_ - 1), sample.end());
        const double bound = static_cast<double>(sample[static_cast<std::size_t>(k_ - 1)]) + gap;
        // Screen in float against the bound rounded up (a superset of the double test).
        auto bound_f = static_cast<float>(bound);
        if (static_cast<double>(bound_f) < bound)
          bound_f = std::nextafter(bound_f, std::numeric_limits<float>::infinity());
        index_t found = 0;
        for (index_t u = 0; u < V; ++u) {  // branch-free compaction
          hits[static_cast<std::size_t>(found)] = static_cast<token_t>(u);
          found += s[u] <= bound_f ? 1 : 0;
        }
        cand.clear();
        for (index_t i = 0; i < found; ++i) {
          const token_t u = hits[static_cast<std::size_t>(i)];
          cand.emplace_back(s[u], u);
        }
        // The k-th smallest score; every token that can be among the k nearest scores within
        // 2e of it.
        std::nth_element(cand.begin(), cand.begin() + (k_ - 1), cand.end());
        const double kth = static_cast<double>(cand[static_cast<std::size_t>(k_ - 1)].first) + gap;
        cand.erase(
            std::remove_if(cand.begin(), cand.end(),
                           [&](const auto& c) { return static_cast<double>(c.first) > kth; }),
            cand.end());
        std::sort(cand.begin(), cand.end());
        // Runs of scores closer than 2e may be in either order: rank each run by the double
        // distance. Runs are separated by gaps > 2e, so their order is settled.
        const float* et = embeddings.row(t).data;
        index_t filled = 0;
        for (std::size_t i = 0; i < cand.size() && filled < k_;) {
          std::size_t j = i + 1;
          while (j < cand.size() &&
                 static_cast<double>(cand[j].first) - static_cast<double>(cand[j - 1].first) <= gap)
            ++j;
          if (j == i + 1) {
            ids_[static_cast<std::size_t>(t * k_ + filled++)] = cand[i].second;
          } else {
            exact.clear();
            for (std::size_t c = i; c < j; ++c) {
              const index_t u = cand[c].second;
              exact.emplace_back(detail::neighbour_distance(et, embeddings.row(u).data, d, metric,
                                                            norm[static_cast<std::size_t>(t)],
                                                            norm[static_cast<std::size_t>(u)]),
                                 static_cast<token_t>(u));
            }
            std::sort(exact.begin(), exact.end());
            for (std::size_t c = 0; c < exact.size() && filled < k_; ++c)
              ids_[static_cast<std::size_t>(t * k_ + filled++)] = exact[c].second;
          }
          i = j;
        }
      }
    }
    build_sorted();
  }

  /// A table from precomputed neighbour lists (V rows of k ids, nearest first; e.g. the first k
  /// columns of LANTERN's top_{V−1}_indices.npy); validated.
  neighbour_table(std::vector<token_t> ids, index_t vocab, index_t k)
      : vocab_(vocab), k_(k), ids_(std::move(ids)) {
    require_parameter(vocab >= 2, "vocab", static_cast<double>(vocab), "must be >= 2");
    check_k(k, vocab);
    if (static_cast<index_t>(ids_.size()) != vocab * k)
      throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(ids_.size())}, "ids",
                      ("expected V * k = " + std::to_string(vocab * k)).c_str());
    for (index_t t = 0; t < vocab; ++t)
      for (index_t j = 0; j < k; ++j) {
        const token_t u = ids_[static_cast<std::size_t>(t * k + j)];
        if (u < 0 || u >= vocab || u == t)
          throw_if_failed({status::token_out_of_range, t, j, static_cast<double>(u)}, "ids",
                          "neighbours must be other tokens in [0, V)");
      }
    build_sorted();
    for (index_t t = 0; t < vocab; ++t)
      for (index_t j = 1; j < k; ++j)
        if (sorted_[static_cast<std::size_t>(t * k + j)] ==
            sorted_[static_cast<std::size_t>(t * k + j - 1)])
          throw_if_failed({status::invalid_parameter, t, j,
                           static_cast<double>(sorted_[static_cast<std::size_t>(t * k + j)])},
                          "ids", "a token's neighbours must be distinct");
  }

  [[nodiscard]] neighbour_table_view view() const noexcept {
    return {ids_.data(), vocab_, k_, sorted_.data(), rank_.data()};
  }
  [[nodiscard]] index_t vocab() const noexcept { return vocab_; }
  [[nodiscard]] index_t k() const noexcept { return k_; }
  /// Token t's neighbours, nearest first.
  [[nodiscard]] std::vector<token_t> neighbours(index_t t) const {
    return {ids_.begin() + t * k_, ids_.begin() + (t + 1) * k_};
  }
  /// Bytes held (ids, sorted ids and ranks): V·k·10.
  [[nodiscard]] std::size_t bytes() const noexcept {
    return ids_.size() * sizeof(token_t) + sorted_.size() * sizeof(token_t) +
           rank_.size() * sizeof(std::uint16_t);
  }

 private:
  static void check_k(index_t k, index_t vocab) {
    require_parameter(
        k >= 1 && k < vocab && k <= lantern_max_neighbours, "k", static_cast<double>(k),
        ("must be in [1, min(V - 1, " + std::to_string(lantern_max_neighbours) + ")]").c_str());
  }

  void build_sorted() {
    sorted_.resize(ids_.size());
    rank_.resize(ids_.size());
    std::vector<std::pair<token_t, std::uint16_t>> row(static_cast<std::size_t>(k_));
    for (index_t t = 0; t < vocab_; ++t) {
      for (index_t j = 0; j < k_; ++j)
        row[static_cast<std::size_t>(j)] = {ids_[static_cast<std::size_t>(t * k_ + j)],
                                            static_cast<std::uint16_t>(j)};
      std::sort(row.begin(), row.end());
      for (index_t j = 0; j < k_; ++j) {
        sorted_[static_cast<std::size_t>(t * k_ + j)] = row[static_cast<std::size_t>(j)].first;
        rank_[static_cast<std::size_t>(t * k_ + j)] = row[static_cast<std::size_t>(j)].second;
      }
    }
  }

  index_t vocab_;
  index_t k_;
  std::vector<token_t> ids_;
  std::vector<token_t> sorted_;
  std::vector<std::uint16_t> rank_;
};

}  // namespace specula
