#pragma once

/// @file
/// Fused verification from logits: target logits (fp32, bf16 or fp16) -> CFG mix -> temperature
/// -> top-k / top-p / min-p -> softmax -> chain verification, without writing a probability
/// tensor.
///
/// Two kernels on the policy's stream:
///   1. one CTA per target row runs the passes of logits_to_probs (transforms.cuh) and keeps only
///      the row's constants (max, thresholds, normalisers: a few dozen bytes, in the workspace);
///   2. one CTA per request runs the chain verifier (chain.cuh) on rows that compute each
///      probability from the logits and the constants when the verifier reads it: p(x) for the
///      acceptance tests and one full row for the residual or bonus sample.
/// The probabilities the verifier sees are bit for bit those logits_to_probs_async writes (the
/// same device function computes both), so the result equals logits_to_probs_async followed by
/// verify_chain_async, without the fp32 copy of the whole [rows, V] tensor (written once, read
/// at least once).
///
/// Rules: scalar acceptance rules (exact_rule, relaxed_rule, scheduled_relaxed_rule, or
/// per_request of one). Drafts: dense fp32 q rows or one-hot (no rows). Greedy and sampled
/// requests mix in one launch through fused_chain_input::is_greedy (vLLM's is_greedy).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/cuda/chain.cuh"
#include "specula/cuda/launch_checks.cuh"
#include "specula/cuda/policy.cuh"
#include "specula/cuda/transforms.cuh"
#include "specula/rules/rule.hpp"
#include "specula/sample/transforms.hpp"
#include "specula/verify/chain.hpp"

SPECULA_CUDA_NAMESPACE_BEGIN

/// Inputs of fused chain verification (device pointers). Layout as chain_batch_input (flattened:
/// request b's drafts are [draft_offsets[b], draft_offsets[b + 1]), its target rows
/// draft_offsets[b] + b .. draft_offsets[b + 1] + b), with target logits instead of target
/// probabilities.
template <class T>
struct fused_chain_input {
  index_t vocab_size = 0;
  index_view draft_offsets;                ///< B + 1, int64 or int32 (as chain_batch_input)
  row_view<const token_t> draft_tokens;    ///< total drafts
  batch_view<const float> draft_probs;     ///< total drafts x V, or no rows (one-hot drafts)
  batch_view<const T> target_logits;       ///< (total drafts + B) x V
  batch_view<const T> uncond_logits;       ///< same shape for CFG, or no rows
  row_view<const sampling_params> params;  ///< 1 entry, or one per target row
  row_view<const request_rng> rng;         ///< B
  /// B flags (device), or empty (every request sampled): request b with is_greedy[b] != 0 is
  /// verified greedily in the same launch (vLLM's is_greedy): drafts accepted while each equals
  /// the arg-max of its target logits after the CFG mix (temperature and the filters do not move
  /// it and are not applied; ties: lowest id), then that arg-max is emitted — what
  /// verify_chain_greedy_async returns on the mixed logit rows. Its draft rows and stream are
  /// not read.
  row_view<const std::uint8_t> is_greedy = {};
};

/// Workspace bytes of verify_chain_from_logits_async for `target_rows` target rows.
[[nodiscard]] inline std::size_t fused_chain_workspace_bytes(index_t target_rows) noexcept {
  return static_cast<std::size_t>(target_rows) * sizeof(transforms_detail::row_transform);
}

namespace detail {

template <class Rule, class T>
SPECULA_KERNEL void __launch_bounds__(chain_block_threads)
    fused_chain_kernel(Rule rule, fused_chain_input<T> in, chain_batch_output out,
                       double residual_floor, const transforms_detail::row_transform* transforms) {
  __shared__ chain_storage storage;
  const chain_passes passes(storage);
  const auto b = static_cast<index_t>(blockIdx.x);
  if (!in.is_greedy.empty() && in.is_greedy[b] != 0) {
    block_greedy_segment(
        specula::detail::flattened_segment(in.draft_offsets, b), in.vocab_size,
        in.draft_tokens.data,
        transforms_detail::mixed_logit_rows<T>{in.target_logits, in.uncond_logits, in.params},
        out.output_tokens.data, out.accepted.empty() ? nullptr : out.accepted.data,
        out.num_accepted.data + b, out.flags.empty() ? nullptr : out.flags.data + b, passes,
        in.draft_tokens.size, in.target_logits.rows, out.output_tokens.size);
    return;
  }
  const transforms_detail::transformed_rows<T> rows{in.target_logits, in.uncond_logits, in.params,
                                                    transforms};
  block_chain_segment(specula::detail::request_rule(rule, b), in.rng[b],
                      specula::detail::flattened_segment(in.draft_offsets, b), in.vocab_size,
                      in.draft_tokens.data, in.draft_probs, rows, residual_floor,
                      out.output_tokens.data, out.accepted.empty() ? nullptr : out.accepted.data,
                      out.num_accepted.data + b, out.flags.empty() ? nullptr : out.flags.data + b,
                      passes, in.draft_tokens.size, in.target_logits.rows, out.output_tokens.size);
}

}  // namespace detail

/// Enqueues fused chain verification from logits (see file comment) on policy.stream.
///
/// - `policy` must carry a workspace of fused_chain_workspace_bytes(target rows);
/// - `in.is_greedy`: empty, or one flag per request (device): flagged requests are verified
///   greedily on their mixed logits (see fused_chain_input); the others as without it, bit for
///   bit (a request's result depends on its own rows and stream only);
/// - `row_status`: device array of one entry per target row receiving the transform's status
///   (0 = ok, see logits_to_probs_async), or null. A request whose rows failed the transform
///   sees NaN probabilities there, exactly as with the unfused path (no chain_valid flag when no
///   token can be sampled).
///
/// Returns cudaErrorInvalidValue without launching for inconsistent extents (the flattened
/// layout's checks, on the logit rows: rows of V with a stride of at least V, arrays present and
/// long enough for the batch; uncond of the logits' shape; params of 1 entry or one per row), a
/// missing, short or misaligned workspace, a vocabulary beyond chain_max_vocab, or a rule whose
/// data the device cannot read (detail::check_rule).
template <logit_element T, batch_tree_rule Rule = exact_rule>
cudaError_t verify_chain_from_logits_async(const par_policy& policy, const fused_chain_input<T>& in,
                                           const chain_batch_output& out,
                                           const chain_options& options = {}, const Rule& rule = {},
                                           std::uint32_t* row_status = nullptr) {
  const index_t batch = in.draft_offsets.size - 1;
  if (in.draft_offsets.size <= 1) return cudaSuccess;  // B = 0 is a no-op
  if (const cudaError_t e = detail::check_vocab(in.vocab_size); e != cudaSuccess) return e;
  const index_t rows = in.target_logits.rows;
  detail::launch_check c =
      detail::check_flattened_layout(in.vocab_size, in.draft_offsets, in.draft_tokens,
                                     in.draft_probs, in.target_logits, in.rng, out, true);
  c.grid(rows)
      .optional_rows(in.uncond_logits, in.vocab_size, rows)
      .require(in.uncond_logits.rows == 0 || in.uncond_logits.rows == rows)
      .require(in.params.size == 1 || in.params.size == rows)
      .array(in.params, 1)
      .optional_array(in.is_greedy, batch)
      .require(policy.workspace != nullptr &&
               policy.workspace_bytes >= fused_chain_workspace_bytes(rows))
      .aligned(policy.workspace, alignof(transforms_detail::row_transform));
  if (const cudaError_t e = c.status(); e != cudaSuccess) return e;
  if (const cudaError_t e = detail::check_rule(rule, in.vocab_size, batch); e != cudaSuccess)
    return e;
  auto* transforms = static_cast<transforms_detail::row_transform*>(policy.workspace);
  transforms_detail::row_transform_kernel<T, transforms_block_size>
      <<<static_cast<unsigned>(rows), transforms_block_size, 0, policy.stream>>>(
          in.target_logits, in.uncond_logits, in.params, transforms, row_status);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  detail::fused_chain_kernel<Rule, T>
      <<<static_cast<unsigned>(batch), chain_block_threads, 0, policy.stream>>>(
          rule, in, out, options.residual_floor, transforms);
  return cudaGetLastError();
}

SPECULA_CUDA_NAMESPACE_END
