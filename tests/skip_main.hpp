#pragma once

// The Catch2 main shared by the host tests (tests/main.cpp) and the device tests
// (tests/cuda/main.cpp): runs the session, unless every test case the command line selects
// must be skipped on this machine (`skip_case`), in which case it prints why and exits 77, which
// ctest reports as skipped (SKIP_RETURN_CODE, tests/CMakeLists.txt) instead of passed. A run that
// selects other cases too runs them all; the skipped ones then return early with a warning.

#include <catch2/catch.hpp>
#include <iostream>
#include <string>
#include <vector>

namespace specula_test {

/// Exit status of a skipped run (the automake convention).
inline constexpr int skip_code = 77;

/// Runs the session of argc/argv; `skip_case(test_case)` says whether a case cannot run here,
/// `why(count)` what to print when all `count` selected cases cannot.
template <class SkipCase, class Why>
int run_or_skip(int argc, char* argv[], SkipCase&& skip_case, Why&& why) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  const Catch::ConfigData& data = session.configData();
  const bool listing = data.listTests || data.listTags || data.listReporters ||
                       data.listTestNamesOnly || data.showHelp;
  if (!listing) {
    Catch::Config& config = session.config();
    const std::vector<Catch::TestCase> selected =
        Catch::filterTests(Catch::getAllTestCasesSorted(config), config.testSpec(), config);
    bool all_skipped = !selected.empty();
    for (const Catch::TestCase& tc : selected) all_skipped = all_skipped && skip_case(tc);
    if (all_skipped) {
      std::cout << why(selected.size()) << "\n";
      return skip_code;
    }
  }
  return session.run();
}

}  // namespace specula_test
