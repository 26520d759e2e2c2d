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
///      d < D (or only the first path's, `pd_full_tree = false`) gets K children drawn without
///      replacement from R_{d+1} (the first-path child is the SJD/AC token, the others exclude
///      the tokens already drawn) — and the first path continues as a chain with what the
///      tree leaves of the window (a fixed budget of drafted nodes, SJD-PAC §5.3.2). Every node
///      at depth d - 1 proposes from the same stale row R_d,
///      which can be nearly one-hot in float (all but ~1e-7 of the mass on the first
///      candidate): the tree verifier renormalises the later candidates' proposal by the
///      summed remaining mass, not 1 - removed mass, so that stays exact (docs/decoding.md);
///    - positions without a stale row are initialised with random tokens (from a token subset,
///      e.g. image tokens), proposed by the uniform row over the subset (`sjd_init::uniform_q`,
///      as SJD-PAC's code) or by the one-hot row at the token (`sjd_init::one_hot_q`, as SJD's
///      code), or with a spatial prior on the image grid (`sjd_options::image_width`): the left
///      neighbour or the token above repeated (one-hot row), a sample from the row it was drawn
///      from (that row), or that row's argmax (one-hot row).
///
/// Every draft token is verified against fresh target rows with q the distribution it was
/// actually drawn from, so the output law is the target's whatever the switches (tested by
/// G-tests on toy models with known laws). When every draft of the path is accepted, the bonus
/// token comes from the target row of the last accepted node.
///
/// Randomness: iteration s verifies with `{seed, request_id, step0 + s}` and builds the next
/// draft with `{fold_in(seed, 1), request_id, step0 + s}` (step0: the stream's `step`, see
/// detail::step_stream).

#include <algorithm>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/rng.hpp"
#include "specula/decode/speculative.hpp"
#include "specula/decode/step.hpp"
#include "specula/decode/task.hpp"
#include "specula/rules/exact.hpp"
#include "specula/sample/random_source.hpp"

namespace specula {

/// How window positions without a stale row are initialised. Random tokens are drawn from
/// `sjd_options::init_tokens` (all tokens by default; image tokens only in the authors' code).
/// The spatial priors (SJD, Table 10) use the image layout `sjd_options::image_width` (tokens
/// per image row in raster order, from `image_first` generated tokens on): a position without
/// the neighbour a prior needs (a row start for the horizontal ones, the first image row for
/// the vertical ones) is initialised as `uniform_q`.
enum class sjd_init {
  uniform_q,  ///< random token, proposal row uniform over init_tokens (SJD-PAC's code)
  one_hot_q,  ///< random token, proposal row one-hot at it (SJD's code)
  /// Repeat the left neighbour (the previous token); proposal row one-hot at it.
  horizontal_repeat,
  /// A sample from the row the left neighbour was drawn from; proposal row that row.
  horizontal_sample,
  /// Repeat the token one image row above; proposal row one-hot at it.
  vertical_repeat,
  /// A sample from the row the token above was drawn from; proposal row that row.
  vertical_sample,
  /// The argmax of the row the left neighbour was drawn from (lowest id on ties); proposal row
  /// one-hot at it (the "horizontal sample" of SJD's code).
  horizontal_argmax,
  /// The argmax of the row the token above was drawn from; proposal row one-hot at it.
  vertical_argmax,
};

/// Options of sjd_decode. Defaults are vanilla SJD with a window of 16 draft tokens.
///
/// `window` is a fixed token budget (SJD-PAC §5.3.2): it counts every drafted node of an
/// iteration's draft, the Proactive Drafting tree included; the chain below the tree's first
/// path gets what the tree leaves. The root (the last committed token, which the forward pass
/// also evaluates) is not counted and `pd_depth` counts candidate levels below it, unless
/// `count_root` is set: then both count the root as the authors' code does (its L = 64 is 63
/// drafted nodes, its SJD window of 16 is 15 drafts, and its `tree_depth = 3` is two candidate
/// levels).
struct sjd_options {
  index_t window = 16;                 ///< L: drafted nodes per iteration (tree + chain), >= 1
  index_t max_new_tokens = 64;         ///< >= 1
  bool adaptive_continuation = false;  ///< AC (SJD-PAC §4.2)
  bool proactive_drafting = false;     ///< PD (SJD-PAC §4.1)
  index_t pd_width = 3;                ///< K: candidates per tree node, >= 1
  index_t pd_depth = 1;                ///< D: candidate levels below the emitted token, >= 1
  bool count_root = false;             ///< window and pd_depth include the root (authors' code)
  /// PD tree shape: full K-ary tree (K + ... + K^D nodes; the authors' code), or K siblings
  /// per level along the first path only (K D nodes; the lighter reading of the paper's text).
  bool pd_full_tree = true;
  sjd_init init = sjd_init::uniform_q;
  /// Random initialisation draws from tokens [init_tokens_begin, init_tokens_end) (end <= 0:
  /// the vocabulary size), e.g. an image model's image tokens.
  index_t init_tokens_begin = 0;
  index_t init_tokens_end = 0;
  /// Image layout for the spatial priors: tokens per image row (0: no rows — the left
  /// neighbour is the previous token, there is no token above) and the number of generated
  /// tokens before the image's first token.
  index_t image_width = 0;
  index_t image_first = 0;
  sampling_params target{};       ///< target logits -> p
  token_t stop_token = no_token;  ///< generation ends after emitting it (-1: never)
  /// More tokens that end generation once emitted, as `stop_token` does (e.g. a model's
  /// several end-of-turn tokens); each in [0, vocab_size).
  std::vector<token_t> stop_tokens;
  /// Reproduces the SJD-PAC authors' code where Proactive Drafting follows Adaptive
  /// Continuation: the first path's extra siblings are drawn from the AC residual
  /// max(R - q_old, 0) but verified as draws from R. **Not lossless** (docs/decoding.md, "Where
  /// the authors' code is not exact"): for measuring that code's behaviour only.
  bool official_residual_siblings = false;

  /// Drafted nodes per iteration: window, less the root under `count_root`.
  [[nodiscard]] index_t draft_budget() const noexcept { return window - (count_root ? 1 : 0); }
  /// Candidate levels of the Proactive Drafting tree: pd_depth, less the root's under
  /// `count_root`.
  [[nodiscard]] index_t pd_levels() const noexcept { return pd_depth - (count_root ? 1 : 0); }

  /// SJD-PAC with both components: window L, K = `width` candidates per node, D = `depth`
  /// (candidate levels; the root counted too under `count_root`).
  [[nodiscard]] static sjd_options sjd_pac(index_t window, index_t width, index_t depth,
                                           bool count_root = false) {
    sjd_options o;
    o.window = window;
    o.adaptive_continuation = true;
    o.proactive_drafting = true;
    o.pd_width = width;
    o.pd_depth = depth;
    o.count_root = count_root;
    return o;
  }

  /// The paper's full method as the authors ran it: L = 64, K = 4, D = 3 in their code's
  /// convention (`count_root`): 63 drafted nodes, a full 4-ary tree of two candidate levels
  /// (20 nodes) and a chain of 43 below its first path. Read as three levels below the
  /// emitted token, a full 4-ary tree has 84 nodes and does not fit L = 64 (the lighter
  /// shape, `pd_full_tree = false`, has 12).
  [[nodiscard]] static sjd_options sjd_pac() { return sjd_pac(64, 4, 3, true); }
};

namespace detail {

/// The draft below the last committed token: parents, tokens and one q row per node.
struct sjd_draft {
  std::vector<index_t> parents{-1};
  std::vector<token_t> tokens{no_token};
  /// nodes x V; row u: what u's children were drawn from. Empty when the rows live elsewhere
  /// (`host_rows` false: a resident rows policy keeps them).
  std::vector<float> q;
  std::vector<index_t> depth{0};
  bool host_rows = true;

  void reset(token_t root, index_t vocab) {
    parents.assign(1, -1);
    tokens.assign(1, root);
    depth.assign(1, 0);
    q.assign(host_rows ? static_cast<std::size_t>(vocab) : 0u, 0.0f);
  }
  index_t add(index_t parent, token_t t, index_t vocab) {
    parents.push_back(parent);
    tokens.push_back(t);
    depth.push_back(depth[static_cast<std::size_t>(parent)] + 1);
    if (host_rows) q.resize(q.size() + static_cast<std::size_t>(vocab), 0.0f);
    return static_cast<index_t>(parents.size()) - 1;
  }
  void reserve(index_t nodes, index_t vocab) {
    const auto n = static_cast<std::size_t>(nodes);
    parents.reserve(n);
    tokens.reserve(n);
    depth.reserve(n);
    if (host_rows) q.reserve(n * static_cast<std::size_t>(vocab));
  }
  [[nodiscard]] index_t size() const noexcept { return static_cast<index_t>(parents.size()); }
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

/// What initialisation needs besides the draft: the options, the generated tokens committed so
/// far and the rows they were drawn from (the last `rows_kept` of them, when a prior samples).
struct sjd_init_context {
  const sjd_options* options = nullptr;
  std::span<const token_t> generated;
  const std::vector<float>* rows = nullptr;  ///< rows of generated[rows_first ..], V each
  index_t rows_first = 0;
  bool misreport = false;  ///< test-only fault: a sampled prior reports the uniform row
};

/// The tokens random initialisation draws from ([begin, end), from sjd_options::init_tokens_*)
/// and the draw itself.
struct sjd_init_tokens {
  index_t begin, end;
  sjd_init_tokens(const sjd_options& o, index_t vocab)
      : begin(std::clamp<index_t>(o.init_tokens_begin, 0, vocab - 1)),
        end(o.init_tokens_end <= 0 ? vocab
                                   : std::clamp<index_t>(o.init_tokens_end, begin + 1, vocab)) {}
  /// The random token for the uniform u.
  [[nodiscard]] token_t token(double u) const noexcept {
    const auto n = static_cast<double>(end - begin);
    return static_cast<token_t>(begin +
                                std::min<index_t>(end - begin - 1, static_cast<index_t>(u * n)));
  }
  /// The entries of the uniform proposal row over [begin, end).
  [[nodiscard]] float uniform_probability() const noexcept {
    return static_cast<float>(1.0 / static_cast<double>(end - begin));
  }
};

/// The token of a new child of `parent` at a position without a stale row, drawn with the
/// uniform `u` as `ctx.options->init` says; writes the parent's q row (what the child is drawn
/// from).
inline token_t sjd_init_child(sjd_draft& draft, index_t parent, const sjd_init_context& ctx,
                              index_t vocab, double u) {
  const sjd_options& o = *ctx.options;
  auto qrow = draft.q_row(parent, vocab);
  const auto sz = [](index_t n) { return static_cast<std::size_t>(n); };
  const sjd_init_tokens range(o, vocab);
  const index_t begin = range.begin, end = range.end;
  const auto one_hot = [&](token_t x) {
    std::fill(qrow.begin(), qrow.end(), 0.0f);
    qrow[sz(x)] = 1.0f;
    return x;
  };
  const auto random = [&](bool uniform_row) {
    const token_t x = range.token(u);
    if (!uniform_row) return one_hot(x);
    std::fill(qrow.begin(), qrow.end(), 0.0f);
    std::fill(qrow.begin() + begin, qrow.begin() + end, range.uniform_probability());
    return x;
  };
  if (o.init == sjd_init::uniform_q) return random(true);
  if (o.init == sjd_init::one_hot_q) return random(false);

  // The neighbour the prior copies or samples from: generated index h of the child's left
  // neighbour or of the token above.
  const index_t committed = static_cast<index_t>(ctx.generated.size());
  const index_t child = committed + draft.depth[sz(parent)];  // the child's generated index
  const bool vertical = o.init == sjd_init::vertical_repeat ||
                        o.init == sjd_init::vertical_sample || o.init == sjd_init::vertical_argmax;
  index_t h = -1;
  if (vertical) {
    if (o.image_width > 0 && child - o.image_width >= o.image_first) h = child - o.image_width;
  } else if (o.image_width <= 0) {
    h = child - 1;  // the previous token, the root included (it may be a prompt token)
  } else if ((child - o.image_first) % o.image_width != 0 && child - 1 >= o.image_first) {
    h = child - 1;
  }
  if (o.image_width <= 0 && !vertical && draft.depth[sz(parent)] == 0 &&
      o.init == sjd_init::horizontal_repeat)
    return one_hot(draft.tokens[0]);  // the root, committed or a prompt token
  if (h < 0) return random(true);

  // The neighbour's token and the row it was drawn from (empty when not known).
  token_t token = no_token;
  std::span<const float> row;
  if (h >= committed) {  // a node of the draft: the ancestor of the child at that depth
    index_t a = parent;
    while (draft.depth[sz(a)] > h - committed + 1) a = draft.parents[sz(a)];
    token = draft.tokens[sz(a)];
    row = draft.q_row(draft.parents[sz(a)], vocab);
  } else {
    token = ctx.generated[sz(h)];
    if (ctx.rows != nullptr && h >= ctx.rows_first)
      row = std::span<const float>(ctx.rows->data() + (h - ctx.rows_first) * vocab, sz(vocab));
  }
  switch (o.init) {
    case sjd_init::horizontal_repeat:
    case sjd_init::vertical_repeat:
      return one_hot(token);
    case sjd_init::horizontal_argmax:
    case sjd_init::vertical_argmax:
      if (row.empty()) return random(true);
      return one_hot(static_cast<token_t>(
          argmax_lowest(row_view<const float>(row.data(), static_cast<index_t>(row.size())))));
    default:
      break;
  }
  // horizontal_sample / vertical_sample
  if (row.empty()) return random(true);
  const auto w = [&](index_t y) { return static_cast<double>(row[sz(y)]); };
  const auto x = static_cast<token_t>(sample_inverse_cdf(vocab, w, positive_mass(vocab, w), u));
  if (ctx.misreport) {
    std::fill(qrow.begin(), qrow.end(), 1.0f / static_cast<float>(vocab));
    return x;
  }
  std::copy(row.begin(), row.end(), qrow.begin());
  return x;
}

}  // namespace detail

namespace detail {

/// Deliberately wrong drafting, for the negative controls of the G-tests (and, for
/// residual_siblings, sjd_options::official_residual_siblings).
enum class sjd_fault {
  none,
  /// AC where the chain below a side node meets the main path takes q_old from the chain's
  /// last node (whose row the old main-path token was not drawn from).
  junction_q_of_chain,
  /// The official code's Proactive Drafting after Adaptive Continuation: the first path's
  /// extra siblings are drawn (without replacement) from the AC residual max(R - q_old, 0)
  /// while the next verification is told they came from R.
  residual_siblings,
  /// A sampling spatial prior reports the uniform row as the row its token was drawn from.
  prior_misreports_row,
};

/// The deliberate deviation an sjd_options asks for (none unless official_residual_siblings).
inline sjd_fault sjd_fault_of(const sjd_options& o) noexcept {
  return o.official_residual_siblings ? sjd_fault::residual_siblings : sjd_fault::none;
}

/// The draws of `jobs` on the host: job j's q row (q_next row job.parent) becomes its stale row
/// (p row job.row), its children go to tokens[sum of earlier jobs' kids ..] and their number to
/// counts[j]. p: the last pass's rows; q_old: the current draft's q rows.
inline void sjd_draw_jobs(std::span<const sjd_children_job> jobs, const float* p,
                          const float* q_old, float* q_next, index_t V, const request_rng& rng,
                          std::span<token_t> tokens, std::span<index_t> counts) {
  const auto row = [&](const float* rows, index_t u) { return u < 0 ? nullptr : rows + u * V; };
  index_t at = 0;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    const sjd_children_job& job = jobs[j];
    const float* R = row(p, job.row);
    std::copy_n(R, V, q_next + job.parent * V);
    counts[j] = sjd_draw_children(job, R, row(q_old, job.ac_from), row(q_old, job.residual_from), V,
                                  rng, tokens.data() + at);
    at += job.kids;
  }
}

/// Where sjd_task's rows live: `sjd_host_rows` (the default) keeps p rows and q rows in host
/// memory (q rows in the sjd_draft objects) and takes its logits from the loop's target passes.
/// A *resident* policy (`resident = true`; the example transformer's resident SJD,
/// examples/transformer/include/specula_example/resident_sjd.hpp) keeps them where its model
/// computes them and runs the forward pass itself (`target(tree)`); the loop then holds only the
/// draft's tokens and shape. Both draw with the same functions (row_draws.hpp). Operations:
/// - `start(vocab, options)`: before the first iteration (may refuse options);
/// - `init_child(next, parent, ctx, u)`: the token of a new child of `next`'s node `parent` at a
///   position without a stale row, writing the parent's q row (sjd_init_child);
/// - `move_q(draft, from, to)`: q row `from` of the current draft to row `to` (to < from);
/// - `target(tree)` (resident) or `logits` (the rows of the loop's pass, host);
/// - `verify(verifier, tree, draft, params, rng, out_tokens, out_nodes)`: p rows from the pass,
///   the leaves' q rows = their p rows, verification; returns the accepted count;
/// - `p_row(node)`: a p row of the last pass (the spatial priors' committed rows; host);
/// - `draw(draft, next, jobs, tokens, counts, rng)`: each job's children (sjd_draw_children;
///   job j's at tokens[sum of earlier jobs' kids ..], their number in counts[j]) and its q row;
/// - `next_ready()`: the next draft's q rows become the current ones.
/// `defers_chain`: jobs of one child each (the chain below the Proactive Drafting tree) may be
/// drawn together after their nodes were added (their number is known: a row always has a
/// token), so that a device policy draws a whole chain with one launch.
struct sjd_host_rows {
  static constexpr bool resident = false;
  static constexpr bool defers_chain = false;
  index_t V = 0;
  std::vector<float> logits, probs, scratch;
  tree_workspace verify_ws;  // the verifier's, when it takes one (verify_one)

  void start(index_t vocab, const sjd_options&) {
    V = vocab;
    scratch.resize(static_cast<std::size_t>(V));
  }
  token_t init_child(sjd_draft& next, index_t parent, const sjd_init_context& ctx, double u) {
    return sjd_init_child(next, parent, ctx, V, u);
  }
  void move_q(sjd_draft& draft, index_t from, index_t to) {
    std::copy_n(draft.q.begin() + from * V, V, draft.q.begin() + to * V);
  }
  template <class Verifier>
  index_t verify(const Verifier& verifier, const token_tree& tree, sjd_draft& draft,
                 const sampling_params& params, const request_rng& rng,
                 std::vector<token_t>& out_tokens, std::vector<index_t>& out_nodes) {
    probs.resize(logits.size());
    rows_to_probs(params, logits, probs, scratch, V);
    return verify_with_leaves(verifier, tree, V, probs, draft.q, rng, out_tokens, out_nodes,
                              &verify_ws);
  }
  [[nodiscard]] std::span<const float> p_row(index_t node) const {
    return {probs.data() + node * V, static_cast<std::size_t>(V)};
  }
  void draw(const sjd_draft& draft, sjd_draft& next, std::span<const sjd_children_job> jobs,
            std::span<token_t> tokens, std::span<index_t> counts, const request_rng& rng) {
    sjd_draw_jobs(jobs, probs.data(), draft.q.data(), next.q.data(), V, rng, tokens, counts);
  }
  void next_ready() {}
};

/// stale[j]: the node of the verified draft `tree` at the position of the (j+1)-th token after
/// the last accepted node `last` (the first at the emitted token's position). First the
/// first-child chain below `last` (inside its subtree), then, below that chain's depth, the main
/// path (the first-child chain from the root): when `last` lies on a side branch, the main path
/// still holds rows for the positions its subtree does not reach.
inline void sjd_stale_nodes(const token_tree& tree, index_t last, std::vector<index_t>& stale) {
  stale.clear();
  for (index_t c = tree.first_child(last); c >= 0; c = tree.first_child(c)) stale.push_back(c);
  const index_t reached = stale.empty() ? tree.depth(last) : tree.depth(stale.back());
  index_t main = 0;
  while (main >= 0 && tree.depth(main) <= reached) main = tree.first_child(main);
  // `main` is the main-path node one deeper than the chain (none when `last` is on the main
  // path: then the chain is the main path's own continuation).
  for (; main >= 0; main = tree.first_child(main)) stale.push_back(main);
}

/// SJD / SJD-PAC decoding of one request (see file comment), as a task; `m` is its handle.
/// `resident_rows`: the rows policy when `Rows` is resident (see sjd_host_rows), else unused.
template <class Handle, class Verifier, class Rows = sjd_host_rows>
decode_task sjd_task(Handle m, std::span<const token_t> prompt, sjd_options options,
                     request_rng rng, Verifier verify, decode_stats& st,
                     std::vector<token_t>& result, sjd_fault fault = sjd_fault::none,
                     Rows* resident_rows = nullptr) {
  if (prompt.empty()) throw_if_failed({status::empty_input, -1, -1, 0.0}, "prompt");
  require_parameter(options.draft_budget() >= 1, "window", static_cast<double>(options.window),
                    options.count_root ? "must be >= 2 (it counts the root)" : "must be >= 1");
  require_parameter(options.max_new_tokens >= 1, "max_new_tokens",
                    static_cast<double>(options.max_new_tokens), "must be >= 1");
  require_parameter(options.pd_width >= 1 && options.pd_width <= 60, "pd_width",
                    static_cast<double>(options.pd_width), "must be in [1, 60]");
  require_parameter(options.pd_depth >= 1, "pd_depth", static_cast<double>(options.pd_depth),
                    "must be >= 1");
  if (options.proactive_drafting) {
    // The candidate levels hold pd_width + pd_width^2 + ... + pd_width^levels nodes, which
    // come out of the window.
    double level = 1.0, tree_nodes = 0.0;
    for (index_t d = 0; d < options.pd_levels() && tree_nodes <= 65536.0; ++d)
      tree_nodes += options.pd_full_tree ? (level *= static_cast<double>(options.pd_width))
                                         : static_cast<double>(options.pd_width);
    require_parameter(tree_nodes <= static_cast<double>(options.draft_budget()), "pd_depth",
                      static_cast<double>(options.pd_depth),
                      "gives a Proactive Drafting tree of more nodes than the window holds at "
                      "this pd_width");
  }
  validate_sampling_params(options.target);
  const index_t V = m.vocab_size();
  const auto sz = [](index_t n) { return static_cast<std::size_t>(n); };
  {
    const index_t end = options.init_tokens_end <= 0 ? V : options.init_tokens_end;
    require_parameter(options.init_tokens_begin >= 0 && options.init_tokens_begin < end,
                      "init_tokens_begin", static_cast<double>(options.init_tokens_begin),
                      "must be in [0, init_tokens_end)");
    require_parameter(end <= V, "init_tokens_end", static_cast<double>(options.init_tokens_end),
                      "must be <= the vocabulary size (or <= 0: the vocabulary size)");
    require_parameter(options.image_width >= 0, "image_width",
                      static_cast<double>(options.image_width), "must be >= 0");
    require_parameter(options.image_first >= 0, "image_first",
                      static_cast<double>(options.image_first), "must be >= 0");
  }

  std::conditional_t<Rows::resident, int, Rows> local_rows{};
  Rows& rows = rows_policy(local_rows, resident_rows);
  rows.start(V, options);

  const auto prompt_len = static_cast<index_t>(prompt.size());
  std::vector<token_t>& seq =
      co_await start_request(prompt, options.stop_token, options.stop_tokens, V, result, st, m);
  detail::sjd_draft draft, next;
  draft.host_rows = next.host_rows = !Rows::resident;
  std::vector<token_t> out_tokens, drawn;
  std::vector<index_t> out_nodes, stale, counts, deferred_nodes, map;
  std::vector<sjd_children_job> jobs;
  // Spatial priors that sample or take an argmax need the rows of the committed neighbours.
  const bool prior_rows =
      options.init == sjd_init::horizontal_sample || options.init == sjd_init::vertical_sample ||
      options.init == sjd_init::horizontal_argmax || options.init == sjd_init::vertical_argmax;
  const index_t keep_rows = prior_rows ? std::max<index_t>(options.image_width, 1) : 0;
  std::vector<float> kept_rows;  // rows of the generated tokens rows_first, rows_first + 1, ...
  index_t rows_first = 0;
  const auto init_context = [&] {
    return detail::sjd_init_context{
        &options, std::span<const token_t>(seq.data() + prompt_len, seq.size() - sz(prompt_len)),
        &kept_rows, rows_first, fault == sjd_fault::prior_misreports_row};
  };
  // Draws `jobs` (sjd_host_rows::draw); with `deferred`, each job's one child was added as node
  // deferred_nodes[j] and receives its token, else the children are added below their parents
  // (and to `below`).
  const auto draw_jobs = [&](const request_rng& draw_rng, bool deferred,
                             std::vector<index_t>* below) {
    if (jobs.empty()) return;
    index_t total = 0;
    for (const auto& job : jobs) total += job.kids;
    drawn.assign(sz(total), no_token);
    counts.assign(jobs.size(), 0);
    rows.draw(draft, next, jobs, drawn, counts, draw_rng);
    index_t at = 0;
    for (std::size_t j = 0; j < jobs.size(); ++j) {
      if (deferred) {
        if (counts[j] < 1)
          throw_if_failed({status::no_mass, jobs[j].row, -1, 0.0}, "rows",
                          "a stale row without mass");
        next.tokens[sz(deferred_nodes[j])] = drawn[sz(at)];
      } else {
        for (index_t c = 0; c < counts[j]; ++c)
          below->push_back(next.add(jobs[j].parent, drawn[sz(at + c)], V));
      }
      at += jobs[j].kids;
    }
    jobs.clear();
    deferred_nodes.clear();
  };
  // Per request, reused by every step: the step's draft tree, the draft cut to the remaining
  // budget, and the nodes of a level of the next draft and of the level below it.
  token_tree tree;
  detail::sjd_draft kept;
  kept.host_rows = !Rows::resident;
  std::vector<index_t> level, below;
  // Every next draft fills the budget (the root and budget nodes): sized once. (The cut
  // draft's q rows come from the draft it cuts: it grows them only at the first cut.)
  draft.reserve(options.draft_budget() + 1, V);
  next.reserve(options.draft_budget() + 1, V);
  kept.reserve(options.draft_budget() + 1, 0);
  bool fresh = true;  // the draft below the root still has to be built from scratch

  for (std::uint32_t step = 0;; ++step) {
    const index_t remaining =
        options.max_new_tokens - (static_cast<index_t>(seq.size()) - prompt_len);
    if (remaining <= 0) break;
    const index_t budget = options.draft_budget();
    const index_t max_depth = std::min(budget, remaining - 1);
    const request_rng draw_rng = step_stream(rng, step, 1);

    // --- Initial window: L uniform random tokens (only before the first iteration; later
    // windows are built from stale rows below).
    if (fresh) {
      detail::scoped_timer timer(st.draft_seconds);
      next.reset(seq.back(), V);
      index_t u = 0;
      for (index_t d = 1; d <= max_depth; ++d) {
        const token_t x = rows.init_child(
            next, u, init_context(),
            uniform_at(draw_rng,
                       draw_id{static_cast<std::uint32_t>(d), detail::sjd_first_window_slot}));
        u = next.add(u, x, V);
      }
      rows.next_ready();
      std::swap(draft, next);  // next keeps its buffers: reset() reuses them (no allocation)
      fresh = false;
    }
    // Drop nodes deeper than the remaining budget allows (parents precede children; a kept
    // node's q row moves down to its new index).
    if (max_depth < budget) {
      kept.reset(draft.tokens[0], V);
      map.assign(draft.parents.size(), -1);
      map[0] = 0;
      for (std::size_t u = 1; u < draft.parents.size(); ++u) {
        if (draft.depth[u] > max_depth) continue;
        const index_t p = map[sz(draft.parents[u])];
        if (p < 0) continue;
        map[u] = kept.add(p, draft.tokens[u], V);
        if (map[u] != static_cast<index_t>(u)) rows.move_q(draft, static_cast<index_t>(u), map[u]);
      }
      kept.q.swap(draft.q);
      kept.q.resize(draft.host_rows ? sz(kept.size() * V) : 0u);
      std::swap(draft, kept);  // kept keeps the old draft's buffers for the next cut
    }

    tree_limits limits;
    limits.max_nodes = static_cast<index_t>(draft.parents.size());
    limits.max_depth = std::max<index_t>(1, max_depth);
    limits.max_children = std::max<index_t>(1, options.pd_width);
    tree.assign(draft.parents, draft.tokens, limits);

    // --- 1. One forward pass over the draft tree.
    co_await rows_pass(
        rows, st, [&](auto& r) { r.target(tree); },
        [&](auto& r) { return detail::target_pass(tree, r.logits, st); });
    // --- 2. Verify (exact rule, siblings without replacement) and commit.
    index_t k = 0;
    {
      detail::scoped_timer timer(st.verify_seconds);
      k = rows.verify(verify, tree, draft, options.target, step_stream(rng, step), out_tokens,
                      out_nodes);
    }
    m.commit(std::span<const index_t>(out_nodes.data(), sz(k + 1)));
    if (keep_rows > 0) {  // the rows the committed tokens were drawn from (the last keep_rows)
      for (index_t j = 0; j <= k; ++j) {
        const auto r = rows.p_row(out_nodes[sz(j)]);
        kept_rows.insert(kept_rows.end(), r.begin(), r.end());
      }
      const index_t drop = static_cast<index_t>(kept_rows.size()) / V - keep_rows;
      if (drop > 0) {
        kept_rows.erase(kept_rows.begin(), kept_rows.begin() + drop * V);
        rows_first += drop;
      }
    }
    if (detail::emit_step(out_tokens, k, stop_set{options.stop_token, options.stop_tokens}, seq,
                          st))
      break;

    // --- 3. The next draft below the emitted token, from the stale rows.
    detail::scoped_timer timer(st.draft_seconds);
    detail::sjd_stale_nodes(tree, out_nodes[sz(k)], stale);
    // Some position after the emitted token has a stale row: the verification rejected a
    // draft token somewhere (on the main path when the last accepted node is a side node).
    const bool rejected = !stale.empty();
    next.reset(seq.back(), V);
    const index_t stale_rows = static_cast<index_t>(stale.size());  // R_1 .. R_{m+1}
    const bool tree_mode = options.proactive_drafting && rejected;
    const index_t width = tree_mode ? options.pd_width : 1;
    // Level by level: `level` holds the nodes at depth d - 1; the first is on the first path.
    // The tree's levels (which fit the budget) come first, the first path's chain gets the
    // rest of the budget.
    level.assign(1, 0);
    bool deferring = false;  // jobs holds deferred one-child jobs
    for (index_t d = 1; static_cast<index_t>(next.parents.size()) - 1 < budget; ++d) {
      below.clear();
      if (d > stale_rows) {  // initialisation (random or spatial prior), first path only
        if (deferring) draw_jobs(draw_rng, true, nullptr);  // a prior reads the tokens above
        deferring = false;
        const token_t x = rows.init_child(
            next, level[0], init_context(),
            uniform_at(draw_rng, draw_id{static_cast<std::uint32_t>(d), detail::sjd_init_slot}));
        below.push_back(next.add(level[0], x, V));
      } else {
        // Each node's children from R_d = the row of stale[d - 1] (its q row becomes R_d).
        const auto level_begin = jobs.size();
        index_t level_kids = 0;
        for (std::size_t li = 0; li < level.size(); ++li) {
          const bool first_path = li == 0;
          const bool branches =
              tree_mode && d <= options.pd_levels() && (options.pd_full_tree || first_path);
          const index_t kids = branches ? width : (first_path ? 1 : 0);
          if (kids == 0) continue;
          sjd_children_job job;
          job.row = stale[sz(d - 1)];
          job.parent = level[li];
          job.kids = kids;
          job.depth = static_cast<std::uint32_t>(d);
          job.slot = static_cast<std::uint32_t>(64 * li);
          if (first_path && options.adaptive_continuation && d < stale_rows) {
            // AC: keep the old draft token at this position with min(1, R/q_old), else
            // resample from max(R - q_old, 0): the kept-or-resampled token has law R. q_old
            // is the row the old token was drawn from: its parent's q row (where the chain
            // below a side node meets the main path, not the chain's last node's row).
            const index_t old = stale[sz(d)];
            job.ac_old = tree.token(old);
            job.ac_from =
                fault == sjd_fault::junction_q_of_chain ? stale[sz(d - 1)] : tree.parent(old);
            if (fault == sjd_fault::residual_siblings) job.residual_from = tree.parent(old);
          }
          jobs.push_back(job);
          level_kids += kids;
        }
        if (Rows::defers_chain && jobs.size() - level_begin == 1 && level_kids == 1) {
          // One child: its node now, its token with the chain's other tokens later.
          deferring = true;
          deferred_nodes.push_back(next.add(jobs.back().parent, no_token, V));
          below.push_back(deferred_nodes.back());
        } else {
          if (deferring) {  // the deferred jobs first (in order), then this level's
            const std::vector<sjd_children_job> level_jobs(
                jobs.begin() + static_cast<std::ptrdiff_t>(level_begin), jobs.end());
            jobs.resize(level_begin);
            draw_jobs(draw_rng, true, nullptr);
            jobs = level_jobs;
            deferring = false;
          }
          draw_jobs(draw_rng, false, &below);
        }
      }
      if (below.empty()) break;
      level.swap(below);
    }
    if (deferring) draw_jobs(draw_rng, true, nullptr);
    rows.next_ready();
    // The new draft takes next's buffers, and next keeps the old draft's, which the next
    // step's reset() reuses: no allocation per step (the q rows alone are nodes x V floats).
    std::swap(draft, next);
  }
  trim_cache(m, static_cast<index_t>(seq.size()) - 1);
  result.assign(seq.begin() + prompt_len, seq.end());
}

}  // namespace detail

/// SJD / SJD-PAC decoding of up to `options.max_new_tokens` tokens after `prompt` (see file
/// comment). The model is restarted with `prefill(prompt)`. Adds to `*stats` when given.
/// `verify` is the exact tree verifier unless a test substitutes another. Arguments in the
/// loops' common order (docs/decoding.md): models, prompt, options, rng, verifier, stats,
/// control (cancellation between passes, decode/control.hpp).
template <session_model Model, verifier Verifier = tree_verifier<>>
std::vector<token_t> sjd_decode(Model& m, std::span<const token_t> prompt,
                                const sjd_options& options, request_rng rng,
                                const Verifier& verify = {}, decode_stats* stats = nullptr,
                                const request_control& control = {}) {
  std::vector<token_t> out;
  detail::decode_solo(
      m, static_cast<detail::no_draft*>(nullptr), stats,
      [&](decode_stats& st) {
        return detail::sjd_task(detail::solo<Model>{&m}, prompt, options, rng, verify, st, out,
                                detail::sjd_fault_of(options));
      },
      control);
  return out;
}

/// sjd_decode with the former argument order (stats before the verifier), kept: the two orders
/// cannot be confused (a `decode_stats*` is no verifier).
template <session_model Model, verifier Verifier = tree_verifier<>>
std::vector<token_t> sjd_decode(Model& m, std::span<const token_t> prompt,
                                const sjd_options& options, request_rng rng, decode_stats* stats,
                                const Verifier& verify = {}) {
  return sjd_decode(m, prompt, options, rng, verify, stats);
}

/// sjd_decode for several requests at once: request r decodes `prompts[r]` with `rngs[r]` as
/// request r of `m`, all requests' iterations sharing forward passes (decode/task.hpp); adds to
/// `stats[r]` when `stats` is given. Each output equals sjd_decode of that request alone.
/// `control` adds isolation, cancellation and per-request limits (decode/control.hpp).
template <batched_session_model Model, verifier Verifier = tree_verifier<>>
std::vector<std::vector<token_t>> sjd_decode_batch(
    Model& m, std::span<const std::vector<token_t>> prompts, const sjd_options& options,
    std::span<const request_rng> rngs, const Verifier& verify = {},
    std::span<decode_stats> stats = {}, const batch_control& control = {}) {
  std::vector<std::vector<token_t>> out(prompts.size());
  detail::decode_batch(
      m, static_cast<detail::no_draft*>(nullptr), m.batch_size(), prompts, rngs.size(), stats,
      [&](index_t r, decode_stats& st) {
        const auto i = static_cast<std::size_t>(r);
        return detail::sjd_task(detail::member<Model>{&m, r}, prompts[i],
                                detail::request_options(options, control, r), rngs[i], verify, st,
                                out[i], detail::sjd_fault_of(options));
      },
      control, m.vocab_size());
  return out;
}

/// sjd_decode_batch with the former argument order (stats before the verifier), kept.
template <batched_session_model Model, class Stats>
requires std::convertible_to<Stats&&, std::span<decode_stats>> std::vector<std::vector<token_t>>
sjd_decode_batch(Model& m, std::span<const std::vector<token_t>> prompts,
                 const sjd_options& options, std::span<const request_rng> rngs, Stats&& stats) {
  return sjd_decode_batch(m, prompts, options, rngs, tree_verifier<>{},
                          std::span<decode_stats>(std::forward<Stats>(stats)));
}
template <batched_session_model Model, verifier Verifier>
std::vector<std::vector<token_t>> sjd_decode_batch(
    Model& m, std::span<const std::vector<token_t>> prompts, const sjd_options& options,
    std::span<const request_rng> rngs, std::span<decode_stats> stats, const Verifier& verify) {
  return sjd_decode_batch(m, prompts, options, rngs, verify, stats);
}

}  // namespace specula
