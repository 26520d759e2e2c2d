// Dynamic draft length (speculative_options::draft_p_min, llama.cpp's p_min): lossless in law
// (G-test against the toy target's sequence law, with drafts actually cut short), greedy equal
// to greedy decoding, bad input.

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <vector>

#include <specula/decode/batch.hpp>
#include <specula/decode/speculative.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula/testing/toy_models.hpp>
#include <specula/tree/builders.hpp>
#include <specula_example/sessions.hpp>

#include "decode_test_util.hpp"

using namespace specula;
using specula::testing::toy_ar_model;
using specula::testing::toy_model_session;

TEST_CASE("speculative decoding with a dynamic draft length is lossless", "[decode][stats]") {
  const toy_ar_model target(3, 5, 111);
  const toy_ar_model draft = toy_ar_model::perturbed(target, 0.4, 222);
  toy_model_session t(target), d(draft);
  speculative_options opt;
  opt.draft_length = 3;
  opt.max_new_tokens = 5;
  opt.draft_p_min = 0.5f;
  const std::vector<token_t> prompt{0};
  const auto law = target.sequence_law();
  std::vector<std::uint64_t> counts(law.size(), 0);
  decode_stats st;
  for (std::uint32_t r = 0; r < 200'000; ++r)
    ++counts[static_cast<std::size_t>(target.sequence_index(
        speculative_decode(t, d, prompt, opt, request_rng{21, r, 0}, tree_verifier<>{}, &st)))];
  decode_testing::check_sequence_law(counts, law, st, 1'000'000);
  // The threshold did cut drafts short: fewer tokens per step than with a fixed length (the
  // draft pass at the cut position is still made, so draft passes need not drop), yet some
  // drafts are accepted.
  decode_stats fixed_st, dynamic_st;
  speculative_options fixed = opt;
  fixed.draft_p_min = 0.0f;
  for (std::uint32_t r = 0; r < 2'000; ++r) {
    (void)speculative_decode(t, d, prompt, opt, request_rng{21, r, 0}, tree_verifier<>{},
                             &dynamic_st);
    (void)speculative_decode(t, d, prompt, fixed, request_rng{21, r, 0}, tree_verifier<>{},
                             &fixed_st);
  }
  INFO("step compression " << dynamic_st.step_compression() << " against "
                           << fixed_st.step_compression());
  CHECK(dynamic_st.step_compression() < fixed_st.step_compression());
  CHECK(dynamic_st.step_compression() > 1.0);
}

TEST_CASE("greedy speculative decoding with a dynamic draft length equals greedy decoding",
          "[decode][models]") {
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto target_model = example::transformer::load(dir / "text-target.safetensors");
  const auto draft_model = example::transformer::load(dir / "text-draft.safetensors");
  example::transformer_session target(target_model), draft(draft_model);
  speculative_options opt;
  opt.max_new_tokens = 32;
  opt.mode = draft_mode::greedy;
  opt.draft_length = 6;
  opt.draft_p_min = 0.6f;
  decode_stats with, without;
  decode_testing::check_greedy_sd_on_text(
      target, draft, opt, [&] { return example::transformer_session(target_model); }, &with);
  speculative_options fixed = opt;
  fixed.draft_p_min = 0.0f;
  for (const auto& text : decode_testing::text_prompts())
    (void)speculative_decode(target, draft, decode_testing::bytes(text), fixed,
                             request_rng{1, 0, 0}, greedy_tree_verifier<>{}, &without);
  CHECK(with.draft_forwards < without.draft_forwards);
}

TEST_CASE("draft_p_min out of [0, 1] is rejected", "[decode][bad_input]") {
  const toy_ar_model target(3, 5, 111);
  toy_model_session t(target), d(target);
  speculative_options opt;
  for (const float bad : {-0.1f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    opt.draft_p_min = bad;
    CHECK_THROWS_WITH(speculative_decode(t, d, std::vector<token_t>{0}, opt, request_rng{}),
                      Catch::Contains("draft_p_min"));
  }
  // Chain drafts only: with a draft tree it would be ignored.
  opt.draft_p_min = 0.5f;
  opt.draft_tree = trees::full(2, 2);
  CHECK_THROWS_WITH(speculative_decode(t, d, std::vector<token_t>{0}, opt, request_rng{}),
                    Catch::Contains("draft_p_min") && Catch::Contains("must be 0 with draft_tree"));
  opt.draft_p_min = 0.0f;
  opt.max_new_tokens = 3;
  CHECK(speculative_decode(t, d, std::vector<token_t>{0}, opt, request_rng{}).size() == 3);
  // One object as both models (their caches would be one), single and batched.
  CHECK_THROWS_WITH(speculative_decode(t, t, std::vector<token_t>{0}, opt, request_rng{}),
                    Catch::StartsWith("specula: draft: invalid parameter") &&
                        Catch::Contains("is the target model itself"));
  session_batch<toy_model_session> tb(std::vector<toy_model_session>(2, t));
  const std::vector<std::vector<token_t>> prompts{{0}, {1}};
  const std::vector<request_rng> rngs{request_rng{1, 0, 0}, request_rng{1, 1, 0}};
  CHECK_THROWS_WITH(speculative_decode_batch(tb, tb, prompts, opt, rngs),
                    Catch::Contains("is the target model itself"));
}
