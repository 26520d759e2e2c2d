// The example transformer backend (examples/transformer): forward passes of a model shaped like
// the shipped text-target model (random weights, so the benchmark needs no model file),
// against the streaming-read baseline of the bytes a pass must touch: every fp32 weight once
// plus the K/V cache of the context.
//
// transformer/step/<kernel>/B:<B>/ctx:<C>
//   one new token per request (an autoregressive step) for B requests at context length C.
// transformer/tree64/<kernel>/B:<B>/ctx:<C>
//   a 64-node SJD-PAC-shaped token tree per request.
// Counter tokens_per_s: evaluated nodes per second.
// <kernel>: builtin (the blocked loops of kernels.hpp) or blas (cblas_sgemm, only in builds
// configured with -DSPECULA_EXAMPLE_BLAS=ON).

#include <benchmark/benchmark.h>

#if defined(SPECULA_BENCH_HAVE_TRANSFORMER)

#include <memory>
#include <random>
#include <string>
#include <vector>

#include <specula_example/sessions.hpp>

#include "specula/tree/builders.hpp"
#include "stream_baseline.hpp"

using namespace specula;
using namespace specula::example;

namespace {

transformer_config target_like_config() {
  transformer_config c;
  c.vocab_size = 256;
  c.d_model = 256;
  c.n_layers = 4;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.d_ff = 640;
  c.max_seq_len = 512;
  return c;
}

const transformer_weights& weights() {
  static const transformer_weights w = [] {
    const transformer_config c = target_like_config();
    std::mt19937_64 g(1);
    std::normal_distribution<float> d(0.0f, 0.05f);
    const auto vec = [&](index_t n) {
      std::vector<float> v(static_cast<std::size_t>(n));
      for (auto& x : v) x = d(g);
      return v;
    };
    transformer_weights tw;
    tw.config = c;
    tw.tok_embeddings = vec(c.vocab_size * c.d_model);
    for (index_t l = 0; l < c.n_layers; ++l)
      tw.layers.push_back({std::vector<float>(static_cast<std::size_t>(c.d_model), 1.0f),
                           vec(c.q_dim() * c.d_model), vec(c.kv_dim() * c.d_model),
                           vec(c.kv_dim() * c.d_model), vec(c.d_model * c.q_dim()),
                           std::vector<float>(static_cast<std::size_t>(c.d_model), 1.0f),
                           vec(c.d_ff * c.d_model), vec(c.d_ff * c.d_model),
                           vec(c.d_model * c.d_ff)});
    tw.norm.assign(static_cast<std::size_t>(c.d_model), 1.0f);
    tw.output = vec(c.vocab_size * c.d_model);
    return tw;
  }();
  return w;
}

void bm_forward(benchmark::State& state, matmul_kernel kernel, bool tree64) {
  const auto B = static_cast<index_t>(state.range(0));
  const auto ctx = static_cast<index_t>(state.range(1));
  const transformer m(weights(), kernel);
  const transformer_config& c = m.config();
  transformer_batch batch(m, B);
  std::mt19937_64 g(2);
  std::uniform_int_distribution<token_t> tok(0, 255);
  std::vector<token_tree> trees;
  for (index_t r = 0; r < B; ++r) {
    std::vector<token_t> prompt(static_cast<std::size_t>(ctx + 1));
    for (auto& t : prompt) t = tok(g);
    batch.prefill(r, prompt);
    token_tree t = tree64 ? trees::sjd_pac(3, 2, 64) : token_tree();
    for (index_t i = 0; i < t.size(); ++i) t.set_token(i, tok(g));
    trees.push_back(std::move(t));
  }
  index_t nodes = 0;
  for (const auto& t : trees) nodes += t.size();
  std::vector<float> logits(static_cast<std::size_t>(nodes * c.vocab_size));
  const double weight_bytes = 4.0 * static_cast<double>(m.weights().parameters());
  const double cache_bytes = 4.0 * 2.0 * static_cast<double>(B * ctx * c.n_layers * c.kv_dim());
  bench::run_against_stream(state, weight_bytes + cache_bytes, [&] {
    batch.evaluate(trees, batch_view<float>(logits.data(), nodes, c.vocab_size));
    benchmark::DoNotOptimize(logits.data());
  });
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(nodes) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.counters["nodes"] = static_cast<double>(nodes);
}

void register_all() {
  std::vector<std::pair<std::string, matmul_kernel>> kernels{{"builtin", matmul_kernel::builtin}};
  if (have_blas()) kernels.emplace_back("blas", matmul_kernel::blas);
  for (const auto& [name, kernel] : kernels) {
    const matmul_kernel k = kernel;
    benchmark::RegisterBenchmark(("transformer/step/" + name).c_str(),
                                 [k](benchmark::State& s) { bm_forward(s, k, false); })
        ->ArgNames({"B", "ctx"})
        ->Args({1, 128})
        ->Args({8, 128})
        ->Args({32, 128})
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("transformer/tree64/" + name).c_str(),
                                 [k](benchmark::State& s) { bm_forward(s, k, true); })
        ->ArgNames({"B", "ctx"})
        ->Args({1, 128})
        ->Args({8, 128})
        ->Unit(benchmark::kMicrosecond);
  }
  // Small shape for the bench.smoke ctest.
  benchmark::RegisterBenchmark(
      "transformer/smoke/step",
      [](benchmark::State& s) { bm_forward(s, matmul_kernel::builtin, false); })
      ->ArgNames({"B", "ctx"})
      ->Args({1, 8})
      ->Unit(benchmark::kMicrosecond);
}

const int registered = (register_all(), 0);

}  // namespace

#endif  // SPECULA_BENCH_HAVE_TRANSFORMER
