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
/// `{fold_in(seed, 1), request_id, step0 + s}` (position i, slot 0) and verifies with
/// `{seed, request_id, step0 + s}` (step0: the stream's `step`, see detail::step_stream), so a
/// request's output depends on its own seed only.

#include <algorithm>
#include <optional>
#include <span>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/rng.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/decode/stats.hpp"
#include "specula/decode/step.hpp"
#include "specula/decode/task.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/sample/random_source.hpp"
#include "specula/sample/transforms.hpp"
#include "specula/sample/without_replacement.hpp"
#include "specula/tree/builders.hpp"

namespace specula {

/// How the draft model proposes.
enum class draft_mode {
  sample,  ///< draw from the draft's transformed rows q; q rows go to the verifier
  greedy,  ///< the draft's argmax; no q rows (the verifier treats drafts as one-hot)
};

/// Options of speculative_decode.
struct speculative_options {
  index_t draft_length = 4;  ///< drafted tokens per step (gamma), >= 0 (chain drafts)
  /// Tree drafts: the shape of each step's draft tree (its tokens are ignored; node 0 is the
  /// root). Unset: a chain of `draft_length` drafts. Set: `draft_length` is ignored and node u's
  /// children in the shape are drawn from the draft's row at u — sampled without replacement
  /// (or with, per `draft_sampling`; it must match the verifier's `tree_options::sampling`), or
  /// the draft's top tokens in greedy mode. A child the row cannot supply (fewer positive-mass
  /// tokens than children) is dropped with its subtree, and levels deeper than the tokens still
  /// to generate are not drafted. Builders: `trees::full`, `trees::sjd_pac`, ...
  std::optional<token_tree> draft_tree;
  sibling_sampling draft_sampling = sibling_sampling::without_replacement;
  index_t max_new_tokens = 64;  ///< tokens to generate, >= 1
  sampling_params target{};     ///< target logits -> p
  sampling_params draft{};      ///< draft logits -> q (mode sample)
  draft_mode mode = draft_mode::sample;
  token_t stop_token = no_token;  ///< generation ends after emitting it (-1: never)
  /// More tokens that end generation once emitted, as `stop_token` does (e.g. a model's
  /// several end-of-turn tokens); each in [0, vocab_size).
  std::vector<token_t> stop_tokens;
  /// Dynamic draft length (llama.cpp's `p_min`), chain drafts only: drafting of a step stops
  /// before position i when the draft's most likely token there has probability below this
  /// (its row transformed by `draft`), so a step drafts 0 .. draft_length tokens. The decision
  /// depends on the draft's row only, never on the token drawn from it, so verification stays
  /// lossless. 0 (the default): always draft `draft_length` tokens. In [0, 1].
  float draft_p_min = 0.0f;
};

namespace detail {

/// Reusable buffers of one decoding loop.
struct speculative_buffers {
  std::vector<float> logits, probs, scratch, target_probs, draft_probs;
  std::vector<token_t> out_tokens;
  std::vector<index_t> out_nodes;
  tree_workspace verify_ws;  ///< the verifier's, when it takes one (verify_one)
};

/// Verifies a step's tree from the target logits in `buf.logits`: p rows by `target`, the q rows
/// of leaves (which have no children) filled with their p rows when `has_q`, then `verify` with
/// the stream `rng`. Returns the accepted count; buf.out_tokens / buf.out_nodes hold the result.
template <class Verifier>
index_t verify_step(const Verifier& verify, const sampling_params& target, const token_tree& tree,
                    index_t V, speculative_buffers& buf, bool has_q, const request_rng& rng) {
  const index_t nodes = tree.size();
  buf.target_probs.resize(static_cast<std::size_t>(nodes * V));
  rows_to_probs(target, buf.logits, buf.target_probs, buf.scratch, V);
  if (!has_q)
    return verify_one(verify, tree, V, buf.target_probs, {}, rng, buf.out_tokens, buf.out_nodes,
                      &buf.verify_ws);
  buf.draft_probs.resize(static_cast<std::size_t>(nodes * V));
  return verify_with_leaves(verify, tree, V, buf.target_probs, buf.draft_probs, rng, buf.out_tokens,
                            buf.out_nodes, &buf.verify_ws);
}

/// Greedy children: the `count` highest logits of `row` (ties: lowest id), best first.
inline index_t top_tokens(std::span<const float> row, index_t count, token_t* out) {
  index_t n = 0;
  for (; n < count && n < static_cast<index_t>(row.size()); ++n) {
    index_t best = -1;
    for (index_t y = 0; y < static_cast<index_t>(row.size()); ++y) {
      bool taken = false;
      for (index_t j = 0; j < n && !taken; ++j) taken = out[j] == static_cast<token_t>(y);
      if (!taken &&
          (best < 0 || row[static_cast<std::size_t>(y)] > row[static_cast<std::size_t>(best)]))
        best = y;
    }
    out[n] = static_cast<token_t>(best);
  }
  return n;
}

/// Tree drafts: adds the children of the shape's depth-`d` nodes below their draft nodes
/// (shape node s is draft node shape_map[s], -1 when it was not drafted). `draw(u, count)`
/// returns draft node u's children's tokens (a span of at most `count`: fewer when the row
/// cannot supply them); `add(u, token)` appends a draft node below u and returns its index.
/// Returns whether a node was added.
template <class Draw, class Add>
bool grow_tree_level(const token_tree& shape, std::vector<index_t>& shape_map, index_t d,
                     Draw&& draw, Add&& add) {
  const auto sz = [](index_t n) { return static_cast<std::size_t>(n); };
  bool grew = false;
  for (index_t s = 0; s < shape.size(); ++s) {
    const index_t u = shape_map[sz(s)];
    if (shape.depth(s) != d || u < 0 || shape.num_children(s) == 0) continue;
    const std::span<const token_t> chosen = draw(u, shape.num_children(s));
    index_t c = 0;
    for (index_t sc = shape.first_child(s); sc >= 0 && c < static_cast<index_t>(chosen.size());
         sc = shape.next_sibling(sc), ++c) {
      shape_map[sz(sc)] = add(u, chosen[sz(c)]);
      grew = true;
    }
  }
  return grew;
}

/// The limits of a tree drafted in the shape `shape` (and of its partial levels).
inline tree_limits shape_limits(const token_tree& shape) {
  tree_limits limits;
  limits.max_nodes = shape.size();
  limits.max_depth = shape.max_depth();
  limits.max_children = shape.max_width();
  return limits;
}

/// Draft-model speculative decoding of one request (see file comment), as a task; `target` and
/// `draft` are the two models' handles.
template <class TargetHandle, class DraftHandle, class Verifier>
decode_task speculative_task(TargetHandle target, DraftHandle draft,
                             std::span<const token_t> prompt, speculative_options options,
                             request_rng rng, Verifier verify, decode_stats& st,
                             std::vector<token_t>& result) {
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
  require_parameter(options.draft_p_min >= 0.0f && options.draft_p_min <= 1.0f, "draft_p_min",
                    static_cast<double>(options.draft_p_min), "must be in [0, 1]");
  const bool sampled = options.mode == draft_mode::sample;
  const bool tree_drafts = options.draft_tree.has_value();
  require_parameter(!tree_drafts || options.draft_p_min == 0.0f, "draft_p_min",
                    static_cast<double>(options.draft_p_min),
                    "stops chain drafts only: must be 0 with draft_tree");
  if constexpr (requires { verify.options.sampling; })
    require_parameter(!tree_drafts || !sampled || verify.options.sampling == options.draft_sampling,
                      "draft_sampling", static_cast<double>(options.draft_sampling),
                      "must equal the verifier's tree_options::sampling");
  const auto sz = [](index_t n) { return static_cast<std::size_t>(n); };

  // seq: prompt and generated tokens. The target holds seq[0 .. n-1) (the root seq.back() is
  // evaluated by each step); the draft holds seq[0 .. draft.context_size()).
  const auto prompt_len = static_cast<index_t>(prompt.size());
  std::vector<token_t>& seq = co_await start_request(
      prompt, options.stop_token, options.stop_tokens, V, result, st, target, draft);
  speculative_buffers buf;
  buf.scratch.resize(sz(V));
  if (options.draft_p_min > 0.0f) buf.probs.resize(sz(V));
  std::vector<token_t> pending, chosen;
  std::vector<index_t> parents, shape_map, all, pass_parents, row_of, depth_of, committed,
      expanding, to_commit;
  std::vector<token_t> tokens, pass_tokens;
  std::vector<float> draft_logits;
  token_tree tree;

  for (std::uint32_t step = 0;; ++step) {
    const index_t generated = static_cast<index_t>(seq.size()) - prompt_len;
    const index_t remaining = options.max_new_tokens - generated;
    if (remaining <= 0) break;
    const index_t n = static_cast<index_t>(seq.size());
    const index_t max_depth = std::min(
        tree_drafts ? options.draft_tree->max_depth() : options.draft_length, remaining - 1);
    const request_rng draft_rng = step_stream(rng, step, 1);
    // Node u's children were drawn from q row u (q_rows: nodes x V).
    parents.assign(1, -1);
    tokens.assign(1, seq.back());
    buf.draft_probs.assign(sz(V), 0.0f);
    // Draws node `parent`'s children from the draft's logit row (q row `parent` in sample mode).
    const auto draw_children = [&](index_t parent, std::span<float> row, index_t count) {
      chosen.resize(sz(count));
      index_t got = 0;
      if (sampled) {
        auto q = std::span<float>(buf.draft_probs.data() + parent * V, sz(V));
        logits_to_probs(options.draft, row, {}, q, buf.scratch);
        auto w = [&](index_t y) { return static_cast<double>(q[sz(y)]); };
        philox_source src{draft_rng};
        if (options.draft_sampling == sibling_sampling::without_replacement) {
          got = sample_without_replacement_sequential(
              src, V, w, count, static_cast<std::uint32_t>(parent), 0, chosen.data());
        } else {
          const double total = positive_mass(V, w);
          for (; got < count && total > 0.0; ++got)
            chosen[sz(got)] = static_cast<token_t>(src.categorical(
                V, w, total,
                draw_id{static_cast<std::uint32_t>(parent), static_cast<std::uint32_t>(got)}));
        }
      } else {
        got = top_tokens(row, count, chosen.data());
      }
      chosen.resize(sz(got));
      return std::span<const token_t>(chosen);
    };
    const auto add_node = [&](index_t parent, token_t t) {
      parents.push_back(parent);
      tokens.push_back(t);
      buf.draft_probs.resize(buf.draft_probs.size() + sz(V), 0.0f);
      return static_cast<index_t>(parents.size()) - 1;
    };

    // --- Draft.
    if (max_depth > 0) {
      scoped_timer timer(st.draft_seconds);
      const index_t held = draft.context_size();
      pending.assign(seq.begin() + held, seq.end());  // not yet in the draft's cache
      if (!tree_drafts) {
        // A chain, one token per draft pass; each pass's nodes are committed to the draft's
        // cache (rolled back after verification).
        for (index_t i = 0; i < max_depth; ++i) {
          const token_tree chain = trees::chain(pending);
          co_await draft_pass(chain, draft_logits, st);
          all.resize(sz(chain.size()));
          for (index_t k = 0; k < chain.size(); ++k) all[sz(k)] = k;
          draft.commit(all);
          const auto row = std::span<float>(draft_logits.data() + (chain.size() - 1) * V, sz(V));
          if (options.draft_p_min > 0.0f) {
            // The draft's most likely token at this position, from its row alone.
            auto q = std::span<float>(buf.probs.data(), sz(V));
            logits_to_probs(options.draft, row, {}, q, buf.scratch);
            if (*std::max_element(q.begin(), q.end()) < options.draft_p_min) break;
          }
          draw_children(i, row, 1);
          add_node(i, chosen.at(0));
          pending.assign(1, chosen[0]);
        }
      } else {
        // A tree, one level per draft pass. The first pass brings the draft's cache up to
        // seq[0 .. n-1) and gives the root's row. Each later pass evaluates, on top of the
        // cache, only what the level's rows need: the nodes of the level that get children
        // (E) and their ancestors; the ancestors above the deepest common ancestor c of E are
        // committed to the draft's cache first (they were in the previous pass), so that a
        // chain with alternatives (one node per level with children) drafts with one-node
        // passes like a chain, and a leaf sibling is never evaluated.
        const token_tree& shape = *options.draft_tree;
        shape_map.assign(sz(shape.size()), -1);
        shape_map[0] = 0;
        depth_of.assign(1, 0);
        committed.clear();
        index_t chain_len = 0;
        bool chain_committed = false;
        for (index_t d = 0; d < max_depth; ++d) {
          std::span<float> rows;
          if (d == 0) {
            const token_tree chain = trees::chain(pending);
            co_await draft_pass(chain, draft_logits, st);
            chain_len = chain.size();
            row_of.assign(1, chain_len - 1);  // the root's row
            rows = std::span<float>(draft_logits.data() + (chain_len - 1) * V, sz(V));
          } else {
            // E, and c (-1: E is empty).
            expanding.clear();
            for (index_t s = 0; s < shape.size(); ++s) {
              const index_t u = shape_map[sz(s)];
              if (shape.depth(s) == d && u >= 0 && shape.num_children(s) > 0)
                expanding.push_back(u);
            }
            index_t c = expanding.empty() ? -1 : expanding.front();
            for (const index_t e : expanding) {
              index_t a = e;
              while (depth_of[sz(a)] > depth_of[sz(c)]) a = parents[sz(a)];
              while (depth_of[sz(c)] > depth_of[sz(a)]) c = parents[sz(c)];
              while (a != c) {
                a = parents[sz(a)];
                c = parents[sz(c)];
              }
            }
            // Commit the nodes above c that the cache does not hold yet (root first), by their
            // indices in the previous pass (the first pass: its whole chain but the root, and
            // the root too when it lies above c).
            const auto first_new = static_cast<index_t>(committed.size());
            to_commit.clear();
            for (index_t v = c < 0 ? -1 : parents[sz(c)]; v >= 0 && depth_of[sz(v)] >= first_new;
                 v = parents[sz(v)])
              to_commit.push_back(v);
            std::reverse(to_commit.begin(), to_commit.end());
            all.clear();
            if (d == 1)
              for (index_t k = 0; k + 1 < chain_len; ++k) all.push_back(k);
            for (const index_t v : to_commit) all.push_back(row_of[sz(v)]);
            if (d == 1 || !all.empty()) draft.commit(all);
            chain_committed = true;
            committed.insert(committed.end(), to_commit.begin(), to_commit.end());
            if (expanding.empty()) break;
            // The pass: c and the nodes between c and E (c is its root).
            row_of.assign(parents.size(), -1);
            for (const index_t e : expanding)
              for (index_t v = e; row_of[sz(v)] < 0; v = parents[sz(v)]) {
                row_of[sz(v)] = 0;
                if (v == c) break;
              }
            pass_parents.clear();
            pass_tokens.clear();
            for (index_t v = c; v < static_cast<index_t>(parents.size()); ++v) {
              if (row_of[sz(v)] < 0) continue;
              row_of[sz(v)] = static_cast<index_t>(pass_parents.size());
              pass_parents.push_back(v == c ? -1 : row_of[sz(parents[sz(v)])]);
              pass_tokens.push_back(tokens[sz(v)]);
            }
            tree.assign(pass_parents, pass_tokens, shape_limits(shape));
            co_await draft_pass(tree, draft_logits, st);
            rows = std::span<float>(draft_logits);
          }
          const auto draw = [&](index_t u, index_t count) {
            return draw_children(u, rows.subspan(d == 0 ? 0 : sz(row_of[sz(u)] * V), sz(V)), count);
          };
          const auto add = [&](index_t u, token_t t) {
            depth_of.push_back(d + 1);
            return add_node(u, t);
          };
          if (!grow_tree_level(shape, shape_map, d, draw, add)) break;
        }
        if (!chain_committed) {
          // No second pass took the first pass's chain: commit it but the root.
          all.clear();
          for (index_t k = 0; k + 1 < chain_len; ++k) all.push_back(k);
          draft.commit(all);
        }
      }
    }

    // --- Target: root and drafts in one forward pass.
    {
      tree_limits limits;
      limits.max_nodes = std::max<index_t>(1, static_cast<index_t>(parents.size()));
      limits.max_depth = std::max<index_t>(1, max_depth);
      limits.max_children = std::max<index_t>(1, tree_drafts ? options.draft_tree->max_width() : 1);
      tree.assign(parents, tokens, limits);
    }
    co_await target_pass(tree, buf.logits, st);

    // --- Verify.
    index_t accepted = 0;
    {
      scoped_timer timer(st.verify_seconds);
      accepted = verify_step(verify, options.target, tree, V, buf, sampled, step_stream(rng, step));
    }

    // --- Commit: the target keeps root + accepted drafts; the draft drops what it does not
    // hold from the accepted path (chain drafts) or its uncommitted tree (tree drafts).
    target.commit(std::span<const index_t>(buf.out_nodes.data(), sz(accepted + 1)));
    if (max_depth > 0 && tree_drafts) {
      // The draft holds seq[0 .. n-1) and the committed tree nodes (root first): it keeps
      // those on the accepted path.
      index_t keep = 0;
      while (keep < static_cast<index_t>(committed.size()) && keep <= accepted &&
             committed[sz(keep)] == buf.out_nodes[sz(keep)])
        ++keep;
      draft.rollback(std::min(draft.context_size(), n - 1 + keep));
    } else if (max_depth > 0) {
      draft.rollback(std::min(draft.context_size(), n + accepted));
    }
    if (emit_step(buf.out_tokens, accepted, stop_set{options.stop_token, options.stop_tokens}, seq,
                  st))
      break;
  }
  trim_cache(target, static_cast<index_t>(seq.size()) - 1);
  trim_cache(draft, static_cast<index_t>(seq.size()));
  result.assign(seq.begin() + prompt_len, seq.end());
}

}  // namespace detail

/// Generates up to `options.max_new_tokens` tokens after `prompt` (see file comment). Both
/// models are (re)started with `prefill(prompt)`. Returns the generated tokens; adds to
/// `*stats` when given. `control` adds cancellation between passes (decode/control.hpp).
template <session_model Target, session_model Draft, verifier Verifier = tree_verifier<>>
std::vector<token_t> speculative_decode(Target& target, Draft& draft,
                                        std::span<const token_t> prompt,
                                        const speculative_options& options, request_rng rng,
                                        const Verifier& verify = {}, decode_stats* stats = nullptr,
                                        const request_control& control = {}) {
  detail::require_distinct_models(&target, &draft);
  std::vector<token_t> out;
  detail::decode_solo(
      target, &draft, stats,
      [&](decode_stats& st) {
        return detail::speculative_task(detail::solo<Target>{&target},
                                        detail::solo<Draft>{&draft, fault_source::draft}, prompt,
                                        options, rng, verify, st, out);
      },
      control);
  return out;
}

namespace detail {

/// speculative_decode_batch with request r verified by verifier_of(r).
template <class Target, class Draft, class VerifierOf>
std::vector<std::vector<token_t>> speculative_batch(
    Target& target, Draft& draft, std::span<const std::vector<token_t>> prompts,
    const speculative_options& options, std::span<const request_rng> rngs, VerifierOf&& verifier_of,
    std::span<decode_stats> stats, const batch_control& control) {
  if (!prompts.empty()) require_distinct_models(&target, &draft);  // B = 0: a no-op
  require_parameter(draft.batch_size() >= static_cast<index_t>(prompts.size()), "draft",
                    static_cast<double>(draft.batch_size()),
                    "the draft model's batch_size() is smaller than the number of prompts");
  std::vector<std::vector<token_t>> out(prompts.size());
  decode_batch(
      target, &draft, target.batch_size(), prompts, rngs.size(), stats,
      [&](index_t r, decode_stats& st) {
        const auto i = static_cast<std::size_t>(r);
        return speculative_task(
            member<Target>{&target, r}, member<Draft>{&draft, r, fault_source::draft}, prompts[i],
            request_options(options, control, r), rngs[i], verifier_of(r), st, out[i]);
      },
      control, target.vocab_size());
  return out;
}

}  // namespace detail

/// speculative_decode for several requests at once: request r decodes `prompts[r]` with
/// `rngs[r]` as request r of both batched models, all requests' draft and target passes shared
/// (decode/task.hpp); adds to `stats[r]` when `stats` is given. Each output equals
/// speculative_decode of that request alone. `control` adds isolation, cancellation and
/// per-request limits (decode/control.hpp).
template <batched_session_model Target, batched_session_model Draft,
          verifier Verifier = tree_verifier<>>
std::vector<std::vector<token_t>> speculative_decode_batch(
    Target& target, Draft& draft, std::span<const std::vector<token_t>> prompts,
    const speculative_options& options, std::span<const request_rng> rngs,
    const Verifier& verify = {}, std::span<decode_stats> stats = {},
    const batch_control& control = {}) {
  return detail::speculative_batch(
      target, draft, prompts, options, rngs, [&](index_t) -> const Verifier& { return verify; },
      stats, control);
}

/// speculative_decode_batch with one verifier per request: `verifiers[r]` verifies request r
/// (per-request rules, e.g. each request's relaxation or LANTERN parameters in a tree_verifier).
/// Throws invalid_input ("verifiers") unless there is one per prompt.
template <batched_session_model Target, batched_session_model Draft, verifier Verifier>
std::vector<std::vector<token_t>> speculative_decode_batch(
    Target& target, Draft& draft, std::span<const std::vector<token_t>> prompts,
    const speculative_options& options, std::span<const request_rng> rngs,
    std::span<const Verifier> verifiers, std::span<decode_stats> stats = {},
    const batch_control& control = {}) {
  detail::require_size(static_cast<index_t>(verifiers.size()), static_cast<index_t>(prompts.size()),
                       "verifiers", "one verifier per prompt");
  return detail::speculative_batch(
      target, draft, prompts, options, rngs,
      [&](index_t r) -> const Verifier& { return verifiers[static_cast<std::size_t>(r)]; }, stats,
      control);
}

}  // namespace specula
