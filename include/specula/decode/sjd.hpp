#pragma once

/// @file
/// Speculative Jacobi decoding (SJD) and SJD-PAC's Adaptive Continuation (AC) and Proactive
/// Drafting (PD), generic over the model.
///
/// The draft is a token tree below the last committed token (a chain of L tokens for SJD),
/// together with, for every node, the row its children were drawn from (q). Each iteration:
///
/// 1. one forward pass evaluates the draft tree: rows P (target logits -> probabilities);
/// 2. the tree is verified with the exact rule (`tree_verifier<>`, siblings drawn without
///    replacement): the accepted path is committed and one more token is emitted — the residual
///    sample at the first rejection, or the bonus from the target row of an accepted leaf;
/// 3. the next draft is built below the emitted token from the *stale* rows: the rows the
///    forward pass computed along the rejected continuation, whose context still holds a
///    rejected token — the first-child chain below the last accepted node, then, for the
///    positions below that chain's depth, the main path (the first-child chain from the root;
///    this matters when a side candidate was accepted: a side leaf's subtree is empty, yet the
///    main path holds refined rows for the rest of the window, as in the authors' code). Row
///    R_j proposes the j-th token after the emitted one:
///    - SJD (refinement): a fresh sample from R_j, with q = R_j;
///    - AC: the old draft token at that position is kept with probability min(1, R_j/q_old),
///      else replaced by a sample of max(R_j - q_old, 0) — its law is R_j (the rejection lemma),
///      so q = R_j. q_old is the row the old token was drawn from (its parent's), which is not
///      R_j's node where the chain below a side node meets the main path; the old tokens used
///      lie below every token the verifier examined, so their law given what it saw is q_old.
///      The position after the old draft's end is a fresh sample from its row;
///    - PD (after a rejection): the first D positions become a K-ary tree — every node at depth
///      d < D gets K children drawn without replacement from R_{d+1} (the first-path child is
///      the SJD/AC token, the others exclude the tokens already drawn) — and the first path
///      continues as a chain. Every node at depth d - 1 proposes from the same stale row R_d,
///      which can be nearly one-hot in float (all but ~1e-7 of the mass on the first
///      candidate): the tree verifier renormalises the later candidates' proposal by the
///      summed remaining mass, not 1 - removed mass, so that stays exact (docs/decoding.md);
///    - positions without a stale row are initialised with uniform random tokens, proposed by
///      the uniform row (`sjd_init::uniform_q`, as SJD-PAC) or by the one-hot row at the token
///      (`sjd_init::one_hot_q`, as SJD's code), or with a spatial prior for images: the previous
///      window token repeated (`horizontal_repeat`, one-hot row) or a sample from the row the
///      previous token was drawn from (`horizontal_sample`, that row).
///
/// Every draft token is verified against fresh target rows with q the distribution it was
/// actually drawn from, so the output law is the target's whatever the switches (tested by
/// G-tests on toy models with known laws). When every draft of the path is accepted, the bonus
/// token comes from the target row of the last accepted node.
///
/// Randomness: iteration s verifies with `{seed, request_id, s}` and builds the next draft with
/// `{fold_in(seed, 1), request_id, s}`.

#include <algorithm>
#include <span>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/rng.hpp"
#include "specula/decode/speculative.hpp"
#include "specula/decode/step.hpp"
#include "specula/decode/task.hpp"
#include "specula/rules/exact.hpp"
#include "specula/sample/random_source.hpp"

namespace specula {

/// How window positions without a stale row are initialised.
enum class sjd_init {
  uniform_q,  ///< uniform random token, proposal row uniform (SJD-PAC's code)
  one_hot_q,  ///< uniform random token, proposal row one-hot at it (SJD's code)
  /// Spatial prior (SJD, Table 10): repeat the previous token of the window (in raster order,
  /// the left neighbour); proposal row one-hot at it.
  horizontal_repeat,
  /// Spatial prior: a sample from the row the previous window token was drawn from (uniform
  /// after the root); proposal row that row.
  horizontal_sample,
};

/// Options of sjd_decode. Defaults are vanilla SJD with the official window L = 16.
struct sjd_options {
  index_t window = 16;                 ///< L: draft tokens per iteration (depth of the draft)
  index_t max_new_tokens = 64;         ///< >= 1
  bool adaptive_continuation = false;  ///< AC (SJD-PAC §4.2)
  bool proactive_drafting = false;     ///< PD (SJD-PAC §4.1)
  index_t pd_width = 3;                ///< K: candidates per tree node, >= 1
  index_t pd_depth = 1;                ///< D: candidate levels below the emitted token, >= 1
  sjd_init init = sjd_init::uniform_q;
  sampling_params target{};       ///< target logits -> p
  token_t stop_token = no_token;  ///< generation ends after emitting it (-1: never)

  /// SJD-PAC with both components (the paper's full method).
  [[nodiscard]] static sjd_options sjd_pac(index_t window = 32, index_t width = 3,
                                           index_t depth = 1) {
    sjd_options o;
    o.window = window;
    o.adaptive_continuation = true;
    o.proactive_drafting = true;
    o.pd_width = width;
    o.pd_depth = depth;
    return o;
  }
};

namespace detail {

/// The draft below the last committed token: parents, tokens and one q row per node.
struct sjd_draft {
  std::vector<index_t> parents{-1};
  std::vector<token_t> tokens{no_token};
  std::vector<float> q;  ///< nodes x V; row u: what u's children were drawn from
  std::vector<index_t> depth{0};

  void reset(token_t root, index_t vocab) {
    parents.assign(1, -1);
    tokens.assign(1, root);
    depth.assign(1, 0);
    q.assign(static_cast<std::size_t>(vocab), 0.0f);
  }
  index_t add(index_t parent, token_t t, index_t vocab) {
    parents.push_back(parent);
    tokens.push_back(t);
    depth.push_back(depth[static_cast<std::size_t>(parent)] + 1);
    q.resize(q.size() + static_cast<std::size_t>(vocab), 0.0f);
    return static_cast<index_t>(parents.size()) - 1;
  }
  std::span<float> q_row(index_t u, index_t vocab) {
    return {q.data() + u * vocab, static_cast<std::size_t>(vocab)};
  }
};

/// Draw slots of a step's drafting stream: node li of a level uses slots 64 li .. 64 li + 2 + K;
/// random initialisation of later windows and of the first window use their own slots (the
/// first window is drawn from step 0's stream, which also builds step 1's window: sharing a
/// slot would make a refilled token a copy of an earlier one, which its q row does not say).
inline constexpr std::uint32_t sjd_init_slot = 0xFFFFFFF0u;
inline constexpr std::uint32_t sjd_first_window_slot = 0xFFFFFFF1u;

/// The token of a new child of `parent` at a position without a stale row, drawn with the
/// uniform `u` as `init` says; writes the parent's q row (what the child is drawn from).
inline token_t sjd_init_child(sjd_draft& draft, index_t parent, sjd_init init, index_t vocab,
                              double u) {
  auto qrow = draft.q_row(parent, vocab);
  const auto uniform_token = [&] {
    return static_cast<token_t>(
        std::min<index_t>(vocab - 1, static_cast<index_t>(u * static_cast<double>(vocab))));
  };
  switch (init) {
    case sjd_init::uniform_q:
      std::fill(qrow.begin(), qrow.end(), 1.0f / static_cast<float>(vocab));
      return uniform_token();
    case sjd_init::one_hot_q: {
      const token_t x = uniform_token();
      std::fill(qrow.begin(), qrow.end(), 0.0f);
      qrow[static_cast<std::size_t>(x)] = 1.0f;
      return x;
    }
    case sjd_init::horizontal_repeat: {
      const token_t x = draft.tokens[static_cast<std::size_t>(parent)];
      std::fill(qrow.begin(), qrow.end(), 0.0f);
      qrow[static_cast<std::size_t>(x)] = 1.0f;
      return x;
    }
    case sjd_init::horizontal_sample:
      break;
  }
  // horizontal_sample: the row the parent was drawn from (its parent's q row), uniform below
  // the root.
  const index_t grand = draft.parents[static_cast<std::size_t>(parent)];
  if (grand < 0) {
    std::fill(qrow.begin(), qrow.end(), 1.0f / static_cast<float>(vocab));
    return uniform_token();
  }
  const auto src = draft.q_row(grand, vocab);
  std::copy(src.begin(), src.end(), qrow.begin());
  const auto w = [&](index_t y) { return static_cast<double>(qrow[static_cast<std::size_t>(y)]); };
  return static_cast<token_t>(sample_inverse_cdf(vocab, w, positive_mass(vocab, w), u));
}

}  // namespace detail

namespace detail {

/// Deliberately wrong drafting, for the negative controls of the G-tests only.
enum class sjd_fault {
  none,
  /// AC where the chain below a side node meets the main path takes q_old from the chain's
  /// last node (whose row the old main-path token was not drawn from).
  junction_q_of_chain,
  /// The official code's Proactive Drafting after Adaptive Continuation: the first path's
  /// extra siblings are drawn (without replacement) from the AC residual max(R - q_old, 0)
  /// while the next verification is told they came from R.
  residual_siblings,
};

/// SJD / SJD-PAC decoding of one request (see file comment), as a task; `m` is its handle.
template <class Handle, class Verifier>
decode_task sjd_task(Handle m, std::span<const token_t> prompt, sjd_options options,
                     request_rng rng, Verifier verify, decode_stats& st,
                     std::vector<token_t>& result, sjd_fault fault = sjd_fault::none) {
  if (prompt.empty()) throw_if_failed({status::empty_input, -1, -1, 0.0}, "prompt");
  require_parameter(options.window >= 1, "window", static_cast<double>(options.window),
                    "must be >= 1");
  require_parameter(options.max_new_tokens >= 1, "max_new_tokens",
                    static_cast<double>(options.max_new_tokens), "must be >= 1");
  require_parameter(options.pd_width >= 1 && options.pd_width <= 60, "pd_width",
                    static_cast<double>(options.pd_width), "must be in [1, 60]");
  require_parameter(options.pd_depth >= 1, "pd_depth", static_cast<double>(options.pd_depth),
                    "must be >= 1");
  {
    // The candidate levels hold pd_width + pd_width^2 + ... + pd_width^pd_depth nodes.
    double level = 1.0, tree_nodes = 0.0;
    for (index_t d = 0; d < options.pd_depth && tree_nodes <= 65536.0; ++d)
      tree_nodes += (level *= static_cast<double>(options.pd_width));
    require_parameter(!options.proactive_drafting || tree_nodes <= 65536.0, "pd_depth",
                      static_cast<double>(options.pd_depth),
                      "gives a Proactive Drafting tree of more than 65536 nodes at this pd_width");
  }
  validate_sampling_params(options.target);
  const index_t V = m.vocab_size();
  const auto sz = [](index_t n) { return static_cast<std::size_t>(n); };

  m.prefill(prompt);
  std::vector<token_t> seq(prompt.begin(), prompt.end());
  const auto prompt_len = static_cast<index_t>(prompt.size());
  detail::sjd_draft draft, next;
  draft.reset(seq.back(), V);
  std::vector<float> logits, probs, scratch(sz(V));
  std::vector<token_t> out_tokens;
  std::vector<index_t> out_nodes, stale;
  std::vector<token_t> chosen;
  bool fresh = true;  // the draft below the root still has to be built from scratch

  for (std::uint32_t step = 0;; ++step) {
    const index_t remaining =
        options.max_new_tokens - (static_cast<index_t>(seq.size()) - prompt_len);
    if (remaining <= 0) break;
    const index_t max_depth = std::min(options.window, remaining - 1);
    const request_rng draw_rng{fold_in(rng.seed, 1), rng.request_id, step};

    // --- Initial window: L uniform random tokens (only before the first iteration; later
    // windows are built from stale rows below).
    if (fresh) {
      detail::scoped_timer timer(st.draft_seconds);
      draft.reset(seq.back(), V);
      index_t u = 0;
      for (index_t d = 1; d <= max_depth; ++d) {
        const token_t x = detail::sjd_init_child(
            draft, u, options.init, V,
            uniform_at(draw_rng,
                       draw_id{static_cast<std::uint32_t>(d), detail::sjd_first_window_slot}));
        u = draft.add(u, x, V);
      }
      fresh = false;
    }
    // Drop nodes deeper than the remaining budget allows (parents precede children).
    {
      detail::sjd_draft kept;
      kept.reset(draft.tokens[0], V);
      std::vector<index_t> map(draft.parents.size(), -1);
      map[0] = 0;
      std::copy_n(draft.q.begin(), V, kept.q.begin());
      for (std::size_t u = 1; u < draft.parents.size(); ++u) {
        if (draft.depth[u] > max_depth) continue;
        const index_t p = map[sz(draft.parents[u])];
        if (p < 0) continue;
        map[u] = kept.add(p, draft.tokens[u], V);
        std::copy_n(draft.q.begin() + static_cast<std::ptrdiff_t>(u) * V, V,
                    kept.q.begin() + map[u] * V);
      }
      draft = std::move(kept);
    }

    tree_limits limits;
    limits.max_nodes = static_cast<index_t>(draft.parents.size());
    limits.max_depth = std::max<index_t>(1, max_depth);
    limits.max_children = std::max<index_t>(1, options.pd_width);
    const token_tree tree(draft.parents, draft.tokens, limits);
    const index_t nodes = tree.size();

    // --- 1. One forward pass over the draft tree.
    co_await detail::target_pass(tree, logits, st);
    // --- 2. Verify (exact rule, siblings without replacement) and commit.
    probs.resize(logits.size());
    index_t k = 0;
    {
      detail::scoped_timer timer(st.verify_seconds);
      detail::rows_to_probs(options.target, logits, probs, scratch, V);
      // Leaves have no children: give them a valid q row (never used).
      for (index_t u = 0; u < nodes; ++u)
        if (tree.num_children(u) == 0)
          std::copy_n(probs.begin() + u * V, V, draft.q.begin() + u * V);
      const request_rng verify_rng{rng.seed, rng.request_id, step};
      k = detail::verify_one(verify, tree, V, probs, draft.q, verify_rng, out_tokens, out_nodes);
    }
    m.commit(std::span<const index_t>(out_nodes.data(), sz(k + 1)));
    if (detail::emit_step(out_tokens, k, options.stop_token, seq, st)) break;

    // --- 3. The next draft below the emitted token, from the stale rows.
    detail::scoped_timer timer(st.draft_seconds);
    const index_t last = out_nodes[sz(k)];
    // stale[j]: the node of the old draft at the position of the (j+1)-th token after `last`
    // (the first at the emitted token's position). First the first-child chain below `last`
    // (inside its subtree), then, below that chain's depth, the main path (the first-child
    // chain from the root): when `last` lies on a side branch, the main path still holds rows
    // for the positions its subtree does not reach.
    stale.clear();
    for (index_t c = tree.first_child(last); c >= 0; c = tree.first_child(c)) stale.push_back(c);
    {
      const index_t reached = stale.empty() ? tree.depth(last) : tree.depth(stale.back());
      index_t main = 0;
      while (main >= 0 && tree.depth(main) <= reached) main = tree.first_child(main);
      // `main` is the main-path node one deeper than the chain (none when `last` is on the
      // main path: then the chain is the main path's own continuation).
      for (; main >= 0; main = tree.first_child(main)) stale.push_back(main);
    }
    // Some position after the emitted token has a stale row: the verification rejected a
    // draft token somewhere (on the main path when `last` is a side node).
    const bool rejected = !stale.empty();
    next.reset(seq.back(), V);
    const auto row_of = [&](index_t node) {
      return std::span<const float>(probs.data() + node * V, sz(V));
    };
    const index_t stale_rows = static_cast<index_t>(stale.size());  // R_1 .. R_{m+1}
    const bool tree_mode = options.proactive_drafting && rejected;
    const index_t width = tree_mode ? options.pd_width : 1;
    // Level by level: `level` holds the nodes at depth d - 1; the first is on the first path.
    std::vector<index_t> level{0}, below;
    for (index_t d = 1; d <= options.window; ++d) {
      below.clear();
      const bool have_row = d <= stale_rows;
      for (std::size_t li = 0; li < level.size(); ++li) {
        const index_t parent = level[li];
        const bool first_path = li == 0;
        auto qrow = next.q_row(parent, V);
        if (!have_row) {  // initialisation (random or spatial prior)
          if (!first_path) continue;
          const token_t x = detail::sjd_init_child(
              next, parent, options.init, V,
              uniform_at(draw_rng, draw_id{static_cast<std::uint32_t>(d), detail::sjd_init_slot}));
          below.push_back(next.add(parent, x, V));
          continue;
        }
        const auto R = row_of(stale[sz(d - 1)]);
        std::copy(R.begin(), R.end(), qrow.begin());
        const index_t kids = (tree_mode && d <= options.pd_depth) ? width : (first_path ? 1 : 0);
        chosen.clear();
        const auto slot = static_cast<std::uint32_t>(64 * li);
        for (index_t c = 0; c < kids; ++c) {
          token_t x = no_token;
          if (c == 0 && first_path && options.adaptive_continuation && d < stale_rows) {
            // AC: keep the old draft token at this position with min(1, R/q_old), else
            // resample from max(R - q_old, 0): the kept-or-resampled token has law R. q_old
            // is the row the old token was drawn from: its parent's q row (where the chain
            // below a side node meets the main path, not the chain's last node's row).
            const index_t old = stale[sz(d)];
            const index_t old_from =
                fault == sjd_fault::junction_q_of_chain ? stale[sz(d - 1)] : tree.parent(old);
            x = detail::adaptive_continuation_draw(
                R, std::span<const float>(draft.q.data() + old_from * V, sz(V)), tree.token(old),
                draw_rng, draw_id{static_cast<std::uint32_t>(d), slot},
                draw_id{static_cast<std::uint32_t>(d), slot + 1});
          } else {
            // A draw from R without the tokens already chosen (without replacement).
            const bool from_residual = fault == sjd_fault::residual_siblings && first_path &&
                                       options.adaptive_continuation && d < stale_rows;
            const float* q_old =
                from_residual ? draft.q.data() + tree.parent(stale[sz(d)]) * V : nullptr;
            auto w = [&](index_t y) {
              for (const token_t t : chosen)
                if (t == y) return 0.0;
              const double r = R[sz(y)];
              return q_old ? std::max(r - static_cast<double>(q_old[y]), 0.0) : r;
            };
            double mass = positive_mass(V, w);
            if (q_old && !(mass > 0.0)) {
              q_old = nullptr;
              mass = positive_mass(V, w);
            }
            if (!(mass > 0.0)) break;  // the row has fewer than `kids` tokens
            x = static_cast<token_t>(sample_inverse_cdf(
                V, w, mass,
                uniform_at(draw_rng, draw_id{static_cast<std::uint32_t>(d),
                                             slot + 2 + static_cast<std::uint32_t>(c)})));
          }
          chosen.push_back(x);
          below.push_back(next.add(parent, x, V));
        }
      }
      if (below.empty()) break;
      level.swap(below);
    }
    draft = std::move(next);
    next = detail::sjd_draft{};
  }
  result.assign(seq.begin() + prompt_len, seq.end());
}

}  // namespace detail

/// SJD / SJD-PAC decoding of up to `options.max_new_tokens` tokens after `prompt` (see file
/// comment). The model is restarted with `prefill(prompt)`. Adds to `*stats` when given.
/// `verify` is the exact tree verifier unless a test substitutes another.
template <session_model Model, verifier Verifier = tree_verifier<>>
std::vector<token_t> sjd_decode(Model& m, std::span<const token_t> prompt,
                                const sjd_options& options, request_rng rng,
                                decode_stats* stats = nullptr, const Verifier& verify = {}) {
  std::vector<token_t> out;
  detail::decode_solo(m, static_cast<detail::no_draft*>(nullptr), stats, [&](decode_stats& st) {
    return detail::sjd_task(detail::solo<Model>{&m}, prompt, options, rng, verify, st, out);
  });
  return out;
}

/// sjd_decode for several requests at once: request r decodes `prompts[r]` with `rngs[r]` as
/// request r of `m`, all requests' iterations sharing forward passes (decode/task.hpp); adds to
/// `stats[r]` when `stats` is given. Each output equals sjd_decode of that request alone.
template <batched_session_model Model, verifier Verifier = tree_verifier<>>
std::vector<std::vector<token_t>> sjd_decode_batch(Model& m,
                                                   std::span<const std::vector<token_t>> prompts,
                                                   const sjd_options& options,
                                                   std::span<const request_rng> rngs,
                                                   std::span<decode_stats> stats = {},
                                                   const Verifier& verify = {}) {
  std::vector<std::vector<token_t>> out(prompts.size());
  detail::decode_batch(m, static_cast<detail::no_draft*>(nullptr), m.batch_size(), prompts,
                       rngs.size(), stats, [&](index_t r, decode_stats& st) {
                         const auto i = static_cast<std::size_t>(r);
                         return detail::sjd_task(detail::member<Model>{&m, r}, prompts[i], options,
                                                 rngs[i], verify, st, out[i]);
                       });
  return out;
}

}  // namespace specula
