// SSD (self speculative decoding of masked diffusion models): output identical to stepwise
// low-confidence-remasking decoding for both verification trees, on toy masked models and the
// shipped text-diffusion model, without a cache and through the dual cache (then identical to
// stepwise decoding through the same cache); fewer forward passes; Algorithm 1's fallback; the
// paper preset; bad input.

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include <specula/decode/ssd.hpp>
#include <specula/testing/toy_models.hpp>
#include <specula_example/transformer.hpp>

#include "decode_test_util.hpp"

using namespace specula;

namespace {

/// Passes whose accepted nodes reach past a refreshing step of the dual cache's schedule (blocks
/// of `block`, refresh every `refresh` steps within a block): a step emitting k tokens from step
/// t accepted nodes at steps t + 1 .. t + k - 1.
index_t passes_across_refresh(const decode_stats& st, index_t block, index_t refresh) {
  index_t t = 0, across = 0;
  for (const index_t k : st.step_tokens) {
    bool crossed = false;
    for (index_t s = t + 1; s < t + k; ++s) crossed = crossed || s % block % refresh == 0;
    across += crossed ? 1 : 0;
    t += k;
  }
  return across;
}

}  // namespace

TEST_CASE("SSD equals stepwise decoding on toy masked models", "[decode]") {
  decode_stats total;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    const testing::toy_masked_model model(5, seed);
    const std::vector<token_t> prompt{0, 3, 1};
    for (const index_t block : {3, 4, 12}) {
      ssd_options opt;
      opt.gen_length = 12;
      opt.block_size = block;
      decode_stats ref_st;
      const auto ref = diffusion_stepwise_decode(model, prompt, opt, &ref_st);
      CHECK(ref_st.target_forwards == 12);
      for (const index_t n : {1, 2, 3, 5})
        for (const auto tree : {ssd_tree::chain, ssd_tree::mix_order}) {
          opt.draft_length = n;
          opt.tree = tree;
          decode_stats st;
          INFO("seed " << seed << " block " << block << " N " << n << " mix "
                       << (tree == ssd_tree::mix_order));
          CHECK(ssd_decode(model, prompt, opt, &st) == ref);
          CHECK(st.tokens == 12);
          CHECK(st.accepted_histogram.size() <= static_cast<std::size_t>(n + 1));
          total.merge(st);
        }
    }
  }
  // Drafts are accepted: fewer forward passes than tokens over all runs.
  CHECK(total.step_compression() > 1.0);
}

TEST_CASE("SSD equals stepwise decoding on the shipped diffusion model", "[decode][models]") {
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto model = example::transformer::load(dir / "text-diffusion.safetensors");
  const auto& prompts = decode_testing::text_prompts();
  for (const auto cache : {ssd_cache::none, ssd_cache::dual}) {
    decode_stats chain_st, mix_st;
    index_t differ = 0, across = 0;
    for (std::size_t i = 0; i < 6; ++i) {
      const auto prompt = decode_testing::bytes(prompts[i]);
      ssd_options opt;
      opt.gen_length = 24;
      opt.block_size = 8;
      const auto uncached = diffusion_stepwise_decode(model, prompt, opt);
      opt.cache = cache;
      opt.refresh_interval = i % 2 == 0 ? 8 : 3;
      const auto ref = diffusion_stepwise_decode(model, prompt, opt);
      differ += ref != uncached ? 1 : 0;
      INFO("prompt " << prompts[i] << " dual cache " << (cache == ssd_cache::dual) << " R "
                     << opt.refresh_interval);
      opt.draft_length = 3;
      decode_stats st;
      CHECK(ssd_decode(model, prompt, opt, &st) == ref);
      across += passes_across_refresh(st, opt.block_size, opt.refresh_interval);
      chain_st.merge(st);
      opt.tree = ssd_tree::mix_order;
      opt.draft_length = 4;
      st = {};
      CHECK(ssd_decode(model, prompt, opt, &st) == ref);
      across += passes_across_refresh(st, opt.block_size, opt.refresh_interval);
      mix_st.merge(st);
      // Refreshing at every step is the uncached model.
      opt.refresh_interval = 1;
      CHECK(diffusion_stepwise_decode(model, prompt, opt) == uncached);
    }
    CHECK(chain_st.step_compression() > 1.0);
    CHECK(mix_st.step_compression() > 1.0);
    INFO(differ << " of 6 cached outputs differ from the uncached ones");
    CHECK(differ < 6);
    // Without a cache every refresh is trivial; with it, passes accept nodes past a refresh.
    INFO(across << " passes accepted nodes past a refresh");
    CHECK(across > 0);
  }
}

TEST_CASE("SSD rejects bad input", "[decode]") {
  const testing::toy_masked_model model(5, 1);
  const std::vector<token_t> prompt{0, 1};
  auto check = [&](auto mutate, std::vector<token_t> p, const char* name) {
    ssd_options opt;
    opt.gen_length = 4;
    mutate(opt);
    CHECK_THROWS_WITH(ssd_decode(model, p, opt), Catch::Contains(name));
    CHECK_THROWS_WITH(diffusion_stepwise_decode(model, p, opt), Catch::Contains(name));
  };
  check([](ssd_options& o) { o.gen_length = 0; }, prompt, "gen_length");
  check([](ssd_options& o) { o.block_size = 0; }, prompt, "block_size");
  check([](ssd_options& o) { o.draft_length = 0; }, prompt, "draft_length");
  check([](ssd_options&) {}, {}, "prompt");
  check([](ssd_options&) {}, {0, 4}, "prompt");  // the mask token
  check([](ssd_options&) {}, {0, 7}, "prompt");  // out of range
  // A causal model has no mask token.
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto causal = example::transformer::load(dir / "text-draft.safetensors");
  CHECK_THROWS_WITH(ssd_decode(causal, prompt, ssd_options{}), Catch::Contains("mask_token"));
}

// --- The dual cache --------------------------------------------------------------------------

namespace {

using decode_testing::toy_dual_cache_model;

/// Every step emits one token once fewer than `n` masked positions remain.
bool stepwise_below(const decode_stats& st, index_t gen_length, index_t n) {
  index_t remaining = gen_length;
  for (const index_t k : st.step_tokens) {
    if (remaining < n && k != 1) return false;
    remaining -= k;
  }
  return true;
}

}  // namespace

TEST_CASE("SSD equals stepwise decoding under the dual cache on toy models", "[decode]") {
  const std::vector<token_t> prompt{0, 3, 1};
  decode_stats total;
  index_t stale = 0, runs = 0, across = 0;
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    const toy_dual_cache_model model(5, seed);
    for (const index_t block : {3, 4, 12})
      for (const index_t refresh : {1, 2, 3, 8}) {
        ssd_options opt;
        opt.gen_length = 12;
        opt.block_size = block;
        const auto uncached = diffusion_stepwise_decode(model, prompt, opt);
        opt.cache = ssd_cache::dual;
        opt.refresh_interval = refresh;
        decode_stats ref_st;
        const auto ref = diffusion_stepwise_decode(model, prompt, opt, &ref_st);
        CHECK(ref_st.target_forwards == 12);
        // Every step refreshes with R = 1: the uncached rows.
        if (refresh == 1) CHECK(ref == uncached);
        stale += ref != uncached ? 1 : 0;
        ++runs;
        for (const index_t n : {1, 2, 3, 5})
          for (const auto tree : {ssd_tree::chain, ssd_tree::mix_order})
            for (const bool fallback : {false, true}) {
              opt.draft_length = n;
              opt.tree = tree;
              opt.fallback = fallback;
              decode_stats st;
              INFO("seed " << seed << " block " << block << " R " << refresh << " N " << n
                           << " mix " << (tree == ssd_tree::mix_order) << " fallback " << fallback);
              CHECK(ssd_decode(model, prompt, opt, &st) == ref);
              CHECK(st.tokens == 12);
              if (fallback) CHECK(stepwise_below(st, 12, n));
              across += passes_across_refresh(st, block, refresh);
              total.merge(st);
            }
      }
  }
  // The cache matters on these models (stale rows change some outputs), and drafts are
  // accepted under it.
  CHECK(stale > 0);
  CHECK(stale < runs);
  CHECK(total.step_compression() > 1.0);
  // Candidate selection runs across refreshes (and blocks): some passes accept nodes past one.
  INFO(across << " passes accepted nodes past a refresh");
  CHECK(across > 0);
}

TEST_CASE("SSD's fallback decodes the last positions stepwise, and only with the option",
          "[decode]") {
  const std::vector<token_t> prompt{2, 0};
  index_t without = 0;
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    const testing::toy_masked_model model(5, seed);
    ssd_options opt;
    opt.gen_length = 16;
    opt.block_size = 16;
    opt.draft_length = 5;
    const auto ref = diffusion_stepwise_decode(model, prompt, opt);
    decode_stats plain, fallback;
    CHECK(ssd_decode(model, prompt, opt, &plain) == ref);
    without += stepwise_below(plain, 16, 5) ? 0 : 1;
    opt.fallback = true;
    CHECK(ssd_decode(model, prompt, opt, &fallback) == ref);
    CHECK(stepwise_below(fallback, 16, 5));
  }
  CHECK(without > 0);  // without the fallback, SSD keeps drafting at the end
}

TEST_CASE("The paper preset is the SSD paper's setting", "[decode]") {
  const ssd_options p = ssd_options::paper();
  CHECK(p.gen_length == 256);
  CHECK(p.block_size == 8);
  CHECK(p.refresh_interval == 8);
  CHECK(p.draft_length == 4);
  CHECK(p.tree == ssd_tree::chain);
  CHECK(p.cache == ssd_cache::dual);
  CHECK(p.fallback);
  // And SSD equals stepwise decoding with it (toy models with a dual cache, 256 positions).
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    const toy_dual_cache_model model(6, seed);
    const std::vector<token_t> prompt{1, 2, 3, 4};
    decode_stats st;
    CHECK(ssd_decode(model, prompt, p, &st) == diffusion_stepwise_decode(model, prompt, p));
    CHECK(st.tokens == 256);
    CHECK(stepwise_below(st, 256, 4));
  }
}

TEST_CASE("The dual cache rejects bad input", "[decode][bad_input]") {
  const std::vector<token_t> prompt{0, 1};
  ssd_options opt;
  opt.gen_length = 4;
  opt.cache = ssd_cache::dual;
  // A masked model without a dual cache.
  const testing::toy_masked_model plain(5, 1);
  CHECK_THROWS_WITH(ssd_decode(plain, prompt, opt), Catch::Contains("cache"));
  CHECK_THROWS_WITH(diffusion_stepwise_decode(plain, prompt, opt), Catch::Contains("cache"));
  const std::vector<std::vector<token_t>> prompts{prompt, prompt};
  CHECK_THROWS_WITH(ssd_decode_batch(plain, prompts, opt), Catch::Contains("cache"));
  // A refresh interval of 0.
  const toy_dual_cache_model model(5, 1);
  opt.refresh_interval = 0;
  CHECK_THROWS_WITH(ssd_decode(model, prompt, opt), Catch::Contains("refresh_interval"));
  CHECK_THROWS_WITH(diffusion_stepwise_decode(model, prompt, opt),
                    Catch::Contains("refresh_interval"));
  opt.cache = ssd_cache::none;  // checked whatever the cache
  CHECK_THROWS_WITH(ssd_decode(model, prompt, opt), Catch::Contains("refresh_interval"));
}
