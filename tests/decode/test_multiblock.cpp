// Multi-block decoding with rejection recycling: output identical to greedy decoding (toy models
// and the shipped target model) for every block / recycling configuration; bad input.

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include <specula/decode/multiblock.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula/testing/toy_models.hpp>
#include <specula_example/sessions.hpp>

#include "decode_test_util.hpp"

using namespace specula;

namespace {

multiblock_options mb(index_t block, index_t blocks, double r, bool recycle, index_t tokens) {
  multiblock_options o;
  o.block_size = block;
  o.max_blocks = blocks;
  o.spawn_ratio = r;
  o.recycling = recycle;
  o.pool_size = 4;
  o.ngram_length = 3;
  o.max_new_tokens = tokens;
  return o;
}

}  // namespace

TEST_CASE("Multi-block decoding equals greedy decoding on toy models", "[decode]") {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    // Low-entropy toy models (temperature 0.3) repeat themselves, so recycled n-grams match.
    const testing::toy_ar_model model(3, 9, seed, 0.0);
    testing::toy_model_session s(model);
    const std::vector<token_t> prompt{0};
    const auto ref = decode_testing::greedy_reference(s, prompt, 9);
    for (const index_t block : {1, 2, 4, 8})
      for (const index_t blocks : {1, 2, 3})
        for (const bool recycle : {false, true})
          for (const auto init :
               {jacobi_init::repeat_last, jacobi_init::random, jacobi_init::sample_context})
            for (const auto pool : {multiblock_pool::per_key, multiblock_pool::fifo})
              for (const auto spawn : {multiblock_spawn::any_block, multiblock_spawn::newest_block})
                for (const bool past_ra : {true, false}) {
                  auto opt = mb(block, blocks, 0.5, recycle, 9);
                  opt.init = init;
                  opt.pool = pool;
                  opt.spawn = spawn;
                  opt.verify_past_ra = past_ra;
                  decode_stats st;
                  const auto out = multiblock_decode(s, prompt, opt, request_rng{seed, 0, 0}, &st);
                  INFO("seed " << seed << " block " << block << " blocks " << blocks << " recycle "
                               << recycle << " init " << static_cast<int>(init) << " fifo "
                               << (pool == multiblock_pool::fifo) << " newest "
                               << (spawn == multiblock_spawn::newest_block) << " past RA "
                               << past_ra);
                  CHECK(out == ref);
                  CHECK(st.tokens == 9);
                  CHECK(st.steps == st.target_forwards);
                }
  }
}

TEST_CASE("Multi-block decoding equals greedy decoding on the shipped text model",
          "[decode][models]") {
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto model = example::transformer::load(dir / "text-target.safetensors");
  example::transformer_session s(model);
  decode_stats plain, multi, recycled, released;
  for (const auto& text : decode_testing::text_prompts()) {
    const auto prompt = decode_testing::bytes(text);
    const auto ref = decode_testing::greedy_reference(s, prompt, 64);
    INFO("prompt " << text);
    CHECK(multiblock_decode(s, prompt, mb(16, 1, 0.85, false, 64), {}, {}, &plain) == ref);
    CHECK(multiblock_decode(s, prompt, mb(16, 2, 0.5, false, 64), {}, {}, &multi) == ref);
    auto opt = mb(16, 2, 0.5, true, 64);
    opt.ngram_length = 8;
    CHECK(multiblock_decode(s, prompt, opt, {}, {}, &recycled) == ref);
    // The released code's rules: one FIFO of whole sequences, only the newest block spawns.
    opt.pool = multiblock_pool::fifo;
    opt.spawn = multiblock_spawn::newest_block;
    CHECK(multiblock_decode(s, prompt, opt, {}, {}, &released) == ref);
  }
  CHECK(plain.step_compression() >= 1.0);
  CHECK(recycled.step_compression() >= 1.0);
  CHECK(released.step_compression() >= 1.0);
}

namespace {

template <class Verifier = tree_verifier<>>
std::vector<std::uint64_t> stochastic_counts(const testing::toy_ar_model& model,
                                             const multiblock_options& opt, std::uint32_t runs,
                                             std::uint64_t seed, decode_stats* stats,
                                             const Verifier& v = {}) {
  testing::toy_model_session s(model);
  const std::vector<token_t> prompt{0};
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(model.num_sequences()), 0);
  for (std::uint32_t r = 0; r < runs; ++r) {
    const auto out = multiblock_decode(s, prompt, opt, request_rng{seed, r, 0}, v, stats);
    ++counts[static_cast<std::size_t>(model.sequence_index(out))];
  }
  return counts;
}

multiblock_options stochastic_mb(index_t block, index_t blocks, double r, jacobi_init init) {
  auto o = mb(block, blocks, r, false, 5);
  o.stochastic = true;
  o.init = init;
  return o;
}

}  // namespace

TEST_CASE("Stochastic multi-block decoding samples the target's sequence law (G-test)",
          "[decode][stats]") {
  // V = 4, 5 positions (1024 sequences), sparse rows; blocks shorter than the sequence so
  // that blocks are spawned, promoted and refilled from stale rows.
  const testing::toy_ar_model model(4, 5, 77, 0.3);
  const auto law = model.sequence_law();
  struct variant {
    const char* name;
    multiblock_options opt;
  };
  for (const auto& v :
       {variant{"block 2, K = 2, random fill", stochastic_mb(2, 2, 0.5, jacobi_init::random)},
        variant{"block 3, K = 3, repeat fill", stochastic_mb(3, 3, 0.34, jacobi_init::repeat_last)},
        variant{"block 2, K = 2, context fill",
                stochastic_mb(2, 2, 0.5, jacobi_init::sample_context)}}) {
    decode_stats st;
    INFO(v.name);
    decode_testing::check_sequence_law(stochastic_counts(model, v.opt, 1'000'000, 41, &st), law, st,
                                       5'000'000);
  }
  // Negative control: a verifier that accepts the whole first path fails the same test.
  const auto biased =
      stochastic_counts(model, stochastic_mb(2, 2, 0.5, jacobi_init::random), 200'000, 42, nullptr,
                        decode_testing::first_path_verifier{});
  CHECK(specula::testing::g_test(biased, law).p_value < 1e-6);
}

TEST_CASE("A stop token ends multi-block decoding", "[decode]") {
  const testing::toy_ar_model model(3, 8, 5, 0.0);
  testing::toy_model_session s(model);
  const std::vector<token_t> prompt{0};
  const auto ref = decode_testing::greedy_reference(s, prompt, 8);
  auto opt = mb(4, 2, 0.5, true, 8);
  opt.stop_token = ref[3];
  const auto out = multiblock_decode(s, prompt, opt);
  std::vector<token_t> expect;
  for (const token_t t : ref) {
    expect.push_back(t);
    if (t == opt.stop_token) break;
  }
  CHECK(out == expect);
}

TEST_CASE("Multi-block decoding rejects bad input", "[decode]") {
  const testing::toy_ar_model model(3, 4, 1);
  testing::toy_model_session s(model);
  const std::vector<token_t> prompt{0};
  auto check = [&](auto mutate, const char* name) {
    auto opt = mb(4, 2, 0.5, true, 4);
    mutate(opt);
    CHECK_THROWS_WITH(multiblock_decode(s, prompt, opt), Catch::Contains(name));
  };
  check([](multiblock_options& o) { o.block_size = 0; }, "block_size");
  check([](multiblock_options& o) { o.max_blocks = 0; }, "max_blocks");
  check([](multiblock_options& o) { o.spawn_ratio = 0.0; }, "spawn_ratio");
  check([](multiblock_options& o) { o.spawn_ratio = 1.5; }, "spawn_ratio");
  check([](multiblock_options& o) { o.pool_size = -1; }, "pool_size");
  check([](multiblock_options& o) { o.ngram_length = 0; }, "ngram_length");
  check([](multiblock_options& o) { o.max_new_tokens = 0; }, "max_new_tokens");
  check([](multiblock_options& o) { o.stochastic = true; }, "recycling");
  check(
      [](multiblock_options& o) {
        o.stochastic = true;
        o.recycling = false;
        o.target.temperature = -1.0f;
      },
      "temperature");
  check(
      [](multiblock_options& o) {
        o.stochastic = true;
        o.recycling = false;
        o.verify_past_ra = false;
      },
      "verify_past_ra");
  CHECK_THROWS_WITH(multiblock_decode(s, std::vector<token_t>{}, mb(4, 2, 0.5, true, 4)),
                    Catch::Contains("prompt"));
}
