// Draft-model speculative decoding: its output law is the target's (G-test on toy models with a
// known law, with a biased verifier as the negative control), greedy SD equals greedy decoding
// on the shipped models, and bad input is rejected.

#include <catch2/catch.hpp>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <specula/decode/speculative.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula/testing/toy_models.hpp>
#include <specula/tree/builders.hpp>
#include <specula_example/sessions.hpp>

#include "decode_test_util.hpp"

using namespace specula;
using specula::testing::toy_ar_model;
using specula::testing::toy_model_session;

namespace {

template <class Verifier>
std::vector<std::uint64_t> sd_sequence_counts(const toy_ar_model& target_model,
                                              const toy_ar_model& draft_model,
                                              speculative_options opt, std::uint32_t runs,
                                              std::uint64_t seed, const Verifier& v,
                                              decode_stats* stats) {
  toy_model_session target(target_model), draft(draft_model);
  opt.max_new_tokens = target_model.horizon();
  const std::vector<token_t> prompt{0};  // BOS
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(target_model.num_sequences()), 0);
  for (std::uint32_t r = 0; r < runs; ++r) {
    const auto out =
        speculative_decode(target, draft, prompt, opt, request_rng{seed, r, 0}, v, stats);
    REQUIRE(static_cast<index_t>(out.size()) == target_model.horizon());
    ++counts[static_cast<std::size_t>(target_model.sequence_index(out))];
  }
  return counts;
}

}  // namespace

TEST_CASE("speculative decoding samples the target's sequence law (G-test)", "[decode][stats]") {
  // V = 4, 4 positions: 256 sequences, 10^6 generations; the draft is the target mixed half
  // and half with a random sparse model, so many drafts are rejected and residuals matter.
  const toy_ar_model target(4, 4, 101);
  const toy_ar_model draft = toy_ar_model::perturbed(target, 0.5, 202);
  const auto law = target.sequence_law();
  decode_stats st;
  speculative_options opt;
  opt.draft_length = 3;
  const auto counts = sd_sequence_counts(target, draft, opt, 1'000'000, 7, tree_verifier<>{}, &st);
  const auto g = specula::testing::g_test(counts, law);
  INFO(g);
  CHECK(g.impossible_observations == 0);
  CHECK(g.p_value > 1e-4);
  // The loop's accounting: every generation produced 4 tokens over its steps.
  CHECK(st.tokens == 4'000'000);
  CHECK(st.target_forwards == st.steps);
  CHECK(st.step_compression() > 1.2);  // drafts were accepted
  CHECK(st.accepted_histogram.size() == 4);

  // Negative control: accepting every draft samples a different law and must fail.
  const auto biased = sd_sequence_counts(target, draft, opt, 200'000, 8,
                                         decode_testing::accept_all_verifier{}, nullptr);
  CHECK(specula::testing::g_test(biased, law).p_value < 1e-6);
}

TEST_CASE("speculative decoding with tree drafts samples the target's sequence law (G-tests)",
          "[decode][stats]") {
  // Full binary draft trees of depth 2 (7 nodes): siblings drawn without replacement (10^6
  // generations) and with replacement, each verified with the matching tree rule.
  const toy_ar_model target(4, 4, 101);
  const toy_ar_model draft = toy_ar_model::perturbed(target, 0.5, 202);
  const auto law = target.sequence_law();
  speculative_options opt;
  opt.draft_tree = trees::full(2, 2);
  {
    decode_stats st;
    const auto counts =
        sd_sequence_counts(target, draft, opt, 1'000'000, 17, tree_verifier<>{}, &st);
    decode_testing::check_sequence_law(counts, law, st, 4'000'000);
    CHECK(st.draft_forwards <= 2 * st.steps);  // one draft pass per level
  }
  {
    opt.draft_sampling = sibling_sampling::with_replacement;
    tree_verifier<> v;
    v.options.sampling = sibling_sampling::with_replacement;
    decode_stats st;
    const auto counts = sd_sequence_counts(target, draft, opt, 1'000'000, 18, v, &st);
    decode_testing::check_sequence_law(counts, law, st, 4'000'000);
  }
  // Negative control: accepting the first path whatever the target says must fail.
  opt.draft_sampling = sibling_sampling::without_replacement;
  const auto biased = sd_sequence_counts(target, draft, opt, 200'000, 19,
                                         decode_testing::first_path_verifier{}, nullptr);
  CHECK(specula::testing::g_test(biased, law).p_value < 1e-6);
}

namespace {

/// A toy session that records the node count of every evaluation (the draft's passes).
struct counting_session : toy_model_session {
  using toy_model_session::toy_model_session;
  std::vector<index_t> pass_nodes, pass_widths;
  void evaluate(const token_tree& nodes, batch_view<float> logits) {
    pass_nodes.push_back(nodes.size());
    pass_widths.push_back(nodes.max_width());
    toy_model_session::evaluate(nodes, logits);
  }
};

}  // namespace

TEST_CASE("narrow draft trees sample the target's sequence law and draft like chains",
          "[decode][stats]") {
  // Trees whose levels have one node with children (a chain with alternatives: SJD-PAC's
  // first-path siblings) and a tree that branches, then narrows: the draft commits the nodes
  // above the deepest common ancestor of each level's parents and evaluates only the rest.
  const toy_ar_model target(4, 4, 101);
  const toy_ar_model draft = toy_ar_model::perturbed(target, 0.5, 202);
  const auto law = target.sequence_law();
  // 0 -> {1, 2}; 1 -> {3, 4}; 2 -> {5}; 3 -> {6, 7}: level 1 branches (root is the common
  // ancestor), level 2 narrows to node 3 (root and node 1 committed).
  const token_tree narrowing = trees::from_parents({-1, 0, 0, 1, 1, 2, 3, 3});
  for (const token_tree& shape : {trees::first_path_siblings(2, 3), narrowing}) {
    speculative_options opt;
    opt.draft_tree = shape;
    decode_stats st;
    const auto counts =
        sd_sequence_counts(target, draft, opt, 1'000'000, 23, tree_verifier<>{}, &st);
    decode_testing::check_sequence_law(counts, law, st, 4'000'000);
    const auto biased = sd_sequence_counts(target, draft, opt, 200'000, 24,
                                           decode_testing::first_path_verifier{}, nullptr);
    CHECK(specula::testing::g_test(biased, law).p_value < 1e-6);
  }

  // The passes: a step's first (the tokens the draft lacks, ending at the root) is a chain, and
  // a chain with alternatives then evaluates one node per level, never a leaf sibling: every
  // pass is a chain, and at most one per step has more than one node.
  toy_model_session t(target);
  counting_session d(draft);
  speculative_options opt;
  opt.draft_tree = trees::first_path_siblings(3, 3);
  opt.max_new_tokens = 4;
  for (std::uint32_t r = 0; r < 200; ++r) {
    d.pass_nodes.clear();
    d.pass_widths.clear();
    decode_stats st;
    (void)speculative_decode(t, d, std::vector<token_t>{0}, opt, request_rng{5, r, 0},
                             tree_verifier<>{}, &st);
    index_t first_passes = 0;
    for (std::size_t k = 0; k < d.pass_nodes.size(); ++k) {
      if (d.pass_nodes[k] != 1) ++first_passes;
      CHECK(d.pass_widths[k] <= 1);
    }
    CHECK(st.draft_forwards == static_cast<index_t>(d.pass_nodes.size()));
    INFO("passes with more than one node: " << first_passes);
    CHECK(first_passes <= st.steps);
  }
}

TEST_CASE("chain-shaped draft trees reproduce chain drafts exactly", "[decode]") {
  // The tree drafter (one uncommitted draft pass per level) and the chain drafter (the draft's
  // cache extended token by token) draw from the same rows with the same draws.
  const toy_ar_model target(4, 5, 111);
  const toy_ar_model draft_model = toy_ar_model::perturbed(target, 0.4, 112);
  toy_model_session t(target), d(draft_model);
  for (const draft_mode mode : {draft_mode::sample, draft_mode::greedy}) {
    speculative_options chain, tree;
    chain.draft_length = 3;
    chain.max_new_tokens = tree.max_new_tokens = 5;
    chain.mode = tree.mode = mode;
    tree.draft_tree = trees::chain(3);
    for (std::uint32_t r = 0; r < 300; ++r) {
      decode_stats a, b;
      const auto x = speculative_decode(t, d, std::vector<token_t>{0}, chain, request_rng{4, r, 0},
                                        tree_verifier<>{}, &a);
      const auto y = speculative_decode(t, d, std::vector<token_t>{0}, tree, request_rng{4, r, 0},
                                        tree_verifier<>{}, &b);
      REQUIRE(x == y);
      REQUIRE(a.accepted_histogram == b.accepted_histogram);
    }
  }
}

TEST_CASE("speculative decoding with greedy drafts and one-hot verification is lossless",
          "[decode][stats]") {
  const toy_ar_model target(3, 5, 303);
  const toy_ar_model draft = toy_ar_model::perturbed(target, 0.7, 404);
  toy_model_session t(target), d(draft);
  speculative_options opt;
  opt.draft_length = 2;
  opt.max_new_tokens = 5;
  opt.mode = draft_mode::greedy;
  const std::vector<token_t> prompt{0};
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(target.num_sequences()), 0);
  for (std::uint32_t r = 0; r < 300'000; ++r)
    ++counts[static_cast<std::size_t>(
        target.sequence_index(speculative_decode(t, d, prompt, opt, request_rng{9, r, 0})))];
  const auto g = specula::testing::g_test(counts, target.sequence_law());
  INFO(g);
  CHECK(g.p_value > 1e-4);
}

TEST_CASE("speculative decoding is reproducible per request seed", "[decode]") {
  const toy_ar_model target(4, 5, 505);
  const toy_ar_model draft = toy_ar_model::perturbed(target, 0.3, 606);
  toy_model_session t(target), d(draft);
  speculative_options opt;
  opt.max_new_tokens = 5;
  const std::vector<token_t> prompt{0};
  const auto a = speculative_decode(t, d, prompt, opt, request_rng{1, 3, 0});
  const auto b = speculative_decode(t, d, prompt, opt, request_rng{1, 3, 0});
  CHECK(a == b);
  int differ = 0;
  for (std::uint32_t r = 0; r < 20; ++r)
    differ += speculative_decode(t, d, prompt, opt, request_rng{1, r, 0}) != a ? 1 : 0;
  CHECK(differ > 0);
}

TEST_CASE("greedy speculative decoding equals greedy decoding of the target model",
          "[decode][models]") {
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto target_model = example::transformer::load(dir / "text-target.safetensors");
  const auto draft_model = example::transformer::load(dir / "text-draft.safetensors");
  example::transformer_session target(target_model), draft(draft_model);
  speculative_options opt;
  opt.max_new_tokens = 40;
  opt.mode = draft_mode::greedy;
  for (const index_t gamma : {1, 4, 7, -1, -2, -3}) {
    // gamma -1, -2, -3: greedy draft trees (top-2 children at two levels; the SJD-PAC shape;
    // two siblings per level on the first path, five levels).
    opt.draft_length = std::max<index_t>(gamma, 0);
    if (gamma == -1) opt.draft_tree = trees::full(2, 2);
    if (gamma == -2) opt.draft_tree = trees::sjd_pac(3, 1, 8);
    if (gamma == -3) opt.draft_tree = trees::first_path_siblings(2, 5);
    decode_stats st;
    INFO("draft length " << gamma);
    decode_testing::check_greedy_sd_on_text(
        target, draft, opt, [&] { return example::transformer_session(target_model); }, &st);
    CHECK(st.step_compression() > 1.0);
  }
}

TEST_CASE("speculative decoding rejects bad input", "[decode]") {
  const toy_ar_model target(4, 3, 1), other(5, 3, 2);
  toy_model_session t(target), d(other), d4(target);
  speculative_options opt;
  const std::vector<token_t> prompt{0};
  const auto msg = [](auto&& f) {
    try {
      f();
    } catch (const invalid_input& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(msg([&] { (void)speculative_decode(t, d, prompt, opt, request_rng{}); }),
             Catch::Contains("draft"));
  CHECK_THAT(
      msg([&] { (void)speculative_decode(t, d4, std::vector<token_t>{}, opt, request_rng{}); }),
      Catch::Contains("prompt"));
  opt.draft_length = -1;
  CHECK_THAT(msg([&] { (void)speculative_decode(t, d4, prompt, opt, request_rng{}); }),
             Catch::Contains("draft_length"));
  opt.draft_length = 2;
  opt.max_new_tokens = 0;
  CHECK_THAT(msg([&] { (void)speculative_decode(t, d4, prompt, opt, request_rng{}); }),
             Catch::Contains("max_new_tokens"));
  opt.max_new_tokens = 3;
  opt.target.temperature = 0.0f;
  CHECK_THAT(msg([&] { (void)speculative_decode(t, d4, prompt, opt, request_rng{}); }),
             Catch::Contains("temperature"));
  opt.target.temperature = 1.0f;
  // Tree drafts drawn with replacement cannot be verified by the without-replacement rule.
  opt.draft_tree = trees::full(2, 1);
  opt.draft_sampling = sibling_sampling::with_replacement;
  CHECK_THAT(msg([&] { (void)speculative_decode(t, d4, prompt, opt, request_rng{}); }),
             Catch::Contains("draft_sampling"));
}
