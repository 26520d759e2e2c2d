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
/// The first iteration has no drafts and evaluates the root alone. With `ssd_options::fallback`
/// (Algorithm 1, lines 8-9), once fewer than N masked positions remain the rest is decoded
/// stepwise (root alone).
///
/// **Dual cache** (`ssd_options::cache = ssd_cache::dual`, for a `dual_cache_model`), in the style
/// of Fast-dLLM's dual cache: step t (t tokens decoded so far) *refreshes* when it is the first
/// step of a block or every `refresh_interval` (R) steps within a block, i.e. when
/// (t mod block_size) mod R = 0. A refreshing step evaluates the whole sequence and keeps every
/// position's keys/values; the other steps evaluate only the active block (the window), whose
/// queries attend to the block's own fresh keys/values and to the cached ones of the prefix and
/// suffix. Both loops follow this one schedule, so SSD stays identical to stepwise decoding under
/// it: a tree node at depth d stands for stepwise step t + d and is evaluated as that step is.
/// One pass evaluates the tree in groups, one `dual_cache_pass` each (`diffusion_pass_plan`):
/// the root and its descendants before the next refreshing step through the request's current
/// cache (refreshed by the root when step t refreshes); and every node at a refreshing step
/// (the first refreshing step after t, and any later ones) evaluated whole into a spare
/// cache, with its descendants before the following refresh evaluated over their window against
/// it. Candidate selection therefore runs across refreshes and into the next block (the paper's
/// cross-block selection), every node sees the cache of the same refresh and the same window as
/// its stepwise step, and when the accepted path passes a refreshing node, that node's cache
/// becomes the current one (nothing is recomputed). Drafts of positions outside the accepted
/// node's window come from the last rows that covered them (a refresh's whole rows). The
/// mix-order tree leaves out its out-of-order leaf at a refreshing step: that leaf would be a
/// whole-sequence evaluation of its own (into a cache of its own), for a placement that the
/// chain's node at the same depth is the in-order alternative of.

#include <algorithm>
#include <cmath>
#include <deque>
#include <span>
#include <type_traits>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/types.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/decode/row_top.hpp"
#include "specula/decode/stats.hpp"
#include "specula/decode/task.hpp"
#include "specula/tree/builders.hpp"

namespace specula {

/// SSD's verification tree.
enum class ssd_tree {
  chain,      ///< greedy chain of N + 1 nodes (the paper's default)
  mix_order,  ///< chain plus one out-of-order leaf below every chain node with a grandchild
};

/// What the diffusion loops evaluate through (see file comment).
enum class ssd_cache {
  none,  ///< every pass evaluates whole sequences (`evaluate_sequences`)
  dual,  ///< the dual (prefix and suffix) cache of a `dual_cache_model`
};

/// Options of ssd_decode and diffusion_stepwise_decode.
struct ssd_options {
  index_t gen_length = 64;   ///< masked positions after the prompt, >= 1
  index_t block_size = 32;   ///< semi-autoregressive block size, >= 1
  index_t draft_length = 4;  ///< N: drafts verified per iteration, >= 1 (SSD only)
  ssd_tree tree = ssd_tree::chain;
  ssd_cache cache = ssd_cache::none;
  /// R: with the dual cache, refresh at every block start and every R steps within a block, >= 1.
  index_t refresh_interval = 8;
  /// Algorithm 1, lines 8-9: once fewer than N masked positions remain, decode them stepwise
  /// (SSD only; the output is the same either way).
  bool fallback = false;

  /// The SSD paper's setting (§4.1, Algorithm 1): blocks of 8, 256 new tokens, draft length 4
  /// (the paper uses 3 to 5), the greedy chain, the dual cache refreshed every 8 decoded tokens,
  /// and the fallback to stepwise decoding.
  [[nodiscard]] static ssd_options paper() {
    ssd_options o;
    o.gen_length = 256;
    o.block_size = 8;
    o.draft_length = 4;
    o.tree = ssd_tree::chain;
    o.cache = ssd_cache::dual;
    o.refresh_interval = 8;
    o.fallback = true;
    return o;
  }
};

namespace detail {

/// A position to unmask and its token.
struct diffusion_pick {
  index_t position = -1;
  token_t token = no_token;
  bool operator==(const diffusion_pick&) const = default;
};

/// row_top (row_top.hpp) of one logit row.
inline row_top top_of(std::span<const float> row) {
  return top_of(row.data(), static_cast<index_t>(row.size()));
}

/// A range of positions [begin, end).
struct position_range {
  index_t begin = 0;
  index_t end = 0;
  [[nodiscard]] index_t size() const { return end - begin; }
};

/// The semi-autoregressive layout of a request.
struct diffusion_layout {
  index_t prompt_len = 0;
  index_t length = 0;  ///< prompt + generated positions
  index_t block_size = 1;
  [[nodiscard]] index_t block_of(index_t pos) const { return (pos - prompt_len) / block_size; }
  /// The block stepwise decoding works on at step t (t tokens decoded): blocks fill in order.
  [[nodiscard]] position_range window_of_step(index_t t) const {
    const index_t begin = prompt_len + t / block_size * block_size;
    return {begin, std::min(begin + block_size, length)};
  }
};

/// The dual cache's refresh schedule over stepwise steps (see file comment).
struct refresh_schedule {
  index_t gen_length = 1;
  index_t block_size = 1;
  index_t interval = 1;
  /// Step t refreshes: a block's first step, and every `interval` steps within the block.
  [[nodiscard]] bool refresh_at(index_t t) const { return t % block_size % interval == 0; }
};

/// How one pass of a diffusion loop at step t evaluates a tree of node sequences, node u standing
/// for stepwise step t + depth(u) (see file comment). Uncached: every node's whole sequence. With
/// the dual cache the nodes split into groups, one `dual_cache_pass` each: a group starts at the
/// root and at every other node whose step refreshes (its head) and holds the head's descendants
/// before the next refreshing step, which share the head's window. The root group goes through
/// the request's current cache (refreshed by the root when its step refreshes); every other
/// group through a spare cache, which its head, evaluated whole, refreshes.
struct diffusion_pass_plan {
  struct group {
    index_t cache = 0;  ///< index of its cache among the request's caches
    position_range window;
    bool refresh = false;
    index_t begin = 0, end = 0;  ///< its nodes: order[begin, end), the head first
  };
  index_t length = 0;
  index_t vocab = 0;
  bool cached = false;
  std::vector<index_t> order;     ///< the nodes in pass order
  std::vector<index_t> group_of;  ///< per node
  std::vector<index_t> at;        ///< per node: its first row in the pass's logits
  std::vector<index_t> first;     ///< per node: the first position it has a row for
  std::vector<index_t> count;     ///< per node: its rows
  std::vector<group> groups;

  /// The first position node u has a row for.
  [[nodiscard]] index_t first_position(index_t u) const {
    return first[static_cast<std::size_t>(u)];
  }
  /// The pass's row index of node u's first row, and node u's row count.
  [[nodiscard]] index_t first_row(index_t u) const { return at[static_cast<std::size_t>(u)]; }
  [[nodiscard]] index_t row_count(index_t u) const { return count[static_cast<std::size_t>(u)]; }
};

/// Where a diffusion loop's rows live: `diffusion_host_rows` (the default) takes the logits of
/// the loop's passes and summarises the rows it reads (top_of); a *resident* policy
/// (`resident = true`: the example transformer's resident SSD) runs the pass itself
/// (`pass(start, plan, tokens)`) and keeps only the summaries of every row, so that the logits
/// never leave the device. `top(plan, u, pos)`: node u's row at sequence position pos.
struct diffusion_host_rows {
  static constexpr bool resident = false;
  std::vector<float> logits;
  [[nodiscard]] row_top top(const diffusion_pass_plan& plan, index_t u, index_t pos) const {
    const auto at =
        static_cast<std::size_t>((plan.first_row(u) + pos - plan.first_position(u)) * plan.vocab);
    return top_of(logits.data() + at, plan.vocab);
  }
};

/// The plan of the pass at step t over the nodes of `parent` (parent[0] = -1, parents before
/// their children); `current` is the request's current cache, spare caches take the other
/// indices from 0 on.
inline diffusion_pass_plan plan_diffusion_pass(std::span<const index_t> parent, index_t t,
                                               index_t vocab, const diffusion_layout& lay,
                                               const refresh_schedule& schedule, bool cached,
                                               index_t current) {
  const auto n = static_cast<index_t>(parent.size());
  const auto sz = [](index_t i) { return static_cast<std::size_t>(i); };
  diffusion_pass_plan p;
  p.length = lay.length;
  p.vocab = vocab;
  p.cached = cached;
  p.group_of.assign(sz(n), 0);
  p.at.assign(sz(n), 0);
  p.first.assign(sz(n), 0);
  p.count.assign(sz(n), lay.length);
  if (!cached) {
    for (index_t u = 0; u < n; ++u) {
      p.order.push_back(u);
      p.at[sz(u)] = u * lay.length;
    }
    p.groups.push_back({0, {}, false, 0, n});
    return p;
  }
  std::vector<index_t> depth(sz(n), 0);
  index_t spare = 0;
  for (index_t u = 0; u < n; ++u) {
    if (u > 0) depth[sz(u)] = depth[sz(parent[sz(u)])] + 1;
    const index_t step = t + depth[sz(u)];
    // A node past the last step (the chain filled every position) joins its parent's group.
    if (u == 0 || (step < schedule.gen_length && schedule.refresh_at(step))) {
      diffusion_pass_plan::group g;
      g.cache = u == 0 ? current : (spare < current ? spare : spare + 1);
      if (u > 0) ++spare;
      g.window = lay.window_of_step(step);
      g.refresh = schedule.refresh_at(step);
      p.group_of[sz(u)] = static_cast<index_t>(p.groups.size());
      p.groups.push_back(g);
    } else {
      p.group_of[sz(u)] = p.group_of[sz(parent[sz(u)])];
    }
  }
  index_t row = 0;
  for (std::size_t gi = 0; gi < p.groups.size(); ++gi) {
    auto& g = p.groups[gi];
    g.begin = static_cast<index_t>(p.order.size());
    for (index_t u = 0; u < n; ++u) {
      if (p.group_of[sz(u)] != static_cast<index_t>(gi)) continue;
      const bool whole = g.refresh && static_cast<index_t>(p.order.size()) == g.begin;
      p.order.push_back(u);
      p.at[sz(u)] = row;
      p.first[sz(u)] = whole ? 0 : g.window.begin;
      p.count[sz(u)] = whole ? lay.length : g.window.size();
      row += p.count[sz(u)];
    }
    g.end = static_cast<index_t>(p.order.size());
  }
  return p;
}

/// The stepwise rule: the most confident masked position of the first unfinished block, and its
/// argmax. `top_at(pos)`: the summary of the sequence's row at position pos (rows of the first
/// unfinished block are read).
template <class TopAt>
diffusion_pick stepwise_choice(std::span<const token_t> seq, token_t mask,
                               const diffusion_layout& lay, TopAt&& top_at) {
  diffusion_pick pick;
  index_t block = -1;
  double best = -1.0;
  for (index_t pos = lay.prompt_len; pos < lay.length; ++pos) {
    if (seq[static_cast<std::size_t>(pos)] != mask) continue;
    if (block < 0) block = lay.block_of(pos);
    if (lay.block_of(pos) != block) break;
    const row_top t = top_at(pos);
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
  require_parameter(o.refresh_interval >= 1, "refresh_interval",
                    static_cast<double>(o.refresh_interval), "must be >= 1");
  require_parameter(o.cache == ssd_cache::none || o.cache == ssd_cache::dual, "cache",
                    static_cast<double>(static_cast<int>(o.cache)), "not an ssd_cache value");
  require_parameter(mask >= 0 && mask < vocab, "mask_token", static_cast<double>(mask),
                    "the model has no mask token in [0, vocab_size)");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab || prompt[i] == mask)
      throw_if_failed(
          {status::token_out_of_range, static_cast<index_t>(i), -1, static_cast<double>(prompt[i])},
          "prompt", "token outside [0, vocab_size) or the mask token");
}

/// Stands in for the dual cache of a model without one.
struct no_dual_cache {};
template <class Model>
struct dual_cache_of {
  using type = no_dual_cache;
};
template <dual_cache_model Model>
struct dual_cache_of<Model> {
  using type = typename Model::dual_cache;
};

/// A request's start: input checked, layout, the prompt followed by the masks, its refresh
/// schedule, and its dual caches (unused without one): `caches[current]` holds the state of the
/// last refresh on the committed path, the others are spares that a pass refreshes ahead.
template <class Model>
struct diffusion_start {
  diffusion_layout lay;
  std::vector<token_t> seq;
  refresh_schedule schedule;
  bool cached = false;
  std::deque<typename dual_cache_of<Model>::type> caches;
  index_t current = 0;
  std::vector<token_t> tokens;       // the pending cached pass's node sequences, in pass order
  std::vector<cached_group> groups;  // and its groups

  /// The plan of the pass at step t over the nodes of `parent` (see plan_diffusion_pass).
  [[nodiscard]] diffusion_pass_plan plan(std::span<const index_t> parent, index_t t,
                                         index_t vocab) const {
    return plan_diffusion_pass(parent, t, vocab, lay, schedule, cached, current);
  }
  /// The pass of `plan` over the node sequences `nodes` (in node order).
  pass_awaiter pass(const diffusion_pass_plan& plan, std::span<const token_t> nodes,
                    std::vector<float>& logits, decode_stats& st) {
    if (!plan.cached) return sequences_pass(nodes, lay.length, logits, st);
    return cached_pass(cached_groups(plan, nodes), lay.length, logits, st);
  }
  /// The groups of the cached pass of `plan` over the node sequences `nodes` (in node order),
  /// one per plan group, over the nodes in pass order (`tokens`); grows `caches` as needed.
  std::span<const cached_group> cached_groups(const diffusion_pass_plan& plan,
                                              std::span<const token_t> nodes) {
    const auto L = static_cast<std::size_t>(lay.length);
    tokens.resize(nodes.size());
    for (std::size_t i = 0; i < plan.order.size(); ++i)
      std::copy_n(
          nodes.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(plan.order[i]) * L),
          L, tokens.begin() + static_cast<std::ptrdiff_t>(i * L));
    groups.clear();
    for (const auto& g : plan.groups) {
      while (caches.size() <= static_cast<std::size_t>(g.cache)) caches.emplace_back();
      groups.push_back(
          {&caches[static_cast<std::size_t>(g.cache)],
           std::span<const token_t>(tokens).subspan(static_cast<std::size_t>(g.begin) * L,
                                                    static_cast<std::size_t>(g.end - g.begin) * L),
           g.window.begin, g.window.end, g.refresh});
    }
    return groups;
  }
  /// Node u of `plan` is the committed path's last node: its group's cache becomes current.
  void accept(const diffusion_pass_plan& plan, index_t u) {
    if (plan.cached)
      current =
          plan.groups[static_cast<std::size_t>(plan.group_of[static_cast<std::size_t>(u)])].cache;
  }
};
template <class Model>
diffusion_start<Model> start_diffusion(const Model& m, std::span<const token_t> prompt,
                                       const ssd_options& o) {
  check_diffusion_input(prompt, o, m.vocab_size(), m.mask_token());
  if (o.cache == ssd_cache::dual && !dual_cache_model<Model>)
    throw_if_failed(
        {status::invalid_parameter, -1, -1, static_cast<double>(static_cast<int>(o.cache))},
        "cache", "the model has no dual cache (see dual_cache_model)");
  diffusion_start<Model> s;
  s.lay = {static_cast<index_t>(prompt.size()), static_cast<index_t>(prompt.size()) + o.gen_length,
           o.block_size};
  s.seq.assign(prompt.begin(), prompt.end());
  s.seq.resize(static_cast<std::size_t>(s.lay.length), m.mask_token());
  s.schedule = {o.gen_length, o.block_size, o.refresh_interval};
  s.cached = o.cache == ssd_cache::dual;
  return s;
}

}  // namespace detail

namespace detail {

/// The pass of `plan` over `tokens` (rows_pass): run by a resident rows policy, else served
/// into rows.logits by the driver.
template <class Rows, class Start>
optional_pass_awaiter diffusion_pass(Rows& rows, Start& start, const diffusion_pass_plan& plan,
                                     std::span<const token_t> tokens, decode_stats& st) {
  return rows_pass(
      rows, st, [&](auto& r) { r.pass(start, plan, tokens); },
      [&](auto& r) { return start.pass(plan, tokens, r.logits, st); });
}

/// Stepwise decoding of one request (see file comment), as a task. `resident_rows`: the rows
/// policy when `Rows` is resident (see diffusion_host_rows), else unused.
template <class Model, class Rows = diffusion_host_rows>
decode_task stepwise_task(const Model& m, std::span<const token_t> prompt, ssd_options options,
                          decode_stats& st, std::vector<token_t>& result,
                          Rows* resident_rows = nullptr) {
  std::conditional_t<Rows::resident, int, Rows> local_rows{};
  Rows& rows = rows_policy(local_rows, resident_rows);
  auto start = detail::start_diffusion(m, prompt, options);
  const diffusion_layout lay = start.lay;
  task_state& published = co_await publish(std::move(start.seq), lay.prompt_len, result, st, false);
  std::vector<token_t>& seq = published.seq;
  const index_t V = m.vocab_size();
  const token_t mask = m.mask_token();
  const index_t root[] = {-1};
  for (index_t i = 0; i < options.gen_length; ++i) {
    const auto plan = start.plan(root, i, V);
    co_await diffusion_pass(rows, start, plan, seq, st);
    detail::scoped_timer timer(st.verify_seconds);
    const auto pick = detail::stepwise_choice(seq, mask, lay,
                                              [&](index_t pos) { return rows.top(plan, 0, pos); });
    seq[static_cast<std::size_t>(pick.position)] = pick.token;
    st.record_step(0);
    st.step_tokens.push_back(1);
    ++st.tokens;
  }
  result.assign(seq.begin() + lay.prompt_len, seq.end());
}

/// SSD of one request (see file comment), as a task. `resident_rows`: the rows policy when
/// `Rows` is resident (see diffusion_host_rows), else unused.
template <class Model, class Rows = diffusion_host_rows>
decode_task ssd_task(const Model& m, std::span<const token_t> prompt, ssd_options options,
                     decode_stats& st, std::vector<token_t>& result,
                     Rows* resident_rows = nullptr) {
  std::conditional_t<Rows::resident, int, Rows> local_rows{};
  Rows& rows = rows_policy(local_rows, resident_rows);
  auto start = detail::start_diffusion(m, prompt, options);
  const diffusion_layout lay = start.lay;
  task_state& published = co_await publish(std::move(start.seq), lay.prompt_len, result, st, false);
  std::vector<token_t>& seq = published.seq;
  const index_t V = m.vocab_size();
  const token_t mask = m.mask_token();
  const auto L = static_cast<std::size_t>(lay.length);
  const auto sz = [](index_t i) { return static_cast<std::size_t>(i); };

  std::vector<detail::row_top> drafts;  // per position, from the last accepted node's rows
  std::vector<index_t> order;
  std::vector<detail::diffusion_pick> placed;  // per tree node
  std::vector<index_t> parents;                // per tree node
  std::vector<index_t> cands;                  // per tree node: the candidate it places
  std::vector<token_t> batch;                  // the node sequences, in node order
  index_t masked = options.gen_length;

  while (masked > 0) {
    const index_t step = options.gen_length - masked;  // the stepwise step of the root
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
      auto n = static_cast<index_t>(
          std::min<std::size_t>(order.size(), static_cast<std::size_t>(options.draft_length)));
      if (options.fallback && masked < options.draft_length) n = 0;
      // Chain node i (1..n) places candidate i - 1 at depth i; the mix-order tree's leaf below
      // chain node k (0..n-2) places candidate k + 1 at depth k + 1 — except, with the dual
      // cache, at a refreshing step, where it would be a whole-sequence evaluation of its own
      // for a node the chain's node at that depth already covers in order.
      parents.assign(1, -1);
      cands.assign(1, -1);
      for (index_t i = 1; i <= n; ++i) {
        parents.push_back(i - 1);
        cands.push_back(i - 1);
      }
      if (options.tree == ssd_tree::mix_order)
        for (index_t k = 0; k + 2 <= n; ++k) {
          if (start.cached && step + k + 1 < options.gen_length &&
              start.schedule.refresh_at(step + k + 1))
            continue;
          parents.push_back(k);
          cands.push_back(k + 1);
        }
      tree.assign(parents);
      placed.resize(sz(tree.size()));
      for (index_t u = 1; u < tree.size(); ++u)
        placed[sz(u)] = {order[sz(cands[sz(u)])],
                         static_cast<token_t>(drafts[sz(order[sz(cands[sz(u)])])].token)};
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
    // --- 2. One forward pass over every node's sequence (with the dual cache: each node's window
    // against the cache of its stepwise step's refresh, the nodes at refreshing steps whole).
    const auto plan = start.plan(parents, step, V);
    co_await diffusion_pass(rows, start, plan, batch, st);
    // --- 3. Verification against the stepwise rule, from the root.
    detail::scoped_timer timer(st.verify_seconds);
    const auto seq_of = [&](index_t u) {
      return std::span<const token_t>(batch.data() + sz(u) * L, L);
    };
    index_t u = 0, accepted = 0;
    detail::diffusion_pick pick;
    for (;;) {
      pick = detail::stepwise_choice(seq_of(u), mask, lay,
                                     [&](index_t pos) { return rows.top(plan, u, pos); });
      index_t next = -1;
      for (index_t c = tree.first_child(u); c >= 0 && next < 0; c = tree.next_sibling(c))
        if (placed[sz(c)] == pick) next = c;
      if (next < 0) break;
      u = next;
      ++accepted;
    }
    std::copy(seq_of(u).begin(), seq_of(u).end(), seq.begin());
    start.accept(plan, u);
    // No pick when the accepted node has no masked position left (the chain filled them all).
    const index_t emitted = accepted + (pick.position >= 0 ? 1 : 0);
    if (pick.position >= 0) seq[sz(pick.position)] = pick.token;
    masked -= emitted;
    st.record_step(accepted);
    st.step_tokens.push_back(emitted);
    st.tokens += emitted;
    // The next drafts: the accepted node's rows (its window with the dual cache unless it
    // refreshed; the other positions keep their drafts from the last rows that covered them).
    drafts.resize(L);
    const index_t first = plan.first_position(u);
    for (index_t pos = std::max(first, lay.prompt_len); pos < first + plan.row_count(u); ++pos)
      if (seq[sz(pos)] == mask) drafts[sz(pos)] = rows.top(plan, u, pos);
  }
  result.assign(seq.begin() + lay.prompt_len, seq.end());
}

/// Runs `task(m, prompt_r, ...)` for every prompt, sharing sequence passes.
template <class Model, class Task>
std::vector<std::vector<token_t>> diffusion_batch(const Model& m,
                                                  std::span<const std::vector<token_t>> prompts,
                                                  std::span<decode_stats> stats,
                                                  const batch_control& control, Task task) {
  std::vector<std::vector<token_t>> out(prompts.size());
  decode_batch(
      m, static_cast<no_draft*>(nullptr), static_cast<index_t>(prompts.size()), prompts,
      prompts.size(), stats,
      [&](index_t r, decode_stats& st) {
        const auto i = static_cast<std::size_t>(r);
        (void)request_options(ssd_options{}, control, r);  // refuses token limits
        return task(prompts[i], st, out[i]);
      },
      control);
  return out;
}

}  // namespace detail

/// Stepwise semi-autoregressive decoding with low-confidence remasking: one position per forward
/// pass (see file comment). Returns the `gen_length` generated tokens.
/// `control` adds cancellation between passes (decode/control.hpp).
template <masked_model Model>
std::vector<token_t> diffusion_stepwise_decode(const Model& m, std::span<const token_t> prompt,
                                               const ssd_options& options,
                                               decode_stats* stats = nullptr,
                                               const request_control& control = {}) {
  std::vector<token_t> out;
  detail::decode_solo(
      m, static_cast<detail::no_draft*>(nullptr), stats,
      [&](decode_stats& st) { return detail::stepwise_task(m, prompt, options, st, out); },
      control);
  return out;
}

/// Self speculative decoding (see file comment). Output identical to
/// diffusion_stepwise_decode with the same options. Returns the `gen_length` generated tokens.
/// `control` adds cancellation between passes (decode/control.hpp).
template <masked_model Model>
std::vector<token_t> ssd_decode(const Model& m, std::span<const token_t> prompt,
                                const ssd_options& options, decode_stats* stats = nullptr,
                                const request_control& control = {}) {
  std::vector<token_t> out;
  detail::decode_solo(
      m, static_cast<detail::no_draft*>(nullptr), stats,
      [&](decode_stats& st) { return detail::ssd_task(m, prompt, options, st, out); }, control);
  return out;
}

/// diffusion_stepwise_decode for several prompts at once: each step evaluates all requests'
/// sequences of equal length in one call (decode/task.hpp); adds to `stats[r]` when `stats` is
/// given. Each output equals diffusion_stepwise_decode of that prompt alone.
template <masked_model Model>
std::vector<std::vector<token_t>> diffusion_stepwise_decode_batch(
    const Model& m, std::span<const std::vector<token_t>> prompts, const ssd_options& options,
    std::span<decode_stats> stats = {}, const batch_control& control = {}) {
  return detail::diffusion_batch(m, prompts, stats, control,
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
                                                   std::span<decode_stats> stats = {},
                                                   const batch_control& control = {}) {
  return detail::diffusion_batch(m, prompts, stats, control,
                                 [&](std::span<const token_t> p, decode_stats& st, auto& out) {
                                   return detail::ssd_task(m, p, options, st, out);
                                 });
}

}  // namespace specula
