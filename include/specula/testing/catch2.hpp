#pragma once

/// @file
/// Catch2 (v2) helpers for proving a verifier lossless in a few lines.
///
/// Example (compiled and run by the test suite):
/// @snippet testing/test_user_verifier_example.cpp user_verifier
///
/// `my_verify` draws through the random_source interface (specula/sample/random_source.hpp):
/// the helper enumerates its randomness and compares its exact output law with p.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "specula/testing/enumerate.hpp"
#include "specula/testing/goodness_of_fit.hpp"

namespace specula::testing {

/// Comparison of an experiment's exact output law with a target law.
struct lossless_report {
  std::vector<double> law;     ///< the experiment's exact output law
  double invalid_mass = 0.0;   ///< probability of outputs outside [0, vocab)
  double max_abs_error = 0.0;  ///< max |law - target| over tokens
  index_t worst_token = -1;    ///< argmax of |law - target|

  [[nodiscard]] std::string describe() const {
    std::ostringstream os;
    os.precision(17);
    os << "max |law - target| = " << max_abs_error << " at token " << worst_token
       << ", invalid mass = " << invalid_mass << "\nlaw:";
    for (double v : law) os << ' ' << v;
    return os.str();
  }
};

/// Enumerates `experiment` (a callable taking an enumerating_source& and returning a token) and
/// compares its output law with `target`.
template <class Experiment>
lossless_report check_lossless(std::span<const double> target, Experiment&& experiment) {
  const auto law = enumerate_token_law(static_cast<index_t>(target.size()), experiment);
  lossless_report r{law.probability, law.invalid_mass, 0.0, -1};
  for (std::size_t i = 0; i < target.size(); ++i) {
    const double e = std::abs(law.probability[i] - target[i]);
    if (e > r.max_abs_error || r.worst_token < 0) {
      r.max_abs_error = e;
      r.worst_token = static_cast<index_t>(i);
    }
  }
  return r;
}

}  // namespace specula::testing

/// REQUIREs that the experiment's exact output law equals `target` within `tolerance`.
#define SPECULA_REQUIRE_LOSSLESS_TOL(target, experiment, tolerance)                          \
  do {                                                                                       \
    const auto specula_report_ = ::specula::testing::check_lossless((target), (experiment)); \
    INFO(specula_report_.describe());                                                        \
    REQUIRE(specula_report_.invalid_mass <= (tolerance));                                    \
    REQUIRE(specula_report_.max_abs_error <= (tolerance));                                   \
  } while (false)

/// REQUIREs that the experiment's exact output law equals `target` to 1e-12.
#define SPECULA_REQUIRE_LOSSLESS(target, experiment) \
  SPECULA_REQUIRE_LOSSLESS_TOL(target, experiment, 1e-12)

/// REQUIREs that observed counts fit the exact law: G-test p-value above `alpha`.
#define SPECULA_REQUIRE_FITS(counts, law, alpha)                           \
  do {                                                                     \
    const auto specula_gof_ = ::specula::testing::g_test((counts), (law)); \
    INFO("G-test: " << specula_gof_);                                      \
    REQUIRE(specula_gof_.p_value > (alpha));                               \
  } while (false)

/// REQUIREs that observed counts do NOT fit the law (p-value below `alpha`): for negative
/// controls, proving that a test can fail.
#define SPECULA_REQUIRE_MISFITS(counts, law, alpha)                        \
  do {                                                                     \
    const auto specula_gof_ = ::specula::testing::g_test((counts), (law)); \
    INFO("G-test: " << specula_gof_);                                      \
    REQUIRE(specula_gof_.p_value < (alpha));                               \
  } while (false)
