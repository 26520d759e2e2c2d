#pragma once

// Helpers of the device tests: GPU detection with a skip message, a device copy of a host
// vector, conversions of the logit types and the G-test of stats_bridge.cpp.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/cuda/error.cuh"

namespace specula::cuda_test {

/// True when a CUDA device is present; otherwise warns that `what` is skipped.
inline bool have_gpu(const char* what) {
  if (specula::cuda::device_count() > 0) return true;
  WARN("no CUDA device: " << what << " skipped (compile-only)");
  return false;
}

/// Copies host memory to the device and waits until the copy has landed: cudaMemcpy from
/// pageable memory may return before its DMA completes, and a kernel on a non-blocking stream
/// (which does not wait for the legacy stream) could otherwise read the old contents.
inline void upload_bytes(void* dst, const void* src, std::size_t bytes) {
  specula::cuda::throw_on_error(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  specula::cuda::throw_on_error(cudaDeviceSynchronize(), "cudaMemcpy (landed)");
}

/// A device copy of a host vector, freed on destruction. Uploads have landed when the
/// constructor or assign() returns (upload_bytes), whatever stream the next kernel runs on.
template <class T>
struct device_vector {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit device_vector(const std::vector<T>& v) : n(v.size()) {
    specula::cuda::throw_on_error(cudaMalloc(&ptr, (n == 0 ? 1 : n) * sizeof(T)), "cudaMalloc");
    if (n > 0) upload_bytes(ptr, v.data(), n * sizeof(T));
  }
  device_vector(const device_vector&) = delete;
  device_vector& operator=(const device_vector&) = delete;
  ~device_vector() { cudaFree(ptr); }
  void assign(const std::vector<T>& v) {
    if (v.size() != n) throw std::logic_error("device_vector::assign: size mismatch");
    if (n > 0) upload_bytes(ptr, v.data(), n * sizeof(T));
  }
  [[nodiscard]] std::vector<T> to_host() const {
    std::vector<T> v(n);
    if (n > 0)
      specula::cuda::throw_on_error(
          cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return v;
  }
  row_view<T> view() { return {ptr, static_cast<index_t>(n)}; }
  row_view<const T> cview() const { return {ptr, static_cast<index_t>(n)}; }
};

/// A logit of type T (float, __half or __nv_bfloat16) rounded from a float (to nearest even).
template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(x);
  else
    return x;
}

/// The float value of a logit of type T (exact).
template <class T>
float to_float(T x) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x);
  else
    return x;
}

/// G-test p-value of counts against a law, with a printable summary (stats_bridge.cpp: compiled
/// by the host compiler, Boost.Math stays out of nvcc translation units).
double g_test_p_value(const std::vector<std::uint64_t>& counts, const std::vector<double>& law,
                      std::string& summary);

/// Inverse-CDF draw from a probability row with uniform u (test data generation).
template <class Row>
token_t draw_from(const Row& q, double u) {
  double acc = 0;
  token_t x = 0;
  for (std::size_t y = 0; y < q.size(); ++y) {
    if (q[y] <= 0) continue;
    x = static_cast<token_t>(y);
    acc += q[y];
    if (u < acc) break;
  }
  return x;
}

}  // namespace specula::cuda_test
