// resident_speculative_decode (resident_sd.hpp) with its host stand-in ops: the loop's stepping
// that the device ops share, exercised without a GPU. Its output law is the target's (G-test on
// the toy transformer; negative control: ops whose verification accepts every draft), and with
// top-k = 1 (one-hot p and q) it is greedy decoding of the shipped text model.

#include <catch2/catch.hpp>

#include <filesystem>
#include <vector>

#include <specula_example/resident_sd.hpp>

#include "toy_sd_gtest.hpp"

using namespace specula;
using namespace specula::example;

namespace {

/// Accepts every draft and emits the last draft again: biased.
class accept_all_ops : public host_sd_ops {
 public:
  using host_sd_ops::host_sd_ops;
  index_t verify(std::span<const token_t> chain, const request_rng&, std::span<token_t> out) {
    for (std::size_t k = 1; k < chain.size(); ++k) out[k - 1] = chain[k];
    out[chain.size() - 1] = chain.back();
    return static_cast<index_t>(chain.size()) - 1;
  }
};

}  // namespace

TEST_CASE("resident SD with host ops samples the toy transformer's sequence law (G-test)",
          "[backend][stats]") {
  const auto c = example::testing::toy_gtest_config();
  const auto tw = example::testing::random_weights(c, 71),
             dw = example::testing::random_weights(c, 72);
  const transformer target(tw), draft(dw);
  host_sd_ops ops(target, draft);
  accept_all_ops biased(target, draft);
  resident_sd_options opt;
  opt.draft_length = 2;
  opt.max_new_tokens = 3;
  const std::vector<token_t> prompt{0};
  example::testing::check_toy_law(
      [&](const request_rng& rng, decode_stats* st) {
        return resident_speculative_decode(ops, prompt, opt, rng, st);
      },
      [&](const request_rng& rng, decode_stats* st) {
        return resident_speculative_decode(biased, prompt, opt, rng, st);
      },
      example::testing::toy_sequence_law(tw));
}

TEST_CASE("resident SD with top-k = 1 equals greedy decoding of the shipped text model",
          "[backend][models]") {
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto target = transformer::load(dir / "text-target.safetensors");
  const auto draft = transformer::load(dir / "text-draft.safetensors");
  host_sd_ops ops(target, draft);
  resident_sd_options opt;
  opt.max_new_tokens = 32;
  opt.target.top_k = 1;
  opt.draft.top_k = 1;
  decode_stats st;
  for (const auto& text : decode_testing::text_prompts()) {
    const auto prompt = decode_testing::bytes(text);
    transformer_session ar(target);
    INFO("prompt " << text);
    CHECK(resident_speculative_decode(ops, prompt, opt, request_rng{3, 0, 0}, &st) ==
          decode_testing::greedy_reference(ar, prompt, 32));
  }
  CHECK(st.step_compression() > 1.0);
  CHECK(st.tokens == 32 * static_cast<index_t>(decode_testing::text_prompts().size()));
}

TEST_CASE("resident SD rejects bad input", "[backend][bad_input]") {
  const auto w = example::testing::random_weights(example::testing::small_config(), 3);
  const transformer m(w);
  host_sd_ops ops(m, m);
  resident_sd_options opt;
  const std::vector<token_t> prompt{1, 2};
  CHECK_THROWS_WITH(resident_speculative_decode(ops, std::span<const token_t>(), opt, {}),
                    Catch::Contains("prompt"));
  opt.draft_length = -1;
  CHECK_THROWS_WITH(resident_speculative_decode(ops, prompt, opt, {}),
                    Catch::Contains("draft_length"));
  opt.draft_length = 2;
  opt.max_new_tokens = 0;
  CHECK_THROWS_WITH(resident_speculative_decode(ops, prompt, opt, {}),
                    Catch::Contains("max_new_tokens"));
}
