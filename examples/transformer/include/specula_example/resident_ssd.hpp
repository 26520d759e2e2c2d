#pragma once

/// @file
/// SSD (decode/ssd.hpp) with the logits kept where the model computes them:
/// `resident_ssd_decode(model, rows, ...)` runs the library's own loop (`detail::ssd_task`)
/// with a *resident rows policy* (`resident_ssd_rows`) that evaluates each pass itself and keeps
/// only each row's summary — its argmax and softmax probability (`detail::row_top`), all that
/// SSD reads of a row. On `device_transformer` the summaries are computed on the GPU
/// (`evaluate_sequences_tops`, `evaluate_cached_tops`: 16 bytes per row cross instead of the
/// row's 4 V); on the host transformer (the stand-in that CI runs) every row is summarised on
/// the host, as the device does. Chain and mix-order trees, without a cache or with the dual
/// cache. The output equals `ssd_decode`'s (and so stepwise decoding's) on the same model.
/// `resident_stepwise_decode`: the stepwise reference (SSD's baseline) the same way.

#include <span>
#include <vector>

#include "specula/decode/concepts.hpp"
#include "specula/decode/row_top.hpp"
#include "specula/decode/ssd.hpp"
#include "specula_example/resident_sd.hpp"

namespace specula::example {

/// The resident rows policy of `ssd_task` over `Model` (see file comment).
template <class Model>
class resident_ssd_rows {
 public:
  static constexpr bool resident = true;

  explicit resident_ssd_rows(const Model& m) : m_(&m) {}

  /// The pass of `plan` over the node sequences `tokens`: every row's summary.
  template <class Start>
  void pass(Start& start, const specula::detail::diffusion_pass_plan& plan,
            std::span<const token_t> tokens) {
    const index_t length = start.lay.length;
    if constexpr (dual_cache_model<Model>) {
      if (plan.cached) {
        // One dual_cache_pass per plan group, through its own cache, over the group's nodes.
        using cache_t = typename Model::dual_cache;
        specula::detail::pass_request req;
        req.kind = specula::detail::pass_kind::cached;
        req.length = length;
        req.groups = start.cached_groups(plan, tokens);
        passes_.clear();
        const index_t rows = req.append_cached(passes_);
        const auto passes = std::span<const dual_cache_pass<cache_t>>(passes_);
        tops_.resize(static_cast<std::size_t>(rows));
        if constexpr (requires { m_->evaluate_cached_tops(passes, std::span(tops_)); }) {
          m_->evaluate_cached_tops(passes, tops_);
        } else {
          logits_.resize(tops_.size() * static_cast<std::size_t>(plan.vocab));
          m_->evaluate_cached(passes, batch_view<float>(logits_.data(), rows, plan.vocab));
          summarise(plan.vocab);
        }
        return;
      }
    }
    tops_.resize(tokens.size());
    if constexpr (requires { m_->evaluate_sequences_tops(tokens, length, std::span(tops_)); }) {
      m_->evaluate_sequences_tops(tokens, length, tops_);
    } else {
      logits_.resize(tokens.size() * static_cast<std::size_t>(plan.vocab));
      m_->evaluate_sequences(
          tokens, length,
          batch_view<float>(logits_.data(), static_cast<index_t>(tokens.size()), plan.vocab));
      summarise(plan.vocab);
    }
  }

  /// Node u's row at sequence position pos.
  [[nodiscard]] specula::detail::row_top top(const specula::detail::diffusion_pass_plan& plan,
                                             index_t u, index_t pos) const {
    return tops_[static_cast<std::size_t>(plan.first_row(u) + pos - plan.first_position(u))];
  }

 private:
  void summarise(index_t vocab) {
    for (std::size_t r = 0; r < tops_.size(); ++r)
      tops_[r] =
          specula::detail::top_of(logits_.data() + r * static_cast<std::size_t>(vocab), vocab);
  }
  const Model* m_;
  std::vector<specula::detail::row_top> tops_;
  std::vector<float> logits_;  // the host stand-in's
  std::vector<dual_cache_pass<typename specula::detail::dual_cache_of<Model>::type>> passes_;
};

/// diffusion_stepwise_decode with `rows` (over the same model `m`) as the loop's resident rows
/// policy.
template <masked_model Model>
std::vector<token_t> resident_stepwise_decode(const Model& m, resident_ssd_rows<Model>& rows,
                                              std::span<const token_t> prompt,
                                              const ssd_options& options,
                                              decode_stats* stats = nullptr) {
  return detail::run_task(m, stats, [&](decode_stats& st, std::vector<token_t>& out) {
    return specula::detail::stepwise_task(m, prompt, options, st, out, &rows);
  });
}

/// ssd_decode with `rows` (over the same model `m`) as the loop's resident rows policy.
template <masked_model Model>
std::vector<token_t> resident_ssd_decode(const Model& m, resident_ssd_rows<Model>& rows,
                                         std::span<const token_t> prompt,
                                         const ssd_options& options,
                                         decode_stats* stats = nullptr) {
  return detail::run_task(m, stats, [&](decode_stats& st, std::vector<token_t>& out) {
    return specula::detail::ssd_task(m, prompt, options, st, out, &rows);
  });
}

}  // namespace specula::example
