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
#include <limits>

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
  /// Shapes, extents, offsets and token ids, before verifying; then every probability the
  /// verifier reads, checked as it is read: the entries it reads pointwise (p(x) and q(x) of each
  /// drafted token, child or candidate it tests: finite, non-negative, q(x) > 0) and every row it
  /// reads in full (no NaN, no Inf, no negative entry, |sum - 1| within the tolerance). What the
  /// verifier never reads (the rows of accepted drafts beyond p(x), the drafts after a
  /// rejection, the children of nodes the walk does not reach) cannot change its output and is
  /// not checked, so a checked call costs about what an unchecked one does. Applies to the exact
  /// rule over float rows; other rules and row types are checked at the `full` level.
  reads,
  /// Every row of every input, and p(x) and q(x) of every drafted token, are validated before
  /// anything is verified.
  full,
};

/// The first failure found by checking_passes, and the rows already checked (each row is
/// checked once even when several passes read it, as the K-candidate recursion does).
struct row_read_log {
  static constexpr int max_remembered = 8;
  double sum_tolerance = 1e-3;
  const float* remembered[max_remembered] = {};
  int count = 0;
  /// The row of the first failure (a row that failed, or the row of an entry read pointwise that
  /// failed), or nullptr.
  const float* failed_row = nullptr;
  diagnostic failure{};  ///< its diagnostic (row index not set; the column of a failed entry)
  /// The first failure is an entry q(x) of a proposal row (names draft_probs / q even when the
  /// caller passed one array for both).
  bool failed_in_proposal = false;
};

/// Host passes that validate every float probability row they read (check_level::reads): the
/// rows named by a weight function's dense form (core/simd.hpp). Simple forms (a row, the chain
/// residual max(p - q, 0), the first candidate step) are validated by the pass that sums their
/// weights, which reads each row once: its kernels add up the rows' entries and track their
/// minimum on the way (detail::dense_tile_sums), and unless those prove the rows valid, the
/// rows are scanned with check_probability_row (for the diagnostic, or to settle a sum close to
/// the tolerance). The candidate recursion's later forms are checked with check_probability_row
/// before their pass. The entries a verifier reads pointwise, p(x) and q(x) of the drafted token
/// it tests, are checked by check_entry (detail::check_pointwise) just before their use. The
/// weights, and so the results, are those of sequential_passes for every valid row. The first
/// failure is recorded in the log; the caller turns it into an error after the request.
struct checking_passes {
  using summary_type = weight_summary;
  row_read_log* log = nullptr;

  /// Checks an entry the verifier reads pointwise: `row[col]` is p(x) (finite, >= 0) or, when
  /// `proposal`, q(x) of a drafted token (finite, > 0). Records the first failure.
  SPECULA_HOST_DEVICE void check_entry(const float* row, index_t col,
                                       bool proposal) const noexcept {
#if !SPECULA_IS_DEVICE_CODE
    const float v = row[col];
    // NaN fails every comparison; +Inf fails the upper bound.
    const bool ok = (proposal ? v > 0.0f : v >= 0.0f) && v <= std::numeric_limits<float>::max();
    if (ok || log->failed_row != nullptr) return;
    status code = status::zero_draft_probability;
    if (detail::is_nan(v))
      code = status::nan_value;
    else if (!detail::is_finite(v))
      code = status::inf_value;
    else if (v < 0.0f)
      code = status::negative_value;
    log->failed_row = row;
    log->failure = {code, -1, col, static_cast<double>(v)};
    log->failed_in_proposal = proposal;
#else
    (void)row;
    (void)col;
    (void)proposal;
#endif
  }

  // Host+device only so that verifiers (host+device functions) instantiate cleanly with it in
  // CUDA translation units; it validates on the host and is never used in device code.
  template <class WeightFn>
  [[nodiscard]] SPECULA_HOST_DEVICE double mass(index_t n, WeightFn&& w) const noexcept {
#if !SPECULA_IS_DEVICE_CODE
    if constexpr (detail::dense_f32_weight_function<std::remove_cvref_t<WeightFn>>) {
      if (fused(n, w.dense_f32())) {
        detail::dense_scan scan;
        const double total = detail::positive_mass_scanning(n, w, &scan);
        conclude(n, w.dense_f32(), scan);
        return total;
      }
    }
#endif
    return positive_mass(n, w);
  }
  template <class WeightFn>
  SPECULA_HOST_DEVICE void summarize(index_t n, WeightFn&& w, summary_type& s) const noexcept {
#if !SPECULA_IS_DEVICE_CODE
    if constexpr (detail::dense_f32_weight_function<std::remove_cvref_t<WeightFn>>) {
      if (fused(n, w.dense_f32())) {
        detail::dense_scan scan;
        detail::summarize_weights_scanning(n, w, s, &scan);
        conclude(n, w.dense_f32(), scan);
        return;
      }
    }
#endif
    summarize_weights(n, w, s);
  }
  template <class Row>
  [[nodiscard]] SPECULA_HOST_DEVICE index_t argmax(const Row& row) const noexcept {
    return argmax_lowest(row);
  }

 private:
  /// Whether the pass over a dense form should validate its rows as it sums them. Rows already
  /// checked are not checked again; rows of a form the fused kernels do not take are checked here
  /// first.
  bool fused(index_t n, const dense_f32_weights& f) const noexcept {
    if (seen(f.p) && (f.q == nullptr || seen(f.q))) return false;
    if (detail::simple_form(f)) return true;
    check(f.p, n);
    if (f.q != nullptr) check(f.q, n);
    return false;
  }
  /// Records the rows of a fused pass: unless its scan proves them valid, the rows are checked
  /// in full (check_probability_row), which finds the first failure (p before q) or, for rows
  /// whose float-lane sums lie too close to the tolerance to decide (detail::entry_sum_within),
  /// that they are valid: the same rows are refused as by the full scan.
  void conclude(index_t n, const dense_f32_weights& f,
                const detail::dense_scan& scan) const noexcept {
    auto sum_ok = [&](double sum) {
      return detail::entry_sum_within(sum, scan.float_lane_adds, n, log->sum_tolerance);
    };
    const bool valid =
        scan.low >= 0.0f && sum_ok(scan.p_sum) && (f.q == nullptr || sum_ok(scan.q_sum));
    if (valid) {
      remember(f.p);
      if (f.q != nullptr) remember(f.q);
      return;
    }
    check(f.p, n);
    if (f.q != nullptr) check(f.q, n);
  }
  [[nodiscard]] bool seen(const float* row) const noexcept {
    for (int k = 0; k < log->count; ++k)
      if (log->remembered[k] == row) return true;
    return false;
  }
  void remember(const float* row) const noexcept {
    if (!seen(row) && log->count < row_read_log::max_remembered)
      log->remembered[log->count++] = row;
  }
  /// Checks a row with check_probability_row (unless already checked) and records a failure.
  void check(const float* row, index_t n) const noexcept {
    if (seen(row)) return;
    remember(row);
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

namespace detail {

/// Called by a verifier before it rewrites scratch memory that it read earlier (a tree walk's
/// candidate lists, node after node). Passes whose threads share that scratch (the CUDA
/// backend's block_passes keeps it in shared memory, written alike by every thread) provide
/// sync(), a barrier after which no thread still reads the old contents; for the host's passes
/// this does nothing.
template <class Passes>
SPECULA_HOST_DEVICE constexpr void workspace_barrier(const Passes& passes) noexcept {
  if constexpr (requires { passes.sync(); }) passes.sync();
}

/// Whether this thread writes scratch that every thread reads back (the candidate lists, the
/// normalisers 1/Z_k): one thread of a CTA for passes whose threads share that scratch
/// (block_passes provides leader()), every caller otherwise. A verifier writes such scratch as
///   if (workspace_leader(passes)) slot = value;  workspace_barrier(passes);
/// with every thread computing `value` alike, so that one thread writes it and the barrier
/// publishes it (no two threads write the same shared word; racecheck stays clean).
template <class Passes>
SPECULA_HOST_DEVICE constexpr bool workspace_leader(const Passes& passes) noexcept {
  if constexpr (requires { passes.leader(); })
    return passes.leader();
  else
    return true;
}

/// Called by a verifier just before it uses an entry it reads pointwise: `row[x]` is p(x) or, when
/// `proposal`, q(x) of the drafted token x it tests. Passes that validate what a verifier reads
/// (checking_passes) check the entry of a float row_view; with other passes or row types (double
/// rows, the device's transformed rows) it does nothing.
template <class Passes, class Row>
SPECULA_HOST_DEVICE constexpr void check_pointwise(const Passes& passes, const Row& row, index_t x,
                                                   bool proposal) noexcept {
  if constexpr (requires { passes.check_entry(row.data, x, proposal); })
    passes.check_entry(row.data, x, proposal);
  else {
    (void)passes;
    (void)row;
    (void)x;
    (void)proposal;
  }
}

}  // namespace detail

}  // namespace specula
