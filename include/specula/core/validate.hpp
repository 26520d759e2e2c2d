#pragma once

/// @file
/// Input validation. The `check_*` functions are host+device scans that return a `diagnostic`;
/// the `validate_*` functions are host wrappers that throw `invalid_input` naming the argument.

#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/numeric.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/simd.hpp"
#include "specula/core/status.hpp"

namespace specula {

/// Default tolerance on |sum(row) - 1| for probability rows.
inline constexpr double default_sum_tolerance = 1e-3;

/// Checks that `row` is a probability row: no NaN, no Inf, no negative entry, and
/// |sum - 1| <= sum_tolerance. The sum is taken in double in the fixed order of the row passes:
/// tiles of detail::sum_tile elements, each summed in eight interleaved lanes combined pairwise,
/// tile sums added left to right (so a valid row's sum is bit for bit its positive_mass, and a
/// checked pass that reads the row for its weights computes it on the way; see
/// detail::dense_tile_sums). `row_index` is copied into the diagnostic.
template <class T>
SPECULA_HOST_DEVICE constexpr diagnostic check_probability_row(row_view<const T> row,
                                                               double sum_tolerance,
                                                               index_t row_index = -1) noexcept {
  if (row.size <= 0) return {status::empty_input, row_index, -1, 0.0};
  // Fast pass: the sum of detail::checked_entry (v, or 0 for v < 0; NaN kept) and the minimum.
  // A NaN or an infinity makes the sum non-finite and a negative entry makes the minimum
  // negative; only then does the precise scan below run to report the first offending entry.
  // Float rows on the host use the SIMD kernels of core/simd.hpp (same bits as the loop below).
  double lowest = 0.0;
  double sum = 0.0;
  bool summed = false;
#if !SPECULA_IS_DEVICE_CODE
  if constexpr (std::is_same_v<std::remove_cv_t<T>, float>) {
    if (!std::is_constant_evaluated()) {
      sum = detail::row_sum_and_min(row.data, row.size, lowest);
      summed = true;
    }
  }
#endif
  if (!summed) {
    for (index_t t = 0; t < row.size; t += detail::sum_tile) {
      const index_t end = t + detail::sum_tile < row.size ? t + detail::sum_tile : row.size;
      double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      double low[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      index_t i = t;
      for (; i + 8 <= end; i += 8)
        for (int k = 0; k < 8; ++k) {
          const double v = detail::to_double(row[i + k]);
          lane[k] += detail::checked_entry(v);
          low[k] = v < low[k] ? v : low[k];
        }
      for (int k = 0; i < end; ++i, ++k) {
        const double v = detail::to_double(row[i]);
        lane[k] += detail::checked_entry(v);
        low[k] = v < low[k] ? v : low[k];
      }
      sum += detail::combine_lanes(lane);
      for (double v : low) lowest = v < lowest ? v : lowest;
    }
  }
  if (!detail::is_finite(sum) || lowest < 0.0) {
    for (index_t j = 0; j < row.size; ++j) {
      const double v = detail::to_double(row[j]);
      if (detail::is_nan(v)) return {status::nan_value, row_index, j, v};
      if (!detail::is_finite(v)) return {status::inf_value, row_index, j, v};
      if (v < 0.0) return {status::negative_value, row_index, j, v};
    }
  }
  if (detail::abs_value(sum - 1.0) > sum_tolerance)
    return {status::bad_row_sum, row_index, -1, sum};
  return {};
}

/// Checks a logit row: no NaN and no +Inf; -Inf marks a masked token; at least one finite entry.
template <class T>
SPECULA_HOST_DEVICE constexpr diagnostic check_logit_row(row_view<const T> row,
                                                         index_t row_index = -1) noexcept {
  if (row.size <= 0) return {status::empty_input, row_index, -1, 0.0};
  bool any_finite = false;
  for (index_t i = 0; i < row.size; ++i) {
    const double v = detail::to_double(row[i]);
    if (detail::is_nan(v)) return {status::nan_value, row_index, i, v};
    if (!detail::is_finite(v)) {
      if (v > 0) return {status::inf_value, row_index, i, v};
    } else {
      any_finite = true;
    }
  }
  if (!any_finite) return {status::no_mass, row_index, -1, 0.0};
  return {};
}

/// Checks a token id against the vocabulary. With `allow_padding`, `no_token` (-1) is accepted.
SPECULA_HOST_DEVICE constexpr diagnostic check_token(token_t token, index_t vocab_size,
                                                     index_t index, bool allow_padding) noexcept {
  if (token == no_token && allow_padding) return {};
  if (token < 0 || static_cast<index_t>(token) >= vocab_size)
    return {status::token_out_of_range, index, -1, static_cast<double>(token)};
  return {};
}

/// Throws unless every row of `batch` is a probability row (see check_probability_row).
template <class T>
void validate_probability_rows(batch_view<const T> batch, const char* argument,
                               double sum_tolerance = default_sum_tolerance) {
  if (batch.rows > 1 && batch.row_stride < batch.cols)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(batch.row_stride)},
                    argument, "row_stride must be at least the row length");
  if (batch.rows > 0 && batch.data == nullptr)
    throw_if_failed({status::empty_input, -1, -1, 0.0}, argument, "null data pointer");
  for (index_t r = 0; r < batch.rows; ++r)
    throw_if_failed(check_probability_row<T>(batch.row(r), sum_tolerance, r), argument);
}

/// Throws unless every row of `batch` is a valid logit row (see check_logit_row).
template <class T>
void validate_logit_rows(batch_view<const T> batch, const char* argument) {
  if (batch.rows > 1 && batch.row_stride < batch.cols)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(batch.row_stride)},
                    argument, "row_stride must be at least the row length");
  for (index_t r = 0; r < batch.rows; ++r)
    throw_if_failed(check_logit_row<T>(batch.row(r), r), argument);
}

/// Throws unless 0 <= sum_tolerance < 1. A tolerance of 1 or more would accept a row with no
/// mass at all (sum 0), from which a verifier would emit an arbitrary token.
inline void validate_sum_tolerance(double sum_tolerance, const char* argument) {
  require_parameter(sum_tolerance >= 0.0 && sum_tolerance < 1.0, argument, sum_tolerance,
                    "must be in [0, 1)");
}

/// Throws unless `actual == expected`, naming the argument and both extents.
inline void validate_extent(index_t actual, index_t expected, const char* argument,
                            const char* what) {
  if (actual == expected) return;
  const std::string detail_text =
      std::string(what) + " (expected " + std::to_string(expected) + ")";
  throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(actual)}, argument,
                  detail_text.c_str());
}

namespace detail {

/// Checks one probability entry that a verifier reads pointwise (p(x) or q(x)): not NaN, finite,
/// not negative; throws naming the argument, row and column.
inline void check_entry(double v, const char* argument, index_t row, index_t col) {
  if (is_nan(v)) throw_if_failed({status::nan_value, row, col, v}, argument);
  if (!is_finite(v)) throw_if_failed({status::inf_value, row, col, v}, argument);
  if (v < 0.0) throw_if_failed({status::negative_value, row, col, v}, argument);
}

/// The verifiers' extent check: throws unless `actual == expected` (see validate_extent).
inline void require_size(index_t actual, index_t expected, const char* argument, const char* what) {
  validate_extent(actual, expected, argument, what);
}

/// Two requests of one call whose random streams have the same seed and request id (they would
/// make the same draws: a call's requests share their step in practice), `first < second`; -1,
/// -1 when every (seed, request_id) pair is distinct.
struct shared_stream_pair {
  index_t first = -1;
  index_t second = -1;
};

/// The shared pair with the smallest `second` (then the smallest `first`), or none. Up to 32
/// requests a comparison of every pair; above, one pass over an open-addressing table of the
/// pairs seen (a thread-local buffer of 4 to 8 bytes per request, kept between calls).
inline shared_stream_pair find_shared_stream(row_view<const request_rng> rng) {
  const index_t n = rng.size;
  const auto same = [&](index_t a, index_t b) {
    return rng[a].seed == rng[b].seed && rng[a].request_id == rng[b].request_id;
  };
  if (n <= 32) {
    for (index_t b = 1; b < n; ++b)
      for (index_t a = 0; a < b; ++a)
        if (same(a, b)) return {a, b};
    return {};
  }
  std::size_t size = 64;
  while (size < 2 * static_cast<std::size_t>(n)) size *= 2;
  thread_local std::vector<std::uint32_t> table;  // request index + 1; 0: empty slot
  table.assign(size, 0u);
  const std::size_t mask = size - 1;
  for (index_t b = 0; b < n; ++b) {
    // SplitMix64's finaliser over the seed and the request id.
    std::uint64_t h = rng[b].seed ^ (std::uint64_t{rng[b].request_id} * 0x9e3779b97f4a7c15ull);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    for (std::size_t slot = h & mask;; slot = (slot + 1) & mask) {
      if (table[slot] == 0u) {
        table[slot] = static_cast<std::uint32_t>(b + 1);
        break;
      }
      const auto a = static_cast<index_t>(table[slot] - 1);
      if (same(a, b)) return {a, b};
    }
  }
  return {};
}

/// The checked entry points' stream check: one stream per request (`batch` of them), and no
/// two with the same (seed, request_id) (status::shared_stream, naming both requests).
/// Throws status::shared_stream for requests `first` and `second` of `rng`.
[[noreturn]] inline void throw_shared_stream(row_view<const request_rng> rng, index_t first,
                                             index_t second) {
  const std::string text =
      "requests " + std::to_string(first) + " and " + std::to_string(second) +
      " have the same seed (" + std::to_string(rng[second].seed) + ") and request_id (" +
      std::to_string(rng[second].request_id) +
      "), so they would make the same draws: give each request of a call its own (seed, "
      "request_id)";
  throw_if_failed({status::shared_stream, second, -1, 0.0}, "rng", text.c_str());
  std::abort();  // unreachable
}

inline void require_streams(row_view<const request_rng> rng, index_t batch) {
  require_size(rng.size, batch, "rng", "one random stream per request");
  const shared_stream_pair s = find_shared_stream(rng);
  if (s.second >= 0) throw_shared_stream(rng, s.first, s.second);
}

/// require_streams over the requests that draw: those with `skip[b] == 0` (greedy requests
/// make no draw, so their streams may repeat).
inline void require_streams(row_view<const request_rng> rng, index_t batch,
                            row_view<const std::uint8_t> skip) {
  require_size(rng.size, batch, "rng", "one random stream per request");
  std::vector<request_rng> drawing;
  std::vector<index_t> which;
  for (index_t b = 0; b < batch; ++b)
    if (skip[b] == 0) {
      drawing.push_back(rng[b]);
      which.push_back(b);
    }
  const shared_stream_pair s = find_shared_stream(
      row_view<const request_rng>{drawing.data(), static_cast<index_t>(drawing.size())});
  if (s.second >= 0)
    throw_shared_stream(rng, which[static_cast<std::size_t>(s.first)],
                        which[static_cast<std::size_t>(s.second)]);
}

}  // namespace detail

}  // namespace specula
