#pragma once

/// @file
/// Draft-model speculative decoding (chain or tree drafts, sampled; the exact rule, or Cool-SD's
/// relaxed rule with `resident_sd_options::relaxed`) with the probability rows kept where the
/// model computes them: the loop
/// (`resident_speculative_decode`) holds only tokens, the draft tree's shape and counters, and
/// drives an *ops* object that owns both models, their caches and the q / p rows.
///
/// - `host_sd_ops`: the host stand-in (host transformers, `logits_to_probs`, the keyed
///   without-replacement draw, `verify_tree`), so CI runs the loop's stepping without a GPU;
/// - `device_sd_ops` (device_transformer.hpp's library, CUDA builds): the same steps on the GPU —
///   logits from `device_transformer::evaluate_tree_device`,
///   `specula::cuda::logits_to_probs_async`, `specula::cuda::sample_without_replacement_async` for
///   the drafts (k = 1 for a chain, a node's children for a tree) and
///   `specula::cuda::verify_tree_async` for the verification. What crosses per step is listed in
///   docs/cuda.md ("The example transformer on the GPU").
///
/// Tree drafts (`resident_sd_options::draft_tree`) follow speculative_decode's: one draft pass
/// per level, node u's children the keyed draws without replacement from q row u (siblings
/// distinct, so the accepted path is recovered from the emitted tokens alone).
///
/// Randomness: the children of draft node u in step s are the keyed draws at position u of the
/// stream {fold_in(seed, 1), request_id, s} (for a chain, draft i is drawn at position i);
/// verification uses {seed, request_id, s}. Host and device ops make the same draws from the
/// same rows; rows differ by float rounding only, so outputs agree except where a draw falls
/// within rounding of a boundary. The output law is the target's with the exact rule (tested by
/// G-tests on both), the relaxed loop's law with Cool-SD's rule (tested against its exact law on
/// the host).

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/rng.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/decode/speculative.hpp"
#include "specula/decode/stats.hpp"
#include "specula/decode/step.hpp"
#include "specula/decode/task.hpp"
#include "specula/rules/relaxed.hpp"
#include "specula/sample/transforms.hpp"
#include "specula/sample/without_replacement.hpp"
#include "specula/tree/builders.hpp"
#include "specula_example/sessions.hpp"

namespace specula::example {

/// Options of resident_speculative_decode.
struct resident_sd_options {
  index_t draft_length = 4;  ///< drafted tokens per step (gamma), >= 0 (chain drafts)
  /// Tree drafts: the shape of each step's draft tree (as speculative_options::draft_tree;
  /// siblings drawn without replacement). Unset: a chain of `draft_length` drafts.
  std::optional<token_tree> draft_tree;
  index_t max_new_tokens = 64;  ///< >= 1
  /// Dynamic draft length (as speculative_options::draft_p_min; chain drafts only): drafting of
  /// a step stops at the first draft row whose largest q probability is below this, in [0, 1].
  float draft_p_min = 0.0f;
  sampling_params target{};       ///< target logits -> p
  sampling_params draft{};        ///< draft logits -> q
  token_t stop_token = no_token;  ///< generation ends after emitting it (-1: never)
  /// Cool-SD: verify with this relaxed rule (ω by draft position; not lossless, docs/relaxed.md).
  /// Unset: the exact rule. The device ops refuse a custom schedule (its values are host memory).
  std::optional<scheduled_relaxed_rule> relaxed;
};

/// What the loop asks of its ops object (see file comment). Trees are evaluated below the
/// model's committed context (node 0: its last committed token, as a session's).
/// - `start(prompt, options)`: both models prefilled with all of the prompt but its last token;
/// - `draft_context()`: tokens the draft's cache holds;
/// - `draft_pass(tree, commit, first, q_first)`: evaluates `tree` with the draft model, commits
///   its first `commit` nodes (a chain prefix; 0: none, the nodes stay pending until the next
///   pass or rollback) and turns the rows of nodes [first, tree.size()) into q rows q_first,
///   q_first + 1, ...;
/// - `sample(u, k, rng, out)`: draws up to k distinct tokens from q row u (keyed draws at
///   position u of `rng`) into out[0 ..) and returns how many (fewer when the row has fewer
///   positive entries);
/// - `draft_max(u)`: the largest probability of q row u (with `draft_p_min` only);
/// - `target(tree)`: evaluates `tree` with the target model into p rows, one per node;
/// - `verify(tree, rng, out)`: verifies the tree (node u's children drawn from q row u) against
///   the p rows; writes the accepted drafts and the emitted token to out[0 .. accepted] (out has
///   tree.size() entries) and returns accepted;
/// - `commit_target(path)` (the accepted root-to-node path), `rollback_draft(n)`.
template <class O>
concept resident_sd_ops = requires(O& o, const token_tree& tree, std::span<const token_t> tokens,
                                   std::span<const index_t> path, const resident_sd_options& opt,
                                   index_t i, const request_rng& rng, std::span<token_t> out) {
  o.start(tokens, opt);
  { o.draft_context() } -> std::convertible_to<index_t>;
  o.draft_pass(tree, i, i, i);
  { o.sample(i, i, rng, out) } -> std::convertible_to<index_t>;
  { o.draft_max(i) } -> std::convertible_to<float>;
  o.target(tree);
  { o.verify(tree, rng, out) } -> std::convertible_to<index_t>;
  o.commit_target(path);
  o.rollback_draft(i);
};

namespace detail {

/// The accepted root-to-node path of a verification whose output tokens are out[0 .. accepted]:
/// each accepted token is the child of the path's last node that carries it (siblings are
/// distinct). Throws when a token is no such child (an ops object that broke the contract).
inline void accepted_path(const token_tree& tree, std::span<const token_t> out, index_t accepted,
                          std::vector<index_t>& path) {
  path.assign(1, 0);
  for (index_t j = 0; j < accepted; ++j) {
    const token_t t = out[static_cast<std::size_t>(j)];
    index_t c = tree.first_child(path.back());
    while (c >= 0 && tree.token(c) != t) c = tree.next_sibling(c);
    if (c < 0)
      throw_if_failed({status::invalid_parameter, j, -1, static_cast<double>(t)}, "verify",
                      "an accepted token that is no child of the accepted path");
    path.push_back(c);
  }
}

/// Runs the task `make(stats, out)` (a decode_task that leaves its tokens in `out`) over
/// `target` alone (the resident SJD, SSD and greedy loops' entry points); returns the tokens.
template <class Target, class MakeTask>
std::vector<token_t> run_task(Target& target, decode_stats* stats, MakeTask&& make) {
  std::vector<token_t> out;
  specula::detail::decode_solo(target, static_cast<specula::detail::no_draft*>(nullptr), stats,
                               [&](decode_stats& st) { return make(st, out); });
  return out;
}

}  // namespace detail

/// A session (`transformer_session`, `device_session`) as a resident loop's model: the
/// `session_model` face of an ops object that is also the loop's rows policy.
template <class Session>
class resident_session {
 public:
  template <class Model>
  explicit resident_session(const Model& m) : session_(m) {}

  [[nodiscard]] index_t vocab_size() const noexcept { return session_.vocab_size(); }
  void prefill(std::span<const token_t> prompt) { session_.prefill(prompt); }
  [[nodiscard]] index_t context_size() const noexcept { return session_.context_size(); }
  void rollback(index_t n) { session_.rollback(n); }
  void evaluate(const token_tree& tree, batch_view<float> logits) {
    session_.evaluate(tree, logits);
  }
  void commit(std::span<const index_t> path) { session_.commit(path); }

 protected:
  Session session_;
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
  require_parameter(options.draft_p_min >= 0.0f && options.draft_p_min <= 1.0f, "draft_p_min",
                    static_cast<double>(options.draft_p_min), "must be in [0, 1]");
  require_parameter(!options.draft_tree.has_value() || options.draft_p_min == 0.0f, "draft_p_min",
                    static_cast<double>(options.draft_p_min),
                    "stops chain drafts only: must be 0 with draft_tree");
  if (options.relaxed) options.relaxed->validate();
  const auto sz = [](index_t n) { return static_cast<std::size_t>(n); };
  decode_stats local;
  decode_stats& st = stats != nullptr ? *stats : local;
  ops.start(prompt, options);
  std::vector<token_t> seq(prompt.begin(), prompt.end()), pending, tokens, chosen, out;
  std::vector<index_t> parents, shape_map, path;
  const auto prompt_len = static_cast<index_t>(prompt.size());
  const bool tree_drafts = options.draft_tree.has_value();
  for (std::uint32_t step = 0;; ++step) {
    const index_t remaining =
        options.max_new_tokens - (static_cast<index_t>(seq.size()) - prompt_len);
    if (remaining <= 0) break;
    const auto n = static_cast<index_t>(seq.size());
    const index_t max_depth = std::min(
        tree_drafts ? options.draft_tree->max_depth() : options.draft_length, remaining - 1);
    parents.assign(1, -1);
    tokens.assign(1, seq.back());
    if (max_depth > 0) {
      specula::detail::scoped_timer timer(st.draft_seconds);
      const request_rng draft_rng = specula::detail::step_stream(rng, step, 1);
      pending.assign(seq.begin() + ops.draft_context(), seq.end());
      const auto held = static_cast<index_t>(pending.size());  // the last one is the root
      const auto draw = [&](index_t u, index_t count) {
        chosen.resize(sz(count));
        chosen.resize(sz(ops.sample(u, count, draft_rng, chosen)));
        return std::span<const token_t>(chosen);
      };
      const auto add = [&](index_t parent, token_t t) {
        parents.push_back(parent);
        tokens.push_back(t);
        return static_cast<index_t>(parents.size()) - 1;
      };
      if (!tree_drafts) {
        // A chain, one token per draft pass, each pass committed to the draft's cache.
        for (index_t i = 0; i < max_depth; ++i) {
          const auto len = static_cast<index_t>(pending.size());
          ops.draft_pass(trees::chain(pending), len, len - 1, i);
          ++st.draft_forwards;
          // The draw comes first (the device ops fetch the row's largest probability with the
          // drawn token, one round trip); at a stopping position it is dropped (keyed draws:
          // no other draw depends on it), so the drafts are speculative_decode's.
          if (draw(i, 1).empty())
            throw_if_failed({status::no_mass, i, -1, 0.0}, "draft", "the draft row has no mass");
          if (options.draft_p_min > 0.0f && ops.draft_max(i) < options.draft_p_min) break;
          add(i, chosen[0]);
          pending.assign(1, chosen[0]);
        }
      } else {
        // A tree, one level per draft pass: the first brings the draft's cache up to the root
        // (committed) and gives the root's row; later ones evaluate the tree drafted so far
        // (uncommitted) for the rows of its deepest level, nodes [first, size).
        const token_tree& shape = *options.draft_tree;
        shape_map.assign(sz(shape.size()), -1);
        shape_map[0] = 0;
        index_t first = 0;
        for (index_t d = 0; d < max_depth; ++d) {
          if (d == 0)
            ops.draft_pass(trees::chain(pending), held - 1, held - 1, 0);
          else
            ops.draft_pass(token_tree(parents, tokens, specula::detail::shape_limits(shape)), 0,
                           first, first);
          ++st.draft_forwards;
          first = static_cast<index_t>(parents.size());
          if (!specula::detail::grow_tree_level(shape, shape_map, d, draw, add)) break;
        }
      }
    }
    tree_limits limits;
    limits.max_nodes = std::max<index_t>(1, static_cast<index_t>(parents.size()));
    limits.max_depth = std::max<index_t>(1, max_depth);
    limits.max_children = std::max<index_t>(1, tree_drafts ? options.draft_tree->max_width() : 1);
    const token_tree tree(parents, tokens, limits);
    {
      specula::detail::scoped_timer timer(st.forward_seconds);
      ops.target(tree);
      ++st.target_forwards;
    }
    index_t accepted = 0;
    out.assign(sz(tree.size()), no_token);
    {
      specula::detail::scoped_timer timer(st.verify_seconds);
      accepted = ops.verify(tree, specula::detail::step_stream(rng, step), out);
      detail::accepted_path(tree, out, accepted, path);
    }
    ops.commit_target(path);
    if (max_depth > 0) ops.rollback_draft(std::min(ops.draft_context(), n + accepted));
    if (specula::detail::emit_step(out, accepted, options.stop_token, seq, st)) break;
  }
  return {seq.begin() + prompt_len, seq.end()};
}

/// The host stand-in of `device_sd_ops`: two sessions (`Session`: one request of a model, e.g.
/// `transformer_session`, or a test kit's toy session), rows in host memory.
template <class Session>
class basic_host_sd_ops {
 public:
  template <class Model>
  basic_host_sd_ops(const Model& target, const Model& draft)
      : target_(target), draft_(draft), V_(target_.vocab_size()) {
    require_parameter(draft_.vocab_size() == V_, "draft", static_cast<double>(draft_.vocab_size()),
                      "the draft model's vocabulary must equal the target's");
  }

  void start(std::span<const token_t> prompt, const resident_sd_options& options) {
    options_ = options;
    target_.prefill(prompt);
    if (options.draft_length > 0 || options.draft_tree) draft_.prefill(prompt);  // else unused
    buf_.scratch.resize(static_cast<std::size_t>(V_));
  }
  [[nodiscard]] index_t draft_context() const noexcept { return draft_.context_size(); }

  void draft_pass(const token_tree& tree, index_t commit, index_t first, index_t q_first) {
    const auto sz = [](index_t n) { return static_cast<std::size_t>(n); };
    logits_.resize(sz(tree.size() * V_));
    draft_.evaluate(tree, batch_view<float>(logits_.data(), tree.size(), V_));
    if (commit > 0) {
      path_.resize(sz(commit));
      for (index_t k = 0; k < commit; ++k) path_[sz(k)] = k;
      draft_.commit(path_);
    }
    const index_t rows = tree.size() - first;
    auto& q = buf_.draft_probs;
    q.resize(std::max(q.size(), sz((q_first + rows) * V_)));
    specula::detail::rows_to_probs(
        options_.draft, std::span<float>(logits_).subspan(sz(first * V_), sz(rows * V_)),
        std::span<float>(q).subspan(sz(q_first * V_), sz(rows * V_)), buf_.scratch, V_);
  }

  index_t sample(index_t u, index_t k, const request_rng& rng, std::span<token_t> out) {
    const float* q = buf_.draft_probs.data() + u * V_;
    keys_.resize(static_cast<std::size_t>(k));
    return sample_without_replacement_keys(
        V_, [&](index_t y) { return static_cast<double>(q[y]); }, k, rng,
        static_cast<std::uint32_t>(u), out.data(), keys_.data());
  }

  [[nodiscard]] float draft_max(index_t u) const {
    const float* q = buf_.draft_probs.data() + u * V_;
    return *std::max_element(q, q + V_);
  }

  void target(const token_tree& tree) {
    buf_.logits.resize(static_cast<std::size_t>(tree.size() * V_));
    target_.evaluate(tree, batch_view<float>(buf_.logits.data(), tree.size(), V_));
  }

  index_t verify(const token_tree& tree, const request_rng& rng, std::span<token_t> out) {
    // p rows from the target's logits; leaves (no children) get q = p (never read).
    index_t accepted = 0;
    if (options_.relaxed) {
      tree_verifier<host::sequential_policy, scheduled_relaxed_rule> relaxed;
      relaxed.rule = *options_.relaxed;
      accepted = specula::detail::verify_step(relaxed, options_.target, tree, V_, buf_, true, rng);
    } else {
      accepted = specula::detail::verify_step(tree_verifier<>{}, options_.target, tree, V_, buf_,
                                              true, rng);
    }
    std::copy_n(buf_.out_tokens.begin(), accepted + 1, out.begin());
    return accepted;
  }

  void commit_target(std::span<const index_t> path) { target_.commit(path); }
  void rollback_draft(index_t n) { draft_.rollback(n); }

 private:
  Session target_, draft_;
  index_t V_;
  resident_sd_options options_;
  specula::detail::speculative_buffers buf_;  // logits: target; draft_probs: q rows
  std::vector<float> logits_;                 // the draft's
  std::vector<double> keys_;
  std::vector<index_t> path_;
};

/// The host stand-in over the example transformer.
using host_sd_ops = basic_host_sd_ops<transformer_session>;

static_assert(resident_sd_ops<host_sd_ops>);

}  // namespace specula::example
