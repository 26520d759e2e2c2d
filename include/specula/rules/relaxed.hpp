#pragma once

/// @file
/// Relaxed acceptance (Cool-SD): the ω-relaxed rule with a choice of resampling distribution,
/// and relaxation schedules ω_i along a draft. These rules are NOT lossless: they trade a
/// bounded, computable distortion for longer accepted drafts (docs/relaxed.md; the distortion
/// is computed exactly by specula/testing/relaxation_analysis.hpp).
///
/// References (Annealed Relaxation of Speculative Decoding, "Cool-SD"): Eq. 12 (ω-relaxed
/// acceptance), Eq. 10 (optimal resampling G*), Eq. 2 (vanilla resampling), Eq. 13 (uniform
/// schedule), Eq. 16 (exponential schedule), Eq. 17 (linear schedule, Appendix C.3).

#include <cmath>
#include <cstdint>

#include "specula/core/config.hpp"
#include "specula/core/error.hpp"
#include "specula/core/numeric.hpp"
#include "specula/core/types.hpp"
#include "specula/rules/rule.hpp"

namespace specula {

/// Which distribution a relaxed rule resamples from after a rejection.
enum class resampling : std::uint8_t {
  optimal,  ///< G* = Norm([p − q·f]+) (Cool-SD Eq. 10), the default
  vanilla,  ///< G_van = Norm([p − q]+) (Eq. 2)
  lantern,  ///< LANTERN++'s Norm([P^{k,λ} − q]+) (Eq. 6); only for lantern_rule
  /// LANTERN's code: the target p zeroed at x̃'s first k + 1 neighbours, then Norm([p − q]+);
  /// only for lantern_rule (rules/lantern.hpp)
  lantern_official,
};

namespace detail {
/// True for the resamplings only lantern_rule provides.
[[nodiscard]] SPECULA_HOST_DEVICE constexpr bool is_lantern_resampling(resampling r) noexcept {
  return r == resampling::lantern || r == resampling::lantern_official;
}
}  // namespace detail

/// f(x) = min(1, ω·p(x)/q(x)) (Cool-SD Eq. 12), 0/0 = 1. ω = 1 with either resampling is the
/// exact rule; ω > 1 relaxes, ω < 1 tightens.
struct relaxed_rule {
  double omega = 1.0;
  resampling resample = resampling::optimal;

  [[nodiscard]] SPECULA_HOST_DEVICE constexpr double accept_probability(double p,
                                                                        double q) const noexcept {
    if (q <= 0.0) return 1.0;
    const double wp = detail::mul_rn(omega, p);
    return wp >= q ? 1.0 : wp / q;
  }
  /// G*: [p − q·f]+ = [p − min(q, ω·p)]+; G_van: [p − q]+.
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr double residual_weight(double p,
                                                                     double q) const noexcept {
    if (resample == resampling::vanilla) {
      const double d = p - q;
      return d > 0.0 ? d : 0.0;
    }
    const double wp = detail::mul_rn(omega, p);
    const double d = p - (wp < q ? wp : q);
    return d > 0.0 ? d : 0.0;
  }

  /// Checked entry points call this: ω must be finite and > 0 (ω <= 0 or NaN would reject every
  /// draft, +inf accept every one), and the resampling G* or G_van.
  void validate(index_t /*vocab*/ = 0) const {
    require_parameter(detail::is_finite(omega) && omega > 0.0, "rule.omega", omega,
                      "must be finite and > 0");
    require_parameter(!detail::is_lantern_resampling(resample), "rule.resample",
                      static_cast<double>(resample), "a relaxed rule resamples from G* or G_van");
  }
};

static_assert(acceptance_rule<relaxed_rule>);

/// The kinds of relaxation schedule.
enum class schedule_kind : std::uint8_t { uniform, exponential, linear, custom };

/// ω_i for draft positions i = 1, 2, ... (position i is depth i − 1 of the verifying node).
///
/// - uniform (Eq. 13): ω_i = δ;
/// - exponential (Eq. 16): ω_i = δ·exp(−ν·i − μ) with μ chosen so that
///   Σ_{i=1..L} exp(−ν·i − μ) = L, i.e. the mean of ω over the first L positions is δ; the
///   formula continues for i > L (deeper tree nodes keep decaying);
/// - linear (Eq. 17): ω_i = δ·L·ω̃_i / Σ_{j=1..L} ω̃_j with ω̃_i = (ℓ − i)/(ℓ(ℓ + 1)). For
///   positions i ≥ ℓ the formula gives ω̃_i ≤ 0, which would reject every draft; specula
///   defines ω_i = 1 (the exact rule) there and sums only the positive ω̃_j (j < min(L + 1, ℓ))
///   in the normaliser, so the mean of ω over positions 1 .. min(L, ℓ − 1) is δ;
/// - custom: ω_i = values[i − 1] for i ≤ count, and 1 (the exact rule) past the end.
struct relaxation_schedule {
  schedule_kind kind = schedule_kind::uniform;
  double delta = 1.0;              ///< relaxation budget δ
  double nu = 0.0;                 ///< exponential decay ν
  double mu = 0.0;                 ///< exponential normaliser μ (set by make_exponential)
  double linear_scale = 0.0;       ///< δ·L / Σ ω̃_j (set by make_linear)
  double ell = 0.0;                ///< linear slope parameter ℓ
  const double* values = nullptr;  ///< custom ω_1..ω_count (not owned)
  index_t count = 0;

  /// ω at draft position i >= 1.
  [[nodiscard]] SPECULA_HOST_DEVICE double omega(index_t i) const noexcept {
    switch (kind) {
      case schedule_kind::uniform:
        return delta;
      case schedule_kind::exponential:
        return delta * std::exp(-detail::mul_rn(nu, static_cast<double>(i)) - mu);
      case schedule_kind::linear: {
        const double w = ell - static_cast<double>(i);
        return w > 0.0 ? linear_scale * w / (ell * (ell + 1.0)) : 1.0;
      }
      case schedule_kind::custom:
        return i >= 1 && i <= count ? values[i - 1] : 1.0;
    }
    return 1.0;
  }

  /// Uniform schedule ω_i = δ (Cool-SD Eq. 13, "UniformRSD").
  static relaxation_schedule make_uniform(double delta) {
    require_parameter(detail::is_finite(delta) && delta > 0.0, "delta", delta,
                      "must be finite and > 0");
    return {schedule_kind::uniform, delta};
  }

  /// Exponential schedule (Cool-SD Eq. 16) over draft length L (the normalisation window).
  static relaxation_schedule make_exponential(double delta, double nu, index_t length) {
    require_parameter(detail::is_finite(delta) && delta > 0.0, "delta", delta,
                      "must be finite and > 0");
    require_parameter(detail::is_finite(nu) && nu >= 0.0, "nu", nu, "must be finite and >= 0");
    require_parameter(length >= 1, "length", static_cast<double>(length), "must be >= 1");
    // Σ_{i=1..L} e^{−ν i − μ} = L  ⇔  μ = log(Σ e^{−ν i} / L); summed as e^{−ν}·Σ e^{−ν(i−1)}
    // to stay finite for large ν.
    double s = 0.0;
    for (index_t i = 1; i <= length; ++i) s += std::exp(-nu * static_cast<double>(i - 1));
    relaxation_schedule r{schedule_kind::exponential, delta, nu};
    r.mu = -nu + std::log(s / static_cast<double>(length));
    return r;
  }

  /// Linear schedule (Cool-SD Eq. 17) over draft length L with slope parameter ℓ >= 2 (the
  /// paper uses ℓ = 8).
  static relaxation_schedule make_linear(double delta, double ell, index_t length) {
    require_parameter(detail::is_finite(delta) && delta > 0.0, "delta", delta,
                      "must be finite and > 0");
    require_parameter(detail::is_finite(ell) && ell >= 2.0, "ell", ell, "must be >= 2");
    require_parameter(length >= 1, "length", static_cast<double>(length), "must be >= 1");
    double s = 0.0;
    index_t positive = 0;
    for (index_t i = 1; i <= length; ++i) {
      const double w = (ell - static_cast<double>(i)) / (ell * (ell + 1.0));
      if (w > 0.0) {
        s += w;
        ++positive;
      }
    }
    relaxation_schedule r{schedule_kind::linear, delta};
    r.ell = ell;
    r.linear_scale = delta * static_cast<double>(positive) / s;
    return r;
  }

  /// User-supplied ω_1..ω_count (the array must outlive the schedule); each finite and > 0.
  static relaxation_schedule make_custom(const double* values, index_t count) {
    require_parameter(count >= 0, "count", static_cast<double>(count), "must be >= 0");
    require_parameter(count == 0 || values != nullptr, "values", 0.0, "must not be null");
    for (index_t i = 0; i < count; ++i)
      if (!(detail::is_finite(values[i]) && values[i] > 0.0))
        throw_if_failed({status::invalid_parameter, i, -1, values[i]}, "values",
                        "each ω must be finite and > 0");
    relaxation_schedule r{schedule_kind::custom};
    r.values = values;
    r.count = count;
    return r;
  }

  /// Checks a schedule however it was built (the make_* functions check their arguments; a
  /// schedule assembled field by field is checked here): the parameters its kind reads, and that
  /// every ω it can produce is finite and > 0. Throws invalid_input naming the field.
  void validate() const {
    const auto positive = [](double v, const char* name) {
      require_parameter(detail::is_finite(v) && v > 0.0, name, v, "must be finite and > 0");
    };
    switch (kind) {
      case schedule_kind::uniform:
        positive(delta, "schedule.delta");
        return;
      case schedule_kind::exponential:
        positive(delta, "schedule.delta");
        require_parameter(detail::is_finite(nu) && nu >= 0.0, "schedule.nu", nu,
                          "must be finite and >= 0");
        require_parameter(detail::is_finite(mu), "schedule.mu", mu,
                          "must be finite (build the schedule with make_exponential)");
        return;
      case schedule_kind::linear:
        positive(delta, "schedule.delta");
        require_parameter(detail::is_finite(ell) && ell >= 2.0, "schedule.ell", ell,
                          "must be finite and >= 2");
        positive(linear_scale, "schedule.linear_scale");
        return;
      case schedule_kind::custom:
        require_parameter(count >= 0, "schedule.count", static_cast<double>(count), "must be >= 0");
        require_parameter(count == 0 || values != nullptr, "schedule.values", 0.0,
                          "must not be null");
        for (index_t i = 0; i < count; ++i)
          if (!(detail::is_finite(values[i]) && values[i] > 0.0))
            throw_if_failed({status::invalid_parameter, i, -1, values[i]}, "schedule.values",
                            "each ω must be finite and > 0");
        return;
    }
    throw_if_failed({status::invalid_parameter, -1, -1, static_cast<double>(kind)}, "schedule.kind",
                    "unknown schedule kind");
  }
};

/// The ω-relaxed rule with ω taken from a schedule by draft position (depth + 1).
struct scheduled_relaxed_rule {
  relaxation_schedule schedule;
  resampling resample = resampling::optimal;

  /// The rule at depth d (draft position d + 1).
  [[nodiscard]] SPECULA_HOST_DEVICE relaxed_rule at(index_t depth) const noexcept {
    return relaxed_rule{schedule.omega(depth + 1), resample};
  }
  // The position-free form (used only where no depth is known) is the first position's rule.
  [[nodiscard]] SPECULA_HOST_DEVICE double accept_probability(double p, double q) const noexcept {
    return at(0).accept_probability(p, q);
  }
  [[nodiscard]] SPECULA_HOST_DEVICE double residual_weight(double p, double q) const noexcept {
    return at(0).residual_weight(p, q);
  }

  /// Checked entry points call this (see relaxation_schedule::validate).
  void validate(index_t /*vocab*/ = 0) const {
    schedule.validate();
    require_parameter(!detail::is_lantern_resampling(resample), "rule.resample",
                      static_cast<double>(resample), "a relaxed rule resamples from G* or G_van");
  }
};

static_assert(acceptance_rule<scheduled_relaxed_rule>);

}  // namespace specula
