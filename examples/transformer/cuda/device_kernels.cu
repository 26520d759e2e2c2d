// The kernels of the device forward pass (see device_kernels.hpp). fp32 throughout.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "device_kernels.hpp"
#include "specula/decode/row_top.hpp"
#include "specula_example/vocab_limit.hpp"

namespace specula::example::device_detail {
namespace {

constexpr int threads = 128;

__device__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

/// Sum (or max) over the CTA; every thread gets the result. `red` holds 32 floats.
template <bool Max>
__device__ float block_reduce(float x, float* red) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = Max ? warp_max(x) : warp_sum(x);
  __syncthreads();  // red may still be read by an earlier reduction
  if (lane == 0) red[warp] = x;
  __syncthreads();
  float y = lane < warps ? red[lane] : (Max ? -INFINITY : 0.0f);
  y = Max ? warp_max(y) : warp_sum(y);
  return y;
}

__global__ void embed_kernel(const std::int32_t* tokens, const float* table, float* x, int d) {
  const int r = blockIdx.x;
  const float* src = table + static_cast<std::size_t>(tokens[r]) * d;
  for (int t = threadIdx.x; t < d; t += blockDim.x) x[static_cast<std::size_t>(r) * d + t] = src[t];
}

__global__ void rms_norm_kernel(const float* x, const float* w, float eps, float* out, int d) {
  __shared__ float red[32];
  const float* xr = x + static_cast<std::size_t>(blockIdx.x) * d;
  float ss = 0.0f;
  for (int t = threadIdx.x; t < d; t += blockDim.x) ss += xr[t] * xr[t];
  ss = block_reduce<false>(ss, red);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  float* o = out + static_cast<std::size_t>(blockIdx.x) * d;
  for (int t = threadIdx.x; t < d; t += blockDim.x) o[t] = __fmul_rn(__fmul_rn(xr[t], scale), w[t]);
}

/// Rotate-half RoPE of the pair (x0, x1) = (v[i], v[i + half]), products rounded on their own
/// (as the host's loop, which is not contracted into FMAs).
__device__ void rope_pair(const float* in, float* out, int i, int half, float c, float s) {
  const float x0 = in[i], x1 = in[i + half];
  out[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  out[i + half] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

__global__ void rope_scatter_kernel(shape s, const float* qkv, const std::int32_t* positions,
                                    const std::int32_t* row_block, const attn_block* blocks,
                                    const float* cos_table, const float* sin_table, float* q,
                                    float* k, float* v, int layer) {
  const int r = blockIdx.x;
  const attn_block b = blocks[row_block[r]];
  const int hd = s.head_dim, half = hd / 2, qd = s.n_heads * hd, kvd = s.n_kv_heads * hd;
  const float* in = qkv + static_cast<std::size_t>(r) * (qd + 2 * kvd);
  const float* cs = cos_table + static_cast<std::size_t>(positions[r]) * half;
  const float* sn = sin_table + static_cast<std::size_t>(positions[r]) * half;
  float* kr = k + static_cast<std::size_t>(r) * kvd;
  float* vr = v + static_cast<std::size_t>(r) * kvd;
  for (int idx = threadIdx.x; idx < s.n_heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    rope_pair(in + h * hd, q + static_cast<std::size_t>(r) * qd + h * hd, i, half, cs[i], sn[i]);
  }
  for (int idx = threadIdx.x; idx < s.n_kv_heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    rope_pair(in + qd + h * hd, kr + h * hd, i, half, cs[i], sn[i]);
  }
  for (int idx = threadIdx.x; idx < kvd; idx += blockDim.x) vr[idx] = in[qd + kvd + idx];
  if (!b.stash) return;
  __syncthreads();  // kr is written by other threads of this CTA
  const std::size_t slot = static_cast<std::size_t>(b.ctx + (r - b.row_begin));
  float* kc = b.kv + (2 * static_cast<std::size_t>(layer)) * b.capacity * kvd + slot * kvd;
  float* vc = b.kv + (2 * static_cast<std::size_t>(layer) + 1) * b.capacity * kvd + slot * kvd;
  for (int idx = threadIdx.x; idx < kvd; idx += blockDim.x) {
    kc[idx] = kr[idx];
    vc[idx] = vr[idx];
  }
}

__global__ void attention_kernel(shape s, const float* q, const float* k, const float* v,
                                 const std::int32_t* row_block, const attn_block* blocks,
                                 const std::uint64_t* mask, float* out, int layer, float scale,
                                 int max_keys) {
  extern __shared__ float sm[];
  const int r = blockIdx.x, h = blockIdx.y;
  const attn_block b = blocks[row_block[r]];
  const int i = r - b.row_begin;
  const int hd = s.head_dim, qd = s.n_heads * hd, kvd = s.n_kv_heads * hd;
  const int kvh = h / (s.n_heads / s.n_kv_heads);
  const int keys = b.ctx + b.n;
  float* scores = sm;             // max_keys
  float* qs = scores + max_keys;  // hd
  float* red = qs + hd;           // 32
  float* partial = red + 32;      // max(blockDim, hd)
  for (int t = threadIdx.x; t < hd; t += blockDim.x)
    qs[t] = q[static_cast<std::size_t>(r) * qd + h * hd + t];
  __syncthreads();
  const float* kc = b.kv + (2 * static_cast<std::size_t>(layer)) * b.capacity * kvd + kvh * hd;
  const float* vc = b.kv + (2 * static_cast<std::size_t>(layer) + 1) * b.capacity * kvd + kvh * hd;
  const std::uint64_t* mrow = mask + b.mask_offset + static_cast<std::size_t>(i) * b.words;
  const auto new_row = [&](const float* base, int j) {
    return base + static_cast<std::size_t>(b.row_begin + j - b.ctx) * kvd + kvh * hd;
  };
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int j = warp; j < keys; j += warps) {
    bool visible = true;
    const float* kp = kc + static_cast<std::size_t>(j) * kvd;
    if (j >= b.ctx) {
      const int u = j - b.ctx;
      visible = ((mrow[u >> 6] >> (u & 63)) & 1u) != 0;
      kp = new_row(k, j);
    }
    float acc = 0.0f;
    if (visible)
      for (int t = lane; t < hd; t += 32) acc += qs[t] * kp[t];
    acc = warp_sum(acc);
    if (lane == 0) scores[j] = visible ? acc * scale : -INFINITY;
  }
  __syncthreads();
  float m = -INFINITY;
  for (int j = threadIdx.x; j < keys; j += blockDim.x) m = fmaxf(m, scores[j]);
  m = block_reduce<true>(m, red);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < keys; j += blockDim.x) {
    const float e = scores[j] == -INFINITY ? 0.0f : expf(scores[j] - m);
    scores[j] = e;
    sum += e;
  }
  sum = block_reduce<false>(sum, red);  // its barriers also publish scores[]
  // Output: groups of hd threads split the keys, then the groups' partial sums are added.
  const int groups = blockDim.x >= hd ? blockDim.x / hd : 1;
  for (int idx = threadIdx.x; idx < groups * hd; idx += blockDim.x) {
    const int g = idx / hd, t = idx % hd;
    float acc = 0.0f;
    for (int j = g; j < keys; j += groups) {
      const float p = scores[j];
      if (p == 0.0f) continue;
      const float* vp = j < b.ctx ? vc + static_cast<std::size_t>(j) * kvd : new_row(v, j);
      acc += p * vp[t];
    }
    partial[idx] = acc;
  }
  __syncthreads();
  for (int t = threadIdx.x; t < hd; t += blockDim.x) {
    float acc = 0.0f;
    for (int g = 0; g < groups; ++g) acc += partial[g * hd + t];
    out[static_cast<std::size_t>(r) * qd + h * hd + t] = acc / sum;
  }
}

__global__ void swiglu_kernel(float* gate_up, int d_ff) {
  float* g = gate_up + static_cast<std::size_t>(blockIdx.x) * 2 * d_ff;
  for (int j = threadIdx.x; j < d_ff; j += blockDim.x)
    g[j] = g[j] / (1.0f + expf(-g[j])) * g[d_ff + j];
}

__global__ void gather_kernel(float* data, int capacity, int row_size, int at,
                              const std::int32_t* from, int count) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= row_size) return;
  float* plane = data + static_cast<std::size_t>(blockIdx.x) * capacity * row_size;
  for (int k = 0; k < count; ++k)
    if (from[k] != at + k)
      plane[static_cast<std::size_t>(at + k) * row_size + c] =
          plane[static_cast<std::size_t>(from[k]) * row_size + c];
}

constexpr int tile = 16;

/// y[r, o] = beta * y[r, o] + sum_i x[r, i] * w[o, i]: 16 x 16 output tiles, the k dimension in
/// shared-memory tiles of 16 (both operands read along their rows, coalesced); each output is
/// summed in k order.
__global__ void linear_kernel(const float* x, int ldx, int rows, int in, const float* w, int out,
                              float* y, int ldy, float beta) {
  __shared__ float xs[tile][tile + 1];
  __shared__ float ws[tile][tile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int r = blockIdx.y * tile + ty, o = blockIdx.x * tile + tx;
  const int wo = blockIdx.x * tile + ty;  // the weight row this thread loads
  float acc = 0.0f;
  for (int k0 = 0; k0 < in; k0 += tile) {
    xs[ty][tx] = r < rows && k0 + tx < in ? x[static_cast<std::size_t>(r) * ldx + k0 + tx] : 0.0f;
    ws[ty][tx] = wo < out && k0 + tx < in ? w[static_cast<std::size_t>(wo) * in + k0 + tx] : 0.0f;
    __syncthreads();
    for (int k = 0; k < tile; ++k) acc += xs[ty][k] * ws[tx][k];
    __syncthreads();
  }
  if (r < rows && o < out) {
    float* yp = y + static_cast<std::size_t>(r) * ldy + o;
    *yp = beta == 0.0f ? acc : beta * *yp + acc;
  }
}

}  // namespace

cudaError_t linear(cudaStream_t stream, const float* x, int ldx, int rows, int in, const float* w,
                   int out, float* y, int ldy, float beta) {
  const dim3 grid((out + tile - 1) / tile, (rows + tile - 1) / tile);
  linear_kernel<<<grid, dim3(tile, tile), 0, stream>>>(x, ldx, rows, in, w, out, y, ldy, beta);
  return cudaGetLastError();
}

cudaError_t embed(cudaStream_t stream, const std::int32_t* tokens, const float* table, float* x,
                  int rows, int d) {
  embed_kernel<<<rows, threads, 0, stream>>>(tokens, table, x, d);
  return cudaGetLastError();
}

cudaError_t rms_norm(cudaStream_t stream, const float* x, const float* weight, float eps,
                     float* out, int rows, int d) {
  rms_norm_kernel<<<rows, threads, 0, stream>>>(x, weight, eps, out, d);
  return cudaGetLastError();
}

cudaError_t rope_scatter(cudaStream_t stream, const shape& s, const float* qkv,
                         const std::int32_t* positions, const std::int32_t* row_block,
                         const attn_block* blocks, const float* cos_table, const float* sin_table,
                         float* q, float* k, float* v, int rows, int layer) {
  rope_scatter_kernel<<<rows, threads, 0, stream>>>(s, qkv, positions, row_block, blocks, cos_table,
                                                    sin_table, q, k, v, layer);
  return cudaGetLastError();
}

cudaError_t attention(cudaStream_t stream, const shape& s, const float* q, const float* k,
                      const float* v, const std::int32_t* row_block, const attn_block* blocks,
                      const std::uint64_t* mask, float* out, int rows, int layer, float scale,
                      int max_keys) {
  const int partial = threads > s.head_dim ? threads : s.head_dim;
  const std::size_t smem = sizeof(float) * (static_cast<std::size_t>(max_keys) + s.head_dim + 32 +
                                            static_cast<std::size_t>(partial));
  if (smem > 48 * 1024) return cudaErrorInvalidValue;  // > 12 000 keys: not this example's sizes
  attention_kernel<<<dim3(rows, s.n_heads), threads, smem, stream>>>(
      s, q, k, v, row_block, blocks, mask, out, layer, scale, max_keys);
  return cudaGetLastError();
}

cudaError_t swiglu(cudaStream_t stream, float* gate_up, int rows, int d_ff) {
  swiglu_kernel<<<rows, threads, 0, stream>>>(gate_up, d_ff);
  return cudaGetLastError();
}

cudaError_t gather_rows(cudaStream_t stream, float* data, int planes, int capacity, int row_size,
                        int at, const std::int32_t* from, int count) {
  if (count == 0 || planes == 0) return cudaSuccess;
  gather_kernel<<<dim3(planes, (row_size + threads - 1) / threads), threads, 0, stream>>>(
      data, capacity, row_size, at, from, count);
  return cudaGetLastError();
}

namespace {

__global__ void row_tops_kernel(const float* logits, int rows, int vocab,
                                specula::detail::row_top* out) {
  const int r = static_cast<int>(blockIdx.x) * blockDim.x + static_cast<int>(threadIdx.x);
  if (r < rows)
    out[r] = specula::detail::top_of(logits + static_cast<std::size_t>(r) * vocab, vocab);
}

__global__ void vocab_limit_kernel(float* logits, int vocab, int limit) {
  specula::example::detail::vocab_limit_op{limit}(
      logits + static_cast<std::size_t>(blockIdx.x) * vocab, vocab,
      static_cast<index_t>(threadIdx.x), static_cast<index_t>(blockDim.x));
}

__global__ void row_max_kernel(const float* data, int vocab, float* out) {
  __shared__ float red[32];
  const float* row = data + static_cast<std::size_t>(blockIdx.x) * vocab;
  float m = -INFINITY;
  for (int t = threadIdx.x; t < vocab; t += blockDim.x) m = fmaxf(m, row[t]);
  m = block_reduce<true>(m, red);
  if (threadIdx.x == 0) out[blockIdx.x] = m;
}

}  // namespace

cudaError_t vocab_limit(cudaStream_t stream, float* logits, int rows, int vocab, int limit) {
  if (rows <= 0 || limit >= vocab) return cudaSuccess;
  vocab_limit_kernel<<<rows, threads, 0, stream>>>(logits, vocab, limit);
  return cudaGetLastError();
}

cudaError_t row_max(cudaStream_t stream, const float* data, int rows, int vocab, float* out) {
  if (rows <= 0) return cudaSuccess;
  row_max_kernel<<<rows, threads, 0, stream>>>(data, vocab, out);
  return cudaGetLastError();
}

cudaError_t row_tops(cudaStream_t stream, const float* logits, int rows, int vocab, void* out) {
  if (rows <= 0) return cudaSuccess;
  constexpr int block = 128;
  row_tops_kernel<<<(rows + block - 1) / block, block, 0, stream>>>(
      logits, rows, vocab, static_cast<specula::detail::row_top*>(out));
  return cudaGetLastError();
}

}  // namespace specula::example::device_detail
