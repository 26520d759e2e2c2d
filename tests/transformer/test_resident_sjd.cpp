// resident_sjd_decode (resident_sjd.hpp) with its host stand-in ops: the library's SJD loop
// driven with the rows kept by the ops — the plumbing the device ops share (the ops' forward
// pass and verification, the accepted path recovered from the emitted tokens, the chain below
// the Proactive Drafting tree drawn as one batch, the q-row buffers swapped) — exercised
// without a GPU. With the same rows and draws it equals sjd_decode token for token (sampled,
// on the shipped text model); its output law is the target's (G-tests on the toy transformer;
// negative control: a verifier that accepts the first path); with top-k = 1 it is greedy
// decoding. The same ops as multi-block's stochastic rows policy (resident_multiblock_decode):
// equal to multiblock_decode token for token (every window initialisation) and the target's law
// on the toy transformer (negative control: accept the whole window). And as the target of
// speculative decoding with the n-gram proposal (resident_proposal_decode): equal to
// speculative_decode token for token (chain and tree drafts), the target's law on the toy
// transformer (negative control: accept every draft), a proposal with q rows refused.

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <vector>

#include <specula/decode/lookup.hpp>
#include <specula/decode/multiblock.hpp>
#include <specula/decode/sjd.hpp>
#include <specula_example/resident_sjd.hpp>

#include "image_test_util.hpp"
#include "toy_sd_gtest.hpp"
#include "transformer_test_util.hpp"

using namespace specula;
using namespace specula::example;

namespace {

/// SJD (window 16), SJD-PAC as its authors ran it but on a window of 24, SJD-PAC with the
/// lighter first-path tree and one-hot initialisation, and the authors' code's residual
/// siblings (not lossless; the same draws on both sides).
std::vector<sjd_options> resident_configurations(index_t max_new_tokens) {
  std::vector<sjd_options> all(4);
  all[1] = sjd_options::sjd_pac(24, 3, 3, true);
  all[2] = sjd_options::sjd_pac(12, 2, 2);
  all[2].pd_full_tree = false;
  all[2].init = sjd_init::one_hot_q;
  all[3] = sjd_options::sjd_pac(16, 3, 2);
  all[3].official_residual_siblings = true;
  for (auto& o : all) o.max_new_tokens = max_new_tokens;
  return all;
}

}  // namespace

TEST_CASE("resident SJD with host ops equals sjd_decode token for token", "[backend][models]") {
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto model = transformer::load(dir / "text-target.safetensors");
  host_sjd_ops ops(model);
  const auto& prompts = decode_testing::text_prompts();
  for (const sjd_options& o : resident_configurations(40)) {
    decode_stats st;
    for (std::size_t i = 0; i < 3; ++i) {
      const auto prompt = decode_testing::bytes(prompts[i]);
      transformer_session s(model);
      INFO("prompt " << prompts[i] << ", window " << o.window << ", PD " << o.proactive_drafting);
      const request_rng rng{11, static_cast<std::uint32_t>(i), 0};
      CHECK(resident_sjd_decode(ops, prompt, o, rng, tree_verifier<>{}, &st) ==
            sjd_decode(s, prompt, o, rng));
    }
    CHECK(st.tokens == 120);
  }
}

namespace {

/// check_toy_law of a resident loop `run(ops, prompt, verifier, rng, stats)` with host ops over
/// the toy transformer (law enumerated with the host forward): the exact verifier, and a
/// verifier that accepts the first path as the negative control.
template <class Run>
void check_host_ops_toy_law(Run&& run) {
  const auto tw = example::testing::random_weights(example::testing::toy_gtest_config(), 71);
  const transformer target(tw);
  host_sjd_ops ops(target);
  const std::vector<token_t> prompt{0};
  example::testing::check_toy_law(
      [&](const request_rng& rng, decode_stats* st) {
        return run(ops, prompt, tree_verifier<>{}, rng, st);
      },
      [&](const request_rng& rng, decode_stats* st) {
        return run(ops, prompt, decode_testing::first_path_verifier{}, rng, st);
      },
      example::testing::toy_sequence_law(tw));
}

}  // namespace

TEST_CASE("resident SJD and SJD-PAC with host ops sample the toy transformer's law (G-test)",
          "[backend][stats]") {
  for (const bool pac : {false, true}) {
    sjd_options o = pac ? sjd_options::sjd_pac(4, 2, 1) : sjd_options{};
    o.window = pac ? 4 : 2;
    o.max_new_tokens = 3;
    INFO((pac ? "SJD-PAC" : "SJD"));
    check_host_ops_toy_law(
        [&](auto& ops, const auto& prompt, const auto& verifier, const request_rng& rng,
            decode_stats* st) { return resident_sjd_decode(ops, prompt, o, rng, verifier, st); });
  }
}

TEST_CASE("resident SJD-PAC with top-k = 1 equals greedy decoding of the shipped text model",
          "[backend][models]") {
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto model = transformer::load(dir / "text-target.safetensors");
  host_sjd_ops ops(model);
  sjd_options o = sjd_options::sjd_pac(24, 3, 3, true);
  o.max_new_tokens = 32;
  o.target.top_k = 1;
  decode_stats st;
  for (const auto& text : decode_testing::text_prompts()) {
    const auto prompt = decode_testing::bytes(text);
    transformer_session ar(model);
    INFO("prompt " << text);
    CHECK(resident_sjd_decode(ops, prompt, o, request_rng{5, 0, 0}, tree_verifier<>{}, &st) ==
          decode_testing::greedy_reference(ar, prompt, 32));
  }
  CHECK(st.step_compression() > 1.0);
}

TEST_CASE(
    "resident SJD on a vocabulary-limited image model equals sjd_decode over rows masked by the "
    "caller",
    "[backend][models]") {
  // The image task on the GPU: the model cuts the label tokens from its rows (set_vocab_limit);
  // the same rows and draws as the demo's host loop, which masks them in its session.
  const example::testing::image_task image(SPECULA_MODELS_DIR);
  const transformer limited = image.limited(), plain(image.weights);
  host_sjd_ops ops(limited);
  std::vector<sjd_options> configurations(2);
  configurations[1] = sjd_options::sjd_pac(16, 3, 2);
  for (sjd_options& o : configurations) {
    o.max_new_tokens = image.tokens();
    o.init_tokens_end = image.limit();  // random initialisation draws image tokens
    o.image_width = image.vq.grid();
    for (std::uint32_t i = 0; i < 2; ++i) {
      const std::vector<token_t> prompt{image.vq.label_token(static_cast<index_t>(i))};
      example::testing::tail_masked_session<transformer_session> masked(plain, image.limit());
      const request_rng rng{13, i, 0};
      const auto out = resident_sjd_decode(ops, prompt, o, rng);
      INFO("label " << i << ", PD " << o.proactive_drafting);
      CHECK(out == sjd_decode(masked, prompt, o, rng));
      CHECK(std::all_of(out.begin(), out.end(), [&](token_t t) { return t < image.limit(); }));
    }
  }
}

TEST_CASE("resident SJD refuses the spatial priors", "[backend][bad_input]") {
  const auto w = example::testing::random_weights(example::testing::small_config(), 3);
  const transformer m(w);
  host_sjd_ops ops(m);
  sjd_options o;
  o.init = sjd_init::horizontal_sample;
  const std::vector<token_t> prompt{1, 2};
  CHECK_THROWS_WITH(resident_sjd_decode(ops, prompt, o, request_rng{}), Catch::Contains("init"));
}

namespace {

/// Multi-block's stochastic variant: two blocks of 8, spawning at half a block, the window
/// filled as `init` says.
multiblock_options stochastic_blocks(jacobi_init init, index_t max_new_tokens) {
  multiblock_options o;
  o.block_size = 8;
  o.spawn_ratio = 0.5;
  o.stochastic = true;
  o.recycling = false;
  o.init = init;
  o.max_new_tokens = max_new_tokens;
  return o;
}

}  // namespace

TEST_CASE(
    "resident multi-block (stochastic) with host ops equals multiblock_decode token for token",
    "[backend][models]") {
  // The SJD ops as the sampled window's rows policy: AC draws as jobs of one child, the rows set
  // without a draw (kept rows, one-hot / uniform fills, the context law counted as the device
  // counts it), the leaf's window row kept aside during verification.
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto model = transformer::load(dir / "text-target.safetensors");
  host_sjd_ops ops(model);
  const auto& prompts = decode_testing::text_prompts();
  for (const jacobi_init init :
       {jacobi_init::repeat_last, jacobi_init::random, jacobi_init::sample_context}) {
    const multiblock_options o = stochastic_blocks(init, 36);
    decode_stats st;
    for (std::size_t i = 0; i < 2; ++i) {
      const auto prompt = decode_testing::bytes(prompts[i]);
      transformer_session s(model);
      INFO("prompt " << prompts[i] << ", init " << static_cast<int>(init));
      const request_rng rng{17, static_cast<std::uint32_t>(i), 0};
      CHECK(resident_multiblock_decode(ops, prompt, o, rng, tree_verifier<>{}, &st) ==
            multiblock_decode(s, prompt, o, rng));
    }
    CHECK(st.tokens == 72);
  }
  // The SJD ops serve the stochastic variant only.
  multiblock_options greedy = stochastic_blocks(jacobi_init::repeat_last, 8);
  greedy.stochastic = false;
  const std::vector<token_t> prompt{1, 2};
  CHECK_THROWS_WITH(resident_multiblock_decode(ops, prompt, greedy), Catch::Contains("stochastic"));
}

TEST_CASE("resident multi-block (stochastic) with host ops samples the toy transformer's law",
          "[backend][stats]") {
  // Negative control: accepting the whole window (its uniform fills and stale draws are no
  // target samples).
  multiblock_options o = stochastic_blocks(jacobi_init::random, 3);
  o.block_size = 2;
  check_host_ops_toy_law([&](auto& ops, const auto& prompt, const auto& verifier,
                             const request_rng& rng, decode_stats* st) {
    return resident_multiblock_decode(ops, prompt, o, rng, verifier, st);
  });
}

namespace {

/// A stochastic proposal (one drafted token and its q row: the uniform row).
struct uniform_proposal {
  index_t V = 4;
  bool propose(std::span<const token_t> context, token_tree& tree, std::vector<float>& q) {
    tree = token_tree({-1, 0}, {context.back(), 0});
    q.assign(static_cast<std::size_t>(2 * V), 1.0f / static_cast<float>(V));
    return true;
  }
};

}  // namespace

TEST_CASE("resident n-gram lookup with host ops equals speculative_decode token for token",
          "[backend][models]") {
  // The drafts from the committed tokens (host), the target's p rows and the verification of
  // the deterministic drafts (one-hot proposals) by the ops, as on the GPU.
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto model = transformer::load(dir / "text-target.safetensors");
  host_sjd_ops ops(model);
  speculative_options o;
  o.max_new_tokens = 40;
  const auto& prompts = decode_testing::text_prompts();
  for (const index_t branches : {1, 3}) {
    ngram_options no;
    no.max_branches = branches;
    decode_stats st;
    for (std::size_t i = 0; i < 2; ++i) {
      const auto prompt = decode_testing::bytes(prompts[i]);
      transformer_session s(model);
      ngram_proposal a(no), b(no);
      INFO("prompt " << prompts[i] << ", branches " << branches);
      const request_rng rng{19, static_cast<std::uint32_t>(i), 0};
      CHECK(resident_proposal_decode(ops, a, prompt, o, rng, tree_verifier<>{}, &st) ==
            speculative_decode(s, b, prompt, o, rng));
    }
    CHECK(st.tokens == 80);
  }
  // A proposal with q rows (host memory) is refused.
  uniform_proposal stochastic{model.vocab_size()};
  const std::vector<token_t> prompt{1, 2};
  CHECK_THROWS_WITH(resident_proposal_decode(ops, stochastic, prompt, o, request_rng{}),
                    Catch::Contains("proposal"));
}

TEST_CASE("resident n-gram lookup with host ops samples the toy transformer's law",
          "[backend][stats]") {
  // Negative control: accepting every n-gram draft (and the argmax after them).
  speculative_options o;
  o.max_new_tokens = 3;
  ngram_options no;
  no.max_branches = 2;
  ngram_proposal draft(no);
  check_host_ops_toy_law([&](auto& ops, const auto& prompt, const auto& verifier,
                             const request_rng& rng, decode_stats* st) {
    return resident_proposal_decode(ops, draft, prompt, o, rng, verifier, st);
  });
}
