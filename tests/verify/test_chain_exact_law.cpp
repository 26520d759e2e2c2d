// Exact output law of chain verification: enumerate the verifier's randomness (draft sampled
// from q, accept/reject, residual or bonus sample) in double and compare with the target law.

#include <catch2/catch.hpp>
#include <map>
#include <vector>

#include "chain_test_util.hpp"
#include "specula/rules/exact.hpp"
#include "specula/testing/catch2.hpp"
#include "specula/testing/enumerate.hpp"
#include "specula/testing/goodness_of_fit.hpp"
#include "specula/verify/chain_core.hpp"

using namespace specula;
using specula::test::make_pair;
using specula::test::pair_kind;
using specula::test::view;

namespace {

/// One position: draft x ~ q (through the source), verify a chain of length 1, return the first
/// emitted token (the accepted draft or the correction).
template <class Rule>
auto single_position(const std::vector<double>& p, const std::vector<double>& q,
                     const std::vector<double>& p_next, Rule rule, bool one_hot = false) {
  return [&p, &q, &p_next, rule, one_hot](auto& src) -> index_t {
    auto qw = [&](index_t y) { return q[static_cast<std::size_t>(y)]; };
    const auto x = static_cast<token_t>(
        src.categorical(static_cast<index_t>(q.size()), qw, 1.0, draw_id{99, 0}));
    token_t out[2];
    auto target_row = [&](index_t i) { return i == 0 ? view(p) : view(p_next); };
    chain_request_result r;
    if (one_hot) {
      auto prop = [&](index_t) { return one_hot_proposal{x}; };
      r = verify_chain_request(rule, src, 1, &x, target_row, prop, 0.0, out, nullptr);
    } else {
      auto prop = [&](index_t) { return dense_proposal<double>{view(q)}; };
      r = verify_chain_request(rule, src, 1, &x, target_row, prop, 0.0, out, nullptr);
    }
    REQUIRE((r.flags & chain_valid) != 0);
    return out[0];
  };
}

}  // namespace

TEST_CASE("exact law of one verified position equals p on 250 random pairs", "[verify][law]") {
  const pair_kind kinds[] = {pair_kind::dense, pair_kind::sparse, pair_kind::q_zero_off_support,
                             pair_kind::equal, pair_kind::disjoint};
  int checked = 0;
  for (pair_kind kind : kinds) {
    for (std::uint64_t seed = 1; seed <= 50; ++seed) {
      const index_t vocab = 2 + static_cast<index_t>(seed % 7);  // 2..8
      const auto pr = make_pair(kind, vocab, seed * 7919 + static_cast<std::uint64_t>(kind));
      const auto p_next = testing::random_probability_row(vocab, seed, 5);
      INFO("kind " << static_cast<int>(kind) << " seed " << seed << " vocab " << vocab);
      SPECULA_REQUIRE_LOSSLESS(pr.p, single_position(pr.p, pr.q, p_next, exact_rule{}));
      ++checked;
    }
  }
  CHECK(checked == 250);
}

TEST_CASE("exact law with one-hot drafts (no q rows) equals p", "[verify][law]") {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    const index_t vocab = 2 + static_cast<index_t>(seed % 6);
    const auto pr = make_pair(seed % 2 ? pair_kind::dense : pair_kind::sparse, vocab, seed);
    const auto p_next = testing::random_probability_row(vocab, seed, 5);
    INFO("seed " << seed);
    SPECULA_REQUIRE_LOSSLESS(pr.p, single_position(pr.p, pr.q, p_next, exact_rule{}, true));
  }
}

TEST_CASE("negative control: biased residuals visibly change the exact law", "[verify][law]") {
  const auto pr = make_pair(pair_kind::dense, 6, 1234);
  const auto p_next = testing::random_probability_row(6, 1234, 5);
  const auto r1 = testing::check_lossless(
      pr.p, single_position(pr.p, pr.q, p_next, test::resample_from_target_rule{}));
  const auto r2 = testing::check_lossless(
      pr.p, single_position(pr.p, pr.q, p_next, test::absolute_residual_rule{}));
  INFO(r1.describe() << "\n" << r2.describe());
  CHECK(r1.max_abs_error > 1e-3);
  CHECK(r2.max_abs_error > 1e-3);
  // ... while the exact rule on the same pair is lossless.
  CHECK(testing::check_lossless(pr.p, single_position(pr.p, pr.q, p_next, exact_rule{}))
            .max_abs_error < 1e-12);
}

TEST_CASE("exact sequence law of multi-token speculative decoding on a toy model",
          "[verify][law]") {
  // Horizon 3, draft length 2: enumerate the draft samples, every accept/reject and every
  // residual/bonus sample, and the follow-up steps when fewer than 3 tokens were emitted.
  for (std::uint64_t seed : {3u, 11u, 29u}) {
    const testing::toy_ar_model target(3, 3, seed, 0.3);
    const auto draft = testing::toy_ar_model::perturbed(target, 0.7, seed + 100, 0.4);
    const auto law = target.sequence_law();
    auto experiment = [&](auto& run) -> index_t {
      std::vector<token_t> seq;
      // Each step draws from its own stream (as the decoding loops give each step its own
      // request_rng), and each draft position from its own draw point.
      for (std::uint32_t step = 0; static_cast<index_t>(seq.size()) < target.horizon(); ++step) {
        auto src = run.stream(step);
        const index_t length =
            std::min<index_t>(2, target.horizon() - 1 - static_cast<index_t>(seq.size()));
        std::vector<token_t> ctx = seq, drafts;
        std::vector<std::span<const double>> prow, qrow;
        for (index_t i = 0; i < length; ++i) {
          const auto q = draft.row(ctx);
          auto qw = [&](index_t y) { return q[static_cast<std::size_t>(y)]; };
          const auto x = static_cast<token_t>(
              src.categorical(3, qw, 1.0, draw_id{50 + static_cast<std::uint32_t>(i), 0}));
          drafts.push_back(x);
          qrow.push_back(q);
          prow.push_back(target.row(ctx));
          ctx.push_back(x);
        }
        prow.push_back(target.row(ctx));
        std::vector<token_t> out(static_cast<std::size_t>(length + 1));
        auto target_row = [&](index_t i) {
          auto r = prow[static_cast<std::size_t>(i)];
          return row_view<const double>(r.data(), 3);
        };
        auto prop = [&](index_t i) {
          auto r = qrow[static_cast<std::size_t>(i)];
          return dense_proposal<double>{row_view<const double>(r.data(), 3)};
        };
        const auto res = verify_chain_request(exact_rule{}, src, length, drafts.data(), target_row,
                                              prop, 0.0, out.data(), nullptr);
        for (index_t i = 0; i <= res.num_accepted; ++i)
          seq.push_back(out[static_cast<std::size_t>(i)]);
      }
      return target.sequence_index(seq);
    };
    const auto got = testing::enumerate_token_law(target.num_sequences(), experiment);
    INFO("seed " << seed);
    CHECK(got.invalid_mass == 0.0);
    CHECK(testing::max_abs_difference(got.probability, law) < 1e-12);
  }
}

TEST_CASE("an empty residual falls back to p and is flagged", "[verify][law]") {
  // p sums to 0.8 (as if a caller's tolerance let it through) and p <= q everywhere, so the
  // residual [p - q]+ is exactly zero while rejection has probability 0.2.
  const std::vector<double> p = {0.5, 0.3, 0.0};
  const std::vector<double> q = {0.5, 0.5, 0.0};
  const std::vector<double> p_next = {1.0, 0.0, 0.0};
  std::map<std::pair<index_t, bool>, double> law;
  auto experiment = [&](auto& src) -> std::pair<index_t, bool> {
    auto qw = [&](index_t y) { return q[static_cast<std::size_t>(y)]; };
    const auto x = static_cast<token_t>(src.categorical(3, qw, 1.0, draw_id{99, 0}));
    token_t out[2];
    auto target_row = [&](index_t i) { return i == 0 ? view(p) : view(p_next); };
    auto prop = [&](index_t) { return dense_proposal<double>{view(q)}; };
    const auto r = verify_chain_request(exact_rule{}, src, 1, &x, target_row, prop,
                                        default_residual_floor, out, nullptr);
    REQUIRE((r.flags & chain_valid) != 0);
    return {out[0], (r.flags & chain_residual_fallback) != 0};
  };
  law = testing::enumerate_outcomes<std::pair<index_t, bool>>(experiment);
  // Rejection happens only for x = 1 (q = 0.5 > p = 0.3): probability 0.5 * (1 - 0.6) = 0.2.
  // The fallback then samples Norm(p) = (0.625, 0.375, 0).
  double flagged = 0.0;
  for (const auto& [k, v] : law)
    if (k.second) flagged += v;
  CHECK(flagged == Approx(0.2).epsilon(1e-12));
  CHECK(law[{0, true}] == Approx(0.2 * 0.625).epsilon(1e-12));
  CHECK(law[{1, true}] == Approx(0.2 * 0.375).epsilon(1e-12));
  CHECK(law.count({2, true}) == 0);
  CHECK(law[{0, false}] == Approx(0.5).epsilon(1e-12));
  CHECK(law[{1, false}] == Approx(0.3).epsilon(1e-12));
}
