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

namespace {
// The mistake the kit exists to catch: one draw point used for the draft, the acceptance test
// and the residual sample, so the three decisions share one uniform.
template <class Source>
specula::index_t reusing_verify(Source& src, const std::vector<double>& p,
                                const std::vector<double>& q) {
  const specula::draw_id same{0, 0};
  auto qw = [&](specula::index_t y) { return q[static_cast<std::size_t>(y)]; };
  const auto x = src.categorical(4, qw, 1.0, same);
  const auto xs = static_cast<std::size_t>(x);
  const double a = q[xs] > 0 ? std::min(1.0, p[xs] / q[xs]) : 1.0;
  if (src.bernoulli(a, same)) return x;
  auto residual = [&](specula::index_t y) {
    return std::max(p[static_cast<std::size_t>(y)] - q[static_cast<std::size_t>(y)], 0.0);
  };
  return src.categorical(4, residual, 0.5, same);  // the residual's mass is 0.5 here
}
}  // namespace

TEST_CASE("the kit catches a verifier that reuses a draw point", "[stats][testing]") {
  const std::vector<double> p = {0.1, 0.6, 0.3, 0.0};
  const std::vector<double> q = {0.4, 0.2, 0.2, 0.2};
  // Its law with one shared uniform u, by hand: the draft is 0 on u < .4, 1 on [.4, .6),
  // 2 on [.6, .8), 3 on [.8, 1); draft 0 is accepted on u < .25, drafts 1 and 2 always, 3 never;
  // the residual (0, .4, .1, 0) / .5 at the same u gives 1 on u < .8 and 2 above. So:
  // P(0) = .25, P(1) = .15 + .2 = .35, P(2) = .2 + .2 = .4, P(3) = 0.
  const std::vector<double> by_hand = {0.25, 0.35, 0.40, 0.0};
  const auto report =
      specula::testing::check_lossless(p, [&](auto& src) { return reusing_verify(src, p, q); });
  INFO(report.describe());
  CHECK(report.max_abs_error > 0.1);
  for (std::size_t y = 0; y < 4; ++y) CHECK(report.law[y] == Approx(by_hand[y]).margin(1e-12));

  // The production source gives that law, not p (G-tests, 200 000 runs).
  std::vector<std::uint64_t> counts(4, 0);
  for (std::uint32_t r = 0; r < 200'000; ++r) {
    specula::philox_source src{specula::request_rng{7, r, 0}};
    ++counts[static_cast<std::size_t>(reusing_verify(src, p, q))];
  }
  SPECULA_REQUIRE_FITS(counts, by_hand, 1e-4);
  SPECULA_REQUIRE_MISFITS(counts, p, 1e-9);

  // Reuse is visible, and independent streams are not reuse.
  std::uint64_t reused = 0;
  (void)specula::testing::enumerate_outcomes<specula::index_t>([&](auto& src) {
    const auto y = reusing_verify(src, p, q);
    reused = src.reused_draws();
    return y;
  });
  CHECK(reused > 0);
  const auto two_streams = specula::testing::enumerate_outcomes<int>([&](auto& src) {
    auto other = src.stream(1);
    return (src.bernoulli(0.5, specula::draw_id{}) ? 2 : 0) +
           (other.bernoulli(0.5, specula::draw_id{}) ? 1 : 0);
  });
  for (int v = 0; v < 4; ++v) CHECK(two_streams.at(v) == Approx(0.25).epsilon(1e-15));
}

TEST_CASE("decisions at one draw point see one uniform", "[stats][testing]") {
  // u < .3 and then u < .5 at the same point: (true, true) .3, (false, true) .2, (false,
  // false) .5, never (true, false).
  const auto law = specula::testing::enumerate_outcomes<int>([](auto& src) {
    const bool a = src.bernoulli(0.3, specula::draw_id{2, 5});
    const bool b = src.bernoulli(0.5, specula::draw_id{2, 5});
    return (a ? 2 : 0) + (b ? 1 : 0);
  });
  CHECK(law.size() == 3);
  CHECK(law.at(3) == Approx(0.3).epsilon(1e-15));
  CHECK(law.at(1) == Approx(0.2).epsilon(1e-14));
  CHECK(law.at(0) == Approx(0.5).epsilon(1e-15));
}
