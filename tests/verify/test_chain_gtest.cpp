// Sequence-level G-tests: 10^6 speculative generations on a toy AR model (V = 5, 4 positions)
// through the public checked batch API, against the model's exact sequence law; and the same
// test on a verifier with a planted bias, which must fail.

#include <catch2/catch.hpp>
#include <vector>

#include "chain_test_util.hpp"
#include "specula/testing/catch2.hpp"
#include "specula/testing/goodness_of_fit.hpp"
#include "specula/testing/speculative_harness.hpp"
#include "specula/verify/chain.hpp"

using namespace specula;

namespace {

/// Verifies a harness problem with the public batch entry point (B = 1, flattened layout, float
/// rows), optionally with one-hot drafts.
template <class Rule>
struct batch_api_verifier {
  Rule rule{};
  bool one_hot = false;

  void operator()(const testing::chain_problem& pr, std::vector<token_t>& emitted) const {
    const auto length = static_cast<index_t>(pr.drafts.size());
    const index_t vocab = pr.vocab;
    std::vector<float> target, draft;
    for (auto r : pr.target_rows) target.insert(target.end(), r.begin(), r.end());
    for (auto r : pr.draft_rows) draft.insert(draft.end(), r.begin(), r.end());
    const std::vector<index_t> offsets = {0, length};
    const std::vector<request_rng> rng = {pr.rng};
    std::vector<token_t> out(static_cast<std::size_t>(length + 1));
    std::vector<std::int32_t> accepted(1);
    chain_batch_input<float> in;
    in.vocab_size = vocab;
    in.draft_offsets = offsets;
    in.draft_tokens = {pr.drafts.data(), length};
    if (!one_hot) in.draft_probs = {draft.data(), length, vocab};
    in.target_probs = {target.data(), length + 1, vocab};
    in.rng = rng;
    verify_chain(host::seq, in, chain_batch_output{out, accepted, {}, {}}, {}, rule);
    emitted.assign(out.begin(), out.begin() + accepted[0] + 1);
  }
};

constexpr std::uint64_t gtest_runs = 1'000'000;
constexpr double alpha = 1e-4;

}  // namespace

TEST_CASE("G-test: speculative decoding reproduces the toy model's sequence law",
          "[verify][stats]") {
  const testing::toy_ar_model target(5, 4, 2024, 0.3);
  const auto draft = testing::toy_ar_model::perturbed(target, 0.6, 77, 0.3);
  const auto law = target.sequence_law();

  SECTION("dense draft rows, draft length 3") {
    const auto counts = testing::speculative_sequence_counts(target, draft, 3, gtest_runs, 1,
                                                             batch_api_verifier<exact_rule>{});
    SPECULA_REQUIRE_FITS(counts, law, alpha);
  }
  SECTION("one-hot drafts, draft length 2") {
    const auto counts = testing::speculative_sequence_counts(
        target, draft, 2, gtest_runs, 2, batch_api_verifier<exact_rule>{exact_rule{}, true});
    SPECULA_REQUIRE_FITS(counts, law, alpha);
  }
}

TEST_CASE("negative control: the same G-test rejects a verifier with a planted bias",
          "[verify][stats]") {
  const testing::toy_ar_model target(5, 4, 2024, 0.3);
  const auto draft = testing::toy_ar_model::perturbed(target, 0.6, 77, 0.3);
  const auto law = target.sequence_law();

  SECTION("residual resampled from p instead of [p - q]+") {
    const auto counts = testing::speculative_sequence_counts(
        target, draft, 3, gtest_runs, 1, batch_api_verifier<test::resample_from_target_rule>{});
    SPECULA_REQUIRE_MISFITS(counts, law, alpha);
  }
  SECTION("residual |p - q| without the max") {
    const auto counts = testing::speculative_sequence_counts(
        target, draft, 3, gtest_runs, 1, batch_api_verifier<test::absolute_residual_rule>{});
    SPECULA_REQUIRE_MISFITS(counts, law, alpha);
  }
}

TEST_CASE("G-test on the per-request algorithm with double rows (testing-kit adapter)",
          "[verify][stats]") {
  const testing::toy_ar_model target(4, 4, 99, 0.4);
  const auto draft = testing::toy_ar_model::perturbed(target, 1.0, 5, 0.4);  // unrelated draft
  const auto counts = testing::speculative_sequence_counts(target, draft, 3, 200'000, 3,
                                                           testing::rule_chain_verifier<>{});
  SPECULA_REQUIRE_FITS(counts, target.sequence_law(), alpha);
}
