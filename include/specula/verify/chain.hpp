#pragma once

/// @file
/// Batched chain verification on the host, in two layouts:
///
/// - **flattened / ragged** (like vLLM's [num_tokens, V]): request b has
///   L_b = draft_offsets[b+1] - draft_offsets[b] drafts at rows draft_offsets[b] .. of the draft
///   arrays, and L_b + 1 target rows starting at row draft_offsets[b] + b (or, with
///   `bonus_tokens`, L_b target rows starting at row draft_offsets[b]: vLLM's layout, where the
///   engine samples the bonus token itself);
/// - **padded** [B, L, V]: request b has drafts at rows b*L .. b*L + L_b - 1 and target rows at
///   b*(L+1) .. b*(L+1) + L_b, with L_b <= L given by draft_lengths or by -1 padding.
///
/// `verify_chain` validates every input first (see docs/api.md for the list of checks) and
/// throws `specula::invalid_input` naming the argument and index. `verify_chain_unchecked` skips
/// validation: it is the fast path for callers whose inputs are valid by construction, and its
/// behaviour on invalid input is undefined.
///
/// Drafts without proposal rows (one-hot drafts, as most engines draft) are given by an empty
/// `draft_probs` (rows == 0).

#include <cstdint>
#include <string>

#include "specula/backend/host.hpp"
#include "specula/core/error.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/validate.hpp"
#include "specula/rules/exact.hpp"
#include "specula/sample/random_source.hpp"
#include "specula/verify/chain_core.hpp"

namespace specula {

/// What checked entry points do with -1 inside a request's counted drafts (its L_b drafts:
/// draft_offsets in the flattened layout, draft_lengths in the padded one).
enum class draft_placeholders {
  /// Invalid input: `invalid_input` (status::bad_padding) naming the draft (the default).
  refuse,
  /// vLLM's rule for its placeholder draft id: the draft at that position is rejected without an
  /// acceptance draw and the request emits a token sampled from the rule's residual there (the
  /// placeholder proposes nothing: without proposal rows the exact rule samples p; with them,
  /// max(p - q, 0) normalised), then stops. Scalar rules only (exact, relaxed, scheduled):
  /// row-aware rules (LANTERN++, typical acceptance) still refuse placeholders.
  reject,
};

/// Options of chain verification.
struct chain_options {
  /// Checked entry points reject probability rows with |sum - 1| above this.
  double sum_tolerance = default_sum_tolerance;
  /// A residual whose mass is at or below this is treated as empty; the emitted token is then
  /// sampled from p and the request is flagged chain_residual_fallback.
  double residual_floor = default_residual_floor;
  /// What checked entry points validate (see check_level): by default the rows and the entries
  /// p(x), q(x) the verifier reads, checked as they are read; check_level::full checks every row
  /// and every drafted token's p(x), q(x) first.
  check_level check = check_level::reads;
  /// -1 inside a request's counted drafts: invalid input, or vLLM's rejection at that position.
  draft_placeholders placeholders = draft_placeholders::refuse;
};

/// Inputs in the flattened (ragged) layout. B = draft_offsets.size - 1.
template <class T>
struct chain_batch_input {
  index_t vocab_size = 0;
  index_view draft_offsets;              ///< B + 1 non-decreasing offsets, first 0 (int64 or int32)
  row_view<const token_t> draft_tokens;  ///< num_draft = draft_offsets[B] tokens
  batch_view<const T> draft_probs;       ///< num_draft x V, or no rows for one-hot drafts
  batch_view<const T> target_probs;      ///< (num_draft + B) x V; num_draft x V with bonus_tokens
  row_view<const request_rng> rng;       ///< B random streams
  /// B bonus tokens sampled by the caller (vLLM's bonus_token_ids), or empty. Empty: request b's
  /// L_b + 1 target rows start at row draft_offsets[b] + b and a request whose drafts are all
  /// accepted samples its bonus token from its last one. Given: target_probs holds one row per
  /// draft token (request b's L_b rows start at row draft_offsets[b], no bonus row) and such a
  /// request emits bonus_tokens[b] (flags chain_bonus | chain_valid) without a draw. Host entry
  /// points only (verify_chain, verify_chain_unchecked, verify_chain_greedy).
  row_view<const token_t> bonus_tokens = {};
  /// B flags, or empty (every request sampled): request b with is_greedy[b] != 0 is verified
  /// greedily in the same call (vLLM's is_greedy): its drafts are accepted while each equals the
  /// argmax of its target row (ties: lowest id) and it emits the argmax after the last accepted
  /// one (or its bonus token), as verify_chain_greedy would; its draft_probs rows and rng are
  /// not used. Its target rows are validated in full before verification (checked entry
  /// points). Taken by verify_chain, verify_chain_unchecked and the device's verify_chain_async
  /// (flags in device memory).
  row_view<const std::uint8_t> is_greedy = {};
};

/// Outputs in the flattened layout, caller-allocated.
struct chain_batch_output {
  /// num_draft + B slots laid out like target_probs: request b's accepted drafts then its
  /// emitted token start at slot draft_offsets[b] + b; unused slots are -1.
  row_view<token_t> output_tokens;
  row_view<std::int32_t> num_accepted;  ///< B
  row_view<std::uint8_t> accepted;      ///< num_draft per-position flags, or empty
  row_view<std::uint32_t> flags;        ///< B chain_flags, or empty
};

/// Inputs in the padded layout.
template <class T>
struct padded_chain_input {
  index_t vocab_size = 0;
  index_t batch_size = 0;                ///< B
  index_t max_draft = 0;                 ///< L
  row_view<const token_t> draft_tokens;  ///< B x L, -1 after each request's drafts
  index_view draft_lengths;  ///< B lengths (int32 or int64), or empty: count up to the first -1
  batch_view<const T> draft_probs;   ///< (B x L) x V, or no rows for one-hot drafts
  batch_view<const T> target_probs;  ///< (B x (L + 1)) x V
  row_view<const request_rng> rng;   ///< B random streams
};

/// Outputs in the padded layout, caller-allocated.
struct padded_chain_output {
  row_view<token_t> output_tokens;      ///< B x (L + 1); unused slots are -1
  row_view<std::int32_t> num_accepted;  ///< B
  row_view<std::uint8_t> accepted;      ///< B x L, or empty
  row_view<std::uint32_t> flags;        ///< B, or empty
};

namespace detail {

/// Where one request's data lives, in either layout.
struct chain_segment {
  index_t length;      ///< L_b
  index_t draft_row;   ///< first draft token / draft row / accepted flag
  index_t target_row;  ///< first output slot, and first target row without a given bonus
  /// The caller's bonus token (chain_batch_input::bonus_tokens[b]), emitted when all drafts are
  /// accepted; the target rows then hold no bonus row and start at draft_row. -1: the bonus is
  /// sampled from target row target_row + length.
  token_t given_bonus = no_token;

  /// Row of the target rows holding p_{i+1}.
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr index_t target_row_of(index_t i) const noexcept {
    return (given_bonus == no_token ? target_row : draft_row) + i;
  }
};

SPECULA_HOST_DEVICE constexpr chain_segment flattened_segment(index_view offsets,
                                                              index_t b) noexcept {
  return {offsets[b + 1] - offsets[b], offsets[b], offsets[b] + b};
}

/// The segment of request b with its given bonus token, if any (host entry points).
template <class T>
constexpr chain_segment flattened_segment(const chain_batch_input<T>& in, index_t b) noexcept {
  chain_segment s = flattened_segment(in.draft_offsets, b);
  if (!in.bonus_tokens.empty()) s.given_bonus = in.bonus_tokens[b];
  return s;
}

SPECULA_HOST_DEVICE constexpr index_t padded_length(row_view<const token_t> tokens,
                                                    index_view lengths, index_t max_draft,
                                                    index_t b) noexcept {
  if (!lengths.empty()) return lengths[b];
  index_t n = 0;
  while (n < max_draft && tokens[b * max_draft + n] != no_token) ++n;
  return n;
}

/// Runs verify_chain_request for one segment, with dense or one-hot proposals. `target_probs`
/// may be any batch of rows with row(i) (the fused device path passes transformed logits).
template <class Rule, class T, class TargetRows, class Passes = sequential_passes>
SPECULA_HOST_DEVICE chain_request_result
run_segment(const Rule& rule, const request_rng& rng, const chain_segment& s, const token_t* tokens,
            batch_view<const T> draft_probs, const TargetRows& target_probs, double residual_floor,
            token_t* out_tokens, std::uint8_t* accepted, const Passes& passes = {}) {
  philox_source src{rng};
  auto target_row = [&](index_t i) { return target_probs.row(s.target_row_of(i)); };
  const token_t* drafts = tokens + s.draft_row;
  std::uint8_t* acc = accepted == nullptr ? nullptr : accepted + s.draft_row;
  token_t* out = out_tokens + s.target_row;
  auto run = [&](const auto& proposal) {
    if (s.given_bonus == no_token)
      return verify_chain_request(rule, src, s.length, drafts, target_row, proposal, residual_floor,
                                  out, acc, passes);
    chain_request_result r = verify_chain_drafts(rule, src, s.length, drafts, target_row, proposal,
                                                 residual_floor, out, acc, passes);
    if ((r.flags & chain_bonus) != 0) {
      r.emitted = s.given_bonus;
      r.flags |= chain_valid;
      out[s.length] = s.given_bonus;
    }
    return r;
  };
  if (draft_probs.rows > 0)
    return run([&](index_t i) { return dense_proposal<T>{draft_probs.row(s.draft_row + i)}; });
  return run([&](index_t i) { return one_hot_proposal{drafts[i]}; });
}

/// The message of a -1 inside a request's counted drafts when placeholders are refused (every
/// entry point words it so, the Python package included).
inline constexpr const char* placeholder_refused =
    "-1 inside a request's counted drafts (a placeholder: pass placeholders='reject' / "
    "draft_placeholders::reject for vLLM's rule, which rejects the draft at that position)";

/// Whether a checked call with this rule and these options takes -1 inside the counted drafts:
/// draft_placeholders::reject with a scalar rule (a row-aware rule binds the drafted token).
template <class Rule>
[[nodiscard]] constexpr bool takes_placeholders(const chain_options& o) noexcept {
  using R = typename unwrap_per_request<Rule>::type;
  constexpr bool binds = requires(const R& r, const row_view<const float>& p, token_t x) {
    rule_at(r, index_t{0}).bind(p, x);
  };
  return o.placeholders == draft_placeholders::reject && !binds;
}

/// The detail text of status::zero_draft_probability for a drafted token or child.
inline constexpr const char* zero_draft_text =
    "a drafted token must have positive probability in its proposal row";

/// Validates drafted tokens of a segment and, when `entries` (check_level::full), the
/// probabilities the verifier reads at them: q(x) (positive) and p(x) at every drafted position.
/// At check_level::reads the verifier checks them itself as it reads them (check_pointwise), so
/// drafts after a rejection are not checked.
template <class T>
void validate_segment_drafts(const chain_segment& s, index_t b, const token_t* tokens,
                             batch_view<const T> draft_probs, batch_view<const T> target_probs,
                             index_t vocab, bool padded, index_t max_draft, bool entries,
                             bool placeholders = false) {
  for (index_t i = 0; i < s.length; ++i) {
    const token_t x = tokens[s.draft_row + i];
    const index_t row = padded ? b : s.draft_row + i;
    const index_t col = padded ? i : -1;
    if (x == no_token && placeholders) continue;  // rejected at its position; nothing read at x
    if (x == no_token)
      throw_if_failed({status::bad_padding, row, col, -1.0}, "draft_tokens", placeholder_refused);
    if (x < 0 || static_cast<index_t>(x) >= vocab)
      throw_if_failed({status::token_out_of_range, row, col, static_cast<double>(x)},
                      "draft_tokens", ("vocab_size is " + std::to_string(vocab)).c_str());
    if (!entries) continue;  // check_level::reads: checked as the verifier reads them
    if (draft_probs.rows > 0) {
      const auto qx = static_cast<double>(draft_probs.row(s.draft_row + i)[x]);
      check_entry(qx, "draft_probs", s.draft_row + i, x);
      if (!(qx > 0.0))
        throw_if_failed({status::zero_draft_probability, s.draft_row + i, x, qx}, "draft_probs",
                        zero_draft_text);
    }
    check_entry(static_cast<double>(target_probs.row(s.target_row_of(i))[x]), "target_probs",
                s.target_row_of(i), x);
  }
  if (padded) {
    for (index_t i = s.length; i < max_draft; ++i)
      if (tokens[s.draft_row + i] != no_token)
        throw_if_failed({status::bad_padding, b, i, static_cast<double>(tokens[s.draft_row + i])},
                        "draft_tokens", "a token after the request's draft length must be -1");
  }
}

/// Shape checks, then every row checked under `policy` (rows split over threads with `par`; the
/// error reported is the first failing row in row order either way).
template <class T>
void validate_row_shape(batch_view<const T> rows, index_t expected_rows, index_t vocab,
                        const char* argument) {
  require_size(rows.rows, expected_rows, argument, "number of rows");
  require_size(rows.cols, vocab, argument, "row length must equal vocab_size");
  if (rows.rows > 1 && rows.row_stride < rows.cols)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(rows.row_stride)},
                    argument, "row_stride must be at least the row length");
  if (rows.rows > 0 && rows.data == nullptr)
    throw_if_failed({status::empty_input, -1, -1, 0.0}, argument, "null data pointer");
}

/// Shape checks, then (unless `shape_only`) every row checked under `policy`.
template <host::policy Policy, class T>
void validate_rows(const Policy& policy, batch_view<const T> rows, index_t expected_rows,
                   index_t vocab, const char* argument, double tolerance, bool shape_only = false) {
  validate_row_shape(rows, expected_rows, vocab, argument);
  if (shape_only) return;
  host::for_each_index(policy, rows.rows, [&](index_t r) {
    throw_if_failed(check_probability_row<T>(rows.row(r), tolerance, r), argument);
  });
}

/// Whether check_level::reads can check the rows a verifier reads as it reads them: the rows
/// must reach the passes through a dense form (core/simd.hpp), which the exact rule over float
/// rows provides. Other rules and row types are validated at check_level::full.
template <class Rule, class T>
inline constexpr bool checks_reads = [] {
  if constexpr (is_per_request<Rule>::value)
    return residual_is_positive_difference<typename is_per_request<Rule>::rule_type> &&
           std::is_same_v<T, float>;
  else
    return residual_is_positive_difference<Rule> && std::is_same_v<T, float>;
}();

/// Whether a checked call with these options scans every row before verifying.
template <class Rule, class T>
[[nodiscard]] constexpr bool scans_all_rows(check_level level) noexcept {
  return level == check_level::full || !checks_reads<Rule, T>;
}

/// Throws the failure recorded by checking_passes, naming the argument and row it belongs to.
template <class T>
void throw_read_failure(const row_read_log& log, batch_view<const T> target_probs,
                        batch_view<const T> draft_probs) {
  if (log.failed_row == nullptr) return;
  diagnostic d = log.failure;
  auto row_in = [&](batch_view<const T> rows) -> index_t {
    if (rows.rows == 0 || rows.data == nullptr) return -1;
    const auto* first = reinterpret_cast<const float*>(rows.data);
    const std::ptrdiff_t offset = log.failed_row - first;
    const index_t stride = rows.row_stride > 0 ? rows.row_stride : rows.cols;
    if (offset < 0 || offset >= static_cast<std::ptrdiff_t>(rows.rows * stride)) return -1;
    return static_cast<index_t>(offset) / stride;
  };
  const index_t target_row = log.failed_in_proposal ? -1 : row_in(target_probs);
  if (target_row >= 0) {
    d.row = target_row;
    throw_if_failed(d, "target_probs");
  }
  d.row = row_in(draft_probs);
  throw_if_failed(d, "draft_probs",
                  d.code == status::zero_draft_probability ? zero_draft_text : "");
}

inline void validate_options(const chain_options& o) {
  validate_sum_tolerance(o.sum_tolerance, "options.sum_tolerance");
  require_parameter(o.residual_floor >= 0.0, "options.residual_floor", o.residual_floor,
                    "must be >= 0");
}

/// B of the flattened layout: draft_offsets holds B + 1 entries; an empty draft_offsets is an
/// empty batch too.
SPECULA_HOST_DEVICE constexpr index_t flattened_batch(index_view offsets) noexcept {
  return offsets.size > 0 ? offsets.size - 1 : 0;
}

/// Drafted tokens in all of a flattened batch (draft_offsets[B]; 0 for an empty batch).
SPECULA_HOST_DEVICE constexpr index_t flattened_drafts(index_view offsets) noexcept {
  return offsets.size > 0 ? offsets[offsets.size - 1] : 0;
}

inline index_t batch_size_of(const auto& in) {
  if constexpr (requires { in.draft_offsets; })
    return flattened_batch(in.draft_offsets);
  else
    return in.batch_size;
}

inline void write_result(const chain_request_result& r, index_t b, row_view<std::int32_t> n,
                         row_view<std::uint32_t> flags) {
  n[b] = r.num_accepted;
  if (!flags.empty()) flags[b] = r.flags;
}

/// Checks vocab_size, draft_offsets and the length of draft_tokens of the flattened layout;
/// returns B.
template <class T>
index_t validate_flattened_shape(const chain_batch_input<T>& in) {
  require_parameter(in.vocab_size > 0, "vocab_size", static_cast<double>(in.vocab_size),
                    "must be positive");
  const index_t batch = flattened_batch(in.draft_offsets);
  if (batch == 0) return 0;  // an empty batch: nothing to check or do
  if (in.draft_offsets[0] != 0)
    throw_if_failed({status::invalid_parameter, 0, -1, static_cast<double>(in.draft_offsets[0])},
                    "draft_offsets", "the first offset must be 0");
  for (index_t b = 0; b < batch; ++b)
    if (in.draft_offsets[b + 1] < in.draft_offsets[b])
      throw_if_failed(
          {status::invalid_parameter, b + 1, -1, static_cast<double>(in.draft_offsets[b + 1])},
          "draft_offsets", "offsets must be non-decreasing");
  require_size(in.draft_tokens.size, in.draft_offsets[batch], "draft_tokens",
               "length must equal draft_offsets[B]");
  return batch;
}

/// Checks bonus_tokens of the flattened layout (B ids in [0, vocab), or empty); returns the
/// number of target rows the batch needs: num_draft + B, or num_draft with bonus tokens.
template <class T>
index_t validate_bonus_tokens(const chain_batch_input<T>& in, index_t num_draft, index_t batch) {
  if (in.bonus_tokens.empty()) return num_draft + batch;
  require_size(in.bonus_tokens.size, batch, "bonus_tokens", "length must be B");
  if (in.bonus_tokens.data == nullptr)
    throw_if_failed({status::empty_input, -1, -1, 0.0}, "bonus_tokens", "null data pointer");
  for (index_t b = 0; b < batch; ++b) {
    const token_t x = in.bonus_tokens[b];
    if (x < 0 || static_cast<index_t>(x) >= in.vocab_size)
      throw_if_failed({status::token_out_of_range, b, -1, static_cast<double>(x)}, "bonus_tokens",
                      ("vocab_size is " + std::to_string(in.vocab_size)).c_str());
  }
  return num_draft;
}

/// Checks the output extents of the flattened layout.
inline void validate_flattened_outputs(const chain_batch_output& out, index_t num_draft,
                                       index_t batch) {
  require_size(out.output_tokens.size, num_draft + batch, "output_tokens",
               "length must be num_draft + B");
  require_size(out.num_accepted.size, batch, "num_accepted", "length must be B");
  if (!out.accepted.empty())
    require_size(out.accepted.size, num_draft, "accepted", "length must be num_draft");
  if (!out.flags.empty()) require_size(out.flags.size, batch, "flags", "length must be B");
}

}  // namespace detail

namespace detail {

/// Validates flattened-layout inputs and outputs; scans every row only when `scan_rows`.
template <host::policy Policy, class T>
void validate_chain_input(const Policy& policy, const chain_batch_input<T>& in,
                          const chain_batch_output& out, const chain_options& options,
                          bool scan_rows, bool placeholders = false) {
  detail::validate_options(options);
  const index_t batch = detail::validate_flattened_shape(in);
  if (batch == 0) return;  // B = 0 is a no-op
  const index_t num_draft = in.draft_offsets[batch];
  if (!in.is_greedy.empty())
    detail::require_size(in.is_greedy.size, batch, "is_greedy", "one flag per request, or empty");
  if (in.is_greedy.empty())
    detail::require_streams(in.rng, batch);
  else
    detail::require_streams(in.rng, batch, in.is_greedy);  // greedy requests make no draw
  const index_t target_rows = detail::validate_bonus_tokens(in, num_draft, batch);
  detail::validate_rows(policy, in.target_probs, target_rows, in.vocab_size, "target_probs",
                        options.sum_tolerance, !scan_rows);
  if (in.draft_probs.rows > 0)
    detail::validate_rows(policy, in.draft_probs, num_draft, in.vocab_size, "draft_probs",
                          options.sum_tolerance, !scan_rows);
  if (!in.is_greedy.empty()) {
    // Greedy requests read their rows through argmax, which checks nothing: scan them here.
    if (!scan_rows)
      for (index_t b = 0; b < batch; ++b) {
        if (in.is_greedy[b] == 0) continue;
        const auto s = detail::flattened_segment(in, b);
        const index_t rows = s.length + (s.given_bonus == no_token ? 1 : 0);
        for (index_t i = 0; i < rows; ++i) {
          const index_t row = s.target_row_of(i);
          throw_if_failed(
              check_probability_row(in.target_probs.row(row), options.sum_tolerance, row),
              "target_probs");
        }
      }
  }
  for (index_t b = 0; b < batch; ++b)
    detail::validate_segment_drafts(detail::flattened_segment(in, b), b, in.draft_tokens.data,
                                    in.draft_probs, in.target_probs, in.vocab_size, false, 0,
                                    scan_rows, placeholders);
  detail::validate_flattened_outputs(out, num_draft, batch);
}

/// Validates padded-layout inputs and outputs; scans every row only when `scan_rows`.
template <host::policy Policy, class T>
void validate_chain_input(const Policy& policy, const padded_chain_input<T>& in,
                          const padded_chain_output& out, const chain_options& options,
                          bool scan_rows, bool placeholders = false) {
  detail::validate_options(options);
  require_parameter(in.vocab_size > 0, "vocab_size", static_cast<double>(in.vocab_size),
                    "must be positive");
  require_parameter(in.batch_size >= 0, "batch_size", static_cast<double>(in.batch_size),
                    "must be >= 0");
  if (in.batch_size == 0) return;  // B = 0 is a no-op
  require_parameter(in.max_draft >= 0, "max_draft", static_cast<double>(in.max_draft),
                    "must be >= 0");
  const index_t batch = in.batch_size;
  const index_t len = in.max_draft;
  detail::require_size(in.draft_tokens.size, batch * len, "draft_tokens", "length must be B * L");
  if (!in.draft_lengths.empty()) {
    detail::require_size(in.draft_lengths.size, batch, "draft_lengths", "length must be B");
    for (index_t b = 0; b < batch; ++b)
      if (in.draft_lengths[b] < 0 || in.draft_lengths[b] > len)
        throw_if_failed(
            {status::invalid_parameter, b, -1, static_cast<double>(in.draft_lengths[b])},
            "draft_lengths", ("must be in [0, " + std::to_string(len) + "]").c_str());
  }
  detail::require_streams(in.rng, batch);
  detail::validate_rows(policy, in.target_probs, batch * (len + 1), in.vocab_size, "target_probs",
                        options.sum_tolerance, !scan_rows);
  if (in.draft_probs.rows > 0)
    detail::validate_rows(policy, in.draft_probs, batch * len, in.vocab_size, "draft_probs",
                          options.sum_tolerance, !scan_rows);
  for (index_t b = 0; b < batch; ++b) {
    const index_t n = detail::padded_length(in.draft_tokens, in.draft_lengths, len, b);
    detail::validate_segment_drafts(detail::chain_segment{n, b * len, b * (len + 1)}, b,
                                    in.draft_tokens.data, in.draft_probs, in.target_probs,
                                    in.vocab_size, true, len, scan_rows, placeholders);
  }
  detail::require_size(out.output_tokens.size, batch * (len + 1), "output_tokens",
                       "length must be B * (L + 1)");
  detail::require_size(out.num_accepted.size, batch, "num_accepted", "length must be B");
  if (!out.accepted.empty())
    detail::require_size(out.accepted.size, batch * len, "accepted", "length must be B * L");
  if (!out.flags.empty()) detail::require_size(out.flags.size, batch, "flags", "length must be B");
}

}  // namespace detail

/// Validates flattened-layout inputs and outputs, every row included; throws invalid_input on
/// the first problem.
template <host::policy Policy, class T>
void validate_chain_batch(const Policy& policy, const chain_batch_input<T>& in,
                          const chain_batch_output& out, const chain_options& options = {}) {
  detail::validate_chain_input(policy, in, out, options, true,
                               options.placeholders == draft_placeholders::reject);
}

/// Validates padded-layout inputs and outputs, every row included; throws invalid_input on the
/// first problem.
template <host::policy Policy, class T>
void validate_chain_batch(const Policy& policy, const padded_chain_input<T>& in,
                          const padded_chain_output& out, const chain_options& options = {}) {
  detail::validate_chain_input(policy, in, out, options, true,
                               options.placeholders == draft_placeholders::reject);
}

/// Validates inputs and outputs of either layout on the calling thread.
template <class Input, class Output>
requires requires(const Input& in, const Output& out) { validate_chain_batch(host::seq, in, out); }
void validate_chain_batch(const Input& in, const Output& out, const chain_options& options = {}) {
  validate_chain_batch(host::seq, in, out, options);
}

namespace detail {

/// Runs `run(passes)` for one request with plain passes, or, when CheckReads, with passes that
/// validate every row read (check_level::reads) and throw the first failure afterwards.
template <bool CheckReads, class T, class Run>
chain_request_result with_passes(double sum_tolerance, batch_view<const T> target_probs,
                                 batch_view<const T> draft_probs, Run&& run) {
  if constexpr (CheckReads) {
    row_read_log log;
    log.sum_tolerance = sum_tolerance;
    const chain_request_result r = run(checking_passes{&log});
    throw_read_failure(log, target_probs, draft_probs);
    return r;
  } else {
    (void)sum_tolerance;
    (void)target_probs;
    (void)draft_probs;
    return run(sequential_passes{});
  }
}

/// Verifies request b (segment s) of either layout and writes its count and flags.
template <bool CheckReads, class Input, class Output, class Rule>
void verify_segment(const Input& in, const Output& out, const chain_options& options,
                    const Rule& rule, const chain_segment& s, index_t b, std::uint8_t* accepted) {
  bool greedy = false;
  if constexpr (requires { in.is_greedy; }) greedy = !in.is_greedy.empty() && in.is_greedy[b] != 0;
  const auto r = with_passes<CheckReads>(
      options.sum_tolerance, in.target_probs, in.draft_probs, [&](const auto& passes) {
        if (greedy)
          return greedy_chain_request(
              s.length, in.draft_tokens.data + s.draft_row,
              [&](index_t i) { return in.target_probs.row(s.target_row_of(i)); },
              out.output_tokens.data + s.target_row,
              accepted == nullptr ? nullptr : accepted + s.draft_row, passes, s.given_bonus);
        return run_segment(request_rule(rule, b), in.rng[b], s, in.draft_tokens.data,
                           in.draft_probs, in.target_probs, options.residual_floor,
                           out.output_tokens.data, accepted, passes);
      });
  write_result(r, b, out.num_accepted, out.flags);
}

template <bool CheckReads, host::policy Policy, class T, class Rule>
void run_chain_batch(const Policy& policy, const chain_batch_input<T>& in,
                     const chain_batch_output& out, const chain_options& options,
                     const Rule& rule) {
  const index_t batch = flattened_batch(in.draft_offsets);
  std::uint8_t* accepted = out.accepted.empty() ? nullptr : out.accepted.data;
  host::for_each_index(policy, batch, [&](index_t b) {
    const auto s = flattened_segment(in, b);
    verify_segment<CheckReads>(in, out, options, rule, s, b, accepted);
  });
}

template <bool CheckReads, host::policy Policy, class T, class Rule>
void run_chain_batch(const Policy& policy, const padded_chain_input<T>& in,
                     const padded_chain_output& out, const chain_options& options,
                     const Rule& rule) {
  const index_t len = in.max_draft;
  std::uint8_t* accepted = out.accepted.empty() ? nullptr : out.accepted.data;
  host::for_each_index(policy, in.batch_size, [&](index_t b) {
    const index_t n = padded_length(in.draft_tokens, in.draft_lengths, len, b);
    const chain_segment s{n, b * len, b * (len + 1)};
    verify_segment<CheckReads>(in, out, options, rule, s, b, accepted);
    // Slots past the request's L_b + 1 outputs and L_b flags belong to padding.
    for (index_t i = n + 1; i <= len; ++i) out.output_tokens[b * (len + 1) + i] = no_token;
    if (accepted != nullptr)
      for (index_t i = n; i < len; ++i) accepted[b * len + i] = 0;
  });
}

}  // namespace detail

/// Chain verification without input validation (flattened layout). Undefined behaviour on
/// invalid input; use verify_chain unless the inputs are valid by construction.
template <host::policy Policy, class T, batch_chain_rule Rule = exact_rule>
void verify_chain_unchecked(const Policy& policy, const chain_batch_input<T>& in,
                            const chain_batch_output& out, const chain_options& options = {},
                            const Rule& rule = {}) {
  detail::run_chain_batch<false>(policy, in, out, options, rule);
}

/// Chain verification without input validation (padded layout).
template <host::policy Policy, class T, batch_chain_rule Rule = exact_rule>
void verify_chain_unchecked(const Policy& policy, const padded_chain_input<T>& in,
                            const padded_chain_output& out, const chain_options& options = {},
                            const Rule& rule = {}) {
  detail::run_chain_batch<false>(policy, in, out, options, rule);
}

/// Checked chain verification (either layout): validates inputs and outputs, then verifies every
/// request under `policy` with `rule` (the exact rule by default). At check_level::reads (the
/// default) the rows and the entries p(x), q(x) are checked as the verifier reads them; a bad one
/// then throws after the requests before it were verified, so outputs are unspecified whenever
/// the call throws.
template <host::policy Policy, class Input, class Output, batch_chain_rule Rule = exact_rule>
requires requires(const Policy& p, const Input& in, const Output& out) {
  validate_chain_batch(p, in, out);
}
void verify_chain(const Policy& policy, const Input& in, const Output& out,
                  const chain_options& options = {}, const Rule& rule = {}) {
  using T = typename decltype(in.target_probs)::value_type;
  const bool scan = detail::scans_all_rows<Rule, T>(options.check);
  detail::validate_chain_input(policy, in, out, options, scan,
                               detail::takes_placeholders<Rule>(options));
  detail::validate_rule(rule, in.vocab_size, detail::batch_size_of(in));
  if constexpr (detail::checks_reads<Rule, T>) {
    if (!scan) {
      detail::run_chain_batch<true>(policy, in, out, options, rule);
      return;
    }
  }
  detail::run_chain_batch<false>(policy, in, out, options, rule);
}

}  // namespace specula
