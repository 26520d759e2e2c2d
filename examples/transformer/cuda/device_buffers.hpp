#pragma once

// Small host-side helpers of the device ops (device_resident_*.cpp): a CUDA status check that
// throws specula's error, and a grow-only device array.

#include <cuda_runtime_api.h>

#include <cstddef>

#include "specula/core/error.hpp"

namespace specula::example::device_detail {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw_if_failed({status::invalid_parameter, -1, -1, static_cast<double>(e)}, what,
                    cudaGetErrorString(e));
}

/// A device array that grows on demand (contents are not kept when it grows).
template <class T>
struct device_array {
  T* ptr = nullptr;
  std::size_t n = 0;
  void ensure(std::size_t count) {
    if (count <= n) return;
    cudaFree(ptr);  // synchronises: no pending work reads the old array
    ptr = nullptr;
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, count * sizeof(T)), "cudaMalloc");
    ptr = static_cast<T*>(p);
    n = count;
  }
  device_array() = default;
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() { cudaFree(ptr); }
};

}  // namespace specula::example::device_detail
