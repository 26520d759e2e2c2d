#pragma once

/// @file
/// Draft-model speculative decoding (chain drafts, sampled, exact rule) with the probability rows
/// kept where the model computes them: the loop (`resident_speculative_decode`) holds only
/// tokens and counters and drives an *ops* object that owns both models, their caches and the
/// q / p rows.
///
/// - `host_sd_ops`: the host stand-in (host transformers, `logits_to_probs`, the keyed
///   without-replacement draw, `verify_tree`), so CI runs the loop's stepping without a GPU;
/// - `device_sd_ops` (device_transformer.hpp's library, CUDA builds): the same steps on the GPU —
///   logits from `device_transformer::evaluate_device`, `specula::cuda::logits_to_probs_async`,
///   `specula::cuda::sample_without_replacement_async` (k = 1) for the drafts and
///   `specula::cuda::verify_tree_async` for the verification. What crosses per step is listed
///   in docs/cuda.md ("The example transformer on the GPU").
///
/// Randomness: draft i of step s is the keyed draw at position i of the stream
/// {fold_in(seed, 1), request_id, s}; verification uses {seed, request_id, s}. Host and device
/// ops make the same draws from the same rows; rows differ by float rounding only, so outputs
/// agree except where a draw falls within rounding of a boundary. The output law is the
/// target's (exact rule; tested by G-tests on both).

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/rng.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/decode/stats.hpp"
#include "specula/decode/step.hpp"
#include "specula/sample/transforms.hpp"
#include "specula/sample/without_replacement.hpp"
#include "specula/tree/builders.hpp"
#include "specula_example/sessions.hpp"

namespace specula::example {

/// Options of resident_speculative_decode.
struct resident_sd_options {
  index_t draft_length = 4;       ///< drafted tokens per step (gamma), >= 0
  index_t max_new_tokens = 64;    ///< >= 1
  sampling_params target{};       ///< target logits -> p
  sampling_params draft{};        ///< draft logits -> q
  token_t stop_token = no_token;  ///< generation ends after emitting it (-1: never)
};

/// What the loop asks of its ops object (see file comment).
/// - `start(prompt, options)`: both models prefilled with all of the prompt but its last token;
/// - `draft_context()`: tokens the draft's cache holds;
/// - `draft(tokens, i, rng)`: evaluates `tokens` as a chain below the draft's context and
///   commits them, turns the last row into q row i and returns the draft drawn from it
///   (keyed draw at position i of `rng`);
/// - `target(tokens)`: evaluates the chain root + drafts below the target's context into p rows;
/// - `verify(drafts, rng, out)`: verifies the chain against p and q rows; writes the accepted
///   drafts and the emitted token to out[0 .. accepted] and returns accepted;
/// - `commit_target(accepted)`, `rollback_draft(n)`.
template <class O>
concept resident_sd_ops = requires(O& o, std::span<const token_t> tokens,
                                   const resident_sd_options& opt, index_t i,
                                   const request_rng& rng, std::span<token_t> out) {
  o.start(tokens, opt);
  { o.draft_context() } -> std::convertible_to<index_t>;
  { o.draft(tokens, i, rng) } -> std::convertible_to<token_t>;
  o.target(tokens);
  { o.verify(tokens, rng, out) } -> std::convertible_to<index_t>;
  o.commit_target(i);
  o.rollback_draft(i);
};

/// Generates up to `options.max_new_tokens` tokens after `prompt` with `ops` (see file comment);
/// adds to `*stats` when given.
template <resident_sd_ops Ops>
std::vector<token_t> resident_speculative_decode(Ops& ops, std::span<const token_t> prompt,
                                                 const resident_sd_options& options,
                                                 request_rng rng, decode_stats* stats = nullptr) {
  if (prompt.empty()) throw_if_failed({status::empty_input, -1, -1, 0.0}, "prompt");
  require_parameter(options.draft_length >= 0, "draft_length",
                    static_cast<double>(options.draft_length), "must be >= 0");
  require_parameter(options.max_new_tokens >= 1, "max_new_tokens",
                    static_cast<double>(options.max_new_tokens), "must be >= 1");
  validate_sampling_params(options.target);
  validate_sampling_params(options.draft);
  decode_stats local;
  decode_stats& st = stats != nullptr ? *stats : local;
  ops.start(prompt, options);
  std::vector<token_t> seq(prompt.begin(), prompt.end()), pending, chain, out;
  const auto prompt_len = static_cast<index_t>(prompt.size());
  for (std::uint32_t step = 0;; ++step) {
    const index_t remaining =
        options.max_new_tokens - (static_cast<index_t>(seq.size()) - prompt_len);
    if (remaining <= 0) break;
    const auto n = static_cast<index_t>(seq.size());
    const index_t gamma = std::min(options.draft_length, remaining - 1);
    chain.assign(1, seq.back());
    if (gamma > 0) {
      specula::detail::scoped_timer timer(st.draft_seconds);
      const request_rng draft_rng{fold_in(rng.seed, 1), rng.request_id, step};
      pending.assign(seq.begin() + ops.draft_context(), seq.end());
      for (index_t i = 0; i < gamma; ++i) {
        chain.push_back(ops.draft(pending, i, draft_rng));
        pending.assign(1, chain.back());
        ++st.draft_forwards;
      }
    }
    {
      specula::detail::scoped_timer timer(st.forward_seconds);
      ops.target(chain);
      ++st.target_forwards;
    }
    index_t accepted = 0;
    out.assign(chain.size(), no_token);
    {
      specula::detail::scoped_timer timer(st.verify_seconds);
      accepted = ops.verify(chain, request_rng{rng.seed, rng.request_id, step}, out);
    }
    ops.commit_target(accepted);
    if (gamma > 0) ops.rollback_draft(std::min(ops.draft_context(), n + accepted));
    if (specula::detail::emit_step(out, accepted, options.stop_token, seq, st)) break;
  }
  return {seq.begin() + prompt_len, seq.end()};
}

/// The host stand-in of `device_sd_ops`: host transformers, rows in host memory.
class host_sd_ops {
 public:
  host_sd_ops(const transformer& target, const transformer& draft)
      : target_(target), draft_(draft), V_(target.vocab_size()) {
    require_parameter(draft.vocab_size() == V_, "draft", static_cast<double>(draft.vocab_size()),
                      "the draft model's vocabulary must equal the target's");
  }

  void start(std::span<const token_t> prompt, const resident_sd_options& options) {
    options_ = options;
    target_.prefill(prompt);
    draft_.prefill(prompt);
    scratch_.resize(static_cast<std::size_t>(V_));
  }
  [[nodiscard]] index_t draft_context() const noexcept { return draft_.context_size(); }

  token_t draft(std::span<const token_t> tokens, index_t i, const request_rng& rng) {
    const token_tree chain = trees::chain(tokens);
    logits_.resize(static_cast<std::size_t>(chain.size() * V_));
    draft_.evaluate(chain, batch_view<float>(logits_.data(), chain.size(), V_));
    std::vector<index_t> all(static_cast<std::size_t>(chain.size()));
    for (index_t k = 0; k < chain.size(); ++k) all[static_cast<std::size_t>(k)] = k;
    draft_.commit(all);
    q_.resize(static_cast<std::size_t>((i + 2) * V_));
    const auto q = std::span<float>(q_).subspan(static_cast<std::size_t>(i * V_),
                                                static_cast<std::size_t>(V_));
    logits_to_probs(
        options_.draft,
        std::span<float>(logits_).subspan(static_cast<std::size_t>((chain.size() - 1) * V_),
                                          static_cast<std::size_t>(V_)),
        {}, q, scratch_);
    token_t t = no_token;
    double key = 0.0;
    sample_without_replacement_keys(
        V_, [&](index_t y) { return static_cast<double>(q[static_cast<std::size_t>(y)]); }, 1, rng,
        static_cast<std::uint32_t>(i), &t, &key);
    return t;
  }

  void target(std::span<const token_t> tokens) {
    const token_tree chain = trees::chain(tokens);
    logits_.resize(static_cast<std::size_t>(chain.size() * V_));
    target_.evaluate(chain, batch_view<float>(logits_.data(), chain.size(), V_));
    p_.resize(logits_.size());
    specula::detail::rows_to_probs(options_.target, logits_, p_, scratch_, V_);
  }

  index_t verify(std::span<const token_t> chain_tokens, const request_rng& rng,
                 std::span<token_t> out) {
    const token_tree chain = trees::chain(chain_tokens);
    const index_t nodes = chain.size();
    q_.resize(static_cast<std::size_t>(nodes * V_));
    // The leaf has no children: its q row is any valid row (the host loop's choice: p).
    std::copy_n(p_.begin() + (nodes - 1) * V_, V_, q_.begin() + (nodes - 1) * V_);
    const index_t accepted = specula::detail::verify_one(
        tree_verifier<>{}, chain, V_,
        std::span<const float>(p_).first(static_cast<std::size_t>(nodes * V_)),
        std::span<const float>(q_).first(static_cast<std::size_t>(nodes * V_)), rng, out_tokens_,
        out_nodes_);
    std::copy_n(out_tokens_.begin(), accepted + 1, out.begin());
    return accepted;
  }

  void commit_target(index_t accepted) {
    std::vector<index_t> path(static_cast<std::size_t>(accepted + 1));
    for (index_t k = 0; k <= accepted; ++k) path[static_cast<std::size_t>(k)] = k;
    target_.commit(path);
  }
  void rollback_draft(index_t n) { draft_.rollback(n); }

 private:
  transformer_session target_, draft_;
  index_t V_;
  resident_sd_options options_;
  std::vector<float> logits_, p_, q_, scratch_;
  std::vector<token_t> out_tokens_;
  std::vector<index_t> out_nodes_;
};

static_assert(resident_sd_ops<host_sd_ops>);

}  // namespace specula::example
