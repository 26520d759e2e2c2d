// Conan test_package (with_testing=True): the testing kit compiles against Boost.Math.
#include <specula/testing/goodness_of_fit.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

int main() {
  const std::vector<std::uint64_t> observed{250, 250, 250, 250};
  const std::vector<double> law{0.25, 0.25, 0.25, 0.25};
  const auto r = specula::testing::chi_square_test(observed, law);
  std::printf("specula::testing chi_square_test p_value=%g\n", r.p_value);
  return r.p_value > 0.99 ? 0 : 1;
}
