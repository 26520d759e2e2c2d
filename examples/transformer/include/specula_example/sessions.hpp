#pragma once

/// @file
/// The example transformer seen through specula's decoding concepts:
///
/// - `transformer_session`: one request, a `specula::model` (evaluate a token tree below the
///   committed context, commit an accepted path).
/// - `transformer_batch` (`basic_batch`): several requests evaluated in one forward pass, a
///   `specula::batched_session_model` (the batched decoding loops' model; `device_batch` on
///   the GPU).
/// - `transformer` itself is a `specula::masked_model` (whole-sequence evaluation with a mask
///   token) when its file is a bidirectional model.
///
/// The root (node 0) of every evaluated tree is the last committed token, which the cache does
/// not hold yet: `prefill(prompt)` commits all prompt tokens but the last, and the next tree's
/// root is the last prompt token; after `commit(path)` the next root is the emitted bonus token.

#include <span>
#include <vector>

#include "specula/decode/concepts.hpp"
#include "specula/decode/speculative.hpp"
#include "specula_example/transformer.hpp"

namespace specula::example {

/// One request of a model as a `specula::session_model`: `Model` (the host `transformer`, or
/// `device_transformer`) evaluates token trees below a `Cache` (`kv_cache`, `device_kv_cache`).
template <class Model, class Cache>
class basic_session {
 public:
  explicit basic_session(const Model& model) : model_(&model) {}

  [[nodiscard]] index_t vocab_size() const noexcept { return model_->vocab_size(); }
  [[nodiscard]] const Model& model() const noexcept { return *model_; }
  [[nodiscard]] Cache& cache() noexcept { return cache_; }
  [[nodiscard]] const Cache& cache() const noexcept { return cache_; }

  /// Starts a request: clears the cache and commits all of `prompt` but its last token, which
  /// becomes the root of the first evaluated tree.
  void prefill(std::span<const token_t> prompt) {
    if (prompt.empty()) throw_if_failed({status::empty_input, -1, -1, 0.0}, "prompt");
    cache_.clear();
    if (prompt.size() > 1) model_->prefill(cache_, prompt.first(prompt.size() - 1));
  }

  /// Committed tokens.
  [[nodiscard]] index_t context_size() const noexcept { return cache_.size(); }
  /// Keeps the first n committed tokens (drops any pending nodes).
  void rollback(index_t n) { cache_.rollback(n); }

  /// One logit row per node of `nodes` (node 0: the last committed token).
  void evaluate(const token_tree& nodes, batch_view<float> logits) {
    model_->evaluate_tree(cache_, nodes, logits);
  }

  /// Keeps the accepted root-to-node path (local node ids, root first) and rolls back the rest.
  void commit(std::span<const index_t> path) { cache_.commit(path); }

 private:
  const Model* model_;
  Cache cache_;
};

/// One request of a host transformer as a `specula::session_model`.
using transformer_session = basic_session<transformer, kv_cache>;

/// Several requests of one model, evaluated together (one forward pass per call), as a
/// `specula::batched_model`: `Model` (the host `transformer`, or `device_transformer`) evaluates
/// `Block`s (`node_block`, `device_node_block`) over `Cache`s.
template <class Model, class Cache, class Block>
class basic_batch {
 public:
  basic_batch(const Model& model, index_t batch)
      : model_(&model), caches_(static_cast<std::size_t>(batch)) {
    require_parameter(batch > 0, "batch", static_cast<double>(batch), "must be > 0");
  }

  [[nodiscard]] index_t vocab_size() const noexcept { return model_->vocab_size(); }
  [[nodiscard]] index_t batch_size() const noexcept { return static_cast<index_t>(caches_.size()); }
  [[nodiscard]] Cache& cache(index_t request) { return caches_.at(checked(request)); }

  /// Starts request `request` (see transformer_session::prefill).
  void prefill(index_t request, std::span<const token_t> prompt) {
    if (prompt.empty()) throw_if_failed({status::empty_input, request, -1, 0.0}, "prompt");
    Cache& c = caches_[checked(request)];
    c.clear();
    if (prompt.size() > 1) model_->prefill(c, prompt.first(prompt.size() - 1));
  }

  /// One forward pass over all requests' trees (one per request, in order); one logit row per
  /// node, requests' nodes concatenated.
  void evaluate(std::span<const token_tree> trees, batch_view<float> logits) {
    if (static_cast<index_t>(trees.size()) != batch_size())
      throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(trees.size())}, "trees",
                      "one tree per request");
    all_.resize(trees.size());
    for (std::size_t r = 0; r < trees.size(); ++r) all_[r] = static_cast<index_t>(r);
    evaluate(all_, trees, logits);
  }

  /// One forward pass over the listed requests' trees (distinct requests, any subset, in list
  /// order); one logit row per node, concatenated in list order.
  void evaluate(std::span<const index_t> requests, std::span<const token_tree> trees,
                batch_view<float> logits) {
    if (requests.size() != trees.size())
      throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(trees.size())}, "trees",
                      "one tree per listed request");
    storage_.resize(trees.size());
    blocks_.resize(trees.size());
    for (std::size_t i = 0; i < trees.size(); ++i) {
      for (std::size_t j = 0; j < i; ++j)
        if (requests[j] == requests[i])
          throw_if_failed({status::invalid_parameter, static_cast<index_t>(i), -1,
                           static_cast<double>(requests[i])},
                          "requests", "listed twice");
      blocks_[i] = tree_block<Block>(caches_[checked(requests[i])], trees[i], storage_[i]);
    }
    model_->evaluate(blocks_, logits);
  }

  /// Commits request `request`'s accepted path (see transformer_session::commit).
  void commit(index_t request, std::span<const index_t> path) {
    caches_[checked(request)].commit(path);
  }

  /// Committed tokens of request `request`.
  [[nodiscard]] index_t context_size(index_t request) const {
    return caches_[checked(request)].size();
  }
  /// Keeps the first n committed tokens of request `request`.
  void rollback(index_t request, index_t n) { caches_[checked(request)].rollback(n); }

 private:
  [[nodiscard]] std::size_t checked(index_t request) const {
    if (request < 0 || request >= batch_size())
      throw_if_failed({status::invalid_parameter, request, -1, static_cast<double>(request)},
                      "request", "outside [0, batch_size)");
    return static_cast<std::size_t>(request);
  }

  const Model* model_;
  std::vector<Cache> caches_;
  std::vector<tree_block_storage> storage_;
  std::vector<Block> blocks_;
  std::vector<index_t> all_;
};

/// Several requests of a host transformer, evaluated in one forward pass.
using transformer_batch = basic_batch<transformer, kv_cache, node_block>;

static_assert(session_model<transformer_session>);
static_assert(batched_session_model<transformer_batch>);
static_assert(masked_model<transformer>);

}  // namespace specula::example
