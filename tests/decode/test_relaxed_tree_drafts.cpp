// Row-aware and scheduled rules in the draft-model loop with tree drafts: the loop's empirical
// law matches the exact law of testing::speculative_tree_loop_law (G-test) for LANTERN++ under
// Cool-SD's schedule (siblings without replacement) and for typical acceptance (i.i.d.
// siblings), the relaxation is measurable (the target law is rejected), and the law of a
// neighbouring rule is rejected (negative control). The tree loop law itself reduces to the
// target's law for the exact rule; LANTERN++ with
// λ = 0 decodes token for token like the ω-relaxed rule with the same schedule.

#include <catch2/catch.hpp>
#include <vector>

#include <specula/decode/batch.hpp>
#include <specula/decode/speculative.hpp>
#include <specula/rules/lantern.hpp>
#include <specula/rules/relaxed.hpp>
#include <specula/rules/typical.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula/testing/relaxation_analysis.hpp>
#include <specula/testing/toy_models.hpp>
#include <specula/tree/builders.hpp>

using namespace specula;
using specula::testing::toy_ar_model;
using specula::testing::toy_model_session;

namespace {

constexpr index_t vocab = 5;

/// Hand-made neighbour lists of 5 tokens on a line 0-1-2-3-4, 3 per token, nearest first (one
/// table for the whole program: rules hold views of it).
const neighbour_table& line_table() {
  static const neighbour_table table(
      {1, 2, 3, /**/ 0, 2, 3, /**/ 1, 3, 0, /**/ 2, 4, 1, /**/ 3, 2, 1}, vocab, 3);
  return table;
}

template <class Rule>
std::vector<std::uint64_t> tree_loop_counts(const toy_ar_model& target, const toy_ar_model& draft,
                                            const token_tree& shape, sibling_sampling sampling,
                                            const Rule& rule, std::uint32_t runs,
                                            std::uint64_t seed) {
  toy_model_session t(target), d(draft);
  speculative_options opt;
  opt.draft_tree = shape;
  opt.draft_sampling = sampling;
  opt.max_new_tokens = target.horizon();
  tree_verifier<host::sequential_policy, Rule> verify;
  verify.rule = rule;
  verify.options.sampling = sampling;
  const std::vector<token_t> prompt{0};
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(target.num_sequences()), 0);
  for (std::uint32_t r = 0; r < runs; ++r) {
    const auto out = speculative_decode(t, d, prompt, opt, request_rng{seed, r, 0}, verify);
    ++counts[static_cast<std::size_t>(target.sequence_index(out))];
  }
  return counts;
}

}  // namespace

TEST_CASE("the tree loop law is the target's law for the exact rule", "[decode][law][relaxed]") {
  const toy_ar_model target(vocab, 3, 61, 0.1);
  const toy_ar_model draft = toy_ar_model::perturbed(target, 0.7, 62, 0.1);
  const auto law = target.sequence_law();
  for (const auto sampling :
       {sibling_sampling::without_replacement, sibling_sampling::with_replacement})
    for (const token_tree& shape : {trees::full(2, 2), trees::full(3, 1), trees::chain(2)}) {
      const auto exact =
          testing::speculative_tree_loop_law(target, draft, shape, sampling, exact_rule{});
      CHECK(testing::max_abs_difference(exact, law) < 1e-12);
    }
}

namespace {

/// Samples the loop with `used` and checks the counts: they fit the exact loop law of `used`
/// (G-test), the relaxation is measurable (the target law is rejected), and the law of `other`, a
/// neighbouring rule, is rejected (negative control).
template <class Rule>
void check_tree_loop_law(const toy_ar_model& target, const toy_ar_model& draft,
                         const token_tree& shape, sibling_sampling sampling, const Rule& used,
                         const Rule& other, std::uint64_t seed) {
  const auto relaxed = testing::speculative_tree_loop_law(target, draft, shape, sampling, used);
  const auto counts = tree_loop_counts(target, draft, shape, sampling, used, 100'000, seed);
  const auto fit = testing::g_test(counts, relaxed);
  INFO("G-test against the exact loop law: " << fit);
  CHECK(fit.impossible_observations == 0);
  CHECK(fit.p_value > 1e-4);
  const auto law = target.sequence_law();
  INFO("TV(relaxed, target) " << testing::total_variation(relaxed, law));
  CHECK(testing::total_variation(relaxed, law) > 0.01);
  CHECK(testing::g_test(counts, law).p_value < 1e-6);
  const auto wrong = testing::speculative_tree_loop_law(target, draft, shape, sampling, other);
  INFO("law gap " << testing::max_abs_difference(wrong, relaxed));
  CHECK(testing::g_test(counts, wrong).p_value < 1e-6);
}

}  // namespace

TEST_CASE("LANTERN++ under Cool-SD's schedule with tree drafts follows the exact loop law",
          "[decode][stats][relaxed]") {
  // V = 5, 3 tokens (125 sequences); drafts: two siblings per node without replacement, two
  // levels. Negative control: lambda = 2.5.
  const toy_ar_model target(vocab, 3, 61, 0.1);
  const toy_ar_model draft = toy_ar_model::perturbed(target, 0.7, 62, 0.1);
  const auto schedule = relaxation_schedule::make_exponential(2.0, 0.7, 2);
  check_tree_loop_law(
      target, draft, trees::full(2, 2), sibling_sampling::without_replacement,
      scheduled_lantern_rule{lantern_rule::make_relative(line_table(), 1.0), schedule},
      scheduled_lantern_rule{lantern_rule::make_relative(line_table(), 2.5), schedule}, 17);
}

TEST_CASE("typical acceptance with i.i.d. tree drafts follows the exact loop law",
          "[decode][stats][relaxed]") {
  // Three i.i.d. siblings, then two below the first. Negative control: epsilon = 0.1.
  const toy_ar_model target(vocab, 3, 71, 0.1);
  const toy_ar_model draft = toy_ar_model::perturbed(target, 0.7, 72, 0.1);
  check_tree_loop_law(target, draft, trees::from_parents({-1, 0, 0, 0, 1, 1}),
                      sibling_sampling::with_replacement, typical_rule::make(0.2, 0.3),
                      typical_rule::make(0.1, 0.3), 23);
}

TEST_CASE("LANTERN++ with lambda 0 decodes like the omega-relaxed rule with the same schedule",
          "[decode][relaxed]") {
  const toy_ar_model target(vocab, 6, 81, 0.1);
  const toy_ar_model draft = toy_ar_model::perturbed(target, 0.7, 82, 0.1);
  const auto schedule = relaxation_schedule::make_linear(2.0, 8.0, 3);
  const scheduled_lantern_rule lantern{lantern_rule::make_relative(line_table(), 0.0), schedule};
  const scheduled_relaxed_rule relaxed{schedule};
  toy_model_session t(target), d(draft);
  speculative_options opt;
  opt.draft_tree = trees::full(2, 3);
  opt.max_new_tokens = target.horizon();
  tree_verifier<host::sequential_policy, scheduled_lantern_rule> va;
  va.rule = lantern;
  tree_verifier<host::sequential_policy, scheduled_relaxed_rule> vb;
  vb.rule = relaxed;
  const std::vector<token_t> prompt{0};
  decode_stats sa, sb;
  for (std::uint32_t r = 0; r < 300; ++r) {
    const auto a = speculative_decode(t, d, prompt, opt, request_rng{5, r, 0}, va, &sa);
    const auto b = speculative_decode(t, d, prompt, opt, request_rng{5, r, 0}, vb, &sb);
    CHECK(a == b);
  }
  CHECK(sa.target_forwards == sb.target_forwards);
}

TEST_CASE("the batched loop with one verifier per request equals each request decoded alone",
          "[decode][relaxed]") {
  // Per-request rules in a loop: request r is verified by verifiers[r] (LANTERN++ with its own
  // lambda and schedule), its output and statistics those of the request decoded alone.
  const toy_ar_model target(vocab, 7, 91, 0.1);
  const toy_ar_model draft = toy_ar_model::perturbed(target, 0.7, 92, 0.1);
  using verifier_type = tree_verifier<host::sequential_policy, scheduled_lantern_rule>;
  std::vector<verifier_type> verifiers(3);
  verifiers[0].rule = {lantern_rule::make_relative(line_table(), 0.5),
                       relaxation_schedule::make_uniform(1.0)};
  verifiers[1].rule = {lantern_rule::make_relative(line_table(), 3.0),
                       relaxation_schedule::make_exponential(2.0, 0.7, 2)};
  verifiers[2].rule = {lantern_rule::make_relative(line_table(), 1.0, resampling::lantern),
                       relaxation_schedule::make_linear(1.5, 8.0, 2)};
  speculative_options opt;
  opt.draft_tree = trees::full(2, 2);
  opt.max_new_tokens = 6;
  const std::vector<std::vector<token_t>> prompts = {{0}, {0, 2}, {0, 4, 1}};
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const std::vector<request_rng> rngs = {{seed, 0, 0}, {seed, 1, 0}, {seed, 2, 0}};
    session_batch<toy_model_session> tb(
        std::vector<toy_model_session>(3, toy_model_session(target)));
    session_batch<toy_model_session> db(
        std::vector<toy_model_session>(3, toy_model_session(draft)));
    std::vector<decode_stats> stats(3);
    const auto out = speculative_decode_batch(tb, db, prompts, opt, rngs,
                                              std::span<const verifier_type>(verifiers), stats);
    for (std::size_t r = 0; r < 3; ++r) {
      toy_model_session t(target), d(draft);
      decode_stats alone;
      CHECK(out[r] == speculative_decode(t, d, prompts[r], opt, rngs[r], verifiers[r], &alone));
      CHECK(stats[r].target_forwards == alone.target_forwards);
    }
  }
  session_batch<toy_model_session> tb(std::vector<toy_model_session>(3, toy_model_session(target)));
  session_batch<toy_model_session> db(std::vector<toy_model_session>(3, toy_model_session(draft)));
  const std::vector<request_rng> rngs = {{1, 0, 0}, {1, 1, 0}, {1, 2, 0}};
  try {
    (void)speculative_decode_batch(tb, db, prompts, opt, rngs,
                                   std::span<const verifier_type>(verifiers.data(), 2));
    FAIL("two verifiers for three prompts were accepted");
  } catch (const invalid_input& e) {
    CHECK(std::string(e.argument()) == "verifiers");
  }
}
