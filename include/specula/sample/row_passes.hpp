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
#include "specula/core/types.hpp"
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

}  // namespace specula
