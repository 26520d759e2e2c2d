#pragma once

/// @file
/// The exact (lossless) rule of speculative sampling: the rejection lemma.

#include "specula/core/config.hpp"
#include "specula/rules/rule.hpp"

namespace specula {

/// Accept x with min(1, p(x)/q(x)); on rejection sample from Norm([p - q]+).
///
/// The output is distributed exactly as p for any q (Leviathan et al. 2023; Chen et al. 2023;
/// SJD Theorem 1; see docs/rejection_lemma.md). Convention 0/0 = 1: a token with q(x) = 0 is
/// accepted (checked entry points reject such drafts before they reach the rule).
struct exact_rule {
  /// residual_weight(p, q) is max(p - q, 0) exactly (the host passes then use SIMD kernels).
  static constexpr bool residual_is_positive_difference = true;

  [[nodiscard]] SPECULA_HOST_DEVICE constexpr double accept_probability(double p,
                                                                        double q) const noexcept {
    if (q <= 0.0 || p >= q) return 1.0;
    return p / q;
  }
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr double residual_weight(double p,
                                                                     double q) const noexcept {
    // Written as max(d, 0) on the difference so that row loops vectorise (maxpd).
    const double d = p - q;
    return d > 0.0 ? d : 0.0;
  }
};

static_assert(acceptance_rule<exact_rule>);

}  // namespace specula
