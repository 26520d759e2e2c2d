#pragma once

// Helpers of the device tests: GPU detection with a skip message, and a device copy of a host
// vector.

#include <catch2/catch.hpp>
#include <cstddef>
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

/// A device copy of a host vector, freed on destruction.
template <class T>
struct device_vector {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit device_vector(const std::vector<T>& v) : n(v.size()) {
    specula::cuda::throw_on_error(cudaMalloc(&ptr, (n == 0 ? 1 : n) * sizeof(T)), "cudaMalloc");
    if (n > 0)
      specula::cuda::throw_on_error(
          cudaMemcpy(ptr, v.data(), n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  device_vector(const device_vector&) = delete;
  device_vector& operator=(const device_vector&) = delete;
  ~device_vector() { cudaFree(ptr); }
  void assign(const std::vector<T>& v) {
    if (v.size() != n) throw std::logic_error("device_vector::assign: size mismatch");
    if (n > 0)
      specula::cuda::throw_on_error(
          cudaMemcpy(ptr, v.data(), n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
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
