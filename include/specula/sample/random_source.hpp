#pragma once

/// @file
/// The random-source interface that verifiers draw through, and its production model.
///
/// A verifier never touches raw random numbers. It asks a source two questions:
///   - `bernoulli(prob, at)`: true with probability clamp(prob, 0, 1);
///   - `categorical(n, w, total, at)`: an index i in [0, n) with probability w(i) / total.
/// `philox_source` answers with Philox uniforms (u < prob; inverse CDF with one uniform). The
/// testing kit's `enumerating_source` answers every possible way, with the exact probability
/// of each answer under the same rules, which is how a verifier's output law is computed
/// exactly (specula/testing/enumerate.hpp).

#include <concepts>

#include "specula/core/config.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/types.hpp"
#include "specula/sample/categorical.hpp"

namespace specula {

namespace detail {
struct example_weight_fn {
  SPECULA_HOST_DEVICE constexpr double operator()(index_t) const noexcept { return 1.0; }
};
}  // namespace detail

/// A source of the two kinds of random decisions verifiers make (see file comment). Sources
/// also accept a weight_summary in place of the total (the library's verifiers pass one; it
/// must describe the same weights).
template <class S>
concept random_source = requires(S& s, double prob, draw_id at, index_t n, double total,
                                 const weight_summary& summary, detail::example_weight_fn w) {
  { s.bernoulli(prob, at) } -> std::same_as<bool>;
  { s.categorical(n, w, total, at) } -> std::same_as<index_t>;
  { s.categorical(n, w, summary, at) } -> std::same_as<index_t>;
};

/// Production random source: one Philox block per draw point of a request's stream.
struct philox_source {
  request_rng rng;

  /// True iff u < prob, with u = uniform_at(rng, at) in (0, 1); so prob >= 1 always accepts and
  /// prob <= 0 never does.
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr bool bernoulli(double prob,
                                                             draw_id at) const noexcept {
    return uniform_at(rng, at) < prob;
  }

  /// Inverse-CDF sample with one uniform (see sample_inverse_cdf).
  template <class WeightFn>
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr index_t categorical(index_t n, WeightFn&& w,
                                                                  double total,
                                                                  draw_id at) const noexcept {
    return sample_inverse_cdf(n, w, total, uniform_at(rng, at));
  }

  /// The same sample (same index for the same uniform) using tile sums recorded by
  /// summarize_weights, so the row is not summed again. With a device passes summary (a
  /// tile_scanning_summary) this is a CTA-wide step: every thread of the CTA must call it.
  template <class WeightFn, tile_summary Summary>
  [[nodiscard]] SPECULA_HOST_DEVICE index_t categorical(index_t n, WeightFn&& w, const Summary& s,
                                                        draw_id at) const noexcept {
    return sample_inverse_cdf(n, w, s, uniform_at(rng, at));
  }
};

static_assert(random_source<philox_source>);

}  // namespace specula
