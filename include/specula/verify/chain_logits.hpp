#pragma once

/// @file
/// Chain verification from logits on the host: target logits (and draft logits, or one-hot
/// drafts) in fp32, bf16 or fp16 -> the sampling transforms of sample/transforms.hpp with
/// per-row or per-request parameters -> chain verification, in one call and without a
/// probability tensor. The host counterpart of specula/cuda/fused.cuh.
///
/// Each request turns a logit row into probabilities only when the verifier first reads it:
/// target row i when position i is reached, draft row i likewise, so the rows after the first
/// rejection are never transformed (the unfused path transforms all of them). The rows are
/// made by the same row code as the batched logits_to_probs into a per-request buffer of V
/// floats (two with draft logits), and verified by verify_chain_request exactly as
/// verify_chain runs it, so the result is bit for bit that of logits_to_probs followed by
/// verify_chain (tested). Greedy and sampled requests mix in one call through
/// chain_logits_input::is_greedy (vLLM's is_greedy).

#include <cstdint>
#include <memory>
#include <string>

#include "specula/backend/host.hpp"
#include "specula/core/error.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/validate.hpp"
#include "specula/rules/exact.hpp"
#include "specula/rules/rule.hpp"
#include "specula/sample/random_source.hpp"
#include "specula/sample/transforms.hpp"
#include "specula/verify/chain.hpp"
#include "specula/verify/chain_core.hpp"

namespace specula {

/// Inputs of chain verification from logits, flattened layout (as chain_batch_input: request
/// b's drafts are [draft_offsets[b], draft_offsets[b + 1]), its target rows
/// draft_offsets[b] + b .. draft_offsets[b + 1] + b), with logits instead of probabilities.
template <class T>
struct chain_logits_input {
  index_t vocab_size = 0;
  index_view draft_offsets;              ///< B + 1 non-decreasing offsets, first 0 (int64 or int32)
  row_view<const token_t> draft_tokens;  ///< num_draft = draft_offsets[B] tokens
  batch_view<const T> draft_logits;      ///< num_draft x V, or no rows for one-hot drafts
  batch_view<const T> draft_uncond;      ///< the same shape for CFG on the drafts, or no rows
  /// With draft_logits: 1 entry, or one per draft row (one per request when
  /// params_per_request).
  row_view<const sampling_params> draft_params;
  batch_view<const T> target_logits;  ///< (num_draft + B) x V
  batch_view<const T> target_uncond;  ///< the same shape for CFG, or no rows
  /// 1 entry, or one per target row (one per request when params_per_request).
  row_view<const sampling_params> target_params;
  row_view<const request_rng> rng;  ///< B random streams
  /// Whether params with more than one entry have one per request instead of one per row.
  bool params_per_request = false;
  /// B flags, or empty (every request sampled): request b with is_greedy[b] != 0 is verified
  /// greedily in the same call (vLLM's is_greedy): its drafts are accepted while each equals the
  /// arg-max of its target logits after the CFG mix (temperature and the filters do not move
  /// the arg-max and are not applied; ties: lowest id), and it emits that arg-max after the last
  /// accepted one — verify_chain_greedy on the mixed logit rows. Its draft rows and stream are
  /// not read (its stream may repeat another request's).
  row_view<const std::uint8_t> is_greedy = {};
};

namespace detail {

/// The parameters of `row` (a draft or target row of request b).
inline const sampling_params& row_params(row_view<const sampling_params> params, bool per_request,
                                         index_t b, index_t row) noexcept {
  if (params.size == 1) return params[0];
  return params[per_request ? b : row];
}

/// Transforms `row` of `logits` (with `uncond` unless it has no rows) into out[0 .. V).
template <class T>
void transform_logit_row(batch_view<const T> logits, batch_view<const T> uncond,
                         const sampling_params& sp, index_t row, float* out, const char* argument) {
  with_logit_source(
      logits.row(row).data, uncond.rows > 0 ? uncond.row(row).data : nullptr, sp,
      [&](const auto& src) { transform_row(sp, src, logits.cols, out, nullptr, row, argument); });
}

/// Checks the logits of every row (NaN, +Inf, rows of -Inf only) under `policy`.
template <host::policy Policy, class T>
void validate_logit_values(const Policy& policy, batch_view<const T> logits,
                           batch_view<const T> uncond, row_view<const sampling_params> params,
                           bool per_request, index_view offsets, bool target,
                           const char* argument) {
  // The request of each row, for per-request parameters: rows are in request order.
  host::for_each_index(policy, logits.rows, [&](index_t r) {
    index_t b = 0;
    if (per_request && params.size > 1) {
      const index_t batch = offsets.size - 1;
      index_t lo = 0;
      index_t hi = batch - 1;
      while (lo < hi) {  // the last request whose first row is <= r
        const index_t mid = (lo + hi + 1) / 2;
        if ((target ? offsets[mid] + mid : offsets[mid]) <= r)
          lo = mid;
        else
          hi = mid - 1;
      }
      b = lo;
    }
    const sampling_params& sp = row_params(params, per_request, b, r);
    with_logit_source(logits.row(r).data, uncond.rows > 0 ? uncond.row(r).data : nullptr, sp,
                      [&](const auto& src) { (void)scan_logits(src, logits.cols, r, argument); });
  });
}

/// One request's logit rows, transformed on first use into a buffer of one row.
template <class T>
struct lazy_prob_row {
  batch_view<const T> logits;
  batch_view<const T> uncond;
  row_view<const sampling_params> params;
  bool per_request;
  index_t request;
  const char* argument;
  std::unique_ptr<float[]> buffer;
  index_t held = -1;  ///< the row in the buffer

  row_view<const float> get(index_t row) {
    if (!buffer)
      buffer = std::make_unique_for_overwrite<float[]>(static_cast<std::size_t>(logits.cols));
    if (held != row) {
      held = -1;
      transform_logit_row(logits, uncond, row_params(params, per_request, request, row), row,
                          buffer.get(), argument);
      held = row;
    }
    return {buffer.get(), logits.cols};
  }
};

/// One request's target logit rows after the CFG mix (greedy requests), converted on first use
/// into a buffer of one row of floats.
template <class T>
struct lazy_mixed_row {
  batch_view<const T> logits;
  batch_view<const T> uncond;
  row_view<const sampling_params> params;
  bool per_request;
  index_t request;
  std::unique_ptr<float[]> buffer;
  index_t held = -1;

  row_view<const float> get(index_t row) {
    if (!buffer)
      buffer = std::make_unique_for_overwrite<float[]>(static_cast<std::size_t>(logits.cols));
    if (held != row) {
      sampling_params sp;  // the CFG scale only: no temperature
      sp.cfg_scale = row_params(params, per_request, request, row).cfg_scale;
      float* out = buffer.get();
      with_logit_source(logits.row(row).data, uncond.rows > 0 ? uncond.row(row).data : nullptr, sp,
                        [&](const auto& src) {
                          for (index_t i = 0; i < logits.cols; ++i) out[i] = src(i);
                        });
      held = row;
    }
    return {buffer.get(), logits.cols};
  }
};

/// Whether request b of a logits batch is verified greedily.
template <class T>
[[nodiscard]] bool greedy_request(const chain_logits_input<T>& in, index_t b) noexcept {
  return !in.is_greedy.empty() && in.is_greedy[b] != 0;
}

}  // namespace detail

/// Validates inputs and outputs of chain verification from logits; throws invalid_input on the
/// first problem: the checks of verify_chain on the layout, tokens and outputs, the shapes and
/// parameters of the logit rows (as the batched logits_to_probs), and every logit row's values
/// (NaN or +Inf after CFG and temperature, or a row of -Inf only), rows checked under `policy`.
template <host::policy Policy, class T>
void validate_chain_logits(const Policy& policy, const chain_logits_input<T>& in,
                           const chain_batch_output& out, const chain_options& options = {}) {
  detail::validate_options(options);
  const index_t batch = detail::validate_flattened_shape(
      chain_batch_input<float>{in.vocab_size, in.draft_offsets, in.draft_tokens, {}, {}, in.rng});
  const index_t num_draft = in.draft_offsets[batch];
  if (!in.is_greedy.empty()) {
    detail::require_size(in.is_greedy.size, batch, "is_greedy", "one flag per request, or empty");
    if (in.is_greedy.data == nullptr)
      throw_if_failed({status::empty_input, -1, -1, 0.0}, "is_greedy", "null data pointer");
    detail::require_streams(in.rng, batch, in.is_greedy);  // greedy requests make no draw
  } else {
    detail::require_streams(in.rng, batch);
  }
  detail::require_size(in.target_logits.rows, num_draft + batch, "target_logits",
                       "number of rows must be num_draft + B");
  detail::require_size(in.target_logits.cols, in.vocab_size, "target_logits",
                       "row length must equal vocab_size");
  detail::validate_logit_rows_shape(in.target_logits, in.target_uncond, in.target_params,
                                    in.params_per_request ? batch : num_draft + batch,
                                    "target_logits", "target_uncond", "target_params");
  const bool dense = in.draft_logits.rows > 0;
  if (dense) {
    detail::require_size(in.draft_logits.rows, num_draft, "draft_logits",
                         "number of rows must be num_draft (or 0 for one-hot drafts)");
    detail::require_size(in.draft_logits.cols, in.vocab_size, "draft_logits",
                         "row length must equal vocab_size");
    detail::validate_logit_rows_shape(in.draft_logits, in.draft_uncond, in.draft_params,
                                      in.params_per_request ? batch : num_draft, "draft_logits",
                                      "draft_uncond", "draft_params");
  } else if (in.draft_uncond.rows > 0) {
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(in.draft_uncond.rows)},
                    "draft_uncond", "must have no rows without draft_logits");
  }
  for (index_t r = 0; r < num_draft; ++r) {
    const token_t x = in.draft_tokens[r];
    if (x == no_token)  // placeholders are refused here (no draft_placeholders::reject yet)
      throw_if_failed({status::bad_padding, r, -1, -1.0}, "draft_tokens",
                      "-1 inside a request's counted drafts (a placeholder: the logits entry "
                      "point refuses them; verify_chain with draft_placeholders::reject takes "
                      "them)");
    if (x < 0 || static_cast<index_t>(x) >= in.vocab_size)
      throw_if_failed(
          {x == no_token ? status::bad_padding : status::token_out_of_range, r, -1,
           static_cast<double>(x)},
          "draft_tokens",
          ("must be in [0, vocab_size) with vocab_size " + std::to_string(in.vocab_size)).c_str());
  }
  detail::validate_flattened_outputs(out, num_draft, batch);
  detail::validate_logit_values(policy, in.target_logits, in.target_uncond, in.target_params,
                                in.params_per_request, in.draft_offsets, true, "target_logits");
  if (dense)
    detail::validate_logit_values(policy, in.draft_logits, in.draft_uncond, in.draft_params,
                                  in.params_per_request, in.draft_offsets, false, "draft_logits");
}

/// Chain verification from logits (see the file comment) under `policy` with `rule` (any rule
/// verify_chain takes): the result is that of logits_to_probs on every row followed by
/// verify_chain on the probabilities. Validates first (validate_chain_logits), so bad input
/// throws invalid_input before any output is written, with one exception: a drafted token whose
/// probability under the transformed draft row is 0 (which a token sampled from that row never
/// has; verify_chain rejects it as draft_probs[row][column]) is found when its row is
/// transformed, and throws `draft_logits[row r][column x]` with the outputs of other requests
/// possibly written. Allocates one row of V floats per request (two with draft logits).
template <host::policy Policy, class T, batch_chain_rule Rule = exact_rule>
void verify_chain_from_logits(const Policy& policy, const chain_logits_input<T>& in,
                              const chain_batch_output& out, const chain_options& options = {},
                              const Rule& rule = {}) {
  validate_chain_logits(policy, in, out, options);
  const index_t batch = in.draft_offsets.size - 1;
  detail::validate_rule(rule, in.vocab_size, batch);
  std::uint8_t* accepted = out.accepted.empty() ? nullptr : out.accepted.data;
  host::for_each_index(policy, batch, [&](index_t b) {
    const auto s = detail::flattened_segment(in.draft_offsets, b);
    if (detail::greedy_request(in, b)) {
      detail::lazy_mixed_row<T> mixed{
          in.target_logits, in.target_uncond, in.target_params, in.params_per_request, b, nullptr};
      const auto r = greedy_chain_request(
          s.length, in.draft_tokens.data + s.draft_row,
          [&](index_t i) { return mixed.get(s.target_row + i); },
          out.output_tokens.data + s.target_row,
          accepted == nullptr ? nullptr : accepted + s.draft_row);
      detail::write_result(r, b, out.num_accepted, out.flags);
      return;
    }
    detail::lazy_prob_row<T> target{
        in.target_logits, in.target_uncond, in.target_params, in.params_per_request, b,
        "target_logits",  nullptr};
    const auto target_row = [&](index_t i) { return target.get(s.target_row + i); };
    philox_source src{in.rng[b]};
    const token_t* drafts = in.draft_tokens.data + s.draft_row;
    std::uint8_t* acc = accepted == nullptr ? nullptr : accepted + s.draft_row;
    token_t* tokens = out.output_tokens.data + s.target_row;
    const auto& request_rule = detail::request_rule(rule, b);
    chain_request_result r;
    if (in.draft_logits.rows > 0) {
      detail::lazy_prob_row<T> draft{
          in.draft_logits, in.draft_uncond, in.draft_params, in.params_per_request, b,
          "draft_logits",  nullptr};
      const auto proposal = [&](index_t i) {
        const index_t row = s.draft_row + i;
        const row_view<const float> q = draft.get(row);
        const token_t x = drafts[i];
        if (!(q[x] > 0.0f))
          throw_if_failed({status::zero_draft_probability, row, x, static_cast<double>(q[x])},
                          "draft_logits",
                          "a drafted token must have positive probability under the draft's "
                          "transformed row");
        return dense_proposal<float>{q};
      };
      r = verify_chain_request(request_rule, src, s.length, drafts, target_row, proposal,
                               options.residual_floor, tokens, acc);
    } else {
      const auto proposal = [&](index_t i) { return one_hot_proposal{drafts[i]}; };
      r = verify_chain_request(request_rule, src, s.length, drafts, target_row, proposal,
                               options.residual_floor, tokens, acc);
    }
    detail::write_result(r, b, out.num_accepted, out.flags);
  });
}

}  // namespace specula
