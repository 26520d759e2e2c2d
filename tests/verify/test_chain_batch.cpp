// Batched chain verification: layouts, determinism, batch-position invariance, policies,
// output conventions.

#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <vector>

#include "chain_test_util.hpp"
#include "specula/testing/toy_models.hpp"
#include "specula/verify/chain.hpp"

using namespace specula;

namespace {

/// A random ragged batch with float rows; drafts sampled from their q rows.
struct ragged_batch {
  index_t vocab = 0;
  std::vector<index_t> lengths;
  std::vector<index_t> offsets;
  std::vector<token_t> tokens;
  std::vector<float> draft;
  std::vector<float> target;
  std::vector<request_rng> rng;

  ragged_batch(index_t v, std::vector<index_t> lens, std::uint64_t seed) : vocab(v), lengths(lens) {
    offsets.push_back(0);
    std::uint32_t id = 0;
    for (std::size_t b = 0; b < lens.size(); ++b) {
      offsets.push_back(offsets.back() + lens[b]);
      for (index_t i = 0; i < lens[b]; ++i) {
        auto q = testing::random_probability_row(v, seed, id++, 0.2);
        // p close to q so that chains are partly accepted.
        auto p = testing::random_probability_row(v, seed, id++, 0.0);
        for (index_t y = 0; y < v; ++y)
          p[static_cast<std::size_t>(y)] =
              0.7 * q[static_cast<std::size_t>(y)] + 0.3 * p[static_cast<std::size_t>(y)];
        const double u = uniform_at(request_rng{seed, id, 7}, draw_id{0, 0});
        double acc = 0.0;
        token_t x = 0;
        for (index_t y = 0; y < v; ++y) {
          acc += q[static_cast<std::size_t>(y)];
          if (q[static_cast<std::size_t>(y)] > 0.0) x = static_cast<token_t>(y);
          if (u < acc && q[static_cast<std::size_t>(y)] > 0.0) break;
        }
        tokens.push_back(x);
        draft.insert(draft.end(), q.begin(), q.end());
        target.insert(target.end(), p.begin(), p.end());
      }
      auto bonus = testing::random_probability_row(v, seed, id++, 0.1);
      // Target rows of request b: its L_b rows then its bonus row, contiguous.
      target.insert(target.end(), bonus.begin(), bonus.end());
      rng.push_back(request_rng{1000 + b, static_cast<std::uint32_t>(b), 3});
    }
  }
  [[nodiscard]] index_t batch() const { return static_cast<index_t>(lengths.size()); }
  [[nodiscard]] index_t num_draft() const { return offsets.back(); }
  [[nodiscard]] chain_batch_input<float> input(bool one_hot = false) const {
    chain_batch_input<float> in;
    in.vocab_size = vocab;
    in.draft_offsets = offsets;
    in.draft_tokens = tokens;
    if (!one_hot) in.draft_probs = {draft.data(), num_draft(), vocab};
    in.target_probs = {target.data(), num_draft() + batch(), vocab};
    in.rng = rng;
    return in;
  }
};

using outputs = test::flat_chain_outputs;

/// Request b's emitted tokens (accepted drafts + final) from a flattened output.
std::vector<token_t> emitted(const ragged_batch& bt, const outputs& o, index_t b) {
  const auto start = static_cast<std::size_t>(bt.offsets[static_cast<std::size_t>(b)] + b);
  const auto n = static_cast<std::size_t>(o.accepted_count[static_cast<std::size_t>(b)] + 1);
  return {o.tokens.begin() + static_cast<std::ptrdiff_t>(start),
          o.tokens.begin() + static_cast<std::ptrdiff_t>(start + n)};
}

}  // namespace

TEST_CASE("output conventions of the flattened layout", "[verify]") {
  const ragged_batch bt(64, {3, 0, 5, 1, 8}, 11);
  outputs o(bt.num_draft(), bt.batch());
  verify_chain(host::seq, bt.input(), o.view());
  for (index_t b = 0; b < bt.batch(); ++b) {
    const auto sb = static_cast<std::size_t>(b);
    const index_t len = bt.lengths[sb];
    const index_t n = o.accepted_count[sb];
    REQUIRE(n >= 0);
    REQUIRE(n <= len);
    CHECK((o.flags[sb] & chain_valid) != 0);
    CHECK(((o.flags[sb] & chain_bonus) != 0) == (n == len));
    const index_t start = bt.offsets[sb] + b;
    for (index_t i = 0; i <= len; ++i) {
      const token_t t = o.tokens[static_cast<std::size_t>(start + i)];
      if (i < n) CHECK(t == bt.tokens[static_cast<std::size_t>(bt.offsets[sb] + i)]);
      if (i == n) CHECK((t >= 0 && t < bt.vocab));
      if (i > n) CHECK(t == no_token);
    }
    for (index_t i = 0; i < len; ++i)
      CHECK(o.accepted[static_cast<std::size_t>(bt.offsets[sb] + i)] == (i < n ? 1 : 0));
  }
}

TEST_CASE("same seed gives the same output and another step gives other draws", "[verify]") {
  ragged_batch bt(128, {6, 6, 6, 6, 6, 6}, 5);
  outputs a(bt.num_draft(), bt.batch()), b(bt.num_draft(), bt.batch());
  verify_chain(host::seq, bt.input(), a.view());
  verify_chain(host::seq, bt.input(), b.view());
  CHECK(a.tokens == b.tokens);
  CHECK(a.accepted_count == b.accepted_count);
  CHECK(a.flags == b.flags);
  // Changing the step changes the stream: over many steps outputs must differ somewhere.
  bool differs = false;
  for (std::uint32_t step = 4; step < 40 && !differs; ++step) {
    for (auto& r : bt.rng) r.step = step;
    outputs c(bt.num_draft(), bt.batch());
    verify_chain(host::seq, bt.input(), c.view());
    differs = c.tokens != a.tokens;
  }
  CHECK(differs);
}

TEST_CASE("a request's output does not depend on its batch position or its neighbours",
          "[verify]") {
  const ragged_batch full(96, {4, 1, 7, 0, 3, 5}, 21);
  outputs ref(full.num_draft(), full.batch());
  verify_chain(host::seq, full.input(), ref.view());

  // Each request alone in a batch of one.
  for (index_t b = 0; b < full.batch(); ++b) {
    const auto sb = static_cast<std::size_t>(b);
    const index_t len = full.lengths[sb];
    std::vector<index_t> offsets = {0, len};
    std::vector<token_t> tokens(full.tokens.begin() + full.offsets[sb],
                                full.tokens.begin() + full.offsets[sb] + len);
    std::vector<float> draft(full.draft.begin() + full.offsets[sb] * full.vocab,
                             full.draft.begin() + (full.offsets[sb] + len) * full.vocab);
    std::vector<float> target(full.target.begin() + (full.offsets[sb] + b) * full.vocab,
                              full.target.begin() + (full.offsets[sb] + b + len + 1) * full.vocab);
    std::vector<request_rng> rng = {full.rng[sb]};
    chain_batch_input<float> in{full.vocab,
                                offsets,
                                tokens,
                                {draft.data(), len, full.vocab},
                                {target.data(), len + 1, full.vocab},
                                rng};
    outputs one(len, 1);
    verify_chain(host::seq, in, one.view());
    CHECK(one.accepted_count[0] == ref.accepted_count[sb]);
    const auto mine =
        std::vector<token_t>(one.tokens.begin(), one.tokens.begin() + one.accepted_count[0] + 1);
    CHECK(mine == emitted(full, ref, b));
  }

  // The batch in reverse order.
  ragged_batch rev = full;
  {
    std::vector<index_t> order(static_cast<std::size_t>(full.batch()));
    std::iota(order.begin(), order.end(), 0);
    std::reverse(order.begin(), order.end());
    rev.lengths.clear();
    rev.offsets = {0};
    rev.tokens.clear();
    rev.draft.clear();
    rev.target.clear();
    rev.rng.clear();
    for (index_t b : order) {
      const auto sb = static_cast<std::size_t>(b);
      const index_t len = full.lengths[sb];
      rev.lengths.push_back(len);
      rev.offsets.push_back(rev.offsets.back() + len);
      rev.tokens.insert(rev.tokens.end(), full.tokens.begin() + full.offsets[sb],
                        full.tokens.begin() + full.offsets[sb] + len);
      rev.draft.insert(rev.draft.end(), full.draft.begin() + full.offsets[sb] * full.vocab,
                       full.draft.begin() + (full.offsets[sb] + len) * full.vocab);
      rev.target.insert(rev.target.end(), full.target.begin() + (full.offsets[sb] + b) * full.vocab,
                        full.target.begin() + (full.offsets[sb] + b + len + 1) * full.vocab);
      rev.rng.push_back(full.rng[sb]);
    }
  }
  outputs r(rev.num_draft(), rev.batch());
  verify_chain(host::seq, rev.input(), r.view());
  for (index_t k = 0; k < full.batch(); ++k)
    CHECK(emitted(rev, r, k) == emitted(full, ref, full.batch() - 1 - k));
}

TEST_CASE("the parallel policy gives the sequential policy's output", "[verify]") {
  std::vector<index_t> lens;
  for (int b = 0; b < 37; ++b) lens.push_back(b % 9);
  const ragged_batch bt(200, lens, 8);
  outputs a(bt.num_draft(), bt.batch()), b(bt.num_draft(), bt.batch());
  verify_chain(host::seq, bt.input(), a.view());
  verify_chain(host::par.with_threads(4), bt.input(), b.view());
  CHECK(a.tokens == b.tokens);
  CHECK(a.accepted_count == b.accepted_count);
  CHECK(a.accepted == b.accepted);
  CHECK(a.flags == b.flags);
}

TEST_CASE("padded layout gives the flattened layout's output", "[verify]") {
  const ragged_batch bt(50, {2, 5, 0, 3}, 31);
  outputs ref(bt.num_draft(), bt.batch());
  verify_chain(host::seq, bt.input(), ref.view());

  const index_t L = 5, B = bt.batch(), V = bt.vocab;
  std::vector<token_t> tokens(static_cast<std::size_t>(B * L), no_token);
  std::vector<float> draft(static_cast<std::size_t>(B * L * V), 0.0f);
  std::vector<float> target(static_cast<std::size_t>(B * (L + 1) * V), 0.0f);
  for (index_t b = 0; b < B; ++b) {
    const auto sb = static_cast<std::size_t>(b);
    const index_t len = bt.lengths[sb];
    for (index_t i = 0; i < len; ++i) {
      tokens[static_cast<std::size_t>(b * L + i)] =
          bt.tokens[static_cast<std::size_t>(bt.offsets[sb] + i)];
      std::copy_n(bt.draft.begin() + (bt.offsets[sb] + i) * V, V, draft.begin() + (b * L + i) * V);
    }
    for (index_t i = len; i < L; ++i) draft[static_cast<std::size_t>((b * L + i) * V)] = 1.0f;
    for (index_t i = 0; i <= len; ++i)
      std::copy_n(bt.target.begin() + (bt.offsets[sb] + b + i) * V, V,
                  target.begin() + (b * (L + 1) + i) * V);
    for (index_t i = len + 1; i <= L; ++i)
      target[static_cast<std::size_t>((b * (L + 1) + i) * V)] = 1.0f;
  }
  padded_chain_input<float> in;
  in.vocab_size = V;
  in.batch_size = B;
  in.max_draft = L;
  in.draft_tokens = tokens;
  in.draft_probs = {draft.data(), B * L, V};
  in.target_probs = {target.data(), B * (L + 1), V};
  in.rng = bt.rng;

  for (bool explicit_lengths : {false, true}) {
    std::vector<std::int32_t> lengths;
    for (index_t len : bt.lengths) lengths.push_back(static_cast<std::int32_t>(len));
    if (explicit_lengths) in.draft_lengths = lengths;
    std::vector<token_t> out(static_cast<std::size_t>(B * (L + 1)), 999);
    std::vector<std::int32_t> n(static_cast<std::size_t>(B));
    std::vector<std::uint8_t> acc(static_cast<std::size_t>(B * L), 9);
    verify_chain(host::seq, in, padded_chain_output{out, n, acc, {}});
    for (index_t b = 0; b < B; ++b) {
      const auto sb = static_cast<std::size_t>(b);
      CHECK(n[sb] == ref.accepted_count[sb]);
      const auto e = emitted(bt, ref, b);
      for (index_t i = 0; i <= L; ++i) {
        const token_t want =
            i < static_cast<index_t>(e.size()) ? e[static_cast<std::size_t>(i)] : no_token;
        CHECK(out[static_cast<std::size_t>(b * (L + 1) + i)] == want);
      }
      for (index_t i = 0; i < L; ++i)
        CHECK(acc[static_cast<std::size_t>(b * L + i)] == (i < n[sb] ? 1 : 0));
    }
  }
}

TEST_CASE("one-hot drafts never emit a rejected draft as the correction", "[verify]") {
  // With q one-hot at x, the residual is p with x removed: a correction never equals x.
  const ragged_batch bt(16, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 3);
  for (std::uint32_t step = 0; step < 50; ++step) {
    ragged_batch s = bt;
    for (auto& r : s.rng) r.step = step;
    outputs o(s.num_draft(), s.batch());
    verify_chain(host::seq, s.input(true), o.view());
    for (index_t b = 0; b < s.batch(); ++b) {
      const auto sb = static_cast<std::size_t>(b);
      if (o.accepted_count[sb] == 0) {
        CHECK(o.tokens[static_cast<std::size_t>(s.offsets[sb] + b)] !=
              s.tokens[static_cast<std::size_t>(s.offsets[sb])]);
      }
    }
  }
}
