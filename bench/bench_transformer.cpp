// The example transformer backend (examples/transformer): forward passes against the
// streaming-read baseline of the bytes a pass must touch (every fp32 weight once plus the K/V
// cache of the context).
//
// transformer/step/<kernel>/threads:<t>/B:<B>/ctx:<C>
//   one new token per request (an autoregressive step) for B requests at context length C, on a
//   model shaped like text-target with random weights.
// transformer/tree64/<kernel>/threads:<t>/B:<B>/ctx:<C>
//   a 64-node SJD-PAC-shaped token tree per request, same model.
// transformer/cost/<model>/threads:<t>/n:<n>
//   the cost curve of a shipped model: a pass of n nodes (a causal chain below the context; a
//   whole sequence of n tokens for the bidirectional text-diffusion), timed alternately with a
//   one-node pass in the same loop. Counters: ratio = c(n)/c(1) (mean times), ratio_min (the
//   fastest iteration of each: the cost without other jobs on a shared machine), c1_us,
//   cn_min_us, c1_min_us, and the roofline of the
//   pass: t_mem_us (fp32 weight bytes over the stream rate measured in-process), t_flops_us
//   (the pass's multiply-add flops over the measured peak of the kernel at this thread count,
//   peak_GFLOPs) and roof_ratio = max(t_mem, t_flops(n)) / max(t_mem, t_flops(1)), the ratio a
//   kernel at the roofline would reach. The fastest single stream pass over the same bytes
//   (stream_fastest_GBps) and kernel call (peak_fastest_GFLOPs) are the counterparts of the
//   fastest iterations; from them: model_ratio = (t_mem + (n - 1) t_flops(1)) / t_mem, the
//   streaming model c(n) = c(1) (1 + (n - 1) BW / (2 F)) (each node after the first adds its
//   arithmetic to a pass that streams the weights once), and c1_frac_of_stream = the one-node
//   pass's bytes per second (fastest iteration) over the fastest stream rate. text-target-xl (70
//   MiB of fp32 weights, more than the L3 of the machines measured) is the case where the stream
//   comes from DRAM; its curve and text-target's have denser n (1..8, 12, 16, 24, 32, 48, 64).
// Counter tokens_per_s: evaluated nodes per second.
// <kernel>: builtin (the packed kernels of gemm.hpp) or blas (cblas_sgemm, only in builds
// configured with -DSPECULA_EXAMPLE_BLAS=ON). <t>: threads per pass (backend_options::threads).

#include <benchmark/benchmark.h>

#if defined(SPECULA_BENCH_HAVE_TRANSFORMER)

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
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

transformer make_model(transformer_weights w, matmul_kernel kernel, int threads) {
  backend_options o;
  o.kernel = kernel;
  o.threads = threads;
  return transformer(std::move(w), o);
}

void bm_forward(benchmark::State& state, matmul_kernel kernel, int threads, bool tree64) {
  const auto B = static_cast<index_t>(state.range(0));
  const auto ctx = static_cast<index_t>(state.range(1));
  const transformer m = make_model(weights(), kernel, threads);
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

// --- The cost curve of the shipped models --------------------------------------------------

const transformer_weights& shipped(const std::string& name) {
  static std::map<std::string, transformer_weights> loaded;
  auto it = loaded.find(name);
  if (it == loaded.end())
    it = loaded
             .emplace(name, transformer_weights::load(std::filesystem::path(SPECULA_MODELS_DIR) /
                                                      (name + ".safetensors")))
             .first;
  return it->second;
}

/// Multiply-add flops (2 per term) of the linear layers and attention of an n-node pass with
/// `ctx` context positions.
double pass_flops(const transformer_config& c, index_t n, index_t ctx) {
  const double d = static_cast<double>(c.d_model),
               qkv = static_cast<double>(c.q_dim() + 2 * c.kv_dim());
  const double per_node_linear =
      static_cast<double>(c.n_layers) *
          (d * qkv + static_cast<double>(c.q_dim()) * d + 3.0 * d * static_cast<double>(c.d_ff)) +
      d * static_cast<double>(c.vocab_size);
  const double keys = static_cast<double>(ctx + n);
  const double attention = static_cast<double>(c.n_layers * c.n_heads * c.head_dim()) * 2.0 * keys;
  return 2.0 * static_cast<double>(n) * (per_node_linear + attention);
}

/// Flops per second of the built-in kernel on a compute-bound product (m = 96 rows against a
/// 256 x 256 packed matrix that stays in cache), best of five runs of 20 ms, on `threads`
/// threads.
double kernel_peak(const transformer& m, int threads, bool fastest_call = false) {
  const index_t rows = 96, dim = 256;
  std::mt19937_64 g(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> w(static_cast<std::size_t>(dim * dim)),
      x(static_cast<std::size_t>(rows * dim)), y(x.size());
  for (auto& v : w) v = d(g);
  for (auto& v : x) v = d(g);
  const example::detail::linear_weights lw(matmul_kernel::builtin, dim, {w});
  const example::detail::kernel_context kc{matmul_kernel::builtin, m.options().isa, threads};
  const auto call = [&] {
    example::detail::linear(kc, x.data(), rows, dim, lw, y.data());
    benchmark::DoNotOptimize(y.data());
  };
  const double flops = 2.0 * rows * dim * dim;
  return fastest_call ? bench::fastest_rate(flops, 400, call) : bench::best_rate(flops, call);
}

void bm_cost(benchmark::State& state, const std::string& name, int threads) {
  const auto n = static_cast<index_t>(state.range(0));
  const transformer m = make_model(shipped(name), matmul_kernel::builtin, threads);
  const transformer_config& c = m.config();
  const bool causal = c.causal;
  const index_t ctx = causal ? std::min<index_t>(128, c.max_seq_len - 65) : 0;
  std::mt19937_64 g(4);
  std::uniform_int_distribution<token_t> tok(0, static_cast<token_t>(c.vocab_size - 1));
  std::vector<token_t> prompt(static_cast<std::size_t>(ctx + 1)),
      block(static_cast<std::size_t>(n));
  for (auto& t : prompt) t = tok(g);
  for (auto& t : block) t = tok(g);
  kv_cache cache;
  if (ctx > 0)
    m.prefill(cache, std::span<const token_t>(prompt).first(static_cast<std::size_t>(ctx)));
  const token_tree chain = trees::chain(block), one = trees::chain(std::span(block).first(1));
  std::vector<float> logits(static_cast<std::size_t>(n * c.vocab_size));
  const auto pass = [&](index_t nodes) {
    const batch_view<float> out(logits.data(), nodes, c.vocab_size);
    if (causal)
      m.evaluate_tree(cache, nodes == 1 ? one : chain, out);
    else
      m.evaluate_sequences(std::span<const token_t>(block).first(static_cast<std::size_t>(nodes)),
                           nodes, out);
    benchmark::DoNotOptimize(logits.data());
  };
  pass(n);
  pass(1);
  const double weight_bytes = 4.0 * static_cast<double>(m.weights().parameters());
  const double bytes =
      weight_bytes + 4.0 * 2.0 * static_cast<double>(ctx * c.n_layers * c.kv_dim());
  const double stream = bench::stream_bytes_per_second(static_cast<std::size_t>(bytes));
  const double peak = kernel_peak(m, threads);
  // The fastest single stream pass and kernel call: the counterparts of the fastest iterations
  // (cn_min_us, c1_min_us) when other jobs share the machine.
  const double stream_fast =
      bench::stream_fastest_bytes_per_second(static_cast<std::size_t>(bytes));
  const double peak_fast = kernel_peak(m, threads, true);
  double sum_n = 0.0, sum_1 = 0.0, min_n = 1e30, min_1 = 1e30;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    pass(n);
    const auto t1 = std::chrono::steady_clock::now();
    pass(1);
    const auto t2 = std::chrono::steady_clock::now();
    const double cn = std::chrono::duration<double>(t1 - t0).count();
    state.SetIterationTime(cn);
    const double c1 = std::chrono::duration<double>(t2 - t1).count();
    sum_n += cn;
    sum_1 += c1;
    min_n = std::min(min_n, cn);
    min_1 = std::min(min_1, c1);
  }
  const auto iters = static_cast<double>(state.iterations());
  const double t_mem = weight_bytes / stream, t_flops_n = pass_flops(c, n, ctx) / peak,
               t_flops_1 = pass_flops(c, 1, ctx) / peak;
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes * iters));
  state.counters["bytes"] = bytes;
  state.counters["stream_GBps"] = stream / 1e9;
  state.counters["frac_of_stream"] = sum_n > 0 ? bytes * iters / sum_n / stream : 0.0;
  state.counters["ratio"] = sum_1 > 0 ? sum_n / sum_1 : 0.0;
  state.counters["c1_us"] = 1e6 * sum_1 / iters;
  // The fastest iteration of each: on a machine shared with other jobs, the cost without them.
  state.counters["ratio_min"] = min_n / min_1;
  state.counters["cn_min_us"] = 1e6 * min_n;
  state.counters["c1_min_us"] = 1e6 * min_1;
  state.counters["t_mem_us"] = 1e6 * t_mem;
  state.counters["t_flops_us"] = 1e6 * t_flops_n;
  state.counters["peak_GFLOPs"] = peak / 1e9;
  state.counters["roof_ratio"] = std::max(t_mem, t_flops_n) / std::max(t_mem, t_flops_1);
  const double t_mem_fast = weight_bytes / stream_fast,
               t_flops_1_fast = pass_flops(c, 1, ctx) / peak_fast;
  state.counters["stream_fastest_GBps"] = stream_fast / 1e9;
  state.counters["peak_fastest_GFLOPs"] = peak_fast / 1e9;
  state.counters["model_ratio"] =
      (t_mem_fast + static_cast<double>(n - 1) * t_flops_1_fast) / t_mem_fast;
  state.counters["c1_frac_of_stream"] = bytes / min_1 / stream_fast;
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(n) * iters, benchmark::Counter::kIsRate);
}

void register_all() {
  std::vector<std::pair<std::string, matmul_kernel>> kernels{{"builtin", matmul_kernel::builtin}};
  if (have_blas()) kernels.emplace_back("blas", matmul_kernel::blas);
  const int threads = hardware_threads();
  std::vector<int> thread_counts{1};
  if (threads > 1) thread_counts.push_back(threads);
  for (const auto& [name, kernel] : kernels)
    for (const int t : thread_counts) {
      if (kernel == matmul_kernel::blas && t > 1) continue;  // OpenBLAS has its own threads
      const matmul_kernel k = kernel;
      const std::string suffix = name + "/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(("transformer/step/" + suffix).c_str(),
                                   [k, t](benchmark::State& s) { bm_forward(s, k, t, false); })
          ->ArgNames({"B", "ctx"})
          ->Args({1, 128})
          ->Args({8, 128})
          ->Args({32, 128})
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("transformer/tree64/" + suffix).c_str(),
                                   [k, t](benchmark::State& s) { bm_forward(s, k, t, true); })
          ->ArgNames({"B", "ctx"})
          ->Args({1, 128})
          ->Args({8, 128})
          ->Unit(benchmark::kMicrosecond);
    }
  for (const char* model :
       {"text-target", "text-draft", "image-ar", "text-diffusion", "text-target-xl"})
    for (const int t : thread_counts) {
      const std::string name = model;
      // A checkout may lack a model (a file not yet trained): its cases are left out.
      if (!std::filesystem::exists(std::filesystem::path(SPECULA_MODELS_DIR) /
                                   (name + ".safetensors")))
        continue;
      auto* b = benchmark::RegisterBenchmark(
          ("transformer/cost/" + name + "/threads:" + std::to_string(t)).c_str(),
          [name, t](benchmark::State& s) { bm_cost(s, name, t); });
      b->ArgName("n")->UseManualTime()->Unit(benchmark::kMicrosecond);
      if (name == "text-target" || name == "text-target-xl") {
        for (const int n : {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64}) b->Arg(n);
      } else {
        b->RangeMultiplier(2)->Range(1, 64);
      }
    }
  // Small shape for the bench.smoke ctest.
  benchmark::RegisterBenchmark(
      "transformer/smoke/step",
      [](benchmark::State& s) { bm_forward(s, matmul_kernel::builtin, 1, false); })
      ->ArgNames({"B", "ctx"})
      ->Args({1, 8})
      ->Unit(benchmark::kMicrosecond);
}

const int registered = (register_all(), 0);

}  // namespace

#endif  // SPECULA_BENCH_HAVE_TRANSFORMER
