// The entry-point instantiations that several device test files call, each compiled once.
//
// nvcc compiles a kernel template once per translation unit that instantiates it, and the
// kernels dominate the build (tens of seconds of NVVM each). The launch checks
// (test_launch_checks.cu) call most entry points with the same template arguments as the
// files that test those entry points on the device, so they declare them here `extern` and
// compile none of their kernels; each instantiation is defined in one owning file, which
// defines that file's macro before including this header:
//
//   SPECULA_TEST_CHAIN_INSTANCES     test_chain_kernel.cu
//   SPECULA_TEST_TREE_INSTANCES      test_tree_kernel.cu
//   SPECULA_TEST_FUSED_INSTANCES     test_fused_kernel.cu
//   SPECULA_TEST_SAMPLING_INSTANCES  test_sampling_rows.cu
//
// (an empty macro: an explicit instantiation definition; undefined: `extern`, a declaration).
// The signatures must match the entry points' exactly (default arguments included as
// parameters); a mismatch is a link error, not a silent second copy.
#pragma once

#include <cstdint>

#include "specula/cuda/chain.cuh"
#include "specula/cuda/fused.cuh"
#include "specula/cuda/sampling.cuh"
#include "specula/cuda/tree.cuh"
#include "specula/rules/lantern.hpp"
#include "specula/rules/relaxed.hpp"

#ifndef SPECULA_TEST_CHAIN_INSTANCES
#define SPECULA_TEST_CHAIN_INSTANCES extern
#endif
#ifndef SPECULA_TEST_TREE_INSTANCES
#define SPECULA_TEST_TREE_INSTANCES extern
#endif
#ifndef SPECULA_TEST_FUSED_INSTANCES
#define SPECULA_TEST_FUSED_INSTANCES extern
#endif
#ifndef SPECULA_TEST_SAMPLING_INSTANCES
#define SPECULA_TEST_SAMPLING_INSTANCES extern
#endif

#define SPECULA_TEST_CHAIN_FLATTENED(RULE)                                        \
  SPECULA_TEST_CHAIN_INSTANCES template cudaError_t                               \
  specula::cuda::verify_chain_async<float, RULE>(                                 \
      const specula::cuda::par_policy&, const specula::chain_batch_input<float>&, \
      const specula::chain_batch_output&, const specula::chain_options&, const RULE&)

// Chain verification (test_chain_kernel.cu).
SPECULA_TEST_CHAIN_FLATTENED(specula::exact_rule);
SPECULA_TEST_CHAIN_FLATTENED(specula::lantern_rule);
SPECULA_TEST_CHAIN_FLATTENED(specula::scheduled_relaxed_rule);
SPECULA_TEST_CHAIN_FLATTENED(specula::scheduled_lantern_rule);
SPECULA_TEST_CHAIN_FLATTENED(specula::per_request<specula::relaxed_rule>);
SPECULA_TEST_CHAIN_INSTANCES template cudaError_t
specula::cuda::verify_chain_async<float, specula::exact_rule>(
    const specula::cuda::par_policy&, const specula::padded_chain_input<float>&,
    const specula::padded_chain_output&, const specula::chain_options&, const specula::exact_rule&);
SPECULA_TEST_CHAIN_INSTANCES template cudaError_t specula::cuda::verify_chain_greedy_async<float>(
    const specula::cuda::par_policy&, const specula::chain_batch_input<float>&,
    const specula::chain_batch_output&);

#undef SPECULA_TEST_CHAIN_FLATTENED

// Tree and candidate verification, sampling without replacement (test_tree_kernel.cu).
SPECULA_TEST_TREE_INSTANCES template cudaError_t
specula::cuda::verify_tree_async<float, specula::exact_rule>(
    const specula::cuda::par_policy&, const specula::cuda::tree_device_input<float>&,
    const specula::tree_batch_output&, const specula::tree_options&, const specula::exact_rule&);
SPECULA_TEST_TREE_INSTANCES template cudaError_t
specula::cuda::verify_tree_async<float, specula::per_request<specula::relaxed_rule>>(
    const specula::cuda::par_policy&, const specula::cuda::tree_device_input<float>&,
    const specula::tree_batch_output&, const specula::tree_options&,
    const specula::per_request<specula::relaxed_rule>&);
SPECULA_TEST_TREE_INSTANCES template cudaError_t specula::cuda::verify_tree_greedy_async<float>(
    const specula::cuda::par_policy&, const specula::cuda::tree_device_input<float>&,
    const specula::tree_batch_output&);
SPECULA_TEST_TREE_INSTANCES template cudaError_t
specula::cuda::verify_candidates_async<float, specula::exact_rule>(
    const specula::cuda::par_policy&, const specula::cuda::candidates_device_input<float>&,
    const specula::cuda::candidates_device_output&, const specula::tree_options&,
    const specula::exact_rule&);
SPECULA_TEST_TREE_INSTANCES template cudaError_t specula::cuda::sample_without_replacement_async<
    float>(const specula::cuda::par_policy&, specula::batch_view<const float>, specula::index_t,
           specula::row_view<const specula::request_rng>, std::uint32_t,
           specula::row_view<specula::token_t>, specula::row_view<std::int32_t>);

// Logits-to-verdict fusion (test_fused_kernel.cu).
SPECULA_TEST_FUSED_INSTANCES template cudaError_t
specula::cuda::verify_chain_from_logits_async<float, specula::exact_rule>(
    const specula::cuda::par_policy&, const specula::cuda::fused_chain_input<float>&,
    const specula::chain_batch_output&, const specula::chain_options&, const specula::exact_rule&,
    std::uint32_t*);

// One token per row (test_sampling_rows.cu).
SPECULA_TEST_SAMPLING_INSTANCES template cudaError_t specula::cuda::sample_from_probs_async<float>(
    const specula::cuda::par_policy&, specula::batch_view<const float>,
    specula::row_view<const specula::request_rng>, specula::row_view<specula::token_t>,
    std::uint32_t*);
SPECULA_TEST_SAMPLING_INSTANCES template cudaError_t specula::cuda::sample_from_logits_async<float>(
    const specula::cuda::par_policy&, specula::batch_view<const float>,
    specula::row_view<const specula::sampling_params>,
    specula::row_view<const specula::request_rng>, specula::row_view<specula::token_t>,
    specula::row_view<const std::uint8_t>, std::uint32_t*);
