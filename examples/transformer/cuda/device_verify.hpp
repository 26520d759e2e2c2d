#pragma once

// The library's device transforms, sampling and verification (specula::cuda) behind plain
// launchers for device_resident_sd.cpp: this translation unit (device_verify.cu) is the only one
// that includes the CUB-based headers. Each launcher enqueues on `stream` and returns the entry
// point's cudaError_t.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "specula/core/rng.hpp"
#include "specula/core/types.hpp"
#include "specula/rules/relaxed.hpp"
#include "specula/sample/transforms.hpp"

namespace specula::example::device_detail {

/// rows x V logits -> probability rows (specula::cuda::logits_to_probs_async, one parameter set).
cudaError_t probs(cudaStream_t stream, const float* logits, index_t rows, index_t V,
                  const sampling_params* params, float* out);

/// Up to k distinct draws from the row q (specula::cuda::sample_without_replacement_async) with
/// the stream *rng at `position`: out_tokens[0 .. k), -1 past the row's positive entries.
cudaError_t sample(cudaStream_t stream, const float* q, index_t V, const request_rng* rng,
                   std::uint32_t position, index_t k, token_t* out_tokens, std::int32_t* out_count);

/// Tree verification of one request's `nodes` nodes (specula::cuda::verify_tree_async, siblings
/// without replacement): the exact rule, or `relaxed` when given (a schedule without device
/// data: not custom); p and q are nodes x V rows (q null: deterministic children, one-hot
/// proposals).
cudaError_t verify_tree(cudaStream_t stream, index_t V, const index_t* offsets,
                        const index_t* parents, const token_t* tokens, index_t nodes,
                        const float* p, const float* q, const request_rng* rng, token_t* out_tokens,
                        std::int32_t* num_accepted, index_t* accepted_nodes, std::uint32_t* flags,
                        const scheduled_relaxed_rule* relaxed = nullptr);

}  // namespace specula::example::device_detail
