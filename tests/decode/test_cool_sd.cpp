// Cool-SD (relaxed draft-model speculative decoding): the loop's empirical output law matches
// the exact law computed by testing::speculative_loop_law (G-test, and the empirical total
// variation from the target law matches the exact one) for uniform, exponential and linear
// schedules; the exact rule's loop law is the target's; a mismatched schedule fails.

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include <specula/decode/speculative.hpp>
#include <specula/rules/relaxed.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula/testing/relaxation_analysis.hpp>
#include <specula/testing/toy_models.hpp>

using namespace specula;
using specula::testing::toy_ar_model;
using specula::testing::toy_model_session;

namespace {

constexpr index_t draft_length = 3;

std::vector<std::uint64_t> loop_counts(const toy_ar_model& target_model,
                                       const toy_ar_model& draft_model,
                                       const scheduled_relaxed_rule& rule, std::uint32_t runs,
                                       std::uint64_t seed, decode_stats* stats) {
  toy_model_session target(target_model), draft(draft_model);
  speculative_options opt;
  opt.draft_length = draft_length;
  opt.max_new_tokens = target_model.horizon();
  tree_verifier<host::sequential_policy, scheduled_relaxed_rule> verify;
  verify.rule = rule;
  const std::vector<token_t> prompt{0};  // BOS
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(target_model.num_sequences()), 0);
  for (std::uint32_t r = 0; r < runs; ++r) {
    const auto out =
        speculative_decode(target, draft, prompt, opt, request_rng{seed, r, 0}, verify, stats);
    ++counts[static_cast<std::size_t>(target_model.sequence_index(out))];
  }
  return counts;
}

double tv(std::span<const double> a, std::span<const double> b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += std::abs(a[i] - b[i]);
  return 0.5 * s;
}

}  // namespace

TEST_CASE("the exact rule's loop law is the target's law", "[decode][law]") {
  const toy_ar_model target(3, 4, 31);
  const toy_ar_model draft = toy_ar_model::perturbed(target, 0.6, 32);
  scheduled_relaxed_rule exact;
  exact.schedule = relaxation_schedule::make_uniform(1.0);
  const auto loop = testing::speculative_loop_law(target, draft, draft_length, exact);
  const auto law = target.sequence_law();
  REQUIRE(loop.size() == law.size());
  for (std::size_t i = 0; i < law.size(); ++i) CHECK(loop[i] == Approx(law[i]).margin(1e-12));
}

TEST_CASE("Cool-SD's empirical law and TV match the exact ones", "[decode][stats]") {
  // V = 3, 4 positions (81 sequences), 2*10^5 generations per schedule.
  const toy_ar_model target(3, 4, 31);
  const toy_ar_model draft = toy_ar_model::perturbed(target, 0.6, 32);
  const auto law = target.sequence_law();
  struct named {
    const char* name;
    relaxation_schedule schedule;
  };
  const std::vector<named> schedules = {
      {"uniform", relaxation_schedule::make_uniform(2.0)},
      {"exponential", relaxation_schedule::make_exponential(2.0, 0.7, draft_length)},
      {"linear", relaxation_schedule::make_linear(2.0, 8.0, draft_length)}};
  constexpr std::uint32_t runs = 200'000;
  std::uint64_t seed = 11;
  for (const auto& s : schedules) {
    INFO("schedule " << s.name);
    scheduled_relaxed_rule rule;
    rule.schedule = s.schedule;
    const auto relaxed = testing::speculative_loop_law(target, draft, draft_length, rule);
    const auto counts = loop_counts(target, draft, rule, runs, seed++, nullptr);
    const auto g = testing::g_test(counts, relaxed);
    INFO(g);
    CHECK(g.impossible_observations == 0);
    CHECK(g.p_value > 1e-4);
    // The relaxation distorts measurably: the target law is rejected ...
    CHECK(testing::g_test(counts, law).p_value < 1e-6);
    // ... and the empirical TV from the target law matches the exact TV within its sampling
    // error (3 standard deviations of the per-cell frequencies, summed).
    std::vector<double> freq(counts.size());
    double sd = 0.0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      freq[i] = static_cast<double>(counts[i]) / runs;
      sd += std::sqrt(relaxed[i] * (1.0 - relaxed[i]) / runs);
    }
    const double exact_tv = tv(relaxed, law);
    INFO("exact TV " << exact_tv << " empirical TV " << tv(freq, law));
    CHECK(exact_tv > 0.01);
    CHECK(std::abs(tv(freq, law) - exact_tv) <= 1.5 * sd);
  }
}

TEST_CASE("Cool-SD's law test fails for a mismatched schedule", "[decode][stats]") {
  // Negative control: generations with delta = 2 tested against the law of delta = 1.5.
  const toy_ar_model target(3, 4, 31);
  const toy_ar_model draft = toy_ar_model::perturbed(target, 0.6, 32);
  scheduled_relaxed_rule used, claimed;
  used.schedule = relaxation_schedule::make_uniform(2.0);
  claimed.schedule = relaxation_schedule::make_uniform(1.5);
  const auto counts = loop_counts(target, draft, used, 200'000, 99, nullptr);
  const auto wrong = testing::speculative_loop_law(target, draft, draft_length, claimed);
  CHECK(testing::g_test(counts, wrong).p_value < 1e-6);
}

TEST_CASE("the loop refuses bad relaxation parameters before it emits anything",
          "[decode][bad_input]") {
  const toy_ar_model target(3, 4, 31);
  const toy_ar_model draft = toy_ar_model::perturbed(target, 0.6, 32);
  for (const double omega : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                             std::numeric_limits<double>::infinity()}) {
    INFO("omega " << omega);
    scheduled_relaxed_rule rule;
    rule.schedule.kind = schedule_kind::uniform;
    rule.schedule.delta = omega;
    CHECK_THROWS_WITH(loop_counts(target, draft, rule, 1, 5, nullptr),
                      Catch::Contains("schedule.delta"));
  }
}
