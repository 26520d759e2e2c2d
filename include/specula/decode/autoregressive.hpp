#pragma once

/// @file
/// Plain autoregressive decoding: one target forward pass per token, the baseline every
/// speculative method is measured against (and the loop an engine runs for requests it does not
/// speculate on).
///
/// Each step evaluates the last token (a one-node tree), commits it, and emits the next token:
/// the argmax of its logits (ties: lowest id) with `greedy`, otherwise a draw from
/// `logits_to_probs(options.params, ...)` with one uniform of the stream
/// `{seed, request_id, rng.step + s}` at step s, at `sample_draw` (sample/sampling.hpp: the same
/// draw as sample_from_logits), so a request's output depends on its own seed only, alone or
/// batched.

#include <span>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/validate.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/decode/stats.hpp"
#include "specula/decode/step.hpp"
#include "specula/decode/task.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/sample/random_source.hpp"
#include "specula/sample/sampling.hpp"
#include "specula/sample/transforms.hpp"
#include "specula/tree/builders.hpp"

namespace specula {

/// Options of autoregressive_decode.
struct autoregressive_options {
  index_t max_new_tokens = 64;    ///< >= 1
  sampling_params params{};       ///< logits -> probabilities (ignored with `greedy`)
  bool greedy = false;            ///< argmax instead of sampling
  token_t stop_token = no_token;  ///< generation ends after emitting it (-1: never)
  /// More tokens that end generation once emitted, as `stop_token` does (e.g. a model's
  /// several end-of-turn tokens); each in [0, vocab_size).
  std::vector<token_t> stop_tokens;
};

namespace detail {

/// Autoregressive decoding of one request (see file comment), as a task; `m` is its handle.
template <class Handle>
decode_task autoregressive_task(Handle m, std::span<const token_t> prompt,
                                autoregressive_options options, request_rng rng, decode_stats& st,
                                std::vector<token_t>& result) {
  if (prompt.empty()) throw_if_failed({status::empty_input, -1, -1, 0.0}, "prompt");
  require_parameter(options.max_new_tokens >= 1, "max_new_tokens",
                    static_cast<double>(options.max_new_tokens), "must be >= 1");
  if (!options.greedy) validate_sampling_params(options.params);
  const index_t V = m.vocab_size();
  const auto sz = [](index_t n) { return static_cast<std::size_t>(n); };

  const auto prompt_len = static_cast<index_t>(prompt.size());
  std::vector<token_t>& seq =
      co_await start_request(prompt, options.stop_token, options.stop_tokens, V, result, st, m);
  std::vector<float> logits, probs(sz(V)), scratch(sz(V));
  const std::vector<index_t> root_path{0};
  token_t next[1] = {no_token};

  for (std::uint32_t step = 0;; ++step) {
    if (static_cast<index_t>(seq.size()) - prompt_len >= options.max_new_tokens) break;
    const token_t root[1] = {seq.back()};
    const token_tree tree = trees::chain(std::span<const token_t>(root, 1));
    co_await target_pass(tree, logits, st);
    {
      scoped_timer timer(st.verify_seconds);
      const row_view<const float> row{logits.data(), V};
      if (options.greedy) {
        throw_if_failed(check_logit_row(row, 0), "logits");
        next[0] = static_cast<token_t>(argmax_lowest(row));
      } else {
        logits_to_probs(options.params, std::span<const float>(logits.data(), sz(V)), {}, probs,
                        scratch);
        philox_source src{step_stream(rng, step)};
        next[0] = static_cast<token_t>(
            sample_weights(src, V, row_weights<float>{row_view<const float>{probs.data(), V}}));
      }
    }
    m.commit(root_path);
    if (emit_step(std::span<const token_t>(next, 1), 0,
                  stop_set{options.stop_token, options.stop_tokens}, seq, st))
      break;
  }
  trim_cache(m, static_cast<index_t>(seq.size()) - 1);
  result.assign(seq.begin() + prompt_len, seq.end());
}

}  // namespace detail

/// Generates up to `options.max_new_tokens` tokens after `prompt`, one forward pass each (see
/// file comment). The model is restarted with `prefill(prompt)`. Adds to `*stats` when given.
/// `control` adds cancellation between passes (decode/control.hpp).
template <session_model Model>
std::vector<token_t> autoregressive_decode(Model& m, std::span<const token_t> prompt,
                                           const autoregressive_options& options,
                                           request_rng rng = {}, decode_stats* stats = nullptr,
                                           const request_control& control = {}) {
  std::vector<token_t> out;
  detail::decode_solo(
      m, static_cast<detail::no_draft*>(nullptr), stats,
      [&](decode_stats& st) {
        return detail::autoregressive_task(detail::solo<Model>{&m}, prompt, options, rng, st, out);
      },
      control);
  return out;
}

/// autoregressive_decode for several requests at once, one batched forward pass per step for
/// all unfinished requests: request r decodes `prompts[r]` with `rngs[r]` as request r of `m`;
/// adds to `stats[r]` when `stats` is given. Each output equals autoregressive_decode of that
/// request alone. No prompts: no-op. `control` adds isolation, cancellation and per-request
/// limits (decode/control.hpp).
template <batched_session_model Model>
std::vector<std::vector<token_t>> autoregressive_decode_batch(
    Model& m, std::span<const std::vector<token_t>> prompts, const autoregressive_options& options,
    std::span<const request_rng> rngs, std::span<decode_stats> stats = {},
    const batch_control& control = {}) {
  std::vector<std::vector<token_t>> out(prompts.size());
  detail::decode_batch(
      m, static_cast<detail::no_draft*>(nullptr), m.batch_size(), prompts, rngs.size(), stats,
      [&](index_t r, decode_stats& st) {
        const auto i = static_cast<std::size_t>(r);
        return detail::autoregressive_task(detail::member<Model>{&m, r}, prompts[i],
                                           detail::request_options(options, control, r), rngs[i],
                                           st, out[i]);
      },
      control, m.vocab_size());
  return out;
}

}  // namespace specula
