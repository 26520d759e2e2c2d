#pragma once

// Forced-instruction-set test cases. SPECULA_ISA_TEST_CASE("name", "[tags]") { ... path ... }
// defines one Catch2 test case per instruction set of simd::isa, named "name - <isa>" and
// tagged [isa_<isa>] besides its own tags; each runs the body with `path` forced
// (simd::force_isa) and restores the default after. On a CPU without that set the case warns
// and returns, and a run that selects only such cases (as each per-case ctest entry does) exits
// 77 from tests/main.cpp, which ctest reports as skipped (SKIP_RETURN_CODE).

#include <catch2/catch.hpp>

#include "specula/core/simd.hpp"

namespace specula_test {

/// Whether this build and CPU can run the instruction set `i`.
inline bool isa_supported(specula::simd::isa i) noexcept {
  return static_cast<int>(i) <= static_cast<int>(specula::simd::supported_isa());
}

/// Restores the instruction set in force at scope exit.
struct isa_guard {
  specula::simd::isa saved = specula::simd::active_isa();
  ~isa_guard() { specula::simd::force_isa(saved); }
};

/// Runs body(i) with the instruction set `i` forced, or warns that it cannot.
template <class Body>
void run_on_isa(specula::simd::isa i, Body&& body) {
  if (!isa_supported(i)) {
    WARN("instruction set " << specula::simd::name(i) << " not supported here: skipped");
    return;
  }
  const isa_guard guard;
  REQUIRE(specula::simd::force_isa(i) == i);
  INFO("isa " << specula::simd::name(i));
  body(i);
}

/// Calls f() with the scalar path forced (the reference of a kernel), restoring the set after.
template <class F>
auto on_scalar(F&& f) {
  const isa_guard guard;
  specula::simd::force_isa(specula::simd::isa::scalar);
  return f();
}

}  // namespace specula_test

#define SPECULA_ISA_TEST_CASE_IMPL(fn, name, tags)            \
  static void fn(specula::simd::isa path);                    \
  TEST_CASE(name " - scalar", tags "[isa_scalar]") {          \
    specula_test::run_on_isa(specula::simd::isa::scalar, fn); \
  }                                                           \
  TEST_CASE(name " - sse2", tags "[isa_sse2]") {              \
    specula_test::run_on_isa(specula::simd::isa::sse2, fn);   \
  }                                                           \
  TEST_CASE(name " - avx2", tags "[isa_avx2]") {              \
    specula_test::run_on_isa(specula::simd::isa::avx2, fn);   \
  }                                                           \
  TEST_CASE(name " - avx512", tags "[isa_avx512]") {          \
    specula_test::run_on_isa(specula::simd::isa::avx512, fn); \
  }                                                           \
  static void fn([[maybe_unused]] specula::simd::isa path)

#define SPECULA_ISA_TEST_CASE(name, tags) \
  SPECULA_ISA_TEST_CASE_IMPL(INTERNAL_CATCH_UNIQUE_NAME(specula_isa_case_), name, tags)
