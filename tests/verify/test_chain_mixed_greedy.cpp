// Greedy and sampled requests in one verify_chain call (chain_batch_input::is_greedy): greedy
// requests against a reference written here from the definition (accept while the draft is the
// first maximum of its target row, then emit that row's first maximum); sampled requests equal
// to the same call without greedy requests; bad input.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "specula/verify/chain.hpp"

using namespace specula;

namespace {

struct batch {
  index_t V = 6;
  std::vector<index_t> offsets = {0, 3, 3, 5, 9};  // B = 4: lengths 3, 0, 2, 4
  std::vector<token_t> tokens;
  std::vector<float> draft, target;
  std::vector<request_rng> rng;

  batch() {
    const index_t B = 4, num_draft = offsets.back();
    auto row = [&](std::vector<float>& rows, index_t salt) {
      std::vector<float> r;
      float s = 0;
      for (index_t y = 0; y < V; ++y) {
        r.push_back(1.0f + std::sin(static_cast<float>(salt * 13 + y * 7)));
        s += r.back();
      }
      for (float& v : r) rows.push_back(v / s);
    };
    for (index_t i = 0; i < num_draft; ++i) row(draft, i);
    for (index_t i = 0; i < num_draft + B; ++i) row(target, 100 + i);
    // Drafts: some equal to their row's argmax (so greedy requests accept a few), some not.
    for (index_t b = 0; b < B; ++b)
      for (index_t i = offsets[static_cast<std::size_t>(b)];
           i < offsets[static_cast<std::size_t>(b) + 1]; ++i) {
        const auto t = target.begin() + (i + b) * V;
        const auto best = static_cast<token_t>(std::max_element(t, t + V) - t);
        tokens.push_back(i % 3 == 2 ? static_cast<token_t>((best + 1) % V) : best);
      }
    for (index_t b = 0; b < B; ++b) rng.push_back({42, static_cast<std::uint32_t>(b), 0});
  }
  [[nodiscard]] chain_batch_input<float> in(row_view<const std::uint8_t> greedy) const {
    chain_batch_input<float> r{V,
                               offsets,
                               tokens,
                               {draft.data(), offsets.back(), V},
                               {target.data(), offsets.back() + 4, V},
                               rng};
    r.is_greedy = greedy;
    return r;
  }
};

struct mixed_outputs {
  std::vector<token_t> tokens = std::vector<token_t>(13, 99);
  std::vector<std::int32_t> n = std::vector<std::int32_t>(4, -1);
  std::vector<std::uint8_t> acc = std::vector<std::uint8_t>(9, 7);
  std::vector<std::uint32_t> flags = std::vector<std::uint32_t>(4, 0);
  chain_batch_output view() { return {tokens, n, acc, flags}; }
};

}  // namespace

TEST_CASE("greedy and sampled requests in one verify_chain call", "[verify]") {
  const batch bt;
  const std::vector<std::uint8_t> greedy = {1, 0, 1, 0};
  mixed_outputs mixed, sampled;
  verify_chain(host::par, bt.in(greedy), mixed.view());
  verify_chain(host::seq, bt.in({}), sampled.view());
  for (index_t b = 0; b < 4; ++b) {
    const auto sb = static_cast<std::size_t>(b);
    const index_t begin = bt.offsets[sb], len = bt.offsets[sb + 1] - begin;
    if (greedy[sb] == 0) {
      CHECK(mixed.n[sb] == sampled.n[sb]);
      CHECK(mixed.flags[sb] == sampled.flags[sb]);
      for (index_t i = 0; i <= len; ++i)
        CHECK(mixed.tokens[static_cast<std::size_t>(begin + b + i)] ==
              sampled.tokens[static_cast<std::size_t>(begin + b + i)]);
      continue;
    }
    // The reference: first maxima of the target rows.
    index_t i = 0;
    token_t best = -1;
    for (;; ++i) {
      const auto t = bt.target.begin() + (begin + b + i) * bt.V;
      best = static_cast<token_t>(std::max_element(t, t + bt.V) - t);
      if (i == len || bt.tokens[static_cast<std::size_t>(begin + i)] != best) break;
    }
    INFO("request " << b);
    CHECK(mixed.n[sb] == i);
    for (index_t k = 0; k < i; ++k)
      CHECK(mixed.tokens[static_cast<std::size_t>(begin + b + k)] ==
            bt.tokens[static_cast<std::size_t>(begin + k)]);
    CHECK(mixed.tokens[static_cast<std::size_t>(begin + b + i)] == best);
    for (index_t k = 0; k < len; ++k)
      CHECK(mixed.acc[static_cast<std::size_t>(begin + k)] == (k < i ? 1 : 0));
    CHECK((mixed.flags[sb] & chain_valid) != 0);
    CHECK(((mixed.flags[sb] & chain_bonus) != 0) == (i == len));
  }
  // The fixture exercises both an early mismatch and a full acceptance among greedy requests.
  CHECK(mixed.n[0] < 3);
  CHECK(mixed.n[2] == 2);
}

TEST_CASE("greedy requests may share a stream, sampled ones may not", "[verify][bad_input]") {
  batch bt;
  mixed_outputs o;
  bt.rng[2] = bt.rng[0];  // requests 0 and 2 are greedy below: neither draws
  const std::vector<std::uint8_t> greedy = {1, 0, 1, 0};
  REQUIRE_NOTHROW(verify_chain(host::seq, bt.in(greedy), o.view()));
  bt.rng[3] = bt.rng[1];  // two sampled requests with one stream
  CHECK_THROWS_WITH(verify_chain(host::seq, bt.in(greedy), o.view()),
                    Catch::Contains("rng[row 3]") && Catch::Contains("requests 1 and 3"));
}

TEST_CASE("is_greedy bad input", "[verify][bad_input]") {
  batch bt;
  mixed_outputs o;
  const std::vector<std::uint8_t> three = {1, 0, 1};
  CHECK_THROWS_WITH(verify_chain(host::seq, bt.in(three), o.view()),
                    Catch::Contains("is_greedy") && Catch::Contains("length mismatch"));
  // A greedy request's rows are validated even though argmax would skip a NaN.
  const std::vector<std::uint8_t> greedy = {0, 0, 1, 0};
  bt.target[static_cast<std::size_t>((3 + 2 + 1) * bt.V + 2)] =
      std::numeric_limits<float>::quiet_NaN();  // request 2's second target row
  CHECK_THROWS_WITH(verify_chain(host::seq, bt.in(greedy), o.view()),
                    Catch::Contains("target_probs[row 6][column 2]: NaN entry"));
}

TEST_CASE("a greedy request's proposal rows are never read: checked at full but not at reads",
          "[verify][bad_input]") {
  batch bt;
  const std::vector<std::uint8_t> greedy = {0, 0, 1, 0};
  // q(x) of request 2's first draft (draft row 3): zero, its mass moved to another token so that
  // the row stays valid.
  const auto at = static_cast<std::size_t>(3 * bt.V + bt.tokens[3]);
  const auto other = static_cast<std::size_t>(3 * bt.V + (bt.tokens[3] + 1) % bt.V);
  mixed_outputs clean, got;
  verify_chain(host::seq, bt.in(greedy), clean.view());
  bt.draft[other] += bt.draft[at];
  bt.draft[at] = 0.0f;
  chain_options full;
  full.check = check_level::full;
  CHECK_THROWS_WITH(
      verify_chain(host::seq, bt.in(greedy), got.view(), full),
      Catch::Contains("draft_probs[row 3][column " + std::to_string(bt.tokens[3]) + "]"));
  REQUIRE_NOTHROW(verify_chain(host::seq, bt.in(greedy), got.view()));
  CHECK(got.tokens == clean.tokens);
  CHECK(got.n == clean.n);
  CHECK(got.flags == clean.flags);
}
