// resident_jacobi_decode / resident_multiblock_decode (resident_greedy.hpp) on the host
// transformer: the library's greedy loops driven by resident_greedy_ops, which keeps only each
// row's summary (what the device ops copy back) and verifies chains and trees from the rows'
// argmaxes, equal greedy decoding of the shipped text model (Jacobi: sliding and block mode,
// repeated and random window initialisation; multi-block: with and without n-gram recycling),
// and the resident ops refuse multi-block's stochastic variant.

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <vector>

#include <specula_example/resident_greedy.hpp>

#include "../decode/decode_test_util.hpp"
#include "image_test_util.hpp"
#include "transformer_test_util.hpp"

using namespace specula;
using namespace specula::example;

TEST_CASE("resident Jacobi with host ops equals greedy decoding", "[backend][models]") {
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto model = transformer::load(dir / "text-target.safetensors");
  resident_greedy_ops<transformer_session> ops(model);
  for (const bool block : {false, true}) {
    jacobi_options o;
    o.window = 8;
    o.max_new_tokens = 32;
    o.block_mode = block;
    o.init = block ? jacobi_init::random : jacobi_init::repeat_last;
    decode_stats st;
    for (const auto& text : decode_testing::text_prompts()) {
      const auto prompt = decode_testing::bytes(text);
      transformer_session ar(model);
      INFO("prompt " << text << (block ? ", block mode" : ", sliding"));
      CHECK(resident_jacobi_decode(ops, prompt, o, request_rng{2, 0, 0}, &st) ==
            decode_testing::greedy_reference(ar, prompt, 32));
    }
    CHECK(st.tokens == 32 * static_cast<index_t>(decode_testing::text_prompts().size()));
  }
}

TEST_CASE("resident multi-block decoding with host ops equals greedy decoding",
          "[backend][models]") {
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto model = transformer::load(dir / "text-target.safetensors");
  resident_greedy_ops<transformer_session> ops(model);
  for (const bool recycling : {false, true}) {
    multiblock_options o;
    o.block_size = 8;
    o.max_blocks = 2;
    o.spawn_ratio = 0.5;
    o.recycling = recycling;
    o.max_new_tokens = 32;
    decode_stats st;
    for (const auto& text : decode_testing::text_prompts()) {
      const auto prompt = decode_testing::bytes(text);
      transformer_session ar(model);
      INFO("prompt " << text << (recycling ? ", recycling" : ""));
      CHECK(resident_multiblock_decode(ops, prompt, o, request_rng{3, 0, 0}, &st) ==
            decode_testing::greedy_reference(ar, prompt, 32));
    }
    CHECK(st.tokens == 32 * static_cast<index_t>(decode_testing::text_prompts().size()));
  }
  multiblock_options stochastic;
  stochastic.stochastic = true;
  stochastic.recycling = false;
  const std::vector<token_t> prompt{1, 2};
  CHECK_THROWS_WITH(resident_multiblock_decode(ops, prompt, stochastic),
                    Catch::Contains("stochastic"));
}

TEST_CASE(
    "resident Jacobi and multi-block on a vocabulary-limited image model equal greedy decoding "
    "of rows masked by the caller",
    "[backend][models]") {
  // The image task on the GPU: the label tokens are cut from every row by the model itself
  // (set_vocab_limit), not by the demo's session on the host.
  const example::testing::image_task image(SPECULA_MODELS_DIR);
  const transformer limited = image.limited(), plain(image.weights);
  resident_greedy_ops<transformer_session> ops(limited);
  const auto jo = example::testing::jacobi_window8(image.tokens());
  const auto mo = example::testing::two_blocks_of8(image.tokens());
  for (const index_t label : {0, 3}) {
    const std::vector<token_t> prompt{image.vq.label_token(label)};
    example::testing::tail_masked_session<transformer_session> masked(plain, image.limit());
    const auto ref = decode_testing::greedy_reference(masked, prompt, image.tokens());
    INFO("label " << label);
    CHECK(std::all_of(ref.begin(), ref.end(), [&](token_t t) { return t < image.limit(); }));
    CHECK(resident_jacobi_decode(ops, prompt, jo, request_rng{4, 0, 0}) == ref);
    CHECK(resident_multiblock_decode(ops, prompt, mo, request_rng{4, 0, 0}) == ref);
  }
}
