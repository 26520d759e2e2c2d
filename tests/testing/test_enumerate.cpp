// The enumerating source reproduces the production source's decision measures.

#include <catch2/catch.hpp>
#include <map>
#include <vector>

#include "specula/sample/random_source.hpp"
#include "specula/testing/enumerate.hpp"

using namespace specula;

namespace {
/// Measure of u in (0, 1) for which the production inverse-CDF sampler returns each index,
/// estimated on a fine midpoint grid of u (independent of the enumerator's arithmetic).
std::map<index_t, double> grid_measure(const std::vector<double>& w, double total) {
  std::map<index_t, double> m;
  const int n = 1 << 20;
  auto wf = [&](index_t i) { return w[static_cast<std::size_t>(i)]; };
  for (int k = 0; k < n; ++k) {
    const double u = (k + 0.5) / n;
    m[sample_inverse_cdf(static_cast<index_t>(w.size()), wf, total, u)] += 1.0 / n;
  }
  return m;
}
}  // namespace

TEST_CASE("bernoulli decisions are enumerated with clamp(prob, 0, 1)", "[stats][testing]") {
  auto law = testing::enumerate_outcomes<int>(
      [](auto& src) { return src.bernoulli(0.3, draw_id{}) ? 1 : 0; });
  CHECK(law[1] == Approx(0.3).epsilon(1e-15));
  CHECK(law[0] == Approx(0.7).epsilon(1e-15));
  auto sure = testing::enumerate_outcomes<int>(
      [](auto& src) { return src.bernoulli(1.7, draw_id{}) ? 1 : 0; });
  CHECK(sure.size() == 1);
  CHECK(sure[1] == 1.0);
}

TEST_CASE("categorical decisions match the production sampler's u-measure", "[stats][testing]") {
  const std::vector<std::vector<double>> rows = {
      {1, 2, 0, 3}, {0, 0, 5}, {0.25, 0.25, 0.5}, {1, 1, 1, 1, 1, 1, 1}};
  for (const auto& w : rows) {
    double sum = 0;
    for (double v : w) sum += v;
    // The correct total, a total that is too small, and one that is too large.
    for (double total : {sum, 0.8 * sum, 1.25 * sum}) {
      auto wf = [&](index_t i) { return w[static_cast<std::size_t>(i)]; };
      auto law = testing::enumerate_outcomes<index_t>([&](auto& src) {
        return src.categorical(static_cast<index_t>(w.size()), wf, total, draw_id{});
      });
      const auto grid = grid_measure(w, total);
      INFO("total " << total);
      for (const auto& [i, m] : grid) CHECK(law[i] == Approx(m).margin(2e-6));
      double s = 0;
      for (const auto& [i, m] : law) s += m;
      CHECK(s == Approx(1.0).epsilon(1e-14));
    }
  }
  auto none = testing::enumerate_outcomes<index_t>([](auto& src) {
    return src.categorical(
        3, [](index_t) { return 0.0; }, 0.0, draw_id{});
  });
  CHECK(none[-1] == 1.0);
}

TEST_CASE("nested decisions multiply and every path is visited once", "[stats][testing]") {
  // Two coin flips with p = 0.25, then a categorical over 3 equal weights if both were heads.
  auto law = testing::enumerate_outcomes<int>([](auto& src) {
    const bool a = src.bernoulli(0.25, draw_id{0, 0});
    const bool b = src.bernoulli(0.25, draw_id{1, 0});
    if (a && b)
      return 10 + static_cast<int>(src.categorical(
                      3, [](index_t) { return 1.0; }, 3.0, draw_id{2, 0}));
    return (a ? 2 : 0) + (b ? 1 : 0);
  });
  CHECK(law[0] == Approx(0.5625));
  CHECK(law[1] == Approx(0.1875));
  CHECK(law[2] == Approx(0.1875));
  CHECK(law[10] == Approx(0.0625 / 3));
  CHECK(law[12] == Approx(0.0625 / 3));
  CHECK(law.size() == 6);
}

TEST_CASE("a nondeterministic experiment is reported", "[stats][testing]") {
  int calls = 0;
  CHECK_THROWS_AS(
      testing::enumerate_outcomes<int>([&](auto& src) {
        ++calls;
        // Offers a different number of outcomes on replay.
        return static_cast<int>(src.categorical(
            calls == 1 ? 2 : 3, [](index_t) { return 1.0; }, calls == 1 ? 2.0 : 3.0, draw_id{}));
      }),
      std::logic_error);
}
