// Chain verification: the padded layout (FlashInfer's chain_speculative_sampling), the flattened
// layout (vLLM's rejection sampler), greedy chains, and K candidates at one position.

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "common.hpp"
#ifdef SPECULA_PYTHON_CUDA
#include "cuda_chain.hpp"
#endif

namespace specula::python {

namespace {

thread_local std::vector<token_t> token_buffer;
thread_local std::vector<token_t> bonus_buffer;
thread_local std::vector<token_t> flat_output_buffer;
thread_local std::vector<std::int64_t> offsets_buffer;

chain_options chain_options_of(double sum_tolerance, double residual_floor,
                               const std::string& check, const std::string& placeholders) {
  chain_options o;
  o.sum_tolerance = sum_tolerance;
  o.residual_floor = residual_floor;
  o.check = parse_check(check);
  if (placeholders == "reject")
    o.placeholders = draft_placeholders::reject;
  else if (placeholders != "refuse")
    value_error("specula: placeholders must be 'refuse' or 'reject' (got '" + placeholders + "')");
  return o;
}

/// Draft rows of the same element type as the target rows, or no rows.
template <class T>
batch_view<const T> optional_rows(const array& a, const char* name, const array& target) {
  if (!a.is_valid()) return {};
  if (a.dtype() != target.dtype())
    type_error(std::string("specula: ") + name + " must have the dtype of target_probs (" +
               dtype_name(target.dtype()) + "; got " + dtype_name(a.dtype()) + ")");
  return prob_rows<T>(a, name, wide_rows_buffer(1));
}

/// The output arrays of a chain call: tokens, counts, and the optional per-position and
/// per-request flags.
struct chain_output_arrays {
  array tokens;
  array counts;
  array accepted;
  array flags;

  chain_output_arrays(nb::handle t, nb::handle c, nb::handle a, nb::handle f)
      : tokens(import_array(t, "output_token_ids", true, true)),
        counts(import_array(c, "num_accepted", true, true)),
        accepted(import_optional(a, "accepted", true, true)),
        flags(import_optional(f, "flags", true, true)) {}

  /// The C++ output struct (padded_chain_output or chain_batch_output) writing the tokens to
  /// `out_tokens`.
  template <class Output>
  [[nodiscard]] Output view(row_view<token_t> out_tokens) const {
    return {out_tokens, int32_output(counts, "num_accepted"), flag8_output(accepted, "accepted"),
            flags_output(flags, "flags")};
  }
};

template <class Input, class Output>
void record_chain_pointers(const Input& in, const Output& out) {
  record_pointer("draft_probs", in.draft_probs.data);
  record_pointer("draft_token_ids", in.draft_tokens.data);
  record_pointer("target_probs", in.target_probs.data);
  record_pointer("output_token_ids", out.output_tokens.data);
  record_pointer("num_accepted", out.num_accepted.data);
}

/// verify_chain with the rule of `rule_arg` under the policy of `threads`, without the GIL,
/// `repeats` times (more than once only for the benchmark, bench/python); returns the mean
/// nanoseconds per call.
template <class Input, class Output>
double run_verify_chain(nb::handle rule_arg, int threads, const Input& in, const Output& out,
                        const chain_options& options, int repeats = 1) {
  record_chain_pointers(in, out);
  double ns = 0.0;
  visit_rule(rule_arg, detail::batch_size_of(in), [&](const auto& rule) {
    nb::gil_scoped_release release;
    with_policy(threads, [&](const auto& policy) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < repeats; ++i) verify_chain(policy, in, out, options, rule);
      ns = static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - start)
                                   .count()) /
           repeats;
    });
  });
  return ns;
}

#ifdef SPECULA_PYTHON_CUDA
/// The rule of a call on CUDA tensors: one exact or relaxed rule (their data lives in the rule;
/// the others point to host memory).
cuda_path::device_rule device_rule_of(nb::handle rule_arg) {
  if (PyList_Check(rule_arg.ptr()) != 0 || PyTuple_Check(rule_arg.ptr()) != 0)
    value_error("specula: rule: per-request rules are not taken with CUDA tensors in this build");
  const rule_holder& r = rule_of(rule_arg);
  if (const auto* relaxed = std::get_if<relaxed_rule>(&r.rule)) return *relaxed;
  if (std::holds_alternative<exact_rule>(r.rule)) return exact_rule{};
  value_error(
      "specula: rule: CUDA tensors take the exact rule or relaxed_rule in this build (not " +
      r.description + ")");
}
#endif

/// ValueError unless padded-layout rows `a` ((B, n, V) or (B * n, V)) hold n rows for each of
/// the B requests of draft_token_ids (B, L).
void require_padded_rows(const array& a, const char* name, index_t batch, index_t max_draft,
                         index_t n) {
  const auto got = static_cast<index_t>(a.shape(0));
  if (a.ndim() == 3 ? got == batch && static_cast<index_t>(a.shape(1)) == n : got == batch * n)
    return;
  std::string shape = "(" + std::to_string(a.shape(0));
  for (std::size_t d = 1; d < a.ndim(); ++d) shape += ", " + std::to_string(a.shape(d));
  shape += ")";
  value_error(std::string("specula: ") + name + " has shape " + shape +
              ", but draft_token_ids has B = " + std::to_string(batch) +
              " requests of L = " + std::to_string(max_draft) + " drafts: " + name +
              " must have shape (" + std::to_string(batch) + ", " + std::to_string(n) +
              ", V) or (" + std::to_string(batch * n) + ", V)");
}

double chain_padded_repeated(nb::handle draft_probs_arg, nb::handle draft_token_ids_arg,
                             nb::handle target_probs_arg, nb::handle draft_lengths_arg,
                             nb::handle seeds, nb::handle request_ids, nb::handle steps,
                             nb::handle output_token_ids_arg, nb::handle num_accepted_arg,
                             nb::handle accepted_arg, nb::handle flags_arg, nb::handle rule_arg,
                             double sum_tolerance, double residual_floor, const std::string& check,
                             const std::string& placeholders, int threads, int repeats,
                             std::uintptr_t stream) {
  clear_pointers();
  if (repeats < 1) value_error("specula: repeats must be >= 1");
  const array target = import_array(target_probs_arg, "target_probs", false, true);
  const array tokens = import_array(draft_token_ids_arg, "draft_token_ids", false, true);
  const array draft = import_optional(draft_probs_arg, "draft_probs", false, true);
  const array lengths = import_optional(draft_lengths_arg, "draft_lengths", false, true);
  const chain_output_arrays outputs(output_token_ids_arg, num_accepted_arg, accepted_arg,
                                    flags_arg);
  const bool cuda = call_on_cuda({&target, "target_probs"}, {{&tokens, "draft_token_ids"},
                                                             {&draft, "draft_probs"},
                                                             {&lengths, "draft_lengths"},
                                                             {&outputs.tokens, "output_token_ids"},
                                                             {&outputs.counts, "num_accepted"},
                                                             {&outputs.accepted, "accepted"},
                                                             {&outputs.flags, "flags"}});
  if (cuda) require_dtype<std::int32_t>(tokens, "draft_token_ids", "int32 (CUDA tensors)");
  if (cuda && is_16bit_float(target))
    type_error(
        "specula: target_probs must have dtype float32 or float64 with CUDA tensors in this "
        "build (got " +
        dtype_name(target.dtype()) + ")");
  require_ndim(tokens, "draft_token_ids", 2, "(B, L)");
  if (target.ndim() != 3 && target.ndim() != 2)
    value_error("specula: target_probs must have shape (B, L + 1, V) or (B * (L + 1), V)");
  if (draft.is_valid() && draft.ndim() != 3 && draft.ndim() != 2)
    value_error("specula: draft_probs must have shape (B, L, V) or (B * L, V), or be None");
  const auto batch = static_cast<index_t>(tokens.shape(0));
  const auto max_draft = static_cast<index_t>(tokens.shape(1));
  const auto vocab = static_cast<index_t>(target.shape(target.ndim() - 1));
  const auto drafts = token_array(tokens, "draft_token_ids", token_buffer);
  const index_view lens = lengths.is_valid() ? index_array(lengths, "draft_lengths") : index_view{};
  // B comes from draft_token_ids: rows of the probabilities for another B are named here, before
  // the per-request seeds are read.
  require_padded_rows(target, "target_probs", batch, max_draft, max_draft + 1);
  if (draft.is_valid()) require_padded_rows(draft, "draft_probs", batch, max_draft, max_draft);
  const auto rng = make_rng(seeds, request_ids, steps, batch);
  const auto out =
      outputs.view<padded_chain_output>(int32_output(outputs.tokens, "output_token_ids"));
  const chain_options options =
      chain_options_of(sum_tolerance, residual_floor, check, placeholders);
  return with_prob_type(target, "target_probs", [&](auto element) {
    using T = decltype(element);
    const padded_chain_input<T> in{vocab,
                                   batch,
                                   max_draft,
                                   drafts,
                                   lens,
                                   optional_rows<T>(draft, "draft_probs", target),
                                   prob_rows<T>(target, "target_probs", wide_rows_buffer(0)),
                                   rng};
#ifdef SPECULA_PYTHON_CUDA
    if (cuda) {
      if (options.placeholders == draft_placeholders::reject)
        value_error("specula: placeholders='reject' is not taken with CUDA tensors in this build");
      const std::string error =
          cuda_path::verify_padded({static_cast<int>(target.device_id()), stream}, in, out, options,
                                   device_rule_of(rule_arg));
      if (!error.empty()) value_error(error);
      return 0.0;
    }
#endif
    return run_verify_chain(rule_arg, threads, in, out, options, repeats);
  });
}

void chain_padded(nb::handle draft_probs_arg, nb::handle draft_token_ids_arg,
                  nb::handle target_probs_arg, nb::handle draft_lengths_arg, nb::handle seeds,
                  nb::handle request_ids, nb::handle steps, nb::handle output_token_ids_arg,
                  nb::handle num_accepted_arg, nb::handle accepted_arg, nb::handle flags_arg,
                  nb::handle rule_arg, double sum_tolerance, double residual_floor,
                  const std::string& check, const std::string& placeholders, int threads,
                  std::uintptr_t stream) {
  chain_padded_repeated(draft_probs_arg, draft_token_ids_arg, target_probs_arg, draft_lengths_arg,
                        seeds, request_ids, steps, output_token_ids_arg, num_accepted_arg,
                        accepted_arg, flags_arg, rule_arg, sum_tolerance, residual_floor, check,
                        placeholders, threads, 1, stream);
}

/// B of a flattened call and draft_offsets with a leading 0 (vLLM's cu_num_draft_tokens has
/// B entries without it: then the B + 1 offsets are copied into a buffer). `batch_from` says
/// where B came from, for messages.
index_view flattened_offsets(const array& cu, index_t batch, const std::string& batch_from) {
  const index_view v = index_array(cu, "cu_num_draft_tokens");
  if (v.size == batch + 1) {
    if (batch > 0 && v[0] != 0)
      value_error("specula: cu_num_draft_tokens has B + 1 entries (B = " + batch_from + " = " +
                  std::to_string(batch) +
                  ") but does not start with 0 (B entries are vLLM's cumulative counts, B + 1 "
                  "entries specula's draft_offsets)");
    return v;
  }
  if (v.size != batch)
    value_error("specula: cu_num_draft_tokens must have B or B + 1 entries (B = " + batch_from +
                " = " + std::to_string(batch) + "; got " + std::to_string(v.size) + ")");
  // Checked here in the caller's indexing (the library would name the copy's draft_offsets,
  // one index further on).
  for (index_t b = 0; b < batch; ++b) {
    const index_t before = b > 0 ? v[b - 1] : 0;
    if (v[b] < before)
      value_error("specula: cu_num_draft_tokens[" + std::to_string(b) +
                  "]: cumulative draft counts must be non-negative and non-decreasing (value " +
                  std::to_string(v[b]) + (b > 0 ? " after " + std::to_string(before) : "") + ")");
  }
  offsets_buffer.resize(static_cast<std::size_t>(batch + 1));
  offsets_buffer[0] = 0;
  for (index_t b = 0; b < batch; ++b) offsets_buffer[static_cast<std::size_t>(b + 1)] = v[b];
  return {offsets_buffer.data(), batch + 1};
}

/// Requests [first, last) of a flattened batch as a batch of their own (views, and a buffer of
/// their offsets rebased to 0).
template <class T>
struct flat_range {
  std::vector<std::int64_t> offsets;
  chain_batch_input<T> in;
  chain_batch_output out;

  flat_range(const chain_batch_input<T>& all, const chain_batch_output& all_out, index_t first,
             index_t last)
      : offsets(static_cast<std::size_t>(last - first + 1)) {
    const index_t d0 = all.draft_offsets[first];
    const index_t nd = all.draft_offsets[last] - d0;
    const index_t n = last - first;
    for (index_t b = 0; b <= n; ++b)
      offsets[static_cast<std::size_t>(b)] = all.draft_offsets[first + b] - d0;
    const bool given_bonus = !all.bonus_tokens.empty();
    auto rows = [](batch_view<const T> v, index_t start, index_t count) {
      return v.rows == 0
                 ? v
                 : batch_view<const T>{v.data + start * v.row_stride, count, v.cols, v.row_stride};
    };
    in = {all.vocab_size,
          index_view{offsets.data(), n + 1},
          all.draft_tokens.subview(d0, nd),
          rows(all.draft_probs, d0, nd),
          given_bonus ? rows(all.target_probs, d0, nd) : rows(all.target_probs, d0 + first, nd + n),
          all.rng.empty() ? all.rng : all.rng.subview(first, n),
          given_bonus ? all.bonus_tokens.subview(first, n) : all.bonus_tokens};
    out = {all_out.output_tokens.subview(d0 + first, nd + n),
           all_out.num_accepted.subview(first, n),
           all_out.accepted.empty() ? all_out.accepted : all_out.accepted.subview(d0, nd),
           all_out.flags.empty() ? all_out.flags : all_out.flags.subview(first, n)};
  }
};

/// A batch whose requests are verified by the greedy rule where `greedy_mask` is 1 and by
/// sampling (rule_arg) elsewhere: each run of consecutive requests of one kind is one call of
/// verify_chain_greedy or verify_chain on views of its rows (nothing is copied). An error is
/// the C++ message of that run, whose indices count from the run's first request and rows.
template <class T>
void verify_mixed(nb::handle rule_arg, int threads, const chain_batch_input<T>& in,
                  const chain_batch_output& out, const chain_options& options,
                  const std::vector<std::uint8_t>& greedy_mask) {
  record_chain_pointers(in, out);
  const auto batch = static_cast<index_t>(greedy_mask.size());
  const bool per_request_rules =
      PyList_Check(rule_arg.ptr()) != 0 || PyTuple_Check(rule_arg.ptr()) != 0;
  if (per_request_rules && static_cast<index_t>(nb::len(rule_arg)) != batch)
    value_error("specula: rule must be one rule, or a sequence of one rule per request (B = " +
                std::to_string(batch) + "; got " + std::to_string(nb::len(rule_arg)) + ")");
  for (index_t first = 0; first < batch;) {
    const std::uint8_t kind = greedy_mask[static_cast<std::size_t>(first)];
    index_t last = first + 1;
    while (last < batch && greedy_mask[static_cast<std::size_t>(last)] == kind) ++last;
    const flat_range<T> r(in, out, first, last);
    try {
      if (kind != 0) {
        nb::gil_scoped_release release;
        with_policy(threads, [&](const auto& policy) {
          verify_chain_greedy(policy, r.in, r.out, options.placeholders);
        });
      } else {
        const nb::object rules = per_request_rules
                                     ? nb::steal(PySequence_GetSlice(rule_arg.ptr(), first, last))
                                     : nb::borrow(rule_arg);
        run_verify_chain(rules, threads, r.in, r.out, options);
      }
    } catch (const invalid_input& e) {
      throw invalid_input(e.code(), e.argument(), e.row(), e.column(),
                          std::string(e.what()) + " [is_greedy splits the call: in requests " +
                              std::to_string(first) + ".." + std::to_string(last - 1) +
                              ", verified " + (kind != 0 ? "greedily" : "by sampling") +
                              ", whose indices count from request " + std::to_string(first) + "]");
    }
    first = last;
  }
}

#ifdef SPECULA_PYTHON_CUDA
/// chain_flat on CUDA arrays: shapes checked here, everything else on the device (bad tokens
/// and offsets flag the request with chain_invalid_input; rows are not validated).
void chain_flat_cuda(const array& target, const char* target_name, const array& tokens,
                     const array& cu, const array& draft, const array& bonus,
                     const chain_output_arrays& outputs, nb::handle seeds, nb::handle request_ids,
                     nb::handle steps, nb::handle rule_arg, const chain_options& options,
                     bool greedy, nb::handle is_greedy, std::uintptr_t stream) {
  if (bonus.is_valid())
    value_error("specula: bonus_token_ids is not taken with CUDA tensors in this build");
  if (options.placeholders == draft_placeholders::reject)
    value_error("specula: placeholders='reject' is not taken with CUDA tensors in this build");
  if (!is_greedy.is_none())
    value_error("specula: is_greedy is not taken with CUDA tensors in this build");
  require_ndim(tokens, "draft_token_ids", 1, "(num_draft_tokens,)");
  require_ndim(target, target_name, 2, "(num_draft_tokens + B, V)");
  require_dtype<std::int32_t>(tokens, "draft_token_ids", "int32 (CUDA tensors)");
  const auto drafts = token_array(tokens, "draft_token_ids", token_buffer);
  const index_t batch = static_cast<index_t>(target.shape(0)) - drafts.size;
  if (batch < 0)
    value_error("specula: " + std::string(target_name) +
                " needs num_draft_tokens + B rows (one more per request than its drafts)");
  const index_view cu_view = index_array(cu, "cu_num_draft_tokens");
  if (cu_view.size != batch && cu_view.size != batch + 1)
    value_error("specula: cu_num_draft_tokens must have B or B + 1 entries (B = " +
                std::to_string(batch) + ")");
  const array& output = outputs.tokens;
  const bool padded_output = output.ndim() == 2;
  const row_view<token_t> out_tokens = int32_output(output, "output_token_ids");
  if (padded_output && static_cast<index_t>(output.shape(0)) != batch)
    value_error("specula: output_token_ids must have B = " + std::to_string(batch) + " rows");
  if (!padded_output && out_tokens.size != drafts.size + batch)
    value_error(
        "specula: output_token_ids must have shape (B, max_spec_len + 1) or "
        "(num_draft_tokens + B,)");
  const auto out =
      outputs.view<chain_batch_output>(padded_output ? row_view<token_t>{} : out_tokens);
  const auto rng =
      greedy ? row_view<const request_rng>{} : make_rng(seeds, request_ids, steps, batch);
  const cuda_path::device_rule rule =
      greedy ? cuda_path::device_rule{exact_rule{}} : device_rule_of(rule_arg);
  if (is_16bit_float(target))
    type_error("specula: " + std::string(target_name) +
               " must have dtype float32 or float64 with "
               "CUDA tensors in this build (got " +
               dtype_name(target.dtype()) + ")");
  with_prob_type(target, target_name, [&](auto element) {
    using T = decltype(element);
    const chain_batch_input<T> in{static_cast<index_t>(target.shape(1)),
                                  {},
                                  drafts,
                                  optional_rows<T>(draft, "draft_probs", target),
                                  rows_view<T>(target, target_name),
                                  rng};
    const std::string error =
        cuda_path::verify_flat({static_cast<int>(target.device_id()), stream}, in, cu_view, batch,
                               out, padded_output ? static_cast<index_t>(output.shape(1)) : 0,
                               padded_output ? out_tokens.data : nullptr, options, rule, greedy);
    if (!error.empty()) value_error(error);
  });
}
#endif

void chain_flat(nb::handle draft_probs_arg, nb::handle draft_token_ids_arg,
                nb::handle cu_num_draft_tokens_arg, nb::handle target_probs_arg,
                nb::handle bonus_token_ids_arg, nb::handle seeds, nb::handle request_ids,
                nb::handle steps, nb::handle output_token_ids_arg, nb::handle num_accepted_arg,
                nb::handle accepted_arg, nb::handle flags_arg, nb::handle rule_arg,
                double sum_tolerance, double residual_floor, const std::string& check,
                const std::string& placeholders, int threads, bool greedy, nb::handle is_greedy_arg,
                std::uintptr_t stream) {
  clear_pointers();
  const char* target_name = greedy ? "target_logits" : "target_probs";
  const array target = import_array(target_probs_arg, target_name, false, true);
  const array tokens = import_array(draft_token_ids_arg, "draft_token_ids", false, true);
  const array cu = import_array(cu_num_draft_tokens_arg, "cu_num_draft_tokens", false, true);
  const array draft = import_optional(draft_probs_arg, "draft_probs", false, true);
  const array bonus = import_optional(bonus_token_ids_arg, "bonus_token_ids", false, true);
  const chain_output_arrays outputs(output_token_ids_arg, num_accepted_arg, accepted_arg,
                                    flags_arg);
  const array& output = outputs.tokens;
  if (call_on_cuda({&target, target_name}, {{&tokens, "draft_token_ids"},
                                            {&cu, "cu_num_draft_tokens"},
                                            {&draft, "draft_probs"},
                                            {&bonus, "bonus_token_ids"},
                                            {&outputs.tokens, "output_token_ids"},
                                            {&outputs.counts, "num_accepted"},
                                            {&outputs.accepted, "accepted"},
                                            {&outputs.flags, "flags"}})) {
#ifdef SPECULA_PYTHON_CUDA
    chain_flat_cuda(target, target_name, tokens, cu, draft, bonus, outputs, seeds, request_ids,
                    steps, rule_arg,
                    chain_options_of(sum_tolerance, residual_floor, check, placeholders), greedy,
                    is_greedy_arg, stream);
#else
    (void)stream;
#endif
    return;
  }
  require_ndim(tokens, "draft_token_ids", 1, "(num_draft_tokens,)");
  require_ndim(target, greedy ? "target_logits" : "target_probs", 2, "(num_draft_tokens + B, V)");
  const auto vocab = static_cast<index_t>(target.shape(1));
  const auto drafts = token_array(tokens, "draft_token_ids", token_buffer);
  // With bonus_token_ids (vLLM's (B,) or (B, 1)), B is their count and target_probs has one row
  // per draft token; without, target_probs holds each request's bonus row too.
  row_view<const token_t> bonus_tokens{};
  if (bonus.is_valid()) {
    if (bonus.ndim() != 1 && !(bonus.ndim() == 2 && bonus.shape(1) == 1))
      value_error("specula: bonus_token_ids must have shape (B,) or (B, 1)");
    bonus_tokens = token_array(bonus, "bonus_token_ids", bonus_buffer);
  }
  const index_t batch =
      bonus.is_valid() ? bonus_tokens.size : static_cast<index_t>(target.shape(0)) - drafts.size;
  if (bonus.is_valid() && static_cast<index_t>(target.shape(0)) != drafts.size)
    value_error(
        "specula: with bonus_token_ids, target_probs needs one row per draft token "
        "(num_draft_tokens = " +
        std::to_string(drafts.size) + "; got " + std::to_string(target.shape(0)) + " rows)");
  if (batch < 0)
    value_error(
        "specula: target_probs needs num_draft_tokens + B rows (one more per request "
        "than its drafts: the bonus row); got " +
        std::to_string(target.shape(0)) + " rows for " + std::to_string(drafts.size) +
        " draft tokens");
  const index_view offsets =
      flattened_offsets(cu, batch,
                        bonus.is_valid() ? "entries of bonus_token_ids"
                                         : "rows of target_probs - number of draft tokens");
  // is_greedy: (B,) bool / uint8 / integer mask of the requests verified by the greedy rule.
  const std::vector<std::uint8_t> greedy_mask =
      greedy ? std::vector<std::uint8_t>{} : mask_of(is_greedy_arg, "is_greedy", batch);
  const auto rng = greedy ? row_view<const request_rng>{}
                          : make_rng(seeds, request_ids, steps, batch,
                                     greedy_mask.empty() ? nullptr : greedy_mask.data());
  // Outputs: (num_draft + B,) in specula's flattened layout, written in place; or vLLM's
  // (B, max_spec_len + 1), written through a buffer of num_draft + B tokens.
  const bool padded_output = output.ndim() == 2;
  if (!padded_output && output.ndim() != 1)
    value_error(
        "specula: output_token_ids must have shape (B, max_spec_len + 1) or "
        "(num_draft_tokens + B,)");
  row_view<token_t> out_tokens = int32_output(output, "output_token_ids");
  if (padded_output) {
    if (static_cast<index_t>(output.shape(0)) != batch)
      value_error("specula: output_token_ids must have B = " + std::to_string(batch) + " rows");
    flat_output_buffer.resize(static_cast<std::size_t>(drafts.size + batch));
    out_tokens = {flat_output_buffer.data(), drafts.size + batch};
  }
  const auto out = outputs.view<chain_batch_output>(out_tokens);
  const chain_options options =
      chain_options_of(sum_tolerance, residual_floor, check, placeholders);
  with_prob_type(target, greedy ? "target_logits" : "target_probs", [&](auto element) {
    using T = decltype(element);
    const chain_batch_input<T> in{vocab,
                                  offsets,
                                  drafts,
                                  optional_rows<T>(draft, "draft_probs", target),
                                  prob_rows<T>(target, target_name, wide_rows_buffer(0)),
                                  rng,
                                  bonus_tokens};
    const bool all_greedy =
        greedy || (!greedy_mask.empty() && std::find(greedy_mask.begin(), greedy_mask.end(),
                                                     std::uint8_t{0}) == greedy_mask.end());
    const bool any_greedy = all_greedy || std::find(greedy_mask.begin(), greedy_mask.end(),
                                                    std::uint8_t{1}) != greedy_mask.end();
    if (any_greedy && !all_greedy) {
      verify_mixed(rule_arg, threads, in, out, options, greedy_mask);
      return;
    }
    if (!all_greedy) {
      run_verify_chain(rule_arg, threads, in, out, options);
      return;
    }
    record_chain_pointers(in, out);
    nb::gil_scoped_release release;
    with_policy(threads, [&](const auto& policy) {
      verify_chain_greedy(policy, in, out, options.placeholders);
    });
  });
  if (padded_output) {
    // Request b's L_b + 1 slots start at draft_offsets[b] + b; the rest of its row is -1.
    const auto width = static_cast<index_t>(output.shape(1));
    for (index_t b = 0; b < batch; ++b) {
      const index_t n = offsets[b + 1] - offsets[b] + 1;
      if (n > width)
        value_error("specula: output_token_ids rows are too short: request " + std::to_string(b) +
                    " has " + std::to_string(n - 1) + " drafts, needing " + std::to_string(n) +
                    " slots (max_spec_len + 1)");
    }
    token_t* dst = static_cast<token_t*>(output.data());
    std::fill(dst, dst + batch * width, no_token);
    for (index_t b = 0; b < batch; ++b) {
      const index_t start = offsets[b] + b;
      const index_t n = offsets[b + 1] - offsets[b] + 1;
      std::copy(out_tokens.data + start, out_tokens.data + start + n, dst + b * width);
    }
  }
}

/// K candidates at one position per request: request b verifies candidates[b] against
/// target_probs[b] (and draft_probs[b]) with verify_candidates_checked.
void candidates(nb::handle target_probs_arg, nb::handle candidates_arg, nb::handle draft_probs_arg,
                nb::handle seeds, nb::handle request_ids, nb::handle steps,
                nb::handle positions_arg, bool with_replacement_sampling,
                nb::handle accepted_index_arg, nb::handle tokens_arg, nb::handle flags_arg,
                nb::handle rule_arg, double sum_tolerance, double residual_floor,
                const std::string& check, int threads) {
  clear_pointers();
  const array target = import_array(target_probs_arg, "target_probs");
  const array cand = import_array(candidates_arg, "candidates");
  const array draft = import_optional(draft_probs_arg, "draft_probs");
  const array index_out = import_array(accepted_index_arg, "accepted_index", true);
  const array token_out = import_array(tokens_arg, "tokens", true);
  const array flags = import_optional(flags_arg, "flags", true);
  require_ndim(target, "target_probs", 2, "(B, V)");
  require_ndim(cand, "candidates", 2, "(B, K)");
  if (draft.is_valid()) require_ndim(draft, "draft_probs", 2, "(B, V)");
  const auto batch = static_cast<index_t>(cand.shape(0));
  const auto k = static_cast<index_t>(cand.shape(1));
  const auto cands = token_array(cand, "candidates", token_buffer);
  for (const auto& [a, name] :
       {std::pair{&target, "target_probs"}, std::pair{&draft, "draft_probs"}})
    if (a->is_valid() && static_cast<index_t>(a->shape(0)) != batch)
      value_error(std::string("specula: ") + name + " has " + std::to_string(a->shape(0)) +
                  " rows, but candidates has B = " + std::to_string(batch) +
                  " requests: one row per request");
  const auto rng = make_rng(seeds, request_ids, steps, batch);
  // Positions: one integer for every request, or one per request.
  std::vector<std::uint32_t> positions(static_cast<std::size_t>(batch), 0);
  if (is_scalar(positions_arg)) {
    const auto p = nb::cast<std::int64_t>(positions_arg);
    if (p < 0 || p > UINT32_MAX) value_error("specula: position must be in [0, 2^32)");
    std::fill(positions.begin(), positions.end(), static_cast<std::uint32_t>(p));
  } else {
    const index_view p = index_array(import_array(positions_arg, "position"), "position");
    if (p.size != batch) value_error("specula: position must be an integer or have B entries");
    for (index_t b = 0; b < batch; ++b) {
      if (p[b] < 0 || p[b] > UINT32_MAX) value_error("specula: position must be in [0, 2^32)");
      positions[static_cast<std::size_t>(b)] = static_cast<std::uint32_t>(p[b]);
    }
  }
  const auto out_index = int64_output(index_out, "accepted_index");
  const auto out_token = int32_output(token_out, "tokens");
  const auto out_flags = flags_output(flags, "flags");
  if (out_index.size != batch || out_token.size != batch ||
      (!out_flags.empty() && out_flags.size != batch))
    value_error("specula: accepted_index, tokens and flags must have B = " + std::to_string(batch) +
                " entries");
  candidates_options options;
  options.sum_tolerance = sum_tolerance;
  options.residual_floor = residual_floor;
  options.check = parse_check(check);
  with_prob_type(target, "target_probs", [&](auto element) {
    using T = decltype(element);
    const auto p_rows = prob_rows<T>(target, "target_probs", wide_rows_buffer(0));
    const auto q_rows = optional_rows<T>(draft, "draft_probs", target);
    if (p_rows.rows != batch || (draft.is_valid() && q_rows.rows != batch))
      value_error("specula: target_probs (and draft_probs) must have one row per request (B = " +
                  std::to_string(batch) + ")");
    record_pointer("target_probs", p_rows.data);
    record_pointer("draft_probs", q_rows.data);
    record_pointer("candidates", cands.data);
    visit_scalar_rule(rule_arg, batch, "K-candidate verification", [&](const auto& rule) {
      nb::gil_scoped_release release;
      with_policy(threads, [&](const auto& policy) {
        host::for_each_index(policy, batch, [&](index_t b) {
          thread_local std::vector<double> workspace;
          workspace.resize(static_cast<std::size_t>(candidates_workspace_size(k)));
          const row_view<const token_t> c = cands.subview(b * k, k);
          const row_view<const T> p = p_rows.row(b);
          auto run = [&](const auto& proposal) {
            try {
              return verify_candidates_checked(detail::request_rule(rule, b), rng[b], p, proposal,
                                               c, row_view<double>{workspace},
                                               positions[static_cast<std::size_t>(b)], options);
            } catch (const invalid_input& e) {
              throw invalid_input(e.code(), e.argument(), e.row(), e.column(),
                                  std::string(e.what()) + " [request " + std::to_string(b) +
                                      ": p = target_probs[" + std::to_string(b) +
                                      "], q = draft_probs[" + std::to_string(b) + "]]");
            }
          };
          candidates_result r;
          if (!draft.is_valid())
            r = run(one_hot_candidates{});
          else if (with_replacement_sampling)
            r = run(with_replacement<T>{q_rows.row(b)});
          else
            r = run(without_replacement<T>{q_rows.row(b)});
          out_index[b] = r.accepted;
          out_token[b] = r.token;
          if (!out_flags.empty()) out_flags[b] = r.flags;
        });
      });
    });
  });
}

}  // namespace

void register_chain(nb::module_& m) {
  m.def("_chain_padded", &chain_padded, nb::arg("draft_probs").none(), nb::arg("draft_token_ids"),
        nb::arg("target_probs"), nb::arg("draft_lengths").none(), nb::arg("seeds"),
        nb::arg("request_ids"), nb::arg("steps"), nb::arg("output_token_ids"),
        nb::arg("num_accepted"), nb::arg("accepted").none(), nb::arg("flags").none(),
        nb::arg("rule").none(), nb::arg("sum_tolerance"), nb::arg("residual_floor"),
        nb::arg("check"), nb::arg("placeholders"), nb::arg("threads"), nb::arg("stream") = 0);
  m.def("_chain_padded_timed", &chain_padded_repeated, nb::arg("draft_probs").none(),
        nb::arg("draft_token_ids"), nb::arg("target_probs"), nb::arg("draft_lengths").none(),
        nb::arg("seeds"), nb::arg("request_ids"), nb::arg("steps"), nb::arg("output_token_ids"),
        nb::arg("num_accepted"), nb::arg("accepted").none(), nb::arg("flags").none(),
        nb::arg("rule").none(), nb::arg("sum_tolerance"), nb::arg("residual_floor"),
        nb::arg("check"), nb::arg("placeholders"), nb::arg("threads"), nb::arg("repeats"),
        nb::arg("stream") = 0,
        "The C++ call alone, `repeats` times on the same arguments: mean ns per call "
        "(bench/python).");
  m.def("_chain_flat", &chain_flat, nb::arg("draft_probs").none(), nb::arg("draft_token_ids"),
        nb::arg("cu_num_draft_tokens"), nb::arg("target_probs"), nb::arg("bonus_token_ids").none(),
        nb::arg("seeds"), nb::arg("request_ids"), nb::arg("steps"), nb::arg("output_token_ids"),
        nb::arg("num_accepted"), nb::arg("accepted").none(), nb::arg("flags").none(),
        nb::arg("rule").none(), nb::arg("sum_tolerance"), nb::arg("residual_floor"),
        nb::arg("check"), nb::arg("placeholders"), nb::arg("threads"), nb::arg("greedy"),
        nb::arg("is_greedy").none(), nb::arg("stream") = 0);
  m.def("_candidates", &candidates, nb::arg("target_probs"), nb::arg("candidates"),
        nb::arg("draft_probs").none(), nb::arg("seeds"), nb::arg("request_ids"), nb::arg("steps"),
        nb::arg("position"), nb::arg("with_replacement"), nb::arg("accepted_index"),
        nb::arg("tokens"), nb::arg("flags").none(), nb::arg("rule").none(),
        nb::arg("sum_tolerance"), nb::arg("residual_floor"), nb::arg("check"), nb::arg("threads"));
}

}  // namespace specula::python
