#pragma once

/// @file
/// Typical acceptance (Medusa): accept a drafted token x iff p(x) > min(ε, α·exp(−H(p))), where
/// H(p) is the entropy of the target row (natural log). Deterministic given p; not lossless.
/// After a rejection the rule resamples from G* = Norm([p − q·f]+) (Cool-SD Eq. 10, default)
/// or G_van = Norm([p − q]+). A row-aware rule (rules/rule.hpp): binding computes H(p) with one
/// pass over the row, summed in the row passes' fixed order (ordered_sum), so the CUDA backend's
/// CTA-wide pass (bind_rule with the verifier's passes) gives the host's sum.

#include <cmath>

#include "specula/core/config.hpp"
#include "specula/core/error.hpp"
#include "specula/core/numeric.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/rules/relaxed.hpp"
#include "specula/sample/categorical.hpp"

namespace specula {

/// Typical acceptance bound to one target row.
struct typical_bound_rule {
  double threshold = 0.0;  ///< min(ε, α·exp(−H(p)))
  resampling resample = resampling::optimal;

  [[nodiscard]] SPECULA_HOST_DEVICE constexpr double accept_probability(
      double p, double /*q*/) const noexcept {
    return p > threshold ? 1.0 : 0.0;
  }
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr double residual_weight_at(index_t /*y*/, double p,
                                                                        double q) const noexcept {
    // G*: [p − q·f]+ with f(y) = 1 if p(y) > threshold else 0.
    const double d = (resample == resampling::vanilla || p > threshold) ? p - q : p;
    return d > 0.0 ? d : 0.0;
  }
};

/// Medusa's typical acceptance. Medusa's defaults: ε = 0.09 (posterior_threshold),
/// α = 0.3 (posterior_alpha).
struct typical_rule {
  double epsilon = 0.09;
  double alpha = 0.3;
  resampling resample = resampling::optimal;

  static typical_rule make(double epsilon, double alpha, resampling r = resampling::optimal) {
    require_parameter(detail::is_finite(epsilon) && epsilon >= 0.0 && epsilon <= 1.0, "epsilon",
                      epsilon, "must be in [0, 1]");
    require_parameter(detail::is_finite(alpha) && alpha >= 0.0, "alpha", alpha,
                      "must be finite and >= 0");
    require_parameter(!detail::is_lantern_resampling(r), "resample", 0.0,
                      "typical acceptance resamples from G* or G_van");
    return {epsilon, alpha, r};
  }

  /// Checked entry points call this: the parameters make() checks, for a rule built field by
  /// field.
  void validate(index_t /*vocab*/ = 0) const { (void)make(epsilon, alpha, resample); }

  /// The entropy's term of entry i: −p_i·log p_i for p_i > 0, else 0 (0·log 0 = 0).
  template <class T>
  struct entropy_terms {
    row_view<const T> p;
    SPECULA_HOST_DEVICE double operator()(index_t i) const noexcept {
      const double v = static_cast<double>(p[i]);
      return v > 0.0 ? -detail::mul_rn(v, std::log(v)) : 0.0;  // no FMA: the host's rounding
    }
  };

  /// Entropy of a probability row (natural log), its terms added in ordered_sum's order.
  template <class T>
  [[nodiscard]] SPECULA_HOST_DEVICE static double entropy(row_view<const T> p) noexcept {
    return ordered_sum(p.size, entropy_terms<T>{p});
  }

  template <class T>
  [[nodiscard]] SPECULA_HOST_DEVICE typical_bound_rule bind(row_view<const T> p,
                                                            token_t /*x*/) const noexcept {
    return bound(entropy(p));
  }

  /// bind(p, x) with the entropy summed by the verifier's row passes (detail::pass_sum): one
  /// CTA-wide pass on the device instead of a whole row in every thread; the same bits.
  template <class T, class Passes>
  [[nodiscard]] SPECULA_HOST_DEVICE typical_bound_rule bind(row_view<const T> p, token_t /*x*/,
                                                            const Passes& passes) const noexcept {
    return bound(detail::pass_sum(passes, p.size, entropy_terms<T>{p}));
  }

 private:
  [[nodiscard]] SPECULA_HOST_DEVICE typical_bound_rule bound(double entropy) const noexcept {
    const double t = alpha * std::exp(-entropy);
    return {epsilon < t ? epsilon : t, resample};
  }
};

}  // namespace specula
