#pragma once

/// @file
/// Row passes: the reductions over a whole row that verifiers make, separated from the
/// verifiers' maths so that one verifier serves every backend.
///
/// A verifier (verify_chain_request, verify_candidates, verify_tree_request, the greedy
/// verifiers) is scalar code plus a few full-row reductions. It makes those reductions through a
/// `row_passes` object:
///   - `mass(n, w)`: the positive mass of weights w over [0, n) (positive_mass's value);
///   - `summarize(n, w, s)`: the same mass together with the tile sums a following inverse-CDF
///     sample walks (summarize_weights), into a `summary_type` the random source accepts;
///   - `argmax(row)`: argmax_lowest(row).
/// Every implementation must give the host's bits: tiles of detail::sum_tile elements, each
/// summed in 8 interleaved lanes combined pairwise, tile sums added left to right.
///
/// `sequential_passes` (here) is the host backend's: one thread walks the row. The CUDA
/// backend's `specula::cuda::block_passes` runs the same verifier with every thread of a CTA
/// executing the scalar code redundantly and the passes split across the CTA's threads.

#include <concepts>

#include "specula/core/config.hpp"
#include "specula/core/row.hpp"
#include "specula/core/status.hpp"
#include "specula/core/types.hpp"
#include "specula/core/validate.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/sample/random_source.hpp"
#include "specula/sample/without_replacement.hpp"

namespace specula {

/// One thread walks the row (the host backend; see file comment).
struct sequential_passes {
  using summary_type = weight_summary;

  template <class WeightFn>
  [[nodiscard]] SPECULA_HOST_DEVICE double mass(index_t n, WeightFn&& w) const noexcept {
    return positive_mass(n, w);
  }
  template <class WeightFn>
  SPECULA_HOST_DEVICE void summarize(index_t n, WeightFn&& w, summary_type& s) const noexcept {
    summarize_weights(n, w, s);
  }
  template <class Row>
  [[nodiscard]] SPECULA_HOST_DEVICE index_t argmax(const Row& row) const noexcept {
    return argmax_lowest(row);
  }
};

/// How much of their input the checked host entry points validate.
enum class check_level {
  /// Shapes, extents, offsets and token ids; the probabilities of drafted tokens (p(x), q(x));
  /// and every probability row the verifier reads in full, checked as it is read (no NaN, no
  /// Inf, no negative entry, |sum - 1| within the tolerance). Rows the verifier never reads
  /// cannot change its output and are not scanned, so a checked call costs about what an
  /// unchecked one does. Applies to the exact rule over float rows; other rules and row types
  /// are checked at the `full` level.
  reads,
  /// Every row of every input is validated before anything is verified.
  full,
};

/// The first failure found by checking_passes, and the rows already checked (each row is
/// checked once even when several passes read it, as the K-candidate recursion does).
struct row_read_log {
  static constexpr int max_remembered = 8;
  double sum_tolerance = 1e-3;
  const float* remembered[max_remembered] = {};
  int count = 0;
  const float* failed_row = nullptr;  ///< the first row that failed, or nullptr
  diagnostic failure{};               ///< its diagnostic (row index not set)
};

/// Host passes that validate every float probability row they read (check_level::reads): the
/// rows named by a weight function's dense form (core/simd.hpp) are checked with
/// check_probability_row before the pass, while they are about to be read anyway. The first
/// failure is recorded in the log; the caller turns it into an error after the request.
struct checking_passes {
  using summary_type = weight_summary;
  row_read_log* log = nullptr;

  // Host+device only so that verifiers (host+device functions) instantiate cleanly with it in
  // CUDA translation units; it validates on the host and is never used in device code.
  template <class WeightFn>
  [[nodiscard]] SPECULA_HOST_DEVICE double mass(index_t n, WeightFn&& w) const noexcept {
#if !SPECULA_IS_DEVICE_CODE
    note(n, w);
#endif
    return positive_mass(n, w);
  }
  template <class WeightFn>
  SPECULA_HOST_DEVICE void summarize(index_t n, WeightFn&& w, summary_type& s) const noexcept {
#if !SPECULA_IS_DEVICE_CODE
    note(n, w);
#endif
    summarize_weights(n, w, s);
  }
  template <class Row>
  [[nodiscard]] SPECULA_HOST_DEVICE index_t argmax(const Row& row) const noexcept {
    return argmax_lowest(row);
  }

 private:
  template <class WeightFn>
  void note(index_t n, const WeightFn& w) const noexcept {
    if constexpr (detail::dense_f32_weight_function<std::remove_cvref_t<WeightFn>>) {
      const dense_f32_weights f = w.dense_f32();
      check(f.p, n);
      if (f.q != nullptr) check(f.q, n);
    }
  }
  void check(const float* row, index_t n) const noexcept {
    for (int k = 0; k < log->count; ++k)
      if (log->remembered[k] == row) return;
    if (log->count < row_read_log::max_remembered) log->remembered[log->count++] = row;
    if (log->failed_row != nullptr) return;
    const diagnostic d = check_probability_row(row_view<const float>{row, n}, log->sum_tolerance);
    if (!d.ok()) {
      log->failed_row = row;
      log->failure = d;
    }
  }
};

/// The interface of a row-passes object (see file comment).
template <class P>
concept row_passes = tile_summary<typename P::summary_type> &&
    requires(const P& p, index_t n, detail::example_weight_fn w, typename P::summary_type& s,
             row_view<const float> row) {
  { p.mass(n, w) } -> std::convertible_to<double>;
  p.summarize(n, w, s);
  { p.argmax(row) } -> std::convertible_to<index_t>;
};

static_assert(row_passes<sequential_passes>);
static_assert(row_passes<checking_passes>);

}  // namespace specula
