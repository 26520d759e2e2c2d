// Jacobi decoding: output identical to greedy decoding (toy models and the shipped target
// model), for several windows and both window initialisations; steps never exceed tokens.

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include <specula/decode/jacobi.hpp>
#include <specula/testing/toy_models.hpp>
#include <specula_example/sessions.hpp>

#include "decode_test_util.hpp"

using namespace specula;

TEST_CASE("Jacobi decoding equals greedy decoding on toy models", "[decode]") {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const testing::toy_ar_model model(3, 7, seed, 0.0);
    testing::toy_model_session s(model);
    const std::vector<token_t> prompt{0};
    const auto ref = decode_testing::greedy_reference(s, prompt, 7);
    for (const index_t window : {1, 2, 5, 16})
      for (const auto init : {jacobi_init::repeat_last, jacobi_init::random}) {
        jacobi_options opt;
        opt.window = window;
        opt.max_new_tokens = 7;
        opt.init = init;
        decode_stats st;
        const auto out = jacobi_decode(s, prompt, opt, request_rng{seed, 0, 0}, &st);
        INFO("seed " << seed << " window " << window);
        CHECK(out == ref);
        CHECK(st.tokens == 7);
        CHECK(st.steps <= st.tokens);
      }
  }
}

TEST_CASE("Jacobi decoding equals greedy decoding on the shipped text model", "[decode][models]") {
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto model = example::transformer::load(dir / "text-target.safetensors");
  example::transformer_session s(model);
  decode_stats st;
  for (const auto& text : decode_testing::text_prompts()) {
    const auto prompt = decode_testing::bytes(text);
    const auto ref = decode_testing::greedy_reference(s, prompt, 48);
    for (const index_t window : {4, 16}) {
      jacobi_options opt;
      opt.window = window;
      opt.max_new_tokens = 48;
      INFO("prompt " << text << " window " << window);
      CHECK(jacobi_decode(s, prompt, opt, request_rng{}, &st) == ref);
    }
  }
  CHECK(st.step_compression() >= 1.0);
}

TEST_CASE("block mode equals greedy decoding and reports every trajectory point", "[decode]") {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const testing::toy_ar_model model(3, 7, seed, 0.0);
    testing::toy_model_session s(model);
    const std::vector<token_t> prompt{0};
    const auto ref = decode_testing::greedy_reference(s, prompt, 7);
    // Output position p (from -1, the root) of the reference sequence.
    const auto at = [&](index_t p) {
      return p < 0 ? prompt.back() : ref[static_cast<std::size_t>(p)];
    };
    for (const bool block_mode : {false, true})
      for (const index_t window : {1, 2, 3, 5, 8})
        for (const auto init :
             {jacobi_init::repeat_last, jacobi_init::random, jacobi_init::sample_context}) {
          INFO("seed " << seed << " block_mode " << block_mode << " window " << window);
          std::vector<jacobi_iteration> seen;
          std::vector<std::vector<token_t>> states;
          jacobi_options opt;
          opt.window = window;
          opt.max_new_tokens = 7;
          opt.init = init;
          opt.block_mode = block_mode;
          opt.on_iteration = [&](const jacobi_iteration& it) {
            seen.push_back(it);
            states.emplace_back(it.state.begin(), it.state.end());
          };
          decode_stats st;
          const auto out = jacobi_decode(s, prompt, opt, request_rng{seed, 0, 0}, &st);
          CHECK(out == ref);
          index_t passes = 0, blocks = 0;
          for (std::size_t i = 0; i < seen.size(); ++i) {
            const jacobi_iteration& it = seen[i];
            const auto& state = states[i];
            REQUIRE(it.converged >= 1);
            REQUIRE(it.converged <= static_cast<index_t>(state.size()));
            // The converged prefix is the greedy output at its positions.
            for (index_t j = 0; j < it.converged; ++j)
              CHECK(state[static_cast<std::size_t>(j)] == at(it.position + j));
            if (!it.fixed_point) {
              CHECK(it.step == static_cast<std::uint32_t>(passes));
              ++passes;
              if (!block_mode) {
                CHECK(it.converged == 1);
                CHECK(static_cast<index_t>(state.size()) <= window + 1);
              } else {
                CHECK(it.block == blocks);
                CHECK(it.position == blocks * window - 1);
                CHECK(static_cast<index_t>(state.size()) <= window);
              }
              // First iteration with sample_context: guesses drawn from the prompt {0}.
              if (i == 0 && init == jacobi_init::sample_context)
                for (const token_t t : state) CHECK(t == 0);
              continue;
            }
            // A converged block: its fixed point is the greedy output over the whole block and
            // equals the state of the block's last iteration (all its guesses were accepted).
            REQUIRE(block_mode);
            CHECK(it.block == blocks);
            CHECK(it.position == blocks * window - 1);
            CHECK(it.converged == window);
            REQUIRE(static_cast<index_t>(state.size()) == window);
            for (index_t j = 0; j < window; ++j)
              CHECK(state[static_cast<std::size_t>(j)] == at(it.position + j));
            REQUIRE(i > 0);
            CHECK(!seen[i - 1].fixed_point);
            // ... unless the block ends the output (its last token was the last one generated,
            // as a correction, so no iteration evaluated the fixed point itself).
            if (it.position + window < 7) CHECK(states[i - 1] == state);
            ++blocks;
          }
          CHECK(passes == st.target_forwards);
          // Blocks of `window` positions from -1 that fit in the 7 tokens (the root is the last
          // prompt token) all converge: floor(8 / window) of them, except that with window 1
          // the last token generated would be the root of a block no iteration evaluates.
          if (block_mode) CHECK(blocks == 8 / window - (window == 1 ? 1 : 0));
        }
  }
}

TEST_CASE("Jacobi decoding rejects bad input", "[decode]") {
  const testing::toy_ar_model model(3, 4, 1);
  testing::toy_model_session s(model);
  jacobi_options opt;
  opt.window = 0;
  CHECK_THROWS_WITH(jacobi_decode(s, std::vector<token_t>{0}, opt), Catch::Contains("window"));
  opt.window = 4;
  opt.max_new_tokens = 0;
  CHECK_THROWS_WITH(jacobi_decode(s, std::vector<token_t>{0}, opt),
                    Catch::Contains("max_new_tokens"));
  opt.max_new_tokens = 4;
  CHECK_THROWS_WITH(jacobi_decode(s, std::vector<token_t>{}, opt), Catch::Contains("prompt"));
}
