#pragma once

/// @file
/// LANTERN / LANTERN++ relaxed acceptance through latent neighbours of image tokens
/// (Cool-SD Eq. 3–6, describing LANTERN++), with the neighbour-table builder.
///
/// For a drafted token x̃ the neighbour set A^{k,λ}(x̃) is taken from x̃'s k nearest codebook
/// neighbours (precomputed, nearest first): neighbours are added in order while their summed
/// target probability stays ≤ λ·p(x̃) (LANTERN++, relative mode) or ≤ δ (LANTERN, absolute
/// mode); the walk stops at the first neighbour that would exceed the limit. The acceptance
/// probability is f(x̃) = min(1, (p(x̃) + Σ_{A} p) / q(x̃)) (Eq. 5). After a rejection the rule
/// resamples from G* = Norm([p − q·f]+) (Cool-SD Eq. 10, the default; f evaluated at every
/// token y with its own neighbour set), G_van = Norm([p − q]+), or LANTERN++'s own
/// Norm([P^{k,λ} − q]+) (Eq. 6), where P^{k,λ} moves the neighbours' mass onto x̃.
///
/// This is a row-aware rule (see rules/rule.hpp): it needs the whole target row. Not lossless.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "specula/core/config.hpp"
#include "specula/core/error.hpp"
#include "specula/core/numeric.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/rules/relaxed.hpp"

namespace specula {

/// Largest neighbour count a lantern_rule supports per token.
inline constexpr index_t lantern_max_neighbours = 64;

/// Read-only view of a neighbour table: row t lists token t's k nearest other tokens, nearest
/// first. Trivially copyable.
struct neighbour_table_view {
  const token_t* ids = nullptr;
  index_t vocab = 0;
  index_t k = 0;
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr const token_t* of(index_t token) const noexcept {
    return ids + token * k;
  }
};

/// Distance used to rank neighbours.
enum class neighbour_metric : std::uint8_t {
  l2,      ///< Euclidean distance between raw embedding rows (as LANTERN's code does)
  cosine,  ///< 1 − cosine similarity
};

/// Owning neighbour table built from a codebook embedding matrix.
class neighbour_table {
 public:
  /// For every token t of `embeddings` (V rows of dimension d), its k nearest other tokens by
  /// `metric`, nearest first, ties broken by the lower token id. O(V²·d) time, V·k memory.
  /// Throws invalid_input for k outside [1, min(V − 1, lantern_max_neighbours)], an empty
  /// matrix, or non-finite entries (naming the row and column).
  neighbour_table(batch_view<const float> embeddings, index_t k,
                  neighbour_metric metric = neighbour_metric::l2)
      : vocab_(embeddings.rows), k_(k) {
    if (embeddings.rows < 2 || embeddings.cols < 1)
      throw_if_failed({status::empty_input, -1, -1, static_cast<double>(embeddings.rows)},
                      "embeddings", "needs at least 2 rows of dimension >= 1");
    require_parameter(
        k >= 1 && k < vocab_ && k <= lantern_max_neighbours, "k", static_cast<double>(k),
        ("must be in [1, min(V - 1, " + std::to_string(lantern_max_neighbours) + ")]").c_str());
    const index_t d = embeddings.cols;
    std::vector<double> norm(static_cast<std::size_t>(vocab_), 1.0);
    for (index_t t = 0; t < vocab_; ++t) {
      double s = 0;
      for (index_t j = 0; j < d; ++j) {
        const double v = embeddings.row(t)[j];
        if (!detail::is_finite(v))
          throw_if_failed({status::inf_value, t, j, v}, "embeddings", "entries must be finite");
        s += v * v;
      }
      if (metric == neighbour_metric::cosine)
        norm[static_cast<std::size_t>(t)] = s > 0 ? std::sqrt(s) : 1.0;
    }
    ids_.resize(static_cast<std::size_t>(vocab_ * k_));
    std::vector<std::pair<double, token_t>> best;
    best.reserve(static_cast<std::size_t>(k_ + 1));
    for (index_t t = 0; t < vocab_; ++t) {
      best.clear();
      const auto et = embeddings.row(t);
      for (index_t u = 0; u < vocab_; ++u) {
        if (u == t) continue;
        const auto eu = embeddings.row(u);
        double dist = 0;
        if (metric == neighbour_metric::l2) {
          for (index_t j = 0; j < d; ++j) {
            const double diff = static_cast<double>(et[j]) - static_cast<double>(eu[j]);
            dist += diff * diff;
          }
        } else {
          double dot = 0;
          for (index_t j = 0; j < d; ++j) dot += static_cast<double>(et[j]) * eu[j];
          dist =
              1.0 - dot / (norm[static_cast<std::size_t>(t)] * norm[static_cast<std::size_t>(u)]);
        }
        const std::pair<double, token_t> cand{dist, static_cast<token_t>(u)};
        if (static_cast<index_t>(best.size()) == k_ && !(cand < best.back())) continue;
        best.insert(std::upper_bound(best.begin(), best.end(), cand), cand);
        if (static_cast<index_t>(best.size()) > k_) best.pop_back();
      }
      for (index_t j = 0; j < k_; ++j)
        ids_[static_cast<std::size_t>(t * k_ + j)] = best[static_cast<std::size_t>(j)].second;
    }
  }

  /// A table from precomputed neighbour lists (V rows of k ids, nearest first); validated.
  neighbour_table(std::vector<token_t> ids, index_t vocab, index_t k)
      : vocab_(vocab), k_(k), ids_(std::move(ids)) {
    require_parameter(vocab >= 2, "vocab", static_cast<double>(vocab), "must be >= 2");
    require_parameter(k >= 1 && k < vocab && k <= lantern_max_neighbours, "k",
                      static_cast<double>(k), "must be in [1, min(V - 1, 64)]");
    if (static_cast<index_t>(ids_.size()) != vocab * k)
      throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(ids_.size())}, "ids",
                      ("expected V * k = " + std::to_string(vocab * k)).c_str());
    for (index_t t = 0; t < vocab; ++t)
      for (index_t j = 0; j < k; ++j) {
        const token_t u = ids_[static_cast<std::size_t>(t * k + j)];
        if (u < 0 || u >= vocab || u == t)
          throw_if_failed({status::token_out_of_range, t, j, static_cast<double>(u)}, "ids",
                          "neighbours must be other tokens in [0, V)");
      }
  }

  [[nodiscard]] neighbour_table_view view() const noexcept { return {ids_.data(), vocab_, k_}; }
  [[nodiscard]] index_t vocab() const noexcept { return vocab_; }
  [[nodiscard]] index_t k() const noexcept { return k_; }
  /// Token t's neighbours, nearest first.
  [[nodiscard]] std::vector<token_t> neighbours(index_t t) const {
    return {ids_.begin() + t * k_, ids_.begin() + (t + 1) * k_};
  }

 private:
  index_t vocab_;
  index_t k_;
  std::vector<token_t> ids_;
};

/// How the neighbour walk is limited.
enum class lantern_limit : std::uint8_t {
  relative,  ///< LANTERN++: summed neighbour probability ≤ λ·p(x̃)
  absolute,  ///< LANTERN: summed neighbour probability ≤ δ
};

/// The LANTERN / LANTERN++ rule bound to one target row and drafted token.
template <class T>
struct lantern_bound_rule {
  row_view<const T> p;
  neighbour_table_view table;
  lantern_limit limit_kind;
  double limit_param;
  resampling resample;
  token_t drafted;
  index_t count = 0;                             ///< |A| (excluding x̃)
  token_t members[lantern_max_neighbours] = {};  ///< A, in walk order
  double mass = 0.0;                             ///< p(x̃) + Σ_A p

  /// Walks x's neighbours and returns p(x) + the mass of the accepted ones (fills `out` when
  /// non-null).
  SPECULA_HOST_DEVICE double neighbour_mass(index_t x, token_t* out, index_t* out_count) const {
    const double px = static_cast<double>(p[x]);
    const double limit = limit_kind == lantern_limit::relative ? limit_param * px : limit_param;
    const token_t* nb = table.of(x);
    double acc = 0.0;
    index_t n = 0;
    for (index_t j = 0; j < table.k; ++j) {
      const double py = static_cast<double>(p[nb[j]]);
      if (acc + py > limit) break;
      acc += py;
      if (out != nullptr) out[n] = nb[j];
      ++n;
    }
    if (out_count != nullptr) *out_count = n;
    return px + acc;
  }

  [[nodiscard]] SPECULA_HOST_DEVICE bool in_set(index_t y) const noexcept {
    for (index_t j = 0; j < count; ++j)
      if (members[j] == y) return true;
    return false;
  }

  /// f(x̃) = min(1, (p(x̃) + Σ_A p) / q(x̃)), 0/0 = 1 (the p argument is unused: the aggregated
  /// mass was computed at bind time).
  [[nodiscard]] SPECULA_HOST_DEVICE double accept_probability(double /*p*/,
                                                              double q) const noexcept {
    if (q <= 0.0 || mass >= q) return 1.0;
    return mass / q;
  }

  [[nodiscard]] SPECULA_HOST_DEVICE double residual_weight_at(index_t y, double py,
                                                              double qy) const {
    double d = 0.0;
    switch (resample) {
      case resampling::vanilla:
        d = py - qy;
        break;
      case resampling::lantern:
        if (y == drafted)
          d = mass - qy;
        else if (in_set(y))
          d = -qy;
        else
          d = py - qy;
        break;
      case resampling::optimal: {
        // q(y)·f(y) = min(q(y), neighbour mass of y as if y had been drafted).
        const double m = neighbour_mass(y, nullptr, nullptr);
        d = py - (m < qy ? m : qy);
        break;
      }
    }
    return d > 0.0 ? d : 0.0;
  }
};

/// LANTERN / LANTERN++ rule (see file comment). Construct with make_relative / make_absolute.
struct lantern_rule {
  neighbour_table_view table;
  lantern_limit limit_kind = lantern_limit::relative;
  double limit_param = 1.0;  ///< λ (relative) or δ (absolute)
  resampling resample = resampling::optimal;

  /// LANTERN++: neighbours kept while their summed p ≤ λ·p(x̃).
  static lantern_rule make_relative(const neighbour_table& table, double lambda,
                                    resampling r = resampling::optimal) {
    require_parameter(detail::is_finite(lambda) && lambda >= 0.0, "lambda", lambda,
                      "must be finite and >= 0");
    return {table.view(), lantern_limit::relative, lambda, r};
  }
  /// LANTERN: neighbours kept while their summed p ≤ δ.
  static lantern_rule make_absolute(const neighbour_table& table, double delta,
                                    resampling r = resampling::optimal) {
    require_parameter(detail::is_finite(delta) && delta >= 0.0, "delta", delta,
                      "must be finite and >= 0");
    return {table.view(), lantern_limit::absolute, delta, r};
  }

  /// Checked entry points call this: the limit must be finite and >= 0, the resampling one of
  /// G*, G_van or LANTERN++'s, and the table must cover the vocabulary.
  void validate(index_t vocab) const {
    require_parameter(detail::is_finite(limit_param) && limit_param >= 0.0, "rule.limit_param",
                      limit_param, "must be finite and >= 0");
    if (table.ids == nullptr || table.vocab != vocab)
      throw_if_failed(
          {status::length_mismatch, -1, -1, static_cast<double>(table.vocab)}, "rule.table",
          ("neighbour table must have one row per token: " + std::to_string(vocab)).c_str());
  }

  template <class T>
  [[nodiscard]] SPECULA_HOST_DEVICE lantern_bound_rule<T> bind(row_view<const T> p,
                                                               token_t x) const {
    lantern_bound_rule<T> b{p, table, limit_kind, limit_param, resample, x};
    b.mass = b.neighbour_mass(x, b.members, &b.count);
    return b;
  }
};

}  // namespace specula
