// Single host passes over one row, against the streaming-read baseline of the same bytes
// (bench/stream_baseline.hpp; counters in bench/README.md). These are the loops whose speed
// depends most on the compiler's optimisation level; bench/CMakeLists.txt also builds this file
// at -O2 (specula_bench_O2) so the two levels can be compared (scripts/bench_opt_levels.sh).
//
// passes/<pass>/V:<V>, one float row (bytes: 4V, 8V for the residual):
//   mass       positive_mass of a probability row (the bonus-token pass)
//   residual   summarize_weights of max(p - q, 0) (the rejection pass of the exact rule)
//   validate   check_probability_row (the checked entry points' per-row scan)
//   argmax     argmax_lowest (greedy verification)
//   softmax    softmax of a logit row (reads the logits, writes the probabilities: 8V)
//
// passes_isa/<pass>/<isa>/V:<V>: the same with the instruction set forced (simd::force_isa:
// sse2, avx2, avx512; a set the CPU lacks is reported as an error, not run), so that one run
// gives what each set brings per pass, side by side.

#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "specula/core/simd.hpp"
#include "specula/core/validate.hpp"
#include "specula/rules/exact.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/sample/transforms.hpp"
#include "specula/verify/chain_core.hpp"
#include "stream_baseline.hpp"

using namespace specula;

namespace {

enum class pass { mass, residual, validate, argmax, softmax };

const char* name_of(pass p) {
  switch (p) {
    case pass::mass:
      return "mass";
    case pass::residual:
      return "residual";
    case pass::validate:
      return "validate";
    case pass::argmax:
      return "argmax";
    case pass::softmax:
      return "softmax";
  }
  return "";
}

void pass_case(benchmark::State& state, pass which, index_t v,
               simd::isa path = simd::active_isa()) {
  const simd::isa saved = simd::active_isa();
  if (simd::force_isa(path) != path) {
    simd::force_isa(saved);
    state.SkipWithError("instruction set not supported by this CPU");
    return;
  }
  const auto p = bench::skewed_row(v, 5, 1);
  const auto q = bench::skewed_row(v, 5, 2);
  std::vector<float> out(static_cast<std::size_t>(v));
  const row_view<const float> prow{p.data(), v};
  const row_view<const float> qrow{q.data(), v};
  double bytes = 4.0 * static_cast<double>(v);
  auto call = [&] {
    switch (which) {
      case pass::mass:
        benchmark::DoNotOptimize(positive_mass(v, detail::row_weights<float>{prow}));
        break;
      case pass::residual: {
        const detail::scalar_bound_rule<exact_rule> rule{};
        const dense_proposal<float> prop{qrow};
        const detail::chain_residual<detail::scalar_bound_rule<exact_rule>, row_view<const float>,
                                     dense_proposal<float>>
            w{rule, prow, prop};
        weight_summary s;
        summarize_weights(v, w, s);
        benchmark::DoNotOptimize(s.total);
        break;
      }
      case pass::validate:
        benchmark::DoNotOptimize(check_probability_row(prow, 1e-3).code);
        break;
      case pass::argmax:
        benchmark::DoNotOptimize(argmax_lowest(prow));
        break;
      case pass::softmax:
        softmax(std::span<const float>(p), std::span<float>(out));
        benchmark::DoNotOptimize(out.data());
        break;
    }
  };
  if (which == pass::residual || which == pass::softmax) bytes *= 2;
  call();
  bench::run_against_stream(state, bytes, call);
  simd::force_isa(saved);
}

int register_all() {
  for (pass which : {pass::mass, pass::residual, pass::validate, pass::argmax, pass::softmax})
    for (index_t v : {32000, 128256})
      benchmark::RegisterBenchmark(
          (std::string("passes/") + name_of(which) + "/V:" + std::to_string(v)).c_str(),
          [=](benchmark::State& s) { pass_case(s, which, v); })
          ->Unit(benchmark::kMicrosecond);
  for (pass which : {pass::mass, pass::residual, pass::validate, pass::argmax, pass::softmax})
    for (simd::isa path : {simd::isa::sse2, simd::isa::avx2, simd::isa::avx512})
      for (index_t v : {32000, 128256})
        benchmark::RegisterBenchmark((std::string("passes_isa/") + name_of(which) + "/" +
                                      simd::name(path) + "/V:" + std::to_string(v))
                                         .c_str(),
                                     [=](benchmark::State& s) { pass_case(s, which, v, path); })
            ->Unit(benchmark::kMicrosecond);
  return 0;
}

const int registered = register_all();

}  // namespace
