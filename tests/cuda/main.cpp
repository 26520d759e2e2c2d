// Catch2 main of the device tests. Test cases that need a GPU carry the [device] tag. Without a
// GPU, a run whose selected test cases are all [device] cases (as every per-case ctest entry of
// a device case is) prints why and exits with specula_test_skip_code, which ctest reports as
// skipped (SKIP_RETURN_CODE, tests/CMakeLists.txt) instead of passed. A run that selects host
// cases too runs them; its device cases return early with a warning.

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <iostream>
#include <string>
#include <vector>

#include "specula/cuda/error.cuh"

namespace {

/// Exit status of a run that was skipped because it needs a GPU (the automake convention).
constexpr int specula_test_skip_code = 77;

bool needs_device(const Catch::TestCase& tc) {
  for (const std::string& tag : tc.tags)
    if (tag == "device") return true;
  return false;
}

}  // namespace

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  const Catch::ConfigData& data = session.configData();
  const bool listing = data.listTests || data.listTags || data.listReporters ||
                       data.listTestNamesOnly || data.showHelp;
  if (!listing && specula::cuda::device_count() == 0) {
    Catch::Config& config = session.config();
    const std::vector<Catch::TestCase> selected =
        Catch::filterTests(Catch::getAllTestCasesSorted(config), config.testSpec(), config);
    bool all_device = !selected.empty();
    for (const Catch::TestCase& tc : selected) all_device = all_device && needs_device(tc);
    if (all_device) {
      std::cout << "no CUDA device: " << selected.size()
                << " device test case(s) skipped (compiled only)\n";
      return specula_test_skip_code;
    }
  }
  return session.run();
}
