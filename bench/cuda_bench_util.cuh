#pragma once
// Helpers shared by the device benchmarks: an owning device buffer, CUDA-event timing with L2
// flushed, a copy baseline counting reads and writes, and warm-ups that fail one case only.

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>
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

/// A device buffer of twice the L2 cache (at least 1 MiB) that flush() overwrites on the legacy
/// default stream, so that the next timed launch finds none of its inputs in L2.
class l2_flusher {
 public:
  l2_flusher() : buf_(bytes_of_l2()), bytes_(bytes_of_l2()) {}
  /// Enqueues a memset of the whole buffer (outside the timed region: before its start event).
  cudaError_t flush() { return cudaMemsetAsync(buf_.ptr, ++value_ & 0xff, bytes_, nullptr); }

 private:
  static std::size_t bytes_of_l2() {
    int device = 0, l2 = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device) != cudaSuccess) {
      (void)cudaGetLastError();
      l2 = 0;
    }
    const std::size_t twice = 2 * static_cast<std::size_t>(l2 > 0 ? l2 : 0);
    return twice < (std::size_t{1} << 20) ? (std::size_t{1} << 20) : twice;
  }
  device_buffer buf_;
  std::size_t bytes_;
  int value_ = 0;
};

/// Runs `launch` once and waits for it (module load, first-touch allocations). On failure the
/// case stops with SkipWithError naming the error and this returns false: a failed warm-up
/// ends one case, never the whole benchmark binary.
template <class Launch>
bool warm_up(benchmark::State& state, Launch&& launch) {
  cudaError_t e = launch();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    state.SkipWithError((std::string("warm-up: ") + cudaGetErrorName(e)).c_str());
    return false;
  }
  return true;
}

/// Wraps a benchmark case so that an exception (a failed allocation or upload, which
/// throw_on_error throws) stops that case with SkipWithError instead of terminating the binary.
template <class Case>
auto guarded(Case c) {
  return [c](benchmark::State& state) {
    try {
      c(state);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
    }
  };
}

/// Times `launch` in the benchmark loop (CUDA events, manual time, L2 flushed before every
/// timed launch) and reports it against a device-to-device copy timed the same way in the same
/// process (best of 20). `bytes` is what one launch must touch (its floor: reads plus writes);
/// the copy moves bytes/2 bytes, i.e. reads bytes/2 and writes bytes/2, so a kernel at the copy's
/// bandwidth scores 1. Counters: bytes, copy_GBps (reads + writes), copy_us, frac_of_copy
/// (launch rate over copy rate = copy time / launch time). `launch` returns the cudaError_t of
/// what it enqueued; a failure stops the case with SkipWithError (the error's name), so that it
/// reports no time.
template <class Launch>
void time_against_copy(benchmark::State& state, double bytes, Launch&& launch) {
  const auto copy_bytes = static_cast<std::size_t>(bytes / 2 > 1 ? bytes / 2 : 1);
  device_buffer src(copy_bytes), dst(copy_bytes);
  l2_flusher l2;
  auto copy = [&] {
    return cudaMemcpyAsync(dst.ptr, src.ptr, copy_bytes, cudaMemcpyDeviceToDevice, nullptr);
  };
  cudaError_t status = copy();
  float best_copy = 1e30f;
  for (int r = 0; r < 20 && status == cudaSuccess; ++r) {
    status = l2.flush();
    if (status != cudaSuccess) break;
    const float ms = time_ms(copy, status);
    best_copy = ms < best_copy ? ms : best_copy;
  }
  if (status != cudaSuccess) {
    state.SkipWithError((std::string("copy baseline: ") + cudaGetErrorName(status)).c_str());
    return;
  }
  double total_ms = 0;
  for (auto _ : state) {
    status = l2.flush();
    const float ms = status == cudaSuccess ? time_ms(launch, status) : 0.0f;
    if (status != cudaSuccess) {
      state.SkipWithError((std::string("launch failed: ") + cudaGetErrorName(status)).c_str());
      return;
    }
    total_ms += ms;
    state.SetIterationTime(ms / 1e3);
  }
  const double per_call_ms = total_ms / static_cast<double>(state.iterations());
  const double copy_gbps = 2.0 * static_cast<double>(copy_bytes) / (best_copy * 1e-3) / 1e9;
  state.counters["bytes"] = bytes;
  state.counters["copy_GBps"] = copy_gbps;
  state.counters["frac_of_copy"] = (bytes / (per_call_ms * 1e-3) / 1e9) / copy_gbps;
  state.counters["copy_us"] = best_copy * 1e3;
}

/// Registers a device benchmark case `name` (manual time, microseconds), guarded().
template <class Case>
void add_case(const std::string& name, Case c) {
  benchmark::RegisterBenchmark(name.c_str(), guarded(std::move(c)))
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
}

}  // namespace specula::bench
