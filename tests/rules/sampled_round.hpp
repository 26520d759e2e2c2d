#pragma once
// One relaxed round sampled through the checked batched verifier (tests/rules): L drafts from
// the draft model, verify_chain with `rule`, the output extended to L + 1 tokens with target
// samples (as relaxation_accounting's law is defined), counted by base-V code over n runs.

#include <cstdint>
#include <vector>

#include "specula/testing/toy_models.hpp"
#include "specula/verify/chain.hpp"

namespace specula::test_support {

/// Counts of the L + 1 token sequences of n sampled rounds; `seed` picks the three streams
/// (drafts: seed, verifier: seed + 1, extension: seed + 2).
template <class Rule>
std::vector<std::uint64_t> sampled_round_counts(const testing::toy_ar_model& target,
                                                const testing::toy_ar_model& draft, index_t L,
                                                const Rule& rule, std::uint64_t n,
                                                std::uint64_t seed) {
  const index_t V = target.vocab_size();
  index_t leaves = 1;
  for (index_t i = 0; i <= L; ++i) leaves *= V;
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(leaves), 0);
  std::vector<float> prow, qrow;
  for (std::uint32_t run = 0; run < n; ++run) {
    std::vector<token_t> drafts;
    prow.clear();
    qrow.clear();
    const request_rng drng{seed, run, 0};
    for (index_t i = 0; i < L; ++i) {
      const auto q = draft.row(drafts);
      const auto p = target.row(drafts);
      qrow.insert(qrow.end(), q.begin(), q.end());
      prow.insert(prow.end(), p.begin(), p.end());
      auto w = [&](index_t y) { return q[static_cast<std::size_t>(y)]; };
      drafts.push_back(static_cast<token_t>(sample_inverse_cdf(
          V, w, 1.0, uniform_at(drng, draw_id{static_cast<std::uint32_t>(i), 0}))));
    }
    const auto plast = target.row(drafts);
    prow.insert(prow.end(), plast.begin(), plast.end());
    const std::vector<index_t> off = {0, L};
    const std::vector<request_rng> rng = {{seed + 1, run, 0}};
    std::vector<token_t> out(static_cast<std::size_t>(L + 1));
    std::vector<std::int32_t> acc(1);
    verify_chain(
        host::seq,
        chain_batch_input<float>{V, off, drafts, {qrow.data(), L, V}, {prow.data(), L + 1, V}, rng},
        chain_batch_output{out, acc, {}, {}}, {}, rule);
    std::vector<token_t> seq(out.begin(), out.begin() + acc[0] + 1);
    for (std::uint32_t j = 0; static_cast<index_t>(seq.size()) < L + 1; ++j) {
      const auto p = target.row(seq);
      auto w = [&](index_t y) { return p[static_cast<std::size_t>(y)]; };
      seq.push_back(static_cast<token_t>(
          sample_inverse_cdf(V, w, 1.0, uniform_at(request_rng{seed + 2, run, 0}, draw_id{j, 0}))));
    }
    index_t code = 0;
    for (token_t t : seq) code = code * V + t;
    ++counts[static_cast<std::size_t>(code)];
  }
  return counts;
}

}  // namespace specula::test_support

namespace specula::test_support {

/// A checked verify_chain call of one draft (token 2) over V = 4 (p: two rows; q: the first row
/// twice, so a one-edge tree can use it too); call it with the rule under test.
struct one_draft_chain {
  static constexpr index_t V = 4;
  std::vector<float> p = {0.4f, 0.3f, 0.2f, 0.1f, 0.25f, 0.25f, 0.25f, 0.25f};
  std::vector<float> q = {0.1f, 0.2f, 0.3f, 0.4f, 0.1f, 0.2f, 0.3f, 0.4f};
  std::vector<index_t> off = {0, 1};
  std::vector<token_t> d = {2};
  std::vector<request_rng> rng = {{1, 0, 0}};
  std::vector<token_t> out = std::vector<token_t>(2);
  std::vector<std::int32_t> n = std::vector<std::int32_t>(1);

  template <class Rule>
  void operator()(const Rule& rule) {
    verify_chain(host::seq,
                 chain_batch_input<float>{V, off, d, {q.data(), 1, V}, {p.data(), 2, V}, rng},
                 chain_batch_output{out, n, {}, {}}, {}, rule);
  }
};

}  // namespace specula::test_support
