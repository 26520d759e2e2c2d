#pragma once

/// @file
/// Chain verification on the GPU: the device counterpart of specula/verify/chain.hpp, running
/// the same rule objects, the same Philox draw points and the same fixed summation order as the
/// host backend, so the same inputs and seeds give the same tokens (see docs/cuda.md for the
/// exact guarantee).
///
/// One CTA per request. Thread 0 walks the drafts (one acceptance test per position, reading
/// p(x) and q(x) only); at the stopping position all threads compute the tile sums of the
/// residual (or of the bonus row) in the host's order — tile t covers 256 elements, lane k of 8
/// sums elements t·256 + k + 8j in increasing j, lanes combine as ((l0+l1)+(l2+l3))+
/// ((l4+l5)+(l6+l7)) — and thread 0 adds the tile sums in order and walks them to the sampled
/// tile, exactly like `summarize_weights` + `sample_inverse_cdf` on the host.
///
/// Bad data never causes an out-of-bounds read: a drafted token outside [0, V) (including −1
/// padding inside a request's draft) sets chain_invalid_input for that request; NaN entries
/// count as zero weight; a request whose rows have no mass gets no chain_valid flag and −1 as
/// its emitted token. Rows longer than max_vocab are rejected with cudaErrorInvalidValue.
/// Validation of whole rows (sums, negative entries) is the host's job (validate_chain_batch
/// on host copies) or the caller's; the kernels do not read rows they do not need.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/cuda/config.cuh"
#include "specula/cuda/error.cuh"
#include "specula/cuda/policy.cuh"
#include "specula/rules/exact.hpp"
#include "specula/rules/rule.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/verify/chain.hpp"
#include "specula/verify/chain_core.hpp"

SPECULA_CUDA_NAMESPACE_BEGIN

/// Threads per CTA of the chain kernels (8 lanes × 32 tiles per round).
inline constexpr int chain_block_threads = 256;
/// Longest row the chain kernels accept (tile sums are kept in shared memory: 32 KiB).
inline constexpr index_t chain_max_vocab = 4096 * specula::detail::sum_tile;

namespace detail {

/// Tile sums of weights w over [0, n) into tile_sums[], in the host's fixed order (see file
/// comment). All threads of the block must call it; ends with a barrier.
template <class WeightFn>
__device__ void block_tile_sums(index_t n, const WeightFn& w, double* tile_sums,
                                double* lane_scratch) {
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 7;
  const int slot = tid >> 3;
  constexpr index_t tile = specula::detail::sum_tile;
  const index_t tiles = (n + tile - 1) / tile;
  for (index_t base = 0; base < tiles; base += chain_block_threads / 8) {
    const index_t t = base + slot;
    double acc = 0.0;
    if (t < tiles) {
      const index_t begin = t * tile;
      const index_t end = begin + tile < n ? begin + tile : n;
      for (index_t i = begin + lane; i < end; i += 8) {
        const double wi = w(i);
        acc += wi > 0.0 ? wi : 0.0;
      }
    }
    lane_scratch[tid] = acc;
    __syncthreads();
    if (lane == 0 && t < tiles) {
      const double* l = lane_scratch + slot * 8;
      tile_sums[t] = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    }
    __syncthreads();
  }
}

/// Thread-0 part of a sample: the host's own inverse-CDF walk (specula::detail::walk_tiles)
/// over the tile sums in shared memory — sample_inverse_cdf(n, w, summary, u) on the host.
template <class WeightFn>
__device__ index_t sample_from_tiles(index_t n, const WeightFn& w, const double* tile_sums,
                                     double total, double u) {
  return specula::detail::walk_tiles(n, w, u * total,
                                     [&](index_t k, index_t, index_t) { return tile_sums[k]; });
}

__device__ inline double ordered_total(const double* tile_sums, index_t tiles) {
  double total = 0.0;
  for (index_t t = 0; t < tiles; ++t) total += tile_sums[t];
  return total;
}

/// Shared state of one request's CTA.
struct chain_block_state {
  int mode;      // 0: residual at `stop`, 1: bonus, 2: invalid input
  index_t stop;  // stopping position
  int fallback;  // residual empty: sample p instead
  double total;  // mass of the weights being sampled
  std::uint32_t flags;
  std::int32_t accepted;
};

/// Verifies one request's chain with the whole block (see file comment). `target_row(i)` and
/// `proposal(i)` as in verify_chain_request.
template <class Rule, class TargetRowFn, class ProposalFn>
__device__ void block_verify_chain(const Rule& rule, const request_rng& rng, index_t length,
                                   index_t vocab, const token_t* drafts,
                                   const TargetRowFn& target_row, const ProposalFn& proposal,
                                   double residual_floor, token_t* out_tokens,
                                   std::uint8_t* accepted, std::int32_t* num_accepted,
                                   std::uint32_t* flags, double* tile_sums, double* lane_scratch,
                                   chain_block_state& st) {
  const philox_source src{rng};
  const index_t tiles = (vocab + specula::detail::sum_tile - 1) / specula::detail::sum_tile;
  if (threadIdx.x == 0) {
    st.flags = 0;
    st.accepted = 0;
    st.mode = 1;
    st.stop = length;
    st.fallback = 0;
    for (index_t i = 0; i <= length; ++i) out_tokens[i] = no_token;
    if (accepted != nullptr)
      for (index_t i = 0; i < length; ++i) accepted[i] = 0;
    for (index_t i = 0; i < length; ++i)
      if (drafts[i] < 0 || static_cast<index_t>(drafts[i]) >= vocab) {
        st.mode = 2;
        st.flags |= chain_invalid_input;
      }
    for (index_t i = 0; i < length && st.mode != 2; ++i) {
      const token_t x = drafts[i];
      const auto p = target_row(i);
      const auto q = proposal(i);
      const auto rule_i = bind_rule(rule_at(rule, i), p, x);
      const double a = rule_i.accept_probability(static_cast<double>(p[x]), q(x));
      if (src.bernoulli(a, draw_id{static_cast<std::uint32_t>(i), 0})) {
        out_tokens[i] = x;
        if (accepted != nullptr) accepted[i] = 1;
        st.accepted = static_cast<std::int32_t>(i + 1);
      } else {
        st.mode = 0;
        st.stop = i;
        break;
      }
    }
  }
  __syncthreads();
  const int mode = st.mode;
  const index_t stop = st.stop;
  const auto draw = draw_id{static_cast<std::uint32_t>(stop), 1};
  if (mode == 0) {
    const auto p = target_row(stop);
    const auto q = proposal(stop);
    const token_t x = drafts[stop];
    const auto rule_s = bind_rule(rule_at(rule, stop), p, x);
    auto residual = [&](index_t y) {
      return static_cast<double>(rule_s.residual_weight_at(y, static_cast<double>(p[y]), q(y)));
    };
    block_tile_sums(vocab, residual, tile_sums, lane_scratch);
    if (threadIdx.x == 0) {
      st.total = ordered_total(tile_sums, tiles);
      st.fallback = (st.total > residual_floor && st.total > 0.0) ? 0 : 1;
      if (!st.fallback) {
        const index_t y =
            sample_from_tiles(vocab, residual, tile_sums, st.total, uniform_at(rng, draw));
        out_tokens[stop] = static_cast<token_t>(y);
        if (y >= 0) st.flags |= chain_valid;
      }
    }
    __syncthreads();
  }
  if (mode == 1 || (mode == 0 && st.fallback != 0)) {
    const auto p = target_row(stop);
    const specula::detail::row_weights<typename decltype(p)::value_type> w{p};
    block_tile_sums(vocab, w, tile_sums, lane_scratch);
    if (threadIdx.x == 0) {
      if (mode == 1)
        st.flags |= chain_bonus;
      else
        st.flags |= chain_residual_fallback;
      st.total = ordered_total(tile_sums, tiles);
      if (st.total > 0.0) {
        const index_t y = sample_from_tiles(vocab, w, tile_sums, st.total, uniform_at(rng, draw));
        out_tokens[stop] = static_cast<token_t>(y);
        if (y >= 0) st.flags |= chain_valid;
      }
    }
  }
  if (threadIdx.x == 0) {
    *num_accepted = st.accepted;
    if (flags != nullptr) *flags = st.flags;
  }
}

/// One segment (either layout) with the whole block: dense or one-hot proposals, as the host's
/// specula::detail::run_segment. Outputs start at out_tokens/accepted of the segment.
template <class Rule, class T>
__device__ void block_verify_segment(const Rule& rule, const request_rng& rng,
                                     const specula::detail::chain_segment& s, index_t vocab,
                                     const token_t* tokens, batch_view<const T> draft_probs,
                                     batch_view<const T> target_probs, double residual_floor,
                                     token_t* out_tokens, std::uint8_t* accepted,
                                     std::int32_t* num_accepted, std::uint32_t* flags,
                                     double* tile_sums, double* lane_scratch,
                                     chain_block_state& st) {
  const token_t* drafts = tokens + s.draft_row;
  auto target_row = [&](index_t i) { return target_probs.row(s.target_row + i); };
  auto run = [&](const auto& proposal) {
    block_verify_chain(rule, rng, s.length, vocab, drafts, target_row, proposal, residual_floor,
                       out_tokens, accepted, num_accepted, flags, tile_sums, lane_scratch, st);
  };
  if (draft_probs.rows > 0)
    run([&](index_t i) { return dense_proposal<T>{draft_probs.row(s.draft_row + i)}; });
  else
    run([&](index_t i) { return one_hot_proposal{drafts[i]}; });
}

template <class Rule, class T>
SPECULA_KERNEL void __launch_bounds__(chain_block_threads)
    chain_flattened_kernel(Rule rule, chain_batch_input<T> in, chain_batch_output out,
                           double residual_floor) {
  extern __shared__ double tile_sums[];
  __shared__ double lane_scratch[chain_block_threads];
  __shared__ chain_block_state st;
  const auto b = static_cast<index_t>(blockIdx.x);
  const auto s = specula::detail::flattened_segment(in.draft_offsets, b);
  block_verify_segment(
      specula::detail::request_rule(rule, b), in.rng[b], s, in.vocab_size, in.draft_tokens.data,
      in.draft_probs, in.target_probs, residual_floor, out.output_tokens.data + s.target_row,
      out.accepted.empty() ? nullptr : out.accepted.data + s.draft_row, out.num_accepted.data + b,
      out.flags.empty() ? nullptr : out.flags.data + b, tile_sums, lane_scratch, st);
}

template <class Rule, class T>
SPECULA_KERNEL void __launch_bounds__(chain_block_threads)
    chain_padded_kernel(Rule rule, padded_chain_input<T> in, padded_chain_output out,
                        double residual_floor) {
  extern __shared__ double tile_sums[];
  __shared__ double lane_scratch[chain_block_threads];
  __shared__ chain_block_state st;
  __shared__ index_t length;
  const auto b = static_cast<index_t>(blockIdx.x);
  const index_t len_max = in.max_draft;
  if (threadIdx.x == 0) {
    // Lengths from draft_lengths (clamped to [0, L]) or up to the first -1.
    index_t n = in.draft_lengths.empty()
                    ? specula::detail::padded_length(in.draft_tokens, in.draft_lengths, len_max, b)
                    : static_cast<index_t>(in.draft_lengths[b]);
    length = n < 0 ? 0 : (n > len_max ? len_max : n);
  }
  __syncthreads();
  const index_t n = length;
  const specula::detail::chain_segment s{n, b * len_max, b * (len_max + 1)};
  std::uint8_t* acc = out.accepted.empty() ? nullptr : out.accepted.data + b * len_max;
  token_t* outp = out.output_tokens.data + b * (len_max + 1);
  block_verify_segment(
      specula::detail::request_rule(rule, b), in.rng[b], s, in.vocab_size, in.draft_tokens.data,
      in.draft_probs, in.target_probs, residual_floor, outp, acc, out.num_accepted.data + b,
      out.flags.empty() ? nullptr : out.flags.data + b, tile_sums, lane_scratch, st);
  if (threadIdx.x == 0) {
    for (index_t i = n + 1; i <= len_max; ++i) outp[i] = no_token;
    if (acc != nullptr)
      for (index_t i = n; i < len_max; ++i) acc[i] = 0;
  }
}

/// Greedy chain verification of one request with the whole block: block-wide argmax (lowest
/// index on ties, NaN skipped) of each needed row.
template <class T>
__device__ index_t block_argmax(row_view<const T> row, double* value_scratch,
                                index_t* index_scratch) {
  const int tid = static_cast<int>(threadIdx.x);
  index_t best = -1;
  double best_v = 0.0;
  for (index_t i = tid; i < row.size; i += chain_block_threads) {
    const double v = static_cast<double>(row[i]);
    if (v != v) continue;
    if (best < 0 || v > best_v) {
      best = i;
      best_v = v;
    }
  }
  value_scratch[tid] = best_v;
  index_scratch[tid] = best;
  __syncthreads();
  for (int stride = chain_block_threads / 2; stride > 0; stride /= 2) {
    if (tid < stride) {
      const index_t oi = index_scratch[tid + stride];
      const double ov = value_scratch[tid + stride];
      const index_t mi = index_scratch[tid];
      if (oi >= 0 && (mi < 0 || ov > value_scratch[tid] || (ov == value_scratch[tid] && oi < mi))) {
        index_scratch[tid] = oi;
        value_scratch[tid] = ov;
      }
    }
    __syncthreads();
  }
  const index_t r = index_scratch[0];
  __syncthreads();
  return r;
}

template <class T>
SPECULA_KERNEL void __launch_bounds__(chain_block_threads)
    greedy_chain_kernel(chain_batch_input<T> in, chain_batch_output out) {
  __shared__ double value_scratch[chain_block_threads];
  __shared__ index_t index_scratch[chain_block_threads];
  __shared__ int done;
  const auto b = static_cast<index_t>(blockIdx.x);
  const auto s = specula::detail::flattened_segment(in.draft_offsets, b);
  token_t* outp = out.output_tokens.data + s.target_row;
  std::uint8_t* acc = out.accepted.empty() ? nullptr : out.accepted.data + s.draft_row;
  if (threadIdx.x == 0) {
    for (index_t i = 0; i <= s.length; ++i) outp[i] = no_token;
    if (acc != nullptr)
      for (index_t i = 0; i < s.length; ++i) acc[i] = 0;
    done = 0;
  }
  __syncthreads();
  index_t i = 0;
  std::uint32_t fl = 0;
  for (; i <= s.length; ++i) {
    const index_t a =
        block_argmax(in.target_probs.row(s.target_row + i), value_scratch, index_scratch);
    if (threadIdx.x == 0) {
      const bool last = i == s.length;
      const token_t x = last ? no_token : in.draft_tokens[s.draft_row + i];
      if (!last && (x < 0 || static_cast<index_t>(x) >= in.vocab_size)) {
        fl |= chain_invalid_input;
        done = 1;
      } else if (!last && a == static_cast<index_t>(x)) {
        outp[i] = x;
        if (acc != nullptr) acc[i] = 1;
      } else {
        outp[i] = static_cast<token_t>(a);
        if (a >= 0) fl |= chain_valid;
        if (last) fl |= chain_bonus;
        done = 1;
      }
    }
    __syncthreads();
    if (done != 0) break;
  }
  if (threadIdx.x == 0) {
    out.num_accepted[b] = static_cast<std::int32_t>((fl & chain_invalid_input) != 0 ? 0 : i);
    if (!out.flags.empty()) out.flags[b] = fl;
  }
}

inline cudaError_t check_vocab(index_t vocab) {
  return (vocab <= 0 || vocab > chain_max_vocab) ? cudaErrorInvalidValue : cudaSuccess;
}

inline std::size_t tile_bytes(index_t vocab) {
  return static_cast<std::size_t>((vocab + specula::detail::sum_tile - 1) /
                                  specula::detail::sum_tile) *
         sizeof(double);
}

}  // namespace detail

/// Enqueues chain verification of a flattened (ragged) batch on pol.stream. All pointers in
/// `in` and `out` are device pointers; extents are those of the host API. Returns the launch
/// status without synchronising. Per-request problems are reported in out.flags.
template <class T, batch_chain_rule Rule = exact_rule>
cudaError_t verify_chain_async(const par_policy& pol, const chain_batch_input<T>& in,
                               const chain_batch_output& out, const chain_options& options = {},
                               const Rule& rule = {}) {
  if (const cudaError_t e = detail::check_vocab(in.vocab_size); e != cudaSuccess) return e;
  const index_t batch = in.draft_offsets.size - 1;
  if (batch <= 0) return cudaErrorInvalidValue;
  detail::chain_flattened_kernel<Rule, T>
      <<<static_cast<unsigned>(batch), chain_block_threads, detail::tile_bytes(in.vocab_size),
         pol.stream>>>(rule, in, out, options.residual_floor);
  return cudaGetLastError();
}

/// Enqueues chain verification of a padded [B, L, V] batch (device pointers).
template <class T, batch_chain_rule Rule = exact_rule>
cudaError_t verify_chain_async(const par_policy& pol, const padded_chain_input<T>& in,
                               const padded_chain_output& out, const chain_options& options = {},
                               const Rule& rule = {}) {
  if (const cudaError_t e = detail::check_vocab(in.vocab_size); e != cudaSuccess) return e;
  if (in.batch_size <= 0 || in.max_draft < 0) return cudaErrorInvalidValue;
  detail::chain_padded_kernel<Rule, T>
      <<<static_cast<unsigned>(in.batch_size), chain_block_threads,
         detail::tile_bytes(in.vocab_size), pol.stream>>>(rule, in, out, options.residual_floor);
  return cudaGetLastError();
}

/// Enqueues greedy chain verification of a flattened batch (rows may be logits).
template <class T>
cudaError_t verify_chain_greedy_async(const par_policy& pol, const chain_batch_input<T>& in,
                                      const chain_batch_output& out) {
  if (in.vocab_size <= 0) return cudaErrorInvalidValue;
  const index_t batch = in.draft_offsets.size - 1;
  if (batch <= 0) return cudaErrorInvalidValue;
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
