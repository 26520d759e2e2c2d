// The example transformer on the GPU (examples/transformer/cuda): the device forward equals the
// host forward on every shipped model's held-out windows, commit/rollback sequences leave the
// device cache equal to a fresh recomputation, every greedy loop on the device model equals host
// greedy decoding token for token, and sampled draft-model SD on the device passes a G-test
// against the sequence law of a toy transformer (enumerated with the host forward), with a biased
// verifier as the negative control. Every case needs a GPU ([device]: skipped without one).
//
// Tolerance of the forward comparison: |device - host| <= 1e-3 * (1 + |host|) per logit. Both
// compute in fp32 from the same weights; they differ in summation order (the GEMM kernel, the
// attention kernel's reductions) and in expf, which over 4-6 layers moves logits of magnitude ~10
// by about 1e-5 -- the bound leaves two orders of magnitude.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <specula/decode/jacobi.hpp>
#include <specula/decode/multiblock.hpp>
#include <specula/decode/sjd.hpp>
#include <specula/decode/speculative.hpp>
#include <specula/decode/ssd.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula/tree/builders.hpp>
#include <specula_example/device_resident_sd.hpp>
#include <specula_example/device_transformer.hpp>
#include <specula_example/sessions.hpp>

#include "../../decode/decode_test_util.hpp"
#include "../../transformer/toy_sd_gtest.hpp"
#include "../../transformer/transformer_test_util.hpp"

using namespace specula;
namespace ex = specula::example;

namespace {

/// The shipped models: $SPECULA_MODELS_DIR when set (a device run from another checkout's
/// path), else the build's source tree.
const std::filesystem::path models_dir = [] {
  const char* env = std::getenv("SPECULA_MODELS_DIR");
  return std::filesystem::path(env != nullptr && *env != '\0' ? env : SPECULA_MODELS_DIR);
}();

bool have_gpu(const char* what) {
  if (ex::cuda_device_available()) return true;
  WARN("no CUDA device: " << what << " skipped (compile-only)");
  return false;
}

/// max over entries of |d - h| / (1 + |h|).
double worst(const std::vector<float>& d, const std::vector<float>& h) {
  REQUIRE(d.size() == h.size());
  double w = 0.0;
  for (std::size_t i = 0; i < d.size(); ++i) {
    const double e = std::abs(static_cast<double>(d[i]) - h[i]) / (1.0 + std::abs(h[i]));
    w = std::isnan(e) ? 1e30 : std::max(w, e);
  }
  return w;
}

constexpr double tolerance = 1e-3;

std::vector<token_t> heldout_windows(const std::string& file, index_t count, index_t length) {
  const auto data = ex::safetensors_file::open(models_dir / file);
  const ex::tensor_info& info = data.at("inputs");
  const auto inputs = data.read_i32("inputs", info.shape);
  const index_t T = info.shape[1];
  std::vector<token_t> out;
  for (index_t r = 0; r < count; ++r)
    out.insert(out.end(), inputs.begin() + r * T, inputs.begin() + r * T + length);
  return out;
}

template <class Session>
std::vector<float> chain_rows(Session& s, std::span<const token_t> tokens, index_t V) {
  const token_tree chain = trees::chain(tokens);
  std::vector<float> rows(static_cast<std::size_t>(chain.size() * V));
  s.evaluate(chain, batch_view<float>(rows.data(), chain.size(), V));
  return rows;
}

}  // namespace

TEST_CASE("device forward equals the host forward on the shipped models' held-out windows",
          "[device][models]") {
  if (!have_gpu("device forward vs host")) return;
  struct entry {
    const char* model;
    const char* heldout;
  };
  for (const entry e : {entry{"text-target", "text-target.heldout.safetensors"},
                        entry{"text-target-jf", "text-target.heldout.safetensors"},
                        entry{"text-draft", "text-draft.heldout.safetensors"},
                        entry{"text-diffusion", "text-diffusion.heldout.safetensors"},
                        entry{"image-ar", "image-ar.heldout.safetensors"},
                        entry{"image-ar-256", "image-ar-256.heldout.safetensors"},
                        entry{"image-draft", "image-draft.heldout.safetensors"}}) {
    INFO("model " << e.model);
    const auto w =
        ex::transformer_weights::load(models_dir / (std::string(e.model) + ".safetensors"));
    const ex::transformer host(w);
    const ex::device_transformer dev(w);
    const index_t V = w.config.vocab_size, L = std::min<index_t>(w.config.max_seq_len, 128);
    const auto tokens = heldout_windows(e.heldout, 4, L);
    // Whole windows without a cache (causal or bidirectional per the model).
    std::vector<float> h(tokens.size() * static_cast<std::size_t>(V)), d(h.size());
    host.evaluate_sequences(tokens, L, batch_view<float>(h.data(), 4 * L, V));
    dev.evaluate_sequences(tokens, L, batch_view<float>(d.data(), 4 * L, V));
    CHECK(worst(d, h) <= tolerance);
    if (!w.config.causal) {
      // The dual cache: a refresh with a second node, then a window pass without refresh,
      // against the host's dual cache (itself tested against a reference in tests/transformer).
      const index_t wb = L / 2, we = L / 2 + 8;
      std::vector<token_t> two(tokens.begin(), tokens.begin() + 2 * L);
      std::copy_n(tokens.begin() + L + wb, we - wb, two.begin() + L + wb);  // node 1: other window
      std::copy_n(tokens.begin(), wb, two.begin() + L);
      std::copy(tokens.begin() + we, tokens.begin() + L, two.begin() + L + we);
      ex::dual_kv_cache hc;
      ex::device_dual_cache dc;
      const auto pass = [&](auto& cache, bool refresh, std::span<const token_t> t) {
        using cache_t = std::remove_reference_t<decltype(cache)>;
        return dual_cache_pass<cache_t>{&cache, t, L, wb, we, refresh};
      };
      const auto rows_of = [&](const auto& model, auto& cache, bool refresh,
                               std::span<const token_t> t) {
        const auto p = pass(cache, refresh, t);
        std::vector<float> out(static_cast<std::size_t>(p.rows() * V));
        model.evaluate_cached(std::span(&p, 1), batch_view<float>(out.data(), p.rows(), V));
        return out;
      };
      CHECK(worst(rows_of(dev, dc, true, two), rows_of(host, hc, true, two)) <= tolerance);
      const auto second = std::span<const token_t>(two).subspan(static_cast<std::size_t>(L));
      CHECK(worst(rows_of(dev, dc, false, second), rows_of(host, hc, false, second)) <= tolerance);
      continue;
    }
    // Through the cache: the first half prefilled, the second half as one chain block, then a
    // token tree below it.
    ex::transformer_session hs(host);
    ex::device_session ds(dev);
    const auto first = std::span<const token_t>(tokens).first(static_cast<std::size_t>(L / 2));
    const auto second = std::span<const token_t>(tokens).subspan(static_cast<std::size_t>(L / 2),
                                                                 static_cast<std::size_t>(L / 4));
    hs.prefill(first);
    ds.prefill(first);
    CHECK(worst(chain_rows(ds, second, V), chain_rows(hs, second, V)) <= tolerance);
    hs.commit(std::vector<index_t>{0, 1, 2});
    ds.commit(std::vector<index_t>{0, 1, 2});
    std::vector<index_t> parents{-1, 0, 0, 1, 1, 2, 3, 3};
    std::vector<token_t> tree_tokens(parents.size());
    for (std::size_t i = 0; i < parents.size(); ++i)
      tree_tokens[i] = tokens[static_cast<std::size_t>(L) + i] % static_cast<token_t>(V);
    const token_tree tree(parents, tree_tokens);
    std::vector<float> th(parents.size() * static_cast<std::size_t>(V)), td(th.size());
    hs.evaluate(tree, batch_view<float>(th.data(), tree.size(), V));
    ds.evaluate(tree, batch_view<float>(td.data(), tree.size(), V));
    CHECK(worst(td, th) <= tolerance);
  }
}

TEST_CASE("commit and rollback leave the device cache equal to a fresh recomputation", "[device]") {
  if (!have_gpu("device cache commit/rollback")) return;
  const auto w = ex::testing::random_weights(ex::testing::small_config(), 41);
  const ex::device_transformer dev(w);
  const index_t V = w.config.vocab_size;
  std::mt19937_64 g(5);
  ex::device_session s(dev);
  std::vector<token_t> committed{3, 1, 4, 1, 5};
  s.prefill(committed);  // holds committed[0 .. 4); committed.back() is the next root
  std::vector<float> rows;
  for (int step = 0; step < 40; ++step) {
    // A random tree of up to 12 nodes below the root; commit a random root path.
    std::vector<index_t> parents{-1};
    std::vector<token_t> toks{committed.back()};
    const auto n = static_cast<index_t>(2 + g() % 11);
    for (index_t i = 1; i < n; ++i) {
      parents.push_back(static_cast<index_t>(g() % static_cast<std::uint64_t>(i)));
      toks.push_back(static_cast<token_t>(g() % static_cast<std::uint64_t>(V)));
    }
    const token_tree tree(parents, toks);
    rows.resize(static_cast<std::size_t>(n * V));
    s.evaluate(tree, batch_view<float>(rows.data(), n, V));
    index_t u = static_cast<index_t>(g() % static_cast<std::uint64_t>(n));
    std::vector<index_t> path;
    for (; u >= 0; u = parents[static_cast<std::size_t>(u)]) path.insert(path.begin(), u);
    s.commit(path);
    for (std::size_t k = 1; k < path.size(); ++k)
      committed.push_back(toks[static_cast<std::size_t>(path[k])]);
    committed.push_back(static_cast<token_t>(g() % static_cast<std::uint64_t>(V)));  // next root
    if (step % 7 == 6) {  // roll back a few positions
      const index_t keep = std::max<index_t>(1, s.context_size() - 3);
      s.rollback(keep);
      committed.resize(static_cast<std::size_t>(keep + 1));
    }
    REQUIRE(s.context_size() == static_cast<index_t>(committed.size()) - 1);
  }
  // A fresh cache of the same tokens, one chain.
  ex::device_session fresh(dev);
  fresh.prefill(committed);
  const index_t n = s.context_size();
  for (index_t l = 0; l < w.config.n_layers; ++l)
    for (const bool values : {false, true}) {
      INFO("layer " << l << (values ? " values" : " keys"));
      CHECK(worst(s.cache().storage().download(l, values, n),
                  fresh.cache().storage().download(l, values, n)) <= 1e-5);
    }
  // And the next evaluation's rows agree.
  const std::vector<token_t> next{committed.back(), 2, 7};
  CHECK(worst(chain_rows(s, next, V), chain_rows(fresh, next, V)) <= 1e-5);
}

TEST_CASE("greedy loops on the device model equal host greedy decoding", "[device][models]") {
  if (!have_gpu("device greedy loops")) return;
  const auto tw = ex::transformer_weights::load(models_dir / "text-target.safetensors");
  const auto dw = ex::transformer_weights::load(models_dir / "text-draft.safetensors");
  const ex::transformer host(tw);
  const ex::device_transformer target(tw), draft(dw);
  ex::device_session t(target), d(draft);
  const index_t n = 40;
  decode_stats sd_st, tree_st, jacobi_st, mb_st, sjd_st, pac_st;
  const auto& prompts = decode_testing::text_prompts();
  for (std::size_t i = 0; i < 4; ++i) {
    const auto prompt = decode_testing::bytes(prompts[i]);
    ex::transformer_session hs(host);
    const auto ref = decode_testing::greedy_reference(hs, prompt, n);
    INFO("prompt " << prompts[i]);
    CHECK(decode_testing::greedy_reference(t, prompt, n) == ref);
    speculative_options opt;
    opt.max_new_tokens = n;
    opt.mode = draft_mode::greedy;
    opt.draft_length = 4;
    CHECK(speculative_decode(t, d, prompt, opt, request_rng{1, 0, 0}, greedy_tree_verifier<>{},
                             &sd_st) == ref);
    opt.draft_tree = trees::sjd_pac(3, 1, 8);
    CHECK(speculative_decode(t, d, prompt, opt, request_rng{1, 0, 0}, greedy_tree_verifier<>{},
                             &tree_st) == ref);
    jacobi_options jo;
    jo.window = 16;
    jo.max_new_tokens = n;
    CHECK(jacobi_decode(t, prompt, jo, request_rng{}, &jacobi_st) == ref);
    multiblock_options mo;
    mo.block_size = 16;
    mo.max_blocks = 2;
    mo.spawn_ratio = 0.5;
    mo.max_new_tokens = n;
    CHECK(multiblock_decode(t, prompt, mo, {}, &mb_st) == ref);
    // SJD and SJD-PAC with top-k = 1: p is one-hot, so the output is greedy decoding.
    sjd_options so;
    so.max_new_tokens = n;
    so.target.top_k = 1;
    CHECK(sjd_decode(t, prompt, so, request_rng{2, 0, 0}, &sjd_st) == ref);
    so = sjd_options::sjd_pac();
    so.max_new_tokens = n;
    so.target.top_k = 1;
    CHECK(sjd_decode(t, prompt, so, request_rng{2, 0, 0}, &pac_st) == ref);
  }
  CHECK(sd_st.step_compression() > 1.0);
  CHECK(tree_st.step_compression() > 1.0);
}

TEST_CASE("SSD on the device diffusion model equals host stepwise decoding", "[device][models]") {
  if (!have_gpu("device SSD")) return;
  const auto w = ex::transformer_weights::load(models_dir / "text-diffusion.safetensors");
  const ex::transformer host(w);
  const ex::device_transformer dev(w);
  const auto& prompts = decode_testing::text_prompts();
  for (const auto cache : {ssd_cache::none, ssd_cache::dual}) {
    decode_stats st;
    for (std::size_t i = 0; i < 3; ++i) {
      const auto prompt = decode_testing::bytes(prompts[i]);
      ssd_options opt;
      opt.gen_length = 24;
      opt.block_size = 8;
      opt.cache = cache;
      opt.refresh_interval = 4;
      const auto ref = diffusion_stepwise_decode(host, prompt, opt);
      INFO("prompt " << prompts[i] << " dual cache " << (cache == ssd_cache::dual));
      CHECK(diffusion_stepwise_decode(dev, prompt, opt) == ref);
      opt.tree = ssd_tree::mix_order;
      opt.draft_length = 4;
      CHECK(ssd_decode(dev, prompt, opt, &st) == ref);
    }
    CHECK(st.step_compression() > 1.0);
  }
}

TEST_CASE("sampled SD on the device model samples the toy transformer's sequence law (G-test)",
          "[device][stats]") {
  if (!have_gpu("device sampled SD G-test")) return;
  const auto c = ex::testing::toy_gtest_config();
  const auto tw = ex::testing::random_weights(c, 71), dw = ex::testing::random_weights(c, 72);
  const ex::device_transformer target(tw), draft(dw);
  ex::device_session t(target), d(draft);
  ex::testing::check_toy_sd_gtest(t, d, ex::testing::toy_sequence_law(tw));
}

TEST_CASE("resident SD on the device samples the toy transformer's law and moves only tokens",
          "[device][stats]") {
  if (!have_gpu("device resident SD")) return;
  const auto c = ex::testing::toy_gtest_config();
  const auto tw = ex::testing::random_weights(c, 71), dw = ex::testing::random_weights(c, 72);
  const ex::device_transformer target(tw), draft(dw);
  ex::device_sd_ops ops(target, draft);
  ex::resident_sd_options opt;
  opt.draft_length = 2;
  opt.max_new_tokens = 3;
  const std::vector<token_t> prompt{0};
  const auto law = ex::testing::toy_sequence_law(tw);
  decode_stats st;
  const auto before = ops.traffic();
  const auto g = specula::testing::g_test(ex::testing::toy_counts(
                                              [&](const request_rng& rng, decode_stats* s) {
                                                return ex::resident_speculative_decode(ops, prompt,
                                                                                       opt, rng, s);
                                              },
                                              4000, 9, &st),
                                          law);
  INFO(g << ", step compression " << st.step_compression());
  CHECK(g.impossible_observations == 0);
  CHECK(g.p_value > 1e-4);
  CHECK(st.step_compression() > 1.0);
  // To the host: each drafted token (4 bytes), and per step the accepted count and the chain's
  // output tokens (4 + 4 * (drafts + 1) bytes) -- never a logit or probability row.
  const auto after = ops.traffic();
  CHECK(after.bytes_to_host - before.bytes_to_host ==
        static_cast<std::uint64_t>(8 * st.draft_forwards + 8 * st.steps));
}

TEST_CASE("resident SD on the device with top-k = 1 equals host greedy decoding",
          "[device][models]") {
  if (!have_gpu("device resident SD greedy")) return;
  const auto tw = ex::transformer_weights::load(models_dir / "text-target.safetensors");
  const auto dw = ex::transformer_weights::load(models_dir / "text-draft.safetensors");
  const ex::transformer host(tw);
  const ex::device_transformer target(tw), draft(dw);
  ex::device_sd_ops ops(target, draft);
  ex::resident_sd_options opt;
  opt.max_new_tokens = 40;
  opt.target.top_k = 1;
  opt.draft.top_k = 1;
  decode_stats st;
  const auto& prompts = decode_testing::text_prompts();
  for (std::size_t i = 0; i < 4; ++i) {
    const auto prompt = decode_testing::bytes(prompts[i]);
    ex::transformer_session hs(host);
    INFO("prompt " << prompts[i]);
    CHECK(ex::resident_speculative_decode(ops, prompt, opt, request_rng{4, 0, 0}, &st) ==
          decode_testing::greedy_reference(hs, prompt, 40));
  }
  CHECK(st.step_compression() > 1.0);
}
