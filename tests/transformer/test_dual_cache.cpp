// The example backend's dual (prefix and suffix) cache for bidirectional models: refreshes give
// the whole-sequence rows, window passes equal an independent naive reference with the prefix and
// suffix keys/values frozen at the refresh, batches equal requests alone, and bad input.

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include <specula/decode/concepts.hpp>
#include <specula_example/transformer.hpp>

#include "transformer_test_util.hpp"

using namespace specula;
using namespace specula::example;
using specula::example::testing::random_tokens;
using specula::example::testing::random_weights;
using specula::example::testing::reference_kv;
using specula::example::testing::reference_logits;
using specula::example::testing::small_config;

static_assert(dual_cache_model<transformer>);

namespace {

using pass_t = dual_cache_pass<dual_kv_cache>;

/// Evaluates `passes` in one call; the rows.
std::vector<float> evaluate(const transformer& m, std::span<const pass_t> passes) {
  index_t rows = 0;
  for (const auto& p : passes) rows += p.rows();
  std::vector<float> out(static_cast<std::size_t>(rows * m.vocab_size()));
  m.evaluate_cached(passes, batch_view<float>(out.data(), rows, m.vocab_size()));
  return out;
}
std::vector<float> evaluate(const transformer& m, const pass_t& pass) {
  return evaluate(m, std::span<const pass_t>(&pass, 1));
}

std::vector<float> whole(const transformer& m, std::span<const token_t> seq) {
  const auto L = static_cast<index_t>(seq.size());
  std::vector<float> out(static_cast<std::size_t>(L * m.vocab_size()));
  m.evaluate_sequences(seq, L, batch_view<float>(out.data(), L, m.vocab_size()));
  return out;
}

template <class A, class B>
double max_abs_diff(const A* a, const B* b, std::size_t n) {
  double worst = 0.0;
  for (std::size_t i = 0; i < n; ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return worst;
}

}  // namespace

TEST_CASE("a dual-cache refresh gives the whole-sequence rows, and an unchanged window the same",
          "[backend]") {
  const transformer m(random_weights(small_config(false), 21));
  const index_t V = m.vocab_size(), L = 40;
  std::mt19937_64 g(3);
  const auto seq = random_tokens(g, L, V);
  dual_kv_cache cache;
  const auto full = whole(m, seq);
  // The refresh's rows are evaluate_sequences' rows, bit for bit (the same computation).
  const auto refreshed = evaluate(m, pass_t{&cache, seq, L, 16, 24, true});
  REQUIRE(refreshed.size() == full.size());
  CHECK(refreshed == full);
  CHECK(!cache.empty());
  CHECK(cache.window_begin() == 16);
  CHECK(cache.window_end() == 24);
  // The window evaluated against the cache of its own sequence: the same rows (exact cache).
  const auto window = evaluate(m, pass_t{&cache, seq, L, 16, 24, false});
  REQUIRE(window.size() == static_cast<std::size_t>(8 * V));
  CHECK(max_abs_diff(window.data(), full.data() + 16 * V, window.size()) < 1e-4);
}

TEST_CASE("dual-cache window rows match the naive reference with a frozen prefix and suffix",
          "[backend]") {
  for (const bool bf16_roundtrip : {false, true}) {
    transformer_weights w = random_weights(small_config(false), 22);
    if (bf16_roundtrip)  // through a file: what a shipped model goes through
      w = transformer_weights::load(
          safetensors_file::parse(serialize_safetensors(w.to_tensors(dtype::bf16),
                                                        {{"specula.config", w.config.to_json()}}),
                                  "memory"));
    const transformer m(w);
    const index_t V = m.vocab_size(), L = 33, b = 8, e = 16;
    std::mt19937_64 g(4);
    const auto before = random_tokens(g, L, V);
    auto after = before;  // the window changes, the rest stays
    const auto fresh = random_tokens(g, e - b, V);
    std::copy(fresh.begin(), fresh.end(), after.begin() + b);

    dual_kv_cache cache;
    (void)evaluate(m, pass_t{&cache, before, L, b, e, true});
    const auto rows = evaluate(m, pass_t{&cache, after, L, b, e, false});

    reference_kv kv;
    (void)reference_logits(w, before, &kv);
    const auto ref = reference_logits(w, after, nullptr, &kv, b, e);
    INFO("bf16 round trip " << bf16_roundtrip);
    CHECK(max_abs_diff(rows.data(), ref.data() + b * V, rows.size()) < 1e-4);
    // The cache is an approximation: the uncached rows of `after` differ.
    const auto uncached = reference_logits(w, after);
    CHECK(max_abs_diff(uncached.data() + b * V, ref.data() + b * V, rows.size()) > 1e-3);
  }
}

TEST_CASE("a refresh with window nodes equals the refresh, then the window pass", "[backend]") {
  const transformer m(random_weights(small_config(false), 23));
  const index_t V = m.vocab_size(), L = 30, b = 20, e = 30;
  std::mt19937_64 g(5);
  const auto root = random_tokens(g, L, V);
  std::vector<token_t> nodes(root);
  for (int k = 0; k < 3; ++k) {  // three more nodes differing from the root in the window
    auto node = root;
    node[static_cast<std::size_t>(b + k)] = static_cast<token_t>((root[b + k] + 1 + k) % V);
    nodes.insert(nodes.end(), node.begin(), node.end());
  }
  dual_kv_cache together, apart;
  const auto one_call = evaluate(m, pass_t{&together, nodes, L, b, e, true});
  auto two_calls = evaluate(m, pass_t{&apart, std::span(nodes).first(L), L, b, e, true});
  const auto rest = evaluate(m, pass_t{&apart, std::span(nodes).subspan(L), L, b, e, false});
  two_calls.insert(two_calls.end(), rest.begin(), rest.end());
  CHECK(one_call == two_calls);
  // A later window pass sees the root's cache in both.
  CHECK(evaluate(m, pass_t{&together, root, L, b, e, false}) ==
        evaluate(m, pass_t{&apart, root, L, b, e, false}));
}

TEST_CASE("a batch of dual-cache passes equals each pass alone", "[backend]") {
  const transformer m(random_weights(small_config(false), 24));
  const index_t V = m.vocab_size();
  std::mt19937_64 g(6);
  struct request {
    index_t length, begin, end;
    std::vector<token_t> seq;
    dual_kv_cache batched, alone;
  };
  std::vector<request> rq(3);
  const index_t shapes[3][3] = {{24, 8, 16}, {40, 32, 40}, {17, 0, 5}};
  for (std::size_t r = 0; r < 3; ++r) {
    rq[r].length = shapes[r][0];
    rq[r].begin = shapes[r][1];
    rq[r].end = shapes[r][2];
    rq[r].seq = random_tokens(g, rq[r].length, V);
  }
  // Round 1 refreshes every request; round 2 refreshes only request 1 and evaluates two nodes
  // of the others against their caches.
  for (const int round : {1, 2}) {
    std::vector<pass_t> batched, alone;
    std::vector<std::vector<token_t>> tokens(3);
    for (std::size_t r = 0; r < 3; ++r) {
      const bool refresh = round == 1 || r == 1;
      tokens[r] = rq[r].seq;
      if (!refresh) {
        auto node = rq[r].seq;
        node[static_cast<std::size_t>(rq[r].begin)] = static_cast<token_t>(r);
        tokens[r].insert(tokens[r].end(), node.begin(), node.end());
      }
      batched.push_back({&rq[r].batched, tokens[r], rq[r].length, rq[r].begin, rq[r].end, refresh});
      alone.push_back({&rq[r].alone, tokens[r], rq[r].length, rq[r].begin, rq[r].end, refresh});
    }
    const auto rows = evaluate(m, batched);
    std::size_t at = 0;
    for (std::size_t r = 0; r < 3; ++r) {
      const auto one = evaluate(m, alone[r]);
      INFO("round " << round << " request " << r);
      REQUIRE(at + one.size() <= rows.size());
      CHECK(max_abs_diff(one.data(), rows.data() + at, one.size()) < 1e-5);
      at += one.size();
    }
    CHECK(at == rows.size());
    (void)V;
  }
}

TEST_CASE("bad dual-cache input is rejected with the argument", "[backend][bad_input]") {
  const transformer m(random_weights(small_config(false), 25));
  const index_t V = m.vocab_size(), L = 12;
  std::mt19937_64 g(7);
  const auto seq = random_tokens(g, L, V);
  std::vector<float> out(static_cast<std::size_t>(2 * L * V));
  const auto check = [&](const pass_t& p, const char* argument) {
    CHECK_THROWS_WITH(
        m.evaluate_cached(std::span<const pass_t>(&p, 1),
                          batch_view<float>(out.data(), std::max<index_t>(p.rows(), 1), V)),
        Catch::Contains(argument));
  };
  dual_kv_cache cache;
  check({nullptr, seq, L, 0, 4, true}, "passes.cache");
  check({&cache, seq, L, 0, 4, false}, "passes.cache");  // no refresh yet
  check({&cache, seq, 0, 0, 4, true}, "passes.length");
  check({&cache, seq, L + 200, 0, 4, true}, "passes.length");
  check({&cache, std::span(seq).first(L - 1), L, 0, 4, true}, "passes.tokens");
  check({&cache, seq, L, 4, 4, true}, "passes.window");
  check({&cache, seq, L, 5, 13, true}, "passes.window");
  auto bad = seq;
  bad[3] = static_cast<token_t>(V);
  check({&cache, bad, L, 0, 4, true}, "passes.tokens");
  // A node changed outside the window of its refresh.
  auto two = seq;
  two.insert(two.end(), seq.begin(), seq.end());
  two[static_cast<std::size_t>(L + 9)] = static_cast<token_t>((seq[9] + 1) % V);
  check({&cache, two, L, 0, 4, true}, "passes.tokens");
  // After a refresh: another window, another length, a changed prefix or suffix.
  const pass_t ok{&cache, seq, L, 0, 4, true};
  m.evaluate_cached(std::span<const pass_t>(&ok, 1), batch_view<float>(out.data(), L, V));
  check({&cache, seq, L, 4, 8, false}, "passes.cache");
  check({&cache, std::span(seq).first(L - 2), L - 2, 0, 4, false}, "passes.cache");
  auto moved = seq;
  moved[L - 1] = static_cast<token_t>((seq[L - 1] + 1) % V);
  check({&cache, moved, L, 0, 4, false}, "passes.tokens");
  // The same cache twice; a logits view of the wrong shape.
  const pass_t twice[2] = {ok, ok};
  CHECK_THROWS_WITH(m.evaluate_cached(twice, batch_view<float>(out.data(), 2 * L, V)),
                    Catch::Contains("passes.cache"));
  CHECK_THROWS_WITH(
      m.evaluate_cached(std::span<const pass_t>(&ok, 1), batch_view<float>(out.data(), L - 1, V)),
      Catch::Contains("logits"));
  // A causal model has no dual cache.
  const transformer causal(random_weights(small_config(true), 26));
  CHECK_THROWS_WITH(
      causal.evaluate_cached(std::span<const pass_t>(&ok, 1), batch_view<float>(out.data(), L, V)),
      Catch::Contains("passes"));
}
