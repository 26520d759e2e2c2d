#pragma once

/// @file
/// Multi-block Jacobi decoding with rejection recycling (Jacobi Forcing §3.2, Algorithm 1),
/// greedy and lossless: the output is identical to greedy decoding.
///
/// The window after the last committed token (the root) is made of up to K blocks of n
/// positions. The first is the *real-active* block (RA): its remaining positions are the guesses
/// for the next tokens. The others are *pseudo-active*: they hold guesses for the positions after
/// the RA block, and a prefix of each (its pseudo-accepted tokens) is frozen. Each step:
///
/// 1. one forward pass evaluates the root, the whole window as one chain, and — with rejection
///    recycling — up to `pool_size` recycled n-grams as extra branches below the root (merged
///    into a trie with the window);
/// 2. greedy tree verification accepts the longest path whose tokens equal the argmax of their
///    parents' rows (it may run past the RA block into pseudo-active blocks: those tokens are
///    then verified for real) and emits one more argmax; the accepted path is committed;
/// 3. pseudo-active blocks extend their frozen prefix by the guesses that equal the argmax of the
///    row before them (conditioned on the noisy tokens in front: the paper's pseudo-acceptance);
/// 4. the window is updated: frozen tokens stay; every other position takes the argmax its row
///    predicts (the Jacobi update: rows of the first-child chain below the last accepted node,
///    else the window chain's row at that position), else keeps its old guess, else is filled
///    (`jacobi_init`);
/// 5. the RA block loses the committed positions; when it is used up, the first pseudo-active
///    block is promoted to RA (its frozen tokens become RA guesses, verified from then on); when
///    there is none, a fresh RA block of n positions follows;
/// 6. when some block has at least ceil(r n) accepted (RA: committed) or frozen tokens and there
///    are fewer than K blocks, a pseudo-active block is spawned after the last one, initialised
///    with a copy of the RA guesses padded to n (as Algorithm 1);
/// 7. rejection recycling: the rejected tail of the RA guesses (from the first position where
///    the window chain disagrees with the argmax) goes into the n-gram pool: for each of its
///    tokens, the up to `ngram_length` tokens after it, keyed by that token. The pool keeps the
///    `pool_size` most recent distinct continuations per key; the next steps propose those whose
///    key is their root token.
///
/// The released code (hao-ai-lab/JacobiForcing, `jacobi_forward_greedy_multiblock`) differs in two
/// rules, both available as options (`multiblock_pool::fifo`, `multiblock_spawn::newest_block`):
/// its pool is one FIFO of the `pool_size` most recent whole sequences — after every step whose
/// RA guesses were not all accepted it adds the concatenation of all blocks (the RA block's
/// committed tokens, then every block's guesses) and then the RA's new guesses — and the next
/// step proposes, from every pooled sequence but the newest, the tokens after the first
/// occurrence of its root token (at most pool_size − 1 candidates, each cut to the RA guesses'
/// length or padded with them); and only the newest block (the last pseudo-active one, else the
/// RA) may spawn.
///
/// With K = 1 and no recycling this is Jacobi decoding with fixed blocks of n (the window shrinks
/// as tokens commit, then a new block starts); `jacobi_decode` is the running-window variant.
///
/// **Stochastic variant** (`stochastic = true`, our extension; lossless for the sampled target
/// law): every window token carries the row it was drawn from (q), the window is verified with
/// the exact rule (`tree_verifier<>`) against the target rows transformed by `target`, and the
/// update is SJD's with Adaptive Continuation: a position with a stale row R keeps its old token
/// with probability min(1, R/q_old), else takes a sample of max(R − q_old, 0) — its law is R, so
/// q = R — and a position first reached by a stale row is sampled from R. Pseudo-acceptance
/// is therefore implicit (no frozen tokens; every token is re-tested against its newest row);
/// spawned blocks copy the RA guesses with one-hot rows (a copy is determined by the earlier
/// drafts), fills are one-hot (`repeat_last`), uniform (`random`) or the token frequencies of
/// the sequence so far (`sample_context`). Rejection recycling is
/// greedy only (a recycled n-gram is no draw from a row), so `recycling` must be off. Draws:
/// step s verifies with `{seed, request_id, step0 + s}`, updates with `{fold_in(seed, 1),
/// request_id, step0 + s}`, fills from `{fold_in(seed, 2), request_id, step0}` (step0: the
/// stream's `step`, see detail::step_stream). The window's rows live in a rows policy
/// (`detail::window_host_rows` on the host; a resident one keeps them where the model computes
/// them, e.g. the example transformer's on the GPU), and the stale positions' draws are SJD's
/// (`detail::sjd_children_job`, one child each; row_draws.hpp).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <iterator>
#include <span>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/rng.hpp"
#include "specula/decode/jacobi.hpp"
#include "specula/decode/row_draws.hpp"
#include "specula/decode/sjd.hpp"
#include "specula/decode/speculative.hpp"
#include "specula/decode/step.hpp"
#include "specula/decode/task.hpp"
#include "specula/verify/greedy.hpp"

namespace specula {

/// Which block may spawn a new pseudo-active block (see file comment, step 6).
enum class multiblock_spawn : std::uint8_t {
  any_block,     ///< any block that reaches ceil(r n) accepted or frozen tokens
  newest_block,  ///< only the newest block (the last pseudo-active one, else the RA), as the
                 ///< released code
};

/// The rejection-recycling pool (see file comment, step 7).
enum class multiblock_pool : std::uint8_t {
  per_key,  ///< continuations keyed by their first token, pool_size per key
  fifo,     ///< one FIFO of pool_size whole sequences, matched at the root's first occurrence,
            ///< as the released code
};

/// Options of multiblock_decode. Defaults: the Jacobi Forcing code's configuration (K = 2
/// blocks of 64, spawn ratio 0.85, a pool of 4 sequences, its pool and spawn rules).
struct multiblock_options {
  index_t block_size = 64;      ///< n, >= 1
  index_t max_blocks = 2;       ///< K: real-active plus pseudo-active blocks, >= 1
  double spawn_ratio = 0.85;    ///< r in (0, 1]: spawn when a block reaches ceil(r n) tokens
  bool recycling = true;        ///< rejection recycling with the n-gram pool
  index_t pool_size = 4;        ///< fifo: sequences pooled (up to pool_size − 1 candidates per
                                ///< step); per_key: continuations kept per key
  index_t ngram_length = 16;    ///< per_key: tokens of a recycled continuation, >= 1
  index_t max_new_tokens = 64;  ///< >= 1
  jacobi_init init = jacobi_init::repeat_last;
  token_t stop_token = no_token;  ///< generation ends after emitting it (-1: never)
  /// More tokens that end generation once emitted, as `stop_token` does (e.g. a model's
  /// several end-of-turn tokens); each in [0, vocab_size).
  std::vector<token_t> stop_tokens;
  bool stochastic = false;   ///< the lossless sampling variant (needs recycling = false)
  sampling_params target{};  ///< target logits -> p (stochastic variant)
  multiblock_pool pool = multiblock_pool::fifo;             ///< the released code's pool
  multiblock_spawn spawn = multiblock_spawn::newest_block;  ///< the released code's rule
  /// Greedy verification may accept past the RA block into pseudo-active blocks (true, the
  /// default: those tokens are verified for real), or stops at the RA block's last position
  /// (false, as the released code, which verifies a promoted block in the next pass). The
  /// output is the same either way; only the tokens per forward differ. Greedy only: must be
  /// true with stochastic = true.
  bool verify_past_ra = true;
};

namespace detail {

/// The recycled n-gram pool: per key token, the most recent distinct continuations.
class ngram_pool {
 public:
  explicit ngram_pool(index_t per_key) : per_key_(per_key) {}

  void add(token_t key, std::span<const token_t> continuation) {
    if (continuation.empty() || per_key_ <= 0) return;
    auto& list = pool_[key];
    const auto same = std::find_if(list.begin(), list.end(), [&](const auto& c) {
      return std::equal(c.begin(), c.end(), continuation.begin(), continuation.end());
    });
    if (same != list.end()) list.erase(same);
    list.emplace_front(continuation.begin(), continuation.end());
    if (static_cast<index_t>(list.size()) > per_key_) list.pop_back();
  }
  [[nodiscard]] const std::deque<std::vector<token_t>>* find(token_t key) const {
    const auto it = pool_.find(key);
    return it == pool_.end() ? nullptr : &it->second;
  }

 private:
  index_t per_key_;
  std::unordered_map<token_t, std::deque<std::vector<token_t>>> pool_;
};

/// A tree built by inserting token chains below a root, sharing common prefixes (a trie).
struct trie_builder {
  std::vector<index_t> parents{-1};
  std::vector<token_t> tokens;
  std::vector<std::vector<index_t>> children{{}};

  explicit trie_builder(token_t root) : tokens{root} {}
  /// Inserts `chain` below node `from`; returns the node of each chain token.
  void insert(index_t from, std::span<const token_t> chain, std::vector<index_t>* nodes = nullptr) {
    index_t u = from;
    for (const token_t t : chain) {
      index_t next = -1;
      for (const index_t c : children[static_cast<std::size_t>(u)])
        if (tokens[static_cast<std::size_t>(c)] == t) next = c;
      if (next < 0) {
        next = static_cast<index_t>(parents.size());
        parents.push_back(u);
        tokens.push_back(t);
        children.emplace_back();
        children[static_cast<std::size_t>(u)].push_back(next);
      }
      if (nodes != nullptr) nodes->push_back(next);
      u = next;
    }
  }
  [[nodiscard]] token_tree build() const {
    tree_limits limits;
    limits.max_nodes = static_cast<index_t>(parents.size());
    limits.max_depth = limits.max_nodes;
    limits.max_children = limits.max_nodes;
    return token_tree(parents, tokens, limits);
  }
};

}  // namespace detail

namespace detail {

/// Where the stochastic variant's rows live. `window_host_rows` (the default) keeps the p rows
/// of the last pass and the q rows of the current and the next window in host memory and takes
/// its logits from the loop's pass. A *resident* policy (`window_rows_policy`; the example
/// transformer's resident SJD ops, examples/transformer/include/specula_example/resident_sjd.hpp)
/// keeps them where its model computes them and runs the pass itself (`target(tree)`); the loop
/// then holds the window's tokens only. Row u of a window is the row its position u + 1's token
/// was drawn from (the q row of the chain's node u). Operations:
/// - `start(vocab, options)`: before the first step (may refuse options);
/// - `target(tree)` (resident) or `set_p(logits)` (host): p rows of the pass;
/// - `verify_window(verifier, tree, rng, out_tokens, out_nodes)`: exact verification of the
///   chain `tree` (node u's child drawn from the current window's row u; the leaf's q row is its
///   p row, the window's row of that index is kept); returns the accepted count;
/// - `draw(jobs, tokens, counts, rng)`: the stale positions' draws (sjd_draw_jobs: one child
///   per job, the next window's row job.parent becomes p row job.row, AC against the current
///   window's row job.ac_from);
/// - `write_rows(next, rows, context)`: rows of the next (`next`) or the current window set
///   without a draw (copies read the current window; `context`: the sequence so far);
/// - `next_ready()`: the next window's rows become the current ones.
struct window_host_rows {
  static constexpr bool resident = false;
  index_t V = 0;
  sampling_params target{};
  std::vector<float> probs, q, q_next, q_verify, scratch;
  tree_workspace verify_ws;  // the verifier's, when it takes one (verify_one)
  std::vector<std::int32_t> context_counts;
  std::int32_t counted = -1;  // the context length `context_counts` counts

  void start(index_t vocab, const multiblock_options& o) {
    V = vocab;
    target = o.target;
    scratch.resize(static_cast<std::size_t>(V));
    counted = -1;
  }
  void set_p(std::span<float> logits) {
    probs.resize(logits.size());
    rows_to_probs(target, logits, probs, scratch, V);
  }
  template <class Verifier>
  index_t verify_window(const Verifier& verify, const token_tree& tree, const request_rng& rng,
                        std::vector<token_t>& out_tokens, std::vector<index_t>& out_nodes) {
    const auto leaf = static_cast<std::ptrdiff_t>((tree.size() - 1) * V);
    q_verify.assign(q.begin(), q.begin() + leaf);
    q_verify.insert(q_verify.end(), probs.begin() + leaf, probs.begin() + leaf + V);
    return verify_one(verify, tree, V, probs, q_verify, rng, out_tokens, out_nodes, &verify_ws);
  }
  void draw(std::span<const sjd_children_job> jobs, std::span<token_t> tokens,
            std::span<index_t> counts, const request_rng& rng) {
    for (const auto& job : jobs) reserve(q_next, job.parent);
    sjd_draw_jobs(jobs, probs.data(), q.data(), q_next.data(), V, rng, tokens, counts);
  }
  void write_rows(bool next, std::span<const window_row> rows, std::span<const token_t> context) {
    std::vector<float>& to = next ? q_next : q;
    for (const window_row& r : rows) {
      reserve(to, r.at);
      if (r.from == window_row::context_law && counted != r.end) {
        context_counts.assign(static_cast<std::size_t>(V), 0);
        for (const token_t c : context.first(static_cast<std::size_t>(r.end)))
          if (c >= 0 && c < V) ++context_counts[static_cast<std::size_t>(c)];
        counted = r.end;
      }
      float* row = to.data() + static_cast<index_t>(r.at) * V;
      for (index_t y = 0; y < V; ++y)
        row[y] = window_row_entry(r, q.data(), context_counts.data(), V, y);
    }
  }
  void next_ready() { q.swap(q_next); }

 private:
  void reserve(std::vector<float>& rows, index_t at) const {
    const auto need = static_cast<std::size_t>((at + 1) * V);
    if (rows.size() < need) rows.resize(need, 0.0f);
  }
};

/// A resident rows policy that serves the stochastic variant (see window_host_rows).
template <class Rows>
concept window_rows_policy = Rows::resident &&
    requires(Rows& r, std::span<const window_row> rows, std::span<const token_t> context) {
  r.write_rows(true, rows, context);
};

/// The stochastic variant's rows: the resident policy `rows` itself, else the task's `host`.
template <class Rows>
decltype(auto) window_rows_of(Rows& rows, window_host_rows& host) {
  if constexpr (window_rows_policy<Rows>) {
    (void)host;
    return (rows);
  } else {
    (void)rows;
    return (host);
  }
}

/// Multi-block decoding of one request (see file comment), as a task; `m` is its handle.
/// `resident_rows`: the rows policy when `Rows` is resident, else unused: a greedy one
/// (greedy_host_rows describes it) serves the greedy variant only, a `window_rows_policy` the
/// stochastic variant only.
template <class Handle, class Verifier, class Rows = greedy_host_rows>
decode_task multiblock_task(Handle m, std::span<const token_t> prompt, multiblock_options options,
                            request_rng rng, Verifier verify, decode_stats& st,
                            std::vector<token_t>& result, Rows* resident_rows = nullptr) {
  if (prompt.empty()) throw_if_failed({status::empty_input, -1, -1, 0.0}, "prompt");
  require_parameter(options.block_size >= 1, "block_size", static_cast<double>(options.block_size),
                    "must be >= 1");
  require_parameter(options.max_blocks >= 1, "max_blocks", static_cast<double>(options.max_blocks),
                    "must be >= 1");
  require_parameter(options.spawn_ratio > 0.0 && options.spawn_ratio <= 1.0, "spawn_ratio",
                    options.spawn_ratio, "must be in (0, 1]");
  require_parameter(options.pool_size >= 0, "pool_size", static_cast<double>(options.pool_size),
                    "must be >= 0");
  require_parameter(options.ngram_length >= 1, "ngram_length",
                    static_cast<double>(options.ngram_length), "must be >= 1");
  require_parameter(options.max_new_tokens >= 1, "max_new_tokens",
                    static_cast<double>(options.max_new_tokens), "must be >= 1");
  require_parameter(!(options.stochastic && options.recycling), "recycling", 1.0,
                    "must be false with stochastic = true (recycled n-grams are verified "
                    "greedily only)");
  require_parameter(!(options.stochastic && !options.verify_past_ra), "verify_past_ra", 0.0,
                    "must be true with stochastic = true (a cut after an exact acceptance "
                    "would emit an accepted draft as the bonus token)");
  if (options.stochastic) validate_sampling_params(options.target);
  constexpr bool sampled_rows = window_rows_policy<Rows>;  // a resident stochastic policy
  if constexpr (Rows::resident)
    require_parameter(options.stochastic == sampled_rows, "stochastic",
                      options.stochastic ? 1.0 : 0.0,
                      sampled_rows ? "this resident rows policy serves the stochastic variant only"
                                   : "a resident rows policy serves the greedy variant only");
  std::conditional_t<Rows::resident, int, Rows> local_rows{};
  Rows& rows = rows_policy(local_rows, resident_rows);
  window_host_rows local_window;
  auto& wrows = window_rows_of(rows, local_window);
  const bool stochastic = options.stochastic;
  if (stochastic) wrows.start(m.vocab_size(), options);
  const index_t V = m.vocab_size();
  const index_t n = options.block_size;
  const auto spawn_at =
      static_cast<index_t>(std::ceil(options.spawn_ratio * static_cast<double>(n)));
  const auto sz = [](index_t i) { return static_cast<std::size_t>(i); };

  const auto prompt_len = static_cast<index_t>(prompt.size());
  std::vector<token_t>& seq =
      co_await start_request(prompt, options.stop_token, options.stop_tokens, V, result, st, m);
  detail::ngram_pool pool(options.recycling ? options.pool_size : 0);
  const bool fifo = options.recycling && options.pool == multiblock_pool::fifo;
  std::deque<std::vector<token_t>> fifo_pool;  // multiblock_pool::fifo: newest last
  bool fifo_propose = false;                   // the previous step rejected some RA guess

  // Window: win[j - 1] is the guess for position j after the root (j = 1 .. W). The RA block
  // covers positions 1 .. ra_left; pseudo-active block b covers the n positions after the
  // blocks before it, of which the first frozen[b] are frozen.
  // Stochastic variant: wrows' window row j - 1 is the row win[j - 1] was drawn from; rows set
  // without a draw are collected in `row_ops`.
  std::vector<token_t> win, next_win;
  std::vector<window_row> row_ops;
  index_t ra_left = n;
  std::vector<index_t> frozen;
  std::uint32_t draws = 0;
  const request_rng fill_rng = step_stream(rng, 0, 2);
  const auto one_hot_row = [](index_t at, token_t t) {
    window_row r;
    r.at = static_cast<std::int32_t>(at);
    r.begin = t;
    r.end = t + 1;
    r.value = 1.0f;
    return r;
  };
  // The row of a fill `t` at window row `at`: uniform (random), the context law, else one-hot.
  const auto fill_row = [&](index_t at, token_t t) {
    window_row r = one_hot_row(at, t);
    if (options.init == jacobi_init::random) {
      r.begin = 0;
      r.end = static_cast<std::int32_t>(V);
      r.value = 1.0f / static_cast<float>(V);
    } else if (options.init == jacobi_init::sample_context) {
      r.from = window_row::context_law;
      r.end = static_cast<std::int32_t>(seq.size());
    }
    return r;
  };
  // Appends a filled position after `previous` to `w` (and its row to row_ops). In the
  // stochastic variant, sample_context's row is the token frequencies of `seq`.
  const auto fill = [&](std::vector<token_t>& w, token_t previous) {
    token_t t = previous;
    if (options.init != jacobi_init::repeat_last) {
      const double u = uniform_at(stochastic ? fill_rng : rng, draw_id{draws++, 1});
      const index_t range =
          options.init == jacobi_init::random ? V : static_cast<index_t>(seq.size());
      const auto pick =
          std::min<index_t>(range - 1, static_cast<index_t>(u * static_cast<double>(range)));
      t = options.init == jacobi_init::random ? static_cast<token_t>(pick) : seq[sz(pick)];
    }
    w.push_back(t);
    if (stochastic) row_ops.push_back(fill_row(static_cast<index_t>(w.size()) - 1, t));
  };
  const auto write_rows = [&](bool next) {
    if (row_ops.empty()) return;
    wrows.write_rows(next, row_ops, seq);
    row_ops.clear();
  };

  std::vector<token_t> out_tokens, drawn;
  std::vector<index_t> out_nodes, main_nodes, argmax, counts;
  std::vector<sjd_children_job> jobs;

  for (std::uint32_t step = 0;; ++step) {
    const index_t remaining =
        options.max_new_tokens - (static_cast<index_t>(seq.size()) - prompt_len);
    if (remaining <= 0) break;
    while (static_cast<index_t>(win.size()) < ra_left + n * static_cast<index_t>(frozen.size()))
      fill(win, win.empty() ? seq.back() : win.back());
    write_rows(false);
    const index_t eval_w = std::min<index_t>(static_cast<index_t>(win.size()), remaining - 1);

    // --- 1. The step's tree: the window chain, then recycled candidates below the root.
    detail::trie_builder trie(seq.back());
    main_nodes.assign(1, 0);
    {
      detail::scoped_timer timer(st.draft_seconds);
      trie.insert(0, std::span<const token_t>(win.data(), sz(eval_w)), &main_nodes);
      if (fifo && fifo_propose && remaining > 1 && fifo_pool.size() > 1) {
        // Every pooled sequence but the newest, newest first: the tokens after the first
        // occurrence of the root, as many as the RA guesses, padded with them.
        const index_t len = std::min(std::min<index_t>(ra_left, eval_w), remaining - 1);
        std::vector<token_t> cand;
        for (auto it = std::next(fifo_pool.rbegin()); it != fifo_pool.rend(); ++it) {
          const auto at = std::find(it->begin(), it->end(), seq.back());
          if (at == it->end()) continue;
          const auto from = static_cast<std::size_t>(at - it->begin()) + 1;
          cand.assign(it->begin() + static_cast<std::ptrdiff_t>(from),
                      it->begin() + static_cast<std::ptrdiff_t>(std::min(
                                        it->size(), from + static_cast<std::size_t>(len))));
          while (static_cast<index_t>(cand.size()) < len) cand.push_back(win[cand.size()]);
          if (!cand.empty()) trie.insert(0, cand);
        }
      } else if (const auto* cands = pool.find(seq.back());
                 !fifo && !stochastic && cands != nullptr && remaining > 1) {
        for (const auto& c : *cands)
          trie.insert(0, std::span<const token_t>(c.data(), std::min(c.size(), sz(remaining - 1))));
      }
    }
    const token_tree tree = trie.build();
    const index_t nodes = tree.size();
    co_await rows_pass(
        rows, st, [&](auto& r) { r.target(tree); },
        [&](auto& r) { return detail::target_pass(tree, r.logits, st); });

    // --- 2. Verification: greedy, or exact against the window's q rows (stochastic).
    index_t k = 0;
    {
      detail::scoped_timer timer(st.verify_seconds);
      if (stochastic) {
        // Node j's child was drawn from window row j (the leaf's row is never used).
        if constexpr (!Rows::resident) wrows.set_p(rows.logits);
        k = wrows.verify_window(verify, tree, step_stream(rng, step), out_tokens, out_nodes);
      } else if constexpr (!sampled_rows) {
        argmax.resize(sz(nodes));
        for (index_t u = 0; u < nodes; ++u) argmax[sz(u)] = rows.argmax(u, V);
        k = rows.verify(tree, V, out_tokens, out_nodes);
        // Released extent: accept within the RA block only. Greedy, so the token after the
        // cut (out_tokens[ra_left]: the argmax of the last kept node's row) is the bonus.
        if (!options.verify_past_ra) k = std::min(k, ra_left);
      }
    }
    m.commit(std::span<const index_t>(out_nodes.data(), sz(k + 1)));
    const bool stop = detail::emit_step(out_tokens, k,
                                        stop_set{options.stop_token, options.stop_tokens}, seq, st);
    if (stop) break;

    detail::scoped_timer timer(st.draft_seconds);
    // The argmax the window chain predicts for position j (row of position j - 1), or -1.
    const auto g_main = [&](index_t j) -> index_t {
      return !stochastic && j - 1 <= eval_w ? argmax[sz(main_nodes[sz(j - 1)])] : -1;
    };
    // --- 7. Recycle the rejected tail of the RA guesses (per-key pool; the FIFO pool is fed
    // after the window update).
    index_t km = 0;  // accepted prefix of the window chain
    while (km < eval_w && static_cast<index_t>(win[sz(km)]) == g_main(km + 1)) ++km;
    // Some RA guess was rejected (feeds the FIFO pool below).
    const bool ra_rejected = km < std::min(ra_left, eval_w);
    if (options.recycling && !fifo) {
      const index_t ra_end = std::min(ra_left, static_cast<index_t>(win.size()));
      for (index_t i = km; i + 1 < ra_end; ++i) {
        const index_t len = std::min(options.ngram_length, ra_end - 1 - i);
        pool.add(win[sz(i)], std::span<const token_t>(win.data() + i + 1, sz(len)));
      }
    }
    // --- 3. Pseudo-acceptance: frozen prefixes grow by the guesses equal to their argmax.
    for (std::size_t b = 0; b < frozen.size() && !stochastic; ++b) {
      const index_t start = ra_left + static_cast<index_t>(b) * n;  // block's first position - 1
      while (frozen[b] < n && start + frozen[b] + 1 <= eval_w &&
             static_cast<index_t>(win[sz(start + frozen[b])]) == g_main(start + frozen[b] + 1))
        ++frozen[b];
    }
    // --- 4. The Jacobi update of the window (old position j becomes new position j - c).
    const index_t c = k + 1;     // committed tokens
    std::vector<index_t> stale;  // first-child chain below the last accepted node
    for (index_t u = tree.first_child(out_nodes[sz(k)]); u >= 0; u = tree.first_child(u))
      stale.push_back(u);
    const auto is_frozen = [&](index_t j) {
      if (j <= ra_left) return false;
      const index_t b = (j - ra_left - 1) / n;
      return b < static_cast<index_t>(frozen.size()) && (j - ra_left - 1) % n < frozen[sz(b)];
    };
    // --- 5. Block bookkeeping: the RA block loses the committed positions.
    index_t new_ra_left = ra_left - c;
    std::vector<index_t> new_frozen = frozen;
    while (new_ra_left <= 0) {
      new_ra_left += n;
      if (!new_frozen.empty()) new_frozen.erase(new_frozen.begin());
    }
    const index_t new_w = new_ra_left + n * static_cast<index_t>(new_frozen.size());
    next_win.clear();
    const request_rng draw_rng = step_stream(rng, step, 1);
    if (stochastic) {
      // SJD + Adaptive Continuation from the stale rows R, one job per stale position i (law
      // R, so its row becomes R): old position j = c + i keeps its token with min(1, R/q_old),
      // else takes a sample of max(R - q_old, 0) (draws {i, 0}, {i, 1}); a position first
      // reached by a stale row is sampled from R (draw {i, 2}).
      jobs.clear();
      for (index_t i = 1; i <= new_w && i - 1 < static_cast<index_t>(stale.size()); ++i) {
        const index_t j = c + i;
        sjd_children_job job;
        job.row = stale[sz(i - 1)];
        job.parent = i - 1;
        job.kids = 1;
        job.depth = static_cast<std::uint32_t>(i);
        if (j <= static_cast<index_t>(win.size())) {
          job.ac_from = j - 1;
          job.ac_old = win[sz(j - 1)];
        }
        jobs.push_back(job);
      }
      drawn.assign(jobs.size(), no_token);
      counts.assign(jobs.size(), 0);
      if (!jobs.empty()) wrows.draw(jobs, drawn, counts, draw_rng);
      for (std::size_t i = 0; i < jobs.size(); ++i) {
        if (counts[i] < 1)
          throw_if_failed({status::no_mass, jobs[i].row, -1, 0.0}, "rows",
                          "a stale row without mass");
        next_win.push_back(drawn[i]);
      }
      // The rest: a position never examined keeps its token and row, a new one is filled.
      for (index_t i = static_cast<index_t>(jobs.size()) + 1; i <= new_w; ++i) {
        const index_t j = c + i;
        if (j <= static_cast<index_t>(win.size())) {
          next_win.push_back(win[sz(j - 1)]);
          window_row keep;
          keep.at = static_cast<std::int32_t>(i - 1);
          keep.from = static_cast<std::int32_t>(j - 1);
          row_ops.push_back(keep);
        } else {
          fill(next_win, next_win.empty() ? seq.back() : next_win.back());
        }
      }
      write_rows(true);
      wrows.next_ready();
    }
    for (index_t i = 1; i <= new_w && !stochastic; ++i) {
      const index_t j = c + i;  // old position
      const bool have_old = j <= static_cast<index_t>(win.size());
      const bool have_stale = j - c - 1 < static_cast<index_t>(stale.size());
      if (is_frozen(j)) {
        next_win.push_back(win[sz(j - 1)]);
      } else if (have_stale) {
        next_win.push_back(static_cast<token_t>(argmax[sz(stale[sz(j - c - 1)])]));
      } else if (j - 1 <= eval_w) {
        next_win.push_back(static_cast<token_t>(g_main(j)));
      } else if (have_old) {
        next_win.push_back(win[sz(j - 1)]);
      } else {
        fill(next_win, next_win.empty() ? seq.back() : next_win.back());
      }
    }
    win.swap(next_win);
    ra_left = new_ra_left;
    frozen = std::move(new_frozen);
    // --- 7 (FIFO pool). After a step that rejected an RA guess: the concatenation of all
    // blocks (the RA block's committed tokens, then the new window), then the RA's new guesses.
    fifo_propose = fifo && ra_rejected;
    if (fifo_propose && options.pool_size > 0) {
      const index_t done = std::min<index_t>(n - ra_left, static_cast<index_t>(seq.size()));
      std::vector<token_t> all(seq.end() - done, seq.end());
      all.insert(all.end(), win.begin(), win.end());
      std::vector<token_t> tail(
          win.begin(), win.begin() + std::min<index_t>(ra_left, static_cast<index_t>(win.size())));
      for (auto* v : {&all, &tail}) {
        if (v->empty()) continue;
        fifo_pool.push_back(std::move(*v));
        if (static_cast<index_t>(fifo_pool.size()) > options.pool_size) fifo_pool.pop_front();
      }
    }
    // --- 6. Spawn a pseudo-active block.
    if (1 + static_cast<index_t>(frozen.size()) < options.max_blocks) {
      bool spawn = n - ra_left >= spawn_at;
      if (options.spawn == multiblock_spawn::newest_block && !frozen.empty())
        spawn = frozen.back() >= spawn_at;
      else
        for (const index_t f : frozen) spawn = spawn || f >= spawn_at;
      if (spawn) {
        for (index_t i = 0; i < n; ++i) {
          const token_t t = i < ra_left ? win[sz(i)] : (win.empty() ? seq.back() : win.back());
          win.push_back(t);
          if (stochastic)  // a copy: one-hot row
            row_ops.push_back(one_hot_row(static_cast<index_t>(win.size()) - 1, t));
        }
        write_rows(false);
        frozen.push_back(0);
      }
    }
  }
  trim_cache(m, static_cast<index_t>(seq.size()) - 1);
  result.assign(seq.begin() + prompt_len, seq.end());
}

}  // namespace detail

/// Multi-block decoding of up to `options.max_new_tokens` tokens after `prompt` (see file
/// comment); `rng` seeds the random draws. The model is restarted with `prefill(prompt)`. Adds
/// to `*stats` when given. `verify` is the stochastic variant's exact tree verifier unless a test
/// substitutes another (the greedy variant always verifies greedily). Arguments in the loops'
/// common order (docs/decoding.md): models, prompt, options, rng, verifier, stats, control
/// (cancellation between passes, decode/control.hpp).
template <session_model Model, verifier Verifier = tree_verifier<>>
std::vector<token_t> multiblock_decode(Model& m, std::span<const token_t> prompt,
                                       const multiblock_options& options, request_rng rng = {},
                                       const Verifier& verify = {}, decode_stats* stats = nullptr,
                                       const request_control& control = {}) {
  std::vector<token_t> out;
  detail::decode_solo(
      m, static_cast<detail::no_draft*>(nullptr), stats,
      [&](decode_stats& st) {
        return detail::multiblock_task(detail::solo<Model>{&m}, prompt, options, rng, verify, st,
                                       out);
      },
      control);
  return out;
}

/// multiblock_decode with the former argument order (stats before the verifier), kept: the two
/// orders cannot be confused (a `decode_stats*` is no verifier).
template <session_model Model, verifier Verifier = tree_verifier<>>
std::vector<token_t> multiblock_decode(Model& m, std::span<const token_t> prompt,
                                       const multiblock_options& options, request_rng rng,
                                       decode_stats* stats, const Verifier& verify = {}) {
  return multiblock_decode(m, prompt, options, rng, verify, stats);
}

/// multiblock_decode for several requests at once: request r decodes `prompts[r]` with
/// `rngs[r]` as request r of `m`, all requests' steps sharing forward passes (decode/task.hpp);
/// adds to `stats[r]` when `stats` is given. Each output equals multiblock_decode of that
/// request alone. `control` adds isolation, cancellation and per-request limits.
template <batched_session_model Model, verifier Verifier = tree_verifier<>>
std::vector<std::vector<token_t>> multiblock_decode_batch(
    Model& m, std::span<const std::vector<token_t>> prompts, const multiblock_options& options,
    std::span<const request_rng> rngs, const Verifier& verify = {},
    std::span<decode_stats> stats = {}, const batch_control& control = {}) {
  std::vector<std::vector<token_t>> out(prompts.size());
  detail::decode_batch(
      m, static_cast<detail::no_draft*>(nullptr), m.batch_size(), prompts, rngs.size(), stats,
      [&](index_t r, decode_stats& st) {
        const auto i = static_cast<std::size_t>(r);
        return detail::multiblock_task(detail::member<Model>{&m, r}, prompts[i],
                                       detail::request_options(options, control, r), rngs[i],
                                       verify, st, out[i]);
      },
      control, m.vocab_size());
  return out;
}

/// multiblock_decode_batch with the former argument order (stats before the verifier), kept.
template <batched_session_model Model, class Stats>
requires std::convertible_to<Stats&&, std::span<decode_stats>> std::vector<std::vector<token_t>>
multiblock_decode_batch(Model& m, std::span<const std::vector<token_t>> prompts,
                        const multiblock_options& options, std::span<const request_rng> rngs,
                        Stats&& stats) {
  return multiblock_decode_batch(m, prompts, options, rngs, tree_verifier<>{},
                                 std::span<decode_stats>(std::forward<Stats>(stats)));
}
template <batched_session_model Model, verifier Verifier>
std::vector<std::vector<token_t>> multiblock_decode_batch(
    Model& m, std::span<const std::vector<token_t>> prompts, const multiblock_options& options,
    std::span<const request_rng> rngs, std::span<decode_stats> stats, const Verifier& verify) {
  return multiblock_decode_batch(m, prompts, options, rngs, verify, stats);
}

}  // namespace specula
