// See device_sjd.hpp.

#include "device_sjd.hpp"

#include <algorithm>

namespace specula::example::device_detail {

namespace {

constexpr int threads = 128;

__global__ void __launch_bounds__(threads)
    sjd_children_kernel(const specula::detail::sjd_children_job* jobs, const float* p,
                        const float* q_old, float* q_next, index_t V, const request_rng* rng,
                        std::int32_t* out_counts, token_t* out_tokens) {
  const auto j = static_cast<index_t>(blockIdx.x);
  const specula::detail::sjd_children_job job = jobs[j];
  const float* R = p + job.row * V;
  float* q = q_next + job.parent * V;
  for (index_t y = threadIdx.x; y < V; y += threads) q[y] = R[y];
  if (threadIdx.x != 0) return;
  index_t at = 0;
  for (index_t i = 0; i < j; ++i) at += jobs[i].kids;
  const float* q_ac = job.ac_from >= 0 ? q_old + job.ac_from * V : nullptr;
  const float* q_res = job.residual_from >= 0 ? q_old + job.residual_from * V : nullptr;
  // The drawing is sequential (each child excludes the earlier ones) and cheap next to a forward
  // pass at these vocabularies; one thread runs the host's function on the same rows.
  out_counts[j] = static_cast<std::int32_t>(
      specula::detail::sjd_draw_children(job, R, q_ac, q_res, V, *rng, out_tokens + at));
}

__global__ void __launch_bounds__(threads)
    fill_row_kernel(float* row, index_t V, index_t begin, index_t end, float value) {
  for (index_t y = blockIdx.x * threads + threadIdx.x; y < V; y += gridDim.x * threads)
    row[y] = y >= begin && y < end ? value : 0.0f;
}

__global__ void __launch_bounds__(threads)
    window_rows_kernel(const specula::detail::window_row* rows, const float* current, float* dest,
                       const std::int32_t* context_counts, index_t V) {
  const specula::detail::window_row r = rows[blockIdx.x];
  float* row = dest + static_cast<index_t>(r.at) * V;
  for (index_t y = threadIdx.x; y < V; y += threads)
    row[y] = specula::detail::window_row_entry(r, current, context_counts, V, y);
}

__global__ void __launch_bounds__(threads)
    count_tokens_kernel(const token_t* tokens, int n, index_t V, std::int32_t* counts) {
  const int i = static_cast<int>(blockIdx.x) * threads + static_cast<int>(threadIdx.x);
  if (i >= n) return;
  const token_t t = tokens[i];
  if (t >= 0 && t < V) atomicAdd(counts + t, 1);
}

}  // namespace

cudaError_t window_rows(cudaStream_t stream, const specula::detail::window_row* rows, int count,
                        const float* current, float* dest, const std::int32_t* context_counts,
                        index_t V) {
  if (count <= 0) return cudaSuccess;
  window_rows_kernel<<<static_cast<unsigned>(count), threads, 0, stream>>>(rows, current, dest,
                                                                           context_counts, V);
  return cudaGetLastError();
}

cudaError_t count_tokens(cudaStream_t stream, const token_t* tokens, int n, index_t V,
                         std::int32_t* counts) {
  if (n <= 0) return cudaSuccess;
  count_tokens_kernel<<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0, stream>>>(
      tokens, n, V, counts);
  return cudaGetLastError();
}

cudaError_t sjd_children(cudaStream_t stream, const specula::detail::sjd_children_job* jobs,
                         int count, const float* p, const float* q_old, float* q_next, index_t V,
                         const request_rng* rng, std::int32_t* out_counts, token_t* out_tokens) {
  if (count <= 0) return cudaSuccess;
  sjd_children_kernel<<<static_cast<unsigned>(count), threads, 0, stream>>>(
      jobs, p, q_old, q_next, V, rng, out_counts, out_tokens);
  return cudaGetLastError();
}

cudaError_t fill_row(cudaStream_t stream, float* row, index_t V, index_t begin, index_t end,
                     float value) {
  const auto blocks = static_cast<unsigned>(std::min<index_t>((V + threads - 1) / threads, 64));
  fill_row_kernel<<<blocks, threads, 0, stream>>>(row, V, begin, end, value);
  return cudaGetLastError();
}

}  // namespace specula::example::device_detail
