// Row-aware rules (LANTERN / LANTERN++, typical acceptance, Cool-SD's schedule composed with
// LANTERN++) in K-candidate and tree verification: the law of verify_candidates, enumerated
// over its randomness, equals the independent transcription in
// specula/testing/relaxation_analysis.hpp (candidates_law) for K = 1..3 candidates drawn without
// replacement, i.i.d. or given; exact configurations stay lossless; neighbouring conventions give
// other laws (negative controls); one candidate and a chain-shaped tree verify exactly like
// verify_chain; per-request rules; bad input.

#include <catch2/catch.hpp>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "chain_test_util.hpp"
#include "specula/rules/lantern.hpp"
#include "specula/rules/relaxed.hpp"
#include "specula/rules/typical.hpp"
#include "specula/sample/without_replacement.hpp"
#include "specula/testing/catch2.hpp"
#include "specula/testing/enumerate.hpp"
#include "specula/testing/goodness_of_fit.hpp"
#include "specula/testing/relaxation_analysis.hpp"
#include "specula/testing/toy_models.hpp"
#include "specula/tree/builders.hpp"
#include "specula/verify/candidates.hpp"
#include "specula/verify/chain.hpp"
#include "specula/verify/tree.hpp"

using namespace specula;
using specula::test::view;
using testing::candidate_draw;

namespace {

constexpr index_t line_vocab = 5;

/// Hand-made neighbour lists of 5 tokens on a line 0-1-2-3-4 (nearest first, ties to the
/// smaller id), 3 per token.
neighbour_table line_table() {
  return neighbour_table({1, 2, 3, /**/ 0, 2, 3, /**/ 1, 3, 0, /**/ 2, 4, 1, /**/ 3, 2, 1},
                         line_vocab, 3);
}

/// Experiment: candidates drawn through the source (or given), verified with `rule` at `depth`.
template <class Rule>
auto k_candidates(const Rule& rule, index_t depth, const std::vector<double>& p,
                  const std::vector<double>& q, index_t k, candidate_draw draw,
                  const std::vector<token_t>& fixed) {
  return [&rule, depth, &p, &q, k, draw, &fixed](auto& src) -> index_t {
    const auto rule_d = rule_at(rule, depth);
    std::vector<token_t> cand(static_cast<std::size_t>(k));
    auto qw = [&](index_t y) { return q[static_cast<std::size_t>(y)]; };
    index_t got = k;
    if (draw == candidate_draw::fixed) {
      cand = fixed;
    } else if (draw == candidate_draw::without_replacement) {
      got = sample_without_replacement_sequential(src, line_vocab, qw, k, 77, 0, cand.data());
    } else {
      for (index_t j = 0; j < k; ++j)
        cand[static_cast<std::size_t>(j)] = static_cast<token_t>(
            src.categorical(line_vocab, qw, 1.0, draw_id{77, static_cast<std::uint32_t>(j)}));
    }
    std::vector<double> ws(static_cast<std::size_t>(
        candidates_workspace_size<std::remove_cvref_t<decltype(rule_d)>>(k, line_vocab)));
    candidates_result r;
    const auto pv = view(p);
    const auto qv = view(q);
    if (draw == candidate_draw::fixed)
      r = verify_candidates(rule_d, src, pv, one_hot_candidates{}, cand.data(), got, 0.0, 0,
                            ws.data());
    else if (draw == candidate_draw::without_replacement)
      r = verify_candidates(rule_d, src, pv, without_replacement<double>{qv}, cand.data(), got, 0.0,
                            0, ws.data());
    else
      r = verify_candidates(rule_d, src, pv, with_replacement<double>{qv}, cand.data(), got, 0.0, 0,
                            ws.data());
    REQUIRE((r.flags & chain_valid) != 0);
    return r.token;
  };
}

/// The enumerated law of verify_candidates and its difference from candidates_law.
template <class Rule>
double law_gap(const Rule& rule, index_t depth, const std::vector<double>& p,
               const std::vector<double>& q, index_t k, candidate_draw draw,
               const std::vector<token_t>& fixed, std::vector<double>* enumerated = nullptr) {
  const auto law =
      testing::enumerate_token_law(line_vocab, k_candidates(rule, depth, p, q, k, draw, fixed));
  CHECK(law.invalid_mass == 0.0);
  const auto ref = testing::candidates_law(rule, depth, p, q, k, draw, fixed, 0.0);
  if (enumerated != nullptr) *enumerated = law.probability;
  return testing::max_abs_difference(law.probability, ref);
}

/// The argument a call's invalid_input names ("" when it does not throw).
template <class Call>
std::string refused_argument(Call&& call) {
  try {
    call();
  } catch (const invalid_input& e) {
    return e.argument();
  }
  return "";
}

const candidate_draw draws[] = {candidate_draw::without_replacement,
                                candidate_draw::with_replacement, candidate_draw::fixed};
const std::vector<token_t> fixed_lists[] = {{2}, {2, 3}, {1, 4, 1}};

}  // namespace

TEST_CASE("row-aware rules over K candidates follow the enumerated recursion law",
          "[verify][tree][relaxed][law]") {
  const auto table = line_table();
  const std::vector<lantern_rule> lanterns = {
      lantern_rule::make_relative(table, 1.5),
      lantern_rule::make_relative(table, 3.0, resampling::lantern),
      lantern_rule::make_relative(table, 2.5, resampling::lantern_official, lantern_cap::official,
                                  2),
      lantern_rule::make_absolute(table, 0.2, resampling::vanilla)};
  const scheduled_lantern_rule scheduled{lantern_rule::make_relative(table, 1.0),
                                         relaxation_schedule::make_exponential(2.0, 0.7, 3)};
  const typical_rule typical = typical_rule::make(0.3, 0.3);
  double max_gap = 0.0;
  int cases = 0;
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    const auto p = testing::random_probability_row(line_vocab, seed, 0, 0.2);
    const auto q = testing::random_probability_row(line_vocab, seed, 1, 0.2);
    for (const candidate_draw draw : draws)
      for (index_t k = 1; k <= 3; ++k) {
        const auto& fixed = fixed_lists[k - 1];
        INFO("seed " << seed << " draw " << static_cast<int>(draw) << " K " << k);
        for (const auto& rule : lanterns)
          max_gap = std::max(max_gap, law_gap(rule, 0, p, q, k, draw, fixed));
        for (index_t depth = 0; depth < 3; ++depth)
          max_gap = std::max(max_gap, law_gap(scheduled, depth, p, q, k, draw, fixed));
        max_gap = std::max(max_gap, law_gap(typical, 0, p, q, k, draw, fixed));
        cases += 8;
      }
  }
  CHECK(cases == 216);
  CHECK(max_gap < 1e-12);
}

TEST_CASE("row-aware rules in their exact configuration stay lossless over K candidates",
          "[verify][tree][relaxed][law]") {
  // LANTERN++ with λ = 0 aggregates no mass; with G* (or G_van) it is the exact rule, for any K
  // and however the candidates came about.
  const auto table = line_table();
  const auto rule = lantern_rule::make_relative(table, 0.0);
  const scheduled_lantern_rule scheduled{rule, relaxation_schedule::make_uniform(1.0)};
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    const auto p = testing::random_probability_row(line_vocab, seed, 2, 0.3);
    const auto q = testing::random_probability_row(line_vocab, seed, 3, 0.3);
    for (const candidate_draw draw : draws)
      for (index_t k = 1; k <= 3; ++k) {
        INFO("seed " << seed << " draw " << static_cast<int>(draw) << " K " << k);
        SPECULA_REQUIRE_LOSSLESS(p, k_candidates(rule, 0, p, q, k, draw, fixed_lists[k - 1]));
        SPECULA_REQUIRE_LOSSLESS(p, k_candidates(scheduled, 1, p, q, k, draw, fixed_lists[k - 1]));
      }
  }
}

TEST_CASE("negative controls: the law of a neighbouring rule is measurably different",
          "[verify][tree][relaxed][law]") {
  // The equality above can fail: the enumerated law of one rule against the transcribed law of a
  // neighbouring one (another λ, another resampling, another depth of the schedule, a rule bound
  // to p instead of the residual target at later steps).
  const auto table = line_table();
  const auto p = testing::random_probability_row(line_vocab, 7, 0, 0.2);
  const auto q = testing::random_probability_row(line_vocab, 7, 1, 0.2);
  const auto used = lantern_rule::make_relative(table, 1.5);
  std::vector<double> enumerated;
  REQUIRE(law_gap(used, 0, p, q, 3, candidate_draw::without_replacement, {}, &enumerated) < 1e-12);
  const auto gap_to = [&](const auto& other, index_t depth) {
    return testing::max_abs_difference(
        enumerated, testing::candidates_law(other, depth, p, q, 3,
                                            candidate_draw::without_replacement, {}, 0.0));
  };
  CHECK(testing::max_abs_difference(enumerated, p) > 1e-3);  // the rule does relax here
  CHECK(gap_to(lantern_rule::make_relative(table, 2.5), 0) > 1e-3);
  CHECK(gap_to(lantern_rule::make_relative(table, 1.5, resampling::lantern), 0) > 1e-3);
  const scheduled_lantern_rule scheduled{used, relaxation_schedule::make_exponential(2.0, 0.7, 3)};
  CHECK(gap_to(scheduled, 0) > 1e-3);
  CHECK(gap_to(scheduled, 2) > 1e-3);
  // A verifier that binds every step to p (not to p^(k)): its law, by the same enumeration.
  const auto biased = testing::enumerate_token_law(line_vocab, [&](auto& src) -> index_t {
    std::vector<token_t> cand(3);
    auto qw = [&](index_t y) { return q[static_cast<std::size_t>(y)]; };
    const index_t got =
        sample_without_replacement_sequential(src, line_vocab, qw, 3, 77, 0, cand.data());
    for (index_t j = 0; j < got; ++j) {
      const auto b = used.bind(view(p), cand[static_cast<std::size_t>(j)]);
      if (src.bernoulli(b.accept_probability(0.0, q[static_cast<std::size_t>(cand[j])]),
                        draw_id{0, static_cast<std::uint32_t>(2 * j)}))
        return cand[static_cast<std::size_t>(j)];
    }
    const auto b = used.bind(view(p), cand[0]);
    auto r = [&](index_t y) {
      return b.residual_weight_at(y, p[static_cast<std::size_t>(y)],
                                  q[static_cast<std::size_t>(y)]);
    };
    double total = 0.0;
    for (index_t y = 0; y < line_vocab; ++y) total += r(y);
    return src.categorical(line_vocab, r, total, draw_id{0, 1});
  });
  CHECK(testing::max_abs_difference(biased.probability, enumerated) > 1e-3);
}

TEST_CASE("a chain-shaped tree with a row-aware rule verifies exactly like verify_chain",
          "[verify][tree][relaxed]") {
  const auto table = line_table();
  const scheduled_lantern_rule rule{lantern_rule::make_relative(table, 1.0),
                                    relaxation_schedule::make_linear(2.0, 8.0, 3)};
  const testing::toy_ar_model target(line_vocab, 4, 41, 0.1), draft(line_vocab, 4, 42, 0.1);
  constexpr index_t L = 3;
  int differing_runs = 0;
  for (std::uint32_t run = 0; run < 300; ++run) {
    // Drafts: a fixed pseudo-random chain; rows of the models along it.
    std::vector<token_t> drafts;
    std::vector<float> prow, qrow;
    for (index_t i = 0; i <= L; ++i) {
      const auto p = target.row(drafts);
      prow.insert(prow.end(), p.begin(), p.end());
      const auto q = draft.row(drafts);
      qrow.insert(qrow.end(), q.begin(), q.end());
      if (i < L) drafts.push_back(static_cast<token_t>((run * 7 + i * 3) % line_vocab));
    }
    bool drafts_possible = true;
    for (index_t i = 0; i < L; ++i)
      drafts_possible =
          drafts_possible && qrow[static_cast<std::size_t>(i * line_vocab + drafts[i])] > 0;
    if (!drafts_possible) continue;
    const std::vector<request_rng> rng = {{9, run, 0}};
    const std::vector<index_t> off = {0, L};
    std::vector<token_t> chain_out(L + 1);
    std::vector<std::int32_t> chain_acc(1);
    verify_chain(host::seq,
                 chain_batch_input<float>{line_vocab,
                                          off,
                                          drafts,
                                          {qrow.data(), L, line_vocab},
                                          {prow.data(), L + 1, line_vocab},
                                          rng},
                 chain_batch_output{chain_out, chain_acc, {}, {}}, {}, rule);
    std::vector<token_t> tokens = {0};
    tokens.insert(tokens.end(), drafts.begin(), drafts.end());
    const std::vector<token_tree> trees = {trees::chain(tokens)};
    std::vector<token_t> tree_out(L + 1);
    std::vector<std::int32_t> tree_acc(1);
    verify_tree(host::seq,
                tree_batch_input<float>{line_vocab,
                                        trees,
                                        {prow.data(), L + 1, line_vocab},
                                        {qrow.data(), L + 1, line_vocab},
                                        rng},
                tree_batch_output{tree_out, tree_acc, {}, {}}, {}, rule);
    CHECK(tree_acc[0] == chain_acc[0]);
    CHECK(tree_out == chain_out);
    differing_runs += chain_acc[0] < L ? 1 : 0;
  }
  CHECK(differing_runs > 20);  // rejections were exercised, not only full acceptances
}

TEST_CASE("per-request row-aware rules in tree verification equal single-rule calls",
          "[verify][tree][relaxed]") {
  const auto table = line_table();
  const std::vector<lantern_rule> rules = {lantern_rule::make_relative(table, 0.5),
                                           lantern_rule::make_relative(table, 3.0)};
  const testing::toy_ar_model target(line_vocab, 3, 51, 0.0), draft(line_vocab, 3, 52, 0.0);
  const token_tree shape = trees::full(2, 2);
  // Both requests: the same tree and rows (each child's q row is its parent's draft row).
  std::vector<float> prow, qrow;
  std::vector<token_t> tokens(static_cast<std::size_t>(shape.size()), 0);
  for (index_t u = 0; u < shape.size(); ++u) {
    std::vector<token_t> path;
    for (index_t a = u; a > 0; a = shape.parent(a)) path.insert(path.begin(), 0);
    const auto p = target.row(path);
    const auto q = draft.row(path);
    prow.insert(prow.end(), p.begin(), p.end());
    qrow.insert(qrow.end(), q.begin(), q.end());
  }
  // Sibling tokens: the two most likely draft tokens of the parent's row, distinct.
  for (index_t u = 0; u < shape.size(); ++u) {
    index_t j = 0;
    for (index_t c = shape.first_child(u); c >= 0; c = shape.next_sibling(c), ++j)
      tokens[static_cast<std::size_t>(c)] = static_cast<token_t>(j + 1);
  }
  const token_tree tree = trees::from_parents(std::vector<index_t>([&] {
                                                std::vector<index_t> par;
                                                for (index_t u = 0; u < shape.size(); ++u)
                                                  par.push_back(shape.parent(u));
                                                return par;
                                              }()),
                                              tokens);
  const index_t n = tree.size();
  std::vector<float> p2 = prow, q2 = qrow;
  p2.insert(p2.end(), prow.begin(), prow.end());
  q2.insert(q2.end(), qrow.begin(), qrow.end());
  for (std::uint32_t run = 0; run < 200; ++run) {
    const std::vector<request_rng> rng = {{3, 2 * run, 0}, {3, 2 * run + 1, 0}};
    const std::vector<token_tree> both = {tree, tree};
    std::vector<token_t> out(static_cast<std::size_t>(2 * n));
    std::vector<std::int32_t> acc(2);
    verify_tree(
        host::seq,
        tree_batch_input<float>{
            line_vocab, both, {p2.data(), 2 * n, line_vocab}, {q2.data(), 2 * n, line_vocab}, rng},
        tree_batch_output{out, acc, {}, {}}, {},
        per_request<lantern_rule>{row_view<const lantern_rule>(rules.data(), 2)});
    for (index_t b = 0; b < 2; ++b) {
      const std::vector<token_tree> one = {tree};
      const std::vector<request_rng> rng1 = {rng[static_cast<std::size_t>(b)]};
      std::vector<token_t> out1(static_cast<std::size_t>(n));
      std::vector<std::int32_t> acc1(1);
      verify_tree(
          host::seq,
          tree_batch_input<float>{
              line_vocab, one, {prow.data(), n, line_vocab}, {qrow.data(), n, line_vocab}, rng1},
          tree_batch_output{out1, acc1, {}, {}}, {}, rules[static_cast<std::size_t>(b)]);
      CHECK(acc[static_cast<std::size_t>(b)] == acc1[0]);
      CHECK(std::equal(out1.begin(), out1.end(), out.begin() + b * n));
    }
  }
}

TEST_CASE("row-aware rules in K-candidate and tree verification refuse bad input",
          "[verify][tree][relaxed][bad_input]") {
  const auto table = line_table();
  const auto p = testing::random_probability_row(line_vocab, 1, 0);
  const auto q = testing::random_probability_row(line_vocab, 1, 1);
  const std::vector<token_t> cand = {1, 2};
  const auto rule = lantern_rule::make_relative(table, 1.5);
  {  // the workspace of a scalar rule is too small for a row-aware one
    std::vector<double> ws(static_cast<std::size_t>(candidates_workspace_size(2)));
    CHECK(refused_argument([&] {
            verify_candidates_checked(
                rule, request_rng{1, 0, 0}, view(p), without_replacement<double>{view(q)},
                row_view<const token_t>(cand.data(), 2),
                row_view<double>(ws.data(), static_cast<index_t>(ws.size())), 0);
          }) == "workspace");
    ws.resize(static_cast<std::size_t>(candidates_workspace_size<lantern_rule>(2, line_vocab)));
    CHECK_NOTHROW(verify_candidates_checked(
        rule, request_rng{1, 0, 0}, view(p), without_replacement<double>{view(q)},
        row_view<const token_t>(cand.data(), 2),
        row_view<double>(ws.data(), static_cast<index_t>(ws.size())), 0));
  }
  // Tree verification: a table for another vocabulary, ω not finite or <= 0, a bad schedule.
  const auto other = neighbour_table({1, 0, 1}, 3, 1);
  std::vector<float> pf(p.begin(), p.end()), qf(q.begin(), q.end());
  const std::vector<token_tree> trees = {trees::from_parents({-1, 0}, {0, 2})};
  pf.insert(pf.end(), p.begin(), p.end());
  qf.insert(qf.end(), q.begin(), q.end());
  const std::vector<request_rng> rng = {{1, 0, 0}};
  std::vector<token_t> out(2);
  std::vector<std::int32_t> acc(1);
  const tree_batch_input<float> in{
      line_vocab, trees, {pf.data(), 2, line_vocab}, {qf.data(), 2, line_vocab}, rng};
  const tree_batch_output o{out, acc, {}, {}};
  CHECK(refused_argument([&] {
          verify_tree(host::seq, in, o, {}, lantern_rule::make_relative(other, 1.0));
        }) == "rule.table");
  for (const double omega : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                             std::numeric_limits<double>::infinity()}) {
    auto bad = rule;
    bad.omega = omega;
    CHECK(refused_argument([&] { verify_tree(host::seq, in, o, {}, bad); }) == "rule.omega");
  }
  scheduled_lantern_rule bad_schedule{rule, relaxation_schedule::make_uniform(2.0)};
  bad_schedule.schedule.delta = std::numeric_limits<double>::quiet_NaN();
  CHECK(refused_argument([&] { verify_tree(host::seq, in, o, {}, bad_schedule); }) ==
        "schedule.delta");
  CHECK_NOTHROW(verify_tree(host::seq, in, o, {},
                            scheduled_lantern_rule{rule, relaxation_schedule::make_uniform(2.0)}));
}
