// LANTERN / LANTERN++ conventions (rules/lantern.hpp, rules/neighbour_table.hpp): both caps
// (paper λ·p, official (λ − 1)·p) × every resampling against a reference written from the
// papers' and LANTERN's code's definitions, by exact enumeration of the output law; negative
// controls (the neighbouring conventions must give other laws); k up to 1000 with the id-sorted
// membership test; the neighbour-table builder against a brute-force double ranking; bad
// parameters at the checked entry points.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "sampled_round.hpp"
#include "specula/rules/lantern.hpp"
#include "specula/sample/without_replacement.hpp"
#include "specula/testing/enumerate.hpp"
#include "specula/testing/goodness_of_fit.hpp"
#include "specula/testing/relaxation_analysis.hpp"
#include "specula/testing/toy_models.hpp"
#include "specula/verify/candidates.hpp"
#include "specula/verify/chain.hpp"

using namespace specula;

namespace {

/// Brute-force neighbour lists: every other token ranked by the double distance, ties to the
/// lower id (std::sort of (distance, id) pairs).
std::vector<std::vector<token_t>> brute_neighbours(const std::vector<float>& e, index_t V,
                                                   index_t d, neighbour_metric m) {
  std::vector<double> norm(static_cast<std::size_t>(V), 1.0);
  if (m == neighbour_metric::cosine)
    for (index_t t = 0; t < V; ++t) {
      double s = 0;
      for (index_t j = 0; j < d; ++j)
        s += static_cast<double>(e[static_cast<std::size_t>(t * d + j)]) *
             e[static_cast<std::size_t>(t * d + j)];
      if (s > 0) norm[static_cast<std::size_t>(t)] = std::sqrt(s);
    }
  std::vector<std::vector<token_t>> out(static_cast<std::size_t>(V));
  for (index_t t = 0; t < V; ++t) {
    std::vector<std::pair<double, token_t>> all;
    for (index_t u = 0; u < V; ++u)
      if (u != t)
        all.emplace_back(detail::neighbour_distance(&e[static_cast<std::size_t>(t * d)],
                                                    &e[static_cast<std::size_t>(u * d)], d, m,
                                                    norm[static_cast<std::size_t>(t)],
                                                    norm[static_cast<std::size_t>(u)]),
                         static_cast<token_t>(u));
    std::sort(all.begin(), all.end());
    for (const auto& [dist, u] : all) out[static_cast<std::size_t>(t)].push_back(u);
  }
  return out;
}

/// Which convention a reference rule follows; the `wrong_*` variants are the negative controls
/// (`wrong_official_zero_q`: q zeroed at the neighbours instead of the target, as the LlamaGen
/// and Anole files' static-tree test path does).
enum class ref_resample {
  eq6,
  official,
  optimal,
  vanilla,
  wrong_eq6_keep_a,
  wrong_official_k,
  wrong_official_zero_q
};

/// LANTERN written from its definitions with explicit sets (no code shared with the library
/// rule): A = the longest prefix of x̃'s first k neighbours whose cumulative p is <= the cap
/// (LANTERN's cumsum test); Eq. 6 builds P^{k,λ} as a vector; the official resampling zeroes a
/// copy of the target p at neighbours[0 .. k] (Python's `gtp[nearest[x, :k + 1]] = 0`, clipped
/// to the row) before subtracting q.
struct reference_lantern {
  const std::vector<std::vector<token_t>>* nb;
  double cap_factor;  // λ (paper) or λ − 1 (official); negative: absolute δ = −cap_factor
  index_t k;
  ref_resample resample;

  struct bound {
    const reference_lantern* r;
    std::vector<double> p;
    token_t x;
    std::vector<bool> in_a;
    double mass;
    bool any;
    double accept_probability(double /*px*/, double qx) const {
      return qx <= 0 || mass >= qx ? 1.0 : mass / qx;
    }
    double residual_weight_at(index_t y, double py, double qy) const {
      const auto sy = static_cast<std::size_t>(y);
      double w = 0;
      switch (r->resample) {
        case ref_resample::vanilla:
          w = py - qy;
          break;
        case ref_resample::eq6:
        case ref_resample::wrong_eq6_keep_a: {
          std::vector<double> P = p;  // P^{k,λ}
          for (std::size_t u = 0; u < p.size(); ++u)
            if (in_a[u]) {
              P[static_cast<std::size_t>(x)] += p[u];
              if (r->resample == ref_resample::eq6) P[u] = 0;
            }
          w = P[sy] - qy;
          break;
        }
        case ref_resample::official:
        case ref_resample::wrong_official_k:
        case ref_resample::wrong_official_zero_q: {
          std::vector<double> pz = p, qz(p.size(), 0.0);
          qz[sy] = qy;
          const auto& row = (*r->nb)[static_cast<std::size_t>(x)];
          const index_t take = r->resample == ref_resample::wrong_official_k ? r->k : r->k + 1;
          auto& zeroed = r->resample == ref_resample::wrong_official_zero_q ? qz : pz;
          if (any)
            for (index_t j = 0; j < take && j < static_cast<index_t>(row.size()); ++j)
              zeroed[static_cast<std::size_t>(row[static_cast<std::size_t>(j)])] = 0;
          w = pz[sy] - qz[sy];
          break;
        }
        case ref_resample::optimal: {
          const bound by = r->make(p, static_cast<token_t>(y));
          w = py - std::min(qy, by.mass);
          break;
        }
      }
      return std::max(w, 0.0);
    }
  };

  bound make(const std::vector<double>& p, token_t x) const {
    bound b{this, p, x, std::vector<bool>(p.size(), false), 0.0, false};
    const double px = p[static_cast<std::size_t>(x)];
    const double cap = cap_factor < 0 ? -cap_factor : cap_factor * px;
    const auto& row = (*nb)[static_cast<std::size_t>(x)];
    double cum = 0, added = 0;
    index_t last = -1;
    for (index_t j = 0; j < k; ++j) {
      cum += p[static_cast<std::size_t>(row[static_cast<std::size_t>(j)])];
      if (cum <= cap) {
        last = j;
        added = cum;
      }
    }
    for (index_t j = 0; j <= last; ++j)
      b.in_a[static_cast<std::size_t>(row[static_cast<std::size_t>(j)])] = true;
    b.any = last >= 0;
    b.mass = px + added;
    return b;
  }
  template <class T>
  bound bind(row_view<const T> p, token_t x) const {
    std::vector<double> pv(static_cast<std::size_t>(p.size));
    for (index_t y = 0; y < p.size; ++y)
      pv[static_cast<std::size_t>(y)] = static_cast<double>(p[y]);
    return make(pv, x);
  }
};

/// Random codebook positions in 2-D.
std::vector<float> codebook(index_t V, index_t d, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n;
  std::vector<float> e(static_cast<std::size_t>(V * d));
  for (auto& v : e) v = n(g);
  return e;
}

/// V = 5 tokens in 2-D, a table of width 4, rules walking k = 2 (so that the official
/// resampling's k + 1 = 3 differs from k), draft length L = 2.
struct small_codebook {
  static constexpr index_t V = 5, d = 2, width = 4, k = 2, L = 2;
  std::vector<float> e = codebook(V, d, 3);
  neighbour_table table{batch_view<const float>(e.data(), V, d), width};
  std::vector<std::vector<token_t>> nb = brute_neighbours(e, V, d, neighbour_metric::l2);
};

}  // namespace

TEST_CASE(
    "LANTERN caps x resamplings: exact law equals the reference's and TV stays within the bound",
    "[relaxed][lantern][law]") {
  const small_codebook c;
  const index_t V = c.V, k = c.k, L = c.L;
  const auto& table = c.table;
  const auto& nb = c.nb;
  struct combo {
    lantern_cap cap;
    double lambda;
    resampling lib;
    ref_resample ref;
  };
  const combo combos[] = {
      {lantern_cap::paper, 1.5, resampling::lantern, ref_resample::eq6},
      {lantern_cap::paper, 1.5, resampling::lantern_official, ref_resample::official},
      {lantern_cap::paper, 1.5, resampling::optimal, ref_resample::optimal},
      {lantern_cap::paper, 1.5, resampling::vanilla, ref_resample::vanilla},
      {lantern_cap::official, 2.5, resampling::lantern, ref_resample::eq6},
      {lantern_cap::official, 2.5, resampling::lantern_official, ref_resample::official},
      {lantern_cap::official, 2.5, resampling::optimal, ref_resample::optimal},
      {lantern_cap::official, 2.5, resampling::vanilla, ref_resample::vanilla},
  };
  int distorted = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    const testing::toy_ar_model target(V, L + 1, seed * 7, 0.1);
    const auto draft = testing::toy_ar_model::perturbed(target, 0.8, seed * 7 + 1, 0.1);
    for (const auto& combo : combos) {
      const auto rule = lantern_rule::make_relative(table, combo.lambda, combo.lib, combo.cap, k);
      const double factor = combo.cap == lantern_cap::official ? combo.lambda - 1.0 : combo.lambda;
      const reference_lantern ref{&nb, factor, k, combo.ref};
      const auto got = testing::relaxation_accounting(target, draft, L, rule);
      const auto want = testing::relaxation_accounting(target, draft, L, ref);
      INFO("seed " << seed << " cap " << static_cast<int>(combo.cap) << " resample "
                   << static_cast<int>(combo.lib));
      CHECK(testing::max_abs_difference(got.relaxed_law, want.relaxed_law) < 1e-12);
      CHECK(got.tv_bound == Approx(want.tv_bound).margin(1e-12));
      CHECK(got.tv_exact <= got.tv_bound + 1e-12);
      distorted += got.tv_exact > 1e-6 ? 1 : 0;
    }
    // Absolute mode (LANTERN's λ <= 1 branch) with the official resampling.
    const auto abs_rule = lantern_rule::make_absolute(table, 0.3, resampling::lantern_official, k);
    const reference_lantern abs_ref{&nb, -0.3, k, ref_resample::official};
    CHECK(testing::max_abs_difference(
              testing::relaxation_accounting(target, draft, L, abs_rule).relaxed_law,
              testing::relaxation_accounting(target, draft, L, abs_ref).relaxed_law) < 1e-12);
  }
  CHECK(distorted > 24);  // the relaxations really change the law
}

TEST_CASE("LANTERN negative controls: each neighbouring convention gives another law",
          "[relaxed][lantern][law]") {
  const small_codebook c;
  const index_t V = c.V, k = c.k, L = c.L;
  const auto& table = c.table;
  const auto& nb = c.nb;
  double cap_gap = 0, eq6_gap = 0, k1_gap = 0, zero_q_gap = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    const testing::toy_ar_model target(V, L + 1, seed * 7, 0.1);
    const auto draft = testing::toy_ar_model::perturbed(target, 0.8, seed * 7 + 1, 0.1);
    const auto law = [&](const auto& rule) {
      return testing::relaxation_accounting(target, draft, L, rule).relaxed_law;
    };
    // Official cap read as the paper's (λ instead of λ − 1).
    const auto official =
        law(lantern_rule::make_relative(table, 2.5, resampling::lantern, lantern_cap::official, k));
    cap_gap =
        std::max(cap_gap, testing::max_abs_difference(
                              official, law(reference_lantern{&nb, 2.5, k, ref_resample::eq6})));
    // Eq. 6 leaving A's own mass in place. (Moving A's mass onto x̃ alone changes nothing
    // after a rejection: f(x̃) < 1 means P^{k,λ}(x̃) < q(x̃), so x̃'s weight is 0 either way.)
    const auto eq6 =
        law(lantern_rule::make_relative(table, 1.5, resampling::lantern, lantern_cap::paper, k));
    eq6_gap = std::max(
        eq6_gap, testing::max_abs_difference(
                     eq6, law(reference_lantern{&nb, 1.5, k, ref_resample::wrong_eq6_keep_a})));
    // The official resampling zeroing k neighbours instead of k + 1.
    const auto off = law(lantern_rule::make_relative(table, 1.5, resampling::lantern_official,
                                                     lantern_cap::paper, k));
    k1_gap = std::max(
        k1_gap, testing::max_abs_difference(
                    off, law(reference_lantern{&nb, 1.5, k, ref_resample::wrong_official_k})));
    // The official resampling zeroing q instead of the target at the neighbours.
    zero_q_gap = std::max(
        zero_q_gap,
        testing::max_abs_difference(
            off, law(reference_lantern{&nb, 1.5, k, ref_resample::wrong_official_zero_q})));
  }
  INFO("cap " << cap_gap << " eq6 " << eq6_gap << " k+1 " << k1_gap << " zero q " << zero_q_gap);
  CHECK(cap_gap > 1e-4);
  CHECK(eq6_gap > 1e-4);
  CHECK(k1_gap > 1e-4);
  CHECK(zero_q_gap > 1e-4);
}

TEST_CASE("LANTERN official conventions through verify_chain follow the enumerated law",
          "[relaxed][lantern][stats]") {
  const small_codebook c;
  const index_t V = c.V, k = c.k, L = c.L;
  const auto& table = c.table;
  const testing::toy_ar_model target(V, L + 1, 21, 0.1);
  const auto draft = testing::toy_ar_model::perturbed(target, 0.8, 22, 0.1);
  const auto rule = lantern_rule::make_relative(table, 2.5, resampling::lantern_official,
                                                lantern_cap::official, k);
  const auto exact = testing::relaxation_accounting(target, draft, L, rule);
  REQUIRE(exact.tv_exact > 1e-3);
  const auto counts = test_support::sampled_round_counts(target, draft, L, rule, 100'000, 31);
  const auto fit = testing::g_test(counts, exact.relaxed_law);
  INFO("G-test against the enumerated law: " << fit);
  CHECK(fit.p_value > 1e-4);
  // Negative control: the same counts against the law of LANTERN++'s Eq. 6 resampling (which
  // drops A's weight where the official code restores p) are rejected.
  const auto eq6 = testing::relaxation_accounting(
      target, draft, L,
      lantern_rule::make_relative(table, 2.5, resampling::lantern, lantern_cap::official, k));
  INFO("law gap " << testing::max_abs_difference(eq6.relaxed_law, exact.relaxed_law));
  CHECK(testing::g_test(counts, eq6.relaxed_law).p_value < 1e-6);
}

TEST_CASE("LANTERN with k = 1000: walk, membership and residuals match explicit sets",
          "[relaxed][lantern]") {
  const index_t V = 1500, d = 8, k = 1000;
  const auto e = codebook(V, d, 5);
  const neighbour_table table(batch_view<const float>(e.data(), V, d), k);
  REQUIRE(table.bytes() == static_cast<std::size_t>(V * k) * 10);
  std::vector<std::vector<token_t>> nb(static_cast<std::size_t>(V));
  for (index_t t = 0; t < V; ++t) nb[static_cast<std::size_t>(t)] = table.neighbours(t);
  // A flat-ish target row so that the walks are long (hundreds of neighbours).
  auto p = testing::random_probability_row(V, 9, 0, 0.0);
  auto q = testing::random_probability_row(V, 9, 1, 0.0);
  const row_view<const double> pr(p);
  std::vector<token_t> heavy;  // the three most probable tokens: walks of hundreds
  for (index_t y = 0; y < V; ++y) heavy.push_back(static_cast<token_t>(y));
  std::partial_sort(heavy.begin(), heavy.begin() + 3, heavy.end(), [&](token_t a, token_t b) {
    return p[static_cast<std::size_t>(a)] > p[static_cast<std::size_t>(b)];
  });
  heavy.resize(3);
  for (const auto cap : {lantern_cap::paper, lantern_cap::official})
    for (const auto r : {resampling::lantern, resampling::lantern_official}) {
      const double lambda = cap == lantern_cap::official ? 2001.0 : 2000.0;
      for (const index_t kk : {k, index_t{999}}) {
        const auto rule = lantern_rule::make_relative(table, lambda, r, cap, kk);
        const reference_lantern ref{
            &nb, 2000.0, kk, r == resampling::lantern ? ref_resample::eq6 : ref_resample::official};
        for (const token_t x : heavy) {
          const auto b = rule.bind(pr, x);
          const auto want = ref.make(p, x);
          INFO("x " << x << " k " << kk << " count " << b.count);
          CHECK(b.count > 100);
          CHECK(b.mass == Approx(want.mass).epsilon(1e-12));
          // The same rule with a table view that has no sorted rows (linear scan).
          auto plain = rule;
          plain.table.sorted = nullptr;
          plain.table.rank = nullptr;
          const auto bp = plain.bind(pr, x);
          for (index_t y = 0; y < V; ++y) {
            const auto sy = static_cast<std::size_t>(y);
            const double w = b.residual_weight_at(y, p[sy], q[sy]);
            REQUIRE(w == Approx(want.residual_weight_at(y, p[sy], q[sy])).margin(1e-15));
            REQUIRE(w == bp.residual_weight_at(y, p[sy], q[sy]));
          }
        }
      }
    }
}

TEST_CASE("LANTERN optimal resampling: the residual equals the neighbour walk's for every omega",
          "[relaxed][lantern]") {
  // The rule walks y's neighbours only where ω·p(y) < q(y) and ω < 1; everywhere else the
  // minimum min(q(y), ω·m(y)) is settled without m(y). The weights must be the walk's.
  const index_t V = 600, d = 4, k = 24;
  const auto e = codebook(V, d, 13);
  const neighbour_table table(batch_view<const float>(e.data(), V, d), k);
  std::vector<std::vector<token_t>> nb(static_cast<std::size_t>(V));
  for (index_t t = 0; t < V; ++t) nb[static_cast<std::size_t>(t)] = table.neighbours(t);
  const auto p = testing::random_probability_row(V, 17, 0, 0.3);  // zeros, p < q and p > q
  const auto q = testing::random_probability_row(V, 17, 1, 0.3);
  const row_view<const double> pr(p);
  index_t walked = 0;
  for (const double omega : {0.35, 0.9, 1.0, 1.8}) {
    for (const double limit : {0.5, 3.0, -0.01}) {  // relative λ = 0.5, 3; absolute δ = 0.01
      lantern_rule rule = limit < 0 ? lantern_rule::make_absolute(table, -limit)
                                    : lantern_rule::make_relative(table, limit);
      rule.omega = omega;
      const reference_lantern ref{&nb, limit, k, ref_resample::optimal};
      const auto b = rule.bind(pr, 5);
      for (index_t y = 0; y < V; ++y) {
        const auto sy = static_cast<std::size_t>(y);
        INFO("omega " << omega << " limit " << limit << " y " << y);
        const double w = b.residual_weight_at(y, p[sy], q[sy]);
        // The definition, walking y's neighbours at every y (the rule's own walk) ...
        const double m = b.walk.relaxed(b.walk.mass(pr, y, nullptr));
        REQUIRE(w == std::max(p[sy] - std::min(q[sy], m), 0.0));
        // ... and the explicit-set reference.
        REQUIRE(w == Approx(std::max(p[sy] - std::min(q[sy], omega * ref.make(p, y).mass), 0.0))
                         .margin(1e-15));
        if (omega < 1.0 && omega * p[sy] < q[sy] && p[sy] > 0.0) ++walked;
      }
    }
  }
  CHECK(walked > 100);  // the walking branch was exercised
}

TEST_CASE("neighbour tables: the builder equals a brute-force double ranking",
          "[relaxed][lantern]") {
  for (const auto metric : {neighbour_metric::l2, neighbour_metric::cosine})
    for (std::uint64_t trial = 0; trial < 4; ++trial) {
      const index_t V = 200 + static_cast<index_t>(trial) * 61,
                    d = 1 + static_cast<index_t>(trial) * 7;
      auto e = codebook(V, d, 40 + trial);
      if (trial % 2 == 1)  // an integer grid: many exact ties, broken by the lower id
        for (auto& v : e) v = std::round(2 * v);
      if (trial == 2)  // a zero row and huge entries (the float screen is scaled)
        for (index_t j = 0; j < d; ++j) {
          e[static_cast<std::size_t>(j)] = 0.f;
          e[static_cast<std::size_t>(d + j)] *= 1e30f;
        }
      const auto want = brute_neighbours(e, V, d, metric);
      for (const index_t k : {index_t{1}, index_t{37}, V - 1}) {
        const neighbour_table t(batch_view<const float>(e.data(), V, d), k, metric);
        const auto view = t.view();
        INFO("metric " << static_cast<int>(metric) << " trial " << trial << " k " << k);
        for (index_t x = 0; x < V; ++x) {
          const auto got = t.neighbours(x);
          REQUIRE(std::equal(got.begin(), got.end(), want[static_cast<std::size_t>(x)].begin()));
          for (index_t j = 0; j < k; ++j)
            REQUIRE(view.rank_of(x, got[static_cast<std::size_t>(j)]) == j);
          REQUIRE(view.rank_of(x, x) == k);
        }
      }
    }
  // Precomputed lists: a repeated neighbour is refused, naming the row.
  CHECK_THROWS_WITH(neighbour_table(std::vector<token_t>{1, 2, 0, 2, 1, 1}, 3, 2),
                    Catch::Contains("ids") && Catch::Contains("distinct"));
  CHECK_THROWS_WITH(neighbour_table(std::vector<token_t>{1, 0}, 2, 2), Catch::Contains("k"));
}

TEST_CASE("checked calls refuse bad LANTERN parameters, naming the field",
          "[relaxed][lantern][bad_input]") {
  test_support::one_draft_chain chain;
  const index_t V = chain.V;
  const std::vector<float> pos = {0.0f, 1.0f, 3.0f, 6.0f};
  const neighbour_table table(batch_view<const float>(pos.data(), V, 1), 2);
  const auto official =
      lantern_rule::make_relative(table, 2.0, resampling::lantern_official, lantern_cap::official);
  CHECK_NOTHROW(chain(official));
  CHECK_NOTHROW(chain(lantern_rule::make_relative(table, 0.5)));  // paper cap: λ >= 0

  // λ <= 1 under the official cap (LANTERN's code would switch to the absolute cap there).
  for (const double lambda : {0.5, 1.0}) {
    INFO("lambda " << lambda);
    CHECK_THROWS_WITH(
        lantern_rule::make_relative(table, lambda, resampling::optimal, lantern_cap::official),
        Catch::Contains("lambda") && Catch::Contains("make_absolute"));
    auto r = official;
    r.limit_param = lambda;
    CHECK_THROWS_WITH(chain(r), Catch::Contains("rule.limit_param"));
    const std::vector<lantern_rule> rules = {r};
    CHECK_THROWS_WITH(chain(per_request<lantern_rule>{rules}), Catch::Contains("rule.limit_param"));
  }
  // k < 1, k beyond the table.
  for (const index_t k : {index_t{0}, index_t{-1}, index_t{3}}) {
    INFO("k " << k);
    auto r = official;
    r.k = k;
    CHECK_THROWS_WITH(chain(r), Catch::Contains("rule.k"));
  }
  CHECK_THROWS_WITH(
      lantern_rule::make_relative(table, 1.0, resampling::optimal, lantern_cap::paper, 3),
      Catch::Contains("k"));
  CHECK_THROWS_WITH(lantern_rule::make_absolute(table, 0.1, resampling::optimal, -2),
                    Catch::Contains("k"));
  // A table view claiming k >= V, and tables of k >= V or another vocabulary.
  auto wide = official;
  wide.table.k = V;
  CHECK_THROWS_WITH(chain(wide), Catch::Contains("rule.table.k"));
  CHECK_THROWS_WITH(neighbour_table(batch_view<const float>(pos.data(), V, 1), V),
                    Catch::Contains("k"));
  CHECK_THROWS_WITH(neighbour_table(batch_view<const float>(pos.data(), V, 1), 0),
                    Catch::Contains("k"));
  const neighbour_table small(batch_view<const float>(pos.data(), 3, 1), 1);
  CHECK_THROWS_WITH(chain(lantern_rule::make_relative(small, 1.0)), Catch::Contains("rule.table"));
  // The LANTERN resamplings belong to lantern_rule only.
  CHECK_THROWS_WITH(chain(relaxed_rule{2.0, resampling::lantern_official}),
                    Catch::Contains("rule.resample"));
  auto bad_resample = official;
  bad_resample.resample = static_cast<resampling>(9);
  CHECK_THROWS_WITH(chain(bad_resample), Catch::Contains("rule.resample"));
}

namespace {

/// LANTERN's resampling after a rejection, transcribed operation by operation from its code
/// (lumina-mGPT with EAGLE-1 drafts): gtp = the target row; if the neighbour walk kept
/// something, gtp[nearest[x, :k + 1]] = 0; gtp = gtp - q; gtp[gtp < 0] = 0; gtp /= gtp.sum().
/// `row` is x's neighbour list (x itself excluded: the code builds its table with an infinite
/// diagonal). Returns false where the code would fall back to a uniform row (gtp.sum() == 0).
bool official_resampling(std::vector<double> gtp, const std::vector<double>& q,
                         const std::vector<token_t>& row, index_t k, bool kept,
                         std::vector<double>& out) {
  if (kept)
    for (std::size_t j = 0; j < row.size() && j < static_cast<std::size_t>(k) + 1; ++j)
      gtp[static_cast<std::size_t>(row[j])] = 0;
  double sum = 0;
  for (std::size_t y = 0; y < gtp.size(); ++y) {
    gtp[y] = std::max(gtp[y] - q[y], 0.0);
    sum += gtp[y];
  }
  if (sum == 0) return false;
  for (auto& v : gtp) v /= sum;
  out = gtp;
  return true;
}

/// The code's acceptance of x: cumsum of p over x's first k neighbours, the last index whose
/// cumsum is <= the cap ((delta - 1)·p(x) for delta > 1, else delta), px += that cumsum;
/// accepted when r <= px / qx. Returns min(1, px / qx) and whether an index was found.
std::pair<double, bool> official_accept(const std::vector<double>& p, double qx,
                                        const std::vector<token_t>& row, index_t k, token_t x,
                                        double delta) {
  const double px = p[static_cast<std::size_t>(x)];
  const double cap = delta > 1.0 ? (delta - 1.0) * px : delta;
  double cum = 0, kept_cum = 0;
  bool found = false;
  for (index_t j = 0; j < k; ++j) {
    cum += p[static_cast<std::size_t>(row[static_cast<std::size_t>(j)])];
    if (cum <= cap) {
      kept_cum = cum;
      found = true;
    }
  }
  const double mass = found ? px + kept_cum : px;
  return {qx <= 0 ? 1.0 : std::min(1.0, mass / qx), found};
}

/// Law of one drafted position: x ~ q, verified by verify_candidates (one candidate drawn
/// through the source), enumerated over every random decision.
std::vector<double> one_position_law(const lantern_rule& rule, const std::vector<double>& p,
                                     const std::vector<double>& q) {
  const auto V = static_cast<index_t>(p.size());
  const auto law = testing::enumerate_token_law(V, [&](auto& src) -> index_t {
    auto qw = [&](index_t y) { return q[static_cast<std::size_t>(y)]; };
    token_t cand = 0;
    const index_t got = sample_without_replacement_sequential(src, V, qw, 1, 77, 0, &cand);
    std::vector<double> ws(static_cast<std::size_t>(candidates_workspace_size<lantern_rule>(1, V)));
    const auto r = verify_candidates(rule, src, row_view<const double>(p),
                                     without_replacement<double>{row_view<const double>(q)}, &cand,
                                     got, 0.0, 0, ws.data());
    REQUIRE((r.flags & chain_valid) != 0);
    return r.token;
  });
  CHECK(law.invalid_mass == 0.0);
  return law.probability;
}

}  // namespace

TEST_CASE("LANTERN official resampling: the worked example, computed by hand",
          "[relaxed][lantern][law]") {
  // p, q over 6 tokens, drafted token 2 whose nearest neighbours are 0, 1, 5, 3, 4; the paper's
  // cap with λ = 1 walking k = 2 neighbours keeps A = {0, 1} (0.1 + 0.1 <= 1 · 0.2), so
  // f = (0.2 + 0.2) / 0.6 = 2/3. The official resampling zeroes p at the first k + 1 = 3
  // neighbours {0, 1, 5}: [(0, 0, .2, .3, .25, 0) - q]+ = (0, 0, 0, .2, .15, 0) -> (0, 0, 0,
  // 4/7, 3/7, 0). (Zeroing q there instead would give (1/6, 1/6, 0, 1/3, 1/4, 1/12).)
  const std::vector<double> p = {0.1, 0.1, 0.2, 0.3, 0.25, 0.05};
  const std::vector<double> q = {0.05, 0.05, 0.6, 0.1, 0.1, 0.1};
  const neighbour_table table({1,      2, 3, 4, 5, /**/ 0, 2, 3, 4, 5, /**/ 0, 1, 5, 3, 4,
                               /**/ 0, 1, 2, 4, 5, /**/ 0, 1, 2, 3, 5, /**/ 0, 1, 2, 3, 4},
                              6, 5);
  const auto rule =
      lantern_rule::make_relative(table, 1.0, resampling::lantern_official, lantern_cap::paper, 2);
  const auto b = rule.bind(row_view<const double>(p), 2);
  REQUIRE(b.count == 2);
  CHECK(b.accept_probability(0.0, 0.6) == Approx(2.0 / 3.0).epsilon(1e-15));
  std::vector<double> g(6);
  double sum = 0;
  for (index_t y = 0; y < 6; ++y) {
    g[static_cast<std::size_t>(y)] =
        b.residual_weight_at(y, p[static_cast<std::size_t>(y)], q[static_cast<std::size_t>(y)]);
    sum += g[static_cast<std::size_t>(y)];
  }
  const double want[] = {0, 0, 0, 4.0 / 7.0, 3.0 / 7.0, 0};
  for (std::size_t y = 0; y < 6; ++y) CHECK(g[y] / sum == Approx(want[y]).margin(1e-15));
}

TEST_CASE("LANTERN official resampling: one position's law equals a transcription of the code",
          "[relaxed][lantern][law]") {
  // Random rows over V = 7 with random neighbour lists; the code's `--lantern_delta` d maps to
  // lantern_cap::official with λ = d (d > 1) or the absolute cap δ = d (d <= 1).
  const index_t V = 7;
  int compared = 0, relaxed_some = 0;
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    std::mt19937_64 g(seed);
    std::vector<token_t> ids;
    std::vector<std::vector<token_t>> rows(static_cast<std::size_t>(V));
    for (index_t t = 0; t < V; ++t) {
      for (index_t u = 0; u < V; ++u)
        if (u != t) rows[static_cast<std::size_t>(t)].push_back(static_cast<token_t>(u));
      std::shuffle(rows[static_cast<std::size_t>(t)].begin(),
                   rows[static_cast<std::size_t>(t)].end(), g);
      ids.insert(ids.end(), rows[static_cast<std::size_t>(t)].begin(),
                 rows[static_cast<std::size_t>(t)].end());
    }
    const neighbour_table table(ids, V, V - 1);
    const auto p = testing::random_probability_row(V, seed, 0, 0.0);
    const auto q = testing::random_probability_row(V, seed, 1, 0.0);
    for (const double delta : {0.3, 1.5, 2.5, 4.0})
      for (const index_t k : {index_t{1}, index_t{2}, index_t{4}}) {
        const auto rule =
            delta > 1.0
                ? lantern_rule::make_relative(table, delta, resampling::lantern_official,
                                              lantern_cap::official, k)
                : lantern_rule::make_absolute(table, delta, resampling::lantern_official, k);
        std::vector<double> want(static_cast<std::size_t>(V), 0.0), gx;
        bool uniform_fallback = false;
        for (index_t x = 0; x < V; ++x) {
          const auto sx = static_cast<std::size_t>(x);
          const auto [a, kept] =
              official_accept(p, q[sx], rows[sx], k, static_cast<token_t>(x), delta);
          relaxed_some += kept ? 1 : 0;
          want[sx] += q[sx] * a;
          if (a < 1.0) {
            if (!official_resampling(p, q, rows[sx], k, kept, gx)) uniform_fallback = true;
            for (std::size_t y = 0; y < gx.size(); ++y) want[y] += q[sx] * (1.0 - a) * gx[y];
          }
        }
        if (uniform_fallback) continue;  // the code's uniform fallback (docs/relaxed.md)
        INFO("seed " << seed << " delta " << delta << " k " << k);
        CHECK(testing::max_abs_difference(one_position_law(rule, p, q), want) < 1e-12);
        ++compared;
      }
  }
  CHECK(compared > 120);
  CHECK(relaxed_some > 100);
}
