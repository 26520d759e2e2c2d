// The example transformer on the GPU (device_transformer.hpp): the cost of one pass against the
// number of query nodes, and a device-to-device copy of the model's fp32 weights as the
// bandwidth baseline, in the same process.
//
//   device_transformer/pass/<model>/ctx:<C>/n:<N>/graphs:<G>: one token tree of N nodes (random
//     parents) below C committed tokens, evaluate_device + stream synchronisation, the pass's
//     launches direct (G = 0) or replayed from a CUDA graph (G = 1; set_graphs); the issue's
//     target is n:64 <= 1.3 x n:1 on one H100.
//   device_transformer/weights_copy/<model>: cudaMemcpyAsync of the weight bytes (D2D) +
//     synchronisation.
//
// Without a CUDA device every benchmark reports "no CUDA device" and is skipped.

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <specula/tree/token_tree.hpp>
#include <specula_example/device_transformer.hpp>

namespace ex = specula::example;
using specula::index_t;
using specula::token_t;

namespace {

/// The shipped models: $SPECULA_MODELS_DIR when set (a device run from another checkout's
/// path), else the build's source tree.
const std::filesystem::path models_dir = [] {
  const char* env = std::getenv("SPECULA_MODELS_DIR");
  return std::filesystem::path(env != nullptr && *env != '\0' ? env : SPECULA_MODELS_DIR);
}();

void bm_pass(benchmark::State& state, const std::string& name) {
  if (!ex::cuda_device_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const auto w = ex::transformer_weights::load(models_dir / (name + ".safetensors"));
  ex::device_transformer model(w);
  model.set_graphs(state.range(2) != 0);
  const index_t ctx = state.range(0), n = state.range(1), V = w.config.vocab_size;
  std::mt19937_64 g(1);
  std::vector<token_t> prompt(static_cast<std::size_t>(ctx));
  for (auto& t : prompt) t = static_cast<token_t>(g() % static_cast<std::uint64_t>(V));
  ex::device_kv_cache cache;
  model.prefill(cache, prompt);
  std::vector<index_t> parents{-1};
  std::vector<token_t> tokens{0};
  for (index_t i = 1; i < n; ++i) {
    parents.push_back(static_cast<index_t>(g() % static_cast<std::uint64_t>(i)));
    tokens.push_back(static_cast<token_t>(g() % static_cast<std::uint64_t>(V)));
  }
  specula::tree_limits limits;
  limits.max_nodes = n;
  limits.max_depth = n;
  limits.max_children = n;
  const specula::token_tree tree(parents, tokens, limits);
  for (auto _ : state) {
    benchmark::DoNotOptimize(model.evaluate_tree_device(cache, tree));
    model.synchronize();
    cache.drop_pending();
  }
  state.counters["nodes"] = static_cast<double>(n);
}

void bm_weights_copy(benchmark::State& state, const std::string& name) {
  if (!ex::cuda_device_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const auto w = ex::transformer_weights::load(models_dir / (name + ".safetensors"));
  const auto bytes = static_cast<std::size_t>(w.parameters()) * sizeof(float);
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    state.SkipWithError("cudaMalloc failed");
    return;
  }
  for (auto _ : state) {
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, nullptr);
    cudaStreamSynchronize(nullptr);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(bytes));
  cudaFree(a);
  cudaFree(b);
}

const bool registered = [] {
  for (const std::string name : {"text-target", "image-ar-256"}) {
    benchmark::RegisterBenchmark(("device_transformer/pass/" + name).c_str(), bm_pass, name)
        ->ArgNames({"ctx", "n", "graphs"})
        ->ArgsProduct({{128}, {1, 8, 16, 32, 64}, {0, 1}})
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("device_transformer/weights_copy/" + name).c_str(),
                                 bm_weights_copy, name)
        ->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

}  // namespace
