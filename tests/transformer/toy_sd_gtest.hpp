#pragma once

// The sampled draft-model SD G-test on a toy transformer, generic over the session type (and
// the resident loops' G-tests, Cool-SD's ω check and the diffusion tests' options): the
// device tests run it on the GPU model (tests/cuda/model), the host tests on the host model, so
// CI checks without a GPU that the test has power (its negative control fails) and that the
// law it tests against is right (the host loop passes).
//
// Toy transformer: 4 tokens, 3 generated after the prompt {0}: 64 sequences whose law is
// enumerated with the host forward (evaluate_sequences, independent of the sessions' caches and
// of the loops); the draft is another random transformer.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <specula/decode/speculative.hpp>
#include <specula/decode/ssd.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula_example/resident_sd.hpp>

#include "../decode/decode_test_util.hpp"
#include "transformer_test_util.hpp"

namespace specula::example::testing {

inline transformer_config toy_gtest_config() {
  auto c = small_config();
  c.vocab_size = 4;
  c.max_seq_len = 8;
  return c;
}

/// The law of the 3 tokens after {0} under `w` (index y1 * 16 + y2 * 4 + y3).
inline std::vector<double> toy_sequence_law(const transformer_weights& w) {
  const transformer host(w);
  const index_t V = 4;
  std::vector<double> law(64, 0.0);
  std::vector<float> logits(static_cast<std::size_t>(3 * V));
  for (index_t s = 0; s < 64; ++s) {
    const std::vector<token_t> seq{0, static_cast<token_t>(s / 16), static_cast<token_t>(s / 4 % 4),
                                   static_cast<token_t>(s % 4)};
    host.evaluate_sequences(std::span<const token_t>(seq).first(3), 3,
                            batch_view<float>(logits.data(), 3, V));
    double p = 1.0;
    for (std::size_t k = 0; k < 3; ++k) {  // softmax in double
      const float* row = logits.data() + k * 4;
      const double m = *std::max_element(row, row + 4);
      double z = 0.0;
      for (std::size_t y = 0; y < 4; ++y) z += std::exp(static_cast<double>(row[y]) - m);
      p *= std::exp(static_cast<double>(row[static_cast<std::size_t>(seq[k + 1])]) - m) / z;
    }
    law[static_cast<std::size_t>(s)] = p;
  }
  return law;
}

/// Sequence counts of `runs` generations `generate(request_rng, stats)` (3 tokens each).
template <class Generate>
std::vector<std::uint64_t> toy_counts(Generate&& generate, std::uint32_t runs, std::uint64_t seed,
                                      decode_stats* st) {
  std::vector<std::uint64_t> counts(64, 0);
  for (std::uint32_t r = 0; r < runs; ++r) {
    const std::vector<token_t> out = generate(request_rng{seed, r, 0}, st);
    REQUIRE(out.size() == 3);
    ++counts[static_cast<std::size_t>(out[0] * 16 + out[1] * 4 + out[2])];
  }
  return counts;
}

/// The G-test of a lossless generator against `law` (`runs` generations, p > 1e-4, drafts
/// accepted).
template <class Generate>
void check_toy_gtest(Generate&& generate, const std::vector<double>& law,
                     std::uint32_t runs = 4000) {
  decode_stats st;
  const auto g = specula::testing::g_test(toy_counts(generate, runs, 9, &st), law);
  INFO(g << ", step compression " << st.step_compression());
  CHECK(g.impossible_observations == 0);
  CHECK(g.p_value > 1e-4);
  CHECK(st.step_compression() > 1.0);
}

/// check_toy_gtest of a lossless generator, and the G-test of a biased one, the negative
/// control (p < 1e-6).
template <class Generate, class Biased>
void check_toy_law(Generate&& generate, Biased&& biased, const std::vector<double>& law) {
  check_toy_gtest(generate, law);
  const auto b = specula::testing::g_test(toy_counts(biased, 4000, 10, nullptr), law);
  INFO("negative control: " << b);
  CHECK(b.p_value < 1e-6);
}

/// check_toy_law for sampled draft-model SD (draft length 2) over two sessions, the negative
/// control verifying with decode_testing::accept_all_verifier.
template <session_model Session>
void check_toy_sd_gtest(Session& target, Session& draft, const std::vector<double>& law) {
  speculative_options opt;
  opt.draft_length = 2;
  opt.max_new_tokens = 3;
  const std::vector<token_t> prompt{0};
  const auto sd = [&](const auto& verifier) {
    return [&, verifier](const request_rng& rng, decode_stats* st) {
      return speculative_decode(target, draft, prompt, opt, rng, verifier, st);
    };
  };
  check_toy_law(sd(tree_verifier<>{}), sd(decode_testing::accept_all_verifier{}), law);
}

}  // namespace specula::example::testing

namespace specula::example::testing {

/// Cool-SD through resident SD (`ops`: host or device ops over the toy transformer pair whose
/// target law is `law`): ω = 1 is the exact rule (the G-test passes), ω = 2 distorts the law
/// (it fails, p < 1e-6); `runs` generations each.
template <class Ops>
void check_toy_relaxed_omega(Ops& ops, const std::vector<double>& law, std::uint32_t runs) {
  const std::vector<token_t> prompt{0};
  for (const double delta : {1.0, 2.0}) {
    resident_sd_options opt;
    opt.draft_length = 2;
    opt.max_new_tokens = 3;
    opt.relaxed = scheduled_relaxed_rule{};
    opt.relaxed->schedule = relaxation_schedule::make_uniform(delta);
    const auto g = specula::testing::g_test(toy_counts(
                                                [&](const request_rng& rng, decode_stats* st) {
                                                  return resident_speculative_decode(ops, prompt,
                                                                                     opt, rng, st);
                                                },
                                                runs, 9, nullptr),
                                            law);
    INFO("delta " << delta << ": " << g);
    if (delta == 1.0)
      CHECK(g.p_value > 1e-4);
    else
      CHECK(g.p_value < 1e-6);
  }
}

/// The diffusion tests' SSD options: 24 positions in blocks of 8, refreshes every 4 steps.
inline ssd_options small_ssd_options(ssd_cache cache) {
  ssd_options opt;
  opt.gen_length = 24;
  opt.block_size = 8;
  opt.cache = cache;
  opt.refresh_interval = 4;
  return opt;
}

}  // namespace specula::example::testing
