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

#include "specula/core/types.hpp"
#include "specula/cuda/config.cuh"
#include "specula/cuda/error.cuh"

SPECULA_CUDA_NAMESPACE_BEGIN

/// Where device work runs: a stream, and scratch memory the caller owns (may be null for
/// algorithms that need none; see each algorithm's workspace_bytes()).
struct par_policy {
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  /// CTAs per row for the full-row passes of algorithms with a split path (chain verification,
  /// sampling without replacement): 0 = automatic (split only when the batch leaves SMs idle),
  /// 1 = one CTA per row, s > 1 = s CTAs per row. A split needs the algorithm's workspace;
  /// without it the algorithm uses one CTA per row. Every choice gives the same results.
  int row_split = 0;

  /// The same policy with a fixed number of CTAs per row (see row_split).
  [[nodiscard]] par_policy with_row_split(int ctas) const noexcept {
    par_policy p = *this;
    p.row_split = ctas;
    return p;
  }

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

namespace detail {

/// CTAs per row for `rows` rows of `units` independent pieces of work (tiles): pol.row_split
/// when set, otherwise enough CTAs for about two per SM when the rows alone would leave SMs
/// idle; at most one CTA per two units and at most 64. Queries the current device (no
/// synchronisation; allowed during stream capture).
inline int ctas_per_row(const par_policy& pol, index_t rows, index_t units) {
  index_t split = pol.row_split;
  if (split <= 0) {
    int device = 0;
    int sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return 1;
    }
    if (rows * 2 > sms) return 1;
    split = (2 * static_cast<index_t>(sms) + rows - 1) / rows;
  }
  const index_t most = units / 2 < 64 ? units / 2 : 64;
  if (split > most) split = most;
  return split < 1 ? 1 : static_cast<int>(split);
}

}  // namespace detail

SPECULA_CUDA_NAMESPACE_END
