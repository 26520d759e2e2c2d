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

  /// Bytes between host and device so far: the model's evaluations and the ops' own copies.
  [[nodiscard]] device_traffic traffic() const noexcept;

 private:
  index_t verify_exact(const token_tree& tree, const request_rng& rng,
                       std::vector<token_t>& out_tokens, std::vector<index_t>& out_nodes);
  struct state;
  std::unique_ptr<state> s_;
};

static_assert(session_model<device_sjd_ops>);

}  // namespace specula::example
