// Catch2 main of the host tests. Test cases tagged [isa_<set>] (tests/isa_cases.hpp) force an
// instruction set of core/simd.hpp; on a CPU without it, a run whose selected test cases all
// need such a set (as every per-case ctest entry of one does) exits 77 (tests/skip_main.hpp),
// which ctest reports as skipped instead of passed.

#define CATCH_CONFIG_RUNNER
#include <string>

#include "skip_main.hpp"
#include "specula/core/simd.hpp"

namespace {

/// Whether the test case needs an instruction set that this build or CPU lacks.
bool needs_missing_isa(const Catch::TestCase& tc) {
  using specula::simd::isa;
  for (const std::string& tag : tc.tags)
    for (isa i : {isa::scalar, isa::sse2, isa::avx2, isa::avx512})
      if (tag == std::string("isa_") + specula::simd::name(i) &&
          static_cast<int>(i) > static_cast<int>(specula::simd::supported_isa()))
        return true;
  return false;
}

}  // namespace

int main(int argc, char* argv[]) {
  return specula_test::run_or_skip(argc, argv, needs_missing_isa, [](std::size_t count) {
    return "instruction set not supported by this CPU (widest: " +
           std::string(specula::simd::name(specula::simd::supported_isa())) +
           "): " + std::to_string(count) + " test case(s) skipped";
  });
}
