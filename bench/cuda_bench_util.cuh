#pragma once
// Helpers shared by the device benchmarks: an owning device buffer and CUDA-event timing.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "specula/core/rng.hpp"
#include "specula/core/types.hpp"
#include "specula/cuda/error.cuh"

namespace specula::bench {

/// An owning device allocation of `bytes` bytes.
struct device_buffer {
  void* ptr = nullptr;
  explicit device_buffer(std::size_t bytes) {
    specula::cuda::throw_on_error(cudaMalloc(&ptr, bytes == 0 ? 1 : bytes), "cudaMalloc");
  }
  ~device_buffer() { cudaFree(ptr); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

/// Copies a host vector into a device buffer (sized for it).
template <class T>
void upload(const device_buffer& d, const std::vector<T>& v) {
  specula::cuda::throw_on_error(
      cudaMemcpy(d.ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
}

/// A skewed probability row of length `vocab`: entries u^3 (u the Philox uniforms of stream
/// `seed`), normalised.
inline std::vector<float> skewed_row(index_t vocab, std::uint64_t seed) {
  std::vector<float> row(static_cast<std::size_t>(vocab));
  double sum = 0;
  for (index_t y = 0; y < vocab; ++y) {
    const double u = uniform_at(request_rng{seed, 0, 0}, draw_id{static_cast<std::uint32_t>(y), 0});
    row[static_cast<std::size_t>(y)] = static_cast<float>(u * u * u);
    sum += u * u * u;
  }
  for (float& x : row) x = static_cast<float>(x / sum);
  return row;
}

/// Milliseconds of `launch` (which returns the cudaError_t of what it enqueued) on the legacy
/// default stream, measured with CUDA events. `status` receives the first failure: the launch's
/// own status, or an error of the kernels it ran (seen when the stop event completes), so a
/// refused or failed launch is never timed as a fast result.
template <class Launch>
float time_ms(Launch&& launch, cudaError_t& status) {
  static_assert(std::is_same_v<decltype(launch()), cudaError_t>,
                "a timed launch returns the cudaError_t of what it enqueued");
  cudaEvent_t a, b;
  specula::cuda::throw_on_error(cudaEventCreate(&a), "cudaEventCreate");
  specula::cuda::throw_on_error(cudaEventCreate(&b), "cudaEventCreate");
  cudaEventRecord(a, nullptr);
  status = launch();
  cudaEventRecord(b, nullptr);
  if (const cudaError_t e = cudaEventSynchronize(b); status == cudaSuccess) status = e;
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms;
}

/// Times `launch` in the benchmark loop (CUDA events, manual time) and reports it against a
/// device-to-device copy timed in the same process (best of 20). `bytes` is what one launch
/// must touch; the copy moves `copy_bytes` bytes and each copied byte counts `copy_traffic`
/// times towards the copy's rate (1: count its reads; 2: count reads and writes). Counters:
/// bytes, copy_GBps, copy_us, frac_of_copy (launch rate over copy rate). `launch` returns the
/// cudaError_t of what it enqueued; a failure stops the case with SkipWithError (the error's
/// name), so that it reports no time.
template <class State, class Launch>
void time_against_copy(State& state, double bytes, std::size_t copy_bytes, double copy_traffic,
                       Launch&& launch) {
  device_buffer src(copy_bytes), dst(copy_bytes);
  auto copy = [&] {
    return cudaMemcpyAsync(dst.ptr, src.ptr, copy_bytes, cudaMemcpyDeviceToDevice, nullptr);
  };
  cudaError_t status = copy();
  float best_copy = 1e30f;
  for (int r = 0; r < 20 && status == cudaSuccess; ++r) {
    const float ms = time_ms(copy, status);
    best_copy = ms < best_copy ? ms : best_copy;
  }
  if (status != cudaSuccess) {
    state.SkipWithError((std::string("copy baseline: ") + cudaGetErrorName(status)).c_str());
    return;
  }
  double total_ms = 0;
  for (auto _ : state) {
    const float ms = time_ms(launch, status);
    if (status != cudaSuccess) {
      state.SkipWithError((std::string("launch failed: ") + cudaGetErrorName(status)).c_str());
      return;
    }
    total_ms += ms;
    state.SetIterationTime(ms / 1e3);
  }
  const double per_call_ms = total_ms / static_cast<double>(state.iterations());
  const double copy_gbps =
      copy_traffic * static_cast<double>(copy_bytes) / (best_copy * 1e-3) / 1e9;
  state.counters["bytes"] = bytes;
  state.counters["copy_GBps"] = copy_gbps;
  state.counters["frac_of_copy"] = (bytes / (per_call_ms * 1e-3) / 1e9) / copy_gbps;
  state.counters["copy_us"] = best_copy * 1e3;
}

}  // namespace specula::bench
