// The example transformer on the GPU (examples/transformer/cuda): the device forward equals the
// host forward on every shipped model's held-out windows, commit/rollback sequences leave the
// device cache equal to a fresh recomputation, every greedy loop on the device model equals host
// greedy decoding token for token, and sampled draft-model SD on the device passes a G-test
// against the sequence law of a toy transformer (enumerated with the host forward), with a biased
// verifier as the negative control; the resident sampled loops (SD, SJD, SJD-PAC, multi-block's
// stochastic variant, n-gram lookup) pass the same G-test. Every case needs a GPU ([device]:
// skipped without one).
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
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <specula/decode/cfg.hpp>
#include <specula/decode/jacobi.hpp>
#include <specula/decode/lookup.hpp>
#include <specula/decode/multiblock.hpp>
#include <specula/decode/sjd.hpp>
#include <specula/decode/speculative.hpp>
#include <specula/decode/ssd.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula/tree/builders.hpp>
#include <specula_example/device_resident_sd.hpp>
#include <specula_example/device_resident_sjd.hpp>
#include <specula_example/device_transformer.hpp>
#include <specula_example/resident_greedy.hpp>
#include <specula_example/resident_ssd.hpp>
#include <specula_example/sessions.hpp>
#include <specula_example/vq_image.hpp>

#include "../../decode/decode_test_util.hpp"
#include "../../transformer/image_test_util.hpp"
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
      ssd_options opt = ex::testing::small_ssd_options(cache);
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
  const auto law = ex::testing::toy_sequence_law(tw);
  for (const bool tree : {false, true}) {
    ex::resident_sd_options opt;
    opt.draft_length = 2;
    opt.max_new_tokens = 3;
    if (tree) opt.draft_tree = trees::full(2, 2);
    const std::vector<token_t> prompt{0};
    decode_stats st;
    const auto before = ops.traffic();
    const auto g = specula::testing::g_test(ex::testing::toy_counts(
                                                [&](const request_rng& rng, decode_stats* s) {
                                                  return ex::resident_speculative_decode(
                                                      ops, prompt, opt, rng, s);
                                                },
                                                tree ? 2000 : 4000, 9, &st),
                                            law);
    INFO((tree ? "tree drafts: " : "chain drafts: ")
         << g << ", step compression " << st.step_compression());
    CHECK(g.impossible_observations == 0);
    CHECK(g.p_value > 1e-4);
    CHECK(st.step_compression() > 1.0);
    const auto after = ops.traffic();
    if (!tree) {
      // To the host: each drafted token (4 bytes), and per step the accepted count and the
      // chain's output tokens (4 + 4 * (drafts + 1) bytes) -- never a logit or probability row.
      CHECK(after.bytes_to_host - before.bytes_to_host ==
            static_cast<std::uint64_t>(8 * st.draft_forwards + 8 * st.steps));
    } else {
      // Per step at most: 4 bytes per draw slot (6), the count and 7 output slots.
      CHECK(after.bytes_to_host - before.bytes_to_host <=
            static_cast<std::uint64_t>((4 * 6 + 4 + 4 * 7) * st.steps));
    }
  }
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
  const auto& prompts = decode_testing::text_prompts();
  for (const bool tree : {false, true}) {
    // Tree drafts: SJD-PAC's shape, three draft candidates (top-3 draft rows) at the first
    // level; with one-hot target rows the output is still greedy decoding.
    if (tree) {
      opt.draft_tree = trees::sjd_pac(3, 1, 8);
      opt.draft.top_k = 3;
    }
    decode_stats st;
    const auto before = ops.traffic();
    for (std::size_t i = 0; i < 4; ++i) {
      const auto prompt = decode_testing::bytes(prompts[i]);
      ex::transformer_session hs(host);
      INFO("prompt " << prompts[i] << (tree ? ", tree drafts" : ", chain drafts"));
      CHECK(ex::resident_speculative_decode(ops, prompt, opt, request_rng{4, 0, 0}, &st) ==
            decode_testing::greedy_reference(hs, prompt, 40));
    }
    CHECK(st.step_compression() > 1.0);
    // Never a row (1 KiB each): per step at most 8 bytes per tree node and the count.
    const auto nodes = static_cast<std::uint64_t>(tree ? opt.draft_tree->size() : 5);
    CHECK(ops.traffic().bytes_to_host - before.bytes_to_host <=
          (8 * nodes + 4) * static_cast<std::uint64_t>(st.steps));
  }
}

TEST_CASE("resident SJD and SJD-PAC on the device sample the toy transformer's law",
          "[device][stats]") {
  if (!have_gpu("device resident SJD")) return;
  const auto c = ex::testing::toy_gtest_config();
  const auto tw = ex::testing::random_weights(c, 71);
  const ex::device_transformer target(tw);
  ex::device_sjd_ops ops(target);
  const auto law = ex::testing::toy_sequence_law(tw);
  const std::vector<token_t> prompt{0};
  for (const bool pac : {false, true}) {
    sjd_options o = pac ? sjd_options::sjd_pac(4, 2, 1) : sjd_options{};
    o.window = pac ? 4 : 2;
    o.max_new_tokens = 3;
    INFO((pac ? "SJD-PAC" : "SJD"));
    ex::testing::check_toy_gtest(
        [&](const request_rng& rng, decode_stats* s) {
          return ex::resident_sjd_decode(ops, prompt, o, rng, tree_verifier<>{}, s);
        },
        law, 2000);
  }
}

TEST_CASE(
    "resident SJD-PAC on the device with top-k = 1 equals host greedy decoding and moves "
    "no rows",
    "[device][models]") {
  if (!have_gpu("device resident SJD-PAC greedy")) return;
  const auto tw = ex::transformer_weights::load(models_dir / "text-target.safetensors");
  const ex::transformer host(tw);
  const ex::device_transformer target(tw);
  ex::device_sjd_ops ops(target);
  sjd_options o = sjd_options::sjd_pac();  // L = 64, K = 4, D = 3 (the authors' convention)
  o.max_new_tokens = 40;
  o.target.top_k = 1;
  decode_stats st;
  const auto before = ops.traffic();
  const auto& prompts = decode_testing::text_prompts();
  for (std::size_t i = 0; i < 4; ++i) {
    const auto prompt = decode_testing::bytes(prompts[i]);
    ex::transformer_session hs(host);
    INFO("prompt " << prompts[i]);
    CHECK(ex::resident_sjd_decode(ops, prompt, o, request_rng{6, 0, 0}, tree_verifier<>{}, &st) ==
          decode_testing::greedy_reference(hs, prompt, 40));
  }
  // Per iteration at most: the count and 64 output tokens, and two batches of draw jobs (one
  // job and one child slot per node, at most 4 children per node) -- no 1 KiB row.
  const std::uint64_t per_step = 4 + 4 * 64 + 2 * (8 * 64 + 4 * 4 * 64);
  CHECK(ops.traffic().bytes_to_host - before.bytes_to_host <=
        per_step * static_cast<std::uint64_t>(st.steps));
}

TEST_CASE(
    "resident multi-block (stochastic) on the device samples the toy transformer's law and moves "
    "no row",
    "[device][stats]") {
  if (!have_gpu("device resident multi-block (stochastic)")) return;
  const auto c = ex::testing::toy_gtest_config();
  const auto tw = ex::testing::random_weights(c, 71);
  const ex::device_transformer toy(tw);
  ex::device_sjd_ops toy_ops(toy);
  multiblock_options o;
  o.block_size = 2;
  o.spawn_ratio = 0.5;
  o.stochastic = true;
  o.recycling = false;
  o.init = jacobi_init::random;
  o.max_new_tokens = 3;
  const std::vector<token_t> prompt{0};
  ex::testing::check_toy_gtest(
      [&](const request_rng& rng, decode_stats* s) {
        return ex::resident_multiblock_decode(toy_ops, prompt, o, rng, tree_verifier<>{}, s);
      },
      ex::testing::toy_sequence_law(tw), 2000);
  // The shipped text model (V = 256, a row is 1 KiB), two blocks of 8, the context law: per
  // step at most the count and 17 output tokens, and a count and a token per stale position
  // (at most 16) -- never a row.
  const auto w = ex::transformer_weights::load(models_dir / "text-target.safetensors");
  const ex::device_transformer target(w);
  ex::device_sjd_ops ops(target);
  o.block_size = 8;
  o.init = jacobi_init::sample_context;
  o.max_new_tokens = 40;
  decode_stats st;
  const auto before = ops.traffic();
  const auto& prompts = decode_testing::text_prompts();
  for (std::uint32_t i = 0; i < 4; ++i) {
    const auto out = ex::resident_multiblock_decode(ops, decode_testing::bytes(prompts[i]), o,
                                                    request_rng{8, i, 0}, tree_verifier<>{}, &st);
    CHECK(out.size() == 40);
  }
  CHECK(st.step_compression() > 1.0);
  CHECK(ops.traffic().bytes_to_host - before.bytes_to_host <=
        static_cast<std::uint64_t>(4 + 4 * 17 + 8 * 16) * static_cast<std::uint64_t>(st.steps));
}

TEST_CASE("resident n-gram lookup on the device samples the toy transformer's law and moves no row",
          "[device][stats]") {
  if (!have_gpu("device resident n-gram lookup")) return;
  const auto c = ex::testing::toy_gtest_config();
  const auto tw = ex::testing::random_weights(c, 71);
  const ex::device_transformer toy(tw);
  ex::device_sjd_ops toy_ops(toy);
  speculative_options o;
  o.max_new_tokens = 3;
  ngram_options no;
  no.max_branches = 2;
  ngram_proposal draft(no);
  const std::vector<token_t> prompt{0};
  ex::testing::check_toy_gtest(
      [&](const request_rng& rng, decode_stats* s) {
        return ex::resident_proposal_decode(toy_ops, draft, prompt, o, rng, tree_verifier<>{}, s);
      },
      ex::testing::toy_sequence_law(tw), 2000);
  // The shipped text model, chain drafts of 4: per step the count and at most 5 output tokens.
  const auto w = ex::transformer_weights::load(models_dir / "text-target.safetensors");
  const ex::transformer host(w);
  const ex::device_transformer target(w);
  ex::device_sjd_ops ops(target);
  o.max_new_tokens = 40;
  o.target.top_k = 1;  // greedy decoding
  decode_stats st;
  const auto before = ops.traffic();
  const auto& prompts = decode_testing::text_prompts();
  for (std::size_t i = 0; i < 4; ++i) {
    const auto prompt_i = decode_testing::bytes(prompts[i]);
    ex::transformer_session hs(host);
    ngram_proposal lookup;
    INFO("prompt " << prompts[i]);
    CHECK(ex::resident_proposal_decode(ops, lookup, prompt_i, o, request_rng{}, tree_verifier<>{},
                                       &st) == decode_testing::greedy_reference(hs, prompt_i, 40));
  }
  CHECK(ops.traffic().bytes_to_host - before.bytes_to_host <=
        static_cast<std::uint64_t>(4 + 4 * 5) * static_cast<std::uint64_t>(st.steps));
}

TEST_CASE("resident Cool-SD on the device: omega = 1 keeps the target's law, omega = 2 does not",
          "[device][stats]") {
  if (!have_gpu("device resident Cool-SD")) return;
  const auto c = ex::testing::toy_gtest_config();
  const auto tw = ex::testing::random_weights(c, 71), dw = ex::testing::random_weights(c, 72);
  const ex::device_transformer target(tw), draft(dw);
  ex::device_sd_ops ops(target, draft);
  ex::testing::check_toy_relaxed_omega(ops, ex::testing::toy_sequence_law(tw), 2000);
}

TEST_CASE("CUDA graphs give the same logits and loop outputs as direct launches",
          "[device][models]") {
  if (!have_gpu("device CUDA graphs")) return;
  const auto tw = ex::transformer_weights::load(models_dir / "text-target.safetensors");
  const auto dw = ex::transformer_weights::load(models_dir / "text-draft.safetensors");
  const ex::device_transformer direct(tw), direct_draft(dw);
  ex::device_transformer graphed(tw), graphed_draft(dw);
  graphed.set_graphs(true);
  graphed_draft.set_graphs(true);
  REQUIRE(graphed.graphs());
  REQUIRE_FALSE(direct.graphs());
  const auto V = static_cast<std::size_t>(tw.config.vocab_size);
  const auto prompt = decode_testing::bytes(decode_testing::text_prompts()[0]);
  // The same evaluations (each shape twice: captured, then replayed) with commits between.
  ex::device_session a(direct), b(graphed);
  a.prefill(prompt);
  b.prefill(prompt);
  const token_tree shapes[] = {trees::chain(std::vector<token_t>{1}),
                               trees::chain(std::vector<token_t>{1, 2, 3, 4}),
                               trees::sjd_pac(3, 1, 8)};
  for (int round = 0; round < 2; ++round)
    for (const token_tree& shape : shapes) {
      std::vector<token_t> tokens(shape.tokens().begin(), shape.tokens().end());
      tokens[0] = prompt.back();
      for (std::size_t i = 1; i < tokens.size(); ++i) tokens[i] = static_cast<token_t>(97 + i);
      const token_tree tree(std::vector<index_t>(shape.parents().begin(), shape.parents().end()),
                            tokens);
      std::vector<float> la(static_cast<std::size_t>(tree.size()) * V), lb(la.size());
      a.evaluate(tree, batch_view<float>(la.data(), tree.size(), tw.config.vocab_size));
      b.evaluate(tree, batch_view<float>(lb.data(), tree.size(), tw.config.vocab_size));
      CHECK(la == lb);
      const std::vector<index_t> path{0};
      a.commit(path);
      b.commit(path);
    }
  // Sampled resident loops: the same rows, so the same draws.
  ex::resident_sd_options so;
  so.max_new_tokens = 32;
  so.draft_tree = trees::full(2, 3);
  ex::device_sd_ops sd_a(direct, direct_draft), sd_b(graphed, graphed_draft);
  CHECK(ex::resident_speculative_decode(sd_a, prompt, so, request_rng{7, 0, 0}) ==
        ex::resident_speculative_decode(sd_b, prompt, so, request_rng{7, 0, 0}));
  sjd_options jo = sjd_options::sjd_pac(24, 3, 3, true);
  jo.max_new_tokens = 32;
  ex::device_sjd_ops sjd_a(direct), sjd_b(graphed);
  CHECK(ex::resident_sjd_decode(sjd_a, prompt, jo, request_rng{7, 0, 0}) ==
        ex::resident_sjd_decode(sjd_b, prompt, jo, request_rng{7, 0, 0}));
}

TEST_CASE("resident SSD on the device equals host stepwise decoding and moves row summaries only",
          "[device][models]") {
  if (!have_gpu("device resident SSD")) return;
  const auto w = ex::transformer_weights::load(models_dir / "text-diffusion.safetensors");
  const ex::transformer host(w);
  const ex::device_transformer dev(w);
  ex::resident_ssd_rows<ex::device_transformer> rows(dev);
  const auto& prompts = decode_testing::text_prompts();
  for (const auto cache : {ssd_cache::none, ssd_cache::dual}) {
    decode_stats st;
    std::uint64_t bytes = 0, bound = 0;
    for (std::size_t i = 0; i < 3; ++i) {
      const auto prompt = decode_testing::bytes(prompts[i]);
      ssd_options opt = ex::testing::small_ssd_options(cache);
      opt.tree = ssd_tree::mix_order;
      opt.draft_length = 4;
      const auto ref = diffusion_stepwise_decode(host, prompt, opt);
      INFO("prompt " << prompts[i] << " dual cache " << (cache == ssd_cache::dual));
      CHECK(ex::resident_stepwise_decode(dev, rows, prompt, opt) == ref);
      const auto before = dev.traffic().bytes_to_host;
      const auto passes = st.target_forwards;
      CHECK(ex::resident_ssd_decode(dev, rows, prompt, opt, &st) == ref);
      bytes += dev.traffic().bytes_to_host - before;
      // At most 8 nodes of prompt + 24 rows per pass, 16 bytes each (a logit row: 1 KiB).
      bound += static_cast<std::uint64_t>(st.target_forwards - passes) * 8 * (prompt.size() + 24) *
               sizeof(specula::detail::row_top);
    }
    CHECK(st.step_compression() > 1.0);
    CHECK(bytes % sizeof(specula::detail::row_top) == 0);
    CHECK(bytes > 0);
    CHECK(bytes <= bound);
  }
}

TEST_CASE(
    "resident Jacobi and multi-block on the device equal host greedy decoding and move row "
    "summaries only",
    "[device][models]") {
  if (!have_gpu("device resident Jacobi")) return;
  const auto tw = ex::transformer_weights::load(models_dir / "text-target.safetensors");
  const ex::transformer host(tw);
  const ex::device_transformer target(tw);
  ex::resident_greedy_ops<ex::device_session> ops(target);
  jacobi_options o;
  o.window = 16;
  o.max_new_tokens = 40;
  decode_stats st;
  const auto before = target.traffic().bytes_to_host;
  const auto& prompts = decode_testing::text_prompts();
  for (std::size_t i = 0; i < 4; ++i) {
    const auto prompt = decode_testing::bytes(prompts[i]);
    ex::transformer_session hs(host);
    INFO("prompt " << prompts[i]);
    const auto ref = decode_testing::greedy_reference(hs, prompt, 40);
    CHECK(ex::resident_jacobi_decode(ops, prompt, o, request_rng{}, &st) == ref);
    multiblock_options mo;
    mo.block_size = 16;
    mo.max_blocks = 2;
    mo.spawn_ratio = 0.5;
    mo.max_new_tokens = 40;
    CHECK(ex::resident_multiblock_decode(ops, prompt, mo, request_rng{}, &st) == ref);
  }
  CHECK(st.step_compression() > 1.0);
  // 16 bytes per evaluated node (at most 33: the root, two blocks of 16, and as many recycled
  // candidate nodes), never a 1 KiB row.
  CHECK(target.traffic().bytes_to_host - before <=
        static_cast<std::uint64_t>(st.target_forwards) * 64 * sizeof(specula::detail::row_top));
}

TEST_CASE(
    "the device vocabulary limit: rows equal the host's limited rows, the resident image loops "
    "equal host greedy decoding of masked rows",
    "[device][models]") {
  if (!have_gpu("device vocabulary limit")) return;
  const ex::testing::image_task image(models_dir);
  const auto& w = image.weights;
  const ex::transformer host = image.limited();
  ex::device_transformer dev(w);
  const index_t V = w.config.vocab_size, limit = image.limit();
  dev.set_vocab_limit(limit);
  CHECK(dev.vocab_limit() == limit);
  const auto tokens = heldout_windows("image-ar.heldout.safetensors", 1, 40);
  ex::transformer_session hs(host);
  ex::device_session ds(dev);
  const auto first = std::span<const token_t>(tokens).first(8);
  hs.prefill(first);
  ds.prefill(first);
  const auto rest = std::span<const token_t>(tokens).subspan(8);
  const auto h = chain_rows(hs, rest, V), d = chain_rows(ds, rest, V);
  std::vector<float> h_kept, d_kept;
  bool tails_masked = true;
  for (std::size_t i = 0; i < h.size(); ++i) {
    if (static_cast<index_t>(i % static_cast<std::size_t>(V)) < limit) {
      h_kept.push_back(h[i]);
      d_kept.push_back(d[i]);
    } else {
      tails_masked =
          tails_masked && d[i] == -std::numeric_limits<float>::infinity() && h[i] == d[i];
    }
  }
  CHECK(tails_masked);
  CHECK(worst(d_kept, h_kept) <= tolerance);
  // The resident loops of the image task: Jacobi, multi-block and SJD-PAC with top-k = 1 on
  // the limited device model equal host greedy decoding of rows masked by the caller.
  const ex::transformer plain(w);
  ex::resident_greedy_ops<ex::device_session> greedy(dev);
  ex::device_sjd_ops sjd(dev);
  const auto jo = ex::testing::jacobi_window8(image.tokens());
  const auto mo = ex::testing::two_blocks_of8(image.tokens());
  sjd_options so = sjd_options::sjd_pac(16, 3, 2);
  so.max_new_tokens = image.tokens();
  so.target.top_k = 1;
  so.init_tokens_end = limit;
  for (const index_t label : {0, 5}) {
    const std::vector<token_t> prompt{image.vq.label_token(label)};
    ex::testing::tail_masked_session<ex::transformer_session> masked(plain, limit);
    const auto ref = decode_testing::greedy_reference(masked, prompt, image.tokens());
    INFO("label " << label);
    CHECK(ex::resident_jacobi_decode(greedy, prompt, jo, request_rng{}) == ref);
    CHECK(ex::resident_multiblock_decode(greedy, prompt, mo, request_rng{}) == ref);
    CHECK(ex::resident_sjd_decode(sjd, prompt, so, request_rng{3, 0, 0}, tree_verifier<>{}) == ref);
  }
}

TEST_CASE("resident SD with p-min on the device samples the toy transformer's law",
          "[device][stats]") {
  if (!have_gpu("device resident SD with p-min")) return;
  const auto c = ex::testing::toy_gtest_config();
  const auto tw = ex::testing::random_weights(c, 71), dw = ex::testing::random_weights(c, 72);
  const ex::device_transformer target(tw), draft(dw);
  ex::device_sd_ops ops(target, draft);
  ex::resident_sd_options opt;
  opt.draft_length = 2;
  opt.max_new_tokens = 3;
  opt.draft_p_min = 0.5f;
  const std::vector<token_t> prompt{0};
  decode_stats st;
  const auto before = ops.traffic();
  const auto g = specula::testing::g_test(ex::testing::toy_counts(
                                              [&](const request_rng& rng, decode_stats* s) {
                                                return ex::resident_speculative_decode(ops, prompt,
                                                                                       opt, rng, s);
                                              },
                                              4000, 9, &st),
                                          ex::testing::toy_sequence_law(tw));
  INFO(g << ", step compression " << st.step_compression());
  CHECK(g.impossible_observations == 0);
  CHECK(g.p_value > 1e-4);
  // Per draft pass its token and its row's largest q entry (8 bytes); per step the count and
  // at most 3 output tokens.
  CHECK(ops.traffic().bytes_to_host - before.bytes_to_host <=
        static_cast<std::uint64_t>(8 * st.draft_forwards + 16 * st.steps));
}

TEST_CASE("guidance on the device: cfg_model over device_batch equals the host's guided pair",
          "[device][models]") {
  if (!have_gpu("device CFG")) return;
  const auto vq = ex::vq_codebook::load(models_dir / "image-vq.safetensors",
                                        models_dir / "image-ar-256.safetensors");
  const auto w = ex::transformer_weights::load(models_dir / "image-ar-256.safetensors");
  const ex::transformer host(w);
  const ex::device_transformer dev(w);
  const token_t null_label = vq.label_token(-1);
  const auto uncond = [null_label](std::span<const token_t> prompt) {
    std::vector<token_t> u(prompt.begin(), prompt.end());
    u.front() = null_label;
    return u;
  };
  ex::transformer_batch host_pair(host, 2);
  ex::device_batch dev_pair(dev, 2);
  cfg_model<ex::transformer_batch> host_guided(host_pair, 3.0f, uncond);
  cfg_model<ex::device_batch> dev_guided(dev_pair, 3.0f, uncond);
  const std::vector<token_t> prompt{vq.label_token(2)};
  // Greedy decoding of the guided rows (48 tokens): the same tokens.
  CHECK(decode_testing::greedy_reference(dev_guided, prompt, 48) ==
        decode_testing::greedy_reference(host_guided, prompt, 48));
}
