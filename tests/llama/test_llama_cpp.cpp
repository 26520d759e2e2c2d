// specula's decoding loops over llama.cpp (examples/llama_cpp/llama_model.hpp), on the shipped
// models converted by tools/to_gguf.py (SPECULA_GGUF_DIR) and on two random toy models.
//
// References: the cards' held-out NLLs (computed by tools/train_models.py in PyTorch), specula's
// example backend (an independent forward pass), plain greedy decoding over llama.cpp itself
// (one token per llama_decode), a fresh prefill, and the toy target's sequence law enumerated
// through llama.cpp one prefix at a time.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <llama_model.hpp>
#include <nlohmann/json.hpp>
#include <specula/decode/jacobi.hpp>
#include <specula/decode/multiblock.hpp>
#include <specula/decode/speculative.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula/tree/builders.hpp>
#include <specula_example/sessions.hpp>
#include <specula_example/transformer.hpp>

#include "../decode/decode_test_util.hpp"

namespace {

using namespace specula;
namespace ex = specula::example;

const std::filesystem::path models_dir{SPECULA_MODELS_DIR};
const std::filesystem::path gguf_dir{SPECULA_GGUF_DIR};

std::filesystem::path gguf(const std::string& name) { return gguf_dir / (name + ".gguf"); }

/// The shipped causal llama-style models (those tools/to_gguf.py converts).
std::vector<std::string> causal_models() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(models_dir)) {
    const std::string f = e.path().filename().string();
    if (!f.ends_with(".card.json")) continue;
    std::ifstream in(e.path());
    const auto card = nlohmann::json::parse(in);
    const auto& c = card.at("config");
    if (c.at("architecture") == "llama" && c.at("causal").get<bool>())
      out.push_back(card.at("name").get<std::string>());
  }
  std::sort(out.begin(), out.end());
  return out;
}

nlohmann::json read_card(const std::string& name) {
  std::ifstream in(models_dir / (name + ".card.json"));
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

/// Largest |a - b| over two equally long rows.
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

/// Rows of `tree` evaluated below `context + tree root` by a session model after a fresh prefill.
template <class Model>
std::vector<float> fresh_rows(Model& m, std::vector<token_t> context, const token_tree& tree) {
  context.push_back(tree.token(0));
  m.prefill(context);
  std::vector<float> rows(static_cast<std::size_t>(tree.size() * m.vocab_size()));
  m.evaluate(tree, batch_view<float>(rows.data(), tree.size(), m.vocab_size()));
  return rows;
}

/// A tree of `shape`'s parents with random tokens in [0, vocab).
token_tree random_tokens(const token_tree& shape, index_t vocab, std::mt19937& rng) {
  std::vector<token_t> tokens(static_cast<std::size_t>(shape.size()));
  std::uniform_int_distribution<token_t> pick(0, static_cast<token_t>(vocab - 1));
  for (auto& t : tokens) t = pick(rng);
  return token_tree(std::vector<index_t>(shape.parents().begin(), shape.parents().end()), tokens);
}

}  // namespace

TEST_CASE("held-out NLL through llama.cpp is within 1% of each model card", "[llama][models]") {
  const auto names = causal_models();
  REQUIRE(names.size() >= 5);
  for (const auto& name : names) {
    const auto card = read_card(name);
    const auto data =
        example::safetensors_file::open(models_dir / card.at("heldout_file").get<std::string>());
    const auto& info = data.at("inputs");
    const index_t rows = info.shape[0], T = info.shape[1];
    const auto inputs = data.read_i32("inputs", info.shape);
    const auto targets = data.read_i32("targets", info.shape);
    ex::llama_model m(gguf(name));
    const index_t V = m.vocab_size();
    REQUIRE(V == card.at("config").at("vocab_size").get<index_t>());
    std::vector<index_t> chain(static_cast<std::size_t>(T));
    for (index_t i = 0; i < T; ++i) chain[static_cast<std::size_t>(i)] = i - 1;
    std::vector<float> logits(static_cast<std::size_t>(T * V));
    double nll = 0.0;
    index_t n = 0;
    for (index_t r = 0; r < rows; ++r) {
      const auto* row_in = inputs.data() + r * T;
      const token_tree seq(chain, std::vector<token_t>(row_in, row_in + T));
      m.prefill(std::span<const token_t>(row_in, 1));
      m.evaluate(seq, batch_view<float>(logits.data(), T, V));
      for (index_t i = 0; i < T; ++i) {
        const std::int32_t t = targets[static_cast<std::size_t>(r * T + i)];
        if (t < 0) continue;
        const float* x = logits.data() + i * V;
        double mx = x[0];
        for (index_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(x[v]));
        double z = 0.0;
        for (index_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(x[v]) - mx);
        nll += std::log(z) + mx - static_cast<double>(x[t]);
        ++n;
      }
    }
    nll /= static_cast<double>(n);
    const double expected = card.at("heldout_nll").get<double>();
    INFO(name << ": NLL through llama.cpp " << nll << ", card " << expected);
    CHECK(n == card.at("heldout_tokens").get<index_t>());
    CHECK(std::abs(nll - expected) <= 0.01 * expected);
  }
}

TEST_CASE("llama.cpp's tree rows match the example backend's within 1e-3", "[llama][models]") {
  std::mt19937 rng(35);
  for (const std::string name : {"text-target", "text-draft", "image-ar-256", "toy-target"}) {
    const auto weights = name.starts_with("toy") ? gguf_dir / (name + ".safetensors")
                                                 : models_dir / (name + ".safetensors");
    const auto ours = example::transformer::load(weights);
    example::transformer_session ref(ours);
    ex::llama_model m(gguf(name));
    REQUIRE(m.vocab_size() == ours.vocab_size());
    const index_t V = m.vocab_size();
    for (const token_tree& shape : {trees::chain(6), trees::full(2, 3), trees::sjd_pac(3, 1, 8)}) {
      const token_tree tree = random_tokens(shape, V, rng);
      std::vector<token_t> context(17);
      std::uniform_int_distribution<token_t> pick(0, static_cast<token_t>(V - 1));
      for (auto& t : context) t = pick(rng);
      const auto a = fresh_rows(m, context, tree);
      const auto b = fresh_rows(ref, context, tree);
      INFO(name << ", tree of " << tree.size() << " nodes");
      CHECK(max_abs_diff(a, b) <= 1e-3);
      // After committing the deepest first path, a chain below it matches too.
      std::vector<index_t> path{0};
      while (tree.first_child(path.back()) >= 0) path.push_back(tree.first_child(path.back()));
      m.commit(path);
      ref.commit(path);
      const token_tree next = random_tokens(trees::chain(3), V, rng);
      std::vector<float> ra(static_cast<std::size_t>(next.size() * V)), rb(ra.size());
      m.evaluate(next, batch_view<float>(ra.data(), next.size(), V));
      ref.evaluate(next, batch_view<float>(rb.data(), next.size(), V));
      CHECK(m.context_size() == ref.context_size());
      CHECK(max_abs_diff(ra, rb) <= 1e-3);
    }
  }
}

TEST_CASE("a chain pass over llama.cpp gives the rows of one-token passes", "[llama][models]") {
  // What greedy SD over llama.cpp verifies with (a pass of root + drafts) against what plain
  // greedy decoding decides with (one token per pass). Without llamafile's GEMM every logit is
  // summed the same way in both: equal bit for bit; with it, equal up to rounding.
  std::mt19937 rng(3);
  for (const std::string name : {"text-target", "text-draft"}) {
    ex::llama_model m(gguf(name));
    const index_t V = m.vocab_size();
    std::uniform_int_distribution<token_t> pick(0, static_cast<token_t>(V - 1));
    std::vector<token_t> context(23);
    for (auto& t : context) t = pick(rng);
    const token_tree chain = random_tokens(trees::chain(7), V, rng);
    const auto whole = fresh_rows(m, context, chain);
    std::vector<float> single(whole.size());
    context.push_back(chain.token(0));
    m.prefill(context);
    const std::vector<index_t> root{0};
    for (index_t i = 0; i < chain.size(); ++i) {
      const token_tree one(std::vector<index_t>{-1}, std::vector<token_t>{chain.token(i)});
      m.evaluate(one, batch_view<float>(single.data() + i * V, 1, V));
      m.commit(root);
    }
    INFO(name << ", llamafile GEMM " << (ex::llama_uses_llamafile() ? "on" : "off"));
    if (ex::llama_uses_llamafile())
      CHECK(max_abs_diff(whole, single) <= 1e-4);
    else
      CHECK(whole == single);
  }
}

TEST_CASE("commit and rollback sequences over llama.cpp equal a fresh prefill", "[llama]") {
  // Three requests in one context, their operations interleaved; after every operation each
  // request's next tree is compared with a fresh single-request context prefilled with what
  // that request committed.
  const index_t R = 3;
  ex::llama_model_options opt;
  opt.requests = R;
  opt.max_leaves = 16;
  ex::llama_model m(gguf("text-target"), opt);
  ex::llama_model fresh(gguf("text-target"));
  const index_t V = m.vocab_size();
  std::mt19937 rng(7);
  std::uniform_int_distribution<token_t> pick(0, static_cast<token_t>(V - 1));
  std::vector<std::vector<token_t>> committed(R);
  std::vector<token_t> root(R);
  for (index_t r = 0; r < R; ++r) {
    std::vector<token_t> prompt(static_cast<std::size_t>(5 + 3 * r));
    for (auto& t : prompt) t = pick(rng);
    m.prefill(r, prompt);
    committed[static_cast<std::size_t>(r)].assign(prompt.begin(), prompt.end() - 1);
    root[static_cast<std::size_t>(r)] = prompt.back();
  }
  const std::vector<token_tree> shapes{trees::chain(4), trees::full(2, 2), trees::full(3, 2),
                                       trees::sjd_pac(4, 2, 24)};
  double worst = 0.0;
  for (int op = 0; op < 60; ++op) {
    const index_t r = static_cast<index_t>(rng() % R);
    auto& ctx = committed[static_cast<std::size_t>(r)];
    if (rng() % 4 == 0 && !ctx.empty()) {
      const index_t n = static_cast<index_t>(rng() % (ctx.size() + 1));
      m.rollback(r, n);
      ctx.resize(static_cast<std::size_t>(n));
      root[static_cast<std::size_t>(r)] = pick(rng);
      CHECK(m.context_size(r) == n);
      continue;
    }
    token_tree tree = random_tokens(shapes[rng() % shapes.size()], V, rng);
    tree.set_token(0, root[static_cast<std::size_t>(r)]);
    std::vector<float> got(static_cast<std::size_t>(tree.size() * V));
    const index_t req[] = {r};
    m.evaluate(req, std::span<const token_tree>(&tree, 1),
               batch_view<float>(got.data(), tree.size(), V));
    const auto want = fresh_rows(fresh, ctx, tree);
    worst = std::max(worst, max_abs_diff(got, want));
    // Commit a random root-to-node path.
    const index_t end = static_cast<index_t>(rng() % static_cast<std::uint32_t>(tree.size()));
    const auto path = tree.path_to(end);
    m.commit(r, path);
    for (const index_t u : path) ctx.push_back(tree.token(u));
    root[static_cast<std::size_t>(r)] = pick(rng);
    CHECK(m.context_size(r) == static_cast<index_t>(ctx.size()));
  }
  INFO("largest difference to a fresh prefill " << worst);
  CHECK(worst <= 1e-4);
}

TEST_CASE("greedy SD, Jacobi and multi-block over llama.cpp equal greedy decoding over llama.cpp",
          "[llama][models]") {
  ex::llama_model target(gguf("text-target")), draft(gguf("text-draft"));
  ex::llama_model ar(gguf("text-target"));
  speculative_options sd;
  sd.max_new_tokens = 40;
  sd.mode = draft_mode::greedy;
  decode_stats chain_st, tree_st, jacobi_st, mb_st;
  for (const auto& text : decode_testing::text_prompts()) {
    const auto prompt = decode_testing::bytes(text);
    const auto ref = decode_testing::greedy_reference(ar, prompt, 40);
    INFO("prompt " << text);
    sd.draft_tree.reset();
    sd.draft_length = 4;
    CHECK(speculative_decode(target, draft, prompt, sd, request_rng{1, 0, 0},
                             greedy_tree_verifier<>{}, &chain_st) == ref);
    sd.draft_tree = trees::sjd_pac(3, 1, 8);
    CHECK(speculative_decode(target, draft, prompt, sd, request_rng{1, 0, 0},
                             greedy_tree_verifier<>{}, &tree_st) == ref);
    jacobi_options jo;
    jo.window = 8;
    jo.max_new_tokens = 40;
    CHECK(jacobi_decode(target, prompt, jo, request_rng{}, &jacobi_st) == ref);
    multiblock_options mo;
    mo.block_size = 8;
    mo.max_blocks = 2;
    mo.spawn_ratio = 0.5;
    mo.max_new_tokens = 40;
    CHECK(multiblock_decode(target, prompt, mo, {}, &mb_st) == ref);
  }
  CHECK(chain_st.step_compression() > 1.0);
  CHECK(tree_st.step_compression() > 1.0);
  CHECK(jacobi_st.step_compression() >= 1.0);
  CHECK(mb_st.step_compression() >= 1.0);
}

TEST_CASE("batched greedy SD over one llama.cpp context equals greedy decoding of each request",
          "[llama][models]") {
  ex::llama_model_options opt;
  opt.requests = 4;
  opt.max_leaves = 8;
  ex::llama_model target(gguf("text-target"), opt), draft(gguf("text-draft"), opt);
  ex::llama_model ar(gguf("text-target"));
  std::vector<std::vector<token_t>> prompts;
  for (int i = 0; i < 4; ++i)
    prompts.push_back(
        decode_testing::bytes(decode_testing::text_prompts()[static_cast<std::size_t>(i)]));
  speculative_options sd;
  sd.max_new_tokens = 32;
  sd.mode = draft_mode::greedy;
  sd.draft_tree = trees::full(2, 2);
  const std::vector<request_rng> rngs(4, request_rng{1, 0, 0});
  const auto before = target.decode_calls();
  const auto out =
      speculative_decode_batch(target, draft, prompts, sd, rngs, greedy_tree_verifier<>{});
  REQUIRE(out.size() == 4);
  for (std::size_t r = 0; r < 4; ++r)
    CHECK(out[r] == decode_testing::greedy_reference(ar, prompts[r], 32));
  // All four requests share each target pass: fewer llama_decode calls than steps of one.
  CHECK(target.decode_calls() - before < 4 * 32);
}

TEST_CASE("sampled SD over llama.cpp samples the toy target's sequence law (G-test)",
          "[llama][stats]") {
  // V = 4, 3 generated tokens (64 sequences); the law enumerated through llama.cpp one prefix
  // at a time (a fresh prefill each), the generations (8000 each) from chain and tree drafts.
  ex::llama_model target(gguf("toy-target")), draft(gguf("toy-draft")),
      law_model(gguf("toy-target"));
  const index_t V = target.vocab_size();
  REQUIRE(V == 4);
  const std::vector<token_t> prompt{1, 3, 0, 2};
  const index_t L = 3;
  std::vector<double> law(64, 1.0);
  for (index_t s = 0; s < 64; ++s) {
    std::vector<token_t> ctx = prompt;
    for (index_t i = 0; i < L; ++i) {
      const token_t y = static_cast<token_t>((s >> (2 * (L - 1 - i))) & 3);
      const token_tree root(std::vector<index_t>{-1}, std::vector<token_t>{ctx.back()});
      const auto row = fresh_rows(law_model, {ctx.begin(), ctx.end() - 1}, root);
      double mx = row[0], z = 0.0;
      for (const float x : row) mx = std::max(mx, static_cast<double>(x));
      for (const float x : row) z += std::exp(static_cast<double>(x) - mx);
      law[static_cast<std::size_t>(s)] *=
          std::exp(static_cast<double>(row[static_cast<std::size_t>(y)]) - mx) / z;
      ctx.push_back(y);
    }
  }
  const auto counts = [&](const speculative_options& opt, auto verifier, std::uint64_t seed,
                          std::uint32_t runs, decode_stats* st) {
    std::vector<std::uint64_t> c(64, 0);
    for (std::uint32_t i = 0; i < runs; ++i) {
      const auto out =
          speculative_decode(target, draft, prompt, opt, request_rng{seed, i, 0}, verifier, st);
      REQUIRE(out.size() == static_cast<std::size_t>(L));
      index_t s = 0;
      for (const token_t t : out) s = s * 4 + t;
      ++c[static_cast<std::size_t>(s)];
    }
    return c;
  };
  const std::uint32_t runs = 8'000;
  speculative_options opt;
  opt.max_new_tokens = L;
  opt.draft_length = 2;
  {
    decode_stats st;
    decode_testing::check_sequence_law(counts(opt, tree_verifier<>{}, 11, runs, &st), law, st,
                                       L * runs);
  }
  opt.draft_tree = trees::full(2, 2);
  {
    decode_stats st;
    decode_testing::check_sequence_law(counts(opt, tree_verifier<>{}, 12, runs, &st), law, st,
                                       L * runs);
  }
  // Negative control: accepting the first drafted path whatever the target says must fail.
  const auto biased = counts(opt, decode_testing::first_path_verifier{}, 13, runs / 4, nullptr);
  const auto g = specula::testing::g_test(biased, law);
  INFO(g);
  CHECK(g.p_value < 1e-6);
}

TEST_CASE("llama_model rejects bad input naming the argument", "[llama][bad_input]") {
  ex::llama_model_options opt;
  opt.requests = 2;
  opt.max_leaves = 4;
  ex::llama_model m(gguf("toy-target"), opt);
  const auto throws_naming = [](auto&& f, const std::string& what) {
    try {
      f();
      FAIL("no exception; expected one naming " << what);
    } catch (const invalid_input& e) {
      CHECK_THAT(e.what(), Catch::Contains(what));
    }
  };
  throws_naming([&] { m.prefill(0, std::vector<token_t>{}); }, "prompt");
  throws_naming([&] { m.prefill(0, std::vector<token_t>{1, 9}); }, "prompt");
  throws_naming([&] { m.prefill(2, std::vector<token_t>{1}); }, "request");
  m.prefill(0, std::vector<token_t>{1, 2, 3});
  std::vector<float> rows(64 * 4);
  const token_tree wide(std::vector<index_t>{-1, 0, 0, 0, 0, 0},
                        std::vector<token_t>{1, 0, 1, 2, 3, 0});  // five leaves > max_leaves
  throws_naming([&] { m.evaluate(wide, batch_view<float>(rows.data(), wide.size(), 4)); }, "trees");
  const token_tree bad(std::vector<index_t>{-1, 0}, std::vector<token_t>{1, 4});
  throws_naming([&] { m.evaluate(bad, batch_view<float>(rows.data(), 2, 4)); }, "tree tokens");
  const token_tree two(std::vector<index_t>{-1, 0}, std::vector<token_t>{1, 2});
  throws_naming([&] { m.evaluate(two, batch_view<float>(rows.data(), 3, 4)); }, "logits");
  throws_naming([&] { m.commit(std::vector<index_t>{0}); }, "path");  // nothing evaluated
  m.evaluate(two, batch_view<float>(rows.data(), 2, 4));
  throws_naming([&] { m.commit(std::vector<index_t>{1}); }, "path");  // not from the root
  throws_naming([&] { m.rollback(5); }, "n");
  throws_naming(
      [&] {
        ex::llama_model(gguf("toy-target"), ex::llama_model_options{2, 200});
      },
      "max_leaves");
}
