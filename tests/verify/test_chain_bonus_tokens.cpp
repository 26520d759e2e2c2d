// Chain verification with caller-sampled bonus tokens (chain_batch_input::bonus_tokens, vLLM's
// bonus_token_ids): target rows without bonus rows, the given token emitted after a fully
// accepted chain, the same draws as a call with bonus rows otherwise, and bad bonus tokens.

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "bad_input_util.hpp"
#include "chain_test_util.hpp"
#include "specula/rules/relaxed.hpp"
#include "specula/testing/toy_models.hpp"
#include "specula/verify/chain.hpp"
#include "specula/verify/greedy.hpp"

using namespace specula;

namespace {

/// A ragged batch whose target rows exist twice: with each request's bonus row (num_draft + B
/// rows) and without (num_draft rows, vLLM's layout).
struct bonus_batch {
  index_t vocab = 0;
  std::vector<index_t> offsets{0};
  std::vector<token_t> tokens;
  std::vector<float> draft;
  std::vector<float> target_with_bonus_rows;
  std::vector<float> target;
  std::vector<token_t> bonus;
  std::vector<request_rng> rng;

  bonus_batch(index_t v, const std::vector<index_t>& lens, std::uint64_t seed) : vocab(v) {
    std::uint32_t id = 0;
    auto append = [](std::vector<float>& to, const std::vector<double>& row) {
      to.insert(to.end(), row.begin(), row.end());
    };
    for (std::size_t b = 0; b < lens.size(); ++b) {
      offsets.push_back(offsets.back() + lens[b]);
      for (index_t i = 0; i < lens[b]; ++i) {
        const auto q = testing::random_probability_row(v, seed, id++, 0.2);
        auto p = testing::random_probability_row(v, seed, id++, 0.0);
        // p close to q, so that many chains are accepted in full.
        for (std::size_t y = 0; y < p.size(); ++y) p[y] = 0.7 * q[y] + 0.3 * p[y];
        token_t x = 0;
        for (std::size_t y = 0; y < q.size(); ++y)
          if (q[y] > q[static_cast<std::size_t>(x)]) x = static_cast<token_t>(y);
        tokens.push_back(x);
        append(draft, q);
        append(target, p);
        append(target_with_bonus_rows, p);
      }
      append(target_with_bonus_rows, testing::random_probability_row(v, seed, id++, 0.1));
      bonus.push_back(static_cast<token_t>((7 * b + 3) % static_cast<std::size_t>(v)));
      rng.push_back(request_rng{seed, static_cast<std::uint32_t>(b), 5});
    }
  }
  [[nodiscard]] index_t batch() const { return static_cast<index_t>(bonus.size()); }
  [[nodiscard]] index_t num_draft() const { return offsets.back(); }
  [[nodiscard]] chain_batch_input<float> input(bool given_bonus, bool one_hot = false) const {
    chain_batch_input<float> in{vocab, offsets, tokens, {}, {}, rng};
    if (!one_hot) in.draft_probs = {draft.data(), num_draft(), vocab};
    if (given_bonus) {
      in.target_probs = {target.data(), num_draft(), vocab};
      in.bonus_tokens = bonus;
    } else {
      in.target_probs = {target_with_bonus_rows.data(), num_draft() + batch(), vocab};
    }
    return in;
  }
};

using outputs = test::flat_chain_outputs;

/// The two calls agree except at the emitted token of fully accepted requests, which is the
/// given bonus token.
void require_same_except_bonus(const bonus_batch& bt, const outputs& sampled,
                               const outputs& given) {
  CHECK(given.accepted_count == sampled.accepted_count);
  CHECK(given.accepted == sampled.accepted);
  index_t full = 0;
  for (index_t b = 0; b < bt.batch(); ++b) {
    const auto sb = static_cast<std::size_t>(b);
    const index_t len = bt.offsets[sb + 1] - bt.offsets[sb];
    const index_t start = bt.offsets[sb] + b;
    for (index_t i = 0; i <= len; ++i) {
      const auto slot = static_cast<std::size_t>(start + i);
      if (i == len && given.accepted_count[sb] == len) {
        CHECK(given.tokens[slot] == bt.bonus[sb]);
        CHECK(given.flags[sb] == (chain_valid | chain_bonus));
        CHECK((sampled.flags[sb] & chain_bonus) != 0);
        ++full;
      } else {
        CHECK(given.tokens[slot] == sampled.tokens[slot]);
      }
    }
    if (given.accepted_count[sb] < len) CHECK(given.flags[sb] == sampled.flags[sb]);
  }
  CHECK(full > 0);           // the batch exercises the bonus path
  CHECK(full < bt.batch());  // and the rejection path
}

}  // namespace

TEST_CASE("bonus_tokens: the given token after a fully accepted chain, the same draws otherwise",
          "[verify]") {
  const bonus_batch bt(48, {3, 0, 5, 1, 2, 4, 0, 6, 2, 1, 3, 3}, 17);
  for (const bool one_hot : {false, true}) {
    outputs sampled(bt.num_draft(), bt.batch()), given(bt.num_draft(), bt.batch());
    verify_chain(host::seq, bt.input(false, one_hot), sampled.view());
    verify_chain(host::seq, bt.input(true, one_hot), given.view());
    require_same_except_bonus(bt, sampled, given);

    outputs relaxed_sampled(bt.num_draft(), bt.batch()), relaxed_given(bt.num_draft(), bt.batch());
    const relaxed_rule rule{1.1, resampling::optimal};
    verify_chain(host::seq, bt.input(false, one_hot), relaxed_sampled.view(), {}, rule);
    verify_chain(host::par, bt.input(true, one_hot), relaxed_given.view(), {}, rule);
    require_same_except_bonus(bt, relaxed_sampled, relaxed_given);

    outputs unchecked(bt.num_draft(), bt.batch());
    verify_chain_unchecked(host::seq, bt.input(true, one_hot), unchecked.view());
    CHECK(unchecked.tokens == given.tokens);
    CHECK(unchecked.flags == given.flags);
  }
}

TEST_CASE("bonus_tokens: certain acceptance emits the drafts then the bonus token", "[verify]") {
  // Target rows one-hot at the drafts (one-hot drafts): every draft is accepted.
  const index_t v = 5;
  const std::vector<index_t> offsets{0, 2, 2, 3};
  const std::vector<token_t> drafts{4, 1, 2};
  std::vector<float> target(3 * v, 0.0f);
  for (index_t i = 0; i < 3; ++i) target[static_cast<std::size_t>(i * v + drafts[i])] = 1.0f;
  const std::vector<token_t> bonus{3, 0, 4};
  const std::vector<request_rng> rng{{1, 0, 0}, {1, 1, 0}, {1, 2, 0}};
  chain_batch_input<float> in{v, offsets, drafts, {}, {target.data(), 3, v}, rng};
  in.bonus_tokens = bonus;
  std::vector<token_t> tokens(6, 99);
  std::vector<std::int32_t> count(3, -1);
  std::vector<std::uint32_t> flags(3, 0);
  verify_chain(host::seq, in, chain_batch_output{tokens, count, {}, flags});
  CHECK(tokens == std::vector<token_t>{4, 1, 3, 0, 2, 4});
  CHECK(count == std::vector<std::int32_t>{2, 0, 1});
  for (const auto f : flags) CHECK(f == (chain_valid | chain_bonus));

  // Greedy: the argmax of the one-hot rows is the draft, so the same tokens.
  std::vector<token_t> greedy_tokens(6, 99);
  std::vector<std::int32_t> greedy_count(3, -1);
  verify_chain_greedy(host::seq, in, chain_batch_output{greedy_tokens, greedy_count, {}, {}});
  CHECK(greedy_tokens == tokens);
  CHECK(greedy_count == count);

  // Greedy with a mismatch at request 0's second draft: the argmax there is the correction.
  target[static_cast<std::size_t>(1 * v + 1)] = 0.0f;
  target[static_cast<std::size_t>(1 * v + 2)] = 1.0f;
  verify_chain_greedy(host::seq, in, chain_batch_output{greedy_tokens, greedy_count, {}, {}});
  CHECK(greedy_tokens == std::vector<token_t>{4, 2, -1, 0, 2, 4});
  CHECK(greedy_count == std::vector<std::int32_t>{1, 0, 1});
}

TEST_CASE("bonus_tokens: bad bonus tokens and target rows are refused", "[verify][bad-input]") {
  const bonus_batch bt(16, {2, 1, 3}, 3);
  outputs o(bt.num_draft(), bt.batch());
  using test::require_error;
  auto call = [&](const chain_batch_input<float>& in) { verify_chain(host::seq, in, o.view()); };
  auto greedy = [&](const chain_batch_input<float>& in) {
    verify_chain_greedy(host::seq, in, o.view());
  };
  for (const auto& run : {std::function<void(const chain_batch_input<float>&)>(call),
                          std::function<void(const chain_batch_input<float>&)>(greedy)}) {
    std::vector<token_t> bonus = bt.bonus;
    auto in = bt.input(true);
    bonus.pop_back();
    in.bonus_tokens = bonus;
    require_error([&] { run(in); }, {status::length_mismatch, "bonus_tokens", -1, -1});
    bonus = bt.bonus;
    bonus[1] = -1;
    in.bonus_tokens = bonus;
    require_error([&] { run(in); }, {status::token_out_of_range, "bonus_tokens", 1, -1});
    bonus[1] = 16;
    in.bonus_tokens = bonus;
    require_error([&] { run(in); }, {status::token_out_of_range, "bonus_tokens", 1, -1});
    // Target rows with bonus rows while bonus tokens are given: one row per draft is expected.
    in = bt.input(false);
    in.bonus_tokens = bt.bonus;
    require_error([&] { run(in); }, {status::length_mismatch, "target_probs", -1, -1});
  }
}
