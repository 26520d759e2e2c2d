#pragma once

/// @file
/// `device_sjd_ops`: the model and resident rows policy of `resident_sjd_decode`
/// (resident_sjd.hpp) on the GPU (target `specula_example_cuda`). The p rows of the last pass
/// and the q rows of the current and the next draft stay on the device. Per iteration the host
/// sends the pass's small inputs, the tree (parents, tokens) and the random stream for the
/// verification, and the draw jobs (56 bytes each) with the drafting stream; it receives the
/// accepted count and the output tokens (4 + 4 n bytes for n nodes) and, per batch of draw
/// jobs, their counts and tokens (4 bytes per job and per child slot) — never a row.
/// `traffic()` adds them up. Verification: the exact rule only.
///
/// Multi-block's stochastic variant (`resident_multiblock_decode` with these ops): the p rows
/// and the current and next window's q rows stay on the device. Per step the host receives the
/// accepted count and the output tokens (4 + 4 n bytes for a chain of n nodes) and, for the one
/// batch of stale-position draws, a count and a token per position (8 bytes each); it sends the
/// pass's inputs, the chain (32 + 12 n bytes), the draw jobs (16 + 56 per position) and the rows
/// set without a draw (20 bytes each: copies, one-hot or uniform fills; with the context law,
/// the tokens committed since the last count, 4 bytes each).
///
/// A deterministic proposal's drafts (`resident_proposal_decode`, the n-gram / prompt-lookup
/// drafter): the p rows stay on the device; per step the host sends the pass's inputs and the
/// draft tree (32 + 12 n bytes for n nodes) and receives the accepted count and the output
/// tokens (4 + 4 n bytes).

#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "specula_example/device_transformer.hpp"
#include "specula_example/resident_sjd.hpp"

namespace specula::example {

class device_sjd_ops {
 public:
  static constexpr bool resident = true;
  static constexpr bool defers_chain = true;

  explicit device_sjd_ops(const device_transformer& model);
  device_sjd_ops(device_sjd_ops&&) noexcept;
  device_sjd_ops& operator=(device_sjd_ops&&) noexcept;
  ~device_sjd_ops();

  // The model, as the loop's handle sees it (a session_model).
  [[nodiscard]] index_t vocab_size() const noexcept;
  void prefill(std::span<const token_t> prompt);
  [[nodiscard]] index_t context_size() const noexcept;
  void rollback(index_t n);
  void evaluate(const token_tree& tree, batch_view<float> logits);
  void commit(std::span<const index_t> path);

  // The rows policy (specula::detail::sjd_host_rows describes each operation).
  void start(index_t vocab, const sjd_options& options);
  token_t init_child(specula::detail::sjd_draft& next, index_t parent,
                     const specula::detail::sjd_init_context& ctx, double u);
  void move_q(specula::detail::sjd_draft& draft, index_t from, index_t to);
  void target(const token_tree& tree);
  template <class Verifier>
  index_t verify(const Verifier&, const token_tree& tree, specula::detail::sjd_draft&,
                 const sampling_params&, const request_rng& rng, std::vector<token_t>& out_tokens,
                 std::vector<index_t>& out_nodes) {
    static_assert(std::is_same_v<Verifier, tree_verifier<>>,
                  "the device ops verify with the exact rule (tree_verifier<>)");
    return verify_exact(tree, rng, out_tokens, out_nodes);
  }
  [[nodiscard]] std::span<const float> p_row(index_t) const noexcept { return {}; }
  void draw(const specula::detail::sjd_draft& draft, specula::detail::sjd_draft& next,
            std::span<const specula::detail::sjd_children_job> jobs, std::span<token_t> tokens,
            std::span<index_t> counts, const request_rng& rng);
  void next_ready() noexcept;

  // A deterministic proposal's drafts (specula::detail::proposal_host_rows describes each).
  void start(index_t vocab, const speculative_options& options);
  template <class Verifier>
  index_t verify_drafts(const Verifier&, const token_tree& tree, const request_rng& rng,
                        std::vector<token_t>& out_tokens, std::vector<index_t>& out_nodes) {
    static_assert(std::is_same_v<Verifier, tree_verifier<>>,
                  "the device ops verify with the exact rule (tree_verifier<>)");
    return verify_drafts_exact(tree, rng, out_tokens, out_nodes);
  }

  // Multi-block's stochastic window (specula::detail::window_host_rows describes each).
  void start(index_t vocab, const multiblock_options& options);
  template <class Verifier>
  index_t verify_window(const Verifier&, const token_tree& tree, const request_rng& rng,
                        std::vector<token_t>& out_tokens, std::vector<index_t>& out_nodes) {
    static_assert(std::is_same_v<Verifier, tree_verifier<>>,
                  "the device ops verify with the exact rule (tree_verifier<>)");
    return verify_window_exact(tree, rng, out_tokens, out_nodes);
  }
  void draw(std::span<const specula::detail::sjd_children_job> jobs, std::span<token_t> tokens,
            std::span<index_t> counts, const request_rng& rng);
  void write_rows(bool next, std::span<const specula::detail::window_row> rows,
                  std::span<const token_t> context);

  /// Bytes between host and device so far: the model's evaluations and the ops' own copies.
  [[nodiscard]] device_traffic traffic() const noexcept;

 private:
  index_t verify_exact(const token_tree& tree, const request_rng& rng,
                       std::vector<token_t>& out_tokens, std::vector<index_t>& out_nodes);
  index_t verify_window_exact(const token_tree& tree, const request_rng& rng,
                              std::vector<token_t>& out_tokens, std::vector<index_t>& out_nodes);
  index_t verify_drafts_exact(const token_tree& tree, const request_rng& rng,
                              std::vector<token_t>& out_tokens, std::vector<index_t>& out_nodes);
  struct state;
  std::unique_ptr<state> s_;
};

static_assert(session_model<device_sjd_ops>);
static_assert(specula::detail::window_rows_policy<device_sjd_ops>);

}  // namespace specula::example
