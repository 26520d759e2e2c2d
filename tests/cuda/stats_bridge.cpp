// Goodness-of-fit for the device tests, compiled by the host compiler: Boost.Math's
// chi-squared distribution stays out of nvcc translation units (nvcc warns about its
// long double in device code).

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "specula/testing/goodness_of_fit.hpp"

namespace specula::cuda_test {

/// G-test p-value of counts against a law, with a printable summary.
double g_test_p_value(const std::vector<std::uint64_t>& counts, const std::vector<double>& law,
                      std::string& summary) {
  const auto r = testing::g_test(counts, law);
  std::ostringstream os;
  os << r;
  summary = os.str();
  return r.p_value;
}

}  // namespace specula::cuda_test
