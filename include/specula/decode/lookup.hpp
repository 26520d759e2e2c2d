#pragma once

/// @file
/// Speculative decoding with a `proposal` as the draft (no draft model), and the n-gram /
/// prompt-lookup proposal (vLLM's `ngram` speculator, llama.cpp's lookup decoding, Hugging Face's
/// `prompt_lookup_num_tokens`).
///
/// `speculative_decode(target, proposal, prompt, options, rng, verify, stats)`: each step asks the
/// proposal for a draft tree below the last token (`propose(context, tree, q_rows)`, see
/// decode/concepts.hpp; a chain is a tree), evaluates the root and the drafts in one target pass,
/// verifies them and commits the accepted path. A proposal that returns false (deterministic
/// drafts, such as n-gram ones) is verified with one-hot proposal rows: with `tree_verifier<>`
/// the output law is the target's (a deterministic draft x is accepted with probability p(x));
/// with `greedy_tree_verifier<>` the output equals greedy decoding. A stochastic proposal
/// returns true and writes one row per node (the row its children were drawn from), as a draft
/// model's q rows. Of `speculative_options` the loop uses `max_new_tokens`, `target`,
/// `stop_token` and `stop_tokens`; the draft-model fields are ignored. Levels of the draft deeper
/// than the tokens still to generate are dropped.
///
/// `ngram_proposal`: an index of the context's n-grams (n from `min_ngram` to `max_ngram`),
/// updated incrementally as the context grows and rebuilt when it is not an extension of the
/// last one (a new request). To propose, it looks up the context's last n tokens, longest n
/// first, and drafts the `draft_length` tokens that followed their most recent earlier
/// occurrence; with `max_branches` > 1, the continuations of up to that many distinct earlier
/// occurrences (most recent first, longer matches first) are merged into a draft tree. No match:
/// no drafts (the step decodes one token).
///
/// The drafts come from committed tokens (host state), so only the verification needs rows: with
/// a resident rows policy (`detail::proposal_host_rows` describes it) the p rows stay where the
/// model computes them (the example transformer's `resident_proposal_decode` on the GPU).

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/rng.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/decode/speculative.hpp"
#include "specula/decode/stats.hpp"
#include "specula/decode/step.hpp"
#include "specula/decode/task.hpp"
#include "specula/tree/token_tree.hpp"

namespace specula {

/// Options of ngram_proposal.
struct ngram_options {
  index_t min_ngram = 1;     ///< shortest suffix looked up, >= 1
  index_t max_ngram = 3;     ///< longest suffix looked up, >= min_ngram
  index_t draft_length = 4;  ///< drafted tokens per branch (k), >= 1
  index_t max_branches = 1;  ///< 1: a chain; more: up to this many continuations as a tree
};

/// The n-gram / prompt-lookup proposal (see file comment). Models `proposal`.
class ngram_proposal {
 public:
  explicit ngram_proposal(const ngram_options& options = {}) : options_(options) {
    require_parameter(options.min_ngram >= 1, "min_ngram", static_cast<double>(options.min_ngram),
                      "must be >= 1");
    require_parameter(options.max_ngram >= options.min_ngram, "max_ngram",
                      static_cast<double>(options.max_ngram), "must be >= min_ngram");
    require_parameter(options.draft_length >= 1, "draft_length",
                      static_cast<double>(options.draft_length), "must be >= 1");
    require_parameter(options.max_branches >= 1, "max_branches",
                      static_cast<double>(options.max_branches), "must be >= 1");
  }

  [[nodiscard]] const ngram_options& options() const noexcept { return options_; }

  /// Drafts below context.back() (see file comment); never writes q_rows (returns false).
  bool propose(std::span<const token_t> context, token_tree& tree, std::vector<float>& q_rows) {
    (void)q_rows;
    sync(context);
    std::vector<index_t> parents{-1};
    std::vector<token_t> tokens{context.empty() ? no_token : context.back()};
    const auto n_ctx = static_cast<index_t>(context.size());
    index_t branches = 0;
    std::vector<index_t> used_starts;
    for (index_t n = std::min(options_.max_ngram, n_ctx - 1); n >= options_.min_ngram; --n) {
      const auto it = index_.find(key(context.subspan(static_cast<std::size_t>(n_ctx - n)), n));
      if (it == index_.end()) continue;
      const std::vector<index_t>& starts = it->second;
      for (auto s = starts.rbegin(); s != starts.rend() && branches < options_.max_branches; ++s) {
        const index_t start = *s;      // the continuation's first position
        if (start >= n_ctx) continue;  // the suffix itself
        if (!std::equal(context.begin() + (start - n), context.begin() + start, context.end() - n))
          continue;  // a hash collision
        if (std::find(used_starts.begin(), used_starts.end(), start) != used_starts.end())
          continue;  // found again with a shorter n
        used_starts.push_back(start);
        const index_t end = std::min(n_ctx, start + options_.draft_length);
        if (add_branch(context.subspan(static_cast<std::size_t>(start),
                                       static_cast<std::size_t>(end - start)),
                       parents, tokens))
          ++branches;
      }
      if (branches >= options_.max_branches) break;
    }
    tree = token_tree(std::move(parents), std::move(tokens));
    return false;
  }

 private:
  static std::uint64_t key(std::span<const token_t> gram, index_t n) {
    std::uint64_t h = 0xcbf29ce484222325ull ^ static_cast<std::uint64_t>(n);
    for (const token_t t : gram) {
      h ^= static_cast<std::uint32_t>(t);
      h *= 0x100000001b3ull;
      h ^= h >> 29;
    }
    return h;
  }

  /// Brings the index up to `context`: appends the n-grams ending at its new positions, or
  /// rebuilds it when `context` does not extend the indexed tokens.
  void sync(std::span<const token_t> context) {
    if (context.size() < seen_.size() || !std::equal(seen_.begin(), seen_.end(), context.begin())) {
      seen_.clear();
      index_.clear();
    }
    for (std::size_t p = seen_.size(); p < context.size(); ++p) {
      seen_.push_back(context[p]);
      const auto end = static_cast<index_t>(p) + 1;  // the n-gram is [end - n, end)
      for (index_t n = options_.min_ngram; n <= options_.max_ngram && n <= end; ++n)
        index_[key(context.subspan(static_cast<std::size_t>(end - n), static_cast<std::size_t>(n)),
                   n)]
            .push_back(end);
    }
  }

  /// Merges a continuation into the trie below the root; true when it added a node.
  static bool add_branch(std::span<const token_t> cont, std::vector<index_t>& parents,
                         std::vector<token_t>& tokens) {
    index_t u = 0;
    bool added = false;
    for (const token_t t : cont) {
      index_t child = -1;
      for (index_t c = 1; c < static_cast<index_t>(parents.size()); ++c)
        if (parents[static_cast<std::size_t>(c)] == u && tokens[static_cast<std::size_t>(c)] == t) {
          child = c;
          break;
        }
      if (child < 0) {
        parents.push_back(u);
        tokens.push_back(t);
        child = static_cast<index_t>(parents.size()) - 1;
        added = true;
      }
      u = child;
    }
    return added;
  }

  ngram_options options_;
  std::vector<token_t> seen_;  // the indexed context
  std::unordered_map<std::uint64_t, std::vector<index_t>> index_;
};

static_assert(proposal<ngram_proposal>);

namespace detail {

/// The tree's nodes of depth <= max_depth (parents precede children, so one pass remaps them).
inline token_tree prune_depth(const token_tree& tree, index_t max_depth) {
  if (tree.max_depth() <= max_depth) return tree;
  std::vector<index_t> map(static_cast<std::size_t>(tree.size()), -1), parents;
  std::vector<token_t> tokens;
  for (index_t i = 0; i < tree.size(); ++i) {
    if (tree.depth(i) > max_depth) continue;
    map[static_cast<std::size_t>(i)] = static_cast<index_t>(parents.size());
    parents.push_back(i == 0 ? -1 : map[static_cast<std::size_t>(tree.parent(i))]);
    tokens.push_back(tree.token(i));
  }
  return token_tree(std::move(parents), std::move(tokens));
}

/// Where proposal_task's target rows live: `proposal_host_rows` (the default) verifies on the
/// host from the loop's pass (verify_step). A *resident* policy (`resident = true`; the example
/// transformer's SJD ops, examples/transformer/include/specula_example/resident_sjd.hpp) keeps
/// the p rows where its model computes them: `start(vocab, options)` before the first step,
/// `target(tree)` runs the pass (p rows by options.target), `verify_drafts(verifier, tree, rng,
/// out_tokens, out_nodes)` verifies deterministic drafts (one-hot proposal rows, none stored) and
/// returns the accepted count. A proposal that writes q rows (host memory) is refused with a
/// resident policy.
struct proposal_host_rows {
  static constexpr bool resident = false;
};

/// Speculative decoding of one request with a proposal as the draft (see file comment).
/// `resident_rows`: the rows policy when `Rows` is resident, else unused.
template <class TargetHandle, class Proposal, class Verifier, class Rows = proposal_host_rows>
decode_task proposal_task(TargetHandle target, Proposal& draft, std::span<const token_t> prompt,
                          speculative_options options, request_rng rng, Verifier verify,
                          decode_stats& st, std::vector<token_t>& result,
                          Rows* resident_rows = nullptr) {
  if (prompt.empty()) throw_if_failed({status::empty_input, -1, -1, 0.0}, "prompt");
  require_parameter(options.max_new_tokens >= 1, "max_new_tokens",
                    static_cast<double>(options.max_new_tokens), "must be >= 1");
  validate_sampling_params(options.target);
  const index_t V = target.vocab_size();
  std::conditional_t<Rows::resident, int, Rows> local_rows{};
  Rows& rows = rows_policy(local_rows, resident_rows);
  if constexpr (Rows::resident) rows.start(V, options);
  const auto sz = [](index_t n) { return static_cast<std::size_t>(n); };

  const auto prompt_len = static_cast<index_t>(prompt.size());
  std::vector<token_t>& seq = co_await start_request(prompt, options.stop_token,
                                                     options.stop_tokens, V, result, st, target);
  speculative_buffers buf;
  buf.scratch.resize(sz(V));
  token_tree tree;

  for (std::uint32_t step = 0;; ++step) {
    const index_t remaining =
        options.max_new_tokens - (static_cast<index_t>(seq.size()) - prompt_len);
    if (remaining <= 0) break;
    bool has_q = false;
    {
      scoped_timer timer(st.draft_seconds);
      buf.draft_probs.clear();
      has_q =
          static_cast<bool>(draft.propose(std::span<const token_t>(seq), tree, buf.draft_probs));
      if (tree.token(0) != seq.back())
        throw_if_failed({status::invalid_parameter, static_cast<index_t>(step), -1,
                         static_cast<double>(tree.token(0))},
                        "proposal", "the draft tree's root (node 0) must hold the last token");
      tree = prune_depth(tree, remaining - 1);
      if (has_q && buf.draft_probs.size() < sz(tree.size() * V))
        throw_if_failed({status::length_mismatch, static_cast<index_t>(step), -1,
                         static_cast<double>(buf.draft_probs.size())},
                        "proposal", "q_rows must hold one row of vocab_size() per node");
      if (Rows::resident && has_q)
        throw_if_failed({status::invalid_parameter, static_cast<index_t>(step), -1, 1.0},
                        "proposal",
                        "a resident rows policy verifies deterministic drafts only (q rows are "
                        "host memory)");
    }
    co_await rows_pass(
        rows, st, [&](auto& r) { r.target(tree); },
        [&](auto&) { return target_pass(tree, buf.logits, st); });

    index_t accepted = 0;
    {
      scoped_timer timer(st.verify_seconds);
      const request_rng verify_rng = step_stream(rng, step);
      if constexpr (Rows::resident)
        accepted = rows.verify_drafts(verify, tree, verify_rng, buf.out_tokens, buf.out_nodes);
      else
        accepted = verify_step(verify, options.target, tree, V, buf, has_q, verify_rng);
    }
    target.commit(std::span<const index_t>(buf.out_nodes.data(), sz(accepted + 1)));
    if (emit_step(buf.out_tokens, accepted, stop_set{options.stop_token, options.stop_tokens}, seq,
                  st))
      break;
  }
  trim_cache(target, static_cast<index_t>(seq.size()) - 1);
  result.assign(seq.begin() + prompt_len, seq.end());
}

}  // namespace detail

/// Speculative decoding with `draft`, a proposal, as the draft (see file comment). The target is
/// (re)started with `prefill(prompt)`; the proposal sees the whole sequence (prompt and
/// generated tokens) at each step. Returns the generated tokens; adds to `*stats` when given.
/// `control` adds cancellation between passes (decode/control.hpp).
template <session_model Target, proposal Proposal, verifier Verifier = tree_verifier<>>
requires(!session_model<Proposal>) std::vector<token_t> speculative_decode(
    Target& target, Proposal& draft, std::span<const token_t> prompt,
    const speculative_options& options, request_rng rng, const Verifier& verify = {},
    decode_stats* stats = nullptr, const request_control& control = {}) {
  std::vector<token_t> out;
  detail::decode_solo(
      target, static_cast<detail::no_draft*>(nullptr), stats,
      [&](decode_stats& st) {
        return detail::proposal_task(detail::solo<Target>{&target}, draft, prompt, options, rng,
                                     verify, st, out);
      },
      control);
  return out;
}

/// The same for several requests at once, one batched target pass per step: request r decodes
/// `prompts[r]` with `rngs[r]` and its own proposal `drafts[r]`. Each output equals
/// speculative_decode of that request alone. `control` adds isolation, cancellation and
/// per-request limits (decode/control.hpp).
template <batched_session_model Target, proposal Proposal, verifier Verifier = tree_verifier<>>
std::vector<std::vector<token_t>> speculative_decode_batch(
    Target& target, std::span<Proposal> drafts, std::span<const std::vector<token_t>> prompts,
    const speculative_options& options, std::span<const request_rng> rngs,
    const Verifier& verify = {}, std::span<decode_stats> stats = {},
    const batch_control& control = {}) {
  detail::require_size(static_cast<index_t>(drafts.size()), static_cast<index_t>(prompts.size()),
                       "drafts", "one proposal per prompt");
  std::vector<std::vector<token_t>> out(prompts.size());
  detail::decode_batch(
      target, static_cast<detail::no_draft*>(nullptr), target.batch_size(), prompts, rngs.size(),
      stats,
      [&](index_t r, decode_stats& st) {
        const auto i = static_cast<std::size_t>(r);
        return detail::proposal_task(detail::member<Target>{&target, r}, drafts[i], prompts[i],
                                     detail::request_options(options, control, r), rngs[i], verify,
                                     st, out[i]);
      },
      control, target.vocab_size());
  return out;
}

}  // namespace specula
