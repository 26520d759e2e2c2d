// See device_verify.hpp.

#include "device_verify.hpp"

#include "specula/cuda/sampling.cuh"
#include "specula/cuda/transforms.cuh"
#include "specula/cuda/tree.cuh"

namespace specula::example::device_detail {

cudaError_t probs(cudaStream_t stream, const float* logits, index_t rows, index_t V,
                  const sampling_params* params, float* out) {
  return specula::cuda::logits_to_probs_async<float>(
      specula::cuda::par_on(stream), batch_view<const float>(logits, rows, V),
      batch_view<const float>(nullptr, 0, V), row_view<const sampling_params>(params, 1),
      batch_view<float>(out, rows, V));
}

cudaError_t sample(cudaStream_t stream, const float* q, index_t V, const request_rng* rng,
                   std::uint32_t position, index_t k, token_t* out_tokens,
                   std::int32_t* out_count) {
  return specula::cuda::sample_without_replacement_async<float>(
      specula::cuda::par_on(stream), batch_view<const float>(q, 1, V), k,
      row_view<const request_rng>(rng, 1), position, row_view<token_t>(out_tokens, k),
      row_view<std::int32_t>(out_count, 1));
}

cudaError_t verify_tree(cudaStream_t stream, index_t V, const index_t* offsets,
                        const index_t* parents, const token_t* tokens, index_t nodes,
                        const float* p, const float* q, const request_rng* rng, token_t* out_tokens,
                        std::int32_t* num_accepted, index_t* accepted_nodes, std::uint32_t* flags,
                        const scheduled_relaxed_rule* relaxed) {
  specula::cuda::tree_device_input<float> in;
  in.vocab_size = V;
  in.node_offsets = row_view<const index_t>(offsets, 2);
  in.parents = row_view<const index_t>(parents, nodes);
  in.tokens = row_view<const token_t>(tokens, nodes);
  in.target_probs = batch_view<const float>(p, nodes, V);
  if (q != nullptr) in.draft_probs = batch_view<const float>(q, nodes, V);  // else one-hot
  in.rng = row_view<const request_rng>(rng, 1);
  tree_batch_output out;
  out.output_tokens = row_view<token_t>(out_tokens, nodes);
  out.num_accepted = row_view<std::int32_t>(num_accepted, 1);
  out.accepted_nodes = row_view<index_t>(accepted_nodes, nodes);
  out.flags = row_view<std::uint32_t>(flags, 1);
  if (relaxed != nullptr)
    return specula::cuda::verify_tree_async(specula::cuda::par_on(stream), in, out, tree_options{},
                                            *relaxed);
  return specula::cuda::verify_tree_async(specula::cuda::par_on(stream), in, out, tree_options{});
}

}  // namespace specula::example::device_detail
