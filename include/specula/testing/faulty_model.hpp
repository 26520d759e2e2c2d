#pragma once

/// @file
/// Fault injection for the decoding loops: `faulty_session` wraps a `session_model` and
/// misbehaves at a chosen call, `faulty_masked` wraps a `masked_model`. The fault kinds are the
/// ones docs/decoding.md's fault model covers: an exception from a call, a non-finite or empty
/// logit row, a `commit` that does nothing or throws after committing, a `rollback` that
/// throws, a changed `vocab_size()`. With `sticky` the fault repeats at every later call of
/// the same kind (a broken request); without it, it happens once (a transient fault).

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>

#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/tree/token_tree.hpp"

namespace specula::testing {

/// What a faulty model does wrong (see file comment).
enum class fault_kind : std::uint8_t {
  none,
  evaluate_throws,  ///< `evaluate` throws `injected_fault` (before writing anything)
  nan_logit,        ///< `evaluate` writes a NaN at (row, column) of its rows
  inf_logit,        ///< `evaluate` writes +inf at (row, column)
  empty_row,        ///< `evaluate` writes -inf over the whole row `row`
  commit_ignored,   ///< `commit` does nothing (context_size() does not advance)
  commit_throws,    ///< `commit` commits, then throws
  rollback_throws,  ///< `rollback` throws (before rolling back)
  prefill_throws,   ///< `prefill` throws
  vocab_changes,    ///< `vocab_size()` reports one token more from the faulty call on
};
inline constexpr int fault_kind_count = 10;

/// The exception a faulty model throws.
struct injected_fault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// When and where a fault happens: at the `at`-th call (from 1) of the faulty kind's operation
/// (`evaluate` for the row faults and vocab_changes), rows and columns taken modulo the pass's.
struct fault_plan {
  fault_kind kind = fault_kind::none;
  std::int64_t at = 0;
  index_t row = 0;
  index_t column = 0;
  bool sticky = false;
};

namespace detail {
inline bool fault_due(const fault_plan& p, std::int64_t call) {
  return p.at > 0 && (call == p.at || (p.sticky && call > p.at));
}
inline void spoil_rows(const fault_plan& p, batch_view<float> logits) {
  if (logits.rows <= 0 || logits.cols <= 0) return;
  const index_t r = p.row % logits.rows;
  const index_t c = p.column % logits.cols;
  auto row = logits.row(r);
  if (p.kind == fault_kind::nan_logit) row[c] = std::numeric_limits<float>::quiet_NaN();
  if (p.kind == fault_kind::inf_logit) row[c] = std::numeric_limits<float>::infinity();
  if (p.kind == fault_kind::empty_row)
    for (index_t y = 0; y < logits.cols; ++y) row[y] = -std::numeric_limits<float>::infinity();
}
inline bool is_row_fault(fault_kind k) {
  return k == fault_kind::nan_logit || k == fault_kind::inf_logit || k == fault_kind::empty_row;
}
}  // namespace detail

/// A session model that misbehaves as `plan` says (see file comment); counts its calls.
template <class M>
class faulty_session {
 public:
  explicit faulty_session(M inner, fault_plan plan = {}) : inner_(std::move(inner)), plan_(plan) {}

  [[nodiscard]] index_t vocab_size() const {
    const index_t v = inner_.vocab_size();
    return plan_.kind == fault_kind::vocab_changes && detail::fault_due(plan_, evaluates_ + 1)
               ? v + 1
               : v;
  }
  [[nodiscard]] index_t context_size() const { return inner_.context_size(); }

  void prefill(std::span<const token_t> prompt) {
    ++prefills_;
    if (plan_.kind == fault_kind::prefill_throws && detail::fault_due(plan_, prefills_))
      throw injected_fault("injected prefill fault");
    inner_.prefill(prompt);
  }
  void evaluate(const token_tree& nodes, batch_view<float> logits) {
    ++evaluates_;
    const bool due = detail::fault_due(plan_, evaluates_);
    if (due && plan_.kind == fault_kind::evaluate_throws)
      throw injected_fault("injected evaluate fault");
    inner_.evaluate(nodes, logits);
    if (due && detail::is_row_fault(plan_.kind)) detail::spoil_rows(plan_, logits);
  }
  void commit(std::span<const index_t> path) {
    ++commits_;
    const bool due = detail::fault_due(plan_, commits_);
    if (due && plan_.kind == fault_kind::commit_ignored) return;
    inner_.commit(path);
    if (due && plan_.kind == fault_kind::commit_throws)
      throw injected_fault("injected commit fault");
  }
  void rollback(index_t n) {
    ++rollbacks_;
    if (plan_.kind == fault_kind::rollback_throws && detail::fault_due(plan_, rollbacks_))
      throw injected_fault("injected rollback fault");
    inner_.rollback(n);
  }

  [[nodiscard]] M& inner() noexcept { return inner_; }
  [[nodiscard]] const M& inner() const noexcept { return inner_; }
  [[nodiscard]] fault_plan& plan() noexcept { return plan_; }
  /// Calls so far of each operation.
  [[nodiscard]] std::int64_t evaluates() const noexcept { return evaluates_; }
  [[nodiscard]] std::int64_t commits() const noexcept { return commits_; }
  [[nodiscard]] std::int64_t rollbacks() const noexcept { return rollbacks_; }
  [[nodiscard]] std::int64_t prefills() const noexcept { return prefills_; }
  /// Restarts the call counts (the plan's `at` counts from here).
  void reset_counts() noexcept { evaluates_ = commits_ = rollbacks_ = prefills_ = 0; }

 private:
  M inner_;
  fault_plan plan_;
  std::int64_t evaluates_ = 0, commits_ = 0, rollbacks_ = 0, prefills_ = 0;
};

namespace detail {
/// The wrapped model's `dual_cache` type, when it has one.
template <class M>
struct dual_cache_of {};
template <class M>
requires requires { typename M::dual_cache; }
struct dual_cache_of<M> {
  using dual_cache = typename M::dual_cache;
};
}  // namespace detail

/// A masked model that misbehaves in `evaluate_sequences` (and, wrapping a `dual_cache_model`,
/// in `evaluate_cached`) as `plan` says (evaluate_throws and the row faults; rows counted over
/// the whole call; both kinds of call counted together).
template <class M>
class faulty_masked : public detail::dual_cache_of<M> {
 public:
  explicit faulty_masked(M inner, fault_plan plan = {}) : inner_(std::move(inner)), plan_(plan) {}
  [[nodiscard]] index_t vocab_size() const { return inner_.vocab_size(); }
  [[nodiscard]] token_t mask_token() const { return inner_.mask_token(); }
  void evaluate_sequences(std::span<const token_t> tokens, index_t length,
                          batch_view<float> logits) const {
    pass(logits, [&] { inner_.evaluate_sequences(tokens, length, logits); });
  }
  template <class C = M>
  requires requires { typename C::dual_cache; }
  void evaluate_cached(std::span<const dual_cache_pass<typename C::dual_cache>> passes,
                       batch_view<float> logits) const {
    pass(logits, [&] { inner_.evaluate_cached(passes, logits); });
  }
  [[nodiscard]] fault_plan& plan() noexcept { return plan_; }
  [[nodiscard]] std::int64_t evaluates() const noexcept { return evaluates_; }
  void reset_counts() noexcept { evaluates_ = 0; }

 private:
  /// One evaluation call: `evaluate()` writes `logits`, unless the plan's fault is due.
  template <class Evaluate>
  void pass(batch_view<float> logits, Evaluate&& evaluate) const {
    ++evaluates_;
    const bool due = detail::fault_due(plan_, evaluates_);
    if (due && plan_.kind == fault_kind::evaluate_throws)
      throw injected_fault("injected evaluate fault");
    evaluate();
    if (due && detail::is_row_fault(plan_.kind)) detail::spoil_rows(plan_, logits);
  }

  M inner_;
  fault_plan plan_;
  mutable std::int64_t evaluates_ = 0;
};

}  // namespace specula::testing
