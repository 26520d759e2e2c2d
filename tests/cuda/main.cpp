// Catch2 main of the device tests. Test cases that need a GPU carry the [device] tag. Without a
// GPU, a run whose selected test cases are all [device] cases (as every per-case ctest entry of
// a device case is) prints why and exits 77 (tests/skip_main.hpp), which ctest reports as
// skipped (SKIP_RETURN_CODE, tests/CMakeLists.txt) instead of passed. A run that selects host
// cases too runs them; its device cases return early with a warning.

#define CATCH_CONFIG_RUNNER
#include <string>

#include "../skip_main.hpp"
#include "specula/cuda/error.cuh"

namespace {

bool needs_device(const Catch::TestCase& tc) {
  for (const std::string& tag : tc.tags)
    if (tag == "device") return true;
  return false;
}

}  // namespace

int main(int argc, char* argv[]) {
  return specula_test::run_or_skip(
      argc, argv,
      [](const Catch::TestCase& tc) {
        static const bool no_device = specula::cuda::device_count() == 0;  // not when listing
        return needs_device(tc) && no_device;
      },
      [](std::size_t count) {
        return "no CUDA device: " + std::to_string(count) +
               " device test case(s) skipped (compiled only)";
      });
}
