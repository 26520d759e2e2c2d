// Sampling from unnormalised weights: inverse CDF (exact interval law), exponential race
// (G-test), and a negative control.

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "specula/core/rng.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/sample/random_source.hpp"
#include "specula/testing/goodness_of_fit.hpp"

using namespace specula;

namespace {
const std::vector<double> weights = {0.0, 3.0, 1.0, 0.0, 4.0, 2.0, 0.0, 0.5};
const double total = 10.5;
std::vector<double> law() {
  std::vector<double> l;
  for (double w : weights) l.push_back(w / total);
  return l;
}
}  // namespace

TEST_CASE("inverse CDF returns the category whose interval contains u * total", "[sample]") {
  auto w = [](index_t i) { return weights[static_cast<std::size_t>(i)]; };
  const auto n = static_cast<index_t>(weights.size());
  // Interval boundaries (cumulative sums / total): 3/10.5, 4/10.5, 8/10.5, 10/10.5, 1.
  CHECK(sample_inverse_cdf(n, w, total, 1e-12) == 1);
  CHECK(sample_inverse_cdf(n, w, total, 2.999 / total) == 1);
  CHECK(sample_inverse_cdf(n, w, total, 3.001 / total) == 2);
  CHECK(sample_inverse_cdf(n, w, total, 7.999 / total) == 4);
  CHECK(sample_inverse_cdf(n, w, total, 8.001 / total) == 5);
  CHECK(sample_inverse_cdf(n, w, total, 10.001 / total) == 7);
  CHECK(sample_inverse_cdf(n, w, total, 1.0 - 1e-16) == 7);
  // A total larger than the sum (rounding): the last positive index absorbs the excess.
  CHECK(sample_inverse_cdf(n, w, total * 1.01, 0.999) == 7);
  // No mass: -1.
  auto zero = [](index_t) { return 0.0; };
  CHECK(sample_inverse_cdf(4, zero, 0.0, 0.5) == -1);
  // Row overload.
  const std::vector<float> row = {0.0f, 1.0f, 0.0f};
  CHECK(sample_inverse_cdf(row_view<const float>(row), 0.999) == 1);
  CHECK(positive_mass(n, w) == total);
}

TEST_CASE("inverse CDF with Philox uniforms fits the weight law (G-test)", "[sample][stats]") {
  auto w = [](index_t i) { return weights[static_cast<std::size_t>(i)]; };
  std::vector<std::uint64_t> counts(weights.size(), 0);
  for (std::uint32_t i = 0; i < 200000; ++i) {
    philox_source src{request_rng{77, i, 0}};
    ++counts[static_cast<std::size_t>(src.categorical(8, w, total, draw_id{0, 1}))];
  }
  const auto r = testing::g_test(counts, law());
  INFO(r);
  CHECK(r.p_value > 1e-4);
  CHECK(r.impossible_observations == 0);
}

TEST_CASE("exponential race fits the weight law (G-test) and a biased race does not",
          "[sample][stats]") {
  auto w = [](index_t i) { return weights[static_cast<std::size_t>(i)]; };
  std::vector<std::uint64_t> counts(weights.size(), 0);
  std::vector<std::uint64_t> biased(weights.size(), 0);
  for (std::uint32_t i = 0; i < 200000; ++i) {
    const request_rng rng{5, i, 1};
    ++counts[static_cast<std::size_t>(sample_exponential_race(8, w, rng, 3))];
    // Negative control: the race with squared weights (a classic "temperature" slip).
    auto w2 = [&](index_t k) { return w(k) * w(k); };
    ++biased[static_cast<std::size_t>(sample_exponential_race(8, w2, rng, 3))];
  }
  const auto good = testing::g_test(counts, law());
  const auto bad = testing::g_test(biased, law());
  INFO(good << "\n" << bad);
  CHECK(good.p_value > 1e-4);
  CHECK(bad.p_value < 1e-4);
  auto zero = [](index_t) { return 0.0; };
  CHECK(sample_exponential_race(5, zero, request_rng{}, 0) == -1);
}
