#pragma once
// Helpers shared by the device benchmarks: an owning device buffer and CUDA-event timing.

#include <cuda_runtime_api.h>

#include <cstddef>

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

/// Milliseconds of `launch` on the legacy default stream, measured with CUDA events.
template <class Launch>
float time_ms(Launch&& launch) {
  cudaEvent_t a, b;
  specula::cuda::throw_on_error(cudaEventCreate(&a), "cudaEventCreate");
  specula::cuda::throw_on_error(cudaEventCreate(&b), "cudaEventCreate");
  cudaEventRecord(a, nullptr);
  launch();
  cudaEventRecord(b, nullptr);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms;
}

}  // namespace specula::bench
