// resident_speculative_decode (resident_sd.hpp) with its host stand-in ops: the loop's stepping
// that the device ops share, exercised without a GPU, with chain and tree drafts. Its output law
// is the target's (G-tests on the toy transformer; negative control: ops whose verification
// accepts the first-child path), and with top-k = 1 (one-hot p and q) it is greedy decoding of
// the shipped text model. Cool-SD (a relaxed rule) through the same loop samples the relaxed
// loop's exact law (testing::speculative_loop_law / speculative_tree_loop_law on the test kit's
// toy models), which the target's law fails.

#include <catch2/catch.hpp>

#include <filesystem>
#include <vector>

#include <specula/testing/goodness_of_fit.hpp>
#include <specula/testing/relaxation_analysis.hpp>
#include <specula/testing/toy_models.hpp>
#include <specula_example/resident_sd.hpp>

#include "toy_sd_gtest.hpp"

using namespace specula;
using namespace specula::example;

namespace {

/// Accepts the first-child path of every tree and emits its last token again: biased.
class accept_all_ops : public host_sd_ops {
 public:
  using host_sd_ops::host_sd_ops;
  index_t verify(const token_tree& tree, const request_rng&, std::span<token_t> out) {
    index_t k = 0;
    for (index_t u = tree.first_child(0); u >= 0; u = tree.first_child(u))
      out[static_cast<std::size_t>(k++)] = tree.token(u);
    out[static_cast<std::size_t>(k)] = k > 0 ? out[static_cast<std::size_t>(k - 1)] : tree.token(0);
    return k;
  }
};

/// check_toy_law for resident SD with host ops (and the biased ops) under `opt`.
void check_resident_toy_law(const resident_sd_options& opt) {
  const auto c = example::testing::toy_gtest_config();
  const auto tw = example::testing::random_weights(c, 71),
             dw = example::testing::random_weights(c, 72);
  const transformer target(tw), draft(dw);
  host_sd_ops ops(target, draft);
  accept_all_ops biased(target, draft);
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

}  // namespace

TEST_CASE("resident SD with host ops samples the toy transformer's sequence law (G-test)",
          "[backend][stats]") {
  resident_sd_options opt;
  opt.draft_length = 2;
  opt.max_new_tokens = 3;
  check_resident_toy_law(opt);
}

TEST_CASE(
    "resident SD with a dynamic draft length (p-min) samples the toy transformer's sequence law "
    "(G-test) and stops drafting",
    "[backend][stats]") {
  resident_sd_options opt;
  opt.draft_length = 2;
  opt.max_new_tokens = 3;
  opt.draft_p_min = 0.5f;
  check_resident_toy_law(opt);
  // The threshold stops some drafts: fewer draft passes than without it, same seeds.
  const auto c = example::testing::toy_gtest_config();
  const transformer target(example::testing::random_weights(c, 71)),
      draft(example::testing::random_weights(c, 72));
  host_sd_ops ops(target, draft);
  const std::vector<token_t> prompt{0};
  decode_stats with, without;
  resident_sd_options plain = opt;
  plain.draft_p_min = 0.0f;
  for (std::uint32_t r = 0; r < 200; ++r) {
    (void)resident_speculative_decode(ops, prompt, opt, request_rng{5, r, 0}, &with);
    (void)resident_speculative_decode(ops, prompt, plain, request_rng{5, r, 0}, &without);
  }
  INFO("draft passes: " << with.draft_forwards << " with p-min 0.5, " << without.draft_forwards
                        << " without");
  CHECK(with.draft_forwards < without.draft_forwards);
  CHECK(with.draft_forwards > 0);
}

TEST_CASE("resident tree SD with host ops samples the toy transformer's sequence law (G-test)",
          "[backend][stats]") {
  resident_sd_options opt;
  opt.draft_tree = trees::full(2, 2);  // two children per node, drawn without replacement
  opt.max_new_tokens = 3;
  check_resident_toy_law(opt);
}

TEST_CASE("resident Cool-SD with host ops samples the relaxed loop's exact law (G-test)",
          "[backend][stats]") {
  // V = 3, 4 positions (81 sequences), the Cool-SD tests' toy pair; 50 000 generations each.
  const specula::testing::toy_ar_model target(3, 4, 31);
  const auto draft = specula::testing::toy_ar_model::perturbed(target, 0.6, 32);
  scheduled_relaxed_rule rule;
  rule.schedule = relaxation_schedule::make_exponential(2.0, 0.7, 3);
  basic_host_sd_ops<specula::testing::toy_model_session> ops(target, draft);
  const std::vector<token_t> prompt{0};  // BOS
  for (const bool tree : {false, true}) {
    resident_sd_options opt;
    opt.draft_length = 3;
    opt.max_new_tokens = target.horizon();
    opt.relaxed = rule;
    if (tree) opt.draft_tree = trees::full(2, 2);
    const auto law =
        tree ? specula::testing::speculative_tree_loop_law(
                   target, draft, *opt.draft_tree, sibling_sampling::without_replacement, rule)
             : specula::testing::speculative_loop_law(target, draft, 3, rule);
    std::vector<std::uint64_t> counts(law.size(), 0);
    for (std::uint32_t r = 0; r < 50'000; ++r)
      ++counts[static_cast<std::size_t>(target.sequence_index(
          resident_speculative_decode(ops, prompt, opt, request_rng{21, r, 0})))];
    const auto g = specula::testing::g_test(counts, law);
    INFO((tree ? "tree drafts: " : "chain drafts: ") << g);
    CHECK(g.impossible_observations == 0);
    CHECK(g.p_value > 1e-4);
    // The relaxation distorts measurably: the target's law is rejected.
    CHECK(specula::testing::g_test(counts, target.sequence_law()).p_value < 1e-6);
  }
}

TEST_CASE(
    "resident Cool-SD with host ops on the toy transformer: omega = 1 keeps the target's "
    "law, omega = 2 does not",
    "[backend][stats]") {
  // The device test's twin (tests/cuda/model): shows without a GPU that it has power.
  const auto c = example::testing::toy_gtest_config();
  const auto tw = example::testing::random_weights(c, 71),
             dw = example::testing::random_weights(c, 72);
  const transformer target(tw), draft(dw);
  host_sd_ops ops(target, draft);
  example::testing::check_toy_relaxed_omega(ops, example::testing::toy_sequence_law(tw), 2000);
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
  for (const bool tree : {false, true}) {
    // Tree drafts: SJD-PAC's shape (3 candidates at the first level, then a chain: 8 nodes),
    // the candidates drawn from top-3 draft rows; with one-hot target rows the output is still
    // greedy decoding.
    if (tree) {
      opt.draft_tree = trees::sjd_pac(3, 1, 8);
      opt.draft.top_k = 3;
    }
    decode_stats st;
    for (const auto& text : decode_testing::text_prompts()) {
      const auto prompt = decode_testing::bytes(text);
      transformer_session ar(target);
      INFO("prompt " << text << (tree ? ", tree drafts" : ", chain drafts"));
      CHECK(resident_speculative_decode(ops, prompt, opt, request_rng{3, 0, 0}, &st) ==
            decode_testing::greedy_reference(ar, prompt, 32));
    }
    CHECK(st.step_compression() > 1.0);
    CHECK(st.tokens == 32 * static_cast<index_t>(decode_testing::text_prompts().size()));
  }
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
  opt.max_new_tokens = 4;
  opt.draft_p_min = 1.5f;
  CHECK_THROWS_WITH(resident_speculative_decode(ops, prompt, opt, {}),
                    Catch::Contains("draft_p_min"));
  opt.draft_p_min = 0.0f;
  opt.relaxed = scheduled_relaxed_rule{};
  opt.relaxed->schedule.delta = -1.0;
  CHECK_THROWS_WITH(resident_speculative_decode(ops, prompt, opt, {}),
                    Catch::Contains("schedule.delta"));
}
