#pragma once
// The CUDA path of the chain bindings (built with SPECULA_PYTHON_CUDA): chain verification of
// arrays in device memory, enqueued on the caller's stream through specula::cuda
// (cuda/specula/cuda/chain.cuh). Compiled by nvcc in cuda_chain.cu and called by chain.cpp;
// no nanobind and no CUDA header here.

#include <cstdint>
#include <string>
#include <variant>

#include "specula/rules/exact.hpp"
#include "specula/rules/relaxed.hpp"
#include "specula/verify/chain.hpp"

namespace specula::python::cuda_path {

/// Where the work runs: the arrays' device and a stream (a cudaStream_t as an integer; 0 is the
/// legacy default stream).
struct launch {
  int device = 0;
  std::uintptr_t stream = 0;
};

/// The rules the CUDA path takes: those whose data lives in the rule object itself (the others
/// point to host memory: schedules' values, neighbour tables, per-request arrays).
using device_rule = std::variant<exact_rule, relaxed_rule>;

/// Padded layout (FlashInfer's). Every pointer of `in` and `out` is device memory except
/// `in.rng`, B host streams copied to the device on the stream. Returns "" once enqueued, or
/// the error.
template <class T>
std::string verify_padded(const launch& where, const padded_chain_input<T>& in,
                          const padded_chain_output& out, const chain_options& options,
                          const device_rule& rule);

/// Flattened layout (vLLM's). `cu` holds B cumulative counts (vLLM's cu_num_draft_tokens) or
/// B + 1 offsets from 0, in device memory; `in.draft_offsets` is ignored (made from `cu`).
/// With `padded_width` > 0 the tokens go to `padded_tokens` (B x padded_width, -1 after each
/// request's tokens) instead of `out.output_tokens`, which may then be empty. `greedy`: argmax
/// verification (rule and in.rng unused). `in.rng` is host memory, as for verify_padded.
template <class T>
std::string verify_flat(const launch& where, chain_batch_input<T> in, index_view cu, index_t batch,
                        chain_batch_output out, index_t padded_width, token_t* padded_tokens,
                        const chain_options& options, const device_rule& rule, bool greedy);

}  // namespace specula::python::cuda_path
