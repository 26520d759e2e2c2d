#pragma once

/// @file
/// Self speculative decoding of masked diffusion models (SSD, Algorithm 1) and its reference,
/// stepwise semi-autoregressive decoding with low-confidence remasking (LLaDA style).
///
/// The sequence is the prompt followed by `gen_length` mask tokens, split into blocks of
/// `block_size` positions after the prompt. **Stepwise decoding** unmasks one position per
/// forward pass: among the masked positions of the first block that still has any, the one whose
/// argmax probability (the confidence) is highest (ties: the lowest position), set to its argmax
/// token (ties: the lowest id). This is the `detail::stepwise_choice` rule; SSD's output is
/// identical to it by construction.
///
/// **SSD**: the forward pass that verified the previous iteration also drafts every masked
/// position (argmax and confidence of the accepted node's rows). Each iteration:
///
/// 1. select up to N drafted positions in semi-autoregressive order — the first unfinished block
///    by decreasing confidence, then the next block — and place them one after another: node i of
///    the greedy chain is the current sequence with the first i drafts placed (N + 1 nodes); the
///    mix-order tree (`ssd_tree::mix_order`) adds, below chain node k, a leaf with draft k + 2
///    placed directly (out-of-order acceptance; `trees::ssd_mix_order`, 2N nodes with the root);
/// 2. one forward pass evaluates every node's sequence (a batch of whole sequences);
/// 3. from the root, a child is accepted when its placed (position, token) is exactly the
///    stepwise choice from its parent's rows; at the first node without such a child, that
///    node's stepwise choice is placed too (so every iteration unmasks at least one position, and
///    N + 1 when the whole chain is accepted, unless that fills the last masked position). The next
///    drafts are the last accepted node's rows.
///
/// The first iteration has no drafts and evaluates the root alone.

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/types.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/decode/stats.hpp"
#include "specula/decode/task.hpp"
#include "specula/tree/builders.hpp"

namespace specula {

/// SSD's verification tree.
enum class ssd_tree {
  chain,      ///< greedy chain of N + 1 nodes (the paper's default)
  mix_order,  ///< chain plus one out-of-order leaf below every chain node with a grandchild
};

/// Options of ssd_decode and diffusion_stepwise_decode.
struct ssd_options {
  index_t gen_length = 64;   ///< masked positions after the prompt, >= 1
  index_t block_size = 32;   ///< semi-autoregressive block size, >= 1
  index_t draft_length = 4;  ///< N: drafts verified per iteration, >= 1 (SSD only)
  ssd_tree tree = ssd_tree::chain;
};

namespace detail {

/// A position to unmask and its token.
struct diffusion_pick {
  index_t position = -1;
  token_t token = no_token;
  bool operator==(const diffusion_pick&) const = default;
};

/// Argmax (lowest id on ties) and its softmax probability for one logit row.
struct row_top {
  index_t token = -1;
  double confidence = 0.0;
};
inline row_top top_of(std::span<const float> row) {
  row_top t;
  float best = -INFINITY;
  for (std::size_t y = 0; y < row.size(); ++y)
    if (row[y] > best || t.token < 0) {
      best = row[y];
      t.token = static_cast<index_t>(y);
    }
  double sum = 0.0;
  for (const float v : row) sum += std::exp(static_cast<double>(v) - static_cast<double>(best));
  t.confidence = sum > 0.0 ? 1.0 / sum : 0.0;
  return t;
}

/// The semi-autoregressive layout of a request.
struct diffusion_layout {
  index_t prompt_len = 0;
  index_t length = 0;  ///< prompt + generated positions
  index_t block_size = 1;
  [[nodiscard]] index_t block_of(index_t pos) const { return (pos - prompt_len) / block_size; }
};

/// The stepwise rule: the most confident masked position of the first unfinished block, and its
/// argmax. `rows` are the sequence's logit rows (length x V).
inline diffusion_pick stepwise_choice(std::span<const token_t> seq, std::span<const float> rows,
                                      index_t vocab, token_t mask, const diffusion_layout& lay) {
  diffusion_pick pick;
  index_t block = -1;
  double best = -1.0;
  for (index_t pos = lay.prompt_len; pos < lay.length; ++pos) {
    if (seq[static_cast<std::size_t>(pos)] != mask) continue;
    if (block < 0) block = lay.block_of(pos);
    if (lay.block_of(pos) != block) break;
    const auto t = top_of(
        rows.subspan(static_cast<std::size_t>(pos * vocab), static_cast<std::size_t>(vocab)));
    if (t.confidence > best) {
      best = t.confidence;
      pick = {pos, static_cast<token_t>(t.token)};
    }
  }
  return pick;
}

inline void check_diffusion_input(std::span<const token_t> prompt, const ssd_options& o,
                                  index_t vocab, token_t mask) {
  if (prompt.empty()) throw_if_failed({status::empty_input, -1, -1, 0.0}, "prompt");
  require_parameter(o.gen_length >= 1, "gen_length", static_cast<double>(o.gen_length),
                    "must be >= 1");
  require_parameter(o.block_size >= 1, "block_size", static_cast<double>(o.block_size),
                    "must be >= 1");
  require_parameter(o.draft_length >= 1, "draft_length", static_cast<double>(o.draft_length),
                    "must be >= 1");
  require_parameter(mask >= 0 && mask < vocab, "mask_token", static_cast<double>(mask),
                    "the model has no mask token in [0, vocab_size)");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab || prompt[i] == mask)
      throw_if_failed(
          {status::token_out_of_range, static_cast<index_t>(i), -1, static_cast<double>(prompt[i])},
          "prompt", "token outside [0, vocab_size) or the mask token");
}

/// A request's start: input checked, layout, and the prompt followed by the masks.
struct diffusion_start {
  diffusion_layout lay;
  std::vector<token_t> seq;
};
template <class Model>
diffusion_start start_diffusion(const Model& m, std::span<const token_t> prompt,
                                const ssd_options& o) {
  check_diffusion_input(prompt, o, m.vocab_size(), m.mask_token());
  diffusion_start s{{static_cast<index_t>(prompt.size()),
                     static_cast<index_t>(prompt.size()) + o.gen_length, o.block_size},
                    std::vector<token_t>(prompt.begin(), prompt.end())};
  s.seq.resize(static_cast<std::size_t>(s.lay.length), m.mask_token());
  return s;
}

}  // namespace detail

namespace detail {

/// Stepwise decoding of one request (see file comment), as a task.
template <class Model>
decode_task stepwise_task(const Model& m, std::span<const token_t> prompt, ssd_options options,
                          decode_stats& st, std::vector<token_t>& result) {
  auto start = detail::start_diffusion(m, prompt, options);
  const diffusion_layout lay = start.lay;
  std::vector<token_t>& seq = start.seq;
  const index_t V = m.vocab_size();
  const token_t mask = m.mask_token();
  std::vector<float> logits;
  for (index_t i = 0; i < options.gen_length; ++i) {
    co_await detail::sequences_pass(seq, lay.length, logits, st);
    detail::scoped_timer timer(st.verify_seconds);
    const auto pick = detail::stepwise_choice(seq, logits, V, mask, lay);
    seq[static_cast<std::size_t>(pick.position)] = pick.token;
    st.record_step(0);
    st.step_tokens.push_back(1);
    ++st.tokens;
  }
  result.assign(seq.begin() + lay.prompt_len, seq.end());
}

/// SSD of one request (see file comment), as a task.
template <class Model>
decode_task ssd_task(const Model& m, std::span<const token_t> prompt, ssd_options options,
                     decode_stats& st, std::vector<token_t>& result) {
  auto start = detail::start_diffusion(m, prompt, options);
  const diffusion_layout lay = start.lay;
  std::vector<token_t>& seq = start.seq;
  const index_t V = m.vocab_size();
  const token_t mask = m.mask_token();
  const auto L = static_cast<std::size_t>(lay.length);
  const auto sz = [](index_t i) { return static_cast<std::size_t>(i); };

  std::vector<detail::row_top> drafts;  // per position, from the last accepted node's rows
  std::vector<index_t> order;
  std::vector<detail::diffusion_pick> placed;  // per tree node
  std::vector<token_t> batch;
  std::vector<float> logits;
  index_t masked = options.gen_length;

  while (masked > 0) {
    // --- 1. Candidates in semi-autoregressive order, and the tree's node states.
    token_tree tree;
    placed.assign(1, {});
    {
      detail::scoped_timer timer(st.draft_seconds);
      order.clear();
      if (!drafts.empty())
        for (index_t pos = lay.prompt_len; pos < lay.length; ++pos)
          if (seq[sz(pos)] == mask) order.push_back(pos);
      std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) {
        if (lay.block_of(a) != lay.block_of(b)) return lay.block_of(a) < lay.block_of(b);
        return drafts[sz(a)].confidence > drafts[sz(b)].confidence;
      });
      const auto n = static_cast<index_t>(
          std::min<std::size_t>(order.size(), static_cast<std::size_t>(options.draft_length)));
      tree = n == 0 ? token_tree()
                    : (options.tree == ssd_tree::mix_order ? trees::ssd_mix_order(n)
                                                           : trees::chain(n));
      // Chain node i (1..n) places candidate i - 1; extra node n + 1 + k places candidate k + 1.
      placed.resize(sz(tree.size()));
      for (index_t u = 1; u < tree.size(); ++u) {
        const index_t cand = u <= n ? u - 1 : u - n;
        placed[sz(u)] = {order[sz(cand)], static_cast<token_t>(drafts[sz(order[sz(cand)])].token)};
      }
      batch.resize(sz(tree.size()) * L);
      for (index_t u = 0; u < tree.size(); ++u) {
        auto node_seq = std::span<token_t>(batch.data() + sz(u) * L, L);
        const index_t parent = tree.parent(u);
        if (parent < 0)
          std::copy(seq.begin(), seq.end(), node_seq.begin());
        else
          std::copy_n(batch.begin() + static_cast<std::ptrdiff_t>(sz(parent) * L), L,
                      node_seq.begin());
        if (u > 0) node_seq[sz(placed[sz(u)].position)] = placed[sz(u)].token;
      }
    }
    // --- 2. One forward pass over every node's sequence.
    co_await detail::sequences_pass(batch, lay.length, logits, st);
    // --- 3. Verification against the stepwise rule, from the root.
    detail::scoped_timer timer(st.verify_seconds);
    const auto rows_of = [&](index_t u) {
      return std::span<const float>(logits.data() + sz(u) * L * sz(V), L * sz(V));
    };
    const auto seq_of = [&](index_t u) {
      return std::span<const token_t>(batch.data() + sz(u) * L, L);
    };
    index_t u = 0, accepted = 0;
    detail::diffusion_pick pick;
    for (;;) {
      pick = detail::stepwise_choice(seq_of(u), rows_of(u), V, mask, lay);
      index_t next = -1;
      for (index_t c = tree.first_child(u); c >= 0 && next < 0; c = tree.next_sibling(c))
        if (placed[sz(c)] == pick) next = c;
      if (next < 0) break;
      u = next;
      ++accepted;
    }
    std::copy(seq_of(u).begin(), seq_of(u).end(), seq.begin());
    // No pick when the accepted node has no masked position left (the chain filled them all).
    const index_t emitted = accepted + (pick.position >= 0 ? 1 : 0);
    if (pick.position >= 0) seq[sz(pick.position)] = pick.token;
    masked -= emitted;
    st.record_step(accepted);
    st.step_tokens.push_back(emitted);
    st.tokens += emitted;
    // The next drafts: the accepted node's rows.
    drafts.assign(L, {});
    const auto rows = rows_of(u);
    for (index_t pos = lay.prompt_len; pos < lay.length; ++pos)
      if (seq[sz(pos)] == mask) drafts[sz(pos)] = detail::top_of(rows.subspan(sz(pos * V), sz(V)));
  }
  result.assign(seq.begin() + lay.prompt_len, seq.end());
}

/// Runs `task(m, prompt_r, ...)` for every prompt, sharing sequence passes.
template <class Model, class Task>
std::vector<std::vector<token_t>> diffusion_batch(const Model& m,
                                                  std::span<const std::vector<token_t>> prompts,
                                                  std::span<decode_stats> stats, Task task) {
  std::vector<std::vector<token_t>> out(prompts.size());
  decode_batch(m, static_cast<no_draft*>(nullptr), static_cast<index_t>(prompts.size()), prompts,
               prompts.size(), stats, [&](index_t r, decode_stats& st) {
                 const auto i = static_cast<std::size_t>(r);
                 return task(prompts[i], st, out[i]);
               });
  return out;
}

}  // namespace detail

/// Stepwise semi-autoregressive decoding with low-confidence remasking: one position per forward
/// pass (see file comment). Returns the `gen_length` generated tokens.
template <masked_model Model>
std::vector<token_t> diffusion_stepwise_decode(const Model& m, std::span<const token_t> prompt,
                                               const ssd_options& options,
                                               decode_stats* stats = nullptr) {
  std::vector<token_t> out;
  detail::decode_solo(m, static_cast<detail::no_draft*>(nullptr), stats, [&](decode_stats& st) {
    return detail::stepwise_task(m, prompt, options, st, out);
  });
  return out;
}

/// Self speculative decoding (see file comment). Output identical to
/// diffusion_stepwise_decode with the same options. Returns the `gen_length` generated tokens.
template <masked_model Model>
std::vector<token_t> ssd_decode(const Model& m, std::span<const token_t> prompt,
                                const ssd_options& options, decode_stats* stats = nullptr) {
  std::vector<token_t> out;
  detail::decode_solo(m, static_cast<detail::no_draft*>(nullptr), stats, [&](decode_stats& st) {
    return detail::ssd_task(m, prompt, options, st, out);
  });
  return out;
}

/// diffusion_stepwise_decode for several prompts at once: each step evaluates all requests'
/// sequences of equal length in one call (decode/task.hpp); adds to `stats[r]` when `stats` is
/// given. Each output equals diffusion_stepwise_decode of that prompt alone.
template <masked_model Model>
std::vector<std::vector<token_t>> diffusion_stepwise_decode_batch(
    const Model& m, std::span<const std::vector<token_t>> prompts, const ssd_options& options,
    std::span<decode_stats> stats = {}) {
  return detail::diffusion_batch(m, prompts, stats,
                                 [&](std::span<const token_t> p, decode_stats& st, auto& out) {
                                   return detail::stepwise_task(m, p, options, st, out);
                                 });
}

/// ssd_decode for several prompts at once: each iteration evaluates all requests' node
/// sequences of equal length in one call (decode/task.hpp); adds to `stats[r]` when `stats` is
/// given. Each output equals ssd_decode of that prompt alone.
template <masked_model Model>
std::vector<std::vector<token_t>> ssd_decode_batch(const Model& m,
                                                   std::span<const std::vector<token_t>> prompts,
                                                   const ssd_options& options,
                                                   std::span<decode_stats> stats = {}) {
  return detail::diffusion_batch(m, prompts, stats,
                                 [&](std::span<const token_t> p, decode_stats& st, auto& out) {
                                   return detail::ssd_task(m, p, options, st, out);
                                 });
}

}  // namespace specula
