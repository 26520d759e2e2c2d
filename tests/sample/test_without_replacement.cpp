// Sampling without replacement: exact law of the sequential sampler, G-test of the
// exponential-key sampler against the same law, and a negative control.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <map>
#include <vector>

#include "specula/sample/without_replacement.hpp"
#include "specula/testing/enumerate.hpp"
#include "specula/testing/goodness_of_fit.hpp"
#include "specula/testing/toy_models.hpp"

using namespace specula;

namespace {

/// Law of ordered k-tuples drawn one at a time with renormalisation (the definition):
/// P(c_1..c_k) = prod_j w(c_j) / (W - w(c_1) - ... - w(c_{j-1})).
std::map<std::vector<token_t>, double> ordered_law(const std::vector<double>& w, index_t k) {
  std::map<std::vector<token_t>, double> law;
  std::vector<token_t> t;
  auto drawn = [&](std::size_t i) {
    return std::find(t.begin(), t.end(), static_cast<token_t>(i)) != t.end();
  };
  std::function<void(double)> rec = [&](double prob) {
    // The remaining mass is summed afresh (subtracting drawn weights from the total would cancel
    // catastrophically when a tiny weight is all that is left).
    double left = 0;
    for (std::size_t i = 0; i < w.size(); ++i)
      if (!drawn(i)) left += w[i];
    if (static_cast<index_t>(t.size()) == k || left <= 0) {
      law[t] += prob;
      return;
    }
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (w[i] <= 0 || drawn(i)) continue;
      t.push_back(static_cast<token_t>(i));
      rec(prob * w[i] / left);
      t.pop_back();
    }
  };
  rec(1.0);
  return law;
}

}  // namespace

TEST_CASE("sequential sampling without replacement has the exact ordered law", "[sample][law]") {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const index_t vocab = 3 + static_cast<index_t>(seed % 4);
    const auto w = testing::random_probability_row(vocab, seed, 0, 0.25);
    for (index_t k = 1; k <= 3; ++k) {
      auto wf = [&](index_t i) { return w[static_cast<std::size_t>(i)]; };
      const auto got = testing::enumerate_outcomes<std::vector<token_t>>([&](auto& src) {
        std::vector<token_t> out(static_cast<std::size_t>(k));
        const index_t n =
            sample_without_replacement_sequential(src, vocab, wf, k, 0, 10, out.data());
        out.resize(static_cast<std::size_t>(n));
        return out;
      });
      const auto want = ordered_law(w, k);
      INFO("seed " << seed << " k " << k);
      REQUIRE(got.size() == want.size());
      for (const auto& [tuple, p] : want) CHECK(std::abs(got.at(tuple) - p) < 1e-12);
      // Inclusion law: P(i drawn) summed from the ordered law.
      std::vector<double> incl_got(static_cast<std::size_t>(vocab)), incl_want(incl_got);
      for (const auto& [tuple, p] : got)
        for (token_t x : tuple) incl_got[static_cast<std::size_t>(x)] += p;
      for (const auto& [tuple, p] : want)
        for (token_t x : tuple) incl_want[static_cast<std::size_t>(x)] += p;
      CHECK(testing::max_abs_difference(incl_got, incl_want) < 1e-12);
    }
  }
}

TEST_CASE("exponential-key sampling without replacement fits the ordered law (G-test)",
          "[sample][stats]") {
  const std::vector<double> w = {0.5, 0.0, 2.0, 1.0, 0.25, 1.25};
  const index_t k = 2;
  const auto law_map = ordered_law(w, k);
  std::vector<std::vector<token_t>> keys_of;
  std::vector<double> law;
  for (const auto& [t, p] : law_map) {
    keys_of.push_back(t);
    law.push_back(p);
  }
  auto index_of = [&](const std::vector<token_t>& t) {
    return static_cast<std::size_t>(std::find(keys_of.begin(), keys_of.end(), t) - keys_of.begin());
  };
  std::vector<std::uint64_t> counts(law.size(), 0), biased(law.size(), 0);
  auto wf = [&](index_t i) { return w[static_cast<std::size_t>(i)]; };
  auto w2 = [&](index_t i) {
    return w[static_cast<std::size_t>(i)] * w[static_cast<std::size_t>(i)];
  };
  for (std::uint32_t r = 0; r < 200000; ++r) {
    const request_rng rng{31, r, 0};
    token_t out[2];
    double keys[2];
    REQUIRE(sample_without_replacement_keys(6, wf, k, rng, 5, out, keys) == 2);
    CHECK(out[0] != out[1]);
    if (r < 1000) CHECK(out[0] == sample_exponential_race(6, wf, rng, 5));
    ++counts[index_of({out[0], out[1]})];
    // Negative control: keys computed from squared weights.
    sample_without_replacement_keys(6, w2, k, rng, 5, out, keys);
    const auto idx = index_of({out[0], out[1]});
    if (idx < biased.size()) ++biased[idx];
  }
  const auto good = testing::g_test(counts, law);
  const auto bad = testing::g_test(biased, law);
  INFO(good << "\n" << bad);
  CHECK(good.p_value > 1e-4);
  CHECK(bad.p_value < 1e-4);
}

TEST_CASE("exponential keys skip zero weights and stop at the positive count", "[sample]") {
  const std::vector<double> w = {0.0, 1.0, 0.0, 3.0};
  auto wf = [&](index_t i) { return w[static_cast<std::size_t>(i)]; };
  token_t out[4];
  double keys[4];
  const index_t n = sample_without_replacement_keys(4, wf, 4, request_rng{1, 2, 3}, 0, out, keys);
  REQUIRE(n == 2);
  CHECK(((out[0] == 1 && out[1] == 3) || (out[0] == 3 && out[1] == 1)));
  CHECK(keys[0] <= keys[1]);
  CHECK(sample_without_replacement_keys(4, wf, 0, request_rng{}, 0, out, keys) == 0);
}
