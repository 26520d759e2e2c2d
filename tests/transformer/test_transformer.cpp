// The example transformer backend: its evaluation shapes (trees, batches, commit/rollback,
// bidirectional sequences) against sequential evaluation and an independent naive reference.

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <specula_example/sessions.hpp>

#include "transformer_test_util.hpp"

using namespace specula;
using namespace specula::example;
using specula::example::testing::random_tokens;
using specula::example::testing::random_tree;
using specula::example::testing::random_weights;
using specula::example::testing::reference_logits;
using specula::example::testing::small_config;

namespace {

template <class T>
double max_abs_diff(const float* a, const T* b, index_t n) {
  double m = 0.0;
  for (index_t i = 0; i < n; ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

/// Logits of `path_tokens` evaluated one token at a time after all of `context` but its last
/// token (each step commits the token before evaluating the next), one row per path token; the
/// first path token is the last context token.
std::vector<float> stepwise_logits(const transformer& m, std::span<const token_t> context,
                                   std::span<const token_t> path_tokens) {
  transformer_session s(m);
  s.prefill(context);  // all of context but its last token; the path starts with that token
  const index_t V = m.vocab_size();
  std::vector<float> out;
  std::vector<float> row(static_cast<std::size_t>(V));
  for (const token_t t : path_tokens) {
    const token_tree one(std::vector<index_t>{-1}, std::vector<token_t>{t});
    s.evaluate(one, batch_view<float>(row.data(), 1, V));
    const index_t first = 0;
    s.commit(std::span<const index_t>(&first, 1));
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

}  // namespace

TEST_CASE("causal evaluation matches the naive double-precision reference", "[backend]") {
  for (const bool bf16_roundtrip : {false, true}) {
    transformer_weights w = random_weights(small_config(), 11);
    if (bf16_roundtrip) {  // through a file: what a shipped model goes through
      w = transformer_weights::load(
          safetensors_file::parse(serialize_safetensors(w.to_tensors(dtype::bf16),
                                                        {{"specula.config", w.config.to_json()}}),
                                  "memory"));
    }
    const transformer m(w);
    std::mt19937_64 g(5);
    const auto tokens = random_tokens(g, 40, m.vocab_size());
    std::vector<float> logits(tokens.size() * static_cast<std::size_t>(m.vocab_size()));
    m.evaluate_sequences(tokens, 40, batch_view<float>(logits.data(), 40, m.vocab_size()));
    const auto ref = reference_logits(m.weights(), tokens);
    CHECK(max_abs_diff(logits.data(), ref.data(), static_cast<index_t>(ref.size())) < 1e-4);
  }
}

TEST_CASE("bidirectional evaluation matches the naive reference", "[backend]") {
  const transformer m(random_weights(small_config(false), 12));
  REQUIRE(m.mask_token() == 22);
  std::mt19937_64 g(6);
  const index_t T = 24, S = 3;
  auto tokens = random_tokens(g, T * S, m.vocab_size());
  for (std::size_t i = 0; i < tokens.size(); i += 3) tokens[i] = m.mask_token();
  std::vector<float> logits(tokens.size() * static_cast<std::size_t>(m.vocab_size()));
  m.evaluate_sequences(tokens, T, batch_view<float>(logits.data(), T * S, m.vocab_size()));
  for (index_t s = 0; s < S; ++s) {
    const auto ref = reference_logits(
        m.weights(), std::span<const token_t>(tokens).subspan(static_cast<std::size_t>(s * T),
                                                              static_cast<std::size_t>(T)));
    CHECK(max_abs_diff(logits.data() + s * T * m.vocab_size(), ref.data(),
                       static_cast<index_t>(ref.size())) < 1e-4);
  }
  // Bidirectional: a later token changes an earlier position's logits.
  auto changed = tokens;
  changed[static_cast<std::size_t>(T - 1)] = (changed[static_cast<std::size_t>(T - 1)] + 1) % 20;
  std::vector<float> logits2(logits.size());
  m.evaluate_sequences(changed, T, batch_view<float>(logits2.data(), T * S, m.vocab_size()));
  CHECK(max_abs_diff(logits.data(), logits2.data(), m.vocab_size()) > 1e-6);
}

TEST_CASE("tree evaluation equals stepwise evaluation of every root-to-leaf path", "[backend]") {
  const transformer m(random_weights(small_config(), 13));
  const index_t V = m.vocab_size();
  std::mt19937_64 g(7);
  for (int trial = 0; trial < 4; ++trial) {
    const auto context = random_tokens(g, 5 + 3 * trial, V);
    const token_tree tree = random_tree(g, 12 + 10 * trial, 2 + trial, V, context.back());
    transformer_session s(m);
    s.prefill(context);
    std::vector<float> rows(static_cast<std::size_t>(tree.size() * V));
    s.evaluate(tree, batch_view<float>(rows.data(), tree.size(), V));
    double worst = 0.0;
    for (index_t leaf = 0; leaf < tree.size(); ++leaf) {
      if (tree.num_children(leaf) != 0) continue;
      const auto path = tree.path_to(leaf);
      std::vector<token_t> toks;
      for (const index_t n : path) toks.push_back(tree.token(n));
      const auto ref = stepwise_logits(m, context, toks);
      for (std::size_t k = 0; k < path.size(); ++k)
        worst = std::max(worst, max_abs_diff(ref.data() + static_cast<index_t>(k) * V,
                                             rows.data() + path[k] * V, V));
    }
    CHECK(worst < 1e-4);
  }
}

TEST_CASE("a batch of requests equals each request evaluated alone", "[backend]") {
  const transformer m(random_weights(small_config(), 14));
  const index_t V = m.vocab_size(), B = 3;
  std::mt19937_64 g(8);
  transformer_batch batch(m, B);
  std::vector<std::vector<token_t>> contexts;
  std::vector<token_tree> trees;
  index_t total = 0;
  for (index_t r = 0; r < B; ++r) {
    contexts.push_back(random_tokens(g, 3 + 4 * r, V));
    trees.push_back(random_tree(g, 5 + 6 * r, 3, V, contexts.back().back()));
    batch.prefill(r, contexts.back());
    total += trees.back().size();
  }
  std::vector<float> rows(static_cast<std::size_t>(total * V));
  batch.evaluate(trees, batch_view<float>(rows.data(), total, V));
  index_t offset = 0;
  for (index_t r = 0; r < B; ++r) {
    transformer_session s(m);
    s.prefill(contexts[static_cast<std::size_t>(r)]);
    const token_tree& t = trees[static_cast<std::size_t>(r)];
    std::vector<float> alone(static_cast<std::size_t>(t.size() * V));
    s.evaluate(t, batch_view<float>(alone.data(), t.size(), V));
    // The built-in kernels compute each row the same way whatever else is in the pass.
    const double tolerance = m.kernel() == matmul_kernel::builtin ? 0.0 : 1e-5;
    CHECK(max_abs_diff(alone.data(), rows.data() + offset * V, t.size() * V) <= tolerance);
    offset += t.size();
  }
  // Committing one request's path leaves the others alone.
  const auto path = trees[1].path_to(trees[1].size() - 1);
  const index_t before0 = batch.cache(0).size(), before1 = batch.cache(1).size();
  batch.commit(1, path);
  CHECK(batch.cache(1).size() == before1 + static_cast<index_t>(path.size()));
  CHECK(batch.cache(0).size() == before0);
}

TEST_CASE("a vocabulary limit sets the logits past it to -inf and leaves the others", "[backend]") {
  const auto w = random_weights(small_config(), 15);
  const transformer plain(w);
  transformer limited(w);
  const index_t V = plain.vocab_size(), limit = V - 3;
  CHECK(limited.vocab_limit() == V);
  limited.set_vocab_limit(limit);
  CHECK(limited.vocab_limit() == limit);
  std::mt19937_64 g(9);
  const auto context = random_tokens(g, 6, V);
  const token_tree t = random_tree(g, 7, 3, V, context.back());
  std::vector<float> a(static_cast<std::size_t>(t.size() * V)), b(a.size());
  transformer_session sa(plain), sb(limited);
  sa.prefill(context);
  sb.prefill(context);
  sa.evaluate(t, batch_view<float>(a.data(), t.size(), V));
  sb.evaluate(t, batch_view<float>(b.data(), t.size(), V));
  for (index_t i = 0; i < t.size(); ++i)
    for (index_t v = 0; v < V; ++v) {
      const auto k = static_cast<std::size_t>(i * V + v);
      if (v < limit)
        CHECK(b[k] == a[k]);
      else
        CHECK(b[k] == -std::numeric_limits<float>::infinity());
    }
  limited.set_vocab_limit(V);  // lifted
  CHECK(limited.vocab_limit() == V);
  CHECK_THROWS_WITH(limited.set_vocab_limit(0), Catch::Contains("limit"));
  CHECK_THROWS_WITH(limited.set_vocab_limit(V + 1), Catch::Contains("limit"));
}

TEST_CASE("rollback then re-evaluation equals a fresh evaluation", "[backend]") {
  const transformer m(random_weights(small_config(), 15));
  const index_t V = m.vocab_size();
  std::mt19937_64 g(9);
  const auto context = random_tokens(g, 9, V);
  const token_tree tree = random_tree(g, 20, 4, V, context.back());
  transformer_session s(m);
  s.prefill(context);
  std::vector<float> rows(static_cast<std::size_t>(tree.size() * V));
  s.evaluate(tree, batch_view<float>(rows.data(), tree.size(), V));
  const auto path = tree.path_to(tree.size() - 1);
  s.commit(path);
  REQUIRE(s.cache().size() == static_cast<index_t>(context.size() - 1 + path.size()));

  // Roll back to the first 6 committed tokens and continue with other tokens.
  s.cache().rollback(6);
  const auto cont = random_tokens(g, 7, V);
  const token_tree chain = trees::chain(cont);
  std::vector<float> after(static_cast<std::size_t>(chain.size() * V));
  s.evaluate(chain, batch_view<float>(after.data(), chain.size(), V));

  std::vector<token_t> fresh_prompt(context.begin(), context.begin() + 6);
  fresh_prompt.push_back(cont[0]);
  transformer_session fresh(m);
  fresh.prefill(fresh_prompt);
  std::vector<float> expect(after.size());
  fresh.evaluate(chain, batch_view<float>(expect.data(), chain.size(), V));
  CHECK(max_abs_diff(after.data(), expect.data(), chain.size() * V) == 0.0);

  // The full sequence through evaluate_sequences agrees too.
  std::vector<token_t> seq(fresh_prompt.begin(), fresh_prompt.end() - 1);
  seq.insert(seq.end(), cont.begin(), cont.end());
  std::vector<float> full(seq.size() * static_cast<std::size_t>(V));
  m.evaluate_sequences(seq, static_cast<index_t>(seq.size()),
                       batch_view<float>(full.data(), static_cast<index_t>(seq.size()), V));
  CHECK(max_abs_diff(after.data(), full.data() + 6 * V, chain.size() * V) < 1e-4);
}

TEST_CASE("an explicit attention mask evaluates a Jacobi-style window", "[backend]") {
  // A causal chain window given as an explicit mask equals the same chain as a tree.
  const transformer m(random_weights(small_config(), 16));
  const index_t V = m.vocab_size(), n = 70;  // more than 64 nodes: two mask words per row
  std::mt19937_64 g(10);
  const auto toks = random_tokens(g, n, V);
  kv_cache a, b;
  m.prefill(a, random_tokens(g, 3, V));
  b = a;
  std::vector<index_t> pos(static_cast<std::size_t>(n));
  std::vector<std::uint64_t> mask(static_cast<std::size_t>(n * 2), 0);
  for (index_t i = 0; i < n; ++i) {
    pos[static_cast<std::size_t>(i)] = a.size() + i;
    for (index_t j = 0; j <= i; ++j)
      mask[static_cast<std::size_t>(i * 2 + j / 64)] |= std::uint64_t{1} << (j % 64);
  }
  const node_block blk{&a, toks, pos, mask};
  std::vector<float> r1(static_cast<std::size_t>(n * V)), r2(r1.size());
  m.evaluate(std::span<const node_block>(&blk, 1), batch_view<float>(r1.data(), n, V));
  m.evaluate_tree(b, trees::chain(toks), batch_view<float>(r2.data(), n, V));
  CHECK(max_abs_diff(r1.data(), r2.data(), n * V) == 0.0);
  // Committing a prefix of the window is allowed; skipping a node is not.
  const std::vector<index_t> gap{0, 2};
  CHECK_THROWS_AS(a.commit(gap), invalid_input);
  const std::vector<index_t> prefix{0, 1, 2, 3};
  a.commit(prefix);
  CHECK(a.size() == 3 + 4);
}

TEST_CASE("bad evaluation input is rejected with the argument and index", "[backend]") {
  const transformer m(random_weights(small_config(), 17));
  const index_t V = m.vocab_size();
  transformer_session s(m);
  s.prefill(std::vector<token_t>{1, 2, 3});
  std::vector<float> rows(static_cast<std::size_t>(3 * V));
  const auto msg = [&](auto&& f) {
    try {
      f();
    } catch (const invalid_input& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // Token out of range (node 2).
  const token_tree bad_tok(std::vector<index_t>{-1, 0, 1}, std::vector<token_t>{1, 2, 99});
  CHECK_THAT(msg([&] { s.evaluate(bad_tok, batch_view<float>(rows.data(), 3, V)); }),
             Catch::Contains("blocks.tokens[row 0][column 2]") && Catch::Contains("out of range"));
  // Wrong logits shape.
  const token_tree ok(std::vector<index_t>{-1, 0, 1}, std::vector<token_t>{1, 2, 3});
  CHECK_THAT(msg([&] { s.evaluate(ok, batch_view<float>(rows.data(), 2, V)); }),
             Catch::Contains("logits"));
  // Positions beyond max_seq_len.
  kv_cache full;
  m.prefill(full, std::vector<token_t>(static_cast<std::size_t>(m.config().max_seq_len - 1), 1));
  CHECK_THAT(msg([&] { m.evaluate_tree(full, ok, batch_view<float>(rows.data(), 3, V)); }),
             Catch::Contains("blocks.positions[row 0][column 1]"));
  // A mask row without its own bit.
  kv_cache c;
  const std::vector<token_t> toks{1, 2};
  const std::vector<index_t> pos{0, 1};
  const std::vector<std::uint64_t> mask{1, 1};  // node 1 does not see itself
  const node_block blk{&c, toks, pos, mask};
  CHECK_THAT(msg([&] { m.evaluate(std::span<const node_block>(&blk, 1), {}); }),
             Catch::Contains("blocks.mask[row 0][column 1]"));
  // Commit paths: out of range, not starting at the next position, not a chain.
  s.evaluate(ok, batch_view<float>(rows.data(), 3, V));
  CHECK_THAT(msg([&] { s.commit(std::vector<index_t>{0, 5}); }), Catch::Contains("path[row 1]"));
  CHECK_THAT(msg([&] { s.commit(std::vector<index_t>{1}); }), Catch::Contains("path[row 0]"));
  CHECK_THAT(msg([&] { s.cache().rollback(7); }), Catch::Contains("n: invalid parameter"));
  CHECK_THAT(msg([&] { s.prefill({}); }), Catch::Contains("prompt"));
  transformer_batch b(m, 2);
  CHECK_THAT(msg([&] { b.commit(2, std::vector<index_t>{0}); }), Catch::Contains("request"));
}
