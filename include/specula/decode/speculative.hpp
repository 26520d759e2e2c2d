#pragma once

/// @file
/// Draft-model speculative decoding (Leviathan et al.; Chen et al.; Cool-SD's Algorithm 1 in its
/// vanilla form), generic over the target model, the draft model and the verifier.
///
/// Each step: the draft model proposes `draft_length` tokens autoregressively (sampled from its
/// transformed rows q, or greedily); the target evaluates the root and the drafts in one forward
/// pass (a chain tree); the verifier accepts a prefix and emits one more token (a residual
/// sample or the bonus token); the target commits the accepted path and the draft rolls back
/// what was rejected. With `tree_verifier<>` (the exact rule) the output law is the target's;
/// with a relaxed rule (`tree_verifier<host::sequential_policy, relaxed_rule>`) it is Cool-SD's
/// relaxed SD; with greedy drafting and `greedy_tree_verifier<>` the output equals greedy
/// decoding of the target.
///
/// Randomness: step s of a request draws its drafts from the stream
/// `{fold_in(seed, 1), request_id, s}` (position i, slot 0) and verifies with
/// `{seed, request_id, s}`, so a request's output depends on its own seed only.

#include <algorithm>
#include <span>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/rng.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/decode/stats.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/sample/transforms.hpp"
#include "specula/tree/builders.hpp"

namespace specula {

/// A model that can also start a request and truncate its committed context (what a draft
/// model needs: its rejected drafts are rolled back after each step).
/// - `prefill(prompt)`: commit all of the prompt but its last token (the first tree's root);
/// - `context_size()`: committed tokens;
/// - `rollback(n)`: keep the first n committed tokens.
template <class M>
concept session_model = model<M> && requires(M& m, std::span<const token_t> prompt, index_t n) {
  m.prefill(prompt);
  { m.context_size() } -> std::convertible_to<index_t>;
  m.rollback(n);
};

/// How the draft model proposes.
enum class draft_mode {
  sample,  ///< draw from the draft's transformed rows q; q rows go to the verifier
  greedy,  ///< the draft's argmax; no q rows (the verifier treats drafts as one-hot)
};

/// Options of speculative_decode.
struct speculative_options {
  index_t draft_length = 4;     ///< drafted tokens per step (gamma), >= 0
  index_t max_new_tokens = 64;  ///< tokens to generate, >= 1
  sampling_params target{};     ///< target logits -> p
  sampling_params draft{};      ///< draft logits -> q (mode sample)
  draft_mode mode = draft_mode::sample;
  token_t stop_token = no_token;  ///< generation ends after emitting it (-1: never)
};

namespace detail {

/// Reusable buffers of one decoding loop.
struct speculative_buffers {
  std::vector<float> logits, probs, scratch, target_probs, draft_probs;
  std::vector<token_t> out_tokens;
  std::vector<index_t> out_nodes;
};

/// logits (rows x V) -> probability rows, with `params`.
inline void rows_to_probs(const sampling_params& params, std::span<float> logits,
                          std::span<float> probs, std::span<float> scratch, index_t vocab) {
  const auto V = static_cast<std::size_t>(vocab);
  for (std::size_t r = 0; r * V < logits.size(); ++r)
    logits_to_probs(params, logits.subspan(r * V, V), {}, probs.subspan(r * V, V), scratch);
}

/// Appends a step's output (the accepted path's tokens, then the emitted one: out_tokens[0..k])
/// to `seq`, counting them in `st` (and in `st.step_tokens`); returns true when `stop_token` was
/// emitted (tokens after it are dropped).
inline bool emit_step(std::span<const token_t> out_tokens, index_t k, token_t stop_token,
                      std::vector<token_t>& seq, decode_stats& st) {
  st.record_step(k);
  index_t emitted = 0;
  bool stopped = false;
  for (index_t j = 0; j <= k && !stopped; ++j) {
    const token_t t = out_tokens[static_cast<std::size_t>(j)];
    seq.push_back(t);
    ++st.tokens;
    ++emitted;
    stopped = t == stop_token;
  }
  st.step_tokens.push_back(emitted);
  return stopped;
}

/// One target forward pass over `tree`: logits sized nodes x V, timed as model forward time and
/// counted in `st.target_forwards`.
template <class Model>
void target_forward(Model& m, const token_tree& tree, std::vector<float>& logits,
                    decode_stats& st) {
  const index_t V = m.vocab_size();
  logits.resize(static_cast<std::size_t>(tree.size() * V));
  scoped_timer timer(st.forward_seconds);
  m.evaluate(tree, batch_view<float>(logits.data(), tree.size(), V));
  ++st.target_forwards;
}

/// Verifies one request's tree with `verify`: rows are nodes x V (q may be empty for one-hot
/// drafts); fills out_tokens / out_nodes (tree.size() each) and returns the accepted count.
template <class Verifier>
index_t verify_one(const Verifier& verify, const token_tree& tree, index_t vocab,
                   std::span<const float> p_rows, std::span<const float> q_rows,
                   const request_rng& rng, std::vector<token_t>& out_tokens,
                   std::vector<index_t>& out_nodes) {
  const index_t nodes = tree.size();
  out_tokens.assign(static_cast<std::size_t>(nodes), no_token);
  out_nodes.assign(static_cast<std::size_t>(nodes), -1);
  std::int32_t accepted = 0;
  std::uint32_t flags = 0;
  tree_batch_input<float> in;
  in.vocab_size = vocab;
  in.trees = row_view<const token_tree>(&tree, 1);
  in.target_probs = batch_view<const float>(p_rows.data(), nodes, vocab);
  if (!q_rows.empty()) in.draft_probs = batch_view<const float>(q_rows.data(), nodes, vocab);
  in.rng = row_view<const request_rng>(&rng, 1);
  tree_batch_output out;
  out.output_tokens = row_view<token_t>(out_tokens.data(), nodes);
  out.num_accepted = row_view<std::int32_t>(&accepted, 1);
  out.accepted_nodes = row_view<index_t>(out_nodes.data(), nodes);
  out.flags = row_view<std::uint32_t>(&flags, 1);
  verify(in, out);
  return accepted;
}

}  // namespace detail

/// Generates up to `options.max_new_tokens` tokens after `prompt` (see file comment). Both
/// models are (re)started with `prefill(prompt)`. Returns the generated tokens; adds to
/// `*stats` when given.
template <session_model Target, session_model Draft, verifier Verifier = tree_verifier<>>
std::vector<token_t> speculative_decode(Target& target, Draft& draft,
                                        std::span<const token_t> prompt,
                                        const speculative_options& options, request_rng rng,
                                        const Verifier& verify = {},
                                        decode_stats* stats = nullptr) {
  if (prompt.empty()) throw_if_failed({status::empty_input, -1, -1, 0.0}, "prompt");
  require_parameter(options.draft_length >= 0, "draft_length",
                    static_cast<double>(options.draft_length), "must be >= 0");
  require_parameter(options.max_new_tokens >= 1, "max_new_tokens",
                    static_cast<double>(options.max_new_tokens), "must be >= 1");
  const index_t V = target.vocab_size();
  require_parameter(static_cast<index_t>(draft.vocab_size()) == V, "draft",
                    static_cast<double>(draft.vocab_size()),
                    "the draft model's vocabulary must equal the target's");
  validate_sampling_params(options.target);
  validate_sampling_params(options.draft);

  decode_stats local;
  decode_stats& st = stats != nullptr ? *stats : local;
  const auto sz = [](index_t n) { return static_cast<std::size_t>(n); };

  target.prefill(prompt);
  draft.prefill(prompt);
  // seq: prompt and generated tokens. The target holds seq[0 .. n-1) (the root seq.back() is
  // evaluated by each step); the draft holds seq[0 .. draft.context_size()).
  std::vector<token_t> seq(prompt.begin(), prompt.end());
  const auto prompt_len = static_cast<index_t>(prompt.size());
  detail::speculative_buffers buf;
  buf.scratch.resize(sz(V));
  std::vector<token_t> drafts, pending, chain_tokens;
  const bool sampled = options.mode == draft_mode::sample;

  for (std::uint32_t step = 0;; ++step) {
    const index_t generated = static_cast<index_t>(seq.size()) - prompt_len;
    const index_t remaining = options.max_new_tokens - generated;
    if (remaining <= 0) break;
    const index_t gamma = std::min(options.draft_length, remaining - 1);
    const index_t n = static_cast<index_t>(seq.size());

    // --- Draft: gamma tokens, each from the row after the previous one.
    drafts.clear();
    buf.draft_probs.assign(sz((gamma + 1) * V), 0.0f);
    if (gamma > 0) {
      detail::scoped_timer timer(st.draft_seconds);
      const request_rng draft_rng{fold_in(rng.seed, 1), rng.request_id, step};
      const index_t held = draft.context_size();
      pending.assign(seq.begin() + held, seq.end());  // not yet in the draft's cache
      buf.logits.resize(sz(static_cast<index_t>(pending.size()) * V));
      for (index_t i = 0; i < gamma; ++i) {
        const token_tree chain = trees::chain(pending);
        buf.logits.resize(sz(chain.size() * V));
        draft.evaluate(chain, batch_view<float>(buf.logits.data(), chain.size(), V));
        ++st.draft_forwards;
        std::vector<index_t> all(sz(chain.size()));
        for (index_t k = 0; k < chain.size(); ++k) all[sz(k)] = k;
        draft.commit(all);
        std::span<float> last(buf.logits.data() + (chain.size() - 1) * V, sz(V));
        std::span<float> q(buf.draft_probs.data() + i * V, sz(V));
        token_t x = 0;
        if (sampled) {
          logits_to_probs(options.draft, last, {}, q, buf.scratch);
          auto w = [&](index_t y) { return static_cast<double>(q[sz(y)]); };
          const double u = uniform_at(draft_rng, draw_id{static_cast<std::uint32_t>(i), 0});
          x = static_cast<token_t>(sample_inverse_cdf(V, w, positive_mass(V, w), u));
        } else {
          x = static_cast<token_t>(argmax_lowest(row_view<const float>(last.data(), V)));
        }
        drafts.push_back(x);
        pending.assign(1, x);
      }
    }

    // --- Target: root and drafts in one forward pass.
    chain_tokens.assign(1, seq.back());
    chain_tokens.insert(chain_tokens.end(), drafts.begin(), drafts.end());
    const token_tree chain = trees::chain(chain_tokens);
    const index_t nodes = chain.size();
    detail::target_forward(target, chain, buf.logits, st);

    // --- Verify.
    index_t accepted = 0;
    {
      detail::scoped_timer timer(st.verify_seconds);
      buf.target_probs.resize(sz(nodes * V));
      detail::rows_to_probs(options.target, buf.logits, buf.target_probs, buf.scratch, V);
      // The leaf has no children: any valid row will do for its q row.
      std::copy_n(buf.target_probs.begin() + static_cast<std::ptrdiff_t>(gamma * V), V,
                  buf.draft_probs.begin() + static_cast<std::ptrdiff_t>(gamma * V));
      const request_rng verify_rng{rng.seed, rng.request_id, step};
      accepted = detail::verify_one(
          verify, chain, V, buf.target_probs,
          sampled ? std::span<const float>(buf.draft_probs) : std::span<const float>(), verify_rng,
          buf.out_tokens, buf.out_nodes);
    }

    // --- Commit: the target keeps root + accepted drafts; the draft drops rejected drafts.
    target.commit(std::span<const index_t>(buf.out_nodes.data(), sz(accepted + 1)));
    if (gamma > 0) draft.rollback(std::min(draft.context_size(), n + accepted));
    if (detail::emit_step(buf.out_tokens, accepted, options.stop_token, seq, st)) break;
  }
  return {seq.begin() + prompt_len, seq.end()};
}

}  // namespace specula
