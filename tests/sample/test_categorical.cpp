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

TEST_CASE("inverse CDF through a weight summary equals the walk from the total at every tile edge",
          "[sample]") {
  // The summary's walk reads its recorded tile sums eight at a time; the walk from the total
  // (no summary) adds the tiles one by one. Uniforms at, and one ulp either side of, every
  // running sum of whole tiles put the target on each batch's edges and inside each batch.
  for (const index_t n :
       {index_t{1}, index_t{255}, index_t{256}, index_t{2047}, index_t{2048}, index_t{2049},
        index_t{3 * 8 * 256 + 5}, index_t{(weight_summary::max_tiles + 9) * 256 + 77}}) {
    std::vector<double> row(static_cast<std::size_t>(n));
    std::uint32_t state = 12345u + static_cast<std::uint32_t>(n);
    for (std::size_t i = 0; i < row.size(); ++i) {
      state = state * 1664525u + 1013904223u;
      const double x = static_cast<double>(state >> 8) / 16777216.0;
      // Mostly positive; some zeros, negatives and NaN; whole zero tiles (equal running sums).
      const bool zero_tile = (i / 256) % 5 == 3;
      row[i] = zero_tile ? 0.0 : x < 0.1 ? 0.0 : x < 0.15 ? -x : x < 0.16 ? std::nan("") : x;
    }
    auto w = [&](index_t i) { return row[static_cast<std::size_t>(i)]; };
    weight_summary s;
    summarize_weights(n, w, s);
    INFO("n = " << n << ", recorded tiles " << s.recorded);
    std::vector<double> us = {0.0, 1e-300, 0.5, 1.0 - 1e-16};
    double edge = 0.0;
    for (index_t k = 0; k < s.recorded; ++k) {
      edge += s.tile_sum[k];
      const double u = edge / s.total;
      us.push_back(u);
      us.push_back(std::nextafter(u, 0.0));
      if (u < 1.0) us.push_back(std::nextafter(u, 1.0));
    }
    for (const double u : us) {
      INFO("u = " << u);
      CHECK(sample_inverse_cdf(n, w, s, u) == sample_inverse_cdf(n, w, s.total, u));
    }
    // A total above the tiles' sum (rounding): both walks end at the last positive index.
    weight_summary over = s;
    over.total = s.total * (1.0 + 1e-9);
    for (const double u : {1.0 - 1e-16, 0.999999999999})
      CHECK(sample_inverse_cdf(n, w, over, u) == sample_inverse_cdf(n, w, over.total, u));
  }
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

TEST_CASE("ordered_sum adds signed weights in positive_mass's order", "[sample]") {
  for (index_t n : {0, 1, 9, 256, 257, 3000}) {
    std::vector<double> w;
    for (index_t i = 0; i < n; ++i)
      w.push_back(
          2.0 * uniform_at(request_rng{81, 0, 0}, draw_id{static_cast<std::uint32_t>(i), 0}) - 1.0);
    // The order written out: lane k of each 256-weight tile adds weights k, k + 8, ... in order,
    // the lanes combine as ((0+1)+(2+3))+((4+5)+(6+7)), the tiles add up left to right.
    double want = 0.0;
    for (index_t t = 0; t < n; t += 256) {
      double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (index_t i = t; i < n && i < t + 256; ++i)
        lane[(i - t) % 8] += w[static_cast<std::size_t>(i)];
      want +=
          ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    }
    auto at = [&](index_t i) { return w[static_cast<std::size_t>(i)]; };
    INFO("n " << n);
    CHECK(ordered_sum(n, at) == want);
    // Non-negative weights: the positive mass, bit for bit.
    auto magnitude = [&](index_t i) { return std::abs(w[static_cast<std::size_t>(i)]); };
    CHECK(ordered_sum(n, magnitude) == positive_mass(n, magnitude));
  }
}
