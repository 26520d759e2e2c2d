#pragma once

/// @file
/// CUDA status handling: device paths report `cudaError_t`-style status codes; host wrappers
/// turn them into exceptions.

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace specula::cuda {

/// A CUDA runtime call failed in a host wrapper.
class cuda_error : public std::runtime_error {
 public:
  cuda_error(cudaError_t code, const std::string& what)
      : std::runtime_error("specula::cuda: " + what + ": " + cudaGetErrorName(code) + " (" +
                           cudaGetErrorString(code) + ")"),
        code_(code) {}
  [[nodiscard]] cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

/// Throws cuda_error unless `code` is cudaSuccess.
inline void throw_on_error(cudaError_t code, const char* what) {
  if (code != cudaSuccess) throw cuda_error(code, what);
}

/// Number of CUDA devices visible to this process; 0 when there is no GPU or no driver (the
/// error this raises in the runtime is cleared).
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace specula::cuda
