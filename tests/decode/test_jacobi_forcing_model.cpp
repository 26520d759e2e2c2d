// The shipped Jacobi Forcing model (examples/models/text-target-jf, tools/train_models.py
// --only text-target-jf): greedy Jacobi decoding (running window and block mode) and multi-block
// decoding with both pools, both spawn rules, with and without rejection recycling, produce the
// JF model's own greedy output, token for token. Its card is checked with the other shipped
// models (tests/transformer/test_shipped_models.cpp).

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include <specula/decode/jacobi.hpp>
#include <specula/decode/multiblock.hpp>
#include <specula_example/sessions.hpp>

#include "decode_test_util.hpp"

using namespace specula;

namespace {

const std::filesystem::path models_dir{SPECULA_MODELS_DIR};

}  // namespace

TEST_CASE("Jacobi decoding on the Jacobi Forcing model equals its greedy decoding",
          "[decode][models][jf_model]") {
  const auto model = example::transformer::load(models_dir / "text-target-jf.safetensors");
  example::transformer_session s(model);
  decode_stats running, block;
  for (const auto& text : decode_testing::text_prompts()) {
    const auto prompt = decode_testing::bytes(text);
    const auto ref = decode_testing::greedy_reference(s, prompt, 64);
    for (const index_t window : {16, 64})
      for (const bool block_mode : {false, true}) {
        jacobi_options opt;
        opt.window = window;
        opt.max_new_tokens = 64;
        opt.block_mode = block_mode;
        INFO("prompt " << text << " window " << window << " block mode " << block_mode);
        CHECK(jacobi_decode(s, prompt, opt, request_rng{}, block_mode ? &block : &running) == ref);
      }
  }
  CHECK(running.tokens == block.tokens);
  CHECK(running.step_compression() >= 1.0);
}

TEST_CASE("Multi-block decoding on the Jacobi Forcing model equals its greedy decoding",
          "[decode][models][jf_model]") {
  const auto model = example::transformer::load(models_dir / "text-target-jf.safetensors");
  example::transformer_session s(model);
  const auto& prompts = decode_testing::text_prompts();
  for (std::size_t i = 0; i < prompts.size(); i += 2) {  // every other prompt: a few seconds
    const std::string& text = prompts[i];
    const auto prompt = decode_testing::bytes(text);
    const auto ref = decode_testing::greedy_reference(s, prompt, 64);
    for (const index_t blocks : {1, 2})
      for (const bool recycle : {false, true})
        for (const auto pool : {multiblock_pool::per_key, multiblock_pool::fifo})
          for (const auto spawn : {multiblock_spawn::any_block, multiblock_spawn::newest_block}) {
            if (!recycle && pool == multiblock_pool::per_key) continue;  // no pool: one run
            multiblock_options opt;
            opt.block_size = 32;
            opt.max_blocks = blocks;
            opt.spawn_ratio = 0.5;
            opt.recycling = recycle;
            opt.pool = pool;
            opt.spawn = spawn;
            opt.max_new_tokens = 64;
            decode_stats st;
            INFO("prompt " << text << " blocks " << blocks << " recycling " << recycle
                           << " fifo pool " << (pool == multiblock_pool::fifo) << " newest spawns "
                           << (spawn == multiblock_spawn::newest_block));
            CHECK(multiblock_decode(s, prompt, opt, {}, {}, &st) == ref);
            CHECK(st.tokens == 64);
            CHECK(st.steps == st.target_forwards);
          }
  }
}
