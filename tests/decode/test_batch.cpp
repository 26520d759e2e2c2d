// Batched decoding loops: several requests decoded together, sharing forward passes. Each
// request's output and statistics equal the same request decoded alone (toy models, whose
// batched rows equal the single-request rows bit for bit); greedy loops batched on the shipped
// models equal greedy decoding; the passes are really shared; bad batch arguments are rejected.

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <specula/decode/batch.hpp>
#include <specula/decode/jacobi.hpp>
#include <specula/decode/multiblock.hpp>
#include <specula/decode/sjd.hpp>
#include <specula/decode/speculative.hpp>
#include <specula/decode/ssd.hpp>
#include <specula/testing/toy_models.hpp>
#include <specula_example/sessions.hpp>

#include "decode_test_util.hpp"

using namespace specula;
using decode_testing::rngs_for;
using specula::testing::toy_ar_model;
using specula::testing::toy_masked_model;
using specula::testing::toy_model_session;

namespace {

/// session_batch that counts its batched calls and the requests they carried.
class counting_batch : public session_batch<toy_model_session> {
 public:
  using session_batch::session_batch;
  void evaluate(std::span<const index_t> requests, std::span<const token_tree> trees,
                batch_view<float> logits) {
    ++calls;
    max_requests = std::max<index_t>(max_requests, static_cast<index_t>(requests.size()));
    session_batch::evaluate(requests, trees, logits);
  }
  index_t calls = 0, max_requests = 0;
};

counting_batch toy_batch(const toy_ar_model& m, index_t n) {
  return counting_batch(
      std::vector<toy_model_session>(static_cast<std::size_t>(n), toy_model_session(m)));
}

/// Prompts of different lengths (BOS first), so requests finish at different steps.
const std::vector<std::vector<token_t>>& toy_prompts() {
  static const std::vector<std::vector<token_t>> p{{0}, {0, 1}, {0, 3, 2}, {0, 2}, {0, 1, 1, 3}};
  return p;
}

void check_same_stats(const decode_stats& batched, const decode_stats& alone) {
  CHECK(batched.tokens == alone.tokens);
  CHECK(batched.steps == alone.steps);
  CHECK(batched.target_forwards == alone.target_forwards);
  CHECK(batched.draft_forwards == alone.draft_forwards);
  CHECK(batched.accepted_histogram == alone.accepted_histogram);
  CHECK(batched.step_tokens == alone.step_tokens);
}

/// Runs `batched(model, prompts, rngs, stats)` once and `alone(session, prompt, rng, stats)` per
/// request; outputs and statistics must agree, and the batch must have shared its passes.
template <class Batched, class Alone>
void check_batch_equals_alone(const toy_ar_model& target, Batched&& batched, Alone&& alone) {
  const auto& prompts = toy_prompts();
  for (const std::uint64_t seed : {3u, 11u, 29u}) {
    const auto rngs = rngs_for(prompts.size(), seed);
    counting_batch m = toy_batch(target, static_cast<index_t>(prompts.size()) + 1);
    std::vector<decode_stats> st(prompts.size());
    const auto out = batched(m, prompts, rngs, st);
    REQUIRE(out.size() == prompts.size());
    index_t most = 0, total = 0;
    for (std::size_t r = 0; r < prompts.size(); ++r) {
      toy_model_session s(target);
      decode_stats one;
      INFO("seed " << seed << ", request " << r);
      CHECK(out[r] == alone(s, prompts[r], rngs[r], one));
      check_same_stats(st[r], one);
      most = std::max(most, one.target_forwards + one.draft_forwards);
      total += one.target_forwards + one.draft_forwards;
    }
    // Shared passes: one batched call per round, never more than the slowest request needs.
    CHECK(m.calls <= most + 1);
    CHECK(m.calls < total);
    CHECK(m.max_requests > 1);
  }
}

}  // namespace

TEST_CASE("batched speculative decoding equals each request decoded alone", "[decode]") {
  const toy_ar_model target(4, 7, 71);
  const toy_ar_model draft_model = toy_ar_model::perturbed(target, 0.5, 72);
  for (const bool tree : {false, true}) {
    speculative_options opt;
    opt.draft_length = 3;
    opt.max_new_tokens = 6;
    if (tree) opt.draft_tree = trees::full(2, 2);
    INFO((tree ? "tree drafts" : "chain drafts"));
    const auto& prompts = toy_prompts();
    counting_batch drafts = toy_batch(draft_model, static_cast<index_t>(prompts.size()));
    check_batch_equals_alone(
        target,
        [&](auto& m, const auto& p, const auto& rngs, auto& st) {
          return speculative_decode_batch(m, drafts, p, opt, rngs, tree_verifier<>{}, st);
        },
        [&](auto& s, const auto& p, const request_rng& rng, decode_stats& st) {
          toy_model_session d(draft_model);
          return speculative_decode(s, d, p, opt, rng, tree_verifier<>{}, &st);
        });
    CHECK(drafts.max_requests > 1);
  }
}

TEST_CASE("batched SJD-PAC equals each request decoded alone", "[decode]") {
  const toy_ar_model target(4, 7, 81);
  for (const bool pd : {false, true}) {
    sjd_options opt = sjd_options::sjd_pac(4, 2, 1);
    opt.proactive_drafting = pd;
    opt.max_new_tokens = 6;
    check_batch_equals_alone(
        target,
        [&](auto& m, const auto& p, const auto& rngs, auto& st) {
          return sjd_decode_batch(m, p, opt, rngs, {}, st);
        },
        [&](auto& s, const auto& p, const request_rng& rng, decode_stats& st) {
          return sjd_decode(s, p, opt, rng, &st);
        });
  }
}

TEST_CASE("batched Jacobi and multi-block decoding equal each request decoded alone", "[decode]") {
  const toy_ar_model target(4, 8, 91);
  jacobi_options jo;
  jo.window = 3;
  jo.max_new_tokens = 7;
  jo.init = jacobi_init::random;
  check_batch_equals_alone(
      target,
      [&](auto& m, const auto& p, const auto& rngs, auto& st) {
        return jacobi_decode_batch(m, p, jo, rngs, st);
      },
      [&](auto& s, const auto& p, const request_rng& rng, decode_stats& st) {
        return jacobi_decode(s, p, jo, rng, &st);
      });
  for (const bool stochastic : {false, true}) {
    multiblock_options mo;
    mo.block_size = 2;
    mo.max_new_tokens = 7;
    mo.stochastic = stochastic;
    mo.recycling = !stochastic;
    mo.init = jacobi_init::random;
    INFO((stochastic ? "stochastic" : "greedy"));
    check_batch_equals_alone(
        target,
        [&](auto& m, const auto& p, const auto& rngs, auto& st) {
          return multiblock_decode_batch(m, p, mo, rngs, {}, st);
        },
        [&](auto& s, const auto& p, const request_rng& rng, decode_stats& st) {
          return multiblock_decode(s, p, mo, rng, &st);
        });
  }
}

namespace {

/// Batched SSD and stepwise decoding equal each prompt decoded alone (outputs and statistics),
/// and each other.
template <class Model>
void check_diffusion_batch(const Model& m, const std::vector<std::vector<token_t>>& prompts,
                           const ssd_options& opt) {
  std::vector<decode_stats> st(prompts.size()), sw(prompts.size());
  const auto out = ssd_decode_batch(m, prompts, opt, st);
  const auto ref = diffusion_stepwise_decode_batch(m, prompts, opt, sw);
  for (std::size_t r = 0; r < prompts.size(); ++r) {
    INFO("request " << r);
    decode_stats one, one_sw;
    CHECK(out[r] == ssd_decode(m, prompts[r], opt, &one));
    CHECK(ref[r] == diffusion_stepwise_decode(m, prompts[r], opt, &one_sw));
    CHECK(out[r] == ref[r]);
    check_same_stats(st[r], one);
    check_same_stats(sw[r], one_sw);
  }
}

}  // namespace

TEST_CASE("batched SSD and stepwise decoding equal each prompt decoded alone", "[decode]") {
  const toy_masked_model m(6, 5);
  // Two prompt lengths: sequences of equal length share a call.
  const std::vector<std::vector<token_t>> prompts{{1, 2}, {3, 0, 4}, {2, 2}, {4, 1, 0}, {0, 3}};
  for (const ssd_tree tree : {ssd_tree::chain, ssd_tree::mix_order}) {
    ssd_options opt;
    opt.gen_length = 9;
    opt.block_size = 4;
    opt.draft_length = 3;
    opt.tree = tree;
    check_diffusion_batch(m, prompts, opt);
  }
}

TEST_CASE("batched SSD and stepwise decoding under the dual cache equal each prompt alone",
          "[decode]") {
  const decode_testing::toy_dual_cache_model m(6, 7);
  const std::vector<std::vector<token_t>> prompts{{1, 2}, {3, 0, 4}, {2, 2}, {4, 1, 0}, {0, 3}};
  for (const index_t refresh : {2, 8})
    for (const ssd_tree tree : {ssd_tree::chain, ssd_tree::mix_order}) {
      ssd_options opt;
      opt.gen_length = 11;
      opt.block_size = 4;
      opt.draft_length = 3;
      opt.tree = tree;
      opt.cache = ssd_cache::dual;
      opt.refresh_interval = refresh;
      opt.fallback = tree == ssd_tree::chain;
      INFO("R " << refresh);
      check_diffusion_batch(m, prompts, opt);
    }
  // On the shipped diffusion model, prompts of different lengths in one call.
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto model = example::transformer::load(dir / "text-diffusion.safetensors");
  std::vector<std::vector<token_t>> texts;
  for (std::size_t i = 0; i < 3; ++i)
    texts.push_back(decode_testing::bytes(decode_testing::text_prompts()[i]));
  ssd_options opt;
  opt.gen_length = 16;
  opt.block_size = 8;
  opt.draft_length = 3;
  opt.tree = ssd_tree::mix_order;
  opt.cache = ssd_cache::dual;
  const auto out = ssd_decode_batch(model, texts, opt);
  const auto ref = diffusion_stepwise_decode_batch(model, texts, opt);
  for (std::size_t r = 0; r < texts.size(); ++r) {
    CHECK(out[r] == ssd_decode(model, texts[r], opt));
    CHECK(ref[r] == out[r]);
  }
}

TEST_CASE("batched greedy loops equal greedy decoding on the shipped text models",
          "[decode][models]") {
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto target_model = example::transformer::load(dir / "text-target.safetensors");
  const auto draft_model = example::transformer::load(dir / "text-draft.safetensors");
  const auto& texts = decode_testing::text_prompts();
  std::vector<std::vector<token_t>> prompts;
  for (std::size_t i = 0; i < 6; ++i) prompts.push_back(decode_testing::bytes(texts[i]));
  const index_t B = static_cast<index_t>(prompts.size()), n = 32;
  std::vector<std::vector<token_t>> greedy;
  for (const auto& p : prompts) {
    example::transformer_session ar(target_model);
    greedy.push_back(decode_testing::greedy_reference(ar, p, n));
  }
  const auto rngs = rngs_for(prompts.size(), 5);
  example::transformer_batch target(target_model, B), draft(draft_model, B);

  speculative_options so;
  so.max_new_tokens = n;
  so.mode = draft_mode::greedy;
  so.draft_length = 4;
  CHECK(speculative_decode_batch(target, draft, prompts, so, rngs, greedy_tree_verifier<>{}) ==
        greedy);
  so.draft_tree = trees::sjd_pac(2, 2, 10);
  CHECK(speculative_decode_batch(target, draft, prompts, so, rngs, greedy_tree_verifier<>{}) ==
        greedy);

  jacobi_options jo;
  jo.max_new_tokens = n;
  CHECK(jacobi_decode_batch(target, prompts, jo, rngs) == greedy);

  multiblock_options mo;
  mo.max_new_tokens = n;
  mo.block_size = 8;
  mo.recycling = true;
  CHECK(multiblock_decode_batch(target, prompts, mo, rngs) == greedy);
}

TEST_CASE("batched stochastic loops run on the shipped text models", "[decode][models]") {
  // The transformer's batched rows equal its single-request rows up to float rounding, so the
  // outputs are checked for shape and accounting here; equality is tested on the toy models.
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto target_model = example::transformer::load(dir / "text-target.safetensors");
  const auto& texts = decode_testing::text_prompts();
  std::vector<std::vector<token_t>> prompts;
  for (std::size_t i = 0; i < 4; ++i) prompts.push_back(decode_testing::bytes(texts[i]));
  example::transformer_batch target(target_model, 4);
  std::vector<decode_stats> st(prompts.size());
  sjd_options opt = sjd_options::sjd_pac(16, 3, 1);
  opt.max_new_tokens = 24;
  const auto out = sjd_decode_batch(target, prompts, opt, rngs_for(4, 9), {}, st);
  for (std::size_t r = 0; r < prompts.size(); ++r) {
    CHECK(out[r].size() == 24);
    CHECK(st[r].tokens == 24);
    CHECK(st[r].target_forwards == st[r].steps);
    for (const token_t t : out[r]) CHECK((t >= 0 && t < target_model.vocab_size()));
  }
}

TEST_CASE("batched loops reject bad batch arguments", "[decode]") {
  const toy_ar_model target(4, 5, 1);
  counting_batch m = toy_batch(target, 2);
  const std::vector<std::vector<token_t>> two{{0}, {0, 1}}, three{{0}, {0}, {0}},
      with_empty{{0}, {}};
  const auto rngs2 = rngs_for(2, 1), rngs1 = rngs_for(1, 1), rngs3 = rngs_for(3, 1);
  jacobi_options jo;
  jo.max_new_tokens = 3;
  const auto msg = [](auto&& f) {
    try {
      f();
    } catch (const invalid_input& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(msg([&] { (void)jacobi_decode_batch(m, three, jo, rngs3); }),
             Catch::Contains("prompts"));
  CHECK_THAT(msg([&] { (void)jacobi_decode_batch(m, two, jo, rngs1); }), Catch::Contains("rngs"));
  std::vector<decode_stats> st1(1);
  CHECK_THAT(msg([&] { (void)jacobi_decode_batch(m, two, jo, rngs2, st1); }),
             Catch::Contains("stats"));
  CHECK_THAT(msg([&] { (void)jacobi_decode_batch(m, with_empty, jo, rngs2); }),
             Catch::Contains("prompts[row 1]"));
  // No prompts (B = 0) is a no-op, as for the verifiers; so is a batch of no sessions.
  CHECK(jacobi_decode_batch(m, std::vector<std::vector<token_t>>{}, jo, {}).empty());
  CHECK(
      speculative_decode_batch(m, m, std::vector<std::vector<token_t>>{}, speculative_options{}, {})
          .empty());
  session_batch<toy_model_session> none(std::vector<toy_model_session>{});
  CHECK(none.batch_size() == 0);
  CHECK(none.vocab_size() == 0);
  CHECK(jacobi_decode_batch(none, std::vector<std::vector<token_t>>{}, jo, {}).empty());
  counting_batch small = toy_batch(target, 1);
  CHECK_THAT(
      msg([&] { (void)speculative_decode_batch(m, small, two, speculative_options{}, rngs2); }),
      Catch::Contains("draft"));
  jo.window = 0;
  CHECK_THAT(msg([&] { (void)jacobi_decode_batch(m, two, jo, rngs2); }), Catch::Contains("window"));
}
