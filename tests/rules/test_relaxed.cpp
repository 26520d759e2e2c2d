// Relaxed acceptance with exact accounting: Proposition 1, the vanilla case, exact TV below the
// Theorem 2 bound, sampled outputs against the exact relaxed law, schedules, LANTERN++
// neighbour selection, and G* beating G_van when f < f_van.

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "sampled_round.hpp"
#include "specula/rules/exact.hpp"
#include "specula/rules/lantern.hpp"
#include "specula/rules/relaxed.hpp"
#include "specula/rules/typical.hpp"
#include "specula/testing/goodness_of_fit.hpp"
#include "specula/testing/relaxation_analysis.hpp"
#include "specula/testing/toy_models.hpp"
#include "specula/tree/builders.hpp"
#include "specula/verify/candidates.hpp"
#include "specula/verify/chain.hpp"
#include "specula/verify/tree.hpp"

using namespace specula;

namespace {

/// A 1-D codebook for LANTERN tests: token t sits at position pos[t] on a line.
neighbour_table line_table(const std::vector<float>& pos, index_t k) {
  return neighbour_table(batch_view<const float>(pos.data(), static_cast<index_t>(pos.size()), 1),
                         k);
}

}  // namespace

TEST_CASE("Proposition 1: G* equals G_van whenever f >= f_van", "[relaxed]") {
  for (std::uint64_t seed = 1; seed <= 50; ++seed) {
    const auto p = testing::random_probability_row(7, seed, 0, 0.3);
    const auto q = testing::random_probability_row(7, seed, 1, 0.3);
    for (double omega : {1.0, 1.3, 2.0, 5.0}) {
      const relaxed_rule opt{omega, resampling::optimal}, van{omega, resampling::vanilla};
      for (std::size_t y = 0; y < p.size(); ++y) {
        REQUIRE(opt.accept_probability(p[y], q[y]) >= exact_rule{}.accept_probability(p[y], q[y]));
        CHECK(opt.residual_weight(p[y], q[y]) == van.residual_weight(p[y], q[y]));
      }
    }
  }
  // And at the level of output laws, through the verifier's own accounting.
  const testing::toy_ar_model target(3, 3, 5, 0.2);
  const auto draft = testing::toy_ar_model::perturbed(target, 0.8, 6, 0.2);
  const auto sch = relaxation_schedule::make_exponential(1.2, 1.5, 2);
  const auto a = testing::relaxation_accounting(target, draft, 2,
                                                scheduled_relaxed_rule{sch, resampling::optimal});
  const auto b = testing::relaxation_accounting(target, draft, 2,
                                                scheduled_relaxed_rule{sch, resampling::vanilla});
  // ω_2 < 1 here (exponential decay), so Proposition 1 does not apply at position 2 ...
  REQUIRE(sch.omega(2) < 1.0);
  CHECK(a.tv_exact <= b.tv_exact + 1e-15);
  // ... but with every ω >= 1 the laws coincide.
  const auto u1 =
      testing::relaxation_accounting(target, draft, 2, relaxed_rule{1.7, resampling::optimal});
  const auto u2 =
      testing::relaxation_accounting(target, draft, 2, relaxed_rule{1.7, resampling::vanilla});
  CHECK(testing::max_abs_difference(u1.relaxed_law, u2.relaxed_law) < 1e-15);
}

TEST_CASE("vanilla rule: TV bound = 0 and exact TV = 0", "[relaxed][law]") {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const testing::toy_ar_model target(3, 4, seed, 0.3);
    const auto draft = testing::toy_ar_model::perturbed(target, 0.9, seed + 1, 0.3);
    for (index_t L : {1, 2, 3}) {
      const auto e = testing::relaxation_accounting(target, draft, L, exact_rule{});
      const auto r1 = testing::relaxation_accounting(target, draft, L, relaxed_rule{1.0});
      INFO("seed " << seed << " L " << L);
      CHECK(e.tv_bound < 1e-12);
      CHECK(e.tv_exact < 1e-12);
      CHECK(r1.tv_exact < 1e-12);
      CHECK(e.expected_tokens >= 1.0);
      CHECK(e.expected_tokens <= static_cast<double>(L + 1));
    }
  }
}

TEST_CASE("exact TV never exceeds the Theorem 2 bound (120 random toy models)", "[relaxed]") {
  int checked = 0;
  std::vector<token_t> ids = {1, 2, 0, 2, 1, 0};  // V = 3, k = 2 neighbour lists
  const neighbour_table table(ids, 3, 2);
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const testing::toy_ar_model target(3, 4, seed * 13, 0.25);
    const auto draft = testing::toy_ar_model::perturbed(target, 0.8, seed * 13 + 1, 0.25);
    const index_t L = 1 + static_cast<index_t>(seed % 3);
    const auto exp_s = relaxation_schedule::make_exponential(2.5, 0.7, L);
    const auto lin_s = relaxation_schedule::make_linear(2.5, 4, L);
    const auto check = [&](const auto& rule, const char* what) {
      const auto r = testing::relaxation_accounting(target, draft, L, rule);
      INFO(what << " seed " << seed << " L " << L << " tv " << r.tv_exact << " bound "
                << r.tv_bound);
      CHECK(r.tv_exact <= r.tv_bound + 1e-12);
      ++checked;
    };
    check(relaxed_rule{3.0, resampling::optimal}, "uniform G*");
    check(relaxed_rule{0.5, resampling::vanilla}, "tight G_van");
    check(scheduled_relaxed_rule{exp_s, resampling::optimal}, "exponential");
    check(scheduled_relaxed_rule{lin_s, resampling::vanilla}, "linear");
    check(lantern_rule::make_relative(table, 1.0, resampling::lantern), "LANTERN++");
    check(typical_rule::make(0.09, 0.3), "typical");
  }
  CHECK(checked == 120);
}

TEST_CASE("sampled outputs follow the exact relaxed law and their TV agrees with the exact TV",
          "[relaxed][stats]") {
  // One relaxed round (L = 2, exponential schedule, G*) through the checked batched verifier,
  // extended to L + 1 tokens with target samples, repeated n times.
  const testing::toy_ar_model target(3, 3, 77, 0.2);
  const auto draft = testing::toy_ar_model::perturbed(target, 0.8, 78, 0.2);
  const index_t L = 2;
  const auto sch = relaxation_schedule::make_exponential(3.0, 0.5, L);
  const scheduled_relaxed_rule rule{sch, resampling::optimal};
  const auto exact = testing::relaxation_accounting(target, draft, L, rule);
  REQUIRE(exact.tv_exact > 0.01);  // a relaxation that really distorts

  const std::uint64_t n = 200'000;
  const auto counts = test_support::sampled_round_counts(target, draft, L, rule, n, 11);
  // The samples fit the exact relaxed law ...
  const auto fit = testing::g_test(counts, exact.relaxed_law);
  INFO("G-test against P-hat: " << fit);
  CHECK(fit.p_value > 1e-4);
  // ... and their TV to the target agrees with the exact TV: |TV_emp − TV_exact| <=
  // TV(emp, P-hat) <= E[TV(emp, P-hat)] + sqrt(log(2/α)/(2n)) with
  // E[TV(emp, P-hat)] <= 1/2 Σ sqrt(P-hat (1 − P-hat) / n) and α = 1e-6.
  const auto emp = testing::empirical_law(counts);
  const double tv_emp = testing::total_variation(emp, exact.target_law);
  double mean_dev = 0.0;
  for (double v : exact.relaxed_law) mean_dev += std::sqrt(v * (1 - v) / static_cast<double>(n));
  const double ci =
      0.5 * mean_dev + std::sqrt(std::log(2.0 / 1e-6) / (2.0 * static_cast<double>(n)));
  INFO("tv_emp " << tv_emp << " tv_exact " << exact.tv_exact << " ci " << ci);
  CHECK(std::abs(tv_emp - exact.tv_exact) <= ci);
}

TEST_CASE("schedules: normalisation and the documented edge rules", "[relaxed]") {
  const index_t L = 6;
  const auto e = relaxation_schedule::make_exponential(1.8, 0.7, L);
  double mean = 0;
  for (index_t i = 1; i <= L; ++i) mean += e.omega(i) / L;
  CHECK(mean == Approx(1.8).epsilon(1e-12));
  for (index_t i = 1; i < L; ++i) CHECK(e.omega(i) > e.omega(i + 1));
  // Direct formula: δ·L·e^{−νi}/Σ_j e^{−νj}.
  double s = 0;
  for (index_t j = 1; j <= L; ++j) s += std::exp(-0.7 * j);
  CHECK(e.omega(2) == Approx(1.8 * L * std::exp(-1.4) / s).epsilon(1e-12));
  // ν = 0 reduces to uniform.
  const auto e0 = relaxation_schedule::make_exponential(1.8, 0.0, L);
  CHECK(e0.omega(4) == Approx(1.8).epsilon(1e-14));

  const auto lin = relaxation_schedule::make_linear(2.0, 8, 4);  // ℓ > L: the paper's formula
  double lmean = 0, wsum = 0;
  for (index_t i = 1; i <= 4; ++i) {
    lmean += lin.omega(i) / 4;
    wsum += (8.0 - i) / 72.0;
  }
  CHECK(lmean == Approx(2.0).epsilon(1e-12));
  CHECK(lin.omega(1) == Approx(2.0 * 4 * (7.0 / 72.0) / wsum).epsilon(1e-12));
  const auto lin2 = relaxation_schedule::make_linear(2.0, 4, 6);  // positions >= ℓ = 4
  CHECK(lin2.omega(4) == 1.0);
  CHECK(lin2.omega(6) == 1.0);
  CHECK((lin2.omega(1) + lin2.omega(2) + lin2.omega(3)) / 3 == Approx(2.0).epsilon(1e-12));

  const std::vector<double> vals = {3.0, 2.0};
  const auto c = relaxation_schedule::make_custom(vals.data(), 2);
  CHECK(c.omega(1) == 3.0);
  CHECK(c.omega(2) == 2.0);
  CHECK(c.omega(3) == 1.0);
  CHECK(relaxation_schedule::make_uniform(1.5).omega(9) == 1.5);
  // The scheduled rule at depth d uses position d + 1.
  const scheduled_relaxed_rule sr{e, resampling::optimal};
  CHECK(sr.at(0).omega == e.omega(1));
  CHECK(sr.at(3).omega == e.omega(4));

  CHECK_THROWS_WITH(relaxation_schedule::make_uniform(0.0), Catch::Contains("delta"));
  CHECK_THROWS_WITH(relaxation_schedule::make_exponential(1.0, -1.0, 3), Catch::Contains("nu"));
  CHECK_THROWS_WITH(relaxation_schedule::make_linear(1.0, 1.0, 3), Catch::Contains("ell"));
  CHECK_THROWS_WITH(relaxation_schedule::make_exponential(1.0, 1.0, 0), Catch::Contains("length"));
  const std::vector<double> bad = {1.0, -2.0};
  CHECK_THROWS_WITH(relaxation_schedule::make_custom(bad.data(), 2),
                    Catch::Contains("values[row 1]"));
}

TEST_CASE("LANTERN++ neighbour selection on a hand-worked example", "[relaxed]") {
  // Tokens on a line at 0, 1, 3, 6, 10, 2.5. Neighbours of token 2 (at 3) by distance:
  // token 5 (0.5), token 1 (2), token 3 (3), token 0 (3).  Ties (3 vs 3) go to the lower id.
  const std::vector<float> pos = {0.0f, 1.0f, 3.0f, 6.0f, 10.0f, 2.5f};
  const auto table = line_table(pos, 4);
  CHECK(table.neighbours(2) == std::vector<token_t>{5, 1, 0, 3});
  CHECK(table.neighbours(4) == std::vector<token_t>{3, 2, 5, 1});
  // Cosine on 2-D vectors: (1,0), (0,1), (1,1), (-1,0).
  const std::vector<float> vec = {1, 0, 0, 1, 1, 1, -1, 0};
  const neighbour_table cos(batch_view<const float>(vec.data(), 4, 2), 2, neighbour_metric::cosine);
  CHECK(cos.neighbours(0) == std::vector<token_t>{2, 1});
  CHECK(cos.neighbours(3) == std::vector<token_t>{1, 2});

  // p over the 6 tokens; drafted token 2 with p = 0.2, λ = 1: limit 0.2.
  // Walk: token 5 (0.05) -> 0.05 <= 0.2 keep; token 1 (0.1) -> 0.15 keep; token 0 (0.1) ->
  // 0.25 > 0.2 stop. A = {5, 1}; aggregated mass 0.2 + 0.15 = 0.35.
  const std::vector<double> p = {0.1, 0.1, 0.2, 0.3, 0.25, 0.05};
  const row_view<const double> pr(p);
  const auto rule = lantern_rule::make_relative(table, 1.0, resampling::lantern);
  const auto b = rule.bind(pr, 2);
  REQUIRE(b.count == 2);
  CHECK(b.members[0] == 5);
  CHECK(b.members[1] == 1);
  CHECK(b.mass == Approx(0.35));
  CHECK(b.accept_probability(0.2, 0.7) == Approx(0.5));
  CHECK(b.accept_probability(0.2, 0.3) == 1.0);
  // LANTERN++ residual: P^{k,λ} = (0.1, 0, 0.35, 0.3, 0.25, 0) minus q.
  const std::vector<double> q = {0.1, 0.1, 0.4, 0.1, 0.2, 0.1};
  const double want[] = {0.0, 0.0, 0.0, 0.2, 0.05, 0.0};
  for (index_t y = 0; y < 6; ++y)
    CHECK(b.residual_weight_at(y, p[static_cast<std::size_t>(y)], q[static_cast<std::size_t>(y)]) ==
          Approx(want[y]).margin(1e-15));
  // Absolute mode (LANTERN): δ = 0.12 keeps token 5 (0.05) and token 1 (0.15 > 0.12 stops).
  const auto ab = lantern_rule::make_absolute(table, 0.12).bind(pr, 2);
  CHECK(ab.count == 1);
  CHECK(ab.mass == Approx(0.25));
  // λ = 0 keeps nothing: the exact rule's acceptance.
  const auto z = lantern_rule::make_relative(table, 0.0).bind(pr, 2);
  CHECK(z.count == 0);
  CHECK(z.accept_probability(0.2, 0.4) == Approx(0.5));
  CHECK_THROWS_AS(line_table(pos, 6), invalid_input);
  CHECK_THROWS_AS(neighbour_table(std::vector<token_t>{1, 1}, 2, 1), invalid_input);
}

namespace {

/// Host passes whose signed sum returns a set value (stands in for a backend's own pass).
struct summing_passes : sequential_passes {
  double value = 0.0;
  template <class WeightFn>
  double sum(index_t, WeightFn&&) const {
    return value;
  }
};

}  // namespace

TEST_CASE("typical acceptance sums its entropy in the row passes' order", "[relaxed]") {
  const typical_rule rule = typical_rule::make(0.09, 0.3);
  for (index_t n : {1, 7, 256, 1000, 5000}) {
    const auto pd = testing::random_probability_row(n, 71, 0, 0.3);
    const std::vector<float> p(pd.begin(), pd.end());
    const row_view<const float> pr(p);
    // The entropy's terms −p·log p (p > 0) in the tile order written out: lane k of each 256-entry
    // tile adds entries k, k + 8, ...; lanes combine ((0+1)+(2+3))+((4+5)+(6+7)); tiles add up
    // left to right. The device's CTA-wide pass adds in this order too (docs/cuda.md).
    double want = 0.0, sequential = 0.0;
    for (index_t t = 0; t < n; t += 256) {
      double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (index_t i = t; i < n && i < t + 256; ++i) {
        const double v = p[static_cast<std::size_t>(i)];
        if (v > 0.0) {
          lane[(i - t) % 8] -= detail::mul_rn(v, std::log(v));
          sequential -= detail::mul_rn(v, std::log(v));
        }
      }
      want +=
          ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    }
    INFO("n " << n);
    CHECK(typical_rule::entropy(pr) == want);
    CHECK(want == Approx(sequential).epsilon(1e-12));
    const double threshold = std::min(0.09, 0.3 * std::exp(-want));
    CHECK(rule.bind(pr, 0).threshold == threshold);
    // Through the host's passes (ordered_sum): the same bits.
    CHECK(bind_rule(rule, pr, 0, sequential_passes{}).threshold == threshold);
  }
  // Passes with a sum of their own (the CUDA backend's CTA-wide pass) make the reduction.
  summing_passes passes;
  passes.value = 2.0;
  const std::vector<float> p{0.5f, 0.25f, 0.25f};
  CHECK(bind_rule(rule, row_view<const float>(p), 0, passes).threshold ==
        std::min(0.09, 0.3 * std::exp(-2.0)));
}

TEST_CASE("with f < f_van, G* gives strictly lower exact TV than G_van", "[relaxed]") {
  // ω = 0.5 tightens acceptance (f < f_van where p < 2q).
  const testing::toy_ar_model target(3, 2, 4, 0.0);
  const auto draft = testing::toy_ar_model::perturbed(target, 0.7, 5, 0.0);
  const auto gs =
      testing::relaxation_accounting(target, draft, 1, relaxed_rule{0.5, resampling::optimal});
  const auto gv =
      testing::relaxation_accounting(target, draft, 1, relaxed_rule{0.5, resampling::vanilla});
  INFO("G* " << gs.tv_exact << " G_van " << gv.tv_exact);
  CHECK(gs.tv_exact < 1e-12);  // G* even restores the target law exactly in one position
  CHECK(gv.tv_exact > 1e-3);
  CHECK(gs.expected_tokens == Approx(gv.expected_tokens));
}

TEST_CASE("relaxed rules in trees use ω by depth, and checked calls validate rules",
          "[relaxed][tree]") {
  // A chain-shaped tree with a scheduled rule verifies like verify_chain with the same rule.
  const index_t V = 16;
  std::vector<float> p, q;
  for (std::uint32_t k = 0; k < 4; ++k) {
    const auto a = testing::random_probability_row(V, 9, 2 * k, 0.1);
    const auto b = testing::random_probability_row(V, 9, 2 * k + 1, 0.1);
    p.insert(p.end(), a.begin(), a.end());
    q.insert(q.end(), b.begin(), b.end());
  }
  const auto sch = relaxation_schedule::make_exponential(2.0, 0.6, 3);
  const scheduled_relaxed_rule rule{sch, resampling::optimal};
  token_tree tree = trees::chain(3);
  for (std::uint32_t step = 0; step < 40; ++step) {
    std::vector<token_t> drafts;
    for (index_t i = 0; i < 3; ++i) {
      token_t best = 0;
      for (index_t y = 0; y < V; ++y)
        if (q[static_cast<std::size_t>(i * V + y)] > q[static_cast<std::size_t>(i * V + best)])
          best = static_cast<token_t>(y);
      drafts.push_back(static_cast<token_t>((best + step) % V));
      tree.set_token(i + 1, drafts.back());
    }
    bool positive = true;
    for (index_t i = 0; i < 3; ++i)
      positive =
          positive && q[static_cast<std::size_t>(i * V + drafts[static_cast<std::size_t>(i)])] > 0;
    if (!positive) continue;
    const std::vector<request_rng> rng = {{3, 0, step}};
    std::vector<token_t> t_out(4), c_out(4);
    std::vector<std::int32_t> tn(1), cn(1);
    verify_tree(host::seq,
                tree_batch_input<float>{V, {&tree, 1}, {p.data(), 4, V}, {q.data(), 4, V}, rng},
                tree_batch_output{t_out, tn, {}, {}}, tree_options{}, rule);
    const std::vector<index_t> off = {0, 3};
    verify_chain(host::seq,
                 chain_batch_input<float>{V, off, drafts, {q.data(), 3, V}, {p.data(), 4, V}, rng},
                 chain_batch_output{c_out, cn, {}, {}}, {}, rule);
    CHECK(tn == cn);
    CHECK(t_out == c_out);
  }
  // Per-request rules: one per request, checked.
  const std::vector<relaxed_rule> rules = {relaxed_rule{2.0}};
  const std::vector<index_t> off = {0, 1};
  const std::vector<token_t> d = {0};
  const std::vector<request_rng> rng = {{1, 0, 0}, {1, 1, 0}};
  const std::vector<index_t> off2 = {0, 1, 1};
  std::vector<token_t> out(3);
  std::vector<std::int32_t> n(2);
  q[0] = 1.0f;
  for (index_t y = 1; y < V; ++y) q[static_cast<std::size_t>(y)] = 0.0f;
  CHECK_THROWS_WITH(
      verify_chain(host::seq,
                   chain_batch_input<float>{V, off2, d, {q.data(), 1, V}, {p.data(), 3, V}, rng},
                   chain_batch_output{out, n, {}, {}}, {}, per_request<relaxed_rule>{rules}),
      Catch::Contains("rule") && Catch::Contains("one rule per request"));
  // A LANTERN table for another vocabulary is rejected.
  const std::vector<float> pos = {0.0f, 1.0f, 2.0f};
  const auto small = line_table(pos, 1);
  CHECK_THROWS_WITH(
      verify_chain(
          host::seq,
          chain_batch_input<float>{V, off, d, {q.data(), 1, V}, {p.data(), 2, V}, {rng.data(), 1}},
          chain_batch_output{{out.data(), 2}, {n.data(), 1}, {}, {}}, {},
          lantern_rule::make_relative(small, 1.0)),
      Catch::Contains("rule.table"));
}

TEST_CASE("checked calls refuse bad relaxation parameters, naming the field",
          "[relaxed][bad_input]") {
  test_support::one_draft_chain chain;
  const index_t V = chain.V;
  const auto& p = chain.p;
  const auto& q = chain.q;  // 2 tree rows
  const auto& rng = chain.rng;
  auto& out = chain.out;
  auto& n = chain.n;
  token_tree tree = trees::chain(1);
  tree.set_token(1, 2);
  const auto tree_call = [&](const auto& rule) {
    verify_tree(host::seq,
                tree_batch_input<float>{V, {&tree, 1}, {p.data(), 2, V}, {q.data(), 2, V}, rng},
                tree_batch_output{out, n, {}, {}}, tree_options{}, rule);
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();

  // ω of the scalar rule: NaN, negative, zero and +inf would silently reject or accept everything.
  for (const double omega : {nan, -1.0, 0.0, inf}) {
    INFO("omega " << omega);
    CHECK_THROWS_WITH(chain(relaxed_rule{omega}), Catch::Contains("rule.omega"));
    CHECK_THROWS_WITH(tree_call(relaxed_rule{omega}), Catch::Contains("rule.omega"));
    const std::vector<relaxed_rule> rules = {relaxed_rule{omega}};
    CHECK_THROWS_WITH(chain(per_request<relaxed_rule>{rules}), Catch::Contains("rule.omega"));
    const std::vector<token_t> cand = {2};
    std::vector<double> ws(static_cast<std::size_t>(candidates_workspace_size(1)));
    CHECK_THROWS_WITH(
        verify_candidates_checked(relaxed_rule{omega}, rng[0], row_view<const float>(p.data(), V),
                                  without_replacement<float>{{q.data(), V}},
                                  row_view<const token_t>(cand.data(), 1),
                                  row_view<double>(ws.data(), static_cast<index_t>(ws.size())), 0),
        Catch::Contains("rule.omega"));
  }
  CHECK_THROWS_WITH(chain(relaxed_rule{2.0, resampling::lantern}),
                    Catch::Contains("rule.resample"));

  // Schedules assembled field by field (the make_* functions refuse these arguments too).
  const auto scheduled = [](relaxation_schedule s) {
    return scheduled_relaxed_rule{s, resampling::optimal};
  };
  relaxation_schedule s;
  s.kind = schedule_kind::uniform;
  s.delta = nan;
  CHECK_THROWS_WITH(chain(scheduled(s)), Catch::Contains("schedule.delta"));
  CHECK_THROWS_WITH(tree_call(scheduled(s)), Catch::Contains("schedule.delta"));
  s = relaxation_schedule::make_exponential(2.0, 0.7, 4);
  s.mu = inf;
  CHECK_THROWS_WITH(chain(scheduled(s)), Catch::Contains("schedule.mu"));
  s = relaxation_schedule::make_exponential(2.0, 0.7, 4);
  s.nu = -0.5;
  CHECK_THROWS_WITH(chain(scheduled(s)), Catch::Contains("schedule.nu"));
  s = relaxation_schedule::make_linear(2.0, 8.0, 4);
  s.ell = 1.0;
  CHECK_THROWS_WITH(chain(scheduled(s)), Catch::Contains("schedule.ell"));
  s = relaxation_schedule::make_linear(2.0, 8.0, 4);
  s.linear_scale = 0.0;
  CHECK_THROWS_WITH(chain(scheduled(s)), Catch::Contains("schedule.linear_scale"));
  s = relaxation_schedule{};
  s.kind = schedule_kind::custom;
  s.count = 2;
  CHECK_THROWS_WITH(chain(scheduled(s)), Catch::Contains("schedule.values"));
  const std::vector<double> values = {1.5, -1.0};
  s.values = values.data();
  CHECK_THROWS_WITH(chain(scheduled(s)), Catch::Contains("schedule.values"));
  CHECK_THROWS_WITH(
      chain(scheduled_relaxed_rule{relaxation_schedule::make_uniform(2.0), resampling::lantern}),
      Catch::Contains("rule.resample"));
  // The make_* functions refuse the same values.
  CHECK_THROWS_WITH(relaxation_schedule::make_uniform(0.0), Catch::Contains("delta"));
  CHECK_THROWS_WITH(relaxation_schedule::make_exponential(2.0, nan, 4), Catch::Contains("nu"));
  CHECK_THROWS_WITH(relaxation_schedule::make_exponential(2.0, 0.7, 0), Catch::Contains("length"));
  CHECK_THROWS_WITH(relaxation_schedule::make_linear(2.0, 1.5, 4), Catch::Contains("ell"));
  CHECK_THROWS_WITH(relaxation_schedule::make_custom(values.data(), 2), Catch::Contains("values"));

  // Typical acceptance and LANTERN built field by field.
  CHECK_THROWS_WITH(chain(typical_rule{2.0, 0.3}), Catch::Contains("epsilon"));
  CHECK_THROWS_WITH(chain(typical_rule{0.09, nan}), Catch::Contains("alpha"));
  const std::vector<float> pos = {0.0f, 1.0f, 2.0f, 3.0f};
  const auto table = line_table(pos, 1);
  auto lantern = lantern_rule::make_relative(table, 1.0);
  lantern.limit_param = nan;
  CHECK_THROWS_WITH(chain(lantern), Catch::Contains("rule.limit_param"));

  // Valid parameters pass (the checks above fail for the named reason only).
  CHECK_NOTHROW(chain(relaxed_rule{2.0}));
  CHECK_NOTHROW(chain(scheduled(relaxation_schedule::make_linear(2.0, 8.0, 4))));
  CHECK_NOTHROW(chain(scheduled(relaxation_schedule::make_custom(values.data(), 1))));
}
