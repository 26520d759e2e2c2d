#pragma once

/// @file
/// Batched sampling of one token per row (host): the plain sampling step of every decoder, and
/// of a speculative engine's non-speculative requests.
///
/// - `sample_from_probs(policy, probs, rng, out)`: token r is drawn from row r of `probs`
///   (FlashInfer's `sampling_from_probs`). Rows are non-negative weights; they need not sum to
///   1 (the draw is proportional to the row's positive mass).
/// - `sample_from_logits(policy, logits, params, rng, out, is_greedy)`: row r goes through the
///   `logits_to_probs` pipeline with `params[r]` (or `params[0]`): temperature, top-k, softmax,
///   top-p, min-p (FlashInfer's `top_k_top_p_sampling_from_logits`, vLLM's sampler), then token r
///   is drawn from the result. Rows flagged in `is_greedy` take the argmax of their logits
///   instead (ties: lowest id), with no draw: greedy and sampled requests in one call.
///
/// Randomness: row r uses one uniform u of `rng[r]` at `sample_draw` (draw_id{0, 0}) and
/// returns the inverse-CDF index of u over the row (specula::philox_source::categorical), so a
/// row's token depends on its own stream only, whatever the batch and the policy. Give each call
/// a fresh stream (e.g. the step in request_rng::step).
///
/// Errors (invalid_input, before any output is written for shapes and parameters): mismatched
/// shapes or strides, `rng`/`out`/`is_greedy` of the wrong length, parameters out of their
/// domain (`params.top_p[row r]`); a NaN, infinite or negative entry of `probs`
/// (`probs[row r][column i]`) or a row with no positive mass (`probs[row r]`); a NaN or +Inf
/// logit or a row of -Inf only (`logits[row r][column i]`, as logits_to_probs). The lowest failing
/// row's error is thrown under every policy; outputs of other rows may have been written.

#include <cstdint>
#include <vector>

#include "specula/backend/host.hpp"
#include "specula/core/error.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/core/validate.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/sample/random_source.hpp"
#include "specula/sample/row_passes.hpp"
#include "specula/sample/transforms.hpp"

namespace specula {

/// The draw point the samplers use in each row's stream (a function: device code reads it too).
SPECULA_HOST_DEVICE constexpr draw_id sample_draw_point() noexcept { return {0, 0}; }
/// sample_draw_point(), as a constant.
inline constexpr draw_id sample_draw = sample_draw_point();

namespace detail {

/// Draws one token from n non-negative weights `w` (positive mass) with `src`: the weights'
/// mass and tile sums by `passes` (the host's sequential passes, or the device's CTA-wide ones,
/// which sum in the same order), then the inverse-CDF index of the uniform at sample_draw. The
/// sampling step of every backend's samplers, host and device.
template <class Source, class WeightFn, class Passes = sequential_passes>
SPECULA_HOST_DEVICE index_t sample_weights(Source& src, index_t n, const WeightFn& w,
                                           const Passes& passes = {}) {
  typename Passes::summary_type summary;
  passes.summarize(n, w, summary);
  return src.categorical(n, w, summary, sample_draw_point());
}

/// The first problem of a row of sampling weights (host and device): a NaN, infinite or
/// negative entry (its column), or no positive mass (sum in double, in index order).
template <class Row>
SPECULA_HOST_DEVICE constexpr diagnostic check_weight_row(const Row& row, index_t r) noexcept {
  double mass = 0.0;
  for (index_t i = 0; i < row.size; ++i) {
    const double v = static_cast<double>(row[i]);
    if (is_nan(v)) return {status::nan_value, r, i, v};
    if (!is_finite(v)) return {status::inf_value, r, i, v};
    if (v < 0.0) return {status::negative_value, r, i, v};
    mass += v;
  }
  if (!(mass > 0.0)) return {status::no_mass, r, -1, mass};
  return {};
}

/// Checks row r of weights for sample_from_probs: finite, non-negative, positive mass.
template <class T>
void check_sampling_row(row_view<const T> row, index_t r, const char* argument) {
  const diagnostic d = check_weight_row(row, r);
  throw_if_failed(d, argument, d.code == status::no_mass ? "every entry is 0" : "");
}

/// Shape checks shared by the samplers: `rows` rows, `rng` and `out` of one entry per row.
template <class T>
void validate_sampling_shape(batch_view<const T> rows, row_view<const request_rng> rng,
                             row_view<token_t> out, const char* argument) {
  if (rows.rows < 0 || rows.cols < 0)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(rows.rows)}, argument,
                    "rows and cols must be >= 0");
  if (rows.rows > 0 && rows.cols == 0)
    throw_if_failed({status::empty_input, -1, -1, 0.0}, argument, "needs rows of >= 1 entry");
  if (rows.rows > 1 && rows.row_stride < rows.cols)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(rows.row_stride)},
                    argument, "row_stride must be at least the row length");
  if (rows.rows > 0 && rows.data == nullptr)
    throw_if_failed({status::empty_input, -1, -1, 0.0}, argument, "null data pointer");
  require_size(rng.size, rows.rows, "rng", "one random stream per row");
  require_size(out.size, rows.rows, "out", "one token per row");
  if (rows.rows > 0 && (rng.data == nullptr || out.data == nullptr))
    throw_if_failed({status::empty_input, -1, -1, 0.0}, rng.data == nullptr ? "rng" : "out",
                    "null data pointer");
}

}  // namespace detail

/// Samples one token per row of `probs` (rows x V weights, float or double): out[r] is drawn
/// from row r with `rng[r]` (see the file comment). B = 0 is a no-op.
template <host::policy Policy, class T>
requires(std::same_as<T, float> ||
         std::same_as<T, double>) void sample_from_probs(const Policy& policy,
                                                         batch_view<const T> probs,
                                                         row_view<const request_rng> rng,
                                                         row_view<token_t> out) {
  detail::validate_sampling_shape(probs, rng, out, "probs");
  host::for_each_index(policy, probs.rows, [&](index_t r) {
    const row_view<const T> row = probs.row(r);
    const detail::row_weights<T> w{row};
    weight_summary summary;
    if constexpr (std::is_same_v<T, float>) {
      // One pass: the tile sums and the checks (the entry sum is finite, no entry is negative)
      // together; the precise scan runs only to report a failure.
      detail::dense_scan scan;
      detail::summarize_weights_scanning(row.size, w, summary, &scan);
      if (!(scan.low >= 0.0f && detail::is_finite(summary.total) && summary.total > 0.0))
        detail::check_sampling_row(row, r, "probs");
    } else {
      detail::check_sampling_row(row, r, "probs");
      summarize_weights(row.size, w, summary);
    }
    philox_source src{rng[r]};
    out[r] = static_cast<token_t>(src.categorical(row.size, w, summary, sample_draw));
  });
}

/// sample_from_probs on the calling thread.
template <class T>
requires(std::same_as<T, float> || std::same_as<T, double>) void sample_from_probs(
    batch_view<const T> probs, row_view<const request_rng> rng, row_view<token_t> out) {
  sample_from_probs(host::seq, probs, rng, out);
}

/// Samples one token per row of `logits` (rows x V of float, bfloat16 or half) after the
/// logits_to_probs pipeline with `params[r]` (1 entry, or one per row); rows with
/// `is_greedy[r] != 0` (empty: none) take the argmax of their logits instead. See the file
/// comment. B = 0 is a no-op. Allocates one V-float buffer per worker thread.
template <logit_element T, host::policy Policy>
void sample_from_logits(const Policy& policy, batch_view<const T> logits,
                        row_view<const sampling_params> params, row_view<const request_rng> rng,
                        row_view<token_t> out, row_view<const std::uint8_t> is_greedy = {}) {
  detail::validate_sampling_shape(logits, rng, out, "logits");
  detail::validate_logit_rows_shape(logits, batch_view<const T>{}, params, logits.rows, "logits",
                                    "uncond", "params");
  if (!is_greedy.empty())
    detail::require_size(is_greedy.size, logits.rows, "is_greedy", "one flag per row");
  const index_t V = logits.cols;
  host::for_each_index(policy, logits.rows, [&](index_t r) {
    const sampling_params& sp = params[params.size == 1 ? 0 : r];
    if (!is_greedy.empty() && is_greedy[r] != 0) {
      // The argmax of the logits (temperature does not move it); NaN and +Inf are errors as in
      // the sampled rows.
      detail::with_logit_source(logits.row(r).data, static_cast<const T*>(nullptr),
                                sampling_params{}, [&](const auto& src) {
                                  // The max (and the checks), then its first index.
                                  const float m = detail::scan_logits(src, V, r, "logits");
                                  index_t best = 0;
                                  while (src(best) != m) ++best;
                                  out[r] = static_cast<token_t>(best);
                                });
      return;
    }
    thread_local std::vector<float> probs;
    probs.resize(static_cast<std::size_t>(V));
    detail::with_logit_source(
        logits.row(r).data, static_cast<const T*>(nullptr), sp, [&](const auto& src) {
          detail::transform_row(sp, src, V, probs.data(), nullptr, r, "logits");
        });
    philox_source src{rng[r]};
    const row_view<const float> row{probs.data(), V};
    out[r] = static_cast<token_t>(detail::sample_weights(src, V, detail::row_weights<float>{row}));
  });
}

/// sample_from_logits on the calling thread.
template <logit_element T>
void sample_from_logits(batch_view<const T> logits, row_view<const sampling_params> params,
                        row_view<const request_rng> rng, row_view<token_t> out,
                        row_view<const std::uint8_t> is_greedy = {}) {
  sample_from_logits<T>(host::seq, logits, params, rng, out, is_greedy);
}

}  // namespace specula
