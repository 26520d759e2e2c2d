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
//
// One token per row (cuda/specula/cuda/sampling.cuh), V = 128256, B in {1, 32, 264, 1024}, the
// same parameters and logits, each against the same streaming copy baseline:
//   cuda_sample/logits/<f32|bf16>/V/B   sample_from_logits_async (fused: the transform's passes,
//                                       then one pass summing the tile sums and a one-tile walk;
//                                       no probability tensor); bytes = the logits read once
//   cuda_sample/unfused/bf16/V/B        logits_to_probs_async + sample_from_probs_async (the
//                                       fp32 tensor written and read back); bytes as the fused
//                                       case, so frac_of_copy compares the two directly
//   cuda_sample/probs/f32/V/B           sample_from_probs_async on fp32 rows; bytes = the rows
//                                       read once

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
#include "specula/cuda/sampling.cuh"
#include "specula/cuda/transforms.cuh"

using namespace specula;

namespace {

using specula::bench::device_buffer;

/// n logits N(0, 3^2) (fixed seed) as T (float or bf16, rounded to nearest).
template <class T>
std::vector<T> serving_logits(std::size_t n) {
  std::mt19937 gen(1234);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<T> logits(n);
  for (auto& x : logits) {
    if constexpr (std::is_same_v<T, float>)
      x = dist(gen);
    else
      x = __float2bfloat16_rn(dist(gen));
  }
  return logits;
}

/// Typical serving parameters: temperature 0.7, top-k 50, top-p 0.9, no min-p, no CFG.
sampling_params serving_params() {
  sampling_params sp;
  sp.temperature = 0.7f;
  sp.top_k = 50;
  sp.top_p = 0.9f;
  return sp;
}

/// What both kinds of case start from: without a device, the case is skipped (false);
/// otherwise `vocab * batch` serving logits and the serving parameters are on the device.
template <class T>
struct serving_inputs {
  std::size_t n;
  device_buffer d_logits, d_params;
  serving_inputs(index_t vocab, index_t batch)
      : n(static_cast<std::size_t>(vocab * batch)),
        d_logits(n * sizeof(T)),
        d_params(sizeof(sampling_params)) {
    specula::bench::upload(d_logits, serving_logits<T>(n));
    specula::bench::upload(d_params, std::vector<sampling_params>{serving_params()});
  }
  static bool device_or_skip(benchmark::State& state) {
    if (specula::cuda::device_count() != 0) return true;
    state.SkipWithError("no CUDA device");
    return false;
  }
};

template <class T>
void transforms_case(benchmark::State& state, index_t vocab, index_t batch) {
  if (!serving_inputs<T>::device_or_skip(state)) return;
  const serving_inputs<T> inputs(vocab, batch);
  const std::size_t n = inputs.n;
  const device_buffer &d_logits = inputs.d_logits, &d_params = inputs.d_params;
  device_buffer d_probs(n * sizeof(float)),
      d_status(static_cast<std::size_t>(batch) * sizeof(std::uint32_t));

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

/// How a sampling case draws: fused from logits, logits -> probs -> draw, or from probabilities.
enum class sample_kind { logits, unfused, probs };

template <class T>
void sample_case(benchmark::State& state, sample_kind kind, index_t vocab, index_t batch) {
  if (!serving_inputs<T>::device_or_skip(state)) return;
  const serving_inputs<T> inputs(vocab, batch);
  const std::size_t n = inputs.n;
  const device_buffer &d_logits = inputs.d_logits, &d_params = inputs.d_params;
  std::vector<request_rng> rng;
  for (index_t r = 0; r < batch; ++r) rng.push_back({7, static_cast<std::uint32_t>(r), 1});
  device_buffer d_probs(n * sizeof(float)),
      d_rng(static_cast<std::size_t>(batch) * sizeof(request_rng)),
      d_out(static_cast<std::size_t>(batch) * sizeof(token_t));
  specula::bench::upload(d_rng, rng);

  const auto pol = specula::cuda::par_on(nullptr);
  const batch_view<const T> in{d_logits.as<const T>(), batch, vocab};
  const row_view<const sampling_params> params{d_params.as<const sampling_params>(), 1};
  const batch_view<float> probs{d_probs.as<float>(), batch, vocab};
  const row_view<const request_rng> streams{d_rng.as<const request_rng>(), batch};
  const row_view<token_t> out{d_out.as<token_t>(), batch};
  if (kind == sample_kind::probs) {
    // Rows to sample from: the probabilities of the same logits.
    specula::cuda::throw_on_error(
        specula::cuda::logits_to_probs_async<T>(pol, in, {}, params, probs), "logits_to_probs");
    specula::cuda::throw_on_error(cudaDeviceSynchronize(), "logits_to_probs");
  }
  const auto launch = [&]() -> cudaError_t {
    switch (kind) {
      case sample_kind::logits:
        return specula::cuda::sample_from_logits_async<T>(pol, in, params, streams, out);
      case sample_kind::unfused:
        if (const cudaError_t e =
                specula::cuda::logits_to_probs_async<T>(pol, in, {}, params, probs);
            e != cudaSuccess)
          return e;
        return specula::cuda::sample_from_probs_async<float>(pol, probs, streams, out);
      case sample_kind::probs:
        break;
    }
    return specula::cuda::sample_from_probs_async<float>(pol, probs, streams, out);
  };
  if (!specula::bench::warm_up(state, launch)) return;
  const double row_bytes =
      static_cast<double>(kind == sample_kind::probs ? sizeof(float) : sizeof(T));
  specula::bench::time_against_copy(state, static_cast<double>(n) * row_bytes, launch);
}

int register_all() {
  for (index_t b : {1, 32, 264, 1024}) {
    const std::string suffix = "/V:128256/B:" + std::to_string(b);
    specula::bench::add_case("cuda_sample/logits/f32" + suffix, [=](benchmark::State& s) {
      sample_case<float>(s, sample_kind::logits, 128256, b);
    });
    specula::bench::add_case("cuda_sample/logits/bf16" + suffix, [=](benchmark::State& s) {
      sample_case<__nv_bfloat16>(s, sample_kind::logits, 128256, b);
    });
    specula::bench::add_case("cuda_sample/unfused/bf16" + suffix, [=](benchmark::State& s) {
      sample_case<__nv_bfloat16>(s, sample_kind::unfused, 128256, b);
    });
    specula::bench::add_case("cuda_sample/probs/f32" + suffix, [=](benchmark::State& s) {
      sample_case<float>(s, sample_kind::probs, 128256, b);
    });
  }
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
