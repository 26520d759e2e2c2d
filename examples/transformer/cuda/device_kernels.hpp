#pragma once

// The kernels of the device forward pass (device_kernels.cu), behind plain launchers so that the
// host side (device_transformer.cpp) is compiled by the C++ compiler and only this small
// translation unit by nvcc. Every launcher enqueues on `stream` and returns cudaGetLastError().

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::example::device_detail {

/// One evaluation block as the kernels see it: rows [row_begin, row_begin + n) of the batch,
/// `ctx` committed slots in the cache `kv` (layout [layer][keys, values][capacity][kv_dim]),
/// mask rows of `words` words at `mask_offset` of the batch's mask array. With `stash`, the
/// block's keys/values are also written to slots ctx, ctx + 1, ... (its pending nodes).
struct attn_block {
  float* kv;
  std::int32_t row_begin, n, ctx, capacity, words, mask_offset, stash, pad;
};

/// The model's shape as the kernels need it.
struct shape {
  std::int32_t d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab;
};

/// y[rows x out] (row stride ldy) = beta * y + x[rows x in] (row stride ldx) * W^T, W [out x in]
/// row-major (the file's layout); beta 0 or 1.
cudaError_t linear(cudaStream_t stream, const float* x, int ldx, int rows, int in, const float* w,
                   int out, float* y, int ldy, float beta);
cudaError_t embed(cudaStream_t stream, const std::int32_t* tokens, const float* table, float* x,
                  int rows, int d);
cudaError_t rms_norm(cudaStream_t stream, const float* x, const float* weight, float eps,
                     float* out, int rows, int d);
/// qkv rows [q | k | v] -> q (RoPE), k (RoPE), v, and the stash of each block's keys/values.
cudaError_t rope_scatter(cudaStream_t stream, const shape& s, const float* qkv,
                         const std::int32_t* positions, const std::int32_t* row_block,
                         const attn_block* blocks, const float* cos_table, const float* sin_table,
                         float* q, float* k, float* v, int rows, int layer);
/// One CTA per (row, head): softmax(q k^T * scale) v over the block's committed slots and the
/// block nodes its mask row allows; `max_keys` bounds ctx + n over the blocks.
cudaError_t attention(cudaStream_t stream, const shape& s, const float* q, const float* k,
                      const float* v, const std::int32_t* row_block, const attn_block* blocks,
                      const std::uint64_t* mask, float* out, int rows, int layer, float scale,
                      int max_keys);
/// Rows [gate | up] of 2 d_ff values: gate <- silu(gate) * up.
cudaError_t swiglu(cudaStream_t stream, float* gate_up, int rows, int d_ff);
/// For each of `planes` planes of `capacity` rows of `row_size` floats: row at + k <- row
/// from[k], k ascending (from[k] >= at + k).
cudaError_t gather_rows(cudaStream_t stream, float* data, int planes, int capacity, int row_size,
                        int at, const std::int32_t* from, int count);

/// Logits [limit, vocab) of each of `rows` rows set to -inf (detail::vocab_limit_op, one CTA per
/// row; vocab_limit.hpp).
cudaError_t vocab_limit(cudaStream_t stream, float* logits, int rows, int vocab, int limit);

/// out[r] <- the largest of the `vocab` entries of row r, for `rows` rows (one CTA per row).
cudaError_t row_max(cudaStream_t stream, const float* data, int rows, int vocab, float* out);

/// out[r] <- specula::detail::top_of(row r) for `rows` rows of `vocab` logits (one thread per
/// row). `out` points to specula::detail::row_top entries.
cudaError_t row_tops(cudaStream_t stream, const float* logits, int rows, int vocab, void* out);

}  // namespace specula::example::device_detail
