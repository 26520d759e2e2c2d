#pragma once

/// @file
/// What every decoding loop reports: tokens, forward passes, step compression, wall time split
/// into model forward / verification / drafting, and the histogram of accepted drafts per step.

#include <chrono>
#include <cstdint>
#include <vector>

#include "specula/core/types.hpp"

namespace specula {

/// Statistics of one or more decoded requests (merge() adds requests together).
struct decode_stats {
  index_t tokens = 0;            ///< tokens generated
  index_t steps = 0;             ///< decoding steps (target forward passes that verified drafts)
  index_t target_forwards = 0;   ///< target-model forward passes (prefill excluded)
  index_t draft_forwards = 0;    ///< draft-model forward passes
  double forward_seconds = 0.0;  ///< target-model evaluation
  double verify_seconds = 0.0;   ///< logits -> probabilities and verification
  double draft_seconds = 0.0;    ///< drafting (draft-model evaluation and sampling)
  /// accepted_histogram[k]: steps that accepted k drafted tokens (each step also emits one
  /// corrected or bonus token, so it produced k + 1 tokens).
  std::vector<index_t> accepted_histogram;
  /// step_tokens[s]: tokens emitted by step s, in order (accepted drafts + 1, fewer when a stop
  /// token ends the step); merge() appends, so the entries of merged requests follow each other.
  std::vector<index_t> step_tokens;

  /// Tokens per target forward pass: the papers' step compression (1 for plain decoding).
  [[nodiscard]] double step_compression() const noexcept {
    return steps == 0 ? 0.0 : static_cast<double>(tokens) / static_cast<double>(steps);
  }
  /// Mean accepted drafts per step.
  [[nodiscard]] double mean_accepted() const noexcept {
    double s = 0.0;
    index_t n = 0;
    for (std::size_t k = 0; k < accepted_histogram.size(); ++k) {
      s += static_cast<double>(k) * static_cast<double>(accepted_histogram[k]);
      n += accepted_histogram[k];
    }
    return n == 0 ? 0.0 : s / static_cast<double>(n);
  }

  void record_step(index_t accepted) {
    if (accepted < 0) accepted = 0;
    if (static_cast<index_t>(accepted_histogram.size()) <= accepted)
      accepted_histogram.resize(static_cast<std::size_t>(accepted + 1), 0);
    ++accepted_histogram[static_cast<std::size_t>(accepted)];
    ++steps;
  }

  void merge(const decode_stats& o) {
    tokens += o.tokens;
    steps += o.steps;
    target_forwards += o.target_forwards;
    draft_forwards += o.draft_forwards;
    forward_seconds += o.forward_seconds;
    verify_seconds += o.verify_seconds;
    draft_seconds += o.draft_seconds;
    if (accepted_histogram.size() < o.accepted_histogram.size())
      accepted_histogram.resize(o.accepted_histogram.size(), 0);
    for (std::size_t k = 0; k < o.accepted_histogram.size(); ++k)
      accepted_histogram[k] += o.accepted_histogram[k];
    step_tokens.insert(step_tokens.end(), o.step_tokens.begin(), o.step_tokens.end());
  }
};

namespace detail {

/// Adds the wall time of a scope to a counter.
class scoped_timer {
 public:
  explicit scoped_timer(double& sink) : sink_(sink), t0_(std::chrono::steady_clock::now()) {}
  scoped_timer(const scoped_timer&) = delete;
  scoped_timer& operator=(const scoped_timer&) = delete;
  ~scoped_timer() {
    sink_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  double& sink_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace detail
}  // namespace specula
