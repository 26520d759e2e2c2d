// The exact rule's scalar maths.

#include <catch2/catch.hpp>

#include "specula/rules/exact.hpp"

using namespace specula;

TEST_CASE("exact rule: acceptance min(1, p/q), residual [p - q]+, 0/0 = 1", "[verify][rules]") {
  constexpr exact_rule r;
  static_assert(r.accept_probability(0.2, 0.4) == 0.5);
  static_assert(r.accept_probability(0.4, 0.2) == 1.0);
  static_assert(r.accept_probability(0.0, 0.0) == 1.0);  // convention 0/0 = 1
  static_assert(r.accept_probability(0.3, 0.0) == 1.0);
  static_assert(r.accept_probability(0.0, 0.3) == 0.0);
  CHECK(r.residual_weight(0.5, 0.2) == Approx(0.3));
  CHECK(r.residual_weight(0.2, 0.5) == 0.0);
  CHECK(r.residual_weight(0.2, 0.2) == 0.0);
  // Rejection mass equals residual mass when both rows sum to 1: sum q(1 - a) = sum [p - q]+.
  const double p[] = {0.1, 0.6, 0.3};
  const double q[] = {0.5, 0.2, 0.3};
  double reject = 0, residual = 0;
  for (int i = 0; i < 3; ++i) {
    reject += q[i] * (1 - r.accept_probability(p[i], q[i]));
    residual += r.residual_weight(p[i], q[i]);
  }
  CHECK(reject == Approx(residual));
  // rule_at leaves a rule without a schedule unchanged.
  static_assert(std::is_same_v<decltype(rule_at(r, 3)), exact_rule>);
}
