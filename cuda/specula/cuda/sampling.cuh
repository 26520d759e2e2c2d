#pragma once

/// @file
/// Sampling on the GPU.
///
/// **One token per row** (the device counterparts of include/specula/sample/sampling.hpp):
/// sample_from_probs_async (FlashInfer's sampling_from_probs) and sample_from_logits_async
/// (top_k_top_p_sampling_from_logits: the logits_to_probs_async pipeline with per-row
/// sampling_params, then the draw; rows flagged in is_greedy take the arg-max of their logits).
/// One CTA per row runs the host's own sampling step, detail::sample_weights, with CTA-wide
/// passes (block_passes.cuh: the host's summation order): the row's tile sums, then the
/// inverse-CDF index of the uniform at sample_draw of the row's stream. So
/// sample_from_probs_async returns the host sample_from_probs's tokens, bit for bit, and
/// sample_from_logits_async the tokens of logits_to_probs_async followed by
/// sample_from_probs_async (the probabilities are computed by the same device function, one
/// entry at a time, without a probability tensor).
///
/// **Without replacement** (below): the device counterpart of
/// specula::sample_without_replacement_keys (include/specula/sample/without_replacement.hpp).
///
/// Each category i with weight w_i > 0 gets the exponential key E_i / w_i, E_i from the
/// per-category Philox slots of the row's stream (the host's exponential_key_from_bits); the k
/// smallest keys, in ascending order, are the k categories a sequential draw without replacement
/// would produce (Efraimidis–Spirakis; the Gumbel-top-k trick in exponential form).
///
/// Kernel shape: a CTA scans its part of the row in groups of 4 consecutive categories (one
/// Philox call per group), each thread keeping its k best (key, index) pairs; the CTA then merges
/// its threads' lists by k rounds of a block-wide minimum. With one CTA per row that is the
/// result. When the batch is small (par_policy::row_split, with a workspace of
/// sample_without_replacement_workspace_bytes) several CTAs take slices of each row and a second
/// kernel merges their lists the same way. Order: smaller key first, then smaller index — the
/// host's order — so every split gives the same categories.
///
/// Guarantee: the device computes the keys with the same formula; the host uses the C library's
/// log and the device CUDA's (both within 1 ulp), so a pair of keys closer than that could be
/// ordered differently. On random inputs the outputs equal the host's (tested).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cub/block/block_reduce.cuh>

#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/status.hpp"
#include "specula/core/types.hpp"
#include "specula/cuda/block_passes.cuh"
#include "specula/cuda/config.cuh"
#include "specula/cuda/error.cuh"
#include "specula/cuda/launch_checks.cuh"
#include "specula/cuda/policy.cuh"
#include "specula/cuda/transforms.cuh"
#include "specula/sample/random_source.hpp"
#include "specula/sample/sampling.hpp"
#include "specula/sample/without_replacement.hpp"

SPECULA_CUDA_NAMESPACE_BEGIN

/// Threads per CTA of the sampling kernels.
inline constexpr int sample_block_threads = 256;
/// Largest k of sample_without_replacement_async.
inline constexpr index_t sample_max_k = 16;

/// A selected category and its key.
struct keyed_index {
  double key;
  index_t index;  ///< -1: empty slot
};

/// Workspace bytes for the split path of sample_without_replacement_async (rows x at most 64
/// slices x k entries).
[[nodiscard]] inline std::size_t sample_without_replacement_workspace_bytes(index_t rows,
                                                                            index_t k) noexcept {
  return static_cast<std::size_t>(rows) * 64u * static_cast<std::size_t>(k) * sizeof(keyed_index);
}

namespace detail {

__device__ inline bool key_before(const keyed_index& a, const keyed_index& b) {
  if (a.index < 0) return false;
  if (b.index < 0) return true;
  return a.key < b.key || (a.key == b.key && a.index < b.index);
}

struct keyed_min {
  __device__ keyed_index operator()(const keyed_index& a, const keyed_index& b) const {
    return key_before(b, a) ? b : a;
  }
};

/// A thread's k best entries, sorted.
struct local_best {
  keyed_index e[sample_max_k];
  index_t k;

  __device__ explicit local_best(index_t kk) : k(kk) {
    for (index_t j = 0; j < sample_max_k; ++j) e[j] = {0.0, -1};
  }
  __device__ void offer(const keyed_index& c) {
    if (!key_before(c, e[k - 1])) return;
    index_t j = k - 1;
    while (j > 0 && key_before(c, e[j - 1])) {
      e[j] = e[j - 1];
      --j;
    }
    e[j] = c;
  }
};

/// Merges every thread's sorted list (each thread's `head` walks its own list) into the block's
/// k best; calls emit(j, entry) in thread 0 for j = 0 .. k-1.
template <class Next, class Emit>
__device__ void block_merge(index_t k, Next&& next, Emit&& emit) {
  using reduce = cub::BlockReduce<keyed_index, sample_block_threads>;
  __shared__ typename reduce::TempStorage tmp;
  __shared__ keyed_index winner;
  keyed_index head = next();
  for (index_t j = 0; j < k; ++j) {
    const keyed_index best = reduce(tmp).Reduce(head, keyed_min{});
    if (threadIdx.x == 0) {
      winner = best;
      emit(j, best);
    }
    __syncthreads();
    const keyed_index w = winner;
    if (w.index >= 0 && head.index == w.index) head = next();
    __syncthreads();
  }
}

template <class T>
SPECULA_KERNEL void __launch_bounds__(sample_block_threads)
    wor_select_kernel(batch_view<const T> weights, index_t k, row_view<const request_rng> rng,
                      std::uint32_t position, keyed_index* slices, token_t* out_tokens,
                      std::int32_t* out_counts) {
  const auto r = static_cast<index_t>(blockIdx.x);
  const auto split = static_cast<index_t>(gridDim.y);
  const auto part = static_cast<index_t>(blockIdx.y);
  const index_t n = weights.cols;
  const index_t groups = (n + 3) / 4;
  const index_t g0 = part * groups / split;
  const index_t g1 = (part + 1) * groups / split;
  const auto row = weights.row(r);
  local_best best(k);
  for (index_t g = g0 + threadIdx.x; g < g1; g += sample_block_threads) {
    const u32x4 bits = exponential_key_bits(rng[r], position, 4 * g);
    for (int j = 0; j < 4; ++j) {
      const index_t i = 4 * g + j;
      if (i >= n) break;
      const double wi = static_cast<double>(row[i]);
      if (!(wi > 0.0)) continue;
      best.offer({exponential_key_from_bits(bits.v[j], wi), i});
    }
  }
  index_t taken = 0;
  auto next = [&]() -> keyed_index { return taken < k ? best.e[taken++] : keyed_index{0.0, -1}; };
  if (slices != nullptr) {
    keyed_index* out = slices + (r * split + part) * k;
    block_merge(k, next, [&](index_t j, const keyed_index& e) { out[j] = e; });
  } else {
    std::int32_t count = 0;
    block_merge(k, next, [&](index_t j, const keyed_index& e) {
      out_tokens[r * k + j] = e.index >= 0 ? static_cast<token_t>(e.index) : no_token;
      if (e.index >= 0) ++count;
      if (j == k - 1) out_counts[r] = count;
    });
  }
}

/// A template (of the block size) so that, like every kernel of these headers, it may be defined
/// in several translation units of one program (a plain kernel defined in a header is a
/// multiple definition at link time).
template <int Threads = sample_block_threads>
SPECULA_KERNEL void __launch_bounds__(Threads)
    wor_merge_kernel(index_t k, index_t split, const keyed_index* slices, token_t* out_tokens,
                     std::int32_t* out_counts) {
  static_assert(Threads == sample_block_threads, "block_merge reduces over sample_block_threads");
  const auto r = static_cast<index_t>(blockIdx.x);
  const index_t s = threadIdx.x;
  const keyed_index* list = slices + (r * split + s) * k;
  index_t taken = 0;
  auto next = [&]() -> keyed_index {
    return s < split && taken < k ? list[taken++] : keyed_index{0.0, -1};
  };
  std::int32_t count = 0;
  block_merge(k, next, [&](index_t j, const keyed_index& e) {
    out_tokens[r * k + j] = e.index >= 0 ? static_cast<token_t>(e.index) : no_token;
    if (e.index >= 0) ++count;
    if (j == k - 1) out_counts[r] = count;
  });
}

}  // namespace detail

/// Enqueues sampling of k distinct categories per row without replacement (see file comment).
///
/// - `weights`: [rows, V] device rows of non-negative weights (probabilities; entries <= 0 and
///   NaN are never drawn);
/// - `rng`: one stream per row; `position`: the draw position (as on the host);
/// - `out_tokens`: rows x k device tokens, in draw order, -1 past the row's count;
/// - `out_counts`: rows device counts (min(k, positive weights)).
///
/// No rows: a no-op (cudaSuccess, nothing read or written). Otherwise returns
/// cudaErrorInvalidValue without launching for k outside [1, sample_max_k],
/// inconsistent extents, null data, a row stride below the row length, or a workspace not
/// aligned for keyed_index.
template <class T>
cudaError_t sample_without_replacement_async(const par_policy& pol, batch_view<const T> weights,
                                             index_t k, row_view<const request_rng> rng,
                                             std::uint32_t position, row_view<token_t> out_tokens,
                                             row_view<std::int32_t> out_counts) {
  if (weights.rows == 0) return cudaSuccess;  // an empty batch is a no-op, as everywhere
  detail::launch_check c;
  c.require(k >= 1 && k <= sample_max_k && weights.cols > 0)
      .grid(weights.rows)
      .rows(weights, weights.cols, weights.rows)
      .array(rng, weights.rows)
      .array(out_tokens, weights.rows * k)
      .array(out_counts, weights.rows)
      .aligned(pol.workspace, alignof(keyed_index));
  if (const cudaError_t e = c.status(); e != cudaSuccess) return e;
  const index_t groups = (weights.cols + 3) / 4;
  int split = 1;
  if (pol.workspace != nullptr &&
      pol.workspace_bytes >= sample_without_replacement_workspace_bytes(weights.rows, k))
    split = detail::ctas_per_row(pol, weights.rows, groups / sample_block_threads);
  if (split <= 1) {
    detail::wor_select_kernel<T>
        <<<static_cast<unsigned>(weights.rows), sample_block_threads, 0, pol.stream>>>(
            weights, k, rng, position, nullptr, out_tokens.data, out_counts.data);
    return cudaGetLastError();
  }
  auto* slices = static_cast<keyed_index*>(pol.workspace);
  detail::wor_select_kernel<T>
      <<<dim3(static_cast<unsigned>(weights.rows), static_cast<unsigned>(split)),
         sample_block_threads, 0, pol.stream>>>(weights, k, rng, position, slices, nullptr,
                                                nullptr);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  detail::wor_merge_kernel<>
      <<<static_cast<unsigned>(weights.rows), sample_block_threads, 0, pol.stream>>>(
          k, split, slices, out_tokens.data, out_counts.data);
  return cudaGetLastError();
}

/// Threads per CTA of sample_from_probs_async (one CTA per row).
inline constexpr int sample_rows_threads = 256;
/// Tile sums the row samplers keep in shared memory (rows up to sample_rows_max_tiles * 256
/// entries walk recorded sums; longer rows recompute the rest during the draw, as the host).
inline constexpr index_t sample_rows_max_tiles = 4096;

namespace detail {

/// Writes row r's token and status (thread 0).
__device__ inline void write_sampled(index_t r, token_t token, std::uint32_t status_code,
                                     token_t* out, std::uint32_t* row_status) {
  if (threadIdx.x != 0) return;
  out[r] = token;
  if (row_status != nullptr) row_status[r] = status_code;
}

template <class T>
SPECULA_KERNEL void __launch_bounds__(sample_rows_threads)
    sample_probs_kernel(batch_view<const T> probs, row_view<const request_rng> rng, token_t* out,
                        std::uint32_t* row_status) {
  __shared__ block_passes_storage<sample_rows_threads, sample_rows_max_tiles> storage;
  const block_passes<sample_rows_threads> passes(storage);
  const auto r = static_cast<index_t>(blockIdx.x);
  const row_view<const T> row = probs.row(r);
  // The weights of the host's sampler; each thread also notes whether an entry it summed is
  // NaN, infinite or negative (the summing pass covers every entry once).
  bool bad = false;
  const auto w = [&](index_t i) {
    const double v = static_cast<double>(row[i]);
    bad = bad || !(v >= 0.0 && v - v == 0.0);
    return specula::detail::row_weights<T>{row}(i);
  };
  philox_source src{rng[r]};
  const index_t token = specula::detail::sample_weights(src, row.size, w, passes);
  if (__syncthreads_or(bad ? 1 : 0) != 0 || token < 0) {
    // The failure path: the first offending entry decides, as on the host (every thread scans
    // the row; only a failing row pays for it).
    const diagnostic d = specula::detail::check_weight_row(row, r);
    write_sampled(r, no_token, static_cast<std::uint32_t>(d.ok() ? status::no_mass : d.code), out,
                  row_status);
    return;
  }
  write_sampled(r, static_cast<token_t>(token), 0u, out, row_status);
}

/// Shared memory of sample_logits_kernel: the transform's passes, then the sampling passes.
template <int Block>
union sample_logits_shared {
  transforms_detail::transform_shared<Block> transform;
  block_passes_storage<Block, sample_rows_max_tiles> passes;
};

template <class T, int Block>
SPECULA_KERNEL void __launch_bounds__(Block)
    sample_logits_kernel(batch_view<const T> logits, row_view<const sampling_params> params,
                         row_view<const request_rng> rng, const std::uint8_t* is_greedy,
                         token_t* out, std::uint32_t* row_status) {
  __shared__ sample_logits_shared<Block> sh;
  const auto r = static_cast<index_t>(blockIdx.x);
  const index_t n = logits.cols;  // > 0 (launch check)
  const sampling_params sp = params.data[params.size == 1 ? 0 : r];
  if (is_greedy != nullptr && is_greedy[r] != 0) {
    // The arg-max of the logits as given (the host's greedy rows), ties to the lowest id; NaN,
    // +Inf, rows of -Inf only and invalid parameters fail as in the sampled rows.
    const transforms_detail::logit_source<T> src{logits.data + r * logits.row_stride, nullptr,
                                                 cfg_mix_op{1.0f}, temperature_op{1.0f}, false};
    std::uint32_t code = static_cast<std::uint32_t>(status::invalid_parameter);
    if (transforms_detail::valid_params(sp))
      code = transforms_detail::scan_status(
          transforms_detail::scan_row<Block>(src, n, sh.transform), n);
    __syncthreads();  // the scan's shared memory becomes the passes'
    if (code != 0u) {
      write_sampled(r, no_token, code, out, row_status);
      return;
    }
    const block_passes<Block> passes(sh.passes);
    const index_t best = passes.argmax(transforms_detail::mixed_logit_row<T>{src, n});
    write_sampled(r, static_cast<token_t>(best), 0u, out, row_status);
    return;
  }
  const auto src = transforms_detail::row_source(logits, batch_view<const T>{}, sp, r);
  const transforms_detail::row_transform t =
      transforms_detail::compute_row_transform<T, Block>(src, sp, n, sh.transform);
  __syncthreads();  // the transform's shared memory becomes the passes'
  if (t.status != 0u) {
    write_sampled(r, no_token, t.status, out, row_status);
    return;
  }
  // The probabilities logits_to_probs_async would write, one entry at a time.
  const transforms_detail::transformed_row<T> row{src, t, n};
  const block_passes<Block> passes(sh.passes);
  philox_source ps{rng[r]};
  const index_t token = specula::detail::sample_weights(
      ps, n, specula::detail::row_weights<float, transforms_detail::transformed_row<T>>{row},
      passes);
  write_sampled(r, static_cast<token_t>(token), 0u, out, row_status);
}

/// Launch checks shared by the row samplers: a grid of `rows` CTAs, rows of 1 .. 2^31 - 1
/// entries with data and a stride of at least the row length, one stream and one output per
/// row.
template <class T>
launch_check check_sample_rows(batch_view<const T> input, row_view<const request_rng> rng,
                               row_view<token_t> out) {
  launch_check c;
  c.grid(input.rows)
      .require(input.cols >= 1 && input.cols <= max_grid_x)
      .rows(input, input.cols, input.rows)
      .array(rng, input.rows)
      .array(out, input.rows);
  return c;
}

}  // namespace detail

/// Enqueues one draw per row of `probs` (device rows of non-negative weights, float or double;
/// they need not sum to 1): out[r] is drawn from row r with `rng[r]` at sample_draw, the token
/// the host's sample_from_probs returns for the same row and stream. `row_status` (device, one
/// per row, or null) receives specula::status as std::uint32_t: 0, or nan_value / inf_value /
/// negative_value for the row's first bad entry, or no_mass; a failed row's token is -1.
///
/// No rows: a no-op. Otherwise returns cudaErrorInvalidValue without launching for rows of 0 or
/// more than 2^31 - 1 entries, missing data, a row stride below the row length, or rng / out
/// shorter than the batch; cudaGetLastError() after the launch otherwise. Does not synchronise.
template <class T>
requires(std::is_same_v<T, float> || std::is_same_v<T, double>) cudaError_t
    sample_from_probs_async(const par_policy& pol, batch_view<const T> probs,
                            row_view<const request_rng> rng, row_view<token_t> out,
                            std::uint32_t* row_status = nullptr) {
  if (probs.rows == 0) return cudaSuccess;  // an empty batch is a no-op, as everywhere
  if (const cudaError_t e = detail::check_sample_rows(probs, rng, out).status(); e != cudaSuccess)
    return e;
  detail::sample_probs_kernel<T>
      <<<static_cast<unsigned>(probs.rows), sample_rows_threads, 0, pol.stream>>>(
          probs, rng, out.data, row_status);
  return cudaGetLastError();
}

/// Enqueues one draw per row of `logits` (device rows of float, __half or __nv_bfloat16) after
/// the logits_to_probs_async pipeline with `params[r]` (device; 1 entry, or one per row):
/// temperature, top-k, softmax, top-p, min-p, then a draw with `rng[r]` at sample_draw — the
/// token sample_from_probs_async returns on the probabilities logits_to_probs_async writes.
/// Rows with `is_greedy[r] != 0` (device, one flag per row, or empty: none) take the arg-max of
/// their logits instead (ties: lowest id), with no draw, as the host's sample_from_logits.
/// `row_status`: as logits_to_probs_async's (invalid_parameter, nan_value, inf_value, no_mass),
/// the token of a failed row is -1.
///
/// No rows: a no-op. Otherwise returns cudaErrorInvalidValue without launching for the extents
/// sample_from_probs_async refuses, `params` of neither 1 entry nor one per row (or without
/// data), or a non-empty `is_greedy` shorter than the batch.
template <logit_element T>
cudaError_t sample_from_logits_async(const par_policy& pol, batch_view<const T> logits,
                                     row_view<const sampling_params> params,
                                     row_view<const request_rng> rng, row_view<token_t> out,
                                     row_view<const std::uint8_t> is_greedy = {},
                                     std::uint32_t* row_status = nullptr) {
  if (logits.rows == 0) return cudaSuccess;
  detail::launch_check c = detail::check_sample_rows(logits, rng, out);
  c.require(params.size == 1 || params.size == logits.rows)
      .array(params, 1)
      .optional_array(is_greedy, logits.rows);
  if (const cudaError_t e = c.status(); e != cudaSuccess) return e;
  detail::sample_logits_kernel<T, transforms_block_size>
      <<<static_cast<unsigned>(logits.rows), transforms_block_size, 0, pol.stream>>>(
          logits, params, rng, is_greedy.empty() ? nullptr : is_greedy.data, out.data, row_status);
  return cudaGetLastError();
}

SPECULA_CUDA_NAMESPACE_END
