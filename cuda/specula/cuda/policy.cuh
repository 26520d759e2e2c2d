#pragma once

/// @file
/// The CUDA execution policy: a stream and an optional caller-owned workspace. Algorithms that
/// take a host policy (`specula::host::seq`, `host::par`) have overloads taking this one
/// (`specula::cuda::par_on(stream)`); they enqueue work on the stream and return a
/// cudaError_t without synchronising, so they can be captured in a CUDA graph.
///
/// Device entry points report problems as status codes (cudaError_t for launch problems, per
/// request flags for bad data); only the `_checked` host wrappers throw.

#include <cuda_runtime_api.h>

#include <cstddef>

#include "specula/cuda/config.cuh"
#include "specula/cuda/error.cuh"

SPECULA_CUDA_NAMESPACE_BEGIN

/// Where device work runs: a stream, and scratch memory the caller owns (may be null for
/// algorithms that need none; see each algorithm's workspace_bytes()).
struct par_policy {
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;

  /// The same policy with a workspace.
  [[nodiscard]] par_policy with_workspace(void* ptr, std::size_t bytes) const noexcept {
    par_policy p = *this;
    p.workspace = ptr;
    p.workspace_bytes = bytes;
    return p;
  }
};

/// A policy on `stream` (nullptr: the legacy default stream).
inline par_policy par_on(cudaStream_t stream) noexcept { return par_policy{stream}; }

SPECULA_CUDA_NAMESPACE_END
