#pragma once

/// @file
/// Monte Carlo harness: speculative decoding of whole sequences on toy models, for
/// sequence-level goodness-of-fit tests of a chain verifier.
///
/// Each run generates a sequence of length target.horizon(): draft up to `draft_length` tokens
/// from the draft model (never more than the tokens still missing minus one), hand the chain to
/// the verifier under test, append what it emits, repeat. The counts of the finished sequences
/// are compared with target.sequence_law() by a G-test (goodness_of_fit.hpp). All randomness is
/// Philox with fixed seeds, so a failing run is replayable.

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "specula/core/rng.hpp"
#include "specula/core/types.hpp"
#include "specula/rules/exact.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/sample/random_source.hpp"
#include "specula/testing/toy_models.hpp"
#include "specula/verify/chain_core.hpp"

namespace specula::testing {

/// One chain-verification problem handed to the verifier under test.
struct chain_problem {
  index_t vocab = 0;
  std::span<const token_t> drafts;                   ///< L drafted tokens
  std::vector<std::span<const double>> target_rows;  ///< L + 1 rows p_1 .. p_{L+1}
  std::vector<std::span<const double>> draft_rows;   ///< L rows q_1 .. q_L
  request_rng rng;                                   ///< the stream to verify with
};

/// Verifies a chain_problem with the library's per-request chain algorithm and `Rule`.
template <class Rule = exact_rule>
struct rule_chain_verifier {
  Rule rule{};
  double residual_floor = default_residual_floor;

  void operator()(const chain_problem& pr, std::vector<token_t>& emitted) const {
    const auto length = static_cast<index_t>(pr.drafts.size());
    std::vector<token_t> out(static_cast<std::size_t>(length + 1));
    philox_source src{pr.rng};
    auto target_row = [&](index_t i) {
      const auto r = pr.target_rows[static_cast<std::size_t>(i)];
      return row_view<const double>(r.data(), static_cast<index_t>(r.size()));
    };
    auto proposal = [&](index_t i) {
      const auto r = pr.draft_rows[static_cast<std::size_t>(i)];
      return dense_proposal<double>{
          row_view<const double>(r.data(), static_cast<index_t>(r.size()))};
    };
    const auto res = verify_chain_request(rule, src, length, pr.drafts.data(), target_row, proposal,
                                          residual_floor, out.data(), nullptr);
    emitted.assign(out.begin(), out.begin() + res.num_accepted + 1);
  }
};

/// Runs `runs` speculative generations and returns counts indexed by
/// target.sequence_index(). `verify(const chain_problem&, std::vector<token_t>& emitted)` must
/// write the accepted drafts followed by exactly one correction or bonus token.
template <class Verify>
std::vector<std::uint64_t> speculative_sequence_counts(const toy_ar_model& target,
                                                       const toy_ar_model& draft,
                                                       index_t draft_length, std::uint64_t runs,
                                                       std::uint64_t seed, Verify&& verify) {
  if (target.vocab_size() != draft.vocab_size() || target.horizon() != draft.horizon())
    throw std::invalid_argument("specula::testing: target and draft shapes differ");
  if (draft_length < 0) throw std::invalid_argument("specula::testing: draft_length < 0");
  if (runs > 0xFFFFFFFFull) throw std::invalid_argument("specula::testing: too many runs");
  const index_t horizon = target.horizon();
  const index_t vocab = target.vocab_size();
  const std::uint64_t draft_seed = fold_in(seed, 1);
  const std::uint64_t verify_seed = fold_in(seed, 2);
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(target.num_sequences()), 0);
  std::vector<token_t> seq;
  std::vector<token_t> drafts;
  std::vector<token_t> emitted;
  chain_problem pr;
  pr.vocab = vocab;
  for (std::uint64_t run = 0; run < runs; ++run) {
    seq.clear();
    for (std::uint32_t step = 0; static_cast<index_t>(seq.size()) < horizon; ++step) {
      const index_t missing = horizon - static_cast<index_t>(seq.size());
      const index_t length = std::min(draft_length, missing - 1);
      // Draft: sample x_i from the draft model given seq + earlier drafts.
      drafts.clear();
      pr.draft_rows.clear();
      pr.target_rows.clear();
      const request_rng draft_rng{draft_seed, static_cast<std::uint32_t>(run), step};
      std::vector<token_t> context = seq;
      for (index_t i = 0; i < length; ++i) {
        const auto q = draft.row(context);
        auto w = [&](index_t y) { return q[static_cast<std::size_t>(y)]; };
        const index_t x =
            sample_inverse_cdf(vocab, w, positive_mass(vocab, w),
                               uniform_at(draft_rng, draw_id{static_cast<std::uint32_t>(i), 0}));
        drafts.push_back(static_cast<token_t>(x));
        pr.draft_rows.push_back(q);
        pr.target_rows.push_back(target.row(context));
        context.push_back(static_cast<token_t>(x));
      }
      pr.target_rows.push_back(target.row(context));
      pr.drafts = drafts;
      pr.rng = request_rng{verify_seed, static_cast<std::uint32_t>(run), step};
      emitted.clear();
      verify(pr, emitted);
      if (emitted.empty() || static_cast<index_t>(emitted.size()) > length + 1)
        throw std::logic_error("specula::testing: verifier emitted " +
                               std::to_string(emitted.size()) + " tokens for a draft of " +
                               std::to_string(length));
      for (std::size_t i = 0; i + 1 < emitted.size(); ++i)
        if (emitted[i] != drafts[i])
          throw std::logic_error("specula::testing: emitted prefix differs from the drafts");
      for (token_t t : emitted) {
        if (t < 0 || t >= vocab)
          throw std::logic_error("specula::testing: verifier emitted an invalid token");
        seq.push_back(t);
      }
    }
    ++counts[static_cast<std::size_t>(target.sequence_index(seq))];
  }
  return counts;
}

}  // namespace specula::testing
