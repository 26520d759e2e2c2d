#pragma once

/// @file
/// Chain verification on the GPU: the device counterpart of specula/verify/chain.hpp. The kernels
/// run the host's own per-request verifier (specula::detail::run_segment ->
/// verify_chain_request) with block_passes: every thread of the request's CTA executes the
/// scalar walk (one acceptance test per position, reading p(x) and q(x) only) and the full-row
/// passes — the residual or bonus row's mass and tile sums — are split across the CTA in the
/// host's fixed summation order (block_passes.cuh). The same inputs and seeds therefore give the
/// same tokens as the host backend (see docs/cuda.md for the exact guarantee).
///
/// Small batches: with a workspace in the policy and fewer requests than the GPU has SMs, the
/// stopping row's tile sums are computed by several CTAs per request (chain_split_tiles_kernel)
/// and the verifier reads them instead of summing (the same tile sums, so the same bits); both
/// layouts, flattened and padded. Float rows that are 16-byte aligned are read with vector loads
/// (block_passes.cuh; the same bits).
///
/// Bad data never causes an out-of-bounds read: a drafted token outside [0, V) (including -1
/// padding inside a request's draft) sets chain_invalid_input for that request; NaN entries
/// count as zero weight; a request whose rows have no mass gets no chain_valid flag and -1 as
/// its emitted token. Rows longer than chain_max_vocab are rejected with cudaErrorInvalidValue.
/// Validation of whole rows (sums, negative entries) is the host's job (validate_chain_batch
/// on host copies) or the caller's; the kernels do not read rows they do not need.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/cuda/block_passes.cuh"
#include "specula/cuda/config.cuh"
#include "specula/cuda/error.cuh"
#include "specula/cuda/launch_checks.cuh"
#include "specula/cuda/policy.cuh"
#include "specula/rules/exact.hpp"
#include "specula/rules/rule.hpp"
#include "specula/rules/typical.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/verify/chain.hpp"
#include "specula/verify/chain_core.hpp"
#include "specula/verify/greedy.hpp"

SPECULA_CUDA_NAMESPACE_BEGIN

/// Threads per CTA of the chain kernels (8 lanes × 32 tiles per round).
inline constexpr int chain_block_threads = 256;
/// Longest row the chain kernels accept (tile sums are kept in shared memory: 32 KiB).
inline constexpr index_t chain_max_vocab = 4096 * specula::detail::sum_tile;

namespace detail {

/// A proposal read as a single value (vector_weights: q(y) of a dense proposal, loaded).
struct value_proposal {
  float v;
  [[nodiscard]] __host__ __device__ constexpr double operator()(index_t) const noexcept {
    return static_cast<double>(v);
  }
};

/// Bound rules whose chain residual is a short function of p(y) and q(y) alone (scalar rules,
/// typical acceptance): their residual passes load a tile ahead (vector_weights below).
/// Row-aware rules that look beyond y (LANTERN++: a branch on the resampling mode and neighbour
/// lookups per element) are read element by element: 32 inlined copies of such a weight per tile
/// multiplied the compile time of every kernel instantiating it (docs/cuda.md, "Loads").
template <class BoundRule>
inline constexpr bool residual_loads_ahead = false;
template <class Rule>
inline constexpr bool residual_loads_ahead<specula::detail::scalar_bound_rule<Rule>> = true;
template <>
inline constexpr bool residual_loads_ahead<typical_bound_rule> = true;

/// The chain residual over float rows with a dense proposal: rows p and q, loaded ahead
/// (block_passes.cuh); the weight is chain_residual's own on the loaded values.
template <class BoundRule>
requires residual_loads_ahead<BoundRule>
struct vector_weights<
    specula::detail::chain_residual<BoundRule, row_view<const float>, dense_proposal<float>>> {
  using weights =
      specula::detail::chain_residual<BoundRule, row_view<const float>, dense_proposal<float>>;
  static constexpr bool enabled = true;
  static constexpr int rows = 2;
  [[nodiscard]] __device__ static const float* p(const weights& w) noexcept { return w.p.data; }
  [[nodiscard]] __device__ static const float* q(const weights& w) noexcept { return w.q.row.data; }
  [[nodiscard]] __device__ static double weight(const weights& w, index_t y, float p_y,
                                                float q_y) noexcept {
    const value_row p{p_y};
    const value_proposal q{q_y};
    return specula::detail::chain_residual<BoundRule, value_row, value_proposal>{w.rule, p, q}(y);
  }
};

/// The same with a one-hot proposal: row p only (q(y) depends on y alone).
template <class BoundRule>
requires residual_loads_ahead<BoundRule>
struct vector_weights<
    specula::detail::chain_residual<BoundRule, row_view<const float>, one_hot_proposal>> {
  using weights =
      specula::detail::chain_residual<BoundRule, row_view<const float>, one_hot_proposal>;
  static constexpr bool enabled = true;
  static constexpr int rows = 1;
  [[nodiscard]] __device__ static const float* p(const weights& w) noexcept { return w.p.data; }
  [[nodiscard]] __device__ static const float* q(const weights&) noexcept { return nullptr; }
  [[nodiscard]] __device__ static double weight(const weights& w, index_t y, float p_y,
                                                float) noexcept {
    const value_row p{p_y};
    return specula::detail::chain_residual<BoundRule, value_row, one_hot_proposal>{w.rule, p,
                                                                                   w.q}(y);
  }
};

using chain_passes = block_passes<chain_block_threads>;
/// Tile sums of rows up to chain_max_vocab stay recorded in shared memory (32 KiB).
using chain_storage =
    block_passes_storage<chain_block_threads, chain_max_vocab / specula::detail::sum_tile>;

/// Passes of the split path's first kernel: the first summarize() (the stopping row's residual
/// or bonus weights) computes tile sums [first_tile, last_tile) of the row into `out` and reports
/// no mass, which ends the verifier without further row reads; every other pass reports no mass
/// either. Outputs written by the verifier under these passes are overwritten by the second
/// kernel.
struct capture_passes {
  using summary_type = chain_passes::summary_type;
  chain_passes inner;
  double* out;
  index_t first_tile;
  index_t last_tile;
  mutable bool captured = false;

  template <class WeightFn>
  __device__ double mass(index_t, const WeightFn&) const {
    return 0.0;
  }
  /// A signed sum (a row-aware rule's binding, such as typical acceptance's entropy) decides
  /// where the verifier stops, so it is the CTA's own.
  template <class WeightFn>
  __device__ double sum(index_t n, const WeightFn& w) const {
    return inner.sum(n, w);
  }
  template <class WeightFn>
  __device__ void summarize(index_t n, const WeightFn& w, summary_type& s) const {
    s = summary_type{};
    if (captured) return;
    captured = true;
    const bool writer = threadIdx.x == 0;
    inner.tile_rounds(
        n, w,
        [&](index_t t, double v) {
          if (writer) out[t] = v;
        },
        first_tile, last_tile);
  }
  template <class Row>
  __device__ index_t argmax(const Row&) const {
    return -1;
  }
};

/// Passes of the split path's second kernel: the first summarize() takes the tile sums the first
/// kernel computed (adding them in order, as the host does) instead of reading the row; every
/// other pass is the CTA's own.
struct replay_passes {
  using summary_type = chain_passes::summary_type;
  chain_passes inner;
  const double* sums;
  mutable bool replayed = false;

  template <class WeightFn>
  __device__ double mass(index_t n, const WeightFn& w) const {
    return inner.mass(n, w);
  }
  template <class WeightFn>
  __device__ double sum(index_t n, const WeightFn& w) const {
    return inner.sum(n, w);
  }
  template <class WeightFn>
  __device__ void summarize(index_t n, const WeightFn& w, summary_type& s) const {
    if (replayed) {
      inner.summarize(n, w, s);
      return;
    }
    replayed = true;
    const index_t tiles = (n + specula::detail::sum_tile - 1) / specula::detail::sum_tile;
    for (index_t t = threadIdx.x; t < tiles && t < inner.max_tiles; t += chain_block_threads)
      inner.tile_sum[t] = sums[t];
    __syncthreads();
    s.total = 0.0;
    s.recorded = tiles < inner.max_tiles ? tiles : inner.max_tiles;
    s.tile_sum = inner.tile_sum;
    s.scratch = inner.lanes;
    // The same numbers in the same order, from the shared copy (a chain of dependent global
    // loads otherwise), eight read before the first of them is added.
    constexpr index_t batch = specula::detail::walk_batch;
    index_t t = 0;
    for (; t + batch <= s.recorded; t += batch) {
      double v[batch];
#pragma unroll
      for (index_t u = 0; u < batch; ++u) v[u] = s.tile_sum[t + u];
#pragma unroll
      for (index_t u = 0; u < batch; ++u) s.total += v[u];
    }
    for (; t < tiles; ++t) s.total += t < s.recorded ? s.tile_sum[t] : sums[t];
  }
  template <class Row>
  __device__ index_t argmax(const Row& row) const {
    return inner.argmax(row);
  }
};

/// True (in every thread) when every drafted token of the segment is in [0, vocab).
__device__ inline bool drafts_in_range(const token_t* drafts, index_t length, index_t vocab) {
  bool ok = true;
  for (index_t i = 0; i < length; ++i)
    ok = ok && drafts[i] >= 0 && static_cast<index_t>(drafts[i]) < vocab;
  return ok;
}

/// Whether a segment's drafts and target rows lie inside the arrays.
__device__ inline bool segment_in_bounds(const specula::detail::chain_segment& s,
                                         index_t num_drafts, index_t num_target_rows) {
  return s.length >= 0 && s.draft_row >= 0 && s.draft_row + s.length <= num_drafts &&
         s.target_row >= 0 && s.target_row + s.length < num_target_rows;
}

/// Marks a request whose offsets point outside the arrays: chain_invalid_input, nothing
/// accepted, -1 in each of its output slots [first_slot, first_slot + length] that lies in the
/// output array (so no stale token reads as this round's; a negative length: the first slot).
__device__ inline void write_out_of_bounds(index_t first_slot, index_t length, token_t* out_tokens,
                                           index_t num_out_tokens, std::int32_t* num_accepted,
                                           std::uint32_t* flags) {
  if (threadIdx.x != 0) return;
  const index_t last = first_slot + (length > 0 ? length : 0);
  for (index_t i = first_slot < 0 ? 0 : first_slot; i <= last && i < num_out_tokens; ++i)
    out_tokens[i] = no_token;
  *num_accepted = 0;
  if (flags != nullptr) *flags = chain_invalid_input;
}

/// Marks a request with out-of-range drafts: no tokens, nothing accepted, chain_invalid_input.
__device__ inline void write_invalid(index_t length, token_t* out_tokens, std::uint8_t* accepted,
                                     std::int32_t* num_accepted, std::uint32_t* flags) {
  if (threadIdx.x != 0) return;
  for (index_t i = 0; i <= length; ++i) out_tokens[i] = no_token;
  if (accepted != nullptr)
    for (index_t i = 0; i < length; ++i) accepted[i] = 0;
  *num_accepted = 0;
  if (flags != nullptr) *flags = chain_invalid_input;
}

/// The checks every segment passes before a verifier reads it: offsets that point outside the
/// arrays flag the request and write -1 to its output slots that are in bounds (so no stale
/// token reads as this round's), drafts outside [0, vocab) flag it with no tokens. Returns
/// whether the segment may be verified (in every thread).
__device__ inline bool segment_checked(const specula::detail::chain_segment& s, index_t vocab,
                                       const token_t* tokens, token_t* out_tokens,
                                       std::uint8_t* accepted, std::int32_t* num_accepted,
                                       std::uint32_t* flags, index_t num_drafts,
                                       index_t num_target_rows, index_t num_out_tokens) {
  if (!segment_in_bounds(s, num_drafts, num_target_rows)) {
    write_out_of_bounds(s.target_row, s.length, out_tokens, num_out_tokens, num_accepted, flags);
    return false;
  }
  if (!drafts_in_range(tokens + s.draft_row, s.length, vocab)) {
    write_invalid(s.length, out_tokens + s.target_row,
                  accepted == nullptr ? nullptr : accepted + s.draft_row, num_accepted, flags);
    return false;
  }
  return true;
}

/// Writes a request's count and flags (thread 0).
__device__ inline void write_request_result(const chain_request_result& r,
                                            std::int32_t* num_accepted, std::uint32_t* flags) {
  if (threadIdx.x != 0) return;
  *num_accepted = r.num_accepted;
  if (flags != nullptr) *flags = r.flags;
}

/// One segment with the whole CTA: the host's run_segment with CTA-wide passes. Outputs are the
/// batch's arrays (run_segment offsets them by the segment).
template <class Rule, class T, class TargetRows, class Passes>
__device__ void block_chain_segment(const Rule& rule, const request_rng& rng,
                                    const specula::detail::chain_segment& s, index_t vocab,
                                    const token_t* tokens, batch_view<const T> draft_probs,
                                    const TargetRows& target_rows, double residual_floor,
                                    token_t* out_tokens, std::uint8_t* accepted,
                                    std::int32_t* num_accepted, std::uint32_t* flags,
                                    const Passes& passes, index_t num_drafts,
                                    index_t num_target_rows, index_t num_out_tokens) {
  if (!segment_checked(s, vocab, tokens, out_tokens, accepted, num_accepted, flags, num_drafts,
                       num_target_rows, num_out_tokens))
    return;
  write_request_result(specula::detail::run_segment(rule, rng, s, tokens, draft_probs, target_rows,
                                                    residual_floor, out_tokens, accepted, passes),
                       num_accepted, flags);
}

/// One segment verified greedily with the whole CTA: the host's greedy_chain_request with a
/// CTA-wide argmax over `score_rows.row(r)` (probability or logit rows), after the checks of
/// block_chain_segment.
template <class ScoreRows, class Passes>
__device__ void block_greedy_segment(const specula::detail::chain_segment& s, index_t vocab,
                                     const token_t* tokens, const ScoreRows& score_rows,
                                     token_t* out_tokens, std::uint8_t* accepted,
                                     std::int32_t* num_accepted, std::uint32_t* flags,
                                     const Passes& passes, index_t num_drafts,
                                     index_t num_target_rows, index_t num_out_tokens) {
  if (!segment_checked(s, vocab, tokens, out_tokens, accepted, num_accepted, flags, num_drafts,
                       num_target_rows, num_out_tokens))
    return;
  write_request_result(
      greedy_chain_request(
          s.length, tokens + s.draft_row,
          [&](index_t i) { return score_rows.row(s.target_row + i); }, out_tokens + s.target_row,
          accepted == nullptr ? nullptr : accepted + s.draft_row, passes),
      num_accepted, flags);
}

/// Whether request b of a flattened batch is verified greedily (chain_batch_input::is_greedy).
template <class T>
__device__ inline bool greedy_request(const chain_batch_input<T>& in, index_t b) {
  return !in.is_greedy.empty() && in.is_greedy[b] != 0;
}

/// Padded requests are all sampled (padded_chain_input has no greedy flags).
template <class T>
__device__ inline bool greedy_request(const padded_chain_input<T>&, index_t) {
  return false;
}

/// Request b's segment: its drafts and rows in the flattened layout ...
template <class T>
__device__ specula::detail::chain_segment request_segment(const chain_batch_input<T>& in,
                                                          index_t b) {
  return specula::detail::flattened_segment(in.draft_offsets, b);
}

/// ... and in the padded one (lengths from draft_lengths, clamped to [0, L], or up to the first
/// -1; every thread).
template <class T>
__device__ specula::detail::chain_segment request_segment(const padded_chain_input<T>& in,
                                                          index_t b) {
  const index_t len_max = in.max_draft;
  index_t n = specula::detail::padded_length(in.draft_tokens, in.draft_lengths, len_max, b);
  n = n < 0 ? 0 : (n > len_max ? len_max : n);
  return {n, b * len_max, b * (len_max + 1)};
}

/// Drafted tokens of a batch (the bound of a segment's drafts).
template <class T>
__device__ index_t batch_drafts(const chain_batch_input<T>& in) {
  return in.draft_tokens.size;
}
template <class T>
__device__ index_t batch_drafts(const padded_chain_input<T>& in) {
  return in.batch_size * in.max_draft;
}

/// Request blockIdx.x of a flattened batch with the whole CTA.
template <class Rule, class T, class Passes>
__device__ void verify_request(const Rule& rule, const chain_batch_input<T>& in,
                               const chain_batch_output& out, double residual_floor,
                               const Passes& passes) {
  const auto b = static_cast<index_t>(blockIdx.x);
  if (greedy_request(in, b)) {
    block_greedy_segment(
        request_segment(in, b), in.vocab_size, in.draft_tokens.data, in.target_probs,
        out.output_tokens.data, out.accepted.empty() ? nullptr : out.accepted.data,
        out.num_accepted.data + b, out.flags.empty() ? nullptr : out.flags.data + b, passes,
        batch_drafts(in), in.target_probs.rows, out.output_tokens.size);
    return;
  }
  block_chain_segment(specula::detail::request_rule(rule, b), in.rng[b], request_segment(in, b),
                      in.vocab_size, in.draft_tokens.data, in.draft_probs, in.target_probs,
                      residual_floor, out.output_tokens.data,
                      out.accepted.empty() ? nullptr : out.accepted.data, out.num_accepted.data + b,
                      out.flags.empty() ? nullptr : out.flags.data + b, passes, batch_drafts(in),
                      in.target_probs.rows, out.output_tokens.size);
}

/// Request blockIdx.x of a padded batch with the whole CTA: as a flattened request, then -1 in
/// the output slots and 0 in the accepted flags past its length.
template <class Rule, class T, class Passes>
__device__ void verify_request(const Rule& rule, const padded_chain_input<T>& in,
                               const padded_chain_output& out, double residual_floor,
                               const Passes& passes) {
  const auto b = static_cast<index_t>(blockIdx.x);
  const index_t len_max = in.max_draft;
  const specula::detail::chain_segment s = request_segment(in, b);
  std::uint8_t* acc = out.accepted.empty() ? nullptr : out.accepted.data;
  block_chain_segment(specula::detail::request_rule(rule, b), in.rng[b], s, in.vocab_size,
                      in.draft_tokens.data, in.draft_probs, in.target_probs, residual_floor,
                      out.output_tokens.data, acc, out.num_accepted.data + b,
                      out.flags.empty() ? nullptr : out.flags.data + b, passes, batch_drafts(in),
                      in.target_probs.rows, out.output_tokens.size);
  if (threadIdx.x == 0) {
    token_t* outp = out.output_tokens.data + b * (len_max + 1);
    for (index_t i = s.length + 1; i <= len_max; ++i) outp[i] = no_token;
    if (acc != nullptr)
      for (index_t i = s.length; i < len_max; ++i) acc[b * len_max + i] = 0;
  }
}

template <class Rule, class T>
SPECULA_KERNEL void __launch_bounds__(chain_block_threads, SPECULA_CUDA_VERIFIER_MIN_CTAS)
    chain_flattened_kernel(Rule rule, chain_batch_input<T> in, chain_batch_output out,
                           double residual_floor) {
  __shared__ chain_storage storage;
  verify_request(rule, in, out, residual_floor, chain_passes(storage));
}

template <class Rule, class T>
SPECULA_KERNEL void __launch_bounds__(chain_block_threads, SPECULA_CUDA_VERIFIER_MIN_CTAS)
    chain_padded_kernel(Rule rule, padded_chain_input<T> in, padded_chain_output out,
                        double residual_floor) {
  __shared__ chain_storage storage;
  verify_request(rule, in, out, residual_floor, chain_passes(storage));
}

/// Split path, kernel 1: grid (B, S). CTA (b, s) runs request b's verifier up to its stopping
/// row and sums tiles [s·tiles/S, (s+1)·tiles/S) of that row's weights into
/// tile_sums[b·tiles ..]. Either layout (Input: chain_batch_input or padded_chain_input).
template <class Rule, class Input, class Output>
SPECULA_KERNEL void __launch_bounds__(chain_block_threads, SPECULA_CUDA_VERIFIER_MIN_CTAS)
    chain_split_tiles_kernel(Rule rule, Input in, Output out, double residual_floor,
                             double* tile_sums, index_t tiles) {
  __shared__ block_passes_storage<chain_block_threads, 1> storage;
  const auto b = static_cast<index_t>(blockIdx.x);
  const auto split = static_cast<index_t>(gridDim.y);
  const auto part = static_cast<index_t>(blockIdx.y);
  const capture_passes passes{chain_passes(storage), tile_sums + b * tiles, part * tiles / split,
                              (part + 1) * tiles / split};
  const specula::detail::chain_segment s = request_segment(in, b);
  if (greedy_request(in, b)) return;  // verified by the second kernel alone (argmax passes)
  if (!segment_in_bounds(s, batch_drafts(in), in.target_probs.rows)) return;
  if (!drafts_in_range(in.draft_tokens.data + s.draft_row, s.length, in.vocab_size)) return;
  (void)specula::detail::run_segment(specula::detail::request_rule(rule, b), in.rng[b], s,
                                     in.draft_tokens.data, in.draft_probs, in.target_probs,
                                     residual_floor, out.output_tokens.data,
                                     out.accepted.empty() ? nullptr : out.accepted.data, passes);
}

/// Split path, kernel 2: one CTA per request runs the verifier with the first kernel's tile sums.
template <class Rule, class Input, class Output>
SPECULA_KERNEL void __launch_bounds__(chain_block_threads, SPECULA_CUDA_VERIFIER_MIN_CTAS)
    chain_split_finish_kernel(Rule rule, Input in, Output out, double residual_floor,
                              const double* tile_sums, index_t tiles) {
  __shared__ chain_storage storage;
  const auto b = static_cast<index_t>(blockIdx.x);
  verify_request(rule, in, out, residual_floor,
                 replay_passes{chain_passes(storage), tile_sums + b * tiles});
}

/// Greedy chain verification: the host's greedy_chain_request with a CTA-wide argmax.
template <class T>
SPECULA_KERNEL void __launch_bounds__(chain_block_threads, SPECULA_CUDA_VERIFIER_MIN_CTAS)
    greedy_chain_kernel(chain_batch_input<T> in, chain_batch_output out) {
  __shared__ chain_storage storage;
  const auto b = static_cast<index_t>(blockIdx.x);
  block_greedy_segment(
      specula::detail::flattened_segment(in.draft_offsets, b), in.vocab_size, in.draft_tokens.data,
      in.target_probs, out.output_tokens.data, out.accepted.empty() ? nullptr : out.accepted.data,
      out.num_accepted.data + b, out.flags.empty() ? nullptr : out.flags.data + b,
      chain_passes(storage), in.draft_tokens.size, in.target_probs.rows, out.output_tokens.size);
}

inline cudaError_t check_vocab(index_t vocab) {
  return (vocab <= 0 || vocab > chain_max_vocab) ? cudaErrorInvalidValue : cudaSuccess;
}

/// Host checks of a flattened launch (no device memory is read): the rows must be vocab rows
/// (draft rows optional), with data and a stride of at least V, and every array present and
/// long enough for the batch it describes. `target_rows` is the target probabilities' (or the
/// fused path's logits') view. `sampled`: rng and draft rows are read (not by greedy
/// verification).
template <class Target, class Draft>
launch_check check_flattened_layout(index_t vocab, index_view offsets,
                                    row_view<const token_t> draft_tokens,
                                    batch_view<const Draft> draft_probs,
                                    batch_view<const Target> target_rows,
                                    row_view<const request_rng> rng, const chain_batch_output& out,
                                    bool sampled) {
  const index_t batch = offsets.size - 1;
  const index_t drafts = draft_tokens.size;
  launch_check c;
  c.grid(batch)
      .indices(offsets, batch + 1)
      .require(drafts >= 0)
      .array(draft_tokens, drafts)
      .rows(target_rows, vocab, drafts + batch)
      .array(out.num_accepted, batch)
      .array(out.output_tokens, drafts + batch)
      .optional_array(out.accepted, drafts)
      .optional_array(out.flags, batch);
  if (sampled) c.optional_rows(draft_probs, vocab, drafts).array(rng, batch);
  return c;
}

template <class T>
cudaError_t check_flattened(const chain_batch_input<T>& in, const chain_batch_output& out,
                            bool sampled) {
  // The kernels read a bonus row per request; caller-supplied bonus tokens (the host's
  // chain_batch_input::bonus_tokens, vLLM's layout) are not supported on the device yet, and
  // ignoring them would misread the target rows.
  if (in.bonus_tokens.size != 0) return cudaErrorInvalidValue;
  // Per-request greedy flags (chain_batch_input::is_greedy): empty, or one per request.
  return check_flattened_layout(in.vocab_size, in.draft_offsets, in.draft_tokens, in.draft_probs,
                                in.target_probs, in.rng, out, sampled)
      .optional_array(in.is_greedy, in.draft_offsets.size - 1)
      .status();
}

/// The same for the padded layout.
template <class T>
cudaError_t check_padded(const padded_chain_input<T>& in, const padded_chain_output& out) {
  const index_t b = in.batch_size;
  const index_t l = in.max_draft;
  launch_check c;
  c.grid(b)
      .require(l >= 0)
      .array(in.draft_tokens, b * l)
      .optional_indices(in.draft_lengths, b)
      .rows(in.target_probs, in.vocab_size, b * (l + 1))
      .optional_rows(in.draft_probs, in.vocab_size, b * l)
      .array(in.rng, b)
      .array(out.output_tokens, b * (l + 1))
      .array(out.num_accepted, b)
      .optional_array(out.accepted, b * l)
      .optional_array(out.flags, b);
  return c.status();
}

inline index_t row_tiles(index_t vocab) {
  return (vocab + specula::detail::sum_tile - 1) / specula::detail::sum_tile;
}

}  // namespace detail

/// Workspace bytes for the split (several CTAs per row) path of verify_chain_async.
[[nodiscard]] inline std::size_t chain_workspace_bytes(index_t batch, index_t vocab) noexcept {
  return static_cast<std::size_t>(batch) * static_cast<std::size_t>(detail::row_tiles(vocab)) *
         sizeof(double);
}

namespace detail {

/// The launches of verify_chain_async, either layout: one CTA per request (`kernel`), or the
/// split path's two kernels when the policy's workspace holds chain_workspace_bytes(B, V) and
/// ctas_per_row asks for more than one CTA per request. The workspace must be aligned for
/// doubles (checked here, before any launch).
template <class Rule, class Input, class Output, class Kernel>
cudaError_t launch_chain(const par_policy& pol, const Input& in, const Output& out,
                         double residual_floor, const Rule& rule, index_t batch, Kernel* kernel) {
  if (const cudaError_t e = launch_check{}.aligned(pol.workspace, alignof(double)).status();
      e != cudaSuccess)
    return e;  // the split path stores doubles there
  if (const cudaError_t e = check_rule(rule, in.vocab_size, batch); e != cudaSuccess) return e;
  const index_t tiles = row_tiles(in.vocab_size);
  const int split =
      pol.workspace_bytes >= chain_workspace_bytes(batch, in.vocab_size) && pol.workspace != nullptr
          ? ctas_per_row(pol, batch, tiles)
          : 1;
  if (split <= 1) {
    kernel<<<static_cast<unsigned>(batch), chain_block_threads, 0, pol.stream>>>(rule, in, out,
                                                                                 residual_floor);
    return cudaGetLastError();
  }
  auto* sums = static_cast<double*>(pol.workspace);
  chain_split_tiles_kernel<Rule, Input, Output>
      <<<dim3(static_cast<unsigned>(batch), static_cast<unsigned>(split)), chain_block_threads, 0,
         pol.stream>>>(rule, in, out, residual_floor, sums, tiles);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  chain_split_finish_kernel<Rule, Input, Output>
      <<<static_cast<unsigned>(batch), chain_block_threads, 0, pol.stream>>>(
          rule, in, out, residual_floor, sums, tiles);
  return cudaGetLastError();
}

}  // namespace detail

/// Enqueues chain verification of a flattened (ragged) batch on pol.stream. All pointers in
/// `in` and `out` are device pointers; extents are those of the host API. Returns the launch
/// status without synchronising, or cudaErrorInvalidValue without launching when the extents
/// are inconsistent (rows not vocab_size long or with a stride below it, arrays missing or
/// shorter than the batch needs), the workspace is not aligned for doubles, or the rule's data
/// is not readable by the device (detail::check_rule: per_request arrays of at least B rules,
/// neighbour tables of V rows, custom schedules; in device memory). Per-request problems (bad
/// tokens, offsets outside the arrays) are reported in out.flags.
///
/// CTAs per request (pol.row_split; see par_policy): with 1, or without a workspace of
/// chain_workspace_bytes(B, V), one CTA verifies each request. Otherwise the stopping row's
/// tile sums are split across several CTAs per request (two kernel launches) — automatically
/// when the batch leaves most SMs idle. Both paths give the same bits.
template <class T, batch_chain_rule Rule = exact_rule>
cudaError_t verify_chain_async(const par_policy& pol, const chain_batch_input<T>& in,
                               const chain_batch_output& out, const chain_options& options = {},
                               const Rule& rule = {}) {
  if (specula::detail::flattened_batch(in.draft_offsets) == 0) return cudaSuccess;  // B = 0
  if (const cudaError_t e = detail::check_vocab(in.vocab_size); e != cudaSuccess) return e;
  if (const cudaError_t e = detail::check_flattened(in, out, true); e != cudaSuccess) return e;
  return detail::launch_chain(pol, in, out, options.residual_floor, rule, in.draft_offsets.size - 1,
                              detail::chain_flattened_kernel<Rule, T>);
}

/// Enqueues chain verification of a padded [B, L, V] batch (device pointers). Returns
/// cudaErrorInvalidValue without launching for inconsistent extents, a workspace not aligned
/// for doubles, or a rule whose data the device cannot read (detail::check_rule). CTAs per
/// request as the flattened layout's (the same split path, the same bits).
template <class T, batch_chain_rule Rule = exact_rule>
cudaError_t verify_chain_async(const par_policy& pol, const padded_chain_input<T>& in,
                               const padded_chain_output& out, const chain_options& options = {},
                               const Rule& rule = {}) {
  if (in.batch_size == 0) return cudaSuccess;  // B = 0 is a no-op
  if (const cudaError_t e = detail::check_vocab(in.vocab_size); e != cudaSuccess) return e;
  if (const cudaError_t e = detail::check_padded(in, out); e != cudaSuccess) return e;
  return detail::launch_chain(pol, in, out, options.residual_floor, rule, in.batch_size,
                              detail::chain_padded_kernel<Rule, T>);
}

/// Enqueues greedy chain verification of a flattened batch (rows may be logits).
template <class T>
cudaError_t verify_chain_greedy_async(const par_policy& pol, const chain_batch_input<T>& in,
                                      const chain_batch_output& out) {
  if (specula::detail::flattened_batch(in.draft_offsets) == 0) return cudaSuccess;  // B = 0
  if (in.vocab_size <= 0) return cudaErrorInvalidValue;
  if (const cudaError_t e = detail::check_flattened(in, out, false); e != cudaSuccess) return e;
  const index_t batch = in.draft_offsets.size - 1;
  detail::greedy_chain_kernel<T>
      <<<static_cast<unsigned>(batch), chain_block_threads, 0, pol.stream>>>(in, out);
  return cudaGetLastError();
}

/// Host wrapper: enqueues verify_chain_async and throws cuda_error if the launch failed.
template <class Input, class Output, class Rule = exact_rule>
void verify_chain(const par_policy& pol, const Input& in, const Output& out,
                  const chain_options& options = {}, const Rule& rule = {}) {
  throw_on_error(verify_chain_async(pol, in, out, options, rule), "verify_chain");
}

SPECULA_CUDA_NAMESPACE_END
