#pragma once

// Exact laws of device code paths, by enumerating their random decisions.
//
// A scripted source answers each decision with the outcome the host's driver prescribes and
// records how many outcomes there were and the exact probability of the one taken, with the
// host enumerator's rules (testing::bernoulli_outcomes, testing::categorical_outcomes). A test
// kernel runs a device code path under it (every thread of the CTA makes the same decisions;
// thread 0 records); enumerate_device explores every path depth-first, one launch per path.

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "device_buffer.cuh"
#include "specula/core/config.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/types.hpp"
#include "specula/cuda/error.cuh"
#include "specula/sample/categorical.hpp"
#include "specula/testing/enumerate.hpp"
#include "specula/testing/toy_models.hpp"

namespace specula::cuda_test {

inline constexpr int max_decisions = 64;

struct scripted_source {
  const int* script;
  int script_len;
  int* counts;
  double* probs;
  int depth = 0;

  SPECULA_HOST_DEVICE int choice() const { return depth < script_len ? script[depth] : 0; }
  SPECULA_HOST_DEVICE void record(int m, double p) {
#if defined(__CUDA_ARCH__)
    if (threadIdx.x == 0 && depth < max_decisions) {
#else
    if (depth < max_decisions) {
#endif
      counts[depth] = m;
      probs[depth] = p;
    }
    ++depth;
  }

  /// Takes the scripted outcome among those `outcomes(emit)` lists.
  template <class Outcomes>
  SPECULA_HOST_DEVICE index_t decide(Outcomes&& outcomes) {
    const int k = choice();
    int m = 0;
    index_t value = -1;
    double p = 0.0;
    outcomes([&](index_t v, double pv) {
      if (m == k || m == 0) {
        value = v;
        p = pv;
      }
      ++m;
    });
    record(m, p);
    return value;
  }

  SPECULA_HOST_DEVICE bool bernoulli(double prob, draw_id) {
    return decide([&](auto&& emit) { testing::bernoulli_outcomes(prob, emit); }) == 1;
  }

  template <class WeightFn>
  SPECULA_HOST_DEVICE index_t categorical(index_t n, WeightFn&& w, double total, draw_id) {
    return decide([&](auto&& emit) { testing::categorical_outcomes(n, w, total, emit); });
  }
  template <class WeightFn, tile_summary Summary>
  SPECULA_HOST_DEVICE index_t categorical(index_t n, WeightFn&& w, const Summary& s, draw_id at) {
    return categorical(n, w, s.total, at);
  }
};

/// The device side of a scripted run: the script and where to record.
struct script_run {
  const int* script;
  int script_len;
  int* counts;
  double* probs;
  int* depth;
  [[nodiscard]] SPECULA_HOST_DEVICE scripted_source source() const {
    return {script, script_len, counts, probs};
  }
};

/// Device buffers of the scripted runs.
struct script_buffers {
  device_vector<int> script{std::vector<int>(max_decisions, 0)};
  device_vector<int> counts{std::vector<int>(max_decisions, 0)};
  device_vector<double> probs{std::vector<double>(max_decisions, 0.0)};
  device_vector<int> depth{std::vector<int>(1, 0)};
};

/// The decisions of one scripted run, as read back after it.
struct script_record {
  int depth = 0;
  std::vector<int> counts;
  std::vector<double> probs;
};

/// Runs run(path) (returning the run's script_record) along every path of decisions, depth
/// first; after each run calls outcome(probability of the path).
template <class Run, class Outcome>
void enumerate_paths(Run&& run, Outcome&& outcome) {
  std::vector<int> path;
  for (;;) {
    const script_record rec = run(path);
    const int d = rec.depth;
    REQUIRE(d <= max_decisions);
    double prob = 1.0;
    for (int i = 0; i < d; ++i) prob *= rec.probs[static_cast<std::size_t>(i)];
    outcome(prob);
    path.resize(static_cast<std::size_t>(d), 0);
    while (!path.empty() && path.back() + 1 >= rec.counts[path.size() - 1]) path.pop_back();
    if (path.empty()) break;
    ++path.back();
  }
}

/// Runs launch(run) (one kernel launch) along every path of decisions, depth first; after each
/// run calls outcome(probability of the path).
template <class Launch, class Outcome>
void enumerate_device(script_buffers& b, Launch&& launch, Outcome&& outcome) {
  enumerate_paths(
      [&](const std::vector<int>& path) {
        std::vector<int> s(max_decisions, 0);
        std::copy(path.begin(), path.end(), s.begin());
        b.script.assign(s);
        launch(script_run{b.script.ptr, static_cast<int>(path.size()), b.counts.ptr, b.probs.ptr,
                          b.depth.ptr});
        specula::cuda::throw_on_error(cudaDeviceSynchronize(), "scripted kernel");
        return script_record{b.depth.to_host()[0], b.counts.to_host(), b.probs.to_host()};
      },
      std::forward<Outcome>(outcome));
}

/// The host replay of enumerate_device: run(source) runs the same code path on the host (the
/// host's verifier with its sequential passes, which sum in the device's order) under a scripted
/// source, so the law a device test will check can be checked here, without a GPU.
template <class Run, class Outcome>
void enumerate_host(Run&& run, Outcome&& outcome) {
  std::vector<int> script(max_decisions, 0);
  script_record rec{0, std::vector<int>(max_decisions, 0), std::vector<double>(max_decisions, 0.0)};
  enumerate_paths(
      [&](const std::vector<int>& path) {
        std::fill(script.begin(), script.end(), 0);
        std::copy(path.begin(), path.end(), script.begin());
        scripted_source src{script.data(), static_cast<int>(path.size()), rec.counts.data(),
                            rec.probs.data()};
        run(src);
        rec.depth = src.depth;
        return rec;
      },
      std::forward<Outcome>(outcome));
}

/// Row element type of the exact-law tests, on the device and in their host replays. The
/// enumeration's drafting probabilities are doubles; rows of another precision would give the
/// law of the rounded rows (float rows miss the 1e-12 threshold by ~5e-9).
using law_row = double;

/// Adds an outcome to the law of the first two tokens: tokens[0], then tokens[1] when at least
/// one draft was accepted, otherwise the target's exact conditional after tokens[0].
inline void add_two_token_outcome(std::vector<double>& law, const testing::toy_ar_model& target,
                                  const std::vector<token_t>& tokens, std::int32_t accepted,
                                  double prob) {
  const index_t V = target.vocab_size();
  const token_t t0 = tokens[0];
  if (accepted >= 1) {
    law[static_cast<std::size_t>(t0 * V + tokens[1])] += prob;
    return;
  }
  const auto next = target.row(std::vector<token_t>{t0});
  for (index_t y = 0; y < V; ++y)
    law[static_cast<std::size_t>(t0 * V + y)] += prob * next[static_cast<std::size_t>(y)];
}

/// The target's law of the first two tokens.
inline std::vector<double> two_token_law(const testing::toy_ar_model& target) {
  const index_t V = target.vocab_size();
  std::vector<double> law(static_cast<std::size_t>(V * V));
  for (token_t a = 0; a < V; ++a)
    for (token_t b = 0; b < V; ++b)
      law[static_cast<std::size_t>(a * V + b)] =
          target.row({})[static_cast<std::size_t>(a)] *
          target.row(std::vector<token_t>{a})[static_cast<std::size_t>(b)];
  return law;
}

/// Largest |a[i] - b[i]| (laws of the same support).
inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = a.size() == b.size() ? 0.0 : 1.0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    m = std::max(m, a[i] > b[i] ? a[i] - b[i] : b[i] - a[i]);
  return m;
}

/// The toy target of an exact-law test and its draft (the target perturbed with weight `mix`,
/// seed + 1; see testing::toy_ar_model).
struct law_models {
  testing::toy_ar_model target;
  testing::toy_ar_model draft;
  law_models(index_t vocab, index_t horizon, std::uint64_t seed, double sparsity, double mix)
      : target(vocab, horizon, seed, sparsity),
        draft(testing::toy_ar_model::perturbed(target, mix, seed + 1, sparsity)) {}
};

/// The checks of an exact-law test's host replay: law(T{}, ω) is the replayed law with rows of T.
/// With law_row rows and ω = 1 it must be `expected` to 1e-12 (what the device test checks);
/// rows rounded to float give the law of the rounded rows, ~5e-9 away (so the test's rows must
/// have the precision of the drafting probabilities); ω = 2 must miss it (negative control).
template <class LawFn>
void check_host_replay(const std::vector<double>& expected, LawFn&& law) {
  CHECK(max_abs_diff(law(law_row{}, 1.0), expected) < 1e-12);
  CHECK(max_abs_diff(law(float{}, 1.0), expected) > 1e-12);
  CHECK(max_abs_diff(law(law_row{}, 2.0), expected) > 1e-3);
}

}  // namespace specula::cuda_test
