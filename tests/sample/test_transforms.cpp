// Logit/probability row transforms against direct double-precision computations.

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "specula/sample/transforms.hpp"

using namespace specula;

namespace {
const float neg_inf = -std::numeric_limits<float>::infinity();

std::vector<double> softmax_ref(const std::vector<float>& x) {
  double m = -1e300;
  for (float v : x) m = std::max(m, static_cast<double>(v));
  std::vector<double> out;
  double s = 0;
  for (float v : x) {
    out.push_back(std::exp(static_cast<double>(v) - m));
    s += out.back();
  }
  for (double& v : out) v /= s;
  return out;
}
}  // namespace

TEST_CASE("softmax matches a double reference and maps -inf to 0", "[sample]") {
  const std::vector<float> logits = {1.0f, 2.5f, neg_inf, -3.0f, 1000.0f, 999.0f};
  std::vector<float> probs(logits.size());
  softmax(logits, probs);
  const auto ref = softmax_ref(logits);
  for (std::size_t i = 0; i < ref.size(); ++i) CHECK(probs[i] == Approx(ref[i]).margin(1e-7));
  CHECK(probs[2] == 0.0f);
}

TEST_CASE("softmax rejects NaN, +inf and all-masked rows", "[sample][bad_input]") {
  std::vector<float> out(2);
  std::vector<float> nan = {0.0f, std::numeric_limits<float>::quiet_NaN()};
  CHECK_THROWS_WITH(softmax(nan, out), Catch::Contains("logits[column 1]: NaN entry"));
  std::vector<float> inf = {-neg_inf, 0.0f};
  CHECK_THROWS_WITH(softmax(inf, out), Catch::Contains("infinite"));
  std::vector<float> masked = {neg_inf, neg_inf};
  CHECK_THROWS_WITH(softmax(masked, out), Catch::Contains("no positive mass"));
  std::vector<float> short_out(1);
  CHECK_THROWS_AS(softmax(masked, short_out), invalid_input);
}

TEST_CASE("temperature divides logits", "[sample]") {
  std::vector<float> x = {1.0f, -2.0f};
  apply_temperature(x, 0.5f);
  CHECK(x[0] == 2.0f);
  CHECK(x[1] == -4.0f);
  CHECK_THROWS_WITH(apply_temperature(x, 0.0f), Catch::Contains("temperature"));
  CHECK_THROWS_AS(apply_temperature(x, -1.0f), invalid_input);
  CHECK_THROWS_AS(apply_temperature(x, std::numeric_limits<float>::quiet_NaN()), invalid_input);
}

TEST_CASE("top-k keeps the k largest logits, ties at the threshold included", "[sample]") {
  std::vector<float> scratch(8);
  std::vector<float> x = {0.5f, 3.0f, 1.0f, 2.0f, 2.0f, -1.0f};
  top_k_filter(x, 3, scratch);
  CHECK(x == std::vector<float>{neg_inf, 3.0f, neg_inf, 2.0f, 2.0f, neg_inf});
  std::vector<float> y = {0.5f, 3.0f, 1.0f};
  top_k_filter(y, 2, scratch);
  CHECK(y == std::vector<float>{neg_inf, 3.0f, 1.0f});
  std::vector<float> z = {1.0f, 2.0f};
  top_k_filter(z, 5, scratch);  // k >= V: unchanged
  CHECK(z == std::vector<float>{1.0f, 2.0f});
  CHECK_THROWS_AS(top_k_filter(z, 0, scratch), invalid_input);
  std::vector<float> small(1);
  std::vector<float> w = {1.0f, 2.0f, 3.0f};
  CHECK_THROWS_WITH(top_k_filter(w, 1, small), Catch::Contains("scratch"));
}

TEST_CASE("top-p keeps the smallest high-probability set reaching the mass", "[sample]") {
  std::vector<float> scratch(8);
  std::vector<float> p = {0.1f, 0.4f, 0.3f, 0.2f};
  top_p_filter(p, 0.65f, scratch);  // 0.4 + 0.3 = 0.7 >= 0.65
  CHECK(p[0] == 0.0f);
  CHECK(p[3] == 0.0f);
  CHECK(p[1] == Approx(0.4 / 0.7));
  CHECK(p[2] == Approx(0.3 / 0.7));
  std::vector<float> q = {0.1f, 0.4f, 0.3f, 0.2f};
  top_p_filter(q, 1.0f, scratch);
  CHECK(q == std::vector<float>{0.1f, 0.4f, 0.3f, 0.2f});
  CHECK_THROWS_AS(top_p_filter(q, 0.0f, scratch), invalid_input);
  CHECK_THROWS_AS(top_p_filter(q, 1.5f, scratch), invalid_input);
}

TEST_CASE("min-p drops tokens below min_p * max", "[sample]") {
  std::vector<float> p = {0.05f, 0.5f, 0.3f, 0.15f};
  min_p_filter(p, 0.4f);  // threshold 0.2
  CHECK(p[0] == 0.0f);
  CHECK(p[3] == 0.0f);
  CHECK(p[1] == Approx(0.5 / 0.8));
  CHECK_THROWS_AS(min_p_filter(p, -0.1f), invalid_input);
}

TEST_CASE("classifier-free guidance mixes before top-k", "[sample]") {
  const std::vector<float> cond = {1.0f, 2.0f, 0.0f};
  const std::vector<float> uncond = {1.0f, 0.0f, 1.0f};
  std::vector<float> out(3);
  cfg_mix(cond, uncond, 3.0f, out);
  CHECK(out == std::vector<float>{1.0f, 6.0f, -2.0f});
  // Pipeline: CFG, temperature 2, top-k 2, softmax.
  std::vector<float> logits = cond, probs(3), scratch(3);
  sampling_params sp;
  sp.cfg_scale = 3.0f;
  sp.temperature = 2.0f;
  sp.top_k = 2;
  logits_to_probs(sp, logits, uncond, probs, scratch);
  const auto ref = softmax_ref({0.5f, 3.0f, neg_inf});
  CHECK(probs[0] == Approx(ref[0]));
  CHECK(probs[1] == Approx(ref[1]));
  CHECK(probs[2] == 0.0f);
  std::vector<float> bad_uncond(2);
  CHECK_THROWS_WITH(cfg_mix(cond, bad_uncond, 1.0f, out), Catch::Contains("uncond"));
  sp.top_p = 0.0f;
  CHECK_THROWS_WITH(logits_to_probs(sp, logits, uncond, probs, scratch), Catch::Contains("top_p"));
}
