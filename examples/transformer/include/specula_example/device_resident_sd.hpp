#pragma once

/// @file
/// `device_sd_ops`: the ops of `resident_speculative_decode` (resident_sd.hpp) on the GPU
/// (target `specula_example_cuda`). Logits, q rows and p rows stay on the device; per step the
/// host receives the drafted tokens (4 bytes per draw slot: the next draft pass's input and
/// the tree's shape; with draft_p_min 4 more per drafted row, its largest q entry), the accepted
/// count and the emitted tokens, and sends the passes' small inputs (tokens, positions, masks,
/// block tables), the random streams and the tree's parent list. `traffic()` adds them up.

#include <cstdint>
#include <memory>
#include <span>

#include "specula_example/device_transformer.hpp"
#include "specula_example/resident_sd.hpp"

namespace specula::example {

class device_sd_ops {
 public:
  device_sd_ops(const device_transformer& target, const device_transformer& draft);
  device_sd_ops(device_sd_ops&&) noexcept;
  device_sd_ops& operator=(device_sd_ops&&) noexcept;
  ~device_sd_ops();

  void start(std::span<const token_t> prompt, const resident_sd_options& options);
  [[nodiscard]] index_t draft_context() const noexcept;
  void draft_pass(const token_tree& tree, index_t commit, index_t first, index_t q_first);
  index_t sample(index_t u, index_t k, const request_rng& rng, std::span<token_t> out);
  /// With draft_p_min: the largest entry of q row u (4 bytes; fetched with the row's draw).
  float draft_max(index_t u);
  void target(const token_tree& tree);
  index_t verify(const token_tree& tree, const request_rng& rng, std::span<token_t> out);
  void commit_target(std::span<const index_t> path);
  void rollback_draft(index_t n);

  /// Bytes between host and device so far: both models' evaluations and the ops' own copies.
  [[nodiscard]] device_traffic traffic() const noexcept;

 private:
  struct state;
  void enqueue_row_max(index_t u);
  std::unique_ptr<state> s_;
};

static_assert(resident_sd_ops<device_sd_ops>);

}  // namespace specula::example
