// Speculative decoding with a proposal as the draft (decode/lookup.hpp): the n-gram proposal's
// drafts against hand-derived ones, the loop lossless in law (G-test against the toy target's
// sequence law, with a biased verifier as negative control), greedy equal to greedy decoding
// with chains and trees, batched equal to solo, bad input.

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include <specula/decode/batch.hpp>
#include <specula/decode/lookup.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula/testing/toy_models.hpp>
#include <specula_example/sessions.hpp>

#include "decode_test_util.hpp"

using namespace specula;
using specula::testing::toy_ar_model;
using specula::testing::toy_model_session;

namespace {

/// The drafted (parent, token) pairs of a proposal's tree, node order.
std::vector<std::pair<index_t, token_t>> drafted(ngram_proposal& p, std::vector<token_t> context) {
  token_tree tree;
  std::vector<float> q;
  CHECK_FALSE(p.propose(context, tree, q));
  CHECK(tree.token(0) == context.back());
  std::vector<std::pair<index_t, token_t>> r;
  for (index_t i = 1; i < tree.size(); ++i) r.emplace_back(tree.parent(i), tree.token(i));
  return r;
}

using drafts = std::vector<std::pair<index_t, token_t>>;

}  // namespace

TEST_CASE("the n-gram proposal drafts what followed the last match", "[decode]") {
  ngram_options o;
  o.max_ngram = 2;
  o.draft_length = 3;
  ngram_proposal p(o);
  // Suffix (1, 2) occurred at positions 0..1: draft what followed, 3 4 5.
  CHECK(drafted(p, {1, 2, 3, 4, 5, 1, 2}) == drafts{{0, 3}, {1, 4}, {2, 5}});
  // Extended context: suffix (2, 7) never occurred, (7) neither: no drafts.
  CHECK(drafted(p, {1, 2, 3, 4, 5, 1, 2, 7}).empty());
  // Suffix (5): two occurrences; the most recent one (position 4) is followed by 1 2 7.
  CHECK(drafted(p, {1, 2, 3, 4, 5, 1, 2, 7, 5}) == drafts{{0, 1}, {1, 2}, {2, 7}});
  // A new request (not an extension): the index is rebuilt. The continuation stops at the end.
  CHECK(drafted(p, {9, 8, 9}) == drafts{{0, 8}, {1, 9}});
  // The longest suffix wins: (3, 1) matches at 2..3 (then 5), although (1) last matched at 4.
  CHECK(drafted(p, {0, 0, 3, 1, 5, 1, 6, 3, 1}) == drafts{{0, 5}, {1, 1}, {2, 6}});
}

TEST_CASE("the n-gram proposal merges several continuations into a tree", "[decode]") {
  ngram_options o;
  o.max_ngram = 1;
  o.draft_length = 2;
  o.max_branches = 3;
  ngram_proposal p(o);
  // Suffix (1) occurred at 0 (then 2 3), 3 (then 4 1), 5 (then 2 5): most recent first, the
  // branches 2-5, 4-1, and 2-3 sharing its first node with 2-5.
  CHECK(drafted(p, {1, 2, 3, 1, 4, 1, 2, 5, 1}) == drafts{{0, 2}, {1, 5}, {0, 4}, {3, 1}, {1, 3}});
}

TEST_CASE("n-gram speculative decoding is lossless", "[decode][stats]") {
  const toy_ar_model target(3, 6, 4242);
  toy_model_session t(target);
  ngram_options o;
  o.max_ngram = 2;
  o.draft_length = 3;
  o.max_branches = 2;
  ngram_proposal draft(o);
  speculative_options opt;
  opt.max_new_tokens = 6;
  const std::vector<token_t> prompt{0};
  const auto law = target.sequence_law();
  std::vector<std::uint64_t> counts(law.size(), 0), biased(law.size(), 0);
  decode_stats st;
  for (std::uint32_t r = 0; r < 200'000; ++r)
    ++counts[static_cast<std::size_t>(target.sequence_index(
        speculative_decode(t, draft, prompt, opt, request_rng{5, r, 0}, tree_verifier<>{}, &st)))];
  decode_testing::check_sequence_law(counts, law, st, 1'200'000);
  // Negative control: accepting every drafted path is visibly biased.
  for (std::uint32_t r = 0; r < 50'000; ++r)
    ++biased[static_cast<std::size_t>(target.sequence_index(speculative_decode(
        t, draft, prompt, opt, request_rng{5, r, 0}, decode_testing::first_path_verifier{})))];
  CHECK(testing::g_test(biased, law).p_value < 1e-9);
}

TEST_CASE("greedy n-gram speculative decoding equals greedy decoding", "[decode][models]") {
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto model = example::transformer::load(dir / "text-target.safetensors");
  example::transformer_session target(model);
  speculative_options opt;
  opt.max_new_tokens = 40;
  std::vector<std::vector<token_t>> prompts;
  for (const auto& text : decode_testing::text_prompts())
    prompts.push_back(decode_testing::bytes(text));
  for (const index_t branches : {1, 3}) {
    ngram_options o;
    o.max_branches = branches;
    ngram_proposal draft(o);
    decode_stats st;
    for (const auto& prompt : prompts) {
      example::transformer_session ar(model);
      CHECK(speculative_decode(target, draft, prompt, opt, request_rng{}, greedy_tree_verifier<>{},
                               &st) == decode_testing::greedy_reference(ar, prompt, 40));
    }
    INFO("branches " << branches << ", step compression " << st.step_compression());
    CHECK(st.step_compression() > 1.0);
  }
  // Batched and sampled: each request equals its solo run.
  std::vector<ngram_proposal> drafts(prompts.size());
  std::vector<request_rng> rngs;
  for (std::size_t r = 0; r < prompts.size(); ++r)
    rngs.push_back({3, static_cast<std::uint32_t>(r), 0});
  session_batch<example::transformer_session> batch(std::vector<example::transformer_session>(
      prompts.size(), example::transformer_session(model)));
  const auto out =
      speculative_decode_batch(batch, std::span<ngram_proposal>(drafts), prompts, opt, rngs);
  ngram_proposal solo;
  for (std::size_t r = 0; r < prompts.size(); ++r)
    CHECK(out[r] == speculative_decode(target, solo, prompts[r], opt, rngs[r]));
}

namespace {
/// A proposal whose tree does not start at the last token.
struct wrong_root {
  bool propose(std::span<const token_t> context, token_tree& tree, std::vector<float>&) {
    tree = token_tree({-1, 0}, {static_cast<token_t>(context.back() + 1), 0});
    return false;
  }
};
/// A stochastic proposal that forgets its q rows.
struct no_rows {
  bool propose(std::span<const token_t> context, token_tree& tree, std::vector<float>&) {
    tree = token_tree({-1, 0}, {context.back(), 0});
    return true;
  }
};
}  // namespace

TEST_CASE("proposal-driven decoding rejects bad input", "[decode][bad_input]") {
  for (const auto& [field, value] :
       std::vector<std::pair<int, index_t>>{{0, 0}, {1, 0}, {2, 0}, {3, 0}}) {
    ngram_options o;
    if (field == 0) o.min_ngram = value;
    if (field == 1) o.max_ngram = value;
    if (field == 2) o.draft_length = value;
    if (field == 3) o.max_branches = value;
    CHECK_THROWS_AS(ngram_proposal(o), invalid_input);
  }
  const toy_ar_model target(3, 5, 1);
  toy_model_session t(target);
  speculative_options opt;
  opt.max_new_tokens = 3;
  wrong_root w;
  CHECK_THROWS_WITH(speculative_decode(t, w, std::vector<token_t>{0}, opt, request_rng{}),
                    Catch::Contains("proposal") && Catch::Contains("root"));
  no_rows n;
  CHECK_THROWS_WITH(speculative_decode(t, n, std::vector<token_t>{0}, opt, request_rng{}),
                    Catch::Contains("proposal") && Catch::Contains("q_rows"));
}
