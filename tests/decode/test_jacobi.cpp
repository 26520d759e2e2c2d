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
