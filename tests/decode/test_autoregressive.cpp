// Plain autoregressive decoding (decode/autoregressive.hpp): sampled generations fit the toy
// model's exact sequence law (G-test, with a negative control), the sampling parameters are
// applied, greedy equals greedy decoding, the batch equals the solo loop, bad input.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <specula/decode/autoregressive.hpp>
#include <specula/decode/batch.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula/testing/toy_models.hpp>
#include <specula_example/sessions.hpp>

#include "decode_test_util.hpp"

using namespace specula;
using specula::testing::toy_ar_model;
using specula::testing::toy_model_session;

TEST_CASE("autoregressive sampling fits the model's sequence law", "[decode][stats]") {
  const toy_ar_model model(3, 5, 71);
  toy_model_session s(model);
  autoregressive_options opt;
  opt.max_new_tokens = 5;
  const std::vector<token_t> prompt{0};
  const auto law = model.sequence_law();
  std::vector<std::uint64_t> counts(law.size(), 0);
  decode_stats st;
  for (std::uint32_t r = 0; r < 100'000; ++r)
    ++counts[static_cast<std::size_t>(
        model.sequence_index(autoregressive_decode(s, prompt, opt, request_rng{3, r, 0}, &st)))];
  const auto g = testing::g_test(counts, law);
  INFO(g);
  CHECK(g.p_value > 1e-4);
  CHECK(g.impossible_observations == 0);
  CHECK(st.tokens == 500'000);
  CHECK(st.target_forwards == 500'000);
  CHECK(st.step_compression() == 1.0);
  // Negative control: another model's law.
  const auto other = toy_ar_model::perturbed(model, 0.3, 5).sequence_law();
  CHECK(testing::g_test(counts, other).p_value < 1e-9);
}

TEST_CASE("autoregressive sampling applies the sampling parameters", "[decode][stats]") {
  // One step from a single row: its law is the filtered row, computed here from the model's
  // row by hand (top-k 2 keeps the two most likely tokens, renormalised).
  const toy_ar_model model(5, 1, 9, 0.0);
  toy_model_session s(model);
  autoregressive_options opt;
  opt.max_new_tokens = 1;
  opt.params.top_k = 2;
  const auto row = model.row({});
  std::vector<std::size_t> order{0, 1, 2, 3, 4};
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return row[a] > row[b]; });
  std::vector<double> law(5, 0.0);
  const double kept = row[order[0]] + row[order[1]];
  law[order[0]] = row[order[0]] / kept;
  law[order[1]] = row[order[1]] / kept;
  std::vector<std::uint64_t> counts(5, 0);
  for (std::uint32_t r = 0; r < 40'000; ++r)
    ++counts[static_cast<std::size_t>(
        autoregressive_decode(s, std::vector<token_t>{0}, opt, request_rng{8, r, 0}).at(0))];
  const auto g = testing::g_test(counts, law);
  INFO(g);
  CHECK(g.p_value > 1e-4);
}

TEST_CASE("greedy autoregressive decoding equals greedy decoding, batched equals solo",
          "[decode][models]") {
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto model = example::transformer::load(dir / "text-target.safetensors");
  example::transformer_session m(model);
  autoregressive_options opt;
  opt.max_new_tokens = 24;
  opt.greedy = true;
  std::vector<std::vector<token_t>> prompts;
  for (const auto& text : decode_testing::text_prompts())
    prompts.push_back(decode_testing::bytes(text));
  for (const auto& prompt : prompts) {
    example::transformer_session ref(model);
    CHECK(autoregressive_decode(m, prompt, opt) ==
          decode_testing::greedy_reference(ref, prompt, 24));
  }
  // Batched, sampled: each request equals its solo run with the same stream.
  opt.greedy = false;
  opt.params.temperature = 0.8f;
  std::vector<example::transformer_session> sessions(prompts.size(),
                                                     example::transformer_session(model));
  session_batch<example::transformer_session> batch(std::move(sessions));
  std::vector<request_rng> rngs;
  for (std::size_t r = 0; r < prompts.size(); ++r)
    rngs.push_back({77, static_cast<std::uint32_t>(r), 0});
  const auto out = autoregressive_decode_batch(batch, prompts, opt, rngs);
  for (std::size_t r = 0; r < prompts.size(); ++r)
    CHECK(out[r] == autoregressive_decode(m, prompts[r], opt, rngs[r]));
}

TEST_CASE("autoregressive decoding rejects bad input", "[decode][bad_input]") {
  const toy_ar_model model(3, 5, 71);
  toy_model_session s(model);
  autoregressive_options opt;
  CHECK_THROWS_WITH(autoregressive_decode(s, std::vector<token_t>{}, opt),
                    Catch::Contains("prompt"));
  opt.max_new_tokens = 0;
  CHECK_THROWS_WITH(autoregressive_decode(s, std::vector<token_t>{0}, opt),
                    Catch::Contains("max_new_tokens"));
  opt.max_new_tokens = 3;
  opt.params.temperature = 0.0f;
  CHECK_THROWS_WITH(autoregressive_decode(s, std::vector<token_t>{0}, opt),
                    Catch::Contains("temperature"));
  opt.greedy = true;  // greedy ignores the sampling parameters
  CHECK(autoregressive_decode(s, std::vector<token_t>{0}, opt).size() == 3);
  // A stop token outside [0, V) other than -1 (none) could never end generation.
  for (const token_t bad : {token_t{3}, token_t{-5}}) {
    opt.stop_token = bad;
    CHECK_THROWS_WITH(autoregressive_decode(s, std::vector<token_t>{0}, opt),
                      Catch::StartsWith("specula: stop_token: token id out of range") &&
                          Catch::Contains("or -1 for none"));
  }
  opt.stop_token = no_token;
  CHECK(autoregressive_decode(s, std::vector<token_t>{0}, opt).size() == 3);
}

namespace {

/// A toy session whose logits are all 3e37: finite, but +inf once divided by a temperature
/// below about 0.11.
struct huge_logits_session : toy_model_session {
  using toy_model_session::toy_model_session;
  void evaluate(const token_tree& nodes, batch_view<float> logits) {
    toy_model_session::evaluate(nodes, logits);
    for (index_t r = 0; r < logits.rows; ++r)
      for (index_t c = 0; c < logits.cols; ++c) logits.row(r)[c] = 3e37f;
  }
};

}  // namespace

TEST_CASE("a fault the loop's own checks find says specula once", "[decode][faults]") {
  const toy_ar_model model(3, 5, 71);
  huge_logits_session s(model);
  autoregressive_options opt;
  opt.max_new_tokens = 2;
  opt.params.temperature = 0.05f;
  try {
    (void)autoregressive_decode(s, std::vector<token_t>{0}, opt);
    FAIL("no decode_error");
  } catch (const decode_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.rfind("specula: decode fault at step 0: ", 0) == 0);
    CHECK(what.find("specula:", 1) == std::string::npos);
    CHECK_THAT(what, Catch::Contains("logits[column 0]: infinite entry"));
  }
}
