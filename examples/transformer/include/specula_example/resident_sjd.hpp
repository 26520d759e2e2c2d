#pragma once

/// @file
/// SJD and SJD-PAC (decode/sjd.hpp) with the probability rows kept where the model computes
/// them: `resident_sjd_decode(ops, ...)` runs the library's own loop (`detail::sjd_task`) with
/// `ops` as both its model and its *resident rows policy* (see `detail::sjd_host_rows`): the
/// loop holds the draft's tokens and shape only; the ops own the model's session, the p rows of
/// the last pass and the q rows of the current and the next draft.
///
/// - `host_sjd_ops`: the host stand-in (host transformer, rows in host memory), so CI runs the
///   resident plumbing — the forward pass and verification by the ops, the accepted path
///   recovered from the emitted tokens, the chain below the Proactive Drafting tree drawn as one
///   batch, the q-row buffers swapped — without a GPU;
/// - `device_sjd_ops` (device_resident_sjd.hpp, CUDA builds): the same on the GPU —
///   `specula::cuda::logits_to_probs_async` for p, one launch per batch of draw jobs (the
///   library's `detail::sjd_draw_children`, host+device), `specula::cuda::verify_tree_async`.
///
/// Both make the draws of `sjd_decode` from the same rows with the same draw ids, so on the
/// host the output equals `sjd_decode`'s token for token (tested), and on the device it does
/// except where a draw falls within float rounding of a boundary. Supported: everything but the
/// spatial priors (they read committed rows on the host: refused, "init").
///
/// The same ops serve multi-block decoding's stochastic variant (`resident_multiblock_decode`
/// with them; decode/multiblock.hpp): its window is a chain whose stale positions are SJD's
/// Adaptive Continuation draws (jobs of one child), so the ops are its resident rows policy
/// (`specula::detail::window_rows_policy`): the p rows of the pass and the q rows of the current
/// and the next window stay with them; the rows set without a draw (copies, one-hot and uniform
/// fills, the context law of `jacobi_init::sample_context`, counted from the committed tokens
/// the loop hands over) are written by them too.
///
/// And speculative decoding with a deterministic proposal (the n-gram / prompt-lookup drafter,
/// `resident_proposal_decode`; decode/lookup.hpp): the drafts come from the committed tokens on
/// the host, the ops keep the target's p rows and verify the drafts as one-hot proposals.

#include <algorithm>
#include <span>
#include <vector>

#include "specula/decode/lookup.hpp"
#include "specula/decode/multiblock.hpp"
#include "specula/decode/sjd.hpp"
#include "specula/decode/step.hpp"
#include "specula/sample/transforms.hpp"
#include "specula_example/resident_sd.hpp"
#include "specula_example/sessions.hpp"

namespace specula::example {

namespace detail {

/// Refuses what the resident rows policies do not support (the spatial priors).
inline void check_resident_sjd_options(const sjd_options& o) {
  require_parameter(o.init == sjd_init::uniform_q || o.init == sjd_init::one_hot_q, "init",
                    static_cast<double>(o.init),
                    "resident SJD initialises with uniform_q or one_hot_q only (the spatial "
                    "priors read committed rows on the host)");
}

/// Rows of a multi-block window (blocks of the largest window, and the tree's leaf).
inline index_t window_capacity(const multiblock_options& o) {
  return o.max_blocks * o.block_size + 1;
}

/// Refuses a window row the ops cannot write: a row outside the window reserved by start(), a
/// copy from outside it, a context law of another length than the context handed over.
inline void check_window_row(const specula::detail::window_row& r, index_t rows,
                             std::size_t context) {
  const bool law = r.from == specula::detail::window_row::context_law;
  require_parameter(r.at >= 0 && r.at < rows && r.from < rows && (r.from >= -1 || law), "rows",
                    static_cast<double>(r.at),
                    "a window row outside the window reserved by start()");
  require_parameter(!law || static_cast<std::size_t>(r.end) == context, "rows",
                    static_cast<double>(r.end), "a context law of another length than the context");
}

/// The q row of a random initialisation (uniform over the init tokens, or one-hot at x).
inline void init_q_row(const sjd_options& o, index_t V, token_t x, std::span<float> row) {
  std::fill(row.begin(), row.end(), 0.0f);
  if (o.init == sjd_init::one_hot_q) {
    row[static_cast<std::size_t>(x)] = 1.0f;
    return;
  }
  const specula::detail::sjd_init_tokens range(o, V);
  std::fill(row.begin() + range.begin, row.begin() + range.end, range.uniform_probability());
}

}  // namespace detail

/// SJD / SJD-PAC decoding of up to `options.max_new_tokens` tokens after `prompt` with the
/// resident ops `ops` (see file comment); arguments as `sjd_decode`'s. The device ops verify
/// with the exact rule only.
template <class Ops, verifier Verifier = tree_verifier<>>
std::vector<token_t> resident_sjd_decode(Ops& ops, std::span<const token_t> prompt,
                                         const sjd_options& options, request_rng rng,
                                         const Verifier& verify = {},
                                         decode_stats* stats = nullptr) {
  return detail::run_task(ops, stats, [&](decode_stats& st, std::vector<token_t>& out) {
    return specula::detail::sjd_task(specula::detail::solo<Ops>{&ops}, prompt, options, rng, verify,
                                     st, out, specula::detail::sjd_fault_of(options), &ops);
  });
}

/// multiblock_decode's stochastic variant (decode/multiblock.hpp) with the resident ops `ops`
/// (host_sjd_ops, device_sjd_ops) as the loop's model and rows policy (see file comment);
/// arguments as `multiblock_decode`'s. The device ops verify with the exact rule only.
template <specula::detail::window_rows_policy Ops, verifier Verifier = tree_verifier<>>
std::vector<token_t> resident_multiblock_decode(Ops& ops, std::span<const token_t> prompt,
                                                const multiblock_options& options,
                                                request_rng rng = {}, const Verifier& verify = {},
                                                decode_stats* stats = nullptr) {
  return detail::run_task(ops, stats, [&](decode_stats& st, std::vector<token_t>& out) {
    return specula::detail::multiblock_task(specula::detail::solo<Ops>{&ops}, prompt, options, rng,
                                            verify, st, out, &ops);
  });
}

/// speculative_decode with the deterministic proposal `draft` (e.g. ngram_proposal) and the
/// resident ops `ops` (host_sjd_ops, device_sjd_ops) as the target model and its rows policy (see
/// file comment); arguments as speculative_decode's. A proposal that writes q rows is refused.
/// The device ops verify with the exact rule only (greedy decoding: top-k = 1 target rows).
template <class Ops, proposal Proposal, verifier Verifier = tree_verifier<>>
std::vector<token_t> resident_proposal_decode(Ops& ops, Proposal& draft,
                                              std::span<const token_t> prompt,
                                              const speculative_options& options, request_rng rng,
                                              const Verifier& verify = {},
                                              decode_stats* stats = nullptr) {
  return detail::run_task(ops, stats, [&](decode_stats& st, std::vector<token_t>& out) {
    return specula::detail::proposal_task(specula::detail::solo<Ops>{&ops}, draft, prompt, options,
                                          rng, verify, st, out, &ops);
  });
}

/// The host stand-in of `device_sjd_ops` (see file comment).
class host_sjd_ops : public resident_session<transformer_session> {
 public:
  static constexpr bool resident = true;
  static constexpr bool defers_chain = true;

  explicit host_sjd_ops(const transformer& model)
      : resident_session(model), V_(model.vocab_size()) {}

  // The rows policy (detail::sjd_host_rows describes each operation).
  void start(index_t, const sjd_options& options) {
    detail::check_resident_sjd_options(options);
    options_ = options;
    reserve(options.draft_budget() + 1, options.target);
  }
  /// Multi-block's stochastic window (specula::detail::window_host_rows describes the rows).
  void start(index_t, const multiblock_options& options) {
    reserve(detail::window_capacity(options), options.target);
    context_counts_.assign(static_cast<std::size_t>(V_), 0);
    counted_ = 0;
  }
  token_t init_child(specula::detail::sjd_draft&, index_t parent,
                     const specula::detail::sjd_init_context&, double u) {
    const token_t x = specula::detail::sjd_init_tokens(options_, V_).token(u);
    detail::init_q_row(options_, V_, x, row(q_next_, parent));
    return x;
  }
  void move_q(specula::detail::sjd_draft&, index_t from, index_t to) {
    std::copy_n(row(q_, from).begin(), V_, row(q_, to).begin());
  }
  void target(const token_tree& tree) {
    const auto n = static_cast<std::size_t>(tree.size() * V_);
    if (p_.size() < n) p_.resize(n);  // proposal drafts: as many rows as the tree
    logits_.resize(n);
    session_.evaluate(tree, batch_view<float>(logits_.data(), tree.size(), V_));
    specula::detail::rows_to_probs(target_, logits_, std::span<float>(p_).first(n), scratch_, V_);
  }
  template <class Verifier>
  index_t verify(const Verifier& verifier, const token_tree& tree, specula::detail::sjd_draft&,
                 const sampling_params&, const request_rng& rng, std::vector<token_t>& out_tokens,
                 std::vector<index_t>& out_nodes) {
    const auto n = static_cast<std::size_t>(tree.size() * V_);
    const index_t k =
        specula::detail::verify_with_leaves(verifier, tree, V_, std::span<const float>(p_).first(n),
                                            std::span<float>(q_).first(n), rng, out_tokens, nodes_);
    // As the device ops: the accepted path from the emitted tokens alone.
    detail::accepted_path(tree, out_tokens, k, out_nodes);
    return k;
  }
  [[nodiscard]] std::span<const float> p_row(index_t) const noexcept { return {}; }
  void draw(const specula::detail::sjd_draft&, specula::detail::sjd_draft&,
            std::span<const specula::detail::sjd_children_job> jobs, std::span<token_t> tokens,
            std::span<index_t> counts, const request_rng& rng) {
    specula::detail::sjd_draw_jobs(jobs, p_.data(), q_.data(), q_next_.data(), V_, rng, tokens,
                                   counts);
  }
  void next_ready() noexcept { q_.swap(q_next_); }

  /// A deterministic proposal's drafts (resident_proposal_decode): p rows only.
  void start(index_t, const speculative_options& options) {
    target_ = options.target;
    scratch_.resize(static_cast<std::size_t>(V_));
  }
  template <class Verifier>
  index_t verify_drafts(const Verifier& verifier, const token_tree& tree, const request_rng& rng,
                        std::vector<token_t>& out_tokens, std::vector<index_t>& out_nodes) {
    const auto n = static_cast<std::size_t>(tree.size() * V_);
    const index_t k = specula::detail::verify_one(
        verifier, tree, V_, std::span<const float>(p_).first(n), {}, rng, out_tokens, nodes_);
    detail::accepted_path(tree, out_tokens, k, out_nodes);  // as the device ops
    return k;
  }

  // Multi-block's stochastic window: the same rows (window row u = q row u).
  template <class Verifier>
  index_t verify_window(const Verifier& verifier, const token_tree& tree, const request_rng& rng,
                        std::vector<token_t>& out_tokens, std::vector<index_t>& out_nodes) {
    // As the device ops: the leaf's q row takes its p row in place, the window's is kept aside.
    const auto leaf = row(q_, tree.size() - 1);
    kept_.assign(leaf.begin(), leaf.end());
    specula::detail::sjd_draft unused;
    const index_t k = verify(verifier, tree, unused, target_, rng, out_tokens, out_nodes);
    std::copy(kept_.begin(), kept_.end(), leaf.begin());
    return k;
  }
  void draw(std::span<const specula::detail::sjd_children_job> jobs, std::span<token_t> tokens,
            std::span<index_t> counts, const request_rng& rng) {
    specula::detail::sjd_draw_jobs(jobs, p_.data(), q_.data(), q_next_.data(), V_, rng, tokens,
                                   counts);
  }
  void write_rows(bool next, std::span<const specula::detail::window_row> rows,
                  std::span<const token_t> context) {
    // As the device ops: the context's token counts grow with the tokens not yet counted.
    for (; counted_ < context.size(); ++counted_)
      if (context[counted_] >= 0 && context[counted_] < V_)
        ++context_counts_[static_cast<std::size_t>(context[counted_])];
    const index_t capacity = static_cast<index_t>(q_.size()) / V_;
    for (const auto& r : rows) {
      detail::check_window_row(r, capacity, context.size());
      auto to = row(next ? q_next_ : q_, r.at);
      for (index_t y = 0; y < V_; ++y)
        to[static_cast<std::size_t>(y)] =
            specula::detail::window_row_entry(r, q_.data(), context_counts_.data(), V_, y);
    }
  }

 private:
  void reserve(index_t rows, const sampling_params& target) {
    target_ = target;
    const auto n = static_cast<std::size_t>(rows * V_);
    p_.assign(n, 0.0f);
    q_.assign(n, 0.0f);
    q_next_.assign(n, 0.0f);
    scratch_.resize(static_cast<std::size_t>(V_));
  }
  std::span<float> row(std::vector<float>& rows, index_t u) {
    return std::span<float>(rows).subspan(static_cast<std::size_t>(u * V_),
                                          static_cast<std::size_t>(V_));
  }
  index_t V_;
  sjd_options options_;
  sampling_params target_{};
  std::vector<float> logits_, p_, q_, q_next_, scratch_, kept_;
  std::vector<index_t> nodes_;
  std::vector<std::int32_t> context_counts_;
  std::size_t counted_ = 0;
};

static_assert(session_model<host_sjd_ops>);
static_assert(specula::detail::window_rows_policy<host_sjd_ops>);

}  // namespace specula::example
