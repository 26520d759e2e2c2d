#pragma once

/// @file
/// Selection without sorting, for the host transforms (sample/transforms.hpp): the k-th largest
/// of a row of floats, and the nucleus (top-p) threshold of a probability row, both by radix
/// select on the bits of the values: a histogram of the top bits, then of the next bits inside
/// the one bucket that holds the answer, until the bucket is small enough to finish in a stack
/// buffer. A row is read a few times (usually two) instead of being copied and sorted.
///
/// Values are given by a callable `value(i)` so a pass can recompute them from the logits
/// instead of reading a stored copy.
///
/// **The nucleus threshold is bit-exact against the sort-based definition.** That definition
/// (specula::testing::reference_top_p_threshold) sums the probabilities in double in descending
/// order, `total` over the whole row and `acc` until `acc >= top_p * total`, and the rounding of
/// those sums is part of it. Selection avoids the order as follows. A float p >= 2^-29 is a
/// multiple of 2^-52, and so is every sum of such floats below 2; a double holds every such
/// multiple below 2 exactly. So over the probabilities >= 2^-29, which the descending order
/// visits first, every partial sum is exact, whatever the order. Only the "tail" below 2^-29 is
/// rounded (at most 2^-53 per addition), and it only moves `total`, by a bounded amount. The
/// selection therefore finds the threshold for the lowest and for the highest target that
/// rounding allows; when both give the same value (the threshold lies among exact partial sums
/// and no partial sum lies within about n_tail * 2^-52 of the target) that value is the
/// sort-based threshold. Otherwise, which takes top_p within about V * 2^-29 of 1 or a
/// partial sum within rounding of the target, the caller falls back to the sort.

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <functional>
#include <limits>

#include "specula/core/types.hpp"

namespace specula::detail {

/// Order-preserving key of a float: a < b iff key(a) < key(b) for non-NaN a, b (-0 below +0).
[[nodiscard]] constexpr std::uint32_t float_order_key(float f) noexcept {
  const auto b = std::bit_cast<std::uint32_t>(f);
  return (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u);
}

/// The float whose key is k.
[[nodiscard]] constexpr float float_from_order_key(std::uint32_t k) noexcept {
  return std::bit_cast<float>((k & 0x80000000u) != 0u ? (k & 0x7FFFFFFFu) : ~k);
}

/// The radix digits: the top 11 bits, the next 11, the last 10.
struct radix_digit {
  int shift;
  std::uint32_t buckets;
};
inline constexpr std::array<radix_digit, 3> radix_digits{{{21, 2048}, {10, 2048}, {0, 1024}}};

/// Buckets small enough to be gathered into a stack buffer and finished there.
inline constexpr std::uint32_t select_gather_limit = 2048;

/// The k-th largest of value(0 .. n-1) (1 <= k <= n; duplicates count, so the k largest values
/// are exactly those >= the result, ties included). Returns false without a result if a value
/// is NaN (the order is then undefined). Reads the row at most four times.
template <class Value>
[[nodiscard]] bool kth_largest(index_t n, index_t k, const Value& value, float& result) {
  std::uint32_t prefix = 0;                        // the key bits fixed so far
  int fixed = 0;                                   // how many top bits of the key are fixed
  auto remaining = static_cast<std::uint64_t>(k);  // rank inside the bucket of `prefix`
  std::array<std::uint32_t, 2048> count{};
  for (const radix_digit d : radix_digits) {
    const std::uint32_t mask = d.buckets - 1u;
    std::fill_n(count.begin(), d.buckets, 0u);
    if (fixed == 0) {
      // Every element counts: four interleaved histograms, so that runs of one bucket do not
      // wait on each other's increments.
      std::array<std::array<std::uint32_t, 2048>, 4> count4{};
      bool nan = false;
      index_t i = 0;
      for (; i + 4 <= n; i += 4)
        for (int c = 0; c < 4; ++c) {
          const float x = value(i + c);
          nan |= x != x;
          ++count4[static_cast<std::size_t>(c)][float_order_key(x) >> d.shift];
        }
      for (; i < n; ++i) {
        const float x = value(i);
        nan |= x != x;
        ++count4[0][float_order_key(x) >> d.shift];
      }
      if (nan) return false;
      for (std::uint32_t b = 0; b < d.buckets; ++b)
        count[b] = count4[0][b] + count4[1][b] + count4[2][b] + count4[3][b];
    } else {
      for (index_t i = 0; i < n; ++i) {
        const std::uint32_t key = float_order_key(value(i));
        if ((key >> (32 - fixed)) == prefix) ++count[(key >> d.shift) & mask];
      }
    }
    std::uint32_t b = d.buckets;
    std::uint64_t above = 0;
    do {
      --b;
      if (above + count[b] >= remaining) break;
      above += count[b];
    } while (b > 0);
    remaining -= above;
    prefix = (prefix << (32 - d.shift - fixed)) | b;
    fixed = 32 - d.shift;
    if (fixed == 32) break;
    if (count[b] <= select_gather_limit) {  // finish among the bucket's own values
      std::array<float, select_gather_limit> held;
      std::uint32_t m = 0;
      for (index_t i = 0; i < n; ++i) {
        const float x = value(i);
        if ((float_order_key(x) >> (32 - fixed)) == prefix) held[m++] = x;
      }
      const auto r = static_cast<std::ptrdiff_t>(remaining - 1);
      std::nth_element(held.begin(), held.begin() + r, held.begin() + m, std::greater<float>());
      result = held[static_cast<std::size_t>(r)];
      return true;
    }
  }
  result = float_from_order_key(prefix);
  return true;
}

/// Limits of kth_largest_by_blocks (stack buffers of this many floats).
inline constexpr index_t block_select_limit = 4096;

/// The k-th largest of x[i] * s over i < n (no NaN among them; s > 0), as kth_largest, for a k
/// small against n: the rows are cut into blocks whose maxima, m_j * s, are found by
/// `block_max` (a vector pass); at least k entries are >= the k-th largest block maximum b (one
/// in each of k blocks), so the k-th largest is >= b and lies among the entries >= b, which only
/// the blocks with maximum >= b hold; those are gathered and selected. Returns false, without a
/// result, when k is too large for the block count or too many entries tie at or above b (the
/// caller then uses kth_largest); the result, when there is one, is kth_largest's.
template <class BlockMax>
[[nodiscard]] bool kth_largest_by_blocks(const float* x, float s, index_t n, index_t k,
                                         const BlockMax& block_max, float& result) {
  if (k < 1 || k > n / 64) return false;
  // Blocks of a multiple of 16 entries, at least 4k of them and at most block_select_limit.
  index_t block = (n / (4 * k)) / 16 * 16;
  if (block < 16) return false;
  while ((n + block - 1) / block > block_select_limit) block *= 2;
  const index_t blocks = (n + block - 1) / block;
  if (blocks < 2 * k) return false;
  std::array<float, block_select_limit> maxima;
  std::array<float, block_select_limit> work;
  for (index_t j = 0; j < blocks; ++j) {
    const index_t begin = j * block;
    const index_t len = begin + block < n ? block : n - begin;
    maxima[static_cast<std::size_t>(j)] = block_max(x + begin, len) * s;
  }
  std::copy_n(maxima.begin(), blocks, work.begin());
  std::nth_element(work.begin(), work.begin() + (k - 1), work.begin() + blocks,
                   std::greater<float>());
  const float b = work[static_cast<std::size_t>(k - 1)];
  index_t held = 0;
  for (index_t j = 0; j < blocks; ++j) {
    if (!(maxima[static_cast<std::size_t>(j)] >= b)) continue;
    const index_t begin = j * block;
    const index_t end = begin + block < n ? begin + block : n;
    for (index_t i = begin; i < end; ++i) {
      const float v = x[i] * s;
      if (!(v >= b)) continue;
      if (held == block_select_limit) return false;  // many ties at the top: the radix path
      work[static_cast<std::size_t>(held++)] = v;
    }
  }
  std::nth_element(work.begin(), work.begin() + (k - 1), work.begin() + held,
                   std::greater<float>());
  result = work[static_cast<std::size_t>(k - 1)];
  return true;
}

/// A nucleus threshold: keep the probabilities >= threshold; `kept_mass` is their sum.
struct nucleus_cut {
  float threshold = 0.0f;
  double kept_mass = 0.0;
};

/// The sort-based nucleus threshold over s (sorted in place, descending): the value at which
/// the running double sum first reaches top_p times the total (see the file comment).
[[nodiscard]] inline float nucleus_threshold_sorted(float* s, index_t n, float top_p) {
  std::sort(s, s + n, std::greater<float>());
  double total = 0.0;
  for (index_t i = 0; i < n; ++i) total += s[i];
  const double target = static_cast<double>(top_p) * total;
  double acc = 0.0;
  float threshold = n == 0 ? 0.0f : s[n - 1];
  for (index_t i = 0; i < n; ++i) {
    acc += s[i];
    if (acc >= target) {
      threshold = s[i];
      break;
    }
  }
  return threshold;
}

/// The nucleus threshold of the probability row value(0 .. n-1) by selection, equal to
/// nucleus_threshold_sorted whenever it returns true (file comment). Returns false, and the
/// caller must use the sort, when a value is negative, NaN or >= 2, when the row sums to 1.5
/// or more, or when rounding of the sort-based sums could decide the threshold. On success
/// `cut.kept_mass` is the exact sum of the kept values (every one of them is >= 2^-29).
template <class Value>
[[nodiscard]] bool nucleus_threshold_selected(index_t n, float top_p, const Value& value,
                                              nucleus_cut& cut) {
  // Bits of 2^-29: values from here up are multiples of 2^-52 (exact partial sums).
  constexpr std::uint32_t exact_bits = 0x31000000u;
  constexpr double ulp_one = 0x1p-52;

  // Level 1: bits 29..21 (values below 2 have bits 31 and 30 clear), counts and masses in four
  // interleaved copies so consecutive elements of one bucket do not wait on each other.
  constexpr std::uint32_t top_buckets = 512;
  std::array<std::array<std::uint32_t, top_buckets>, 4> count4{};
  std::array<std::array<double, top_buckets>, 4> mass4{};
  std::uint32_t bad = 0;
  // Zeros (+0) are skipped: they add nothing to any sum (rows after top-k are mostly zeros).
  const auto add = [&](std::size_t c, float x) {
    const auto bits = std::bit_cast<std::uint32_t>(x);
    if (bits == 0u) return;
    const std::uint32_t bucket = bits >> 21;
    bad |= bucket & ~(top_buckets - 1u);  // negative, >= 2, NaN or infinite
    const std::uint32_t b = bucket & (top_buckets - 1u);
    ++count4[c][b];
    mass4[c][b] += static_cast<double>(x);
  };
  // Values in blocks (a loop the compiler vectorises), then the scalar histogram updates.
  constexpr index_t block = 64;
  std::array<float, block> vals;
  for (index_t i0 = 0; i0 < n; i0 += block) {
    const index_t m = std::min(block, n - i0);
    for (index_t k = 0; k < m; ++k) vals[static_cast<std::size_t>(k)] = value(i0 + k);
    index_t k = 0;
    for (; k + 4 <= m; k += 4)
      for (std::size_t c = 0; c < 4; ++c) add(c, vals[static_cast<std::size_t>(k) + c]);
    for (; k < m; ++k) add(0, vals[static_cast<std::size_t>(k)]);
  }
  if (bad != 0u) return false;
  std::array<std::uint32_t, 2048> count{};
  std::array<double, 2048> mass{};
  for (std::uint32_t b = 0; b < top_buckets; ++b) {
    count[b] = count4[0][b] + count4[1][b] + count4[2][b] + count4[3][b];
    mass[b] = ((mass4[0][b] + mass4[1][b]) + mass4[2][b]) + mass4[3][b];
  }

  // The totals: exact over the values >= 2^-29, within tail_count * 2^-53 below.
  constexpr std::uint32_t exact_bucket = exact_bits >> 21;
  double exact_total = 0.0;
  double tail_total = 0.0;
  std::uint64_t tail_count = 0;
  for (std::uint32_t b = 0; b < top_buckets; ++b) {
    if (b >= exact_bucket) {
      exact_total += mass[b];
    } else {
      tail_total += mass[b];
      tail_count += count[b];
    }
  }
  if (!(exact_total + tail_total < 1.5)) return false;
  // The sort-based total is exact_total, then the tail added with an error <= 2^-53 per
  // addition (every partial sum is below 2). Ours has at most tail_count + 4 * 512 roundings of
  // the same bound, plus three below: the targets lie within top_p * [lo, hi].
  double lo = exact_total;
  double hi = exact_total;
  if (tail_count > 0) {
    const double err = static_cast<double>(2 * tail_count + 4096) * ulp_one;
    lo = exact_total + tail_total - err;
    hi = exact_total + tail_total + err;
  }
  const double target_lo = static_cast<double>(top_p) * lo;
  const double target_hi = static_cast<double>(top_p) * hi;

  std::uint32_t prefix = 0;  // bits of the bucket holding the threshold
  int fixed = 0;             // how many top bits of the value are fixed (bits 31, 30 are 0)
  double above = 0.0;        // exact mass of the values above the bucket
  for (std::size_t level = 0; level < radix_digits.size(); ++level) {
    const radix_digit d = radix_digits[level];
    const std::uint32_t buckets = level == 0 ? top_buckets : d.buckets;
    if (level > 0) {  // histogram inside the bucket found so far
      std::fill_n(count.begin(), buckets, 0u);
      std::fill_n(mass.begin(), buckets, 0.0);
      const std::uint32_t mask = buckets - 1u;
      for (index_t j = 0; j < n; ++j) {
        const float x = value(j);
        const auto bits = std::bit_cast<std::uint32_t>(x);
        if ((bits >> (32 - fixed)) != prefix) continue;
        ++count[(bits >> d.shift) & mask];
        mass[(bits >> d.shift) & mask] += static_cast<double>(x);
      }
    }
    // The bucket where the running mass reaches each target; it must be the same one, and
    // hold only exactly summed values.
    std::uint32_t b_lo = buckets;
    std::uint32_t b_hi = buckets;
    double above_lo = 0.0;
    double acc = above;
    for (std::uint32_t b = buckets; b-- > 0;) {
      const double before = acc;
      acc += mass[b];
      if (b_lo == buckets && acc >= target_lo) {
        b_lo = b;
        above_lo = before;
      }
      if (acc >= target_hi) {
        b_hi = b;
        break;
      }
    }
    if (b_lo != b_hi || b_hi == buckets) return false;
    const int next_fixed = 32 - d.shift;
    prefix = (prefix << (next_fixed - fixed)) | b_hi;  // level 0: bits 31 and 30 are zero
    fixed = next_fixed;
    above = above_lo;
    if ((prefix << (32 - fixed)) < exact_bits) return false;  // the tail decides
    if (fixed == 32) {  // one value, possibly repeated: the threshold itself
      cut.threshold = std::bit_cast<float>(prefix);
      cut.kept_mass = above + mass[b_hi];
      return true;
    }
    if (count[b_hi] <= select_gather_limit) {  // finish in the bucket's values, sorted
      std::array<float, select_gather_limit> held;
      std::uint32_t m = 0;
      for (index_t j = 0; j < n; ++j) {
        const float x = value(j);
        if ((std::bit_cast<std::uint32_t>(x) >> (32 - fixed)) == prefix) held[m++] = x;
      }
      std::sort(held.begin(), held.begin() + m, std::greater<float>());
      float t_lo = 0.0f;
      float t_hi = 0.0f;
      bool found_lo = false;
      bool found_hi = false;
      double run = above;
      for (std::uint32_t j = 0; j < m && !found_hi; ++j) {
        run += static_cast<double>(held[j]);
        if (!found_lo && run >= target_lo) {
          t_lo = held[j];
          found_lo = true;
        }
        if (run >= target_hi) {
          t_hi = held[j];
          found_hi = true;
        }
      }
      if (!found_hi || t_lo != t_hi) return false;
      double kept = above;
      for (std::uint32_t j = 0; j < m && held[j] >= t_hi; ++j) kept += static_cast<double>(held[j]);
      cut.threshold = t_hi;
      cut.kept_mass = kept;
      return true;
    }
  }
  return false;  // unreachable: the last digit fixes all 32 bits
}

}  // namespace specula::detail
