// Device fused logits -> probabilities (cuda/specula/cuda/transforms.cuh) against a
// device-to-device copy moving the same number of bytes.
//
// Names: cuda_transforms/<f32|bf16>/V:<V>/B:<B>, V in {32000, 128256}, B in {1, 32, 264, 1024}
// (264: two rows per SM of a 132-SM H100, 1024: a full serving batch; one CTA per row, so the
// small batches leave most SMs idle); typical
// serving parameters (temperature 0.7, top_k 50, top_p 0.9, no min-p, no CFG), logits
// N(0, 3^2). Counters:
//   bytes         bytes the call must touch: the logits read once (B·V·sizeof(T)) plus the fp32
//                 probabilities written (4·B·V)
//   copy_GBps     cudaMemcpyAsync device to device of bytes/2 bytes (so that its reads plus
//                 writes are `bytes`), best of 20, timed with CUDA events in the same process;
//                 GB/s counted as bytes read + written
//   frac_of_copy  (bytes / kernel time) / copy_GBps, i.e. copy time / kernel time: 1.0 is the
//                 copy floor for the data the call must touch
//   copy_us       the copy's time
// Timing: CUDA events around each launch, reported with manual time. The kernel re-reads the
// row once per pass (3 + 8 (top-k) + 8 (top-p) = 19 passes here), mostly from L2, with one CTA
// per row, so B = 1 is latency bound. Without a GPU every case is skipped with "no CUDA device".

#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_bench_util.cuh"
#include "specula/cuda/error.cuh"
#include "specula/cuda/transforms.cuh"

using namespace specula;

namespace {

using specula::bench::device_buffer;

template <class T>
void transforms_case(benchmark::State& state, index_t vocab, index_t batch) {
  if (specula::cuda::device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const auto n = static_cast<std::size_t>(vocab * batch);
  std::mt19937 gen(1234);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<T> logits(n);
  for (auto& x : logits) {
    if constexpr (std::is_same_v<T, float>)
      x = dist(gen);
    else
      x = __float2bfloat16_rn(dist(gen));
  }
  sampling_params sp;
  sp.temperature = 0.7f;
  sp.top_k = 50;
  sp.top_p = 0.9f;

  device_buffer d_logits(n * sizeof(T)), d_probs(n * sizeof(float)),
      d_params(sizeof(sampling_params)),
      d_status(static_cast<std::size_t>(batch) * sizeof(std::uint32_t));
  specula::cuda::throw_on_error(
      cudaMemcpy(d_logits.ptr, logits.data(), n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  specula::cuda::throw_on_error(
      cudaMemcpy(d_params.ptr, &sp, sizeof(sampling_params), cudaMemcpyHostToDevice), "cudaMemcpy");

  const auto pol = specula::cuda::par_on(nullptr);
  const batch_view<const T> in{d_logits.as<const T>(), batch, vocab};
  const row_view<const sampling_params> params{d_params.as<const sampling_params>(), 1};
  const batch_view<float> out{d_probs.as<float>(), batch, vocab};
  const auto launch = [&] {
    return specula::cuda::logits_to_probs_async<T>(pol, in, {}, params, out,
                                                   d_status.as<std::uint32_t>());
  };
  if (!specula::bench::warm_up(state, launch)) return;

  // Bytes the call must touch, and a copy moving as many (bytes/2 read + bytes/2 written).
  const double bytes = static_cast<double>(n) * static_cast<double>(sizeof(T) + sizeof(float));
  specula::bench::time_against_copy(state, bytes, launch);
}

int register_all() {
  for (index_t v : {32000, 128256})
    for (index_t b : {1, 32, 264, 1024}) {
      const std::string suffix = "/V:" + std::to_string(v) + "/B:" + std::to_string(b);
      specula::bench::add_case("cuda_transforms/f32" + suffix,
                               [=](benchmark::State& s) { transforms_case<float>(s, v, b); });
      specula::bench::add_case("cuda_transforms/bf16" + suffix, [=](benchmark::State& s) {
        transforms_case<__nv_bfloat16>(s, v, b);
      });
    }
  return 0;
}

const int registered = register_all();

}  // namespace
