#pragma once

/// @file
/// LANTERN / LANTERN++ relaxed acceptance through latent neighbours of image tokens
/// (Cool-SD Eq. 3–6, describing LANTERN++). Neighbour tables: rules/neighbour_table.hpp.
///
/// For a drafted token x̃ the neighbour set A(x̃) is taken from x̃'s first k codebook neighbours
/// (nearest first): neighbours are added in order while their summed target probability stays
/// within the cap, and the walk stops at the first neighbour that would exceed it. The cap is
///   - relative (LANTERN++), lantern_cap::paper:    λ·p(x̃) (Cool-SD's statement of Eq. 4);
///   - relative (LANTERN++), lantern_cap::official: (λ − 1)·p(x̃), λ > 1 (LANTERN's code, whose
///     `--lantern_delta` is λ; it reads λ <= 1 as the absolute cap δ = λ);
///   - absolute (LANTERN): δ.
/// The acceptance probability is f(x̃) = min(1, (p(x̃) + Σ_A p) / q(x̃)) (Eq. 5). After a
/// rejection the rule resamples from
///   - resampling::optimal: G* = Norm([p − q·f]+) (Cool-SD Eq. 10, the default; f evaluated at
///     every token y with its own neighbour set);
///   - resampling::vanilla: G_van = Norm([p − q]+);
///   - resampling::lantern: LANTERN++'s Norm([P^{k,λ} − q]+) (Eq. 6), where P^{k,λ} moves the
///     mass of A onto x̃;
///   - resampling::lantern_official: LANTERN's code (lumina-mGPT with EAGLE-1 drafts): when A is
///     not empty, the *target* p is set to 0 at x̃'s first k + 1 table neighbours (x̃ itself is
///     not in its row: all of A and more), then Norm([p − q]+); when A is empty, G_van. Those
///     neighbours get no resampling mass.
///
/// This is a row-aware rule (see rules/rule.hpp): it needs the whole target row. Not lossless.

#include <cstdint>
#include <string>

#include "specula/core/config.hpp"
#include "specula/core/error.hpp"
#include "specula/core/numeric.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/rules/neighbour_table.hpp"
#include "specula/rules/relaxed.hpp"

namespace specula {

/// How the neighbour walk is limited.
enum class lantern_limit : std::uint8_t {
  relative,  ///< LANTERN++: summed neighbour probability ≤ cap(λ)·p(x̃) (see lantern_cap)
  absolute,  ///< LANTERN: summed neighbour probability ≤ δ
};

/// The relative cap's convention (docs/relaxed.md).
enum class lantern_cap : std::uint8_t {
  paper,     ///< λ·p(x̃), λ >= 0 (Cool-SD Eq. 4's statement of LANTERN++), the default
  official,  ///< (λ − 1)·p(x̃), λ > 1 (LANTERN's code: pass its --lantern_delta unchanged)
};

/// The rule's maths, shared by every bound rule and the acceptance test: the cap on the
/// neighbours' summed probability for a token of probability px, and the walk that selects A.
struct lantern_walk {
  neighbour_table_view table;
  lantern_limit limit_kind = lantern_limit::relative;
  lantern_cap cap = lantern_cap::paper;
  double limit_param = 1.0;
  index_t k = 0;       ///< neighbours walked: the first k of each table row
  double omega = 1.0;  ///< Cool-SD's ω on the aggregated mass (1: LANTERN / LANTERN++ as such)

  /// ω·m: the mass an acceptance test compares with q (m itself when ω = 1).
  [[nodiscard]] SPECULA_HOST_DEVICE double relaxed(double m) const noexcept {
    return detail::mul_rn(omega, m);
  }

  [[nodiscard]] SPECULA_HOST_DEVICE double limit(double px) const noexcept {
    if (limit_kind == lantern_limit::absolute) return limit_param;
    return detail::mul_rn(cap == lantern_cap::official ? limit_param - 1.0 : limit_param, px);
  }

  /// p(x) + the summed p of x's accepted neighbours, walking them nearest first; their number
  /// in *count when non-null (A is the first *count neighbours of x).
  template <class Row>
  SPECULA_HOST_DEVICE double mass(const Row& p, index_t x, index_t* count) const {
    const double px = static_cast<double>(p[x]);
    const double lim = limit(px);
    const token_t* nb = table.of(x);
    double acc = 0.0;
    index_t n = 0;
    for (; n < k; ++n) {
      const double py = static_cast<double>(p[nb[n]]);
      if (acc + py > lim) break;
      acc += py;
    }
    if (count != nullptr) *count = n;
    return px + acc;
  }
};

/// The LANTERN / LANTERN++ rule bound to one target row and drafted token.
template <class T>
struct lantern_bound_rule {
  row_view<const T> p;
  lantern_walk walk;
  resampling resample;
  token_t drafted;
  index_t count = 0;                 ///< |A| (excluding x̃)
  const token_t* members = nullptr;  ///< A = members[0 .. count): x̃'s table row, nearest first
  double mass = 0.0;                 ///< p(x̃) + Σ_A p

  /// True when y is among x̃'s first n table neighbours.
  [[nodiscard]] SPECULA_HOST_DEVICE bool among_first(index_t y, index_t n) const noexcept {
    return n > 0 && walk.table.rank_of(drafted, y) < n;
  }

  /// f(x̃) = min(1, ω·(p(x̃) + Σ_A p) / q(x̃)), 0/0 = 1 (ω = 1 unless scheduled; the p argument
  /// is unused: the aggregated mass was computed at bind time).
  [[nodiscard]] SPECULA_HOST_DEVICE double accept_probability(double /*p*/,
                                                              double q) const noexcept {
    const double m = walk.relaxed(mass);
    if (q <= 0.0 || m >= q) return 1.0;
    return m / q;
  }

  [[nodiscard]] SPECULA_HOST_DEVICE double residual_weight_at(index_t y, double py,
                                                              double qy) const {
    double d = 0.0;
    switch (resample) {
      case resampling::vanilla:
        d = py - qy;
        break;
      case resampling::lantern:
        // A member of A gets [−q(y)]+ = 0 (q(y) ≥ 0), as does any y with p(y) ≤ q(y) outside
        // it: the membership lookup is needed only where p(y) > q(y).
        if (y == drafted)
          d = mass - qy;
        else if (qy >= 0.0 && !(py - qy > 0.0))
          d = 0.0;
        else if (among_first(y, count))
          d = -qy;
        else
          d = py - qy;
        break;
      case resampling::lantern_official: {
        // p zeroed at the first k + 1 table neighbours (as many as the row holds) when A ≠ ∅:
        // [0 − q(y)]+ = 0 there (looked up only where p(y) > q(y): 0 either way elsewhere).
        const index_t zeroed = walk.k < walk.table.k ? walk.k + 1 : walk.table.k;
        d = py - qy > 0.0 && count > 0 && among_first(y, zeroed) ? 0.0 : py - qy;
        break;
      }
      case resampling::optimal: {
        // q(y)·f(y) = min(q(y), ω·m(y)), m(y) the neighbour mass of y as if y had been drafted:
        // d = p(y) − min(q(y), ω·m(y)). m(y) = p(y) + (neighbours' p) ≥ p(y), so low = ω·p(y)
        // bounds ω·m(y) from below (rounding is monotonic): when low ≥ q(y) the minimum is q(y);
        // when q(y) > low ≥ p(y) (any ω ≥ 1) the minimum is at least p(y) and the weight 0.
        // Either way the walk cannot change the result, so only ω < 1 with ω·p(y) < q(y) walks
        // y's neighbours: with ω = 1 (LANTERN, LANTERN++) an element costs O(1), not O(k).
        // (py is p(y) of the bound row, and rows hold no negative entries: probability rows.)
        const double low = walk.relaxed(py);
        if (low >= qy) {
          d = py - qy;
        } else if (low < qy && low >= py) {
          d = 0.0;
        } else {
          const double m = walk.relaxed(walk.mass(p, y, nullptr));
          d = py - (m < qy ? m : qy);
        }
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
  lantern_cap cap = lantern_cap::paper;  ///< relative mode only
  index_t k = 0;  ///< neighbours walked per token, 1 .. table.k (make_*: 0 means table.k)
  /// Cool-SD's ω applied to the aggregated mass: f = min(1, ω·(p(x̃) + Σ_A p)/q(x̃)), and G*
  /// uses the same f. 1 (the default) is LANTERN / LANTERN++; scheduled_lantern_rule sets it
  /// per draft position. The LANTERN resamplings do not read it.
  double omega = 1.0;

  /// LANTERN++: neighbours kept while their summed p ≤ λ·p(x̃) (lantern_cap::paper, λ >= 0) or
  /// ≤ (λ − 1)·p(x̃) (lantern_cap::official, λ > 1). `k` = 0 walks the whole table row.
  static lantern_rule make_relative(const neighbour_table& table, double lambda,
                                    resampling r = resampling::optimal,
                                    lantern_cap cap = lantern_cap::paper, index_t k = 0) {
    check_lambda(lambda, cap, "lambda");
    return {table.view(), lantern_limit::relative, lambda, r, cap, resolve_k(table, k)};
  }
  /// LANTERN: neighbours kept while their summed p ≤ δ. `k` = 0 walks the whole table row.
  static lantern_rule make_absolute(const neighbour_table& table, double delta,
                                    resampling r = resampling::optimal, index_t k = 0) {
    require_parameter(detail::is_finite(delta) && delta >= 0.0, "delta", delta,
                      "must be finite and >= 0");
    return {table.view(),       lantern_limit::absolute, delta, r,
            lantern_cap::paper, resolve_k(table, k)};
  }

  /// Checked entry points call this: the limit (λ >= 0 with the paper's cap, λ > 1 with the
  /// official one, δ >= 0; finite), a LANTERN resampling, a table with one row per token of
  /// `vocab` and 1 <= table.k < vocab, 1 <= k <= table.k, and ω finite and > 0.
  void validate(index_t vocab) const {
    require_parameter(detail::is_finite(omega) && omega > 0.0, "rule.omega", omega,
                      "must be finite and > 0");
    if (limit_kind == lantern_limit::relative)
      check_lambda(limit_param, cap, "rule.limit_param");
    else
      require_parameter(detail::is_finite(limit_param) && limit_param >= 0.0, "rule.limit_param",
                        limit_param, "must be finite and >= 0");
    require_parameter(resample == resampling::optimal || resample == resampling::vanilla ||
                          resample == resampling::lantern ||
                          resample == resampling::lantern_official,
                      "rule.resample", static_cast<double>(resample), "unknown resampling");
    if (table.ids == nullptr || table.vocab != vocab)
      throw_if_failed(
          {status::length_mismatch, -1, -1, static_cast<double>(table.vocab)}, "rule.table",
          ("neighbour table must have one row per token: " + std::to_string(vocab)).c_str());
    require_parameter(table.k >= 1 && table.k < vocab && table.k <= lantern_max_neighbours,
                      "rule.table.k", static_cast<double>(table.k),
                      "must be in [1, min(V - 1, 65535)]");
    require_parameter(k >= 1 && k <= table.k, "rule.k", static_cast<double>(k),
                      ("must be in [1, table k = " + std::to_string(table.k) + "]").c_str());
  }

  [[nodiscard]] SPECULA_HOST_DEVICE lantern_walk walk() const noexcept {
    return {table, limit_kind, cap, limit_param, k, omega};
  }

  template <class T>
  [[nodiscard]] SPECULA_HOST_DEVICE lantern_bound_rule<T> bind(row_view<const T> p,
                                                               token_t x) const {
    lantern_bound_rule<T> b{p, walk(), resample, x};
    b.members = table.of(x);
    b.mass = b.walk.mass(p, x, &b.count);
    return b;
  }

 private:
  static void check_lambda(double lambda, lantern_cap cap, const char* name) {
    if (cap == lantern_cap::official)
      require_parameter(detail::is_finite(lambda) && lambda > 1.0, name, lambda,
                        "must be finite and > 1 with lantern_cap::official (LANTERN's code reads "
                        "lambda <= 1 as the absolute cap delta: use make_absolute)");
    else
      require_parameter(detail::is_finite(lambda) && lambda >= 0.0, name, lambda,
                        "must be finite and >= 0");
  }
  static index_t resolve_k(const neighbour_table& table, index_t k) {
    require_parameter(
        k >= 0 && k <= table.k(), "k", static_cast<double>(k),
        ("must be in [1, table k = " + std::to_string(table.k()) + "] (0: the table's k)").c_str());
    return k == 0 ? table.k() : k;
  }
};

/// Cool-SD's relaxation schedule composed with LANTERN++ (the combined setting): at draft
/// position i (depth i − 1) the LANTERN rule with ω = ω_i, i.e.
///   f(x̃) = min(1, ω_i·(p(x̃) + Σ_A p) / q(x̃)),
/// and, with resampling::optimal (the default), Cool-SD's G* for that f. ω_i = 1 everywhere is
/// `rule` itself (LANTERN / LANTERN++); λ = 0 with the paper's cap is scheduled_relaxed_rule
/// with the same schedule and resampling. A row-aware rule with a schedule: verify_chain,
/// verify_tree and the decoding loops' tree_verifier take it.
struct scheduled_lantern_rule {
  lantern_rule rule;  ///< the neighbour walk, cap, k and resampling (its omega is replaced)
  relaxation_schedule schedule;

  /// The rule at depth d (draft position d + 1).
  [[nodiscard]] SPECULA_HOST_DEVICE lantern_rule at(index_t depth) const noexcept {
    lantern_rule r = rule;
    r.omega = schedule.omega(depth + 1);
    return r;
  }
  /// The position-free form (used only where no depth is known) is the first position's rule.
  template <class T>
  [[nodiscard]] SPECULA_HOST_DEVICE lantern_bound_rule<T> bind(row_view<const T> p,
                                                               token_t x) const {
    return at(0).bind(p, x);
  }

  /// Checked entry points call this: the schedule (relaxation_schedule::validate) and the
  /// LANTERN rule (lantern_rule::validate).
  void validate(index_t vocab) const {
    schedule.validate();
    rule.validate(vocab);
  }
};

}  // namespace specula
