// SSD (self speculative decoding of masked diffusion models): output identical to stepwise
// low-confidence-remasking decoding for both verification trees, on toy masked models and the
// shipped text-diffusion model; fewer forward passes; bad input.

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include <specula/decode/ssd.hpp>
#include <specula/testing/toy_models.hpp>
#include <specula_example/transformer.hpp>

#include "decode_test_util.hpp"

using namespace specula;

TEST_CASE("SSD equals stepwise decoding on toy masked models", "[decode]") {
  decode_stats total;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    const testing::toy_masked_model model(5, seed);
    const std::vector<token_t> prompt{0, 3, 1};
    for (const index_t block : {3, 4, 12}) {
      ssd_options opt;
      opt.gen_length = 12;
      opt.block_size = block;
      decode_stats ref_st;
      const auto ref = diffusion_stepwise_decode(model, prompt, opt, &ref_st);
      CHECK(ref_st.target_forwards == 12);
      for (const index_t n : {1, 2, 3, 5})
        for (const auto tree : {ssd_tree::chain, ssd_tree::mix_order}) {
          opt.draft_length = n;
          opt.tree = tree;
          decode_stats st;
          INFO("seed " << seed << " block " << block << " N " << n << " mix "
                       << (tree == ssd_tree::mix_order));
          CHECK(ssd_decode(model, prompt, opt, &st) == ref);
          CHECK(st.tokens == 12);
          CHECK(st.accepted_histogram.size() <= static_cast<std::size_t>(n + 1));
          total.merge(st);
        }
    }
  }
  // Drafts are accepted: fewer forward passes than tokens over all runs.
  CHECK(total.step_compression() > 1.0);
}

TEST_CASE("SSD equals stepwise decoding on the shipped diffusion model", "[decode][models]") {
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto model = example::transformer::load(dir / "text-diffusion.safetensors");
  decode_stats chain_st, mix_st;
  const auto& prompts = decode_testing::text_prompts();
  for (std::size_t i = 0; i < 6; ++i) {
    const auto prompt = decode_testing::bytes(prompts[i]);
    ssd_options opt;
    opt.gen_length = 24;
    opt.block_size = 8;
    const auto ref = diffusion_stepwise_decode(model, prompt, opt);
    INFO("prompt " << prompts[i]);
    opt.draft_length = 3;
    CHECK(ssd_decode(model, prompt, opt, &chain_st) == ref);
    opt.tree = ssd_tree::mix_order;
    CHECK(ssd_decode(model, prompt, opt, &mix_st) == ref);
  }
  CHECK(chain_st.step_compression() > 1.0);
  CHECK(mix_st.step_compression() > 1.0);
}

TEST_CASE("SSD rejects bad input", "[decode]") {
  const testing::toy_masked_model model(5, 1);
  const std::vector<token_t> prompt{0, 1};
  auto check = [&](auto mutate, std::vector<token_t> p, const char* name) {
    ssd_options opt;
    opt.gen_length = 4;
    mutate(opt);
    CHECK_THROWS_WITH(ssd_decode(model, p, opt), Catch::Contains(name));
    CHECK_THROWS_WITH(diffusion_stepwise_decode(model, p, opt), Catch::Contains(name));
  };
  check([](ssd_options& o) { o.gen_length = 0; }, prompt, "gen_length");
  check([](ssd_options& o) { o.block_size = 0; }, prompt, "block_size");
  check([](ssd_options& o) { o.draft_length = 0; }, prompt, "draft_length");
  check([](ssd_options&) {}, {}, "prompt");
  check([](ssd_options&) {}, {0, 4}, "prompt");  // the mask token
  check([](ssd_options&) {}, {0, 7}, "prompt");  // out of range
  // A causal model has no mask token.
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto causal = example::transformer::load(dir / "text-draft.safetensors");
  CHECK_THROWS_WITH(ssd_decode(causal, prompt, ssd_options{}), Catch::Contains("mask_token"));
}
