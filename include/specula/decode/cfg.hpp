#pragma once

/// @file
/// Classifier-free guidance inside the decoding loops, as a model adapter.
///
/// `cfg_model` wraps a batched model holding two requests per guided request — request r the
/// conditional stream, request r + B its unconditional twin (the same tokens after the null
/// condition, e.g. a null class label) — and presents B requests whose logit rows are
/// `cfg_mix_op{scale}(cond, uncond)`: u + scale * (c - u), each operation rounded on its own,
/// exactly as `logits_to_probs` mixes them. Both streams of every listed request are evaluated
/// in one call of the wrapped model (one forward batch), accepted paths are committed to both,
/// rollbacks applied to both.
///
/// Every loop that takes a `session_model` (B = 1) or a `batched_session_model` then decodes
/// the guided distribution: the loop's `sampling_params` (temperature, top-k, top-p, min-p)
/// apply to the mixed logits, which is the order `logits_to_probs` uses (CFG, temperature,
/// top-k, softmax, top-p, min-p), so a lossless loop samples exactly the law of the mixed,
/// filtered rows. Leave the loop's `cfg_scale` at 1: the mix happens here.
///
/// Prompts: `prefill(r, prompt)` starts the conditional stream with `prompt` and the
/// unconditional one with `make_uncond(prompt)` (for a class-conditional image model: the
/// prompt with its label token replaced by the null label). The two may differ in length; the
/// unconditional stream is kept at the same number of generated tokens. Until the first commit
/// after a prefill the root of a tree is the prompt's last token, which the unconditional
/// stream replaces by its own prompt's last token.

#include <cstddef>
#include <functional>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/core/validate.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/sample/transforms.hpp"
#include "specula/tree/token_tree.hpp"

namespace specula {

template <batched_session_model Inner>
class cfg_model {
 public:
  /// The unconditional prompt of a conditional one.
  using uncond_prompt_fn = std::function<std::vector<token_t>(std::span<const token_t>)>;

  /// `inner` must hold an even number of requests (2 B) and outlive the adapter; `scale` is
  /// the guidance scale (finite; 1 gives the conditional logits' bits back, 0 the
  /// unconditional ones).
  cfg_model(Inner& inner, float scale, uncond_prompt_fn make_uncond)
      : inner_(&inner), mix_{scale}, make_uncond_(std::move(make_uncond)) {
    require_parameter(detail::is_finite(scale), "scale", scale, "must be finite");
    const index_t n = inner.batch_size();
    require_parameter(n >= 2 && n % 2 == 0, "inner", static_cast<double>(n),
                      "batch_size must be even and positive (a conditional and an "
                      "unconditional request per guided request)");
    if (!make_uncond_) fail(status::empty_input, "make_uncond", 0, "must be callable");
    requests_.resize(static_cast<std::size_t>(n / 2));
  }

  [[nodiscard]] index_t vocab_size() const { return inner_->vocab_size(); }
  [[nodiscard]] index_t batch_size() const noexcept {
    return static_cast<index_t>(requests_.size());
  }
  [[nodiscard]] float scale() const noexcept { return mix_.scale; }

  // ----- batched_session_model -----

  void prefill(index_t request, std::span<const token_t> prompt) {
    auto& st = state(request);
    if (prompt.empty()) fail(status::empty_input, "prompt", 0, "must not be empty");
    const std::vector<token_t> uncond = make_uncond_(prompt);
    if (uncond.empty()) fail(status::empty_input, "make_uncond", 0, "returned an empty prompt");
    inner_->prefill(request, prompt);
    inner_->prefill(twin(request), uncond);
    st.prompt_context = inner_->context_size(request);
    st.offset = inner_->context_size(twin(request)) - st.prompt_context;
    st.uncond_root = uncond.back();
  }
  [[nodiscard]] index_t context_size(index_t request) const {
    (void)state(request);
    return inner_->context_size(request);
  }
  void rollback(index_t request, index_t n) {
    const auto& st = state(request);
    if (n < st.prompt_context)
      fail(status::invalid_parameter, "n", static_cast<double>(n),
           "cfg_model cannot roll back into the prompt");
    inner_->rollback(request, n);
    inner_->rollback(twin(request), n + st.offset);
  }
  void evaluate(std::span<const index_t> requests, std::span<const token_tree> trees,
                batch_view<float> logits) {
    if (requests.size() != trees.size())
      fail(status::length_mismatch, "trees", static_cast<double>(trees.size()),
           "needs one tree per listed request");
    both_.assign(requests.begin(), requests.end());
    pair_trees_.assign(trees.begin(), trees.end());
    index_t rows = 0;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const index_t r = requests[i];
      const auto& st = state(r);
      both_.push_back(twin(r));
      token_tree t = trees[i];
      if (inner_->context_size(r) == st.prompt_context) t.set_token(0, st.uncond_root);
      pair_trees_.push_back(std::move(t));
      rows += trees[i].size();
    }
    const index_t V = vocab_size();
    if (logits.rows != rows || logits.cols != V)
      fail(status::length_mismatch, "logits", static_cast<double>(logits.rows),
           "must be (total nodes) x vocab_size");
    both_rows_.resize(static_cast<std::size_t>(2 * rows * V));
    inner_->evaluate(both_, pair_trees_, batch_view<float>(both_rows_.data(), 2 * rows, V));
    const float* cond = both_rows_.data();
    const float* uncond = cond + rows * V;
    for (index_t i = 0; i < rows; ++i) {
      auto out = logits.row(i);
      for (index_t y = 0; y < V; ++y) out[y] = mix_(cond[i * V + y], uncond[i * V + y]);
    }
  }
  /// Commits the path to both streams; throws invalid_input ("inner") when they are not in step
  /// afterwards (a model bug: the unconditional stream's commit did not advance it).
  void commit(index_t request, std::span<const index_t> path) {
    const auto& st = state(request);
    inner_->commit(request, path);
    inner_->commit(twin(request), path);
    const index_t cond = inner_->context_size(request);
    const index_t uncond = inner_->context_size(twin(request));
    if (uncond != cond + st.offset)
      fail(status::length_mismatch, "inner", static_cast<double>(uncond),
           "the unconditional stream is not in step with the conditional one after commit");
  }

  // ----- session_model (request 0) -----

  void prefill(std::span<const token_t> prompt) { prefill(0, prompt); }
  [[nodiscard]] index_t context_size() const { return context_size(0); }
  void rollback(index_t n) { rollback(0, n); }
  void evaluate(const token_tree& nodes, batch_view<float> logits) {
    const index_t r = 0;
    evaluate(std::span<const index_t>(&r, 1), std::span<const token_tree>(&nodes, 1), logits);
  }
  void commit(std::span<const index_t> path) { commit(0, path); }

 private:
  struct request_state {
    index_t prompt_context = -1;  ///< committed tokens right after prefill (-1: not started)
    index_t offset = 0;           ///< unconditional minus conditional committed tokens
    token_t uncond_root = 0;      ///< the unconditional prompt's last token
  };

  [[nodiscard]] index_t twin(index_t request) const noexcept { return request + batch_size(); }
  [[nodiscard]] const request_state& state(index_t request) const {
    if (request < 0 || request >= batch_size())
      fail(status::invalid_parameter, "request", static_cast<double>(request),
           "outside [0, batch_size)");
    return requests_[static_cast<std::size_t>(request)];
  }
  request_state& state(index_t request) {
    return const_cast<request_state&>(std::as_const(*this).state(request));
  }

  [[noreturn]] static void fail(status code, const char* argument, double value, const char* why) {
    throw_if_failed(diagnostic{code, -1, -1, value}, argument, why);
    throw std::logic_error("unreachable");
  }

  Inner* inner_;
  cfg_mix_op mix_;
  uncond_prompt_fn make_uncond_;
  std::vector<request_state> requests_;
  std::vector<index_t> both_;
  std::vector<token_tree> pair_trees_;
  std::vector<float> both_rows_;
};

}  // namespace specula
