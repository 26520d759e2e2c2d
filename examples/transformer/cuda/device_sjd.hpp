#pragma once

// The draw kernels of the resident SJD ops (device_resident_sjd.cpp), in device_sjd.cu. Each
// launcher enqueues on `stream` and returns cudaGetLastError().

#include <cuda_runtime_api.h>

#include <cstdint>

#include "specula/core/rng.hpp"
#include "specula/core/types.hpp"
#include "specula/decode/row_draws.hpp"

namespace specula::example::device_detail {

/// One CTA per job: q_next row job.parent <- p row job.row, then the job's children
/// (specula::detail::sjd_draw_children, one thread) to out_tokens[sum of earlier jobs' kids ..]
/// and their number to out_counts[j]. q_old: the current draft's q rows.
cudaError_t sjd_children(cudaStream_t stream, const specula::detail::sjd_children_job* jobs,
                         int count, const float* p, const float* q_old, float* q_next, index_t V,
                         const request_rng* rng, std::int32_t* out_counts, token_t* out_tokens);

/// One CTA per row: dest row rows[r].at <- specula::detail::window_row_entry (copies read
/// `current`, context laws `context_counts`). dest may be `current` when no row copies.
cudaError_t window_rows(cudaStream_t stream, const specula::detail::window_row* rows, int count,
                        const float* current, float* dest, const std::int32_t* context_counts,
                        index_t V);

/// counts[t] += 1 for each of tokens[0 .. n) in [0, V).
cudaError_t count_tokens(cudaStream_t stream, const token_t* tokens, int n, index_t V,
                         std::int32_t* counts);

/// row[0 .. V) <- `value` on [begin, end), 0 elsewhere.
cudaError_t fill_row(cudaStream_t stream, float* row, index_t V, index_t begin, index_t end,
                     float value);

}  // namespace specula::example::device_detail
