#pragma once

/// @file
/// `session_batch`: several single-request models (one `session_model` per request) seen as one
/// `batched_session_model`. It lets the batched decoding loops run on a model that has no
/// batched forward pass (each listed request is evaluated in turn), and it is how the tests run
/// the batched loops on the toy models.

#include <span>
#include <string>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/tree/token_tree.hpp"

namespace specula {

/// One `session_model` per request, as a `batched_session_model` (see file comment). The
/// sessions are owned; `session(r)` gives access to request r's.
template <session_model M>
class session_batch {
 public:
  explicit session_batch(std::vector<M> sessions) : sessions_(std::move(sessions)) {
    for (std::size_t r = 1; r < sessions_.size(); ++r)
      if (static_cast<index_t>(sessions_[r].vocab_size()) != vocab_size())
        throw_if_failed({status::length_mismatch, static_cast<index_t>(r), -1,
                         static_cast<double>(sessions_[r].vocab_size())},
                        "sessions", "every session must have the same vocabulary");
  }

  /// The sessions' vocabulary size; 0 for a batch of no sessions (a valid, empty batch).
  [[nodiscard]] index_t vocab_size() const {
    return sessions_.empty() ? 0 : static_cast<index_t>(sessions_.front().vocab_size());
  }
  [[nodiscard]] index_t batch_size() const noexcept {
    return static_cast<index_t>(sessions_.size());
  }
  [[nodiscard]] M& session(index_t request) { return sessions_[checked(request)]; }

  /// Evaluates the listed requests' trees, rows concatenated in list order.
  void evaluate(std::span<const index_t> requests, std::span<const token_tree> trees,
                batch_view<float> logits) {
    if (requests.size() != trees.size())
      throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(trees.size())}, "trees",
                      "one tree per listed request");
    index_t total = 0;
    for (const token_tree& t : trees) total += t.size();
    if (logits.rows != total || logits.cols != vocab_size())
      throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(logits.rows)}, "logits",
                      ("needs " + std::to_string(total) + " rows").c_str());
    index_t row = 0;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      M& s = sessions_[checked(requests[i])];
      s.evaluate(trees[i],
                 batch_view<float>(logits.data + row * logits.cols, trees[i].size(), logits.cols));
      row += trees[i].size();
    }
  }
  void commit(index_t request, std::span<const index_t> path) {
    sessions_[checked(request)].commit(path);
  }
  void prefill(index_t request, std::span<const token_t> prompt) {
    sessions_[checked(request)].prefill(prompt);
  }
  [[nodiscard]] index_t context_size(index_t request) const {
    return sessions_[checked(request)].context_size();
  }
  void rollback(index_t request, index_t n) { sessions_[checked(request)].rollback(n); }

 private:
  [[nodiscard]] std::size_t checked(index_t request) const {
    if (request < 0 || request >= batch_size())
      throw_if_failed({status::invalid_parameter, request, -1, static_cast<double>(request)},
                      "request", "outside [0, batch_size)");
    return static_cast<std::size_t>(request);
  }

  std::vector<M> sessions_;
};

}  // namespace specula
