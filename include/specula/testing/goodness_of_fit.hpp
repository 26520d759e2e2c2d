#pragma once

/// @file
/// Goodness-of-fit tests of observed counts against an exact law: G-test and Pearson's
/// chi-square, with p-values from Boost.Math's chi-squared distribution; total variation
/// distance; empirical laws.
///
/// Bins whose expected count is below `min_expected` are pooled into one bin (and that pool is
/// merged into the smallest regular bin if it is still too small), the usual validity condition
/// for both tests. An observation in a bin of expected probability 0 is proof that the sampler
/// is wrong: the result then has p_value = 0 and `impossible_observations` > 0.

#include <algorithm>
#include <boost/math/distributions/chi_squared.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <ostream>
#include <span>
#include <stdexcept>
#include <vector>

#include "specula/core/types.hpp"

namespace specula::testing {

/// Result of a goodness-of-fit test.
struct gof_result {
  double statistic = 0.0;                     ///< G or chi-square statistic
  double degrees_of_freedom = 0.0;            ///< bins used - 1
  double p_value = 1.0;                       ///< upper tail probability
  index_t bins = 0;                           ///< bins after pooling
  std::uint64_t samples = 0;                  ///< total observations
  std::uint64_t impossible_observations = 0;  ///< observations where the law has probability 0
};

inline std::ostream& operator<<(std::ostream& os, const gof_result& r) {
  return os << "statistic=" << r.statistic << " dof=" << r.degrees_of_freedom
            << " p_value=" << r.p_value << " bins=" << r.bins << " samples=" << r.samples
            << " impossible=" << r.impossible_observations;
}

namespace detail {

struct pooled_bins {
  std::vector<double> observed;
  std::vector<double> expected;
  std::uint64_t samples = 0;
  std::uint64_t impossible = 0;
};

inline pooled_bins pool(std::span<const std::uint64_t> observed, std::span<const double> law,
                        double min_expected) {
  if (observed.size() != law.size())
    throw std::invalid_argument("specula::testing: observed and law sizes differ");
  pooled_bins b;
  b.samples = std::accumulate(observed.begin(), observed.end(), std::uint64_t{0});
  double law_sum = 0.0;
  for (double p : law) {
    if (!(p >= 0.0)) throw std::invalid_argument("specula::testing: negative or NaN law entry");
    law_sum += p;
  }
  if (std::abs(law_sum - 1.0) > 1e-9)
    throw std::invalid_argument("specula::testing: law does not sum to 1");
  const auto n = static_cast<double>(b.samples);
  double pool_obs = 0.0;
  double pool_exp = 0.0;
  for (std::size_t i = 0; i < law.size(); ++i) {
    const double e = law[i] * n;
    const auto o = static_cast<double>(observed[i]);
    if (law[i] == 0.0) {
      b.impossible += observed[i];
      continue;
    }
    if (e < min_expected) {
      pool_obs += o;
      pool_exp += e;
    } else {
      b.observed.push_back(o);
      b.expected.push_back(e);
    }
  }
  if (pool_exp > 0.0) {
    if (pool_exp >= min_expected || b.expected.empty()) {
      b.observed.push_back(pool_obs);
      b.expected.push_back(pool_exp);
    } else {
      const auto k = static_cast<std::size_t>(
          std::min_element(b.expected.begin(), b.expected.end()) - b.expected.begin());
      b.observed[k] += pool_obs;
      b.expected[k] += pool_exp;
    }
  }
  return b;
}

inline gof_result finish(const pooled_bins& b, double statistic) {
  gof_result r;
  r.statistic = statistic;
  r.bins = static_cast<index_t>(b.expected.size());
  r.samples = b.samples;
  r.impossible_observations = b.impossible;
  r.degrees_of_freedom = static_cast<double>(std::max<index_t>(r.bins - 1, 0));
  if (b.impossible > 0) {
    r.p_value = 0.0;
  } else if (r.degrees_of_freedom < 1.0) {
    r.p_value = 1.0;
  } else {
    const boost::math::chi_squared_distribution<double> dist(r.degrees_of_freedom);
    r.p_value = boost::math::cdf(boost::math::complement(dist, statistic));
  }
  return r;
}

}  // namespace detail

/// G-test (likelihood-ratio test): G = 2 sum o ln(o / e).
inline gof_result g_test(std::span<const std::uint64_t> observed, std::span<const double> law,
                         double min_expected = 5.0) {
  const auto b = detail::pool(observed, law, min_expected);
  double g = 0.0;
  for (std::size_t i = 0; i < b.expected.size(); ++i)
    if (b.observed[i] > 0.0) g += b.observed[i] * std::log(b.observed[i] / b.expected[i]);
  return detail::finish(b, 2.0 * g);
}

/// Pearson's chi-square test: X^2 = sum (o - e)^2 / e.
inline gof_result chi_square_test(std::span<const std::uint64_t> observed,
                                  std::span<const double> law, double min_expected = 5.0) {
  const auto b = detail::pool(observed, law, min_expected);
  double x2 = 0.0;
  for (std::size_t i = 0; i < b.expected.size(); ++i) {
    const double d = b.observed[i] - b.expected[i];
    x2 += d * d / b.expected[i];
  }
  return detail::finish(b, x2);
}

/// Total variation distance: (1/2) sum |a - b|.
inline double total_variation(std::span<const double> a, std::span<const double> b) {
  if (a.size() != b.size())
    throw std::invalid_argument("specula::testing: total_variation of different sizes");
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += std::abs(a[i] - b[i]);
  return 0.5 * s;
}

/// Largest |a - b| over entries.
inline double max_abs_difference(std::span<const double> a, std::span<const double> b) {
  if (a.size() != b.size())
    throw std::invalid_argument("specula::testing: max_abs_difference of different sizes");
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

/// Counts normalised to frequencies.
inline std::vector<double> empirical_law(std::span<const std::uint64_t> counts) {
  const auto n =
      static_cast<double>(std::accumulate(counts.begin(), counts.end(), std::uint64_t{0}));
  std::vector<double> law(counts.size(), 0.0);
  if (n > 0)
    for (std::size_t i = 0; i < counts.size(); ++i) law[i] = static_cast<double>(counts[i]) / n;
  return law;
}

}  // namespace specula::testing
