// The documented way for users to prove their own verifier lossless (docs/testing.md pulls
// this file): write the verifier against the random_source interface, then let the testing
// kit enumerate its randomness.

#include <catch2/catch.hpp>
#include <vector>

#include "specula/testing/catch2.hpp"

//! [user_verifier]
// A user's single-position verifier: the draft x was sampled from q; accept it with
// min(1, p(x)/q(x)), otherwise sample the residual max(p - q, 0).
template <class Source>
specula::index_t my_verify(Source& src, const std::vector<double>& p, const std::vector<double>& q,
                           specula::index_t x) {
  const double a = q[x] > 0 ? std::min(1.0, p[x] / q[x]) : 1.0;
  if (src.bernoulli(a, specula::draw_id{0, 0})) return x;
  auto residual = [&](specula::index_t y) { return std::max(p[y] - q[y], 0.0); };
  double mass = 0;
  for (std::size_t y = 0; y < p.size(); ++y) mass += residual(static_cast<specula::index_t>(y));
  return src.categorical(static_cast<specula::index_t>(p.size()), residual, mass,
                         specula::draw_id{0, 1});
}

TEST_CASE("my verifier is lossless") {
  const std::vector<double> p = {0.1, 0.6, 0.3, 0.0};
  const std::vector<double> q = {0.4, 0.2, 0.2, 0.2};
  SPECULA_REQUIRE_LOSSLESS(p, [&](auto& src) {
    // The draft itself is part of the randomness: sample it through the source too.
    auto qw = [&](specula::index_t y) { return q[static_cast<std::size_t>(y)]; };
    const auto x = src.categorical(4, qw, 1.0, specula::draw_id{9, 0});
    return my_verify(src, p, q, x);
  });
}
//! [user_verifier]

TEST_CASE("the helper catches a verifier that resamples from p", "[stats][testing]") {
  const std::vector<double> p = {0.1, 0.6, 0.3, 0.0};
  const std::vector<double> q = {0.4, 0.2, 0.2, 0.2};
  const auto report = specula::testing::check_lossless(p, [&](auto& src) {
    auto qw = [&](specula::index_t y) { return q[static_cast<std::size_t>(y)]; };
    const auto x = src.categorical(4, qw, 1.0, specula::draw_id{9, 0});
    const double a = std::min(1.0, p[static_cast<std::size_t>(x)] / q[static_cast<std::size_t>(x)]);
    if (src.bernoulli(a, specula::draw_id{0, 0})) return x;
    auto wrong = [&](specula::index_t y) { return p[static_cast<std::size_t>(y)]; };
    return src.categorical(4, wrong, 1.0, specula::draw_id{0, 1});
  });
  INFO(report.describe());
  CHECK(report.max_abs_error > 0.05);
}
